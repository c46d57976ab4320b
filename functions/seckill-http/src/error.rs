//! The errors of the HTTP layer and the one place they become responses.
//!
//! Every failure a caller can see is an [`ApiError`]; [`ApiError::into_response`] is the
//! only mapping to a status and a stable `code` (`../shared/README.md` §1). Infrastructure
//! failures become `503 unavailable` with a generic message; their detail goes to the log
//! only.

use http::StatusCode;
use lambda_http::{Body, Response};
use seckill_shared::domain::ValidationError;
use seckill_shared::error::StoreError;

/// A failure as the caller sees it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the sale has not started yet")]
    NotStarted,
    #[error("the sale has ended")]
    Ended,
    #[error("sold out")]
    SoldOut,
    #[error("you already hold an order for this voucher")]
    AlreadyPurchased,
    #[error("too many attempts, slow down")]
    RateLimited,
    #[error("the service is unavailable, retry shortly")]
    Unavailable(#[source] StoreError),
}

impl ApiError {
    /// The status and the stable code of the contract.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::NotStarted => (StatusCode::CONFLICT, "not_started"),
            ApiError::Ended => (StatusCode::CONFLICT, "ended"),
            ApiError::SoldOut => (StatusCode::CONFLICT, "sold_out"),
            ApiError::AlreadyPurchased => (StatusCode::CONFLICT, "already_purchased"),
            ApiError::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        }
    }

    pub fn code(&self) -> &'static str {
        self.status_and_code().1
    }

    /// A refusal the sale's own state explains (sold out, not started, ended): the flood
    /// case of a sale, mostly answered from the instance's memory.
    pub fn is_sale_refusal(&self) -> bool {
        matches!(
            self,
            ApiError::SoldOut | ApiError::NotStarted | ApiError::Ended
        )
    }

    pub fn into_response(self) -> Response<Body> {
        let (status, code) = self.status_and_code();
        if let ApiError::Unavailable(source) = &self {
            tracing::error!(error = %source, "backend unavailable");
        }
        // A struct, not a `json!` map: this is the body of every refusal of a sale.
        #[derive(serde::Serialize)]
        struct ErrorBody<'a> {
            code: &'a str,
            message: &'a str,
        }
        let message = self.to_string();
        let body = serde_json::to_string(&ErrorBody {
            code,
            message: &message,
        })
        .expect("two strings serialise");
        json_text_response(status, body)
    }
}

/// Input that failed a domain type's parse: the caller's mistake.
impl From<ValidationError> for ApiError {
    fn from(err: ValidationError) -> ApiError {
        ApiError::InvalidRequest(err.0)
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        ApiError::Unavailable(err)
    }
}

/// A JSON response with the contract's content type.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    json_text_response(status, body.to_string())
}

/// A response with an already serialised JSON body.
fn json_text_response(status: StatusCode, body: String) -> Response<Body> {
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

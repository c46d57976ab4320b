//! The errors of the HTTP layer and the one place they become responses.
//!
//! Every failure a caller can see is an [`ApiError`]; [`ApiError::into_response`] is the
//! only mapping to a status and a stable `code` (docs/http-api.md). The body is
//! `{"code","message"}`, plus `order_id` on `already_purchased`. Infrastructure failures
//! become `503 unavailable` with a generic message; their detail goes to the log only.

use http::StatusCode;
use lambda_http::{Body, Response};
use seckill_shared::domain::{OrderId, ValidationError, VoucherId};
use seckill_shared::error::StoreError;

/// Every `code` an error body can carry: the contract's list (`docs/openapi.yaml`,
/// `ErrorCode`). A unit test keeps it equal to what [`ApiError::status_and_code`] maps.
pub const CODES: &[&str] = &[
    "invalid_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "not_started",
    "ended",
    "sold_out",
    "already_purchased",
    "order_expired",
    "order_cancelled",
    "order_paid",
    "order_rejected",
    "already_paid",
    "payment_not_required",
    "payment_mismatch",
    "payment_reused",
    "rate_limited",
    "unavailable",
    "entry_required",
    "queue_not_open",
];

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
    /// A declared path asked with another method; `allow` is the one it takes (the
    /// `Allow` header).
    #[error("{method} is not allowed here; use {allow}")]
    MethodNotAllowed { method: String, allow: &'static str },
    #[error("the sale has not started yet")]
    NotStarted,
    #[error("the sale has ended")]
    Ended,
    #[error("sold out")]
    SoldOut,
    /// The caller holds `order_id` for this voucher (the body names it).
    #[error("you already hold an order for this voucher")]
    AlreadyPurchased { order_id: OrderId },
    /// Pay or cancel: the order expired (unpaid at its deadline); its unit went back.
    #[error("the order expired: it was not paid in time")]
    OrderExpired,
    /// Pay or cancel: the buyer cancelled the order.
    #[error("the order was cancelled")]
    OrderCancelled,
    /// Cancel: the order is paid.
    #[error("the order is paid and can no longer be cancelled")]
    OrderPaid,
    /// Pay or cancel: the database could not cover the order (see `rejected`).
    #[error("the order was rejected")]
    OrderRejected,
    /// Pay: the order is paid already.
    #[error("the order is paid already")]
    AlreadyPaid,
    /// A provider's payment whose amount or currency is not the voucher's price
    /// (recorded, never applied).
    #[error("{0}")]
    PaymentMismatch(String),
    /// A provider's payment id already recorded for another order: one payment pays at
    /// most one order.
    #[error("{0}")]
    PaymentReused(String),
    /// Pay or cancel an order of a voucher without a payment step.
    #[error("orders of this voucher need no payment and cannot be cancelled")]
    PaymentNotRequired,
    #[error("too many attempts, slow down")]
    RateLimited,
    /// A voucher with a waiting room, bought without a valid entry token of the caller's
    /// for it.
    #[error("{0}")]
    EntryRequired(String),
    /// A join before the waiting room's queue opens.
    #[error("{0}")]
    QueueNotOpen(String),
    /// The admission may have happened but is not promised: in durable mode admitted on
    /// the Redis primary but not yet held by enough replicas to survive a failover; in
    /// any mode no reply from Redis in time. The body names the order: a lookup tells
    /// whether it exists (a retry too, unless the instance already knows the voucher
    /// sold out).
    #[error("your order {order_id} is not confirmed yet: look it up or retry shortly")]
    Unconfirmed {
        order_id: OrderId,
        #[source]
        source: StoreError,
    },
    #[error("the service is unavailable, retry shortly")]
    Unavailable(#[source] StoreError),
    /// A payment event for an order that still waits in its stream, not written yet:
    /// whether the event applies is decided once it is (the provider sends it again).
    /// Nothing is down, so it is told apart from [`ApiError::Unavailable`] in its message
    /// and logged as what it is.
    #[error("order {order_id} is not drained yet: send this event again")]
    NotDrainedYet { order_id: OrderId },
}

impl ApiError {
    /// Redis lost the sale of `voucher` and nothing repaired it yet: an order may still
    /// wait in its stream, so "not found" would be no truthful answer (`503`, ask again).
    pub fn sale_being_restored(voucher: VoucherId) -> ApiError {
        ApiError::unavailable(
            "redis",
            format!("the sale of voucher {voucher} is being restored; ask again shortly"),
        )
    }

    /// `503 unavailable`: `backend` cannot answer now; the caller may retry.
    pub fn unavailable(backend: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::Unavailable(StoreError::Unavailable {
            backend,
            detail: detail.into(),
        })
    }

    /// The status and the stable code of the contract.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
            }
            ApiError::NotStarted => (StatusCode::CONFLICT, "not_started"),
            ApiError::Ended => (StatusCode::CONFLICT, "ended"),
            ApiError::SoldOut => (StatusCode::CONFLICT, "sold_out"),
            ApiError::AlreadyPurchased { .. } => (StatusCode::CONFLICT, "already_purchased"),
            ApiError::OrderExpired => (StatusCode::CONFLICT, "order_expired"),
            ApiError::OrderCancelled => (StatusCode::CONFLICT, "order_cancelled"),
            ApiError::OrderPaid => (StatusCode::CONFLICT, "order_paid"),
            ApiError::OrderRejected => (StatusCode::CONFLICT, "order_rejected"),
            ApiError::AlreadyPaid => (StatusCode::CONFLICT, "already_paid"),
            ApiError::PaymentNotRequired => (StatusCode::CONFLICT, "payment_not_required"),
            ApiError::PaymentMismatch(_) => (StatusCode::UNPROCESSABLE_ENTITY, "payment_mismatch"),
            ApiError::PaymentReused(_) => (StatusCode::CONFLICT, "payment_reused"),
            ApiError::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::EntryRequired(_) => (StatusCode::FORBIDDEN, "entry_required"),
            ApiError::QueueNotOpen(_) => (StatusCode::CONFLICT, "queue_not_open"),
            ApiError::Unavailable(_)
            | ApiError::Unconfirmed { .. }
            | ApiError::NotDrainedYet { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
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

    /// The response, and for a 503 the one log event that names its cause: nothing else
    /// on the request path logs it (the request's own event in
    /// [`crate::routes::handle`] carries only the status and `code`).
    pub fn into_response(self) -> Response<Body> {
        let (status, code) = self.status_and_code();
        match &self {
            ApiError::Unavailable(source) => {
                tracing::error!(error = %source, "backend unavailable")
            }
            ApiError::Unconfirmed { source, .. } => {
                tracing::warn!(error = %source, "admission not confirmed")
            }
            ApiError::NotDrainedYet { order_id } => {
                tracing::info!(order_id = %order_id, "payment event before its order's drain: to be sent again")
            }
            _ => {}
        }
        // A struct, not a `json!` map: this is the body of every refusal of a sale.
        #[derive(serde::Serialize)]
        struct ErrorBody<'a> {
            code: &'a str,
            message: &'a str,
            /// `already_purchased`: the order the caller holds; `unavailable` after an
            /// unconfirmed durable admission: the order that may survive. Decimal string.
            #[serde(skip_serializing_if = "Option::is_none")]
            order_id: Option<String>,
        }
        let message = self.to_string();
        let order_id = match &self {
            ApiError::AlreadyPurchased { order_id } | ApiError::Unconfirmed { order_id, .. } => {
                Some(order_id.to_string())
            }
            _ => None,
        };
        let body = serde_json::to_string(&ErrorBody {
            code,
            message: &message,
            order_id,
        })
        .expect("strings serialise");
        let mut res = json_text_response(status, body);
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            res.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
        }
        res
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
        match err {
            StoreError::Unconfirmed { order_id, .. } => ApiError::Unconfirmed {
                order_id,
                source: err,
            },
            err => ApiError::Unavailable(err),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_exactly_the_codes_of_the_variants() {
        let down = || StoreError::Unavailable {
            backend: "redis",
            detail: String::new(),
        };
        let order_id = OrderId::new(1).unwrap();
        // One of each variant (the match below stops compiling when a variant is added).
        let all = [
            ApiError::InvalidRequest(String::new()),
            ApiError::Unauthorized(String::new()),
            ApiError::Forbidden(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::MethodNotAllowed {
                method: String::new(),
                allow: "GET",
            },
            ApiError::NotStarted,
            ApiError::Ended,
            ApiError::SoldOut,
            ApiError::AlreadyPurchased { order_id },
            ApiError::OrderExpired,
            ApiError::OrderCancelled,
            ApiError::OrderPaid,
            ApiError::OrderRejected,
            ApiError::AlreadyPaid,
            ApiError::PaymentNotRequired,
            ApiError::PaymentMismatch(String::new()),
            ApiError::PaymentReused(String::new()),
            ApiError::RateLimited,
            ApiError::Unconfirmed {
                order_id,
                source: down(),
            },
            ApiError::Unavailable(down()),
            ApiError::NotDrainedYet { order_id },
            ApiError::EntryRequired(String::new()),
            ApiError::QueueNotOpen(String::new()),
        ];
        for e in &all {
            match e {
                ApiError::InvalidRequest(_)
                | ApiError::Unauthorized(_)
                | ApiError::Forbidden(_)
                | ApiError::NotFound(_)
                | ApiError::MethodNotAllowed { .. }
                | ApiError::NotStarted
                | ApiError::Ended
                | ApiError::SoldOut
                | ApiError::AlreadyPurchased { .. }
                | ApiError::OrderExpired
                | ApiError::OrderCancelled
                | ApiError::OrderPaid
                | ApiError::OrderRejected
                | ApiError::AlreadyPaid
                | ApiError::PaymentNotRequired
                | ApiError::PaymentMismatch(_)
                | ApiError::PaymentReused(_)
                | ApiError::RateLimited
                | ApiError::Unconfirmed { .. }
                | ApiError::Unavailable(_)
                | ApiError::NotDrainedYet { .. }
                | ApiError::EntryRequired(_)
                | ApiError::QueueNotOpen(_) => {}
            }
        }
        let mut codes: Vec<&str> = all.iter().map(ApiError::code).collect();
        codes.dedup();
        assert_eq!(codes, CODES);
    }

    fn body(err: ApiError) -> (u16, serde_json::Value) {
        let res = err.into_response();
        let status = res.status().as_u16();
        (status, serde_json::from_slice(res.body().as_ref()).unwrap())
    }

    #[test]
    fn already_purchased_names_the_held_order_and_other_errors_do_not() {
        let order_id = OrderId::new(9_007_199_254_740_993).unwrap();
        let (status, b) = body(ApiError::AlreadyPurchased { order_id });
        assert_eq!(status, 409);
        assert_eq!(b["code"], "already_purchased");
        assert!(b["message"].as_str().is_some_and(|m| !m.is_empty()));
        // A decimal string: 2^53 + 1 would lose its last digit as a JSON number.
        assert_eq!(b["order_id"], "9007199254740993");
        let (status, b) = body(ApiError::SoldOut);
        assert_eq!(status, 409);
        assert_eq!(
            b.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["code", "message"]
        );
    }

    #[test]
    fn an_unconfirmed_admission_is_a_503_naming_the_order_and_other_outages_are_not() {
        let order_id = OrderId::new(42).unwrap();
        let (status, b) = body(ApiError::from(StoreError::Unconfirmed {
            order_id,
            detail: "0 of 1 replica(s) acknowledged within 100 ms".into(),
        }));
        assert_eq!(status, 503);
        assert_eq!(b["code"], "unavailable");
        assert_eq!(b["order_id"], "42");
        assert!(
            !b["message"].as_str().unwrap().contains("replica"),
            "the detail stays in the log"
        );
        let (status, b) = body(ApiError::from(StoreError::Unavailable {
            backend: "redis",
            detail: "connection refused".into(),
        }));
        assert_eq!(status, 503);
        assert!(b.get("order_id").is_none());
    }

    /// The events one closure logs, as `message error` texts (a minimal subscriber: the
    /// crate has no other use for tracing-subscriber).
    fn logged(f: impl FnOnce()) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        use tracing::field::{Field, Visit};
        use tracing::span::{Attributes, Id, Record};
        use tracing::{Event, Metadata};

        #[derive(Default)]
        struct Text(String);
        impl Visit for Text {
            fn record_debug(&mut self, _: &Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{value:?} "));
            }
        }
        struct Capture(Arc<Mutex<Vec<String>>>);
        impl tracing::Subscriber for Capture {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &Attributes<'_>) -> Id {
                Id::from_u64(1)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, event: &Event<'_>) {
                let mut text = Text::default();
                event.record(&mut text);
                self.0.lock().unwrap().push(text.0);
            }
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(Capture(events.clone()), f);
        // The subscriber is gone with `with_default`: this is the last handle.
        Arc::try_unwrap(events).unwrap().into_inner().unwrap()
    }

    #[test]
    fn a_503s_cause_is_logged_exactly_once() {
        let cause = || StoreError::Unavailable {
            backend: "redis",
            detail: "connection refused".into(),
        };
        let events = logged(|| {
            ApiError::from(cause()).into_response();
        });
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].contains("connection refused"), "{events:?}");
        let events = logged(|| {
            ApiError::from(StoreError::Unconfirmed {
                order_id: OrderId::new(42).unwrap(),
                detail: "0 of 1 replica(s)".into(),
            })
            .into_response();
        });
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].contains("0 of 1 replica(s)"), "{events:?}");
        // A refusal the caller caused logs nothing here (the request event says it all).
        assert!(logged(|| drop(ApiError::SoldOut.into_response())).is_empty());
    }
}

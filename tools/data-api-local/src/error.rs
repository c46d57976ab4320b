//! Every error the server answers with, and its wire form, in one place.
//!
//! The SDK picks the typed error variant from the `X-Amzn-Errortype` header (then the
//! body's `code`) and the text from the body's `message`, so each variant here carries
//! the exception name of the Data API model and the HTTP status AWS uses for it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed request, bad parameter, limit exceeded, wrong ARN.
    #[error("{0}")]
    BadRequest(String),
    /// The SQL failed in the database (syntax, duplicate key, CHECK constraint, ...):
    /// the message is MariaDB's own text.
    #[error("{message}")]
    Database { message: String, code: u16 },
    /// The statement ran longer than the statement timeout and was cancelled.
    #[error("{message}")]
    StatementTimeout {
        message: String,
        db_connection_id: u32,
    },
    #[error("{0}")]
    TransactionNotFound(String),
    /// A value the API cannot represent (e.g. BIGINT UNSIGNED above i64::MAX).
    #[error("{0}")]
    UnsupportedResult(String),
    /// MariaDB cannot be reached (refused, reset, gone away).
    #[error("{0}")]
    DatabaseUnavailable(String),
    /// A defect of this server, never caused by request data.
    #[error("{0}")]
    Internal(String),
    /// Not a local SDK client (a browser page, a rebound DNS name).
    #[error("{0}")]
    Forbidden(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    /// The exception name the SDK maps to its typed variant.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BadRequestException",
            ApiError::Database { .. } => "DatabaseErrorException",
            ApiError::StatementTimeout { .. } => "StatementTimeoutException",
            ApiError::TransactionNotFound(_) => "TransactionNotFoundException",
            ApiError::UnsupportedResult(_) => "UnsupportedResultException",
            ApiError::DatabaseUnavailable(_) => "DatabaseUnavailableException",
            ApiError::Internal(_) => "InternalServerErrorException",
            ApiError::Forbidden(_) => "ForbiddenException",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_)
            | ApiError::Database { .. }
            | ApiError::StatementTimeout { .. }
            | ApiError::UnsupportedResult(_) => StatusCode::BAD_REQUEST,
            ApiError::TransactionNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::DatabaseUnavailable(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }

    /// Whether this error, raised by a statement inside a transaction, ends that
    /// transaction. Real Aurora terminates a transaction when one of its calls fails in
    /// the database ("The transaction was terminated due to an error from a previous
    /// call"), so code that keeps using it after such an error must fail here too.
    /// Request validation errors happen before the database is touched and do not.
    pub fn aborts_transaction(&self) -> bool {
        matches!(
            self,
            ApiError::Database { .. }
                | ApiError::StatementTimeout { .. }
                | ApiError::DatabaseUnavailable(_)
                | ApiError::Internal(_)
        )
    }
}

/// Maps a driver error: server-side errors become `DatabaseErrorException` with the
/// server's message; a broken connection becomes `DatabaseUnavailableException`.
impl From<mysql_async::Error> for ApiError {
    fn from(err: mysql_async::Error) -> Self {
        match err {
            mysql_async::Error::Server(server) => ApiError::Database {
                message: server.message,
                code: server.code,
            },
            mysql_async::Error::Io(io) => {
                ApiError::DatabaseUnavailable(format!("Communications link failure: {io}"))
            }
            mysql_async::Error::Driver(driver) => match driver {
                // The count of `?` MariaDB sees differs from the parameters we bound:
                // the caller's SQL confused the placeholder scan.
                mysql_async::DriverError::StmtParamsMismatch { .. } => {
                    ApiError::BadRequest(format!("Parameter count mismatch: {driver}"))
                }
                other => ApiError::DatabaseUnavailable(format!("Database driver error: {other}")),
            },
            mysql_async::Error::Url(url) => ApiError::Internal(format!("Bad MySQL URL: {url}")),
            mysql_async::Error::Other(other) => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code();
        let mut body = serde_json::json!({ "message": self.to_string(), "code": code });
        // Only StatementTimeoutException models a connection id.
        if let ApiError::StatementTimeout {
            db_connection_id, ..
        } = &self
        {
            body["dbConnectionId"] = (*db_connection_id).into();
        }
        let headers = [
            ("content-type", "application/json"),
            ("x-amzn-errortype", code),
        ];
        (self.status(), headers, body.to_string()).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_keep_the_mariadb_text() {
        let err = ApiError::from(mysql_async::Error::Server(mysql_async::ServerError {
            code: 1062,
            message: "Duplicate entry 'x' for key 'PRIMARY'".into(),
            state: "23000".into(),
        }));
        assert_eq!(err.code(), "DatabaseErrorException");
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(err.to_string(), "Duplicate entry 'x' for key 'PRIMARY'");
        assert!(err.aborts_transaction());
        assert!(!ApiError::bad_request("x").aborts_transaction());
    }
}

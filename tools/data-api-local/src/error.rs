//! Every error the server answers with, and its wire form, in one place.
//!
//! The SDK picks the typed error variant from the `X-Amzn-Errortype` header (then the
//! body's `code`) and the text from the body's `message`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
#[error("{}", self.wire().2)]
pub enum ApiError {
    /// Malformed request, bad parameter, limit exceeded, wrong ARN.
    BadRequest(String),
    /// The SQL failed in MariaDB (with its own text) with this error code.
    Database(String, u16),
    /// The statement on this connection ran past the statement timeout.
    StatementTimeout(String, u32),
    TransactionNotFound(String),
    /// A value the API cannot represent (e.g. BIGINT UNSIGNED above i64::MAX).
    UnsupportedResult(String),
    /// MariaDB cannot be reached (refused, reset, gone away).
    DatabaseUnavailable(String),
    /// A defect of this server, never caused by request data.
    Internal(String),
    /// Not a local SDK client (a browser page, a rebound DNS name).
    Forbidden(String),
    /// The service gave no answer in time (only as a test asks: the statement ran).
    ServiceUnavailable(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    /// The exception name the SDK maps to its typed variant, AWS's HTTP status for it,
    /// and the message.
    pub fn wire(&self) -> (&'static str, StatusCode, &str) {
        use ApiError::*;
        match self {
            BadRequest(m) => ("BadRequestException", StatusCode::BAD_REQUEST, m),
            Database(m, _) => ("DatabaseErrorException", StatusCode::BAD_REQUEST, m),
            StatementTimeout(m, _) => ("StatementTimeoutException", StatusCode::BAD_REQUEST, m),
            TransactionNotFound(m) => ("TransactionNotFoundException", StatusCode::NOT_FOUND, m),
            UnsupportedResult(m) => ("UnsupportedResultException", StatusCode::BAD_REQUEST, m),
            DatabaseUnavailable(m) => (
                "DatabaseUnavailableException",
                StatusCode::GATEWAY_TIMEOUT,
                m,
            ),
            Internal(m) => (
                "InternalServerErrorException",
                StatusCode::INTERNAL_SERVER_ERROR,
                m,
            ),
            Forbidden(m) => ("ForbiddenException", StatusCode::FORBIDDEN, m),
            ServiceUnavailable(m) => (
                "ServiceUnavailableError",
                StatusCode::SERVICE_UNAVAILABLE,
                m,
            ),
        }
    }

    /// Whether this error, raised by a statement inside a transaction, ends that
    /// transaction. Real Aurora terminates a transaction when one of its calls fails in
    /// the database ("The transaction was terminated due to an error from a previous
    /// call"), so code that keeps using it after such an error must fail here too.
    /// Request validation errors happen before the database is touched and do not.
    pub fn aborts_transaction(&self) -> bool {
        use ApiError::*;
        matches!(
            self,
            Database(..) | StatementTimeout(..) | DatabaseUnavailable(_) | Internal(_)
        )
    }
}

/// Maps a driver error: server-side errors become `DatabaseErrorException` with the
/// server's message; a broken connection becomes `DatabaseUnavailableException`.
impl From<mysql_async::Error> for ApiError {
    fn from(err: mysql_async::Error) -> Self {
        match err {
            mysql_async::Error::Server(server) => ApiError::Database(server.message, server.code),
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
        let (code, status, message) = self.wire();
        let mut body = serde_json::json!({ "message": message, "code": code });
        // Only StatementTimeoutException models a connection id.
        if let ApiError::StatementTimeout(_, id) = self {
            body["dbConnectionId"] = id.into();
        }
        let headers = [
            ("content-type", "application/json"),
            ("x-amzn-errortype", code),
        ];
        (status, headers, body.to_string()).into_response()
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
        assert_eq!(
            err.wire(),
            (
                "DatabaseErrorException",
                StatusCode::BAD_REQUEST,
                "Duplicate entry 'x' for key 'PRIMARY'"
            )
        );
        assert_eq!(err.to_string(), "Duplicate entry 'x' for key 'PRIMARY'");
        assert!(err.aborts_transaction());
        assert!(!ApiError::bad_request("x").aborts_transaction());
    }
}

//! The Data API's size limits, which the server enforces as Aurora does: on the request
//! body, on the response, and on the SQL text.

/// Data API request limit (headers and JSON included; we count the body).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Data API response limit.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Data API SQL text limit, in characters.
pub const MAX_SQL_CHARS: usize = 65_536;

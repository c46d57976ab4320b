//! `GET /app/{file}` (anyone): the reference buyer page and the operators' live view,
//! served by the function itself so that they share the API's origin (no CORS needed;
//! a deployment that hosts them elsewhere sets the template's `PageOrigin`).
//!
//! The files are compiled in (`web/`): a page is what this build's API answers, never
//! a copy that drifted. Each answer carries a content security policy that lets the page
//! load only its own script and style and talk only to its own origin, so a script
//! injected through a voucher's title (shown as text, never as HTML) could not run or
//! send a token anywhere.

use http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Response};

use crate::error::ApiError;

/// The pages and their files: name, content type, text.
pub const FILES: &[(&str, &str, &str)] = &[
    (
        "sale.html",
        "text/html; charset=utf-8",
        include_str!("../web/sale.html"),
    ),
    (
        "ops.html",
        "text/html; charset=utf-8",
        include_str!("../web/ops.html"),
    ),
    (
        "client.js",
        "text/javascript; charset=utf-8",
        include_str!("../web/client.js"),
    ),
    (
        "sale.js",
        "text/javascript; charset=utf-8",
        include_str!("../web/sale.js"),
    ),
    (
        "ops.js",
        "text/javascript; charset=utf-8",
        include_str!("../web/ops.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../web/style.css"),
    ),
];

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

/// The file `name`: `400` for a name no file could have, `404` for one we do not serve.
pub(crate) fn page(name: &str) -> Result<Response<Body>, ApiError> {
    let plausible = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    if !plausible {
        return Err(ApiError::InvalidRequest(
            "a page's name is letters, digits, '.', '-' or '_' (at most 64)".into(),
        ));
    }
    let Some((_, content_type, text)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return Err(ApiError::NotFound(format!("no page {name:?}")));
    };
    let mut res = Response::new(Body::from(*text));
    *res.status_mut() = StatusCode::OK;
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Short: a new deployment's pages reach buyers within a minute.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=60"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Ok(res)
}

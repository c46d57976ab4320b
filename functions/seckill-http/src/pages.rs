//! `GET /app/{file}` (anyone): the reference buyer page and the operators' live view,
//! served by the function itself so that they share the API's origin (no CORS needed;
//! a deployment that hosts them elsewhere sets the template's `PageOrigin`).
//!
//! The files are compiled in (`web/`): a page is what this build's API answers, never
//! a copy that drifted. Each answer carries a content security policy that lets the page
//! load only its own script and style and talk only to its own origin, so a script
//! injected through a voucher's title (shown as text, never as HTML) could not run or
//! send a token anywhere. Where the buyer page pays with Stripe.js, the policy names
//! Stripe's origins too (its script, its card frames, its API), and nothing else.

use http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Response};

use crate::config::origin_of;
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

/// The pages' content security policy, made once per instance from the configuration.
#[derive(Debug, Clone)]
pub struct Policy(HeaderValue);

/// Where Stripe.js confirms card payments, besides the script's own origin: 3-D Secure
/// frames (Stripe's published policy for Stripe.js).
const STRIPE_HOOKS: &str = "https://hooks.stripe.com";

impl Policy {
    /// Only the page's own origin; with `stripe` (Stripe.js's URL, Stripe's API base),
    /// also the script's origin for scripts and frames and both origins for requests.
    pub fn new(stripe: Option<(&str, &str)>) -> Policy {
        let (mut script, mut frame, mut connect) = (
            "'self'".to_string(),
            "'none'".to_string(),
            "'self'".to_string(),
        );
        if let Some((js_url, api_base)) = stripe {
            let js = origin_of(js_url).unwrap_or("");
            let api = origin_of(api_base).unwrap_or("");
            script = format!("'self' {js}");
            frame = format!("{js} {STRIPE_HOOKS}");
            connect = if api == js {
                format!("'self' {js}")
            } else {
                format!("'self' {js} {api}")
            };
        }
        let text = format!(
            "default-src 'none'; script-src {script}; style-src 'self'; connect-src {connect}; \
             frame-src {frame}; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        );
        // Origins are checked to be plain (origin_of), so the text is a valid header.
        Policy(HeaderValue::from_str(&text).expect("a policy of plain origins"))
    }

    /// The policy's text.
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

/// The file `name`: `400` for a name no file could have, `404` for one we do not serve.
pub(crate) fn page(name: &str, policy: &Policy) -> Result<Response<Body>, ApiError> {
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
    h.insert(header::CONTENT_SECURITY_POLICY, policy.0.clone());
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

#[cfg(test)]
mod tests {
    use super::Policy;

    #[test]
    fn stripe_s_origins_join_the_policy_only_when_the_page_pays_there() {
        let plain = Policy::new(None);
        assert!(
            plain.as_str().contains("script-src 'self';"),
            "{}",
            plain.as_str()
        );
        assert!(plain.as_str().contains("frame-src 'none';"));
        assert!(!plain.as_str().contains("stripe"));
        let live = Policy::new(Some((
            "https://js.stripe.com/v3/",
            "https://api.stripe.com",
        )));
        for want in [
            "script-src 'self' https://js.stripe.com;",
            "frame-src https://js.stripe.com https://hooks.stripe.com;",
            "connect-src 'self' https://js.stripe.com https://api.stripe.com;",
            "default-src 'none';",
            "style-src 'self';",
        ] {
            assert!(live.as_str().contains(want), "{want}: {}", live.as_str());
        }
    }
}

//! The edge in front of the API: a CloudFront distribution with a WAF web ACL
//! (template.yaml, `Edge=Enabled`; docs/deploy.md, "The edge"). The distribution caches
//! the anonymous reads for a second, and WAF's per-address rules stop a flooding client
//! before it costs anything here. Two promises are the function's own:
//!
//! - **Only through the edge.** An HTTP API cannot be made private to one distribution,
//!   so the distribution adds a secret header ([`EDGE_HEADER`]) to every request it
//!   passes on, and an instance configured with that secret (`EDGE_ORIGIN_SECRET_ARN`,
//!   or `EDGE_ORIGIN_SECRET` locally) refuses any request without it: `403 forbidden`,
//!   before anything else is read. Whoever finds the API's own URL gains nothing by
//!   going around the web ACL. A rotation is `new,old` in the secret, then the
//!   distribution's header, then `new`.
//! - **A client is the viewer, not the edge server.** Behind the distribution the
//!   API's source address is one of CloudFront's, shared by everyone that edge
//!   location serves, so the per-address limit of the anonymous read would throttle
//!   whole cities together. The viewer's own address, as CloudFront saw it, comes in
//!   [`VIEWER_HEADER`] (`ip:port`), set by CloudFront itself and only on requests that
//!   passed the origin check above.
//!
//! Without the secret configured (the local stack, a deployment without the edge) both
//! are off: every request is served, and the source is API Gateway's.

use lambda_http::Request;

use crate::app::App;
use crate::error::ApiError;
use crate::limiter::Source;
use crate::request::gateway_source_ip;

/// The header the distribution adds with the origin secret.
pub const EDGE_HEADER: &str = "x-seckill-edge";

/// CloudFront's header naming the viewer's address and port (`203.0.113.7:50312`,
/// `2001:db8::1:50312`).
pub const VIEWER_HEADER: &str = "cloudfront-viewer-address";

/// Whether the request may be served: always without an origin secret configured,
/// otherwise only when it carries one of the held secrets in [`EDGE_HEADER`].
pub(crate) async fn check(app: &App, req: &Request) -> Result<(), ApiError> {
    let Some(held) = &app.edge else {
        return Ok(());
    };
    // During a rotation the distribution sends the whole secret, `new,old`: its first
    // part is the one it stands for.
    let sent = req
        .headers()
        .get(EDGE_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let sent = sent.split(|b| *b == b',').next().unwrap_or_default();
    let secrets = held.get().await?;
    if secrets.all().iter().any(|s| same(s, sent)) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "this API is served through the shop's own address only".into(),
        ))
    }
}

/// The client an anonymous request counts against: the viewer CloudFront saw when the
/// edge is in front (and said so), otherwise the address API Gateway saw.
pub(crate) fn source_of(app: &App, req: &Request) -> Source {
    let viewer = app
        .edge
        .as_ref()
        .and_then(|_| req.headers().get(VIEWER_HEADER))
        .and_then(|v| v.to_str().ok())
        .and_then(viewer_ip);
    match viewer {
        Some(ip) => Source::of(Some(ip)),
        None => Source::of(gateway_source_ip(req)),
    }
}

/// The address of `ip:port` as CloudFront writes it (IPv6 without brackets: the last
/// colon is the port's).
fn viewer_ip(value: &str) -> Option<&str> {
    let (ip, port) = value.trim().rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<std::net::IpAddr>().ok().map(|_| ip)
}

/// Constant-time equality: how long a refusal takes says nothing of how much of the
/// secret a guess got right.
fn same(secret: &[u8], sent: &[u8]) -> bool {
    secret.len() == sent.len() && secret.iter().zip(sent).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_viewer_address_is_read_as_cloudfront_writes_it() {
        assert_eq!(viewer_ip("203.0.113.7:50312"), Some("203.0.113.7"));
        assert_eq!(viewer_ip("2001:db8::1:443"), Some("2001:db8::1"));
        assert_eq!(viewer_ip("[2001:db8::1]:443"), Some("2001:db8::1"));
        for bad in ["203.0.113.7", "nonsense:12", "203.0.113.7:x", ""] {
            assert_eq!(viewer_ip(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_whole_secret_matches() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!same(b"0123456789abcdef", b""));
    }
}

//! What the handlers read from a request besides its route: the largest body accepted
//! and the address API Gateway saw it come from.

use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};

use crate::error::ApiError;

/// The largest request body accepted (a voucher is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The request's body, refused (`400`) when larger than [`MAX_BODY_BYTES`], before
/// anything parses it.
pub(crate) fn body_of(req: &Request) -> Result<&[u8], ApiError> {
    let body = req.body().as_ref();
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "body is larger than {MAX_BODY_BYTES} bytes"
        )));
    }
    Ok(body)
}

/// The address API Gateway saw the request come from (behind the edge, CloudFront's:
/// [`crate::edge::source_of`] is the client's).
pub(crate) fn gateway_source_ip(req: &Request) -> Option<&str> {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.http.source_ip.as_deref(),
        _ => None,
    }
}

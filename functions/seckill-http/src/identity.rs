//! Who is calling (invariant 5): only from a verified token, never from the body.
//!
//! In AWS the API Gateway JWT authorizer has verified the token and passes its claims in
//! `requestContext.authorizer.jwt.claims`; those are trusted and nothing else. Without
//! them, and only when a dev secret is configured, the `Authorization: Bearer` token is
//! verified here (HS256, signature and `exp`). Otherwise the caller is unauthorized.

use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};
use seckill_shared::auth::{self, AuthError, Identity};

use crate::error::ApiError;

/// The verified caller of `req`.
pub fn identify(
    req: &Request,
    dev_secret: Option<&[u8]>,
    now_secs: i64,
) -> Result<Identity, ApiError> {
    if let Some(RequestContext::ApiGatewayV2(ctx)) = req.request_context_ref()
        && let Some(jwt) = ctx.authorizer.as_ref().and_then(|a| a.jwt.as_ref())
    {
        let claim = |k: &str| jwt.claims.get(k).map(String::as_str);
        return Identity::from_claims(claim("sub"), claim("scope")).map_err(unauthorized);
    }
    let Some(secret) = dev_secret else {
        return Err(unauthorized(AuthError::Missing));
    };
    let token = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(|| unauthorized(AuthError::Missing))?;
    auth::verify_hs256(token, secret, now_secs).map_err(unauthorized)
}

/// The caller, who must be an admin.
pub fn require_admin(identity: &Identity) -> Result<(), ApiError> {
    if identity.admin {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "the {} scope is required",
            auth::ADMIN_SCOPE
        )))
    }
}

fn unauthorized(err: AuthError) -> ApiError {
    ApiError::Unauthorized(err.to_string())
}

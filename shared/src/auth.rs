//! Identity (invariant 5): who is calling comes only from a verified token.
//!
//! In AWS, API Gateway's JWT authorizer verifies the token and the function reads the
//! claims it passes in the request context. Locally, and only when
//! `SECKILL_DEV_JWT_SECRET` is set, the function verifies HS256 tokens itself with
//! [`verify_hs256`]. The user id is the `sub` claim; admins carry `seckill/admin` in the
//! space-separated `scope` claim.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use crate::domain::UserId;

/// The scope that allows creating vouchers.
pub const ADMIN_SCOPE: &str = "seckill/admin";

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: UserId,
    pub admin: bool,
}

impl Identity {
    /// Builds an identity from verified claims.
    pub fn from_claims(sub: Option<&str>, scope: Option<&str>) -> Result<Identity, AuthError> {
        let sub = sub.ok_or(AuthError::Invalid("token has no sub claim"))?;
        // `alice` and `alice ` would be two buyers that look like one person in every log,
        // report and support ticket: a padded sub is refused. (The database compares user
        // ids byte for byte since migration 0003.) Control characters are refused by
        // `UserId::parse`.
        if sub.trim() != sub {
            return Err(AuthError::Invalid(
                "token sub claim has leading or trailing whitespace",
            ));
        }
        let user = UserId::parse(sub)
            .map_err(|_| AuthError::Invalid("token sub claim is not a valid user id"))?;
        let admin = scope.is_some_and(|s| s.split(' ').any(|s| s == ADMIN_SCOPE));
        Ok(Identity { user, admin })
    }
}

/// Why a caller is not identified. Messages never echo the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token")]
    Missing,
    #[error("{0}")]
    Invalid(&'static str),
    #[error("token has expired")]
    Expired,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    scope: Option<String>,
    exp: Option<i64>,
    nbf: Option<i64>,
}

/// Verifies an HS256 JWT (signature, `exp` required, `nbf` if present) and returns the
/// caller. `now` is Unix seconds.
pub fn verify_hs256(token: &str, secret: &[u8], now: i64) -> Result<Identity, AuthError> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Invalid("token is not a JWT"));
    };
    let header: Header = decode_json(h)?;
    // Only HS256: refusing everything else closes the `alg: none` and key-confusion doors.
    if header.alg != "HS256" {
        return Err(AuthError::Invalid("token algorithm must be HS256"));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| AuthError::Invalid("token signature is not base64url"))?;
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret).map_err(|_| AuthError::Invalid("bad secret"))?;
    mac.update(h.as_bytes());
    mac.update(b".");
    mac.update(p.as_bytes());
    // verify_slice compares in constant time.
    mac.verify_slice(&sig)
        .map_err(|_| AuthError::Invalid("token signature does not verify"))?;
    let claims: Claims = decode_json(p)?;
    let exp = claims
        .exp
        .ok_or(AuthError::Invalid("token has no exp claim"))?;
    if now >= exp {
        return Err(AuthError::Expired);
    }
    if claims.nbf.is_some_and(|nbf| now < nbf) {
        return Err(AuthError::Invalid("token is not valid yet"));
    }
    Identity::from_claims(claims.sub.as_deref(), claims.scope.as_deref())
}

fn decode_json<T: for<'de> Deserialize<'de>>(segment: &str) -> Result<T, AuthError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(segment)
        .map_err(|_| AuthError::Invalid("token segment is not base64url"))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| AuthError::Invalid("token segment is not valid JSON"))
}

/// Signs an HS256 token for local development and tests.
pub fn mint_hs256(secret: &[u8], sub: &str, scope: Option<&str>, exp: i64) -> String {
    let mut claims = serde_json::json!({ "sub": sub, "exp": exp });
    if let Some(scope) = scope {
        claims["scope"] = serde_json::Value::from(scope);
    }
    sign_hs256(secret, &claims)
}

/// Signs any claims object with HS256 (tests use it to build malformed tokens).
pub fn sign_hs256(secret: &[u8], claims: &serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
    mac.update(header.as_bytes());
    mac.update(b".");
    mac.update(payload.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{header}.{payload}.{sig}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"test-secret";

    #[test]
    fn a_sub_with_surrounding_whitespace_or_control_characters_is_refused() {
        for sub in [
            "alice ",
            " alice",
            "alice\t",
            "\u{a0}alice",
            "al\u{7}ice",
            "al\nice",
        ] {
            let t = mint_hs256(SECRET, sub, None, 2_000);
            assert!(
                matches!(verify_hs256(&t, SECRET, 1_000), Err(AuthError::Invalid(_))),
                "{sub:?}"
            );
        }
        assert!(verify_hs256(&mint_hs256(SECRET, "al ice", None, 2_000), SECRET, 1_000).is_ok());
    }

    #[test]
    fn a_minted_token_verifies() {
        let t = mint_hs256(SECRET, "alice", Some("openid seckill/admin"), 2_000);
        let id = verify_hs256(&t, SECRET, 1_000).unwrap();
        assert_eq!(id.user.as_str(), "alice");
        assert!(id.admin);
        let t = mint_hs256(SECRET, "bob", Some("seckill/adminx"), 2_000);
        assert!(!verify_hs256(&t, SECRET, 1_000).unwrap().admin);
    }

    #[test]
    fn bad_tokens_are_refused() {
        let t = mint_hs256(SECRET, "alice", None, 2_000);
        assert_eq!(verify_hs256(&t, SECRET, 2_000), Err(AuthError::Expired));
        assert!(verify_hs256(&t, b"other", 1_000).is_err());
        assert!(verify_hs256("a.b", SECRET, 1_000).is_err());
        // Tampered payload, original signature.
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(br#"{"sub":"mallory","exp":9999999999}"#);
        parts[1] = &forged;
        assert!(verify_hs256(&parts.join("."), SECRET, 1_000).is_err());
        // alg none.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(br#"{"sub":"mallory","exp":9999999999}"#)
        );
        assert!(verify_hs256(&none, SECRET, 1_000).is_err());
        // No exp.
        let no_exp = sign_hs256(SECRET, &serde_json::json!({ "sub": "alice" }));
        assert_eq!(
            verify_hs256(&no_exp, SECRET, 10),
            Err(AuthError::Invalid("token has no exp claim"))
        );
        let not_yet = sign_hs256(
            SECRET,
            &serde_json::json!({ "sub": "alice", "exp": 2_000, "nbf": 1_500 }),
        );
        assert!(verify_hs256(&not_yet, SECRET, 1_000).is_err());
        assert!(verify_hs256(&not_yet, SECRET, 1_600).is_ok());
        // Over-long sub.
        let long = mint_hs256(SECRET, &"x".repeat(65), None, 2_000);
        assert!(verify_hs256(&long, SECRET, 1_000).is_err());
    }
}

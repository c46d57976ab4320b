//! Entry tokens: the waiting room's proof that a buyer's turn came.
//!
//! `e1.<voucher>.<expires ms>.<mac>`, where `mac` is the unpadded base64url
//! HMAC-SHA256, under the function's entry secret, of `e1.<voucher>.<sub>.<expires ms>`.
//! The token names the voucher and binds the buyer (`sub`) without carrying them: a token
//! handed to another account, or used on another voucher, does not verify. It is not a
//! JWT: there is no algorithm field to choose, so nothing like `alg: none` exists.
//!
//! Verification compares in constant time and accepts the current secret and, during a
//! rotation, the previous one.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{UnixMillis, UserId, VoucherId};

/// The version prefix: a later format gets another.
const PREFIX: &str = "e1";

/// The longest token accepted; anything longer is refused unread.
pub const MAX_TOKEN_LEN: usize = 128;

/// Why a token was refused (the caller is told only that entry is required).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryRefused {
    #[error("no entry token")]
    Missing,
    #[error("the entry token is malformed")]
    Malformed,
    #[error("the entry token is for another voucher")]
    OtherVoucher,
    #[error("the entry token has expired")]
    Expired,
    #[error("the entry token's signature does not match")]
    BadSignature,
}

fn mac(secret: &[u8], voucher: VoucherId, user: &UserId, expires: UnixMillis) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
    mac.update(format!("{PREFIX}.{voucher}.").as_bytes());
    mac.update(user.as_str().as_bytes());
    mac.update(format!(".{expires}").as_bytes());
    mac
}

/// A token letting `user` buy `voucher` until `expires`.
pub fn issue(secret: &[u8], voucher: VoucherId, user: &UserId, expires: UnixMillis) -> String {
    let sig = mac(secret, voucher, user, expires).finalize().into_bytes();
    format!(
        "{PREFIX}.{voucher}.{expires}.{}",
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// Checks `token` for `user` buying `voucher` at `now` against each of `secrets`.
pub fn verify(
    secrets: &[Vec<u8>],
    token: Option<&str>,
    voucher: VoucherId,
    user: &UserId,
    now: UnixMillis,
) -> Result<(), EntryRefused> {
    let token = token.ok_or(EntryRefused::Missing)?.trim();
    if token.is_empty() {
        return Err(EntryRefused::Missing);
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(EntryRefused::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(PREFIX), Some(v), Some(expires), Some(sig), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(EntryRefused::Malformed);
    };
    let v: VoucherId = v.parse().map_err(|_| EntryRefused::Malformed)?;
    let expires: UnixMillis = expires
        .parse()
        .ok()
        .filter(|e: &i64| e.to_string() == expires)
        .ok_or(EntryRefused::Malformed)?;
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| EntryRefused::Malformed)?;
    if v != voucher {
        return Err(EntryRefused::OtherVoucher);
    }
    let signed = secrets
        .iter()
        .any(|s| mac(s, voucher, user, expires).verify_slice(&sig).is_ok());
    if !signed {
        return Err(EntryRefused::BadSignature);
    }
    if now >= expires {
        return Err(EntryRefused::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    fn v(n: i64) -> VoucherId {
        VoucherId::new(n).unwrap()
    }

    const KEY: &[u8] = b"current-secret";

    #[test]
    fn a_token_verifies_for_its_buyer_and_voucher_until_it_expires() {
        let t = issue(KEY, v(7), &user("alice"), 10_000);
        let keys = vec![KEY.to_vec()];
        assert_eq!(verify(&keys, Some(&t), v(7), &user("alice"), 9_999), Ok(()));
        assert_eq!(
            verify(&keys, Some(&t), v(7), &user("alice"), 10_000),
            Err(EntryRefused::Expired)
        );
        assert_eq!(
            verify(&keys, Some(&t), v(7), &user("bob"), 0),
            Err(EntryRefused::BadSignature)
        );
        assert_eq!(
            verify(&keys, Some(&t), v(8), &user("alice"), 0),
            Err(EntryRefused::OtherVoucher)
        );
        // The previous secret still verifies during a rotation; an unknown one does not.
        let rotated = vec![b"next".to_vec(), KEY.to_vec()];
        assert_eq!(verify(&rotated, Some(&t), v(7), &user("alice"), 0), Ok(()));
        let other = vec![b"next".to_vec()];
        assert_eq!(
            verify(&other, Some(&t), v(7), &user("alice"), 0),
            Err(EntryRefused::BadSignature)
        );
    }

    #[test]
    fn forged_and_malformed_tokens_are_refused() {
        let keys = vec![KEY.to_vec()];
        let alice = user("alice");
        let t = issue(KEY, v(7), &alice, 10_000);
        // A later expiry under the same signature.
        let stretched = t.replacen(".10000.", ".99999.", 1);
        assert_eq!(
            verify(&keys, Some(&stretched), v(7), &alice, 0),
            Err(EntryRefused::BadSignature)
        );
        // "10000" and "010000" are one number but not one signed text.
        let padded = t.replacen(".10000.", ".010000.", 1);
        assert_eq!(
            verify(&keys, Some(&padded), v(7), &alice, 0),
            Err(EntryRefused::Malformed)
        );
        let jwt_none = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.";
        for bad in [
            "",
            "e1",
            "e1.7.10000",
            "e2.7.10000.AAAA",
            "e1.x.10000.AAAA",
            "e1.7.-1.AAAA",
            "e1.7.10000.!!!",
            "e1.7.10000.AAAA.extra",
            jwt_none,
        ] {
            assert!(
                verify(&keys, Some(bad), v(7), &alice, 0).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            verify(&keys, None, v(7), &alice, 0),
            Err(EntryRefused::Missing)
        );
        let long = format!("{t}{}", "A".repeat(MAX_TOKEN_LEN));
        assert_eq!(
            verify(&keys, Some(&long), v(7), &alice, 0),
            Err(EntryRefused::Malformed)
        );
    }

    /// User ids may hold dots, and the signed text joins fields with dots: still one
    /// text for one (voucher, buyer, expiry), because the expiry, last, has none. A
    /// token of `x.1` lends nothing to `x`, however its expiry field is rewritten.
    #[test]
    fn a_token_of_a_dotted_user_id_verifies_for_no_other_id() {
        let keys = vec![KEY.to_vec()];
        let t = issue(KEY, v(7), &user("x.1"), 5_000);
        assert_eq!(verify(&keys, Some(&t), v(7), &user("x.1"), 0), Ok(()));
        let sig = t.rsplit('.').next().unwrap();
        // Well formed, for the shorter id: the signature does not match.
        for expires in ["5000", "15000", "1"] {
            let lent = format!("e1.7.{expires}.{sig}");
            assert_eq!(
                verify(&keys, Some(&lent), v(7), &user("x"), 0),
                Err(EntryRefused::BadSignature),
                "{lent}"
            );
        }
        // The rest of the id moved into the expiry field: not a token at all.
        for expires in ["1.5000", "000"] {
            let lent = format!("e1.7.{expires}.{sig}");
            assert_eq!(
                verify(&keys, Some(&lent), v(7), &user("x"), 0),
                Err(EntryRefused::Malformed),
                "{lent}"
            );
        }
    }
}

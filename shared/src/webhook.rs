//! The payment provider's webhooks: how an event is signed and checked, and what it says.
//!
//! An order of a voucher with a payment step is paid only when the payment provider says
//! so, in an event it sends to `POST /payments/webhook`. Nothing else authenticates that
//! route, so everything rests on the signature, modelled on the scheme the large
//! providers publish (Stripe's `Stripe-Signature`):
//!
//! - the header [`SIGNATURE_HEADER`] is `t=<unix seconds>,v1=<hex>[,v1=<hex>...]`;
//! - each `v1` is HMAC-SHA256, keyed with a shared secret, over `"<t>.<raw body>"`: the
//!   bytes as received, before any parsing, so a body changed after signing fails;
//! - a timestamp further than [`TOLERANCE_S`] from the server's clock is refused (a
//!   captured event cannot be replayed later), whatever its signature;
//! - the receiver holds one or two secrets (the current one and, during a rotation, the
//!   previous one) and accepts a `v1` made with either; the sender signs with every
//!   secret it holds during its own rotation, hence several `v1`;
//! - signatures are compared in constant time (`Mac::verify_slice`).
//!
//! The signature proves who sent an event, not that it is new: the provider delivers
//! at least once, late and out of order, and the receiver makes an event's effect
//! happen once (the payment id is unique in the database, the close is decided once in
//! Redis).

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "seckill-signature";

/// How far an event's timestamp may be from the receiver's clock, either way (Stripe's
/// default: five minutes).
pub const TOLERANCE_S: i64 = 300;

/// At most this many secrets are accepted at once: the current and the previous one.
pub const MAX_SECRETS: usize = 2;

/// Why an event's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no {SIGNATURE_HEADER} header")]
    Missing,
    #[error("{SIGNATURE_HEADER} is not `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error("the signature's timestamp is {0} s away from now (more than {TOLERANCE_S} s)")]
    OutsideTolerance(i64),
    #[error("no signature matches the body")]
    Mismatch,
}

/// The secrets a receiver accepts, current first: one, or two during a rotation. Read
/// from a comma-separated list (a Secrets Manager secret string, or `.dev/` locally).
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets(Vec<Vec<u8>>);

impl std::fmt::Debug for Secrets {
    // Never print a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} held)", self.0.len())
    }
}

impl Secrets {
    /// Parses `current[,previous]`: each at least 16 bytes, at most [`MAX_SECRETS`].
    pub fn parse(list: &str) -> Result<Secrets, String> {
        let secrets: Vec<Vec<u8>> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.as_bytes().to_vec())
            .collect();
        if secrets.is_empty() || secrets.len() > MAX_SECRETS {
            return Err(format!(
                "expected 1 to {MAX_SECRETS} comma-separated secrets, found {}",
                secrets.len()
            ));
        }
        if secrets.iter().any(|s| s.len() < 16) {
            return Err("each secret must be at least 16 bytes".into());
        }
        Ok(Secrets(secrets))
    }

    /// The current secret (the one a sender signs with).
    pub fn current(&self) -> &[u8] {
        &self.0[0]
    }

    /// Every secret held, current first (a receiver accepts each).
    pub fn all(&self) -> &[Vec<u8>] {
        &self.0
    }
}

/// The `v1` signature of `body` sent at `timestamp` (unix seconds), as lowercase hex.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    hex(&mac(secret, timestamp, body).finalize().into_bytes())
}

/// The header value a sender holding `secrets` sends with `body` at `timestamp`: one
/// `v1` per secret.
pub fn header(secrets: &[&[u8]], timestamp: i64, body: &[u8]) -> String {
    let mut out = format!("t={timestamp}");
    for secret in secrets {
        out.push_str(",v1=");
        out.push_str(&sign(secret, timestamp, body));
    }
    out
}

/// Checks `header` (the [`SIGNATURE_HEADER`] value, if any) against the raw `body` at
/// `now` (unix seconds): the timestamp within [`TOLERANCE_S`], and some `v1` made with
/// one of `secrets`. Returns the signed timestamp.
pub fn verify(
    secrets: &Secrets,
    header: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<i64, SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) if timestamp.is_none() => {
                timestamp = Some(t.parse::<i64>().map_err(|_| SignatureError::Malformed)?)
            }
            Some(("v1", sig)) => signatures.push(unhex(sig).ok_or(SignatureError::Malformed)?),
            // Other schemes (a future v2) are not ours to judge.
            Some((_, _)) => {}
            None => return Err(SignatureError::Malformed),
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Malformed);
    }
    let skew = now.saturating_sub(timestamp);
    if skew.abs() > TOLERANCE_S {
        return Err(SignatureError::OutsideTolerance(skew));
    }
    for secret in &secrets.0 {
        for signature in &signatures {
            // Constant time: how much of a guess matched is not told by the time taken.
            if mac(secret, timestamp, body).verify_slice(signature).is_ok() {
                return Ok(timestamp);
            }
        }
    }
    Err(SignatureError::Mismatch)
}

/// HMAC-SHA256 keyed with `secret`, fed `"<timestamp>.<body>"`.
fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Hex (either case) to bytes; `None` for anything else, or for an odd length.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// What the provider says happened to a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// The buyer paid: the order is paid, or, if it closed before, the payment is to be
    /// refunded.
    #[serde(rename = "payment.succeeded")]
    Succeeded,
    /// A payment attempt failed: recorded; the order stays open until its deadline (the
    /// buyer may try again).
    #[serde(rename = "payment.failed")]
    Failed,
}

/// A payment event as the provider sends it (the body of `POST /payments/webhook`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The event's own id: the same event delivered again carries the same id.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When the provider created the event (unix seconds).
    #[serde(deserialize_with = "crate::json::integral")]
    pub created: i64,
    pub data: PaymentData,
}

/// The payment an event is about. `order_id` and `buyer` are what the shop gave the
/// provider when the payment started (its checkout); the provider sends them back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentData {
    /// The provider's payment id: pays at most one order.
    pub payment_id: String,
    /// The order, as a decimal string (like every id in the API).
    pub order_id: String,
    /// The buyer's user id (the token's `sub` at checkout).
    pub buyer: String,
    /// In the currency's minor unit (cents).
    #[serde(deserialize_with = "crate::json::integral")]
    pub amount_minor: i64,
    /// ISO 4217, upper case.
    pub currency: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_000_000;

    fn secrets() -> Secrets {
        Secrets::parse("whsec_current_0123456789,whsec_previous_0123456789").unwrap()
    }

    #[test]
    fn a_signature_made_with_either_secret_is_accepted() {
        let body = br#"{"id":"evt_1"}"#;
        for secret in [
            &b"whsec_current_0123456789"[..],
            b"whsec_previous_0123456789",
        ] {
            let h = header(&[secret], NOW, body);
            assert_eq!(verify(&secrets(), Some(&h), body, NOW + 10), Ok(NOW));
        }
        // A sender rotating signs with both.
        let h = header(
            &[b"whsec_unknown_012345678", b"whsec_current_0123456789"],
            NOW,
            body,
        );
        assert_eq!(verify(&secrets(), Some(&h), body, NOW), Ok(NOW));
    }

    #[test]
    fn a_changed_body_a_wrong_secret_or_a_stale_timestamp_is_refused() {
        let body = br#"{"id":"evt_1","amount_minor":100}"#;
        let h = header(&[b"whsec_current_0123456789"], NOW, body);
        let changed = br#"{"id":"evt_1","amount_minor":1}"#;
        assert_eq!(
            verify(&secrets(), Some(&h), changed, NOW),
            Err(SignatureError::Mismatch)
        );
        let other = header(&[b"whsec_other_0123456789ab"], NOW, body);
        assert_eq!(
            verify(&secrets(), Some(&other), body, NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&secrets(), Some(&h), body, NOW + TOLERANCE_S + 1),
            Err(SignatureError::OutsideTolerance(TOLERANCE_S + 1))
        );
        assert_eq!(
            verify(&secrets(), Some(&h), body, NOW - TOLERANCE_S - 1),
            Err(SignatureError::OutsideTolerance(-TOLERANCE_S - 1))
        );
        // The timestamp is signed: moving it breaks the signature.
        let moved = h.replacen(&format!("t={NOW}"), &format!("t={}", NOW + 5), 1);
        assert_eq!(
            verify(&secrets(), Some(&moved), body, NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        let body = b"{}";
        for h in [
            "",
            "t=abc,v1=00",
            "v1=00",
            &format!("t={NOW}"),
            &format!("t={NOW},v1=zz"),
            &format!("t={NOW},v1=0"),
            "garbage",
        ] {
            assert_eq!(
                verify(&secrets(), Some(h), body, NOW),
                Err(SignatureError::Malformed),
                "{h:?}"
            );
        }
        assert_eq!(
            verify(&secrets(), None, body, NOW),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn secrets_are_one_or_two_and_long_enough() {
        assert!(Secrets::parse("whsec_current_0123456789").is_ok());
        assert!(Secrets::parse("").is_err());
        assert!(Secrets::parse("short").is_err());
        assert!(
            Secrets::parse("a123456789abcdefgh,b123456789abcdefgh,c123456789abcdefgh").is_err()
        );
        assert!(!format!("{:?}", secrets()).contains("whsec"));
    }

    #[test]
    fn events_read_as_the_provider_sends_them() {
        let e: Event = serde_json::from_str(
            r#"{"id":"evt_1","type":"payment.succeeded","created":1795000000,
                "data":{"payment_id":"pay_1","order_id":"42","buyer":"alice",
                        "amount_minor":1999,"currency":"EUR"}}"#,
        )
        .unwrap();
        assert_eq!(e.kind, EventType::Succeeded);
        assert_eq!(e.data.amount_minor, 1999);
        assert!(
            serde_json::from_str::<Event>(
                r#"{"id":"evt_1","type":"payment.refunded","created":1,"data":{}}"#
            )
            .is_err()
        );
    }
}

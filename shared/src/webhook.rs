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
//! - signatures are compared in constant time (`Mac::verify_slice`);
//! - the check costs at most one pass over the body per secret held: a header with more
//!   than [`MAX_SIGNATURES`] `v1`, or a `v1` that is not one HMAC-SHA256 (64 hex digits;
//!   empty ones included), is refused before the body is read, and each secret's keyed
//!   hash of the body is computed once and compared with every `v1`.
//!
//! The signature proves who sent an event, not that it is new: the provider delivers
//! at least once, late and out of order, and the receiver makes an event's effect
//! happen once (the payment id is unique in the database, the close is decided once in
//! Redis).
//!
//! Once the signature holds, the event is read leniently ([`Received::read`]): a provider
//! treats a 4xx as final and stops resending, so only what is no payment event at all
//! ([`NotAnEvent`]) may be refused. Unknown fields are ignored, and a field outside the
//! accepted form is a reason the payment cannot be applied ([`Received::defects`]), which
//! the receiver records with the payment: the money taken is then listed, never lost
//! with a refusal.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::domain::{OrderId, PaymentRef, UserId};

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "seckill-signature";

/// How far an event's timestamp may be from the receiver's clock, either way (Stripe's
/// default: five minutes).
pub const TOLERANCE_S: i64 = 300;

/// At most this many secrets are accepted at once: the current and the previous one.
pub const MAX_SECRETS: usize = 2;

/// At most this many `v1` in one header (a sender signs with each secret it holds: one,
/// or two while it rotates). More is refused unread: no header makes the check dear.
pub const MAX_SIGNATURES: usize = 8;

/// A `v1` is one HMAC-SHA256: 32 bytes, 64 hex digits.
const SIGNATURE_BYTES: usize = 32;

/// Why an event's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no signature header")]
    Missing,
    #[error(
        "the signature header is not `t=<unix seconds>,v1=<64 hex digits>` (at most {MAX_SIGNATURES} v1)"
    )]
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
            Some(("v1", _)) if signatures.len() == MAX_SIGNATURES => {
                return Err(SignatureError::Malformed);
            }
            Some(("v1", sig)) => signatures.push(
                unhex(sig)
                    .filter(|s| s.len() == SIGNATURE_BYTES)
                    .ok_or(SignatureError::Malformed)?,
            ),
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
        // The body is hashed once per secret, however many `v1` there are: each compare
        // finishes a copy of that state (a block or two, not the body again).
        let keyed = mac(secret, timestamp, body);
        for signature in &signatures {
            // Constant time: how much of a guess matched is not told by the time taken.
            if keyed.clone().verify_slice(signature).is_ok() {
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

/// A payment event as the provider sends it (the body of `POST /payments/webhook`): what
/// a sender builds (`seckill pay`, the tests). Fields it does not name are ignored when
/// read; the receiver reads events with [`Received::read`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

impl Event {
    /// An event the provider creates now about `data`; `id` names the event (a
    /// redelivery carries the same one).
    pub fn created_now(id: impl Into<String>, kind: EventType, data: PaymentData) -> Event {
        Event {
            id: id.into(),
            kind,
            created: crate::domain::now_millis() / 1000,
            data,
        }
    }

    /// The body as the provider sends it.
    pub fn body(&self) -> String {
        serde_json::to_string(self).expect("an event serialises")
    }
}

/// The payment an event is about. `order_id` and `buyer` are what the shop gave the
/// provider when the payment started (its checkout); the provider sends them back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// The longest event id recorded as sent (`payments.event_id`); a longer one is
/// recorded by its [`stand_in`].
pub const MAX_EVENT_ID_CHARS: usize = 128;

/// What the ledger records as the currency of an event whose currency is no
/// three-letter code: ISO 4217's own code for "no currency".
pub const NO_CURRENCY: &str = "XXX";

/// A body that is no payment event at all: not a JSON object, or a `type` other than
/// [`EventType`]'s. The only events a receiver refuses once the signature holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a payment event: {0}")]
pub struct NotAnEvent(pub String);

/// A payment event as received, read leniently after its signature held.
///
/// Every field is read on its own, so one outside the accepted form spoils only itself:
/// the payment is still recorded (under its id, or a stand-in for it), and the reasons it
/// cannot be applied are in [`Received::defects`] (the payment id, amount or currency),
/// [`Received::order`] and [`Received::buyer`]. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Who sent it: the generic format ([`crate::adapters::payments::GENERIC`]) or a
    /// provider's own (`stripe`), recorded with the payment (only a provider seckill can
    /// call has its refunds issued).
    pub provider: &'static str,
    pub kind: EventType,
    /// The payment's key in the ledger: the provider's payment id when it is of the
    /// accepted form ([`PaymentRef`]), else a [`stand_in`] of what was sent, so every
    /// delivery of the event names the same row (and no provider's id can be it).
    pub payment_id: String,
    /// The payment id, when it is of the accepted form (only then can it close an order).
    pub payment: Option<PaymentRef>,
    /// The order named, or why none is (missing, or not a positive decimal id; a JSON
    /// integer is read too).
    pub order: Result<OrderId, String>,
    /// The buyer named, or why nobody is (missing, or no user id can be it).
    pub buyer: Result<UserId, String>,
    /// In minor units; `None` when missing or not an integer (JSON Schema's: `5.0` is 5).
    pub amount_minor: Option<i64>,
    /// ISO 4217 in upper case (`eur` is read `EUR`); `None` when not three letters.
    pub currency: Option<String>,
    /// The event's id as recorded: as sent when it is a string of 1 to
    /// [`MAX_EVENT_ID_CHARS`] characters, else a [`stand_in`]. Only ever shown: nothing
    /// is decided by it, so an odd one spoils nothing.
    pub event_id: String,
    /// When the provider made the event (unix milliseconds), if it says so readably.
    pub created_ms: Option<i64>,
    /// Why the payment cannot be applied to any order: its id, amount or currency is
    /// missing or outside the accepted form. Empty for a usable event.
    pub defects: Vec<String>,
}

impl Received {
    /// Reads an event's body (whose signature held). [`NotAnEvent`] only when it is no
    /// payment event at all.
    pub fn read(body: &[u8]) -> Result<Received, NotAnEvent> {
        Received::of(&object(body)?, body, crate::adapters::payments::GENERIC)
    }

    /// Reads an event already parsed from `body` (the generic format's fields: what
    /// another provider's adapter, [`stripe`], puts its own event into), sent by
    /// `provider`.
    pub(crate) fn of(
        event: &Map<String, Value>,
        body: &[u8],
        provider: &'static str,
    ) -> Result<Received, NotAnEvent> {
        let kind = match event.get("type") {
            Some(t) => EventType::deserialize(t).map_err(|_| {
                NotAnEvent(format!(
                    "type {} is neither payment.succeeded nor payment.failed",
                    shown(t)
                ))
            })?,
            None => return Err(NotAnEvent("it has no type".into())),
        };
        let no_data = Map::new();
        let data = match event.get("data") {
            Some(Value::Object(data)) => data,
            _ => &no_data,
        };
        // What names this event when it names no payment id of its own: its id, else
        // its bytes (the same event is delivered with the same body).
        let event_name = match event.get("id") {
            Some(id) => format!("event:{id}"),
            None => format!("body:{}", hex(&Sha256::digest(body))),
        };
        let mut defects = Vec::new();
        let accepted = data
            .get("payment_id")
            .and_then(Value::as_str)
            .and_then(|s| PaymentRef::parse(s).ok());
        let (payment_id, payment) = match (accepted, data.get("payment_id")) {
            (Some(p), _) => (p.as_str().to_string(), Some(p)),
            (None, Some(v)) => {
                defects.push(format!(
                    "the payment id {} is not 1 to 128 characters of A-Z a-z 0-9 . _ : -",
                    shown(v)
                ));
                (stand_in(&format!("payment_id:{v}")), None)
            }
            (None, None) => {
                defects.push("the event names no payment id".into());
                (stand_in(&event_name), None)
            }
        };
        let amount_minor = field(
            data,
            "amount_minor",
            "amount",
            "a whole number of minor units",
            |v| crate::json::integral(v).ok(),
        )
        .map_err(|why| defects.push(why))
        .ok();
        let currency = field(
            data,
            "currency",
            "currency",
            "a three-letter ISO 4217 code",
            |v| {
                v.as_str()
                    .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()))
                    .map(str::to_ascii_uppercase)
            },
        )
        .map_err(|why| defects.push(why))
        .ok();
        let order = field(
            data,
            "order_id",
            "order",
            "a positive decimal id",
            |v| match v {
                Value::String(s) => s.parse::<OrderId>().ok(),
                Value::Number(n) => n.as_i64().and_then(OrderId::new),
                _ => None,
            },
        );
        let buyer = match data.get("buyer") {
            Some(Value::String(s)) => UserId::parse(s)
                .map_err(|e| format!("the buyer {} is no user id ({e})", shown(&json_text(s)))),
            Some(v) => Err(format!("the buyer {} is no user id", shown(v))),
            None => Err("the event names no buyer".into()),
        };
        let event_id = match event.get("id") {
            Some(Value::String(s)) if (1..=MAX_EVENT_ID_CHARS).contains(&s.chars().count()) => {
                s.clone()
            }
            _ => stand_in(&event_name),
        };
        let created_ms = event
            .get("created")
            .and_then(|c| crate::json::integral(c).ok())
            .map(|s| s.saturating_mul(1000));
        Ok(Received {
            provider,
            kind,
            payment_id,
            payment,
            order,
            buyer,
            amount_minor,
            currency,
            event_id,
            created_ms,
            defects,
        })
    }

    /// The amount as the ledger records it: 0 when the event gave none readably (the
    /// reason recorded with the payment says what it gave).
    pub fn amount_recorded(&self) -> i64 {
        self.amount_minor.unwrap_or(0)
    }

    /// The currency as the ledger records it: [`NO_CURRENCY`] when the event gave no
    /// three-letter code.
    pub fn currency_recorded(&self) -> &str {
        self.currency.as_deref().unwrap_or(NO_CURRENCY)
    }
}

/// The body as a JSON object, or why it is no event at all.
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, NotAnEvent> {
    match serde_json::from_slice(body).map_err(|e| NotAnEvent(format!("not JSON: {e}")))? {
        Value::Object(event) => Ok(event),
        _ => Err(NotAnEvent("not a JSON object".into())),
    }
}

/// What the ledger records for a value sent outside the accepted form (a payment id, an
/// event id): `#` and the SHA-256 of `sent` in hex, 65 characters. The same value always
/// gives the same stand-in; `#` is in no accepted payment id, so no provider's id is one.
pub fn stand_in(sent: &str) -> String {
    format!("#{}", hex(&Sha256::digest(sent.as_bytes())))
}

/// The field `key` of an event's data read by `read`, or why not, in the words a reason
/// shows: "the event names no {name}" when it is missing, "the {name} {value} is not
/// {form}" when `read` refuses it.
fn field<T>(
    data: &Map<String, Value>,
    key: &str,
    name: &str,
    form: &str,
    read: impl FnOnce(&Value) -> Option<T>,
) -> Result<T, String> {
    match data.get(key) {
        Some(v) => read(v).ok_or_else(|| format!("the {name} {} is not {form}", shown(v))),
        None => Err(format!("the event names no {name}")),
    }
}

/// `s` as JSON text (quoted and escaped, as a reason shows it).
fn json_text(s: &str) -> Value {
    Value::String(s.to_string())
}

/// A value as a reason shows it: its JSON text, cut after 40 characters.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

pub mod stripe;

#[cfg(test)]
mod tests;

//! Stripe's webhook events, read into the one event the ledger takes ([`Received`]): the
//! provider port's second adapter, beside the generic format of `POST /payments/webhook`
//! (`POST /payments/stripe` takes Stripe's events as Stripe sends them).
//!
//! Stripe signs exactly as the generic format does (`t=<unix s>,v1=<hex>`, HMAC-SHA256
//! over `"<t>.<raw body>"`, keyed with the endpoint's `whsec_…` secret as written), only
//! in a header of its own, [`SIGNATURE_HEADER`]: [`super::verify`] checks both, on the
//! raw body, before anything here reads it.
//!
//! Of the types Stripe may send, three are ours ([`read`]):
//! - `payment_intent.succeeded` and `payment_intent.payment_failed`: `data.object` is the
//!   PaymentIntent, whose `metadata` holds what checkout gave it (`order_id`, `buyer`);
//!   its id (`pi_…`) is the ledger's payment id, so the PaymentIntent pays at most one
//!   order however many attempts it took;
//! - `charge.refunded`: `data.object` is the charge, naming its PaymentIntent.
//!
//! Every other type is [`StripeEvent::Ignored`]: answered 2xx (Stripe stops sending it),
//! nothing recorded; so is a PaymentIntent whose metadata names no order (made by
//! something else the shop sells through the same account). What is read is read leniently, as the generic format is: a field
//! outside the accepted form is a reason recorded with the payment, not a refusal.

use serde_json::{Map, Value};

use super::{EventType, NotAnEvent, Received, object};

/// The header Stripe signs in.
pub const SIGNATURE_HEADER: &str = "stripe-signature";

/// The metadata keys checkout gives a PaymentIntent, read back from its events.
pub const METADATA_ORDER: &str = "order_id";
pub const METADATA_BUYER: &str = "buyer";
pub const METADATA_VOUCHER: &str = "voucher_id";

/// A Stripe event, as far as the ledger is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StripeEvent {
    /// A PaymentIntent succeeded or failed: the same event as the generic format's.
    Payment(Received),
    /// A charge was refunded (in whole or in part).
    Refunded(Refund),
    /// A type the ledger does not use (its name).
    Ignored(String),
}

/// What `charge.refunded` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The PaymentIntent the charge belongs to: the ledger's payment id (`None` when
    /// the charge names none, a charge made without one: not ours).
    pub payment_id: Option<String>,
    /// The charge's amount refunded so far, in minor units.
    pub amount_refunded: Option<i64>,
    /// Whether the charge is refunded in full.
    pub refunded: bool,
    /// The event's id, as sent.
    pub event_id: String,
}

/// Reads a Stripe event's body (whose signature held). [`NotAnEvent`] only for what is
/// no Stripe event at all (not a JSON object, no `type`).
pub fn read(body: &[u8]) -> Result<StripeEvent, NotAnEvent> {
    let event = object(body)?;
    let kind = match event.get("type") {
        Some(Value::String(t)) => t.as_str(),
        _ => return Err(NotAnEvent("it has no type".into())),
    };
    let object = event
        .get("data")
        .and_then(|d| d.get("object"))
        .and_then(Value::as_object);
    let ours = match kind {
        "payment_intent.succeeded" => EventType::Succeeded,
        "payment_intent.payment_failed" => EventType::Failed,
        "charge.refunded" => {
            let charge = object.cloned().unwrap_or_default();
            return Ok(StripeEvent::Refunded(Refund {
                payment_id: charge
                    .get("payment_intent")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                amount_refunded: charge
                    .get("amount_refunded")
                    .and_then(|a| crate::json::integral(a).ok()),
                refunded: charge.get("refunded") == Some(&Value::Bool(true)),
                event_id: event
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            }));
        }
        other => return Ok(StripeEvent::Ignored(other.chars().take(80).collect())),
    };
    // A PaymentIntent no checkout of ours made (the shop's account sells other things
    // too): not ours to record, nor to list for a refund.
    let metadata = object
        .and_then(|o| o.get("metadata"))
        .and_then(Value::as_object);
    if metadata.is_none_or(|m| !m.contains_key(METADATA_ORDER)) {
        return Ok(StripeEvent::Ignored(format!(
            "{kind} (no {METADATA_ORDER} in its metadata: not a seckill checkout)"
        )));
    }
    // The generic format's fields, taken from the PaymentIntent: only those it has, so
    // a missing one is told as missing.
    let mut data = Map::new();
    if let Some(intent) = object {
        copy(intent, "id", &mut data, "payment_id");
        // Money taken: `amount_received` (Stripe's, once succeeded), else `amount`.
        let amount = match ours {
            EventType::Succeeded => intent
                .get("amount_received")
                .or_else(|| intent.get("amount")),
            EventType::Failed => intent.get("amount"),
        };
        if let Some(amount) = amount {
            data.insert("amount_minor".into(), amount.clone());
        }
        copy(intent, "currency", &mut data, "currency");
    }
    if let Some(metadata) = metadata {
        copy(metadata, METADATA_ORDER, &mut data, "order_id");
        copy(metadata, METADATA_BUYER, &mut data, "buyer");
    }
    let mut generic = Map::new();
    generic.insert(
        "type".into(),
        serde_json::to_value(ours).expect("a type serialises"),
    );
    copy(&event, "id", &mut generic, "id");
    copy(&event, "created", &mut generic, "created");
    generic.insert("data".into(), Value::Object(data));
    Received::of(&generic, body, crate::refunds::STRIPE).map(StripeEvent::Payment)
}

fn copy(from: &Map<String, Value>, key: &str, to: &mut Map<String, Value>, as_key: &str) {
    if let Some(v) = from.get(key) {
        to.insert(as_key.into(), v.clone());
    }
}

/// A Stripe event of `kind` about `object` (a PaymentIntent or a charge as Stripe's API
/// returns it), as Stripe would send it: what the CLI and the tests build where the
/// local Stripe sends no event of its own.
pub fn event(id: &str, kind: &str, created: i64, object: Value) -> Value {
    serde_json::json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "livemode": false,
        "pending_webhooks": 1,
        "type": kind,
        "data": { "object": object },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent(metadata: Value) -> Value {
        json!({
            "id": "pi_3Pq9a2", "object": "payment_intent", "amount": 1999,
            "amount_received": 1999, "currency": "eur", "status": "succeeded",
            "metadata": metadata,
        })
    }

    fn body(kind: &str, object: Value) -> Vec<u8> {
        event("evt_1", kind, 1_790_000_000, object)
            .to_string()
            .into_bytes()
    }

    #[test]
    fn a_succeeded_payment_intent_reads_as_the_generic_event() {
        let b = body(
            "payment_intent.succeeded",
            intent(json!({"order_id": "42", "buyer": "alice", "voucher_id": "7"})),
        );
        let StripeEvent::Payment(r) = read(&b).unwrap() else {
            panic!("not a payment")
        };
        assert_eq!((r.provider, r.kind), ("stripe", EventType::Succeeded));
        assert_eq!(r.payment_id, "pi_3Pq9a2");
        assert_eq!(r.order.unwrap().get(), 42);
        assert_eq!(r.buyer.unwrap().as_str(), "alice");
        assert_eq!(
            (r.amount_minor, r.currency.as_deref()),
            (Some(1999), Some("EUR"))
        );
        assert_eq!(r.event_id, "evt_1");
        assert_eq!(r.created_ms, Some(1_790_000_000_000));
        assert!(r.defects.is_empty(), "{:?}", r.defects);
    }

    #[test]
    fn metadata_outside_the_form_is_a_reason_and_none_is_not_ours() {
        let b = body(
            "payment_intent.payment_failed",
            intent(json!({"order_id": "x"})),
        );
        let StripeEvent::Payment(r) = read(&b).unwrap() else {
            panic!("not a payment")
        };
        assert_eq!(r.kind, EventType::Failed);
        assert_eq!(
            r.order.unwrap_err(),
            "the order \"x\" is not a positive decimal id"
        );
        assert_eq!(r.buyer.unwrap_err(), "the event names no buyer");
        for other in [json!({}), json!({"buyer": "alice"}), Value::Null] {
            let b = body("payment_intent.succeeded", intent(other));
            assert!(matches!(read(&b).unwrap(), StripeEvent::Ignored(_)));
        }
    }

    #[test]
    fn a_refund_names_its_payment_intent_and_other_types_are_ignored() {
        let charge = json!({"id": "ch_1", "object": "charge", "payment_intent": "pi_3Pq9a2",
                            "amount": 1999, "amount_refunded": 1999, "refunded": true});
        assert_eq!(
            read(&body("charge.refunded", charge)).unwrap(),
            StripeEvent::Refunded(Refund {
                payment_id: Some("pi_3Pq9a2".into()),
                amount_refunded: Some(1999),
                refunded: true,
                event_id: "evt_1".into(),
            })
        );
        assert_eq!(
            read(&body("customer.created", json!({"id": "cus_1"}))).unwrap(),
            StripeEvent::Ignored("customer.created".into())
        );
        assert!(read(b"{\"id\":\"evt_1\"}").is_err());
        assert!(read(b"[1]").is_err());
    }
}

//! Stripe, as a shop runs it, with no code of the shop's own: checkout creates the
//! order's PaymentIntent ([`intent_for`]), and Stripe's own events come to
//! `POST /payments/stripe` ([`webhook`]), checked with the endpoint's `whsec_` secret and
//! taken by the same ledger as the generic format's (`crate::webhook::take`).
//!
//! One PaymentIntent per order: its creation carries the order's idempotency key, and
//! the first one recorded for the order (`checkouts`) is the one every checkout of it
//! answers, so two checkouts at once, or one sent again, never leave the buyer two
//! intents to pay. A PaymentIntent paying an order that closed meanwhile is recorded
//! `refund_due`, as every late payment is.

use http::StatusCode;
use lambda_http::{Body, Request, Response};
use seckill_shared::adapters::stripe::{Checkouts, Intent, StripeError};
use seckill_shared::domain::{Price, UnixMillis};
use seckill_shared::webhook::stripe::{
    self, METADATA_BUYER, METADATA_ORDER, METADATA_VOUCHER, StripeEvent,
};
use serde_json::json;

use crate::app::{App, Stripe};
use crate::error::{ApiError, json_response};
use crate::payment::FoundOrder;
use crate::webhook::{take, verified};

/// The provider's name in the `checkouts` table and in checkout's answer.
pub const PROVIDER: &str = "stripe";

/// The PaymentIntent of `order` for `price`: the one recorded for it, else a new one
/// (recorded; if another checkout recorded one first, that one).
pub(crate) async fn intent_for(
    app: &App,
    stripe: &Stripe,
    order: &FoundOrder,
    price: Price,
    now: UnixMillis,
) -> Result<Intent, ApiError> {
    let secrets = stripe.key.get().await?;
    let key = String::from_utf8_lossy(secrets.current());
    let checkouts = Checkouts(&app.db);
    if let Some(id) = checkouts.get(order.id).await? {
        return stripe.api.intent(&key, &id).await.map_err(unavailable);
    }
    let (order_id, voucher_id) = (order.id.to_string(), order.voucher.id.to_string());
    let metadata = [
        (METADATA_ORDER, order_id.as_str()),
        (METADATA_BUYER, order.buyer.as_str()),
        (METADATA_VOUCHER, voucher_id.as_str()),
    ];
    let created = stripe
        .api
        .create_intent(
            &key,
            order.id,
            price.amount_minor(),
            price.currency(),
            &metadata,
        )
        .await
        .map_err(unavailable)?;
    let standing = checkouts
        .record(order.id, PROVIDER, &created.id, now)
        .await?;
    if standing == created.id {
        return Ok(created);
    }
    // Another checkout of the order recorded its intent first: that one is the order's
    // (this one is never handed out, so never paid).
    stripe
        .api
        .intent(&key, &standing)
        .await
        .map_err(unavailable)
}

/// A call to Stripe that gave no answer to use: the checkout can be tried again.
fn unavailable(e: StripeError) -> ApiError {
    ApiError::unavailable("stripe", e.to_string())
}

/// `POST /payments/stripe`: Stripe's events as Stripe sends them. A PaymentIntent's
/// success or failure is taken as the generic format's event is (the same answers);
/// `charge.refunded` and every type not ours are answered `200` (Stripe stops sending
/// them) with what was done.
pub(crate) async fn webhook(
    app: &App,
    req: &Request,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let secrets = app.stripe_webhook.get().await?;
    let body = verified(req, stripe::SIGNATURE_HEADER, &secrets, now)?;
    match stripe::read(body).map_err(|e| ApiError::InvalidRequest(e.to_string()))? {
        StripeEvent::Payment(event) => take(app, &event, now).await,
        // The ledger lists money to refund (`refund_due`, `refused`); a refund made is
        // seen at Stripe (the operators' refund is theirs to make for now): logged.
        StripeEvent::Refunded(refund) => {
            tracing::info!(
                payment = refund.payment_id.as_deref().unwrap_or(""),
                amount_refunded = refund.amount_refunded,
                event = refund.event_id,
                "charge refunded at stripe"
            );
            Ok(ignored("charge.refunded"))
        }
        StripeEvent::Ignored(kind) => Ok(ignored(&kind)),
    }
}

/// The answer to an event taken without a change: Stripe stops sending it.
fn ignored(kind: &str) -> Response<Body> {
    json_response(StatusCode::OK, &json!({ "ignored": kind }))
}

//! Stripe, as a shop runs it, with no code of the shop's own: checkout's answer gains the
//! order's PaymentIntent ([`attach_intent`]), and Stripe's own events come to
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
use seckill_shared::adapters::payments::{Outcome, Payments};
use seckill_shared::adapters::stripe::{Checkouts, Intent, StripeError};
use seckill_shared::domain::{Price, UnixMillis};
use seckill_shared::webhook::stripe::{
    self, METADATA_BUYER, METADATA_ORDER, METADATA_VOUCHER, Refund, StripeEvent,
};
use serde_json::json;

use crate::app::{App, Stripe};
use crate::error::{ApiError, json_response};
use crate::payment::FoundOrder;
use crate::webhook::{outcome_json, take, verified};

/// The provider's name in the `checkouts` table and in checkout's answer.
pub const PROVIDER: &str = "stripe";

/// With Stripe configured, `body` (checkout's answer for `order`) gains the order's
/// PaymentIntent: `provider`, `payment_intent`, `client_secret` (what the buyer's page
/// confirms with Stripe.js), and where the page is set up for Stripe.js
/// (`STRIPE_PUBLISHABLE_KEY`) `publishable_key` and `stripe_js` (the script's URL, which
/// the pages' policy allows). Without Stripe, or without a price, `body` stays as it is.
pub(crate) async fn attach_intent(
    app: &App,
    order: &FoundOrder,
    now: UnixMillis,
    body: &mut serde_json::Value,
) -> Result<(), ApiError> {
    let (Some(stripe), Some(price)) = (&app.stripe, order.voucher.payment.and_then(|p| p.price))
    else {
        return Ok(());
    };
    let intent = intent_for(app, stripe, order, price, now).await?;
    body["provider"] = json!(PROVIDER);
    body["payment_intent"] = json!(intent.id);
    body["client_secret"] = json!(intent.client_secret);
    if let Some(page) = &stripe.page {
        body["publishable_key"] = json!(page.publishable_key);
        body["stripe_js"] = json!(page.js_url);
    }
    Ok(())
}

/// The PaymentIntent of `order` for `price`: the one recorded for it, else a new one
/// (recorded; if another checkout recorded one first, that one).
async fn intent_for(
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
/// `charge.refunded` records the refund ([`refunded`]); every type not ours is answered
/// `200` (Stripe stops sending it) with what was done.
pub(crate) async fn webhook(
    app: &App,
    req: &Request,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let secrets = app.stripe_webhook.get().await?;
    let body = verified(req, stripe::SIGNATURE_HEADER, &secrets, now)?;
    match stripe::read(body).map_err(|e| ApiError::InvalidRequest(e.to_string()))? {
        StripeEvent::Payment(event) => take(app, &event, now).await,
        StripeEvent::Refunded(refund) => refunded(app, &refund, now).await,
        StripeEvent::Ignored(kind) => Ok(ignored(&kind)),
    }
}

/// `charge.refunded`: a payment to refund is `refunded` once its charge is refunded in
/// full (the drainer's refunds, or an operator's at Stripe). A refund of a payment that
/// was not to refund (a `paid` order's, made at Stripe by hand) changes nothing here:
/// logged for the operators, whose order stays paid.
async fn refunded(app: &App, refund: &Refund, now: UnixMillis) -> Result<Response<Body>, ApiError> {
    let Some(payment_id) = &refund.payment_id else {
        return Ok(ignored(
            "charge.refunded (of a charge without a PaymentIntent)",
        ));
    };
    if !refund.refunded {
        return Ok(ignored("charge.refunded (in part: not the whole payment)"));
    }
    let ledger = Payments(&app.db);
    match ledger.refunded(payment_id, &refund.event_id, now).await? {
        None => Ok(ignored("charge.refunded (of a payment not recorded here)")),
        Some(row) if row.outcome == Outcome::Refunded => {
            tracing::info!(payment = payment_id, "payment refunded");
            Ok(outcome_json(&row))
        }
        Some(row) => {
            tracing::warn!(
                payment = payment_id,
                outcome = row.outcome.as_str(),
                "a payment that was not to refund was refunded at stripe: left as it is"
            );
            Ok(ignored(&format!(
                "charge.refunded (of a payment {}, not to refund: left as it is)",
                row.outcome.as_str()
            )))
        }
    }
}

/// The answer to an event taken without a change: Stripe stops sending it.
fn ignored(kind: &str) -> Response<Body> {
    json_response(StatusCode::OK, &json!({ "ignored": kind }))
}

//! `POST /payments/webhook` and `POST /payments/stripe` (the payment provider, no
//! token): the only ways an order becomes paid. The event's signature is checked on the
//! raw body before anything is read ([`seckill_shared::webhook`], [`verified`]); the
//! event is then read leniently, in the generic format ([`Received::read`]) or in
//! Stripe's (`crate::stripe`), into one [`Received`] that one ledger takes ([`take`]):
//! its payment recorded once per provider payment id ([`Payments`]: one payment pays at
//! most one order), and Redis closes the order (`lua/close.lua`, decided once). A payment after its order expired or was cancelled never reopens it
//! nor takes back a unit sold again: it is recorded `refund_due`.
//!
//! A provider treats a 2xx or a 4xx as final and stops sending; a 5xx makes it send again
//! for days. The answers keep every payment listed, and never let our own uncertainty
//! cost a buyer who paid on time their order:
//! - `200` only once the payment is recorded with an outcome the operators' lists show:
//!   `paid` with its order, `refund_due` (its order closed first, was paid by another
//!   payment, or was rejected), `refused` with the reason (an event that cannot be
//!   applied: its payment id, order id, amount or currency outside the accepted form, an
//!   order that is not its buyer's or of a voucher without a payment step, an order
//!   nobody has), or `failed` (no money taken);
//! - `503` while the answer could still change: a backend failed; the order may wait
//!   undrained in its stream (Redis lost the sale and nothing repaired it, Redis does not
//!   show it as the event's buyer's, or shows it neither open nor closed); or nobody
//!   knows the order id yet (its lease record lost), for at most
//!   [`UNKNOWN_ORDER_WAIT_MS`] after the money moved;
//! - a 4xx only for what is no payment at all (a bad signature: `401`, nothing read; a
//!   body that is no payment event: `400`), and for the two refusals the contract names:
//!   a payment id recorded for another order (`409 payment_reused`: that payment is
//!   listed under its order already) and an amount or currency other than the voucher's
//!   price (`422 payment_mismatch`, recorded `refused` first).

use http::StatusCode;
use lambda_http::{Body, Request, Response};
use seckill_shared::adapters::payments::{NewPayment, Outcome, PaymentRow, Payments};
use seckill_shared::adapters::redis::CloseAction;
use seckill_shared::domain::{Bucket, OrderId, OrderStatus, PaymentRef, UnixMillis, VoucherId};
use seckill_shared::order_id::{EPOCH_UNIX_MS, MAX_BLOCK_AGE_MS, OrderIdParts};
use seckill_shared::webhook::{self, EventType, Received};
use serde_json::json;

use crate::app::App;
use crate::error::{ApiError, json_response};
use crate::lookup::{undrained_orders, voucher_of};
use crate::payment::{FoundOrder, Lookup, close, look_up};
use crate::request::body_of;

/// How long after its payment the webhook waits for an order id that neither the
/// database nor the id's lease record knows (`503`, the provider sends again), before it
/// records the payment `refused`. Such an order may still be drained: admitted by an
/// instance whose lease record Redis lost since, it is found once written. The drainer
/// writes an order within seconds and alarms when it cannot; six hours leave an outage
/// of hours time to be fixed and stay within the days providers resend for.
pub const UNKNOWN_ORDER_WAIT_MS: i64 = 6 * 3_600_000;

/// How far ahead of the server's clock a lease stamp may run (the lease clock jumps ahead
/// after a failover to a server whose clock is behind: `CLOCK_BEHIND_JUMP_MS` a jump),
/// generously. An order id stamped later than that was never issued; an order's stream
/// entry is never older than its id's stamp by more than that.
const LEASE_AHEAD_MS: i64 = 3_600_000;

/// Where an event's payment goes.
enum Target {
    /// The order of its buyer, of a voucher with a payment step.
    Order(FoundOrder),
    /// No order it can pay: recorded `refused` with `why`, for `voucher` and `order`
    /// when known.
    Refuse {
        voucher: Option<VoucherId>,
        order: Option<OrderId>,
        why: String,
    },
}

/// `POST /payments/webhook`: `200` with the payment's outcome once the event is taken
/// into account, however often it comes; see the module's answers.
pub(crate) async fn webhook(
    app: &App,
    req: &Request,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let secrets = app.webhook.get().await?;
    let body = verified(req, webhook::SIGNATURE_HEADER, &secrets, now)?;
    // Authentic from here on: only what is no payment event at all is refused.
    let event = Received::read(body).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    take(app, &event, now).await
}

/// The raw body of `req` once its signature (in `header`) holds for one of `secrets`
/// at `now`: `401` otherwise, before anything in it is read.
pub(crate) fn verified<'r>(
    req: &'r Request,
    header: &str,
    secrets: &webhook::Secrets,
    now: UnixMillis,
) -> Result<&'r [u8], ApiError> {
    let body = body_of(req)?;
    let value = match req.headers().get(header) {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::Unauthorized(format!("{header} must be ASCII")))?,
        ),
        None => None,
    };
    webhook::verify(secrets, value, body, now.div_euclid(1000)).map_err(|e| {
        ApiError::Unauthorized(format!("webhook signature refused ({header}): {e}"))
    })?;
    Ok(body)
}

/// A payment event whose signature held, from either provider's format: the one ledger
/// behind both. `200` with the payment's outcome; see the module's answers.
pub(crate) async fn take(
    app: &App,
    event: &Received,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let (voucher, order, mut why) = match target(app, event, now).await? {
        Target::Order(order) => match &event.payment {
            Some(payment) if event.defects.is_empty() => {
                return apply(app, event, payment, order, now).await;
            }
            _ => (Some(order.voucher.id), Some(order.id), Vec::new()),
        },
        Target::Refuse {
            voucher,
            order,
            why,
        } => (voucher, order, vec![why]),
    };
    why.extend(event.defects.iter().cloned());
    let why = why.join("; ");
    let new = new_payment(event, order, voucher, now);
    let ledger = Payments(&app.db);
    let row = match event.kind {
        EventType::Succeeded => refuse(&ledger, &new, &why).await?,
        // A failed attempt took no money: recorded as any failure, with what was wrong.
        EventType::Failed => {
            let row = ledger.record(&new, Outcome::Received, None).await?;
            same_order(&row, order)?;
            ledger.decide(&new, Outcome::Failed, Some(&why)).await?
        }
    };
    tracing::warn!(
        voucher_id = voucher.map(VoucherId::get),
        order_id = order.map(OrderId::get),
        payment = new.payment_id,
        outcome = row.outcome.as_str(),
        why,
        "payment event that cannot be applied: recorded"
    );
    Ok(outcome_json(&row))
}

/// The order `event` pays, or why it pays none. `503` while that may still change.
async fn target(app: &App, event: &Received, now: UnixMillis) -> Result<Target, ApiError> {
    let id = match &event.order {
        Ok(id) => *id,
        Err(why) => {
            return Ok(Target::Refuse {
                voucher: None,
                order: None,
                why: why.clone(),
            });
        }
    };
    let refuse = |voucher: Option<VoucherId>, why: String| Target::Refuse {
        voucher,
        order: Some(id),
        why,
    };
    let found = look_up(app, id, event.buyer.as_ref().ok(), now).await?;
    Ok(match found {
        Lookup::Theirs(order) => Target::Order(order),
        Lookup::NoPaymentStep { voucher, .. } => refuse(
            Some(voucher.id),
            format!("voucher {} takes no payment", voucher.id),
        ),
        Lookup::NotTheirs { voucher, drained } => {
            // Not drained, Redis's word alone: were the buyers and deadlines it lost
            // (evicted, say) the order's, it is theirs once written.
            if !drained && undrained_anywhere(app, voucher, id, now).await? {
                return Err(not_visible_yet(id));
            }
            let why = match &event.buyer {
                Ok(buyer) => format!("order {id} is not {:?}'s", buyer.as_str()),
                Err(why) => why.clone(),
            };
            refuse(Some(voucher), why)
        }
        Lookup::Unknown => {
            if may_still_appear(id, event.created_ms, now) {
                return Err(ApiError::unavailable(
                    "database",
                    format!(
                        "order {id} is not known yet (not drained, its lease record lost): send this event again"
                    ),
                ));
            }
            refuse(
                None,
                format!(
                    "no order {id} was found: the database does not hold it and its id's lease record names no voucher"
                ),
            )
        }
    })
}

/// The payment of a usable event for its buyer's order: the one path to `paid`.
async fn apply(
    app: &App,
    event: &Received,
    payment: &PaymentRef,
    order: FoundOrder,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let id = order.id;
    let ledger = Payments(&app.db);
    let new = new_payment(event, Some(id), Some(order.voucher.id), now);
    let price = order.voucher.payment.and_then(|p| p.price);
    let matches =
        price.is_some_and(|p| p.amount_minor() == new.amount_minor && p.currency() == new.currency);
    // Only money taken is held to the price: a failed attempt took none, whatever it
    // says it was for, and must not settle the payment id against a later success
    // (the provider retries a card under the same id).
    if !matches && event.kind == EventType::Succeeded {
        let why = match price {
            Some(p) => format!(
                "paid {} {}, the price is {} {}",
                new.amount_minor,
                new.currency,
                p.amount_minor(),
                p.currency()
            ),
            None => "the voucher has no price".to_string(),
        };
        refuse(&ledger, &new, &why).await?;
        tracing::warn!(
            order_id = id.get(),
            payment = payment.as_str(),
            why,
            "payment refused"
        );
        return Err(refused(payment, &why));
    }
    let row = ledger.record(&new, Outcome::Received, None).await?;
    same_order(&row, Some(id))?;
    if row.outcome == Outcome::Refused {
        // Refused for good by an earlier event (a success for the wrong amount): told
        // the same way, whatever this one says.
        return Err(refused(
            payment,
            row.reason
                .as_deref()
                .unwrap_or("its amount was not the price"),
        ));
    }
    if row.outcome.is_final() {
        // Decided by an earlier delivery: told the same way.
        return Ok(outcome_json(&row));
    }
    let decided = match event.kind {
        EventType::Failed => ledger.decide(&new, Outcome::Failed, None).await?,
        EventType::Succeeded => {
            let action = CloseAction::Pay(payment.clone());
            let closed = match order.rejected() {
                // Never held a unit: nothing to pay, the money goes back.
                true => None,
                false => close(app, &order, &order.buyer, &action).await?,
            };
            if closed.is_none() && order.row.is_none() && not_drained(app, &order, now).await? {
                // Neither open nor closed in Redis, no row: still in its stream, it is
                // open once written (the row stays `received` until then).
                return Err(not_visible_yet(id));
            }
            let (outcome, reason) = match &closed {
                Some(c) if c.status == OrderStatus::Paid && c.payment_ref == payment.as_str() => {
                    (Outcome::Paid, None)
                }
                Some(c) if c.status == OrderStatus::Paid => (
                    Outcome::RefundDue,
                    Some(format!("the order was paid by payment {}", c.payment_ref)),
                ),
                Some(c) => (
                    Outcome::RefundDue,
                    Some(format!(
                        "the order was {} before the payment",
                        c.status.as_str()
                    )),
                ),
                None if order.rejected() => (
                    Outcome::RefundDue,
                    Some(
                        "the order was rejected (the database's stock could not cover it)"
                            .to_string(),
                    ),
                ),
                // Not in its stream either: dead-lettered, never to be written.
                None => (
                    Outcome::RefundDue,
                    Some("the order is no longer open".to_string()),
                ),
            };
            let row = ledger.decide(&new, outcome, reason.as_deref()).await?;
            if row.outcome == Outcome::RefundDue {
                seckill_shared::metrics::late_payment();
                tracing::warn!(
                    voucher_id = order.voucher.id.get(),
                    order_id = id.get(),
                    payment = payment.as_str(),
                    reason = row.reason.as_deref().unwrap_or(""),
                    "payment to refund"
                );
            } else {
                tracing::info!(
                    voucher_id = order.voucher.id.get(),
                    order_id = id.get(),
                    "order paid"
                );
            }
            row
        }
    };
    Ok(outcome_json(&decided))
}

/// The ledger's record of `event` for `order` of `voucher`.
fn new_payment<'a>(
    event: &'a Received,
    order: Option<OrderId>,
    voucher: Option<VoucherId>,
    now: UnixMillis,
) -> NewPayment<'a> {
    NewPayment {
        provider: event.provider,
        payment_id: &event.payment_id,
        order,
        voucher,
        amount_minor: event.amount_recorded(),
        currency: event.currency_recorded(),
        event_id: &event.event_id,
        received_ms: now,
    }
}

/// Records `new` refused for `why` (money taken for nothing: listed for a refund), or
/// finds how an earlier event of the payment recorded it. A row an attempt recorded
/// `failed` is refused now (this success took money). A row still `received` is being
/// decided by an earlier event (in flight, or answered 503): were this one answered for
/// good, that event could still end the row `failed` with the money listed nowhere, so
/// `503` until it is decided.
async fn refuse(
    ledger: &Payments<'_>,
    new: &NewPayment<'_>,
    why: &str,
) -> Result<PaymentRow, ApiError> {
    let row = ledger.record(new, Outcome::Refused, Some(why)).await?;
    same_order(&row, new.order)?;
    match row.outcome {
        Outcome::Failed => Ok(ledger.decide(new, Outcome::Refused, Some(why)).await?),
        Outcome::Received => Err(ApiError::unavailable(
            "database",
            format!(
                "payment {} is being decided by an earlier event: send this one again",
                new.payment_id
            ),
        )),
        _ => Ok(row),
    }
}

/// The unix milliseconds of order `id`'s lease stamp.
fn leased_ms(id: OrderId) -> UnixMillis {
    EPOCH_UNIX_MS.saturating_add(OrderIdParts::of(id).ms)
}

/// Whether an order id nobody knows (no row, no lease record) may still be drained:
/// admitted by then (never later than a day after its lease, nor than the payment the
/// provider made the event for, `created_ms`) and not yet [`UNKNOWN_ORDER_WAIT_MS`] past
/// that. An id stamped past any lease issued by now never was an order.
fn may_still_appear(id: OrderId, created_ms: Option<i64>, now: UnixMillis) -> bool {
    let leased = leased_ms(id);
    if leased > now.saturating_add(LEASE_AHEAD_MS) {
        return false;
    }
    let latest = leased.saturating_add(MAX_BLOCK_AGE_MS);
    let admitted_by = created_ms.map_or(latest, |c| c.clamp(leased, latest));
    now < admitted_by.saturating_add(UNKNOWN_ORDER_WAIT_MS)
}

/// [`undrained_anywhere`] for the buyer's own order (no close, no deadline, no row when
/// looked at): its bucket's stream.
async fn not_drained(app: &App, order: &FoundOrder, now: UnixMillis) -> Result<bool, ApiError> {
    let sales = app.sales().await?;
    let since = leased_ms(order.id).saturating_sub(LEASE_AHEAD_MS).min(now);
    if undrained_orders(sales, order.bucket, since)
        .await?
        .iter()
        .any(|o| o.id == order.id)
    {
        return Ok(true);
    }
    Ok(app.db.order(order.id).await?.is_some())
}

/// Whether order `id` of `voucher`, its buyer not known (so every bucket's stream), still
/// waits undrained, or was written meanwhile (the streams are read first, the row after,
/// as orders move): either way the next delivery decides its payment.
async fn undrained_anywhere(
    app: &App,
    voucher: VoucherId,
    id: OrderId,
    now: UnixMillis,
) -> Result<bool, ApiError> {
    let Some(v) = voucher_of(app, voucher, now).await? else {
        return Ok(false);
    };
    let sales = app.sales().await?;
    let since = leased_ms(id).saturating_sub(LEASE_AHEAD_MS).min(now);
    for b in Bucket::all(voucher, v.buckets) {
        if undrained_orders(sales, b, since)
            .await?
            .iter()
            .any(|o| o.id == id)
        {
            return Ok(true);
        }
    }
    Ok(app.db.order(id).await?.is_some())
}

/// The answer while an order waits in its stream: the provider sends the event again.
fn not_visible_yet(id: OrderId) -> ApiError {
    ApiError::NotDrainedYet { order_id: id }
}

/// The answer to an event of a payment refused for its amount.
fn refused(payment: &PaymentRef, why: &str) -> ApiError {
    ApiError::PaymentMismatch(format!("payment {} refused: {why}", payment.as_str()))
}

/// A payment id names one order: an event naming it for another is refused (that
/// payment's row stands, listed under its own order).
fn same_order(row: &PaymentRow, order: Option<OrderId>) -> Result<(), ApiError> {
    if row.order == order {
        return Ok(());
    }
    tracing::warn!(
        payment = row.payment_id,
        recorded_for = row.order.map(OrderId::get),
        asked_for = order.map(OrderId::get),
        "a payment id sent for a second order"
    );
    Err(ApiError::PaymentReused(format!(
        "payment {} is recorded for another order",
        row.payment_id
    )))
}

/// The answer: the payment's row (without `order_id` when its event named no order
/// readably).
pub(crate) fn outcome_json(row: &PaymentRow) -> Response<Body> {
    let mut body = json!({
        "payment_id": row.payment_id,
        "outcome": row.outcome.as_str(),
    });
    if let Some(order) = row.order {
        body["order_id"] = json!(order.to_string());
    }
    if let Some(reason) = &row.reason {
        body["reason"] = json!(reason);
    }
    json_response(StatusCode::OK, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_shared::order_id::Lease;

    const HOUR: i64 = 3_600_000;

    /// An order id leased at unix `ms`.
    fn leased_at(ms: i64) -> OrderId {
        Lease::new(ms - EPOCH_UNIX_MS, 7).unwrap().id(3).unwrap()
    }

    #[test]
    fn an_unknown_order_is_waited_for_a_bounded_time_after_its_payment() {
        let now = 1_795_000_000_000;
        let id = leased_at(now - HOUR);
        assert_eq!(leased_ms(id), now - HOUR);
        // Paid a minute ago: it may still be drained.
        assert!(may_still_appear(id, Some(now - 60_000), now));
        // Paid longer ago than the wait: decided.
        let paid = now - UNKNOWN_ORDER_WAIT_MS - 1;
        assert!(!may_still_appear(leased_at(paid - HOUR), Some(paid), now));
        // A payment said to be older than the lease waits from the lease; no time said,
        // or one past the block's last day, waits from the block's last day.
        assert!(may_still_appear(id, Some(0), now));
        assert!(may_still_appear(id, None, now));
        let old = leased_at(now - MAX_BLOCK_AGE_MS - UNKNOWN_ORDER_WAIT_MS - 1);
        assert!(!may_still_appear(old, None, now));
        assert!(!may_still_appear(old, Some(i64::MAX), now));
        // Stamped past every lease issued by now: never an order.
        assert!(!may_still_appear(leased_at(now + 2 * HOUR), Some(now), now));
        assert!(may_still_appear(leased_at(now + 60_000), Some(now), now));
    }
}

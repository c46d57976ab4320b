//! Paying for an order, for vouchers with a payment step: the buyer starts a payment,
//! the payment provider says how it ended, the buyer may cancel an unpaid order.
//!
//! - `POST /orders/{order_id}/pay` (the buyer) only starts a payment: it answers what a
//!   checkout needs (order, amount, currency, `pay_by`) and changes nothing. A buyer's
//!   token can never make an order paid.
//! - `POST /payments/webhook` (the provider, no token) is the only way an order becomes
//!   paid: the event's signature is checked on the raw body before anything is read
//!   ([`seckill_shared::webhook`]), the payment is recorded once per provider payment id
//!   ([`Payments`]: one payment pays at most one order), then Redis closes the order
//!   (`lua/close.lua`, decided once). A payment that arrives after its order expired or
//!   was cancelled never reopens it nor takes back a unit sold again: it is recorded
//!   `refund_due`, counted, and answered 200 (the provider must stop resending).
//! - `POST /orders/{order_id}/cancel` (the buyer) closes an unpaid order; its unit goes
//!   back on sale.
//!
//! Every close is decided in Redis first; the drainer writes it to the database later.

use http::StatusCode;
use lambda_http::{Body, Request, Response};
use seckill_shared::adapters::closes::restore_deadlines;
use seckill_shared::adapters::payments::{NewPayment, Outcome, PaymentRow, Payments};
use seckill_shared::adapters::redis::{CloseAction, RedisSales};
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{
    Bucket, ClosedOrder, OrderId, OrderStatus, PaymentRef, UnixMillis, UserId, Voucher, VoucherId,
    format_rfc3339_millis,
};
use seckill_shared::webhook::{self, Event, EventType};
use serde_json::json;

use crate::app::App;
use crate::error::{ApiError, json_response};
use crate::lookup::{sale_lost, voucher_of};
use crate::request::MAX_BODY_BYTES;
use seckill_shared::auth::Identity;

pub use crate::secrets::SecretSource;

/// An order found for its buyer: its voucher (with a payment step) and bucket, and its
/// database row if it was drained.
struct FoundOrder {
    id: OrderId,
    voucher: Voucher,
    bucket: Bucket,
    row: Option<(OrderStatus, Option<UnixMillis>)>,
}

impl FoundOrder {
    /// The database refused the order (its stock could not cover it): it never held a
    /// unit, and can be neither paid nor cancelled.
    fn rejected(&self) -> bool {
        matches!(self.row, Some((OrderStatus::Rejected, _)))
    }
}

/// The order `id` of `buyer`, of a voucher with a payment step. 404 when it is not
/// theirs or unknown; 409 `payment_not_required` to its buyer for a voucher without a
/// payment step. (An order the database refused is found, `rejected`.)
async fn find_order(
    app: &App,
    id: OrderId,
    buyer: &UserId,
    now: UnixMillis,
) -> Result<FoundOrder, ApiError> {
    let not_found = || ApiError::NotFound(format!("order {id} not found"));
    // The voucher the order belongs to: its row once drained, else its id's lease record.
    let row = app.db.order(id).await?;
    let voucher = match &row {
        Some((_, owner, ..)) if owner != buyer => return Err(not_found()),
        Some((voucher, ..)) => *voucher,
        None => match app.sales().await?.voucher_of_order(id).await? {
            Some(voucher) => voucher,
            None => return Err(not_found()),
        },
    };
    let Some(voucher) = voucher_of(app, voucher, now).await? else {
        return Err(not_found());
    };
    let bucket = voucher.bucket_of(buyer.as_str());
    if voucher.payment.is_none() {
        // Only the order's buyer learns what kind of order it is.
        let sales = app.sales().await?;
        let theirs = row.is_some() || sales.order_of_buyer(bucket, buyer).await? == Some(id);
        return Err(if theirs {
            ApiError::PaymentNotRequired
        } else {
            not_found()
        });
    }
    if row.is_none() {
        // Not drained yet: Redis says whose it is (its close names the buyer, its
        // deadline member is `<order>\n<buyer>`, the buyers hash maps buyer to order).
        let sales = app.sales().await?;
        let (closed, deadline) = sales.payment_state(bucket, id, buyer).await?;
        let theirs = closed.is_some()
            || deadline.is_some()
            || sales.order_of_buyer(bucket, buyer).await? == Some(id);
        if !theirs {
            // Redis lost the sale: the order may wait in the stream, and a provider told
            // 404 would stop sending its payment for good.
            if sale_lost(sales, bucket).await? {
                return Err(ApiError::sale_being_restored(voucher.id));
            }
            return Err(not_found());
        }
    }
    Ok(FoundOrder {
        id,
        voucher,
        bucket,
        row: row.map(|(_, _, status, pay_by)| (status, pay_by)),
    })
}

/// Closes `order` for `buyer` as `action` asks: in Redis (`lua/close.lua`, the first
/// close wins and every later call is told that one), or, when Redis knows the order
/// neither open nor closed (its keys expired after the sale, or were lost), from the
/// database's row: an order still awaiting payment gets its deadline back and is closed
/// as always; a closed one is told as it stands. `None`: no such order of `buyer`.
async fn close(
    app: &App,
    order: &FoundOrder,
    buyer: &UserId,
    action: &CloseAction,
) -> Result<Option<ClosedOrder>, ApiError> {
    let sales = app.sales().await?;
    let (id, bucket) = (order.id, order.bucket);
    let mut closed = sales.close(bucket, id, buyer, action).await?;
    if closed.is_none()
        && let Some((status, pay_by)) = order.row
    {
        closed = match (status, pay_by) {
            (OrderStatus::AwaitingPayment, Some(pay_by)) => {
                // Its deadline back (as the repair and the drainer restore it), then the
                // close decides as always.
                let open = [(id, buyer.as_str(), pay_by)];
                restore_deadlines(&sales.conn(), bucket, &open).await?;
                sales.close(bucket, id, buyer, action).await?
            }
            (OrderStatus::Paid | OrderStatus::Cancelled | OrderStatus::Expired, _) => {
                let payment_ref = match status {
                    OrderStatus::Paid => app.db.payment_ref(id).await?.unwrap_or_default(),
                    _ => String::new(),
                };
                Some(ClosedOrder {
                    status,
                    pay_by_ms: pay_by.unwrap_or_default(),
                    payment_ref,
                    user: buyer.as_str().to_string(),
                })
            }
            _ => None,
        };
    }
    if let Some(c) = &closed
        && c.status.returned_unit()
    {
        unit_returned(app, sales, &order.voucher).await;
    }
    Ok(closed)
}

/// A unit is back on sale (in the buyer's bucket): this instance must not keep answering
/// sold out, nor may the voucher's sold-out mark stay.
async fn unit_returned(app: &App, sales: &RedisSales, voucher: &Voucher) {
    app.cache.forget_sold_out(voucher.id);
    if voucher.buckets > 1
        && let Err(error) = transfers::clear_sold_out(&sales.conn(), voucher.id).await
    {
        // The close stands; the mark expires by itself within seconds.
        tracing::warn!(%error, "sold-out mark not cleared after a returned unit");
    }
}

/// `POST /orders/{order_id}/pay` (the buyer): what a checkout needs to take the payment
/// (the order, its amount and currency, the deadline); nothing changes. An order that
/// is no longer open says why (paid, cancelled, expired).
pub(crate) async fn start_payment(
    app: &App,
    caller: &Identity,
    now: UnixMillis,
    id: OrderId,
) -> Result<Response<Body>, ApiError> {
    // Limited per user by the route, on this instance and across all of them.
    let order = find_order(app, id, &caller.user, now).await?;
    if order.rejected() {
        return Err(ApiError::OrderRejected);
    }
    let (closed, deadline) = app
        .sales()
        .await?
        .payment_state(order.bucket, id, &caller.user)
        .await?;
    // As the order lookups say it: Redis's close first, else the database's row, else
    // `pending` (admitted, not drained yet).
    let status = match (&closed, order.row) {
        (Some(c), _) => c.status,
        (None, Some((status, _))) => status,
        (None, None) => OrderStatus::Pending,
    };
    let pay_by = closed
        .as_ref()
        .map(|c| c.pay_by_ms)
        .or(deadline)
        .or(order.row.and_then(|r| r.1));
    match status {
        OrderStatus::Paid => return Err(ApiError::AlreadyPaid),
        OrderStatus::Cancelled => return Err(ApiError::OrderCancelled),
        OrderStatus::Expired => return Err(ApiError::OrderExpired),
        OrderStatus::Rejected => return Err(ApiError::OrderRejected),
        _ => {}
    }
    if pay_by.is_some_and(|p| now >= p) {
        // Past its deadline: the sweep expires it at once (any payment now is refunded).
        return Err(ApiError::OrderExpired);
    }
    let terms = order.voucher.payment.expect("find_order: a payment step");
    let mut body = json!({
        "order_id": id.to_string(),
        "voucher_id": order.voucher.id.to_string(),
        "status": status.as_str(),
    });
    if let Some(ms) = pay_by {
        body["pay_by"] = json!(format_rfc3339_millis(ms));
    }
    if let Some(price) = terms.price {
        body["amount_minor"] = json!(price.amount_minor());
        body["currency"] = json!(price.currency());
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// `POST /orders/{order_id}/cancel` (the buyer): closes an unpaid order, whose unit goes
/// back on sale. Cancelling again is answered as the first time; a paid order cannot be
/// cancelled.
pub(crate) async fn cancel_order(
    app: &App,
    caller: &Identity,
    now: UnixMillis,
    id: OrderId,
) -> Result<Response<Body>, ApiError> {
    // Limited per user by the route, on this instance and across all of them.
    let order = find_order(app, id, &caller.user, now).await?;
    if order.rejected() {
        return Err(ApiError::OrderRejected);
    }
    let Some(closed) = close(app, &order, &caller.user, &CloseAction::Cancel).await? else {
        return Err(ApiError::NotFound(format!("order {id} not found")));
    };
    match closed.status {
        OrderStatus::Cancelled => {}
        OrderStatus::Paid => return Err(ApiError::OrderPaid),
        _ => return Err(ApiError::OrderExpired),
    }
    tracing::info!(
        voucher_id = order.voucher.id.get(),
        order_id = id.get(),
        "order cancelled"
    );
    Ok(order_json(order.voucher.id, id, &closed))
}

fn order_json(voucher: VoucherId, id: OrderId, closed: &ClosedOrder) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({
            "order_id": id.to_string(),
            "voucher_id": voucher.to_string(),
            "status": closed.status.as_str(),
            "pay_by": format_rfc3339_millis(closed.pay_by_ms),
        }),
    )
}

/// The longest provider event id recorded (`payments.event_id`).
const MAX_EVENT_ID_CHARS: usize = 128;

/// `POST /payments/webhook` (the payment provider; no token: the signature is the
/// authentication). Answers 200 with the payment's outcome once the event is taken into
/// account, however often it comes; 4xx for an event that can never be (bad signature,
/// unknown order, wrong amount, a payment id of another order), which the provider
/// must not resend; 503 when a backend failed (the provider resends later).
pub(crate) async fn webhook(
    app: &App,
    req: &Request,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let body = req.body().as_ref();
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "body is larger than {MAX_BODY_BYTES} bytes"
        )));
    }
    let secrets = app.webhook.get().await?;
    let header = match req.headers().get(webhook::SIGNATURE_HEADER) {
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::Unauthorized(format!("{} must be ASCII", webhook::SIGNATURE_HEADER))
        })?),
        None => None,
    };
    webhook::verify(&secrets, header, body, now.div_euclid(1000))
        .map_err(|e| ApiError::Unauthorized(format!("webhook signature refused: {e}")))?;
    // Authentic from here on.
    let event: Event = serde_json::from_slice(body)
        .map_err(|e| ApiError::InvalidRequest(format!("not a payment event: {e}")))?;
    let payment = PaymentRef::parse(&event.data.payment_id)?;
    let id: OrderId = event.data.order_id.parse()?;
    // The columns the event is recorded in: refused here, never a failed write later.
    if event.id.is_empty() || event.id.chars().count() > MAX_EVENT_ID_CHARS {
        return Err(ApiError::InvalidRequest(format!(
            "the event id must be 1 to {MAX_EVENT_ID_CHARS} characters"
        )));
    }
    if !(event.data.currency.len() == 3
        && event.data.currency.bytes().all(|b| b.is_ascii_uppercase()))
    {
        return Err(ApiError::InvalidRequest(
            "currency must be three upper-case letters (ISO 4217)".into(),
        ));
    }
    // A buyer no user id can be is no order's buyer: the same answer as another's.
    let buyer = UserId::parse(&event.data.buyer)
        .map_err(|_| ApiError::NotFound(format!("no order {id} of that buyer")))?;
    let order = find_order(app, id, &buyer, now).await?;
    let ledger = Payments(&app.db);
    let new = NewPayment {
        payment_id: payment.as_str(),
        order: id,
        voucher: order.voucher.id,
        amount_minor: event.data.amount_minor,
        currency: &event.data.currency,
        event_id: &event.id,
        received_ms: now,
    };
    let price = order.voucher.payment.and_then(|p| p.price);
    let matches = price.is_some_and(|p| {
        p.amount_minor() == event.data.amount_minor && p.currency() == event.data.currency
    });
    // Only money taken is held to the price: a failed attempt took none, whatever it
    // says it was for, and must not settle the payment id against a later success
    // (the provider retries a card under the same id).
    if !matches && event.kind == EventType::Succeeded {
        let why = match price {
            Some(p) => format!(
                "paid {} {}, the price is {} {}",
                event.data.amount_minor,
                event.data.currency,
                p.amount_minor(),
                p.currency()
            ),
            None => "the voucher has no price".to_string(),
        };
        let row = ledger.record(&new, Outcome::Refused, Some(&why)).await?;
        same_order(&row, id)?;
        match row.outcome {
            // Recorded before by an attempt that failed: this success took the wrong
            // amount, and the row must say so, to be refunded.
            Outcome::Failed => {
                ledger.decide(&new, Outcome::Refused, Some(&why)).await?;
            }
            // Recorded by an earlier event not decided yet (in flight, or answered 503):
            // were this one answered 422, the provider would stop sending it, and that
            // event could still end the row `failed`, the money taken listed nowhere.
            // Asked again once the row is decided, it is refused for good.
            Outcome::Received => {
                return Err(ApiError::unavailable(
                    "database",
                    format!(
                        "payment {} is being decided by an earlier event: send this one again",
                        payment.as_str()
                    ),
                ));
            }
            _ => {}
        }
        tracing::warn!(
            order_id = id.get(),
            payment = payment.as_str(),
            why,
            "payment refused"
        );
        return Err(refused(&payment, &why));
    }
    let row = ledger.record(&new, Outcome::Received, None).await?;
    same_order(&row, id)?;
    if row.outcome == Outcome::Refused {
        // Refused for good by an earlier event (a success for the wrong amount): told
        // the same way, whatever this one says.
        return Err(refused(
            &payment,
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
                false => close(app, &order, &buyer, &action).await?,
            };
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

/// The answer to an event of a payment refused for its amount.
fn refused(payment: &PaymentRef, why: &str) -> ApiError {
    ApiError::PaymentMismatch(format!("payment {} refused: {why}", payment.as_str()))
}

/// A payment id names one order: an event naming it for another is refused.
fn same_order(row: &PaymentRow, order: OrderId) -> Result<(), ApiError> {
    if row.order == order {
        return Ok(());
    }
    tracing::warn!(
        payment = row.payment_id,
        recorded_for = row.order.get(),
        asked_for = order.get(),
        "a payment id sent for a second order"
    );
    Err(ApiError::PaymentReused(format!(
        "payment {} is recorded for another order",
        row.payment_id
    )))
}

fn outcome_json(row: &PaymentRow) -> Response<Body> {
    let mut body = json!({
        "payment_id": row.payment_id,
        "order_id": row.order.to_string(),
        "outcome": row.outcome.as_str(),
    });
    if let Some(reason) = &row.reason {
        body["reason"] = json!(reason);
    }
    json_response(StatusCode::OK, &body)
}

//! Paying for an order, for vouchers with a payment step: the buyer starts a payment,
//! the buyer may cancel an unpaid order; and what both share with the payment
//! provider's events (`crate::webhook`): finding an order for its buyer, closing it.
//!
//! - `POST /orders/{order_id}/pay` (the buyer) only starts a payment: it answers what a
//!   checkout needs (order, amount, currency, `pay_by`; with Stripe, the order's one
//!   PaymentIntent and its `client_secret`, `crate::stripe`) and changes no order. A buyer's
//!   token can never make an order paid: only the provider's signed event does.
//! - `POST /orders/{order_id}/cancel` (the buyer) closes an unpaid order; its unit goes
//!   back on sale.
//!
//! Every close is decided in Redis first; the drainer writes it to the database later.

use http::StatusCode;
use lambda_http::{Body, Response};
use seckill_shared::adapters::closes::restore_deadlines;
use seckill_shared::adapters::redis::{CloseAction, RedisSales};
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{
    Bucket, ClosedOrder, OrderId, OrderStatus, UnixMillis, UserId, Voucher, VoucherId,
    format_rfc3339_millis,
};
use serde_json::json;

use crate::app::App;
use crate::error::{ApiError, json_response};
use crate::lookup::{sale_lost, voucher_of};

pub use crate::secrets::SecretSource;

/// An order found for its buyer: its voucher (with a payment step) and bucket, and its
/// database row if it was drained.
pub(crate) struct FoundOrder {
    pub id: OrderId,
    pub buyer: UserId,
    pub voucher: Voucher,
    pub bucket: Bucket,
    pub row: Option<(OrderStatus, Option<UnixMillis>)>,
}

impl FoundOrder {
    /// The database refused the order (its stock could not cover it): it never held a
    /// unit, and can be neither paid nor cancelled.
    pub fn rejected(&self) -> bool {
        matches!(self.row, Some((OrderStatus::Rejected, _)))
    }
}

/// What is known of an order id for a buyer ([`look_up`]).
pub(crate) enum Lookup {
    /// The buyer's order, of a voucher with a payment step (an order the database
    /// refused too: `rejected`).
    Theirs(FoundOrder),
    /// An order of a voucher without a payment step (`theirs`: the buyer's).
    NoPaymentStep { voucher: Voucher, theirs: bool },
    /// An order that exists and is not the buyer's, as its row says (`drained`) or, not
    /// drained yet, as Redis says (which a lost sale's repair may not have rebuilt yet).
    NotTheirs { voucher: VoucherId, drained: bool },
    /// Neither the database nor the id's lease record knows the id (nor a voucher the
    /// lease record names): made up, or admitted and not drained yet by an instance
    /// whose lease record Redis lost since.
    Unknown,
}

/// What is known of order `id` for `buyer` (`None`: nobody, as for a provider's event
/// whose buyer no user id can be). `503` while Redis has lost the sale of an order not
/// drained yet that Redis does not show as the buyer's: it may wait in the stream.
pub(crate) async fn look_up(
    app: &App,
    id: OrderId,
    buyer: Option<&UserId>,
    now: UnixMillis,
) -> Result<Lookup, ApiError> {
    // The voucher the order belongs to: its row once drained, else its id's lease record.
    let row = app.db.order(id).await?;
    let voucher = match &row {
        Some((voucher, owner, ..)) if Some(owner) != buyer => {
            return Ok(Lookup::NotTheirs {
                voucher: *voucher,
                drained: true,
            });
        }
        Some((voucher, ..)) => *voucher,
        None => match app.sales().await?.voucher_of_order(id).await? {
            Some(voucher) => voucher,
            None => return Ok(Lookup::Unknown),
        },
    };
    let Some(voucher) = voucher_of(app, voucher, now).await? else {
        return Ok(Lookup::Unknown);
    };
    let Some(buyer) = buyer else {
        return Ok(match voucher.payment {
            None => Lookup::NoPaymentStep {
                voucher,
                theirs: false,
            },
            Some(_) => Lookup::NotTheirs {
                voucher: voucher.id,
                drained: false,
            },
        });
    };
    let bucket = voucher.bucket_of(buyer.as_str());
    if voucher.payment.is_none() {
        let sales = app.sales().await?;
        let theirs = row.is_some() || sales.order_of_buyer(bucket, buyer).await? == Some(id);
        return Ok(Lookup::NoPaymentStep { voucher, theirs });
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
            return Ok(Lookup::NotTheirs {
                voucher: voucher.id,
                drained: false,
            });
        }
    }
    Ok(Lookup::Theirs(FoundOrder {
        id,
        buyer: buyer.clone(),
        voucher,
        bucket,
        row: row.map(|(_, _, status, pay_by)| (status, pay_by)),
    }))
}

/// The order `id` of `buyer`, of a voucher with a payment step: the one preamble of the
/// buyer's order routes (pay, cancel; limited per user by the route, on this instance
/// and across all of them). 404 when it is not theirs or unknown; 409
/// `payment_not_required` to its buyer for a voucher without a payment step (only the
/// order's buyer learns what kind of order it is); 409 `order_rejected` for an order the
/// database refused.
pub(crate) async fn find_order(
    app: &App,
    id: OrderId,
    buyer: &UserId,
    now: UnixMillis,
) -> Result<FoundOrder, ApiError> {
    match look_up(app, id, Some(buyer), now).await? {
        Lookup::Theirs(order) if order.rejected() => Err(ApiError::OrderRejected),
        Lookup::Theirs(order) => Ok(order),
        Lookup::NoPaymentStep { theirs: true, .. } => Err(ApiError::PaymentNotRequired),
        _ => Err(ApiError::NotFound(format!("order {id} not found"))),
    }
}

/// Closes `order` for `buyer` as `action` asks: in Redis (`lua/close.lua`, the first
/// close wins and every later call is told that one), or, when Redis knows the order
/// neither open nor closed (its keys expired after the sale, or were lost), from the
/// database's row: an order still awaiting payment gets its deadline back and is closed
/// as always; a closed one is told as it stands. `None`: no such order of `buyer`.
pub(crate) async fn close(
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
        unit_returned(app, sales, &order.voucher, bucket).await;
    }
    Ok(closed)
}

/// A unit is back on sale (in the buyer's bucket): this instance must not keep answering
/// sold out, nor may the voucher's sold-out mark stay. A sale with a waiting room holds
/// it for the line in bucket 0: one given back in another bucket is delivered there now
/// (the drainer's survey does it if this instance dies first).
async fn unit_returned(app: &App, sales: &RedisSales, voucher: &Voucher, bucket: Bucket) {
    if voucher.room.is_some()
        && let Err(error) = transfers::deliver_returned(sales, bucket).await
    {
        tracing::warn!(%error, %bucket, "a returned unit not yet delivered to the line; the drainer will");
    }
    app.cache.forget_sold_out(voucher.id);
    if voucher.buckets > 1
        && let Err(error) = transfers::clear_sold_out(&sales.conn(), voucher.id).await
    {
        // The close stands; the mark expires by itself within seconds.
        tracing::warn!(%error, "sold-out mark not cleared after a returned unit");
    }
}

/// `POST /orders/{order_id}/pay` (the buyer): what a checkout needs to take the payment
/// (the order, its amount and currency, the deadline), as JSON; with Stripe the route
/// adds the order's PaymentIntent (`crate::stripe::attach_intent`). No order changes,
/// but with Stripe a checkout before the deadline gives the order its grace
/// (`lua/grace.lua`). An order that is no longer open says why (paid, cancelled,
/// expired).
pub(crate) async fn checkout(
    app: &App,
    now: UnixMillis,
    order: &FoundOrder,
) -> Result<serde_json::Value, ApiError> {
    let id = order.id;
    let sales = app.sales().await?;
    let (closed, deadline) = sales.payment_state(order.bucket, id, &order.buyer).await?;
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
    let terms = order.voucher.payment.expect("find_order: a payment step");
    // With Stripe the payment starts at the provider now: it holds the unit past the
    // deadline for the grace, once (lua/grace.lua), so its success delivered late pays.
    let expiry = match (&app.stripe, terms.price) {
        (Some(_), Some(_)) if pay_by.is_some() => sales
            .grace(order.bucket, id, &order.buyer, app.payment_grace_ms)
            .await?
            .map(|(expiry, _)| expiry)
            .or(pay_by),
        _ => pay_by,
    };
    if expiry.is_some_and(|p| now >= p) {
        // Past its deadline: the sweep expires it at once (any payment now is refunded).
        return Err(ApiError::OrderExpired);
    }
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
    Ok(body)
}

/// `POST /orders/{order_id}/cancel` (the buyer): closes an unpaid order, whose unit goes
/// back on sale. Cancelling again is answered as the first time; a paid order cannot be
/// cancelled.
pub(crate) async fn cancel_order(app: &App, order: FoundOrder) -> Result<Response<Body>, ApiError> {
    let id = order.id;
    let Some(closed) = close(app, &order, &order.buyer, &CloseAction::Cancel).await? else {
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

//! The orders a buyer reads: `GET /orders/{order_id}` and `GET /vouchers/{id}/order`,
//! from the database once drained, from Redis while pending, with closes Redis decided
//! and the database has not recorded yet.

use http::StatusCode;
use lambda_http::{Body, Response};
use seckill_shared::auth::Identity;
use seckill_shared::domain::{
    Bucket, OrderId, OrderStatus, UnixMillis, UserId, VoucherId, format_rfc3339_millis, now_millis,
};
use serde_json::json;

use crate::app::App;
use crate::error::{ApiError, json_response};
use crate::lookup::{sale_shape, voucher_of};

/// `GET /orders/{order_id}` (the buyer): `confirmed`/`rejected` from the database,
/// `pending` while admitted in Redis and not yet drained. Another user's order is 404.
///
/// A pending order is found through its id, which names the voucher it was issued for
/// (the lease's `block → voucher` record), and then the caller's order for that voucher
/// ([`caller_order`]). If Redis lost the lease record the voucher cannot be named from
/// the id alone: the answer is 404 with a pointer to `GET /vouchers/{id}/order`, which
/// needs no such record.
pub(crate) async fn get_order(
    app: &App,
    caller: &Identity,
    id: OrderId,
) -> Result<Response<Body>, ApiError> {
    let not_found = || {
        ApiError::NotFound(format!(
            "order {id} not found (GET /vouchers/{{voucher_id}}/order finds your order for a voucher)"
        ))
    };
    if let Some((voucher, buyer, status, pay_by)) = app.db.order(id).await? {
        if buyer != caller.user {
            return Err(not_found());
        }
        let view = overlay_close(app, voucher, &caller.user, (id, status, pay_by)).await?;
        return Ok(order_json(voucher, view));
    }
    let Some(voucher) = app.sales().await?.voucher_of_order(id).await? else {
        return Err(not_found());
    };
    match caller_order(app, voucher, &caller.user).await? {
        Some(view) if view.0 == id => Ok(order_json(voucher, view)),
        _ => {
            // Not the buyer's current order: it may be one they cancelled or let expire
            // before it was drained (a voucher that lets them buy again no longer lists
            // it among the buyers).
            let bucket = buyer_bucket(app, voucher, &caller.user).await?;
            let (closed, _) = app
                .sales()
                .await?
                .payment_state(bucket, id, &caller.user)
                .await?;
            match closed {
                Some(c) => Ok(order_json(voucher, (id, c.status, Some(c.pay_by_ms)))),
                None => Err(not_found()),
            }
        }
    }
}

/// An order's status with what Redis decided since the database last heard of it: a
/// `pending` or `awaiting_payment` order may already be paid, cancelled or expired
/// (the drainer records closes on its next run), and a pending order's deadline is in
/// Redis only. Other statuses are final and cost no Redis call.
async fn overlay_close(
    app: &App,
    voucher: VoucherId,
    user: &UserId,
    view: OrderView,
) -> Result<OrderView, ApiError> {
    let (id, status, pay_by) = view;
    if !matches!(status, OrderStatus::Pending | OrderStatus::AwaitingPayment) {
        return Ok(view);
    }
    let bucket = buyer_bucket(app, voucher, user).await?;
    let (closed, deadline) = app.sales().await?.payment_state(bucket, id, user).await?;
    Ok(match closed {
        Some(c) => (id, c.status, Some(c.pay_by_ms)),
        None => (id, status, pay_by.or(deadline)),
    })
}

/// `GET /vouchers/{id}/order` (the buyer): the caller's order for a voucher, found by
/// (voucher, user): from the database once drained, else from the voucher's buyers hash
/// in Redis (`pending`). 404 when the caller holds none.
pub(crate) async fn buyer_order(
    app: &App,
    caller: &Identity,
    id: VoucherId,
) -> Result<Response<Body>, ApiError> {
    match caller_order(app, id, &caller.user).await? {
        Some(view) => Ok(order_json(id, view)),
        None => Err(ApiError::NotFound(format!(
            "you hold no order for voucher {id}"
        ))),
    }
}

/// The order `user` holds for `voucher` and its status. The database first (a drained
/// order, confirmed or rejected, even if Redis lost it), then the buyers hash (admitted,
/// `pending`), then the database again: the drainer may have committed between the two
/// reads, and a drained order's status is the database's.
async fn caller_order(
    app: &App,
    voucher: VoucherId,
    user: &UserId,
) -> Result<Option<OrderView>, ApiError> {
    let in_db = app.db.order_of_buyer(voucher, user).await?;
    let found = match in_db {
        // A drained order that still counts is the buyer's order.
        Some(found) if !found.1.returned_unit() => Some(found),
        // None drained, or only one they cancelled or let expire: a newer admitted order
        // (a voucher that lets them buy again) is theirs now.
        closed => match app
            .sales()
            .await?
            .order_of_buyer(buyer_bucket(app, voucher, user).await?, user)
            .await?
        {
            Some(held) if closed.is_none_or(|c| c.0 != held) => Some(
                // Drained meanwhile? The database's word then.
                match app.db.order_of_buyer(voucher, user).await? {
                    Some(found) if found.0 == held => found,
                    _ => (held, OrderStatus::Pending, None),
                },
            ),
            _ => closed,
        },
    };
    match found {
        Some(view) => Ok(Some(overlay_close(app, voucher, user, view).await?)),
        None => Ok(None),
    }
}

/// An order as a buyer sees it: id, status, payment deadline (vouchers with a payment
/// step).
type OrderView = (OrderId, OrderStatus, Option<UnixMillis>);

/// The bucket `user` buys from in `voucher` (bucket 0 of a voucher the database does
/// not know: nothing is found there either).
async fn buyer_bucket(app: &App, voucher: VoucherId, user: &UserId) -> Result<Bucket, ApiError> {
    let now = now_millis();
    // This instance's memory, else bucket 0's sale hash (one Redis read, as an
    // admission makes), else the database.
    let buckets = match app.cache.look(voucher, now).1 {
        Some(shape) => shape.buckets,
        None => match sale_shape(app, app.sales().await?, voucher).await? {
            Some(shape) => shape.buckets,
            None => voucher_of(app, voucher, now)
                .await?
                .map_or(1, |v| v.buckets),
        },
    };
    Ok(Bucket::of_user(voucher, buckets, user.as_str()))
}

fn order_json(voucher: VoucherId, (id, status, pay_by): OrderView) -> Response<Body> {
    let mut body = json!({ "order_id": id.to_string(), "voucher_id": voucher.to_string(), "status": status.as_str() });
    if let Some(ms) = pay_by {
        body["pay_by"] = json!(format_rfc3339_millis(ms));
    }
    json_response(StatusCode::OK, &body)
}

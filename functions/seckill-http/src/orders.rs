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
use crate::lookup::{sale_lost, sale_shape, voucher_of};

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
        let buyer = Buyer::new(app, voucher, &caller.user);
        let view = overlay_close(&buyer, (id, status, pay_by)).await?;
        return Ok(order_json(voucher, view));
    }
    let Some(voucher) = app.sales().await?.voucher_of_order(id).await? else {
        return Err(not_found());
    };
    let buyer = Buyer::new(app, voucher, &caller.user);
    match caller_order(&buyer).await? {
        Some(view) if view.0 == id => Ok(order_json(voucher, view)),
        _ => {
            // Not the buyer's current order: it may be one they cancelled or let expire
            // before it was drained (a voucher that lets them buy again no longer lists
            // it among the buyers).
            let bucket = buyer.bucket().await?;
            let (closed, _) = app
                .sales()
                .await?
                .payment_state(bucket, id, &caller.user)
                .await?;
            match closed {
                Some(c) => Ok(order_json(voucher, (id, c.status, Some(c.pay_by_ms)))),
                None => Err(unless_lost(app, bucket, not_found()).await?),
            }
        }
    }
}

/// An order's status with what Redis decided since the database last heard of it: a
/// `pending` or `awaiting_payment` order may already be paid, cancelled or expired
/// (the drainer records closes on its next run), and a pending order's deadline is in
/// Redis only. Other statuses are final and cost no Redis call.
async fn overlay_close(buyer: &Buyer<'_>, view: OrderView) -> Result<OrderView, ApiError> {
    let (id, status, pay_by) = view;
    if !matches!(status, OrderStatus::Pending | OrderStatus::AwaitingPayment) {
        return Ok(view);
    }
    let bucket = buyer.bucket().await?;
    let (closed, deadline) = (buyer.app.sales().await?)
        .payment_state(bucket, id, buyer.user)
        .await?;
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
    let buyer = Buyer::new(app, id, &caller.user);
    match caller_order(&buyer).await? {
        Some(view) => Ok(order_json(id, view)),
        None => {
            let bucket = buyer.bucket().await?;
            let none = ApiError::NotFound(format!("you hold no order for voucher {id}"));
            Err(unless_lost(app, bucket, none).await?)
        }
    }
}

/// `not_found`, unless Redis lost the buyer's sale (its buyers hash with it) and the
/// order may still wait in the stream: then not found is no truthful answer, and the
/// caller is asked to come back (`503`) once the sale is repaired or the order drained.
async fn unless_lost(app: &App, bucket: Bucket, not_found: ApiError) -> Result<ApiError, ApiError> {
    if sale_lost(app.sales().await?, bucket).await? {
        return Ok(ApiError::sale_being_restored(bucket.voucher()));
    }
    Ok(not_found)
}

/// The order `user` holds for `voucher` and its status. The database first (a drained
/// order, confirmed or rejected, even if Redis lost it) with the close Redis decided
/// since, then the buyers hash (admitted, `pending`), then the database again: the
/// drainer may have committed between the two reads, and a drained order's status is the
/// database's.
///
/// The close is laid over the drained order *before* deciding whether it still counts:
/// a buyer who cancelled a drained order and bought again (a voucher that allows it)
/// holds the new order even while the database still reads the old one
/// `awaiting_payment` (the drainer records the cancel on its next run).
async fn caller_order(buyer: &Buyer<'_>) -> Result<Option<OrderView>, ApiError> {
    let Buyer {
        app, voucher, user, ..
    } = *buyer;
    let in_db = match app.db.order_of_buyer(voucher, user).await? {
        Some(found) => Some(overlay_close(buyer, found).await?),
        None => None,
    };
    // A drained order that still counts is the buyer's order.
    if let Some(view) = in_db.filter(|v| !v.1.returned_unit()) {
        return Ok(Some(view));
    }
    // None drained, or only one they cancelled or let expire: a newer admitted order
    // (a voucher that lets them buy again) is theirs now.
    let held = app
        .sales()
        .await?
        .order_of_buyer(buyer.bucket().await?, user)
        .await?;
    match held {
        Some(held) if in_db.is_none_or(|c| c.0 != held) => {
            // Drained meanwhile? The database's word then.
            let view = match app.db.order_of_buyer(voucher, user).await? {
                Some(found) if found.0 == held => found,
                _ => (held, OrderStatus::Pending, None),
            };
            Ok(Some(overlay_close(buyer, view).await?))
        }
        _ => Ok(in_db),
    }
}

/// An order as a buyer sees it: id, status, payment deadline (vouchers with a payment
/// step).
type OrderView = (OrderId, OrderStatus, Option<UnixMillis>);

/// The caller and the voucher a lookup is about, with the caller's bucket found at most
/// once per request (on an instance that never saw the voucher it costs a Redis read,
/// and a database read for a voucher Redis does not hold).
struct Buyer<'a> {
    app: &'a App,
    voucher: VoucherId,
    user: &'a UserId,
    bucket: std::sync::OnceLock<Bucket>,
}

impl<'a> Buyer<'a> {
    fn new(app: &'a App, voucher: VoucherId, user: &'a UserId) -> Buyer<'a> {
        Buyer {
            app,
            voucher,
            user,
            bucket: std::sync::OnceLock::new(),
        }
    }

    /// The bucket the caller buys from ([`buyer_bucket`]).
    async fn bucket(&self) -> Result<Bucket, ApiError> {
        if let Some(b) = self.bucket.get() {
            return Ok(*b);
        }
        let b = buyer_bucket(self.app, self.voucher, self.user).await?;
        Ok(*self.bucket.get_or_init(|| b))
    }
}

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

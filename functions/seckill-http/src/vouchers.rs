//! The vouchers: `POST /vouchers` (an admin creates a sale: the database, then Redis)
//! and `GET /vouchers/{id}` (anyone: the sale with its live stock).

use http::StatusCode;
use lambda_http::{Body, Request, Response};
use seckill_shared::adapters::queue;
use seckill_shared::domain::{
    NewVoucher, PaymentTerms, UnixMillis, Voucher, VoucherId, format_rfc3339_millis, now_millis,
};
use seckill_shared::json;
use serde::Deserialize;
use serde_json::json;

use crate::app::App;
use crate::cache::Known;
use crate::edge::source_of;
use crate::error::{ApiError, json_response};
use crate::lookup::{not_found_voucher, voucher_of};
use crate::repair::repair;
use crate::request::body_of;

/// The body of `POST /vouchers`. An optional field is absent or holds a value of its
/// type: `null` is refused, as the contract's schema says.
#[derive(Deserialize)]
struct CreateVoucherBody {
    title: String,
    #[serde(deserialize_with = "json::integral")]
    stock: i64,
    begins_at: String,
    ends_at: String,
    /// Opt-in payment step: seconds a buyer has to pay after admission.
    #[serde(default, deserialize_with = "json::optional_integral")]
    pay_within_s: Option<i64>,
    /// With `pay_within_s`: whether a buyer whose order was cancelled or expired may
    /// buy again (default false).
    #[serde(default, deserialize_with = "json::not_null")]
    rebuy_after_close: Option<bool>,
    /// With `rebuy_after_close`: unpaid closes a buyer may have and buy again (1..=10,
    /// default 2).
    #[serde(default, deserialize_with = "json::optional_integral")]
    rebuy_limit: Option<i64>,
    /// With `pay_within_s` (required then): what a buyer pays, in the currency's minor
    /// unit, and the currency (ISO 4217).
    #[serde(default, deserialize_with = "json::optional_integral")]
    price_minor: Option<i64>,
    #[serde(default, deserialize_with = "json::not_null")]
    currency: Option<String>,
    /// Stock buckets, 1..=16 (default 1): the stock split over that many Redis hash
    /// slots, so one hot sale can use several cluster primaries.
    #[serde(default, deserialize_with = "json::optional_integral")]
    buckets: Option<i64>,
    /// Instead of `buckets`: the admissions per second expected at the sale's peak, from
    /// which the buckets are chosen (one per 10,000/s, at most 16).
    #[serde(default, deserialize_with = "json::optional_integral")]
    expected_peak_per_s: Option<i64>,
    /// Opt-in waiting room: buyers let in per second, in the order they joined.
    #[serde(default, deserialize_with = "json::optional_integral")]
    entry_rate_per_s: Option<i64>,
    /// With `entry_rate_per_s`: how long before the start the queue opens (default 900).
    #[serde(default, deserialize_with = "json::optional_integral")]
    queue_opens_before_s: Option<i64>,
}

/// `POST /vouchers` (admin): writes the database, then preloads Redis.
pub(crate) async fn create_voucher(
    app: &App,
    req: &Request,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let body = body_of(req)?;
    let input: CreateVoucherBody = serde_json::from_slice(body).map_err(|e| {
        ApiError::InvalidRequest(format!(
            "body must be a JSON object with title, stock (integer), begins_at and ends_at (RFC 3339): {e}"
        ))
    })?;
    let mut new = NewVoucher::parse(
        &input.title,
        input.stock,
        &input.begins_at,
        &input.ends_at,
        now,
    )?
    .with_buckets(input.buckets, input.expected_peak_per_s)?
    .with_waiting_room(input.entry_rate_per_s, input.queue_opens_before_s)?;
    new.payment = PaymentTerms::parse_with_limit(
        input.pay_within_s,
        input.rebuy_after_close,
        input.rebuy_limit,
        input.price_minor,
        input.currency.as_deref(),
    )?;
    let voucher = app.db.create_voucher(&new).await?;
    tracing::info!(
        voucher_id = voucher.id.get(),
        stock = voucher.stock,
        "voucher created"
    );
    app.cache.learn_voucher(&voucher);
    // The database row is the truth. If Redis cannot be preloaded now, the voucher is
    // still created: the first GET or purchase finds it missing in Redis and preloads it
    // from the database (see `repair`).
    let preloaded = match app.sales().await {
        Ok(sales) => match sales.preload(&voucher).await {
            // A new room's queue is whole and empty: its counter starts at 0, so the
            // first joins need no restore (crate::queue).
            Ok(_) if voucher.room.is_some() => {
                queue::restore_positions(&sales.conn(), voucher.id, &[], Some(0))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            done => done.map(|_| ()).map_err(|e| e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = preloaded {
        tracing::warn!(%error, "voucher created but not preloaded; it will be preloaded on first use");
    }
    Ok(json_response(
        StatusCode::CREATED,
        &voucher_json(&voucher, voucher.db_stock_left),
    ))
}

/// How long a shared cache may keep a voucher's public answer.
pub const READ_CACHE_CONTROL: &str = "public, max-age=1";

/// `GET /vouchers/{id}` (anyone): the voucher with its live stock from Redis.
pub(crate) async fn get_voucher(
    app: &App,
    req: &Request,
    id: VoucherId,
) -> Result<Response<Body>, ApiError> {
    let now = now_millis();
    // No token here: the caller is its source address, held to a rate before anything
    // (even this instance's memory of unknown ids) is looked up.
    if !app.source_limiter.allow(&source_of(app, req), now) {
        return Err(ApiError::RateLimited);
    }
    if app.cache.short_circuit(id, now) == Some(Known::Missing) {
        return Err(not_found_voucher(id));
    }
    let Some(voucher) = voucher_of(app, id, now).await? else {
        return Err(not_found_voucher(id));
    };
    let sales = app.sales().await?;
    let stock_left = match sales.stock_left_all(&voucher).await? {
        Some(left) => left,
        // A sale that has ended (retired from Redis after its retention, or lost) sells
        // nothing more: the database's count is its answer. An anonymous read never
        // reloads a past sale (that would read all its orders, for anyone who asks).
        None if app.cache.clearly_over(&voucher.window, now) => voucher.db_stock_left,
        None => {
            repair(app, id, now, None).await?;
            sales
                .stock_left_all(&voucher)
                .await?
                .unwrap_or(voucher.db_stock_left)
        }
    };
    let mut body = voucher_json(&voucher, stock_left);
    // The server's clock, so that a client counts down to the start by it, not by its
    // own (a buyer's clock may be minutes off).
    body["server_time"] = json!(format_rfc3339_millis(now_millis()));
    let mut res = json_response(StatusCode::OK, &body);
    // The edge (crate::edge) keeps this answer for a second: however many pages poll a
    // sale, each edge location asks once a second. (A kept answer's `server_time` is as
    // old as its `Age` header says.)
    res.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static(READ_CACHE_CONTROL),
    );
    Ok(res)
}

fn voucher_json(v: &Voucher, stock_left: i64) -> serde_json::Value {
    let mut body = json!({
        "id": v.id.to_string(),
        "title": v.title,
        "stock": v.stock,
        "stock_left": stock_left.max(0),
        "begins_at": format_rfc3339_millis(v.window.begins_ms()),
        "ends_at": format_rfc3339_millis(v.window.ends_ms()),
    });
    if v.buckets > 1 {
        body["buckets"] = json!(v.buckets);
    }
    if let Some(room) = v.room {
        body["entry_rate_per_s"] = json!(room.entry_rate_per_s());
        body["queue_opens_before_s"] = json!(room.opens_before_s());
    }
    if let Some(p) = v.payment {
        body["pay_within_s"] = json!(p.pay_within_ms / 1000);
        body["rebuy_after_close"] = json!(p.rebuy_after_close);
        if p.rebuy_after_close {
            body["rebuy_limit"] = json!(p.rebuy_limit);
        }
        if let Some(price) = p.price {
            body["price_minor"] = json!(price.amount_minor());
            body["currency"] = json!(price.currency());
        }
    }
    body
}

//! The voucher as any handler finds it: its row (this instance's memory, else the
//! database), its stock buckets and waiting room (memory, else Redis), and the answer
//! when there is none.

use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::adapters::queue::{self, SaleShape};
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::domain::{Bucket, UnixMillis, Voucher, VoucherId};

use crate::app::App;
use crate::error::ApiError;

/// The voucher's row: from this instance's memory, else the database (remembered
/// either way, a missing one for a short while).
pub(crate) async fn voucher_of(
    app: &App,
    id: VoucherId,
    now: UnixMillis,
) -> Result<Option<Voucher>, ApiError> {
    if let Some(v) = app.cache.voucher(id) {
        return Ok(Some(v));
    }
    let found = app.db.voucher(id).await?;
    match &found {
        Some(v) => app.cache.learn_voucher(v),
        None => app.cache.learn_missing(id, now),
    }
    Ok(found)
}

pub(crate) fn not_found_voucher(id: VoucherId) -> ApiError {
    ApiError::NotFound(format!("voucher {id} not found"))
}

/// A sale Redis lost again right after a repair: the caller retries.
pub(crate) fn not_loaded(id: VoucherId) -> ApiError {
    ApiError::unavailable("redis", format!("voucher {id} not loaded after preload"))
}

/// Whether Redis lost the sale of `bucket` while its orders stream still holds orders
/// not drained (pending, or not yet delivered to the drain group): the sale waits for
/// its repair (the next admission of a live sale makes it) or the drain, and until then
/// a pending order cannot be told from an unknown one, so "not found" is no truthful
/// answer. One round trip when the sale hash is there or the stream is empty (a sale
/// retired on purpose loses both together); the drain group is read only for a lost sale
/// (a drained stream keeps its key and last entry, and the drainer's probe recreates an
/// empty one).
pub(crate) async fn sale_lost(sales: &RedisSales, bucket: Bucket) -> Result<bool, ApiError> {
    if !sales.sale_lost(bucket).await? {
        return Ok(false);
    }
    Ok(match OrderStreams::new(sales.conn()).stats(bucket).await? {
        Some(s) => s.pending > 0 || s.undelivered > 0,
        // No drain group: every entry is still to be delivered (the drainer makes the
        // group again from the start).
        None => true,
    })
}

/// The voucher's stock buckets and waiting room as bucket 0's sale hash records them,
/// remembered by this instance; `None` when Redis does not have the sale.
pub(crate) async fn sale_shape(
    app: &App,
    sales: &RedisSales,
    voucher: VoucherId,
) -> Result<Option<SaleShape>, ApiError> {
    let found = queue::sale_shape(&sales.conn(), voucher).await?;
    if let Some(shape) = found {
        app.cache.learn_shape(voucher, shape);
    }
    Ok(found)
}

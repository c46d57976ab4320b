//! The voucher as any handler finds it: its row (this instance's memory, else the
//! database), its stock buckets and waiting room (memory, else Redis), and the answer
//! when there is none; and the orders its streams hold undrained, which no other record
//! shows yet (a lost sale's repair gives them their deadlines back, the webhook waits
//! for one it cannot place).

use std::collections::HashSet;

use seckill_shared::adapters::order_stream::{OrderStreams, RANGE_PAGE, id_less};
use seckill_shared::adapters::queue::{self, SaleShape};
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::domain::{Bucket, OrderId, UnixMillis, Voucher, VoucherId};
use seckill_shared::error::StoreError;
use seckill_shared::protocol::fields;

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

/// An order its bucket's stream holds and the drainer has not finished with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undrained {
    pub id: OrderId,
    pub user: String,
    /// When it was admitted: the entry's `admitted_ms` (a re-enqueued or replayed entry),
    /// else its id's milliseconds, as the drainer reads it.
    pub admitted_ms: UnixMillis,
}

/// The orders of `bucket`'s stream not drained yet (delivered and not acked, or not yet
/// delivered to the drain group), of entries from `since_ms` on (0: all), oldest first.
/// Without a drain group every entry counts (the drainer makes the group again from the
/// start). Acked entries (written, or dead-lettered) are left out, and so are entries
/// that do not parse: the drainer dead-letters those.
///
/// Read in pages of [`RANGE_PAGE`]; the drainer trims what it acked, so a stream holds
/// about its backlog. The group is read first and the entries after it, so an entry
/// delivered meanwhile is still after the last-delivered id read, and one acked
/// meanwhile was pending when the pending ids were read: nothing undrained is missed.
pub(crate) async fn undrained_orders(
    sales: &RedisSales,
    bucket: Bucket,
    since_ms: UnixMillis,
) -> Result<Vec<Undrained>, StoreError> {
    let streams = OrderStreams::new(sales.conn());
    let group = streams.stats(bucket).await?;
    let pending: HashSet<String> = match &group {
        Some(g) if g.pending > 0 => streams.pending_ids(bucket).await?.into_iter().collect(),
        _ => HashSet::new(),
    };
    let undrained = |id: &str| match &group {
        Some(g) => id_less(&g.last_delivered, id) || pending.contains(id),
        None => true,
    };
    // Exclusive: the last id of the millisecond before `since_ms`.
    let mut after = (since_ms > 0).then(|| format!("{}-{}", since_ms - 1, u64::MAX));
    let mut out = Vec::new();
    loop {
        let page = streams
            .entries(bucket, after.as_deref(), RANGE_PAGE)
            .await?;
        for e in page.iter().filter(|e| undrained(&e.id)) {
            let text = |name: &str| e.field(name).and_then(|v| std::str::from_utf8(v).ok());
            let id = text(fields::ORDER_ID).and_then(|s| s.parse::<OrderId>().ok());
            let admitted = match e.field(fields::ADMITTED_MS) {
                Some(_) => text(fields::ADMITTED_MS).and_then(|s| s.parse().ok()),
                None => e.id_ms(),
            };
            if let (Some(id), Some(user), Some(admitted_ms)) =
                (id, text(fields::USER_ID), admitted.filter(|ms| *ms > 0))
            {
                out.push(Undrained {
                    id,
                    user: user.to_string(),
                    admitted_ms,
                });
            }
        }
        match page.last() {
            Some(last) if page.len() == RANGE_PAGE => after = Some(last.id.clone()),
            _ => return Ok(out),
        }
    }
}

//! Money listed both ways: every payment `paid` names an order row `paid` by it, and
//! every order `paid` names its payment `paid`. What does not (a paid order
//! dead-lettered, a paid close lost, a row planted by hand), and payments still
//! `received` long after they were recorded (a crash between the record and the close,
//! and no delivery of the event since), is what `seckill status` counts and `seckill
//! reconcile` lists, each with what to do (docs/design.md, "Paid means the provider
//! said so").
//!
//! Invariant kept here: what is only on its way is never reported. A payment is decided
//! `paid` after Redis closed its order (`lua/close.lua`), and that close waits in its
//! bucket's closes to settle until the drainer has written the order's row with it
//! (`paid` by the payment; or `rejected`, and the payment due for refund in the same
//! transaction). Until then the payment matches no paid order, yet nothing is wrong. So
//! the database is read twice with Redis read in between: a mismatch is reported only
//! when both reads find it and Redis did not hold its order's close waiting in between
//! (a close settled after the first read shows settled in the second).

use std::collections::HashSet;

use crate::adapters::data_api::DataApi;
use crate::adapters::order_stream::OrderStreams;
use crate::adapters::payments::Payments;
use crate::adapters::payments::unmatched::{Mismatch, Unmatched};
use crate::domain::{Bucket, OrderId, VoucherId, now_millis};
use crate::error::StoreError;

/// A payment still `received` this long after it was recorded is reported: its
/// delivery died between the record and the close, and the provider has not delivered
/// it again since (it usually does within minutes).
pub const UNDECIDED_AFTER_MS: i64 = 15 * 60 * 1000;

/// `voucher`'s payments and paid orders that do not match, without those on their way
/// (see the module's header); at most [`crate::adapters::payments::unmatched::UNMATCHED_LIMIT`] of
/// each kind of look. `buckets`: the voucher's stock buckets, whose closes to settle are
/// read (a payment names its order, not the buyer whose bucket holds it).
pub async fn unmatched(
    streams: &OrderStreams,
    db: &DataApi,
    voucher: VoucherId,
    buckets: u16,
) -> Result<Vec<Unmatched>, StoreError> {
    let overdue_before = now_millis() - UNDECIDED_AFTER_MS;
    let first = Payments(db).unmatched(voucher, overdue_before).await?;
    if first.is_empty() {
        return Ok(first);
    }
    let paid: Vec<OrderId> = first
        .iter()
        .filter(|u| u.mismatch == Mismatch::PaidWithoutItsOrder)
        .map(|u| u.order)
        .collect();
    let mut waiting: HashSet<OrderId> = HashSet::new();
    if !paid.is_empty() {
        for bucket in Bucket::all(voucher, buckets) {
            let flags = streams.closes_waiting(bucket, &paid).await?;
            waiting.extend(paid.iter().zip(flags).filter(|(_, w)| *w).map(|(o, _)| *o));
        }
    }
    let first: HashSet<Unmatched> = first.into_iter().collect();
    let second = Payments(db).unmatched(voucher, overdue_before).await?;
    Ok(second
        .into_iter()
        .filter(|u| first.contains(u))
        .filter(|u| !(u.mismatch == Mismatch::PaidWithoutItsOrder && waiting.contains(&u.order)))
        .collect())
}

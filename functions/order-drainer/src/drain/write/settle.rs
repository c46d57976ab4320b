//! Which closes a batch transaction records, and recording them (vouchers with a
//! payment step).
//!
//! Redis decides every close (`lua/close.lua`) and lists it in its bucket's `to_settle`
//! until the database holds it. Every batch transaction of the voucher records closes
//! of all its buckets under the voucher's row lock, before its insert, at most
//! [`SETTLE_PER_TRANSACTION`] of them. When more wait than that (a mass expiry, the
//! closes of a database outage longer than the pay window), which ones go first decides
//! what the batch's orders find:
//! - a close whose order has no row yet (not drained) has nothing to record: the batch
//!   that writes the order writes it closed. Past the budget, such closes are left out
//!   (one lookup of which orders have a row, [`LedgerTx::rows_of`]); taken at random
//!   they used it up, however many closes of rows waited behind them;
//! - first the closes of the rows of the batch's own buyers: a buyer who cancelled a
//!   drained order and bought again holds that row (`UNIQUE (voucher_id, holder)`) until
//!   its close is recorded, and the new order would be dead-lettered `duplicate_buyer`;
//! - then the closes that give a unit back: a unit given back in Redis and sold again
//!   in this batch must be back in the database stock first, or the order is written
//!   `rejected`. A batch holds at most the budget of orders (`DRAINER_BATCH_SIZE` ≤
//!   [`SETTLE_PER_TRANSACTION`]), so the units it needs are among those taken;
//! - then the other closes of rows still awaiting payment (paid ones), and last those
//!   of rows whose close is recorded already (only their entry in `to_settle` goes).
//!
//! Invariants kept here: a close is recorded by conditional updates of rows still
//! awaiting payment only, so recording it twice (a retried or killed transaction)
//! returns no unit twice; the orders whose close the database holds are returned
//! ([`Settled::done`]) and leave `to_settle` only after the caller's commit.

use std::collections::{HashMap, HashSet};

use seckill_shared::adapters::ledger::{LedgerTx, SETTLE_PER_TRANSACTION};
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::domain::{AdmittedOrder, Bucket, ClosedOrder, OrderId};

use crate::error::DrainError;
use crate::failpoint;

/// Closes recorded in a batch transaction: units given back, and per bucket the orders
/// whose close the database holds once it commits (they leave that bucket's `to_settle`
/// then).
#[derive(Default)]
pub(super) struct Settled {
    pub(super) returned: u64,
    pub(super) done: Vec<(Bucket, Vec<OrderId>)>,
}

impl Settled {
    pub(super) fn count(&self) -> usize {
        self.done.iter().map(|(_, ids)| ids.len()).sum()
    }
}

/// A close waiting in `to_settle`, and what the database holds of its order: `None`
/// when not looked up (everything waiting fits in the budget), else whether its row
/// still awaits payment (orders without a row are not candidates at all).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    bucket: Bucket,
    id: OrderId,
    close: ClosedOrder,
    awaiting: Option<bool>,
}

/// How much a close matters to the transaction: the lower, the earlier it is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// The row of one of the batch's buyers, awaiting payment in the database.
    OwnBuyer,
    /// Gives a unit back (cancelled or expired).
    GivesBack,
    /// Paid: the row changes, no unit moves.
    Paid,
    /// The row's close is recorded already: only its entry in `to_settle` goes.
    Recorded,
}

fn rank(c: &Candidate, buyers: &HashSet<&str>) -> Rank {
    let open = c.awaiting != Some(false);
    if open && buyers.contains(c.close.user.as_str()) {
        Rank::OwnBuyer
    } else if open && c.close.status.returned_unit() {
        Rank::GivesBack
    } else if open {
        Rank::Paid
    } else {
        Rank::Recorded
    }
}

/// The closes to record, at most `budget`, in the order of [`Rank`] (a stable sort: the
/// buckets keep their order, the bucket being drained first).
fn choose(mut candidates: Vec<Candidate>, buyers: &HashSet<&str>, budget: usize) -> Vec<Candidate> {
    candidates.sort_by_key(|c| rank(c, buyers));
    candidates.truncate(budget);
    candidates
}

/// Records, inside `tx`, the closes Redis decided in every bucket of `voucher`'s sale
/// (`buckets` of them, `voucher` first) that matter most to the batch `orders`, at most
/// [`SETTLE_PER_TRANSACTION`] (see the module's header).
pub(super) async fn settle(
    streams: &OrderStreams,
    tx: &LedgerTx<'_>,
    voucher: Bucket,
    buckets: u16,
    orders: &[AdmittedOrder],
) -> Result<Settled, DrainError> {
    let redis = |step, e| DrainError::store(step, Some(voucher), e);
    let others = Bucket::all(voucher.voucher(), buckets).filter(|b| *b != voucher);
    let mut waiting: Vec<(Bucket, Vec<OrderId>)> = Vec::new();
    for bucket in std::iter::once(voucher).chain(others) {
        let ids = streams
            .to_settle(bucket)
            .await
            .map_err(|e| redis("reading closes to settle", e))?;
        if !ids.is_empty() {
            waiting.push((bucket, ids));
        }
    }
    let total: usize = waiting.iter().map(|(_, ids)| ids.len()).sum();
    if total == 0 {
        return Ok(Settled::default());
    }
    // Everything waiting fits: no lookup. Else only the closes of orders with a row.
    let rows: Option<HashMap<OrderId, bool>> = if total > SETTLE_PER_TRANSACTION {
        let all: Vec<OrderId> = waiting
            .iter()
            .flat_map(|(_, ids)| ids.iter().copied())
            .collect();
        let rows = tx
            .rows_of(voucher.voucher(), &all)
            .await
            .map_err(|e| DrainError::store("finding the rows of closes", Some(voucher), e))?;
        Some(rows)
    } else {
        None
    };
    let mut candidates = Vec::new();
    for (bucket, ids) in waiting {
        let ids: Vec<OrderId> = match &rows {
            Some(rows) => ids.into_iter().filter(|i| rows.contains_key(i)).collect(),
            None => ids,
        };
        let closes = streams
            .closed_orders(bucket, &ids)
            .await
            .map_err(|e| redis("reading closed orders", e))?;
        candidates.extend(ids.into_iter().zip(closes).filter_map(|(id, close)| {
            Some(Candidate {
                bucket,
                id,
                close: close?,
                awaiting: rows.as_ref().and_then(|r| r.get(&id).copied()),
            })
        }));
    }
    let buyers: HashSet<&str> = orders.iter().map(|o| o.user.as_str()).collect();
    let chosen = choose(candidates, &buyers, SETTLE_PER_TRANSACTION);
    // Recorded per bucket (each bucket's `to_settle` is cleared of its own).
    let mut by_bucket: Vec<(Bucket, Vec<(OrderId, ClosedOrder)>)> = Vec::new();
    for c in chosen {
        match by_bucket.iter_mut().find(|(b, _)| *b == c.bucket) {
            Some((_, closes)) => closes.push((c.id, c.close)),
            None => by_bucket.push((c.bucket, vec![(c.id, c.close)])),
        }
    }
    let mut settled = Settled::default();
    for (bucket, closes) in by_bucket {
        let (returned, done) = tx
            .settle(voucher.voucher(), &closes)
            .await
            .map_err(|e| DrainError::store("settling closed orders", Some(bucket), e))?;
        failpoint::hit("after_settle");
        settled.returned += returned;
        if !done.is_empty() {
            settled.done.push((bucket, done));
        }
    }
    Ok(settled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_shared::domain::{OrderStatus, VoucherId};

    fn candidate(id: i64, status: OrderStatus, user: &str, awaiting: Option<bool>) -> Candidate {
        Candidate {
            bucket: Bucket::from(VoucherId::new(7).unwrap()),
            id: OrderId::new(id).unwrap(),
            close: ClosedOrder {
                status,
                pay_by_ms: 1,
                payment_ref: if status == OrderStatus::Paid {
                    format!("pay-{id}")
                } else {
                    String::new()
                },
                user: user.into(),
            },
            awaiting,
        }
    }

    fn ids(chosen: &[Candidate]) -> Vec<i64> {
        chosen.iter().map(|c| c.id.get()).collect()
    }

    #[test]
    fn past_the_budget_the_batch_s_buyers_come_first_then_units_then_the_rest() {
        use OrderStatus::{Cancelled, Expired, Paid};
        let waiting = vec![
            candidate(1, Paid, "p", Some(true)),
            candidate(2, Expired, "done", Some(false)),
            candidate(3, Cancelled, "c", Some(true)),
            candidate(4, Cancelled, "rebuyer", Some(true)),
            candidate(5, Expired, "e", Some(true)),
            // The buyer's close recorded already: nothing holds their place.
            candidate(6, Cancelled, "rebuyer-2", Some(false)),
        ];
        let buyers: HashSet<&str> = ["rebuyer", "rebuyer-2"].into_iter().collect();
        assert_eq!(
            ids(&choose(waiting.clone(), &buyers, 10)),
            vec![4, 3, 5, 1, 2, 6]
        );
        assert_eq!(ids(&choose(waiting.clone(), &buyers, 3)), vec![4, 3, 5]);
        assert_eq!(ids(&choose(waiting, &buyers, 1)), vec![4]);
    }

    #[test]
    fn within_the_budget_every_close_is_taken_unlooked_up() {
        use OrderStatus::{Cancelled, Paid};
        let waiting = vec![
            candidate(1, Paid, "p", None),
            candidate(2, Cancelled, "c", None),
        ];
        let chosen = choose(waiting, &HashSet::new(), 10);
        assert_eq!(ids(&chosen), vec![2, 1]);
    }
}

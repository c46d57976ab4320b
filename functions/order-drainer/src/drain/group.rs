//! Many small sales in one transaction: the group commit, and the drain round that
//! sorts each round's reads into groups and single sales ([`Drainer::drain_round`]).
//!
//! A shop-review app runs thousands of small sales at once, each with a handful of
//! orders per drain round. Written one transaction per sale, the drain pays begin, lock,
//! insert, stock update and commit (five Data API calls) per one or two orders. Here the
//! small reads of a round (fewer than a quarter batch each, one bucket per voucher) are
//! written together, up to a batch of orders and
//! [`MAX_VOUCHERS_PER_STATEMENT`] vouchers per transaction: their rows locked in id
//! order (`NOWAIT`), one multi-voucher insert, one stock update guarding each voucher's
//! own count, one commit; then every stream is acked (pipelined where one Redis node
//! serves every slot).
//!
//! Invariants kept here, by doing only the plain case and handing everything else to
//! the one-sale path ([`Drainer::process`]) whole:
//! - a group commits only when every order of every member is a new `confirmed` row
//!   within its voucher's database stock. A member that is not the plain case (an
//!   unknown voucher, a payment step, a stock that does not cover its orders, an entry
//!   to dead-letter) is taken out and the rest try again; a row locked by another
//!   transaction, a row that exists already (a count short of the plan), a guard that
//!   refuses, a statement the database refuses or a deadlock sends every member alone.
//!   Each time the transaction is rolled back whole.
//!   The one-sale path isolates refusals, dead-letters and records rejections for that
//!   sale alone: a refused order never holds back or dead-letters its neighbours;
//! - each voucher's stock guard is its own (`stock_left >= n` per row, all rows updated);
//! - entries are acked only after the commit, per stream; a crash in between leaves them
//!   pending, and their redelivery finds the rows (duplicates, nothing written);
//! - the transaction is recorded (once, in the groups' registry) before it locks
//!   anything, so a run that finds one of the rows held by a killed group rolls it back.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use futures::StreamExt;
use std::time::Instant;

use seckill_shared::adapters::ledger::sql::MAX_VOUCHERS_PER_STATEMENT;
use seckill_shared::domain::{
    AdmittedOrder, Bucket, OrderStatus, StreamEntry, VoucherId, now_millis,
};
use seckill_shared::error::StoreError;

use super::run::{BatchTimer, Run};
use super::{Drainer, PROBES_IN_FLIGHT, Read};
use crate::error::DrainError;
use crate::failpoint;
use crate::plan;

/// One sale's small read, parsed.
pub(super) struct Member {
    pub(super) bucket: Bucket,
    pub(super) entries: Vec<StreamEntry>,
    orders: Vec<AdmittedOrder>,
}

/// Whether a read of `entries` entries is a small sale's, worth writing with others.
pub(super) fn is_small(entries: usize, batch_size: usize) -> bool {
    entries < (batch_size / 4).max(2)
}

/// Small reads being gathered into one group, full at a batch of orders or
/// [`MAX_VOUCHERS_PER_STATEMENT`] sales (a round's, [`group_small`], and the survey's
/// early writes).
#[derive(Default)]
pub(super) struct Filling {
    reads: Vec<Read>,
    orders: usize,
}

impl Filling {
    /// Adds a small read; returns the group gathered so far when the read does not fit
    /// in it (the read starts the next one).
    pub(super) fn add(&mut self, read: Read, batch_size: usize) -> Option<Vec<Read>> {
        let full = self.orders + read.1.len() > batch_size
            || self.reads.len() >= MAX_VOUCHERS_PER_STATEMENT;
        let done = (full && !self.reads.is_empty()).then(|| {
            self.orders = 0;
            std::mem::take(&mut self.reads)
        });
        self.orders += read.1.len();
        self.reads.push(read);
        done
    }

    /// The reads of the group not full yet.
    pub(super) fn into_reads(self) -> Vec<Read> {
        self.reads
    }
}

/// Splits one round's reads into groups of small sales (one bucket per voucher, at
/// most a batch of orders and [`MAX_VOUCHERS_PER_STATEMENT`] vouchers each) and the
/// reads to drain alone (large ones, or a second bucket of a voucher already grouped).
/// A group of one is drained alone.
pub(super) fn group_small(reads: Vec<Read>, batch_size: usize) -> (Vec<Vec<Read>>, Vec<Read>) {
    let mut groups: Vec<Vec<Read>> = Vec::new();
    let mut alone = Vec::new();
    let mut filling = Filling::default();
    let mut seen = HashSet::new();
    for (bucket, entries) in reads {
        if !is_small(entries.len(), batch_size) || !seen.insert(bucket.voucher()) {
            alone.push((bucket, entries));
            continue;
        }
        groups.extend(filling.add((bucket, entries), batch_size));
    }
    let last = filling.into_reads();
    if !last.is_empty() {
        groups.push(last);
    }
    let (groups, singles): (Vec<_>, Vec<_>) = groups.into_iter().partition(|g| g.len() > 1);
    alone.extend(singles.into_iter().flatten());
    (groups, alone)
}

/// Attempts at one group: the first, and again without the members it could not write.
const GROUP_TRIES: u32 = 3;

/// How a group transaction ended.
enum GroupOutcome {
    /// Committed: every member's orders are rows now.
    Committed(u64),
    /// Rolled back (nothing written): these vouchers' members go through the one-sale
    /// path, the others may try again as a group.
    Without(Vec<VoucherId>, String),
    /// Rolled back (nothing written): the members go through the one-sale path.
    Alone(String),
}

/// One piece of a round's work: a group of small sales' reads, or one voucher's read.
enum Work {
    Group(Vec<Read>),
    Alone(Bucket, Vec<StreamEntry>),
}

impl Work {
    fn reads(&self) -> Vec<(&Bucket, &Vec<StreamEntry>)> {
        match self {
            Work::Group(reads) => reads.iter().map(|(v, e)| (v, e)).collect(),
            Work::Alone(v, e) => vec![(v, e)],
        }
    }
}

impl Drainer {
    /// One round over `round`: every voucher's next entries are read, many at once;
    /// the small reads of distinct vouchers are written together, a group per
    /// transaction (below), the others batch after batch ([`Self::drain_batches`]),
    /// up to `DRAINER_CONCURRENCY` at once. The reads the survey made already (`read`)
    /// are taken as they are; the other vouchers of `round` are read now. Returns how
    /// many entries each voucher that had any was read.
    /// A read whose turn comes when no batch fits before `stop_at` any more is
    /// released, pending and claimable at once.
    pub(super) async fn drain_round(
        &self,
        run: &Run,
        round: Vec<Bucket>,
        read: Vec<Read>,
    ) -> BTreeMap<Bucket, usize> {
        // What the survey read already is taken as it is; the others are read now.
        let already: BTreeSet<Bucket> = read.iter().map(|(v, _)| *v).collect();
        let given = futures::stream::iter(read).then(|(v, entries)| async move {
            self.accept_read(run, v, Ok(entries))
                .await
                .map(|entries| (v, entries))
        });
        let fresh = futures::stream::iter(round)
            .filter(|v| std::future::ready(!already.contains(v)))
            .map(|v| async move {
                if !run.fits(1) {
                    return None;
                }
                let read = self.read_next(run, v, None).await;
                self.accept_read(run, v, read)
                    .await
                    .map(|entries| (v, entries))
            })
            .buffer_unordered(PROBES_IN_FLIGHT);
        let reads: Vec<Read> = given
            .chain(fresh)
            .filter_map(std::future::ready)
            .collect()
            .await;
        let had: BTreeMap<Bucket, usize> = reads.iter().map(|(v, e)| (*v, e.len())).collect();
        let (groups, mut alone) = group_small(reads, self.cfg.batch_size);
        // The largest reads first (a hot sale before the small ones, as the survey
        // ordered the round), then the groups.
        alone.sort_by_key(|(_, e)| std::cmp::Reverse(e.len()));
        let work = alone
            .into_iter()
            .map(|(v, e)| Work::Alone(v, e))
            .chain(groups.into_iter().map(Work::Group));
        futures::stream::iter(work)
            .for_each_concurrent(self.cfg.concurrency, |work| async move {
                if !run.fits(1) {
                    for (v, entries) in work.reads() {
                        self.release(run, *v, entries).await;
                    }
                    return;
                }
                match work {
                    Work::Group(reads) => self.process_group(run, reads).await,
                    Work::Alone(v, entries) => self.drain_batches(run, v, entries).await,
                }
            })
            .await;
        had
    }

    /// Drains a group of small sales' reads in one transaction, or, when that is not
    /// the plain case, each on its own. Every entry ends acked or pending, as in
    /// [`Drainer::process`].
    pub(super) async fn process_group(&self, run: &Run, reads: Vec<Read>) {
        let mut members = Vec::new();
        let mut alone = Vec::new();
        for (bucket, entries) in reads {
            let sorted = plan::sort_entries(bucket.voucher(), &entries);
            if sorted.dead.is_empty() && sorted.orders.len() == entries.len() {
                let orders = sorted.orders.into_iter().map(|(_, o)| o).collect();
                members.push(Member {
                    bucket,
                    entries,
                    orders,
                });
            } else {
                alone.push((bucket, entries));
            }
        }
        // A member the group cannot write (its row says so) is taken out and the group
        // tried again without it, at most this many times; then everyone goes alone.
        let mut tries = 0;
        while members.len() > 1 && tries < GROUP_TRIES && run.fits(1) {
            tries += 1;
            let outcome = {
                let _timer = BatchTimer(run, Instant::now());
                self.commit_group(run, &members).await
            };
            match outcome {
                Ok(GroupOutcome::Committed(rows)) => {
                    run.count(|s| {
                        s.batches += 1;
                        s.inserted += rows;
                        s.grouped += rows;
                    });
                    self.ack_members(run, &members).await;
                    members.clear();
                }
                Ok(GroupOutcome::Without(vouchers, why)) => {
                    tracing::debug!(
                        sales = members.len(),
                        ?vouchers,
                        why,
                        "group rolled back; its other sales try again"
                    );
                    let (out, stay): (Vec<_>, Vec<_>) = members
                        .into_iter()
                        .partition(|m| vouchers.contains(&m.bucket.voucher()));
                    alone.extend(out.into_iter().map(|m| (m.bucket, m.entries)));
                    members = stay;
                }
                Ok(GroupOutcome::Alone(why)) => {
                    tracing::debug!(
                        sales = members.len(),
                        why,
                        "group rolled back; each sale alone"
                    );
                    break;
                }
                Err(e) => {
                    // The database's state, not an order's: every member stays pending.
                    run.record(&e);
                    for m in &members {
                        run.stop(m.bucket);
                        self.release(run, m.bucket, &m.entries).await;
                    }
                    members.clear();
                }
            }
        }
        alone.extend(members.into_iter().map(|m| (m.bucket, m.entries)));
        // Up to a group's worth of sales, one transaction each: each starts only while a
        // batch still fits before the run's end, the others stay pending for the next.
        for (bucket, entries) in alone {
            if run.stopped(bucket) || !run.fits(1) {
                self.release(run, bucket, &entries).await;
            } else {
                self.process(run, bucket, entries, true).await;
            }
        }
    }

    /// Acks every member's entries after their group committed: the whole group's
    /// acks pipelined where one Redis node serves every slot, not a request per sale.
    async fn ack_members(&self, run: &Run, members: &[Member]) {
        let acks: Vec<(Bucket, Vec<&str>)> = members
            .iter()
            .map(|m| (m.bucket, m.entries.iter().map(|e| e.id.as_str()).collect()))
            .collect();
        let answers = self.streams.ack_many(&acks).await;
        for (m, answer) in members.iter().zip(answers) {
            if let Err(e) = answer {
                // Committed, not acked: redelivered later and found as duplicates.
                run.fail(
                    m.bucket,
                    DrainError::store("acking a committed group", Some(m.bucket), e),
                );
                self.release(run, m.bucket, &m.entries).await;
                continue;
            }
            failpoint::hit("after_ack");
        }
    }

    /// One group transaction: begin, record it, lock the rows, write, commit; or roll
    /// back.
    async fn commit_group(
        &self,
        run: &Run,
        members: &[Member],
    ) -> Result<GroupOutcome, DrainError> {
        let first = members[0].bucket;
        let db = |step, e| DrainError::store(step, Some(first), e);
        failpoint::hit("before_begin");
        let tx = self
            .ledger
            .begin()
            .await
            .map_err(|e| db("beginning a group transaction", e))?;
        failpoint::hit("after_begin");
        let id = tx.id().to_string();
        let now = now_millis();
        // Recorded once for every member (the groups' registry, which a run blocked on
        // any voucher's row reads beside the voucher's own).
        if let Err(e) = self
            .streams
            .register_group_tx(&id, &run.consumer, now)
            .await
        {
            tx.rollback().await;
            self.forget_group_tx(&id).await;
            return Err(db("recording the group transaction", e));
        }
        // Each voucher's turn in this run, taken in id order (a one-sale batch takes one
        // turn and waits for no other, so no two holders wait on each other).
        let vouchers: BTreeSet<_> = members.iter().map(|m| m.bucket.voucher()).collect();
        let mut held = Vec::with_capacity(vouchers.len());
        for v in &vouchers {
            held.push(run.turn(*v).lock_owned().await);
        }
        let written = write_group(&tx, members).await;
        let (outcome, over) = match written {
            Ok(rows) => {
                failpoint::hit("before_commit");
                match tx.commit().await {
                    Ok(()) => {
                        failpoint::hit("after_commit");
                        (Ok(GroupOutcome::Committed(rows)), true)
                    }
                    Err(e) => {
                        let ended = tx.try_rollback().await.is_ok();
                        (Err(db("committing a group", e)), ended)
                    }
                }
            }
            Err(why) => {
                let ended = tx.try_rollback().await.is_ok();
                let outcome = match why {
                    Written::Without(vouchers, why) => Ok(GroupOutcome::Without(vouchers, why)),
                    Written::Alone(why) => Ok(GroupOutcome::Alone(why)),
                    Written::Failed(step, e) => Err(db(step, e)),
                };
                (outcome, ended)
            }
        };
        drop(held);
        if over {
            self.forget_group_tx(&id).await;
        }
        outcome
    }

    /// Removes a group transaction's record (a record left behind costs a later run one
    /// rollback of an unknown transaction).
    async fn forget_group_tx(&self, id: &str) {
        if let Err(e) = self.streams.unregister_group_tx(id).await {
            tracing::warn!(error = %e, "could not forget an ended group transaction");
        }
    }
}

/// Why a group's statements stopped before the commit.
enum Written {
    /// These vouchers are not the plain case (unknown, a payment step, a stock that
    /// does not cover their orders): roll back, drain them alone, the rest together.
    Without(Vec<VoucherId>, String),
    /// Not the plain case as a whole (a row held, rows that exist): roll back and drain
    /// each sale alone.
    Alone(String),
    /// A statement failed: (what it was doing, the error).
    Failed(&'static str, StoreError),
}

/// The statements of a group transaction up to its commit: the rows written, or why not.
async fn write_group(
    tx: &seckill_shared::adapters::ledger::LedgerTx<'_>,
    members: &[Member],
) -> Result<u64, Written> {
    let mut ids: Vec<_> = members.iter().map(|m| m.bucket.voucher()).collect();
    ids.sort();
    let locked = match tx.lock_vouchers(&ids).await {
        Ok(locked) => locked,
        Err(e @ StoreError::Locked { .. }) => return Err(Written::Alone(e.to_string())),
        Err(e) => return Err(refused_or_failed("locking the group's vouchers", e)),
    };
    failpoint::hit("after_lock");
    let mut rows = Vec::new();
    let mut takes = Vec::with_capacity(members.len());
    let mut not_plain = Vec::new();
    for m in members {
        let voucher = m.bucket.voucher();
        let plain = locked.iter().find(|(v, _)| *v == voucher).map(|(_, row)| {
            row.pay_within_ms.is_none()
                && plan::split(voucher, &m.orders, &[], row.stock_left, &HashSet::new())
                    .confirmed
                    .len()
                    == m.orders.len()
        });
        if plain != Some(true) {
            // Unknown to the database, a payment step, or stock short of its orders.
            not_plain.push(voucher);
            continue;
        }
        rows.extend(m.orders.iter().cloned());
        takes.push((voucher, m.orders.len() as i64));
    }
    if !not_plain.is_empty() {
        return Err(Written::Without(
            not_plain,
            "not the plain case (unknown, a payment step, or short of stock)".into(),
        ));
    }
    let inserted = tx
        .insert_orders(&rows, OrderStatus::Confirmed, None)
        .await
        .map_err(|e| refused_or_failed("inserting a group's orders", e))?;
    failpoint::hit("after_insert");
    if inserted != rows.len() as u64 {
        return Err(Written::Alone(format!(
            "{inserted} of {} rows inserted (some exist already)",
            rows.len()
        )));
    }
    let updated = tx
        .take_stocks(&takes)
        .await
        .map_err(|e| refused_or_failed("taking a group's stock", e))?;
    if updated != takes.len() as u64 {
        return Err(Written::Alone(format!(
            "the stock guard refused {} of {} vouchers",
            takes.len() as u64 - updated,
            takes.len()
        )));
    }
    failpoint::hit("after_stock_update");
    Ok(inserted)
}

/// A group statement's failure. A refusal (a permanent database error: it may be one
/// order's fault, or one voucher's, or a database that cannot run the group's
/// statements at all) or a deadlock (InnoDB rolled the group back whole) sends every
/// member alone, where the one-sale path retries a deadlock and finds a refused order by
/// splitting its own sale's batch: the group's other sales are written in this run, not
/// held back with it. Anything else (the database unavailable) fails the group: every
/// member stays pending, as it would alone.
fn refused_or_failed(step: &'static str, e: StoreError) -> Written {
    if matches!(e, StoreError::Database(_)) || crate::error::is_deadlock_victim(&e) {
        Written::Alone(format!("{step}: {e}"))
    } else {
        Written::Failed(step, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_or_deadlocked_group_goes_alone_and_an_unavailable_one_fails() {
        let alone = |w: Written| matches!(w, Written::Alone(_));
        let refused = StoreError::Database("order refused by a test trigger".into());
        assert!(alone(refused_or_failed("inserting", refused)));
        let deadlock = StoreError::Unavailable {
            backend: "data api",
            detail: "Deadlock found when trying to get lock; try restarting transaction".into(),
        };
        assert!(alone(refused_or_failed("inserting", deadlock)));
        // The AUTO-INC lock a deadlock kept from the statement (the outbox's triggers):
        // the same as a deadlock, never a refusal that could blame an order.
        let autoinc = StoreError::Unavailable {
            backend: "data api",
            detail:
                "DatabaseErrorException: Failed to read auto-increment value from storage engine"
                    .into(),
        };
        assert!(alone(refused_or_failed("inserting", autoinc)));
        let down = StoreError::Unavailable {
            backend: "data api",
            detail: "connection refused".into(),
        };
        assert!(matches!(
            refused_or_failed("inserting", down),
            Written::Failed("inserting", _)
        ));
    }

    fn read(voucher: i64, bucket: u16, buckets: u16, n: usize) -> Read {
        let b = Bucket::new(VoucherId::new(voucher).unwrap(), bucket, buckets).unwrap();
        let entries = (0..n)
            .map(|i| StreamEntry {
                id: format!("1-{i}"),
                fields: Vec::new(),
                deliveries: 1,
            })
            .collect();
        (b, entries)
    }

    fn shape((groups, alone): (Vec<Vec<Read>>, Vec<Read>)) -> (Vec<Vec<String>>, Vec<String>) {
        (
            groups
                .iter()
                .map(|g| g.iter().map(|(b, _)| b.to_string()).collect())
                .collect(),
            alone.iter().map(|(b, _)| b.to_string()).collect(),
        )
    }

    #[test]
    fn small_reads_of_distinct_vouchers_go_together_and_large_ones_alone() {
        let reads = vec![
            read(1, 0, 1, 2),
            read(2, 0, 1, 500),
            read(3, 0, 1, 1),
            read(3, 1, 2, 1),
            read(4, 0, 1, 3),
        ];
        let (groups, alone) = shape(group_small(reads, 1_000));
        assert_eq!(groups, vec![vec!["1", "3", "4"]]);
        assert_eq!(alone.len(), 2, "{alone:?}");
        assert!(alone[0] == "2" && alone[1].starts_with("3.1"), "{alone:?}");
    }

    #[test]
    fn a_group_holds_at_most_a_batch_of_orders_and_a_single_goes_alone() {
        // Batch 100: small is < 25 entries, so 40 is not small.
        let reads: Vec<_> = (1..=5).map(|v| read(v, 0, 1, 40)).collect();
        let (groups, alone) = shape(group_small(reads, 100));
        assert!(groups.is_empty());
        assert_eq!(alone.len(), 5);
        // Batch 160: small is < 40; five reads of 30 fill 150, the sixth would pass
        // 160 and starts a group of its own, which, alone, drains alone.
        let reads: Vec<_> = (1..=6).map(|v| read(v, 0, 1, 30)).collect();
        let (groups, alone) = shape(group_small(reads, 160));
        assert_eq!(groups, vec![vec!["1", "2", "3", "4", "5"]]);
        assert_eq!(alone, vec!["6"]);
    }
}

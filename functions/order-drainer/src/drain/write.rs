//! Writing: the database side of a batch.
//!
//! One batch of one voucher is one Data API transaction ([`Drainer::commit_batch`]):
//! begin, record the transaction in Redis, lock the voucher row (`NOWAIT`), look up
//! colliding rows (unless the batch is first deliveries),
//! [`plan::split`](crate::plan::split), insert the `confirmed` and `rejected` rows with
//! exact counts, take the stock with a guard, commit. The statements between begin and
//! commit are in [`statements`]. A batch the database refuses is split in halves until
//! the refused order stands alone ([`Drainer::commit_isolating`]). The SQL itself is in
//! `seckill_shared::adapters::ledger::sql`; this module decides what to run and when.
//!
//! Invariants kept here:
//! - the database stock never goes below zero: confirmed ≤ `stock_left` under the row
//!   lock, and the guarded UPDATE must apply, or the transaction rolls back;
//! - a redelivered order finds its row and changes nothing (no row, no stock);
//! - row counts that differ from the plan (a concurrent writer) roll the attempt back and
//!   plan again, a bounded number of times ([`RACE_ATTEMPTS`]);
//! - a transaction left open by a killed run never blocks its voucher: every
//!   transaction is recorded in Redis before it takes the lock and forgotten only once
//!   it is known to be over, and a run that keeps finding the row locked rolls back the
//!   recorded transactions of others ([`Drainer::abort_abandoned`]);
//! - only a refusal of one order *alone* (and not of an ordinary made-up row) blames
//!   that order; any other failure is the database's and leaves the batch pending.

use std::ops::Range;
use std::time::Duration;

use seckill_shared::adapters::closes::EXPIRE_PER_CALL;
use seckill_shared::adapters::ledger::SETTLE_PER_TRANSACTION;
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{AdmittedOrder, Bucket, now_millis};

mod settle;
mod statements;

use self::statements::Attempt;
use super::Drainer;
use super::run::Run;
use crate::error::DrainError;
use crate::failpoint;
use crate::plan::Split;

/// Attempts at a batch whose row counts differ from the plan (a concurrent writer).
const RACE_ATTEMPTS: u32 = 3;
/// Attempts at the voucher's row lock; after the second-to-last, the recorded
/// transactions of other consumers are rolled back (a killed run's, most likely).
const LOCK_ATTEMPTS: u32 = 5;
/// Pause between attempts at a locked voucher row: a live batch commits within it.
const LOCK_RETRY: Duration = Duration::from_millis(150);
/// Attempts at a batch whose transaction InnoDB chose as a deadlock's victim (two
/// vouchers' batches meeting on neighbouring index gaps): rolled back whole, so it is
/// simply tried again.
const DEADLOCK_ATTEMPTS: u32 = 3;

/// How a batch transaction ended.
enum BatchOutcome {
    /// Committed (or nothing to commit): the plan, and how many closes it recorded.
    Committed(Split, usize),
    UnknownVoucher,
}

/// What became of a batch's orders, with their indexes into the batch's orders.
#[derive(Default)]
pub(super) struct Isolated {
    /// Committed, merged over the parts the batch was split into.
    pub(super) committed: Split,
    /// The database has no such voucher.
    pub(super) unknown: Vec<usize>,
    /// Refused alone with a permanent error: (index, error text).
    pub(super) refused: Vec<(usize, String)>,
    /// Parts left untried because the run's time was up (still pending).
    pub(super) unfinished: bool,
}

impl Isolated {
    fn merge(&mut self, offset: usize, part: Split) {
        let shift = |v: Vec<usize>| v.into_iter().map(move |i| i + offset);
        self.committed.confirmed.extend(shift(part.confirmed));
        self.committed.rejected.extend(shift(part.rejected));
        self.committed.duplicates.extend(shift(part.duplicates));
        self.committed.closed.extend(shift(part.closed));
        self.committed
            .dead
            .extend(part.dead.into_iter().map(|(i, r)| (i + offset, r)));
    }
}

impl Drainer {
    /// Closes `voucher`'s orders whose payment deadline has passed (`lua/close.lua`,
    /// which returns their units to the sale), then records every close Redis decided
    /// in the database (a batch transaction without orders). Failures are the run's,
    /// never an order's: what is left waits in Redis for the next sweep.
    pub(super) async fn sweep(&self, run: &Run, voucher: Bucket) {
        let waiting = loop {
            match self.streams.expire_due(voucher).await {
                Ok((expired, to_settle)) => {
                    run.count(|s| s.expired += expired);
                    // Only a voucher with other buckets has a sold-out mark (the survey
                    // probed them); one of a single bucket costs nothing more.
                    let bucketed = run.with(|s| {
                        s.probes
                            .keys()
                            .any(|b| b.voucher() == voucher.voucher() && b.index() > 0)
                    });
                    if expired > 0
                        && bucketed
                        && let Err(e) =
                            transfers::clear_sold_out(self.streams.conn(), voucher.voucher()).await
                    {
                        // The mark expires by itself within seconds.
                        run.record(&DrainError::store(
                            "clearing the sold-out mark",
                            Some(voucher),
                            e,
                        ));
                    }
                    // A sale with a waiting room: the units given back in a bucket other
                    // than 0 go to its line there now, not at the next survey.
                    if expired > 0 && voucher.index() > 0 {
                        let sales = seckill_shared::adapters::redis::RedisSales::new(
                            self.streams.conn().clone(),
                        )
                        .with_durability(self.cfg.redis.durable);
                        if let Err(e) = transfers::deliver_returned(&sales, voucher).await {
                            // The survey finishes them.
                            run.record(&DrainError::store(
                                "delivering returned units to the line",
                                Some(voucher),
                                e,
                            ));
                        }
                    }
                    if expired < EXPIRE_PER_CALL || !run.fits(1) {
                        break to_settle;
                    }
                }
                Err(e) => {
                    run.fail(
                        voucher,
                        DrainError::store("expiring unpaid orders", Some(voucher), e),
                    );
                    return;
                }
            }
        };
        failpoint::hit("after_expire");
        // Settling transactions record up to SETTLE_PER_TRANSACTION closes each, of
        // orders with a row; one that records fewer has recorded all there were (closes
        // of orders not drained yet wait for their batch). The rounds are bounded too.
        let mut rounds = 0;
        while waiting > 0 && run.fits(1) && rounds < 10 {
            rounds += 1;
            match self.commit_batch(run, voucher, &[], true).await {
                Ok(BatchOutcome::Committed(_, settled)) if settled >= SETTLE_PER_TRANSACTION => {}
                Ok(_) => return,
                Err(e) => {
                    run.fail(voucher, e);
                    return;
                }
            }
        }
    }

    /// Commits a batch's orders; when the database refuses its rows (an insert failing
    /// with a permanent error, or row counts that keep differing from the plan), splits
    /// it in halves, in stream order, until each refused order stands alone. Returns what
    /// was decided and, when something else stopped it, that failure: any failure that
    /// is not a refusal (the database unreachable, a lock held, a commit lost, a refusal
    /// of the lock or the stock update) is the database's state, not an order's, and
    /// leaves the untried parts pending. So do refusals when the database also refuses
    /// an ordinary made-up row of the voucher (then the schema, rights or a trigger are
    /// at fault), however many of the batch's orders were refused: the row's answer, not
    /// the count, tells an order's fault from the database's (two refused orders alone
    /// in a read, taken for the database's fault by their count, stalled their sale for
    /// good). Parts are only started while a batch still fits in the run's time; the
    /// rest stay pending (`unfinished`).
    pub(super) async fn commit_isolating(
        &self,
        run: &Run,
        voucher: Bucket,
        orders: &[AdmittedOrder],
        first_delivery: bool,
    ) -> (Isolated, Option<DrainError>) {
        let mut out = Isolated::default();
        let mut parts: Vec<Range<usize>> = Vec::with_capacity(8);
        parts.push(0..orders.len());
        let mut refusals = Vec::new();
        let mut tried = 0;
        while let Some(part) = parts.pop() {
            if tried > 0 && !run.fits(1) {
                out.unfinished = true;
                break;
            }
            tried += 1;
            let result = self
                .commit_batch(run, voucher, &orders[part.clone()], first_delivery)
                .await;
            match result {
                Ok(BatchOutcome::Committed(split, _)) => out.merge(part.start, split),
                Ok(BatchOutcome::UnknownVoucher) => out.unknown.extend(part),
                Err(e) if !(e.is_refusal() || matches!(e, DrainError::Raced { .. })) => {
                    return (out, Some(e));
                }
                Err(e) if part.len() > 1 => {
                    tracing::warn!(%voucher, orders = part.len(), error = %e, "batch refused; splitting it to find the order the database refuses");
                    let mid = part.start + part.len() / 2;
                    // Popped last-in first-out: the first half goes first.
                    parts.push(mid..part.end);
                    parts.push(part.start..mid);
                }
                Err(e) => refusals.push((part.start, e)),
            }
        }
        if refusals.is_empty() {
            return (out, None);
        }
        let healthy = match self.ledger.accepts_an_ordinary_row(voucher.voucher()).await {
            Ok(ok) => ok,
            Err(e) => {
                return (
                    out,
                    Some(DrainError::store(
                        "checking the orders table",
                        Some(voucher),
                        e,
                    )),
                );
            }
        };
        if !healthy {
            // The database refuses everything, not these orders. Keep them all pending;
            // the error alarms.
            let (_, first) = refusals.swap_remove(0);
            return (out, Some(first));
        }
        // The database takes an ordinary row: each refused order is tried alone once
        // more, and only one refused again is the order's fault. A passing state of the
        // database that the error list does not know (it sorts it permanent) is met
        // twice, around a healthy check, far less often than once, and once would cost
        // the order for good. An order not tried again (the run's time is up, or the
        // database failed otherwise) stays pending.
        for (i, _) in refusals {
            if !run.fits(1) {
                out.unfinished = true;
                break;
            }
            match self
                .commit_batch(run, voucher, &orders[i..i + 1], first_delivery)
                .await
            {
                Ok(BatchOutcome::Committed(split, _)) => out.merge(i, split),
                Ok(BatchOutcome::UnknownVoucher) => out.unknown.push(i),
                Err(e) if e.is_refusal() || matches!(e, DrainError::Raced { .. }) => {
                    out.refused.push((i, e.to_string()));
                }
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    /// Commits one voucher's orders in one transaction, retrying when a concurrent
    /// writer made the row counts differ from the plan, or held the voucher's row, or
    /// when the database chose it as a deadlock's victim. The retries are few and short
    /// (well within the run's safety margin), and are not cut by the run's time: the
    /// roll-back of a killed run's transaction comes at the fourth attempt at the lock,
    /// and a run too short to reach it would never free the row.
    ///
    /// A batch of first deliveries is first tried without looking up existing rows: none
    /// should exist, and the exact counts of `INSERT IGNORE` prove it. If one did exist
    /// (Redis lost its record of a committed order, say), a count comes up short, the
    /// attempt is rolled back and the batch is planned again with the lookup. That saves
    /// the largest statement of the common batch without trusting the guess.
    async fn commit_batch(
        &self,
        run: &Run,
        voucher: Bucket,
        orders: &[AdmittedOrder],
        first_delivery: bool,
    ) -> Result<BatchOutcome, DrainError> {
        let mut look_up = !first_delivery;
        let races = RACE_ATTEMPTS + u32::from(first_delivery);
        let (mut raced, mut locked, mut deadlocked) = (0, 0, 0);
        loop {
            failpoint::hit("before_begin");
            let attempt = match self.attempt(run, voucher, orders, look_up).await {
                Err(e) if e.is_deadlock() && deadlocked + 1 < DEADLOCK_ATTEMPTS => {
                    deadlocked += 1;
                    tracing::warn!(%voucher, deadlocked, error = %e, "the batch was a deadlock's victim, retrying");
                    continue;
                }
                other => other?,
            };
            match attempt {
                Attempt::Planned(split, settled) => {
                    return Ok(BatchOutcome::Committed(split, settled.count()));
                }
                Attempt::UnknownVoucher => return Ok(BatchOutcome::UnknownVoucher),
                Attempt::Raced(detail) if !look_up => {
                    look_up = true;
                    tracing::info!(%voucher, detail, "first deliveries collide with existing rows, planning again with a lookup");
                }
                Attempt::Raced(detail) => {
                    tracing::warn!(%voucher, raced, detail, "row counts differ from the plan, retrying");
                }
                Attempt::Locked(e) => {
                    locked += 1;
                    if locked >= LOCK_ATTEMPTS {
                        return Err(DrainError::store("locking the voucher", Some(voucher), e));
                    }
                    if locked == LOCK_ATTEMPTS - 1 {
                        self.abort_abandoned(run, voucher).await?;
                    } else {
                        tokio::time::sleep(LOCK_RETRY).await;
                    }
                    continue;
                }
            }
            raced += 1;
            if raced >= races {
                return Err(DrainError::Raced {
                    voucher,
                    attempts: raced,
                });
            }
        }
    }

    /// One attempt: begin, record the transaction, plan and write, commit (or roll back
    /// when there is nothing to commit or the plan did not hold).
    ///
    /// The record of the transaction is removed only once the transaction is known to
    /// be over (committed, rolled back, or unknown to the server): a transaction whose
    /// commit or rollback failed may still hold the voucher's row, and its record is
    /// what lets a later run roll it back.
    async fn attempt(
        &self,
        run: &Run,
        voucher: Bucket,
        orders: &[AdmittedOrder],
        look_up: bool,
    ) -> Result<Attempt, DrainError> {
        let db = |step, e| DrainError::store(step, Some(voucher), e);
        let tx = self
            .ledger
            .begin()
            .await
            .map_err(|e| db("beginning a transaction", e))?;
        failpoint::hit("after_begin");
        let id = tx.id().to_string();
        if let Err(e) = self
            .streams
            .register_tx(voucher, &id, &run.consumer, now_millis())
            .await
        {
            // Unrecorded: it must not stay open. It holds no lock yet.
            tx.rollback().await;
            return Err(db("recording the transaction", e));
        }
        // From the row lock to the commit, the voucher's other transactions of this run
        // (its other buckets) wait for their turn here instead of failing on the lock:
        // begun and recorded already, each locks the row as soon as the one before
        // commits.
        let turn = run.turn(voucher.voucher());
        let held = turn.lock().await;
        let planned =
            statements::plan_and_write(&self.streams, run, &tx, voucher, orders, look_up).await;
        let (outcome, over) = match planned {
            Ok(Attempt::Planned(split, settled))
                // Units given back are closes recorded, so they are in `done` too.
                if split.writes() > 0 || settled.count() > 0 =>
            {
                failpoint::hit("before_commit");
                match tx.commit().await {
                    Ok(()) => {
                        failpoint::hit("after_commit");
                        // The database holds these closes now; a failure here only
                        // makes a later run find them settled again.
                        for (bucket, done) in &settled.done {
                            if let Err(e) = self.streams.settled(*bucket, done).await {
                                tracing::warn!(%bucket, error = %e, "could not forget settled closes");
                            }
                        }
                        failpoint::hit("after_settled");
                        run.count(|s| s.settled += settled.count() as u64);
                        (Ok(Attempt::Planned(split, settled)), true)
                    }
                    Err(e) => {
                        // The commit may not have reached the server: end it for sure.
                        let ended = tx.try_rollback().await.is_ok();
                        (Err(db("committing", e)), ended)
                    }
                }
            }
            // Only redeliveries or dead letters (nothing to commit), another plan, or a
            // failure: roll back.
            other => {
                let ended = match tx.try_rollback().await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(%voucher, error = %e, "rollback failed; the transaction stays recorded");
                        false
                    }
                };
                (other, ended)
            }
        };
        drop(held);
        if over && let Err(e) = self.streams.unregister_tx(voucher, &id).await {
            // A stale record costs a later run one rollback of an unknown transaction.
            tracing::warn!(%voucher, error = %e, "could not forget an ended transaction");
        }
        outcome
    }

    /// Rolls back the recorded open transactions of other runs (or of this consumer's
    /// earlier invocations) on `voucher` that began
    /// at least [`abandoned_after`](Drainer::abandoned_after) ago: after a kill they
    /// would hold the voucher's row for the Data API's 3 idle minutes. A younger one is
    /// left alone (a live batch of an overlapping run; it ends within seconds). A live
    /// transaction rolled back here fails its commit and leaves its entries pending:
    /// nothing is lost. Each record is handled on its own; a failure is logged and the
    /// next one tried. Returns how many were rolled back.
    async fn abort_abandoned(&self, run: &Run, voucher: Bucket) -> Result<u64, DrainError> {
        let open = self
            .streams
            .registered_txs(voucher)
            .await
            .map_err(|e| DrainError::store("listing open transactions", Some(voucher), e))?;
        let now = now_millis();
        let old_enough = self.abandoned_after().as_millis() as i64;
        let mut aborted = 0;
        for (tx, consumer, begun) in open {
            // This run's own transactions are live (one per voucher at a time). An older
            // one under the same name is a former invocation's: a warm Lambda instance
            // keeps its consumer name, and a transaction whose commit and rollback both
            // failed there would otherwise hold the row until the Data API drops it.
            let this_run = consumer == run.consumer && begun >= run.started_ms;
            if this_run || now - begun < old_enough {
                continue;
            }
            match self.ledger.abort_abandoned(&tx).await {
                Ok(rolled_back) => {
                    if rolled_back {
                        aborted += 1;
                        run.count(|s| s.aborted_transactions += 1);
                        tracing::warn!(%voucher, transaction = %tx, %consumer, age_ms = now - begun, "rolled back a transaction another run left open");
                    }
                    // Recorded in the voucher's registry or in the groups' (forgetting
                    // what is not there costs nothing).
                    let forgot = tokio::join!(
                        self.streams.unregister_tx(voucher, &tx),
                        self.streams.unregister_group_tx(&tx)
                    );
                    if let Err(e) = forgot.0.and(forgot.1) {
                        tracing::warn!(%voucher, error = %e, "could not forget an abandoned transaction");
                    }
                }
                Err(e) => {
                    tracing::warn!(%voucher, transaction = %tx, error = %e, "could not roll back an abandoned transaction");
                }
            }
        }
        Ok(aborted)
    }

    /// How old another run's open transaction must be to count as abandoned: the claim
    /// threshold (after which its entries are taken over anyway), at most 10 s (a live
    /// batch transaction lasts well under a second; production runs never overlap).
    fn abandoned_after(&self) -> Duration {
        self.cfg.min_idle.min(Duration::from_secs(10))
    }
}

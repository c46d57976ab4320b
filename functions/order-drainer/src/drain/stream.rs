//! Stream bookkeeping: what the drainer does to the orders streams around a batch: claim
//! what other runs left idle (step 2 of the cycle, [`Drainer::recover`]), read the next
//! entries (its own unseen pending ones first, then new ones), dead-letter, release what
//! it cannot finish, and at the end of the run trim, measure and retire. (Acking a
//! committed batch is one call in [`Drainer::process`](super::Drainer), next to the
//! commit it follows.)
//!
//! Invariants kept here:
//! - an entry leaves the pending list only through an ack after its batch committed, or
//!   through its dead letter, written in the same script as the ack and after the
//!   `rejected` row its buyer should see ([`Drainer::dead_letter_all`]); a dead letter
//!   carries the close Redis decided for its order (a paid order keeps its payment
//!   through a replay), and the order leaves the payment step in that same script;
//! - only entries that can never be written are dead-lettered; how often an entry was
//!   delivered never counts;
//! - an entry a run read but cannot finish (a transient failure, a voucher stopped) is
//!   released: still pending, but marked idle, so the next run claims it at once
//!   ([`Drainer::release`]); one whose read lost its reply is read again, before any
//!   newer entry of its stream ([`Drainer::read_next`]);
//! - what was read is counted as soon as it is pending, whatever happens next.

use std::collections::BTreeMap;

use futures::StreamExt;
use seckill_shared::adapters::order_stream::Probe;
use seckill_shared::domain::{AdmittedOrder, Bucket, OrderId, StreamEntry, VoucherId, now_millis};
use seckill_shared::error::StoreError;

use super::run::Run;
use super::{Drainer, PROBES_IN_FLIGHT};
use crate::error::DrainError;
use crate::failpoint;
use crate::plan::Reason;

/// A sale is retired this long after it ends, so an admission stamped by a slightly slow
/// clock cannot land in a stream nobody visits any more.
const RETIRE_GRACE_MS: i64 = 60_000;

impl Drainer {
    /// Claims and processes the entries other consumers left idle, page by page.
    pub(super) async fn recover(&self, run: &Run, voucher: Bucket) {
        let mut cursor = "0-0".to_string();
        while run.fits(1) && !run.stopped(voucher) {
            let page = match self
                .streams
                .claim_idle(
                    voucher,
                    &run.consumer,
                    self.cfg.min_idle,
                    &cursor,
                    self.cfg.batch_size,
                )
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    run.fail(
                        voucher,
                        DrainError::store("claiming idle entries", Some(voucher), e),
                    );
                    return;
                }
            };
            if !page.deleted.is_empty() {
                tracing::warn!(%voucher, deleted = ?page.deleted, "pending entries no longer in the stream");
            }
            if !page.entries.is_empty() {
                run.touch(voucher);
                run.count(|s| s.claimed += page.entries.len() as u64);
                failpoint::hit("after_claim");
                self.process(run, voucher, page.entries, false).await;
            }
            match page.next {
                Some(next) => cursor = next,
                None => return,
            }
        }
        // Out of time with claimable entries left (or stopped): nothing newer of this
        // voucher is drained in this run, so its older entries still go first next time.
        run.stop(voucher);
    }

    /// The next batch of `voucher`'s entries for this run, in stream order: entries
    /// pending for this consumer past `after` (the last entry of the batch in hand;
    /// `None`: it holds none), which a read whose reply was lost left there unseen,
    /// while there are any (`lua/read.lua` finds them in its own call and reads nothing
    /// then, as the survey's probe does), and new entries only then. Else a newer order
    /// could take the database's last unit from one admitted before it, and the lost
    /// entries would wait for the claim threshold.
    pub(super) async fn read_next(
        &self,
        run: &Run,
        voucher: Bucket,
        after: Option<&str>,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let (batch, consumer) = (self.cfg.batch_size, run.consumer.as_str());
        if !run.with(|s| s.own_first.contains(&voucher)) {
            match self
                .streams
                .read_new(voucher, consumer, after, batch)
                .await?
            {
                Some(new) => return Ok(new),
                None => {
                    tracing::warn!(%voucher, "entries a lost reply left pending: read before new ones");
                    run.with(|s| s.own_first.insert(voucher));
                }
            }
        }
        let own = self
            .streams
            .read_own_pending(voucher, consumer, after, batch)
            .await?;
        if !own.is_empty() {
            return Ok(own);
        }
        run.with(|s| s.own_first.remove(&voucher));
        Ok(self
            .streams
            .read_new(voucher, consumer, after, batch)
            .await?
            .unwrap_or_default())
    }

    /// Takes the result of one XREADGROUP: counts what was read (it is pending now,
    /// whatever happens next) and returns it when there is something to process: not when
    /// it is empty, when Redis failed, or when the voucher was stopped meanwhile (then it
    /// is released for the next invocation).
    pub(super) async fn accept_read(
        &self,
        run: &Run,
        voucher: Bucket,
        read: Result<Vec<StreamEntry>, StoreError>,
    ) -> Option<Vec<StreamEntry>> {
        let entries = match read {
            Ok(entries) => entries,
            Err(e) => {
                let err = DrainError::store("reading new entries", Some(voucher), e);
                run.fail(voucher, err);
                return None;
            }
        };
        if entries.is_empty() {
            return None;
        }
        run.touch(voucher);
        run.count(|s| s.read += entries.len() as u64);
        if run.stopped(voucher) {
            self.release(run, voucher, &entries).await;
            return None;
        }
        failpoint::hit("after_read");
        Some(entries)
    }

    /// Writes dead letters, after committing the `rejected` rows their buyers should
    /// see. Returns false (the voucher stopped, nothing of the failed step acked) when a
    /// write failed.
    pub(super) async fn dead_letter_all(
        &self,
        run: &Run,
        voucher: Bucket,
        entries: &[StreamEntry],
        dead: Vec<(usize, Reason, Option<AdmittedOrder>)>,
    ) -> bool {
        if dead.is_empty() {
            return true;
        }
        // The rejected rows go first and must commit: if the process dies before the
        // dead letter, the redelivered entry finds its row and is acked as a duplicate,
        // and its buyer sees `rejected` either way.
        let mut by_reason: Vec<(String, Vec<AdmittedOrder>)> = Vec::new();
        for (_, reason, order) in &dead {
            if let Some(order) = order.as_ref().filter(|_| reason.records_rejected_row()) {
                let text = reason.text();
                match by_reason.iter_mut().find(|(r, _)| *r == text) {
                    Some((_, orders)) => orders.push(order.clone()),
                    None => by_reason.push((text, vec![order.clone()])),
                }
            }
        }
        for (reason, orders) in by_reason {
            if let Err(e) = self.ledger.record_rejected(&orders, &reason).await {
                run.fail(
                    voucher,
                    DrainError::store(
                        "recording dead-lettered orders as rejected",
                        Some(voucher),
                        e,
                    ),
                );
                return false;
            }
        }
        for (index, reason, order) in dead {
            let entry = &entries[index];
            let text = reason.text();
            failpoint::hit("before_dead_letter");
            // Vouchers with a payment step: in the same script the order leaves the
            // deadlines (it never expires) and the closes to settle (no row will record
            // its close), and the close Redis decided for it travels in the dead letter,
            // so a paid order keeps the payment that paid it when it is replayed.
            let order = order.as_ref().map(|o| (o.id, o.user.as_str()));
            match self.streams.dead_letter(voucher, entry, &text, order).await {
                Ok(true) => {
                    run.count(|s| s.dead_lettered += 1);
                    tracing::warn!(%voucher, entry = %entry.id, reason = %text, deliveries = entry.deliveries, "dead-lettered");
                }
                Ok(false) => {
                    tracing::info!(%voucher, entry = %entry.id, "entry already finished elsewhere, not dead-lettered");
                }
                Err(e) => {
                    run.fail(
                        voucher,
                        DrainError::store("dead-lettering", Some(voucher), e),
                    );
                    return false;
                }
            }
            failpoint::hit("after_dead_letter");
        }
        true
    }

    /// Gives the batch's still-pending entries back for the next invocation to claim at
    /// once (see [`OrderStreams::release`]); if that fails too, they are claimed after
    /// the claim threshold. The voucher stops for the rest of the run: a batch read
    /// after these entries (the one read ahead) must not commit before them, or a later
    /// order could take the database's last unit from an earlier one.
    pub(super) async fn release(&self, run: &Run, voucher: Bucket, entries: &[StreamEntry]) {
        run.stop(voucher);
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        match self
            .streams
            .release(voucher, &run.consumer, &ids, self.cfg.min_idle)
            .await
        {
            Ok(n) => run.count(|s| s.released += n),
            Err(e) => {
                tracing::warn!(%voucher, error = %e, "could not release unfinished entries; they wait for the claim threshold")
            }
        }
    }

    async fn trim(&self, run: &Run, voucher: Bucket) {
        failpoint::hit("before_trim");
        match self.streams.trim(voucher).await {
            Ok(t) => run.count(|s| s.trimmed += t.removed),
            Err(e) => run.record(&DrainError::store("trimming", Some(voucher), e)),
        }
        failpoint::hit("after_trim");
    }

    /// Trims and measures the streams this run touched (the last probe also deletes
    /// this run's consumer where it holds nothing), until the run's `finish_by`.
    pub(super) async fn trim_and_measure(&self, run: &Run) {
        let touched: Vec<Bucket> = run.with(|s| s.touched.iter().copied().collect());
        let end = tokio::time::sleep_until(run.finish_by.into());
        let consumer = run.consumer.as_str();
        let min_idle = self.cfg.min_idle;
        let run_ref = run;
        let fresh: Vec<(Bucket, Result<Probe, StoreError>)> = futures::stream::iter(touched)
            .map(|v| async move {
                self.trim(run_ref, v).await;
                (v, self.streams.probe(v, consumer, min_idle, true, 0).await)
            })
            .buffer_unordered(PROBES_IN_FLIGHT)
            .take_until(end)
            .collect()
            .await;
        for (voucher, probe) in fresh {
            match probe {
                Ok(p) => run.with(|s| {
                    s.summary.probed += 1;
                    s.probes.insert(voucher, p);
                }),
                Err(e) => run.record(&DrainError::store("reading stream stats", Some(voucher), e)),
            }
        }
    }

    /// Puts back in Redis the deadlines of voucher `v`'s orders the database holds
    /// awaiting payment, each in its buyer's bucket (`ZADD NX`: a deadline Redis still
    /// has, or a close it decided, is left as it is; see
    /// [`seckill_shared::adapters::closes::restore_deadlines`]).
    async fn restore_unpaid_deadlines(&self, v: VoucherId, buckets: u16) -> Result<(), StoreError> {
        let mut after = 0;
        loop {
            let page = self.ledger.awaiting_payment(v, after).await?;
            let Some((last, ..)) = page.last() else {
                return Ok(());
            };
            after = last.get();
            let mut parts: BTreeMap<Bucket, Vec<(OrderId, &str, i64)>> = BTreeMap::new();
            for (o, u, d) in &page {
                parts
                    .entry(Bucket::of_user(v, buckets, u))
                    .or_default()
                    .push((*o, u.as_str(), *d));
            }
            for (b, open) in parts {
                self.streams.restore_deadlines(b, &open).await?;
            }
        }
    }

    /// Retires the sales that are over and drained (by the latest probes), once
    /// `lua/expire_sale.lua` agrees (nothing undrained, no order waiting for payment or
    /// for its close to reach the database, no units on their way; with or without a
    /// retention): their keys get an expiry when a retention is set, then they leave
    /// the active set. Until `finish_by`.
    ///
    /// A drained bucket of the active set without a sale hash (a sale whose preload
    /// failed and that nobody asked for, one Redis lost after it ended, a dead letter
    /// replayed after the retention) has its end read from the database, and goes once
    /// over with no order of the voucher awaiting payment there: else it would be probed
    /// by every run, its stream kept without expiry, for good.
    pub(super) async fn retire_finished(&self, run: &Run) {
        let run_ref = run;
        let now = now_millis();
        let over_at = |end: i64| end + RETIRE_GRACE_MS < now;
        let (mut over, unknown): (Vec<Bucket>, Vec<Bucket>) = run.with(|s| {
            let drained = s
                .probes
                .iter()
                .filter(|(_, p)| p.pending == 0 && p.fully_delivered);
            let over = drained
                .clone()
                .filter(|(_, p)| p.ends_ms.is_some_and(over_at))
                .map(|(v, _)| *v)
                .collect();
            let unknown = drained
                .filter(|(_, p)| p.ends_ms.is_none())
                .map(|(v, _)| *v)
                .collect();
            (over, unknown)
        });
        // One look at the database per voucher, however many of its buckets lost their
        // sale hash.
        let mut by_voucher: BTreeMap<VoucherId, Vec<Bucket>> = BTreeMap::new();
        for b in unknown {
            by_voucher.entry(b.voucher()).or_default().push(b);
        }
        let end = tokio::time::sleep_until(run.finish_by.into());
        let ended: Vec<Vec<Bucket>> = futures::stream::iter(by_voucher)
            .map(|(v, buckets)| async move {
                match self.ledger.sale_end(v).await {
                    // No such voucher: nothing of it can ever be written; drained, it goes.
                    Ok(None) => buckets,
                    Ok(Some(end)) if !over_at(end.ends_ms) => Vec::new(),
                    Ok(Some(end)) if !end.unpaid => buckets,
                    // Over, but orders still await payment in the database: Redis lost
                    // their deadlines with the sale hash (nothing else would expire them,
                    // an ended sale is never repaired). Given back, the sweep expires
                    // them at their deadline, and the bucket retires once settled.
                    Ok(Some(end)) => {
                        if let Err(e) = self.restore_unpaid_deadlines(v, end.buckets).await {
                            run_ref.record(&DrainError::store(
                                "restoring the deadlines of a sale over",
                                Some(v.into()),
                                e,
                            ));
                        }
                        Vec::new()
                    }
                    Err(e) => {
                        run_ref.record(&DrainError::store(
                            "reading a sale's end",
                            Some(v.into()),
                            e,
                        ));
                        Vec::new()
                    }
                }
            })
            .buffer_unordered(PROBES_IN_FLIGHT)
            .take_until(end)
            .collect()
            .await;
        let ended: Vec<Bucket> = ended.into_iter().flatten().collect();
        over.extend(ended);
        let end = tokio::time::sleep_until(run.finish_by.into());
        futures::stream::iter(over)
            .map(|v| async move {
                match self.streams.expire_finished(v, self.cfg.retention).await {
                    Ok(true) => {}
                    // Not drained after all (checked again in the script): stays.
                    Ok(false) => return,
                    Err(e) => {
                        run_ref.record(&DrainError::store("expiring a finished sale", Some(v), e));
                        return;
                    }
                }
                match self.streams.retire(v).await {
                    Ok(true) => {
                        run_ref.count(|s| s.retired += 1);
                        tracing::info!(voucher = %v, "sale over and drained: retired from the active set");
                    }
                    Ok(false) => {}
                    Err(e) => run_ref.record(&DrainError::store("retiring", Some(v), e)),
                }
            })
            .buffer_unordered(PROBES_IN_FLIGHT)
            .take_until(end)
            .for_each(|()| std::future::ready(()))
            .await;
    }
}

//! The drain cycle: one invocation, top to bottom.
//!
//! [`Drainer::run`]:
//! 1. **Discover** the vouchers (the active set, or `DRAINER_VOUCHERS`) and make sure
//!    each stream has the drain group.
//! 2. **Recover**: per voucher, XAUTOCLAIM entries idle longer than `DRAINER_MIN_IDLE_MS`
//!    (left by a crashed or timed-out invocation), following the cursor to its end, one
//!    page at a time, each page processed like a fresh batch.
//! 3. **Drain**: round robin over the vouchers, XREADGROUP `>` one batch each, while the
//!    invocation has time (`DRAINER_MAX_RUN_MS`, and `DRAINER_SAFETY_MARGIN_MS` before
//!    the Lambda deadline). When every stream is empty, wait `DRAINER_IDLE_POLL_MS` and
//!    poll again; every few seconds re-read the active set and trim.
//! 4. **Finish**: trim each stream, measure the remaining lag, retire vouchers whose sale
//!    ended and whose stream is fully drained, delete spent consumers, and return the
//!    [`Summary`].
//!
//! A batch ([`Drainer::process`]): parse ([`plan::sort_entries`]); dead-letter the bad
//! entries; then one Data API transaction for the good ones: lock the voucher row, look
//! up colliding rows, [`plan::split`], insert `confirmed` and `rejected` rows with exact
//! row counts, take the stock with a guard, commit; only then XACK.
//!
//! Invariants:
//! - an entry is acked only after its row is committed, or in the same script that
//!   writes its dead letter: a crash anywhere leaves it pending, to be claimed later;
//! - a redelivered order finds its row and changes nothing (no row, no stock);
//! - the database stock never goes below zero: confirmed ≤ `stock_left` under the row
//!   lock, and the guarded UPDATE must apply, or the transaction rolls back;
//! - a transient failure stops only the voucher it hit, leaves its entries pending and
//!   makes the invocation fail at the end.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::ledger::{AdmittedOrder, Ledger, LedgerTx};
use seckill_shared::adapters::order_stream::{OrderStreams, StreamEntry};
use seckill_shared::adapters::redis::RedisConn;
use seckill_shared::domain::{OrderStatus, VoucherId, now_millis};
use seckill_shared::error::StoreError;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::DrainError;
use crate::failpoint;
use crate::plan::{self, DB_STOCK_EXHAUSTED, Reason, Split};

/// How often a long invocation re-reads the active set (new vouchers) and trims.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(5);
/// Pause after a transient failure before going on with the other vouchers.
const TRANSIENT_BACKOFF: Duration = Duration::from_millis(250);
/// Attempts at a batch whose row counts differ from the plan (a concurrent writer).
const RACE_ATTEMPTS: u32 = 3;
/// A sale is retired this long after it ends, so an admission stamped by a slightly slow
/// clock cannot land in a stream nobody visits any more.
const RETIRE_GRACE_MS: i64 = 60_000;
/// Full batches of one voucher drained back to back (each read while the one before it
/// commits) before the other vouchers get their turn.
const BATCHES_PER_TURN: usize = 16;
/// Error texts kept in the summary (the count is always exact).
const MAX_ERROR_TEXTS: usize = 20;

/// What one invocation did; returned as the Lambda response and logged as one event.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Summary {
    /// The consumer name this invocation read under.
    pub consumer: String,
    /// Vouchers visited.
    pub vouchers: usize,
    /// Entries taken over from idle consumers (XAUTOCLAIM).
    pub claimed: u64,
    /// Entries read for the first time (XREADGROUP).
    pub read: u64,
    /// Orders inserted as `confirmed`.
    pub inserted: u64,
    /// Orders already in the database (redeliveries): acked, nothing written.
    pub duplicates: u64,
    /// Orders inserted as `rejected` because the database stock could not cover them.
    pub rejected: u64,
    /// Entries moved to a dead-letter stream.
    pub dead_lettered: u64,
    /// Entries removed by trimming.
    pub trimmed: u64,
    /// Vouchers removed from the active set (sale over, stream drained).
    pub retired: u64,
    /// Entries not yet delivered, summed over the visited streams, at the end.
    pub lag: u64,
    /// Entries delivered but not acked (pending), summed, at the end.
    pub pending: u64,
    /// Wall time of the invocation.
    pub elapsed_ms: u64,
    /// Number of failures (transient and permanent).
    pub errors: u64,
    /// The first failures' texts.
    pub error_messages: Vec<String>,
}

/// The drainer: clients built once per cold start, one [`run`](Drainer::run) per
/// invocation.
pub struct Drainer {
    cfg: Config,
    streams: OrderStreams,
    ledger: Ledger,
}

/// The state of one invocation.
struct Run {
    consumer: String,
    started: Instant,
    stop_at: Instant,
    /// Vouchers stopped for this invocation after a transient failure.
    failed: BTreeSet<VoucherId>,
    summary: Summary,
}

impl Run {
    fn has_time(&self) -> bool {
        Instant::now() < self.stop_at
    }

    fn remaining(&self) -> Duration {
        self.stop_at.saturating_duration_since(Instant::now())
    }

    fn record(&mut self, err: &DrainError) {
        if err.is_transient() {
            tracing::warn!(error = %err, "transient failure, entries stay pending");
        } else {
            tracing::error!(error = %err, "drain failure, entries stay pending");
        }
        self.summary.errors += 1;
        if self.summary.error_messages.len() < MAX_ERROR_TEXTS {
            self.summary.error_messages.push(err.to_string());
        }
    }
}

/// How a batch transaction ended.
enum BatchOutcome {
    Committed(Split),
    UnknownVoucher,
}

/// How one attempt at a batch transaction ended (before commit).
enum Attempt {
    Planned(Split),
    UnknownVoucher,
    Raced(String),
}

impl Drainer {
    /// Connects to Redis and builds the Data API client.
    pub async fn connect(cfg: Config) -> Result<Drainer, DrainError> {
        let conn = RedisConn::connect(&cfg.redis)
            .await
            .map_err(|e| DrainError::store("connecting to redis", None, e))?;
        let api = DataApi::connect(&cfg.data_api).await;
        Ok(Drainer::new(cfg, OrderStreams::new(conn), Ledger::new(api)))
    }

    pub fn new(cfg: Config, streams: OrderStreams, ledger: Ledger) -> Drainer {
        Drainer {
            cfg,
            streams,
            ledger,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// One invocation: drains until `deadline - safety margin` or `max_run`, whichever
    /// comes first, and returns what it did. Failures are counted in the summary, never
    /// thrown: the caller decides how to report them.
    pub async fn run(&self, consumer: &str, deadline: Instant) -> Summary {
        let started = Instant::now();
        let stop_at = deadline
            .checked_sub(self.cfg.safety_margin)
            .unwrap_or(started)
            .min(started + self.cfg.max_run);
        let mut run = Run {
            consumer: consumer.to_string(),
            started,
            stop_at,
            failed: BTreeSet::new(),
            summary: Summary {
                consumer: consumer.to_string(),
                ..Summary::default()
            },
        };

        // 1. Discover.
        let mut vouchers = match self.discover(&mut run, &BTreeSet::new()).await {
            Some(v) => v,
            None => return self.finish(run, &BTreeSet::new()).await,
        };
        let mut visited: BTreeSet<VoucherId> = vouchers.iter().copied().collect();

        // 2. Recover what crashed or timed-out invocations left pending.
        for &voucher in &vouchers {
            if !run.has_time() {
                break;
            }
            self.recover(&mut run, voucher).await;
        }

        // 3. Drain new entries until the time is up.
        let mut last_maintenance = Instant::now();
        while run.has_time() {
            if last_maintenance.elapsed() >= MAINTENANCE_EVERY {
                if let Some(fresh) = self.discover(&mut run, &visited).await {
                    vouchers = fresh;
                    visited.extend(vouchers.iter().copied());
                }
                for &voucher in &vouchers {
                    self.trim(&mut run, voucher).await;
                }
                last_maintenance = Instant::now();
            }
            let mut busy = false;
            for &voucher in &vouchers {
                if !run.has_time() {
                    break;
                }
                if run.failed.contains(&voucher) {
                    continue;
                }
                busy |= self.drain_batches(&mut run, voucher).await;
            }
            if vouchers.iter().all(|v| run.failed.contains(v)) && !vouchers.is_empty() {
                // Nothing left this invocation can do.
                break;
            }
            if !busy {
                // Every stream is empty: wait for new admissions rather than return, so
                // one scheduled invocation drains for most of its period.
                if run.remaining() <= self.cfg.idle_poll {
                    break;
                }
                tokio::time::sleep(self.cfg.idle_poll).await;
            }
        }

        // 4. Finish.
        self.finish(run, &visited).await
    }

    /// The vouchers to visit, each with its drain group (created for those not `known`
    /// yet). `None` when they cannot be listed.
    async fn discover(&self, run: &mut Run, known: &BTreeSet<VoucherId>) -> Option<Vec<VoucherId>> {
        let vouchers = match &self.cfg.vouchers {
            Some(fixed) => fixed.clone(),
            None => match self.streams.active_vouchers().await {
                Ok((ids, bad)) => {
                    if !bad.is_empty() {
                        tracing::warn!(
                            ?bad,
                            "the active set holds members that are not voucher ids"
                        );
                    }
                    ids
                }
                Err(e) => {
                    run.record(&DrainError::store("reading the active set", None, e));
                    return None;
                }
            },
        };
        let mut ready = Vec::with_capacity(vouchers.len());
        for voucher in vouchers {
            if known.contains(&voucher) {
                ready.push(voucher);
                continue;
            }
            match self.streams.ensure_group(voucher).await {
                Ok(()) => ready.push(voucher),
                Err(e) => {
                    run.record(&DrainError::store(
                        "creating the drain group",
                        Some(voucher),
                        e,
                    ));
                    run.failed.insert(voucher);
                }
            }
        }
        Some(ready)
    }

    /// Claims and processes the entries other consumers left idle, page by page.
    async fn recover(&self, run: &mut Run, voucher: VoucherId) {
        let mut cursor = "0-0".to_string();
        while run.has_time() && !run.failed.contains(&voucher) {
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
                    self.fail(
                        run,
                        voucher,
                        DrainError::store("claiming idle entries", Some(voucher), e),
                    )
                    .await;
                    return;
                }
            };
            if !page.deleted.is_empty() {
                tracing::warn!(%voucher, deleted = ?page.deleted, "pending entries no longer in the stream");
            }
            if !page.entries.is_empty() {
                run.summary.claimed += page.entries.len() as u64;
                failpoint::hit("after_claim");
                self.process(run, voucher, page.entries, false).await;
            }
            match page.next {
                Some(next) => cursor = next,
                None => return,
            }
        }
    }

    /// Reads and processes one voucher's new entries, batch after batch; true when there
    /// were any.
    ///
    /// While a full batch is being committed, the next one is read: Redis and the
    /// database work at the same time instead of in turn. A batch read ahead is always
    /// processed, even past `stop_at` (the safety margin leaves room for one batch), so
    /// its orders are not parked for `DRAINER_MIN_IDLE_MS`. Only when the batch before it
    /// fails does it stay pending, for the next invocation to reclaim, like the failed
    /// batch itself.
    async fn drain_batches(&self, run: &mut Run, voucher: VoucherId) -> bool {
        let first = self.read_new(voucher, &run.consumer).await;
        let Some(mut entries) = self.accept_read(run, voucher, first).await else {
            return false;
        };
        for turn in 1..=BATCHES_PER_TURN {
            let read_ahead =
                entries.len() >= self.cfg.batch_size && turn < BATCHES_PER_TURN && run.has_time();
            if !read_ahead {
                self.process(run, voucher, entries, true).await;
                break;
            }
            let consumer = run.consumer.clone();
            let (_, next) = tokio::join!(
                self.process(run, voucher, entries, true),
                self.read_new(voucher, &consumer)
            );
            match self.accept_read(run, voucher, next).await {
                Some(next) => entries = next,
                None => break,
            }
        }
        true
    }

    async fn read_new(
        &self,
        voucher: VoucherId,
        consumer: &str,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        self.streams
            .read_new(voucher, consumer, self.cfg.batch_size)
            .await
    }

    /// Takes the result of one XREADGROUP: counts what was read (it is pending now,
    /// whatever happens next) and returns it when there is something to process: not when
    /// it is empty, when Redis failed, or when the voucher was stopped meanwhile (then it
    /// stays pending for the next invocation to reclaim).
    async fn accept_read(
        &self,
        run: &mut Run,
        voucher: VoucherId,
        read: Result<Vec<StreamEntry>, StoreError>,
    ) -> Option<Vec<StreamEntry>> {
        let entries = match read {
            Ok(entries) => entries,
            Err(e) => {
                let err = DrainError::store("reading new entries", Some(voucher), e);
                self.fail(run, voucher, err).await;
                return None;
            }
        };
        run.summary.read += entries.len() as u64;
        if entries.is_empty() || run.failed.contains(&voucher) {
            return None;
        }
        failpoint::hit("after_read");
        Some(entries)
    }

    /// One batch of one voucher: dead-letter the bad entries, commit the good ones, ack.
    /// `first_delivery`: the entries come from XREADGROUP `>`, so no earlier run can have
    /// committed them (a run that committed and then died leaves them pending, and they
    /// come back through XAUTOCLAIM).
    async fn process(
        &self,
        run: &mut Run,
        voucher: VoucherId,
        entries: Vec<StreamEntry>,
        first_delivery: bool,
    ) {
        let sorted = plan::sort_entries(voucher, &entries, self.cfg.max_deliveries);
        let dead: Vec<(usize, Reason, Option<AdmittedOrder>)> = sorted
            .dead
            .into_iter()
            .map(|d| (d.index, d.reason, d.order))
            .collect();
        if !self.dead_letter_all(run, voucher, &entries, dead).await {
            return;
        }
        if sorted.orders.is_empty() {
            return;
        }
        let (indexes, orders): (Vec<usize>, Vec<AdmittedOrder>) = sorted.orders.into_iter().unzip();

        match self.commit_batch(voucher, &orders, first_delivery).await {
            Ok(BatchOutcome::Committed(split)) => {
                let ids: Vec<&str> = split
                    .confirmed
                    .iter()
                    .chain(&split.rejected)
                    .chain(&split.duplicates)
                    .map(|&i| entries[indexes[i]].id.as_str())
                    .collect();
                if let Err(e) = self.streams.ack(voucher, &ids).await {
                    // Committed but not acked: the entries are redelivered later and
                    // found as duplicates. Nothing is lost or doubled.
                    self.fail(
                        run,
                        voucher,
                        DrainError::store("acking a committed batch", Some(voucher), e),
                    )
                    .await;
                    return;
                }
                failpoint::hit("after_ack");
                run.summary.inserted += split.confirmed.len() as u64;
                run.summary.rejected += split.rejected.len() as u64;
                run.summary.duplicates += split.duplicates.len() as u64;
                if !split.rejected.is_empty() {
                    tracing::warn!(
                        %voucher,
                        rejected = split.rejected.len(),
                        "database stock could not cover admitted orders (Redis and database disagree); recorded as rejected"
                    );
                }
                let dead = split
                    .dead
                    .into_iter()
                    .map(|(i, reason)| (indexes[i], reason, Some(orders[i].clone())))
                    .collect();
                self.dead_letter_all(run, voucher, &entries, dead).await;
            }
            Ok(BatchOutcome::UnknownVoucher) => {
                tracing::error!(%voucher, orders = orders.len(), "voucher not in the database: dead-lettering the batch");
                let dead = indexes
                    .into_iter()
                    .zip(orders)
                    .map(|(i, o)| (i, Reason::UnknownVoucher, Some(o)))
                    .collect();
                self.dead_letter_all(run, voucher, &entries, dead).await;
            }
            Err(e) => self.fail(run, voucher, e).await,
        }
    }

    /// Writes dead letters (and, where useful, `rejected` rows first, best effort).
    /// Returns false when Redis failed (the voucher is stopped).
    async fn dead_letter_all(
        &self,
        run: &mut Run,
        voucher: VoucherId,
        entries: &[StreamEntry],
        dead: Vec<(usize, Reason, Option<AdmittedOrder>)>,
    ) -> bool {
        if dead.is_empty() {
            return true;
        }
        // The rejected rows go first: if the process dies before the dead letter, the
        // redelivered entry finds its row and is acked as a duplicate, and its buyer
        // sees `rejected` either way.
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
                tracing::warn!(%voucher, %reason, error = %e, "could not record dead-lettered orders as rejected");
            }
        }
        for (index, reason, _) in dead {
            let entry = &entries[index];
            let text = reason.text();
            failpoint::hit("before_dead_letter");
            match self.streams.dead_letter(voucher, entry, &text).await {
                Ok(true) => {
                    run.summary.dead_lettered += 1;
                    tracing::warn!(%voucher, entry = %entry.id, reason = %text, deliveries = entry.deliveries, "dead-lettered");
                }
                Ok(false) => {
                    tracing::info!(%voucher, entry = %entry.id, "entry already finished elsewhere, not dead-lettered");
                }
                Err(e) => {
                    self.fail(
                        run,
                        voucher,
                        DrainError::store("dead-lettering", Some(voucher), e),
                    )
                    .await;
                    return false;
                }
            }
            failpoint::hit("after_dead_letter");
        }
        true
    }

    /// Commits one voucher's orders in one transaction, retrying when a concurrent
    /// writer made the row counts differ from the plan.
    ///
    /// A batch of first deliveries is first tried without looking up existing rows: none
    /// should exist, and the exact counts of `INSERT IGNORE` prove it. If one did exist
    /// (Redis lost its record of a committed order, say), a count comes up short, the
    /// attempt is rolled back and the batch is planned again with the lookup. That saves
    /// the largest statement of the common batch without trusting the guess.
    async fn commit_batch(
        &self,
        voucher: VoucherId,
        orders: &[AdmittedOrder],
        first_delivery: bool,
    ) -> Result<BatchOutcome, DrainError> {
        let db = |step, e| DrainError::store(step, Some(voucher), e);
        let mut look_up = !first_delivery;
        let attempts = RACE_ATTEMPTS + u32::from(first_delivery);
        for attempt in 1..=attempts {
            failpoint::hit("before_begin");
            let tx = self
                .ledger
                .begin()
                .await
                .map_err(|e| db("beginning a transaction", e))?;
            failpoint::hit("after_begin");
            match self.plan_and_write(&tx, voucher, orders, look_up).await {
                Ok(Attempt::Planned(split)) if split.writes() == 0 => {
                    // Only redeliveries or dead letters: nothing to commit.
                    tx.rollback().await;
                    return Ok(BatchOutcome::Committed(split));
                }
                Ok(Attempt::Planned(split)) => {
                    failpoint::hit("before_commit");
                    tx.commit().await.map_err(|e| db("committing", e))?;
                    failpoint::hit("after_commit");
                    return Ok(BatchOutcome::Committed(split));
                }
                Ok(Attempt::UnknownVoucher) => {
                    tx.rollback().await;
                    return Ok(BatchOutcome::UnknownVoucher);
                }
                Ok(Attempt::Raced(detail)) if !look_up => {
                    tx.rollback().await;
                    look_up = true;
                    tracing::info!(%voucher, detail, "first deliveries collide with existing rows, planning again with a lookup");
                }
                Ok(Attempt::Raced(detail)) => {
                    tx.rollback().await;
                    tracing::warn!(%voucher, attempt, detail, "row counts differ from the plan, retrying");
                }
                Err(e) => {
                    tx.rollback().await;
                    return Err(e);
                }
            }
        }
        Err(DrainError::Raced { voucher, attempts })
    }

    /// The statements of one attempt, up to (not including) the commit; without
    /// `look_up`, planned as if no order of the batch were in the database yet.
    async fn plan_and_write(
        &self,
        tx: &LedgerTx<'_>,
        voucher: VoucherId,
        orders: &[AdmittedOrder],
        look_up: bool,
    ) -> Result<Attempt, DrainError> {
        let db = |step, e| DrainError::store(step, Some(voucher), e);
        let Some(stock_left) = tx
            .lock_voucher(voucher)
            .await
            .map_err(|e| db("locking the voucher", e))?
        else {
            return Ok(Attempt::UnknownVoucher);
        };
        failpoint::hit("after_lock");
        let existing = if look_up {
            tx.existing_orders(voucher, orders)
                .await
                .map_err(|e| db("looking up existing orders", e))?
        } else {
            Vec::new()
        };
        let split = plan::split(voucher, orders, &existing, stock_left);

        for (indexes, status, reason) in [
            (&split.confirmed, OrderStatus::Confirmed, None),
            (
                &split.rejected,
                OrderStatus::Rejected,
                Some(DB_STOCK_EXHAUSTED),
            ),
        ] {
            if indexes.is_empty() {
                continue;
            }
            let rows: Vec<AdmittedOrder> = indexes.iter().map(|&i| orders[i].clone()).collect();
            let inserted = tx
                .insert_orders(&rows, status, reason)
                .await
                .map_err(|e| db("inserting orders", e))?;
            failpoint::hit("after_insert");
            if inserted != rows.len() as u64 {
                return Ok(Attempt::Raced(format!(
                    "{inserted} of {} {} rows inserted",
                    rows.len(),
                    status.as_str()
                )));
            }
        }
        let take = split.confirmed.len() as i64;
        if take > 0 {
            let taken = tx
                .take_stock(voucher, take)
                .await
                .map_err(|e| db("taking stock", e))?;
            if !taken {
                return Ok(Attempt::Raced(format!("stock guard refused {take} units")));
            }
            failpoint::hit("after_stock_update");
        }
        Ok(Attempt::Planned(split))
    }

    /// Records a failure; a transient one stops the voucher for this invocation.
    async fn fail(&self, run: &mut Run, voucher: VoucherId, err: DrainError) {
        run.record(&err);
        if err.is_transient() {
            run.failed.insert(voucher);
            if run.remaining() > TRANSIENT_BACKOFF {
                tokio::time::sleep(TRANSIENT_BACKOFF).await;
            }
        }
    }

    async fn trim(&self, run: &mut Run, voucher: VoucherId) {
        failpoint::hit("before_trim");
        match self.streams.trim(voucher).await {
            Ok(t) => run.summary.trimmed += t.removed,
            Err(e) => run.record(&DrainError::store("trimming", Some(voucher), e)),
        }
        failpoint::hit("after_trim");
    }

    /// Trims, measures, retires and cleans up; logs and returns the summary.
    async fn finish(&self, mut run: Run, visited: &BTreeSet<VoucherId>) -> Summary {
        let now = now_millis();
        for &voucher in visited {
            self.trim(&mut run, voucher).await;
            let stats = match self.streams.stats(voucher).await {
                Ok(stats) => stats,
                Err(e) => {
                    run.record(&DrainError::store("reading stream stats", Some(voucher), e));
                    continue;
                }
            };
            let Some(stats) = stats else { continue };
            run.summary.lag += stats.undelivered;
            run.summary.pending += stats.pending;
            if let Err(e) = self
                .streams
                .reap_consumers(voucher, &run.consumer, self.cfg.min_idle)
                .await
            {
                run.record(&DrainError::store(
                    "deleting spent consumers",
                    Some(voucher),
                    e,
                ));
            }
            if stats.pending == 0 && stats.fully_delivered {
                match self.streams.sale_ends_ms(voucher).await {
                    Ok(Some(ends)) if ends + RETIRE_GRACE_MS < now => {
                        match self.streams.retire(voucher).await {
                            Ok(true) => {
                                run.summary.retired += 1;
                                tracing::info!(%voucher, "sale over and drained: retired from the active set");
                            }
                            Ok(false) => {}
                            Err(e) => run.record(&DrainError::store("retiring", Some(voucher), e)),
                        }
                    }
                    Ok(_) => {}
                    Err(e) => run.record(&DrainError::store(
                        "reading the sale window",
                        Some(voucher),
                        e,
                    )),
                }
            }
        }
        run.summary.vouchers = visited.len();
        run.summary.elapsed_ms = run.started.elapsed().as_millis() as u64;
        let s = &run.summary;
        tracing::info!(
            consumer = %s.consumer,
            vouchers = s.vouchers,
            claimed = s.claimed,
            read = s.read,
            inserted = s.inserted,
            duplicates = s.duplicates,
            rejected = s.rejected,
            dead_lettered = s.dead_lettered,
            trimmed = s.trimmed,
            retired = s.retired,
            lag = s.lag,
            pending = s.pending,
            elapsed_ms = s.elapsed_ms,
            errors = s.errors,
            "drain summary"
        );
        run.summary
    }
}

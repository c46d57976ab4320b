//! The drain cycle: one invocation, top to bottom.
//!
//! [`Drainer::run`]:
//! 1. **Survey** every voucher (the active set, or `DRAINER_VOUCHERS`) with one script
//!    call each, many at once ([`OrderStreams::probe`]): it makes a missing drain group,
//!    tells whether new entries wait or idle ones can be claimed, and deletes a few spent
//!    consumers. A voucher without work costs nothing more. The survey starts at a
//!    different place each run and stops when the run's time is up, so with thousands
//!    of sales no voucher is always last.
//! 2. **Recover**: where the survey found claimable entries (left by a crashed, killed
//!    or timed-out invocation, or released by one that gave up), XAUTOCLAIM them page
//!    by page, following the cursor to its end; each page is processed like a batch.
//! 3. **Drain**: up to `DRAINER_CONCURRENCY` vouchers at once, largest backlog first,
//!    XREADGROUP `>` in batches (up to [`BATCHES_PER_TURN`] per voucher per turn, the
//!    next read while the current batch commits). Vouchers with work, and open sales
//!    when there are few, are polled every `DRAINER_IDLE_POLL_MS`; every
//!    [`MAINTENANCE_EVERY`] the whole set is surveyed again.
//! 4. **Finish**: trim the streams it acked, measure what is left, retire sales that are
//!    over and drained (their keys expire after `DRAINER_RETENTION_S`; a non-empty
//!    dead-letter stream stays), and return the [`Summary`].
//!
//! A batch ([`Drainer::process`]): parse ([`plan::sort_entries`]); dead-letter what can
//! never be written; one Data API transaction for the rest: lock the voucher row
//! (`NOWAIT`), look up colliding rows, [`plan::split`], insert `confirmed` and `rejected`
//! rows with exact counts, take the stock with a guard, commit; only then XACK.
//!
//! Invariants:
//! - an entry is acked only once its outcome is committed: its row, or (for an entry
//!   that can never have a row of its own) its dead letter, written in the same script
//!   as the ack, after the `rejected` row its buyer should see;
//! - only entries that can never be written are dead-lettered: malformed, of an unknown
//!   voucher, colliding with another order's buyer or id, or refused by the database
//!   *alone* with a permanent error (a batch that fails permanently is split until the
//!   culprit stands alone). How often an entry was delivered never counts: crashes,
//!   timeouts and outages, however long or repeated, cost an entry nothing;
//! - an entry a run read but cannot finish (a transient failure, a voucher stopped) is
//!   released: still pending, but marked idle, so the next run claims it at once;
//! - a batch starts only when the run's estimate of a batch still fits before
//!   `stop_at`; a batch read ahead was checked to fit too, and is always processed;
//! - a transaction left open by a killed run never blocks its voucher: open
//!   transactions are recorded in Redis, the row lock is taken with `NOWAIT`, and a run
//!   that keeps finding the row locked rolls back the recorded transactions of others;
//! - a redelivered order finds its row and changes nothing (no row, no stock);
//! - the database stock never goes below zero: confirmed ≤ `stock_left` under the row
//!   lock, and the guarded UPDATE must apply, or the transaction rolls back.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::ledger::{Ledger, LedgerTx};
use seckill_shared::adapters::order_stream::{OrderStreams, Probe};
use seckill_shared::adapters::redis::RedisConn;
use seckill_shared::domain::{AdmittedOrder, OrderStatus, StreamEntry, VoucherId, now_millis};
use seckill_shared::error::StoreError;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::DrainError;
use crate::failpoint;
use crate::plan::{self, DB_STOCK_EXHAUSTED, Reason, Split};

/// How often a long invocation surveys every voucher again (new sales, new admissions
/// on quiet ones, entries released by others).
const MAINTENANCE_EVERY: Duration = Duration::from_secs(5);
/// Attempts at a batch whose row counts differ from the plan (a concurrent writer).
const RACE_ATTEMPTS: u32 = 3;
/// Attempts at the voucher's row lock; after the second-to-last, the recorded
/// transactions of other consumers are rolled back (a killed run's, most likely).
const LOCK_ATTEMPTS: u32 = 5;
/// Pause between attempts at a locked voucher row: a live batch commits within it.
const LOCK_RETRY: Duration = Duration::from_millis(150);
/// A sale is retired this long after it ends, so an admission stamped by a slightly slow
/// clock cannot land in a stream nobody visits any more.
const RETIRE_GRACE_MS: i64 = 60_000;
/// Full batches of one voucher drained back to back (each read while the one before it
/// commits) before the other vouchers get their turn.
pub const BATCHES_PER_TURN: usize = 16;
/// Probes in flight at once during a survey.
const PROBES_IN_FLIGHT: usize = 64;
/// Open sales polled every round even without work, up to this many; beyond it, quiet
/// sales wait for the next survey.
const POLL_OPEN_SALES: usize = 256;
/// The run's guess of one batch's duration before it has timed one.
const FIRST_BATCH_ESTIMATE: Duration = Duration::from_millis(100);
/// Error texts kept in the summary (the count is always exact).
const MAX_ERROR_TEXTS: usize = 20;
/// Longest database error text kept in a dead letter's reason.
const MAX_REFUSAL_CHARS: usize = 200;

/// What one invocation did; returned as the Lambda response and logged as one event.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Summary {
    /// The consumer name this invocation read under.
    pub consumer: String,
    /// Vouchers surveyed (distinct).
    pub vouchers: usize,
    /// Probes run (one script call each).
    pub probed: u64,
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
    /// Batches committed (one Data API transaction each).
    pub batches: u64,
    /// Entries this run read but gave back unfinished (pending, claimable at once).
    pub released: u64,
    /// Transactions of other (killed) runs rolled back to free a voucher's row.
    pub aborted_transactions: u64,
    /// Entries removed by trimming.
    pub trimmed: u64,
    /// Vouchers removed from the active set (sale over, stream drained).
    pub retired: u64,
    /// Entries not yet delivered, summed over the surveyed streams, at the end.
    pub lag: u64,
    /// Entries delivered but not acked (pending), summed, at the end.
    pub pending: u64,
    /// Idle time of the oldest pending entry seen at the end, in ms (0: none).
    pub oldest_pending_ms: u64,
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

/// The state of one invocation, shared by the vouchers it drains at once.
struct Run {
    consumer: String,
    started: Instant,
    /// No batch starts unless it is expected to end before this.
    stop_at: Instant,
    /// The finish step stops here: the invocation's deadline less a reserve to log and
    /// return the summary (half the safety margin, at most a second).
    finish_by: Instant,
    /// Recent batch duration (ms), rising at once, falling slowly.
    batch_ms: AtomicU64,
    state: Mutex<RunState>,
}

#[derive(Default)]
struct RunState {
    summary: Summary,
    /// Vouchers stopped for this invocation after a failure.
    failed: BTreeSet<VoucherId>,
    /// The latest probe of each voucher.
    probes: BTreeMap<VoucherId, Probe>,
    /// Vouchers this run read, claimed or acked entries of.
    touched: BTreeSet<VoucherId>,
}

impl Run {
    fn with<R>(&self, f: impl FnOnce(&mut RunState) -> R) -> R {
        // Each update is a few field writes: a poisoned state is still consistent.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    fn has_time(&self) -> bool {
        Instant::now() < self.stop_at
    }

    fn remaining(&self) -> Duration {
        self.stop_at.saturating_duration_since(Instant::now())
    }

    /// Whether `batches` more batches are expected to end before `stop_at`.
    fn fits(&self, batches: u32) -> bool {
        let one = Duration::from_millis(self.batch_ms.load(Ordering::Relaxed));
        Instant::now() + one * batches <= self.stop_at
    }

    /// Learns from a batch's duration: a slower batch raises the estimate at once, a
    /// faster one lowers it by a quarter of the difference.
    fn observe_batch(&self, took: Duration) {
        let took = took.as_millis() as u64;
        let _ = self
            .batch_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if took >= old {
                    took
                } else {
                    old - (old - took) / 4
                })
            });
    }

    fn failed(&self, voucher: VoucherId) -> bool {
        self.with(|s| s.failed.contains(&voucher))
    }

    fn count(&self, f: impl FnOnce(&mut Summary)) {
        self.with(|s| f(&mut s.summary))
    }

    fn touch(&self, voucher: VoucherId) {
        self.with(|s| s.touched.insert(voucher));
    }

    fn record(&self, err: &DrainError) {
        if err.is_transient() {
            tracing::warn!(error = %err, "transient failure, entries stay pending");
        } else {
            tracing::error!(error = %err, "drain failure, entries stay pending");
        }
        self.with(|s| {
            s.summary.errors += 1;
            if s.summary.error_messages.len() < MAX_ERROR_TEXTS {
                s.summary.error_messages.push(err.to_string());
            }
        });
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
    /// The voucher row is locked by another transaction.
    Locked(StoreError),
}

/// Feeds a batch's duration into the run's estimate however the batch ends (a slow
/// failure must raise the estimate as much as a slow success).
struct BatchTimer<'a>(&'a Run, Instant);

impl Drop for BatchTimer<'_> {
    fn drop(&mut self) {
        self.0.observe_batch(self.1.elapsed());
    }
}

/// What became of a batch's orders, with their indexes into the batch's orders.
#[derive(Default)]
struct Isolated {
    /// Committed, merged over the parts the batch was split into.
    committed: Split,
    /// The database has no such voucher.
    unknown: Vec<usize>,
    /// Refused alone with a permanent error: (index, error text).
    refused: Vec<(usize, String)>,
    /// Parts left untried because the run's time was up (still pending).
    unfinished: bool,
}

impl Isolated {
    fn merge(&mut self, offset: usize, part: Split) {
        let shift = |v: Vec<usize>| v.into_iter().map(move |i| i + offset);
        self.committed.confirmed.extend(shift(part.confirmed));
        self.committed.rejected.extend(shift(part.rejected));
        self.committed.duplicates.extend(shift(part.duplicates));
        self.committed
            .dead
            .extend(part.dead.into_iter().map(|(i, r)| (i + offset, r)));
    }
}

impl Drainer {
    /// Connects to Redis and builds the Data API client.
    pub async fn connect(cfg: Config) -> Result<Drainer, DrainError> {
        let conn = RedisConn::connect(&cfg.redis)
            .await
            .map_err(|e| DrainError::store("connecting to redis", None, e))?;
        let api = DataApi::connect(&cfg.data_api).await;
        let streams = OrderStreams::new(conn).with_durability(cfg.redis.durable);
        Ok(Drainer::new(cfg, streams, Ledger::new(api)))
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
        let run = Run {
            consumer: consumer.to_string(),
            started,
            stop_at,
            finish_by: deadline
                .checked_sub((self.cfg.safety_margin / 2).min(Duration::from_secs(1)))
                .unwrap_or(deadline)
                .max(stop_at),
            batch_ms: AtomicU64::new(FIRST_BATCH_ESTIMATE.as_millis() as u64),
            state: Mutex::new(RunState {
                summary: Summary {
                    consumer: consumer.to_string(),
                    ..Summary::default()
                },
                ..RunState::default()
            }),
        };

        // 1. Survey, 2. recover.
        let Some(mut poll) = self.survey(&run).await else {
            return self.finish(run).await;
        };
        let mut last_survey = Instant::now();

        // 3. Drain new entries until the time is up.
        while run.has_time() {
            if last_survey.elapsed() >= MAINTENANCE_EVERY {
                if let Some(fresh) = self.survey(&run).await {
                    // Vouchers that were busy stay first; newly found ones follow.
                    let known: BTreeSet<VoucherId> = poll.iter().copied().collect();
                    poll.extend(fresh.into_iter().filter(|v| !known.contains(v)));
                }
                last_survey = Instant::now();
            }
            let round: Vec<VoucherId> = poll.iter().copied().filter(|v| !run.failed(*v)).collect();
            if round.is_empty() && !poll.is_empty() {
                // Every voucher with work was stopped: nothing left this run can do.
                break;
            }
            let run_ref = &run;
            let results: Vec<(VoucherId, bool)> = futures::stream::iter(round)
                .map(|v| async move { (v, self.drain_batches(run_ref, v).await) })
                .buffer_unordered(self.cfg.concurrency)
                .collect()
                .await;
            // Vouchers that had entries go first next round; quiet ones stay polled only
            // while their sale is open and they are few.
            let busy: BTreeSet<VoucherId> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
            let now = now_millis();
            let mut quiet = 0;
            poll.sort_by_key(|v| !busy.contains(v));
            poll.retain(|v| {
                if busy.contains(v) {
                    return true;
                }
                let open = run.with(|s| {
                    s.probes
                        .get(v)
                        .and_then(|p| p.ends_ms)
                        .is_some_and(|end| end > now)
                });
                quiet += usize::from(open);
                open && quiet <= POLL_OPEN_SALES
            });
            if busy.is_empty() {
                // Nothing new: wait for admissions rather than return, so one scheduled
                // invocation drains for most of its period.
                if run.remaining() <= self.cfg.idle_poll {
                    break;
                }
                tokio::time::sleep(self.cfg.idle_poll).await;
            }
        }

        // 4. Finish.
        self.finish(run).await
    }

    /// Probes every voucher (time-boxed), recovers claimable entries, and returns the
    /// vouchers to poll, largest backlog first. `None` when the vouchers cannot be
    /// listed.
    async fn survey(&self, run: &Run) -> Option<Vec<VoucherId>> {
        let mut vouchers = match &self.cfg.vouchers {
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
        // Start somewhere else each run: a survey cut short by time skips other vouchers.
        if !vouchers.is_empty() {
            let turn = (run.started.elapsed().as_nanos() as usize
                ^ now_millis() as usize
                ^ std::process::id() as usize)
                % vouchers.len();
            vouchers.rotate_left(turn);
        }
        let min_idle = self.cfg.min_idle;
        let consumer = run.consumer.as_str();
        // Position in this run's rotated order: the tie-break between equal backlogs, so
        // that it too changes from run to run.
        let position: BTreeMap<VoucherId, usize> =
            vouchers.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        let probes: Vec<(VoucherId, Result<Probe, StoreError>)> = futures::stream::iter(vouchers)
            .filter(|v| std::future::ready(!run.failed(*v)))
            .map(|v| async move { (v, self.streams.probe(v, consumer, min_idle, false).await) })
            .buffer_unordered(PROBES_IN_FLIGHT)
            .take_until(tokio::time::sleep_until(run.stop_at.into()))
            .collect()
            .await;

        let now = now_millis();
        let mut claimable = Vec::new();
        let mut with_work: Vec<(u64, VoucherId)> = Vec::new();
        let mut open = Vec::new();
        for (voucher, probe) in probes {
            let probe = match probe {
                Ok(p) => p,
                Err(e) => {
                    self.fail(
                        run,
                        voucher,
                        DrainError::store("probing the stream", Some(voucher), e),
                    );
                    continue;
                }
            };
            if probe.claimable {
                claimable.push(voucher);
            }
            if probe.undelivered > 0 || !probe.fully_delivered {
                with_work.push((probe.undelivered.max(1), voucher));
            } else if probe.ends_ms.is_some_and(|end| end > now) {
                open.push(voucher);
            }
            run.with(|s| {
                s.summary.probed += 1;
                s.probes.insert(voucher, probe);
            });
        }

        // 2. Recover what crashed, timed-out or failed invocations left pending.
        futures::stream::iter(claimable)
            .for_each_concurrent(self.cfg.concurrency, |v| self.recover(run, v))
            .await;

        with_work
            .sort_by_key(|(backlog, v)| (std::cmp::Reverse(*backlog), position.get(v).copied()));
        let mut poll: Vec<VoucherId> = with_work.into_iter().map(|(_, v)| v).collect();
        if open.len() <= POLL_OPEN_SALES {
            poll.extend(open);
        }
        Some(poll)
    }

    /// Claims and processes the entries other consumers left idle, page by page.
    async fn recover(&self, run: &Run, voucher: VoucherId) {
        let mut cursor = "0-0".to_string();
        while run.fits(1) && !run.failed(voucher) {
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
    }

    /// Reads and processes one voucher's new entries, batch after batch; true when there
    /// were any.
    ///
    /// While a full batch is being committed, the next one is read, so Redis and the
    /// database work at the same time instead of in turn; but only when both batches
    /// are expected to end before `stop_at`. A batch read ahead is always processed.
    async fn drain_batches(&self, run: &Run, voucher: VoucherId) -> bool {
        if !run.fits(1) {
            return false;
        }
        let first = self.read_new(voucher, &run.consumer).await;
        let Some(mut entries) = self.accept_read(run, voucher, first).await else {
            return false;
        };
        for turn in 1..=BATCHES_PER_TURN {
            let read_ahead =
                entries.len() >= self.cfg.batch_size && turn < BATCHES_PER_TURN && run.fits(2);
            if !read_ahead {
                self.process(run, voucher, entries, true).await;
                break;
            }
            let (_, next) = tokio::join!(
                self.process(run, voucher, entries, true),
                self.read_new(voucher, &run.consumer)
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
    /// is released for the next invocation).
    async fn accept_read(
        &self,
        run: &Run,
        voucher: VoucherId,
        read: Result<Vec<StreamEntry>, StoreError>,
    ) -> Option<Vec<StreamEntry>> {
        let entries = match read {
            Ok(entries) => entries,
            Err(e) => {
                let err = DrainError::store("reading new entries", Some(voucher), e);
                self.fail(run, voucher, err);
                return None;
            }
        };
        if entries.is_empty() {
            return None;
        }
        run.touch(voucher);
        run.count(|s| s.read += entries.len() as u64);
        if run.failed(voucher) {
            self.release(run, voucher, &entries).await;
            return None;
        }
        failpoint::hit("after_read");
        Some(entries)
    }

    /// One batch of one voucher: dead-letter what can never be written, commit the rest,
    /// ack. `first_delivery`: the entries come from XREADGROUP `>`, so no earlier run
    /// should have committed them (a run that committed and then died leaves them
    /// pending, and they come back through XAUTOCLAIM); when one did after all (a group
    /// made again, a failover that lost the group's last-delivered id), the exact insert
    /// counts catch it and the batch is planned again with a lookup.
    async fn process(
        &self,
        run: &Run,
        voucher: VoucherId,
        entries: Vec<StreamEntry>,
        first_delivery: bool,
    ) {
        let _timer = BatchTimer(run, Instant::now());
        let sorted = plan::sort_entries(voucher, &entries);
        let dead: Vec<(usize, Reason, Option<AdmittedOrder>)> = sorted
            .dead
            .into_iter()
            .map(|d| (d.index, d.reason, d.order))
            .collect();
        if !self.dead_letter_all(run, voucher, &entries, dead).await {
            self.release(run, voucher, &entries).await;
            return;
        }
        if sorted.orders.is_empty() {
            return;
        }
        let (indexes, orders): (Vec<usize>, Vec<AdmittedOrder>) = sorted.orders.into_iter().unzip();

        let (isolated, failure) = self
            .commit_isolating(run, voucher, &orders, first_delivery)
            .await;
        let split = &isolated.committed;
        let ids: Vec<&str> = split
            .confirmed
            .iter()
            .chain(&split.rejected)
            .chain(&split.duplicates)
            .map(|&i| entries[indexes[i]].id.as_str())
            .collect();
        if let Err(e) = self.streams.ack(voucher, &ids).await {
            // Committed but not acked: the entries are redelivered later and found as
            // duplicates. Nothing is lost or doubled.
            self.fail(
                run,
                voucher,
                DrainError::store("acking a committed batch", Some(voucher), e),
            );
            self.release(run, voucher, &entries).await;
            return;
        }
        if !ids.is_empty() {
            failpoint::hit("after_ack");
        }
        run.count(|s| {
            s.batches += 1;
            s.inserted += split.confirmed.len() as u64;
            s.rejected += split.rejected.len() as u64;
            s.duplicates += split.duplicates.len() as u64;
        });
        if !split.rejected.is_empty() {
            tracing::warn!(
                %voucher,
                rejected = split.rejected.len(),
                "database stock could not cover admitted orders (Redis and database disagree); recorded as rejected"
            );
        }
        if !isolated.unknown.is_empty() {
            tracing::error!(%voucher, orders = isolated.unknown.len(), "voucher not in the database: dead-lettering its orders");
        }
        let dead: Vec<(usize, Reason, Option<AdmittedOrder>)> = split
            .dead
            .iter()
            .map(|(i, reason)| (*i, reason.clone()))
            .chain(
                isolated
                    .unknown
                    .iter()
                    .map(|&i| (i, Reason::UnknownVoucher)),
            )
            .chain(isolated.refused.iter().map(|(i, text)| {
                let text: String = text.chars().take(MAX_REFUSAL_CHARS).collect();
                (*i, Reason::Refused(text))
            }))
            .map(|(i, reason)| (indexes[i], reason, Some(orders[i].clone())))
            .collect();
        let dead_ok = self.dead_letter_all(run, voucher, &entries, dead).await;
        let failed = failure.is_some();
        if let Some(err) = failure {
            self.fail(run, voucher, err);
        }
        if failed || !dead_ok || isolated.unfinished {
            // Whatever is still pending of this batch goes back for the next run; the
            // entries acked above are no longer pending and XCLAIM skips them.
            self.release(run, voucher, &entries).await;
        }
    }

    /// Commits a batch's orders; when the database refuses its rows (an insert failing
    /// with a permanent error, or row counts that keep differing from the plan), splits
    /// it in halves, in stream order, until each refused order stands alone. Returns what
    /// was decided and, when something else stopped it, that failure: any failure that
    /// is not a refusal (the database unreachable, a lock held, a commit lost, a refusal
    /// of the lock or the stock update) is the database's state, not an order's, and
    /// leaves the untried parts pending. So does a refusal of every order on its own, and
    /// a lone refusal when the database also refuses an ordinary made-up row (then the
    /// schema, rights or a trigger are at fault). Parts are only started while a batch
    /// still fits in the run's time; the rest stay pending (`unfinished`).
    async fn commit_isolating(
        &self,
        run: &Run,
        voucher: VoucherId,
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
                Ok(BatchOutcome::Committed(split)) => out.merge(part.start, split),
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
        let blame_orders = refusals.len() < orders.len() || orders.len() == 1;
        let healthy = blame_orders
            && match self.ledger.accepts_an_ordinary_row(voucher).await {
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
        out.refused = refusals
            .into_iter()
            .map(|(i, e)| (i, e.to_string()))
            .collect();
        (out, None)
    }

    /// Writes dead letters, after committing the `rejected` rows their buyers should
    /// see. Returns false (the voucher stopped, nothing of the failed step acked) when a
    /// write failed.
    async fn dead_letter_all(
        &self,
        run: &Run,
        voucher: VoucherId,
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
                self.fail(
                    run,
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
        for (index, reason, _) in dead {
            let entry = &entries[index];
            let text = reason.text();
            failpoint::hit("before_dead_letter");
            match self.streams.dead_letter(voucher, entry, &text).await {
                Ok(true) => {
                    run.count(|s| s.dead_lettered += 1);
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
                    );
                    return false;
                }
            }
            failpoint::hit("after_dead_letter");
        }
        true
    }

    /// Commits one voucher's orders in one transaction, retrying when a concurrent
    /// writer made the row counts differ from the plan, or held the voucher's row.
    ///
    /// A batch of first deliveries is first tried without looking up existing rows: none
    /// should exist, and the exact counts of `INSERT IGNORE` prove it. If one did exist
    /// (Redis lost its record of a committed order, say), a count comes up short, the
    /// attempt is rolled back and the batch is planned again with the lookup. That saves
    /// the largest statement of the common batch without trusting the guess.
    async fn commit_batch(
        &self,
        run: &Run,
        voucher: VoucherId,
        orders: &[AdmittedOrder],
        first_delivery: bool,
    ) -> Result<BatchOutcome, DrainError> {
        let mut look_up = !first_delivery;
        let races = RACE_ATTEMPTS + u32::from(first_delivery);
        let (mut raced, mut locked) = (0, 0);
        loop {
            failpoint::hit("before_begin");
            let attempt = self.attempt(run, voucher, orders, look_up).await?;
            match attempt {
                Attempt::Planned(split) => return Ok(BatchOutcome::Committed(split)),
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
        voucher: VoucherId,
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
        let planned = self.plan_and_write(&tx, voucher, orders, look_up).await;
        let (outcome, over) = match planned {
            Ok(Attempt::Planned(split)) if split.writes() > 0 => {
                failpoint::hit("before_commit");
                match tx.commit().await {
                    Ok(()) => {
                        failpoint::hit("after_commit");
                        (Ok(Attempt::Planned(split)), true)
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
        if over && let Err(e) = self.streams.unregister_tx(voucher, &id).await {
            // A stale record costs a later run one rollback of an unknown transaction.
            tracing::warn!(%voucher, error = %e, "could not forget an ended transaction");
        }
        outcome
    }

    /// Rolls back the recorded open transactions of other runs on `voucher` that began
    /// at least [`abandoned_after`](Drainer::abandoned_after) ago: after a kill they
    /// would hold the voucher's row for the Data API's 3 idle minutes. A younger one is
    /// left alone (a live batch of an overlapping run; it ends within seconds). A live
    /// transaction rolled back here fails its commit and leaves its entries pending:
    /// nothing is lost. Each record is handled on its own; a failure is logged and the
    /// next one tried. Returns how many were rolled back.
    async fn abort_abandoned(&self, run: &Run, voucher: VoucherId) -> Result<u64, DrainError> {
        let open = self
            .streams
            .registered_txs(voucher)
            .await
            .map_err(|e| DrainError::store("listing open transactions", Some(voucher), e))?;
        let now = now_millis();
        let old_enough = self.abandoned_after().as_millis() as i64;
        let mut aborted = 0;
        for (tx, consumer, begun) in open {
            if consumer == run.consumer || now - begun < old_enough {
                continue;
            }
            match self.ledger.abort_abandoned(&tx).await {
                Ok(rolled_back) => {
                    if rolled_back {
                        aborted += 1;
                        run.count(|s| s.aborted_transactions += 1);
                        tracing::warn!(%voucher, transaction = %tx, %consumer, age_ms = now - begun, "rolled back a transaction another run left open");
                    }
                    if let Err(e) = self.streams.unregister_tx(voucher, &tx).await {
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
        let stock_left = match tx.lock_voucher(voucher).await {
            Ok(Some(left)) => left,
            Ok(None) => return Ok(Attempt::UnknownVoucher),
            Err(e @ StoreError::Locked { .. }) => return Ok(Attempt::Locked(e)),
            Err(e) => return Err(db("locking the voucher", e)),
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

    /// Records a failure and stops the voucher for this invocation. (An order the
    /// database refuses on its own never gets here: it is isolated and dead-lettered.)
    fn fail(&self, run: &Run, voucher: VoucherId, err: DrainError) {
        run.record(&err);
        run.with(|s| s.failed.insert(voucher));
    }

    /// Gives the batch's still-pending entries back for the next invocation to claim at
    /// once (see [`OrderStreams::release`]); if that fails too, they are claimed after
    /// the claim threshold.
    async fn release(&self, run: &Run, voucher: VoucherId, entries: &[StreamEntry]) {
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

    /// Trims and measures what this run touched (the last probe also deletes this run's
    /// consumer where it holds nothing), retires sales that are over and drained, logs
    /// and returns the summary. Stops shortly before the invocation's deadline: what it
    /// skips, a later run does.
    async fn finish(&self, run: Run) -> Summary {
        let touched: Vec<VoucherId> = run.with(|s| s.touched.iter().copied().collect());
        let end = tokio::time::sleep_until(run.finish_by.into());
        let consumer = run.consumer.as_str();
        let min_idle = self.cfg.min_idle;
        let run_ref = &run;
        let fresh: Vec<(VoucherId, Result<Probe, StoreError>)> = futures::stream::iter(touched)
            .map(|v| async move {
                self.trim(run_ref, v).await;
                (v, self.streams.probe(v, consumer, min_idle, true).await)
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

        let now = now_millis();
        let over: Vec<VoucherId> = run.with(|s| {
            s.probes
                .iter()
                .filter(|(_, p)| {
                    p.pending == 0
                        && p.fully_delivered
                        && p.ends_ms.is_some_and(|end| end + RETIRE_GRACE_MS < now)
                })
                .map(|(v, _)| *v)
                .collect()
        });
        let end = tokio::time::sleep_until(run.finish_by.into());
        futures::stream::iter(over)
            .map(|v| async move {
                if let Some(retention) = self.cfg.retention {
                    match self.streams.expire_finished(v, retention).await {
                        Ok(true) => {}
                        // Not drained after all (checked again in the script): stays.
                        Ok(false) => return,
                        Err(e) => {
                            run_ref.record(&DrainError::store("expiring a finished sale", Some(v), e));
                            return;
                        }
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

        let mut summary = run.with(|s| {
            let mut summary = std::mem::take(&mut s.summary);
            summary.vouchers = s.probes.len();
            for p in s.probes.values() {
                summary.lag += p.undelivered;
                summary.pending += p.pending;
                summary.oldest_pending_ms =
                    summary.oldest_pending_ms.max(p.oldest_idle_ms.unwrap_or(0));
            }
            summary
        });
        summary.elapsed_ms = run.started.elapsed().as_millis() as u64;
        let s = &summary;
        tracing::info!(
            consumer = %s.consumer,
            vouchers = s.vouchers,
            probed = s.probed,
            claimed = s.claimed,
            read = s.read,
            inserted = s.inserted,
            duplicates = s.duplicates,
            rejected = s.rejected,
            dead_lettered = s.dead_lettered,
            released = s.released,
            aborted_transactions = s.aborted_transactions,
            trimmed = s.trimmed,
            retired = s.retired,
            lag = s.lag,
            pending = s.pending,
            oldest_pending_ms = s.oldest_pending_ms,
            elapsed_ms = s.elapsed_ms,
            errors = s.errors,
            "drain summary"
        );
        record_metrics(s);
        summary
    }

    async fn trim(&self, run: &Run, voucher: VoucherId) {
        failpoint::hit("before_trim");
        match self.streams.trim(voucher).await {
            Ok(t) => run.count(|s| s.trimmed += t.removed),
            Err(e) => run.record(&DrainError::store("trimming", Some(voucher), e)),
        }
        failpoint::hit("after_trim");
    }
}

/// The run's figures as EMF metrics (`seckill_shared::metrics`), flushed at once: one
/// document per run.
fn record_metrics(s: &Summary) {
    use seckill_shared::metrics::names::*;
    for (name, value) in [
        (DRAIN_CLAIMED, s.claimed),
        (DRAIN_READ, s.read),
        (DRAIN_INSERTED, s.inserted),
        (DRAIN_DUPLICATES, s.duplicates),
        (DRAIN_REJECTED, s.rejected),
        (DRAIN_DEAD_LETTERED, s.dead_lettered),
        (DRAIN_BATCHES, s.batches),
        (DRAIN_ERRORS, s.errors),
        (DRAIN_RUN_TIME, s.elapsed_ms),
        (DRAIN_LAG, s.lag + s.pending),
        (DRAIN_OLDEST_PENDING_AGE, s.oldest_pending_ms),
    ] {
        metrics::gauge!(name).set(value as f64);
    }
    seckill_shared::metrics::flush();
}

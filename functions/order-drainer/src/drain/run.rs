//! The state of one invocation and what it reports: the [`Summary`] (the Lambda response,
//! one log event and one EMF document per run), the run's clock, and the vouchers it
//! stopped.
//!
//! Invariants kept here:
//! - failures are counted, never thrown: every one adds to `errors` (the count is exact,
//!   the texts are capped), and a voucher that failed is stopped for the rest of the run
//!   ([`Run::fail`]), its unfinished entries left pending; so is a voucher whose
//!   entries the run gave back ([`Run::stop`]): nothing it reads later commits first;
//! - a batch starts only when the run's estimate of a batch still fits before `stop_at`
//!   ([`Run::fits`]); the estimate rises at once with a slow batch, failed or not
//!   ([`BatchTimer`]), and falls slowly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seckill_shared::adapters::order_stream::Probe;
use seckill_shared::domain::{Bucket, UnixMillis, VoucherId, now_millis};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::DrainError;

/// The run's guess of one batch's duration before it has timed one.
const FIRST_BATCH_ESTIMATE: Duration = Duration::from_millis(100);
/// Error texts kept in the summary (the count is always exact).
const MAX_ERROR_TEXTS: usize = 20;

/// What one invocation did; returned as the Lambda response and logged as one event.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Summary {
    /// The consumer name this invocation read under.
    pub consumer: String,
    /// The refunds issued beside the drain (with Stripe configured; absent when the
    /// run issued none because its key could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refunds: Option<seckill_shared::refunds::RefundRun>,
    /// The order events published beside the drain (with `EVENT_BUS_NAME`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<crate::events::EventsRun>,
    /// Vouchers surveyed (distinct).
    pub vouchers: usize,
    /// Probes run (one script call each).
    pub probed: u64,
    /// Entries taken over from idle consumers (XAUTOCLAIM).
    pub claimed: u64,
    /// Entries read (XREADGROUP; and the consumer's own pending entries, read again
    /// after a reply was lost).
    pub read: u64,
    /// Orders inserted as `confirmed`.
    pub inserted: u64,
    /// Orders already in the database (redeliveries): acked, nothing written.
    pub duplicates: u64,
    /// Orders inserted as `rejected` because the database stock could not cover them.
    pub rejected: u64,
    /// Entries moved to a dead-letter stream.
    pub dead_lettered: u64,
    /// Orders this run expired (payment deadline passed; unit back on sale).
    pub expired: u64,
    /// Closes (paid, cancelled, expired) this run recorded in the database.
    pub settled: u64,
    /// Batches committed (one Data API transaction each; a group of small sales is one).
    pub batches: u64,
    /// Orders of `inserted` committed in groups of several small sales' orders.
    pub grouped: u64,
    /// Orders of `inserted` committed while the survey was still probing (the reads its
    /// probes made, written as they came back).
    pub during_survey: u64,
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

/// The state of one invocation, shared by the vouchers it drains at once.
pub(super) struct Run {
    pub(super) consumer: String,
    pub(super) started: Instant,
    /// When the run started, on the wall clock the transaction records use.
    pub(super) started_ms: UnixMillis,
    /// No batch starts unless it is expected to end before this.
    pub(super) stop_at: Instant,
    /// The finish step stops here: the invocation's deadline less a reserve to log and
    /// return the summary (half the safety margin, at most a second).
    pub(super) finish_by: Instant,
    /// Recent batch duration (ms), rising at once, falling slowly.
    batch_ms: AtomicU64,
    state: Mutex<RunState>,
}

#[derive(Default)]
pub(super) struct RunState {
    pub(super) summary: Summary,
    /// Vouchers stopped for this invocation: after a failure, or once the run gave
    /// entries of theirs back ([`Run::stop`]).
    pub(super) stopped: BTreeSet<Bucket>,
    /// The latest probe of each voucher.
    pub(super) probes: BTreeMap<Bucket, Probe>,
    /// Vouchers this run read, claimed or acked entries of.
    pub(super) touched: BTreeSet<Bucket>,
    /// One turn per voucher for its database transactions: the buckets of a voucher
    /// are drained concurrently, but each transaction locks the voucher's
    /// row (`NOWAIT`), so they take turns in process, from the lock to the commit,
    /// instead of failing on the lock.
    pub(super) turns: BTreeMap<VoucherId, Arc<tokio::sync::Mutex<()>>>,
    /// The signal a voucher's read-ahead waits for (see [`Run::read_ahead_gate`]).
    pub(super) read_gates: BTreeMap<Bucket, Arc<tokio::sync::Notify>>,
    /// Vouchers whose read found entries pending for this run's consumer that no batch
    /// of the run holds (a read whose reply was lost: a probe's or a read's, sent again
    /// by the client, or an earlier invocation's of this instance). Their reads take
    /// those first, and new entries only once none is left (`Drainer::read_next`).
    pub(super) own_first: BTreeSet<Bucket>,
}

impl Run {
    /// The state of a run that starts no batch after `deadline - safety margin` or
    /// `max_run` from now, whichever comes first, and finishes by the deadline less a
    /// reserve to log and return the summary (half the safety margin, at most a second).
    pub(super) fn new(consumer: &str, deadline: Instant, cfg: &Config) -> Run {
        let started = Instant::now();
        let stop_at = deadline
            .checked_sub(cfg.safety_margin)
            .unwrap_or(started)
            .min(started + cfg.max_run);
        Run {
            consumer: consumer.to_string(),
            started,
            started_ms: now_millis(),
            stop_at,
            finish_by: deadline
                .checked_sub((cfg.safety_margin / 2).min(Duration::from_secs(1)))
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
        }
    }

    pub(super) fn with<R>(&self, f: impl FnOnce(&mut RunState) -> R) -> R {
        // Each update is a few field writes: a poisoned state is still consistent.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// Whether `voucher`'s sale was still open at `now_ms` by its latest probe (false
    /// when it was never probed or Redis had no sale hash).
    pub(super) fn sale_open(&self, voucher: Bucket, now_ms: i64) -> bool {
        self.with(|s| {
            s.probes
                .get(&voucher)
                .and_then(|p| p.ends_ms)
                .is_some_and(|end| end > now_ms)
        })
    }

    pub(super) fn has_time(&self) -> bool {
        Instant::now() < self.stop_at
    }

    pub(super) fn remaining(&self) -> Duration {
        self.stop_at.saturating_duration_since(Instant::now())
    }

    /// Whether `batches` more batches are expected to end before `stop_at`.
    pub(super) fn fits(&self, batches: u32) -> bool {
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

    /// The turn of `voucher`'s database transactions in this run (see
    /// [`RunState::turns`]).
    pub(super) fn turn(&self, voucher: VoucherId) -> Arc<tokio::sync::Mutex<()>> {
        self.with(|s| s.turns.entry(voucher).or_default().clone())
    }

    /// A new gate for the read-ahead of `voucher`'s next batch: the batch being written
    /// opens it once its transaction holds the row and its Redis calls before the
    /// insert are done ([`Run::open_read_ahead`]), or when it ends. The next batch is
    /// processed only after this one, so every attempt of this batch (a retry, the
    /// halves of a split) finds this gate, never the next batch's. Read earlier, the
    /// next batch's XREADGROUP (milliseconds of server time for a full batch, which
    /// also writes the pending list) would sit in front of those calls on the one Redis
    /// connection and server: a full batch's wait measured 8-10 ms, a quarter of the
    /// batch, before this gate.
    pub(super) fn read_ahead_gate(&self, voucher: Bucket) -> Arc<tokio::sync::Notify> {
        let gate = Arc::new(tokio::sync::Notify::new());
        self.with(|s| s.read_gates.insert(voucher, gate.clone()));
        gate
    }

    /// Opens `voucher`'s read-ahead gate, if one waits (a retried attempt opens it
    /// again: harmless).
    pub(super) fn open_read_ahead(&self, voucher: Bucket) {
        if let Some(gate) = self.with(|s| s.read_gates.get(&voucher).cloned()) {
            gate.notify_one();
        }
    }

    pub(super) fn stopped(&self, voucher: Bucket) -> bool {
        self.with(|s| s.stopped.contains(&voucher))
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut Summary)) {
        self.with(|s| f(&mut s.summary))
    }

    pub(super) fn touch(&self, voucher: Bucket) {
        self.with(|s| s.touched.insert(voucher));
    }

    pub(super) fn record(&self, err: &DrainError) {
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

    /// Records a failure and stops the voucher for this invocation. (An order the
    /// database refuses on its own never gets here: it is isolated and dead-lettered.)
    /// Ends the run: the summary with the figures of the latest probes, logged as one
    /// event and recorded as one metrics document.
    pub(super) fn into_summary(self) -> Summary {
        let run = self;
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
            grouped = s.grouped,
            during_survey = s.during_survey,
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

    pub(super) fn fail(&self, voucher: Bucket, err: DrainError) {
        self.record(&err);
        self.stop(voucher);
    }

    /// Stops `voucher` for the rest of the run, without recording an error.
    pub(super) fn stop(&self, voucher: Bucket) {
        self.with(|s| s.stopped.insert(voucher));
    }
}

/// Feeds a batch's duration into the run's estimate however the batch ends (a slow
/// failure must raise the estimate as much as a slow success).
pub(super) struct BatchTimer<'a>(pub(super) &'a Run, pub(super) Instant);

impl Drop for BatchTimer<'_> {
    fn drop(&mut self) {
        self.0.observe_batch(self.1.elapsed());
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
        (DRAIN_EXPIRED, s.expired),
        (DRAIN_SETTLED, s.settled),
        (DRAIN_ERRORS, s.errors),
        (DRAIN_RUN_TIME, s.elapsed_ms),
        (DRAIN_LAG, s.lag + s.pending),
        (DRAIN_OLDEST_PENDING_AGE, s.oldest_pending_ms),
    ] {
        metrics::gauge!(name).set(value as f64);
    }
    seckill_shared::metrics::flush();
}

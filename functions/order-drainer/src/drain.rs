//! The drain cycle: one invocation, top to bottom.
//!
//! [`Drainer::run`]:
//! 1. **Survey** every voucher (the active set, or `DRAINER_VOUCHERS`) with one script
//!    call each, a slice of vouchers at a time ([`OrderStreams::probe_many`]: one
//!    pipeline where one Redis node serves every slot, else many calls at once): it
//!    makes a missing drain group,
//!    tells whether new entries wait or idle ones can be claimed, and reads the new
//!    entries it finds in the same call (a batch at most; not in durable mode, where
//!    only a read that waits for the replicas hands entries out). A voucher without work
//!    costs nothing more, and one with a few orders one call until its ack. What the
//!    probes of plain vouchers read is written while the survey goes on probing
//!    ([`early`]: small reads a group at a time, large ones batch after batch), so the
//!    database and Redis work at once; the rest waits for the first round. The survey
//!    starts at a different place each run and stops when the run's time is up, so
//!    with thousands of sales no voucher is always last.
//! 2. **Recover**: where the survey found claimable entries (left by a crashed, killed
//!    or timed-out invocation, or released by one that gave up), XAUTOCLAIM them page
//!    by page, following the cursor to its end; each page is processed like a batch.
//! 3. **Drain**: each round reads every voucher's new entries (`lua/read.lua`, many at
//!    once; entries a lost reply left with this consumer first); the small reads of
//!    many sales are written together, a group per transaction ([`group`]); the others
//!    up to `DRAINER_CONCURRENCY` vouchers at once, largest backlog first, in batches
//!    (up to [`BATCHES_PER_TURN`] per voucher per turn, the next read while the
//!    database writes the current batch). Vouchers whose read was a full batch are read
//!    again at once; those whose read emptied the stream, and quiet open sales, only
//!    while there are few ([`POLL_OPEN_SALES`], the larger reads first), every
//!    `DRAINER_IDLE_POLL_MS`; every [`MAINTENANCE_EVERY`] the whole set is surveyed again.
//! 4. **Finish**: trim the streams it acked, measure what is left, retire sales that are
//!    over and drained (their keys expire after `DRAINER_RETENTION_S`; a non-empty
//!    dead-letter stream stays), and return the [`Summary`].
//!
//! A batch ([`Drainer::process`]): parse ([`plan::sort_entries`]); dead-letter what can
//! never be written; one Data API transaction for the rest: lock the voucher row
//! (`NOWAIT`), look up colliding rows, [`plan::split`], insert `confirmed` and `rejected`
//! rows with exact counts, take the stock with a guard, commit; only then XACK.
//!
//! The cycle itself (survey, recover, drain, a batch, finish) is in this file; the steps
//! it calls live in submodules, each `impl Drainer` with what it keeps, none calling back
//! into this file:
//! - [`early`]: the survey's reads written while it still probes;
//! - [`write`]: the database side, one transaction per batch, splitting refused batches,
//!   the payment step's sweep; the statements between begin and commit are free functions
//!   of its own submodule;
//! - [`stream`]: claim what other runs left idle (step 2), read, dead-letter, release,
//!   trim, retire;
//! - [`run`]: the run's clock and state, and its [`Summary`];
//! - the SQL is in `seckill_shared::adapters::ledger::sql`, the pure decisions in
//!   [`crate::plan`].
//!
//! Invariants (each kept where the list above says):
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
use std::time::{Duration, Instant};

use futures::StreamExt;
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::ledger::Ledger;
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::adapters::redis::{RedisConn, RedisSales};
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{AdmittedOrder, Bucket, StreamEntry, VoucherId, now_millis};

mod early;
mod group;
mod run;
mod stream;
mod write;

pub use run::Summary;

use self::run::{BatchTimer, Run};
use crate::config::Config;
use crate::error::DrainError;
use crate::events::{self, Publisher};
use crate::failpoint;
use crate::plan::{self, Reason};
use crate::refunds::{self, Refunder};

/// How often a long invocation surveys every voucher again (new sales, new admissions
/// on quiet ones, entries released by others).
const MAINTENANCE_EVERY: Duration = Duration::from_secs(5);
/// Full batches of one voucher drained back to back (each read while the one before it
/// commits) before the other vouchers get their turn.
pub const BATCHES_PER_TURN: usize = 16;
/// Probes in flight at once outside a survey.
const PROBES_IN_FLIGHT: usize = 64;
/// A survey probes its vouchers a slice at a time, each slice pipelined where one Redis
/// node serves every slot ([`OrderStreams::probe_many`]), [`SLICES_IN_FLIGHT`] slices at
/// once.
const PROBES_PER_SLICE: usize = 256;
const SLICES_IN_FLIGHT: usize = 2;
/// Open sales polled every round even without work, up to this many; beyond it, quiet
/// sales wait for the next survey.
const POLL_OPEN_SALES: usize = 256;
/// One voucher bucket's entries, as one read returned them (XREADGROUP, or the survey's
/// probe).
type Read = (Bucket, Vec<StreamEntry>);

/// Longest database error text kept in a dead letter's reason.
const MAX_REFUSAL_CHARS: usize = 200;

/// The drainer: clients built once per cold start, one [`run`](Drainer::run) per
/// invocation.
pub struct Drainer {
    cfg: Config,
    streams: OrderStreams,
    ledger: Ledger,
    /// Stripe, when refunds are issued (`STRIPE_*`).
    refunder: Option<Refunder>,
    /// EventBridge, when order events are published (`EVENT_BUS_NAME`).
    publisher: Option<Publisher>,
}

impl Drainer {
    /// Connects to Redis and builds the Data API client.
    pub async fn connect(cfg: Config) -> Result<Drainer, DrainError> {
        let conn = RedisConn::connect(&cfg.redis)
            .await
            .map_err(|e| DrainError::store("connecting to redis", None, e))?;
        let api = DataApi::connect(&cfg.data_api).await;
        let streams = OrderStreams::new(conn).with_durability(cfg.redis.durable);
        let publisher = Publisher::of(&cfg).await;
        let mut drainer = Drainer::new(cfg, streams, Ledger::new(api));
        drainer.publisher = publisher;
        Ok(drainer)
    }

    /// A drainer over these clients (no event publisher: [`Drainer::connect`] builds it).
    pub fn new(cfg: Config, streams: OrderStreams, ledger: Ledger) -> Drainer {
        Drainer {
            refunder: cfg.stripe.as_ref().map(Refunder::new),
            publisher: None,
            cfg,
            streams,
            ledger,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Entries this drainer took off the pending lists since it was made (acked after
    /// their commit, or dead-lettered): see [`OrderStreams::finished`].
    pub fn finished(&self) -> u64 {
        self.streams.finished()
    }

    /// One invocation: drains until `deadline - safety margin` or `max_run`, whichever
    /// comes first, and returns what it did; refunds what is due through Stripe
    /// meanwhile (`crate::refunds`, with Stripe configured). Failures are counted in the
    /// summary, never thrown: the caller decides how to report them.
    pub async fn run(&self, consumer: &str, deadline: Instant) -> Summary {
        let refunds = refunds::beside(
            self.refunder.as_ref(),
            self.ledger.api(),
            &self.cfg,
            deadline,
        );
        let (done, drained) = tokio::sync::watch::channel(false);
        let drain = async {
            let summary = self.drain(consumer, deadline).await;
            let _ = done.send(true);
            summary
        };
        let events = events::beside(
            self.publisher.as_ref(),
            self.ledger.api(),
            self.streams.conn(),
            consumer,
            &self.cfg,
            deadline,
            drained,
        );
        let (mut summary, refunds, events) = tokio::join!(drain, refunds, events);
        summary.refunds = refunds;
        summary.events = events;
        summary
    }

    /// The drain of one invocation ([`Drainer::run`]).
    async fn drain(&self, consumer: &str, deadline: Instant) -> Summary {
        let run = Run::new(consumer, deadline, &self.cfg);

        // 1. Survey, 2. recover. The survey reads the new entries it finds (in the probe's
        // own call): the first round drains them without reading again.
        let Some((mut poll, mut read)) = self.survey(&run).await else {
            return self.finish(run).await;
        };
        let mut last_survey = Instant::now();

        // 3. Drain new entries until the time is up.
        while run.has_time() {
            if last_survey.elapsed() >= MAINTENANCE_EVERY {
                if let Some((fresh, fresh_read)) = self.survey(&run).await {
                    // Vouchers that were busy stay first; newly found ones follow.
                    let known: BTreeSet<Bucket> = poll.iter().copied().collect();
                    poll.extend(fresh.into_iter().filter(|v| !known.contains(v)));
                    read.extend(fresh_read);
                }
                last_survey = Instant::now();
            }
            let round: Vec<Bucket> = poll.iter().copied().filter(|v| !run.stopped(*v)).collect();
            if round.is_empty() && !poll.is_empty() && read.is_empty() {
                // Every voucher with work was stopped: nothing left this run can do.
                break;
            }
            // Vouchers whose read was a full batch (more wait) go first next round; the
            // others, whose read emptied their stream, and the quiet ones stay polled
            // only while their sale is open and they are few, the larger reads first.
            let had = self
                .drain_round(&run, round, std::mem::take(&mut read))
                .await;
            let full = |v: &Bucket| had.get(v).is_some_and(|n| *n >= self.cfg.batch_size);
            let now = now_millis();
            let mut polled = 0;
            poll.sort_by_key(|v| {
                (
                    !full(v),
                    std::cmp::Reverse(had.get(v).copied().unwrap_or(0)),
                )
            });
            poll.retain(|v| {
                if full(v) {
                    return true;
                }
                let open = run.sale_open(*v, now);
                polled += usize::from(open);
                open && polled <= POLL_OPEN_SALES
            });
            if had.is_empty() {
                // Nothing new: wait for admissions rather than return, so one scheduled
                // invocation drains for most of its period.
                if run.remaining() <= self.cfg.idle_poll {
                    break;
                }
                tokio::time::sleep(self.cfg.idle_poll).await;
            }
        }

        // Entries a last survey read after the time ran out: pending, claimable at once.
        for (v, entries) in read {
            self.release(&run, v, &entries).await;
        }

        // 4. Finish.
        self.finish(run).await
    }

    /// Probes every voucher (time-boxed), reading the new entries each one has while the
    /// run still has time for a batch, recovers claimable entries, and returns the
    /// vouchers to poll, largest backlog first, with what it read (pending now, for the
    /// next round to drain). `None` when the vouchers cannot be listed.
    async fn survey(&self, run: &Run) -> Option<(Vec<Bucket>, Vec<Read>)> {
        let mut vouchers = match self.streams.active_vouchers().await {
            Ok((ids, bad)) => {
                if !bad.is_empty() {
                    tracing::warn!(?bad, "the active set holds members that are not buckets");
                }
                ids
            }
            Err(e) => {
                run.record(&DrainError::store("reading the active set", None, e));
                return None;
            }
        };
        if let Some(fixed) = &self.cfg.vouchers {
            // Only these vouchers: each one's bucket 0 (active or not), and its other
            // buckets the active set names.
            vouchers.retain(|b| fixed.contains(&b.voucher()));
            vouchers.extend(fixed.iter().map(|v| Bucket::from(*v)));
            vouchers.sort();
            vouchers.dedup();
        }
        // Start somewhere else each run: a survey cut short by time skips other vouchers.
        if !vouchers.is_empty() {
            let turn = (run.started.elapsed().as_nanos() as usize
                ^ now_millis() as usize
                ^ std::process::id() as usize)
                % vouchers.len();
            vouchers.rotate_left(turn);
        }
        let min_idle = self.cfg.min_idle;
        let batch = self.cfg.batch_size;
        let consumer = run.consumer.as_str();
        // Position in this run's rotated order: the tie-break between equal backlogs, so
        // that it too changes from run to run.
        let position: BTreeMap<Bucket, usize> =
            vouchers.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        // Bucketed vouchers (their transfers are finished after the probes).
        let bucketed: BTreeSet<VoucherId> = position
            .keys()
            .filter(|b| b.index() > 0)
            .map(|b| b.voucher())
            .collect();
        // A slice of vouchers at a time, pipelined where one Redis node serves every
        // slot: with thousands of small sales the probes are most of a run's requests.
        let slices: Vec<Vec<Bucket>> = vouchers
            .chunks(PROBES_PER_SLICE)
            .map(<[Bucket]>::to_vec)
            .collect();
        let probes = futures::stream::iter(slices)
            .map(|slice| async move {
                let slice: Vec<Bucket> = slice.into_iter().filter(|v| !run.stopped(*v)).collect();
                let read = if run.fits(1) { batch } else { 0 };
                let probed = self
                    .streams
                    .probe_many(&slice, consumer, min_idle, read)
                    .await;
                futures::stream::iter(slice.into_iter().zip(probed))
            })
            .buffer_unordered(SLICES_IN_FLIGHT)
            .flatten()
            .take_until(tokio::time::sleep_until(run.stop_at.into()));
        let mut probes = std::pin::pin!(probes);

        let now = now_millis();
        let mut claimable = Vec::new();
        let mut closing = Vec::new();
        let mut with_work: Vec<(u64, Bucket)> = Vec::new();
        let mut open = Vec::new();
        let mut read = Vec::new();
        // The plain vouchers' reads are written while the probes go on (early.rs).
        let mut early = self.early_writes(run);
        let inserted_before = run.with(|s| s.summary.inserted);
        loop {
            let (voucher, probe) = tokio::select! {
                _ = early.progress() => continue,
                next = probes.next() => match next {
                    Some(next) => next,
                    None => break,
                },
            };
            let mut probe = match probe {
                Ok(p) => p,
                Err(e) => {
                    run.fail(
                        voucher,
                        DrainError::store("probing the stream", Some(voucher), e),
                    );
                    continue;
                }
            };
            let entries = std::mem::take(&mut probe.entries);
            let plain = !probe.claimable
                && !probe.closing
                && voucher.index() == 0
                && !bucketed.contains(&voucher.voucher());
            if probe.claimable {
                claimable.push(voucher);
            }
            if probe.closing {
                closing.push(voucher);
            }
            // Entries a lost reply left with this consumer: the round reads them first.
            if probe.undelivered > 0 || !probe.fully_delivered || probe.own_pending {
                with_work.push((probe.undelivered.max(1), voucher));
            } else if probe.ends_ms.is_some_and(|end| end > now) {
                open.push(voucher);
            }
            run.with(|s| {
                s.summary.probed += 1;
                s.probes.insert(voucher, probe);
            });
            if entries.is_empty() {
                continue;
            }
            if plain {
                early.push(voucher, entries);
            } else {
                read.push((voucher, entries));
            }
        }
        let (written, gathered) = early.finish().await;
        read.extend(gathered);
        run.count(|s| s.during_survey += s.inserted - inserted_before);
        // A voucher written already is polled again at once only when its read was a
        // full batch (more wait); the others as quiet open sales.
        with_work.retain(|(_, v)| written.get(v).is_none_or(|n| *n >= batch));
        for (v, _) in written.iter().filter(|(_, n)| **n < batch) {
            if run.sale_open(*v, now) {
                open.push(*v);
            }
        }

        // 2. Recover what crashed, timed-out or failed invocations left pending.
        futures::stream::iter(claimable)
            .for_each_concurrent(self.cfg.concurrency, |v| self.recover(run, v))
            .await;

        // Vouchers with a payment step: expire unpaid orders past their deadline, record
        // closes in the database (after recovery: a recovered batch settles too).
        futures::stream::iter(closing)
            .for_each_concurrent(self.cfg.concurrency, |v| self.sweep(run, v))
            .await;

        // Bucketed vouchers: units a donor bucket gave whose caller died before the
        // recipient had them are delivered now (at most once).
        let donors = position
            .keys()
            .filter(|b| bucketed.contains(&b.voucher()))
            .copied();
        let sales =
            RedisSales::new(self.streams.conn().clone()).with_durability(self.cfg.redis.durable);
        let sales = &sales;
        futures::stream::iter(donors)
            .for_each_concurrent(self.cfg.concurrency, |b| async move {
                match transfers::finish_open(sales, b).await {
                    Ok(0) => {}
                    Ok(units) => {
                        tracing::warn!(bucket = %b, units, "finished transfers a dead caller left")
                    }
                    Err(e) => run.record(&DrainError::store("finishing transfers", Some(b), e)),
                }
            })
            .await;

        with_work
            .sort_by_key(|(backlog, v)| (std::cmp::Reverse(*backlog), position.get(v).copied()));
        let mut poll: Vec<Bucket> = with_work.into_iter().map(|(_, v)| v).collect();
        if open.len() <= POLL_OPEN_SALES {
            poll.extend(open);
        }
        Some((poll, read))
    }

    /// Processes one voucher's entries just read, then its next ones, batch after batch.
    ///
    /// While the database writes a full batch, the next one is read, so Redis and the
    /// database work at the same time instead of in turn; but only when both batches
    /// are expected to end before `stop_at`. The read waits until the batch's
    /// transaction holds the row and its own Redis calls before the insert are done
    /// ([`Run::read_ahead_gate`]). A batch read ahead is processed only once the batch
    /// before it is over (committed, retried or failed), so batches of one voucher are
    /// written in the order they were read; and only while a batch still fits in the
    /// run's time, else it is released (pending, claimable at once, the voucher stopped).
    async fn drain_batches(&self, run: &Run, voucher: Bucket, mut entries: Vec<StreamEntry>) {
        for turn in 1..=BATCHES_PER_TURN {
            // A batch read ahead was read while the one before it was expected to end in
            // time; a slow one (lock retries, a split) may have used that time up.
            if turn > 1 && !run.fits(1) {
                self.release(run, voucher, &entries).await;
                break;
            }
            let read_ahead =
                entries.len() >= self.cfg.batch_size && turn < BATCHES_PER_TURN && run.fits(2);
            // Entries read again (this consumer's own, after a lost reply) may have been
            // written before: their batch looks its rows up.
            let first = entries.iter().all(|e| e.deliveries <= 1);
            if !read_ahead {
                self.process(run, voucher, entries, first).await;
                break;
            }
            let after = entries.last().map(|e| e.id.clone());
            let gate = run.read_ahead_gate(voucher);
            let (_, next) = tokio::join!(
                async {
                    self.process(run, voucher, entries, first).await;
                    // Opened at the latest when the batch is over, whatever happened.
                    gate.notify_one();
                },
                async {
                    gate.notified().await;
                    self.read_next(run, voucher, after.as_deref()).await
                }
            );
            match self.accept_read(run, voucher, next).await {
                Some(next) => entries = next,
                None => break,
            }
        }
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
        voucher: Bucket,
        entries: Vec<StreamEntry>,
        first_delivery: bool,
    ) {
        let _timer = BatchTimer(run, Instant::now());
        let sorted = plan::sort_entries(voucher.voucher(), &entries);
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
            .chain(&split.closed)
            .map(|&i| entries[indexes[i]].id.as_str())
            .collect();
        if let Err(e) = self.streams.ack(voucher, &ids).await {
            // Committed but not acked: the entries are redelivered later and found as
            // duplicates. Nothing is lost or doubled.
            run.fail(
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
            run.fail(voucher, err);
        }
        if failed || !dead_ok || isolated.unfinished {
            // Whatever is still pending of this batch goes back for the next run; the
            // entries acked above are no longer pending and XCLAIM skips them.
            self.release(run, voucher, &entries).await;
        }
    }

    /// Trims and measures what this run touched, retires sales that are over and
    /// drained, logs and returns the summary. Stops shortly before the invocation's
    /// deadline: what it skips, a later run does.
    async fn finish(&self, run: Run) -> Summary {
        self.trim_and_measure(&run).await;
        self.retire_finished(&run).await;
        run.into_summary()
    }
}

//! Each run's order events (`seckill_shared::adapters::events`): beside the drain, the
//! events the database owes (its outbox, filled by triggers in each transition's own
//! transaction) are published to EventBridge and deleted once taken, until the drain
//! ends, then once more for what its last batches committed.
//!
//! One publisher at a time (a Redis lock for the run's length): two runs at once would
//! publish the same rows twice and could interleave an order's events. What cannot be
//! published now (EventBridge down or throttling, an entry refused) stays in the outbox
//! for the next pass or the next run: a failure here never counts against an order, nor
//! as a drain error.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use aws_sdk_eventbridge::Client;
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::events::{OutboxRow, calls};
use seckill_shared::adapters::redis::{RedisConn, lock};
use seckill_shared::domain::now_millis;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::{Config, EventsConfig};
use crate::failpoint;

/// The publisher's lock, held for a run's length (no hash tag: one key, any slot).
pub const LOCK_KEY: &str = "seckill:events:publisher";

/// How long the publisher's lock outlives the run that took it.
const LOCK_PAST_RUN: Duration = Duration::from_secs(2);

/// Pause between passes while the outbox is empty, and after a failed call.
const IDLE: Duration = Duration::from_millis(250);

/// What one run published.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EventsRun {
    /// Events EventBridge took (their rows deleted).
    pub published: u64,
    /// Entries EventBridge refused one by one (kept for the next try).
    pub refused: u64,
    /// `PutEvents` calls that failed whole (unreachable, throttled).
    pub failed_calls: u64,
    /// Whether another run held the publisher's lock (this one published nothing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub locked_out: bool,
    /// Events still owed when the run ended (the outbox's depth), and how long the
    /// oldest has waited (ms; 0: none).
    #[serde(default)]
    pub owed: u64,
    #[serde(default)]
    pub oldest_owed_ms: i64,
}

/// The events of a run whose drain ends by `deadline`: published beside it, and once
/// more when `drained` says it ended (what its last batches committed), until the
/// deadline less half the safety margin. `None` without a bus.
pub async fn beside(
    publisher: Option<&Publisher>,
    db: &DataApi,
    redis: &RedisConn,
    holder: &str,
    cfg: &Config,
    deadline: Instant,
    drained: watch::Receiver<bool>,
) -> Option<EventsRun> {
    let until = deadline
        .checked_sub(cfg.safety_margin / 2)
        .unwrap_or(deadline);
    Some(publisher?.run(db, redis, holder, until, drained).await)
}

/// The EventBridge client a drainer keeps (built once per cold start).
pub struct Publisher {
    client: Client,
    bus: String,
}

impl Publisher {
    /// The publisher `cfg` asks for (`None`: no bus configured).
    pub async fn of(cfg: &Config) -> Option<Publisher> {
        match &cfg.events {
            Some(events) => Some(Publisher::new(events).await),
            None => None,
        }
    }

    pub async fn new(cfg: &EventsConfig) -> Publisher {
        let shared = seckill_shared::adapters::data_api::sdk_config(cfg.endpoint.is_some()).await;
        let mut builder = aws_sdk_eventbridge::config::Builder::from(&shared);
        if let Some(endpoint) = &cfg.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        Publisher {
            client: Client::from_conf(builder.build()),
            bus: cfg.bus.clone(),
        }
    }

    /// Publishes until `done` says the drain ended (then one last pass) or `until`.
    pub async fn run(
        &self,
        db: &DataApi,
        redis: &RedisConn,
        holder: &str,
        until: Instant,
        mut done: watch::Receiver<bool>,
    ) -> EventsRun {
        let mut out = EventsRun::default();
        // Held to this run's end and a little past it: a run killed while it held the
        // lock blocks the next one no longer than that.
        let ttl = until.saturating_duration_since(Instant::now()) + LOCK_PAST_RUN;
        match lock::try_lock(redis, LOCK_KEY, holder, ttl.as_millis() as u64).await {
            Ok(true) => {}
            Ok(false) => {
                out.locked_out = true;
                return out;
            }
            Err(error) => {
                tracing::warn!(%error, "event publisher's lock not taken: no events this run");
                return out;
            }
        }
        loop {
            let last = *done.borrow() || Instant::now() >= until;
            let more = self.pass(db, &mut out).await;
            if last {
                break;
            }
            if !more {
                tokio::select! {
                    _ = tokio::time::sleep(IDLE) => {}
                    _ = done.changed() => {}
                }
            }
        }
        if let Err(error) = lock::unlock(redis, LOCK_KEY, holder).await {
            tracing::warn!(%error, "event publisher's lock not given back: it lapses");
        }
        match db.outbox_depth().await {
            Ok((owed, oldest)) => {
                out.owed = owed;
                out.oldest_owed_ms = oldest.map_or(0, |at| (now_millis() - at).max(0));
            }
            Err(error) => tracing::warn!(%error, "outbox depth not read"),
        }
        record_metrics(&out);
        out
    }

    /// One page of the outbox: published call by call, the taken rows deleted. Returns
    /// whether a full page was published (more may wait).
    async fn pass(&self, db: &DataApi, out: &mut EventsRun) -> bool {
        let rows = match db.outbox_page().await {
            Ok(rows) => rows,
            Err(error) => {
                tracing::warn!(%error, "outbox not read: events wait for the next pass");
                return false;
            }
        };
        let full = rows.len() as i64 >= seckill_shared::adapters::events::OUTBOX_PAGE;
        // Orders with an event not published in this pass: their later ones wait too.
        let mut held_back: HashSet<u64> = HashSet::new();
        let mut all_taken = true;
        for call in calls(&rows) {
            let call: Vec<&OutboxRow> = call
                .into_iter()
                .filter(|r| !held_back.contains(&r.order_id))
                .collect();
            if call.is_empty() {
                continue;
            }
            let taken = match self.put(&call).await {
                Ok(taken) => taken,
                Err(error) => {
                    tracing::warn!(%error, "PutEvents failed: events wait for the next try");
                    out.failed_calls += 1;
                    return false;
                }
            };
            let mut published = Vec::new();
            for (row, ok) in call.iter().zip(taken) {
                if ok {
                    published.push(row.id);
                } else {
                    out.refused += 1;
                    all_taken = false;
                    held_back.insert(row.order_id);
                }
            }
            // Published and not yet deleted: a crash here publishes them again (at least
            // once; the consumer drops the repeat by event_id).
            failpoint::hit("events_after_put");
            if let Err(error) = db.delete_published(&published).await {
                tracing::warn!(%error, "published events not deleted: they go out again");
                return false;
            }
            out.published += published.len() as u64;
        }
        full && all_taken
    }

    /// One `PutEvents` call: whether each entry was taken, in order.
    async fn put(&self, rows: &[&OutboxRow]) -> Result<Vec<bool>, String> {
        let entries = rows.iter().map(|r| r.entry(&self.bus)).collect();
        let reply = self
            .client
            .put_events()
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| format!("{}", aws_sdk_eventbridge::error::DisplayErrorContext(e)))?;
        let results = reply.entries();
        if results.len() != rows.len() {
            return Err(format!(
                "PutEvents answered {} results for {} entries",
                results.len(),
                rows.len()
            ));
        }
        Ok(results
            .iter()
            .map(|e| e.error_code().is_none() && e.event_id().is_some())
            .collect())
    }
}

/// The run's event figures as EMF metrics (the template's alarm on the oldest owed
/// event reads them).
fn record_metrics(out: &EventsRun) {
    use seckill_shared::metrics::names::*;
    for (name, value) in [
        (EVENTS_PUBLISHED, out.published as f64),
        (EVENTS_OWED, out.owed as f64),
        (EVENTS_OLDEST_OWED_AGE, out.oldest_owed_ms as f64),
    ] {
        metrics::gauge!(name).set(value);
    }
    seckill_shared::metrics::flush();
}

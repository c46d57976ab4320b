//! Operational metrics as CloudWatch Embedded Metric Format (EMF) log lines.
//!
//! The functions record with the `metrics` crate's macros (a counter increment is an
//! atomic add, no I/O, no AWS API call on the hot path); `metrics_cloudwatch_embedded`
//! turns what was recorded since the last flush into one EMF JSON document per label
//! set, written to stdout, where Lambda sends it to CloudWatch Logs and CloudWatch
//! extracts the metrics. Counters are deltas since the last flush; gauges are the last
//! value; histograms the values recorded since the last flush.
//!
//! Nothing is recorded unless [`install`] ran: inside Lambda (or its local emulator,
//! `cargo lambda watch`) [`install_from_env`] does; in-process tests leave it off, so
//! the macros are no-ops there, except the test that checks these lines.
//!
//! When to flush ([`request_done`]): seckill-http handles one request at a time per
//! instance, and a line per request would cost a CloudWatch log line per buyer. It
//! flushes once [`FLUSH_EVERY_REQUESTS`] requests or [`FLUSH_EVERY`] have passed, at the
//! end of a request (a frozen instance runs no timer). What an instance recorded after
//! its last flush is lost if it is reclaimed; the figures are for trends and alarms,
//! the exact counts live in the database and in `seckill status`. The drainer flushes
//! after every run ([`flush`]).
//!
//! Dimensions stay bounded: admissions carry only their outcome (a fixed set of codes);
//! the voucher id is never a dimension (unbounded: one metric per voucher would cost
//! per sale and per month); per-voucher figures are in the request log and `seckill
//! status`.

use std::io::Write;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Histogram, Unit};
use metrics_cloudwatch_embedded::{Builder, Collector};

use crate::domain::now_millis;

/// The CloudWatch namespace of every seckill metric (the template's dashboard and alarms
/// read it).
pub const NAMESPACE: &str = "seckill";

/// seckill-http flushes after this many requests ...
pub const FLUSH_EVERY_REQUESTS: u32 = 64;
/// ... or once this long has passed since the last flush (checked at the end of a
/// request). The histogram of Redis latencies holds at most 100 values between flushes,
/// hence the request count.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Metric names, one place for the functions, the template and the tests.
pub mod names {
    /// seckill-http: admission answers, dimension `outcome` (admitted, sold_out,
    /// not_started, ended, already_purchased, rate_limited, unavailable, and the
    /// client-error codes).
    pub const ADMISSIONS: &str = "Admissions";
    /// seckill-http: answers with a 5xx status, any route.
    pub const HTTP_5XX: &str = "Http5xx";
    /// seckill-http: one admission's Redis round trip (script, or script and WAIT).
    pub const REDIS_LATENCY: &str = "RedisLatency";
    /// seckill-http: payments the provider confirmed after their order had closed (or
    /// that another payment had paid): recorded `refund_due`, to refund.
    pub const LATE_PAYMENTS: &str = "LatePayments";
    /// order-drainer, per run.
    pub const DRAIN_CLAIMED: &str = "DrainClaimed";
    pub const DRAIN_READ: &str = "DrainRead";
    pub const DRAIN_INSERTED: &str = "DrainInserted";
    pub const DRAIN_DUPLICATES: &str = "DrainDuplicates";
    pub const DRAIN_REJECTED: &str = "DrainRejected";
    pub const DRAIN_DEAD_LETTERED: &str = "DrainDeadLettered";
    pub const DRAIN_BATCHES: &str = "DrainBatches";
    /// Orders the run expired (payment step: unpaid at their deadline, unit returned).
    pub const DRAIN_EXPIRED: &str = "DrainExpired";
    /// Closes (paid, cancelled, expired) the run recorded in the database.
    pub const DRAIN_SETTLED: &str = "DrainSettled";
    pub const DRAIN_ERRORS: &str = "DrainErrors";
    pub const DRAIN_RUN_TIME: &str = "DrainRunTime";
    /// Entries not yet acknowledged after the run: unread plus pending.
    pub const DRAIN_LAG: &str = "DrainLag";
    /// Age of the oldest entry still pending after the run.
    pub const DRAIN_OLDEST_PENDING_AGE: &str = "DrainOldestPendingAge";
    /// order-drainer, per run: order events published to EventBridge.
    pub const EVENTS_PUBLISHED: &str = "EventsPublished";
    /// Order events still owed after the run (the outbox's depth).
    pub const EVENTS_OWED: &str = "EventsOwed";
    /// Age of the oldest order event still owed after the run (ms; 0: none).
    pub const EVENTS_OLDEST_OWED_AGE: &str = "EventsOldestOwedAge";

    /// Every name, for the template's checks.
    pub const ALL: &[&str] = &[
        ADMISSIONS,
        HTTP_5XX,
        REDIS_LATENCY,
        LATE_PAYMENTS,
        DRAIN_CLAIMED,
        DRAIN_READ,
        DRAIN_INSERTED,
        DRAIN_DUPLICATES,
        DRAIN_REJECTED,
        DRAIN_DEAD_LETTERED,
        DRAIN_BATCHES,
        DRAIN_EXPIRED,
        DRAIN_SETTLED,
        DRAIN_ERRORS,
        DRAIN_RUN_TIME,
        DRAIN_LAG,
        DRAIN_OLDEST_PENDING_AGE,
        EVENTS_PUBLISHED,
        EVENTS_OWED,
        EVENTS_OLDEST_OWED_AGE,
    ];
}

/// Where flushed lines go.
#[derive(Clone)]
pub enum Sink {
    /// The process's stdout: CloudWatch Logs in Lambda, the emulator's log locally.
    Stdout,
    /// A buffer (tests).
    Buffer(Arc<Mutex<Vec<u8>>>),
}

struct Emf {
    collector: &'static Collector,
    sink: Sink,
    since_flush: AtomicU32,
    flushed_at: AtomicI64,
    /// Registered handles, kept so a request does not build a key and look it up in the
    /// recorder's registry each time (the `counter!` macro does). One entry per outcome
    /// code: the codes are `&'static str` from a fixed set, so this stays small.
    admissions: Mutex<Vec<(&'static str, Counter)>>,
    http_5xx: OnceLock<Counter>,
    redis_latency: OnceLock<Histogram>,
}

static EMF: OnceLock<Emf> = OnceLock::new();

/// Installs the process-wide recorder writing to `sink`; false if one was installed
/// already (the first stays).
pub fn install(sink: Sink) -> bool {
    let mut installed = false;
    EMF.get_or_init(|| {
        installed = true;
        let collector = Builder::new()
            .cloudwatch_namespace(NAMESPACE)
            .init()
            .expect("the metrics recorder is installed once");
        describe();
        Emf {
            collector,
            sink,
            since_flush: AtomicU32::new(0),
            flushed_at: AtomicI64::new(now_millis()),
            admissions: Mutex::new(Vec::new()),
            http_5xx: OnceLock::new(),
            redis_latency: OnceLock::new(),
        }
    });
    installed
}

/// Installs the stdout recorder inside Lambda or its emulator (`AWS_LAMBDA_FUNCTION_NAME`
/// set), or anywhere with `SECKILL_METRICS=emf`; `SECKILL_METRICS=off` keeps it off.
pub fn install_from_env() {
    let wanted = match std::env::var("SECKILL_METRICS").as_deref() {
        Ok("off") => false,
        Ok("emf") => true,
        _ => std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some(),
    };
    if wanted {
        install(Sink::Stdout);
    }
}

fn describe() {
    use names::*;
    for &name in ALL {
        let unit = match name {
            REDIS_LATENCY | DRAIN_RUN_TIME | DRAIN_OLDEST_PENDING_AGE => Unit::Milliseconds,
            _ => Unit::Count,
        };
        match name {
            ADMISSIONS | HTTP_5XX | LATE_PAYMENTS => metrics::describe_counter!(name, unit, ""),
            REDIS_LATENCY => metrics::describe_histogram!(name, unit, ""),
            // The drainer's figures are per run: the last run's value.
            _ => metrics::describe_gauge!(name, unit, ""),
        }
    }
}

/// seckill-http: one admission answered with `outcome` ([`names::ADMISSIONS`]).
pub fn admission(outcome: &'static str) {
    let Some(emf) = EMF.get() else { return };
    let mut cached = emf.admissions.lock().unwrap_or_else(|e| e.into_inner());
    match cached.iter().find(|(o, _)| *o == outcome) {
        Some((_, counter)) => counter.increment(1),
        None => {
            let counter = metrics::counter!(names::ADMISSIONS, "outcome" => outcome);
            counter.increment(1);
            cached.push((outcome, counter));
        }
    }
}

/// seckill-http: one answer with a 5xx status ([`names::HTTP_5XX`]).
pub fn http_5xx() {
    let Some(emf) = EMF.get() else { return };
    emf.http_5xx
        .get_or_init(|| metrics::counter!(names::HTTP_5XX))
        .increment(1);
}

/// seckill-http: one payment to refund ([`names::LATE_PAYMENTS`]). Rare: no handle
/// kept.
pub fn late_payment() {
    if EMF.get().is_some() {
        metrics::counter!(names::LATE_PAYMENTS).increment(1);
    }
}

/// seckill-http: one admission's Redis round trip ([`names::REDIS_LATENCY`]).
pub fn redis_latency(took: std::time::Duration) {
    let Some(emf) = EMF.get() else { return };
    emf.redis_latency
        .get_or_init(|| metrics::histogram!(names::REDIS_LATENCY))
        .record(took.as_secs_f64() * 1000.0);
}

/// Writes what was recorded since the last flush.
pub fn flush() {
    let Some(emf) = EMF.get() else { return };
    emf.since_flush.store(0, Ordering::Relaxed);
    emf.flushed_at.store(now_millis(), Ordering::Relaxed);
    let result = match &emf.sink {
        Sink::Stdout => {
            // One write per document, whole lines: lines of concurrent writers never
            // interleave within a line.
            let mut out = Vec::with_capacity(1024);
            emf.collector
                .flush(&mut out)
                .and_then(|()| std::io::stdout().lock().write_all(&out))
        }
        Sink::Buffer(buf) => emf
            .collector
            .flush(&mut *buf.lock().unwrap_or_else(|e| e.into_inner())),
    };
    if let Err(error) = result {
        tracing::warn!(%error, "writing metrics failed");
    }
}

/// Called at the end of each request: flushes when [`FLUSH_EVERY_REQUESTS`] requests
/// or [`FLUSH_EVERY`] have passed. Costs two atomic operations otherwise.
pub fn request_done() {
    let Some(emf) = EMF.get() else { return };
    let n = emf.since_flush.fetch_add(1, Ordering::Relaxed) + 1;
    let due_at = emf.flushed_at.load(Ordering::Relaxed) + FLUSH_EVERY.as_millis() as i64;
    if n >= FLUSH_EVERY_REQUESTS || now_millis() >= due_at {
        flush();
    }
}

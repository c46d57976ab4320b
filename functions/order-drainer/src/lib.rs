//! order-drainer: the scheduled function that turns admitted orders in Redis streams into
//! committed rows in MySQL (through the RDS Data API), losing and duplicating none.
//!
//! - [`drain`]: the cycle of one invocation (recover, drain in bounded batches, trim,
//!   summarise), readable top to bottom, with its database side, stream bookkeeping and
//!   run state in submodules;
//! - [`plan`]: the pure decisions about a batch (parse, dedupe, confirm or reject);
//! - [`refunds`]: the run's refunds through Stripe, beside the drain;
//! - [`events`]: the run's order events to EventBridge, beside the drain;
//! - [`config`]: the `DRAINER_*` settings and their defaults;
//! - [`failpoint`]: named crash points for the crash-recovery tests;
//! - [`error`]: the one error type.
//!
//! [`handle`] is the Lambda handler (an EventBridge scheduled event in, the [`Summary`]
//! out); [`run_once`] is the same cycle for `order-drainer --once`.

pub mod config;
pub mod drain;
pub mod error;
pub mod events;
pub mod failpoint;
pub mod plan;
pub mod refunds;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use config::Config;
pub use drain::{Drainer, Summary};
pub use error::DrainError;

/// The Lambda handler: drains until shortly before the invocation's deadline and returns
/// the summary; an `Err` (carrying the summary's first error) when anything failed, so
/// the scheduler's error metric and alarms see it (`main.rs` turns it into the
/// invocation's `Diagnostic`).
///
/// Every invocation of one instance reads under the same consumer name
/// ([`instance_consumer`]): a group then holds one consumer per instance that ever ran,
/// not one per invocation, and the survey deletes spent ones a few at a time.
pub async fn handle(
    drainer: &Drainer,
    request_id: &str,
    deadline_epoch_ms: u64,
    event: &serde_json::Value,
) -> Result<Summary, DrainError> {
    tracing::debug!(
        detail_type = event
            .get("detail-type")
            .and_then(|v| v.as_str())
            .unwrap_or(""),
        "invoked"
    );
    tracing::debug!(request_id = %sanitize(request_id), "drain invocation");
    let consumer = instance_consumer();
    let deadline = instant_of_epoch_ms(deadline_epoch_ms).unwrap_or_else(|| {
        // No usable deadline (a local invoke may send none): bound the run by the
        // settings alone.
        Instant::now() + drainer.config().max_run + drainer.config().safety_margin
    });
    outcome(drainer.run(consumer, deadline).await)
}

/// `order-drainer --once`: one cycle without the Lambda runtime, deadline = now +
/// `DRAINER_MAX_RUN_MS` + `DRAINER_SAFETY_MARGIN_MS`. Returns the summary and whether
/// everything went well.
pub async fn run_once(drainer: &Drainer) -> (Summary, bool) {
    let cfg = drainer.config();
    let deadline = Instant::now() + cfg.max_run + cfg.safety_margin;
    let consumer = format!("drainer-once-{}", unique_suffix());
    let summary = drainer.run(&consumer, deadline).await;
    let ok = summary.errors == 0;
    (summary, ok)
}

/// `Ok(summary)`, or `Err` when the summary counts errors.
pub fn outcome(summary: Summary) -> Result<Summary, DrainError> {
    if summary.errors == 0 {
        Ok(summary)
    } else {
        Err(DrainError::Incomplete {
            count: summary.errors as usize,
            first: summary.error_messages.first().cloned().unwrap_or_default(),
        })
    }
}

/// Deadlines below this (September 2001) cannot be Unix-epoch times of a live invocation.
const EPOCH_MS_FLOOR: u64 = 1_000_000_000_000;

/// The `Instant` of the invocation deadline header (`Lambda-Runtime-Deadline-Ms`); `None`
/// when it is unset (0).
///
/// Lambda sends Unix-epoch milliseconds. `cargo lambda watch` (1.9) sends the function
/// timeout instead (`600000`), which read as an epoch time lies in 1970 and would stop
/// every local invocation at once, so a value too small to be an epoch time is taken as
/// milliseconds from now.
fn instant_of_epoch_ms(deadline_ms: u64) -> Option<Instant> {
    if deadline_ms == 0 {
        return None;
    }
    if deadline_ms < EPOCH_MS_FLOOR {
        return Some(Instant::now() + Duration::from_millis(deadline_ms));
    }
    let now_ms = u64::try_from(seckill_shared::domain::now_millis()).ok()?;
    Some(Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(now_ms)))
}

/// Consumer names go into Redis commands as single arguments; keep them printable.
fn sanitize(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    if cleaned.is_empty() {
        unique_suffix()
    } else {
        cleaned
    }
}

/// The consumer name of this process: `drainer-<pid>-<start nanoseconds, hex>`.
pub fn instance_consumer() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| format!("drainer-{}", unique_suffix()))
}

/// `<pid>-<nanoseconds, hex>`: a consumer name no other process uses.
fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{nanos:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_names_are_printable_and_never_empty() {
        assert_eq!(
            sanitize("8476a536-e9f4-11e8-9739-2dfe598c3fcd"),
            "8476a536-e9f4-11e8-9739-2dfe598c3fcd"
        );
        assert_eq!(sanitize("a b\nc"), "abc");
        assert!(!sanitize("").is_empty());
    }

    #[test]
    fn deadlines_are_epoch_times_or_relative_under_cargo_lambda() {
        assert!(instant_of_epoch_ms(0).is_none());
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let past = instant_of_epoch_ms(now_ms - 5_000).unwrap();
        assert!(past <= Instant::now());
        let epoch = instant_of_epoch_ms(now_ms + 60_000).unwrap();
        let left = epoch.saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(58) && left <= Duration::from_secs(60),
            "{left:?}"
        );
        // cargo lambda watch: the timeout itself.
        let relative = instant_of_epoch_ms(600_000).unwrap();
        let left = relative.saturating_duration_since(Instant::now());
        assert!(left > Duration::from_secs(598), "{left:?}");
    }

    #[test]
    fn a_summary_with_errors_fails_the_invocation() {
        assert!(outcome(Summary::default()).is_ok());
        let bad = Summary {
            errors: 2,
            error_messages: vec!["data api unavailable".into()],
            ..Summary::default()
        };
        let err = outcome(bad).unwrap_err();
        assert!(err.to_string().contains("2 error(s)"), "{err}");
    }
}

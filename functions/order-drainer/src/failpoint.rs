//! Failpoints: named places in the drain cycle where a crash test can freeze the process
//! and SIGKILL it, to prove that a crash at any of them loses and duplicates nothing.
//!
//! `DRAINER_FAILPOINT=<name>[:<nth>]` (read once) arms one point. The `nth` time (by
//! default the first) the drain cycle reaches it, [`hit`] prints `FAILPOINT <name>` on stderr, flushes,
//! and blocks the calling thread forever, so the test knows exactly where the process is
//! when it kills it. Unset, [`hit`] is one load of an initialised `OnceLock` and a
//! comparison: no I/O, no allocation.
//!
//! The points, in the order a batch meets them: `after_claim`, `after_read`,
//! `before_dead_letter`, `after_dead_letter`, `before_begin`, `after_begin`, `after_lock`,
//! `after_insert`, `after_stock_update`, `before_commit`, `after_commit`, `after_ack`,
//! `before_trim`, `after_trim` ([`ALL`]); and for vouchers with a payment step:
//! `after_expire` (units returned in Redis, nothing in the database yet), `after_settle`
//! (closes recorded, not committed), `after_settled` (committed, `to_settle` cleared);
//! and beside the drain, `events_after_put` (order events published, their outbox rows
//! not yet deleted).

use std::io::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every failpoint name the drain cycle knows.
pub const ALL: &[&str] = &[
    "after_claim",
    "after_read",
    "before_dead_letter",
    "after_dead_letter",
    "before_begin",
    "after_begin",
    "after_lock",
    "after_insert",
    "after_stock_update",
    "before_commit",
    "after_commit",
    "after_ack",
    "before_trim",
    "after_trim",
    "after_expire",
    "after_settle",
    "after_settled",
    "events_after_put",
];

/// The environment variable that arms a failpoint.
pub const ENV: &str = "DRAINER_FAILPOINT";

struct Armed {
    name: String,
    nth: u32,
    seen: AtomicU32,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

/// Parses `<name>[:<nth>]`; `None` for an empty or malformed value.
fn parse(spec: &str) -> Option<(String, u32)> {
    let spec = spec.trim();
    let (name, nth) = match spec.split_once(':') {
        Some((name, nth)) => (name, nth.parse().ok().filter(|n| *n >= 1)?),
        None => (spec, 1),
    };
    (!name.is_empty()).then(|| (name.to_string(), nth))
}

fn armed() -> &'static Option<Armed> {
    ARMED.get_or_init(|| {
        let spec = std::env::var(ENV).ok()?;
        let Some((name, nth)) = parse(&spec) else {
            tracing::warn!(spec, "ignoring malformed {ENV}");
            return None;
        };
        if !ALL.contains(&name.as_str()) {
            tracing::warn!(name, "{ENV} names an unknown failpoint");
        }
        Some(Armed {
            name,
            nth,
            seen: AtomicU32::new(0),
        })
    })
}

/// Marks that the drain cycle reached failpoint `name`; freezes the process if armed.
pub fn hit(name: &'static str) {
    let Some(armed) = armed() else {
        return;
    };
    if armed.name != name || armed.seen.fetch_add(1, Ordering::SeqCst) + 1 != armed.nth {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "FAILPOINT {name}");
    let _ = err.flush();
    drop(err);
    // Block this thread (not just the task): the test SIGKILLs the process now.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_an_optional_count() {
        assert_eq!(parse("after_commit"), Some(("after_commit".into(), 1)));
        assert_eq!(parse("after_insert:3"), Some(("after_insert".into(), 3)));
        assert_eq!(parse("after_insert:0"), None);
        assert_eq!(parse("after_insert:x"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn there_are_at_least_ten_distinct_points() {
        let mut names = ALL.to_vec();
        names.sort();
        names.dedup();
        assert!(names.len() >= 10);
    }
}

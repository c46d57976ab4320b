//! Faults on demand, for whole-sale tests of the local stack (`seckill-load storm`): a
//! database outage, and answers lost after the call ran. Off unless the server was
//! started with `--fault-control`; then `POST /_local/faults` sets them and
//! `GET /_local/faults` reads them back with what they did so far.
//!
//! - **Outage**: until it ends, every Data API call is answered `504
//!   DatabaseUnavailableException` without reaching MariaDB (what Aurora's Data API
//!   answers while the writer is unreachable), whatever its transaction; transactions
//!   already open stay open (and are rolled back after 3 idle minutes, as always).
//! - **Lost answers**: each call (a statement, a begin, a commit, a rollback) is, with
//!   the given probability, run and then answered `503 ServiceUnavailableError`, its
//!   effect kept (as a proxy that gave up waiting answers, or a connection cut after the
//!   request went out): the caller cannot tell whether it ran.
//!
//! Nothing here is part of the Data API; in AWS there is no such route.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The faults in force, shared by every call.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
    outage_answers: AtomicU64,
    lost_answers: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    outage_until: Option<Instant>,
    lose_per_mille: u32,
    /// xorshift state, seeded by the control call (repeatable given the same calls).
    rng: u64,
}

/// The body of `POST /_local/faults`; an absent field leaves that fault as it is.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRequest {
    /// An outage from now for this long (0 ends one).
    pub outage_ms: Option<u64>,
    /// Calls whose answer is lost, per thousand (0 stops it).
    pub lose_answers_per_mille: Option<u32>,
    /// Seeds the draw of which answers are lost.
    pub seed: Option<u64>,
}

/// What `GET /_local/faults` (and the `POST`) answers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct FaultState {
    /// What is left of the outage.
    pub outage_left_ms: u64,
    pub lose_answers_per_mille: u32,
    /// Calls answered 504 by an outage so far.
    pub outage_answers: u64,
    /// Calls that ran and lost their answer so far.
    pub lost_answers: u64,
}

impl Faults {
    /// Applies a control call; answers the state after it.
    pub fn set(&self, req: &FaultRequest) -> FaultState {
        {
            let mut s = self.state.lock().expect("faults lock");
            if let Some(ms) = req.outage_ms {
                s.outage_until = (ms > 0).then(|| Instant::now() + Duration::from_millis(ms));
            }
            if let Some(p) = req.lose_answers_per_mille {
                s.lose_per_mille = p.min(1000);
            }
            if let Some(seed) = req.seed {
                s.rng = seed | 1;
            }
        }
        self.read()
    }

    /// The faults in force and what they did so far.
    pub fn read(&self) -> FaultState {
        let s = self.state.lock().expect("faults lock");
        FaultState {
            outage_left_ms: s.outage_until.map_or(0, |u| {
                u.saturating_duration_since(Instant::now()).as_millis() as u64
            }),
            lose_answers_per_mille: s.lose_per_mille,
            outage_answers: self.outage_answers.load(Ordering::Relaxed),
            lost_answers: self.lost_answers.load(Ordering::Relaxed),
        }
    }

    /// Whether a call arriving now is refused by an outage (counted).
    pub fn in_outage(&self) -> bool {
        let out = {
            let s = self.state.lock().expect("faults lock");
            s.outage_until.is_some_and(|u| Instant::now() < u)
        };
        if out {
            self.outage_answers.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// Whether the answer of a call that just ran is to be lost (counted).
    pub fn lose_answer(&self) -> bool {
        let lose = {
            let mut s = self.state.lock().expect("faults lock");
            if s.lose_per_mille == 0 {
                return false;
            }
            if s.rng == 0 {
                s.rng = 0x9E37_79B9_7F4A_7C15;
            }
            // xorshift64
            let mut x = s.rng;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.rng = x;
            (x % 1000) < u64::from(s.lose_per_mille)
        };
        if lose {
            self.lost_answers.fetch_add(1, Ordering::Relaxed);
        }
        lose
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_refuses_until_it_ends() {
        let f = Faults::default();
        assert!(!f.in_outage());
        f.set(&FaultRequest {
            outage_ms: Some(60_000),
            ..FaultRequest::default()
        });
        assert!(f.in_outage());
        assert!(f.read().outage_left_ms > 59_000);
        f.set(&FaultRequest {
            outage_ms: Some(0),
            ..FaultRequest::default()
        });
        assert!(!f.in_outage());
        assert_eq!(f.read().outage_answers, 1);
    }

    #[test]
    fn answers_are_lost_at_about_the_rate_asked() {
        let f = Faults::default();
        f.set(&FaultRequest {
            lose_answers_per_mille: Some(100),
            seed: Some(7),
            ..FaultRequest::default()
        });
        let lost = (0..10_000).filter(|_| f.lose_answer()).count();
        assert!((800..1200).contains(&lost), "{lost} of 10,000 lost at 10 %");
        f.set(&FaultRequest {
            lose_answers_per_mille: Some(0),
            ..FaultRequest::default()
        });
        assert!(!(0..1000).any(|_| f.lose_answer()));
    }
}

//! What this instance's requests cost Redis where the cost varies per request: the
//! borrowing at the end of a bucketed sale ([`BorrowCosts`]). Counted in memory with
//! relaxed atomics (a few per borrowing attempt); read by tests and the benchmark to
//! show the bound holds and what it is in practice.

use std::sync::atomic::{AtomicU64, Ordering};

/// Borrowing attempts (an admission whose own bucket was empty) and the Redis calls
/// they made, in this instance.
#[derive(Debug, Default)]
pub struct BorrowCosts {
    attempts: AtomicU64,
    calls: AtomicU64,
    max_calls: AtomicU64,
    /// Attempts that stopped because their call budget or time ran out.
    spent: AtomicU64,
}

/// A snapshot of [`BorrowCosts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BorrowFigures {
    pub attempts: u64,
    pub calls: u64,
    pub max_calls: u64,
    pub spent: u64,
}

impl BorrowFigures {
    /// Mean Redis calls per borrowing attempt (0 without any).
    pub fn mean_calls(&self) -> f64 {
        if self.attempts == 0 {
            0.0
        } else {
            self.calls as f64 / self.attempts as f64
        }
    }

    /// These figures added to `other` (several instances' together; the max is the
    /// larger).
    pub fn plus(self, other: BorrowFigures) -> BorrowFigures {
        BorrowFigures {
            attempts: self.attempts + other.attempts,
            calls: self.calls + other.calls,
            max_calls: self.max_calls.max(other.max_calls),
            spent: self.spent + other.spent,
        }
    }
}

impl BorrowCosts {
    /// One borrowing attempt that made `calls` Redis calls; `spent` when it stopped on
    /// its budget rather than on an answer.
    pub fn record(&self, calls: u32, spent: bool) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(u64::from(calls), Ordering::Relaxed);
        self.max_calls
            .fetch_max(u64::from(calls), Ordering::Relaxed);
        if spent {
            self.spent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The figures so far.
    pub fn figures(&self) -> BorrowFigures {
        BorrowFigures {
            attempts: self.attempts.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            max_calls: self.max_calls.load(Ordering::Relaxed),
            spent: self.spent.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_add_up_and_the_largest_is_kept() {
        let c = BorrowCosts::default();
        c.record(5, false);
        c.record(12, true);
        c.record(3, false);
        let f = c.figures();
        assert_eq!((f.attempts, f.calls, f.max_calls, f.spent), (3, 20, 12, 1));
        assert!((f.mean_calls() - 20.0 / 3.0).abs() < 1e-9);
        let both = f.plus(BorrowFigures {
            attempts: 1,
            calls: 30,
            max_calls: 30,
            spent: 0,
        });
        assert_eq!((both.attempts, both.calls, both.max_calls), (4, 50, 30));
    }
}

//! Per-instance, per-user admission rate limit: a token bucket per user.
//!
//! It protects Redis from one client hammering "buy" in a loop through a warm instance:
//! answers this instance already knows (sold out, not started, ended) are free and come
//! first; only attempts that would reach Redis spend a token. API Gateway's stage
//! throttling is the global limit; this one is per caller.

use std::collections::HashMap;
use std::sync::Mutex;

use seckill_shared::domain::{UnixMillis, UserId};

/// Users remembered at most; past it, buckets that are full again are forgotten.
const MAX_TRACKED_USERS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: UnixMillis,
}

/// Token buckets of `per_sec` tokens per second, holding at most `burst`.
#[derive(Debug)]
pub struct RateLimiter {
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<UserId, Bucket>>,
}

impl RateLimiter {
    /// `per_sec == 0` disables the limit.
    pub fn new(per_sec: u32, burst: u32) -> RateLimiter {
        RateLimiter {
            per_sec: f64::from(per_sec),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for `user` at `now`; false when the user is over the limit.
    pub fn allow(&self, user: &UserId, now: UnixMillis) -> bool {
        if self.per_sec <= 0.0 {
            return true;
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_TRACKED_USERS {
            let (per_sec, burst) = (self.per_sec, self.burst);
            buckets.retain(|_, b| b.tokens + (now - b.at) as f64 / 1000.0 * per_sec < burst);
        }
        let b = buckets.entry(user.clone()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = (now - b.at).max(0) as f64 / 1000.0;
        b.tokens = (b.tokens + elapsed * self.per_sec).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_steady_rate() {
        let l = RateLimiter::new(2, 3);
        let u = UserId::parse("u").unwrap();
        assert!((0..3).all(|_| l.allow(&u, 1_000)));
        assert!(!l.allow(&u, 1_000));
        assert!(!l.allow(&u, 1_400));
        assert!(l.allow(&u, 1_500), "half a second refills one token at 2/s");
        assert!(!l.allow(&u, 1_500));
        // Another user has their own bucket.
        assert!(l.allow(&UserId::parse("v").unwrap(), 1_500));
    }

    #[test]
    fn zero_disables_the_limit() {
        let l = RateLimiter::new(0, 0);
        let u = UserId::parse("u").unwrap();
        assert!((0..1000).all(|_| l.allow(&u, 0)));
    }
}

//! Per-instance rate limits: token buckets per caller.
//!
//! Two are kept, both in this instance's memory:
//! - per user, on admissions: it protects Redis from one client hammering "buy" in a
//!   loop through a warm instance. Answers this instance already knows (sold out, not
//!   started, ended) are free and come first; only attempts that would reach Redis spend
//!   a token.
//! - per source address, on the one route that needs no token (`GET /vouchers/{id}`): a
//!   made-up voucher id costs a database read, so anonymous callers are held to a rate
//!   before anything is looked up. IPv6 sources are counted per /64 (what one customer
//!   usually holds), so rotating addresses within one's own prefix gains nothing.
//!
//! API Gateway's stage and route throttling (template.yaml) is the global limit; these
//! are per caller. Memory is bounded: past a cap, buckets that are full again (idle
//! callers) are forgotten, and if that frees nothing, the tenth of the callers seen
//! longest ago: never all, so a caller hammering its limit stays limited however many
//! new callers a flood brings.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;

use seckill_shared::domain::{UnixMillis, UserId};

/// Callers remembered at most per limiter.
pub const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: UnixMillis,
}

/// Token buckets of `per_sec` tokens per second, holding at most `burst`, one per key.
#[derive(Debug)]
pub struct RateLimiter<K = UserId> {
    per_sec: f64,
    burst: f64,
    cap: usize,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// `per_sec == 0` disables the limit.
    pub fn new(per_sec: u32, burst: u32) -> RateLimiter<K> {
        RateLimiter::with_cap(per_sec, burst, MAX_TRACKED)
    }

    /// A limiter remembering at most `cap` callers.
    pub fn with_cap(per_sec: u32, burst: u32, cap: usize) -> RateLimiter<K> {
        RateLimiter {
            per_sec: f64::from(per_sec),
            burst: f64::from(burst.max(1)),
            cap: cap.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for `key` at `now`; false when the caller is over the limit.
    pub fn allow(&self, key: &K, now: UnixMillis) -> bool {
        if self.per_sec <= 0.0 {
            return true;
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= self.cap && !buckets.contains_key(key) {
            let (per_sec, burst) = (self.per_sec, self.burst);
            buckets.retain(|_, b| {
                b.tokens + now.saturating_sub(b.at).max(0) as f64 / 1000.0 * per_sec < burst
            });
            if buckets.len() >= self.cap {
                forget_longest_idle(&mut buckets, self.cap / 10 + 1);
            }
        }
        let b = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_sub(b.at).max(0) as f64 / 1000.0;
        b.tokens = (b.tokens + elapsed * self.per_sec).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Callers remembered now.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Forgets the `n` callers seen longest ago. A caller hammering the limit is always among
/// the most recent, so it keeps its empty bucket however many others come and go (a
/// flood of new callers never hands it a fresh burst).
fn forget_longest_idle<K: Hash + Eq>(buckets: &mut HashMap<K, Bucket>, n: usize) {
    if n >= buckets.len() {
        buckets.clear();
        return;
    }
    let mut seen: Vec<UnixMillis> = buckets.values().map(|b| b.at).collect();
    let cutoff = *seen.select_nth_unstable(n - 1).1;
    // All seen before the cutoff instant, and as many seen at it as make `n`.
    let mut at_cutoff = n - seen.iter().filter(|&&t| t < cutoff).count();
    buckets.retain(|_, b| {
        if b.at < cutoff {
            return false;
        }
        if b.at == cutoff && at_cutoff > 0 {
            at_cutoff -= 1;
            return false;
        }
        true
    });
}

/// The caller an anonymous request is counted against: its IPv4 address, or the /64
/// prefix of its IPv6 address; one shared key when API Gateway named no valid address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(Option<IpAddr>);

impl Source {
    /// From API Gateway's `requestContext.http.sourceIp`.
    pub fn of(source_ip: Option<&str>) -> Source {
        Source(source_ip.and_then(|s| s.parse().ok()).map(|ip| match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::from(octets)
            }
        }))
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

    #[test]
    fn memory_stays_bounded_whatever_callers_come() {
        // Every caller spends its whole burst, so no bucket is idle when the cap is hit.
        let l = RateLimiter::<u64>::with_cap(1, 2, 100);
        for caller in 0..10_000u64 {
            assert!(l.allow(&caller, 0));
            assert!(l.allow(&caller, 0));
            assert!(!l.allow(&caller, 0));
            assert!(l.tracked() <= 100, "{} tracked", l.tracked());
        }
        // Idle callers are what is forgotten first: a full bucket carries no state.
        let l = RateLimiter::<u64>::with_cap(1, 1, 10);
        for caller in 0..9u64 {
            assert!(l.allow(&caller, 0));
        }
        assert!(l.allow(&100, 4_500));
        assert!(!l.allow(&100, 4_500), "the limited caller is limited");
        assert!(l.allow(&200, 5_000), "the cap frees the refilled buckets");
        assert!(!l.allow(&100, 5_000), "and keeps the one still draining");
        assert_eq!(l.tracked(), 2);
    }

    #[test]
    fn a_flood_of_new_callers_never_refills_a_hammering_one() {
        // Every caller spends its burst (nobody idle), and one keeps hammering.
        let l = RateLimiter::<u64>::with_cap(1, 2, 1_000);
        let hammer = u64::MAX;
        let mut now = 0;
        assert!(l.allow(&hammer, now) && l.allow(&hammer, now));
        for caller in 0..20_000u64 {
            now += 1;
            assert!(l.allow(&caller, now));
            assert!(l.allow(&caller, now));
            // 20 s pass in all, 1 token/s: the hammerer earns a token about each second
            // and spends it at once; it never gets a burst back.
            if caller % 50 == 0 {
                assert!(
                    !(l.allow(&hammer, now) && l.allow(&hammer, now)),
                    "at {now} ms"
                );
            }
            assert!(l.tracked() <= 1_000);
        }
        assert!(l.tracked() > 800, "only the longest idle are forgotten");
    }

    #[test]
    fn sources_are_addresses_and_ipv6_counts_per_64() {
        assert_eq!(
            Source::of(Some("203.0.113.7")),
            Source::of(Some("203.0.113.7"))
        );
        assert_ne!(
            Source::of(Some("203.0.113.7")),
            Source::of(Some("203.0.113.8"))
        );
        assert_eq!(
            Source::of(Some("2001:db8:1:2:aaaa::1")),
            Source::of(Some("2001:db8:1:2:ffff:1:2:3"))
        );
        assert_ne!(
            Source::of(Some("2001:db8:1:2::1")),
            Source::of(Some("2001:db8:1:3::1"))
        );
        assert_eq!(Source::of(None), Source::of(Some("not an address")));
    }
}

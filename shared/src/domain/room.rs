//! The waiting room of a voucher that has one: who may enter when.
//!
//! Buyers join before the sale and get a position, 1, 2, 3, ... in the order Redis saw
//! their first join (`lua/queue.lua`); a retry or a refresh keeps the position. Served
//! positions are computed from the clock and the room's entry rate, never stored or
//! advanced by a job: at the start one second's worth of positions enters, then `rate`
//! more each second. Position `p` is served at
//! `begins + max(0, ceil((p - rate) * 1000 / rate))` ms, a function that never decreases
//! with `p`, so entry follows arrival exactly.

use super::clock::UnixMillis;
use super::ids::{ValidationError, invalid};

/// The highest entry rate a room may have, per second.
pub const MAX_ENTRY_RATE_PER_S: i64 = 100_000;

/// How long before the start a room opens unless the admin says otherwise, in seconds.
pub const DEFAULT_QUEUE_OPENS_BEFORE_S: i64 = 900;

/// The longest a room may open before the start, in seconds (one day).
pub const MAX_QUEUE_OPENS_BEFORE_S: i64 = 86_400;

/// How long an entry token stays valid after it is handed out, in ms.
pub const ENTRY_TOKEN_TTL_MS: i64 = 10 * 60 * 1000;

/// A voucher's waiting room: how many buyers enter per second once the sale begins, and
/// how long before the start buyers may join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitingRoom {
    entry_rate_per_s: u32,
    opens_before_s: u32,
}

impl WaitingRoom {
    /// Checks an admin's request: a rate of 1..=[`MAX_ENTRY_RATE_PER_S`] and an opening
    /// 0..=[`MAX_QUEUE_OPENS_BEFORE_S`] seconds before the start
    /// ([`DEFAULT_QUEUE_OPENS_BEFORE_S`] when not given).
    pub fn parse(
        entry_rate_per_s: i64,
        opens_before_s: Option<i64>,
    ) -> Result<WaitingRoom, ValidationError> {
        if !(1..=MAX_ENTRY_RATE_PER_S).contains(&entry_rate_per_s) {
            return Err(invalid(format!(
                "entry_rate_per_s must be between 1 and {MAX_ENTRY_RATE_PER_S}"
            )));
        }
        let opens = opens_before_s.unwrap_or(DEFAULT_QUEUE_OPENS_BEFORE_S);
        if !(0..=MAX_QUEUE_OPENS_BEFORE_S).contains(&opens) {
            return Err(invalid(format!(
                "queue_opens_before_s must be between 0 and {MAX_QUEUE_OPENS_BEFORE_S}"
            )));
        }
        Ok(WaitingRoom {
            entry_rate_per_s: entry_rate_per_s as u32,
            opens_before_s: opens as u32,
        })
    }

    /// A room as stored (database row, sale hash); `None` when out of range.
    pub fn from_stored(entry_rate_per_s: i64, opens_before_s: i64) -> Option<WaitingRoom> {
        WaitingRoom::parse(entry_rate_per_s, Some(opens_before_s)).ok()
    }

    pub fn entry_rate_per_s(&self) -> u32 {
        self.entry_rate_per_s
    }

    pub fn opens_before_s(&self) -> u32 {
        self.opens_before_s
    }

    /// When buyers may start joining, for a sale beginning at `begins_ms`.
    pub fn opens_at(&self, begins_ms: UnixMillis) -> UnixMillis {
        begins_ms.saturating_sub(i64::from(self.opens_before_s) * 1000)
    }

    /// When position `position` (1-based) enters a sale beginning at `begins_ms`.
    pub fn served_at(&self, begins_ms: UnixMillis, position: u64) -> UnixMillis {
        let rate = u64::from(self.entry_rate_per_s);
        let after_first_second = position.saturating_sub(rate);
        // ceil(after * 1000 / rate), in u128 so no position can overflow it.
        let wait = (u128::from(after_first_second) * 1000).div_ceil(u128::from(rate));
        begins_ms.saturating_add(i64::try_from(wait).unwrap_or(i64::MAX))
    }

    /// Where position `position` stands at `now`: served, or the time left to wait.
    pub fn standing(&self, begins_ms: UnixMillis, position: u64, now: UnixMillis) -> Standing {
        let at = self.served_at(begins_ms, position);
        if now >= at {
            Standing::Served
        } else {
            Standing::Waiting { wait_ms: at - now }
        }
    }
}

/// A position's standing at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Served,
    Waiting { wait_ms: i64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(rate: i64) -> WaitingRoom {
        WaitingRoom::parse(rate, None).unwrap()
    }

    #[test]
    fn the_first_seconds_worth_enters_at_the_start_then_rate_per_second() {
        let r = room(100);
        assert_eq!(r.served_at(10_000, 1), 10_000);
        assert_eq!(r.served_at(10_000, 100), 10_000);
        assert_eq!(r.served_at(10_000, 101), 10_010);
        assert_eq!(r.served_at(10_000, 200), 11_000);
        assert_eq!(r.served_at(10_000, 201), 11_010);
        let one = room(1);
        assert_eq!(one.served_at(0, 1), 0);
        assert_eq!(one.served_at(0, 2), 1_000);
        assert_eq!(one.served_at(0, 60), 59_000);
    }

    #[test]
    fn entry_never_overtakes_arrival() {
        for rate in [1, 3, 7, 100, 999, 100_000] {
            let r = room(rate);
            let mut last = i64::MIN;
            for p in 1..5_000u64 {
                let at = r.served_at(1_000_000, p);
                assert!(
                    at >= last,
                    "rate {rate}: position {p} enters before {}",
                    p - 1
                );
                last = at;
            }
            // How many have entered after t ms is within one of rate * (t / 1000 + 1).
            let served = (1..5_000u64)
                .filter(|p| r.served_at(1_000_000, *p) <= 1_002_000)
                .count() as i64;
            assert!(
                (served - (rate * 3).min(4_999)).abs() <= 1,
                "rate {rate}: {served}"
            );
        }
        assert_eq!(room(1).served_at(i64::MAX - 5, u64::MAX), i64::MAX);
    }

    #[test]
    fn standing_and_opening() {
        let r = WaitingRoom::parse(10, Some(60)).unwrap();
        assert_eq!(r.opens_at(100_000), 40_000);
        assert_eq!(r.standing(100_000, 10, 100_000), Standing::Served);
        assert_eq!(
            r.standing(100_000, 30, 100_500),
            Standing::Waiting { wait_ms: 1_500 }
        );
        assert_eq!(r.standing(100_000, 30, 102_000), Standing::Served);
    }

    #[test]
    fn rates_and_openings_out_of_range_are_refused() {
        for (rate, opens) in [(0, None), (-1, None), (MAX_ENTRY_RATE_PER_S + 1, None)] {
            assert!(WaitingRoom::parse(rate, opens).is_err(), "{rate}");
        }
        assert!(WaitingRoom::parse(1, Some(-1)).is_err());
        assert!(WaitingRoom::parse(1, Some(MAX_QUEUE_OPENS_BEFORE_S + 1)).is_err());
        let r = WaitingRoom::parse(MAX_ENTRY_RATE_PER_S, Some(0)).unwrap();
        assert_eq!(r.opens_before_s(), 0);
        assert_eq!(
            room(5).opens_before_s() as i64,
            DEFAULT_QUEUE_OPENS_BEFORE_S
        );
        assert_eq!(WaitingRoom::from_stored(0, 5), None);
    }
}

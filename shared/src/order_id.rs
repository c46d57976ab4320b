//! Order ids: 64-bit, positive, time-prefixed, unique across vouchers, instances and
//! restarts, and cheap to issue.
//!
//! Layout: `seconds since 2026-01-01T00:00:00Z << 32 | seq`. The top bit stays 0 (31 bits
//! of seconds last until 2094), so ids are positive `i64`s that sort by time.
//!
//! `seq` (1..=2^32-1) comes from a per-UTC-day counter in Redis. Instead of one INCR per
//! order (the tutorial design), an instance leases a block of [`BLOCK`] numbers at a time
//! for one (voucher, day) and records `block index → voucher` in the same atomic call
//! (`lua/lease.lua`), which gives:
//!
//! - uniqueness: ids with the same seconds share a day and so a counter; a block is used
//!   only for ids whose seconds fall in the block's own day, so a day change or a clock
//!   step onto another day makes the instance lease from that day's counter;
//! - 1/[`BLOCK`] extra round trips per admission on average;
//! - an exact way back from an order id to its voucher (see [`OrderIdParts::block`]),
//!   which `GET /orders/{id}` needs while the order is still pending in Redis.

use std::collections::HashMap;

use crate::domain::{OrderId, UnixMillis, VoucherId};

/// Unix seconds of the id epoch, 2026-01-01T00:00:00Z.
pub const EPOCH_UNIX_SECS: i64 = 1_767_225_600;
/// Sequence numbers leased per call. Fixed: the block index math depends on it.
pub const BLOCK: u32 = 1024;
/// How long a day's counter and block map live, in seconds. A clock stepping back more
/// than this onto an expired day could reuse numbers; a week is far beyond any NTP step.
pub const DAY_KEY_TTL_SECS: i64 = 8 * 86_400;

const SEQ_BITS: u32 = 32;
const SEQ_MASK: i64 = (1 << SEQ_BITS) - 1;

/// The parts of an order id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderIdParts {
    /// Seconds since [`EPOCH_UNIX_SECS`].
    pub secs: u32,
    /// Position in the day's sequence, from 1.
    pub seq: u32,
}

impl OrderIdParts {
    /// Builds an id; `None` when the seconds are before the epoch or past 2^31, or `seq`
    /// is 0.
    pub fn compose(secs: i64, seq: u32) -> Option<OrderId> {
        if !(0..(1i64 << 31)).contains(&secs) || seq == 0 {
            return None;
        }
        OrderId::new((secs << SEQ_BITS) | i64::from(seq))
    }

    pub fn of(id: OrderId) -> OrderIdParts {
        OrderIdParts {
            secs: (id.get() >> SEQ_BITS) as u32,
            seq: (id.get() & SEQ_MASK) as u32,
        }
    }

    /// The UTC day (days since the Unix epoch) the id was issued on.
    pub fn day(&self) -> i64 {
        (EPOCH_UNIX_SECS + i64::from(self.secs)).div_euclid(86_400)
    }

    /// The index of the leased block the id's `seq` came from.
    pub fn block(&self) -> u32 {
        (self.seq - 1) / BLOCK
    }
}

/// The `yyyymmdd` name of a UTC day given as days since the Unix epoch.
pub fn day_name(day: i64) -> String {
    let date = time::Date::from_julian_day(2_440_588 + day as i32).unwrap_or(time::Date::MIN);
    format!(
        "{:04}{:02}{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    )
}

/// The id clock reading for a moment: (seconds since the id epoch, UTC day).
pub fn clock(now: UnixMillis) -> (i64, i64) {
    let unix_secs = now.div_euclid(1000);
    (unix_secs - EPOCH_UNIX_SECS, unix_secs.div_euclid(86_400))
}

/// A leased range of sequence numbers of one day, `next..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    day: i64,
    next: u32,
    last: u32,
}

/// The blocks one instance holds, per voucher. Pure bookkeeping: the lease itself is a
/// Redis call made by the caller when [`IdBlocks::take`] says so.
#[derive(Debug, Default)]
pub struct IdBlocks {
    blocks: HashMap<VoucherId, Block>,
}

/// What [`IdBlocks::take`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    Id(OrderId),
    /// Lease a block of this day, hand its highest number to [`IdBlocks::add`], try again.
    Lease {
        day: i64,
    },
    /// The clock is outside the id epoch (before 2026 or after 2094).
    ClockOutOfRange,
}

impl IdBlocks {
    /// Issues the next id for `voucher` at `now` from a block of the same day, if any.
    pub fn take(&mut self, voucher: VoucherId, now: UnixMillis) -> Take {
        let (secs, day) = clock(now);
        if !(0..(1i64 << 31)).contains(&secs) {
            return Take::ClockOutOfRange;
        }
        match self.blocks.get_mut(&voucher) {
            Some(b) if b.day == day && b.next <= b.last => {
                let seq = b.next;
                b.next += 1;
                match OrderIdParts::compose(secs, seq) {
                    Some(id) => Take::Id(id),
                    None => Take::ClockOutOfRange,
                }
            }
            _ => Take::Lease { day },
        }
    }

    /// Records a freshly leased block whose highest number is `last` (a multiple of
    /// [`BLOCK`], as `lua/lease.lua` returns).
    pub fn add(&mut self, voucher: VoucherId, day: i64, last: u32) {
        let first = last.saturating_sub(BLOCK - 1).max(1);
        self.blocks.insert(
            voucher,
            Block {
                day,
                next: first,
                last,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_puts_seconds_above_the_sequence() {
        let id = OrderIdParts::compose(3, 7).unwrap();
        assert_eq!(id.get(), (3 << 32) | 7);
        assert_eq!(OrderIdParts::of(id), OrderIdParts { secs: 3, seq: 7 });
        let max = OrderIdParts::compose((1 << 31) - 1, u32::MAX).unwrap();
        assert_eq!(max.get(), i64::MAX);
        assert!(OrderIdParts::compose(1 << 31, 1).is_none());
        assert!(OrderIdParts::compose(-1, 1).is_none());
        assert!(OrderIdParts::compose(5, 0).is_none());
    }

    #[test]
    fn ids_sort_by_time_then_sequence() {
        let a = OrderIdParts::compose(10, u32::MAX).unwrap();
        let b = OrderIdParts::compose(11, 1).unwrap();
        assert!(a < b);
    }

    #[test]
    fn day_and_block_are_recoverable_from_an_id() {
        // 2026-11-22T23:59:59Z
        let now = 1_795_391_999_000;
        let (secs, day) = clock(now);
        assert_eq!(day_name(day), "20261122");
        let id = OrderIdParts::compose(secs, BLOCK * 3 + 1).unwrap();
        let parts = OrderIdParts::of(id);
        assert_eq!(parts.day(), day);
        assert_eq!(parts.block(), 3);
        assert_eq!(
            OrderIdParts::of(OrderIdParts::compose(secs, BLOCK * 3).unwrap()).block(),
            2
        );
        assert_eq!(day_name(0), "19700101");
    }

    #[test]
    fn blocks_are_used_up_then_leased_again() {
        let v = VoucherId::new(1).unwrap();
        let now = 1_795_300_000_000;
        let (_, day) = clock(now);
        let mut blocks = IdBlocks::default();
        assert_eq!(blocks.take(v, now), Take::Lease { day });
        blocks.add(v, day, 2 * BLOCK);
        let mut seqs = Vec::new();
        for _ in 0..BLOCK {
            match blocks.take(v, now) {
                Take::Id(id) => seqs.push(OrderIdParts::of(id).seq),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seqs.first(), Some(&(BLOCK + 1)));
        assert_eq!(seqs.last(), Some(&(2 * BLOCK)));
        assert_eq!(blocks.take(v, now), Take::Lease { day });
    }

    #[test]
    fn a_block_is_never_used_on_another_day() {
        let v = VoucherId::new(1).unwrap();
        let before_midnight = 1_795_391_999_000;
        let after_midnight = before_midnight + 1_000;
        let mut blocks = IdBlocks::default();
        let (_, day) = clock(before_midnight);
        blocks.add(v, day, BLOCK);
        assert!(matches!(blocks.take(v, before_midnight), Take::Id(_)));
        assert_eq!(blocks.take(v, after_midnight), Take::Lease { day: day + 1 });
        // A clock stepping back onto the old day uses the old day's block again: its
        // numbers are still unique within that day.
        assert!(matches!(blocks.take(v, before_midnight), Take::Id(_)));
    }

    #[test]
    fn clock_outside_the_epoch_is_refused() {
        let v = VoucherId::new(1).unwrap();
        let mut blocks = IdBlocks::default();
        assert_eq!(blocks.take(v, 0), Take::ClockOutOfRange);
    }
}

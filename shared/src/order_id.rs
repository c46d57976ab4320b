//! Order ids: 64-bit, positive, unique across vouchers, instances and restarts (also
//! when Redis forgets its last writes), and cheap to issue.
//!
//! Layout: `lease_ms << 22 | slot << 10 | offset`, 41 + 12 + 10 bits, the top bit 0 (41
//! bits of milliseconds since 2025-01-01 last until 2094), so ids are positive `i64`s.
//!
//! An instance does not ask Redis for every id: it leases a block of [`BLOCK`] ids for
//! one voucher with one call of `lua/lease.lua`, which stamps the lease with
//! `(lease_ms, slot)` from a hybrid logical clock kept in Redis (the server's `TIME`,
//! strictly increasing over every lease the server remembers) and records
//! `<lease_ms>:<slot> → voucher` in the same atomic call. The instance then issues
//! `offset` 0..1023 from memory. This gives:
//!
//! - uniqueness: two leases the server remembers differ in `(lease_ms, slot)`. A lease the
//!   server forgets (AOF `everysec`, a failover to a replica that had not received it) is
//!   still held, and used, by its instance; stamps follow the server's clock (plus a
//!   remembered skew), so the next lease after the loss is stamped later than the
//!   forgotten one by the restart or failover time (far more than a millisecond), and a
//!   clock found behind the remembered stamps jumps ahead instead (see `lua/lease.lua`);
//! - 1/[`BLOCK`] extra round trips per admission on average;
//! - an exact way back from an order id to its voucher ([`OrderIdParts::block_field`]),
//!   which `GET /orders/{id}` needs while the order is still pending in Redis; a
//!   forgotten lease cannot make an id resolve to another voucher, because the field
//!   names the whole stamp, not a position in a counter that can be handed out again.
//!
//! The epoch is a year before the first layout's (`seconds since 2026-01-01 << 32 | seq`),
//! so every id of this layout is larger than every id that layout issued before 2067:
//! ids already in the database cannot be issued again after the switch.

use std::collections::HashMap;

use crate::domain::{OrderId, UnixMillis, VoucherId};

/// Unix milliseconds of the id epoch, 2025-01-01T00:00:00Z.
pub const EPOCH_UNIX_MS: i64 = 1_735_689_600_000;
/// Ids per leased block. Fixed: the layout's `offset` field is exactly this wide.
pub const BLOCK: u32 = 1 << OFFSET_BITS;
/// Leases one clock millisecond can stamp; the next lease moves the clock on a
/// millisecond (`lua/lease.lua`).
pub const SLOTS_PER_MS: u32 = 1 << SLOT_BITS;
/// How long a day's block map lives after its latest lease, in seconds. Pending orders
/// are found by id for at least this long minus [`MAX_BLOCK_AGE_MS`].
pub const DAY_KEY_TTL_SECS: i64 = 8 * 86_400;
/// An instance stops issuing from a block this long after it leased it, so that the
/// block's map entry outlives every id issued from it by a week.
pub const MAX_BLOCK_AGE_MS: i64 = 86_400_000;
/// How far the lease clock jumps ahead of the latest stamp it remembers when the
/// server's clock reads earlier than the clock that wrote that stamp (a failover to a
/// server whose clock is behind, or a clock stepped back): past every stamp the lost
/// writes can have used. Lost writes span at most a second or two (AOF `everysec`,
/// replication lag); a minute leaves a wide margin. Stamps then stay that far ahead of
/// the server's clock (the clock's `skew`), which costs nothing: ids are not times.
pub const CLOCK_BEHIND_JUMP_MS: i64 = 60_000;

const OFFSET_BITS: u32 = 10;
const SLOT_BITS: u32 = 12;
const MS_BITS: u32 = 41;
const LOW_BITS: u32 = SLOT_BITS + OFFSET_BITS;
const MAX_MS: i64 = (1 << MS_BITS) - 1;

/// The stamp of one lease: the lease clock's millisecond (since [`EPOCH_UNIX_MS`]) and
/// the lease's number within that millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub ms: i64,
    pub slot: u32,
}

impl Lease {
    /// Checks a stamp as the lease script returns it: `ms` in 1..2^41, `slot` below
    /// [`SLOTS_PER_MS`].
    pub fn new(ms: i64, slot: i64) -> Option<Lease> {
        let slot = u32::try_from(slot).ok().filter(|s| *s < SLOTS_PER_MS)?;
        (1..=MAX_MS).contains(&ms).then_some(Lease { ms, slot })
    }

    /// The block's id at `offset` (below [`BLOCK`]).
    pub fn id(&self, offset: u32) -> Option<OrderId> {
        OrderIdParts {
            ms: self.ms,
            slot: self.slot,
            offset,
        }
        .compose()
    }
}

/// The parts of an order id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderIdParts {
    /// The lease's millisecond, since [`EPOCH_UNIX_MS`].
    pub ms: i64,
    /// The lease's number within its millisecond.
    pub slot: u32,
    /// The id's position in its block.
    pub offset: u32,
}

impl OrderIdParts {
    /// Builds the id; `None` when a part does not fit its bits or the id would be 0.
    pub fn compose(&self) -> Option<OrderId> {
        if !(0..=MAX_MS).contains(&self.ms) || self.slot >= SLOTS_PER_MS || self.offset >= BLOCK {
            return None;
        }
        OrderId::new(
            (self.ms << LOW_BITS) | (i64::from(self.slot) << OFFSET_BITS) | i64::from(self.offset),
        )
    }

    pub fn of(id: OrderId) -> OrderIdParts {
        let n = id.get();
        OrderIdParts {
            ms: n >> LOW_BITS,
            slot: ((n >> OFFSET_BITS) & i64::from(SLOTS_PER_MS - 1)) as u32,
            offset: (n & i64::from(BLOCK - 1)) as u32,
        }
    }

    /// The UTC day (days since the Unix epoch) of the lease, which names the block map
    /// that records it.
    ///
    /// Saturating: the parts of a real id (`ms` below 2^41) are far from the bounds, but
    /// the fields are public and a day is only ever a lookup key, never a reason to panic.
    pub fn day(&self) -> i64 {
        day_of(EPOCH_UNIX_MS.saturating_add(self.ms))
    }

    /// The field of the day's block map that holds the voucher of this id's block.
    pub fn block_field(&self) -> String {
        block_field(self.ms, self.slot)
    }
}

/// The block-map field of a lease stamp, `<ms>:<slot>` (as `lua/lease.lua` writes it).
pub fn block_field(ms: i64, slot: u32) -> String {
    format!("{ms}:{slot}")
}

/// The Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

/// The `yyyymmdd` name of a UTC day given as days since the Unix epoch.
///
/// A day outside what `time` can represent (years -9999..=9999) names the nearest day it
/// can: such a day can come only from a corrupt reply (the lease script's day) or a
/// hand-built [`OrderIdParts`], and names a map that holds nothing. Checked, because a
/// plain `as i32` wraps and the addition can overflow (a panic in debug builds).
pub fn day_name(day: i64) -> String {
    let julian = i32::try_from(day)
        .ok()
        .and_then(|d| d.checked_add(UNIX_EPOCH_JULIAN_DAY));
    let date = match julian.map(time::Date::from_julian_day) {
        Some(Ok(date)) => date,
        _ if day < 0 => time::Date::MIN,
        _ => time::Date::MAX,
    };
    format!(
        "{:04}{:02}{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    )
}

/// The UTC day (days since the Unix epoch) of a moment.
pub fn day_of(now: UnixMillis) -> i64 {
    now.div_euclid(86_400_000)
}

/// A leased block: ids `lease.id(next..BLOCK)` are still free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    lease: Lease,
    next: u32,
    /// The instance's clock when it got the block.
    leased_at: UnixMillis,
}

/// Vouchers one instance holds a block for, at most. Blocks are leased only for vouchers
/// that exist, but a warm instance can see many sales over its life; past this, used-up
/// and expired blocks are dropped, then the oldest (its unused ids are simply never
/// issued).
pub const MAX_HELD_BLOCKS: usize = 10_000;

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
    /// Lease a block, hand it to [`IdBlocks::add`], try again. `day` is the instance's
    /// guess of the lease's UTC day (the server's clock decides; the script says when the
    /// guess is wrong).
    Lease {
        day: i64,
    },
}

impl IdBlocks {
    /// Issues the next id for `voucher` from the block held for it, unless the block is
    /// used up or older than [`MAX_BLOCK_AGE_MS`] at `now`.
    pub fn take(&mut self, voucher: VoucherId, now: UnixMillis) -> Take {
        if let Some(b) = self.blocks.get_mut(&voucher)
            && b.next < BLOCK
            // `abs_diff`: a difference of two clock readings cannot overflow this way.
            && now.abs_diff(b.leased_at) <= MAX_BLOCK_AGE_MS.unsigned_abs()
            && let Some(id) = b.lease.id(b.next)
        {
            b.next += 1;
            return Take::Id(id);
        }
        Take::Lease { day: day_of(now) }
    }

    /// Records a freshly leased block, replacing the voucher's previous one.
    pub fn add(&mut self, voucher: VoucherId, lease: Lease, now: UnixMillis) {
        if self.blocks.len() >= MAX_HELD_BLOCKS && !self.blocks.contains_key(&voucher) {
            self.blocks.retain(|_, b| {
                b.next < BLOCK && now.abs_diff(b.leased_at) <= MAX_BLOCK_AGE_MS.unsigned_abs()
            });
            if self.blocks.len() >= MAX_HELD_BLOCKS
                && let Some(oldest) = self
                    .blocks
                    .iter()
                    .min_by_key(|(_, b)| b.leased_at)
                    .map(|(v, _)| *v)
            {
                self.blocks.remove(&oldest);
            }
        }
        self.blocks.insert(
            voucher,
            Block {
                lease,
                next: 0,
                leased_at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_puts_the_lease_stamp_above_the_offset() {
        let id = OrderIdParts {
            ms: 3,
            slot: 5,
            offset: 7,
        }
        .compose()
        .unwrap();
        assert_eq!(id.get(), (3 << 22) | (5 << 10) | 7);
        assert_eq!(
            OrderIdParts::of(id),
            OrderIdParts {
                ms: 3,
                slot: 5,
                offset: 7
            }
        );
        let max = OrderIdParts {
            ms: MAX_MS,
            slot: SLOTS_PER_MS - 1,
            offset: BLOCK - 1,
        };
        assert_eq!(max.compose().unwrap().get(), i64::MAX);
        assert_eq!(OrderIdParts::of(max.compose().unwrap()), max);
        for bad in [
            OrderIdParts {
                ms: MAX_MS + 1,
                slot: 0,
                offset: 0,
            },
            OrderIdParts {
                ms: -1,
                slot: 0,
                offset: 1,
            },
            OrderIdParts {
                ms: 1,
                slot: SLOTS_PER_MS,
                offset: 0,
            },
            OrderIdParts {
                ms: 1,
                slot: 0,
                offset: BLOCK,
            },
            OrderIdParts {
                ms: 0,
                slot: 0,
                offset: 0,
            },
        ] {
            assert_eq!(bad.compose(), None, "{bad:?}");
        }
        assert_eq!(Lease::new(0, 0), None);
        assert_eq!(Lease::new(MAX_MS + 1, 0), None);
        assert_eq!(Lease::new(1, i64::from(SLOTS_PER_MS)), None);
        assert_eq!(Lease::new(1, -1), None);
        assert_eq!(Lease::new(9, 2), Some(Lease { ms: 9, slot: 2 }));
    }

    #[test]
    fn ids_sort_by_lease_stamp_then_offset() {
        let a = Lease::new(10, SLOTS_PER_MS as i64 - 1).unwrap();
        let b = Lease::new(11, 0).unwrap();
        assert!(a.id(BLOCK - 1).unwrap() < b.id(0).unwrap());
        assert!(a.id(1).unwrap() < a.id(2).unwrap());
    }

    #[test]
    fn every_id_of_the_first_layout_is_below_every_id_of_this_one() {
        // The first layout: seconds since 2026-01-01 << 32 | seq (seq < 2^32). Its
        // largest id issued by a moment is below this layout's smallest id at that
        // moment, for every moment from its start to 2067.
        let old_epoch_secs = 1_767_225_600_i64;
        let year = 365 * 86_400_i64;
        for t in (old_epoch_secs..old_epoch_secs + 41 * year).step_by(86_400) {
            let old_max = ((t - old_epoch_secs + 1) << 32) - 1;
            let new_min = Lease::new(t * 1000 - EPOCH_UNIX_MS, 0)
                .unwrap()
                .id(0)
                .unwrap()
                .get();
            assert!(old_max < new_min, "at unix {t}");
        }
    }

    #[test]
    fn day_and_block_field_are_recoverable_from_an_id() {
        // 2026-11-22T23:59:59.999Z
        let unix_ms = 1_795_391_999_999;
        let lease = Lease::new(unix_ms - EPOCH_UNIX_MS, 3).unwrap();
        let parts = OrderIdParts::of(lease.id(17).unwrap());
        assert_eq!(day_name(parts.day()), "20261122");
        assert_eq!(parts.day(), day_of(unix_ms));
        assert_eq!(
            parts.block_field(),
            format!("{}:3", unix_ms - EPOCH_UNIX_MS)
        );
        let next_day = OrderIdParts::of(Lease::new(lease.ms + 1, 0).unwrap().id(0).unwrap());
        assert_eq!(day_name(next_day.day()), "20261123");
        assert_eq!(day_name(0), "19700101");
    }

    #[test]
    fn sequence_zero_of_a_block_and_other_boundaries_decompose() {
        // 4294967296 = 2^32 was sequence 0 of a block in the first layout, where it
        // underflowed; in this one it is ms 1024, slot 0, offset 0.
        for (n, ms, slot, offset) in [
            (1_i64, 0, 0, 1),
            (1 << 10, 0, 1, 0),
            (1 << 22, 1, 0, 0),
            (1 << 32, 1 << 10, 0, 0),
            ((1 << 32) - 1, (1 << 10) - 1, SLOTS_PER_MS - 1, BLOCK - 1),
            (i64::MAX, MAX_MS, SLOTS_PER_MS - 1, BLOCK - 1),
        ] {
            let parts = OrderIdParts::of(OrderId::new(n).unwrap());
            assert_eq!(parts, OrderIdParts { ms, slot, offset }, "{n}");
            assert_eq!(parts.block_field(), format!("{ms}:{slot}"));
            assert_eq!(day_name(parts.day()).len(), 8, "{n}");
        }
        assert_eq!(day_name(i64::MAX), "99991231");
        assert_eq!(day_name(i64::MIN), "-99990101");
        assert_eq!(day_name(i64::from(i32::MAX)), "99991231");
    }

    proptest::proptest! {
        // Every positive i64 is an id a caller can send (`GET /orders/{id}`): its
        // decomposition, day, day name and block field never panic, and the parts
        // compose back to the same id.
        #[test]
        fn every_id_decomposes_and_composes_back(n in 1..=i64::MAX) {
            let id = OrderId::new(n).unwrap();
            let parts = OrderIdParts::of(id);
            proptest::prop_assert_eq!(parts.compose(), Some(id));
            proptest::prop_assert!((0..=MAX_MS).contains(&parts.ms));
            let name = day_name(parts.day());
            proptest::prop_assert_eq!(name.len(), 8);
            let _ = parts.block_field();
        }

        // Parts built by hand, a day from a corrupt lease reply, clocks anywhere: no
        // panic, and only parts that fit compose.
        #[test]
        fn any_parts_days_and_clocks_are_handled(
            ms in proptest::num::i64::ANY,
            slot in proptest::num::u32::ANY,
            offset in proptest::num::u32::ANY,
            day in proptest::num::i64::ANY,
            now in proptest::num::i64::ANY,
            leased_at in proptest::num::i64::ANY,
            lease_slot in proptest::num::i64::ANY,
        ) {
            let parts = OrderIdParts { ms, slot, offset };
            let fits = (0..=MAX_MS).contains(&ms) && slot < SLOTS_PER_MS && offset < BLOCK;
            let composed = parts.compose();
            proptest::prop_assert_eq!(composed.is_some(), fits && (ms, slot, offset) != (0, 0, 0));
            if let Some(id) = composed {
                proptest::prop_assert_eq!(OrderIdParts::of(id), parts);
            }
            let _ = day_name(parts.day());
            let _ = day_name(day);
            let _ = day_of(now);
            let _ = Lease::new(ms, lease_slot);
            let v = VoucherId::new(1).unwrap();
            let mut blocks = IdBlocks::default();
            blocks.add(v, Lease::new(1, 0).unwrap(), leased_at);
            let _ = blocks.take(v, now);
        }
    }

    #[test]
    fn blocks_are_used_up_then_leased_again() {
        let v = VoucherId::new(1).unwrap();
        let w = VoucherId::new(2).unwrap();
        let now = 1_795_300_000_000;
        let day = day_of(now);
        let mut blocks = IdBlocks::default();
        assert_eq!(blocks.take(v, now), Take::Lease { day });
        let lease = Lease::new(1_000, 7).unwrap();
        blocks.add(v, lease, now);
        let mut ids = Vec::new();
        for _ in 0..BLOCK {
            match blocks.take(v, now) {
                Take::Id(id) => ids.push(id),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(ids.first(), lease.id(0).as_ref());
        assert_eq!(ids.last(), lease.id(BLOCK - 1).as_ref());
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(blocks.take(v, now), Take::Lease { day });
        // Each voucher has its own block.
        assert_eq!(blocks.take(w, now), Take::Lease { day });
    }

    #[test]
    fn an_old_block_is_not_used_any_more() {
        let v = VoucherId::new(1).unwrap();
        let now = 1_795_300_000_000;
        let mut blocks = IdBlocks::default();
        blocks.add(v, Lease::new(1_000, 0).unwrap(), now);
        assert!(matches!(
            blocks.take(v, now + MAX_BLOCK_AGE_MS),
            Take::Id(_)
        ));
        assert_eq!(
            blocks.take(v, now + MAX_BLOCK_AGE_MS + 1),
            Take::Lease {
                day: day_of(now + MAX_BLOCK_AGE_MS + 1)
            }
        );
        // A clock stepped far back does not keep a block alive either.
        assert!(matches!(
            blocks.take(v, now - MAX_BLOCK_AGE_MS - 1),
            Take::Lease { .. }
        ));
    }

    #[test]
    fn the_blocks_held_stay_bounded_oldest_dropped_first() {
        let now = 1_795_300_000_000;
        let v = |n: i64| VoucherId::new(n).unwrap();
        let mut blocks = IdBlocks::default();
        for n in 1..=MAX_HELD_BLOCKS as i64 {
            blocks.add(v(n), Lease::new(1_000, 0).unwrap(), now + n);
        }
        assert_eq!(blocks.blocks.len(), MAX_HELD_BLOCKS);
        // Voucher 7's block is used up: it goes first, and nobody else's.
        for _ in 0..BLOCK {
            assert!(matches!(blocks.take(v(7), now + 7), Take::Id(_)));
        }
        blocks.add(v(100_000), Lease::new(1_000, 1).unwrap(), now + 100_000);
        assert_eq!(blocks.blocks.len(), MAX_HELD_BLOCKS);
        assert!(matches!(blocks.take(v(1), now), Take::Id(_)));
        // All live: the oldest lease (voucher 1) makes room.
        blocks.add(v(100_001), Lease::new(1_000, 2).unwrap(), now + 100_001);
        assert_eq!(blocks.blocks.len(), MAX_HELD_BLOCKS);
        assert!(matches!(blocks.take(v(1), now), Take::Lease { .. }));
        assert!(matches!(blocks.take(v(2), now), Take::Id(_)));
        assert!(matches!(blocks.take(v(100_001), now), Take::Id(_)));
        // Replacing a voucher's own block never evicts another.
        blocks.add(v(2), Lease::new(1_000, 3).unwrap(), now + 200_000);
        assert!(matches!(blocks.take(v(3), now), Take::Id(_)));
        for n in 0..2_000 {
            blocks.add(
                v(200_000 + n),
                Lease::new(1_000, 4).unwrap(),
                now + 300_000 + n,
            );
            assert!(blocks.blocks.len() <= MAX_HELD_BLOCKS);
        }
    }
}

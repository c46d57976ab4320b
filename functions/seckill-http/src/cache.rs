//! What one function instance remembers about vouchers, to answer without Redis.
//!
//! A voucher's title, stock and window never change after creation, so once seen they
//! are kept for the life of the instance. Two things are remembered only briefly,
//! because they can stop being true:
//!
//! - sold out, for [`SOLD_OUT_TTL_MS`]: stock can come back (a repair after Redis lost
//!   the sale, an operator adding stock), and a flag that never expired would refuse it
//!   forever. During a sell-out flood this costs one Redis call per instance per TTL;
//! - an unknown voucher id, for [`MISSING_TTL_MS`], since it may be created any moment.
//!
//! The sale window is decided by Redis's clock (`TIME` in `lua/admit.lua`), not this
//! instance's. To answer `not_started` / `ended` from memory the instance estimates the
//! Redis clock as its own plus the offset measured on the last refusal the script gave
//! (an admission's reply is one integer, without the time), and short-circuits only when
//! the sale's edge is more than [`SKEW_BOUND_MS`] away from that estimate; closer to the
//! edge, or before any such reply was seen, or when it is older than
//! [`CLOCK_OFFSET_TTL_MS`], Redis decides. A skewed instance clock therefore
//! refuses no buyer Redis would admit (beyond the bound's error of one round trip).

use std::collections::HashMap;
use std::sync::Mutex;

use seckill_shared::adapters::queue::SaleShape;
use seckill_shared::domain::{SaleWindow, UnixMillis, Voucher, VoucherId};

/// How long an unknown voucher id is answered `not_found` from memory.
pub const MISSING_TTL_MS: i64 = 1_000;

/// How long a sold-out answer from Redis is repeated from memory.
pub const SOLD_OUT_TTL_MS: i64 = 1_000;

/// How close (in estimated Redis time) to the start or end of a sale the instance stops
/// answering from memory and lets Redis decide. Covers the error of the offset estimate
/// (one round trip) and clock drift since it was measured.
pub const SKEW_BOUND_MS: i64 = 1_000;

/// How long a measured clock offset is trusted (the instance's clock may be stepped).
pub const CLOCK_OFFSET_TTL_MS: i64 = 60_000;

#[derive(Debug, Clone, Default)]
struct Entry {
    window: Option<SaleWindow>,
    voucher: Option<Voucher>,
    /// Instance time until which the voucher is answered sold out.
    sold_out_until: Option<UnixMillis>,
    missing_until: Option<UnixMillis>,
    /// The admission script answered for it (an admission's reply carries no window).
    live: bool,
    /// Its stock buckets and waiting room, once learned: from its description, or
    /// from bucket 0's sale hash, always together (an instance never admits knowing the
    /// buckets but not that a token is needed). Immutable, like the description.
    shape: Option<SaleShape>,
}

impl Entry {
    /// Whether the voucher is known to exist: described, or answered for by Redis.
    fn seen(&self) -> bool {
        self.live || self.window.is_some() || self.voucher.is_some()
    }
}

/// The Redis clock minus this instance's, as measured at `measured_at` (instance time).
#[derive(Debug, Clone, Copy)]
struct ClockOffset {
    offset: i64,
    measured_at: UnixMillis,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<VoucherId, Entry>,
    clock: Option<ClockOffset>,
}

/// The answer the cache can give on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    NotStarted,
    Ended,
    SoldOut,
    Missing,
}

/// Vouchers remembered at most. Unknown ids come from callers (anyone can ask for
/// `GET /vouchers/<any id>`), so the memory is bounded: when full, the notes about
/// unknown ids go first, then, if it is still full, an arbitrary half. Forgetting costs
/// only a Redis or database read later; no answer depends on being remembered.
pub const MAX_VOUCHERS: usize = 10_000;

/// Makes room for `voucher` when it is new and the memory is full.
fn make_room(entries: &mut HashMap<VoucherId, Entry>, voucher: VoucherId) {
    if entries.len() < MAX_VOUCHERS || entries.contains_key(&voucher) {
        return;
    }
    entries.retain(|_, e| e.seen());
    if entries.len() >= MAX_VOUCHERS {
        let mut drop = entries.len() / 2;
        entries.retain(|_, _| {
            if drop > 0 {
                drop -= 1;
                false
            } else {
                true
            }
        });
    }
}

/// Per-instance voucher memory.
#[derive(Debug, Default)]
pub struct VoucherCache {
    state: Mutex<State>,
}

/// Whether `now` lies in `[until - ttl, until)`: a deadline set at most `ttl` ago. A
/// deadline further in the future means the clock was stepped back; it is not trusted.
fn within(until: Option<UnixMillis>, ttl: i64, now: UnixMillis) -> bool {
    until.is_some_and(|t| t.saturating_sub(ttl) <= now && now < t)
}

impl VoucherCache {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A poisoned map is still a consistent map: each update is one field write.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// An answer for an admission attempt at `now` (this instance's clock) that needs
    /// no Redis call, if any.
    pub fn short_circuit(&self, voucher: VoucherId, now: UnixMillis) -> Option<Known> {
        self.look(voucher, now).0
    }

    /// [`short_circuit`](Self::short_circuit)'s answer, and the voucher's
    /// [`SaleShape`] (stock buckets, waiting room) when this instance knows the voucher
    /// exists and its shape, under one lock: the admission path asks both.
    pub fn look(&self, voucher: VoucherId, now: UnixMillis) -> (Option<Known>, Option<SaleShape>) {
        self.with(|s| {
            let Some(e) = s.entries.get(&voucher) else {
                return (None, None);
            };
            let shape = e
                .shape
                .or(e.voucher.as_ref().map(|v| SaleShape {
                    buckets: v.buckets,
                    room: v.room,
                }))
                .filter(|_| e.seen());
            (Self::answer(e, s.clock, now), shape)
        })
    }

    /// Remembers a voucher's stock buckets and waiting room, as bucket 0's sale hash
    /// records them.
    pub fn learn_shape(&self, voucher: VoucherId, shape: SaleShape) {
        self.with(|s| {
            make_room(&mut s.entries, voucher);
            let e = s.entries.entry(voucher).or_default();
            e.shape = Some(shape);
            e.live = true;
        });
    }

    /// Whether the sale of `window` is clearly over at `now` (this instance's clock):
    /// by Redis's clock as this instance last measured it (its own, when it has no
    /// recent measure), more than [`SKEW_BOUND_MS`] past the end. What a past sale is
    /// for the routes that must not reload one from the database; nearer the end,
    /// Redis decides.
    pub fn clearly_over(&self, window: &SaleWindow, now: UnixMillis) -> bool {
        let clock = self.with(|s| s.clock);
        let redis_now = Self::redis_now(clock, now).unwrap_or(now);
        redis_now >= window.ends_ms().saturating_add(SKEW_BOUND_MS)
    }

    /// Redis's clock at `now` by the last measure, while it is recent.
    fn redis_now(clock: Option<ClockOffset>, now: UnixMillis) -> Option<UnixMillis> {
        clock
            .filter(|c| now.abs_diff(c.measured_at) < CLOCK_OFFSET_TTL_MS.unsigned_abs())
            .map(|c| now.saturating_add(c.offset))
    }

    fn answer(e: &Entry, clock: Option<ClockOffset>, now: UnixMillis) -> Option<Known> {
        if within(e.missing_until, MISSING_TTL_MS, now) {
            return Some(Known::Missing);
        }
        let redis_now = Self::redis_now(clock, now);
        if let (Some(w), Some(t)) = (e.window, redis_now) {
            // Saturating: a window read back from Redis is whatever its hash holds, and
            // a corrupt one must not panic here (debug) or wrap (release).
            if t < w.begins_ms().saturating_sub(SKEW_BOUND_MS) {
                return Some(Known::NotStarted);
            }
            if t >= w.ends_ms().saturating_add(SKEW_BOUND_MS) {
                return Some(Known::Ended);
            }
        }
        if within(e.sold_out_until, SOLD_OUT_TTL_MS, now) {
            // Sold out is only ever learned from Redis, whose window then was open or
            // closed: an ended sale that sold out is still `ended` (checked above once
            // clearly past; near the edge Redis answers).
            return Some(Known::SoldOut);
        }
        None
    }

    /// Remembers what an admission script's answer for a live sale (not `NotLoaded`)
    /// says: that the voucher exists, its window when the answer has it, whether the
    /// stock is gone (for [`SOLD_OUT_TTL_MS`]), and the
    /// offset of Redis's clock (`server_ms`, when the answer has it) from this
    /// instance's (`now`, read when the answer arrived). One lock per answer.
    pub fn learn_sale(
        &self,
        voucher: VoucherId,
        window: Option<SaleWindow>,
        sold_out: bool,
        server_ms: Option<UnixMillis>,
        now: UnixMillis,
    ) {
        self.with(|s| {
            if let Some(server_ms) = server_ms {
                s.clock = Some(ClockOffset {
                    offset: server_ms.saturating_sub(now),
                    measured_at: now,
                });
            }
            make_room(&mut s.entries, voucher);
            let e = s.entries.entry(voucher).or_default();
            e.live = true;
            if let Some(w) = window {
                e.window = Some(w);
                e.missing_until = None;
            }
            e.sold_out_until = sold_out.then_some(now.saturating_add(SOLD_OUT_TTL_MS));
        });
    }

    /// Forgets that `voucher` is sold out: this instance returned a unit to it (a
    /// cancelled or expired order). Other instances forget within [`SOLD_OUT_TTL_MS`].
    pub fn forget_sold_out(&self, voucher: VoucherId) {
        self.with(|s| {
            if let Some(e) = s.entries.get_mut(&voucher) {
                e.sold_out_until = None;
            }
        });
    }

    /// Remembers that the database does not know `voucher`, until `now + MISSING_TTL_MS`.
    pub fn learn_missing(&self, voucher: VoucherId, now: UnixMillis) {
        self.with(|s| {
            make_room(&mut s.entries, voucher);
            s.entries.entry(voucher).or_default().missing_until =
                Some(now.saturating_add(MISSING_TTL_MS))
        });
    }

    /// Remembers a voucher's immutable description.
    pub fn learn_voucher(&self, v: &Voucher) {
        self.with(|s| {
            make_room(&mut s.entries, v.id);
            let e = s.entries.entry(v.id).or_default();
            e.window = Some(v.window);
            e.voucher = Some(v.clone());
            e.missing_until = None;
        });
    }

    /// The voucher's description, if seen. Its `db_stock_left` is as of when it was seen.
    pub fn voucher(&self, voucher: VoucherId) -> Option<Voucher> {
        self.with(|s| s.entries.get(&voucher)?.voucher.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000;

    #[test]
    fn the_buckets_learned_from_redis_mark_the_voucher_seen() {
        let c = VoucherCache::default();
        let v = VoucherId::new(9).unwrap();
        assert_eq!(c.look(v, 0), (None, None));
        // An admission's reply (no window, no server time) says nothing of buckets.
        c.learn_sale(v, None, false, None, 0);
        assert_eq!(c.look(v, 0), (None, None));
        c.learn_shape(
            v,
            SaleShape {
                buckets: 3,
                room: None,
            },
        );
        let shape = |buckets| {
            Some(SaleShape {
                buckets,
                room: None,
            })
        };
        assert_eq!(c.look(v, 0), (None, shape(3)));
        // The description tells the room too.
        let room = seckill_shared::domain::WaitingRoom::parse(10, None).unwrap();
        let w = VoucherId::new(10).unwrap();
        c.learn_voucher(&Voucher {
            id: w,
            title: "t".into(),
            stock: 5,
            db_stock_left: 5,
            window: SaleWindow::new(0, 10).unwrap(),
            payment: None,
            buckets: 2,
            room: Some(room),
        });
        assert_eq!(
            c.look(w, 0).1,
            Some(SaleShape {
                buckets: 2,
                room: Some(room)
            })
        );
    }

    #[test]
    fn answers_from_the_window_and_sold_out_flag() {
        let c = VoucherCache::default();
        let v = VoucherId::new(7).unwrap();
        let w = SaleWindow::new(100_000, 130_000).unwrap();
        assert_eq!(c.short_circuit(v, 0), None);
        // The instance's clock agrees with Redis's.
        c.learn_sale(v, Some(w), false, Some(50_000), 50_000);
        assert_eq!(c.short_circuit(v, 50_000), Some(Known::NotStarted));
        assert_eq!(c.short_circuit(v, 105_000), None);
        c.learn_sale(v, None, true, Some(120_000), 120_000);
        assert_eq!(c.short_circuit(v, 120_000), Some(Known::SoldOut));
        // Ended wins over sold out once the window has clearly closed.
        c.learn_sale(v, None, true, Some(129_900), 129_900);
        assert_eq!(
            c.short_circuit(v, 130_000 + SKEW_BOUND_MS),
            Some(Known::Ended)
        );
    }

    #[test]
    fn a_sale_is_clearly_over_by_redis_clock_when_known_else_by_this_instance() {
        let c = VoucherCache::default();
        let w = SaleWindow::new(100_000, 130_000).unwrap();
        let end = 130_000 + SKEW_BOUND_MS;
        // No measure of Redis's clock: this instance's.
        assert!(!c.clearly_over(&w, end - 1));
        assert!(c.clearly_over(&w, end));
        // Redis's clock is 5 s behind this instance's: the sale is over 5 s later here.
        c.learn_sale(
            VoucherId::new(1).unwrap(),
            None,
            false,
            Some(120_000),
            125_000,
        );
        assert!(!c.clearly_over(&w, end));
        assert!(!c.clearly_over(&w, end + 4_999));
        assert!(c.clearly_over(&w, end + 5_000));
    }

    #[test]
    fn the_memory_is_bounded_whatever_ids_callers_make_up() {
        let c = VoucherCache::default();
        let real = VoucherId::new(1).unwrap();
        c.learn_sale(
            real,
            Some(SaleWindow::new(0, HOUR).unwrap()),
            false,
            Some(0),
            0,
        );
        for id in 2..(3 * MAX_VOUCHERS as i64) {
            c.learn_missing(VoucherId::new(id).unwrap(), 0);
        }
        let len = c.with(|s| s.entries.len());
        assert!(len <= MAX_VOUCHERS, "{len} entries");
        // Unknown ids are forgotten first: the real sale is still known.
        assert!(c.with(|s| s.entries.contains_key(&real)));
        // Full of real vouchers, it still stays within the bound.
        for id in 100_000..(100_000 + 2 * MAX_VOUCHERS as i64) {
            c.learn_sale(
                VoucherId::new(id).unwrap(),
                Some(SaleWindow::new(0, HOUR).unwrap()),
                false,
                Some(0),
                0,
            );
        }
        assert!(c.with(|s| s.entries.len()) <= MAX_VOUCHERS);
    }

    #[test]
    fn sold_out_is_forgotten_after_its_ttl() {
        let c = VoucherCache::default();
        let v = VoucherId::new(9).unwrap();
        let w = SaleWindow::new(0, 10 * HOUR).unwrap();
        c.learn_sale(v, Some(w), true, Some(HOUR), HOUR);
        assert_eq!(c.short_circuit(v, HOUR), Some(Known::SoldOut));
        assert_eq!(
            c.short_circuit(v, HOUR + SOLD_OUT_TTL_MS - 1),
            Some(Known::SoldOut)
        );
        // Stock may have come back: ask Redis again.
        assert_eq!(c.short_circuit(v, HOUR + SOLD_OUT_TTL_MS), None);
        // A clock stepped back does not stretch the flag either.
        assert_eq!(c.short_circuit(v, HOUR - HOUR / 2), None);
        // An answer with stock left clears it at once.
        c.learn_sale(v, Some(w), true, Some(2 * HOUR), 2 * HOUR);
        c.learn_sale(v, Some(w), false, Some(2 * HOUR + 1), 2 * HOUR + 1);
        assert_eq!(c.short_circuit(v, 2 * HOUR + 2), None);
    }

    #[test]
    fn a_skewed_instance_clock_refuses_no_buyer_redis_would_admit() {
        let v = VoucherId::new(10).unwrap();
        let begins = 10 * HOUR;
        let w = SaleWindow::new(begins, begins + HOUR).unwrap();
        for skew in [-HOUR, -30_000, -1_500, 1_500, 30_000, HOUR] {
            let c = VoucherCache::default();
            // Seen in the database only, no Redis answer yet: no window answers at all,
            // whatever the instance's clock says.
            c.learn_voucher(&Voucher {
                id: v,
                title: "t".into(),
                stock: 1,
                db_stock_left: 1,
                window: w,
                payment: None,
                buckets: 1,
                room: None,
            });
            assert_eq!(c.short_circuit(v, begins - HOUR + skew), None, "{skew}");
            // Redis answered not started 10 s early; the instance's clock is `skew` off
            // Redis's.
            let local = |redis: i64| redis + skew;
            c.learn_sale(
                v,
                Some(w),
                false,
                Some(begins - 10_000),
                local(begins - 10_000),
            );
            assert_eq!(
                c.short_circuit(v, local(begins - 2 * SKEW_BOUND_MS)),
                Some(Known::NotStarted),
                "{skew}"
            );
            // From the bound before the start on, Redis decides.
            for at in [begins - SKEW_BOUND_MS, begins, begins + 5_000] {
                assert_eq!(c.short_circuit(v, local(at)), None, "{skew} {at}");
            }
            // Same at the end: an admission 5 s before it, then Redis decides until the
            // bound after it.
            let ends = w.ends_ms();
            c.learn_sale(v, Some(w), false, Some(ends - 5_000), local(ends - 5_000));
            for at in [ends - 1, ends, ends + SKEW_BOUND_MS - 1] {
                assert_eq!(c.short_circuit(v, local(at)), None, "{skew} {at}");
            }
            assert_eq!(
                c.short_circuit(v, local(ends + SKEW_BOUND_MS)),
                Some(Known::Ended),
                "{skew}"
            );
            // An offset measured long ago is not trusted (the clock may have been stepped).
            assert_eq!(
                c.short_circuit(v, local(ends - 5_000) + CLOCK_OFFSET_TTL_MS),
                None,
                "{skew}"
            );
        }
    }

    proptest::proptest! {
        // Windows and server clocks as a corrupt Redis hash or reply could name them, and
        // instance clocks anywhere: never a panic.
        #[test]
        fn any_window_and_clock_is_handled(
            a in proptest::num::i64::ANY,
            b in proptest::num::i64::ANY,
            server_ms in proptest::num::i64::ANY,
            now in proptest::num::i64::ANY,
            later in proptest::num::i64::ANY,
        ) {
            let c = VoucherCache::default();
            let v = VoucherId::new(1).unwrap();
            let w = SaleWindow::new(a.min(b), a.max(b)).ok();
            c.learn_sale(v, w, true, Some(server_ms), now);
            c.learn_missing(v, now);
            let _ = c.short_circuit(v, later);
            let _ = c.short_circuit(v, now);
        }
    }

    #[test]
    fn missing_vouchers_are_forgotten_quickly() {
        let c = VoucherCache::default();
        let v = VoucherId::new(8).unwrap();
        c.learn_missing(v, 1_000);
        assert_eq!(c.short_circuit(v, 1_500), Some(Known::Missing));
        assert_eq!(c.short_circuit(v, 1_000 + MISSING_TTL_MS), None);
    }
}

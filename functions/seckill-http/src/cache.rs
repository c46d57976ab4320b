//! What one function instance remembers about vouchers, to answer without Redis.
//!
//! A voucher's title, stock and window never change after creation, so once seen they
//! are kept for the life of the instance. Stock never comes back either (no order is
//! ever cancelled back into Redis), so a voucher seen sold out stays sold out until its
//! sale ends: later attempts are answered `sold_out` without a round trip. A voucher id
//! that the database does not know is remembered for [`MISSING_TTL_MS`] only, since it
//! may be created any moment.

use std::collections::HashMap;
use std::sync::Mutex;

use seckill_shared::domain::{Phase, SaleWindow, UnixMillis, Voucher, VoucherId};

/// How long an unknown voucher id is answered `not_found` from memory.
pub const MISSING_TTL_MS: i64 = 1_000;

#[derive(Debug, Clone, Default)]
struct Entry {
    window: Option<SaleWindow>,
    voucher: Option<Voucher>,
    sold_out: bool,
    missing_until: Option<UnixMillis>,
}

/// The answer the cache can give on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    NotStarted,
    Ended,
    SoldOut,
    Missing,
}

/// Per-instance voucher memory.
#[derive(Debug, Default)]
pub struct VoucherCache {
    entries: Mutex<HashMap<VoucherId, Entry>>,
}

impl VoucherCache {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<VoucherId, Entry>) -> R) -> R {
        // A poisoned map is still a consistent map: each update is one field write.
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut map)
    }

    /// An answer for an admission attempt at `now` that needs no Redis call, if any.
    pub fn short_circuit(&self, voucher: VoucherId, now: UnixMillis) -> Option<Known> {
        self.with(|m| {
            let e = m.get(&voucher)?;
            if e.missing_until.is_some_and(|t| now < t) {
                return Some(Known::Missing);
            }
            match e.window.map(|w| w.phase(now)) {
                Some(Phase::NotStarted) => Some(Known::NotStarted),
                Some(Phase::Ended) => Some(Known::Ended),
                _ if e.sold_out => Some(Known::SoldOut),
                _ => None,
            }
        })
    }

    /// Remembers what an admission script's answer says about a sale: its window, when
    /// Redis knows it, and whether the stock is gone. One lock per answer.
    pub fn learn_sale(&self, voucher: VoucherId, window: Option<SaleWindow>, sold_out: bool) {
        self.with(|m| {
            let e = m.entry(voucher).or_default();
            if let Some(w) = window {
                e.window = Some(w);
                e.missing_until = None;
            }
            e.sold_out |= sold_out;
        });
    }

    /// Remembers that the database does not know `voucher`, until `now + MISSING_TTL_MS`.
    pub fn learn_missing(&self, voucher: VoucherId, now: UnixMillis) {
        self.with(|m| m.entry(voucher).or_default().missing_until = Some(now + MISSING_TTL_MS));
    }

    /// Remembers a voucher's immutable description.
    pub fn learn_voucher(&self, v: &Voucher) {
        self.with(|m| {
            let e = m.entry(v.id).or_default();
            e.window = Some(v.window);
            e.voucher = Some(v.clone());
            e.missing_until = None;
        });
    }

    /// The voucher's description, if seen. Its `db_stock_left` is as of when it was seen.
    pub fn voucher(&self, voucher: VoucherId) -> Option<Voucher> {
        self.with(|m| m.get(&voucher)?.voucher.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_from_the_window_and_sold_out_flag() {
        let c = VoucherCache::default();
        let v = VoucherId::new(7).unwrap();
        assert_eq!(c.short_circuit(v, 0), None);
        c.learn_sale(v, Some(SaleWindow::new(100, 200).unwrap()), false);
        assert_eq!(c.short_circuit(v, 99), Some(Known::NotStarted));
        assert_eq!(c.short_circuit(v, 150), None);
        assert_eq!(c.short_circuit(v, 200), Some(Known::Ended));
        c.learn_sale(v, None, true);
        assert_eq!(c.short_circuit(v, 150), Some(Known::SoldOut));
        // Ended wins over sold out once the window has closed.
        assert_eq!(c.short_circuit(v, 250), Some(Known::Ended));
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

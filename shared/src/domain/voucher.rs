//! A voucher: its sale window, its payment terms and price, the rules an admin's request
//! must meet ([`NewVoucher`]) and the row as stored ([`Voucher`]).

use super::bucket::{Bucket, MAX_BUCKETS, PLANNED_ADMISSIONS_PER_BUCKET};
use super::clock::{UnixMillis, parse_rfc3339_millis};
use super::ids::{ValidationError, VoucherId, invalid};
use super::room::WaitingRoom;

/// When a voucher is on sale: `[begins_ms, ends_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleWindow {
    begins_ms: UnixMillis,
    ends_ms: UnixMillis,
}

/// Where a moment falls relative to a [`SaleWindow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    NotStarted,
    Open,
    Ended,
}

impl SaleWindow {
    pub fn new(begins_ms: UnixMillis, ends_ms: UnixMillis) -> Result<SaleWindow, ValidationError> {
        if begins_ms >= ends_ms {
            return Err(invalid("begins_at must be before ends_at"));
        }
        Ok(SaleWindow { begins_ms, ends_ms })
    }
    pub fn begins_ms(&self) -> UnixMillis {
        self.begins_ms
    }
    pub fn ends_ms(&self) -> UnixMillis {
        self.ends_ms
    }
    pub fn phase(&self, now: UnixMillis) -> Phase {
        if now < self.begins_ms {
            Phase::NotStarted
        } else if now >= self.ends_ms {
            Phase::Ended
        } else {
            Phase::Open
        }
    }
}

/// The most units one voucher may put on sale.
pub const MAX_STOCK: i64 = 10_000_000;
/// The longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// The latest moment a sale window may name, 9999-12-31T23:59:59.999Z: the last the
/// database's `DATETIME(3)` holds. An RFC 3339 time with a negative offset on
/// 9999-12-31 is later in UTC and parses, and the database would refuse its row.
pub const MAX_SALE_TIME_MS: UnixMillis = 253_402_300_799_999;

/// The longest payment window a voucher may give, in seconds (one day).
pub const MAX_PAY_WITHIN_S: i64 = 86_400;

/// A voucher's payment step: each admitted order must be paid within `pay_within_ms`
/// of its admission, or it expires and its unit goes back on sale. Paid means the
/// payment provider said so (see [`crate::webhook`]), for `price`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentTerms {
    /// From admission to the payment deadline, 1 s ..= [`MAX_PAY_WITHIN_S`].
    pub pay_within_ms: i64,
    /// Whether a buyer whose order was cancelled or expired may buy again.
    pub rebuy_after_close: bool,
    /// With `rebuy_after_close`: how many of a buyer's orders of this voucher may close
    /// unpaid (cancelled or expired) with the buyer free to buy again; after that many,
    /// the buyer holds their last order for good. Bounds one account cancelling and
    /// rebuying in a loop to hold a unit unpaid for the whole sale.
    pub rebuy_limit: u8,
    /// What a buyer pays for one unit. `None` only for vouchers made before prices
    /// existed: a payment for one of those is refused as not matching.
    pub price: Option<Price>,
}

/// A buyer's unpaid closes after which they may not buy again, unless the admin says
/// otherwise (`rebuy_limit`).
pub const DEFAULT_REBUY_LIMIT: u8 = 2;

/// The most `rebuy_limit` may be.
pub const MAX_REBUY_LIMIT: u8 = 10;

impl PaymentTerms {
    /// How many unpaid closes leave a buyer free to buy again: 0 when none does.
    pub fn rebuys(&self) -> u8 {
        if self.rebuy_after_close {
            self.rebuy_limit
        } else {
            0
        }
    }

    /// Checks an admin's `pay_within_s`, `rebuy_after_close`, `rebuy_limit`,
    /// `price_minor` and `currency`: none without a payment window; a payment window
    /// needs a price; `rebuy_limit` needs `rebuy_after_close` (1..=[`MAX_REBUY_LIMIT`],
    /// default [`DEFAULT_REBUY_LIMIT`]); the others alone are refused (they mean nothing
    /// then).
    pub fn parse(
        pay_within_s: Option<i64>,
        rebuy_after_close: Option<bool>,
        price_minor: Option<i64>,
        currency: Option<&str>,
    ) -> Result<Option<PaymentTerms>, ValidationError> {
        PaymentTerms::parse_with_limit(pay_within_s, rebuy_after_close, None, price_minor, currency)
    }

    /// [`PaymentTerms::parse`] with the admin's `rebuy_limit`.
    pub fn parse_with_limit(
        pay_within_s: Option<i64>,
        rebuy_after_close: Option<bool>,
        rebuy_limit: Option<i64>,
        price_minor: Option<i64>,
        currency: Option<&str>,
    ) -> Result<Option<PaymentTerms>, ValidationError> {
        // Given with `rebuy_after_close: false`, the limit is kept and counts nothing
        // (the schema asks only that the flag be given: docs/openapi.yaml).
        if rebuy_limit.is_some() && rebuy_after_close.is_none() {
            return Err(invalid("rebuy_limit needs rebuy_after_close"));
        }
        let limit = rebuy_limit.unwrap_or(i64::from(DEFAULT_REBUY_LIMIT));
        if !(1..=i64::from(MAX_REBUY_LIMIT)).contains(&limit) {
            return Err(invalid(format!(
                "rebuy_limit must be between 1 and {MAX_REBUY_LIMIT}"
            )));
        }
        let Some(s) = pay_within_s else {
            if rebuy_after_close.is_some() {
                return Err(invalid("rebuy_after_close needs pay_within_s"));
            }
            if price_minor.is_some() || currency.is_some() {
                return Err(invalid("price_minor and currency need pay_within_s"));
            }
            return Ok(None);
        };
        if !(1..=MAX_PAY_WITHIN_S).contains(&s) {
            return Err(invalid(format!(
                "pay_within_s must be between 1 and {MAX_PAY_WITHIN_S}"
            )));
        }
        let (Some(amount), Some(currency)) = (price_minor, currency) else {
            return Err(invalid(
                "pay_within_s needs price_minor and currency: what the buyer pays",
            ));
        };
        Ok(Some(PaymentTerms {
            pay_within_ms: s * 1000,
            rebuy_after_close: rebuy_after_close.unwrap_or(false),
            rebuy_limit: limit as u8,
            price: Some(Price::new(amount, currency)?),
        }))
    }
}

/// The most a unit may cost, in minor units (a hundred million of the currency).
pub const MAX_PRICE_MINOR: i64 = 10_000_000_000;

/// An amount of money: minor units (cents) of an ISO 4217 currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Price {
    amount_minor: i64,
    currency: [u8; 3],
}

impl Price {
    /// `amount_minor` 1..=[`MAX_PRICE_MINOR`]; `currency` three letters, upper case
    /// (`EUR`), as ISO 4217 writes them.
    pub fn new(amount_minor: i64, currency: &str) -> Result<Price, ValidationError> {
        if !(1..=MAX_PRICE_MINOR).contains(&amount_minor) {
            return Err(invalid(format!(
                "price_minor must be between 1 and {MAX_PRICE_MINOR}"
            )));
        }
        let code: [u8; 3] = currency
            .as_bytes()
            .try_into()
            .ok()
            .filter(|c: &[u8; 3]| c.iter().all(u8::is_ascii_uppercase))
            .ok_or_else(|| invalid("currency must be three upper-case letters (ISO 4217)"))?;
        Ok(Price {
            amount_minor,
            currency: code,
        })
    }

    pub fn amount_minor(&self) -> i64 {
        self.amount_minor
    }

    pub fn currency(&self) -> &str {
        std::str::from_utf8(&self.currency).expect("ASCII letters")
    }
}

/// A voucher as an admin asks to create it, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVoucher {
    pub title: String,
    pub stock: i64,
    pub window: SaleWindow,
    /// `None`: orders end `confirmed` at once (no payment step).
    pub payment: Option<PaymentTerms>,
    /// Stock buckets, 1..=[`MAX_BUCKETS`] (see [`Bucket`]); 1 unless asked.
    pub buckets: u16,
    /// `Some`: buyers queue first and need an entry token to buy.
    pub room: Option<WaitingRoom>,
}

impl NewVoucher {
    /// Checks an admin's request: title non-empty and bounded, stock 1..=10,000,000,
    /// begins before ends, ends in the future.
    pub fn parse(
        title: &str,
        stock: i64,
        begins_at: &str,
        ends_at: &str,
        now: UnixMillis,
    ) -> Result<NewVoucher, ValidationError> {
        let title = title.trim();
        if title.is_empty() {
            return Err(invalid("title must not be empty"));
        }
        if title.chars().count() > MAX_TITLE_CHARS {
            return Err(invalid(format!(
                "title must be at most {MAX_TITLE_CHARS} characters"
            )));
        }
        if title.chars().any(char::is_control) {
            return Err(invalid("title must not contain control characters"));
        }
        if !(1..=MAX_STOCK).contains(&stock) {
            return Err(invalid(format!("stock must be between 1 and {MAX_STOCK}")));
        }
        let begins = parse_rfc3339_millis(begins_at, "begins_at")?;
        let ends = parse_rfc3339_millis(ends_at, "ends_at")?;
        // From the Unix epoch (no sale starts earlier, and the database's DATETIME has
        // no year 0) to the last moment the database holds.
        for (t, what) in [(begins, "begins_at"), (ends, "ends_at")] {
            if !(0..=MAX_SALE_TIME_MS).contains(&t) {
                return Err(invalid(format!(
                    "{what} must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z"
                )));
            }
        }
        let window = SaleWindow::new(begins, ends)?;
        if ends <= now {
            return Err(invalid("ends_at must be in the future"));
        }
        Ok(NewVoucher {
            title: title.to_string(),
            stock,
            window,
            payment: None,
            buckets: 1,
            room: None,
        })
    }

    /// Sets the stock buckets an admin asked for, given as a count (`buckets`,
    /// 1..=[`MAX_BUCKETS`]) or as the admissions per second expected at the sale's peak
    /// (`expected_peak_per_s`: one bucket per [`PLANNED_ADMISSIONS_PER_BUCKET`], at most
    /// [`MAX_BUCKETS`]), not both; never more buckets than units (every bucket starts
    /// with at least one).
    pub fn with_buckets(
        mut self,
        buckets: Option<i64>,
        expected_peak_per_s: Option<i64>,
    ) -> Result<NewVoucher, ValidationError> {
        let k = match (buckets, expected_peak_per_s) {
            (None, None) => return Ok(self),
            (Some(_), Some(_)) => {
                return Err(invalid("give buckets or expected_peak_per_s, not both"));
            }
            (None, Some(peak)) if !(1..=MAX_STOCK * 100).contains(&peak) => {
                return Err(invalid(format!(
                    "expected_peak_per_s must be between 1 and {}",
                    MAX_STOCK * 100
                )));
            }
            (None, Some(peak)) => {
                let k = (peak + PLANNED_ADMISSIONS_PER_BUCKET - 1) / PLANNED_ADMISSIONS_PER_BUCKET;
                k.clamp(1, i64::from(MAX_BUCKETS)).min(self.stock)
            }
            (Some(k), None) => k,
        };
        if !(1..=i64::from(MAX_BUCKETS)).contains(&k) {
            return Err(invalid(format!(
                "buckets must be between 1 and {MAX_BUCKETS}"
            )));
        }
        if k > self.stock {
            return Err(invalid("buckets must not exceed stock"));
        }
        self.buckets = k as u16;
        Ok(self)
    }
}

impl NewVoucher {
    /// Gives the sale a waiting room when the admin asked for one (`entry_rate_per_s`,
    /// optionally `queue_opens_before_s`); an opening time without a rate is refused.
    pub fn with_waiting_room(
        mut self,
        entry_rate_per_s: Option<i64>,
        queue_opens_before_s: Option<i64>,
    ) -> Result<NewVoucher, ValidationError> {
        self.room = match (entry_rate_per_s, queue_opens_before_s) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(invalid("queue_opens_before_s needs entry_rate_per_s"));
            }
            (Some(rate), opens) => Some(WaitingRoom::parse(rate, opens)?),
        };
        Ok(self)
    }
}

/// A voucher as stored in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voucher {
    pub id: VoucherId,
    pub title: String,
    /// Units put on sale.
    pub stock: i64,
    /// Units the database still has (decremented by the drainer).
    pub db_stock_left: i64,
    pub window: SaleWindow,
    pub payment: Option<PaymentTerms>,
    /// Stock buckets (1: the voucher's stock is one Redis key, as before buckets).
    pub buckets: u16,
    /// `Some`: buyers queue first and need an entry token to buy.
    pub room: Option<WaitingRoom>,
}

impl Voucher {
    /// The bucket `user` buys from.
    pub fn bucket_of(&self, user: &str) -> Bucket {
        Bucket::of_user(self.id, self.buckets, user)
    }
    /// Every bucket of the voucher, bucket 0 first.
    pub fn buckets(&self) -> impl Iterator<Item = Bucket> {
        Bucket::all(self.id, self.buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ClosedOrder, OrderStatus, PaymentRef, format_rfc3339_millis};

    #[test]
    fn new_voucher_checks_every_rule() {
        let now = parse_rfc3339_millis("2026-11-22T00:00:00Z", "t").unwrap();
        let ok = NewVoucher::parse(
            "Coffee",
            100,
            "2026-11-22T10:00:00Z",
            "2026-11-22T11:00:00+00:00",
            now,
        )
        .unwrap();
        assert_eq!(ok.window.ends_ms() - ok.window.begins_ms(), 3_600_000);
        let cases = [
            ("", 1, "2026-11-22T10:00:00Z", "2026-11-22T11:00:00Z"),
            ("t", 0, "2026-11-22T10:00:00Z", "2026-11-22T11:00:00Z"),
            (
                "t",
                10_000_001,
                "2026-11-22T10:00:00Z",
                "2026-11-22T11:00:00Z",
            ),
            ("t", 1, "2026-11-22T11:00:00Z", "2026-11-22T10:00:00Z"),
            ("t", 1, "2026-11-21T10:00:00Z", "2026-11-21T11:00:00Z"),
            ("t", 1, "yesterday", "2026-11-22T11:00:00Z"),
            // Later than 9999-12-31 in UTC, which the database cannot store (was a 503).
            ("t", 1, "2026-11-22T10:00:00Z", "9999-12-31T23:59:59-23:59"),
            ("t", 1, "1969-12-31T23:59:59.999Z", "2026-11-22T11:00:00Z"),
            ("t", 1, "0000-01-01T00:00:00Z", "2026-11-22T11:00:00Z"),
        ];
        for (title, stock, b, e) in cases {
            assert!(
                NewVoucher::parse(title, stock, b, e, now).is_err(),
                "{title:?} {stock} {b} {e}"
            );
        }
        assert!(
            NewVoucher::parse(
                &"t".repeat(201),
                1,
                "2026-11-22T10:00:00Z",
                "2026-11-22T11:00:00Z",
                now
            )
            .is_err()
        );
    }

    #[test]
    fn the_widest_window_the_database_holds_is_accepted() {
        let v = NewVoucher::parse(
            "t",
            1,
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999Z",
            0,
        )
        .unwrap();
        assert_eq!(v.window.ends_ms(), MAX_SALE_TIME_MS);
        assert_eq!(
            format_rfc3339_millis(MAX_SALE_TIME_MS),
            "9999-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn payment_terms_and_references_are_checked() {
        let eur = Some("EUR");
        // A rebuy limit only with rebuy_after_close, 1..=MAX_REBUY_LIMIT, 2 by default.
        let limit = |l| PaymentTerms::parse_with_limit(Some(30), Some(true), l, Some(100), eur);
        assert_eq!(
            limit(None).unwrap().unwrap().rebuy_limit,
            DEFAULT_REBUY_LIMIT
        );
        assert_eq!(limit(Some(5)).unwrap().unwrap().rebuys(), 5);
        for bad in [0, -1, i64::from(MAX_REBUY_LIMIT) + 1] {
            assert!(limit(Some(bad)).is_err(), "{bad}");
        }
        assert!(PaymentTerms::parse_with_limit(Some(30), None, Some(2), Some(100), eur).is_err());
        let off = PaymentTerms::parse_with_limit(Some(30), Some(false), Some(3), Some(100), eur);
        assert_eq!(
            off.unwrap().unwrap().rebuys(),
            0,
            "a limit of no rebuys counts nothing"
        );
        let no_rebuy = PaymentTerms::parse(Some(30), None, Some(100), eur)
            .unwrap()
            .unwrap();
        assert_eq!(no_rebuy.rebuys(), 0);
        assert_eq!(PaymentTerms::parse(None, None, None, None).unwrap(), None);
        assert!(PaymentTerms::parse(None, Some(true), None, None).is_err());
        assert!(PaymentTerms::parse(None, None, Some(100), eur).is_err());
        assert!(PaymentTerms::parse(Some(0), None, Some(100), eur).is_err());
        assert!(PaymentTerms::parse(Some(MAX_PAY_WITHIN_S + 1), None, Some(100), eur).is_err());
        // A payment step needs a price: a whole one.
        assert!(PaymentTerms::parse(Some(30), None, None, None).is_err());
        assert!(PaymentTerms::parse(Some(30), None, Some(100), None).is_err());
        assert!(PaymentTerms::parse(Some(30), None, None, eur).is_err());
        for (amount, currency) in [
            (0, "EUR"),
            (MAX_PRICE_MINOR + 1, "EUR"),
            (1, "eur"),
            (1, "EU"),
            (1, "EURO"),
            (1, "E1R"),
        ] {
            assert!(
                PaymentTerms::parse(Some(30), None, Some(amount), Some(currency)).is_err(),
                "{amount} {currency}"
            );
        }
        let t = PaymentTerms::parse(Some(30), None, Some(1999), eur)
            .unwrap()
            .unwrap();
        assert_eq!((t.pay_within_ms, t.rebuy_after_close), (30_000, false));
        let price = t.price.unwrap();
        assert_eq!((price.amount_minor(), price.currency()), (1999, "EUR"));
        assert!(PaymentRef::parse("pi_3Nx:01-a.b_c").is_ok());
        for bad in ["", "a b", "é", &"x".repeat(129)] {
            assert!(PaymentRef::parse(bad).is_err(), "{bad:?}");
        }
        let c = ClosedOrder::parse("paid\n1700000000123\npi_1\nal ice").unwrap();
        assert_eq!(c.status, OrderStatus::Paid);
        assert_eq!(
            (c.pay_by_ms, c.payment_ref.as_str(), c.user.as_str()),
            (1_700_000_000_123, "pi_1", "al ice")
        );
        assert!(ClosedOrder::parse("confirmed\n1\n\nu").is_none());
        assert!(ClosedOrder::parse("expired\nx\n\nu").is_none());
        for st in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(st.as_str()), Some(st));
        }
        // lua/close.lua writes the states under the names protocol::close holds.
        use crate::protocol::close;
        assert_eq!(
            [close::PAID, close::CANCELLED, close::EXPIRED],
            [
                OrderStatus::Paid,
                OrderStatus::Cancelled,
                OrderStatus::Expired
            ]
            .map(OrderStatus::as_str)
        );
    }

    #[test]
    fn window_phases_are_half_open() {
        let w = SaleWindow::new(10, 20).unwrap();
        assert_eq!(w.phase(9), Phase::NotStarted);
        assert_eq!(w.phase(10), Phase::Open);
        assert_eq!(w.phase(19), Phase::Open);
        assert_eq!(w.phase(20), Phase::Ended);
        assert!(SaleWindow::new(20, 20).is_err());
    }
}

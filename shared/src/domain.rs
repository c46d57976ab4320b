//! Domain types, parsed once at the edge ("parse, don't validate").
//!
//! A value of one of these types is valid by construction: a [`VoucherId`] is a positive
//! 63-bit integer, a [`UserId`] is a non-empty string of at most 64 bytes without control
//! characters, a [`SaleWindow`] begins before it ends. Everything past the HTTP edge can
//! rely on that and never re-checks.

use std::fmt;
use std::str::FromStr;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

mod order;
mod room;
mod sale;
mod voucher;

pub use order::{AdmittedOrder, DeadLetter, ExistingOrder, StreamEntry};
pub use room::{
    DEFAULT_QUEUE_OPENS_BEFORE_S, ENTRY_TOKEN_TTL_MS, MAX_ENTRY_RATE_PER_S,
    MAX_QUEUE_OPENS_BEFORE_S, Standing, WaitingRoom,
};
pub use sale::{AdmitReply, Reopen, SaleState};
pub use voucher::{
    MAX_PAY_WITHIN_S, MAX_PRICE_MINOR, MAX_SALE_TIME_MS, MAX_STOCK, MAX_TITLE_CHARS, NewVoucher,
    PaymentTerms, Phase, Price, SaleWindow, Voucher,
};

/// Why an input was refused. The message is safe to show to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

fn invalid(msg: impl Into<String>) -> ValidationError {
    ValidationError(msg.into())
}

/// Parses a positive 63-bit decimal id: ids travel as decimal strings (JSON numbers lose
/// precision past 2^53) and must fit the Data API's signed `longValue`.
fn parse_positive_id(s: &str, what: &str) -> Result<i64, ValidationError> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!(
            "{what} must be a positive decimal integer"
        )));
    }
    match s.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid(format!(
            "{what} must be a positive decimal integer"
        ))),
    }
}

/// The id of a voucher (a sale), assigned by the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VoucherId(i64);

impl VoucherId {
    /// Wraps an id that came from the database; `None` unless positive.
    pub fn new(n: i64) -> Option<VoucherId> {
        (n > 0).then_some(VoucherId(n))
    }
    pub fn get(self) -> i64 {
        self.0
    }
}

impl FromStr for VoucherId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_positive_id(s, "voucher id").map(VoucherId)
    }
}

impl fmt::Display for VoucherId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The most stock buckets one voucher may have (see [`Bucket`]).
pub const MAX_BUCKETS: u16 = 16;

/// Admissions per second one bucket is planned for when an admin gives an expected peak
/// rate instead of a bucket count: two thirds of one ElastiCache Serverless slot's
/// ceiling on paper (about 15,000 admissions/s, docs/benchmarks.md, "One hot voucher
/// over stock buckets"), leaving room for the retries and lookups of a sale.
pub const PLANNED_ADMISSIONS_PER_BUCKET: i64 = 10_000;

/// One stock bucket of a voucher: a part of its stock with its own Redis keys, in a
/// hash slot of its own, so one hot voucher can use several cluster primaries.
///
/// Bucket 0 uses the voucher's own tag (`{42}`): a voucher with one bucket is exactly
/// the voucher of before. Bucket b >= 1 uses the tag `{42.b.salt}`, the salt chosen so
/// the buckets spread over the slot space ([`crate::keys::bucket_salt`]); that tag is
/// also how the bucket is written in the active set ([`fmt::Display`], [`FromStr`]). A
/// buyer always lands on the same bucket ([`Bucket::of_user`]), so that bucket's buyers
/// hash alone keeps one order per user per voucher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket {
    voucher: VoucherId,
    index: u16,
    salt: u16,
}

impl Bucket {
    /// Bucket `index` of a voucher of `buckets` buckets; `None` unless
    /// `index < buckets <= MAX_BUCKETS`.
    pub fn new(voucher: VoucherId, index: u16, buckets: u16) -> Option<Bucket> {
        (index < buckets && buckets <= MAX_BUCKETS).then(|| Bucket {
            voucher,
            index,
            salt: crate::keys::bucket_salt(voucher, index, buckets),
        })
    }
    pub fn voucher(self) -> VoucherId {
        self.voucher
    }
    pub fn index(self) -> u16 {
        self.index
    }
    /// The bucket of `user` in a voucher of `buckets` buckets: FNV-1a (64-bit) of the
    /// user id modulo `buckets`. Fixed and documented (never the process's hasher): every
    /// instance, and every later run, must send a buyer to the same bucket.
    pub fn of_user(voucher: VoucherId, buckets: u16, user: &str) -> Bucket {
        let buckets = buckets.clamp(1, MAX_BUCKETS);
        if buckets == 1 {
            return Bucket::from(voucher);
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in user.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let index = (h % u64::from(buckets)) as u16;
        Bucket::new(voucher, index, buckets).unwrap_or(Bucket::from(voucher))
    }
    /// The units this bucket starts with when a voucher of `stock` units has `buckets`
    /// buckets: the stock split as evenly as it goes, the first buckets one more.
    pub fn share(self, stock: i64, buckets: u16) -> i64 {
        let k = i64::from(buckets.clamp(1, MAX_BUCKETS));
        stock / k + i64::from(i64::from(self.index) < stock % k)
    }
    /// Every bucket of a voucher of `buckets` buckets, bucket 0 first.
    pub fn all(voucher: VoucherId, buckets: u16) -> impl Iterator<Item = Bucket> {
        let buckets = buckets.clamp(1, MAX_BUCKETS);
        (0..buckets).filter_map(move |index| Bucket::new(voucher, index, buckets))
    }
}

impl From<VoucherId> for Bucket {
    fn from(voucher: VoucherId) -> Bucket {
        Bucket {
            voucher,
            index: 0,
            salt: 0,
        }
    }
}

impl FromStr for Bucket {
    type Err = ValidationError;
    /// `42` (bucket 0) or `42.3.17` (bucket 3, salt 17): the bucket's hash tag.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split('.').collect();
        match parts.as_slice() {
            [v] => Ok(Bucket::from(v.parse::<VoucherId>()?)),
            [v, b, salt] => {
                let number = |t: &str| {
                    (t == "0" || !t.starts_with('0'))
                        .then(|| t.parse::<u16>().ok())
                        .flatten()
                };
                let index = number(b)
                    .filter(|i| (1..MAX_BUCKETS).contains(i))
                    .ok_or_else(|| invalid(format!("bucket must be 1..{MAX_BUCKETS}")))?;
                let salt = number(salt).ok_or_else(|| invalid("bucket salt must be a number"))?;
                Ok(Bucket {
                    voucher: v.parse()?,
                    index,
                    salt,
                })
            }
            _ => Err(invalid(
                "a bucket is <voucher> or <voucher>.<bucket>.<salt>",
            )),
        }
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            0 => write!(f, "{}", self.voucher),
            b => write!(f, "{}.{b}.{}", self.voucher, self.salt),
        }
    }
}

/// The id of an order: time-prefixed, see [`crate::order_id`] for the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderId(i64);

impl OrderId {
    pub fn new(n: i64) -> Option<OrderId> {
        (n > 0).then_some(OrderId(n))
    }
    pub fn get(self) -> i64 {
        self.0
    }
}

impl FromStr for OrderId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_positive_id(s, "order id").map(OrderId)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A buyer, as named by the `sub` claim of a verified token (never by a request body).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(String);

/// The longest `sub` the contract accepts, in bytes (it is a `VARCHAR(64)` column).
pub const MAX_USER_ID_BYTES: usize = 64;

impl UserId {
    pub fn parse(s: &str) -> Result<UserId, ValidationError> {
        if s.is_empty() {
            return Err(invalid("user id is empty"));
        }
        if s.len() > MAX_USER_ID_BYTES {
            return Err(invalid("user id is longer than 64 bytes"));
        }
        if s.chars().any(char::is_control) {
            return Err(invalid("user id contains control characters"));
        }
        Ok(UserId(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Unix time in milliseconds: the one clock unit shared by Redis, Lua and the handlers.
pub type UnixMillis = i64;

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> UnixMillis {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Parses an RFC 3339 timestamp into Unix milliseconds.
pub fn parse_rfc3339_millis(s: &str, what: &str) -> Result<UnixMillis, ValidationError> {
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|_| invalid(format!("{what} must be an RFC 3339 timestamp")))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Formats Unix milliseconds as RFC 3339 in UTC: `2026-11-22T10:00:00.123Z`, with the
/// fraction's trailing zeros dropped (`…:00.5Z`, and `…:00Z` on a whole second), as the
/// `time` crate writes it; `docs/openapi.yaml`'s `Timestamp` describes the same form.
pub fn format_rfc3339_millis(ms: UnixMillis) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let t = t
        .replace_nanosecond((ms.rem_euclid(1000) as u32) * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_default()
}

/// What a buyer sees of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Admitted by Redis, not yet written to the database.
    Pending,
    /// In the database, holding a unit of stock.
    Confirmed,
    /// Admitted by Redis but refused by the database (its stock could not cover it).
    Rejected,
    /// Vouchers with a payment step: holding a unit until paid or its deadline passes.
    AwaitingPayment,
    /// Paid before the deadline: keeps its unit.
    Paid,
    /// Cancelled by the buyer before paying: its unit went back on sale.
    Cancelled,
    /// Not paid by the deadline: its unit went back on sale.
    Expired,
}

impl OrderStatus {
    /// Every status (the database's ENUM holds all but `pending`).
    pub const ALL: [OrderStatus; 7] = [
        OrderStatus::Pending,
        OrderStatus::Confirmed,
        OrderStatus::Rejected,
        OrderStatus::AwaitingPayment,
        OrderStatus::Paid,
        OrderStatus::Cancelled,
        OrderStatus::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::Rejected => "rejected",
            OrderStatus::AwaitingPayment => "awaiting_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Expired => "expired",
        }
    }

    /// The status a name spells, as the database and the API write it.
    pub fn parse(s: &str) -> Option<OrderStatus> {
        OrderStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the order gave its unit back (cancelled or expired).
    pub fn returned_unit(self) -> bool {
        matches!(self, OrderStatus::Cancelled | OrderStatus::Expired)
    }
}

/// How an order of a voucher with a payment step was closed, as `lua/close.lua` decided
/// it, once: the state, the deadline, the payment reference (paid only) and the buyer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedOrder {
    /// [`OrderStatus::Paid`], [`OrderStatus::Cancelled`] or [`OrderStatus::Expired`].
    pub status: OrderStatus,
    pub pay_by_ms: UnixMillis,
    pub payment_ref: String,
    pub user: String,
}

impl ClosedOrder {
    /// Parses the value the close script writes: `<state>\n<deadline>\n<ref>\n<user>`.
    pub fn parse(value: &str) -> Option<ClosedOrder> {
        let mut it = value.splitn(4, '\n');
        let status = OrderStatus::parse(it.next()?)?;
        if !matches!(
            status,
            OrderStatus::Paid | OrderStatus::Cancelled | OrderStatus::Expired
        ) {
            return None;
        }
        Some(ClosedOrder {
            status,
            pay_by_ms: it.next()?.parse().ok()?,
            payment_ref: it.next()?.to_string(),
            user: it.next()?.to_string(),
        })
    }
}

/// A payment reference (the payment provider's id, used as the idempotency key of
/// `POST /orders/{id}/pay`): 1 to 128 characters of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRef(String);

impl PaymentRef {
    pub fn parse(s: &str) -> Result<PaymentRef, ValidationError> {
        let ok = (1..=128).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
        if !ok {
            return Err(invalid(
                "the payment reference must be 1 to 128 characters of A-Z a-z 0-9 . _ : -",
            ));
        }
        Ok(PaymentRef(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the admission script decided for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Stock taken, buyer recorded, order queued.
    Admitted {
        order_id: OrderId,
        stock_after: i64,
    },
    /// Redis has no sale for this voucher (never preloaded, or lost).
    NotLoaded,
    NotStarted,
    Ended,
    SoldOut,
    /// The user already holds `order_id` for this voucher.
    AlreadyPurchased {
        order_id: OrderId,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_name_parse_split_and_place_users() {
        let v = VoucherId::new(42).unwrap();
        let b3 = Bucket::new(v, 3, 4).unwrap();
        assert_eq!(Bucket::from(v).to_string(), "42");
        assert!(b3.to_string().starts_with("42.3."));
        assert_eq!(b3.to_string().parse::<Bucket>().unwrap(), b3);
        assert_eq!("42".parse::<Bucket>().unwrap(), Bucket::from(v));
        for bad in [
            "42.0.1", "42.3", "42.03.1", "42.16.0", "42.1.01", "42.", ".1.1", "0.1.1", "42.x.1",
            "42.1.1.1",
        ] {
            assert!(bad.parse::<Bucket>().is_err(), "{bad}");
        }
        assert!(Bucket::new(v, 4, 4).is_none());
        // From an expected peak: one bucket per 10,000 admissions/s, 1..=16, <= stock.
        let new = |stock| {
            NewVoucher::parse(
                "t",
                stock,
                "2026-01-01T00:00:00Z",
                "2999-01-01T00:00:00Z",
                0,
            )
            .unwrap()
        };
        let k = |stock, peak| new(stock).with_buckets(None, Some(peak)).map(|n| n.buckets);
        assert_eq!(k(1_000, 1), Ok(1));
        assert_eq!(k(1_000, 10_000), Ok(1));
        assert_eq!(k(1_000, 10_001), Ok(2));
        assert_eq!(k(1_000, 45_000), Ok(5));
        assert_eq!(k(1_000, 10_000_000), Ok(16));
        assert_eq!(k(3, 90_000), Ok(3));
        assert!(k(1_000, 0).is_err());
        assert!(new(1_000).with_buckets(Some(2), Some(20_000)).is_err());
        assert!(new(10).with_buckets(Some(11), None).is_err());
        assert_eq!(
            new(1_000).with_buckets(Some(16), None).map(|n| n.buckets),
            Ok(16)
        );
        assert!(Bucket::new(v, 1, MAX_BUCKETS + 1).is_none());
        // FNV-1a 64 of "u1" is 0x08c47b07b56747f3 (a fixed hash: any language can place
        // a buyer the same way).
        assert_eq!(
            Bucket::of_user(v, 16, "u1").index(),
            (0x08c4_7b07_b567_47f3_u64 % 16) as u16
        );
        assert_eq!(
            Bucket::of_user(v, 16, "u1"),
            Bucket::new(v, Bucket::of_user(v, 16, "u1").index(), 16).unwrap()
        );
        assert_eq!(Bucket::of_user(v, 1, "anyone"), Bucket::from(v));
        let mut seen = [0u32; 3];
        for u in 0..30_000 {
            seen[usize::from(Bucket::of_user(v, 3, &format!("user-{u}")).index())] += 1;
        }
        assert!(seen.iter().all(|n| (9_000..11_000).contains(n)), "{seen:?}");
        for (stock, k) in [(1000, 3), (7, 7), (10, 4), (1, 1)] {
            let shares: Vec<i64> = Bucket::all(v, k).map(|b| b.share(stock, k)).collect();
            assert_eq!(shares.len(), usize::from(k));
            assert_eq!(shares.iter().sum::<i64>(), stock);
            assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn ids_accept_only_positive_decimals_that_fit_i64() {
        assert_eq!("42".parse::<VoucherId>().unwrap().get(), 42);
        assert_eq!(
            "9223372036854775807".parse::<OrderId>().unwrap().get(),
            i64::MAX
        );
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1e3",
            " 1",
            "9223372036854775808",
            "12345678901234567890",
            "abc",
            "1.0",
        ] {
            assert!(bad.parse::<VoucherId>().is_err(), "{bad:?} parsed");
        }
    }

    proptest::proptest! {
        // Any path segment a caller can send: parsing never panics, and what parses is
        // exactly the positive i64 it spells.
        #[test]
        fn any_string_parses_to_a_positive_id_or_an_error(s in "\\PC{0,24}|[0-9+-]{0,21}") {
            match s.parse::<OrderId>() {
                Ok(id) => {
                    proptest::prop_assert!(id.get() > 0);
                    proptest::prop_assert_eq!(id.get().to_string(), s.trim_start_matches('0'));
                }
                Err(e) => proptest::prop_assert!(!e.0.is_empty()),
            }
            proptest::prop_assert_eq!(s.parse::<VoucherId>().is_ok(), s.parse::<OrderId>().is_ok());
        }

        #[test]
        fn every_i64_spelled_in_decimal_parses_iff_positive(n in proptest::num::i64::ANY) {
            proptest::prop_assert_eq!(n.to_string().parse::<OrderId>().ok().map(OrderId::get), (n > 0).then_some(n));
            let wider = i128::from(n) + i128::from(u64::MAX);
            proptest::prop_assert!(wider.to_string().parse::<OrderId>().is_err() || wider <= i128::from(i64::MAX));
        }
    }

    #[test]
    fn user_ids_are_bounded_and_printable() {
        assert!(UserId::parse("alice").is_ok());
        assert!(UserId::parse(&"x".repeat(64)).is_ok());
        assert!(UserId::parse(&"x".repeat(65)).is_err());
        assert!(UserId::parse("").is_err());
        assert!(UserId::parse("a\nb").is_err());
        // 64 bytes, not 64 characters: 22 three-byte characters are 66 bytes.
        assert!(UserId::parse(&"€".repeat(22)).is_err());
    }

    #[test]
    fn rfc3339_round_trips_with_milliseconds() {
        let ms = parse_rfc3339_millis("2026-11-22T10:00:00.123Z", "t").unwrap();
        assert_eq!(format_rfc3339_millis(ms), "2026-11-22T10:00:00.123Z");
        // Trailing zeros of the fraction are dropped (the contract's Timestamp form).
        assert_eq!(format_rfc3339_millis(ms - 123), "2026-11-22T10:00:00Z");
        assert_eq!(format_rfc3339_millis(ms + 377), "2026-11-22T10:00:00.5Z");
    }
}

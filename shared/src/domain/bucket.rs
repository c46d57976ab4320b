//! The stock buckets of a voucher: how many a voucher may have, which one a buyer
//! belongs to, how the stock is split between them and how a bucket is written.
//!
//! The placement of a buyer ([`Bucket::of_user`]) and the split of the stock
//! ([`Bucket::share`]) are fixed functions: every instance, and every later run, must
//! send a buyer to the same bucket and start each bucket with the same units.

use std::fmt;
use std::str::FromStr;

use super::ids::{ValidationError, VoucherId, invalid};

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
            salt: crate::keys::slots::bucket_salt(voucher, index, buckets),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NewVoucher;

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
}

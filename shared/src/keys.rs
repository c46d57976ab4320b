//! Redis key names.
//!
//! Invariant 4 (cluster safety) lives here: every key of one voucher carries the hash tag
//! `{<voucher id>}`, so the admission script, which receives all of them in `KEYS`, runs
//! on a single cluster slot. A voucher with stock buckets has one such set of
//! keys per bucket: bucket 0 the voucher's own tag, bucket b the tag `{<voucher id>.b}`
//! (see [`Bucket`]). Nothing else in the code builds a key by hand.

use crate::domain::{Bucket, OrderId, VoucherId};

/// The consumer group that drains every orders stream.
pub const DRAIN_GROUP: &str = "drainers";

/// The set of buckets whose streams the drainer visits: voucher ids (bucket 0) and
/// `<voucher id>.<bucket>` (see [`Bucket`]'s `Display`).
pub const ACTIVE_VOUCHERS: &str = "seckill:active";

/// The keys of one voucher's sale, all in the slot of `{<voucher id>}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoucherKeys {
    /// Hash: `stock`, `total`, `begins_ms`, `ends_ms`.
    pub sale: String,
    /// Hash: user id → order id.
    pub buyers: String,
    /// Stream of admitted orders.
    pub orders: String,
    /// Stream of dead letters.
    pub dead: String,
    /// Hash: open drainer transaction id → `<consumer> <begun unix ms>`, so a drainer
    /// can roll back the transaction (and free the row lock) of a run that was killed.
    pub drain_tx: String,
    /// String: held (SET NX PX) by the one instance repairing a lost sale.
    pub repair: String,
    /// Sorted set, vouchers with a payment step only: `<order id>\n<user id>` scored by
    /// its payment deadline (unix ms); an order leaves it when it is closed.
    pub deadlines: String,
    /// Hash: order id → how it was closed (`lua/close.lua`, written once per order).
    pub closed: String,
    /// Set: ids of closed orders whose close the database has not recorded yet.
    pub to_settle: String,
    /// Hash, bucketed vouchers: transfer id → `<recipient bucket> <units>`, units this
    /// bucket gave away that the recipient may not have received yet (`lua/give.lua`).
    pub transfers: String,
    /// Hash, bucketed vouchers: transfer id → units, the transfers this bucket received
    /// (`lua/take.lua`): a transfer is added to the stock once, however often retried.
    pub received: String,
}

impl VoucherKeys {
    /// The keys of one bucket (a voucher id is its bucket 0).
    pub fn new(bucket: impl Into<Bucket>) -> VoucherKeys {
        let tag = format!("seckill:{{{}}}", bucket.into());
        VoucherKeys {
            sale: format!("{tag}:sale"),
            buyers: format!("{tag}:buyers"),
            orders: format!("{tag}:orders"),
            dead: format!("{tag}:dead"),
            drain_tx: format!("{tag}:drain_tx"),
            repair: format!("{tag}:repair"),
            deadlines: format!("{tag}:deadlines"),
            closed: format!("{tag}:closed"),
            to_settle: format!("{tag}:to_settle"),
            transfers: format!("{tag}:transfers"),
            received: format!("{tag}:received"),
        }
    }
}

/// String, bucketed vouchers, in bucket 0's slot: set once every bucket was found
/// empty with no transfer open, so instances stop asking each bucket in turn; deleted
/// when a unit comes back and expiring on its own (a mark set just after a
/// return would otherwise stay).
pub fn sold_out(voucher: VoucherId) -> String {
    format!("seckill:{{{voucher}}}:sold_out")
}

/// Hash, vouchers with a waiting room, in bucket 0's slot: user id -> position in the
/// queue (`lua/queue.lua`).
pub fn queue(voucher: VoucherId) -> String {
    format!("seckill:{{{voucher}}}:queue")
}

impl VoucherKeys {
    /// The keys `lua/admit.lua` takes, in its `KEYS` order (sale, buyers, orders,
    /// deadlines), and only those: the admission runs on every purchase attempt, and
    /// [`VoucherKeys::new`] formats every key of the voucher.
    pub fn admission(bucket: impl Into<Bucket>) -> [String; 4] {
        let tag = format!("seckill:{{{}}}:", bucket.into());
        let key = |name: &str| {
            let mut k = String::with_capacity(tag.len() + name.len());
            k.push_str(&tag);
            k.push_str(name);
            k
        };
        [key("sale"), key("buyers"), key("orders"), key("deadlines")]
    }
}

/// The member of an open order in its voucher's `deadlines` set: `<order id>\n<user id>`
/// (`lua/admit.lua` writes it, `lua/close.lua` finds an order only with its buyer's id).
pub fn deadline_member(order: OrderId, user: &str) -> String {
    format!("{order}\n{user}")
}

/// The keys of order-id leasing (`lua/lease.lua`), all in the slot of `{ids}`: the lease
/// clock, and the block map of the UTC day `yyyymmdd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdKeys {
    /// Hash: `ms`, `slot` (the latest lease stamp), `seen` (the server's clock then).
    pub clock: String,
    /// Hash: `<ms>:<slot>` (a lease stamp of that day) → voucher id.
    pub blocks: String,
}

impl IdKeys {
    pub fn for_day(yyyymmdd: &str) -> IdKeys {
        IdKeys {
            clock: "seckill:{ids}:clock".to_string(),
            blocks: format!("seckill:{{ids}}:blocks:{yyyymmdd}"),
        }
    }
}

/// How many hash slots a Redis Cluster has.
pub const SLOTS: u16 = 16_384;

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag, modulo [`SLOTS`].
pub fn slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for b in hash_tag(key).bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// How far (in slots) a bucket may sit from its place in the lattice
/// ([`bucket_salt`]): small enough that buckets stay at least `SLOTS / k - 64` apart
/// (more than `SLOTS / n` for every k < n <= 16), large enough that a salt is found in
/// about `SLOTS / 64` = 256 tries.
const BUCKET_WINDOW: u32 = 64;

/// The salt in the hash tag of bucket `index` (>= 1) of a voucher of `buckets` buckets
/// (`{<voucher>.<index>.<salt>}`, see [`Bucket`]): the smallest one that puts bucket b
/// within [`BUCKET_WINDOW`] slots of `home + b * SLOTS / k` (mod `SLOTS`), home being the
/// slot of the voucher's own tag (bucket 0). The k buckets then form a lattice of step
/// `SLOTS / k`, each window leaning towards the middle of its k-th, so on a cluster
/// whose n primaries own equal contiguous slot ranges (what `--cluster create` makes):
/// - n = k: one bucket per primary (each bucket stays in its own k-th);
/// - n > k: no two buckets on one primary (they are more than `SLOTS / n` apart);
/// - n < k: as even as k buckets over n primaries go.
///
/// Random tags would put two of three buckets on one of three primaries more often than
/// not. The search (about 256 CRC16s) runs once per bucket and process (memoised).
pub fn bucket_salt(voucher: VoucherId, index: u16, buckets: u16) -> u16 {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    /// (voucher, index, buckets) → salt.
    type Salts = HashMap<(VoucherId, u16, u16), u16>;
    static FOUND: LazyLock<Mutex<Salts>> = LazyLock::new(Mutex::default);
    if index == 0 || buckets <= 1 {
        return 0;
    }
    let memo = |m: &Mutex<HashMap<_, u16>>| {
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(voucher, index, buckets))
            .copied()
    };
    if let Some(salt) = memo(&FOUND) {
        return salt;
    }
    let (k, slots) = (u32::from(buckets), u32::from(SLOTS));
    let home = u32::from(slot(&voucher.to_string()));
    // Lean inwards: a home in the lower half of its k-th takes windows above each
    // lattice point, one in the upper half windows below, so no window crosses into the
    // next k-th (every lattice point sits at home's offset in its own k-th).
    let offset = home * k % slots;
    let upward = offset < slots / 2;
    let target = (home + (u32::from(index) * slots).div_ceil(k)) % slots;
    let near = |s: u32| {
        let d = if upward {
            (s + slots - target) % slots
        } else {
            (target + slots - s) % slots
        };
        d < BUCKET_WINDOW
    };
    let salt = (0..u16::MAX)
        .find(|salt| near(u32::from(slot(&format!("{voucher}.{index}.{salt}")))))
        .unwrap_or(0);
    FOUND
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((voucher, index, buckets), salt);
    salt
}

/// The hash tag of a key: what Redis Cluster hashes to pick its slot.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_keys_of_a_voucher_share_one_hash_tag() {
        let k = VoucherKeys::new(VoucherId::new(42).unwrap());
        for key in [
            &k.sale,
            &k.buyers,
            &k.orders,
            &k.dead,
            &k.drain_tx,
            &k.repair,
            &k.deadlines,
            &k.closed,
            &k.to_settle,
            &k.transfers,
            &k.received,
        ] {
            assert_eq!(hash_tag(key), "42", "{key}");
        }
        assert_eq!(hash_tag(&sold_out(VoucherId::new(42).unwrap())), "42");
        let bucket = Bucket::new(VoucherId::new(42).unwrap(), 3, 4).unwrap();
        let b = VoucherKeys::new(bucket);
        assert_eq!(b.orders, format!("seckill:{{{bucket}}}:orders"));
        assert_eq!(hash_tag(&b.received), bucket.to_string());
        assert!(bucket.to_string().starts_with("42.3."));
        assert_eq!(k.orders, "seckill:{42}:orders");
        let admission = VoucherKeys::admission(VoucherId::new(42).unwrap());
        assert_eq!(
            admission,
            [
                k.sale.clone(),
                k.buyers.clone(),
                k.orders.clone(),
                k.deadlines.clone()
            ]
        );
        let s = IdKeys::for_day("20261122");
        assert_eq!(hash_tag(&s.clock), hash_tag(&s.blocks));
        assert_eq!(s.blocks, "seckill:{ids}:blocks:20261122");
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot("123456789"), 0x31c3);
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
    }

    /// The node owning `slot` when `n` primaries own equal contiguous ranges, as
    /// `redis-cli --cluster create` splits them.
    fn even_owner(slot: u16, n: u32) -> u32 {
        let s = u32::from(SLOTS);
        (0..n)
            .find(|i| u32::from(slot) < ((i + 1) * s).div_ceil(n))
            .unwrap_or(n - 1)
    }

    #[test]
    fn buckets_land_on_distinct_primaries_of_an_even_split() {
        for id in (1..120).chain([123_456, 9_876_543_210]) {
            let v = VoucherId::new(id).unwrap();
            for k in 2..=16u16 {
                let slots: Vec<u16> = Bucket::all(v, k)
                    .map(|b| slot(&VoucherKeys::new(b).sale))
                    .collect();
                assert_eq!(slots.len(), usize::from(k));
                for n in u32::from(k)..=16 {
                    let owners: std::collections::BTreeSet<u32> =
                        slots.iter().map(|s| even_owner(*s, n)).collect();
                    assert_eq!(
                        owners.len(),
                        usize::from(k),
                        "voucher {id}, {k} buckets on {n} primaries: slots {slots:?}"
                    );
                }
            }
        }
    }

    /// Bucket keys are derived, never stored: a change to [`bucket_salt`] renames the
    /// keys of every live bucketed sale (its buyers and stock would vanish from view).
    /// These values pin it; change them only with a migration of live sales.
    #[test]
    fn bucket_salts_never_change() {
        let salt = |v: i64, i: u16, k: u16| bucket_salt(VoucherId::new(v).unwrap(), i, k);
        assert_eq!(
            [
                salt(1, 1, 2),
                salt(42, 1, 3),
                salt(42, 2, 3),
                salt(777, 15, 16)
            ],
            [106, 267, 49, 1]
        );
        assert_eq!(salt(42, 0, 3), 0);
    }

    #[test]
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("a{b}c"), "b");
        assert_eq!(hash_tag("a{}c"), "a{}c");
        assert_eq!(hash_tag("abc"), "abc");
        assert_eq!(hash_tag("{x}{y}"), "x");
    }
}

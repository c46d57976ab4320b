//! Redis key names.
//!
//! Invariant 4 (cluster safety) lives here: every key of one voucher carries the hash tag
//! `{<voucher id>}`, so the admission script, which receives all of them in `KEYS`, runs
//! on a single cluster slot. A voucher with stock buckets has one such set of
//! keys per bucket: bucket 0 the voucher's own tag, bucket b the tag `{<voucher id>.b}`
//! (see [`Bucket`]). Nothing else in the code builds a key by hand.
//!
//! The cluster slot of a key and the salts of bucket tags are in `slots`, re-exported
//! here.

pub(crate) mod slots;

pub use slots::{SLOTS, bucket_salt, hash_tag, slot};

use crate::domain::{Bucket, OrderId, VoucherId};

/// The consumer group that drains every orders stream.
pub const DRAIN_GROUP: &str = "drainers";

/// Hash: open drainer transaction id → `<consumer> <begun unix ms>`, for the group
/// transactions that write many small sales at once: recorded once here rather than in
/// each voucher's `drain_tx`, and read beside it by a run that finds a row held.
pub const DRAIN_GROUP_TX: &str = "seckill:drain_group_tx";

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
    /// String: how far a repair that stopped part-way got (its record, written after
    /// every page it read), so the next request goes on from there.
    pub repair_progress: String,
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
    /// Hash, payment step: order id → the deadline it was given, for an open order whose
    /// expiry (its score in `deadlines`) a checkout moved past it (`lua/grace.lua`).
    pub grace: String,
    /// Hash, vouchers that let a buyer buy again: user id → their orders closed unpaid
    /// (`lua/close.lua`), against the voucher's rebuy limit.
    pub rebuys: String,
    /// Sorted set, vouchers with a waiting room: user id → when their offer of a returned
    /// unit lapses (bucket 0's is [`offers`]; another bucket's holds the offers that
    /// moved there with their unit, `lua/take.lua`).
    pub offers: String,
}

impl VoucherKeys {
    /// The keys of one bucket (a voucher id is its bucket 0).
    pub fn new(bucket: impl Into<Bucket>) -> VoucherKeys {
        let key = key_maker(bucket);
        VoucherKeys {
            sale: key("sale"),
            buyers: key("buyers"),
            orders: key("orders"),
            dead: key("dead"),
            drain_tx: key("drain_tx"),
            repair: key("repair"),
            repair_progress: key("repair_progress"),
            deadlines: key("deadlines"),
            closed: key("closed"),
            to_settle: key("to_settle"),
            transfers: key("transfers"),
            received: key("received"),
            grace: key("grace"),
            rebuys: key("rebuys"),
            offers: key("offers"),
        }
    }

    /// Every key of the bucket, for whoever deletes or lists a sale whole (the bench's
    /// clean-up, the tests).
    pub fn all(&self) -> [&str; 15] {
        [
            &self.sale,
            &self.buyers,
            &self.orders,
            &self.dead,
            &self.drain_tx,
            &self.repair,
            &self.repair_progress,
            &self.deadlines,
            &self.closed,
            &self.to_settle,
            &self.transfers,
            &self.received,
            &self.grace,
            &self.rebuys,
            &self.offers,
        ]
    }
}

/// Makes the keys of one bucket: its tag `seckill:{<bucket>}:` formatted once, each
/// name appended to it. Not a `format!` per key: the drainer makes a voucher's keys for
/// every small sale it probes and acks (10,000 in a run), and twelve `format!` calls a
/// sale were 4 % of its process's CPU there (perf, 2026-11-28).
fn key_maker(bucket: impl Into<Bucket>) -> impl Fn(&str) -> String {
    let tag = format!("seckill:{{{}}}:", bucket.into());
    move |name| {
        let mut k = String::with_capacity(tag.len() + name.len());
        k.push_str(&tag);
        k.push_str(name);
        k
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

/// String, vouchers with a waiting room, in bucket 0's slot: held (SET NX PX) by the one
/// instance rebuilding the queue from the database (seckill-http's `queue`).
pub fn queue_restore(voucher: VoucherId) -> String {
    format!("seckill:{{{voucher}}}:queue_restore")
}

/// Sorted set, vouchers with a waiting room, in bucket 0's slot: user id scored by when
/// their offer of a returned unit lapses (`lua/queue.lua` writes it, `lua/admit.lua` uses
/// an offer up, `lua/give.lua` moves one with its unit to the buyer's own bucket, whose
/// [`VoucherKeys::offers`] then holds it).
pub fn offers(voucher: VoucherId) -> String {
    format!("seckill:{{{voucher}}}:offers")
}

/// Sorted set, as [`offers`]: user id scored by queue position, the served buyers without
/// an order looking at a sale sold out to them (`lua/queue.lua`).
pub fn waiters(voucher: VoucherId) -> String {
    format!("seckill:{{{voucher}}}:waiters")
}

/// Hash, as [`offers`]: user id -> when they last looked as a waiter (unix ms), or
/// `passed` once an offer of theirs lapsed (`lua/queue.lua`).
pub fn looked(voucher: VoucherId) -> String {
    format!("seckill:{{{voucher}}}:looked")
}

impl VoucherKeys {
    /// The keys `lua/admit.lua` takes, in its `KEYS` order (sale, buyers, orders,
    /// deadlines, closed, offers), and only those: the admission runs on every purchase
    /// attempt, and [`VoucherKeys::new`] formats every key of the voucher.
    pub fn admission(bucket: impl Into<Bucket>) -> [String; 6] {
        let key = key_maker(bucket);
        [
            key("sale"),
            key("buyers"),
            key("orders"),
            key("deadlines"),
            key("closed"),
            key("offers"),
        ]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_keys_of_a_voucher_share_one_hash_tag() {
        let k = VoucherKeys::new(VoucherId::new(42).unwrap());
        for key in k.all() {
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
                k.deadlines.clone(),
                k.closed.clone(),
                offers(VoucherId::new(42).unwrap())
            ]
        );
        for key in [offers, waiters, looked, queue, queue_restore] {
            assert_eq!(hash_tag(&key(VoucherId::new(42).unwrap())), "42");
        }
        let s = IdKeys::for_day("20261122");
        assert_eq!(hash_tag(&s.clock), hash_tag(&s.blocks));
        assert_eq!(s.blocks, "seckill:{ids}:blocks:20261122");
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
}

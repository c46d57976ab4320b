//! Redis key names.
//!
//! Invariant 4 (cluster safety) lives here: every key of one voucher carries the hash tag
//! `{<voucher id>}`, so the admission script, which receives all of them in `KEYS`, runs
//! on a single cluster slot. Nothing else in the code builds a key by hand.

use crate::domain::{OrderId, VoucherId};

/// The consumer group that drains every orders stream.
pub const DRAIN_GROUP: &str = "drainers";

/// The set of voucher ids whose streams the drainer visits.
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
}

impl VoucherKeys {
    pub fn new(voucher: VoucherId) -> VoucherKeys {
        let tag = format!("seckill:{{{voucher}}}");
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
        }
    }
}

impl VoucherKeys {
    /// The keys `lua/admit.lua` takes, in its `KEYS` order (sale, buyers, orders,
    /// deadlines), and only those: the admission runs on every purchase attempt, and
    /// [`VoucherKeys::new`] formats every key of the voucher.
    pub fn admission(voucher: VoucherId) -> [String; 4] {
        let tag = format!("seckill:{{{voucher}}}:");
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
        ] {
            assert_eq!(hash_tag(key), "42", "{key}");
        }
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
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("a{b}c"), "b");
        assert_eq!(hash_tag("a{}c"), "a{}c");
        assert_eq!(hash_tag("abc"), "abc");
        assert_eq!(hash_tag("{x}{y}"), "x");
    }
}

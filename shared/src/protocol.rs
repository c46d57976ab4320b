//! What the Rust side and the Lua scripts in `lua/` say to each other: the scripts'
//! result codes, the fields of the orders stream and of dead letters, and the fields of
//! the sale hash. (The key names themselves are [`crate::keys`].)
//!
//! Each script opens with one block of `local NAME = value` lines naming what it shares
//! with Rust, and its body uses those names, never the bare values. This module holds the
//! same names and values, and its test reads every script (`include_str!`) and checks
//! that the two agree, both ways: a value changed, a name added or dropped on either side
//! fails the build's tests instead of a sale.

/// `lua/admit.lua`: the first element of its reply table.
pub mod admit {
    /// Admitted now: stock taken, buyer recorded, order appended to the stream. The
    /// script answers it with a bare integer (the stock left), not a table; this code
    /// names it on the Rust side only.
    pub const ADMITTED: i64 = 0;
    /// No sale hash: never preloaded, or Redis lost it.
    pub const NOT_LOADED: i64 = 1;
    pub const NOT_STARTED: i64 = 2;
    pub const ENDED: i64 = 3;
    pub const SOLD_OUT: i64 = 4;
    /// The buyer already holds an order; the reply's detail is its id.
    pub const ALREADY_BOUGHT: i64 = 5;
    /// A late copy of an attempt that a copy sent again (`ARGV[3]` `again`) already
    /// decided: nothing written.
    pub const SUPERSEDED: i64 = 6;
    /// What a resend passes as `ARGV[3]`.
    pub const AGAIN: &str = "again";
    /// The sale hash field that marks an order id decided by a resend: this prefix and
    /// the order id.
    pub const AGAIN_PREFIX: &str = "again:";
}

/// `lua/preload.lua`: its reply.
pub mod preload {
    /// The sale hash was created.
    pub const CREATED: i64 = 1;
    /// The sale hash was there already (live stock, left alone).
    pub const ALREADY_LIVE: i64 = 0;
    /// The buyers hash holds fewer buyers than the database settled; nothing written.
    pub const BUYERS_LOST: i64 = -1;
}

/// `lua/close.lua`: its actions (`ARGV[1]`) and the states of a closed order (the first
/// line of the value it returns).
pub mod close {
    pub const PAY: &str = "pay";
    pub const CANCEL: &str = "cancel";
    pub const EXPIRE_DUE: &str = "expire_due";
    pub const PAID: &str = "paid";
    pub const CANCELLED: &str = "cancelled";
    pub const EXPIRED: &str = "expired";
}

/// The member that keeps a voucher's deadlines set (score `+inf`, never due), closed
/// hash and to-settle set in existence: scripts name these keys, and a slot migration
/// refuses a script that names a key its source node lacks (`lua/preload.lua`,
/// `lua/probe.lua`). Never an order id.
pub const DEADLINES_SENTINEL: &str = "~";

/// `lua/give.lua` (first element of its reply) and `lua/take.lua` (its reply): moving
/// units between the stock buckets of one voucher.
pub mod transfer {
    /// The bucket's sale is not loaded: nothing moved.
    pub const NOT_LOADED: i64 = -1;
    /// `lua/take.lua`: the units were added now.
    pub const TAKEN: i64 = 1;
    /// `lua/take.lua`: this transfer had been received before.
    pub const ALREADY: i64 = 0;
    /// A transfer record's fourth word: a unit an order gave back in a bucket other
    /// than 0 of a sale with a waiting room, on its way to be held for the line in
    /// bucket 0 (`lua/close.lua`).
    pub const LINE: &str = "line";
    /// A transfer record's fourth word: a held unit going with its offer to the offered
    /// buyer's bucket (`lua/give.lua`), then `<lapses ms> <user>`.
    pub const OFFER: &str = "offer";
    /// `lua/take.lua`: how long a bucket's offers key outlives the offer it was last
    /// given, in ms (past any sale's retirement).
    pub const OFFERS_KEPT_MS: i64 = 86_400_000;
}

/// `lua/lease.lua`: the first element of a reply that leased nothing.
pub mod lease {
    /// The stamp falls on another UTC day than the key names; the second element is
    /// that day.
    pub const OTHER_DAY: i64 = -1;
}

/// `lua/dead_letter.lua`: its reply.
pub mod dead_letter {
    /// The dead letter was written and the entry acked.
    pub const WRITTEN: i64 = 1;
    /// The entry was no longer pending (finished elsewhere); nothing written.
    pub const NOT_PENDING: i64 = 0;
}

/// `lua/expire_sale.lua`: its reply.
pub mod expire_sale {
    /// The sale's keys now expire.
    pub const EXPIRING: i64 = 1;
    /// The stream still holds undrained orders; nothing changed.
    pub const UNDRAINED: i64 = 0;
}

/// `lua/restore_buyers.lua`: its mode (`ARGV[1]`) and whether closed orders free their
/// buyer (`ARGV[2]`).
pub mod restore_buyers {
    /// `ARGV[3..]` are user id, order id pairs from the database.
    pub const PAIRS: &str = "pairs";
    /// `ARGV[3]`, `ARGV[4]`: a page of the orders stream to take buyers from.
    pub const STREAM: &str = "stream";
}

/// Field names of an orders-stream entry and of a dead letter (`lua/dead_letter.lua` adds
/// the last four to the entry's own: `close` only to an order Redis had closed).
///
/// `lua/admit.lua` writes `order_id` and `user_id` only: the entry id is the admission
/// time and the key names the voucher. `voucher_id` and `admitted_ms` are in entries an
/// operator re-enqueues (`seckill reconcile --repair`: the admission time is older than
/// the new entry's id) and in entries written before admissions dropped them; the
/// drainer reads both shapes.
pub mod fields {
    pub const ORDER_ID: &str = "order_id";
    pub const USER_ID: &str = "user_id";
    /// Optional: when present, it must name the stream's voucher.
    pub const VOUCHER_ID: &str = "voucher_id";
    /// Optional: when present, the admission time instead of the entry id's.
    pub const ADMITTED_MS: &str = "admitted_ms";
    /// Added to a dead letter: the id of the entry in the orders stream.
    pub const SOURCE_ID: &str = "source_id";
    /// Added to a dead letter: why it was dead-lettered.
    pub const REASON: &str = "reason";
    /// Added to a dead letter: how many times the entry had been delivered.
    pub const DELIVERIES: &str = "deliveries";
    /// Added to a dead letter of an order Redis had closed (paid, cancelled or expired):
    /// the close as `lua/close.lua` wrote it, which a replay puts back.
    pub const CLOSE: &str = "close";
}

/// Field names of a voucher's sale hash (`seckill:{<voucher>}:sale`, written by
/// `lua/preload.lua`).
pub mod sale_fields {
    pub const STOCK: &str = "stock";
    pub const TOTAL: &str = "total";
    pub const BEGINS_MS: &str = "begins_ms";
    pub const ENDS_MS: &str = "ends_ms";
    /// The payment window in ms; present only for vouchers with a payment step.
    pub const PAY_MS: &str = "pay_ms";
    /// `1` when a buyer whose order was cancelled or expired may buy again.
    pub const REBUY: &str = "rebuy";
    /// The voucher's stock buckets; present only when more than one.
    pub const BUCKETS: &str = "buckets";
    /// The waiting room's entry rate per second; present only for a voucher with a room.
    pub const ROOM_RATE: &str = "room_rate";
    /// How many seconds before the start the room's queue opens (with `room_rate`).
    pub const ROOM_OPENS_S: &str = "room_opens_s";
    /// `1` once the sale's deadlines, closed and to-settle keys hold their sentinel
    /// (`lua/preload.lua`; `lua/probe.lua` makes them for a sale preloaded without it).
    pub const SENTINELS: &str = "sentinels";
    /// Units returned to a one-bucket sale with a waiting room, held for its line
    /// (`lua/close.lua`; [`super::line`]).
    pub const HELD: &str = "held";
    /// Until when (unix ms) every held unit waits for the line; after it, only those an
    /// offer holds.
    pub const HELD_UNTIL: &str = "held_until";
    /// The waiting room's last position given (`lua/queue.lua`); absent until the queue
    /// is known whole.
    pub const QUEUE_NEXT: &str = "queue_next";
}

/// The line for returned units (`lua/close.lua`, `lua/queue.lua`, `lua/admit.lua`).
pub mod line {
    /// How long a returned unit waits for the line before anyone may take it, in ms:
    /// twice the longest a waiter is told to wait before looking again.
    pub const HOLD_MS: i64 = 60_000;
    /// The `looked` hash's mark of a waiter whose offer lapsed: not offered again.
    pub const PASSED: &str = "passed";
    /// Waiters and lapsed offers one look goes through at most.
    pub const MOST: i64 = 32;
}

/// `lua/queue.lua`'s results.
pub mod queue {
    /// The caller holds a position (given now or before).
    pub const QUEUED: i64 = 0;
    /// Bucket 0's sale hash is absent.
    pub const NOT_LOADED: i64 = 1;
    /// The voucher has no waiting room.
    pub const NO_ROOM: i64 = 2;
    /// A join before the queue opens.
    pub const NOT_OPEN: i64 = 3;
    /// A join once the sale has ended.
    pub const ENDED: i64 = 4;
    /// A look by a caller who never joined.
    pub const NOT_JOINED: i64 = 5;
    /// The queue must be rebuilt from the database first (a new sale, or Redis lost it).
    pub const NEEDS_RESTORE: i64 = 6;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::VoucherId;
    use crate::keys::VoucherKeys;

    /// A value as a script's header spells it.
    fn num(v: i64) -> String {
        v.to_string()
    }
    fn text(v: &str) -> String {
        format!("'{v}'")
    }

    /// A script's file name, its text, and the names its header must hold (Lua name,
    /// Rust value).
    type Expected = (&'static str, &'static str, Vec<(&'static str, String)>);

    /// Every script in `lua/`.
    fn expected() -> Vec<Expected> {
        use fields as f;
        use sale_fields as s;
        vec![
            (
                "admit.lua",
                include_str!("../../lua/admit.lua"),
                vec![
                    ("NOT_LOADED", num(admit::NOT_LOADED)),
                    ("NOT_STARTED", num(admit::NOT_STARTED)),
                    ("ENDED", num(admit::ENDED)),
                    ("SOLD_OUT", num(admit::SOLD_OUT)),
                    ("ALREADY_BOUGHT", num(admit::ALREADY_BOUGHT)),
                    ("SUPERSEDED", num(admit::SUPERSEDED)),
                    ("AGAIN_PREFIX", text(admit::AGAIN_PREFIX)),
                    ("AGAIN", text(admit::AGAIN)),
                    ("STOCK", text(s::STOCK)),
                    ("BEGINS_MS", text(s::BEGINS_MS)),
                    ("ENDS_MS", text(s::ENDS_MS)),
                    ("PAY_MS", text(s::PAY_MS)),
                    ("HELD", text(s::HELD)),
                    ("HELD_UNTIL", text(s::HELD_UNTIL)),
                    ("ORDER_ID", text(f::ORDER_ID)),
                    ("USER_ID", text(f::USER_ID)),
                ],
            ),
            (
                "preload.lua",
                include_str!("../../lua/preload.lua"),
                vec![
                    ("CREATED", num(preload::CREATED)),
                    ("ALREADY_LIVE", num(preload::ALREADY_LIVE)),
                    ("BUYERS_LOST", num(preload::BUYERS_LOST)),
                    ("STOCK", text(s::STOCK)),
                    ("TOTAL", text(s::TOTAL)),
                    ("BEGINS_MS", text(s::BEGINS_MS)),
                    ("ENDS_MS", text(s::ENDS_MS)),
                    ("PAY_MS", text(s::PAY_MS)),
                    ("REBUY", text(s::REBUY)),
                    ("BUCKETS", text(s::BUCKETS)),
                    ("ROOM_RATE", text(s::ROOM_RATE)),
                    ("ROOM_OPENS_S", text(s::ROOM_OPENS_S)),
                    ("SENTINELS", text(s::SENTINELS)),
                    ("SENTINEL", text(DEADLINES_SENTINEL)),
                ],
            ),
            (
                "queue.lua",
                include_str!("../../lua/queue.lua"),
                vec![
                    ("QUEUED", num(queue::QUEUED)),
                    ("NOT_LOADED", num(queue::NOT_LOADED)),
                    ("NO_ROOM", num(queue::NO_ROOM)),
                    ("NOT_OPEN", num(queue::NOT_OPEN)),
                    ("ENDED", num(queue::ENDED)),
                    ("NOT_JOINED", num(queue::NOT_JOINED)),
                    ("NEEDS_RESTORE", num(queue::NEEDS_RESTORE)),
                    ("QUEUE_NEXT", text(s::QUEUE_NEXT)),
                    ("STOCK", text(s::STOCK)),
                    ("BEGINS_MS", text(s::BEGINS_MS)),
                    ("ENDS_MS", text(s::ENDS_MS)),
                    ("BUCKETS", text(s::BUCKETS)),
                    ("ROOM_RATE", text(s::ROOM_RATE)),
                    ("ROOM_OPENS_S", text(s::ROOM_OPENS_S)),
                    ("HELD", text(s::HELD)),
                    ("HELD_UNTIL", text(s::HELD_UNTIL)),
                    ("PASSED", text(line::PASSED)),
                    ("MOST", num(line::MOST)),
                ],
            ),
            (
                "restore_queue.lua",
                include_str!("../../lua/restore_queue.lua"),
                vec![
                    ("STOCK", text(s::STOCK)),
                    ("ENDS_MS", text(s::ENDS_MS)),
                    ("QUEUE_NEXT", text(s::QUEUE_NEXT)),
                ],
            ),
            (
                "give.lua",
                include_str!("../../lua/give.lua"),
                vec![
                    ("NOT_LOADED", num(transfer::NOT_LOADED)),
                    ("STOCK", text(s::STOCK)),
                    ("HELD", text(s::HELD)),
                    ("HELD_UNTIL", text(s::HELD_UNTIL)),
                    ("OFFER", text(transfer::OFFER)),
                    ("SENTINEL", text(DEADLINES_SENTINEL)),
                ],
            ),
            (
                "take.lua",
                include_str!("../../lua/take.lua"),
                vec![
                    ("TAKEN", num(transfer::TAKEN)),
                    ("ALREADY", num(transfer::ALREADY)),
                    ("NOT_LOADED", num(transfer::NOT_LOADED)),
                    ("STOCK", text(s::STOCK)),
                    ("HELD", text(s::HELD)),
                    ("HELD_UNTIL", text(s::HELD_UNTIL)),
                    ("LINE", text(transfer::LINE)),
                    ("OFFER", text(transfer::OFFER)),
                    ("HOLD_MS", num(line::HOLD_MS)),
                    ("OFFERS_KEPT_MS", num(transfer::OFFERS_KEPT_MS)),
                ],
            ),
            (
                "close.lua",
                include_str!("../../lua/close.lua"),
                vec![
                    ("PAY", text(close::PAY)),
                    ("CANCEL", text(close::CANCEL)),
                    ("EXPIRE_DUE", text(close::EXPIRE_DUE)),
                    ("PAID", text(close::PAID)),
                    ("CANCELLED", text(close::CANCELLED)),
                    ("EXPIRED", text(close::EXPIRED)),
                    ("STOCK", text(s::STOCK)),
                    ("REBUY", text(s::REBUY)),
                    ("ROOM_RATE", text(s::ROOM_RATE)),
                    ("HELD", text(s::HELD)),
                    ("HELD_UNTIL", text(s::HELD_UNTIL)),
                    ("LINE", text(transfer::LINE)),
                    ("HOLD_MS", num(line::HOLD_MS)),
                    ("SENTINEL", text(DEADLINES_SENTINEL)),
                ],
            ),
            (
                "lease.lua",
                include_str!("../../lua/lease.lua"),
                vec![("OTHER_DAY", num(lease::OTHER_DAY))],
            ),
            (
                "dead_letter.lua",
                include_str!("../../lua/dead_letter.lua"),
                vec![
                    ("WRITTEN", num(dead_letter::WRITTEN)),
                    ("NOT_PENDING", num(dead_letter::NOT_PENDING)),
                    ("SOURCE_ID", text(f::SOURCE_ID)),
                    ("REASON", text(f::REASON)),
                    ("DELIVERIES", text(f::DELIVERIES)),
                    ("CLOSE", text(f::CLOSE)),
                ],
            ),
            (
                "expire_sale.lua",
                include_str!("../../lua/expire_sale.lua"),
                vec![
                    ("EXPIRING", num(expire_sale::EXPIRING)),
                    ("UNDRAINED", num(expire_sale::UNDRAINED)),
                    ("SENTINEL", text(DEADLINES_SENTINEL)),
                ],
            ),
            (
                "restore_buyers.lua",
                include_str!("../../lua/restore_buyers.lua"),
                vec![
                    ("PAIRS", text(restore_buyers::PAIRS)),
                    ("STREAM", text(restore_buyers::STREAM)),
                    ("ORDER_ID", text(f::ORDER_ID)),
                    ("USER_ID", text(f::USER_ID)),
                    ("CANCELLED", text(close::CANCELLED)),
                    ("EXPIRED", text(close::EXPIRED)),
                ],
            ),
            (
                "probe.lua",
                include_str!("../../lua/probe.lua"),
                vec![
                    ("ENDS_MS", text(s::ENDS_MS)),
                    ("PAY_MS", text(s::PAY_MS)),
                    ("SENTINELS", text(s::SENTINELS)),
                    ("SENTINEL", text(DEADLINES_SENTINEL)),
                ],
            ),
            ("read.lua", include_str!("../../lua/read.lua"), vec![]),
            ("trim.lua", include_str!("../../lua/trim.lua"), vec![]),
            (
                "replay_dead_letter.lua",
                include_str!("../../lua/replay_dead_letter.lua"),
                vec![],
            ),
            (
                "lib/streams.lua",
                include_str!("../../lua/lib/streams.lua"),
                vec![],
            ),
        ]
    }

    /// The `local NAME = value` lines of a script's header: upper-case names, a number
    /// or a quoted string. Lower-case locals are the script's own.
    fn header(script: &str) -> Vec<(String, String)> {
        script
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("local ")?;
                let (name, value) = rest.split_once('=')?;
                let (name, value) = (name.trim(), value.trim());
                let named = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                named.then(|| (name.to_string(), value.to_string()))
            })
            .collect()
    }

    #[test]
    fn every_script_header_agrees_with_the_rust_names() {
        for (file, script, want) in expected() {
            let mut got = header(script);
            let mut want: Vec<(String, String)> =
                want.into_iter().map(|(n, v)| (n.to_string(), v)).collect();
            got.sort();
            want.sort();
            assert_eq!(
                got, want,
                "lua/{file}: header and shared/src/protocol.rs differ"
            );
        }
    }

    #[test]
    fn the_header_parser_sees_what_it_must() {
        let parsed = header("local A_1 = 5\nlocal now = 3\n-- local B = 1\nlocal S = 'x'\n");
        assert_eq!(
            parsed,
            vec![
                ("A_1".to_string(), "5".to_string()),
                ("S".to_string(), "'x'".to_string())
            ]
        );
    }

    /// Every key a script's comments name (`seckill:{<voucher>}:<name>`) is one of
    /// [`VoucherKeys`], so the comments describe the keys Rust passes.
    #[test]
    fn keys_named_in_scripts_are_the_voucher_keys() {
        let k = VoucherKeys::new(VoucherId::new(7).unwrap());
        let known = [
            k.sale,
            k.buyers,
            k.orders,
            k.dead,
            k.drain_tx,
            k.repair,
            k.deadlines,
            k.closed,
            k.to_settle,
            k.transfers,
            k.received,
            k.grace,
            k.rebuys,
            crate::keys::queue(VoucherId::new(7).unwrap()),
            crate::keys::offers(VoucherId::new(7).unwrap()),
            crate::keys::waiters(VoucherId::new(7).unwrap()),
            crate::keys::looked(VoucherId::new(7).unwrap()),
        ];
        let mut seen = 0;
        for (file, script, _) in expected() {
            for (at, _) in script.match_indices("seckill:{<voucher>}:") {
                let name: String = script[at..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && *c != ')')
                    .collect();
                let key = name.replace("<voucher>", "7");
                assert!(known.contains(&key), "lua/{file} names {name}");
                seen += 1;
            }
        }
        assert!(seen > 10, "the scripts name their keys ({seen} found)");
    }
}

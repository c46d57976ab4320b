//! Batch planning: pure decisions about a batch of stream entries, no I/O.
//!
//! Two steps, both deterministic and unit tested here:
//!
//! 1. [`sort_entries`]: parse each entry of one voucher's stream into an
//!    [`AdmittedOrder`], or set it aside for the dead-letter stream with a [`Reason`]
//!    (malformed or missing fields, an order of another voucher). A bad entry only ever
//!    affects itself: the good ones of the batch go on. How often an entry was
//!    delivered never matters: crashes, timeouts and outages redeliver entries that
//!    are perfectly good (invariant 3).
//! 2. [`split`]: given the database's view (the voucher's `stock_left` under lock and the
//!    existing rows that collide with the batch), decide for each order whether it is
//!    already recorded (a redelivery: nothing to do), new and `confirmed` (the first
//!    `stock_left` new ones, in stream order), new and `rejected` (the database stock
//!    cannot cover it), or impossible to record (another order of the same buyer, or its
//!    id taken by a different order).
//!
//! Invariants: every entry of the batch ends in exactly one class; confirmed ≤
//! `stock_left`, so the database stock never goes below zero; an order already in the
//! database is never written twice.

use std::collections::{HashMap, HashSet};

use seckill_shared::domain::{
    AdmittedOrder, ExistingOrder, OrderId, StreamEntry, UserId, VoucherId,
};
use seckill_shared::protocol::fields;

/// Why an entry goes to the dead-letter stream (its `reason` field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A field is missing, not UTF-8 or not valid; the text says which.
    BadFields(String),
    /// The entry names a voucher other than its stream's.
    VoucherMismatch,
    /// The database refused this order alone with a permanent error (the text), after
    /// its batch was split down to it.
    Refused(String),
    /// The database has no such voucher.
    UnknownVoucher,
    /// The buyer already holds another order of this voucher (Redis lost its buyers
    /// hash); the unique (voucher, user) key forbids a second row.
    DuplicateBuyer,
    /// The order id is taken by an order of another voucher or buyer.
    OrderIdConflict,
}

impl Reason {
    /// The `reason` text of the dead letter (and of the `rejected` row, when one is
    /// recorded).
    pub fn text(&self) -> String {
        match self {
            Reason::BadFields(detail) => format!("bad_fields: {detail}"),
            Reason::VoucherMismatch => "voucher_mismatch".into(),
            Reason::Refused(detail) => format!("refused: {detail}"),
            Reason::UnknownVoucher => "unknown_voucher".into(),
            Reason::DuplicateBuyer => "duplicate_buyer".into(),
            Reason::OrderIdConflict => "order_id_conflict".into(),
        }
    }

    /// Whether the order must also get a `rejected` row (committed before its dead
    /// letter), so its buyer sees `rejected` instead of `pending` forever. Not when the
    /// row's keys belong to another order (the buyer's other order, or the id's other
    /// owner), nor when the database refused this very row: the row cannot exist.
    pub fn records_rejected_row(&self) -> bool {
        matches!(self, Reason::UnknownVoucher)
    }
}

/// The reason text of orders the database stock could not cover.
pub const DB_STOCK_EXHAUSTED: &str = "db_stock_exhausted";

/// An entry set aside for the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dead {
    /// Index into the batch's entries.
    pub index: usize,
    pub reason: Reason,
    /// The order, when the entry parsed as one.
    pub order: Option<AdmittedOrder>,
}

/// A batch sorted into orders to record and entries to dead-letter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sorted {
    /// (index into the entries, order), in stream order.
    pub orders: Vec<(usize, AdmittedOrder)>,
    pub dead: Vec<Dead>,
}

/// Parses the entries of `voucher`'s stream.
pub fn sort_entries(voucher: VoucherId, entries: &[StreamEntry]) -> Sorted {
    let mut sorted = Sorted::default();
    for (index, entry) in entries.iter().enumerate() {
        match parse_entry(voucher, entry) {
            Ok(order) => sorted.orders.push((index, order)),
            Err(reason) => sorted.dead.push(Dead {
                index,
                reason,
                order: None,
            }),
        }
    }
    sorted
}

/// One entry of `voucher`'s stream as an order.
pub fn parse_entry(voucher: VoucherId, entry: &StreamEntry) -> Result<AdmittedOrder, Reason> {
    let text = |name: &str| -> Result<&str, Reason> {
        let raw = entry
            .field(name)
            .ok_or_else(|| Reason::BadFields(format!("missing {name}")))?;
        std::str::from_utf8(raw).map_err(|_| Reason::BadFields(format!("{name} is not UTF-8")))
    };
    let bad = |name: &str| Reason::BadFields(format!("invalid {name}"));
    let id: OrderId = text(fields::ORDER_ID)?
        .parse()
        .map_err(|_| bad(fields::ORDER_ID))?;
    let user = UserId::parse(text(fields::USER_ID)?).map_err(|_| bad(fields::USER_ID))?;
    // Optional fields (see `fields`): absent, the key names the voucher and the entry id
    // carries the admission time.
    if entry.field(fields::VOUCHER_ID).is_some() {
        let entry_voucher: VoucherId = text(fields::VOUCHER_ID)?
            .parse()
            .map_err(|_| bad(fields::VOUCHER_ID))?;
        if entry_voucher != voucher {
            return Err(Reason::VoucherMismatch);
        }
    }
    let admitted_ms: i64 = match entry.field(fields::ADMITTED_MS) {
        Some(_) => text(fields::ADMITTED_MS)?.parse().ok(),
        None => entry.id_ms(),
    }
    .filter(|ms| *ms > 0)
    .ok_or_else(|| bad(fields::ADMITTED_MS))?;
    Ok(AdmittedOrder {
        id,
        voucher,
        user,
        admitted_ms,
    })
}

/// What to do with each order of a batch, as indexes into the orders slice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// New orders the stock covers: insert as `confirmed`, take one unit each.
    pub confirmed: Vec<usize>,
    /// New orders beyond the database stock: insert as `rejected` (`db_stock_exhausted`).
    pub rejected: Vec<usize>,
    /// Orders already recorded (a redelivery, or the same entry twice): only ack.
    pub duplicates: Vec<usize>,
    /// Orders that cannot be recorded: dead-letter.
    pub dead: Vec<(usize, Reason)>,
    /// New orders already cancelled or expired in Redis (vouchers with a payment step):
    /// insert with that status; their unit went back on sale, so they take none.
    pub closed: Vec<usize>,
}

impl Split {
    /// Rows the transaction writes.
    pub fn writes(&self) -> usize {
        self.confirmed.len() + self.rejected.len() + self.closed.len()
    }
}

/// Splits the orders of one voucher's batch against the database's view. `gave_back`:
/// the orders Redis already closed with their unit returned (cancelled or expired before
/// they were drained): they hold no unit and no buyer's place.
pub fn split(
    voucher: VoucherId,
    orders: &[AdmittedOrder],
    existing: &[ExistingOrder],
    stock_left: i64,
    gave_back: &HashSet<OrderId>,
) -> Split {
    let by_id: HashMap<OrderId, &ExistingOrder> = existing.iter().map(|e| (e.id, e)).collect();
    // Buyers of this voucher who already hold an order, and the order they hold.
    let mut buyers: HashMap<&str, OrderId> = existing
        .iter()
        .filter(|e| e.voucher == voucher && e.live)
        .map(|e| (e.user.as_str(), e.id))
        .collect();
    let mut seen: HashSet<OrderId> = HashSet::new();
    let mut out = Split::default();
    let capacity = usize::try_from(stock_left.max(0)).unwrap_or(usize::MAX);
    for (i, order) in orders.iter().enumerate() {
        let same = |v: VoucherId, u: &str| v == order.voucher && u == order.user.as_str();
        if let Some(e) = by_id.get(&order.id) {
            if same(e.voucher, &e.user) {
                out.duplicates.push(i);
            } else {
                out.dead.push((i, Reason::OrderIdConflict));
            }
            continue;
        }
        if gave_back.contains(&order.id) {
            // Closed in Redis before it was drained: recorded once, holding no place.
            if seen.insert(order.id) {
                out.closed.push(i);
            } else {
                out.duplicates.push(i);
            }
            continue;
        }
        if !seen.insert(order.id) {
            // The same order twice in one batch: the first occurrence records it.
            match buyers.get(order.user.as_str()) {
                Some(id) if *id == order.id => out.duplicates.push(i),
                _ => out.dead.push((i, Reason::OrderIdConflict)),
            }
            continue;
        }
        if buyers.contains_key(order.user.as_str()) {
            out.dead.push((i, Reason::DuplicateBuyer));
            continue;
        }
        buyers.insert(order.user.as_str(), order.id);
        if out.confirmed.len() < capacity {
            out.confirmed.push(i);
        } else {
            out.rejected.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: i64 = 42;

    fn v() -> VoucherId {
        VoucherId::new(V).unwrap()
    }

    fn entry(id: &str, kv: &[(&str, &str)], deliveries: u64) -> StreamEntry {
        StreamEntry {
            id: id.into(),
            fields: kv
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
            deliveries,
        }
    }

    fn good(n: i64, user: &str) -> StreamEntry {
        entry(
            &format!("{n}-0"),
            &[
                ("order_id", &n.to_string()),
                ("voucher_id", &V.to_string()),
                ("user_id", user),
                ("admitted_ms", "1795391999123"),
            ],
            1,
        )
    }

    fn order(n: i64, user: &str) -> AdmittedOrder {
        parse_entry(v(), &good(n, user)).unwrap()
    }

    #[test]
    fn a_well_formed_entry_parses_into_an_order() {
        let o = order(7, "alice");
        assert_eq!(o.id.get(), 7);
        assert_eq!(o.voucher, v());
        assert_eq!(o.user.as_str(), "alice");
        assert_eq!(o.admitted_ms, 1_795_391_999_123);
    }

    #[test]
    fn an_admission_entry_of_two_fields_takes_its_time_from_its_id() {
        // What lua/admit.lua writes: the key names the voucher, the id the time.
        let e = entry(
            "1795391999123-4",
            &[("order_id", "9"), ("user_id", "bob")],
            1,
        );
        let o = parse_entry(v(), &e).unwrap();
        assert_eq!((o.id.get(), o.voucher, o.user.as_str()), (9, v(), "bob"));
        assert_eq!(o.admitted_ms, 1_795_391_999_123);
        // A re-enqueued entry's own admission time wins over its newer id.
        let mut re = e.clone();
        re.fields
            .push((b"admitted_ms".to_vec(), b"1700000000000".to_vec()));
        assert_eq!(
            parse_entry(v(), &re).unwrap().admitted_ms,
            1_700_000_000_000
        );
        // An id that is no stream id gives no time.
        let odd = entry("x", &[("order_id", "9"), ("user_id", "bob")], 1);
        assert_eq!(
            parse_entry(v(), &odd),
            Err(Reason::BadFields("invalid admitted_ms".into()))
        );
    }

    #[test]
    fn malformed_entries_get_a_precise_reason() {
        let cases: Vec<(StreamEntry, Reason)> = vec![
            (
                entry(
                    "1-0",
                    &[("voucher_id", "42"), ("user_id", "u"), ("admitted_ms", "1")],
                    1,
                ),
                Reason::BadFields("missing order_id".into()),
            ),
            (
                entry(
                    "1-0",
                    &[
                        ("order_id", "x"),
                        ("voucher_id", "42"),
                        ("user_id", "u"),
                        ("admitted_ms", "1"),
                    ],
                    1,
                ),
                Reason::BadFields("invalid order_id".into()),
            ),
            (
                entry(
                    "1-0",
                    &[
                        ("order_id", "1"),
                        ("voucher_id", "42"),
                        ("user_id", ""),
                        ("admitted_ms", "1"),
                    ],
                    1,
                ),
                Reason::BadFields("invalid user_id".into()),
            ),
            (
                entry(
                    "1-0",
                    &[
                        ("order_id", "1"),
                        ("voucher_id", "42"),
                        ("user_id", "u"),
                        ("admitted_ms", "-5"),
                    ],
                    1,
                ),
                Reason::BadFields("invalid admitted_ms".into()),
            ),
            (
                entry(
                    "1-0",
                    &[
                        ("order_id", "1"),
                        ("voucher_id", "43"),
                        ("user_id", "u"),
                        ("admitted_ms", "1"),
                    ],
                    1,
                ),
                Reason::VoucherMismatch,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(parse_entry(v(), &e), Err(want));
        }
        let mut not_utf8 = good(1, "u");
        not_utf8.fields[2].1 = vec![0xff, 0xfe];
        assert_eq!(
            parse_entry(v(), &not_utf8),
            Err(Reason::BadFields("user_id is not UTF-8".into()))
        );
    }

    #[test]
    fn bad_entries_never_block_their_neighbours_and_deliveries_never_count() {
        let entries = vec![
            good(1, "a"),
            entry("2-0", &[("junk", "1")], 1),
            good(3, "c"),
            {
                // Redelivered by a crash loop or an outage: still a good order.
                let mut e = good(4, "d");
                e.deliveries = 1_000;
                e
            },
            good(5, "e"),
        ];
        let sorted = sort_entries(v(), &entries);
        let ids: Vec<usize> = sorted.orders.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, vec![0, 2, 3, 4]);
        assert_eq!(sorted.dead.len(), 1);
        assert_eq!(sorted.dead[0].index, 1);
        assert!(matches!(sorted.dead[0].reason, Reason::BadFields(_)));
        assert_eq!(sorted.dead[0].order, None);
    }

    #[test]
    fn orders_closed_before_their_drain_take_no_unit_and_no_buyers_place() {
        // u1 cancelled before the drain, then bought again (a voucher allowing it): the
        // closed order is written as closed and the new one takes the one unit.
        let orders = vec![order(1, "u1"), order(2, "u2"), order(3, "u1")];
        let gave_back: HashSet<OrderId> = [orders[0].id].into_iter().collect();
        let s = split(v(), &orders, &[], 1, &gave_back);
        assert_eq!(s.closed, vec![0]);
        assert_eq!(s.confirmed, vec![1]);
        assert_eq!(s.rejected, vec![2]);
        assert!(s.dead.is_empty());
        assert_eq!(s.writes(), 3);
    }

    #[test]
    fn a_closed_order_in_the_database_leaves_its_buyer_free_to_hold_a_new_one() {
        // X (u1's cancelled order) was committed but not acked, so it comes back with
        // u1's new order Y in a recovery batch: X is a duplicate, Y a new order, and the
        // closed order seen twice in a batch is recorded once.
        let orders = vec![
            order(1, "u1"),
            order(2, "u1"),
            order(3, "u2"),
            order(3, "u2"),
        ];
        let existing = vec![ExistingOrder {
            id: orders[0].id,
            voucher: v(),
            user: "u1".into(),
            live: false,
        }];
        let s = split(v(), &orders, &existing, 5, &HashSet::new());
        assert_eq!(s.duplicates, vec![0, 3]);
        assert_eq!(s.confirmed, vec![1, 2]);
        assert!(s.dead.is_empty(), "{:?}", s.dead);
        let gave_back: HashSet<OrderId> = [orders[2].id].into_iter().collect();
        let s = split(v(), &orders[2..], &[], 5, &gave_back);
        assert_eq!((s.closed, s.duplicates), (vec![0], vec![1]));
        assert!(s.dead.is_empty());
    }

    #[test]
    fn new_orders_are_confirmed_up_to_the_stock_in_stream_order() {
        let orders: Vec<_> = (1..=5).map(|n| order(n, &format!("u{n}"))).collect();
        let s = split(v(), &orders, &[], 3, &HashSet::new());
        assert_eq!(s.confirmed, vec![0, 1, 2]);
        assert_eq!(s.rejected, vec![3, 4]);
        assert!(s.duplicates.is_empty() && s.dead.is_empty());
        assert_eq!(s.writes(), 5);
        // No stock at all (or a negative reading): everything rejected, nothing taken.
        assert_eq!(
            split(v(), &orders, &[], 0, &HashSet::new()).confirmed.len(),
            0
        );
        assert_eq!(
            split(v(), &orders, &[], -1, &HashSet::new()).rejected.len(),
            5
        );
    }

    #[test]
    fn a_redelivered_batch_changes_nothing() {
        let orders: Vec<_> = (1..=4).map(|n| order(n, &format!("u{n}"))).collect();
        let existing: Vec<_> = orders
            .iter()
            .map(|o| ExistingOrder {
                id: o.id,
                voucher: o.voucher,
                user: o.user.to_string(),
                live: true,
            })
            .collect();
        let s = split(v(), &orders, &existing, 100, &HashSet::new());
        assert_eq!(s.duplicates, vec![0, 1, 2, 3]);
        assert_eq!(s.writes(), 0);
    }

    #[test]
    fn duplicates_do_not_use_stock_and_buyers_hold_one_order() {
        let orders = vec![
            order(1, "a"), // already recorded
            order(2, "b"), // b already holds order 9
            order(3, "c"),
            order(4, "c"), // c twice in the batch
            order(3, "c"), // the same entry twice
            order(5, "x"), // id 5 belongs to another voucher's order
            order(6, "d"),
        ];
        let existing = vec![
            ExistingOrder {
                id: orders[0].id,
                voucher: v(),
                user: "a".into(),
                live: true,
            },
            ExistingOrder {
                id: OrderId::new(9).unwrap(),
                voucher: v(),
                user: "b".into(),
                live: true,
            },
            ExistingOrder {
                id: OrderId::new(5).unwrap(),
                voucher: VoucherId::new(99).unwrap(),
                user: "x".into(),
                live: true,
            },
        ];
        let s = split(v(), &orders, &existing, 1, &HashSet::new());
        assert_eq!(s.duplicates, vec![0, 4]);
        assert_eq!(s.confirmed, vec![2]);
        assert_eq!(s.rejected, vec![6]);
        assert_eq!(
            s.dead,
            vec![
                (1, Reason::DuplicateBuyer),
                (3, Reason::DuplicateBuyer),
                (5, Reason::OrderIdConflict)
            ]
        );
        // Every order lands in exactly one class.
        let mut all: Vec<usize> = s
            .confirmed
            .iter()
            .chain(&s.rejected)
            .chain(&s.duplicates)
            .copied()
            .chain(s.dead.iter().map(|(i, _)| *i))
            .collect();
        all.sort();
        assert_eq!(all, (0..orders.len()).collect::<Vec<_>>());
    }

    #[test]
    fn buyers_are_compared_byte_for_byte_as_in_the_database() {
        // The orders table's user_id is binary (no PAD SPACE): these are three buyers.
        let orders = vec![order(1, "pad"), order(2, "pad "), order(3, "Pad")];
        let s = split(v(), &orders, &[], 10, &HashSet::new());
        assert_eq!(s.confirmed, vec![0, 1, 2]);
        assert!(s.dead.is_empty(), "{:?}", s.dead);
        // And against a row already in the database.
        let existing = vec![ExistingOrder {
            id: OrderId::new(9).unwrap(),
            voucher: v(),
            user: "pad".into(),
            live: true,
        }];
        let s = split(v(), &orders[1..2], &existing, 10, &HashSet::new());
        assert_eq!(s.confirmed, vec![0]);
        let s = split(v(), &orders[0..1], &existing, 10, &HashSet::new());
        assert_eq!(s.dead, vec![(0, Reason::DuplicateBuyer)]);
    }

    #[test]
    fn reasons_have_stable_texts_that_fit_the_column() {
        for r in [
            Reason::BadFields("missing user_id".into()),
            Reason::VoucherMismatch,
            Reason::Refused("Data too long for column 'user_id' at row 1".repeat(3)),
            Reason::UnknownVoucher,
            Reason::DuplicateBuyer,
            Reason::OrderIdConflict,
        ] {
            assert!(
                r.text().chars().count() <= 64 || matches!(r, Reason::Refused(_)),
                "{}",
                r.text()
            );
        }
        assert!(Reason::UnknownVoucher.records_rejected_row());
        assert!(!Reason::Refused("x".into()).records_rejected_row());
        assert_eq!(Reason::UnknownVoucher.text(), "unknown_voucher");
    }
}

//! `seckill reconcile VOUCHER`: compares the buyers hash, the orders stream, the dead
//! letters and the orders table, and names each discrepancy by class. Reads go the way
//! orders move (buyers, stream, dead letters, one database snapshot), so an order in
//! flight is never reported lost. `--repair` fixes only what cannot oversell or duplicate
//! (docs/operations.md); the other classes are left to an operator. The money is checked
//! both ways too ([`seckill_shared::sale_status::money`]): each payment `paid` without its
//! paid order, payment never decided, or paid order without its payment is listed with
//! what to do.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use order_drainer::plan::parse_entry;
use seckill_shared::adapters::order_stream::{RANGE_PAGE, id_less};
use seckill_shared::adapters::payments::{Outcome, PaymentRow, Payments};
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{AdmittedOrder, Bucket, OrderId, StreamEntry, UserId, VoucherId};
use seckill_shared::order_id::{EPOCH_UNIX_MS, OrderIdParts};
use serde::Serialize;

use super::{Backend, Backends};

mod unmatched;

pub use unmatched::UnmatchedMoney;

/// Examples shown per class.
pub const EXAMPLES: usize = 5;

/// The classes of discrepancy.
pub mod class {
    /// Admitted, but not undrained, dead-lettered nor in the database. Repaired: re-enqueued.
    pub const ADMITTED_LOST: &str = "admitted_but_nowhere";
    /// In the database, not in the buyers hash. Repaired: buyer restored.
    pub const DB_NOT_IN_REDIS: &str = "in_database_not_in_redis";
    /// An undrained stream entry whose buyer the buyers hash lost. Repaired: restored.
    pub const STREAM_NOT_IN_BUYERS: &str = "in_stream_not_in_buyers";
    /// The buyers hash and the database name different orders for one buyer.
    pub const BUYER_MISMATCH: &str = "buyer_order_mismatch";
    /// Redis stock differs from what the database can still cover.
    pub const REDIS_STOCK: &str = "redis_stock_mismatch";
    /// `stock - stock_left` differs from the confirmed orders.
    pub const DB_STOCK: &str = "database_stock_mismatch";
    /// Dead letters waiting for an operator (`seckill dead-letters`).
    pub const DEAD_LETTERED: &str = "dead_lettered";
    /// An undrained stream entry that does not parse as an order.
    pub const UNPARSEABLE: &str = "unparseable_entry";
    /// Undrained entries, but the drainer does not visit the voucher. Repaired.
    pub const INACTIVE: &str = "undrained_but_inactive";
    /// The classes `--repair` fixes.
    pub const REPAIRABLE: [&str; 4] = [
        ADMITTED_LOST,
        DB_NOT_IN_REDIS,
        STREAM_NOT_IN_BUYERS,
        INACTIVE,
    ];
}

/// One class found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Discrepancy {
    pub class: String,
    pub count: u64,
    pub examples: Vec<String>,
    /// Whether `--repair` fixes it.
    pub repairable: bool,
    /// What `--repair` did (empty without it).
    pub repaired: Vec<String>,
}

/// What reconcile found (and did).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub voucher: i64,
    pub buyers: u64,
    pub stream_entries: u64,
    pub undrained: u64,
    pub dead_letters: u64,
    pub db_orders: u64,
    /// Closes of orders (vouchers with a payment step) the drainer has not recorded in
    /// the database yet; while any wait, Redis holds returned units the database does
    /// not, and the Redis stock is not compared.
    pub closes_to_settle: u64,
    pub discrepancies: Vec<Discrepancy>,
    pub repaired: bool,
    /// Payments to refund (confirmed by the provider after their order closed, for an
    /// order another payment paid or the database rejected, or of the wrong amount):
    /// money to give back, not a discrepancy of the sale's state (at most
    /// `payments::LIST_LIMIT` listed of each kind).
    pub refunds_due: Vec<RefundDue>,
    /// Money the records do not match both ways (payments `paid` without their paid
    /// order, payments never decided, paid orders without their payment), each with what
    /// to do; what is only on its way to the database is not listed. A discrepancy:
    /// reconcile is not clean while any is listed.
    pub unmatched_money: Vec<UnmatchedMoney>,
    /// Payments to refund whose event named no order any voucher has (an order id
    /// outside the accepted form, or one nobody found): recorded without a voucher, and
    /// listed in every report.
    pub unmatched_payments: Vec<RefundDue>,
}

/// A payment to refund.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RefundDue {
    pub payment_id: String,
    /// Empty when its event named no order readably.
    pub order_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub reason: String,
    /// Where its refund stands: `refund_due` or `refused` (not asked yet), or
    /// `refund_requested` (the provider took the request).
    pub outcome: String,
}

impl RefundDue {
    fn of(p: PaymentRow) -> RefundDue {
        RefundDue {
            outcome: p.outcome.as_str().to_string(),
            payment_id: p.payment_id,
            order_id: p.order.map(|o| o.to_string()).unwrap_or_default(),
            amount_minor: p.amount_minor,
            currency: p.currency,
            reason: p.reason.unwrap_or_default(),
        }
    }
}

impl Report {
    /// True when nothing is left to fix: no money unmatched, and no discrepancy or
    /// `--repair` fixed each one.
    pub fn clean_after(&self) -> bool {
        self.unmatched_money.is_empty()
            && self
                .discrepancies
                .iter()
                .all(|d| self.repaired && d.repairable && !d.repaired.is_empty())
    }

    /// The class named `class`, if found.
    pub fn class(&self, class: &str) -> Option<&Discrepancy> {
        self.discrepancies.iter().find(|d| d.class == class)
    }

    fn repaired(&mut self, class: &str, what: String) {
        if let Some(d) = self.discrepancies.iter_mut().find(|d| d.class == class) {
            d.repaired.push(what);
        }
    }
}

/// `order 12 of "buyer-3"`, as examples name an order.
fn order_of(order: OrderId, user: &str) -> String {
    format!("order {order} of {user:?}")
}

/// Compares the four records of `voucher`; with `repair`, fixes the safe classes.
pub async fn reconcile(b: &Backends, voucher: VoucherId, repair: bool) -> anyhow::Result<Report> {
    let db_voucher = b.voucher(voucher).await?;
    // A voucher with stock buckets: every bucket's records, read bucket after bucket.
    let k = db_voucher.as_ref().map_or(1, |v| v.buckets);
    let buckets: Vec<Bucket> = Bucket::all(voucher, k).collect();
    // 1. Buyers.
    let mut buyers = Vec::new();
    for bk in &buckets {
        buyers.extend(b.sales.buyers(*bk).await.redis()?);
    }
    let known: HashSet<&str> = buyers.iter().map(|(u, _)| u.as_str()).collect();
    // 2. The streams: every entry, and whether it is acked yet.
    let mut entries: Vec<(StreamEntry, bool)> = Vec::new();
    for bk in &buckets {
        let stats = b.streams.stats(*bk).await.redis()?;
        let pending = b.streams.pending_ids(*bk).await.redis()?;
        let pending: HashSet<&str> = pending.iter().map(String::as_str).collect();
        let last_delivered = stats.map_or("0-0".to_string(), |s| s.last_delivered);
        let mut after: Option<String> = None;
        loop {
            let page = b
                .streams
                .entries(*bk, after.as_deref(), RANGE_PAGE)
                .await
                .redis()?;
            let full = page.len() == RANGE_PAGE;
            after = page.last().map(|e| e.id.clone());
            for e in page {
                let open = pending.contains(e.id.as_str()) || id_less(&last_delivered, &e.id);
                entries.push((e, open));
            }
            if !full {
                break;
            }
        }
    }
    // 3. Dead letters.
    let mut dead = Vec::new();
    for bk in &buckets {
        dead.extend(b.streams.dead_letters(*bk).await.redis()?);
    }
    // 4. The database, one snapshot.
    let mut db_orders: BTreeMap<String, OrderId> = BTreeMap::new();
    let mut db_left = None;
    if let Some((v, mut snap)) = b.db.sale_snapshot(voucher).await.db()? {
        db_left = Some(v.db_stock_left);
        while let Some(page) = snap.next_page().await.db()? {
            db_orders.extend(page);
        }
        snap.finish().await;
    }
    let (confirmed, _rejected) = b.db.order_counts(voucher).await.db()?;
    let db_ids: HashSet<OrderId> = db_orders.values().copied().collect();
    // Buyers admitted since the first read are no discrepancy: look again.
    let mut recheck = Vec::new();
    for bk in &buckets {
        recheck.extend(b.sales.buyers(*bk).await.redis()?);
    }
    let known_now: HashSet<&str> = recheck.iter().map(|(u, _)| u.as_str()).collect();
    let unknown = |user: &str| !known.contains(user) && !known_now.contains(user);

    let mut report = Report {
        voucher: voucher.get(),
        buyers: buyers.len() as u64,
        stream_entries: entries.len() as u64,
        dead_letters: dead.len() as u64,
        db_orders: db_orders.len() as u64,
        repaired: repair,
        ..Report::default()
    };

    // Closes Redis decided that the database has not recorded yet (payment step): their
    // rows still read `awaiting_payment`, so the database's view of those buyers lags.
    let mut settling: HashSet<OrderId> = HashSet::new();
    for bk in &buckets {
        settling.extend(b.streams.to_settle(*bk).await.redis()?);
    }
    report.closes_to_settle = settling.len() as u64;
    for outcome in Outcome::TO_REFUND {
        report.refunds_due.extend(
            Payments(&b.db)
                .list(voucher, outcome)
                .await
                .db()?
                .into_iter()
                .map(RefundDue::of),
        );
        // Payments of no voucher's order: no voucher's list holds them, so every
        // report shows them.
        report.unmatched_payments.extend(
            Payments(&b.db)
                .of_no_voucher(outcome)
                .await
                .db()?
                .into_iter()
                .map(RefundDue::of),
        );
    }

    // Admission times of the orders in the stream.
    let mut admitted_ms: HashMap<OrderId, i64> = HashMap::new();
    let mut undrained_orders: HashSet<OrderId> = HashSet::new();
    let mut unparseable = Vec::new();
    let mut stream_lost_buyers = Vec::new();
    for (e, open) in &entries {
        let open = *open;
        report.undrained += u64::from(open);
        match parse_entry(voucher, e) {
            Ok(order) => {
                if open {
                    undrained_orders.insert(order.id);
                    if unknown(order.user.as_str()) {
                        stream_lost_buyers.push((order.user.as_str().to_string(), order.id));
                    }
                }
                admitted_ms.insert(order.id, order.admitted_ms);
            }
            Err(reason) if open => unparseable.push(format!("entry {}: {}", e.id, reason.text())),
            Err(_) => {}
        }
    }
    let dead_orders: HashSet<OrderId> = dead
        .iter()
        .filter_map(|d| parse_entry(voucher, &d.entry).ok().map(|o| o.id))
        .collect();

    // Admitted, but nowhere else.
    let mut lost: Vec<AdmittedOrder> = Vec::new();
    let mut mismatched = Vec::new();
    for (user, order) in &buyers {
        let Some(order) = *order else {
            mismatched.push(format!("buyer {user:?} holds \"?\", not an order id"));
            continue;
        };
        if let Some(db_order) = db_orders.get(user)
            && *db_order != order
            && !settling.contains(db_order)
        {
            mismatched.push(format!(
                "buyer {user:?}: redis order {order}, database order {db_order}"
            ));
            continue;
        }
        if db_ids.contains(&order)
            || undrained_orders.contains(&order)
            || dead_orders.contains(&order)
        {
            continue;
        }
        let Ok(user_id) = UserId::parse(user) else {
            mismatched.push(format!("buyer {user:?} is not a valid user id"));
            continue;
        };
        // Not in the stream any more: when its order id's block was leased, no later
        // than its admission.
        let leased_ms = || EPOCH_UNIX_MS + OrderIdParts::of(order).ms;
        lost.push(AdmittedOrder {
            id: order,
            voucher,
            user: user_id,
            admitted_ms: admitted_ms.get(&order).copied().unwrap_or_else(leased_ms),
        });
    }
    let not_in_buyers: Vec<(String, OrderId)> = db_orders
        .iter()
        .filter(|(u, o)| unknown(u) && !settling.contains(o))
        .map(|(u, o)| (u.clone(), *o))
        .collect();
    // A buyer whose order was cancelled or expired (its unit back in the stock) left the
    // buyers hash on purpose when the voucher lets them buy again (else a close keeps
    // the buyer, and a lost one is a discrepancy as any other): no discrepancy, and
    // restoring them would refuse them for good (`already_purchased`). Read after the
    // database's snapshot and the stream: a close made since shows here (the closed
    // hash only grows until the sale is retired).
    let rebuy = db_voucher
        .as_ref()
        .and_then(|v| v.payment)
        .map_or(0, |p| p.rebuys());
    let (not_in_buyers, stream_lost_buyers) = if rebuy > 0 {
        (
            without_returned(b, voucher, k, not_in_buyers).await?,
            without_returned(b, voucher, k, stream_lost_buyers).await?,
        )
    } else {
        (not_in_buyers, stream_lost_buyers)
    };

    let listed = |pairs: &[(String, OrderId)]| -> Vec<String> {
        pairs.iter().map(|(u, o)| order_of(*o, u)).collect()
    };
    let lost_listed = lost.iter().map(|o| order_of(o.id, o.user.as_str()));
    // Stock. Units the database still has to cover: undrained orders, lost ones, and
    // dead letters whose order is not in the database (they may be replayed).
    let not_in_db = |orders: &HashSet<OrderId>| orders.difference(&db_ids).count();
    let owed = not_in_db(&undrained_orders) + lost.len() + not_in_db(&dead_orders);
    // Redis's stock: every bucket's, and the units on their way between two of them
    // (none without bucket 0's sale).
    let sale_stock = match b.sales.stock_left(voucher).await.redis()? {
        Some(_) => Some(
            transfers::units(b.sales.conn_ref(), voucher, k)
                .await
                .redis()?
                .total(),
        ),
        None => None,
    };
    let redis_stock = db_left
        .filter(|_| report.closes_to_settle == 0)
        .zip(sale_stock)
        .and_then(|(left, stock)| {
            let expected = (left - owed as i64).max(0);
            let what = match stock.cmp(&expected) {
                Ordering::Equal => return None,
                Ordering::Greater => "later admissions will be rejected by the database",
                Ordering::Less => "units will stay unsold",
            };
            Some(format!(
                "redis stock {stock}, database can still cover {expected} \
                 (stock_left {left} minus {owed} admitted orders not in it): {what}"
            ))
        });
    let db_stock = db_voucher.as_ref().and_then(|v| {
        let (stock, left) = (v.stock, v.db_stock_left);
        let sold = stock - left;
        (sold != confirmed as i64).then(|| {
            format!(
                "stock {stock} - stock_left {left} = {sold}, but {confirmed} orders are confirmed"
            )
        })
    });
    let mut active = true;
    for bk in &buckets {
        active &= b.streams.is_active(*bk).await.redis()?;
    }
    let inactive = (!active && (report.undrained > 0 || !lost.is_empty()))
        .then(|| format!("{} undrained entries", report.undrained));
    let found = [
        (class::ADMITTED_LOST, lost_listed.collect()),
        (class::DB_NOT_IN_REDIS, listed(&not_in_buyers)),
        (class::STREAM_NOT_IN_BUYERS, listed(&stream_lost_buyers)),
        (class::BUYER_MISMATCH, mismatched),
        (class::UNPARSEABLE, unparseable),
        (
            class::DEAD_LETTERED,
            dead.iter()
                .map(|d| format!("{} ({})", d.id, d.reason))
                .collect(),
        ),
        (class::REDIS_STOCK, Vec::from_iter(redis_stock)),
        (class::DB_STOCK, Vec::from_iter(db_stock)),
        (class::INACTIVE, Vec::from_iter(inactive)),
    ];
    let found = found.into_iter().filter(|(_, items)| !items.is_empty());
    report.discrepancies = found
        .map(|(class, items)| Discrepancy {
            class: class.to_string(),
            count: items.len() as u64,
            examples: items.into_iter().take(EXAMPLES).collect(),
            repairable: class::REPAIRABLE.contains(&class),
            repaired: Vec::new(),
        })
        .collect();

    // The money, both ways, after everything else: each mismatch with what to do.
    report.unmatched_money = unmatched::listed(b, voucher, k).await?;

    if repair {
        for o in &lost {
            let bucket = Bucket::of_user(voucher, k, o.user.as_str());
            let id = b.streams.requeue(bucket, o).await.redis()?;
            let what = format!(
                "re-enqueued {} as entry {id}",
                order_of(o.id, o.user.as_str())
            );
            report.repaired(class::ADMITTED_LOST, what);
        }
        // `restore_buyers` of nothing asks Redis nothing; `repaired` of a class not
        // found records nothing.
        for (class, pairs) in [
            (class::DB_NOT_IN_REDIS, &not_in_buyers),
            (class::STREAM_NOT_IN_BUYERS, &stream_lost_buyers),
        ] {
            let mut added = 0;
            for bk in &buckets {
                let theirs: Vec<(String, OrderId)> = pairs
                    .iter()
                    .filter(|(u, _)| Bucket::of_user(voucher, k, u) == *bk)
                    .cloned()
                    .collect();
                added += b
                    .sales
                    .restore_buyers(*bk, &theirs, rebuy)
                    .await
                    .redis()?
                    .added;
            }
            report.repaired(class, format!("restored {added} buyer(s) (HSETNX)"));
        }
        if report.class(class::INACTIVE).is_some() {
            for bk in &buckets {
                b.streams.activate(*bk).await.redis()?;
            }
            report.repaired(class::INACTIVE, "added to the active set".into());
        }
    }
    Ok(report)
}

/// `pairs` (buyer, order) without the orders Redis closed with their unit given back
/// (cancelled or expired), each looked up in its buyer's bucket.
async fn without_returned(
    b: &Backends,
    voucher: VoucherId,
    buckets: u16,
    pairs: Vec<(String, OrderId)>,
) -> anyhow::Result<Vec<(String, OrderId)>> {
    let mut kept = Vec::with_capacity(pairs.len());
    for bk in Bucket::all(voucher, buckets) {
        let theirs: Vec<&(String, OrderId)> = pairs
            .iter()
            .filter(|(u, _)| Bucket::of_user(voucher, buckets, u) == bk)
            .collect();
        let ids: Vec<OrderId> = theirs.iter().map(|(_, o)| *o).collect();
        let closed = b.streams.closed_orders(bk, &ids).await.redis()?;
        kept.extend(
            theirs
                .into_iter()
                .zip(closed)
                .filter(|(_, c)| !c.as_ref().is_some_and(|c| c.status.returned_unit()))
                .map(|(pair, _)| pair.clone()),
        );
    }
    Ok(kept)
}

/// The text form.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "voucher {}: {} buyers in redis, {} stream entries ({} undrained), {} dead letters, {} orders in the database\n",
        r.voucher, r.buyers, r.stream_entries, r.undrained, r.dead_letters, r.db_orders
    );
    if r.closes_to_settle > 0 {
        out.push_str(&format!(
            "{} closes wait for the drainer (payment step): redis stock not compared\n",
            r.closes_to_settle
        ));
    }
    if !r.refunds_due.is_empty() {
        let _ = writeln!(out, "payments to refund: {}", r.refunds_due.len());
        for p in &r.refunds_due {
            let _ = writeln!(
                out,
                "    {} of order {}: {} {} ({})",
                p.payment_id, p.order_id, p.amount_minor, p.currency, p.reason
            );
        }
    }
    if !r.unmatched_payments.is_empty() {
        let _ = writeln!(
            out,
            "payments of no known order, to refund (any voucher): {}",
            r.unmatched_payments.len()
        );
        for p in &r.unmatched_payments {
            let order = match p.order_id.as_str() {
                "" => "no order".to_string(),
                id => format!("order {id}"),
            };
            let _ = writeln!(
                out,
                "    {} of {order}: {} {} ({})",
                p.payment_id, p.amount_minor, p.currency, p.reason
            );
        }
    }
    unmatched::render(&mut out, &r.unmatched_money);
    if r.discrepancies.is_empty() && r.unmatched_money.is_empty() {
        out.push_str("clean: no discrepancy\n");
    }
    for d in &r.discrepancies {
        let manual = if d.repairable {
            ""
        } else {
            "  (not repaired automatically)"
        };
        let _ = writeln!(out, "{}: {}{manual}", d.class, d.count);
        for e in &d.examples {
            let _ = writeln!(out, "    e.g. {e}");
        }
        for done in &d.repaired {
            let _ = writeln!(out, "    repaired: {done}");
        }
    }
    out
}

//! The end of a storm: bring the sale to rest (faults off, every deadline passed, the
//! drainers run until nothing waits), then check the whole ledger from the database and
//! Redis against what every buyer and the provider were told:
//!
//! - every order a buyer was told is theirs is exactly one row of theirs; no dead letter;
//! - every unit accounted for: in the database, held orders + `stock_left` = stock and
//!   nothing awaits payment any more (each unit paid once or back on sale); Redis has
//!   exactly the database's units back on sale;
//! - every payment's money listed: `paid` with its paid order (and each paid order with
//!   its payment), `refund_due` / `refused` shown by `seckill status` and `seckill
//!   reconcile`, none undecided; every success the provider sent recorded, every `paid`
//!   answer a paid order;
//! - every buyer can look up each of their orders, and sees the database's status;
//! - no answer a client should never see (a 5xx other than `503`, a body that is not
//!   JSON), no call left unanswered; `reconcile` finds nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use seckill_shared::domain::{Bucket, VoucherId};
use seckill_shared::keys::VoucherKeys;
use serde::Serialize;
use tokio::time::Instant;

use super::buyer::BuyerLog;
use super::client::Call;
use super::context::Storm;
use super::faults::Machinery;

/// The figures of a storm's ledger.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Figures {
    pub stock: i64,
    pub stock_left_db: i64,
    pub stock_left_redis: i64,
    pub rows: BTreeMap<String, u64>,
    pub payments: BTreeMap<String, u64>,
    pub told_orders: u64,
    pub dead_letters: u64,
    pub refunds_listed: u64,
    /// Successes the provider sent before the order's deadline that were decided
    /// `refund_due` all the same (delivered late through an outage).
    pub paid_in_time_refunded: u64,
    pub settle_ms: u64,
}

/// What the check found.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Ledger {
    pub figures: Figures,
    /// Broken promises, each with what to look at.
    pub failures: Vec<String>,
    /// Worth knowing, not a broken promise.
    pub notes: Vec<String>,
}

/// Brings the sale to rest: faults off, then drainer runs until every bucket's stream is
/// drained, no deadline nor close waits in Redis and no order awaits payment in the
/// database, for at most `limit`. `Err` with what still waits.
pub async fn settle(storm: &Storm, m: &Machinery, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    if let Err(e) = m.restore().await {
        return Err(format!("could not end the faults: {e:#}"));
    }
    let mut last = String::new();
    while t0.elapsed() < limit {
        let _ = m.drain_once(None).await;
        match waiting(storm).await {
            Ok(None) => return Ok(t0.elapsed()),
            Ok(Some(what)) => last = what,
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!(
        "the sale did not come to rest within {limit:?}: {last}"
    ))
}

/// What still waits, if anything.
async fn waiting(storm: &Storm) -> anyhow::Result<Option<String>> {
    let v: VoucherId = storm.voucher.parse()?;
    let mut conn = storm.backends.streams.conn().clone();
    for b in Bucket::all(v, storm.opts.buckets) {
        let k = VoucherKeys::new(b);
        if let Some(s) = storm.backends.streams.stats(b).await?
            && (s.pending > 0 || s.undelivered > 0)
        {
            return Ok(Some(format!(
                "bucket {b}: {} pending, {} undelivered",
                s.pending, s.undelivered
            )));
        }
        // Each holds a sentinel member `~` (docs/design.md).
        let deadlines: u64 = redis::cmd("ZCARD")
            .arg(&k.deadlines)
            .query_async(&mut conn)
            .await?;
        let to_settle: u64 = redis::cmd("SCARD")
            .arg(&k.to_settle)
            .query_async(&mut conn)
            .await?;
        let transfers: u64 = redis::cmd("HLEN")
            .arg(&k.transfers)
            .query_async(&mut conn)
            .await?;
        if deadlines > 1 || to_settle > 1 || transfers > 1 {
            return Ok(Some(format!(
                "bucket {b}: {} deadlines, {} closes to settle, {} transfers open",
                deadlines.saturating_sub(1),
                to_settle.saturating_sub(1),
                transfers.saturating_sub(1)
            )));
        }
    }
    let mut db = storm.mysql.get_conn().await?;
    let awaiting: Option<u64> = db
        .exec_first(
            "SELECT COUNT(*) FROM orders WHERE voucher_id = ? AND status = 'awaiting_payment'",
            (v.get(),),
        )
        .await?;
    Ok(match awaiting.unwrap_or(0) {
        0 => None,
        n => Some(format!("{n} orders await payment in the database")),
    })
}

/// Checks the ledger (the sale at rest).
pub async fn check(storm: &Storm, logs: &[BuyerLog]) -> anyhow::Result<Ledger> {
    let mut l = Ledger::default();
    let v: VoucherId = storm.voucher.parse()?;
    let mut db = storm.mysql.get_conn().await?;

    // What the buyers were told.
    let mut told: HashMap<String, String> = HashMap::new();
    let mut maybe: HashSet<String> = HashSet::new();
    for log in logs {
        for o in &log.orders {
            told.insert(o.clone(), log.user.clone());
        }
        maybe.extend(log.maybe.iter().cloned());
    }
    l.figures.told_orders = told.len() as u64;

    // The rows.
    let rows: Vec<(u64, String, String, Option<String>)> = db
        .exec(
            "SELECT id, user_id, CAST(status AS CHAR), pay_ref FROM orders WHERE voucher_id = ?",
            (v.get(),),
        )
        .await?;
    let by_id: HashMap<String, (String, String, Option<String>)> = rows
        .iter()
        .map(|(id, u, s, r)| (id.to_string(), (u.clone(), s.clone(), r.clone())))
        .collect();
    for (_, _, status, _) in &rows {
        *l.figures.rows.entry(status.clone()).or_default() += 1;
    }
    for (order, user) in &told {
        match by_id.get(order) {
            None => l.failures.push(format!(
                "order {order} of {user}: the buyer was told it is theirs (202 or already_purchased), no row"
            )),
            Some((owner, ..)) if owner != user => l.failures.push(format!(
                "order {order}: told to {user}, the row names {owner}"
            )),
            Some(_) => {}
        }
    }
    let untold: Vec<&String> = by_id
        .iter()
        .filter(|(id, (_, status, _))| !told.contains_key(*id) && status != "rejected")
        .map(|(id, _)| id)
        .collect();
    if !untold.is_empty() {
        let examples: Vec<String> = untold
            .iter()
            .take(5)
            .map(|id| {
                let (user, status, _) = &by_id[*id];
                let log = logs.iter().find(|l| &l.user == user);
                format!(
                    "{id} ({status}) of {user}, who was told {:?} and ended {:?}",
                    log.map(|l| &l.orders),
                    log.map(|l| &l.outcome)
                )
            })
            .collect();
        l.notes.push(format!(
            "{} rows no buyer was told of ({} named by a 503), e.g. {examples:?}",
            untold.len(),
            untold.iter().filter(|id| maybe.contains(**id)).count(),
        ));
    }

    // Dead letters.
    for b in Bucket::all(v, storm.opts.buckets) {
        for d in storm.backends.streams.dead_letters(b).await? {
            l.figures.dead_letters += 1;
            l.failures.push(format!(
                "dead letter in bucket {b}: {:?} (reason {:?})",
                d.entry.fields, d.reason
            ));
        }
    }

    // Units.
    let (stock, stock_left): (i64, i64) = db
        .exec_first(
            "SELECT stock, stock_left FROM vouchers WHERE id = ?",
            (v.get(),),
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("voucher {v} has no row"))?;
    l.figures.stock = stock;
    l.figures.stock_left_db = stock_left;
    let held: i64 = ["confirmed", "awaiting_payment", "paid"]
        .iter()
        .map(|s| l.figures.rows.get(*s).copied().unwrap_or(0) as i64)
        .sum();
    if held + stock_left != stock {
        l.failures.push(format!(
            "units: {held} held orders + stock_left {stock_left} != stock {stock}"
        ));
    }
    if let Some(n) = l.figures.rows.get("awaiting_payment") {
        l.failures
            .push(format!("{n} orders still await payment at rest"));
    }
    let status = seckill_shared::sale_status::SaleSources {
        sales: &storm.backends.sales,
        streams: &storm.backends.streams,
        db: &storm.backends.db,
    }
    .voucher_status(v)
    .await?
    .ok_or_else(|| anyhow::anyhow!("seckill status knows no voucher {v}"))?;
    let in_redis = status.stock_left_redis.unwrap_or(-1) + status.in_transit;
    l.figures.stock_left_redis = in_redis;
    if in_redis != stock_left {
        l.failures.push(format!(
            "units back on sale: Redis {in_redis} (stock over the buckets, with {} in transit), database {stock_left}",
            status.in_transit
        ));
    }

    // Money.
    let payments: Vec<(String, u64, String, i64)> = db
        .exec(
            "SELECT payment_id, order_id, CAST(outcome AS CHAR), amount_minor FROM payments WHERE voucher_id = ?",
            (v.get(),),
        )
        .await?;
    let mut outcome_of: HashMap<&str, &str> = HashMap::new();
    for (pid, order, outcome, _) in &payments {
        *l.figures.payments.entry(outcome.clone()).or_default() += 1;
        outcome_of.insert(pid, outcome);
        match outcome.as_str() {
            "paid" => match by_id.get(&order.to_string()) {
                Some((_, s, r)) if s == "paid" && r.as_deref() == Some(pid) => {}
                other => l.failures.push(format!(
                    "payment {pid} is paid, its order {order} is {:?}",
                    other.map(|(_, s, r)| (s, r))
                )),
            },
            "received" => l.failures.push(format!(
                "payment {pid} of order {order} is still undecided (received)"
            )),
            _ => {}
        }
    }
    for (id, (_, s, r)) in &by_id {
        if s == "paid" {
            let ok = r
                .as_deref()
                .and_then(|r| outcome_of.get(r))
                .is_some_and(|o| *o == "paid");
            if !ok {
                l.failures.push(format!(
                    "order {id} is paid by {r:?}, which no paid payment row says"
                ));
            }
        }
    }
    let report = seckill_cli::ops::reconcile::reconcile(&storm.backends, v, false).await?;
    let listed: HashSet<&str> = report
        .refunds_due
        .iter()
        .map(|r| r.payment_id.as_str())
        .collect();
    l.figures.refunds_listed = listed.len() as u64;
    for (pid, order, outcome, _) in &payments {
        if (outcome == "refund_due" || outcome == "refused") && !listed.contains(pid.as_str()) {
            l.failures.push(format!(
                "payment {pid} of order {order} is {outcome} but reconcile does not list it"
            ));
        }
    }
    let owed = payments
        .iter()
        .filter(|p| p.2 == "refund_due" || p.2 == "refused")
        .count() as u64;
    if status.refunds_due != owed {
        l.failures.push(format!(
            "seckill status counts {} refunds due, the payments table {owed}",
            status.refunds_due
        ));
    }
    for d in report
        .discrepancies
        .iter()
        .filter(|d| d.class != "dead_lettered")
    {
        l.failures.push(format!(
            "reconcile: {} × {} (e.g. {:?})",
            d.count, d.class, d.examples
        ));
    }
    for log in logs {
        for p in log.payments.iter().filter(|p| p.succeeded) {
            match outcome_of.get(p.payment_id.as_str()) {
                None => l.failures.push(format!(
                    "money taken, recorded nowhere: payment {} of order {} (answer {})",
                    p.payment_id, p.order_id, p.answer
                )),
                Some(o) if !["paid", "refund_due", "refused"].contains(o) => {
                    l.failures.push(format!(
                        "payment {} of order {} took money and is recorded {o}",
                        p.payment_id, p.order_id
                    ));
                }
                Some(o) => {
                    if p.answer == "200 paid" && *o != "paid" {
                        l.failures.push(format!(
                            "payment {} was answered paid and is recorded {o}",
                            p.payment_id
                        ));
                    }
                    // Refunded though sent in time, of the right amount, for an order
                    // no other payment paid: its delivery came after the deadline.
                    let order_paid = by_id.get(&p.order_id).is_some_and(|(_, s, _)| s == "paid");
                    if *o == "refund_due" && !p.late && p.right_amount && !order_paid {
                        l.figures.paid_in_time_refunded += 1;
                    }
                }
            }
        }
    }
    if l.figures.paid_in_time_refunded > 0 {
        l.notes.push(format!(
            "{} payments sent before their deadline were decided refund_due (delivered after it, through the outage)",
            l.figures.paid_in_time_refunded
        ));
    }

    // Each buyer looks up each order.
    let looks = futures::future::join_all(logs.iter().flat_map(|log| {
        let token = storm.shop.token(&log.user, false);
        log.orders.iter().map(move |o| {
            let token = token.clone();
            async move {
                let path = format!("/orders/{o}");
                let a = storm
                    .shop
                    .until_final(
                        &Call::get("lookup", &path).token(&token),
                        Duration::from_secs(60),
                    )
                    .await;
                (o.clone(), a)
            }
        })
    }))
    .await;
    for (o, a) in looks {
        let Some((_, db_status, _)) = by_id.get(&o) else {
            continue;
        };
        match a {
            Some(a) if a.status == 200 && a.str("status").as_deref() == Some(db_status) => {}
            Some(a) => l.failures.push(format!(
                "GET /orders/{o}: {} {} while the row is {db_status}",
                a.status, a.body
            )),
            None => l.failures.push(format!("GET /orders/{o}: never answered")),
        }
    }

    // What no client should see.
    let tally = storm.shop.tally.lock().expect("tally");
    for u in tally.unexpected.iter().take(20) {
        l.failures.push(format!("unexpected answer: {u}"));
    }
    if tally.unexpected.len() > 20 {
        l.failures.push(format!(
            "... {} unexpected answers in all",
            tally.unexpected.len()
        ));
    }
    for u in tally.unanswered.iter().take(20) {
        l.failures.push(format!("never answered: {u}"));
    }
    Ok(l)
}

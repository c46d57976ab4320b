//! Repair: reopen a sale that Redis lost, without reopening what was already sold.
//!
//! Redis can lose a voucher's sale hash (a restart without its data, a failover to a
//! replica that had not caught up, an operator's FLUSH, eviction). The database row is
//! the truth for the sale's description and for the orders drained so far; Redis still
//! holds whatever survived of the orders admitted but not drained. A repair, run by
//! whichever request first finds the sale missing:
//!
//! 1. records, from the orders stream, the buyer of every order still in it
//!    (`HSETNX`: a buyer the hash still has is never overwritten). This comes before the
//!    database read, so an entry trimmed in the meantime was committed before that read
//!    and is counted there instead;
//! 2. reads the voucher row and all its orders in one consistent snapshot (one read-only
//!    Data API transaction, pages of `data_api::SNAPSHOT_PAGE_ROWS` rows, each well within
//!    the 1 MiB response limit), recording each page's buyers in Redis as it goes
//!    (`HSETNX`);
//! 3. reopens the sale only if it is still missing, with stock = `stock_left` of the
//!    snapshot minus the buyers the snapshot had not settled (admitted, not yet drained,
//!    so not yet taken from `stock_left`), never more, never below 0
//!    (`lua/preload.lua`).
//!
//! While the sale hash is missing no admission can happen (`lua/admit.lua` answers "not
//! loaded" before any write), so the buyers hash only grows by repairs, which is why
//! step 3's count is exact. Everything is idempotent: concurrent repairs merge the same
//! buyers and only the first creates the sale. Past buyers, drained or not, hear
//! `already_purchased`; admissions after the repair fit in the database's stock.
//!
//! Only one instance repairs a voucher at a time (a Redis lock, [`REPAIR_LOCK_MS`]):
//! when a hot sale is lost, thousands of requests find it missing at once, and each
//! reading every order through the Data API would bury the database. The others wait up
//! to [`REPAIR_WAIT_MS`] for the sale to reappear and then go on, or answer `503`
//! (retry). A repairer that dies leaves the lock to expire.
//!
//! 4. for a voucher with a payment step, restores the deadlines of the orders the database
//!    holds `awaiting_payment`, and of the orders its streams still hold undrained
//!    (admission + pay window, as the admission wrote it; the drainer restores the same
//!    when it writes them, but until then a payment would find such an order closed), so
//!    every open order can still be paid and still expire. An undrained order the
//!    database already holds closed or refused (written, its ack lost) gets none: it
//!    would expire, and give a unit back, a second time.
//!
//! A repair is bounded, and resumable: one request's part reads at most
//! `SECKILL_REPAIR_PART_ROWS` order rows (100,000 by default) or [`REPAIR_PART_TIME`],
//! whichever comes first, well within the lock and the function's timeout. After every
//! page it saves how far it got ([`Progress`]: the last buyer read through and the
//! counts so far) in Redis; a part that stops before the end answers `503` and the next
//! request, on any instance, goes on from there, in a new snapshot. A repair that dies
//! loses at most its last page. The parts' snapshots are taken at different instants:
//! an order the drainer commits between two parts for a buyer already read counts in
//! the later snapshot's `stock_left` but not among the settled, so its unit is taken
//! twice and stays unsold (as a lost bucket's units do), never sold twice. A change in
//! which buckets are missing, or buyers lost again, begins the repair again.
//!
//! A voucher with stock buckets repairs every bucket whose sale is missing,
//! each from its own stream and its own buyers' rows. The stock goes where it is known
//! exactly: with every bucket lost, all of it to bucket 0 (the others borrow from it);
//! with some buckets still live, a lost bucket reopens empty, because the live buckets'
//! stock and the database's cannot be read at one instant: its units stay unsold
//! (`seckill reconcile` shows them) rather than risk selling one twice.
//!
//! What no repair can bring back: admissions whose stream entry and buyer were both lost
//! (acknowledged in the last moment before Redis lost unsynced writes), and closes (paid,
//! cancelled) Redis decided but lost before the drainer recorded them: those orders are
//! open again until paid or expired. docs/promises.md states that window.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use seckill_shared::adapters::closes::restore_deadlines;
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{
    Bucket, OrderId, OrderStatus, Reopen, UnixMillis, UserId, Voucher, VoucherId, now_millis,
};
use seckill_shared::error::StoreError;

use crate::app::App;
use crate::cache::Known;
use crate::error::ApiError;
use crate::lookup::undrained_orders;

/// How long a repair lock lasts if its holder never releases it (it died).
pub const REPAIR_LOCK_MS: u64 = 10_000;

/// How long a request waits for another instance's repair before answering `503`.
/// Below the function's timeout (10 s) with room for the admission after it.
pub const REPAIR_WAIT_MS: i64 = 3_000;

/// How long one request's part of a repair reads the database at most (then one more
/// page at most): with the reopening after it, well within [`REPAIR_LOCK_MS`] and the
/// function's 10 s timeout.
pub const REPAIR_PART_TIME: Duration = Duration::from_secs(4);
const _: () = assert!(REPAIR_PART_TIME.as_millis() * 2 <= REPAIR_LOCK_MS as u128);

/// How long a saved [`Progress`] is kept: a repair nobody goes on with for this long
/// (its sale over, or never asked for again) begins again.
const PROGRESS_TTL_MS: u64 = 15 * 60 * 1_000;

/// The database's voucher `id`, read within `caller`'s share of reads (none taken for
/// an anonymous read, which found the voucher in the database itself before).
async fn lookup(
    app: &App,
    id: VoucherId,
    caller: Option<&UserId>,
) -> Result<Option<Voucher>, ApiError> {
    if let Some(user) = caller {
        app.take_shared_read(user).await?;
    }
    Ok(app.db.voucher(id).await?)
}

/// How often a waiting request looks for the repaired sale.
const REPAIR_POLL: Duration = Duration::from_millis(50);

/// Reopens a voucher that Redis does not have, from the database and what Redis still
/// holds, or waits for the instance that is doing it. Returns false when the database
/// does not know the voucher; [`ApiError::Ended`] for a sale that has ended.
///
/// Every route that finds a sale missing comes here (a purchase, the waiting room), so
/// the guards sit here too: an id this instance learned the database does not know
/// costs no database read again (for [`crate::cache::MISSING_TTL_MS`]); a voucher no
/// instance's memory holds is looked up in the database only within `caller`'s share
/// of reads, across instances ([`App::take_shared_read`], the budget of the order
/// reads: made-up ids, each new, cost a database read each, and every warm instance
/// would otherwise grant one user its own allowance of them); and a sale that has
/// ended is never reopened. It sells nothing more, and reopening it reads all its
/// orders: anyone could ask that of every past sale in turn (their ids are
/// sequential) and keep the database from the drainer during a live one.
pub async fn repair(
    app: &App,
    id: VoucherId,
    now: UnixMillis,
    caller: Option<&UserId>,
) -> Result<bool, ApiError> {
    if app.cache.short_circuit(id, now) == Some(Known::Missing) {
        return Ok(false);
    }
    // An id the database does not know is answered 404 without taking a lock (a
    // voucher seen before is known: vouchers can only be deleted before their sale).
    let voucher = match app.cache.voucher(id) {
        Some(v) => v,
        None => match lookup(app, id, caller).await? {
            Some(v) => {
                app.cache.learn_voucher(&v);
                v
            }
            None => {
                app.cache.learn_missing(id, now);
                return Ok(false);
            }
        },
    };
    // A sale at its very end may still be reopened (Redis's clock then decides), never
    // one clearly over.
    if app.cache.clearly_over(&voucher.window, now) {
        return Err(ApiError::Ended);
    }
    let buckets = voucher.buckets;
    let sales = app.sales().await?;
    // Who holds it, for someone inspecting Redis; nothing compares it.
    let holder = format!("pid {} at {now}", std::process::id());
    if !sales.try_lock_repair(id, &holder, REPAIR_LOCK_MS).await? {
        return wait_for_repair(sales, id, buckets).await;
    }
    // A voucher that lets a buyer buy again after a close: its closed orders name no
    // buyer when buyers are restored (`lua/restore_buyers.lua`).
    let rebuy = voucher.payment.map_or(0, |p| p.rebuys());
    let repaired = repair_locked(app, sales, id, buckets, rebuy, now).await;
    if let Err(error) = sales.unlock_repair(id).await {
        tracing::warn!(%error, "repair lock not released; it expires by itself");
    }
    repaired
}

/// Waits for another instance's repair to bring the sale back (every bucket of it).
async fn wait_for_repair(
    sales: &RedisSales,
    id: VoucherId,
    buckets: u16,
) -> Result<bool, ApiError> {
    let deadline = now_millis() + REPAIR_WAIT_MS;
    'poll: while now_millis() < deadline {
        tokio::time::sleep(REPAIR_POLL).await;
        for b in Bucket::all(id, buckets) {
            if sales.stock_left(b).await?.is_none() {
                continue 'poll;
            }
        }
        return Ok(true);
    }
    Err(ApiError::unavailable(
        "redis",
        format!("voucher {id} is being repaired by another instance"),
    ))
}

/// How far a repair got, saved in Redis after every page it reads (as JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The buckets (indexes) found missing when the repair began: it goes on only while
    /// the same buckets are missing.
    pub missing: Vec<u16>,
    /// The last buyer whose orders were read and merged.
    pub read_through: Option<String>,
    /// Buyers the database had settled, per bucket index, over the pages read.
    pub settled: BTreeMap<u16, u64>,
    /// Of those, per bucket index, the ones Redis had closed with their unit given back
    /// (not settled yet; a voucher that lets buyers buy again restores no buyer for
    /// them).
    #[serde(default)]
    pub returned: BTreeMap<u16, u64>,
    /// Buyers restored from the streams, and from the database's pages.
    pub from_stream: u64,
    pub from_db: u64,
    /// Order rows read, and parts (requests) that read them.
    pub rows: u64,
    pub parts: u32,
}

/// The saved progress of `id`'s repair; one that does not parse is dropped (the
/// repair begins again, which is always correct).
async fn saved_progress(sales: &RedisSales, id: VoucherId) -> Result<Option<Progress>, StoreError> {
    Ok(sales
        .repair_progress(id)
        .await?
        .and_then(|record| match serde_json::from_str(&record) {
            Ok(p) => Some(p),
            Err(error) => {
                tracing::warn!(%error, record, "unreadable repair progress dropped");
                None
            }
        }))
}

async fn save_progress(sales: &RedisSales, id: VoucherId, p: &Progress) -> Result<(), StoreError> {
    let record = serde_json::to_string(p).expect("a progress record serializes");
    sales
        .save_repair_progress(id, &record, PROGRESS_TTL_MS)
        .await
}

/// The repair itself, under the lock: every bucket of the voucher whose sale is missing
/// (a voucher of one bucket: that bucket, whatever Redis says, as before buckets),
/// going on from a saved [`Progress`] if there is one.
async fn repair_locked(
    app: &App,
    sales: &RedisSales,
    id: VoucherId,
    k: u16,
    rebuy: u8,
    now: UnixMillis,
) -> Result<bool, ApiError> {
    // A bucket can go missing while this runs, but none comes back (a repair holds the
    // lock): the buckets found live here stay counted as live.
    let mut missing = Vec::new();
    for b in Bucket::all(id, k) {
        if k == 1 || sales.stock_left(b).await?.is_none() {
            missing.push(b);
        }
    }
    if missing.is_empty() {
        sales.clear_repair_progress(id).await?;
        return Ok(true);
    }
    let indexes: Vec<u16> = missing.iter().map(|b| b.index()).collect();
    let mut progress = match saved_progress(sales, id).await? {
        Some(p) if p.missing == indexes => p,
        _ => {
            // A repair begins: the streams' buyers first (step 1).
            let mut p = Progress {
                missing: indexes,
                ..Progress::default()
            };
            for b in &missing {
                p.from_stream += sales.restore_buyers_from_stream(*b, rebuy).await?;
            }
            p
        }
    };
    progress.parts += 1;
    let Some((voucher, mut snapshot)) = app
        .db
        .sale_snapshot_after(id, progress.read_through.as_deref())
        .await?
    else {
        sales.clear_repair_progress(id).await?;
        app.cache.learn_missing(id, now);
        return Ok(false);
    };
    app.cache.learn_voucher(&voucher);
    // Orders of the snapshot per bucket (their buyer's bucket), merged into the missing
    // buckets' buyers hashes as they come; the progress saved after every page.
    let began = Instant::now();
    let rows_before = progress.rows;
    let mut read_all = false;
    let merged: Result<(), StoreError> = async {
        while !read_all {
            let Some(page) = snapshot.next_page().await? else {
                read_all = true;
                break;
            };
            let mut parts: BTreeMap<Bucket, Vec<(String, OrderId)>> = BTreeMap::new();
            for (user, order) in page {
                parts
                    .entry(voucher.bucket_of(&user))
                    .or_default()
                    .push((user, order));
            }
            for (b, part) in parts {
                *progress.settled.entry(b.index()).or_default() += part.len() as u64;
                if missing.contains(&b) {
                    // A rejected order took no unit: closed in Redis (a cancel racing its
                    // write), it gives none back, and its skipped buyer is no longer one
                    // the database settled.
                    let (rejected, took): (Vec<_>, Vec<_>) =
                        part.into_iter().partition(|(_, o)| snapshot.rejected(*o));
                    let restored = sales.restore_buyers(b, &took, rebuy).await?;
                    progress.from_db += restored.added;
                    *progress.returned.entry(b.index()).or_default() += restored.returned;
                    let restored = sales.restore_buyers(b, &rejected, rebuy).await?;
                    progress.from_db += restored.added;
                    let settled = progress.settled.entry(b.index()).or_default();
                    *settled = settled.saturating_sub(restored.returned);
                }
            }
            progress.read_through = snapshot.read_through().map(str::to_string);
            progress.rows = rows_before + snapshot.rows_read();
            save_progress(sales, id, &progress).await?;
            if snapshot.rows_read() >= app.repair_part_rows || began.elapsed() >= REPAIR_PART_TIME {
                break;
            }
        }
        Ok(())
    }
    .await;
    snapshot.finish().await;
    merged?;
    if !read_all {
        tracing::warn!(
            voucher_id = id.get(),
            part = progress.parts,
            rows = progress.rows,
            read_through = progress.read_through.as_deref(),
            "repair part done; the next request goes on"
        );
        return Err(ApiError::unavailable(
            "redis",
            format!(
                "voucher {id} is being reloaded from the database ({} order rows read in {} part(s)); retry",
                progress.rows, progress.parts
            ),
        ));
    }
    let settled: BTreeMap<Bucket, u64> = progress
        .settled
        .iter()
        .filter_map(|(i, n)| Some((Bucket::new(id, *i, k)?, *n)))
        .collect();
    let (from_stream, from_db) = (progress.from_stream, progress.from_db);
    // The database's stock_left, minus the units of orders it has not settled, is what
    // the sale still has. With one bucket, or every bucket lost, it all goes to bucket 0
    // (the others reopen empty and borrow from it). With other buckets still live, their
    // stock cannot be read together with the database's, so a lost bucket reopens empty:
    // its units are stranded, never sold twice (docs/promises.md). Except before
    // anything was sold (a preload that stopped part-way, or a loss before the sale
    // began): then each missing bucket gets its share, as the preload would have given
    // it. "Nothing sold" is no order row in the database, of any status, and every
    // bucket as the preload left it (its share, no buyer, no order entry): no buyer alone
    // is not enough, since a voucher that lets buyers buy again forgets a buyer who
    // cancelled, while the units that sale borrowed stay moved.
    let all_lost = missing.len() == usize::from(k);
    let mut pristine = k > 1 && progress.rows == 0;
    for b in Bucket::all(id, k) {
        if !pristine {
            break;
        }
        pristine = sales.as_preloaded(b, b.share(voucher.stock, k)).await?;
    }
    let mut bucket0_stock = if all_lost { voucher.db_stock_left } else { 0 };
    if all_lost {
        for b in missing.iter().filter(|b| b.index() > 0) {
            let pending = sales
                .buyer_count(*b)
                .await?
                .saturating_sub(settled.get(b).copied().unwrap_or(0));
            bucket0_stock -= pending as i64;
        }
    }
    // Bucket 0 last: instances that never saw the voucher look for it first.
    for b in missing.iter().rev() {
        let stock = match (pristine, b.index()) {
            (true, _) => b.share(voucher.stock, k),
            (false, 0) => bucket0_stock,
            (false, _) => 0,
        };
        let settled = settled.get(b).copied().unwrap_or(0);
        let returned = progress.returned.get(&b.index()).copied().unwrap_or(0);
        // Units given back by closes the database had not settled are the sale's again
        // where its stock is known (every bucket lost) and was read in the same snapshot
        // as those closes (one part): lua/preload.lua counts them in. Not otherwise: a
        // bucket reopened empty beside live ones (those units may have moved on to
        // another bucket since), or a repair of several parts, whose last snapshot's
        // stock may already have a close back that an earlier part saw unsettled.
        let (settled, returned) = match all_lost && progress.parts == 1 {
            true => (settled, returned),
            false => (settled.saturating_sub(returned), 0),
        };
        match sales
            .reopen_bucket(&voucher, *b, stock, settled, returned)
            .await?
        {
            Reopen::Created => tracing::warn!(
                voucher_id = id.get(),
                bucket = %b,
                db_stock_left = voucher.db_stock_left,
                settled,
                buyers_from_stream = from_stream,
                buyers_from_db = from_db,
                "voucher was missing in redis; reopened from the database"
            ),
            Reopen::AlreadyLive => {}
            Reopen::BuyersLost => {
                // What was merged is gone with them: the next repair begins again.
                sales.clear_repair_progress(id).await?;
                return Err(ApiError::unavailable(
                    "redis",
                    format!("voucher {b}: buyers lost again during repair"),
                ));
            }
        }
    }
    if k > 1 {
        // Stock may be back (all of it in bucket 0): the voucher's sold-out mark, set
        // while its buckets were empty or missing, must not outlive the repair.
        transfers::clear_sold_out(&sales.conn(), id).await?;
    }
    if let Some(terms) = voucher.payment {
        let mut after = 0;
        loop {
            let page = app.db.awaiting_payment(id, after).await?;
            let Some((last, ..)) = page.last() else { break };
            after = last.get();
            let mut parts: BTreeMap<Bucket, Vec<_>> = BTreeMap::new();
            for (o, u, d) in &page {
                parts
                    .entry(voucher.bucket_of(u))
                    .or_default()
                    .push((*o, u.as_str(), *d));
            }
            for (b, open) in parts {
                restore_deadlines(&sales.conn(), b, &open).await?;
            }
        }
        for b in &missing {
            undrained_deadlines(app, sales, &voucher, *b, terms.pay_within_ms).await?;
        }
    }
    sales.clear_repair_progress(id).await?;
    Ok(true)
}

/// Gives the orders `bucket`'s stream holds undrained their deadlines back (step 4):
/// admission + `pay_within_ms`, the deadline the admission wrote and the drainer writes
/// again (`ZADD NX`, so a deadline still there or restored meanwhile stays). Without it
/// such an order would be open in the database once drained, yet a payment before then
/// would find it neither open nor closed in Redis. Left out: orders the database holds
/// in any status but `awaiting_payment` (written and settled while their entry waited for
/// its ack), whose deadline would expire them a second time. Returns how many were given.
async fn undrained_deadlines(
    app: &App,
    sales: &RedisSales,
    voucher: &Voucher,
    bucket: Bucket,
    pay_within_ms: i64,
) -> Result<usize, ApiError> {
    let undrained = undrained_orders(sales, bucket, 0).await?;
    if undrained.is_empty() {
        return Ok(0);
    }
    let ids: Vec<OrderId> = undrained.iter().map(|o| o.id).collect();
    let rows = app.db.order_statuses(voucher.id, &ids).await?;
    let open: Vec<(OrderId, &str, UnixMillis)> = undrained
        .iter()
        .filter(|o| {
            rows.get(&o.id)
                .is_none_or(|s| *s == OrderStatus::AwaitingPayment)
        })
        .map(|o| (o.id, o.user.as_str(), o.admitted_ms + pay_within_ms))
        .collect();
    restore_deadlines(&sales.conn(), bucket, &open).await?;
    Ok(open.len())
}

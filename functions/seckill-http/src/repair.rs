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
//!    holds `awaiting_payment` (orders not drained yet get theirs back when the drainer
//!    writes them), so they can still be paid and still expire.
//!
//! What no repair can bring back: admissions whose stream entry and buyer were both lost
//! (acknowledged in the last moment before Redis lost unsynced writes), and closes (paid,
//! cancelled) Redis decided but lost before the drainer recorded them: those orders are
//! open again until paid or expired. README, "Promises", states that window.

use std::time::Duration;

use seckill_shared::adapters::closes::restore_deadlines;
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::domain::{Reopen, UnixMillis, VoucherId, now_millis};
use seckill_shared::error::StoreError;

use crate::app::App;
use crate::error::ApiError;

/// How long a repair lock lasts if its holder never releases it (it died).
pub const REPAIR_LOCK_MS: u64 = 10_000;

/// How long a request waits for another instance's repair before answering `503`.
/// Below the function's timeout (10 s) with room for the admission after it.
pub const REPAIR_WAIT_MS: i64 = 3_000;

/// How often a waiting request looks for the repaired sale.
const REPAIR_POLL: Duration = Duration::from_millis(50);

/// Reopens a voucher that Redis does not have, from the database and what Redis still
/// holds, or waits for the instance that is doing it. Returns false when the database
/// does not know the voucher.
pub async fn repair(app: &App, id: VoucherId, now: UnixMillis) -> Result<bool, ApiError> {
    // An id the database does not know is answered 404 without taking a lock (a
    // voucher seen before is known: vouchers can only be deleted before their sale).
    if app.cache.voucher(id).is_none() {
        match app.db.voucher(id).await? {
            Some(v) => app.cache.learn_voucher(&v),
            None => {
                app.cache.learn_missing(id, now);
                return Ok(false);
            }
        }
    }
    let sales = app.sales().await?;
    // Who holds it, for someone inspecting Redis; nothing compares it.
    let holder = format!("pid {} at {now}", std::process::id());
    if !sales.try_lock_repair(id, &holder, REPAIR_LOCK_MS).await? {
        return wait_for_repair(sales, id).await;
    }
    let repaired = repair_locked(app, sales, id, now).await;
    if let Err(error) = sales.unlock_repair(id).await {
        tracing::warn!(%error, "repair lock not released; it expires by itself");
    }
    repaired
}

/// Waits for another instance's repair to bring the sale back.
async fn wait_for_repair(sales: &RedisSales, id: VoucherId) -> Result<bool, ApiError> {
    let deadline = now_millis() + REPAIR_WAIT_MS;
    while now_millis() < deadline {
        tokio::time::sleep(REPAIR_POLL).await;
        if sales.stock_left(id).await?.is_some() {
            return Ok(true);
        }
    }
    Err(ApiError::Unavailable(StoreError::Unavailable {
        backend: "redis",
        detail: format!("voucher {id} is being repaired by another instance"),
    }))
}

/// The repair itself, under the lock.
async fn repair_locked(
    app: &App,
    sales: &RedisSales,
    id: VoucherId,
    now: UnixMillis,
) -> Result<bool, ApiError> {
    let from_stream = sales.restore_buyers_from_stream(id).await?;
    let Some((voucher, mut snapshot)) = app.db.sale_snapshot(id).await? else {
        app.cache.learn_missing(id, now);
        return Ok(false);
    };
    app.cache.learn_voucher(&voucher);
    let mut settled: u64 = 0;
    let mut from_db: u64 = 0;
    let merged: Result<(), StoreError> = async {
        while let Some(page) = snapshot.next_page().await? {
            settled += page.len() as u64;
            from_db += sales.restore_buyers(id, &page).await?;
        }
        Ok(())
    }
    .await;
    snapshot.finish().await;
    merged?;
    match sales.reopen(&voucher, settled).await? {
        Reopen::Created => tracing::warn!(
            voucher_id = id.get(),
            db_stock_left = voucher.db_stock_left,
            settled,
            buyers_from_stream = from_stream,
            buyers_from_db = from_db,
            "voucher was missing in redis; reopened from the database"
        ),
        Reopen::AlreadyLive => {}
        Reopen::BuyersLost => {
            return Err(ApiError::Unavailable(StoreError::Unavailable {
                backend: "redis",
                detail: format!("voucher {id}: buyers lost again during repair"),
            }));
        }
    }
    if voucher.payment.is_some() {
        let mut after = 0;
        loop {
            let page = app.db.awaiting_payment(id, after).await?;
            let Some((last, ..)) = page.last() else { break };
            after = last.get();
            let open: Vec<_> = page.iter().map(|(o, u, d)| (*o, u.as_str(), *d)).collect();
            restore_deadlines(&sales.conn(), id, &open).await?;
        }
    }
    Ok(true)
}

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
//! What no repair can bring back: admissions whose stream entry and buyer were both lost
//! (acknowledged in the last moment before Redis lost unsynced writes). README,
//! "Promises", states that window.

use seckill_shared::adapters::redis::Reopen;
use seckill_shared::domain::{UnixMillis, VoucherId};
use seckill_shared::error::StoreError;

use crate::app::App;
use crate::error::ApiError;

/// Reopens a voucher that Redis does not have, from the database and what Redis still
/// holds. Returns false when the database does not know the voucher either.
pub async fn repair(app: &App, id: VoucherId, now: UnixMillis) -> Result<bool, ApiError> {
    let sales = app.sales().await?;
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
    Ok(true)
}

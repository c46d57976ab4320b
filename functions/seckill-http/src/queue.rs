//! The waiting room: `POST /vouchers/{id}/queue` (join) and `GET /vouchers/{id}/queue`
//! (look), and the entry check the admission makes for a voucher with a room.
//!
//! Each request is one script call on the voucher's slot (`lua/queue.lua`), which
//! answers the caller's position with Redis's clock, the window and the room; whether
//! the position is served is computed here from them
//! ([`WaitingRoom::served_at`](seckill_shared::domain::WaitingRoom::served_at)), so no
//! job moves the queue and every instance agrees. A served caller gets an entry token
//! ([`seckill_shared::entry`]) bound to them and the voucher.

use http::StatusCode;
use lambda_http::{Body, Request, Response};
use seckill_shared::adapters::queue::{self, QueueAsk, QueueOutcome, QueueReply, QueueView};
use seckill_shared::adapters::transfers;
use seckill_shared::auth::Identity;
use seckill_shared::domain::{
    ENTRY_TOKEN_TTL_MS, Standing, UnixMillis, VoucherId, format_rfc3339_millis,
};
use seckill_shared::entry;
use seckill_shared::error::StoreError;
use serde_json::json;

use crate::app::App;
use crate::error::{ApiError, json_response};
use crate::lookup::{not_found_voucher, not_loaded};
use crate::repair::repair;

/// The header an admission of a voucher with a room carries its entry token in.
pub const ENTRY_HEADER: &str = "seckill-entry";

/// How soon a caller told `sold_out` while units may still come back looks again, at
/// least and at most (until the earliest payment deadline), and once that deadline has
/// passed (the drainer's sweep returns the unit).
const RETURN_LOOK_MIN_MS: i64 = 1_000;
const RETURN_LOOK_MAX_MS: i64 = 30_000;
const RETURN_LOOK_DUE_MS: i64 = 10_000;

/// How soon a waiter looks again while returned units are held for the line (one may be
/// offered to them, or an offer ahead of them lapse).
const HELD_LOOK_MS: i64 = 5_000;

/// `POST /vouchers/{id}/queue` (`join`) or `GET /vouchers/{id}/queue` (user).
pub(crate) async fn standing(
    app: &App,
    caller: &Identity,
    now: UnixMillis,
    id: VoucherId,
    join: bool,
) -> Result<Response<Body>, ApiError> {
    if !app.limiter.allow(&caller.user, now) {
        return Err(ApiError::RateLimited);
    }
    let sales = app.sales().await?;
    let mut ask = if join { QueueAsk::Join } else { QueueAsk::Look };
    // A look at a voucher of several buckets whose sold-out mark stands (an admission's
    // or an earlier look's proof): the caller is told to the line in the same call
    // (unless they hold an order), not in a second one after the proof.
    let mut marked = None;
    let several = app.cache.look(id, now).1.filter(|s| s.buckets > 1);
    if let (false, Some(shape)) = (join, several) {
        let conn = sales.conn();
        let m = transfers::is_marked_sold_out(&conn, id).await?;
        marked = Some(m);
        if m && !queue::has_order(&conn, id, shape.buckets, &caller.user).await? {
            ask = QueueAsk::LookSoldOut;
        }
    }
    let mut reply = queue::queue(&sales.conn(), id, &caller.user, ask).await?;
    if reply == QueueReply::NotLoaded {
        // Redis lost the sale (or never had it): a live sale is repaired as an
        // admission would; an unknown voucher is 404, and a sale that has ended is
        // never repaired.
        match repair(app, id, now, Some(&caller.user)).await {
            Ok(true) => {}
            Ok(false) => return Err(not_found_voucher(id)),
            // Over and gone from Redis: no queue left to join (`409 ended`, as a join
            // after the end) nor a place in it to look at.
            Err(ApiError::Ended) if !join => {
                return Err(ApiError::NotFound(format!(
                    "the sale of voucher {id} has ended; its waiting room is gone"
                )));
            }
            Err(e) => return Err(e),
        }
        reply = queue::queue(&sales.conn(), id, &caller.user, ask).await?;
    }
    if reply == QueueReply::NeedsRestore {
        reply = restore_and_ask_again(app, sales, id, &caller.user, ask).await?;
    }
    let mut view = match reply {
        QueueReply::Room(view) => {
            app.cache.learn_shape(
                id,
                queue::SaleShape {
                    buckets: view.buckets,
                    room: Some(view.room),
                },
            );
            view
        }
        QueueReply::NeedsRestore => return Err(being_restored(id)),
        QueueReply::NoRoom => {
            return Err(ApiError::NotFound(format!(
                "voucher {id} has no waiting room"
            )));
        }
        QueueReply::NotLoaded => return Err(not_loaded(id)),
    };
    let position = match (view.outcome, view.position) {
        (QueueOutcome::Queued, Some(p)) => p,
        (QueueOutcome::NotOpen, _) => {
            let opens = view.room.opens_at(view.window.begins_ms());
            return Err(ApiError::QueueNotOpen(format!(
                "the queue opens at {}",
                format_rfc3339_millis(opens)
            )));
        }
        (QueueOutcome::Ended, _) => return Err(ApiError::Ended),
        _ => {
            return Err(ApiError::NotFound(format!(
                "you have not joined the queue of voucher {id}"
            )));
        }
    };
    // A join's answer is a promise of a place: written where a repair finds it before
    // it is given (sent again, it writes the same row again).
    if join {
        app.positions
            .record(&app.db, id, &caller.user, position)
            .await?;
    }
    // Sold out to the caller, and when a unit may come back; a caller of a voucher of
    // several buckets is then told to the line (only this instance could tell), which
    // may offer them a held unit at once.
    let mut sold = None;
    if view.offer_until.is_none() && view.now_ms < view.window.ends_ms() {
        sold = sold_out(sales, id, &view, marked).await?;
        if sold.is_some()
            && view.buckets > 1
            && ask != QueueAsk::LookSoldOut
            && !queue::has_order(&sales.conn(), id, view.buckets, &caller.user).await?
            && let QueueReply::Room(again) =
                queue::queue(&sales.conn(), id, &caller.user, QueueAsk::LookSoldOut).await?
        {
            view = again;
            if view.offer_until.is_some() {
                sold = None;
            }
        }
    }
    let served_at = view.room.served_at(view.window.begins_ms(), position);
    let mut body = json!({
        "voucher_id": id.to_string(),
        "position": position,
        "served_at": format_rfc3339_millis(served_at),
        "expected_wait_ms": 0,
    });
    let status = if view.now_ms >= view.window.ends_ms() {
        "ended"
    } else if let Some(until) = view.offer_until {
        // A returned unit is offered to this caller, the earliest waiting position still
        // looking (lua/queue.lua): served again, with a fresh token, until it lapses.
        let expires = view.now_ms.saturating_add(ENTRY_TOKEN_TTL_MS);
        let secrets = app.entry_secrets.get().await?;
        body["entry_token"] = json!(entry::issue(secrets.current(), id, &caller.user, expires));
        body["entry_expires_at"] = json!(format_rfc3339_millis(expires));
        body["offer_expires_at"] = json!(format_rfc3339_millis(until));
        "served"
    } else if let Some(next) = sold {
        // Not for good while orders await payment: an unpaid one gives its unit back at
        // its deadline (a cancel sooner). The caller is told to look again then (at
        // most RETURN_LOOK_MAX_MS ahead, for the cancels), instead of giving up and
        // leaving the returned units to whoever keeps asking.
        body["units_may_return"] = json!(next.is_some());
        if let Some(at) = next {
            // A deadline already past waits for the drainer's sweep (a run a minute):
            // no sooner than RETURN_LOOK_DUE_MS, so the waiters do not ask every second.
            let wait = match at.saturating_sub(view.now_ms) {
                due if due <= 0 => RETURN_LOOK_DUE_MS,
                ahead => ahead.clamp(RETURN_LOOK_MIN_MS, RETURN_LOOK_MAX_MS),
            };
            body["expected_wait_ms"] = json!(wait);
        }
        "sold_out"
    } else {
        match view
            .room
            .standing(view.window.begins_ms(), position, view.now_ms)
        {
            Standing::Waiting { wait_ms } => {
                body["expected_wait_ms"] = json!(wait_ms);
                "waiting"
            }
            Standing::Served => {
                let expires = view.now_ms.saturating_add(ENTRY_TOKEN_TTL_MS);
                let secrets = app.entry_secrets.get().await?;
                body["entry_token"] =
                    json!(entry::issue(secrets.current(), id, &caller.user, expires));
                body["entry_expires_at"] = json!(format_rfc3339_millis(expires));
                "served"
            }
        }
    };
    body["status"] = json!(status);
    Ok(json_response(StatusCode::OK, &body))
}

/// How long one instance may hold a queue's restore before another may take it over.
const RESTORE_LOCK_MS: u64 = 30_000;

/// How long a call waits for another instance's restore of the queue before `503`.
const RESTORE_WAIT_MS: u64 = 3_000;

/// Restores the queue (or waits for the instance restoring it), then asks again.
async fn restore_and_ask_again(
    app: &App,
    sales: &seckill_shared::adapters::redis::RedisSales,
    id: VoucherId,
    user: &seckill_shared::domain::UserId,
    ask: QueueAsk,
) -> Result<QueueReply, ApiError> {
    let waited = std::time::Instant::now();
    loop {
        match restore(app, sales, id).await {
            Ok(()) => {}
            Err(e) if waited.elapsed().as_millis() >= u128::from(RESTORE_WAIT_MS) => {
                return Err(e);
            }
            // Another instance restores it: its counter appears when it is done.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
        let reply = queue::queue(&sales.conn(), id, user, ask).await?;
        if reply != QueueReply::NeedsRestore
            || waited.elapsed().as_millis() >= u128::from(RESTORE_WAIT_MS)
        {
            return Ok(reply);
        }
    }
}

/// Rebuilds the voucher's queue from the positions the database holds
/// (`lua/restore_queue.lua`), one instance at a time: a new sale's first call, or the
/// first after Redis lost the queue or the sale. Until the counter is set nobody joins,
/// so whoever rejoins first after a loss gets a place after everyone who held one.
async fn restore(
    app: &App,
    sales: &seckill_shared::adapters::redis::RedisSales,
    id: VoucherId,
) -> Result<(), ApiError> {
    let conn = sales.conn();
    let holder = format!("{:016x}", rand::random::<u64>());
    if !queue::lock_restore(&conn, id, &holder, RESTORE_LOCK_MS).await? {
        return Err(being_restored(id));
    }
    let restored = async {
        let top = app.db.max_position(id).await?;
        let mut after = 0;
        while after < top {
            let page = app.db.positions_after(id, after).await?;
            let Some((_, last)) = page.last() else {
                break;
            };
            after = *last;
            if !queue::restore_positions(&conn, id, &page, None).await? {
                return Err(ApiError::from(StoreError::Corrupt(format!(
                    "the sale of voucher {id} went missing during its queue's restore"
                ))));
            }
        }
        if top > 0 {
            tracing::warn!(voucher = %id, positions = top, "waiting room restored from the database");
        }
        queue::restore_positions(&conn, id, &[], Some(top)).await?;
        Ok(())
    }
    .await;
    if let Err(error) = queue::unlock_restore(&conn, id, &holder).await {
        tracing::warn!(voucher = %id, %error, "could not release the queue-restore lock");
    }
    restored
}

/// `503`: another instance is rebuilding the queue.
fn being_restored(id: VoucherId) -> ApiError {
    ApiError::unavailable(
        "redis",
        format!("the waiting room of voucher {id} is being restored; ask again shortly"),
    )
}

/// Whether the voucher is sold out, as a waiting buyer must learn it, and the earliest
/// deadline of an unpaid order (a unit may come back then). `marked`: the sold-out mark
/// as the caller read it already (`None`: read here when needed).
///
/// One bucket: bucket 0's stock (read by the script). Several: bucket 0 empty, then
/// every bucket empty with nothing moving between them, on two looks that agree (three
/// commands a bucket each). Waiters keep looking at a sold-out voucher while units may
/// come back (every 1-30 s), so while an unpaid order's deadline is ahead and the
/// voucher's sold-out mark is set (an admission's or an earlier look's two looks), the
/// mark answers instead. Never when no deadline is left: that answer tells the waiters
/// nothing will come back, and a mark set just after a cancel returned a unit (the race
/// [`transfers::SOLD_OUT_MARK`] bounds to 5 s) must not end anybody's wait for good. Nor
/// is a voucher with a bucket Redis lost sold out: its units are unknown until an
/// admission repairs it.
async fn sold_out(
    sales: &seckill_shared::adapters::redis::RedisSales,
    id: VoucherId,
    view: &QueueView,
    marked: Option<bool>,
) -> Result<Option<Option<UnixMillis>>, ApiError> {
    if view.stock_bucket0 > 0 {
        return Ok(None);
    }
    // Units held for the line: offered to the earliest waiters still looking, and
    // offered on when an offer lapses. Looked at again soon.
    if view.held > 0 {
        return Ok(Some(Some(view.now_ms.saturating_add(HELD_LOOK_MS))));
    }
    let conn = sales.conn();
    let next = || queue::earliest_deadline(&conn, id, view.buckets);
    if view.buckets <= 1 {
        return Ok(Some(next().await?));
    }
    let marked = match marked {
        Some(m) => m,
        None => transfers::is_marked_sold_out(&conn, id).await?,
    };
    if marked && let Some(at) = next().await? {
        return Ok(Some(Some(at)));
    }
    let first = transfers::units(&conn, id, view.buckets).await?;
    if first.total() > 0 {
        return Ok(None);
    }
    let second = transfers::units(&conn, id, view.buckets).await?;
    // A bucket whose sale Redis lost holds units nobody can count until an admission
    // repairs it: not sold out (the caller is served, and buying repairs it), as an
    // admission would wait rather than answer sold out.
    if first.missing + second.missing > 0 || !transfers::sold_out_between(first, second) {
        return Ok(None);
    }
    // Marked for the looks and admissions after this one.
    if let Err(error) = transfers::mark_sold_out(&conn, id).await {
        tracing::warn!(voucher = %id, %error, "could not set the sold-out mark");
    }
    Ok(Some(next().await?))
}

/// The admission's entry check for a voucher with a room: the caller's token for this
/// voucher, signed by us, unexpired; checked in memory before anything is asked of
/// Redis. Any failure is `403 entry_required`.
pub(crate) async fn check_entry(
    app: &App,
    req: &Request,
    caller: &Identity,
    id: VoucherId,
    now: UnixMillis,
) -> Result<(), ApiError> {
    let token = req
        .headers()
        .get(ENTRY_HEADER)
        .map(|v| v.to_str().unwrap_or("\u{0}"));
    let secrets = app.entry_secrets.get().await?;
    entry::verify(secrets.all(), token, id, &caller.user, now).map_err(|why| {
        tracing::info!(voucher = %id, user = %caller.user.as_str(), %why, "entry refused");
        ApiError::EntryRequired(format!(
            "voucher {id} lets buyers in from its waiting room: join it \
             (POST /vouchers/{id}/queue) and send the entry token you get once served \
             as {ENTRY_HEADER} ({why})"
        ))
    })
}

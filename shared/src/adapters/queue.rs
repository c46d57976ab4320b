//! The waiting room in Redis (`lua/queue.lua`), and what an instance that never saw a
//! voucher reads before its first admission: its stock buckets and whether it has a room.
//!
//! Joining and looking are one script call each on the voucher's slot (`{<voucher>}`,
//! bucket 0's), whatever the queue's length: a position is a hash field, never a scan.
//! The room's settings live in bucket 0's sale hash beside the buckets, so learning one
//! means learning the other in the same read: no instance can know a voucher's buckets
//! without knowing that buying it needs an entry token.

use std::sync::LazyLock;

use redis::Script;

use crate::adapters::redis::{RedisConn, lock};
use crate::domain::{Bucket, SaleWindow, UnixMillis, UserId, VoucherId, WaitingRoom};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::{queue, sale_fields};

static QUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/queue.lua")));
static RESTORE_QUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/restore_queue.lua")));

/// How long a queue is kept after its sale ends: a buyer looking late still learns the
/// sale ended rather than that they never joined.
pub const KEEP_AFTER_END_MS: i64 = 24 * 3600 * 1000;

/// How recent a waiter's last look must be for a returned unit to be offered to them:
/// a waiter is told to look again within 30 s at most (seckill-http's `queue`), so two
/// of those and some slack. Earlier positions that looked longer ago have left the line.
pub const STILL_LOOKING_MS: i64 = 65_000;

/// How long an offer of a returned unit holds: time for a waiter's next look (at most
/// 30 s) and a purchase, and a payment step's checkout after it is the order's own time.
pub const OFFER_MS: i64 = 90_000;

/// What an instance must know of a live sale before admitting to it, read together
/// from bucket 0's sale hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleShape {
    pub buckets: u16,
    /// `Some`: buying needs an entry token.
    pub room: Option<WaitingRoom>,
}

/// The voucher's [`SaleShape`], `None` when bucket 0's sale is not loaded. One `HMGET`.
pub async fn sale_shape(
    conn: &RedisConn,
    voucher: VoucherId,
) -> Result<Option<SaleShape>, StoreError> {
    let k = VoucherKeys::new(voucher);
    let (stock, buckets, rate, opens): (Option<i64>, Option<u16>, Option<i64>, Option<i64>) =
        redis::cmd("HMGET")
            .arg(&k.sale)
            .arg(sale_fields::STOCK)
            .arg(sale_fields::BUCKETS)
            .arg(sale_fields::ROOM_RATE)
            .arg(sale_fields::ROOM_OPENS_S)
            .query_async(&mut conn.clone())
            .await?;
    if stock.is_none() {
        return Ok(None);
    }
    let room = match (rate, opens) {
        (None, None) => None,
        (Some(rate), Some(opens)) => {
            Some(WaitingRoom::from_stored(rate, opens).ok_or_else(|| {
                StoreError::Corrupt(format!("waiting room of voucher {voucher} out of range"))
            })?)
        }
        _ => {
            return Err(StoreError::Corrupt(format!(
                "waiting room of voucher {voucher} half recorded"
            )));
        }
    };
    Ok(Some(SaleShape {
        buckets: buckets.unwrap_or(1).max(1),
        room,
    }))
}

/// A queue answer for a voucher with a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueView {
    /// The caller's position, `None` when they have not joined (or could not).
    pub position: Option<u64>,
    pub outcome: QueueOutcome,
    /// Units left in bucket 0 for the caller (all of the voucher's when it has one
    /// bucket), less the units held for others in the line for returned units.
    pub stock_bucket0: i64,
    /// When the caller's offer of a returned unit lapses, if they hold one: they are
    /// served again, and may buy a held unit until then.
    pub offer_until: Option<UnixMillis>,
    /// Returned units held for the line in bucket 0 (sales with a room).
    pub held: i64,
    pub buckets: u16,
    pub room: WaitingRoom,
    pub window: SaleWindow,
    /// Redis's clock when it answered: the one every instance serves positions by.
    pub now_ms: UnixMillis,
}

/// How a join or a look went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueOutcome {
    Queued,
    NotOpen,
    Ended,
    NotJoined,
}

/// What the queue script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueReply {
    NotLoaded,
    NoRoom,
    /// The queue must be rebuilt from the database first ([`restore_positions`]).
    NeedsRestore,
    Room(QueueView),
}

/// Writes positions the database holds into the voucher's queue (`lua/restore_queue.lua`);
/// `last`: the highest position the database holds, on the call that ends a restore
/// (it sets the counter past every position). False when bucket 0's sale is missing.
pub async fn restore_positions(
    conn: &RedisConn,
    voucher: VoucherId,
    positions: &[(String, u64)],
    last: Option<u64>,
) -> Result<bool, StoreError> {
    let k = VoucherKeys::new(voucher);
    let mut call = RESTORE_QUEUE.key(&k.sale);
    call.key(keys::queue(voucher))
        .arg(KEEP_AFTER_END_MS)
        .arg(last.map(|m| m.to_string()).unwrap_or_default());
    for (user, position) in positions {
        call.arg(user.as_str()).arg(*position);
    }
    let done: i64 = call.invoke_async(&mut conn.clone()).await?;
    Ok(done == 1)
}

/// Takes the voucher's queue-restore lock for `ttl_ms` under `holder`; false when another
/// instance holds it.
pub async fn lock_restore(
    conn: &RedisConn,
    voucher: VoucherId,
    holder: &str,
    ttl_ms: u64,
) -> Result<bool, StoreError> {
    lock::try_lock(conn, &keys::queue_restore(voucher), holder, ttl_ms).await
}

/// Gives the lock back (only the holder's: a lock that timed out and was taken by another
/// instance is left alone).
pub async fn unlock_restore(
    conn: &RedisConn,
    voucher: VoucherId,
    holder: &str,
) -> Result<(), StoreError> {
    lock::unlock(conn, &keys::queue_restore(voucher), holder).await
}

/// What a call of the queue script asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueAsk {
    /// Join (a position is given at the first join and kept ever after).
    Join,
    /// Look one's position up.
    Look,
    /// Look, as a buyer found the voucher sold out to them (a voucher of several
    /// buckets, whose stock bucket 0's slot cannot see): the line records them as
    /// waiting for a returned unit, and may offer them one at once.
    LookSoldOut,
}

impl QueueAsk {
    /// The script's ARGV[2].
    fn arg(self) -> &'static str {
        match self {
            QueueAsk::Join => "1",
            QueueAsk::Look => "0",
            QueueAsk::LookSoldOut => "2",
        }
    }
}

/// Joins `user` to the voucher's queue ([`QueueAsk::Join`]), keeping the position of an
/// earlier join, or only looks their position up. One script call.
pub async fn queue(
    conn: &RedisConn,
    voucher: VoucherId,
    user: &UserId,
    ask: QueueAsk,
) -> Result<QueueReply, StoreError> {
    let k = VoucherKeys::new(voucher);
    let reply: Vec<i64> = QUEUE
        .key(&k.sale)
        .key(keys::queue(voucher))
        .key(keys::offers(voucher))
        .key(keys::waiters(voucher))
        .key(keys::looked(voucher))
        .key(&k.buyers)
        .arg(user.as_str())
        .arg(ask.arg())
        .arg(KEEP_AFTER_END_MS)
        .arg(STILL_LOOKING_MS)
        .arg(OFFER_MS)
        .invoke_async(&mut conn.clone())
        .await?;
    let corrupt = || StoreError::Corrupt(format!("queue script answered {reply:?}"));
    match reply.as_slice() {
        [queue::NOT_LOADED] => Ok(QueueReply::NotLoaded),
        [queue::NO_ROOM] => Ok(QueueReply::NoRoom),
        [queue::NEEDS_RESTORE] => Ok(QueueReply::NeedsRestore),
        &[
            result,
            position,
            stock,
            buckets,
            now_ms,
            begins,
            ends,
            rate,
            opens,
            offer_until,
            held,
        ] => {
            let outcome = match result {
                queue::QUEUED => QueueOutcome::Queued,
                queue::NOT_OPEN => QueueOutcome::NotOpen,
                queue::ENDED => QueueOutcome::Ended,
                queue::NOT_JOINED => QueueOutcome::NotJoined,
                _ => return Err(corrupt()),
            };
            Ok(QueueReply::Room(QueueView {
                position: u64::try_from(position).ok().filter(|p| *p > 0),
                outcome,
                stock_bucket0: stock,
                buckets: u16::try_from(buckets).map_err(|_| corrupt())?.max(1),
                room: WaitingRoom::from_stored(rate, opens).ok_or_else(corrupt)?,
                window: SaleWindow::new(begins, ends).map_err(|_| corrupt())?,
                now_ms,
                offer_until: (offer_until > now_ms).then_some(offer_until),
                held,
            }))
        }
        _ => Err(corrupt()),
    }
}

/// Whether `user` holds an order of the voucher in their own bucket (its buyers hash:
/// the one that keeps one order per user).
pub async fn has_order(
    conn: &RedisConn,
    voucher: VoucherId,
    buckets: u16,
    user: &UserId,
) -> Result<bool, StoreError> {
    let bucket = Bucket::of_user(voucher, buckets, user.as_str());
    let k = VoucherKeys::new(bucket);
    Ok(redis::cmd("HEXISTS")
        .arg(&k.buyers)
        .arg(user.as_str())
        .query_async(&mut conn.clone())
        .await?)
}

/// The earliest payment deadline among the voucher's orders still awaiting payment
/// (every bucket's `deadlines`, the `+inf` sentinel left out), `None` when no order
/// awaits payment: then no unit can come back to a sold-out voucher. One read per
/// bucket, each on its own slot, made only when a room answers `sold_out`.
pub async fn earliest_deadline(
    conn: &RedisConn,
    voucher: VoucherId,
    buckets: u16,
) -> Result<Option<UnixMillis>, StoreError> {
    let each = futures::future::try_join_all(Bucket::all(voucher, buckets).map(|b| async move {
        let first: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(VoucherKeys::new(b).deadlines)
            .arg("-inf")
            .arg("(+inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut conn.clone())
            .await?;
        Ok::<_, StoreError>(first.first().map(|(_, at)| *at as UnixMillis))
    }))
    .await?;
    Ok(each.into_iter().flatten().min())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::slot;

    #[test]
    fn the_queue_shares_bucket_zeros_slot() {
        let v = VoucherId::new(42).unwrap();
        assert_eq!(slot(&keys::queue(v)), slot(&VoucherKeys::new(v).sale));
    }
}

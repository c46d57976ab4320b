//! The drainer's side of closed orders (vouchers with a payment step):
//! expiring orders past their deadline, and carrying every close to the database.
//!
//! `lua/close.lua` decides each close once, in Redis, and returns a cancelled or expired
//! order's unit to the sale there; the order then waits in the voucher's `to_settle` set
//! until the drainer has recorded the close in the database (and given the database its
//! unit back). These are the calls the drainer makes for that; they are
//! [`OrderStreams`] methods because the drainer holds one connection for all of it.
//!
//! Invariant kept here: an order leaves `to_settle` only through [`OrderStreams::settled`],
//! which the drainer calls after the database committed the order's final status.

use redis::AsyncCommands;

use super::order_stream::OrderStreams;
use super::redis::{CLOSE, RedisConn};
use crate::domain::{Bucket, ClosedOrder, OrderId, UnixMillis};
use crate::error::StoreError;
use crate::keys::{VoucherKeys, deadline_member};
use crate::protocol::close;

/// Orders one [`OrderStreams::expire_due`] call closes at most: a long backlog of due
/// orders goes in steps, never one long script.
pub const EXPIRE_PER_CALL: u64 = 500;

/// Closes one `HMGET` reads at most: a backlog of closes to settle (a mass expiry) is
/// read in steps, never one long command on the sale's slot.
const CLOSES_PER_CALL: usize = 10_000;

/// Deadlines per `ZADD` when deadlines are restored.
const DEADLINES_PER_CALL: usize = 1_000;

/// Records payment deadlines of open orders, `(order, buyer, deadline)`, unless present
/// (`ZADD NX`). Safe at any time: a deadline restored for an order closed meanwhile is
/// only removed again, since `lua/close.lua` consults the closed hash before the
/// deadlines. The admission script writes each deadline first; this restores them after
/// Redis lost them (a repair, and every order the drainer writes `awaiting_payment`).
pub async fn restore_deadlines(
    conn: &RedisConn,
    voucher: impl Into<Bucket>,
    open: &[(OrderId, &str, UnixMillis)],
) -> Result<(), StoreError> {
    let voucher: Bucket = voucher.into();
    let k = VoucherKeys::new(voucher);
    for chunk in open.chunks(DEADLINES_PER_CALL) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&k.deadlines).arg("NX");
        for (order, user, deadline) in chunk {
            zadd.arg(*deadline).arg(deadline_member(*order, user));
        }
        let _: i64 = zadd.query_async(&mut conn.clone()).await?;
    }
    Ok(())
}

impl OrderStreams {
    /// [`restore_deadlines`] on this connection.
    pub async fn restore_deadlines(
        &self,
        voucher: impl Into<Bucket>,
        open: &[(OrderId, &str, UnixMillis)],
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        restore_deadlines(&self.conn, voucher, open).await
    }

    /// Expires up to [`EXPIRE_PER_CALL`] orders of `voucher` whose payment deadline has
    /// passed (by the Redis server's clock), returning each unit to the sale. Returns
    /// (expired now, orders waiting to be settled).
    pub async fn expire_due(&self, voucher: impl Into<Bucket>) -> Result<(u64, u64), StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let reply: (u64, u64) = CLOSE
            .key(&k.sale)
            .key(&k.buyers)
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.to_settle)
            .key(&k.grace)
            .key(&k.rebuys)
            .key(&k.transfers)
            .arg(close::EXPIRE_DUE)
            .arg(EXPIRE_PER_CALL)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(reply)
    }

    /// The orders of `voucher` closed in Redis whose close the database may not have yet.
    pub async fn to_settle(&self, voucher: impl Into<Bucket>) -> Result<Vec<OrderId>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let ids: Vec<String> = self.conn.clone().smembers(&k.to_settle).await?;
        Ok(ids
            .iter()
            .filter_map(|id| id.parse::<OrderId>().ok())
            .collect())
    }

    /// How each of `orders` was closed, in order (`None`: still open, or no such order),
    /// read [`CLOSES_PER_CALL`] at a time.
    pub async fn closed_orders(
        &self,
        voucher: impl Into<Bucket>,
        orders: &[OrderId],
    ) -> Result<Vec<Option<ClosedOrder>>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut closed = Vec::with_capacity(orders.len());
        for chunk in orders.chunks(CLOSES_PER_CALL) {
            let ids: Vec<i64> = chunk.iter().map(|o| o.get()).collect();
            let values: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&k.closed)
                .arg(&ids)
                .query_async(&mut self.conn.clone())
                .await?;
            closed.extend(
                values
                    .iter()
                    .map(|v| v.as_deref().and_then(ClosedOrder::parse)),
            );
        }
        Ok(closed)
    }

    /// Removes the deadlines of orders the database holds no unit for (`(order, buyer)`):
    /// recorded `rejected` (its stock could not cover them) or dead-lettered. Such an
    /// order must never expire and give Redis a unit back. No-op for vouchers without a
    /// payment step.
    pub async fn drop_deadlines(
        &self,
        voucher: impl Into<Bucket>,
        orders: &[(OrderId, &str)],
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        if orders.is_empty() {
            return Ok(());
        }
        let k = VoucherKeys::new(voucher);
        let members: Vec<String> = orders.iter().map(|(o, u)| deadline_member(*o, u)).collect();
        let _: i64 = self.conn.clone().zrem(&k.deadlines, &members).await?;
        Ok(())
    }

    /// Forgets orders whose close the database has committed.
    pub async fn settled(
        &self,
        voucher: impl Into<Bucket>,
        orders: &[OrderId],
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        if orders.is_empty() {
            return Ok(());
        }
        let k = VoucherKeys::new(voucher);
        let ids: Vec<i64> = orders.iter().map(|o| o.get()).collect();
        let _: i64 = self.conn.clone().srem(&k.to_settle, &ids).await?;
        Ok(())
    }
}

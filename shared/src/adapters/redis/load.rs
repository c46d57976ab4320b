//! Putting a sale into Redis, bringing back one Redis lost, and reading what a loaded
//! sale holds: the [`RedisSales`] calls of an admin creating a voucher and of a repair.
//!
//! Invariants kept here: a sale hash is only ever created where absent
//! (`lua/preload.lua`), so loading is idempotent and never overwrites a live sale; a
//! bucket is registered for the drainer before its sale hash exists, never after; a
//! buyer the buyers hash still has is never overwritten when buyers are restored.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::sales::RedisSales;
use super::scripts::{PRELOAD, RESTORE_BUYERS};
use crate::domain::{Bucket, OrderId, Reopen, SaleState, UserId, Voucher, VoucherId};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::{self, preload, sale_fields};

/// Orders stream entries per page when buyers are restored from the stream.
pub const RESTORE_STREAM_PAGE: usize = 1_000;

/// What [`RedisSales::restore_buyers`] did with the database's holders it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Buyers recorded (the buyers hash lacked them).
    pub added: u64,
    /// Holders skipped: their order was closed in Redis with its unit given back (the
    /// database has not settled the close yet) on a voucher that lets buyers buy again.
    pub returned: u64,
}

impl RedisSales {
    /// Makes a new voucher sellable: registers each of its buckets for the drainer, then
    /// creates each bucket's sale hash (only if absent, with the bucket's share of the
    /// stock) and consumer group. Idempotent; returns true when bucket 0's sale hash was
    /// created now.
    pub async fn preload(&self, voucher: &Voucher) -> Result<bool, StoreError> {
        let mut created = false;
        // Bucket 0 last: an instance that never saw the voucher looks for bucket 0, so
        // every other bucket is live once bucket 0 is.
        for bucket in voucher.buckets().collect::<Vec<_>>().into_iter().rev() {
            // A new voucher has no orders in the database.
            let share = bucket.share(voucher.stock, voucher.buckets);
            created = self.reopen_bucket(voucher, bucket, share, 0, 0).await? == Reopen::Created;
        }
        Ok(created)
    }

    /// Makes a voucher of one bucket sellable again after Redis lost its sale hash: see
    /// [`Self::reopen_bucket`], with the voucher's `db_stock_left`.
    pub async fn reopen(&self, voucher: &Voucher, settled: u64) -> Result<Reopen, StoreError> {
        self.reopen_bucket(
            voucher,
            voucher.id.into(),
            voucher.db_stock_left,
            settled,
            0,
        )
        .await
    }

    /// Makes one bucket sellable again after Redis lost its sale hash
    /// (`lua/preload.lua`): registers it for the drainer, then, only if the sale hash is
    /// absent, creates it with `stock_left` minus the bucket's buyers the database had
    /// not settled.
    ///
    /// `settled` is the number of the bucket's orders in the database when `stock_left`
    /// was read (one consistent read), and every one of their buyers must already be in
    /// the buyers hash ([`Self::restore_buyers`]) but the `returned` ones (closed in
    /// Redis with their unit given back, the close not yet settled, on a voucher that
    /// lets buyers buy again: [`Restored::returned`]); the buyers beyond those are
    /// admitted orders the database has not taken stock for yet.
    ///
    /// The active-set write comes first: if the second step fails, the drainer merely
    /// visits an empty stream, while the reverse order could leave orders undrained.
    pub async fn reopen_bucket(
        &self,
        voucher: &Voucher,
        bucket: Bucket,
        stock_left: i64,
        settled: u64,
        returned: u64,
    ) -> Result<Reopen, StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = conn.sadd(keys::ACTIVE_VOUCHERS, bucket.to_string()).await?;
        let k = VoucherKeys::new(bucket);
        let created: i64 = PRELOAD
            .key(&k.sale)
            .key(&k.buyers)
            .key(&k.orders)
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.to_settle)
            .key(&k.transfers)
            .key(&k.received)
            .arg(stock_left)
            .arg(voucher.stock)
            .arg(voucher.window.begins_ms())
            .arg(voucher.window.ends_ms())
            .arg(keys::DRAIN_GROUP)
            .arg(settled)
            .arg(
                voucher
                    .payment
                    .map_or(String::new(), |p| p.pay_within_ms.to_string()),
            )
            .arg(voucher.payment.map_or(0, |p| p.rebuys()))
            .arg(voucher.buckets)
            .arg(
                voucher
                    .room
                    .map_or(String::new(), |r| r.entry_rate_per_s().to_string()),
            )
            .arg(voucher.room.map_or(0, |r| r.opens_before_s()))
            .arg(returned)
            .invoke_async(&mut conn)
            .await?;
        match created {
            preload::CREATED => Ok(Reopen::Created),
            preload::ALREADY_LIVE => Ok(Reopen::AlreadyLive),
            preload::BUYERS_LOST => Ok(Reopen::BuyersLost),
            other => Err(StoreError::Corrupt(format!(
                "preload script answered {other}"
            ))),
        }
    }

    /// The voucher's stock buckets as bucket 0's sale hash records them (1 when it
    /// records none), `None` when bucket 0's sale is not loaded: what an instance that
    /// never saw the voucher needs before its first admission.
    pub async fn sale_buckets(&self, voucher: VoucherId) -> Result<Option<u16>, StoreError> {
        let k = VoucherKeys::new(voucher);
        let (stock, buckets): (Option<i64>, Option<u16>) = redis::cmd("HMGET")
            .arg(&k.sale)
            .arg(sale_fields::STOCK)
            .arg(sale_fields::BUCKETS)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(stock.map(|_| buckets.unwrap_or(1).max(1)))
    }

    /// Units left in Redis over every bucket of the voucher (units on their way between
    /// two buckets are not counted), `None` when bucket 0's sale is not loaded.
    pub async fn stock_left_all(&self, voucher: &Voucher) -> Result<Option<i64>, StoreError> {
        let stocks =
            futures::future::try_join_all(voucher.buckets().map(|b| self.stock_left(b))).await?;
        match stocks.first() {
            Some(Some(_)) => Ok(Some(stocks.iter().flatten().sum())),
            _ => Ok(None),
        }
    }

    /// Records buyers the buyers hash lost (`lua/restore_buyers.lua`, HSETNX: a buyer it
    /// still has is never overwritten; with `rebuy`, the voucher's rebuy limit (0: none),
    /// an order closed with its unit given back names no buyer unless the buyer used the
    /// limit up): how many were added, and how many were skipped so.
    pub async fn restore_buyers(
        &self,
        voucher: impl Into<Bucket>,
        buyers: &[(String, OrderId)],
        rebuy: u8,
    ) -> Result<Restored, StoreError> {
        let voucher: Bucket = voucher.into();
        if buyers.is_empty() {
            return Ok(Restored::default());
        }
        let k = VoucherKeys::new(voucher);
        let mut call = RESTORE_BUYERS.key(&k.buyers);
        call.key(&k.orders)
            .key(&k.closed)
            .key(&k.rebuys)
            .arg(protocol::restore_buyers::PAIRS)
            .arg(rebuy_arg(rebuy));
        for (user, order) in buyers {
            call.arg(user.as_str()).arg(order.get());
        }
        let (_, added, returned): (String, u64, u64) =
            call.invoke_async(&mut self.conn.clone()).await?;
        Ok(Restored { added, returned })
    }

    /// Records the buyer of every order still in the voucher's orders stream that the
    /// buyers hash lost, a page of [`RESTORE_STREAM_PAGE`] entries per call (`rebuy` as
    /// for [`Self::restore_buyers`]). Returns how many were added.
    pub async fn restore_buyers_from_stream(
        &self,
        voucher: impl Into<Bucket>,
        rebuy: u8,
    ) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut start = "-".to_string();
        let mut added = 0;
        loop {
            let (last, n): (String, u64) = RESTORE_BUYERS
                .key(&k.buyers)
                .key(&k.orders)
                .key(&k.closed)
                .key(&k.rebuys)
                .arg(protocol::restore_buyers::STREAM)
                .arg(rebuy_arg(rebuy))
                .arg(&start)
                .arg(RESTORE_STREAM_PAGE)
                .invoke_async(&mut self.conn.clone())
                .await?;
            added += n;
            if last.is_empty() {
                return Ok(added);
            }
            start = format!("({last}");
        }
    }

    /// Takes the voucher's repair lock for `ttl_ms` unless another holder has it; true
    /// when taken. The lock only spares the database a repair per instance when a hot
    /// sale is lost: repairs are idempotent, so two at once are merely wasteful.
    pub async fn try_lock_repair(
        &self,
        voucher: VoucherId,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let k = VoucherKeys::new(voucher);
        super::lock::try_lock(&self.conn, &k.repair, holder, ttl_ms).await
    }

    /// Releases the repair lock. A plain DEL: if this holder's lock had expired and
    /// another took it, a third repair may start early, which is safe (see
    /// [`Self::try_lock_repair`]).
    pub async fn unlock_repair(&self, voucher: VoucherId) -> Result<(), StoreError> {
        let k = VoucherKeys::new(voucher);
        let _: i64 = self.conn.clone().del(&k.repair).await?;
        Ok(())
    }

    /// The record a repair of `voucher` that stopped part-way left (opaque here: the
    /// repair writes and reads it), if any.
    pub async fn repair_progress(&self, voucher: VoucherId) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .clone()
            .get(VoucherKeys::new(voucher).repair_progress)
            .await?)
    }

    /// Saves a repair's progress record for `ttl_ms` (a repair nobody goes on with is
    /// forgotten, and the next one begins again).
    pub async fn save_repair_progress(
        &self,
        voucher: VoucherId,
        record: &str,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        let _: () = self
            .conn
            .clone()
            .pset_ex(VoucherKeys::new(voucher).repair_progress, record, ttl_ms)
            .await?;
        Ok(())
    }

    /// Forgets a repair's progress (it finished, or must begin again).
    pub async fn clear_repair_progress(&self, voucher: VoucherId) -> Result<(), StoreError> {
        let _: i64 = self
            .conn
            .clone()
            .del(VoucherKeys::new(voucher).repair_progress)
            .await?;
        Ok(())
    }

    /// The sale hash as Redis holds it, `None` when the sale is not loaded.
    pub async fn sale_state(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Option<SaleState>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let all: HashMap<String, String> = self.conn.clone().hgetall(&k.sale).await?;
        if all.is_empty() {
            return Ok(None);
        }
        let num = |name: &str| all.get(name).and_then(|v| v.parse::<i64>().ok());
        Ok(Some(SaleState {
            stock: num(sale_fields::STOCK),
            total: num(sale_fields::TOTAL),
            begins_ms: num(sale_fields::BEGINS_MS),
            ends_ms: num(sale_fields::ENDS_MS),
        }))
    }

    /// How many buyers the buyers hash holds (HLEN).
    pub async fn buyer_count(&self, voucher: impl Into<Bucket>) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        Ok(self
            .conn
            .clone()
            .hlen(VoucherKeys::new(voucher).buyers)
            .await?)
    }

    /// Whether `bucket` is as a preload leaves it, nothing ever sold from it nor moved
    /// out: its stock is `share` (when its sale hash exists), and neither a buyer nor an
    /// order entry is in it (one pipeline, one slot). Orders drained and trimmed away
    /// are not seen here: the database's rows tell those.
    pub async fn as_preloaded(&self, bucket: Bucket, share: i64) -> Result<bool, StoreError> {
        let k = VoucherKeys::new(bucket);
        let (stock, buyers, orders): (Option<i64>, u64, u64) = redis::pipe()
            .hget(&k.sale, sale_fields::STOCK)
            .hlen(&k.buyers)
            .xlen(&k.orders)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(stock.is_none_or(|s| s == share) && buyers == 0 && orders == 0)
    }

    /// Every (user id, order id) of the buyers hash (HSCAN). A value that is not an order
    /// id comes back as `None`.
    pub async fn buyers(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Vec<(String, Option<OrderId>)>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut cursor = 0u64;
        let mut out = Vec::new();
        loop {
            let (next, flat): (u64, Vec<String>) = redis::cmd("HSCAN")
                .arg(&k.buyers)
                .arg(cursor)
                .arg("COUNT")
                .arg(RESTORE_STREAM_PAGE)
                .query_async(&mut self.conn.clone())
                .await?;
            for pair in flat.chunks(2) {
                if let [user, order] = pair {
                    out.push((user.clone(), order.parse().ok().and_then(OrderId::new)));
                }
            }
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Units left in Redis, `None` when the sale is not loaded.
    pub async fn stock_left(&self, voucher: impl Into<Bucket>) -> Result<Option<i64>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        Ok(self.conn.clone().hget(&k.sale, sale_fields::STOCK).await?)
    }

    /// The order id `user` holds for `voucher`, if admitted.
    pub async fn order_of_buyer(
        &self,
        voucher: impl Into<Bucket>,
        user: &UserId,
    ) -> Result<Option<OrderId>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let held: Option<i64> = self.conn.clone().hget(&k.buyers, user.as_str()).await?;
        Ok(held.and_then(OrderId::new))
    }

    /// Whether Redis lost `voucher`'s sale (its sale hash is gone) while its orders stream
    /// still holds entries, in one round trip. Whether any of them is still to be drained
    /// is the drain group's to say: see seckill-http's `lookup::sale_lost`.
    pub async fn sale_lost(&self, voucher: impl Into<Bucket>) -> Result<bool, StoreError> {
        let k = VoucherKeys::new(voucher.into());
        let (sale, orders): (bool, u64) = redis::pipe()
            .exists(&k.sale)
            .xlen(&k.orders)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(!sale && orders > 0)
    }
}

/// `lua/restore_buyers.lua`'s `ARGV[2]`: the voucher's rebuy limit, 0 for none.
fn rebuy_arg(rebuys: u8) -> u8 {
    rebuys
}

//! Order ids from blocks leased in Redis (`lua/lease.lua`), and the voucher an order id
//! was issued for.
//!
//! The layout of an id and the bookkeeping of blocks are [`crate::order_id`]'s; this is
//! the Redis side. Invariant kept here: an id is only ever taken from a block the lease
//! script granted, so no id is issued twice.

use std::sync::Mutex;

use redis::AsyncCommands;

use super::sales::RedisSales;
use super::scripts::LEASE;
use crate::domain::{OrderId, UnixMillis, VoucherId};
use crate::error::StoreError;
use crate::keys::IdKeys;
use crate::order_id::{
    self, CLOCK_BEHIND_JUMP_MS, DAY_KEY_TTL_SECS, EPOCH_UNIX_MS, IdBlocks, Lease, SLOTS_PER_MS,
    Take,
};
use crate::protocol;

impl RedisSales {
    /// Leases a block of order ids for `voucher` (`lua/lease.lua`): returns its stamp.
    /// `day` is the caller's guess of the UTC day the lease falls on (the block map of
    /// that day is the script's key); when the server's clock says otherwise the script
    /// writes nothing and names the day, and the call is made once more with it.
    pub async fn lease_block(&self, voucher: VoucherId, day: i64) -> Result<Lease, StoreError> {
        let mut day = day;
        for _ in 0..2 {
            let k = IdKeys::for_day(&order_id::day_name(day));
            // {ms, slot}, or {OTHER_DAY, day} when the lease falls on another day.
            let (ms, slot_or_day): (i64, i64) = LEASE
                .key(&k.clock)
                .key(&k.blocks)
                .arg(voucher.get())
                .arg(day)
                .arg(DAY_KEY_TTL_SECS)
                .arg(EPOCH_UNIX_MS)
                .arg(CLOCK_BEHIND_JUMP_MS)
                .arg(SLOTS_PER_MS)
                .invoke_async(&mut self.conn.clone())
                .await?;
            if ms == protocol::lease::OTHER_DAY {
                day = slot_or_day;
                continue;
            }
            return Lease::new(ms, slot_or_day).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "lease script returned the stamp {ms}:{slot_or_day}"
                ))
            });
        }
        Err(StoreError::Unavailable {
            backend: "redis",
            detail: "the lease script named another UTC day twice".into(),
        })
    }

    /// The voucher an order id was issued for (see [`crate::order_id`]).
    pub async fn voucher_of_order(&self, id: OrderId) -> Result<Option<VoucherId>, StoreError> {
        let parts = order_id::OrderIdParts::of(id);
        let k = IdKeys::for_day(&order_id::day_name(parts.day()));
        let v: Option<i64> = self
            .conn
            .clone()
            .hget(&k.blocks, parts.block_field())
            .await?;
        Ok(v.and_then(VoucherId::new))
    }
}

/// Issues order ids from leased blocks: on average 1/1024 of a Redis round trip each.
/// One per instance; its blocks live in its memory only.
#[derive(Debug, Default)]
pub struct OrderIds {
    blocks: Mutex<IdBlocks>,
}

impl OrderIds {
    /// The next id for an order of `voucher` issued at `now`.
    pub async fn next(
        &self,
        sales: &RedisSales,
        voucher: VoucherId,
        now: UnixMillis,
    ) -> Result<OrderId, StoreError> {
        // A block leased here may be used up by concurrent requests before this one takes
        // from it; then this request leases again. Three rounds is plenty.
        for _ in 0..3 {
            // The lock is never held across an await.
            let take = self.lock().take(voucher, now);
            match take {
                Take::Id(id) => return Ok(id),
                Take::Lease { day } => {
                    let lease = sales.lease_block(voucher, day).await?;
                    self.lock().add(voucher, lease, now);
                }
            }
        }
        Err(StoreError::Unavailable {
            backend: "redis",
            detail: "could not lease an order id block".into(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdBlocks> {
        // A poisoned lock only means another request panicked mid-update of a plain map;
        // the map itself is still consistent (each update is a single insert).
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

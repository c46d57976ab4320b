//! What an operator asks of the orders streams: entries and dead letters read in pages,
//! pending ids, the oldest unfinished entry, which closes still wait for the drainer,
//! and putting an entry back (a dead letter replayed, an admitted order requeued).
//!
//! Invariants kept here: a dead letter is replayed exactly once
//! (`lua/replay_dead_letter.lua` appends it and deletes the dead letter in one script),
//! with the close it carries put back (a paid order is written paid by its payment);
//! a replayed or requeued entry's bucket is in the active set before and after the
//! write, so the drainer visits it.

use redis::{AsyncCommands, Value};

use super::parse::parse_entries;
use super::reading::OrderStreams;
use super::scripts::REPLAY_DEAD_LETTER;
use crate::domain::{AdmittedOrder, Bucket, DeadLetter, OrderId, StreamEntry};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::fields;

/// Entries per XRANGE / XPENDING page when an operator command reads a whole stream.
pub const RANGE_PAGE: usize = 1_000;

/// A dead letter as `lua/dead_letter.lua` wrote it: the entry's own fields, and the
/// ones it added taken out.
fn dead_letter_of(raw: StreamEntry) -> DeadLetter {
    let text = |name: &str| {
        raw.field(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let added = [
        fields::SOURCE_ID,
        fields::REASON,
        fields::DELIVERIES,
        fields::CLOSE,
    ];
    DeadLetter {
        reason: text(fields::REASON),
        deliveries: text(fields::DELIVERIES).parse().unwrap_or(0),
        close: raw
            .field(fields::CLOSE)
            .map(|v| String::from_utf8_lossy(v).into_owned()),
        entry: StreamEntry {
            id: text(fields::SOURCE_ID),
            fields: raw
                .fields
                .iter()
                .filter(|(k, _)| !added.iter().any(|a| k.as_slice() == a.as_bytes()))
                .cloned()
                .collect(),
            deliveries: 0,
        },
        id: raw.id,
    }
}

impl OrderStreams {
    /// Up to `count` entries of `key` after `after` (`None`: from the start), in order.
    async fn range(
        &self,
        key: &str,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let start = after.map_or_else(|| "-".to_string(), |id| format!("({id}"));
        let reply: Value = redis::cmd("XRANGE")
            .arg(key)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count.max(1))
            .query_async(&mut self.conn.clone())
            .await?;
        parse_entries(reply)
    }

    /// Up to `count` entries of the voucher's orders stream after `after` (`None`: from
    /// the oldest), acked or not: what an operator compares with the database.
    pub async fn entries(
        &self,
        voucher: impl Into<Bucket>,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let voucher: Bucket = voucher.into();
        self.range(&VoucherKeys::new(voucher).orders, after, count)
            .await
    }

    /// Every dead letter of the voucher, oldest first (read in pages of [`RANGE_PAGE`]).
    pub async fn dead_letters(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut out: Vec<DeadLetter> = Vec::new();
        loop {
            let after = out.last().map(|d| d.id.clone());
            let page = self.range(&k.dead, after.as_deref(), RANGE_PAGE).await?;
            let full = page.len() == RANGE_PAGE;
            out.extend(page.into_iter().map(dead_letter_of));
            if !full {
                return Ok(out);
            }
        }
    }

    /// How many dead letters the voucher has (XLEN).
    pub async fn dead_letter_count(&self, voucher: impl Into<Bucket>) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        Ok(self
            .conn
            .clone()
            .xlen(VoucherKeys::new(voucher).dead)
            .await?)
    }

    /// Which of `orders` wait in the bucket's closes to settle (closed in Redis, the
    /// close not yet in the database): one `SMISMEMBER`, an answer per order, in order.
    pub async fn closes_waiting(
        &self,
        voucher: impl Into<Bucket>,
        orders: &[OrderId],
    ) -> Result<Vec<bool>, StoreError> {
        let voucher: Bucket = voucher.into();
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = orders.iter().map(|o| o.get()).collect();
        Ok(redis::cmd("SMISMEMBER")
            .arg(VoucherKeys::new(voucher).to_settle)
            .arg(&ids)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Ids of every entry pending in the drain group (delivered, not acked), in order.
    pub async fn pending_ids(&self, voucher: impl Into<Bucket>) -> Result<Vec<String>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut out: Vec<String> = Vec::new();
        if self.stats(voucher).await?.is_none() {
            return Ok(out);
        }
        loop {
            let start = out
                .last()
                .map_or_else(|| "-".to_string(), |id| format!("({id}"));
            let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&k.orders)
                .arg(keys::DRAIN_GROUP)
                .arg(start)
                .arg("+")
                .arg(RANGE_PAGE)
                .query_async(&mut self.conn.clone())
                .await?;
            let full = rows.len() == RANGE_PAGE;
            out.extend(rows.into_iter().map(|(id, ..)| id));
            if !full {
                return Ok(out);
            }
        }
    }

    /// The id of the oldest entry not yet acked: the oldest pending one, or else the
    /// first one after the group's last-delivered id. `None` when everything is acked.
    pub async fn oldest_unfinished(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Option<String>, StoreError> {
        let voucher: Bucket = voucher.into();
        let Some(stats) = self.stats(voucher).await? else {
            return Ok(None);
        };
        let k = VoucherKeys::new(voucher);
        if stats.pending > 0 {
            let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&k.orders)
                .arg(keys::DRAIN_GROUP)
                .arg("-")
                .arg("+")
                .arg(1)
                .query_async(&mut self.conn.clone())
                .await?;
            if let Some((id, ..)) = rows.into_iter().next() {
                return Ok(Some(id));
            }
        }
        let next = self
            .range(&k.orders, Some(&stats.last_delivered), 1)
            .await?;
        Ok(next.into_iter().next().map(|e| e.id))
    }

    /// Puts a dead letter back on the orders stream, exactly once
    /// (`lua/replay_dead_letter.lua`): its original fields are appended as a new entry
    /// and the dead letter is deleted, in one script; the close it carries (an order
    /// paid, cancelled or expired before it was dead-lettered) goes back to the closed
    /// hash, unless Redis holds one, and among the closes to settle, so the order is
    /// written as it was closed. The voucher is added to the active set first, so the
    /// drainer visits it. Returns the new entry's id, `None` when the dead letter was
    /// gone already (replayed by someone else): nothing was written.
    pub async fn replay_dead_letter(
        &self,
        voucher: impl Into<Bucket>,
        dead: &DeadLetter,
    ) -> Result<Option<String>, StoreError> {
        let voucher: Bucket = voucher.into();
        self.activate(voucher).await?;
        let k = VoucherKeys::new(voucher);
        let mut call = REPLAY_DEAD_LETTER.key(&k.orders);
        // A close without the order it closes cannot be put back (a dead letter only
        // carries one when its entry parsed as an order).
        let order = dead.entry.field(fields::ORDER_ID).unwrap_or_default();
        let close = dead
            .close
            .as_deref()
            .filter(|_| !order.is_empty())
            .unwrap_or_default();
        call.key(&k.dead)
            .key(&k.closed)
            .key(&k.to_settle)
            .arg(keys::DRAIN_GROUP)
            .arg(&dead.id)
            .arg(close)
            .arg(order);
        for (f, v) in &dead.entry.fields {
            call.arg(f.as_slice()).arg(v.as_slice());
        }
        // An admission's entry holds its time only in its id, and the replayed entry
        // gets a new id: it carries the original time as a field instead.
        if dead.entry.field(fields::ADMITTED_MS).is_none()
            && let Some(ms) = dead.entry.id_ms()
        {
            call.arg(fields::ADMITTED_MS).arg(ms);
        }
        let id: String = call.invoke_async(&mut self.conn.clone()).await?;
        // Again after the write: a drainer that retired the voucher in between (it
        // checked the stream before the new entry) must find it active once more.
        self.activate(voucher).await?;
        Ok((!id.is_empty()).then_some(id))
    }

    /// Appends an order to the orders stream of `bucket` (its buyer's bucket) with the
    /// fields admission writes (an operator re-enqueueing an admitted order that is
    /// nowhere else), with the bucket in the active set before and after the write and
    /// the stream's expiry (a retired sale's) removed, as a replay does. Returns the new
    /// entry's id. The drainer writes it like any admission; an order already in the
    /// database is a duplicate by its id.
    pub async fn requeue(
        &self,
        bucket: Bucket,
        order: &AdmittedOrder,
    ) -> Result<String, StoreError> {
        self.activate(bucket).await?;
        let k = VoucherKeys::new(bucket);
        let id: String = redis::cmd("XADD")
            .arg(&k.orders)
            .arg("*")
            .arg(fields::ORDER_ID)
            .arg(order.id.get())
            .arg(fields::VOUCHER_ID)
            .arg(order.voucher.get())
            .arg(fields::USER_ID)
            .arg(order.user.as_str())
            .arg(fields::ADMITTED_MS)
            .arg(order.admitted_ms)
            .query_async(&mut self.conn.clone())
            .await?;
        // A retired sale's stream expires: the entry must not go with it.
        let _: bool = self.conn.clone().persist(&k.orders).await?;
        // Again after the write: a drainer that retired the voucher in between (it
        // checked the stream before the new entry) must find it active once more.
        self.activate(bucket).await?;
        Ok(id)
    }
}

//! How an entry leaves the pending list, and the stream with it: acked once its batch
//! is committed, or dead-lettered; trimmed once every group is past it.
//!
//! Invariants kept here: an entry is never acked without being either in the database
//! (the caller acks after its commit) or in the dead letters (`lua/dead_letter.lua`
//! copies and acks in one script, and carries the close Redis decided for its order, so
//! a paid order never loses the payment that paid it); a trim removes only entries every group has acked
//! and that were delivered (`lua/trim.lua`, `XTRIM MINID`), never by `MAXLEN`.

use std::sync::atomic::Ordering;

use redis::AsyncCommands;
use redis::aio::ConnectionLike;

use super::reading::OrderStreams;
use super::scripts::{DEAD_LETTER, TRIM};
use crate::adapters::redis::AfterFailure;
use crate::domain::{Bucket, OrderId, StreamEntry};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol;

/// What [`OrderStreams::trim`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Entries removed.
    pub removed: u64,
    /// The MINID used, `None` when nothing could be trimmed.
    pub min_id: Option<String>,
}

impl OrderStreams {
    /// Acknowledges entries; returns how many were still pending.
    pub async fn ack(&self, voucher: impl Into<Bucket>, ids: &[&str]) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        if ids.is_empty() {
            return Ok(0);
        }
        let k = VoucherKeys::new(voucher);
        let acked: u64 = self
            .conn
            .clone()
            .xack(&k.orders, keys::DRAIN_GROUP, ids)
            .await?;
        self.finished.fetch_add(acked, Ordering::Relaxed);
        Ok(acked)
    }

    /// Acknowledges the entries of many streams at once (each `(bucket, ids)` as
    /// [`Self::ack`] would), pipelined where one node serves every slot
    /// ([`crate::adapters::redis::RedisConn::pipelined`]): the acks of a group of small
    /// sales committed together. Returns, per stream in order, how many were still
    /// pending.
    pub async fn ack_many(&self, acks: &[(Bucket, Vec<&str>)]) -> Vec<Result<u64, StoreError>> {
        // Streams with nothing to ack send nothing (XACK needs an id), as in `ack`.
        let sent: Vec<usize> = (0..acks.len()).filter(|&i| !acks[i].1.is_empty()).collect();
        let cmds: Vec<redis::Cmd> = sent
            .iter()
            .map(|&i| {
                let mut xack = redis::cmd("XACK");
                let (bucket, ids) = &acks[i];
                xack.arg(VoucherKeys::new(*bucket).orders)
                    .arg(keys::DRAIN_GROUP)
                    .arg(ids);
                xack
            })
            .collect();
        // An XACK sent twice acks nothing the second time: anything unanswered is sent
        // again alone.
        let alone = |i: usize| {
            let (mut conn, cmd) = (self.conn.clone(), &cmds[i]);
            async move { conn.req_packed_command(cmd).await }
        };
        let answers = self
            .conn
            .pipelined(&cmds, AfterFailure::SendAlone, alone)
            .await;
        let mut answers = answers.into_iter();
        let mut acked: Vec<Result<u64, StoreError>> = acks.iter().map(|_| Ok(0)).collect();
        for &i in &sent {
            let answer = answers.next().expect("one answer per command");
            acked[i] = answer
                .and_then(|v| redis::from_redis_value::<u64>(v).map_err(redis::RedisError::from))
                .map_err(StoreError::from);
            if let Ok(n) = &acked[i] {
                self.finished.fetch_add(*n, Ordering::Relaxed);
            }
        }
        acked
    }

    /// Copies `entry` with `reason` to the dead-letter stream and acks it, atomically.
    /// `order` is the entry's order and buyer when it parsed as one: in the same script
    /// the order leaves the payment step (its deadline and the closes to settle: no row
    /// will ever record its close) and the close Redis decided for it, if any, is
    /// carried in the dead letter, so a paid order keeps its payment through a replay
    /// (`lua/dead_letter.lua`). Returns false when the entry was no longer pending
    /// (someone else finished it).
    pub async fn dead_letter(
        &self,
        voucher: impl Into<Bucket>,
        entry: &StreamEntry,
        reason: &str,
        order: Option<(OrderId, &str)>,
    ) -> Result<bool, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut call = DEAD_LETTER.key(&k.orders);
        let (id, user) = order.map_or((String::new(), ""), |(o, u)| (o.to_string(), u));
        call.key(&k.dead)
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.to_settle)
            .arg(keys::DRAIN_GROUP)
            .arg(&entry.id)
            .arg(reason)
            .arg(entry.deliveries)
            .arg(id)
            .arg(user);
        for (f, v) in &entry.fields {
            call.arg(f.as_slice()).arg(v.as_slice());
        }
        let written: i64 = call.invoke_async(&mut self.conn.clone()).await?;
        let written = written == protocol::dead_letter::WRITTEN;
        self.finished
            .fetch_add(u64::from(written), Ordering::Relaxed);
        Ok(written)
    }

    /// Trims the orders stream below every group's oldest pending entry and
    /// last-delivered id (`lua/trim.lua`).
    pub async fn trim(&self, voucher: impl Into<Bucket>) -> Result<Trimmed, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let (removed, min_id): (u64, String) = TRIM
            .key(&k.orders)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(Trimmed {
            removed,
            min_id: (!min_id.is_empty()).then_some(min_id),
        })
    }
}

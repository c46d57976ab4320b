//! [`OrderStreams`], the orders streams seen from the drain group, and how entries are
//! handed out to a drainer: new ones (`lua/read.lua`: XREADGROUP, unless the drainer
//! holds unseen ones of its own), idle ones claimed (XAUTOCLAIM), its own pending ones
//! again after a lost reply (XPENDING, XCLAIM), and unfinished ones given back (XCLAIM)
//! without an ack.
//!
//! Invariants kept here: in durable mode no entry reaches a drainer before the replicas
//! hold it (entries handed out too early are given back, claimable at once, and the
//! caller sees a transient error); an entry given back stays pending, never lost; no
//! new entry is handed to a drainer that holds older ones it has not seen (a read whose
//! reply was lost), so a stream is drained in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{Cmd, ScriptInvocation, Value};

use super::parse::{ClaimPage, parse_autoclaim, parse_entries};
use super::scripts::READ;
use crate::adapters::redis::RedisConn;
use crate::config::Durable;
use crate::domain::{Bucket, StreamEntry};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};

/// The orders streams of all vouchers, seen from the drain group.
#[derive(Clone)]
pub struct OrderStreams {
    pub(in crate::adapters) conn: RedisConn,
    pub(super) durable: Option<Durable>,
    /// Entries this handle and its clones finished (acked, or dead-lettered and acked).
    pub(super) finished: Arc<AtomicU64>,
}

impl OrderStreams {
    /// The connection, for the drainer's calls outside the streams (transfers between
    /// stock buckets).
    pub fn conn(&self) -> &RedisConn {
        &self.conn
    }

    pub fn new(conn: RedisConn) -> OrderStreams {
        OrderStreams {
            conn,
            durable: None,
            finished: Arc::default(),
        }
    }

    /// How many entries this handle and its clones took off the pending list so far:
    /// acked after their batch committed, or dead-lettered (each counted once, by what
    /// Redis says it removed). A live figure of progress for a watcher in the same
    /// process: the benchmark stops its drain clock on it instead of asking every
    /// stream over and over while the drain it measures runs.
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// Entries are handed out only once `durable.replicas` replicas hold them (see
    /// [`Self::read_new`]); `None`: as soon as the primary has them.
    pub fn with_durability(mut self, durable: Option<Durable>) -> OrderStreams {
        self.durable = durable;
        self
    }

    /// Runs a command that hands out entries (XREADGROUP, XAUTOCLAIM) and, in durable
    /// mode, a `WAIT` in the same pipeline to the same primary. The reply and whether
    /// enough replicas acknowledged: the command's own write (the group's new state)
    /// follows the entries' admissions in the replication stream, so an acknowledgement
    /// covers the entries too.
    async fn handing_out(&self, cmd: &Cmd) -> Result<(Value, bool), StoreError> {
        let mut conn = self.conn.clone();
        match self.durable {
            None => Ok((cmd.query_async(&mut conn).await?, true)),
            Some(d) => {
                let (reply, acked): (Value, u32) = redis::pipe()
                    .add_command(cmd.clone())
                    .add_command(d.wait_cmd())
                    .query_async(&mut conn)
                    .await?;
                Ok((reply, d.held_by(acked)))
            }
        }
    }

    /// [`Self::handing_out`] for a script call that hands out entries (`lua/read.lua`):
    /// in durable mode the script and the `WAIT` in one pipeline, the script loaded
    /// first where a primary never ran it (new, or promoted).
    async fn handing_out_script(
        &self,
        call: &ScriptInvocation<'_>,
    ) -> Result<(Value, bool), StoreError> {
        let mut conn = self.conn.clone();
        let Some(d) = self.durable else {
            return Ok((call.invoke_async(&mut conn).await?, true));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(call).add_command(d.wait_cmd());
        let (reply, acked): (Value, u32) = match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                call.load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        Ok((reply, d.held_by(acked)))
    }

    /// Durable mode: entries just handed out that the replicas do not hold yet. They
    /// must not reach the database (a failover now would forget their admissions, and
    /// their buyers could be admitted again with another order): they are given back,
    /// claimable at once, and the caller sees a transient error.
    async fn not_yet_replicated(
        &self,
        voucher: Bucket,
        consumer: &str,
        ids: &[&str],
    ) -> StoreError {
        // Idle "forever": any drainer's XAUTOCLAIM takes them at once.
        let given_back = self
            .release(
                voucher,
                consumer,
                ids,
                Duration::from_secs(365 * 24 * 3_600),
            )
            .await;
        StoreError::Unavailable {
            backend: "redis",
            detail: format!(
                "{} entries of voucher {voucher} not yet held by {} replica(s); given back: {given_back:?}",
                ids.len(),
                self.durable.map_or(0, |d| d.replicas),
            ),
        }
    }

    /// Gives pending entries back: they stay pending (never lost) but are marked idle for
    /// `idle`, so the next drainer's XAUTOCLAIM takes them at once instead of after the
    /// claim threshold. For entries a run read but will not finish (a transient failure,
    /// or no time left). `JUSTID` leaves their delivery counts alone. Returns how many
    /// were still pending.
    pub async fn release(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        ids: &[&str],
        idle: Duration,
    ) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        if ids.is_empty() {
            return Ok(0);
        }
        let k = VoucherKeys::new(voucher);
        let released: Vec<String> = redis::cmd("XCLAIM")
            .arg(&k.orders)
            .arg(keys::DRAIN_GROUP)
            .arg(consumer)
            .arg(0)
            .arg(ids)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(released.len() as u64)
    }

    /// One page of `XAUTOCLAIM` from `cursor` (start with `"0-0"`): entries idle for at
    /// least `min_idle` move to `consumer`, each with its delivery count (which the claim
    /// itself incremented), read with the extended XPENDING form.
    pub async fn claim_idle(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        min_idle: Duration,
        cursor: &str,
        count: usize,
    ) -> Result<ClaimPage, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&k.orders)
            .arg(keys::DRAIN_GROUP)
            .arg(consumer)
            .arg(min_idle.as_millis() as u64)
            .arg(cursor)
            .arg("COUNT")
            .arg(count.max(1));
        let (reply, replicated) = self.handing_out(&cmd).await?;
        let mut page = parse_autoclaim(reply)?;
        if !replicated && !page.entries.is_empty() {
            let ids: Vec<&str> = page.entries.iter().map(|e| e.id.as_str()).collect();
            return Err(self.not_yet_replicated(voucher, consumer, &ids).await);
        }
        if let (Some(first), Some(last)) = (page.entries.first(), page.entries.last()) {
            let counts = self
                .delivery_counts(voucher, &first.id, &last.id, page.entries.len(), consumer)
                .await?;
            for e in &mut page.entries {
                e.deliveries = counts.get(&e.id).copied().unwrap_or(0);
            }
        }
        Ok(page)
    }

    /// Delivery counts of the pending entries of `consumer` in `[first, last]`.
    async fn delivery_counts(
        &self,
        voucher: Bucket,
        first: &str,
        last: &str,
        count: usize,
        consumer: &str,
    ) -> Result<HashMap<String, u64>, StoreError> {
        let k = VoucherKeys::new(voucher);
        let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&k.orders)
            .arg(keys::DRAIN_GROUP)
            .arg(first)
            .arg(last)
            .arg(count)
            .arg(consumer)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, _, _, delivered)| (id, delivered))
            .collect())
    }

    /// Up to `count` entries pending for `consumer` itself after the entry `after` (from
    /// the start when `None`), handed to it again: entries a read gave it whose reply
    /// was lost, which must be drained before anything newer is read. Taken with
    /// `XCLAIM` (min idle 0: their idle time starts over, as for a read; in durable mode
    /// with the same `WAIT` as a read, see [`Self::with_durability`]), each with its
    /// delivery count. Entries deleted from the stream meanwhile are dropped from the
    /// pending list by the claim (Redis 7) and skipped. Empty when `consumer` holds none
    /// after `after`.
    pub async fn read_own_pending(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut start = after.map_or_else(|| "-".to_string(), |id| format!("({id}"));
        loop {
            let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&k.orders)
                .arg(keys::DRAIN_GROUP)
                .arg(&start)
                .arg("+")
                .arg(count.max(1))
                .arg(consumer)
                .query_async(&mut self.conn.clone())
                .await?;
            let Some((last, ..)) = rows.last() else {
                return Ok(Vec::new());
            };
            let mut cmd = redis::cmd("XCLAIM");
            cmd.arg(&k.orders)
                .arg(keys::DRAIN_GROUP)
                .arg(consumer)
                .arg(0);
            for (id, ..) in &rows {
                cmd.arg(id);
            }
            let (reply, replicated) = self.handing_out(&cmd).await?;
            let mut entries = parse_entries(reply)?;
            if entries.is_empty() {
                // All deleted from the stream: look past them.
                start = format!("({last}");
                continue;
            }
            if !replicated {
                let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
                return Err(self.not_yet_replicated(voucher, consumer, &ids).await);
            }
            let delivered: HashMap<&str, u64> =
                rows.iter().map(|(id, _, _, n)| (id.as_str(), *n)).collect();
            for e in &mut entries {
                // The claim counted one more delivery.
                e.deliveries = delivered.get(e.id.as_str()).map_or(1, |n| n + 1);
            }
            return Ok(entries);
        }
    }

    /// Up to `count` entries never delivered to the group (`XREADGROUP ... >`), now
    /// pending for `consumer` (`lua/read.lua`), unless `consumer` holds entries past
    /// `after` (the last entry of the batch in hand; `None`: it holds none): then
    /// `None`, and nothing is read. Those were handed out by a read whose reply was
    /// lost (an earlier copy of this call, which the client sends again after a cut
    /// connection): the caller takes them first ([`Self::read_own_pending`]). Does not
    /// block: the caller decides how long to wait. In durable mode, entries the
    /// replicas do not hold yet are given back and reported as a transient error (see
    /// [`Self::with_durability`]).
    pub async fn read_new(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        after: Option<&str>,
        count: usize,
    ) -> Result<Option<Vec<StreamEntry>>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut call = READ.key(&k.orders);
        call.arg(keys::DRAIN_GROUP)
            .arg(consumer)
            .arg(count.max(1))
            .arg(after.unwrap_or(""));
        let (reply, replicated) = self.handing_out_script(&call).await?;
        let bad = || StoreError::Corrupt(format!("read of voucher {voucher} replied {reply:?}"));
        let (own, entries) = match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(own), entries @ Value::Array(_)] => (*own, entries.clone()),
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        };
        if own == 1 {
            return Ok(None);
        }
        let mut entries = parse_entries(entries)?;
        if !replicated && !entries.is_empty() {
            let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            return Err(self.not_yet_replicated(voucher, consumer, &ids).await);
        }
        for e in &mut entries {
            e.deliveries = 1;
        }
        Ok(Some(entries))
    }
}

//! The consumer side of the orders streams: what the order drainer asks of Redis.
//!
//! Admission (`lua/admit.lua`) appends one entry per admitted order to
//! `seckill:{<vid>}:orders`; the drainer reads them through the consumer group
//! [`keys::DRAIN_GROUP`]. This module keeps the stream invariants the drainer relies on:
//!
//! - the group exists before any read: preloading a sale makes it, and
//!   [`OrderStreams::probe`], the drainer's first call on every stream, makes it again
//!   where it is missing, so `NOGROUP` never happens;
//! - an entry leaves the pending list only by [`OrderStreams::ack`] (after its batch is
//!   committed) or by [`OrderStreams::dead_letter`], which copies it to
//!   `seckill:{<vid>}:dead` and acks it in one script (`lua/dead_letter.lua`), so an
//!   entry is never acked without being either in the database or in the dead letters;
//!   [`OrderStreams::release`] gives unfinished entries back without acking them;
//! - [`OrderStreams::trim`] removes only entries every group has acked and that were
//!   delivered (`lua/trim.lua`, `XTRIM MINID` below both bounds), never `MAXLEN`;
//! - every script gets all its keys in `KEYS`, with the voucher's one hash tag.
//!
//! Entry fields are kept as raw bytes: a malformed entry must reach the dead-letter stream
//! exactly as it was written, not as a lossy re-encoding.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Cmd, Script, Value};

use super::redis::RedisConn;
use crate::config::Durable;
use crate::domain::{AdmittedOrder, Bucket, DeadLetter, StreamEntry, UnixMillis};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::{self, fields, sale_fields};

/// A stream script with `lua/lib/streams.lua` (helpers it shares) in front of it.
macro_rules! stream_script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("../../../lua/lib/streams.lua"),
            include_str!(concat!("../../../lua/", $name, ".lua"))
        ))
    };
}

static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/dead_letter.lua")));
static TRIM: LazyLock<Script> = LazyLock::new(|| stream_script!("trim"));
static PROBE: LazyLock<Script> = LazyLock::new(|| stream_script!("probe"));
static EXPIRE_SALE: LazyLock<Script> = LazyLock::new(|| stream_script!("expire_sale"));
static REPLAY_DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| stream_script!("replay_dead_letter"));

/// Entries per XRANGE / XPENDING page when an operator command reads a whole stream.
pub const RANGE_PAGE: usize = 1_000;

/// Spent consumers one [`OrderStreams::probe`] deletes at most: a long backlog goes in
/// small steps, never one long script.
pub const REAP_PER_PROBE: u64 = 8;

/// A dead letter as `lua/dead_letter.lua` wrote it: the entry's own fields, and the
/// three it added taken out.
fn dead_letter_of(raw: StreamEntry) -> DeadLetter {
    let text = |name: &str| {
        raw.field(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let added = [fields::SOURCE_ID, fields::REASON, fields::DELIVERIES];
    DeadLetter {
        reason: text(fields::REASON),
        deliveries: text(fields::DELIVERIES).parse().unwrap_or(0),
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

/// One page of an XAUTOCLAIM scan.
#[derive(Debug, Clone, Default)]
pub struct ClaimPage {
    /// Entries now owned by the claiming consumer, with their delivery counts.
    pub entries: Vec<StreamEntry>,
    /// Ids that were pending but no longer exist in the stream: Redis dropped them from
    /// the pending list itself, there is nothing to process.
    pub deleted: Vec<String>,
    /// Where the next page starts; `None` when the scan reached the end (`0-0`).
    pub next: Option<String>,
}

/// The state of one voucher's orders stream and its drain group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// XLEN.
    pub length: u64,
    /// Entries delivered and not yet acked.
    pub pending: u64,
    /// Entries not yet delivered to the group: XINFO GROUPS `lag`, or when Redis cannot
    /// tell (`nil`), 0 if the newest entry was delivered, else the estimate
    /// `length - pending` (an upper bound).
    pub undelivered: u64,
    /// False when `undelivered` is the estimate.
    pub lag_exact: bool,
    /// True when the group was delivered the stream's newest entry (or it is empty): no
    /// entry waits for a first read.
    pub fully_delivered: bool,
    /// The group's last-delivered id (`0-0` before the first read).
    pub last_delivered: String,
}

/// What one voucher's stream needs from the drainer (`lua/probe.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// XLEN.
    pub length: u64,
    /// Entries delivered and not yet acked.
    pub pending: u64,
    /// Entries not yet delivered to the group (exact, or the upper bound
    /// `length - pending` when Redis cannot tell).
    pub undelivered: u64,
    /// True when the group was delivered the newest entry (or the stream is empty).
    pub fully_delivered: bool,
    /// True when a pending entry has been idle for the claim threshold.
    pub claimable: bool,
    /// Idle time of the oldest pending entry, in ms; `None` when nothing is pending.
    pub oldest_idle_ms: Option<u64>,
    /// The sale's end (unix ms); `None` when Redis has no sale hash.
    pub ends_ms: Option<UnixMillis>,
    /// The group's last-delivered id.
    pub last_delivered: String,
    /// Spent consumers this probe deleted.
    pub reaped: u64,
    /// An order's payment deadline has passed or a close waits for the database
    /// (vouchers with a payment step): the drainer sweeps the voucher.
    pub closing: bool,
}

impl Probe {
    /// Whether the drainer has anything to do here: new entries, or idle ones to claim.
    pub fn has_work(&self) -> bool {
        self.undelivered > 0 || !self.fully_delivered || self.claimable
    }
}

/// What [`OrderStreams::trim`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Entries removed.
    pub removed: u64,
    /// The MINID used, `None` when nothing could be trimmed.
    pub min_id: Option<String>,
}

/// The orders streams of all vouchers, seen from the drain group.
#[derive(Clone)]
pub struct OrderStreams {
    pub(super) conn: RedisConn,
    durable: Option<Durable>,
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
        }
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

    /// The buckets the drainer should visit (`SMEMBERS seckill:active`: voucher ids, and
    /// `<voucher>.<b>` for the other buckets of bucketed vouchers), sorted, and the
    /// members that are neither (reported, never fatal).
    pub async fn active_vouchers(&self) -> Result<(Vec<Bucket>, Vec<String>), StoreError> {
        let members: Vec<String> = self.conn.clone().smembers(keys::ACTIVE_VOUCHERS).await?;
        let mut ids = Vec::with_capacity(members.len());
        let mut bad = Vec::new();
        for m in members {
            match m.parse::<Bucket>() {
                Ok(id) => ids.push(id),
                Err(_) => bad.push(m),
            }
        }
        ids.sort();
        Ok((ids, bad))
    }

    /// Whether a finished sale may be retired (`lua/expire_sale.lua`): false while its
    /// stream holds undrained orders, orders wait for payment or for their close to
    /// reach the database, or units it gave are on their way (then nothing changes).
    /// When it may, its keys get an expiry of `retention` (`None`: they are kept); a
    /// non-empty dead-letter stream is kept either way.
    pub async fn expire_finished(
        &self,
        voucher: impl Into<Bucket>,
        retention: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let done: i64 = EXPIRE_SALE
            .key(&k.sale)
            .key(&k.buyers)
            .key(&k.orders)
            .key(&k.dead)
            .key(&k.drain_tx)
            .key(&k.repair)
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.to_settle)
            .key(&k.transfers)
            .key(&k.received)
            .arg(keys::DRAIN_GROUP)
            .arg(retention.map_or(0, |r| r.as_millis() as u64))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(done == protocol::expire_sale::EXPIRING)
    }

    /// Removes a voucher from the active set; true when it was there.
    pub async fn retire(&self, voucher: impl Into<Bucket>) -> Result<bool, StoreError> {
        let voucher: Bucket = voucher.into();
        let removed: i64 = self
            .conn
            .clone()
            .srem(keys::ACTIVE_VOUCHERS, voucher.to_string())
            .await?;
        Ok(removed == 1)
    }

    /// Probes one voucher's stream in one script call (`lua/probe.lua`): makes its drain
    /// group if missing and reports what the drainer has to do there ([`Probe`]). When
    /// `leaving` (the run's last look at the stream), it also deletes up to
    /// [`REAP_PER_PROBE`] spent consumers other than `consumer`, and `consumer` itself
    /// if it holds nothing.
    pub async fn probe(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        min_idle: Duration,
        leaving: bool,
    ) -> Result<Probe, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let reply: Vec<Value> = PROBE
            .key(&k.orders)
            .key(&k.sale)
            .key(&k.deadlines)
            .key(&k.to_settle)
            .key(&k.closed)
            .arg(keys::DRAIN_GROUP)
            .arg(min_idle.as_millis() as u64)
            .arg(consumer)
            .arg(if leaving { REAP_PER_PROBE } else { 0 })
            .arg(if leaving { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await?;
        let bad = || StoreError::Corrupt(format!("probe of voucher {voucher} replied {reply:?}"));
        let int = |i: usize| match reply.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            _ => Err(bad()),
        };
        let (length, pending, undelivered) = (int(0)?, int(1)?, int(2)?);
        let (fully, claimable, oldest_idle, ends) = (int(3)?, int(4)?, int(5)?, int(6)?);
        let last_delivered = reply.get(7).cloned().and_then(string_of).ok_or_else(bad)?;
        let reaped = int(8)?;
        let closing = int(9)? == 1;
        let count = |n: i64| u64::try_from(n).map_err(|_| bad());
        let (length, pending, undelivered) = (count(length)?, count(pending)?, count(undelivered)?);
        Ok(Probe {
            length,
            pending,
            undelivered,
            fully_delivered: fully == 1,
            claimable: claimable == 1,
            oldest_idle_ms: u64::try_from(oldest_idle).ok(),
            ends_ms: (ends >= 0).then_some(ends),
            last_delivered,
            reaped: count(reaped)?,
            closing,
        })
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

    /// Records an open drainer transaction of `voucher` (see [`VoucherKeys::drain_tx`]),
    /// in bucket 0's registry for every bucket: a transaction holds the voucher's row
    /// lock, so a run blocked while draining any bucket must find it there.
    /// The record expires an hour after the voucher's latest transaction: entries left
    /// by killed runs do not pile up on a sale nobody drains any more.
    pub async fn register_tx(
        &self,
        voucher: impl Into<Bucket>,
        transaction: &str,
        consumer: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        // One registry per voucher, whatever the bucket: the row lock is the voucher's.
        let k = VoucherKeys::new(voucher.voucher());
        let _: () = redis::pipe()
            .hset(&k.drain_tx, transaction, format!("{consumer} {now}"))
            .ignore()
            .expire(&k.drain_tx, 3_600)
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Forgets an ended transaction.
    pub async fn unregister_tx(
        &self,
        voucher: impl Into<Bucket>,
        transaction: &str,
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        // One registry per voucher, whatever the bucket: the row lock is the voucher's.
        let k = VoucherKeys::new(voucher.voucher());
        let _: i64 = self.conn.clone().hdel(&k.drain_tx, transaction).await?;
        Ok(())
    }

    /// The open drainer transactions recorded for `voucher`: (transaction id, consumer,
    /// when it began; 0 when the record does not say).
    pub async fn registered_txs(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Vec<(String, String, UnixMillis)>, StoreError> {
        let voucher: Bucket = voucher.into();
        // One registry per voucher, whatever the bucket: the row lock is the voucher's.
        let k = VoucherKeys::new(voucher.voucher());
        let all: HashMap<String, String> = self.conn.clone().hgetall(&k.drain_tx).await?;
        Ok(all
            .into_iter()
            .map(|(tx, v)| {
                let (consumer, begun) = v.split_once(' ').unwrap_or((&v, "0"));
                (tx, consumer.to_string(), begun.parse().unwrap_or(0))
            })
            .collect())
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

    /// Up to `count` entries never delivered to the group (`XREADGROUP ... >`), now
    /// pending for `consumer`. Does not block: the caller decides how long to wait. In
    /// durable mode, entries the replicas do not hold yet are given back and reported as
    /// a transient error (see [`Self::with_durability`]).
    pub async fn read_new(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(keys::DRAIN_GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count.max(1))
            .arg("STREAMS")
            .arg(&k.orders)
            .arg(">");
        let (reply, replicated) = self.handing_out(&cmd).await?;
        let mut entries = parse_read_reply(reply)?;
        if !replicated && !entries.is_empty() {
            let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            return Err(self.not_yet_replicated(voucher, consumer, &ids).await);
        }
        for e in &mut entries {
            e.deliveries = 1;
        }
        Ok(entries)
    }

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
        Ok(acked)
    }

    /// Copies `entry` with `reason` to the dead-letter stream and acks it, atomically.
    /// Returns false when the entry was no longer pending (someone else finished it).
    pub async fn dead_letter(
        &self,
        voucher: impl Into<Bucket>,
        entry: &StreamEntry,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut call = DEAD_LETTER.key(&k.orders);
        call.key(&k.dead)
            .arg(keys::DRAIN_GROUP)
            .arg(&entry.id)
            .arg(reason)
            .arg(entry.deliveries);
        for (f, v) in &entry.fields {
            call.arg(f.as_slice()).arg(v.as_slice());
        }
        let written: i64 = call.invoke_async(&mut self.conn.clone()).await?;
        Ok(written == protocol::dead_letter::WRITTEN)
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

    /// Length, pending count and lag of the drain group (`None` when the stream or the
    /// group does not exist).
    pub async fn stats(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Option<StreamStats>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut conn = self.conn.clone();
        let exists: bool = conn.exists(&k.orders).await?;
        if !exists {
            return Ok(None);
        }
        let groups: redis::streams::StreamInfoGroupsReply = conn.xinfo_groups(&k.orders).await?;
        let Some(group) = groups
            .groups
            .into_iter()
            .find(|g| g.name == keys::DRAIN_GROUP)
        else {
            return Ok(None);
        };
        let length: u64 = conn.xlen(&k.orders).await?;
        let newest: Value = redis::cmd("XREVRANGE")
            .arg(&k.orders)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await?;
        let newest = parse_entries(newest)?.into_iter().next().map(|e| e.id);
        let fully_delivered = match &newest {
            None => true,
            Some(id) => !id_less(&group.last_delivered_id, id),
        };
        let pending = group.pending as u64;
        let (undelivered, lag_exact) = match group.lag {
            Some(lag) => (lag as u64, true),
            None if fully_delivered => (0, true),
            None => (length.saturating_sub(pending), false),
        };
        Ok(Some(StreamStats {
            length,
            pending,
            undelivered,
            lag_exact,
            fully_delivered,
            last_delivered: group.last_delivered_id,
        }))
    }

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
    /// and the dead letter is deleted, in one script. The voucher is added to the active
    /// set first, so the drainer visits it. Returns the new entry's id, `None` when the
    /// dead letter was gone already (replayed by someone else): nothing was written.
    pub async fn replay_dead_letter(
        &self,
        voucher: impl Into<Bucket>,
        dead: &DeadLetter,
    ) -> Result<Option<String>, StoreError> {
        let voucher: Bucket = voucher.into();
        self.activate(voucher).await?;
        let k = VoucherKeys::new(voucher);
        let mut call = REPLAY_DEAD_LETTER.key(&k.orders);
        call.key(&k.dead).arg(keys::DRAIN_GROUP).arg(&dead.id);
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
    /// nowhere else), after adding the bucket to the active set. Returns the new entry's
    /// id. The drainer writes it like any admission; an order already in the database is
    /// a duplicate by its id.
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
        Ok(id)
    }

    /// Adds the voucher to the set the drainer visits (idempotent).
    pub async fn activate(&self, voucher: impl Into<Bucket>) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        let _: i64 = self
            .conn
            .clone()
            .sadd(keys::ACTIVE_VOUCHERS, voucher.to_string())
            .await?;
        Ok(())
    }

    /// Whether the voucher is in the set the drainer visits.
    pub async fn is_active(&self, voucher: impl Into<Bucket>) -> Result<bool, StoreError> {
        let voucher: Bucket = voucher.into();
        Ok(self
            .conn
            .clone()
            .sismember(keys::ACTIVE_VOUCHERS, voucher.to_string())
            .await?)
    }

    /// When the voucher's sale ends (`ends_ms` of its sale hash), if Redis has the sale.
    pub async fn sale_ends_ms(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Option<UnixMillis>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let ends: Option<String> = self
            .conn
            .clone()
            .hget(&k.sale, sale_fields::ENDS_MS)
            .await?;
        Ok(ends.and_then(|s| s.parse().ok()))
    }
}

/// Orders stream ids (`<ms>-<seq>`) numerically; ids that do not parse sort first.
pub fn id_less(a: &str, b: &str) -> bool {
    fn parts(id: &str) -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    }
    parts(a) < parts(b)
}

fn corrupt(what: &str, v: &Value) -> StoreError {
    StoreError::Corrupt(format!("unexpected {what} reply: {v:?}"))
}

fn bytes_of(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn string_of(v: Value) -> Option<String> {
    bytes_of(v).and_then(|b| String::from_utf8(b).ok())
}

/// `[id, [f1, v1, f2, v2, ...]]` → an entry; `None` for an entry whose fields are nil (it
/// was deleted while pending).
fn parse_entry(v: Value) -> Result<Option<StreamEntry>, StoreError> {
    let items = match v {
        Value::Array(items) => items,
        Value::Nil => return Ok(None),
        other => return Err(corrupt("stream entry", &other)),
    };
    let [id, body] = <[Value; 2]>::try_from(items)
        .map_err(|items| corrupt("stream entry", &Value::Array(items)))?;
    let id = string_of(id.clone()).ok_or_else(|| corrupt("stream entry id", &id))?;
    let flat = match body {
        Value::Array(flat) => flat,
        Value::Nil => return Ok(None),
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => return Err(corrupt("stream entry fields", &other)),
    };
    if flat.len() % 2 != 0 {
        return Err(StoreError::Corrupt(format!(
            "stream entry {id} has an odd number of field items"
        )));
    }
    let mut fields = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(f), Some(v)) = (it.next(), it.next()) {
        let f = bytes_of(f).ok_or_else(|| StoreError::Corrupt(format!("entry {id}: field")))?;
        let v = bytes_of(v).ok_or_else(|| StoreError::Corrupt(format!("entry {id}: value")))?;
        fields.push((f, v));
    }
    Ok(Some(StreamEntry {
        id,
        fields,
        deliveries: 0,
    }))
}

fn parse_entries(v: Value) -> Result<Vec<StreamEntry>, StoreError> {
    match v {
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if let Some(e) = parse_entry(item)? {
                    out.push(e);
                }
            }
            Ok(out)
        }
        Value::Nil => Ok(Vec::new()),
        other => Err(corrupt("stream entries", &other)),
    }
}

/// XREADGROUP of one stream: nil (nothing new), `[[key, entries]]` (RESP2) or
/// `{key: entries}` (RESP3).
fn parse_read_reply(v: Value) -> Result<Vec<StreamEntry>, StoreError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut out = Vec::new();
            for s in streams {
                match s {
                    Value::Array(pair) if pair.len() == 2 => {
                        let mut pair = pair.into_iter();
                        let _key = pair.next();
                        if let Some(entries) = pair.next() {
                            out.extend(parse_entries(entries)?);
                        }
                    }
                    other => return Err(corrupt("XREADGROUP", &other)),
                }
            }
            Ok(out)
        }
        Value::Map(streams) => {
            let mut out = Vec::new();
            for (_key, entries) in streams {
                out.extend(parse_entries(entries)?);
            }
            Ok(out)
        }
        other => Err(corrupt("XREADGROUP", &other)),
    }
}

/// XAUTOCLAIM: `[next, entries]` (Redis 6.2) or `[next, entries, deleted ids]` (7+).
fn parse_autoclaim(v: Value) -> Result<ClaimPage, StoreError> {
    let Value::Array(items) = v else {
        return Err(corrupt("XAUTOCLAIM", &v));
    };
    if !(2..=3).contains(&items.len()) {
        return Err(corrupt("XAUTOCLAIM", &Value::Array(items)));
    }
    let mut it = items.into_iter();
    let next = it
        .next()
        .and_then(string_of)
        .ok_or_else(|| StoreError::Corrupt("XAUTOCLAIM cursor".into()))?;
    let entries = parse_entries(it.next().unwrap_or(Value::Nil))?;
    let deleted = match it.next() {
        Some(Value::Array(ids)) => ids.into_iter().filter_map(string_of).collect(),
        _ => Vec::new(),
    };
    Ok(ClaimPage {
        entries,
        deleted,
        next: (next != "0-0").then_some(next),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, kv: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(kv.iter().map(|s| bulk(s)).collect()),
        ])
    }

    #[test]
    fn read_replies_parse_in_resp2_and_resp3_shapes() {
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("seckill:{1}:orders"),
            Value::Array(vec![
                entry("1-0", &["order_id", "5"]),
                entry("2-0", &["a", "b"]),
            ]),
        ])]);
        let got = parse_read_reply(resp2).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].field("order_id"), Some(&b"5"[..]));
        assert_eq!(got[1].id, "2-0");
        let resp3 = Value::Map(vec![(
            bulk("k"),
            Value::Array(vec![entry("3-0", &["x", "y"])]),
        )]);
        assert_eq!(parse_read_reply(resp3).unwrap()[0].id, "3-0");
        assert!(parse_read_reply(Value::Nil).unwrap().is_empty());
        assert!(parse_read_reply(Value::Int(3)).is_err());
    }

    #[test]
    fn autoclaim_reply_reports_cursor_entries_and_deleted_ids() {
        let reply = Value::Array(vec![
            bulk("7-0"),
            Value::Array(vec![entry("5-0", &["f", "v"]), Value::Nil]),
            Value::Array(vec![bulk("6-0")]),
        ]);
        let page = parse_autoclaim(reply).unwrap();
        assert_eq!(page.next.as_deref(), Some("7-0"));
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.deleted, vec!["6-0".to_string()]);
        let end = parse_autoclaim(Value::Array(vec![bulk("0-0"), Value::Array(vec![])])).unwrap();
        assert_eq!(end.next, None);
    }

    #[test]
    fn stream_ids_compare_numerically() {
        assert!(id_less("9-0", "10-0"));
        assert!(id_less("10-9", "10-10"));
        assert!(!id_less("10-10", "10-10"));
        assert!(id_less("0-0", "1-0"));
    }

    #[test]
    fn odd_field_lists_are_corrupt_not_panics() {
        let bad = Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("lonely")])]);
        assert!(parse_entry(bad).is_err());
        assert!(parse_entry(Value::Array(vec![bulk("1-0")])).is_err());
    }
}

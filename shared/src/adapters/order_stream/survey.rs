//! What the drainer looks at before it reads: the set of buckets to visit, one
//! stream's probe (`lua/probe.lua`) and statistics, and the retirement of a finished
//! sale (`lua/expire_sale.lua`).
//!
//! Invariants kept here: the probe, the drainer's first call on every stream, makes the
//! drain group where it is missing, so `NOGROUP` never happens; a finished sale is
//! retired only when nothing of it is left to drain, pay, settle or transfer.

use std::time::Duration;

use redis::{AsyncCommands, Value};

use super::parse::{id_less, parse_entries};
use super::reading::OrderStreams;
use super::scripts::{EXPIRE_SALE, PROBE};
use crate::adapters::redis::AfterFailure;
use crate::domain::{Bucket, StreamEntry, UnixMillis};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::{self, sale_fields};

/// Spent consumers one [`OrderStreams::probe`] deletes at most: a long backlog goes in
/// small steps, never one long script.
pub const REAP_PER_PROBE: u64 = 8;

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
    /// Spent consumers this probe deleted.
    pub reaped: u64,
    /// An order's payment deadline has passed or a close waits for the database
    /// (vouchers with a payment step): the drainer sweeps the voucher.
    pub closing: bool,
    /// New entries the probe read for its caller (asked with `read > 0`, see
    /// [`OrderStreams::probe`]): pending for it now, to process or release like any read.
    pub entries: Vec<StreamEntry>,
    /// Entries are pending for the caller itself: a read whose reply was lost left them
    /// there unseen (the probe's own, sent again after a cut connection, or an earlier
    /// run's of the same consumer). The probe read nothing new then; the caller drains
    /// them first ([`OrderStreams::read_own_pending`]), before anything newer.
    pub own_pending: bool,
}

impl Probe {
    /// Whether the drainer has anything to do here: new entries, idle ones to claim, or
    /// its own pending ones.
    pub fn has_work(&self) -> bool {
        self.undelivered > 0 || !self.fully_delivered || self.claimable || self.own_pending
    }
}

impl OrderStreams {
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
            .key(&k.grace)
            .key(&k.rebuys)
            .arg(keys::DRAIN_GROUP)
            .arg(retention.map_or(0, |r| r.as_millis() as u64))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(done == protocol::expire_sale::EXPIRING)
    }

    /// Removes a voucher from the active set, after [`Self::expire_finished`] agreed;
    /// true when it was there and stays out.
    ///
    /// The check and the removal are two calls (the active set is one key of its own
    /// slot, the check's keys are the voucher's), so an operator's replay or requeue
    /// can write an entry between them; it activates the voucher after its write, and
    /// that may come before the removal. So the check is made once more after the
    /// removal (nothing expires in it) and the voucher goes back when something waits:
    /// an entry written before that second check is seen by it, one written after finds
    /// the removal done and its own activation lasts. No entry is left unvisited.
    pub async fn retire(&self, voucher: impl Into<Bucket>) -> Result<bool, StoreError> {
        let voucher: Bucket = voucher.into();
        let removed: i64 = self
            .conn
            .clone()
            .srem(keys::ACTIVE_VOUCHERS, voucher.to_string())
            .await?;
        match self.expire_finished(voucher, None).await {
            Ok(true) => Ok(removed == 1),
            Ok(false) => {
                self.activate(voucher).await?;
                Ok(false)
            }
            Err(e) => {
                // Not known to be drained still: back in the set (best effort), so a
                // later run looks again.
                let _ = self.activate(voucher).await;
                Err(e)
            }
        }
    }

    /// Probes one voucher's stream in one script call (`lua/probe.lua`): makes its drain
    /// group if missing and reports what the drainer has to do there ([`Probe`]). When
    /// `leaving` (the run's last look at the stream), it also deletes up to
    /// [`REAP_PER_PROBE`] spent consumers other than `consumer`, and `consumer` itself
    /// if it holds nothing. With `read > 0` it also reads up to `read` new entries for
    /// `consumer` when some wait, none is claimable and `consumer` holds none
    /// ([`Probe::entries`]; claimable entries are recovered first, the caller's own
    /// drained first, and the new ones read after them), in the same call: a survey of
    /// thousands of small sales then reads each one once instead of twice. In durable
    /// mode nothing is read here (entries are handed out only through
    /// [`Self::read_new`], which waits for the replicas first).
    pub async fn probe(
        &self,
        voucher: impl Into<Bucket>,
        consumer: &str,
        min_idle: Duration,
        leaving: bool,
        read: usize,
    ) -> Result<Probe, StoreError> {
        let voucher: Bucket = voucher.into();
        let call = self.probe_call(voucher, consumer, min_idle, leaving, read);
        let reply = call.alone(&self.conn).await?;
        parse_probe(voucher, reply)
    }

    /// [`Self::probe`] of many buckets (a survey's, not leaving), pipelined where one
    /// Redis node serves every slot instead of a request each: with thousands of small
    /// sales the survey's probes are most of a run's requests. Each answer as [`Self::probe`]
    /// would give it; a probe whose pipeline failed as a whole fails (it may have read
    /// entries, which wait, pending, for a later claim), as it would have alone.
    pub async fn probe_many(
        &self,
        vouchers: &[Bucket],
        consumer: &str,
        min_idle: Duration,
        read: usize,
    ) -> Vec<Result<Probe, StoreError>> {
        let calls: Vec<ProbeCall> = vouchers
            .iter()
            .map(|v| self.probe_call(*v, consumer, min_idle, false, read))
            .collect();
        let cmds: Vec<redis::Cmd> = calls.iter().map(ProbeCall::cmd).collect();
        let alone = |i: usize| calls[i].alone(&self.conn);
        let answers = self.conn.pipelined(&cmds, AfterFailure::Fail, alone).await;
        answers
            .into_iter()
            .zip(vouchers)
            .map(|(answer, v)| parse_probe(*v, answer?))
            .collect()
    }

    /// The keys and arguments of one probe (`lua/probe.lua`).
    fn probe_call(
        &self,
        voucher: Bucket,
        consumer: &str,
        min_idle: Duration,
        leaving: bool,
        read: usize,
    ) -> ProbeCall {
        let read = if self.durable.is_some() { 0 } else { read };
        let k = VoucherKeys::new(voucher);
        ProbeCall {
            keys: [k.orders, k.sale, k.deadlines, k.to_settle, k.closed],
            args: [
                keys::DRAIN_GROUP.to_string(),
                (min_idle.as_millis() as u64).to_string(),
                consumer.to_string(),
                (if leaving { REAP_PER_PROBE } else { 0 }).to_string(),
                (if leaving { "1" } else { "0" }).to_string(),
                read.to_string(),
            ],
        }
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
        // Nothing waits once the newest entry was delivered, whatever lag Redis reports
        // (Redis 7.0 can report 1 for ever after an undelivered entry was deleted; as
        // in lua/probe.lua).
        let (undelivered, lag_exact) = match group.lag {
            _ if fully_delivered => (0, true),
            Some(lag) => (lag as u64, true),
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

/// One probe's keys and arguments: sent alone ([`ProbeCall::alone`], which loads the
/// script where it is missing) or in a pipeline ([`ProbeCall::cmd`]).
struct ProbeCall {
    keys: [String; 5],
    args: [String; 6],
}

impl ProbeCall {
    /// The probe as one `EVALSHA`, for a pipeline.
    fn cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(PROBE.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys[..])
            .arg(&self.args[..]);
        cmd
    }

    /// The probe sent alone.
    async fn alone(&self, conn: &crate::adapters::redis::RedisConn) -> redis::RedisResult<Value> {
        let mut call = PROBE.prepare_invoke();
        for k in &self.keys {
            call.key(k);
        }
        for a in &self.args {
            call.arg(a);
        }
        let reply: Value = call.invoke_async(&mut conn.clone()).await?;
        reply.extract_error()
    }
}

/// A probe's reply (see `lua/probe.lua`'s header) as a [`Probe`].
fn parse_probe(voucher: Bucket, reply: Value) -> Result<Probe, StoreError> {
    let Value::Array(reply) = reply else {
        return Err(StoreError::Corrupt(format!(
            "probe of voucher {voucher} replied {reply:?}"
        )));
    };
    let bad = || StoreError::Corrupt(format!("probe of voucher {voucher} replied {reply:?}"));
    let int = |i: usize| match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        _ => Err(bad()),
    };
    let (length, pending, undelivered) = (int(0)?, int(1)?, int(2)?);
    let (fully, claimable, oldest_idle, ends) = (int(3)?, int(4)?, int(5)?, int(6)?);
    let reaped = int(7)?;
    let closing = int(8)? == 1;
    let own_pending = int(10)? == 1;
    let mut entries = match reply.get(9) {
        Some(v @ Value::Array(_)) => parse_entries(v.clone())?,
        _ => return Err(bad()),
    };
    for e in &mut entries {
        e.deliveries = 1;
    }
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
        reaped: count(reaped)?,
        closing,
        entries,
        own_pending,
    })
}

//! The cluster client of an instance: replaced by a new one when a request times out,
//! and which requests are then sent again.
//!
//! Invariants kept here: only a request that survives being run twice is resent after
//! a timeout ([`resendable`]: reads and the scripts that decide once; never a give, a
//! `WAIT`, a group read, a lock or a plain write); an admission is resent marked as a
//! resend, so a late first copy writes nothing; a caller whose request may have run
//! hears "no answer in time", never a refusal; the client is replaced at most once per
//! [`REPLACE_AT_MOST_EVERY`].

use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Value};

use super::redirect::{Request, redirected};
use super::scripts::{ADMIT, GIVE};
use crate::protocol::admit;

/// The cluster client of an instance, replaced by a new one when a request times out.
///
/// Seen in the failover and slot-moving tests: after a failover or a slot move the
/// library's client can get into a state where the requests for a slot time out while
/// every node answers at once: some requests are lost inside the client, and for
/// seconds (after a failover, minutes) new ones are too. Other requests, even for the
/// same slot, may still be answered meanwhile, so a lost request cannot be told from a
/// slow server here. A request that times out therefore has the client replaced by a
/// new one built from the seed address, which reads the topology afresh (at most once
/// per [`REPLACE_AT_MOST_EVERY`]), and, if [`resendable`], is sent again on it; so are
/// the requests timing out beside it, sent before the replacement. A resend that times
/// out too, or does not get through (its slot split, its node not yet connected), is
/// sent again while the request's budget lasts ([`Cluster::resend`]). Buyers see one
/// slow answer instead of a 503.
#[derive(Clone)]
pub struct Cluster {
    pub(super) client: Arc<redis::cluster::ClusterClient>,
    /// The current client's connection and its generation (one more per replacement).
    pub(super) conn: Arc<RwLock<(u64, ClusterConnection)>>,
    /// When a replacement was last tried (successful or not), in microseconds since
    /// `BORN` plus one (0: never). Held while one is under way, so the requests timing
    /// out together wait for it instead of each replacing.
    pub(super) replaced_at: Arc<tokio::sync::Mutex<u64>>,
    /// How many primaries serve slots (`CLUSTER SLOTS`), read when first needed: many
    /// commands travel as pipelines where one does (the `pipelined` module).
    pub(super) primaries: Arc<RwLock<Option<usize>>>,
}

/// The least time between two replacements of an instance's cluster client: a Redis
/// that is merely slow (every request timing out) costs each instance one new client
/// a second, not one per response timeout.
pub const REPLACE_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// The clock replacements are timed by.
static BORN: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Microseconds since [`BORN`], plus one: finer than a request's round trip.
fn born_us() -> u64 {
    BORN.elapsed().as_micros() as u64 + 1
}

/// Whether a request that timed out may be sent once more: its first attempt may have
/// run with only the reply lost, or may still run later (stuck on the old connection,
/// overtaken by the resend on the new one). True when every command is a read or a
/// script call that survives both: an admission finds its own order id, a close its
/// order, a take its transfer id, a lease sent twice only wastes a block. Not resent:
/// `lua/give.lua` (a late first copy arriving after the transfer's record was deleted
/// would give the units again under an id already received, and they would be lost);
/// a `WAIT` (on a new connection it would count no write and vouch for one it never
/// saw); a stream read for a group (the first read's entries would wait, pending, for
/// the next claim); a lock taken with `SET NX`; plain writes.
fn resendable(request: Request<'_>) -> bool {
    let is_safe = |cmd: &Cmd| {
        let mut args = plain_args(cmd);
        let Some(name) = args.next() else {
            return false;
        };
        if name.eq_ignore_ascii_case(b"EVALSHA") {
            return args.next() != Some(GIVE.get_hash().as_bytes());
        }
        READS
            .iter()
            .any(|r| r.as_bytes().eq_ignore_ascii_case(name))
    };
    match request {
        Request::Command(cmd) => is_safe(cmd),
        Request::Pipeline(p, ..) => p.cmd_iter().all(is_safe),
    }
}

/// How long a request keeps asking again while its slot is split between two nodes
/// (`TRYAGAIN`: a multi-key script while some of its keys have moved and others not, as
/// long as a big key takes to move) or the cluster is down for a reconfiguration
/// (`CLUSTERDOWN`), after the client's own retries (about 0.55 s) gave up: nothing ran,
/// so asking again is always safe. It also bounds the resends of a request that timed
/// out ([`Cluster::resend`]): a resend is sent within it, and may take one request
/// timeout more. Within seckill-http's 10 s function timeout, and well beyond the 2 s
/// a big stream was seen to hold a slot split.
pub const SPLIT_SLOT_BUDGET: Duration = Duration::from_secs(4);
/// The pause between two rounds (plus as much again at random).
const SPLIT_SLOT_PAUSE: Duration = Duration::from_millis(50);

/// Whether a request's answer says that nothing ran because its slot is split between
/// two nodes or the cluster is down (see [`SPLIT_SLOT_BUDGET`]).
fn slot_split(result: &redis::RedisResult<Value>) -> bool {
    use redis::ServerErrorKind::{ClusterDown, TryAgain};
    match result {
        Err(e) => matches!(e.kind(), redis::ErrorKind::Server(TryAgain | ClusterDown)),
        Ok(Value::ServerError(e)) => matches!(e.kind(), Some(TryAgain | ClusterDown)),
        Ok(_) => false,
    }
}

/// Whether a failure says that the request did not get through this time and may
/// simply be sent again: its slot split or the cluster down (nothing ran), or the
/// connection to its node lost or not yet known to the client (after a slot moved or
/// the client was replaced).
fn not_through(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{ClusterDown, TryAgain};
    matches!(
        e.kind(),
        redis::ErrorKind::Server(TryAgain | ClusterDown)
            | redis::ErrorKind::ClusterConnectionNotFound
            | redis::ErrorKind::Io
    ) || e.is_connection_dropped()
}

/// Whether there is time left for one more round (and its pause) within `budget`
/// from `started`.
fn within(started: Instant, budget: Duration) -> bool {
    started.elapsed() + SPLIT_SLOT_PAUSE < budget
}

/// The pause before asking again while a slot is split: [`SPLIT_SLOT_PAUSE`] plus as
/// much again at random. The clock's microseconds are random enough to spread the
/// buyers out.
async fn pause_for_split() {
    let jitter = born_us() % (SPLIT_SLOT_PAUSE.as_micros() as u64 + 1);
    tokio::time::sleep(SPLIT_SLOT_PAUSE + Duration::from_micros(jitter)).await;
}

/// The form of `request` to send again after a timeout: an admission (`lua/admit.lua`)
/// carries `ARGV[3]` [`admit::AGAIN`], so that it decides the attempt and a late first
/// copy writes nothing (see the script's header); `None` for everything else, sent as
/// it was.
fn resend_of(request: Request<'_>) -> Option<Cmd> {
    let Request::Command(cmd) = request else {
        return None;
    };
    let mut args = plain_args(cmd);
    let (name, sha) = (args.next()?, args.next()?);
    if !name.eq_ignore_ascii_case(b"EVALSHA") || sha != ADMIT.get_hash().as_bytes() {
        return None;
    }
    let mut again = redis::cmd("EVALSHA");
    again.arg(sha);
    for arg in args {
        again.arg(arg);
    }
    again.arg(admit::AGAIN);
    Some(again)
}

/// A command's arguments as bytes (a cursor argument, which no command here has, as
/// empty).
fn plain_args(cmd: &Cmd) -> impl Iterator<Item = &[u8]> {
    cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(bytes) => bytes,
        _ => &b""[..],
    })
}

/// A resend's failure as the caller must see it: no answer in time (an earlier copy
/// may have run, or may still run), with the failure's own text.
fn may_have_run(e: &redis::RedisError) -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no reply in time, and sending again failed: {e}"),
    )
    .into()
}

/// Commands that only read (and `SCRIPT`, which loads scripts): safe to send again.
#[rustfmt::skip]
const READS: &[&str] = &[
    "SCRIPT", "GET", "MGET", "EXISTS", "PTTL", "TTL", "HGET", "HMGET", "HGETALL", "HVALS",
    "HKEYS", "HLEN", "HEXISTS", "HSCAN", "SMEMBERS", "SCARD", "SISMEMBER", "ZRANGE",
    "ZRANGEBYSCORE", "ZCARD", "ZSCORE", "ZCOUNT", "XLEN", "XRANGE", "XREVRANGE", "XPENDING",
    "XINFO", "PING", "TIME", "INFO",
];

impl Cluster {
    pub(super) fn current(&self) -> (u64, ClusterConnection) {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn generation(&self) -> u64 {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Sends `request`; when it times out, replaces the client and, if the request is
    /// [`resendable`], sends it again on the new one (an admission marked as a resend:
    /// [`resend_of`]).
    ///
    /// The first copy may still run after that, or may have run: whatever becomes of
    /// the resend, its caller must hear "no answer in time" rather than a refusal, so
    /// a resend that fails any other way is reported as a timeout too (an admission
    /// then names its order instead of denying it).
    pub(super) async fn request(&self, request: Request<'_>) -> redis::RedisResult<Value> {
        let started = Instant::now();
        loop {
            let (generation, mut conn) = self.current();
            // Stamped after the client is read: a replacement begun before this request
            // took its client is not one that covers it.
            let sent = born_us();
            let result = redirected(&mut conn, request).await;
            match &result {
                Err(e) if e.is_timeout() && resendable(request) => {
                    return self
                        .resend(request, started, generation, sent, result)
                        .await;
                }
                // Nothing ran: the slot's keys are between two nodes (a move under way)
                // or the cluster is reconfiguring. Ask again while the budget lasts,
                // rather than answer a buyer 503.
                _ if slot_split(&result) && within(started, SPLIT_SLOT_BUDGET) => {
                    pause_for_split().await
                }
                _ => return result,
            }
        }
    }

    /// After a copy of `request` sent at `sent` on client `generation` timed out with
    /// `timed_out`: sends it again on a new client, and again while a copy times out
    /// (on another new client) or does not get through (its slot split, its node's
    /// connection lost), within [`SPLIT_SLOT_BUDGET`] from `started`. Any number of
    /// resends is safe: a resendable request survives copies, and an admission's
    /// resends decide once and then only report (`lua/admit.lua`).
    async fn resend(
        &self,
        request: Request<'_>,
        started: Instant,
        mut generation: u64,
        mut sent: u64,
        timed_out: redis::RedisResult<Value>,
    ) -> redis::RedisResult<Value> {
        let again = resend_of(request);
        let resend = again.as_ref().map_or(request, Request::Command);
        let mut last = timed_out;
        let mut needs_new_client = true;
        loop {
            if needs_new_client && !self.replaced_since(generation, sent).await {
                return last;
            }
            let mut conn;
            (generation, conn) = self.current();
            sent = born_us();
            // An error reply comes back as a value; it is a failure all the same.
            let e = match redirected(&mut conn, resend)
                .await
                .and_then(Value::extract_error)
            {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            needs_new_client = e.is_timeout();
            let retry = needs_new_client || not_through(&e);
            last = Err(if needs_new_client {
                e
            } else {
                may_have_run(&e)
            });
            if !retry || !within(started, SPLIT_SLOT_BUDGET) {
                return last;
            }
            if !needs_new_client {
                pause_for_split().await;
            }
        }
    }

    /// After a request sent at `sent` on client `generation` timed out: replaces that
    /// client unless a replacement was tried since the request was sent or less than
    /// [`REPLACE_AT_MOST_EVERY`] ago, then says whether a newer client is there to send
    /// the request again on.
    async fn replaced_since(&self, generation: u64, sent: u64) -> bool {
        let mut tried = self.replaced_at.lock().await;
        let now = born_us();
        let due = *tried < sent
            && (*tried == 0 || now - *tried >= REPLACE_AT_MOST_EVERY.as_micros() as u64);
        if self.generation() == generation && due {
            *tried = now;
            match self.client.get_async_connection().await {
                Ok(fresh) => {
                    *self.conn.write().unwrap_or_else(|e| e.into_inner()) = (generation + 1, fresh);
                    tracing::warn!(
                        "a redis cluster request timed out; replaced the client with a new one"
                    );
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "a redis cluster request timed out; replacing the client failed"
                ),
            }
        }
        drop(tried);
        self.generation() != generation
    }
}

#[cfg(test)]
mod tests {
    use super::super::scripts::CLOSE;
    use super::*;

    #[test]
    fn only_reads_and_script_calls_are_sent_again_after_a_timeout() {
        let mut admit = redis::cmd("EVALSHA");
        admit
            .arg("0123abcd")
            .arg(1)
            .arg("seckill:{42}:sale")
            .arg("alice");
        let mut read = redis::cmd("HMGET");
        read.arg("seckill:{42}:sale").arg("stock");
        assert!(resendable(Request::Command(&admit)));
        assert!(resendable(Request::Command(&read)));
        let mut p = redis::pipe();
        p.add_command(read.clone()).hlen("seckill:{42}:received");
        assert!(resendable(Request::Pipeline(&p, 0, 2)));

        // A durable admission: the WAIT would vouch for nothing on a new connection.
        let mut durable = redis::pipe();
        durable
            .add_command(admit.clone())
            .cmd("WAIT")
            .arg(1)
            .arg(100);
        assert!(!resendable(Request::Pipeline(&durable, 0, 2)));
        // A group read, a lock, a plain write.
        let mut group_read = redis::cmd("XREADGROUP");
        group_read
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("STREAMS")
            .arg("s")
            .arg(">");
        let mut lock = redis::cmd("SET");
        lock.arg("seckill:{42}:repair")
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(10_000);
        let mut ack = redis::cmd("XACK");
        ack.arg("s").arg("g").arg("1-1");
        // A transfer's give: a late first copy would give its units again.
        let mut give = redis::cmd("EVALSHA");
        give.arg(GIVE.get_hash()).arg(2).arg("seckill:{42}:sale");
        for cmd in [&group_read, &lock, &ack, &give] {
            assert!(
                !resendable(Request::Command(cmd)),
                "{:?}",
                cmd.args_iter().next()
            );
        }
    }

    #[test]
    fn only_an_admission_is_resent_marked_as_a_resend() {
        let mut admit = redis::cmd("EVALSHA");
        admit
            .arg(ADMIT.get_hash())
            .arg(4)
            .arg(&["s", "b", "o", "d", "alice", "41"]);
        let again = resend_of(Request::Command(&admit)).expect("an admission");
        let args: Vec<&[u8]> = again
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b,
                _ => &b""[..],
            })
            .collect();
        let want: Vec<&[u8]> = vec![
            b"EVALSHA",
            ADMIT.get_hash().as_bytes(),
            b"4",
            b"s",
            b"b",
            b"o",
            b"d",
            b"alice",
            b"41",
            admit::AGAIN.as_bytes(),
        ];
        assert_eq!(args, want);
        let mut close = redis::cmd("EVALSHA");
        close.arg(CLOSE.get_hash()).arg(1).arg("s");
        assert!(resend_of(Request::Command(&close)).is_none());
        let e = may_have_run(&redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
            "slot moving",
        )));
        assert!(e.is_timeout(), "{e}");
    }
}

//! The Redis adapter: connections and the sale's atomic scripts.
//!
//! [`RedisConn`] hides whether Redis runs as one node or as a cluster (ElastiCache
//! Serverless is always cluster mode; the local stack runs cluster mode too). Scripts are
//! kept in `lua/` and run with `redis::Script`, which sends EVALSHA and reloads the
//! script on NOSCRIPT by itself. Every script receives all its keys in `KEYS`, built by
//! [`crate::keys`] with one hash tag per call (invariant 4).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Script, Value};

use crate::config::{Durable, RedisConfig};
use crate::domain::{
    Admission, AdmitReply, Bucket, ClosedOrder, OrderId, PaymentRef, Reopen, SaleState, SaleWindow,
    UnixMillis, UserId, Voucher, VoucherId,
};
use crate::error::StoreError;
use crate::keys::{self, IdKeys, VoucherKeys};
use crate::order_id::{
    self, CLOCK_BEHIND_JUMP_MS, DAY_KEY_TTL_SECS, EPOCH_UNIX_MS, IdBlocks, Lease, SLOTS_PER_MS,
    Take,
};
use crate::protocol::{self, admit, close, preload, sale_fields};

static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/admit.lua")));
static PRELOAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/preload.lua")));
static RESTORE_BUYERS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/restore_buyers.lua")));
static LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/lease.lua")));
/// `lua/close.lua`: paying, cancelling and expiring orders (also run by the drainer).
pub(crate) static CLOSE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/close.lua")));

/// What a buyer asks of their order of a voucher with a payment step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseAction {
    Pay(PaymentRef),
    Cancel,
}

/// How the cluster client rides out a slot that moves or a primary that fails over.
///
/// MOVED (the slot has a new owner) and ASK (the slot is migrating and this key already
/// left) are followed at once; TRYAGAIN (a multi-key script during a migration, while
/// some of its keys have moved and others not), CLUSTERDOWN and a lost connection wait
/// first. The waits grow from 2 ms to at most 100 ms, each drawn at random below its
/// bound, so the 14 retries span about 0.55 s (at most 1.4 s): long enough for a slot's
/// keys to finish moving or a replica to be promoted, short enough to stay well inside
/// an admission's budget. (With 10, spanning 0.34 s on average but less than the 0.2 s
/// a slot of seven keys took to move in about one draw in twenty, one of 48 buyers
/// racing a move sometimes ran out of retries: the slot-moving test caught it.) The
/// library's defaults (16 retries, waits from 1.28 s) would hold a buyer for minutes;
/// two retries with them surfaced `MOVED` to buyers as 503s while a slot moved.
const REDIRECT_RETRIES: u32 = 14;
const REDIRECT_MIN_WAIT_MS: u64 = 2;
const REDIRECT_MAX_WAIT_MS: u64 = 100;
/// The n-th wait is drawn from `min .. min(max, factor * 2^n)` ms.
const REDIRECT_WAIT_FACTOR_MS: u64 = 5;

/// A single attempt's response timeout, as a multiple of the whole request's: larger, so
/// that the request's own timeout always fires first (see [`RedisConn::connect`]).
const ATTEMPT_TIMEOUT_FACTOR: u32 = 4;

/// A multiplexed, self-reconnecting connection to a single node or a cluster. Cheap to
/// clone: clones share the underlying connections.
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(Cluster),
}

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
    client: Arc<redis::cluster::ClusterClient>,
    /// The current client's connection and its generation (one more per replacement).
    conn: Arc<RwLock<(u64, ClusterConnection)>>,
    /// When a replacement was last tried (successful or not), in microseconds since
    /// `BORN` plus one (0: never). Held while one is under way, so the requests timing
    /// out together wait for it instead of each replacing.
    replaced_at: Arc<tokio::sync::Mutex<u64>>,
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
            return args.next() != Some(super::transfers::GIVE.get_hash().as_bytes());
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
    fn current(&self) -> (u64, ClusterConnection) {
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
    async fn request(&self, request: Request<'_>) -> redis::RedisResult<Value> {
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

impl RedisConn {
    /// Connects with bounded connect and response timeouts, so an unreachable Redis turns
    /// into an error within `cfg.timeout` rather than a hung request.
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisConn, StoreError> {
        install_crypto_provider();
        let certs = match &cfg.tls_ca_file {
            Some(path) => Some(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(path).map_err(|e| StoreError::Unavailable {
                    backend: "redis",
                    detail: format!("cannot read REDIS_TLS_CA_FILE {path}: {e}"),
                })?),
            }),
            None => None,
        };
        if cfg.cluster {
            // The request as a whole times out after `cfg.timeout`; a single attempt only
            // later. Were the attempt's own timeout to fire first, the client would send
            // the command again by itself (a plain copy, unmarked, possibly after the
            // caller had given up: see `Cluster::request`); a request whose caller has
            // gone is dropped by the client instead of retried.
            let mut builder = redis::cluster::ClusterClientBuilder::new(vec![cfg.url.as_str()])
                .connection_timeout(cfg.timeout)
                .response_timeout(cfg.timeout * ATTEMPT_TIMEOUT_FACTOR)
                .overall_response_timeout(Some(cfg.timeout))
                .retries(REDIRECT_RETRIES)
                .min_retry_wait(REDIRECT_MIN_WAIT_MS)
                .max_retry_wait(REDIRECT_MAX_WAIT_MS)
                .retry_wait_formula(REDIRECT_WAIT_FACTOR_MS, 2);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            let client = builder.build()?;
            let conn = client.get_async_connection().await?;
            Ok(RedisConn::Cluster(Cluster {
                client: Arc::new(client),
                conn: Arc::new(RwLock::new((0, conn))),
                replaced_at: Arc::default(),
            }))
        } else {
            let client = match certs {
                Some(certs) => redis::Client::build_with_tls(cfg.url.as_str(), certs)?,
                None => redis::Client::open(cfg.url.as_str())?,
            };
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(cfg.timeout))
                .set_response_timeout(Some(cfg.timeout))
                .set_number_of_retries(2);
            Ok(RedisConn::Single(
                ConnectionManager::new_with_config(client, config).await?,
            ))
        }
    }
}

/// Makes aws-lc-rs the process's TLS crypto provider. rustls refuses to pick one itself
/// when a build links two (the AWS SDK brings aws-lc-rs, other crates ring), and
/// redis-rs would then panic on the first `rediss://` connection.
pub fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => Box::pin(c.request(Request::Command(cmd))),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => Box::pin(async move {
                let result = c.request(Request::Pipeline(pipeline, offset, count)).await;
                result.map(|v| match v {
                    Value::Array(items) => items,
                    other => vec![other],
                })
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.current().1.get_db(),
        }
    }
}

/// Rounds of redirection this adapter adds on top of the cluster client's own.
const ASK_ROUNDS: usize = 5;

/// A command or a pipeline (with the reply offset and count the caller wants).
#[derive(Clone, Copy)]
enum Request<'a> {
    Command(&'a Cmd),
    Pipeline(&'a Pipeline, usize, usize),
}

/// Sends `request` through the cluster client and finishes the redirections it gave
/// up on, sending the request straight to the node each redirection names.
///
/// An ASK (the slot is migrating and this key already left) must reach the target
/// node right after an `ASKING` on the same connection. The client sends `ASKING` as a
/// request of its own on the node's multiplexed connection, so under concurrency
/// another request's command can slip in between: the target then answers MOVED back
/// to the source, which answers ASK again, until the client's retries run out (seen as
/// 503s while a slot moved). Here `ASKING` and the request travel as one pipeline, which
/// the connection writes contiguously. A MOVED the client gave up on is sent through
/// the client once more, then to the node it names: under load the client's slot map
/// was still the old one after its retries, and each round met the same MOVED (seen as
/// 503s in the slot-moving test while a failover test shared the CPU). A pipeline's
/// reply comes back as one array. (A node is reached by its address only if the client
/// already knows it: a brand-new node named by an ASK fails this way until the client's
/// slot map has it. Atomic pipelines cannot be redirected here; none are used.)
async fn redirected(c: &mut ClusterConnection, request: Request<'_>) -> redis::RedisResult<Value> {
    let mut result = send(c, request, None).await;
    let mut moved_before = false;
    for _ in 0..ASK_ROUNDS {
        let Err(err) = &result else { break };
        let asking = match err.kind() {
            redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => true,
            // The first time through the client, whose slot map is usually refreshed
            // by now (and which connects to a node it does not know yet).
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved) if !moved_before => {
                moved_before = true;
                result = send(c, request, None).await;
                continue;
            }
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => false,
            _ => break,
        };
        let Some((host, port)) = err
            .redirect_node()
            .and_then(|(addr, _slot)| addr.rsplit_once(':'))
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        else {
            break;
        };
        result = send(c, request, Some(Redirect { host, port, asking })).await;
    }
    result
}

/// The node a MOVED or an ASK named, and whether it was an ASK.
struct Redirect {
    host: String,
    port: u16,
    asking: bool,
}

/// One attempt: routed by the client, or to the node `to` names (with `ASKING` in front
/// of each command after an ASK).
async fn send(
    c: &mut ClusterConnection,
    request: Request<'_>,
    to: Option<Redirect>,
) -> redis::RedisResult<Value> {
    use redis::cluster_routing::SingleNodeRoutingInfo;
    let Some(to) = to else {
        return match request {
            Request::Command(cmd) => c.req_packed_command(cmd).await,
            Request::Pipeline(p, offset, count) => c
                .req_packed_commands(p, offset, count)
                .await
                .map(Value::Array),
        };
    };
    // `ASKING` lets only the next command in: one in front of each.
    let mut p = redis::pipe();
    let mut add = |cmd: &Cmd| {
        if to.asking {
            p.cmd("ASKING");
        }
        p.add_command(cmd.clone());
    };
    let (offset, count) = match request {
        Request::Command(cmd) => {
            add(cmd);
            (0, 1)
        }
        Request::Pipeline(original, offset, count) => {
            original.cmd_iter().for_each(add);
            (offset, count)
        }
    };
    let n = p.len();
    let route = SingleNodeRoutingInfo::ByAddress {
        host: to.host,
        port: to.port,
    };
    let all = c.route_pipeline(p, 0, n, route).await?;
    // After an ASK every second reply is a command's; the others are the `ASKING`s' OKs.
    let (skip, step) = if to.asking { (1, 2) } else { (0, 1) };
    let mut replies: Vec<Value> = all
        .into_iter()
        .skip(skip)
        .step_by(step)
        .skip(offset)
        .take(count)
        .collect();
    // A MOVED or ASK met again comes back as an error, for the next round.
    match request {
        Request::Command(_) => replies.pop().unwrap_or(Value::Nil),
        Request::Pipeline(..) => Value::Array(replies),
    }
    .extract_error()
}

/// The admission script's reply: the stock left when admitted, else a table of code,
/// detail, window begins/ends, stock left, server ms.
enum AdmitWire {
    Admitted(i64),
    Other(i64, String, i64, i64, i64, i64),
}

impl redis::FromRedisValue for AdmitWire {
    fn from_redis_value(v: Value) -> Result<AdmitWire, redis::ParsingError> {
        Ok(match v {
            Value::Int(left) => AdmitWire::Admitted(left),
            other => {
                let (code, detail, begins, ends, left, server_ms) =
                    redis::FromRedisValue::from_redis_value(other)?;
                AdmitWire::Other(code, detail, begins, ends, left, server_ms)
            }
        })
    }
}

/// Orders stream entries per page when buyers are restored from the stream.
pub const RESTORE_STREAM_PAGE: usize = 1_000;

/// The sale state of vouchers in Redis.
#[derive(Clone)]
pub struct RedisSales {
    conn: RedisConn,
    durable: Option<Durable>,
}

impl RedisSales {
    pub fn new(conn: RedisConn) -> RedisSales {
        RedisSales {
            conn,
            durable: None,
        }
    }

    /// Admissions wait for `durable.replicas` replicas to hold their write before they
    /// count as admitted (see [`Self::admit`]); `None` keeps replication asynchronous.
    pub fn with_durability(mut self, durable: Option<Durable>) -> RedisSales {
        self.durable = durable;
        self
    }

    pub fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The durability admissions wait for (`None`: replication stays asynchronous).
    pub fn durable(&self) -> Option<Durable> {
        self.durable
    }

    /// The connection, borrowed.
    pub fn conn_ref(&self) -> &RedisConn {
        &self.conn
    }

    /// Runs the admission script (`lua/admit.lua`): one round trip, atomic. The sale
    /// window is judged by the Redis server's clock, never the caller's.
    ///
    /// In durable mode the script and a `WAIT replicas timeout` travel in one pipeline,
    /// so the wait runs on the very node and connection that ran the script, and a
    /// pipeline the client sends again (a lost connection, a redirect) sends both again.
    /// (A `WAIT` sent on its own, routed to the slot's primary, can reach a newly promoted
    /// primary that never saw the script and answer at once: the failover test lost a
    /// 202 that way.) An admission fewer replicas acknowledged in time is reported
    /// [`StoreError::Unconfirmed`]: the caller must not promise it, because a failover now
    /// could lose it. So is, in any mode, an admission that got no reply in time: it may
    /// have run, so the caller names the order instead of denying it.
    pub async fn admit(
        &self,
        voucher: impl Into<Bucket>,
        user: &UserId,
        order_id: OrderId,
    ) -> Result<AdmitReply, StoreError> {
        let voucher: Bucket = voucher.into();
        let [sale, buyers, orders, deadlines] = VoucherKeys::admission(voucher);
        let mut call = ADMIT.key(&sale);
        call.key(&buyers)
            .key(&orders)
            .key(&deadlines)
            .arg(user.as_str())
            .arg(order_id.get());
        let (wire, acked): (AdmitWire, Option<u32>) = match self.invoke_durable_raw(&call).await {
            Ok(reply) => reply,
            // No reply in time, or the connection lost after the request went out: the
            // script may have run (its reply lost, or the request still queued
            // somewhere), so this order may exist. Named, not promised.
            Err(e) if e.is_timeout() || e.is_io_error() || e.is_connection_dropped() => {
                return Err(StoreError::Unconfirmed {
                    order_id,
                    detail: format!("no reply from redis in time ({e}); it may have run"),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let (admission, window, server_ms) = match wire {
            AdmitWire::Admitted(left) => (
                admission_of(voucher.voucher(), order_id, admit::ADMITTED, "", left)?,
                None,
                None,
            ),
            AdmitWire::Other(code, detail, begins, ends, left, server_ms) => (
                admission_of(voucher.voucher(), order_id, code, &detail, left)?,
                SaleWindow::new(begins, ends).ok(),
                Some(server_ms),
            ),
        };
        if let (Some(d), Some(acked), Admission::Admitted { .. }) =
            (self.durable, acked, &admission)
            && !d.held_by(acked)
        {
            return Err(StoreError::Unconfirmed {
                order_id,
                detail: format!(
                    "only {acked} of {} replica(s) acknowledged within {} ms",
                    d.replicas,
                    d.timeout.as_millis()
                ),
            });
        }
        Ok(AdmitReply {
            admission,
            window,
            server_ms,
        })
    }

    /// Runs a script that writes; in durable mode with a `WAIT` in the same pipeline
    /// (see [`Self::admit`]), returning how many replicas acknowledged it.
    ///
    /// [`Self::durable`] says whether that count is enough.
    pub(crate) async fn invoke_durable<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<(T, Option<u32>), StoreError> {
        Ok(self.invoke_durable_raw(call).await?)
    }

    /// [`Self::invoke_durable`] with the client's error as it came.
    async fn invoke_durable_raw<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<(T, Option<u32>)> {
        let mut conn = self.conn.clone();
        let Some(d) = self.durable else {
            return Ok((call.invoke_async(&mut conn).await?, None));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(call).add_command(d.wait_cmd());
        let reply = match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // A primary that never ran the script (new, or promoted): load it on
                // every primary, then send the pipeline again.
                call.load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        let (value, acked): (T, u32) = reply;
        Ok((value, Some(acked)))
    }

    /// Pays or cancels `user`'s order `order` of `voucher` (`lua/close.lua`): the order's
    /// close as Redis decided it, now or earlier (the caller compares it with what was
    /// asked), or `None` when `user` holds no open order `order` there (another user's,
    /// unknown, or a voucher without a payment step). A payment at or after the deadline
    /// expires the order instead. In durable mode a close too few replicas acknowledged
    /// is [`StoreError::Unconfirmed`]: a failover could still undo it.
    pub async fn close(
        &self,
        voucher: impl Into<Bucket>,
        order: OrderId,
        user: &UserId,
        action: &CloseAction,
    ) -> Result<Option<ClosedOrder>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut call = CLOSE.key(&k.sale);
        call.key(&k.buyers)
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.to_settle);
        match action {
            CloseAction::Pay(r) => call
                .arg(close::PAY)
                .arg(order.get())
                .arg(user.as_str())
                .arg(r.as_str()),
            CloseAction::Cancel => call.arg(close::CANCEL).arg(order.get()).arg(user.as_str()),
        };
        let (value, acked): (Option<String>, Option<u32>) = self.invoke_durable(&call).await?;
        let Some(value) = value else {
            return Ok(None);
        };
        let closed = ClosedOrder::parse(&value).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "closed order {order} of voucher {voucher}: {value:?}"
            ))
        })?;
        if closed.user != user.as_str() {
            return Ok(None);
        }
        if let (Some(d), Some(acked)) = (self.durable, acked)
            && !d.held_by(acked)
        {
            return Err(StoreError::Unconfirmed {
                order_id: order,
                detail: format!("close acknowledged by {acked} of {} replica(s)", d.replicas),
            });
        }
        Ok(Some(closed))
    }

    /// Where `user`'s order `order` of `voucher` stands in its payment step, in one round
    /// trip: its close if it was closed (and it is `user`'s), and its deadline while it
    /// is open. (`None`, `None` for vouchers without a payment step.)
    pub async fn payment_state(
        &self,
        voucher: impl Into<Bucket>,
        order: OrderId,
        user: &UserId,
    ) -> Result<(Option<ClosedOrder>, Option<UnixMillis>), StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let (closed, deadline): (Option<String>, Option<f64>) = redis::pipe()
            .hget(&k.closed, order.get())
            .zscore(&k.deadlines, keys::deadline_member(order, user.as_str()))
            .query_async(&mut self.conn.clone())
            .await?;
        let closed = closed
            .as_deref()
            .and_then(ClosedOrder::parse)
            .filter(|c| c.user == user.as_str());
        Ok((closed, deadline.map(|d| d as UnixMillis)))
    }

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
            created = self.reopen_bucket(voucher, bucket, share, 0).await? == Reopen::Created;
        }
        Ok(created)
    }

    /// Makes a voucher of one bucket sellable again after Redis lost its sale hash: see
    /// [`Self::reopen_bucket`], with the voucher's `db_stock_left`.
    pub async fn reopen(&self, voucher: &Voucher, settled: u64) -> Result<Reopen, StoreError> {
        self.reopen_bucket(voucher, voucher.id.into(), voucher.db_stock_left, settled)
            .await
    }

    /// Makes one bucket sellable again after Redis lost its sale hash
    /// (`lua/preload.lua`): registers it for the drainer, then, only if the sale hash is
    /// absent, creates it with `stock_left` minus the bucket's buyers the database had
    /// not settled.
    ///
    /// `settled` is the number of the bucket's orders in the database when `stock_left`
    /// was read (one consistent read), and every one of their buyers must already be in
    /// the buyers hash ([`Self::restore_buyers`]); the buyers beyond those are admitted
    /// orders the database has not taken stock for yet.
    ///
    /// The active-set write comes first: if the second step fails, the drainer merely
    /// visits an empty stream, while the reverse order could leave orders undrained.
    pub async fn reopen_bucket(
        &self,
        voucher: &Voucher,
        bucket: Bucket,
        stock_left: i64,
        settled: u64,
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
            .arg(if voucher.payment.is_some_and(|p| p.rebuy_after_close) {
                "1"
            } else {
                "0"
            })
            .arg(voucher.buckets)
            .arg(
                voucher
                    .room
                    .map_or(String::new(), |r| r.entry_rate_per_s().to_string()),
            )
            .arg(voucher.room.map_or(0, |r| r.opens_before_s()))
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
    /// still has is never overwritten). Returns how many were added.
    pub async fn restore_buyers(
        &self,
        voucher: impl Into<Bucket>,
        buyers: &[(String, OrderId)],
    ) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        if buyers.is_empty() {
            return Ok(0);
        }
        let k = VoucherKeys::new(voucher);
        let mut call = RESTORE_BUYERS.key(&k.buyers);
        call.key(&k.orders).arg(protocol::restore_buyers::PAIRS);
        for (user, order) in buyers {
            call.arg(user.as_str()).arg(order.get());
        }
        let (_, added): (String, u64) = call.invoke_async(&mut self.conn.clone()).await?;
        Ok(added)
    }

    /// Records the buyer of every order still in the voucher's orders stream that the
    /// buyers hash lost, a page of [`RESTORE_STREAM_PAGE`] entries per call. Returns how
    /// many were added.
    pub async fn restore_buyers_from_stream(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<u64, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut start = "-".to_string();
        let mut added = 0;
        loop {
            let (last, n): (String, u64) = RESTORE_BUYERS
                .key(&k.buyers)
                .key(&k.orders)
                .arg(protocol::restore_buyers::STREAM)
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
        let set: Option<String> = redis::cmd("SET")
            .arg(&k.repair)
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(set.is_some())
    }

    /// Releases the repair lock. A plain DEL: if this holder's lock had expired and
    /// another took it, a third repair may start early, which is safe (see
    /// [`Self::try_lock_repair`]).
    pub async fn unlock_repair(&self, voucher: VoucherId) -> Result<(), StoreError> {
        let k = VoucherKeys::new(voucher);
        let _: i64 = self.conn.clone().del(&k.repair).await?;
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

/// What the admission script's reply means for the attempt that issued `order_id`.
///
/// [`admit::ALREADY_BOUGHT`] naming this very attempt's `order_id` is a success: the
/// script ran and admitted it, its reply was lost (connection reset, failover) and the
/// same EVALSHA was sent again, which the cluster client does by itself after a dropped
/// connection. Order ids are never issued twice, so no other attempt can hold that id.
pub fn admission_of(
    voucher: VoucherId,
    order_id: OrderId,
    code: i64,
    detail: &str,
    stock_after: i64,
) -> Result<Admission, StoreError> {
    let held = || {
        detail.parse::<OrderId>().map_err(|_| {
            StoreError::Corrupt(format!("buyers hash of voucher {voucher} holds {detail:?}"))
        })
    };
    Ok(match code {
        admit::ADMITTED => Admission::Admitted {
            order_id,
            stock_after,
        },
        admit::NOT_LOADED => Admission::NotLoaded,
        admit::NOT_STARTED => Admission::NotStarted,
        admit::ENDED => Admission::Ended,
        admit::SOLD_OUT => Admission::SoldOut,
        // A copy of an attempt that another copy already decided, and whose answer
        // was lost with it. The buyer's order, if any, is what counts (as for code 5,
        // below); with none, the attempt was refused (or its order closed since): a
        // retry decides anew.
        admit::SUPERSEDED if detail.is_empty() => {
            return Err(StoreError::Unavailable {
                backend: "redis",
                detail: format!(
                    "order {order_id}: another copy decided it and its answer was lost"
                ),
            });
        }
        admit::ALREADY_BOUGHT | admit::SUPERSEDED => match held()? {
            held if held == order_id => Admission::Admitted {
                order_id,
                stock_after,
            },
            held => Admission::AlreadyPurchased { order_id: held },
        },
        other => {
            return Err(StoreError::Corrupt(format!(
                "admission script answered code {other}"
            )));
        }
    })
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

#[cfg(test)]
mod tests {
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
        give.arg(super::super::transfers::GIVE.get_hash())
            .arg(2)
            .arg("seckill:{42}:sale");
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

    #[test]
    fn a_superseded_copy_reports_the_buyer_s_order_or_nothing() {
        let v = VoucherId::new(7).unwrap();
        let mine = OrderId::new(41).unwrap();
        assert!(matches!(
            admission_of(v, mine, admit::SUPERSEDED, "", 3),
            Err(StoreError::Unavailable { .. })
        ));
        assert_eq!(
            admission_of(v, mine, admit::SUPERSEDED, "42", 3).unwrap(),
            Admission::AlreadyPurchased {
                order_id: OrderId::new(42).unwrap()
            }
        );
    }

    #[test]
    fn a_retried_admission_that_finds_its_own_order_is_admitted() {
        let v = VoucherId::new(7).unwrap();
        let mine = OrderId::new(41).unwrap();
        let other = OrderId::new(42).unwrap();
        assert_eq!(
            admission_of(v, mine, 5, "41", 3).unwrap(),
            Admission::Admitted {
                order_id: mine,
                stock_after: 3
            }
        );
        assert_eq!(
            admission_of(v, mine, 5, "42", 3).unwrap(),
            Admission::AlreadyPurchased { order_id: other }
        );
        assert_eq!(
            admission_of(v, mine, 0, "", 0).unwrap(),
            Admission::Admitted {
                order_id: mine,
                stock_after: 0
            }
        );
        assert_eq!(admission_of(v, mine, 4, "", 0).unwrap(), Admission::SoldOut);
        assert!(matches!(
            admission_of(v, mine, 5, "garbage", 0),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            admission_of(v, mine, 9, "", 0),
            Err(StoreError::Corrupt(_))
        ));
    }
}

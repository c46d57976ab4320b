//! The connection every Redis call goes through: one node or a cluster, behind one type.
//!
//! [`RedisConn`] hides whether Redis runs as one node or as a cluster (ElastiCache
//! Serverless is always cluster mode; the local stack runs cluster mode too). Every
//! request is bounded: it times out after the configured timeout. In cluster mode a
//! single attempt never times out before the request as a whole does, so the client
//! never sends an unmarked copy of its own after the caller gave up.

use std::sync::{Arc, RwLock};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::cluster::Cluster;
use super::redirect::Request;
use crate::config::RedisConfig;
use crate::error::StoreError;

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
                primaries: Arc::default(),
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

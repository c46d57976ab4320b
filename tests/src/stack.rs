//! The running local stack for the suites (`.dev/stack.env`, see docs/local-stack.md): read by the one reader, [`seckill_cli::stack_env`]; here a missing key is
//! a test failure whose message says how to start the stack.

use std::path::PathBuf;

use seckill_cli::stack_env;

/// Addresses of the running local stack.
#[derive(Debug, Clone)]
pub struct StackEnv(stack_env::StackEnv);

/// The workspace root (the folder holding `.dev/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

impl StackEnv {
    /// Reads `.dev/stack.env` (or the file named by `SECKILL_STACK_ENV`) and the
    /// variables that override it.
    pub fn load() -> StackEnv {
        StackEnv(stack_env::StackEnv::load(None).unwrap_or_else(|e| panic!("{e:#}")))
    }

    /// One key of the file.
    ///
    /// # Panics
    /// When the key is missing: the stack is not running, and the message says how to
    /// start it.
    pub fn get(&self, key: &str) -> String {
        self.0.get(key).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// One key of the file, `None` when it is missing.
    pub fn get_opt(&self, key: &str) -> Option<String> {
        self.0.optional(key)
    }

    pub fn seckill_http_url(&self) -> String {
        self.get("SECKILL_HTTP_URL")
    }
    pub fn drainer_invoke_url(&self) -> String {
        self.get("DRAINER_INVOKE_URL")
    }
    pub fn redis_url(&self) -> String {
        self.get("REDIS_URL")
    }
    pub fn mysql_url(&self) -> String {
        self.get("MYSQL_URL")
    }
    pub fn data_api_url(&self) -> String {
        self.get("DATA_API_URL")
    }
    pub fn dev_jwt_secret(&self) -> String {
        self.get("SECKILL_DEV_JWT_SECRET")
    }
    /// See [`stack_env::StackEnv::redis_engine`].
    pub fn redis_engine(&self) -> String {
        self.0.redis_engine()
    }
    /// See [`stack_env::StackEnv::redis_topology`].
    pub fn redis_topology(&self) -> String {
        self.0.redis_topology()
    }
    /// See [`stack_env::StackEnv::redis_server_bin`].
    pub fn redis_server_bin(&self) -> String {
        self.0.redis_server_bin()
    }
    /// See [`stack_env::StackEnv::redis_nodes`].
    ///
    /// # Panics
    /// When neither `REDIS_NODES` nor `REDIS_URL` is set (the stack is not running).
    pub fn redis_nodes(&self) -> Vec<String> {
        self.0.redis_nodes().unwrap_or_else(|e| panic!("{e:#}"))
    }
}

/// Keeps the stack's drainer away from one voucher while it lives: the voucher is out of
/// the set the drainer visits (`seckill:active`), and goes back in when this is dropped,
/// also when the test panics, so the stack drains its orders after. For a test that must
/// see an order before the drain (every second) under whatever load the machine has.
#[must_use = "the drainer visits the voucher again as soon as this is dropped"]
pub struct DrainerHeldBack {
    redis_url: String,
    voucher: String,
}

impl StackEnv {
    /// Takes `voucher` (a decimal id) out of the stack drainer's round until the returned
    /// guard is dropped. Call it after the voucher is created (its preload adds it).
    ///
    /// # Panics
    /// When the stack's Redis cannot be reached.
    pub fn hold_drainer_back(&self, voucher: &str) -> DrainerHeldBack {
        let held = DrainerHeldBack {
            redis_url: self.redis_url(),
            voucher: voucher.to_string(),
        };
        let removed: i64 = held
            .command("SREM")
            .unwrap_or_else(|e| panic!("SREM {ACTIVE} {voucher} on the stack's Redis: {e}"));
        assert_eq!(removed, 1, "voucher {voucher} was not in {ACTIVE}");
        held
    }
}

const ACTIVE: &str = seckill_shared::keys::ACTIVE_VOUCHERS;

impl DrainerHeldBack {
    /// `SREM`/`SADD` of the voucher on the active set, through a cluster client (the
    /// stack's Redis is always in cluster mode). Blocking: also called from `drop`.
    fn command(&self, name: &str) -> redis::RedisResult<i64> {
        let client = redis::cluster::ClusterClient::new(vec![self.redis_url.as_str()])?;
        let mut conn = client.get_connection()?;
        redis::cmd(name)
            .arg(ACTIVE)
            .arg(&self.voucher)
            .query(&mut conn)
    }
}

impl Drop for DrainerHeldBack {
    fn drop(&mut self) {
        if let Err(e) = self.command("SADD") {
            eprintln!(
                "voucher {} stays out of {ACTIVE} (the stack's drainer will not drain it): {e}",
                self.voucher
            );
        }
    }
}

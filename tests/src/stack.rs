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

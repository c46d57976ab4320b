//! The local stack contract (`.dev/stack.env`, see README.md "The local stack" and
//! `docs/design.md`).

use std::collections::HashMap;
use std::path::PathBuf;

/// Addresses of the running local stack: the `KEY=VALUE` lines of `.dev/stack.env`,
/// with variables already set in the process environment taking precedence.
#[derive(Debug, Clone)]
pub struct StackEnv {
    path: PathBuf,
    all: HashMap<String, String>,
}

/// The workspace root (the folder holding `.dev/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

impl StackEnv {
    /// Reads `.dev/stack.env` (or the file named by `SECKILL_STACK_ENV`).
    pub fn load() -> StackEnv {
        let path = std::env::var("SECKILL_STACK_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace_root().join(".dev/stack.env"));
        let mut all = HashMap::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                if let Some((k, v)) = line.split_once('=') {
                    all.insert(k.trim().to_string(), v.trim().to_string());
                }
            }
        }
        for key in KEYS {
            if let Ok(v) = std::env::var(key) {
                all.insert(key.to_string(), v);
            }
        }
        StackEnv { path, all }
    }

    /// One key of the file.
    ///
    /// # Panics
    /// When the key is missing: the stack is not running, and the message says how to
    /// start it.
    pub fn get(&self, key: &str) -> String {
        self.all.get(key).cloned().unwrap_or_else(|| {
            panic!(
                "{key} is not set: the local stack is not running ({} missing or incomplete). \
                 Start it with `scripts/stack.sh up`, or run the whole suite with `scripts/test.sh`.",
                self.path.display()
            )
        })
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
}

/// Keys that an environment variable of the same name overrides.
const KEYS: &[&str] = &[
    "SECKILL_HTTP_URL",
    "DRAINER_INVOKE_URL",
    "REDIS_URL",
    "REDIS_CLUSTER",
    "MYSQL_URL",
    "DATA_API_URL",
    "SECKILL_DEV_JWT_SECRET",
    "DB_CLUSTER_ARN",
    "DB_SECRET_ARN",
    "DB_NAME",
    "AWS_REGION",
];

//! The local stack contract (`.dev/stack.env`, see `../shared/README.md` §2 and
//! `docs/design.md`).

use std::collections::HashMap;
use std::path::PathBuf;

/// Addresses of the running local stack.
#[derive(Debug, Clone)]
pub struct StackEnv {
    pub seckill_http_url: String,
    pub drainer_invoke_url: String,
    pub redis_url: String,
    pub mysql_url: String,
    pub data_api_url: String,
    pub dev_jwt_secret: String,
    /// Every `KEY=VALUE` of the file (and the process environment on top), for the
    /// less common keys such as `DB_CLUSTER_ARN`.
    pub all: HashMap<String, String>,
}

/// The workspace root (the folder holding `.dev/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

impl StackEnv {
    /// Reads `.dev/stack.env`; variables already set in the environment win.
    ///
    /// # Panics
    /// When a key of the contract is missing: the stack is not running, and the
    /// message says how to start it.
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
        for (k, v) in std::env::vars() {
            if all.contains_key(&k) {
                all.insert(k, v);
            }
        }
        let get = |k: &str| -> String {
            all.get(k).cloned().unwrap_or_else(|| {
                panic!(
                    "{k} is not set: the local stack is not running ({} missing or incomplete). \
                     Start it with `scripts/stack.sh up`, or run the whole suite with `scripts/test.sh`.",
                    path.display()
                )
            })
        };
        StackEnv {
            seckill_http_url: get("SECKILL_HTTP_URL"),
            drainer_invoke_url: get("DRAINER_INVOKE_URL"),
            redis_url: get("REDIS_URL"),
            mysql_url: get("MYSQL_URL"),
            data_api_url: get("DATA_API_URL"),
            dev_jwt_secret: get("SECKILL_DEV_JWT_SECRET"),
            all,
        }
    }

    /// Any other key of the file, panicking with the same hint when absent.
    pub fn var(&self, key: &str) -> String {
        self.all
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("{key} is missing from .dev/stack.env"))
    }
}

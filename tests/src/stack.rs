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

    /// One key of the file, `None` when it is missing.
    pub fn get_opt(&self, key: &str) -> Option<String> {
        self.all.get(key).cloned()
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

    /// The Redis engine of the stack, `SECKILL_REDIS_ENGINE`: `redis` or `valkey`
    /// (`redis` when absent, as written by a stack before engines could be picked).
    pub fn redis_engine(&self) -> String {
        self.get_or("SECKILL_REDIS_ENGINE", "redis")
    }

    /// The Redis topology of the stack, `SECKILL_REDIS_TOPOLOGY`: `single` (one
    /// cluster-mode node owning all slots) or `cluster` (3 primaries with a replica
    /// each); `single` when absent.
    pub fn redis_topology(&self) -> String {
        self.get_or("SECKILL_REDIS_TOPOLOGY", "single")
    }

    /// The server binary the stack's Redis runs, `SECKILL_REDIS_SERVER` (an absolute
    /// path); `redis-server` (found on `PATH`) when absent.
    pub fn redis_server_bin(&self) -> String {
        self.get_or("SECKILL_REDIS_SERVER", "redis-server")
    }

    /// `host:port` of every node of the stack's Redis, `REDIS_NODES` (comma-separated);
    /// when absent, the one node of `REDIS_URL`.
    ///
    /// # Panics
    /// When neither is set (the stack is not running).
    pub fn redis_nodes(&self) -> Vec<String> {
        match self.all.get("REDIS_NODES") {
            Some(nodes) => nodes
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect(),
            None => vec![host_port(&self.redis_url())],
        }
    }

    fn get_or(&self, key: &str, default: &str) -> String {
        self.all
            .get(key)
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }

    #[cfg(test)]
    fn from_pairs(pairs: &[(&str, &str)]) -> StackEnv {
        StackEnv {
            path: PathBuf::from("(test)"),
            all: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

/// `host:port` of a `redis://[user:password@]host:port[/db]` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
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
    "DB_MASTER_SECRET_ARN",
    "DB_APP_SECRET_ARN",
    "SECRETS_MANAGER_URL",
    "DB_NAME",
    "AWS_REGION",
    "SECKILL_REDIS_ENGINE",
    "SECKILL_REDIS_TOPOLOGY",
    "SECKILL_REDIS_SERVER",
    "REDIS_NODES",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_settings_default_to_one_redis_server_node_at_redis_url() {
        let env = StackEnv::from_pairs(&[("REDIS_URL", "redis://127.0.0.1:16379")]);
        assert_eq!(env.redis_engine(), "redis");
        assert_eq!(env.redis_topology(), "single");
        assert_eq!(env.redis_server_bin(), "redis-server");
        assert_eq!(env.redis_nodes(), vec!["127.0.0.1:16379"]);
    }

    #[test]
    fn redis_settings_come_from_the_stack_file() {
        let env = StackEnv::from_pairs(&[
            ("REDIS_URL", "redis://127.0.0.1:26400"),
            ("SECKILL_REDIS_ENGINE", "valkey"),
            ("SECKILL_REDIS_TOPOLOGY", "cluster"),
            (
                "SECKILL_REDIS_SERVER",
                "/root/.cache/seckill/valkey-9.1.2/valkey-server",
            ),
            (
                "REDIS_NODES",
                "127.0.0.1:26400,127.0.0.1:26401, 127.0.0.1:26402,",
            ),
        ]);
        assert_eq!(env.redis_engine(), "valkey");
        assert_eq!(env.redis_topology(), "cluster");
        assert_eq!(
            env.redis_server_bin(),
            "/root/.cache/seckill/valkey-9.1.2/valkey-server"
        );
        assert_eq!(
            env.redis_nodes(),
            vec!["127.0.0.1:26400", "127.0.0.1:26401", "127.0.0.1:26402"]
        );
    }

    #[test]
    fn host_port_of_redis_urls() {
        assert_eq!(host_port("redis://127.0.0.1:16379"), "127.0.0.1:16379");
        assert_eq!(
            host_port("rediss://u:p@cache.local:6379/0"),
            "cache.local:6379"
        );
        assert_eq!(host_port("127.0.0.1:6379"), "127.0.0.1:6379");
    }
}

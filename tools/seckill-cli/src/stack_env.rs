//! The one reader of the local stack's `.dev/stack.env` (docs/local-stack.md),
//! the `KEY=VALUE` file `scripts/stack.sh up` writes, for the operator commands, the load
//! tool and the test fixtures. Which file: the one named explicitly (`--stack-env`), else
//! `$SECKILL_STACK_ENV`, else `.dev/stack.env` here or in the nearest parent that has one.
//! A variable of the same name set (non-empty) in the environment wins.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The addresses of the running local stack.
#[derive(Clone)]
pub struct StackEnv {
    /// The file read, if one was found.
    path: Option<PathBuf>,
    vars: HashMap<String, String>,
}

/// Shows the file and how many values, never the values: they include the whole
/// environment (credentials too).
impl std::fmt::Debug for StackEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackEnv")
            .field("path", &self.path)
            .field("vars", &self.vars.len())
            .finish()
    }
}

impl StackEnv {
    /// Reads the stack file and the environment. No file found is not an error (every
    /// [`get`](Self::get) then says how to start the stack); an unreadable file is.
    pub fn load(explicit: Option<&Path>) -> anyhow::Result<StackEnv> {
        let path = explicit
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("SECKILL_STACK_ENV").map(PathBuf::from))
            .or_else(|| {
                let cwd = std::env::current_dir().ok()?;
                let mut found = cwd.ancestors().map(|dir| dir.join(".dev/stack.env"));
                found.find(|candidate| candidate.is_file())
            });
        let mut vars = HashMap::new();
        if let Some(p) = &path {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the stack file {}", p.display()))?;
            vars = parse(&text);
        }
        let set = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
        vars.extend(set.filter(|(_, v)| !v.trim().is_empty()));
        Ok(StackEnv { path, vars })
    }

    /// A stack made of the given pairs (tests).
    pub fn from_pairs(pairs: &[(&str, &str)]) -> StackEnv {
        StackEnv {
            path: None,
            vars: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The stack file read, if one was found (its folder also holds the functions'
    /// `functions.env`).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Every key and value read: the file's, and the environment's non-empty ones over them.
    pub fn vars(&self) -> &HashMap<String, String> {
        &self.vars
    }

    /// One value; the error names the file and how to start the stack.
    pub fn get(&self, key: &str) -> anyhow::Result<String> {
        let file = self.path.as_ref().map(|p| format!("read {}", p.display()));
        self.optional(key).with_context(|| {
            format!(
                "{key} is not set: is the local stack running? ({}). Start it with \
                 `scripts/stack.sh up`, or run the whole suite with `scripts/test.sh`.",
                file.unwrap_or_else(|| "no .dev/stack.env found".to_string())
            )
        })
    }

    /// One value, `None` when missing or empty.
    pub fn optional(&self, key: &str) -> Option<String> {
        self.vars
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// The Redis engine, `SECKILL_REDIS_ENGINE`: `redis` (when absent) or `valkey`.
    pub fn redis_engine(&self) -> String {
        self.optional("SECKILL_REDIS_ENGINE")
            .unwrap_or_else(|| "redis".into())
    }

    /// The Redis topology, `SECKILL_REDIS_TOPOLOGY`: `single` (one cluster-mode node
    /// owning all slots; when absent) or `cluster` (3 primaries with a replica each).
    pub fn redis_topology(&self) -> String {
        self.optional("SECKILL_REDIS_TOPOLOGY")
            .unwrap_or_else(|| "single".into())
    }

    /// The stack's Redis server binary, `SECKILL_REDIS_SERVER`; `redis-server` when absent.
    pub fn redis_server_bin(&self) -> String {
        self.optional("SECKILL_REDIS_SERVER")
            .unwrap_or_else(|| "redis-server".into())
    }

    /// `host:port` of every node of the stack's Redis, `REDIS_NODES` (comma-separated);
    /// when absent, the one node of `REDIS_URL`.
    pub fn redis_nodes(&self) -> anyhow::Result<Vec<String>> {
        match self.optional("REDIS_NODES") {
            Some(nodes) => Ok(nodes
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect()),
            None => Ok(vec![host_port(&self.get("REDIS_URL")?)]),
        }
    }
}

fn parse(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `host:port` of a `redis://[user:password@]host:port[/db]` URL.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

/// `mysql_url` with its database replaced by `database`.
pub fn url_with_database(mysql_url: &str, database: &str) -> anyhow::Result<String> {
    let rest = mysql_url
        .strip_prefix("mysql://")
        .with_context(|| format!("MYSQL_URL {mysql_url:?} is not a mysql:// URL"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    Ok(format!("mysql://{authority}/{database}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_files_parse_and_urls_swap_databases() {
        let vars = parse("# c\nREDIS_URL=redis://x:1\n\nMYSQL_URL = mysql://u:p@h:3/seckill\n");
        assert_eq!(vars["REDIS_URL"], "redis://x:1");
        assert_eq!(
            url_with_database(&vars["MYSQL_URL"], "seckill_b_1").unwrap(),
            "mysql://u:p@h:3/seckill_b_1"
        );
        assert!(url_with_database("postgres://x", "d").is_err());
    }

    #[test]
    fn missing_keys_say_how_to_start_the_stack() {
        let s = StackEnv::from_pairs(&[("REDIS_URL", "redis://a"), ("DB_NAME", " ")]);
        let err = s.get("MYSQL_URL").unwrap_err().to_string();
        assert!(err.contains("scripts/stack.sh up"), "{err}");
        assert!(s.get("DB_NAME").is_err(), "an empty value is missing");
    }

    #[test]
    fn redis_settings_default_to_one_redis_server_node_at_redis_url() {
        let env = StackEnv::from_pairs(&[("REDIS_URL", "redis://127.0.0.1:16379")]);
        assert_eq!(env.redis_engine(), "redis");
        assert_eq!(env.redis_topology(), "single");
        assert_eq!(env.redis_server_bin(), "redis-server");
        assert_eq!(env.redis_nodes().unwrap(), vec!["127.0.0.1:16379"]);
    }

    #[test]
    fn redis_settings_come_from_the_stack_file() {
        let env = StackEnv::from_pairs(&[
            ("REDIS_URL", "redis://127.0.0.1:26400"),
            ("SECKILL_REDIS_ENGINE", "valkey"),
            ("SECKILL_REDIS_TOPOLOGY", "cluster"),
            ("SECKILL_REDIS_SERVER", "/opt/valkey-9.1.2/valkey-server"),
            (
                "REDIS_NODES",
                "127.0.0.1:26400,127.0.0.1:26401, 127.0.0.1:26402,",
            ),
        ]);
        assert_eq!(env.redis_engine(), "valkey");
        assert_eq!(env.redis_topology(), "cluster");
        assert_eq!(env.redis_server_bin(), "/opt/valkey-9.1.2/valkey-server");
        assert_eq!(
            env.redis_nodes().unwrap(),
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

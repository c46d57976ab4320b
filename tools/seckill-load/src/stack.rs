//! Where the backends are: the local stack's `.dev/stack.env` (see `docs/design.md`),
//! with variables of the same name in the process environment taking precedence.
//!
//! The file is found at `--stack-env`, else `$SECKILL_STACK_ENV`, else `.dev/stack.env`
//! in the current folder or the nearest parent that has one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The keys an environment variable of the same name overrides.
const KEYS: &[&str] = &[
    "SECKILL_HTTP_URL",
    "DRAINER_INVOKE_URL",
    "REDIS_URL",
    "REDIS_CLUSTER",
    "REDIS_TIMEOUT_MS",
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
];

/// The addresses of the running local stack.
#[derive(Debug, Clone)]
pub struct StackEnv {
    path: Option<PathBuf>,
    vars: HashMap<String, String>,
}

impl StackEnv {
    /// Reads the stack file (if one is found) and the environment.
    pub fn load(explicit: Option<&Path>) -> anyhow::Result<StackEnv> {
        let path = match explicit {
            Some(p) => Some(p.to_path_buf()),
            None => match std::env::var_os("SECKILL_STACK_ENV") {
                Some(p) => Some(PathBuf::from(p)),
                None => find_upwards(".dev/stack.env"),
            },
        };
        let mut vars = HashMap::new();
        if let Some(p) = &path {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the stack file {}", p.display()))?;
            vars = parse(&text);
        }
        for key in KEYS {
            if let Ok(v) = std::env::var(key)
                && !v.trim().is_empty()
            {
                vars.insert(key.to_string(), v);
            }
        }
        Ok(StackEnv { path, vars })
    }

    /// A stack built from given pairs (tests).
    pub fn from_pairs(pairs: &[(&str, &str)]) -> StackEnv {
        StackEnv {
            path: None,
            vars: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// One value; the error says how to start the stack.
    pub fn get(&self, key: &str) -> anyhow::Result<String> {
        match self.vars.get(key) {
            Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
            _ => bail!(
                "{key} is not set: is the local stack running? ({}). Start it with `scripts/stack.sh up`, or set {key}.",
                match &self.path {
                    Some(p) => format!("read {}", p.display()),
                    None => "no .dev/stack.env found".to_string(),
                }
            ),
        }
    }

    pub fn optional(&self, key: &str) -> Option<String> {
        self.vars
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    pub fn mysql_url(&self) -> anyhow::Result<String> {
        self.get("MYSQL_URL")
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

fn find_upwards(rel: &str) -> Option<PathBuf> {
    let mut dir = std::env::current_dir().ok()?;
    loop {
        let candidate = dir.join(rel);
        if candidate.is_file() {
            return Some(candidate);
        }
        if !dir.pop() {
            return None;
        }
    }
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
        let s = StackEnv::from_pairs(&[("REDIS_URL", "redis://a")]);
        let err = s.get("MYSQL_URL").unwrap_err().to_string();
        assert!(err.contains("scripts/stack.sh up"), "{err}");
    }
}

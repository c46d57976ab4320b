//! Typed configuration, read once per cold start.
//!
//! [`EnvReader`] collects every missing or malformed variable before failing, so a
//! misconfigured deployment reports all its mistakes in one log line instead of one per
//! redeploy. Each function composes the pieces it needs ([`RedisConfig`],
//! [`DataApiConfig`]) into its own `Config::from_env`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Variables that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration error: {}", .problems.join("; "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// Reads variables from an environment, remembering every problem.
#[derive(Debug)]
pub struct EnvReader {
    vars: HashMap<String, String>,
    problems: Vec<String>,
    /// Every name asked for, when recording (see [`check_env_vars`]).
    asked: Option<Arc<Mutex<BTreeSet<String>>>>,
}

impl EnvReader {
    /// Reads the process environment.
    pub fn from_env() -> EnvReader {
        EnvReader::from_map(std::env::vars().collect())
    }

    /// Reads a given map (tests, and checking a template's variables).
    pub fn from_map(vars: HashMap<String, String>) -> EnvReader {
        EnvReader {
            vars,
            problems: Vec::new(),
            asked: None,
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        if let Some(asked) = &self.asked {
            asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.to_string());
        }
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// A variable that must be set and non-empty.
    pub fn required(&mut self, name: &str) -> String {
        match self.get(name) {
            Some(v) => v.to_string(),
            None => {
                self.problems.push(format!("{name} is not set"));
                String::new()
            }
        }
    }

    /// A variable that may be absent.
    pub fn optional(&self, name: &str) -> Option<String> {
        self.get(name).map(str::to_string)
    }

    /// A parsed variable with a default.
    pub fn parse_or<T: FromStr>(&mut self, name: &str, default: T) -> T {
        match self.get(name) {
            None => default,
            Some(v) => match v.parse() {
                Ok(x) => x,
                Err(_) => {
                    self.problems
                        .push(format!("{name} has an invalid value {v:?}"));
                    default
                }
            },
        }
    }

    /// A boolean (`true`/`false`/`1`/`0`) with a default.
    pub fn flag_or(&mut self, name: &str, default: bool) -> bool {
        match self.get(name).map(str::to_ascii_lowercase).as_deref() {
            None => default,
            Some("true" | "1" | "yes") => true,
            Some("false" | "0" | "no") => false,
            Some(v) => {
                self.problems
                    .push(format!("{name} must be true or false, not {v:?}"));
                default
            }
        }
    }

    /// Records a problem found while checking values together.
    pub fn problem(&mut self, message: impl Into<String>) {
        self.problems.push(message.into());
    }

    /// Ends reading: every problem at once, or nothing.
    pub fn finish(self) -> Result<(), ConfigError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                problems: self.problems,
            })
        }
    }
}

/// The smallest environment both functions start with: the required variables of
/// [`RedisConfig`] and [`DataApiConfig`].
const MINIMAL_ENV: &[(&str, &str)] = &[
    ("REDIS_URL", "redis://127.0.0.1:6379"),
    (
        "DB_CLUSTER_ARN",
        "arn:aws:rds:us-east-1:000000000000:cluster:c",
    ),
    (
        "DB_SECRET_ARN",
        "arn:aws:secretsmanager:us-east-1:000000000000:secret:s",
    ),
    ("DB_NAME", "seckill"),
];

/// Test support: a reader of the minimal valid environment plus `extra` (which wins).
pub fn minimal_env_with(extra: &[(&str, &str)]) -> EnvReader {
    let vars: HashMap<String, String> = MINIMAL_ENV
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    EnvReader::from_map(vars)
}

/// Test support for each function's config: checks its list of variables (`listed`, the
/// names the SAM template may set) against its loader `read`. Panics unless `read`, given
/// the minimal valid environment, asks for exactly the listed names, and unless changing
/// any one listed variable changes what `read` returns.
pub fn check_env_vars<T: Debug, E: Debug>(
    listed: &[&str],
    read: impl Fn(EnvReader) -> Result<T, E>,
) {
    let base: HashMap<String, String> = MINIMAL_ENV
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let asked = Arc::new(Mutex::new(BTreeSet::new()));
    let mut env = EnvReader::from_map(base.clone());
    env.asked = Some(asked.clone());
    let baseline = format!("{:?}", read(env));
    assert!(
        baseline.starts_with("Ok("),
        "the base environment fails: {baseline}"
    );

    let listed_set: BTreeSet<String> = listed.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed_set.len(), listed.len(), "the list has duplicates");
    let asked = asked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        listed_set, asked,
        "the list differs from the names the loader asks for"
    );
    for name in listed {
        let mut changed = base.clone();
        changed.insert(name.to_string(), "changed-value".to_string());
        let result = format!("{:?}", read(EnvReader::from_map(changed)));
        assert_ne!(result, baseline, "{name} is asked for but never used");
    }
}

/// The environment variables [`RedisConfig::read`] and [`DataApiConfig::read`] read: the
/// backends of both functions (each function's `env_vars` adds its own).
pub const BACKEND_ENV_VARS: &[&str] = &[
    "REDIS_URL",
    "REDIS_CLUSTER",
    "REDIS_TIMEOUT_MS",
    "REDIS_TLS_CA_FILE",
    "REDIS_DURABLE_REPLICAS",
    "REDIS_DURABLE_TIMEOUT_MS",
    "DB_CLUSTER_ARN",
    "DB_SECRET_ARN",
    "DB_NAME",
    "DATA_API_URL",
    "DATA_API_TIMEOUT_MS",
];

/// [`BACKEND_ENV_VARS`] followed by a function's own variables.
pub fn backend_env_vars_and(own: &[&'static str]) -> Vec<&'static str> {
    BACKEND_ENV_VARS.iter().chain(own).copied().collect()
}

/// Where Redis is and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://` or `rediss://` (TLS, as ElastiCache Serverless requires).
    pub url: String,
    /// Use the cluster client (ElastiCache Serverless is always cluster mode).
    pub cluster: bool,
    /// Connect and response timeout: a slow Redis must turn into a quick 503, not a hang.
    pub timeout: Duration,
    /// PEM file of the CA that signed the server's certificate, for `rediss://` servers
    /// with a private CA. Unset: the public web PKI roots (what ElastiCache needs).
    pub tls_ca_file: Option<String>,
    /// Durable admissions (opt-in): seckill-http answers 202 only once this many
    /// replicas hold the admission, and the drainer writes to the database only entries
    /// that many replicas hold. `None`: asynchronous replication, the default.
    pub durable: Option<Durable>,
}

/// How long an admission waits for replicas before it is reported unconfirmed (see
/// docs/configuration.md, "Durable admissions").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durable {
    /// Replicas that must acknowledge the admission's write (`WAIT replicas timeout`).
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

impl RedisConfig {
    pub fn read(env: &mut EnvReader) -> RedisConfig {
        RedisConfig {
            url: env.required("REDIS_URL"),
            cluster: env.flag_or("REDIS_CLUSTER", false),
            timeout: Duration::from_millis(env.parse_or("REDIS_TIMEOUT_MS", 250)),
            tls_ca_file: env.optional("REDIS_TLS_CA_FILE"),
            durable: Durable::read(env),
        }
    }
}

impl Durable {
    /// `WAIT replicas timeout`: sent right after a write, on the same connection, it
    /// answers how many replicas acknowledged everything written there so far.
    pub fn wait_cmd(&self) -> redis::Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(self.timeout.as_millis() as u64);
        wait
    }

    /// Whether `acked` replicas (a `WAIT` answer) are enough.
    pub fn held_by(&self, acked: u32) -> bool {
        acked >= self.replicas
    }

    /// `REDIS_DURABLE_REPLICAS` (0 or unset: off) and `REDIS_DURABLE_TIMEOUT_MS` (100).
    fn read(env: &mut EnvReader) -> Option<Durable> {
        let replicas: u32 = env.parse_or("REDIS_DURABLE_REPLICAS", 0);
        let timeout = Duration::from_millis(env.parse_or("REDIS_DURABLE_TIMEOUT_MS", 100));
        (replicas > 0).then_some(Durable { replicas, timeout })
    }
}

/// Where the database is, through the RDS Data API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataApiConfig {
    pub cluster_arn: String,
    pub secret_arn: String,
    pub database: String,
    /// Endpoint override: the local Data API server. `None` in AWS.
    pub endpoint: Option<String>,
    /// Bound on one call, retries included.
    pub timeout: Duration,
}

impl DataApiConfig {
    pub fn read(env: &mut EnvReader) -> DataApiConfig {
        DataApiConfig {
            cluster_arn: env.required("DB_CLUSTER_ARN"),
            secret_arn: env.required("DB_SECRET_ARN"),
            database: env.required("DB_NAME"),
            endpoint: env.optional("DATA_API_URL"),
            timeout: Duration::from_millis(env.parse_or("DATA_API_TIMEOUT_MS", 5_000)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(pairs: &[(&str, &str)]) -> EnvReader {
        EnvReader::from_map(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn every_missing_variable_is_reported_together() {
        let mut env = reader(&[("REDIS_CLUSTER", "maybe"), ("DB_NAME", "seckill")]);
        let _ = RedisConfig::read(&mut env);
        let _ = DataApiConfig::read(&mut env);
        let err = env.finish().unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                "REDIS_URL is not set",
                "REDIS_CLUSTER must be true or false, not \"maybe\"",
                "DB_CLUSTER_ARN is not set",
                "DB_SECRET_ARN is not set",
            ]
        );
    }

    #[test]
    fn durable_admissions_are_opt_in() {
        let base = [
            ("REDIS_URL", "redis://x"),
            ("REDIS_DURABLE_REPLICAS", "1"),
            ("REDIS_DURABLE_TIMEOUT_MS", "40"),
        ];
        let mut env = reader(&base);
        assert_eq!(
            RedisConfig::read(&mut env).durable,
            Some(Durable {
                replicas: 1,
                timeout: Duration::from_millis(40)
            })
        );
        env.finish().unwrap();
        let mut env = reader(&[("REDIS_URL", "redis://x"), ("REDIS_DURABLE_REPLICAS", "0")]);
        assert_eq!(RedisConfig::read(&mut env).durable, None);
    }

    #[test]
    fn defaults_apply_when_optional_variables_are_absent() {
        let mut env = reader(&[
            ("REDIS_URL", "redis://x"),
            ("DB_CLUSTER_ARN", "a"),
            ("DB_SECRET_ARN", "s"),
            ("DB_NAME", "d"),
        ]);
        let r = RedisConfig::read(&mut env);
        let d = DataApiConfig::read(&mut env);
        env.finish().unwrap();
        assert!(!r.cluster);
        assert_eq!(r.timeout, Duration::from_millis(250));
        assert_eq!(r.durable, None);
        assert_eq!(d.endpoint, None);
    }
}

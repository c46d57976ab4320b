//! Configuration of seckill-http, read once per cold start.

use seckill_shared::config::{ConfigError, DataApiConfig, EnvReader, RedisConfig};

/// Every environment variable [`Config::read`] reads (its own and those of
/// [`RedisConfig`] and [`DataApiConfig`]). The SAM template may set only these (and
/// `RUST_LOG`, read by the logging setup); `tests/tests/template.rs` checks that, and the
/// unit test below keeps this list equal to what `read` really reads.
pub const ENV_VARS: &[&str] = &[
    "REDIS_URL",
    "REDIS_CLUSTER",
    "REDIS_TIMEOUT_MS",
    "REDIS_TLS_CA_FILE",
    "DB_CLUSTER_ARN",
    "DB_SECRET_ARN",
    "DB_NAME",
    "DATA_API_URL",
    "DATA_API_TIMEOUT_MS",
    "SECKILL_DEV_JWT_SECRET",
    "SECKILL_USER_RATE_PER_SEC",
    "SECKILL_USER_RATE_BURST",
];

/// Everything the function needs from its environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub redis: RedisConfig,
    pub data_api: DataApiConfig,
    /// Local development only: verify HS256 tokens with this secret. Unset in AWS, where
    /// API Gateway's JWT authorizer verifies tokens.
    pub dev_jwt_secret: Option<String>,
    /// Admission attempts per second one user may send through one instance (0: no
    /// limit), and the burst allowed above that rate.
    pub user_rate_per_sec: u32,
    pub user_rate_burst: u32,
}

impl Config {
    /// Reads the process environment; every problem is reported at once.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::read(EnvReader::from_env())
    }

    pub fn read(mut env: EnvReader) -> Result<Config, ConfigError> {
        let cfg = Config {
            redis: RedisConfig::read(&mut env),
            data_api: DataApiConfig::read(&mut env),
            dev_jwt_secret: env.optional("SECKILL_DEV_JWT_SECRET"),
            user_rate_per_sec: env.parse_or("SECKILL_USER_RATE_PER_SEC", 5),
            user_rate_burst: env.parse_or("SECKILL_USER_RATE_BURST", 10),
        };
        env.finish()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;

    fn read(vars: &HashMap<String, String>) -> String {
        format!("{:?}", Config::read(EnvReader::from_map(vars.clone())))
    }

    /// The names passed to `EnvReader` calls in the non-test part of `src`, or of one
    /// `impl <Type> { ... }` block of it.
    fn names_read(src: &str, impl_block: Option<&str>) -> BTreeSet<String> {
        let mut src = src.split("#[cfg(test)]").next().unwrap_or_default();
        if let Some(ty) = impl_block {
            let start = src
                .find(&format!("impl {ty} {{"))
                .unwrap_or_else(|| panic!("no `impl {ty}` block"));
            src = &src[start..];
            src = &src[..src.find("\n}\n").unwrap_or(src.len())];
        }
        let mut names = BTreeSet::new();
        for call in ["required(\"", "optional(\"", "parse_or(\"", "flag_or(\""] {
            for (i, _) in src.match_indices(call) {
                let rest = &src[i + call.len()..];
                names.insert(rest[..rest.find('"').unwrap()].to_string());
            }
        }
        names
    }

    #[test]
    fn env_vars_lists_exactly_what_read_reads() {
        // Statically: the names in the reading code.
        let mut read_in_source = names_read(include_str!("config.rs"), None);
        let shared = include_str!("../../../shared/src/config.rs");
        read_in_source.extend(names_read(shared, Some("RedisConfig")));
        read_in_source.extend(names_read(shared, Some("DataApiConfig")));
        let listed: BTreeSet<String> = ENV_VARS.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            listed, read_in_source,
            "ENV_VARS differs from the names Config::read reads"
        );
        assert_eq!(listed.len(), ENV_VARS.len(), "ENV_VARS has duplicates");

        // Dynamically: changing any listed variable changes the outcome of `read`.
        let base: HashMap<String, String> = [
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
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let baseline = read(&base);
        assert!(baseline.starts_with("Ok("), "{baseline}");
        for name in ENV_VARS {
            let mut changed = base.clone();
            changed.insert(name.to_string(), "changed-value".to_string());
            assert_ne!(read(&changed), baseline, "{name} is listed but never read");
        }
    }
}

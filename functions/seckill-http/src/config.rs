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
    use super::*;

    #[test]
    fn env_vars_lists_exactly_what_read_reads() {
        seckill_shared::config::check_env_vars(ENV_VARS, Config::read);
    }
}

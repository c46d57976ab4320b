//! Configuration of seckill-http, read once per cold start.

use seckill_shared::config::{ConfigError, DataApiConfig, EnvReader, RedisConfig};

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

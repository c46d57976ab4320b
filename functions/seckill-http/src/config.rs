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
        };
        env.finish()?;
        Ok(cfg)
    }
}

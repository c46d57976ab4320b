//! One storm's context, shared by its buyers, its faults and its ledger check: the
//! options, the sale's voucher and price, the buyers' HTTP client, and the stack's
//! backends as the operators' commands connect.

use seckill_cli::ops::Backends;

use super::client::Shop;
use super::plan::StormOptions;

/// One storm's context, shared by its buyers.
pub struct Storm {
    pub opts: StormOptions,
    pub voucher: String,
    pub price: Option<i64>,
    pub shop: Shop,
    pub backends: Backends,
    pub mysql: mysql_async::Pool,
}

impl Storm {
    /// The stack's backends as the operators' commands connect.
    pub async fn backends(env: &seckill_cli::stack_env::StackEnv) -> anyhow::Result<Backends> {
        let mut reader = seckill_shared::config::EnvReader::from_map(env.vars().clone());
        let redis = seckill_shared::config::RedisConfig::read(&mut reader);
        let data = seckill_shared::config::DataApiConfig::read(&mut reader);
        reader.finish()?;
        Backends::connect(&redis, &data).await
    }
}

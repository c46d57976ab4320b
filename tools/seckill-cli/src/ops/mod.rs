//! Operator commands over a sale's Redis state and its database (`seckill status`,
//! `dead-letters`, `reconcile`), configured and connected like the functions, from the
//! environment completed by `.dev/stack.env`.

pub mod dead_letters;
pub mod pay;
pub mod reconcile;
pub mod status;
pub mod stripe;

use anyhow::{Context, anyhow, bail};
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::adapters::redis::{RedisConn, RedisSales};
use seckill_shared::config::{DataApiConfig, EnvReader, RedisConfig};
use seckill_shared::domain::{Voucher, VoucherId};
use seckill_shared::error::StoreError;

use crate::stack_env::StackEnv;

/// Redis and the database, as the functions reach them.
#[derive(Clone)]
pub struct Backends {
    pub sales: RedisSales,
    pub streams: OrderStreams,
    pub db: DataApi,
}

/// A Redis URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://***@{host}"),
        _ => url.to_string(),
    }
}

impl Backends {
    /// Reads the configuration from the environment completed by the local stack's
    /// `.dev/stack.env` (every problem at once), and connects.
    pub async fn from_env() -> anyhow::Result<Backends> {
        Backends::from_stack(&StackEnv::load(None)?).await
    }

    /// Reads the configuration from a loaded stack file (its values, overridden by those
    /// set in the environment: every problem at once), and connects.
    pub async fn from_stack(stack: &StackEnv) -> anyhow::Result<Backends> {
        let mut env = EnvReader::from_map(stack.vars().clone());
        let redis = RedisConfig::read(&mut env);
        let data = DataApiConfig::read(&mut env);
        env.finish()?;
        Backends::connect(&redis, &data).await
    }

    /// Connects to both and proves each answers, with a message that says which failed.
    pub async fn connect(redis: &RedisConfig, data: &DataApiConfig) -> anyhow::Result<Backends> {
        let conn = RedisConn::connect(redis)
            .await
            .map_err(|e| anyhow!("cannot reach Redis at {}: {e}", redacted(&redis.url)))?;
        let streams = OrderStreams::new(conn.clone());
        streams
            .is_active(VoucherId::new(1).expect("1 is an id"))
            .await
            .map_err(|e| anyhow!("Redis at {} does not answer: {e}", redacted(&redis.url)))?;
        let db = DataApi::connect(data).await;
        let where_ = data.endpoint.as_ref().unwrap_or(&data.cluster_arn);
        match db.execute("SELECT 1", vec![], None).await {
            Ok(_) => {}
            Err(e) if e.is_transient() => bail!(
                "cannot reach the database {} through the Data API at {where_}: {e}",
                data.database
            ),
            Err(e) => bail!(
                "the database {} at {where_} refused the connection: {e} \
                 (check DB_CLUSTER_ARN, DB_SECRET_ARN, DB_NAME and the AWS credentials)",
                data.database
            ),
        }
        Ok(Backends {
            sales: RedisSales::new(conn),
            streams,
            db,
        })
    }

    /// The voucher as the database has it; an error naming it when neither the
    /// database nor Redis knows it.
    pub async fn voucher(&self, id: VoucherId) -> anyhow::Result<Option<Voucher>> {
        let v = self.db.voucher(id).await.db()?;
        if v.is_none() && self.sales.sale_state(id).await.redis()?.is_none() {
            bail!("voucher {id} does not exist (neither the database nor Redis has it)");
        }
        Ok(v)
    }
}

/// Names the backend a [`StoreError`] came from.
pub(crate) trait Backend<T> {
    fn db(self) -> anyhow::Result<T>;
    fn redis(self) -> anyhow::Result<T>;
}

impl<T> Backend<T> for Result<T, StoreError> {
    fn db(self) -> anyhow::Result<T> {
        self.context("database")
    }
    fn redis(self) -> anyhow::Result<T> {
        self.context("redis")
    }
}

/// `v`, or `-` when there is none, for the text forms.
pub(crate) fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Parses a voucher id argument.
pub fn voucher_arg(s: &str) -> anyhow::Result<VoucherId> {
    s.parse::<VoucherId>()
        .ok()
        .with_context(|| format!("{s:?} is not a voucher id (a positive integer)"))
}

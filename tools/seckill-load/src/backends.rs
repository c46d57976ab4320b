//! A private corner of the shared backends for one benchmark run.
//!
//! A run never touches the stack's own `seckill` database or its vouchers: it creates a
//! fresh database `seckill_b_<random>` ([`seckill_cli::scratch_db`]), applies the schema
//! through the Data API exactly as `seckill migrate` does, and numbers its vouchers from
//! a random base far above anything the stack creates, so its Redis keys
//! (`seckill:{<voucher>}:*`, and the baselines' `bench:<run>:*`) are its own.
//! [`Bench::cleanup`] deletes all of it.

use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context;
use seckill_cli::scratch_db;
use seckill_cli::stack_env::{StackEnv, url_with_database};
use seckill_http::Config;
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::adapters::redis::{RedisConn, RedisSales};
use seckill_shared::config::{EnvReader, RedisConfig};
use seckill_shared::domain::{Bucket, NewVoucher, SaleWindow, Voucher, VoucherId, now_millis};
use seckill_shared::keys::VoucherKeys;
use seckill_shared::migrate;

use crate::drivers::connect;
use crate::workload::Tokens;

/// The backends of one run and what it created in them.
pub struct Bench {
    /// seckill-http's configuration, pointing at this run's database.
    pub http: Config,
    /// The Data API client of this run's database.
    pub db: DataApi,
    /// Direct MariaDB URL of this run's database (database floor, latency queries).
    pub mysql_url: String,
    /// A connection for setup and checks.
    pub redis: RedisConn,
    /// Where the tutorial baseline runs: the functions' Redis unless
    /// [`Bench::use_tutorial_redis`] named another.
    pub tutorial_redis: RedisConfig,
    /// A connection to [`Self::tutorial_redis`].
    pub tutorial: RedisConn,
    /// A random hex id, used in key prefixes.
    pub run_id: String,
    /// The database to drop at cleanup: (admin URL, name).
    owned_db: Option<(String, String)>,
    /// The Data API server of this run's own, stopped at cleanup.
    data_api_server: tokio::sync::Mutex<Option<data_api_local::RunningServer>>,
    vouchers: Mutex<Vec<VoucherId>>,
    extra_keys: Mutex<Vec<String>>,
}

impl Bench {
    /// A fresh database on the stack's MariaDB and the stack's Redis, reached through a
    /// Data API server in this process (the stack's `data-api-local`, built with this tool).
    pub async fn on_stack(stack: &StackEnv) -> anyhow::Result<Bench> {
        let admin_url = stack.get("MYSQL_URL")?;
        let database = scratch_db::create_database(&admin_url, "seckill_b_").await?;
        let run_id = database["seckill_b_".len()..].to_string();
        let bench = async {
            let mysql_url = url_with_database(&admin_url, &database)?;
            // The stack's application user has no rights on a database of the benchmark's
            // own: everything signs in as the stack's admin (DB_SECRET_ARN on older stacks).
            let secret_arn = stack
                .optional("DB_MASTER_SECRET_ARN")
                .map_or_else(|| stack.get("DB_SECRET_ARN"), Ok)?;
            let mut cfg = data_api_local::ServerConfig::new(mysql_url.clone());
            cfg.resource_arn = stack.get("DB_CLUSTER_ARN")?;
            cfg.secret_arn = secret_arn.clone();
            let server = data_api_local::spawn(cfg)
                .await
                .context("starting a Data API server in this process")?;
            let mut vars = vec![
                ("REDIS_URL", stack.get("REDIS_URL")?),
                ("DB_CLUSTER_ARN", stack.get("DB_CLUSTER_ARN")?),
                ("DB_SECRET_ARN", secret_arn),
                ("DB_NAME", database.clone()),
                ("DATA_API_URL", server.url()),
                (
                    "SECKILL_DEV_JWT_SECRET",
                    format!("{:032x}", rand::random::<u128>()),
                ),
            ];
            for key in ["REDIS_CLUSTER", "REDIS_TIMEOUT_MS"] {
                vars.extend(stack.optional(key).map(|v| (key, v)));
            }
            let vars = vars.into_iter().map(|(k, v)| (k.to_string(), v));
            let http = Config::read(EnvReader::from_map(vars.collect()))
                .context("building seckill-http's configuration from the stack")?;
            let mut b = Bench::attach(http, mysql_url, run_id).await?;
            b.owned_db = Some((admin_url.clone(), database.clone()));
            b.data_api_server = tokio::sync::Mutex::new(Some(server));
            anyhow::Ok(b)
        }
        .await;
        if bench.is_err() {
            scratch_db::drop_database(&admin_url, &database).await.ok();
        }
        bench
    }

    /// Backends someone else made (tests): `http` must point at a database of its own.
    /// The schema is applied if missing.
    pub async fn attach(http: Config, mysql_url: String, run_id: String) -> anyhow::Result<Bench> {
        let db = DataApi::connect(&http.data_api).await;
        migrate::apply(&db, &migrate::embedded())
            .await
            .context("applying the schema to the benchmark database through the Data API")?;
        // Voucher ids from a random base: this run's Redis keys collide with nobody's.
        let base = 1_000_000_000_000 + (rand::random::<u64>() % 8_000_000_000_000) as i64;
        db.execute(
            &format!("ALTER TABLE vouchers AUTO_INCREMENT = {base}"),
            vec![],
            None,
        )
        .await
        .context("setting the voucher id base")?;
        let redis = connect(&http.redis).await?;
        Ok(Bench {
            tutorial_redis: http.redis.clone(),
            tutorial: redis.clone(),
            http,
            db,
            mysql_url,
            redis,
            run_id,
            owned_db: None,
            data_api_server: tokio::sync::Mutex::new(None),
            vouchers: Mutex::new(Vec::new()),
            extra_keys: Mutex::new(Vec::new()),
        })
    }

    /// Runs the tutorial baseline on another Redis. Its script builds its keys inside
    /// Lua, in slots it does not declare (`lua/bench/tutorial_seckill.lua`): a cluster of
    /// several shards refuses it ("Script attempted to access a non local key"), so there
    /// the tutorial needs a Redis whose one node owns every slot, as the local stack's.
    pub async fn use_tutorial_redis(&mut self, cfg: RedisConfig) -> anyhow::Result<()> {
        self.tutorial = connect(&cfg).await?;
        self.tutorial_redis = cfg;
        Ok(())
    }

    /// The database's name.
    pub fn database(&self) -> &str {
        &self.http.data_api.database
    }

    /// Where the functions reach the Data API.
    pub fn data_api_url(&self) -> &str {
        self.http.data_api.endpoint.as_deref().unwrap_or("AWS")
    }

    /// The functions' dev secret, which the users' tokens are signed with.
    pub fn jwt_secret(&self) -> String {
        self.http.dev_jwt_secret.clone().unwrap_or_default()
    }

    /// Tokens of users `0..users`, signed with the functions' dev secret.
    pub fn tokens(&self, users: u32) -> Arc<Tokens> {
        Arc::new(Tokens::mint(self.jwt_secret().as_bytes(), users))
    }

    /// A voucher on sale now for an hour, in the database and preloaded in Redis, then
    /// taken out of `seckill:active` again so that no drainer of the stack visits its
    /// stream (its orders are not in the stack's database).
    pub async fn voucher(&self, title: &str, stock: i64) -> anyhow::Result<Voucher> {
        self.voucher_in_buckets(title, stock, 1).await
    }

    /// The same with its stock over `buckets` stock buckets.
    pub async fn voucher_in_buckets(
        &self,
        title: &str,
        stock: i64,
        buckets: u16,
    ) -> anyhow::Result<Voucher> {
        let now = now_millis();
        let window = SaleWindow::new(now - 60_000, now + 3_600_000)
            .map_err(|e| anyhow::anyhow!("sale window: {}", e.0))?;
        let new = NewVoucher {
            title: title.to_string(),
            stock,
            window,
            payment: None,
            buckets,
            room: None,
        };
        let voucher = self
            .db
            .create_voucher(&new)
            .await
            .context("creating a voucher through the Data API")?;
        lock(&self.vouchers).push(voucher.id);
        RedisSales::new(self.redis.clone())
            .preload(&voucher)
            .await
            .context("preloading the voucher into Redis")?;
        OrderStreams::new(self.redis.clone())
            .retire(voucher.id)
            .await?;
        Ok(voucher)
    }

    /// Deletes a voucher's Redis keys now (between runs: a dataset that only grows makes
    /// Redis rewrite its AOF ever more often, which would disturb later runs).
    pub async fn release_voucher(&self, voucher: VoucherId) -> anyhow::Result<()> {
        // Every bucket of the voucher (bucket 0's sale hash says how many), each one's
        // keys in one slot.
        let buckets = RedisSales::new(self.redis.clone())
            .sale_buckets(voucher)
            .await?
            .unwrap_or(1);
        for bucket in Bucket::all(voucher, buckets) {
            let k = VoucherKeys::new(bucket);
            // Every key, the sentinels' included: leaving `deadlines`, `closed` and
            // `to_settle` behind grew a long-used stack by three keys a sale, for good.
            let _: i64 = redis::cmd("UNLINK")
                .arg(&k.all()[..])
                .query_async(&mut self.redis.clone())
                .await?;
            OrderStreams::new(self.redis.clone()).retire(bucket).await?;
        }
        let _: i64 = redis::cmd("UNLINK")
            .arg(seckill_shared::keys::sold_out(voucher))
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// Deletes keys of the tutorial baseline now (they stay listed for cleanup, where
    /// deleting again is harmless).
    pub async fn release_keys(&self, keys: &[String]) -> anyhow::Result<()> {
        let mut conn = self.tutorial.clone();
        for key in keys {
            let _: i64 = redis::cmd("UNLINK").arg(key).query_async(&mut conn).await?;
        }
        Ok(())
    }

    /// Remembers a key of the tutorial baseline to delete at cleanup.
    pub fn track_key(&self, key: impl Into<String>) {
        lock(&self.extra_keys).push(key.into());
    }

    /// A key prefix of this run for the baselines' keys.
    pub fn prefix(&self) -> String {
        format!("bench:{}:", self.run_id)
    }

    /// Deletes the run's Redis keys and drops its database.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        let vouchers = std::mem::take(&mut *lock(&self.vouchers));
        let extra = std::mem::take(&mut *lock(&self.extra_keys));
        for v in vouchers {
            self.release_voucher(v).await?;
        }
        self.release_keys(&extra).await?;
        if let Some(server) = self.data_api_server.lock().await.take()
            && let Err(e) = server.shutdown().await
        {
            eprintln!("warning: stopping the Data API server: {e:#}");
        }
        if let Some((admin, name)) = &self.owned_db {
            scratch_db::drop_database(admin, name).await?;
        }
        Ok(())
    }
}

/// A list of the run's, locked (a panic elsewhere while it was held leaves it whole).
fn lock<T>(list: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
    list.lock().unwrap_or_else(|e| e.into_inner())
}

//! Support for the order-drainer suites: private backends, realistic admissions, the
//! drainer in process or as a child process (`order-drainer --once`, for SIGKILL crash
//! tests), and exact read-backs of the database and the streams.
//!
//! Each [`DrainCtx`] owns a private cluster-mode `redis-server`, a fresh database on the
//! stack's MariaDB (schema applied through the Data API) and an in-process
//! `data-api-local` that, like Aurora, keeps an idle transaction (and its row locks) for
//! [`TX_IDLE_TIMEOUT`]: 3 minutes, longer than any test waits, so a killed drainer's
//! open transaction is the drainer's own problem to clear, as in production. Nothing is
//! shared between tests, so they run in parallel.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use data_api_local::ServerConfig;
use futures::StreamExt;
use mysql_async::prelude::Queryable;
use order_drainer::{Config, Drainer, Summary};
use redis::AsyncCommands;
use seckill_shared::adapters::data_api::{DataApi, param};
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::adapters::redis::{OrderIds, RedisConn, RedisSales};
use seckill_shared::config::DataApiConfig;
use seckill_shared::domain::{
    Admission, Bucket, NewVoucher, OrderId, SaleWindow, UserId, Voucher, VoucherId, now_millis,
};
use seckill_shared::keys::{DRAIN_GROUP, VoucherKeys};
use seckill_shared::migrate;

use crate::mysql::{LocalDataApi, connect, drop_database, fresh_database, start_data_api};
use crate::redis::RedisServer;
use crate::stack::{StackEnv, workspace_root};

/// How long the test Data API server lets a transaction sit idle before rolling it back:
/// Aurora's 3 minutes.
pub const TX_IDLE_TIMEOUT: Duration = Duration::from_secs(180);

/// Private backends for one drainer test.
pub struct DrainCtx {
    pub redis: RedisServer,
    data_api: Option<LocalDataApi>,
    /// The stack's MariaDB URL (any database).
    pub mysql_url: String,
    /// This test's database.
    pub database: String,
    pub sales: RedisSales,
    pub streams: OrderStreams,
    /// The order ids this test issues (as one seckill-http instance would).
    pub ids: OrderIds,
}

impl DrainCtx {
    /// Starts Redis, a fresh migrated database and a Data API server for it.
    pub async fn start() -> DrainCtx {
        DrainCtx::start_with(RedisServer::start()).await
    }

    /// The same with a Redis of the test's choosing (e.g. a cluster with replicas).
    pub async fn start_with(redis: RedisServer) -> DrainCtx {
        let mysql_url = StackEnv::load().mysql_url();
        let database = fresh_database(&mysql_url).await;
        let conn = redis.connect().await;
        let mut ctx = DrainCtx {
            redis,
            data_api: None,
            mysql_url,
            database,
            sales: RedisSales::new(conn.clone()),
            streams: OrderStreams::new(conn),
            ids: OrderIds::default(),
        };
        ctx.start_data_api().await;
        migrate::apply(&ctx.db().await, &migrate::embedded())
            .await
            .expect("migrations apply to a fresh database");
        ctx
    }

    /// A Redis connection of this test.
    pub fn conn(&self) -> RedisConn {
        self.sales.conn()
    }

    /// (Re)starts the in-process Data API server (on a new port).
    pub async fn start_data_api(&mut self) {
        self.start_data_api_with(|_| {}).await;
    }

    /// [`Self::start_data_api`] with its configuration changed by `edit` first.
    pub async fn start_data_api_with(&mut self, edit: impl FnOnce(&mut ServerConfig)) {
        assert!(
            self.data_api.is_none(),
            "the Data API server is already running"
        );
        let mut config = ServerConfig::new(crate::mysql::url_with_database(
            &self.mysql_url,
            &self.database,
        ));
        config.transaction_idle_timeout = TX_IDLE_TIMEOUT;
        edit(&mut config);
        self.data_api = Some(start_data_api(config).await);
    }

    /// Stops the Data API server: every later call to it is refused.
    pub async fn stop_data_api(&mut self) {
        if let Some(api) = self.data_api.take() {
            api.server.shutdown().await.expect("data api server stops");
        }
    }

    /// How the drainer reaches the database now. While the server is stopped, an address
    /// nothing listens on.
    pub fn data_api_config(&self) -> DataApiConfig {
        let (cluster_arn, secret_arn, endpoint) = match &self.data_api {
            Some(api) => (
                api.resource_arn.clone(),
                api.secret_arn.clone(),
                api.server.url(),
            ),
            None => (
                data_api_local::DEFAULT_RESOURCE_ARN.to_string(),
                data_api_local::DEFAULT_SECRET_ARN.to_string(),
                format!("http://127.0.0.1:{}", crate::redis::free_port()),
            ),
        };
        DataApiConfig {
            cluster_arn,
            secret_arn,
            database: self.database.clone(),
            endpoint: Some(endpoint),
            timeout: Duration::from_secs(10),
        }
    }

    /// A Data API client for this database (through the current server).
    pub async fn db(&self) -> DataApi {
        DataApi::connect(&self.data_api_config()).await
    }

    /// Drainer settings for tests: small batches, a short claim threshold, a short run.
    pub fn drainer_config(&self) -> Config {
        Config {
            redis: self.redis.config(),
            data_api: self.data_api_config(),
            batch_size: 50,
            min_idle: Duration::from_millis(1_000),
            concurrency: 4,
            retention: Some(Duration::from_secs(7 * 24 * 3_600)),
            safety_margin: Duration::from_millis(100),
            max_run: Duration::from_millis(1_500),
            idle_poll: Duration::from_millis(50),
            vouchers: None,
            // Refunds are the stack's drainer's (and the Stripe suite's) business.
            stripe: None,
            events: None,
        }
    }

    /// One in-process invocation (`--once` semantics) with `cfg`.
    pub async fn drain(&self, cfg: Config) -> Summary {
        let drainer = Drainer::connect(cfg).await.expect("drainer connects");
        order_drainer::run_once(&drainer).await.0
    }

    /// Creates a voucher of `stock` units on sale now (for an hour) in the database,
    /// with `db_stock_left` units left there, and preloads it into Redis with all `stock`
    /// units (so Redis may admit more than the database holds).
    pub async fn voucher(&self, stock: i64, db_stock_left: i64) -> Voucher {
        let now = now_millis();
        self.voucher_in(
            stock,
            db_stock_left,
            SaleWindow::new(now - 60_000, now + 3_600_000).expect("window"),
        )
        .await
    }

    /// A voucher of `stock` units whose sale begins at `begins_ms` and lasts an hour.
    pub async fn voucher_at(&self, stock: i64, begins_ms: i64) -> Voucher {
        let window = SaleWindow::new(begins_ms, begins_ms + 3_600_000).expect("window");
        self.voucher_in(stock, stock, window).await
    }

    async fn voucher_in(&self, stock: i64, db_stock_left: i64, window: SaleWindow) -> Voucher {
        let new = seckill_shared::domain::NewVoucher {
            title: "drainer test".into(),
            stock,
            window,
            payment: None,
            buckets: 1,
            room: None,
        };
        let db = self.db().await;
        let mut v = db.create_voucher(&new).await.expect("voucher created");
        if db_stock_left != stock {
            db.execute(
                "UPDATE vouchers SET stock_left = :left WHERE id = :id",
                vec![
                    param::long("left", db_stock_left),
                    param::long("id", v.id.get()),
                ],
                None,
            )
            .await
            .expect("stock_left set");
        }
        self.sales.preload(&v).await.expect("preload");
        v.db_stock_left = db_stock_left;
        v
    }

    /// Admits `n` buyers (`<prefix>-0` ...) through the real admission script, with order
    /// ids leased like seckill-http does; returns the order ids in admission order.
    pub async fn admit(&self, voucher: VoucherId, prefix: &str, n: usize) -> Vec<OrderId> {
        self.admit_to(voucher.into(), prefix, n).await
    }

    /// [`DrainCtx::admit`] into one stock bucket of a voucher.
    pub async fn admit_to(&self, bucket: Bucket, prefix: &str, n: usize) -> Vec<OrderId> {
        let voucher = bucket.voucher();
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(
                self.ids
                    .next(&self.sales, voucher, now_millis())
                    .await
                    .expect("order id"),
            );
        }
        let admitted: Vec<(usize, OrderId)> =
            futures::stream::iter(ids.iter().copied().enumerate())
                .map(|(i, id)| async move {
                    let user = UserId::parse(&format!("{prefix}-{i}")).expect("user id");
                    let reply = self.sales.admit(bucket, &user, id).await.expect("admit");
                    assert!(
                        matches!(reply.admission, Admission::Admitted { .. }),
                        "admission of {user} refused: {:?}",
                        reply.admission
                    );
                    (i, id)
                })
                .buffer_unordered(32)
                .collect()
                .await;
        // Stream order may differ from `ids` order under concurrency; callers compare sets.
        assert_eq!(admitted.len(), n);
        ids
    }

    /// Creates `new` in the database (through the Data API, as seckill-http does) and
    /// preloads it into Redis.
    pub async fn voucher_of(&self, new: &NewVoucher) -> Voucher {
        let v = self
            .db()
            .await
            .create_voucher(new)
            .await
            .expect("voucher created");
        self.sales.preload(&v).await.expect("preload");
        v
    }

    /// Makes the test database refuse (SIGNAL) every order row whose user id starts with
    /// `prefix`: a permanent error no retry fixes, tied to those orders alone. The
    /// trigger is `refuse_<prefix>`.
    pub async fn refuse_users(&self, prefix: &str) {
        self.refuse_users_after(prefix, 0).await;
    }

    /// [`DrainCtx::refuse_users`], each refusal after `seconds` of sleep (a statement
    /// that takes that long before it fails).
    pub async fn refuse_users_after(&self, prefix: &str, seconds: u32) {
        let mut conn = self.mysql().await;
        conn.query_drop(format!(
            "CREATE TRIGGER refuse_{prefix} BEFORE INSERT ON orders FOR EACH ROW \
             IF NEW.user_id LIKE '{prefix}%' THEN DO SLEEP({seconds}); \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'order refused by a test trigger'; END IF"
        ))
        .await
        .expect("CREATE TRIGGER");
        conn.disconnect().await.ok();
    }

    /// Makes the test database refuse the next `times` order rows whose user id starts
    /// with `prefix`, then take them: a fault the error's text calls permanent that
    /// passes all the same. The count lives in a MEMORY table, which a refused
    /// statement does not roll back.
    pub async fn refuse_users_times(&self, prefix: &str, times: u32) {
        let mut conn = self.mysql().await;
        conn.query_drop(format!(
            "CREATE TABLE refusals_{prefix} (n INT NOT NULL) ENGINE = MEMORY; \
             INSERT INTO refusals_{prefix} VALUES ({times})"
        ))
        .await
        .expect("the refusals' count");
        conn.query_drop(format!(
            "CREATE TRIGGER refuse_{prefix} BEFORE INSERT ON orders FOR EACH ROW \
             IF NEW.user_id LIKE '{prefix}%' AND (SELECT n FROM refusals_{prefix}) > 0 THEN \
             BEGIN UPDATE refusals_{prefix} SET n = n - 1; \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'order refused by a test trigger'; END; \
             END IF"
        ))
        .await
        .expect("CREATE TRIGGER");
        conn.disconnect().await.ok();
    }

    /// Makes `n` vouchers of `stock` units on sale now, straight in the database (one
    /// multi-row INSERT per thousand) and preloaded in Redis, ids from `first_id`.
    pub async fn many_vouchers(&self, first_id: i64, n: i64, stock: i64) -> Vec<Voucher> {
        let now = now_millis();
        let window = SaleWindow::new(now - 60_000, now + 3_600_000).expect("window");
        let mut conn = self.mysql().await;
        let ids: Vec<i64> = (first_id..first_id + n).collect();
        for chunk in ids.chunks(1_000) {
            let values: Vec<String> = chunk
                .iter()
                .map(|id| {
                    format!(
                        "({id}, 'scale', {stock}, {stock}, \
                         NOW(3) - INTERVAL 1 MINUTE, NOW(3) + INTERVAL 1 HOUR)"
                    )
                })
                .collect();
            conn.query_drop(format!(
                "INSERT INTO vouchers (id, title, stock, stock_left, begins_at, ends_at) VALUES {}",
                values.join(",")
            ))
            .await
            .expect("vouchers inserted");
        }
        conn.disconnect().await.ok();
        let vouchers: Vec<Voucher> = ids
            .iter()
            .map(|&id| Voucher {
                id: VoucherId::new(id).expect("voucher id"),
                title: "scale".into(),
                stock,
                db_stock_left: stock,
                window,
                payment: None,
                buckets: 1,
                room: None,
            })
            .collect();
        futures::stream::iter(&vouchers)
            .for_each_concurrent(64, |v| async move {
                self.sales.preload(v).await.expect("preload");
            })
            .await;
        vouchers
    }

    /// Another run's open transaction holding the voucher's row, as a killed run leaves
    /// it: begun through the Data API, the row locked, recorded under `consumer` as
    /// begun at `begun_ms` (or not recorded at all). Returns its id.
    pub async fn hold_the_voucher_row(&self, v: VoucherId, record: Option<(&str, i64)>) -> String {
        let db = self.db().await;
        let tx = db.begin().await.expect("begin");
        db.execute(
            "SELECT stock_left FROM vouchers WHERE id = :v FOR UPDATE",
            vec![param::long("v", v.get())],
            Some(&tx),
        )
        .await
        .expect("row locked");
        if let Some((consumer, begun)) = record {
            self.streams
                .register_tx(v, &tx, consumer, begun)
                .await
                .expect("recorded");
        }
        tx
    }

    /// Appends a raw entry to a voucher's orders stream (poison entries).
    pub async fn xadd_raw(&self, voucher: VoucherId, fields: &[(&str, &str)]) -> String {
        let k = VoucherKeys::new(voucher);
        self.conn()
            .xadd(&k.orders, "*", fields)
            .await
            .expect("XADD")
    }

    /// A direct MariaDB connection to this test's database.
    pub async fn mysql(&self) -> mysql_async::Conn {
        connect(&crate::mysql::url_with_database(
            &self.mysql_url,
            &self.database,
        ))
        .await
    }

    /// The voucher's orders in the database: id → (status, reason).
    pub async fn orders_in_db(
        &self,
        voucher: VoucherId,
    ) -> BTreeMap<i64, (String, Option<String>)> {
        let mut conn = self.mysql().await;
        let rows: Vec<(i64, String, Option<String>)> = conn
            .exec(
                "SELECT id, status, reason FROM orders WHERE voucher_id = ?",
                (voucher.get(),),
            )
            .await
            .expect("orders query");
        conn.disconnect().await.ok();
        rows.into_iter().map(|(id, s, r)| (id, (s, r))).collect()
    }

    /// The voucher's `stock_left` in the database.
    pub async fn db_stock_left(&self, voucher: VoucherId) -> i64 {
        let mut conn = self.mysql().await;
        let left: Option<i64> = conn
            .exec_first(
                "SELECT stock_left FROM vouchers WHERE id = ?",
                (voucher.get(),),
            )
            .await
            .expect("stock query");
        conn.disconnect().await.ok();
        left.expect("voucher row exists")
    }

    /// Entries pending in the drain group of the voucher's stream.
    pub async fn pending(&self, voucher: impl Into<Bucket>) -> u64 {
        let k = VoucherKeys::new(voucher.into());
        let reply: redis::streams::StreamPendingReply = self
            .conn()
            .xpending(&k.orders, DRAIN_GROUP)
            .await
            .expect("XPENDING");
        reply.count() as u64
    }

    /// Ids of the entries of the voucher's orders stream.
    pub async fn stream_ids(&self, voucher: VoucherId) -> Vec<String> {
        let k = VoucherKeys::new(voucher);
        let reply: redis::streams::StreamRangeReply =
            self.conn().xrange_all(&k.orders).await.expect("XRANGE");
        reply.ids.into_iter().map(|e| e.id).collect()
    }

    /// The voucher's dead letters, each as field → value (UTF-8, lossy).
    pub async fn dead_letters(&self, voucher: VoucherId) -> Vec<HashMap<String, String>> {
        let k = VoucherKeys::new(voucher);
        let reply: redis::streams::StreamRangeReply =
            self.conn().xrange_all(&k.dead).await.expect("XRANGE dead");
        reply
            .ids
            .into_iter()
            .map(|e| {
                e.map
                    .into_iter()
                    .map(|(k, v)| {
                        let v: Vec<u8> = redis::from_redis_value(v).unwrap_or_default();
                        (k, String::from_utf8_lossy(&v).into_owned())
                    })
                    .collect()
            })
            .collect()
    }

    /// The environment of an `order-drainer --once` child process for `cfg`.
    pub fn drainer_env(&self, cfg: &Config) -> Vec<(String, String)> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut env = vec![
            ("REDIS_URL".into(), cfg.redis.url.clone()),
            ("REDIS_CLUSTER".into(), cfg.redis.cluster.to_string()),
            ("REDIS_TIMEOUT_MS".into(), ms(cfg.redis.timeout)),
            ("DB_CLUSTER_ARN".into(), cfg.data_api.cluster_arn.clone()),
            ("DB_SECRET_ARN".into(), cfg.data_api.secret_arn.clone()),
            ("DB_NAME".into(), cfg.data_api.database.clone()),
            ("DATA_API_TIMEOUT_MS".into(), ms(cfg.data_api.timeout)),
            ("DRAINER_BATCH_SIZE".into(), cfg.batch_size.to_string()),
            ("DRAINER_MIN_IDLE_MS".into(), ms(cfg.min_idle)),
            ("DRAINER_CONCURRENCY".into(), cfg.concurrency.to_string()),
            (
                "DRAINER_RETENTION_S".into(),
                cfg.retention.map_or(0, |r| r.as_secs()).to_string(),
            ),
            ("DRAINER_SAFETY_MARGIN_MS".into(), ms(cfg.safety_margin)),
            ("DRAINER_MAX_RUN_MS".into(), ms(cfg.max_run)),
            ("DRAINER_IDLE_POLL_MS".into(), ms(cfg.idle_poll)),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), "local".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "local".into()),
            ("RUST_LOG".into(), "warn".into()),
        ];
        if let Some(endpoint) = &cfg.data_api.endpoint {
            env.push(("DATA_API_URL".into(), endpoint.clone()));
        }
        if let Some(vouchers) = &cfg.vouchers {
            let list: Vec<String> = vouchers.iter().map(|v| v.to_string()).collect();
            env.push(("DRAINER_VOUCHERS".into(), list.join(",")));
        }
        if let Some(events) = &cfg.events {
            env.push(("EVENT_BUS_NAME".into(), events.bus.clone()));
            if let Some(endpoint) = &events.endpoint {
                env.push(("EVENTS_ENDPOINT_URL".into(), endpoint.clone()));
            }
        }
        env
    }
}

/// The `order-drainer` binary of this workspace.
///
/// # Panics
/// When it is missing or older than the sources it is built from: build it first with
/// `cargo build --bin order-drainer` (`scripts/test.sh` does).
pub fn drainer_binary() -> PathBuf {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug").join("order-drainer");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build --bin order-drainer` first",
                bin.display()
            )
        });
    // The sources compiled into it (the scripts are `lua/*.lua`, not subfolders).
    let newest_source = [
        ("functions/order-drainer/src", true),
        ("shared/src", true),
        ("lua", false),
    ]
    .iter()
    .flat_map(|(dir, recurse)| newest_mtime(&root.join(dir), *recurse))
    .max()
    .unwrap_or(SystemTime::UNIX_EPOCH);
    assert!(
        built >= newest_source,
        "{} is older than its sources: run `cargo build --bin order-drainer` first",
        bin.display()
    );
    bin
}

fn newest_mtime(dir: &std::path::Path, recurse: bool) -> Option<SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            if recurse {
                newest_mtime(&path, true)
            } else {
                None
            }
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// A running `order-drainer --once` child; killed (SIGKILL) when dropped.
pub struct DrainerProcess {
    child: Child,
    stderr_lines: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

impl DrainerProcess {
    /// Starts `order-drainer --once` with `env` (plus `DRAINER_FAILPOINT` when given).
    pub fn spawn(env: &[(String, String)], failpoint: Option<&str>) -> DrainerProcess {
        let mut cmd = Command::new(drainer_binary());
        cmd.arg("--once")
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(fp) = failpoint {
            cmd.env(order_drainer::failpoint::ENV, fp);
        }
        let mut child = cmd.spawn().expect("order-drainer starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        DrainerProcess {
            child,
            stderr_lines: rx,
            stderr_seen: Vec::new(),
        }
    }

    /// Waits until the child prints `FAILPOINT <name>`; panics after `timeout` or if the
    /// child exits first, showing its stderr.
    pub fn wait_for_failpoint(&mut self, name: &str, timeout: Duration) {
        let want = format!("FAILPOINT {name}");
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .stderr_lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(line) => {
                    let hit = line.trim() == want;
                    self.stderr_seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    panic!(
                        "order-drainer exited ({status:?}) before {want}; stderr:\n{}",
                        self.stderr_seen.join("\n")
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "no {want} within {timeout:?}; stderr:\n{}",
                self.stderr_seen.join("\n")
            );
        }
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the child to exit (at most `timeout`) and returns its exit success and
    /// the summary it printed.
    pub fn finish(mut self, timeout: Duration) -> (bool, Summary) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("order-drainer --once did not finish within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            use std::io::Read as _;
            let _ = stdout.read_to_string(&mut out);
        }
        while let Ok(line) = self.stderr_lines.try_recv() {
            self.stderr_seen.push(line);
        }
        let summary = serde_json::from_str::<Summary>(out.trim())
            .ok()
            .unwrap_or_else(|| {
                panic!(
                    "order-drainer --once printed no summary (exit {status}); stdout:\n{out}\nstderr:\n{}",
                    self.stderr_seen.join("\n")
                )
            });
        (status.success(), summary)
    }
}

impl Drop for DrainerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl DrainCtx {
    /// Drops the database (Redis and the Data API server stop when dropped).
    pub async fn cleanup(mut self) {
        self.stop_data_api().await;
        drop_database(&self.mysql_url, &self.database).await;
    }
}

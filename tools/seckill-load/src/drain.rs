//! The drain side: `drain` (N admitted orders waiting in streams, moved into the
//! database) and the admission-to-commit latency while one drainer invocation runs.
//!
//! - **ours**: one invocation of the real drain cycle ([`order_drainer::Drainer::run`])
//!   in this process, restricted to the run's voucher (`DRAINER_VOUCHERS`), through the
//!   stack's Data API server, for each batch size of a sweep; the best one is picked.
//!   The clock stops when the stream's group has nothing undelivered or pending (every
//!   entry committed, then acked); the invocation, by then idle-polling, is dropped.
//! - **tutorial consumer**: COUNT 1 per XREADGROUP; per order one Data API transaction
//!   (count query for (user, voucher), `UPDATE ... stock_left = stock_left - 1 WHERE
//!   stock_left > 0`, INSERT, commit), then XACK; one consumer, as in the tutorial.
//! - **database floor**: multi-row INSERTs straight into MariaDB (mysql_async, no Data
//!   API), one connection. Compared in `floor_rounds` rounds, each a run of the floor
//!   and a run of ours (the sweep's best batch size) back to back, the order alternating:
//!   the floor's rate moves a lot between runs on a shared machine (and with the size of
//!   the table, which every run grows), so each ratio is taken from two neighbouring
//!   runs on the same table, and the round with the median ratio stands for the drain.
//! - **spread**: the same N orders spread evenly over 1, 10 and 100 sales at once, one
//!   invocation of ours (the sweep's best batch size, `DRAINER_CONCURRENCY` at its
//!   default) draining them all: how the rate holds when many sales drain together.
//!
//! Every variant is checked afterwards: the database holds exactly the N orders, one per
//! user, and the voucher's stock went down by N.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;
use mysql_async::prelude::Queryable;
use order_drainer::config::{MAX_BATCH_SIZE, defaults};
use order_drainer::{Config as DrainerConfig, Drainer};
use redis::AsyncCommands;
use redis::streams::StreamReadReply;
use seckill_shared::adapters::data_api::{field, format_datetime, param};
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::config::{DataApiConfig, RedisConfig};
use seckill_shared::domain::{Voucher, VoucherId, now_millis};
use serde::{Deserialize, Serialize};

use seckill_cli::scratch_db::mysql;

use crate::admission::{ours_drivers, tutorial_keys};
use crate::backends::Bench;
use crate::drivers::{Driver, TutorialKeys, many};
use crate::engine::{Ui, run};
use crate::record::{Check, Latency, RunResult, latency_of_values};
use crate::workload::{Plan, user_name};

/// Sizes of the drain scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize, clap::Args)]
pub struct DrainOptions {
    /// Orders waiting in the stream for each run of ours and for the database floor
    #[arg(long, default_value_t = 20_000)]
    pub orders: u64,
    /// `DRAINER_BATCH_SIZE` values to sweep
    #[arg(long, value_delimiter = ',', default_value = "100,250,500,1000,2000")]
    pub batch_sizes: Vec<usize>,
    /// Orders the tutorial consumer drains (it is slow; its rate is steady)
    #[arg(long, default_value_t = 3_000)]
    pub tutorial_orders: u64,
    /// Rows per INSERT of the database floor
    #[arg(long, default_value_t = 1_000)]
    pub floor_batch: usize,
    /// Rounds of the comparison with the database floor (a floor run and a run of ours
    /// side by side in each; the median round's ratio is reported)
    #[arg(long, default_value_t = 3)]
    #[serde(default = "three")]
    pub floor_rounds: usize,
    /// Run the tutorial consumer and the database floor too.
    #[arg(skip = true)]
    pub baseline: bool,
    /// Numbers of sales the N orders are spread over, each drained by one invocation
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    #[serde(default)]
    pub sales: Vec<usize>,
}

/// One drain run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainRun {
    /// `ours`, `tutorial`, `db-floor`, `spread`.
    pub variant: String,
    pub batch_size: usize,
    /// Sales the orders were spread over (1 but for `spread`).
    #[serde(default = "one")]
    pub sales: usize,
    pub orders: u64,
    pub elapsed_s: f64,
    pub orders_per_s: f64,
    /// The drainer's own summary of the invocation (ours).
    pub summary: Option<serde_json::Value>,
    pub checks: Vec<Check>,
    /// Why the variant FAILED on this server (the tutorial consumer, when the server
    /// refused the tutorial's admission script that fills its stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DrainReport {
    pub options: DrainOptions,
    pub ours: Vec<DrainRun>,
    pub tutorial: Option<DrainRun>,
    /// The floor run of the median round (a report written before rounds existed: the
    /// only floor run, made after every run of ours).
    pub db_floor: Option<DrainRun>,
    /// The rounds of the comparison with the floor, in the order they ran.
    #[serde(default)]
    pub floor_rounds: Vec<FloorRound>,
    /// Ours over 1, 10, 100 sales at once.
    #[serde(default)]
    pub spread: Vec<DrainRun>,
}

/// A run of the database floor and a run of ours next to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorRound {
    pub floor_first: bool,
    pub floor: DrainRun,
    pub ours: DrainRun,
}

impl FloorRound {
    /// Ours over the floor.
    pub fn ratio(&self) -> f64 {
        self.ours.orders_per_s / self.floor.orders_per_s.max(1e-9)
    }
}

fn one() -> usize {
    1
}

fn three() -> usize {
    3
}

impl DrainRun {
    fn new(
        variant: &str,
        batch_size: usize,
        sales: usize,
        orders: u64,
        elapsed: Duration,
        checks: Vec<Check>,
    ) -> DrainRun {
        DrainRun {
            variant: variant.into(),
            batch_size,
            sales,
            orders,
            elapsed_s: elapsed.as_secs_f64(),
            orders_per_s: orders as f64 / elapsed.as_secs_f64().max(1e-9),
            summary: None,
            checks,
            error: None,
        }
    }
}

impl DrainReport {
    /// The round with the median ratio of ours to the floor (the lower middle one of
    /// an even count).
    pub fn median_round(&self) -> Option<&FloorRound> {
        let mut rounds: Vec<&FloorRound> = self.floor_rounds.iter().collect();
        rounds.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        rounds.get(rounds.len().saturating_sub(1) / 2).copied()
    }

    /// Our fastest batch size.
    pub fn best(&self) -> Option<&DrainRun> {
        self.ours
            .iter()
            .max_by(|a, b| a.orders_per_s.total_cmp(&b.orders_per_s))
    }

    pub fn runs(&self) -> impl Iterator<Item = &DrainRun> {
        self.ours
            .iter()
            .chain(self.tutorial.iter())
            .chain(self.spread.iter())
            .chain(self.floor_rounds.iter().flat_map(|r| [&r.floor, &r.ours]))
            // A report from before the rounds: its one floor run.
            .chain(
                self.db_floor
                    .iter()
                    .filter(|_| self.floor_rounds.is_empty()),
            )
    }
}

/// Options of the admission-to-commit measurement.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct CommitLatencyOptions {
    /// Admissions per second while the drainer runs (paced)
    #[arg(long, default_value_t = 1_000.0)]
    pub rate: f64,
    /// For this long
    #[arg(long, default_value_t = 15.0)]
    pub seconds: f64,
    /// Callers of the paced admissions
    #[arg(id = "latency_callers", long = "latency-callers", default_value_t = 16)]
    pub callers: usize,
    /// DRAINER_BATCH_SIZE of the invocation (0: the drain sweep's best, else the
    /// drainer's default)
    #[arg(id = "latency_batch", long = "latency-batch", default_value_t = 0)]
    pub batch_size: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommitLatencyReport {
    pub options: CommitLatencyOptions,
    /// The paced admissions through the in-process handler.
    pub admissions: RunResult,
    pub committed: u64,
    /// Commit (the row's `created_at`, set by the INSERT inside the committing
    /// transaction) minus admission (`admitted_at`, the handler's clock), both at
    /// millisecond precision.
    pub latency: Latency,
    /// Seconds from the end of the admissions until the last order was committed.
    pub drained_after_s: f64,
    pub summary: Option<serde_json::Value>,
    pub checks: Vec<Check>,
}

/// `drain`: the sweep of ours, then the baselines.
pub async fn drain(bench: &Bench, o: &DrainOptions, ui: &Ui) -> anyhow::Result<DrainReport> {
    anyhow::ensure!(
        o.orders >= 1 && !o.batch_sizes.is_empty() && (o.floor_rounds >= 1 || !o.baseline),
        "sizes must be positive"
    );
    let mut report = DrainReport {
        options: o.clone(),
        ..DrainReport::default()
    };
    for &b in o.batch_sizes.iter().take_while(|_| !ui.stopped()) {
        let run = drain_sales(bench, "ours", o.orders, 1, b, ui).await?;
        report.ours.push(run);
    }
    let best = report.best().map_or(defaults::BATCH_SIZE, |r| r.batch_size);
    for &k in o.sales.iter().take_while(|_| !ui.stopped()) {
        let run = drain_sales(bench, "spread", o.orders, k, best, ui).await?;
        report.spread.push(run);
    }
    if o.baseline && !ui.stopped() {
        report.tutorial = Some(drain_tutorial(bench, o.tutorial_orders, ui).await?);
        for round in (0..o.floor_rounds).take_while(|_| !ui.stopped()) {
            let floor_first = round % 2 == 0;
            let floor_run = || drain_floor(bench, o.orders, o.floor_batch, round);
            let ours_run = || drain_sales(bench, "ours", o.orders, 1, best, ui);
            let (floor, ours) = if floor_first {
                let floor = floor_run().await?;
                (floor, ours_run().await?)
            } else {
                let ours = ours_run().await?;
                (floor_run().await?, ours)
            };
            report.floor_rounds.push(FloorRound {
                floor_first,
                floor,
                ours,
            });
        }
        report.db_floor = report.median_round().map(|r| r.floor.clone());
    }
    for r in report.runs() {
        let error = r
            .error
            .as_deref()
            .map_or(String::new(), |e| format!(": FAILED: {e}"));
        eprintln!(
            "  drain  {:<8} {:>3} sale(s), batch {:>5}: {:>7} orders in {:>6.2} s = {:>8.0} orders/s{error}",
            r.variant, r.sales, r.batch_size, r.orders, r.elapsed_s, r.orders_per_s
        );
    }
    Ok(report)
}

/// A drainer of `vouchers` on the run's backends, with short idle polls, no safety
/// margin, and nothing claimed from another invocation during a run.
async fn drainer(
    bench: &Bench,
    vouchers: &[VoucherId],
    batch: usize,
    max_run: Duration,
) -> anyhow::Result<Drainer> {
    anyhow::ensure!(
        (1..=MAX_BATCH_SIZE).contains(&batch),
        "DRAINER_BATCH_SIZE must be between 1 and {MAX_BATCH_SIZE}"
    );
    let h = &bench.http;
    let cfg = DrainerConfig {
        redis: RedisConfig {
            tls_ca_file: None,
            durable: None,
            ..h.redis.clone()
        },
        data_api: DataApiConfig {
            timeout: Duration::from_secs(30),
            ..h.data_api.clone()
        },
        batch_size: batch,
        min_idle: max_run * 2 + Duration::from_secs(60),
        concurrency: defaults::CONCURRENCY,
        retention: Some(Duration::from_secs(defaults::RETENTION_S)),
        safety_margin: Duration::ZERO,
        max_run,
        idle_poll: Duration::from_millis(20),
        vouchers: Some(vouchers.to_vec()),
    };
    Drainer::connect(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("connecting the drainer: {e}"))
}

/// A voucher of `n` units to which our engine (adapter callers) admitted `n` distinct
/// users, so that `n` orders wait in its stream.
pub(crate) async fn filled(bench: &Bench, title: &str, n: u64, ui: &Ui) -> anyhow::Result<Voucher> {
    let voucher = bench.voucher(title, n.max(1) as i64).await?;
    let callers = (n as usize).clamp(1, 16);
    let drivers = many(callers, || Driver::adapter(&bench.http.redis, voucher.id)).await?;
    let (plan, what) = (Arc::new(Plan::distinct(n)), ["drain", "fill", "redis"]);
    let r = run(drivers, plan, what, voucher.stock, None, ui).await?;
    anyhow::ensure!(
        r.admitted == n,
        "filling the stream admitted {} of {n} orders ({:?})",
        r.admitted,
        r.failure_samples
    );
    Ok(voucher)
}

/// Waits until no stream of `ids` has anything undelivered or pending, showing the
/// orders done (`per` a sale) on `bar`. Only the sales not yet drained are asked again,
/// so the watcher's own Redis calls shrink as the drain progresses.
async fn wait_drained(
    streams: &OrderStreams,
    ids: &[VoucherId],
    per: u64,
    poll: Duration,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    let (mut open, mut done) = (ids.to_vec(), 0);
    loop {
        let (mut still, mut partly) = (Vec::with_capacity(open.len()), 0);
        for &v in &open {
            match streams.stats(v).await? {
                Some(st) if st.pending == 0 && st.undelivered == 0 && st.lag_exact => {
                    done += per;
                }
                other => {
                    partly += other.map_or(0, |st| {
                        st.length.saturating_sub(st.undelivered + st.pending)
                    });
                    still.push(v);
                }
            }
        }
        open = still;
        bar.set_position(done + partly);
        if open.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(poll).await;
    }
}

/// One invocation of ours draining `n` orders spread evenly over `sales` fresh sales (a
/// check records it when the invocation ends before they are drained).
async fn drain_sales(
    bench: &Bench,
    variant: &str,
    n: u64,
    sales: usize,
    batch: usize,
    ui: &Ui,
) -> anyhow::Result<DrainRun> {
    anyhow::ensure!(
        sales >= 1 && n >= sales as u64,
        "need at least one order per sale"
    );
    let per = n / sales as u64;
    let n = per * sales as u64;
    let mut ids = Vec::with_capacity(sales);
    for i in 0..sales {
        let title = format!("bench drain {variant} {i}/{sales} batch {batch}");
        ids.push(filled(bench, &title, per, ui).await?.id);
    }
    let drainer = drainer(bench, &ids, batch, ui.max_run).await?;
    let streams = OrderStreams::new(bench.redis.clone());
    let bar = ui.bar(n, &format!("drain {variant} {sales} sale(s) b={batch}"));
    let consumer = format!("bench-{}", bench.run_id);
    let start = Instant::now();
    let watch = async {
        // One sale is watched closely.
        let poll = Duration::from_millis(if sales == 1 { 2 } else { 10 });
        wait_drained(&streams, &ids, per, poll, &bar).await?;
        anyhow::Ok(start.elapsed())
    };
    let (elapsed, summary) = tokio::select! {
        s = drainer.run(&consumer, start + ui.max_run) => (start.elapsed(), Some(s)),
        w = watch => (w?, None),
    };
    bar.finish_and_clear();
    let mut checks = Vec::new();
    for &v in &ids {
        checks.extend(db_checks(bench, v, per, Some(0)).await?);
        bench.release_voucher(v).await?;
    }
    if let Some(s) = &summary {
        checks.push(Check::new(
            "the invocation drained everything before its time was up",
            false,
            format!("{s:?}"),
        ));
    }
    Ok(DrainRun {
        summary: summary.and_then(|s| serde_json::to_value(s).ok()),
        ..DrainRun::new(variant, batch, sales, n, elapsed, checks)
    })
}

/// The database holds exactly `n` orders of `voucher`, one per user, all confirmed,
/// and (when given) the voucher's database stock is `left`.
async fn db_checks(
    bench: &Bench,
    voucher: VoucherId,
    n: u64,
    left: Option<i64>,
) -> anyhow::Result<Vec<Check>> {
    let out = bench
        .db
        .execute(
            "SELECT COUNT(*), COUNT(DISTINCT user_id), COALESCE(SUM(status = 'confirmed'), 0) FROM orders WHERE voucher_id = :v",
            vec![param::long("v", voucher.get())],
            None,
        )
        .await?;
    let long = |i: usize| out.records().first()?.get(i).and_then(field::long);
    let [rows, users, confirmed] = [0, 1, 2].map(|i| long(i).unwrap_or(-1));
    let mut checks = vec![
        Check::new(
            "every order committed once",
            rows == n as i64 && confirmed == n as i64,
            format!("{rows} rows ({confirmed} confirmed) for {n} admitted orders"),
        ),
        Check::new(
            "no user twice",
            users == rows,
            format!("{users} distinct users in {rows} rows"),
        ),
    ];
    if let Some(left) = left {
        let v = bench.db.voucher(voucher).await?;
        let have = v.as_ref().map(|v| v.db_stock_left);
        checks.push(Check::new(
            "database stock taken exactly",
            have == Some(left),
            format!("stock_left {have:?}, expected {left}"),
        ));
    }
    Ok(checks)
}

/// The tutorial's admission fills a stream of its own (the admission runs' orders sit
/// in the run's global stream), then the tutorial's consumer drains it.
async fn drain_tutorial(bench: &Bench, n: u64, ui: &Ui) -> anyhow::Result<DrainRun> {
    let voucher = bench.voucher("bench drain tutorial", n as i64).await?;
    let prefix = format!("{}drain:", bench.prefix());
    let keys = tutorial_keys(bench, &prefix, voucher.id, n as i64).await?;
    let drivers = many(16, || Driver::tutorial(&bench.tutorial_redis, keys.clone())).await?;
    let plan = Arc::new(Plan::distinct(n));
    let what = ["drain", "tutorial fill", "redis"];
    let filled = run(drivers, plan, what, n as i64, None, ui).await?;
    let run = if let Some(e) = filled.error {
        let mut run = DrainRun::new("tutorial", 1, 1, 0, Duration::ZERO, Vec::new());
        run.error = Some(format!(
            "filling its stream with the tutorial's admission: {e}"
        ));
        run
    } else {
        anyhow::ensure!(
            filled.admitted == n,
            "the tutorial admitted {} of {n}",
            filled.admitted
        );
        let mut conn = bench.tutorial.clone();
        let _: () = conn
            .xgroup_create_mkstream(keys.stream(), "g1", "0")
            .await?;
        let bar = ui.bar(n, "drain tutorial");
        let start = Instant::now();
        let done = tutorial_consume(bench, &keys, &bar, start + ui.max_run).await?;
        let elapsed = start.elapsed();
        bar.finish_and_clear();
        let checks = db_checks(bench, voucher.id, n, Some(0)).await?;
        DrainRun::new("tutorial", 1, 1, done, elapsed, checks)
    };
    bench.release_voucher(voucher.id).await?;
    bench.release_keys(&keys.all()).await?;
    Ok(run)
}

/// The tutorial's consumer loop; returns the orders it processed.
async fn tutorial_consume(
    bench: &Bench,
    keys: &TutorialKeys,
    bar: &ProgressBar,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let mut conn = bench.tutorial.clone();
    let db = &bench.db;
    let opts = redis::streams::StreamReadOptions::default()
        .group("g1", "c1")
        .count(1);
    let mut done = 0u64;
    while Instant::now() < deadline {
        let reply: StreamReadReply = conn.xread_options(&[keys.stream()], &[">"], &opts).await?;
        let Some(entry) = reply.keys.into_iter().flat_map(|k| k.ids).next() else {
            break;
        };
        let fields = (
            entry.get::<String>("userId"),
            entry.get("voucherId"),
            entry.get("id"),
        );
        let (Some(user), Some(voucher), Some(id)) = fields else {
            anyhow::bail!(
                "tutorial stream entry {} lacks userId, voucherId or id",
                entry.id
            );
        };
        let tx = db.begin().await?;
        let count = db
            .execute(
                "SELECT COUNT(*) FROM orders WHERE user_id = :u AND voucher_id = :v",
                vec![param::string("u", &user), param::long("v", voucher)],
                Some(&tx),
            )
            .await?;
        let bought = count.records().first().and_then(|r| r.first());
        let updated = match bought.and_then(field::long).unwrap_or(0) {
            0 => db
                .execute(
                    "UPDATE vouchers SET stock_left = stock_left - 1 WHERE id = :v AND stock_left > 0",
                    vec![param::long("v", voucher)],
                    Some(&tx),
                )
                .await?
                .number_of_records_updated(),
            _ => 0,
        };
        if updated == 0 {
            db.rollback(&tx).await;
        } else {
            db.execute(
                "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES (:id, :v, :u, 'confirmed', :a)",
                vec![
                    param::long("id", id),
                    param::long("v", voucher),
                    param::string("u", &user),
                    param::timestamp("a", now_millis()),
                ],
                Some(&tx),
            )
            .await?;
            db.commit(&tx).await?;
        }
        let _: i64 = conn.xack(keys.stream(), "g1", &[&entry.id]).await?;
        done += 1;
        bar.set_position(done);
    }
    Ok(done)
}

/// The floor's `round`-th run (its order ids are the round's own: ids are unique across
/// vouchers).
async fn drain_floor(
    bench: &Bench,
    n: u64,
    batch: usize,
    round: usize,
) -> anyhow::Result<DrainRun> {
    let first_id = (1_i64 << 40) + ((round as i64) << 32);
    let voucher = bench.voucher("bench drain floor", n as i64).await?;
    let mut conn = mysql(&bench.mysql_url).await?;
    let admitted = format_datetime(now_millis());
    let start = Instant::now();
    for first in (0..n).step_by(batch) {
        let rows: Vec<String> = (first..(first + batch as u64).min(n))
            .map(|k| {
                let (id, user) = (first_id + k as i64, user_name(k as u32));
                format!("({id},{},'{user}','confirmed','{admitted}')", voucher.id)
            })
            .collect();
        conn.query_drop(format!(
            "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES {}",
            rows.join(",")
        ))
        .await
        .context("database floor INSERT")?;
    }
    let elapsed = start.elapsed();
    conn.disconnect().await.ok();
    let checks = db_checks(bench, voucher.id, n, None).await?;
    bench.release_voucher(voucher.id).await?;
    Ok(DrainRun::new("db-floor", batch, 1, n, elapsed, checks))
}

/// Admission-to-commit latency: paced admissions through the in-process handler while
/// one drainer invocation runs.
pub async fn commit_latency(
    bench: &Bench,
    o: &CommitLatencyOptions,
    ui: &Ui,
) -> anyhow::Result<CommitLatencyReport> {
    anyhow::ensure!(
        o.rate > 0.0 && o.seconds > 0.0 && o.callers >= 1,
        "sizes must be positive"
    );
    let n = (o.rate * o.seconds).round().max(1.0) as u64;
    let voucher = bench.voucher("bench commit latency", n as i64).await?;
    let max_run = Duration::from_secs_f64(o.seconds + 60.0);
    let drainer = drainer(bench, &[voucher.id], o.batch_size, max_run).await?;
    let consumer = format!("bench-latency-{}", bench.run_id);
    let invocation =
        tokio::spawn(async move { drainer.run(&consumer, Instant::now() + max_run).await });
    let drivers = ours_drivers(&bench.http, voucher.id, &bench.tokens(n as u32), o.callers).await?;
    let plan = Arc::new(Plan::distinct(n));
    let what = ["commit-latency", "ours", "in-process"];
    let admissions = run(drivers, plan, what, n as i64, Some(o.rate), ui).await?;
    let admitted_end = Instant::now();
    let streams = OrderStreams::new(bench.redis.clone());
    let (poll, bar) = (Duration::from_millis(5), ProgressBar::hidden());
    let wait = wait_drained(&streams, std::slice::from_ref(&voucher.id), 0, poll, &bar);
    let drained = tokio::time::timeout(Duration::from_secs(60), wait).await;
    let drained_after = admitted_end.elapsed();
    // Still running (idle-polling) unless its time was up: no summary then.
    invocation.abort();
    let summary = invocation.await.ok();
    let mut conn = mysql(&bench.mysql_url).await?;
    let lat: Vec<i64> = conn
        .exec(
            "SELECT TIMESTAMPDIFF(MICROSECOND, admitted_at, created_at) FROM orders WHERE voucher_id = ?",
            (voucher.id.get(),),
        )
        .await
        .context("reading commit times")?;
    conn.disconnect().await.ok();
    let committed = lat.len() as u64;
    bench.release_voucher(voucher.id).await?;
    let mut checks = db_checks(bench, voucher.id, admissions.admitted, None).await?;
    checks.push(Check::new(
        "the invocation drained every admission",
        matches!(drained, Ok(Ok(()))),
        format!(
            "{committed} of {} admitted orders committed",
            admissions.admitted
        ),
    ));
    Ok(CommitLatencyReport {
        options: o.clone(),
        admissions,
        committed,
        latency: latency_of_values(lat.into_iter().map(|v| v.max(0) as u64)),
        drained_after_s: drained_after.as_secs_f64(),
        summary: summary.and_then(|s| serde_json::to_value(s).ok()),
        checks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(variant: &str, orders_per_s: f64) -> DrainRun {
        let elapsed = Duration::from_secs_f64(1000.0 / orders_per_s);
        DrainRun::new(variant, 1000, 1, 1000, elapsed, Vec::new())
    }

    fn round(ours: f64, floor: f64) -> FloorRound {
        FloorRound {
            floor_first: true,
            floor: run("db-floor", floor),
            ours: run("ours", ours),
        }
    }

    #[test]
    fn the_median_round_is_the_middle_ratio_not_the_middle_rate() {
        let report = DrainReport {
            // Ratios 0.5, 0.2, 0.9: the median is the first round, whereas the middle
            // floor rate (100) and the middle rate of ours (90) are other rounds'.
            floor_rounds: vec![round(100.0, 200.0), round(20.0, 100.0), round(90.0, 100.0)],
            ..DrainReport::default()
        };
        let m = report.median_round().expect("three rounds");
        assert!((m.ratio() - 0.5).abs() < 1e-9, "{}", m.ratio());
        assert_eq!(m.floor.orders_per_s.round(), 200.0);
        // Every round's two runs are listed (their checks count).
        assert_eq!(report.runs().count(), 6);
        let even = DrainReport {
            floor_rounds: vec![round(60.0, 100.0), round(40.0, 100.0)],
            ..DrainReport::default()
        };
        let m = even.median_round().expect("two rounds");
        assert!(
            (m.ratio() - 0.4).abs() < 1e-9,
            "the lower middle: {}",
            m.ratio()
        );
        assert!(DrainReport::default().median_round().is_none());
    }

    #[test]
    fn a_report_from_before_the_rounds_still_reads() {
        let floor = serde_json::to_value(run("db-floor", 100.0)).expect("a run");
        let old = serde_json::json!({
            "options": {"orders": 10, "batch_sizes": [5], "tutorial_orders": 1,
                        "floor_batch": 5, "baseline": true},
            "ours": [], "tutorial": null, "db_floor": floor
        });
        let report: DrainReport = serde_json::from_value(old).expect("old report");
        assert!(report.floor_rounds.is_empty() && report.median_round().is_none());
        assert_eq!(report.options.floor_rounds, 3);
        // Its one floor run is still listed, with its checks.
        let variants: Vec<&str> = report.runs().map(|r| r.variant.as_str()).collect();
        assert_eq!(variants, ["db-floor"]);
    }

    /// The rows the table shows for a drain: the floor row (and, with rounds, the rounds).
    fn floor_rows(drain: DrainReport) -> Vec<crate::report::Row> {
        let results = crate::report::Results {
            drain: Some(drain),
            ..crate::report::Results::default()
        };
        let rows = crate::report::rows(&results).into_iter();
        rows.filter(|r| r.what.contains("floor")).collect()
    }

    #[test]
    fn the_table_compares_the_median_round_or_an_old_report_s_one_floor_run() {
        let rounds = DrainReport {
            ours: vec![run("ours", 300.0)],
            floor_rounds: vec![round(100.0, 200.0), round(20.0, 100.0), round(90.0, 100.0)],
            ..DrainReport::default()
        };
        let rows = floor_rows(rounds);
        assert_eq!(rows.len(), 2, "{rows:?}");
        // The median round's ratio, not the sweep's best (300) against any floor.
        assert_eq!(
            (rows[0].ratio.as_str(), rows[0].met),
            ("0.50×", Some(false))
        );
        assert!(rows[0].what.contains("median of 3"), "{}", rows[0].what);
        assert!(rows[1].ours.starts_with("0.50× (100 vs 200, floor first)"));
        let old = DrainReport {
            ours: vec![run("ours", 300.0)],
            db_floor: Some(run("db-floor", 400.0)),
            ..DrainReport::default()
        };
        let rows = floor_rows(old);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!((rows[0].ratio.as_str(), rows[0].met), ("0.75×", Some(true)));
    }
}

//! Ours: one invocation of the real drain cycle in this process on streams filled by our
//! engine, and the watch that stops the clock once every order is committed and acked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use order_drainer::config::{MAX_BATCH_SIZE, defaults};
use order_drainer::{Config as DrainerConfig, Drainer};
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::config::{DataApiConfig, RedisConfig};
use seckill_shared::domain::{Voucher, VoucherId};

use super::checks::db_checks;
use super::results::DrainRun;
use crate::backends::Bench;
use crate::drivers::{Driver, many};
use crate::engine::{Ui, run};
use crate::record::Check;
use crate::workload::Plan;

/// A drainer of `vouchers` on the run's backends, with short idle polls, no safety
/// margin, and nothing claimed from another invocation during a run.
pub(super) async fn drainer(
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
/// orders done (`per` a sale) on `bar`.
pub(super) async fn wait_drained(
    streams: &OrderStreams,
    ids: &[VoucherId],
    per: u64,
    poll: Duration,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    // Each poll asks the sales still open one by one until it meets one not drained
    // yet, and stops there: a sale is asked again only while it is the first open one,
    // so with thousands of sales the watcher makes about one call per sale in all, not
    // one per sale per poll (which took a second per poll at 10,000 sales and competed
    // with the drain it measures).
    let (mut open, mut done) = (ids.to_vec(), 0);
    loop {
        let mut partly = 0;
        while let Some(&v) = open.last() {
            match streams.stats(v).await? {
                Some(st) if st.pending == 0 && st.undelivered == 0 && st.lag_exact => {
                    done += per;
                    open.pop();
                }
                other => {
                    partly = other.map_or(0, |st| {
                        st.length.saturating_sub(st.undelivered + st.pending)
                    });
                    break;
                }
            }
        }
        bar.set_position(done + partly);
        if open.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(poll).await;
    }
}

/// One invocation of ours draining `n` orders spread evenly over `sales` fresh sales (a
/// check records it when the invocation ends before they are drained).
pub(super) async fn drain_sales(
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

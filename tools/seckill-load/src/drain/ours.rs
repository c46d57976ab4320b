//! Ours: one invocation of the real drain cycle in this process on streams filled by our
//! engine, and the watch that stops the clock once every order is committed and acked.

use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use order_drainer::config::{MAX_BATCH_SIZE, defaults};
use order_drainer::{Config as DrainerConfig, Drainer};
use redis::AsyncCommands;
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::config::{DataApiConfig, RedisConfig};
use seckill_shared::domain::{Voucher, VoucherId};
use seckill_shared::keys::{self, VoucherKeys};

use super::checks::db_checks;
use super::results::{DrainRun, RunClock};
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
        stripe: None,
        events: None,
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

/// Sales the watcher asks at once.
const WATCH_IN_FLIGHT: usize = 64;

/// Whether `voucher`'s stream is drained (nothing pending, nothing undelivered), asked
/// with one call (XINFO GROUPS: the group's pending count and its lag), or with the
/// full [`OrderStreams::stats`] when Redis cannot say the lag exactly.
async fn drained(streams: &OrderStreams, voucher: VoucherId) -> anyhow::Result<bool> {
    let orders = VoucherKeys::new(voucher).orders;
    let groups: redis::streams::StreamInfoGroupsReply =
        streams.conn().clone().xinfo_groups(&orders).await?;
    let group = groups
        .groups
        .into_iter()
        .find(|g| g.name == keys::DRAIN_GROUP);
    Ok(match group {
        Some(g) if g.lag.is_some() => g.pending == 0 && g.lag == Some(0),
        _ => streams
            .stats(voucher)
            .await?
            .is_some_and(|st| st.pending == 0 && st.undelivered == 0 && st.lag_exact),
    })
}

/// Waits until no stream of `ids` has anything undelivered or pending, showing the
/// orders done (`per` a sale) on `bar`. Returns how many polls found a sale not drained
/// yet (0: all were drained at the first look).
pub(super) async fn wait_drained(
    streams: &OrderStreams,
    ids: &[VoucherId],
    per: u64,
    poll: Duration,
    bar: &ProgressBar,
) -> anyhow::Result<u32> {
    // Each poll asks the sales still open a chunk at a time ([`WATCH_IN_FLIGHT`] at
    // once, one call each) and stops at the first chunk that holds a sale not drained
    // yet, so a poll during a drain costs one chunk's calls.
    let mut open = ids.to_vec();
    let mut waits = 0;
    loop {
        while !open.is_empty() {
            let chunk: Vec<VoucherId> = open.iter().rev().take(WATCH_IN_FLIGHT).copied().collect();
            let states =
                futures::future::try_join_all(chunk.iter().map(|&v| drained(streams, v))).await?;
            let finished: Vec<VoucherId> = chunk
                .iter()
                .zip(&states)
                .filter(|(_, d)| **d)
                .map(|(v, _)| *v)
                .collect();
            open.retain(|v| !finished.contains(v));
            if finished.len() < chunk.len() {
                break;
            }
        }
        bar.set_position((ids.len() - open.len()) as u64 * per);
        if open.is_empty() {
            return Ok(waits);
        }
        waits += 1;
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
    let clock = RunClock::start();
    let start = clock.started;
    let watch = async {
        // The clock stops when the drainer has taken all `n` orders off the pending
        // lists (its own count, read in memory every millisecond); the streams are
        // asked only then, untimed, to confirm it. Asking the streams while the drain
        // ran (one call per sale, 10,000 at the largest size, and the first chunk not
        // drained again every 10 ms: about 12,000 calls) took Redis and client time
        // from the drain it measured. Should the streams disagree, the clock runs on
        // until they are drained and a check fails.
        while drainer.finished() < n {
            bar.set_position(drainer.finished());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let counted = clock.stop();
        let waits = wait_drained(&streams, &ids, per, Duration::from_millis(10), &bar).await?;
        anyhow::Ok(if waits == 0 {
            (counted, true)
        } else {
            (clock.stop(), false)
        })
    };
    let (stopped, summary, agreed) = tokio::select! {
        s = drainer.run(&consumer, start + ui.max_run) => (clock.stop(), Some(s), true),
        w = watch => {
            let (stopped, agreed) = w?;
            (stopped, None, agreed)
        }
    };
    bar.finish_and_clear();
    let mut checks = Vec::new();
    for &v in &ids {
        checks.extend(db_checks(bench, v, per, Some(0)).await?);
        bench.release_voucher(v).await?;
    }
    checks.push(Check::new(
        "every stream was drained once the drainer had finished every order",
        agreed,
        if agreed {
            String::new()
        } else {
            "the drainer counted every order finished before the streams were drained".into()
        },
    ));
    if let Some(s) = &summary {
        checks.push(Check::new(
            "the invocation drained everything before its time was up",
            false,
            format!("{s:?}"),
        ));
    }
    Ok(DrainRun {
        summary: summary.and_then(|s| serde_json::to_value(s).ok()),
        ..DrainRun::timed(variant, batch, sales, n, stopped, checks)
    })
}

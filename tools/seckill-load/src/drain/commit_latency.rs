//! Admission-to-commit latency: paced admissions through the in-process handler while
//! one drainer invocation runs, and the time from each admission to its commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;
use mysql_async::prelude::Queryable;
use seckill_cli::scratch_db::mysql;
use seckill_shared::adapters::order_stream::OrderStreams;

use super::checks::db_checks;
use super::ours::{drainer, wait_drained};
use super::results::{CommitLatencyOptions, CommitLatencyReport};
use crate::admission::ours_drivers;
use crate::backends::Bench;
use crate::engine::{Ui, run};
use crate::record::{Check, latency_of_values};
use crate::workload::Plan;

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
        matches!(drained, Ok(Ok(_))),
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

//! Runs one variant: `callers` tasks share a counter of attempts; each takes the next
//! attempt, makes it through its own [`Driver`] and records it in its own
//! [`Recorder`]. Closed loop (each caller waits for its answer before its next attempt)
//! unless a pace is given, in which case attempt `i` is not sent before `i / rate`
//! seconds after the start.
//!
//! Callers share the runtime's worker threads the way separate Lambda instances share
//! nothing, so a caller yields regularly even when its answers need no I/O (see the
//! loop). A progress bar (indicatif, on stderr, only on a terminal) shows attempts and
//! admissions while it runs. The run stops early when the shared stop flag is raised
//! (Ctrl-C) or its time limit passes: a load run is bounded in count and time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::try_join_all;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use seckill_shared::adapters::redis::RedisConn;

use crate::drivers::Driver;
use crate::record::{CpuSample, Outcome, Recorder, RunMeta, RunResult, merge};
use crate::redis_info::redis_infos;
use crate::workload::Plan;

/// How the run shows progress and when it must stop.
#[derive(Clone)]
pub struct Ui {
    pub progress: bool,
    /// Raised by Ctrl-C.
    pub stop: Arc<AtomicBool>,
    /// No run lasts longer than this.
    pub max_run: Duration,
    /// Where to read Redis's CPU time before and after each run (every primary's).
    pub redis_probe: Option<RedisConn>,
}

impl Ui {
    pub fn quiet() -> Ui {
        Ui {
            progress: false,
            stop: Arc::new(AtomicBool::new(false)),
            max_run: Duration::from_secs(600),
            redis_probe: None,
        }
    }

    /// A bar of `len` steps labelled `label` (hidden unless enabled and on a terminal).
    pub fn bar(&self, len: u64, label: &str) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(8));
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix:>22} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} {per_sec:>12} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(label.to_string());
        bar
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Runs `drivers` (one task each) over `plan`; `what` is the run's scenario, variant
/// and target, `stock` the units on sale.
pub async fn run(
    drivers: Vec<Driver>,
    plan: Arc<Plan>,
    what: [&str; 3],
    stock: i64,
    pace_per_s: Option<f64>,
    ui: &Ui,
) -> anyhow::Result<RunResult> {
    let [scenario, variant, target] = what;
    let meta = RunMeta {
        variant: variant.into(),
        target: target.into(),
        scenario: scenario.into(),
        callers: drivers.len(),
        planned: plan.attempts(),
        users: u64::from(plan.users()),
        stock: Some(stock),
    };
    let planned = plan.attempts();
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let bar = ui.bar(planned, &format!("{scenario} {variant}"));
    let ticker = {
        let (bar, done, admitted) = (bar.clone(), done.clone(), admitted.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(done.load(Ordering::Relaxed));
                bar.set_message(format!("admitted {}", admitted.load(Ordering::Relaxed)));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let cpu_before = cpu_sample(ui).await;
    let start = Instant::now();
    let deadline = start + ui.max_run;
    let tasks = drivers.into_iter().map(|mut driver| {
        let (next, done, admitted, plan, stop) = (
            next.clone(),
            done.clone(),
            admitted.clone(),
            plan.clone(),
            ui.stop.clone(),
        );
        tokio::spawn(async move {
            let mut rec = Recorder::new();
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= planned {
                    break;
                }
                if let Some(rate) = pace_per_s {
                    let due = start + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let user = plan.user(i);
                let t0 = Instant::now();
                let outcome = driver.attempt(user).await;
                let end = Instant::now();
                if matches!(outcome, Outcome::Admitted(_)) {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                rec.record(user, outcome, end - t0, end - start);
                done.fetch_add(1, Ordering::Relaxed);
                // An answer from the instance's memory never waits, so without this a
                // caller would hold its worker thread until its last attempt and starve
                // the callers (and Redis connection tasks) that do wait: every 128 steps
                // it yields, as a tokio resource would.
                tokio::task::coop::consume_budget().await;
            }
            (rec, driver)
        })
    });
    let (recorders, used): (Vec<_>, Vec<_>) = try_join_all(tasks.collect::<Vec<_>>())
        .await
        .context("a caller task panicked")?
        .into_iter()
        .unzip();
    let elapsed = start.elapsed();
    let cpu_after = cpu_sample(ui).await;
    // Connections close after the clock stopped.
    drop(used);
    ticker.abort();
    bar.finish_and_clear();
    let mut result = merge(meta, recorders, elapsed);
    result.cpu = Some(cpu_before.until(&cpu_after, result.completed));
    Ok(result)
}

async fn cpu_sample(ui: &Ui) -> CpuSample {
    match &ui.redis_probe {
        Some(conn) => CpuSample::take(
            &redis_infos(conn, "cpu").await,
            &redis_infos(conn, "commandstats").await,
        ),
        None => CpuSample::take(&[], &[]),
    }
}

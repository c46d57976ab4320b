//! Peak memory of the functions' release binaries, run as Lambda runs them.
//!
//! The real release binary (`target/release/seckill-http`, `target/release/order-drainer`)
//! is started with the run's backends in its environment and `AWS_LAMBDA_RUNTIME_API`
//! pointing at a minimal Lambda Runtime API of its own on loopback (one axum fallback
//! route), which hands it one invocation at a time, as one Lambda instance gets them. Its peak
//! resident memory (`VmHWM` of `/proc/<pid>/status`) is read before it is stopped.
//!
//! seckill-http gets `requests` admissions of distinct users; order-drainer one
//! EventBridge scheduled event while `orders` admitted orders wait in its stream.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use indicatif::ProgressBar;
use seckill_shared::domain::now_millis;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::backends::Bench;
use crate::drivers::seckill_event;
use crate::engine::Ui;
use crate::record::{Latency, latency_of_values};

#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct FootprintOptions {
    /// The seckill-http release binary
    #[arg(long, default_value = "target/release/seckill-http")]
    pub http_bin: PathBuf,
    /// The order-drainer release binary
    #[arg(long, default_value = "target/release/order-drainer")]
    pub drainer_bin: PathBuf,
    /// Admissions sent to seckill-http
    #[arg(long, default_value_t = 20_000)]
    pub requests: u64,
    /// Orders waiting for the drainer's invocation
    #[arg(
        id = "footprint_orders",
        long = "footprint-orders",
        default_value_t = 20_000
    )]
    pub orders: u64,
}

/// One binary's size and memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BinaryFootprint {
    pub name: String,
    pub size_bytes: u64,
    /// Peak resident set (VmHWM) after the workload.
    pub peak_rss_kib: Option<u64>,
    pub rss_kib: Option<u64>,
    /// What it ran.
    pub workload: String,
    /// Invocations per second through the runtime API (one at a time).
    pub invocations_per_s: Option<f64>,
    /// Per-invocation latency as the runtime API sees it.
    pub latency: Option<Latency>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FootprintReport {
    pub options: FootprintOptions,
    pub binaries: Vec<BinaryFootprint>,
}

/// Sizes and peak memory of both functions.
pub async fn footprint(
    bench: &Bench,
    o: &FootprintOptions,
    ui: &Ui,
) -> anyhow::Result<FootprintReport> {
    for bin in [&o.http_bin, &o.drainer_bin] {
        anyhow::ensure!(
            bin.is_file(),
            "{} is missing: build the functions first (cargo build --release -p seckill-http -p order-drainer)",
            bin.display()
        );
    }
    let mut binaries = Vec::new();
    // seckill-http: `requests` admissions of distinct users.
    let voucher = bench
        .voucher("bench footprint", o.requests.max(1) as i64)
        .await?;
    let tokens = bench.tokens(o.requests as u32);
    let mut env = base_env(bench, "seckill-http");
    env.push(("SECKILL_DEV_JWT_SECRET", bench.jwt_secret()));
    // A local emulator of Lambda, as the stack's: the function refuses the dev secret
    // inside Lambda otherwise.
    env.push(("SECKILL_DEV_JWT_IN_LAMBDA", "allow".into()));
    let events = (0..o.requests as u32).map(|i| {
        let auth = tokens.header(i).to_str().unwrap_or_default();
        seckill_event(voucher.id, Some(auth)).to_string()
    });
    let bar = ui.bar(o.requests, "footprint seckill-http");
    let workload = format!("{} admissions, one at a time", o.requests);
    let run = run_function(&o.http_bin, "seckill-http", workload, env, events, bar).await;
    bench.release_voucher(voucher.id).await?;
    let (footprint, responses) = run?;
    let admitted = responses
        .iter()
        .filter(|r| r["statusCode"].as_u64() == Some(202))
        .count() as u64;
    anyhow::ensure!(
        admitted == o.requests,
        "seckill-http admitted {admitted} of {} requests",
        o.requests
    );
    binaries.push(footprint);
    // order-drainer: one invocation while `orders` orders wait in its stream.
    let voucher = crate::drain::filled(bench, "bench footprint drain", o.orders, ui).await?;
    let mut env = base_env(bench, "order-drainer");
    env.push(("DRAINER_VOUCHERS", voucher.id.to_string()));
    // Long enough to drain them all (at a few thousand orders per second); the
    // invocation then idles until this is up.
    env.push(("DRAINER_MAX_RUN_MS", (3_000 + o.orders / 2).to_string()));
    env.push(("DRAINER_MIN_IDLE_MS", "120000".into()));
    // Any JSON will do (the event carries no input): the fixture `cargo lambda invoke` sends.
    let event = include_str!("../../../tests/fixtures/eventbridge-scheduled.json");
    let workload = format!("one invocation draining {} orders", o.orders);
    let events = [event.to_string()];
    let bar = ProgressBar::hidden();
    let run = run_function(&o.drainer_bin, "order-drainer", workload, env, events, bar).await;
    bench.release_voucher(voucher.id).await?;
    let (footprint, responses) = run?;
    let inserted = responses[0]["inserted"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        inserted == o.orders,
        "the drainer invocation inserted {inserted} of {} orders: {}",
        o.orders,
        responses[0]
    );
    binaries.push(BinaryFootprint {
        invocations_per_s: None,
        ..footprint
    });
    for b in &binaries {
        eprintln!(
            "  footprint {}: {:.2} MiB, peak RSS {} KiB, {}",
            b.name,
            b.size_bytes as f64 / 1048576.0,
            b.peak_rss_kib.map_or("n/a".into(), |k| k.to_string()),
            b.workload
        );
    }
    Ok(FootprintReport {
        options: o.clone(),
        binaries,
    })
}

/// The environment both functions get, as the SAM template and the local stack give it.
fn base_env(bench: &Bench, name: &str) -> Vec<(&'static str, String)> {
    let h = &bench.http;
    let mut env = vec![
        ("AWS_LAMBDA_FUNCTION_NAME", name.to_string()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".into()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128".into()),
        ("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}")),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "bench".into()),
        ("AWS_LAMBDA_LOG_FORMAT", "JSON".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "local".into()),
        ("AWS_SECRET_ACCESS_KEY", "local".into()),
        ("RUST_LOG", "info".into()),
        ("REDIS_URL", h.redis.url.clone()),
        ("REDIS_CLUSTER", h.redis.cluster.to_string()),
        ("DB_CLUSTER_ARN", h.data_api.cluster_arn.clone()),
        ("DB_SECRET_ARN", h.data_api.secret_arn.clone()),
        ("DB_NAME", h.data_api.database.clone()),
    ];
    env.extend(h.data_api.endpoint.clone().map(|e| ("DATA_API_URL", e)));
    env
}

const ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:bench";
const TRACE_ID: &str = "Root=1-00000000-000000000000000000000000;Parent=0000000000000000;Sampled=0";

/// Runs `bin` under a runtime API of its own on a free loopback port, hands it `events`
/// one at a time, and returns its footprint after them and their responses.
async fn run_function(
    bin: &Path,
    name: &str,
    workload: String,
    mut env: Vec<(&str, String)>,
    events: impl IntoIterator<Item = String>,
    bar: ProgressBar,
) -> anyhow::Result<(BinaryFootprint, Vec<Value>)> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    env.push(("AWS_LAMBDA_RUNTIME_API", listener.local_addr()?.to_string()));
    // Every request of its runtime client (path, body, where the reply goes) goes to the
    // loop below, which answers it.
    let (calls_tx, mut calls) = mpsc::channel::<(String, Bytes, oneshot::Sender<Response>)>(1);
    let api = axum::Router::new().fallback(move |uri: http::Uri, body: Bytes| async move {
        let (reply, rx) = oneshot::channel();
        let _ = calls_tx.send((uri.path().into(), body, reply)).await;
        rx.await.map_err(|_| http::StatusCode::SERVICE_UNAVAILABLE)
    });
    let server = tokio::spawn(axum::serve(listener, api).into_future());
    let log = std::env::temp_dir().join(format!("seckill-load-{name}-{}.log", std::process::id()));
    let file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = tokio::process::Command::new(bin)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    // The tail of its log, for error messages.
    let log_tail = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    let (mut latencies, mut responses) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let invocations = async {
        for (n, event) in events.into_iter().enumerate() {
            let t0 = Instant::now();
            // `GET .../invocation/next` gets the event with the headers the runtime
            // client reads; then comes its `POST .../response` (or an error).
            let headers = [
                ("lambda-runtime-aws-request-id", format!("bench-{n:08}")),
                (
                    "lambda-runtime-deadline-ms",
                    (now_millis() + 60_000).to_string(),
                ),
                ("lambda-runtime-invoked-function-arn", ARN.into()),
                ("lambda-runtime-trace-id", TRACE_ID.into()),
                ("content-type", "application/json".into()),
            ];
            let mut next = Some((headers, event).into_response());
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            let response = loop {
                let (path, body, reply) = tokio::select! {
                    call = calls.recv() => call.context("the runtime API stopped")?,
                    status = child.wait() => {
                        bail!("the function exited ({status:?}); its log:\n{}", log_tail())
                    }
                    _ = tokio::time::sleep_until(deadline) => {
                        bail!("an invocation took over 120 s; the function's log:\n{}", log_tail())
                    }
                };
                if path.ends_with("/invocation/next") {
                    let event = next
                        .take()
                        .context("the function asked for a second event")?;
                    let _ = reply.send(event);
                    continue;
                }
                let _ = reply.send(http::StatusCode::ACCEPTED.into_response());
                if path.ends_with("/response") {
                    break serde_json::from_slice::<Value>(&body)
                        .context("the response is not JSON")?;
                }
                bail!(
                    "the invocation failed: {}; the function's log:\n{}",
                    String::from_utf8_lossy(&body),
                    log_tail()
                )
            };
            latencies.push(t0.elapsed().as_micros() as u64);
            responses.push(response);
            bar.inc(1);
        }
        anyhow::Ok(())
    }
    .await;
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let status = child
        .id()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    // Our own child, by its handle; the server goes with it.
    let _ = child.start_kill();
    server.abort();
    let _ = std::fs::remove_file(&log);
    invocations?;
    let footprint = BinaryFootprint {
        name: name.into(),
        size_bytes: std::fs::metadata(bin)?.len(),
        peak_rss_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
        workload,
        invocations_per_s: Some(responses.len() as f64 / elapsed.as_secs_f64().max(1e-9)),
        latency: Some(latency_of_values(latencies)),
    };
    Ok((footprint, responses))
}

//! Peak memory of the functions' release binaries, run as Lambda runs them.
//!
//! The real release binary (`target/release/seckill-http`, `target/release/order-drainer`)
//! is started with the run's backends in its environment and `AWS_LAMBDA_RUNTIME_API`
//! pointing at a Lambda Runtime API of its own on loopback, which hands it one
//! invocation at a time, as one Lambda instance gets them. Its peak resident memory
//! (`VmHWM` of `/proc/<pid>/status`) is read before it is stopped.
//!
//! seckill-http gets `requests` admissions of distinct users; order-drainer one
//! EventBridge scheduled event while `orders` admitted orders wait in its stream.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, mpsc};

use crate::backends::Bench;
use crate::drivers::seckill_event;
use crate::engine::Ui;
use crate::record::{Latency, latency_of_values};
use crate::workload::Tokens;

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
        if !bin.is_file() {
            bail!(
                "{} is missing: build the functions first (cargo build --release -p seckill-http -p order-drainer)",
                bin.display()
            );
        }
    }
    let binaries = vec![
        http_footprint(bench, o, ui).await?,
        drainer_footprint(bench, o, ui).await?,
    ];
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
fn base_env(bench: &Bench, name: &str) -> HashMap<String, String> {
    let h = &bench.http;
    let mut env: HashMap<String, String> = [
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
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(e) = &h.data_api.endpoint {
        env.insert("DATA_API_URL".into(), e.clone());
    }
    env
}

async fn http_footprint(
    bench: &Bench,
    o: &FootprintOptions,
    ui: &Ui,
) -> anyhow::Result<BinaryFootprint> {
    let voucher = bench
        .voucher("bench footprint", o.requests.max(1) as i64, false)
        .await?;
    let secret = format!("{:032x}", rand::random::<u128>());
    let tokens = Tokens::mint(secret.as_bytes(), o.requests as u32);
    let mut env = base_env(bench, "seckill-http");
    env.insert("SECKILL_DEV_JWT_SECRET".into(), secret);
    // A local emulator of Lambda, as the stack's: the function refuses the dev secret
    // inside Lambda otherwise.
    env.insert("SECKILL_DEV_JWT_IN_LAMBDA".into(), "allow".into());
    let mut f = Function::start(&o.http_bin, env).await?;
    let bar = ui.bar(o.requests, "footprint seckill-http");
    let mut lat = Vec::with_capacity(o.requests as usize);
    let start = Instant::now();
    let mut admitted = 0u64;
    for i in 0..o.requests as u32 {
        let auth = tokens.header(i).to_str().unwrap_or_default();
        let event = seckill_event(voucher.id, Some(auth)).to_string();
        let t0 = Instant::now();
        let res = f.invoke(event).await?;
        lat.push(t0.elapsed().as_micros() as u64);
        admitted += u64::from(res["statusCode"].as_u64() == Some(202));
        bar.set_position(u64::from(i) + 1);
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let footprint = f.finish(
        "seckill-http",
        format!("{} admissions, one at a time", o.requests),
    );
    bench.release_voucher(voucher.id).await?;
    anyhow::ensure!(
        admitted == o.requests,
        "seckill-http admitted {admitted} of {} requests",
        o.requests
    );
    Ok(BinaryFootprint {
        invocations_per_s: Some(o.requests as f64 / elapsed.as_secs_f64().max(1e-9)),
        latency: Some(latency_of_values(lat)),
        ..footprint?
    })
}

async fn drainer_footprint(
    bench: &Bench,
    o: &FootprintOptions,
    ui: &Ui,
) -> anyhow::Result<BinaryFootprint> {
    let voucher = bench
        .voucher("bench footprint drain", o.orders.max(1) as i64, false)
        .await?;
    crate::drain::fill(bench, &voucher, o.orders, ui).await?;
    let mut env = base_env(bench, "order-drainer");
    env.insert("DRAINER_VOUCHERS".into(), voucher.id.to_string());
    // Long enough to drain them all (at a few thousand orders per second); the
    // invocation then idles until this is up.
    env.insert(
        "DRAINER_MAX_RUN_MS".into(),
        (3_000 + o.orders / 2).to_string(),
    );
    env.insert("DRAINER_MIN_IDLE_MS".into(), "120000".into());
    let mut f = Function::start(&o.drainer_bin, env).await?;
    let event = serde_json::json!({
        "version": "0",
        "id": "bench",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": format_rfc3339_millis(now_millis()),
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/seckill-drain"],
        "detail": {}
    });
    let t0 = Instant::now();
    let res = f.invoke(event.to_string()).await;
    let took = t0.elapsed();
    let footprint = f.finish(
        "order-drainer",
        format!("one invocation draining {} orders", o.orders),
    );
    bench.release_voucher(voucher.id).await?;
    let res = res?;
    let inserted = res["inserted"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        inserted == o.orders,
        "the drainer invocation inserted {inserted} of {} orders: {res}",
        o.orders
    );
    Ok(BinaryFootprint {
        latency: Some(latency_of_values([took.as_micros() as u64])),
        ..footprint?
    })
}

/// A function process and the Lambda Runtime API that feeds it, one invocation at a
/// time: `next` hands out the one event waiting in `events`, and the function's
/// response (or error) comes back through `replies`.
struct Function {
    bin: PathBuf,
    child: tokio::process::Child,
    log: PathBuf,
    events: mpsc::Sender<String>,
    replies: mpsc::Receiver<Result<Bytes, Bytes>>,
    server: tokio::task::JoinHandle<()>,
}

/// The Runtime API's side of the two channels.
struct RuntimeApi {
    events: Mutex<mpsc::Receiver<String>>,
    replies: mpsc::Sender<Result<Bytes, Bytes>>,
    invocations: AtomicU64,
}

impl Function {
    /// Starts the Runtime API on a free loopback port, then `bin` pointing at it.
    async fn start(bin: &Path, mut env: HashMap<String, String>) -> anyhow::Result<Function> {
        let (events, events_rx) = mpsc::channel(1);
        let (replies_tx, replies) = mpsc::channel(1);
        let api = Arc::new(RuntimeApi {
            events: Mutex::new(events_rx),
            replies: replies_tx,
            invocations: AtomicU64::new(0),
        });
        let reply = |ok: bool| {
            move |State(api): State<Arc<RuntimeApi>>, body: Bytes| async move {
                let _ = api
                    .replies
                    .send(if ok { Ok(body) } else { Err(body) })
                    .await;
                StatusCode::ACCEPTED
            }
        };
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(reply(true)),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post(reply(false)),
            )
            .route("/2018-06-01/runtime/init/error", post(reply(false)))
            .with_state(api);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        env.insert(
            "AWS_LAMBDA_RUNTIME_API".into(),
            listener.local_addr()?.to_string(),
        );
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let name = bin
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("function");
        let log =
            std::env::temp_dir().join(format!("seckill-load-{name}-{}.log", std::process::id()));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = tokio::process::Command::new(bin)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        Ok(Function {
            bin: bin.to_path_buf(),
            child,
            log,
            events,
            replies,
            server,
        })
    }

    /// Invokes the function with `event` and returns its JSON response.
    async fn invoke(&mut self, event: String) -> anyhow::Result<serde_json::Value> {
        self.events
            .send(event)
            .await
            .map_err(|_| anyhow::anyhow!("the runtime API stopped"))?;
        let reply = tokio::select! {
            r = self.replies.recv() => r.context("the runtime API stopped")?,
            status = self.child.wait() => {
                bail!("the function exited ({status:?}); its log:\n{}", self.log_tail())
            }
            _ = tokio::time::sleep(Duration::from_secs(120)) => {
                bail!("an invocation took over 120 s; the function's log:\n{}", self.log_tail())
            }
        };
        match reply {
            Ok(body) => serde_json::from_slice(&body).context("the response is not JSON"),
            Err(body) => bail!(
                "the invocation failed: {}; the function's log:\n{}",
                String::from_utf8_lossy(&body),
                self.log_tail()
            ),
        }
    }

    /// The tail of its log, for error messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Reads the binary's size and the process's memory (VmHWM, VmRSS), then stops it.
    fn finish(mut self, name: &str, workload: String) -> anyhow::Result<BinaryFootprint> {
        let status = self
            .child
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
        let _ = self.child.start_kill();
        self.server.abort();
        let _ = std::fs::remove_file(&self.log);
        Ok(BinaryFootprint {
            name: name.into(),
            size_bytes: std::fs::metadata(&self.bin)?.len(),
            peak_rss_kib: kib("VmHWM:"),
            rss_kib: kib("VmRSS:"),
            workload,
            invocations_per_s: None,
            latency: None,
        })
    }
}

/// `GET .../invocation/next`: waits for the next event and hands it out with the
/// headers the runtime client reads.
async fn next(State(api): State<Arc<RuntimeApi>>) -> Response {
    let Some(event) = api.events.lock().await.recv().await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let n = api.invocations.fetch_add(1, Ordering::Relaxed);
    let headers = [
        ("lambda-runtime-aws-request-id", format!("bench-{n:08}")),
        (
            "lambda-runtime-deadline-ms",
            (now_millis() + 60_000).to_string(),
        ),
        (
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:us-east-1:123456789012:function:bench".into(),
        ),
        (
            "lambda-runtime-trace-id",
            "Root=1-00000000-000000000000000000000000;Parent=0000000000000000;Sampled=0".into(),
        ),
        ("content-type", "application/json".into()),
    ];
    (headers, event).into_response()
}

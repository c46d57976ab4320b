//! Peak memory of the functions' release binaries, run as Lambda runs them.
//!
//! A minimal Lambda Runtime API (`/2018-06-01/runtime/invocation/next`, `.../response`,
//! `.../error`, `/runtime/init/error`) listens on loopback; the real release binary
//! (`target/release/seckill-http`, `target/release/order-drainer`) is started with
//! `AWS_LAMBDA_RUNTIME_API` pointing at it and the run's backends in its environment,
//! and is fed invocations one at a time, as one Lambda instance is. Its peak resident
//! memory (`VmHWM` of `/proc/<pid>/status`) is read before it is stopped.
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
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, mpsc, oneshot};

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
    pub path: String,
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
    /// The last response (the drainer's summary).
    pub last_response: Option<serde_json::Value>,
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
    let http = http_footprint(bench, o, ui).await?;
    let drainer = drainer_footprint(bench, o, ui).await?;
    Ok(FootprintReport {
        options: o.clone(),
        binaries: vec![http, drainer],
    })
}

/// The environment both functions get, as the SAM template and the local stack give it.
fn base_env(bench: &Bench, runtime_api: &str, name: &str) -> HashMap<String, String> {
    let h = &bench.http;
    let mut env: HashMap<String, String> = [
        ("AWS_LAMBDA_RUNTIME_API", runtime_api.to_string()),
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
    let runtime = RuntimeApi::start().await?;
    let mut env = base_env(bench, &runtime.addr, "seckill-http");
    env.insert("SECKILL_DEV_JWT_SECRET".into(), secret);
    // A local emulator of Lambda, as the stack's: the function refuses the dev secret
    // inside Lambda otherwise.
    env.insert("SECKILL_DEV_JWT_IN_LAMBDA".into(), "allow".into());
    let mut child = Function::start(&o.http_bin, &env)?;
    let bar = ui.bar(o.requests, "footprint seckill-http");
    let mut lat = Vec::with_capacity(o.requests as usize);
    let start = Instant::now();
    let mut admitted = 0u64;
    for i in 0..o.requests as u32 {
        let auth = tokens.header(i).to_str().unwrap_or_default().to_string();
        let event = seckill_event(voucher.id, Some(&auth)).to_string();
        let t0 = Instant::now();
        let res = runtime.invoke(event, &mut child).await?;
        lat.push(t0.elapsed().as_micros() as u64);
        if res
            .get("statusCode")
            .and_then(|s| s.as_u64())
            .is_some_and(|s| s == 202)
        {
            admitted += 1;
        }
        bar.set_position(u64::from(i) + 1);
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let (peak, rss) = child.memory();
    child.stop().await;
    bench.release_voucher(voucher.id).await?;
    anyhow::ensure!(
        admitted == o.requests,
        "seckill-http admitted {admitted} of {} requests",
        o.requests
    );
    Ok(BinaryFootprint {
        name: "seckill-http".into(),
        path: o.http_bin.display().to_string(),
        size_bytes: std::fs::metadata(&o.http_bin)?.len(),
        peak_rss_kib: peak,
        rss_kib: rss,
        workload: format!("{} admissions, one at a time", o.requests),
        invocations_per_s: Some(o.requests as f64 / elapsed.as_secs_f64().max(1e-9)),
        latency: Some(latency_of_values(lat)),
        last_response: None,
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
    let runtime = RuntimeApi::start().await?;
    let mut env = base_env(bench, &runtime.addr, "order-drainer");
    env.insert("DRAINER_VOUCHERS".into(), voucher.id.to_string());
    // Long enough to drain them all (at a few thousand orders per second); the
    // invocation then idles until this is up.
    env.insert(
        "DRAINER_MAX_RUN_MS".into(),
        (3_000 + o.orders / 2).to_string(),
    );
    env.insert("DRAINER_MIN_IDLE_MS".into(), "120000".into());
    let mut child = Function::start(&o.drainer_bin, &env)?;
    let event = serde_json::json!({
        "version": "0",
        "id": "bench",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": seckill_shared::domain::format_rfc3339_millis(seckill_shared::domain::now_millis()),
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/seckill-drain"],
        "detail": {}
    });
    let t0 = Instant::now();
    let res = runtime.invoke(event.to_string(), &mut child).await?;
    let took = t0.elapsed();
    let (peak, rss) = child.memory();
    child.stop().await;
    bench.release_voucher(voucher.id).await?;
    let inserted = res.get("inserted").and_then(|v| v.as_u64()).unwrap_or(0);
    anyhow::ensure!(
        inserted == o.orders,
        "the drainer invocation inserted {inserted} of {} orders: {res}",
        o.orders
    );
    Ok(BinaryFootprint {
        name: "order-drainer".into(),
        path: o.drainer_bin.display().to_string(),
        size_bytes: std::fs::metadata(&o.drainer_bin)?.len(),
        peak_rss_kib: peak,
        rss_kib: rss,
        workload: format!("one invocation draining {} orders", o.orders),
        invocations_per_s: None,
        latency: Some(latency_of_values([took.as_micros() as u64])),
        last_response: Some(res),
    })
}

/// A function process.
struct Function {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Function {
    fn start(bin: &Path, env: &HashMap<String, String>) -> anyhow::Result<Function> {
        let log = std::env::temp_dir().join(format!(
            "seckill-load-{}-{}.log",
            bin.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("function"),
            std::process::id()
        ));
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
        Ok(Function { child, log })
    }

    /// (VmHWM, VmRSS) in KiB.
    fn memory(&self) -> (Option<u64>, Option<u64>) {
        let Some(pid) = self.child.id() else {
            return (None, None);
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    /// The tail of its log, for error messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    async fn stop(mut self) {
        // Our own child, by its handle.
        let _ = self.child.kill().await;
        let _ = std::fs::remove_file(&self.log);
    }
}

type Reply = Result<Bytes, Bytes>;

struct RuntimeState {
    queue: Mutex<mpsc::Receiver<(String, String)>>,
    waiting: Mutex<HashMap<String, oneshot::Sender<Reply>>>,
}

/// A Lambda Runtime API on loopback, one function process at a time.
struct RuntimeApi {
    addr: String,
    send: mpsc::Sender<(String, String)>,
    state: Arc<RuntimeState>,
    counter: AtomicU64,
    server: tokio::task::JoinHandle<()>,
}

impl RuntimeApi {
    async fn start() -> anyhow::Result<RuntimeApi> {
        let (send, recv) = mpsc::channel(1);
        let state = Arc::new(RuntimeState {
            queue: Mutex::new(recv),
            waiting: Mutex::new(HashMap::new()),
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?.to_string();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(RuntimeApi {
            addr,
            send,
            state,
            counter: AtomicU64::new(0),
            server,
        })
    }

    /// Invokes the function with `event` and returns its JSON response.
    async fn invoke(&self, event: String, f: &mut Function) -> anyhow::Result<serde_json::Value> {
        let id = format!("bench-{:08}", self.counter.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.state.waiting.lock().await.insert(id.clone(), tx);
        self.send
            .send((id.clone(), event))
            .await
            .map_err(|_| anyhow::anyhow!("the runtime API stopped"))?;
        let reply = tokio::select! {
            r = rx => r.map_err(|_| anyhow::anyhow!("invocation {id} got no answer"))?,
            status = f.child.wait() => {
                bail!("the function exited ({status:?}); its log:\n{}", f.log_tail())
            }
            _ = tokio::time::sleep(Duration::from_secs(120)) => {
                bail!("invocation {id} took over 120 s; the function's log:\n{}", f.log_tail())
            }
        };
        match reply {
            Ok(body) => serde_json::from_slice(&body)
                .with_context(|| format!("the response of {id} is not JSON")),
            Err(body) => bail!(
                "invocation {id} failed: {}; the function's log:\n{}",
                String::from_utf8_lossy(&body),
                f.log_tail()
            ),
        }
    }
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn next(State(s): State<Arc<RuntimeState>>) -> (StatusCode, HeaderMap, String) {
    let item = s.queue.lock().await.recv().await;
    let Some((id, event)) = item else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            HeaderMap::new(),
            String::new(),
        );
    };
    let mut h = HeaderMap::new();
    let deadline = (seckill_shared::domain::now_millis() + 60_000).to_string();
    let pairs = [
        ("lambda-runtime-aws-request-id", id),
        ("lambda-runtime-deadline-ms", deadline),
        (
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:us-east-1:123456789012:function:bench".to_string(),
        ),
        (
            "lambda-runtime-trace-id",
            "Root=1-00000000-000000000000000000000000;Parent=0000000000000000;Sampled=0".into(),
        ),
        ("content-type", "application/json".into()),
    ];
    for (k, v) in pairs {
        if let Ok(v) = HeaderValue::try_from(v) {
            h.insert(k, v);
        }
    }
    (StatusCode::OK, h, event)
}

async fn response(
    State(s): State<Arc<RuntimeState>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    if let Some(tx) = s.waiting.lock().await.remove(&id) {
        let _ = tx.send(Ok(body));
    }
    StatusCode::ACCEPTED
}

async fn error(
    State(s): State<Arc<RuntimeState>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    if let Some(tx) = s.waiting.lock().await.remove(&id) {
        let _ = tx.send(Err(body));
    }
    StatusCode::ACCEPTED
}

async fn init_error(body: Bytes) -> StatusCode {
    eprintln!("function init error: {}", String::from_utf8_lossy(&body));
    StatusCode::ACCEPTED
}

//! `seckill-load flood`: Stripe's real events beside a flood of junk at
//! `POST /payments/stripe`, over real HTTP through a local API Gateway, measured three
//! ways in one run: no junk (the baseline), junk against the route's ceiling as the
//! template sets it now (the stack's gateway), and junk against the old ceiling of
//! 100 requests a second (a gateway of its own, started here with that throttle).
//!
//! A real event is what Stripe sends for a PaymentIntent that checkout created for an
//! admitted order, signed with the stack's `STRIPE_WEBHOOK_SECRET`; it is applied in time
//! when its first delivery is answered `200 paid` (Stripe resends a throttled or failed
//! delivery only minutes later, past a short payment window). Junk is what an attacker
//! can send without the secret: a plausible body and a well-formed signature that
//! matches nothing (each costs the function one HMAC of the body). The table prints, per
//! row, the real events applied in time, their latency (p50, p99, max) and its ratio to
//! the baseline's, and what the junk got.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use seckill_cli::stack_env::StackEnv;
use seckill_shared::auth::{ADMIN_SCOPE, mint_hs256};
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use seckill_shared::webhook::{self, Secrets};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// The flood's size and pace.
#[derive(Debug, Clone, clap::Args)]
pub struct FloodOptions {
    /// Real events per row (one admitted, checked-out order each)
    #[arg(long, default_value_t = 100)]
    pub events: u32,
    /// Real events sent per second
    #[arg(long, default_value_t = 20)]
    pub event_rate: u32,
    /// Junk requests per second at the route, beside them
    #[arg(long, default_value_t = 1_000)]
    pub junk_rate: u32,
    /// The route's old ceiling (requests per second, burst), for the "before" row
    #[arg(long, default_value_t = 100)]
    pub old_rate: u32,
    #[arg(long, default_value_t = 200)]
    pub old_burst: u32,
    /// Where the old-ceiling gateway listens
    #[arg(long, default_value_t = 19_190)]
    pub old_port: u16,
}

/// One row of the table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FloodRow {
    pub name: String,
    pub events: u32,
    /// First deliveries answered `200 paid`.
    pub applied: u32,
    /// Answers of the other first deliveries (`429`, ...), by status.
    pub not_applied: BTreeMap<String, u32>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Junk requests sent, and their answers by status.
    pub junk_sent: u64,
    pub junk_answers: BTreeMap<String, u64>,
}

/// The three rows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FloodReport {
    pub rows: Vec<FloodRow>,
}

impl FloodReport {
    /// The table, with each row's p99 against the baseline's.
    pub fn render(&self) -> String {
        let base = self.rows.first().map_or(1.0, |r| r.p99_ms.max(0.001));
        let mut out = format!(
            "{:<52} {:>9} {:>8} {:>8} {:>8} {:>9}  junk answers\n",
            "row", "applied", "p50 ms", "p99 ms", "max ms", "p99 ratio"
        );
        for r in &self.rows {
            let (p50, p99, max, ratio) = match r.applied {
                0 => ("-".into(), "-".into(), "-".into(), "-".into()),
                _ => (
                    format!("{:.1}", r.p50_ms),
                    format!("{:.1}", r.p99_ms),
                    format!("{:.1}", r.max_ms),
                    format!("{:.2}x", r.p99_ms / base),
                ),
            };
            out.push_str(&format!(
                "{:<52} {:>4}/{:<4} {:>8} {:>8} {:>8} {:>9}  {:?} of {}\n",
                r.name, r.applied, r.events, p50, p99, max, ratio, r.junk_answers, r.junk_sent
            ));
        }
        out
    }
}

struct Stack {
    http: reqwest::Client,
    url: String,
    jwt: String,
    whsec: Secrets,
}

/// Runs the three rows against the stack in `env` (its gateway, seckill-http and
/// localstripe), starting the old-ceiling gateway itself.
pub async fn flood(env: &StackEnv, o: &FloodOptions) -> anyhow::Result<FloodReport> {
    let stack = Stack {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(512)
            .build()?,
        url: env.get("SECKILL_HTTP_URL")?,
        jwt: env.get("SECKILL_DEV_JWT_SECRET")?,
        whsec: Secrets::parse(&env.get("STRIPE_WEBHOOK_SECRET")?)
            .map_err(|e| anyhow::anyhow!("STRIPE_WEBHOOK_SECRET: {e}"))?,
    };
    let lambda = env.get("SECKILL_LAMBDA_URL")?;
    let lambda = lambda
        .split("/lambda-url/")
        .next()
        .unwrap_or(&lambda)
        .to_string();
    let old = OldGateway::start(&lambda, o)?;
    let mut report = FloodReport::default();
    for (name, url, junk) in [
        ("no junk (baseline)".to_string(), stack.url.clone(), 0),
        (
            format!(
                "{} junk/s, the ceiling as the template sets it",
                o.junk_rate
            ),
            stack.url.clone(),
            o.junk_rate,
        ),
        (
            format!(
                "{} junk/s, the old ceiling ({}/s, burst {})",
                o.junk_rate, o.old_rate, o.old_burst
            ),
            old.url.clone(),
            o.junk_rate,
        ),
    ] {
        let events = prepare(&stack, o.events, &name).await?;
        report
            .rows
            .push(row(&stack, &url, &name, events, junk, o).await?);
    }
    Ok(report)
}

/// A gateway of its own with the old ceiling on `POST /payments/stripe`, stopped when
/// dropped.
struct OldGateway {
    child: Child,
    url: String,
}

impl OldGateway {
    fn start(lambda: &str, o: &FloodOptions) -> anyhow::Result<OldGateway> {
        let exe = std::env::current_exe()?;
        let bin = exe
            .parent()
            .context("the tool's folder")?
            .join("api-gateway-local");
        let child = Command::new(&bin)
            .args(["--listen", &format!("127.0.0.1:{}", o.old_port)])
            .args(["--lambda", lambda, "--function", "seckill-http"])
            .arg("--route-throttle")
            .arg(format!(
                "POST /payments/stripe={},{}",
                o.old_rate, o.old_burst
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (cargo build --workspace --bins)",
                    bin.display()
                )
            })?;
        let url = format!("http://127.0.0.1:{}", o.old_port);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", o.old_port)).is_ok() {
                return Ok(OldGateway { child, url });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the old-ceiling gateway did not listen on {url}")
    }
}

impl Drop for OldGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A voucher of `n` units with a price, `n` buyers admitted and checked out: each
/// order's PaymentIntent as Stripe would send it once paid.
async fn prepare(s: &Stack, n: u32, name: &str) -> anyhow::Result<Vec<Value>> {
    let token = |sub: &str, admin: bool| {
        mint_hs256(
            s.jwt.as_bytes(),
            sub,
            admin.then_some(ADMIN_SCOPE),
            now_millis() / 1000 + 3600,
        )
    };
    let run = format!("{:08x}", rand::random::<u32>());
    let voucher: Value = s
        .http
        .post(format!("{}/vouchers", s.url))
        .bearer_auth(token("flood-admin", true))
        .json(&json!({
            "title": format!("flood {run}: {name}"),
            "stock": n,
            "begins_at": format_rfc3339_millis(now_millis() - 1_000),
            "ends_at": format_rfc3339_millis(now_millis() + 3_600_000),
            "pay_within_s": 600,
            "price_minor": 1999,
            "currency": "EUR",
        }))
        .send()
        .await?
        .json()
        .await?;
    let vid = voucher["id"].as_str().context("a voucher id")?.to_string();
    let bar = bar(u64::from(n), "prepare: admitted and checked out")?;
    let slots = Arc::new(Semaphore::new(16));
    let mut tasks = Vec::new();
    for i in 0..n {
        let permit = slots.clone().acquire_owned().await?;
        let user = format!("flood-{run}-{i}");
        let t = token(&user, false);
        let (http, url, vid, bar) = (s.http.clone(), s.url.clone(), vid.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let admitted: Value = http
                .post(format!("{url}/vouchers/{vid}/seckill"))
                .bearer_auth(&t)
                .send()
                .await?
                .json()
                .await?;
            let order = admitted["order_id"]
                .as_str()
                .with_context(|| format!("not admitted: {admitted}"))?
                .to_string();
            let checkout: Value = http
                .post(format!("{url}/orders/{order}/pay"))
                .bearer_auth(&t)
                .send()
                .await?
                .json()
                .await?;
            let pi = checkout["payment_intent"]
                .as_str()
                .with_context(|| format!("no PaymentIntent (is Stripe configured?): {checkout}"))?
                .to_string();
            drop(permit);
            bar.inc(1);
            anyhow::Ok(json!({
                "id": pi, "object": "payment_intent", "amount": 1999, "amount_received": 1999,
                "currency": "eur", "status": "succeeded",
                "metadata": {"order_id": order, "buyer": user, "voucher_id": vid},
            }))
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    bar.finish_and_clear();
    Ok(out)
}

fn bar(len: u64, what: &str) -> anyhow::Result<ProgressBar> {
    Ok(ProgressBar::new(len).with_style(
        ProgressStyle::with_template(&format!("{what} [{{bar:40}}] {{pos}}/{{len}} {{msg}}"))?
            .progress_chars("=> "),
    ))
}

/// One row: the real events at their rate to `url`, junk beside them at `junk` a second.
async fn row(
    s: &Stack,
    url: &str,
    name: &str,
    intents: Vec<Value>,
    junk: u32,
    o: &FloodOptions,
) -> anyhow::Result<FloodRow> {
    let target = format!("{url}/payments/stripe");
    let period = Duration::from_secs_f64(1.0 / f64::from(o.event_rate.max(1)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The junk, paced by the clock, at most 512 in flight (a client that waits for
    // nothing would only queue in its own sockets).
    let junk_task = (junk > 0).then(|| {
        let (http, target, stop) = (s.http.clone(), target.clone(), stop.clone());
        tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(512));
            let started = Instant::now();
            let mut answers: BTreeMap<String, u64> = BTreeMap::new();
            let mut tasks = Vec::new();
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let due = started + Duration::from_secs_f64(sent as f64 / f64::from(junk));
                tokio::time::sleep_until(due.into()).await;
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    *answers.entry("not sent (512 in flight)".into()).or_default() += 1;
                    sent += 1;
                    continue;
                };
                sent += 1;
                let (http, target) = (http.clone(), target.clone());
                tasks.push(tokio::spawn(async move {
                    let body = json!({"id": format!("evt_junk_{sent}"), "type": "payment_intent.succeeded",
                                      "data": {"object": {"id": "pi_junk", "metadata": {"order_id": "1"}}}})
                    .to_string();
                    let sig = format!(
                        "t={},v1={:064x}",
                        now_millis() / 1000,
                        rand::random::<u128>()
                    );
                    let status = match http
                        .post(&target)
                        .header("content-type", "application/json")
                        .header(webhook::stripe::SIGNATURE_HEADER, sig)
                        .body(body)
                        .send()
                        .await
                    {
                        Ok(r) => r.status().as_u16().to_string(),
                        Err(_) => "no answer".to_string(),
                    };
                    drop(permit);
                    status
                }));
            }
            for t in tasks {
                if let Ok(status) = t.await {
                    *answers.entry(status).or_default() += 1;
                }
            }
            (sent, answers)
        })
    });
    // Let the flood reach its pace first.
    if junk > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let bar = bar(intents.len() as u64, name)?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, intent) in intents.into_iter().enumerate() {
        tokio::time::sleep_until((started + period * i as u32).into()).await;
        let body = seckill_shared::webhook::stripe::event(
            &format!("evt_flood_{}", intent["id"].as_str().unwrap_or_default()),
            "payment_intent.succeeded",
            now_millis() / 1000,
            intent,
        )
        .to_string();
        let sig = webhook::header(&[s.whsec.current()], now_millis() / 1000, body.as_bytes());
        let (http, target, bar) = (s.http.clone(), target.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let res = http
                .post(&target)
                .header("content-type", "application/json")
                .header(webhook::stripe::SIGNATURE_HEADER, sig)
                .body(body)
                .send()
                .await;
            let (status, answer) = match res {
                Ok(r) => (
                    r.status().as_u16(),
                    r.json::<Value>().await.unwrap_or_default(),
                ),
                Err(_) => (0, Value::Null),
            };
            bar.inc(1);
            (status, answer, t0.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    let mut out = FloodRow {
        name: name.to_string(),
        events: tasks.len() as u32,
        ..FloodRow::default()
    };
    for t in tasks {
        let (status, answer, took) = t.await?;
        if status == 200 && answer["outcome"] == "paid" {
            out.applied += 1;
            latencies.push(took.as_secs_f64() * 1000.0);
        } else {
            *out.not_applied.entry(status.to_string()).or_default() += 1;
        }
    }
    bar.finish_and_clear();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(j) = junk_task {
        let (sent, answers) = j.await?;
        out.junk_sent = sent;
        out.junk_answers = answers;
    }
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (out.p50_ms, out.p99_ms, out.max_ms) = (at(0.5), at(0.99), at(1.0));
    Ok(out)
}

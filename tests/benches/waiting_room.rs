//! What a waiting room costs under a flood: a burst of requests at a voucher with a room
//! (each buyer joins, looks, and buys with the token once served) against the same
//! number of admissions at a voucher without one, measured in the same run on the same
//! Redis. The voucher without a room has a unit for every request, so each of its
//! requests is a real admission (one script), not a sold-out answer from an instance's
//! memory. Reports, per kind of request, Redis commands per request as the server counts
//! them (`INFO commandstats`: script calls and the commands they run), requests per
//! second, and the answers' p50 / p99 through the function's handler (four instances in
//! process, 256 requests in flight).
//!
//! `cargo bench -p seckill-tests --bench waiting_room [-- REQUESTS]` (default 200,000;
//! the local stack's MariaDB must be up: `scripts/stack.sh up`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use seckill_http::App;
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use seckill_tests::harness::{Backends, call, create_voucher, request, token};
use seckill_tests::redis::RedisServer;
use serde_json::{Value, json};

const DEFAULT_REQUESTS: usize = 200_000;
const INSTANCES: usize = 4;
const CONCURRENCY: usize = 256;
const STOCK: i64 = 1_000;
const ENTRY_RATE: i64 = 5_000;

/// Commands the server ran, by name (script calls and what they ran), over every node.
fn commands(redis: &RedisServer) -> BTreeMap<String, u64> {
    let stats = redis.commandstats().into_iter();
    stats.map(|(name, s)| (name, s.calls)).collect()
}

fn reset(redis: &RedisServer) {
    for n in redis.nodes() {
        let _: () = redis
            .query(n.port, redis::cmd("CONFIG").arg("RESETSTAT"))
            .expect("RESETSTAT");
    }
}

/// The commands run between two counts, leaving out the counting itself.
fn spent(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, u64) {
    let mut all = 0;
    let mut scripts = 0;
    for (name, n) in after {
        if matches!(name.as_str(), "info" | "config|resetstat" | "config") {
            continue;
        }
        let d = n - before.get(name).copied().unwrap_or(0);
        all += d;
        if name == "evalsha" || name == "eval" {
            scripts += d;
        }
    }
    (all, scripts)
}

async fn create(app: &App, room: bool, stock: i64) -> String {
    let now = now_millis();
    let mut body = json!({
        "title": if room { "queued sale" } else { "plain sale" },
        "stock": stock,
        "begins_at": format_rfc3339_millis(now - 1_000),
        "ends_at": format_rfc3339_millis(now + 3_600_000),
    });
    if room {
        body["entry_rate_per_s"] = json!(ENTRY_RATE);
    }
    let v = create_voucher(app, &body).await;
    v["id"].as_str().unwrap().to_string()
}

/// One request's kind and how long its answer took.
struct Sample {
    kind: &'static str,
    took: Duration,
}

/// What one buyer sends: with a room, a join, a look, and the purchase with the token
/// when served; without, one purchase.
async fn buyer(app: &App, voucher: &str, user: &str, room: bool) -> Vec<Sample> {
    let bearer = token(user, false);
    let mut out = Vec::new();
    let mut timed = async |kind: &'static str, method: &str, path: String, entry: Option<&str>| {
        let mut req = request(method, &path, Some(&bearer), None, None);
        if let Some(e) = entry {
            req.headers_mut()
                .insert("seckill-entry", e.parse().unwrap());
        }
        let t0 = Instant::now();
        let (status, body) = Box::pin(call(app, req)).await;
        out.push(Sample {
            kind,
            took: t0.elapsed(),
        });
        assert!(status < 500, "{kind}: {status} {body}");
        body
    };
    if !room {
        timed(
            "admission (no room)",
            "POST",
            format!("/vouchers/{voucher}/seckill"),
            None,
        )
        .await;
        return out;
    }
    timed("join", "POST", format!("/vouchers/{voucher}/queue"), None).await;
    let look: Value = timed("look", "GET", format!("/vouchers/{voucher}/queue"), None).await;
    if let Some(t) = look["entry_token"].as_str() {
        let t = t.to_string();
        timed(
            "purchase (token)",
            "POST",
            format!("/vouchers/{voucher}/seckill"),
            Some(&t),
        )
        .await;
    }
    out
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

struct Report {
    requests: usize,
    commands: u64,
    scripts: u64,
    p50: Duration,
    p99: Duration,
    kinds: BTreeMap<&'static str, Vec<Duration>>,
    wall: Duration,
}

async fn burst(
    b: &Backends,
    apps: &[Arc<App>],
    voucher: &str,
    room: bool,
    requests: usize,
) -> Report {
    // A buyer sends about two requests with a room (join, look; the served few buy),
    // one without.
    let buyers = if room { requests / 2 } else { requests };
    let bar = ProgressBar::new(buyers as u64).with_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} buyers {per_sec}")
            .expect("template"),
    );
    bar.set_message(if room { "with room" } else { "without" });
    reset(&b.redis);
    let before = commands(&b.redis);
    let t0 = Instant::now();
    let samples: Vec<Sample> = futures::stream::iter(0..buyers)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            let voucher = voucher.to_string();
            let bar = bar.clone();
            async move {
                let tag = if room { "r" } else { "p" };
                let s = buyer(&app, &voucher, &format!("{tag}{i}"), room).await;
                bar.inc(1);
                s
            }
        })
        .buffer_unordered(CONCURRENCY)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    let wall = t0.elapsed();
    bar.finish();
    let after = commands(&b.redis);
    let (commands, scripts) = spent(&before, &after);
    let mut all: Vec<Duration> = samples.iter().map(|s| s.took).collect();
    all.sort_unstable();
    let mut kinds: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    for s in &samples {
        kinds.entry(s.kind).or_default().push(s.took);
    }
    for v in kinds.values_mut() {
        v.sort_unstable();
    }
    Report {
        requests: samples.len(),
        commands,
        scripts,
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
        kinds,
        wall,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let requests: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(DEFAULT_REQUESTS);
    let b = Backends::start().await;
    let apps: Vec<Arc<App>> = futures::future::join_all(
        (0..INSTANCES).map(|_| async { Arc::new(App::new(&b.http_config()).await) }),
    )
    .await;
    let plain = create(&apps[0], false, requests as i64).await;
    let queued = create(&apps[0], true, STOCK).await;
    let base = burst(&b, &apps, &plain, false, requests).await;
    let with = burst(&b, &apps, &queued, true, requests).await;

    println!(
        "\nA burst of about {requests} requests, {INSTANCES} instances, {CONCURRENCY} at once; \
         the room's voucher {STOCK} units at {ENTRY_RATE}/s, the other one a unit per request"
    );
    println!(
        "{:<22} {:>9} {:>14} {:>12} {:>10} {:>9} {:>9}",
        "burst", "requests", "Redis cmd/req", "scripts/req", "req/s", "p50", "p99"
    );
    for (name, r) in [("admissions, no room", &base), ("with a room", &with)] {
        println!(
            "{:<22} {:>9} {:>14.3} {:>12.3} {:>10.0} {:>9} {:>9}",
            name,
            r.requests,
            r.commands as f64 / r.requests as f64,
            r.scripts as f64 / r.requests as f64,
            r.requests as f64 / r.wall.as_secs_f64(),
            ms(r.p50),
            ms(r.p99),
        );
    }
    println!("\nby kind of request");
    for r in [&base, &with] {
        for (kind, v) in &r.kinds {
            println!(
                "  {:<20} {:>9} p50 {:>9} p99 {:>9}",
                kind,
                v.len(),
                ms(percentile(v, 0.5)),
                ms(percentile(v, 0.99))
            );
        }
    }
    println!(
        "\nratio with a room / admissions without: Redis commands per request {:.2}x, scripts per request {:.2}x, p99 {:.2}x",
        (with.commands as f64 / with.requests as f64)
            / (base.commands as f64 / base.requests as f64).max(1e-9),
        (with.scripts as f64 / with.requests as f64)
            / (base.scripts as f64 / base.requests as f64).max(1e-9),
        with.p99.as_secs_f64() / base.p99.as_secs_f64().max(1e-9)
    );
    b.cleanup().await;
}

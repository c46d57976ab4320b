//! What the EMF metrics cost a request (the benchmark must not regress by more
//! than 5 %), measured against a baseline in the same run.
//!
//! The request is the cheapest one that is still counted as an admission: `POST
//! /vouchers/<not an id>/seckill`, answered 400 from the handler alone, with no I/O. A
//! real admission adds a Redis round trip (hundreds of microseconds), so the ratio here
//! is an upper bound of what the metrics cost an admission.
//!
//! The recorder is process-wide and cannot be removed, so the baseline runs first, then
//! the recorder is installed and the same requests run again, in rounds of fresh
//! requests, and the medians are compared.
//!
//! Cold start: the bench also starts itself [`COLD_RUNS`] times per variant as a fresh
//! process (alternating with and without the recorder) that does what the function's
//! `main` does before answering (read the config, build the clients, install the
//! recorder or not) and answers one request; each child reports the time from its
//! first instruction to that answer, and the medians are compared.
//!
//! `cargo bench -p seckill-http --bench emf`

use std::sync::{Arc, Mutex};
use std::time::Instant;

use lambda_http::{Request, RequestExt};
use seckill_http::{App, Config, handle};
use seckill_shared::config::minimal_env_with;
use seckill_shared::metrics::{self, Sink};

const REQUESTS: usize = 200_000;
const ROUNDS: usize = 5;
const COLD_RUNS: usize = 40;
/// Set in a child process: `on` or `off` (the recorder), see the module header.
const CHILD: &str = "SECKILL_EMF_BENCH_CHILD";

fn request() -> Request {
    let event = serde_json::json!({
        "version": "2.0",
        "routeKey": "POST /vouchers/{id}/seckill",
        "rawPath": "/vouchers/not-an-id/seckill",
        "rawQueryString": "",
        "headers": {"content-type": "application/json"},
        "pathParameters": {"id": "not-an-id"},
        "requestContext": {
            "routeKey": "POST /vouchers/{id}/seckill",
            "http": {"method": "POST", "path": "/vouchers/not-an-id/seckill",
                     "protocol": "HTTP/1.1", "sourceIp": "203.0.113.7", "userAgent": "bench"},
            "requestId": "bench", "stage": "$default", "timeEpoch": 0
        },
        "isBase64Encoded": false
    });
    lambda_http::request::from_str(&event.to_string())
        .expect("an API Gateway v2 event")
        .with_lambda_context(lambda_http::Context::default())
}

/// Time per request of one round, in nanoseconds.
async fn round(app: &App) -> f64 {
    let requests: Vec<Request> = (0..REQUESTS).map(|_| request()).collect();
    let t0 = Instant::now();
    for r in requests {
        let res = handle(app, r).await;
        assert_eq!(res.status(), 400);
    }
    t0.elapsed().as_nanos() as f64 / REQUESTS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn app() -> App {
    // Nothing listens on port 1: Redis and the Data API are never reached by this request.
    let env = minimal_env_with(&[
        ("REDIS_URL", "redis://127.0.0.1:1"),
        ("REDIS_TIMEOUT_MS", "50"),
    ]);
    let cfg = Config::read(env).expect("config");
    App::new(&cfg).await
}

/// A child process: start as the function does, answer one request, print two times
/// in nanoseconds: start to first answer, and the part the recorder can touch (from
/// the clients being built to the first answer, installing the recorder included).
async fn cold_child(recorder: bool) {
    let t0 = Instant::now();
    let app = app().await;
    let t1 = Instant::now();
    if recorder {
        metrics::install(Sink::Buffer(Arc::new(Mutex::new(Vec::new()))));
    }
    let res = handle(&app, request()).await;
    assert_eq!(res.status(), 400);
    metrics::flush();
    println!("{} {}", t0.elapsed().as_nanos(), t1.elapsed().as_nanos());
}

/// Medians over fresh processes, `[total, recorder part]`, without and with the recorder.
fn cold_starts() -> ([f64; 2], [f64; 2]) {
    let exe = std::env::current_exe().expect("the bench binary");
    let run = |variant: &str| -> [f64; 2] {
        let out = std::process::Command::new(&exe)
            .env(CHILD, variant)
            .output()
            .expect("start a child");
        assert!(out.status.success(), "child failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut times = text
            .split_whitespace()
            .map(|t| t.parse().expect("nanoseconds"));
        [times.next().unwrap(), times.next().unwrap()]
    };
    let (mut off, mut on) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    run("off"); // warm the page cache
    for _ in 0..COLD_RUNS {
        for (variant, into) in [("off", &mut off), ("on", &mut on)] {
            let [total, part] = run(variant);
            into[0].push(total);
            into[1].push(part);
        }
    }
    let [off_total, off_part] = off;
    let [on_total, on_part] = on;
    (
        [median(off_total), median(off_part)],
        [median(on_total), median(on_part)],
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Ok(variant) = std::env::var(CHILD) {
        return cold_child(variant == "on").await;
    }
    let (cold_off, cold_on) = cold_starts();
    let app = app().await;
    round(&app).await; // warm-up
    let mut off = Vec::new();
    for _ in 0..ROUNDS {
        off.push(round(&app).await);
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    assert!(metrics::install(Sink::Buffer(buf.clone())));
    let mut on = Vec::new();
    for _ in 0..ROUNDS {
        on.push(round(&app).await);
        buf.lock().unwrap().clear();
    }
    let (off, on) = (median(off), median(on));
    println!(
        "EMF metrics, {ROUNDS} rounds of {REQUESTS} requests (POST .../seckill answered 400, no I/O):"
    );
    println!("  without recorder  {:>8.0} ns/request", off);
    println!("  with recorder     {:>8.0} ns/request", on);
    println!(
        "  ratio {:.3}x; added {:.0} ns/request (an admission adds a Redis round trip to both)",
        on / off,
        on - off
    );
    println!(
        "Cold start, medians of {COLD_RUNS} fresh processes each (start to first answer; the\n\
         clients' part is mostly the first Redis connect, which fails here: nothing listens):"
    );
    println!(
        "  without recorder  {:>9.0} us total, {:>6.0} us from clients built to first answer",
        cold_off[0] / 1000.0,
        cold_off[1] / 1000.0
    );
    println!(
        "  with recorder     {:>9.0} us total, {:>6.0} us from clients built to first answer",
        cold_on[0] / 1000.0,
        cold_on[1] / 1000.0
    );
    println!(
        "  recorder adds {:.0} us to a cold start ({:.3}x of that last part)",
        (cold_on[1] - cold_off[1]) / 1000.0,
        cold_on[1] / cold_off[1]
    );
}

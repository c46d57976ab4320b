//! What the EMF metrics cost a request (issue #14: the benchmark must not regress by more
//! than 5 %), measured against a baseline in the same run.
//!
//! The request is the cheapest one that is still counted as an admission: `POST
//! /vouchers/<not an id>/seckill`, answered 400 from the handler alone, with no I/O. A
//! real admission adds a Redis round trip (hundreds of microseconds), so the ratio here
//! is an upper bound of what the metrics cost an admission.
//!
//! The recorder is process-wide and cannot be removed, so the baseline runs first, then
//! the recorder is installed and the same requests run again; both phases alternate in
//! rounds of fresh requests and the medians are compared.
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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Nothing listens on port 1: Redis and the Data API are never reached by this request.
    let env = minimal_env_with(&[
        ("REDIS_URL", "redis://127.0.0.1:1"),
        ("REDIS_TIMEOUT_MS", "50"),
    ]);
    let cfg = Config::read(env).expect("config");
    let app = App::new(&cfg).await;
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
}

//! The functions' CloudWatch Embedded Metric Format lines (shared/src/metrics.rs), read
//! back after a small sale through the real handler and a real drainer run: the EMF
//! envelope CloudWatch needs, and values equal to what the buyers were answered and what
//! the drainer wrote.
//!
//! Its own test binary: the metrics recorder is process-wide, and no other test may
//! record into it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use seckill_shared::domain::now_millis;
use seckill_shared::metrics::{self, FLUSH_EVERY_REQUESTS, NAMESPACE, Sink, names};
use seckill_tests::drainer::DrainCtx;
use seckill_tests::harness::{buy, request, test_http_config};
use serde_json::Value;

/// One EMF document: its dimensions (name -> value) and metrics (name -> values).
type Document = (BTreeMap<String, String>, BTreeMap<String, Vec<f64>>);

/// The EMF documents in `buf`, each checked against the format's envelope: returns, per
/// document, its dimensions (name -> value) and metrics (name -> values).
fn documents(buf: &[u8]) -> Vec<Document> {
    let text = String::from_utf8(buf.to_vec()).expect("UTF-8");
    text.lines()
        .map(|line| {
            let doc: Value = serde_json::from_str(line).expect("each line is one JSON document");
            let aws = &doc["_aws"];
            let ts = aws["Timestamp"].as_i64().expect("_aws.Timestamp in ms");
            assert!(
                (now_millis() - ts).abs() < 120_000,
                "timestamp {ts} is not now"
            );
            let directives = aws["CloudWatchMetrics"].as_array().expect("directives");
            assert_eq!(directives.len(), 1, "{line}");
            let d = &directives[0];
            assert_eq!(d["Namespace"], NAMESPACE, "{line}");
            let dimension_sets = d["Dimensions"].as_array().expect("Dimensions");
            assert_eq!(dimension_sets.len(), 1, "{line}");
            let mut dims = BTreeMap::new();
            for name in dimension_sets[0].as_array().expect("a dimension set") {
                let name = name.as_str().expect("dimension name");
                let value = doc[name].as_str().unwrap_or_else(|| {
                    panic!("dimension {name} has no string value at the top level: {line}")
                });
                dims.insert(name.to_string(), value.to_string());
            }
            let mut values = BTreeMap::new();
            for m in d["Metrics"].as_array().expect("Metrics") {
                let name = m["Name"].as_str().expect("metric Name");
                assert!(names::ALL.contains(&name), "unknown metric {name}");
                let unit = m["Unit"].as_str().expect("metric Unit");
                assert!(["Count", "Milliseconds"].contains(&unit), "{name}: {unit}");
                let v = match &doc[name] {
                    Value::Number(n) => vec![n.as_f64().unwrap()],
                    Value::Array(a) => a.iter().map(|x| x.as_f64().unwrap()).collect(),
                    other => panic!("{name} has no value: {other}"),
                };
                values.insert(name.to_string(), v);
            }
            (dims, values)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_sale_shows_in_the_emf_lines_as_it_was_answered_and_drained() {
    let buf = Arc::new(Mutex::new(Vec::new()));
    assert!(metrics::install(Sink::Buffer(buf.clone())), "first install");
    assert!(!metrics::install(Sink::Stdout), "installed once");

    let ctx = DrainCtx::start().await;
    let app = seckill_http::App::new(&seckill_http::Config {
        user_rate_per_sec: 1,
        user_rate_burst: 3,
        ..test_http_config(ctx.redis.config(), ctx.data_api_config())
    })
    .await;
    let open = ctx.voucher(3, 3).await.id;
    // Not started: begins in an hour.
    let later = ctx.voucher_at(5, now_millis() + 3_600_000).await.id;

    // What the buyers were told, by code.
    let mut told: BTreeMap<String, f64> = BTreeMap::new();
    let mut note = |body: &Value, status: u16| {
        let code = if status == 202 {
            "admitted".to_string()
        } else {
            body["code"].as_str().expect("error code").to_string()
        };
        *told.entry(code).or_default() += 1.0;
    };
    let attempts = [
        (open, "u0"),
        (open, "u0"),
        (open, "u1"),
        (open, "u2"),
        (open, "u3"),
        (open, "u4"),
        (later, "u5"),
        (later, "u5"),
        (later, "u5"),
        (later, "u5"),
    ];
    for (voucher, user) in attempts {
        let (status, body) = buy(&app, voucher, user).await;
        note(&body, status);
    }
    // A bot over its rate on a sale this instance has not answered from memory yet.
    let fresh = ctx.voucher(100, 100).await.id;
    for _ in 0..4 {
        let (status, body) = buy(&app, fresh, "bot").await;
        note(&body, status);
    }
    let requests = attempts.len() + 4;
    assert!(requests < FLUSH_EVERY_REQUESTS as usize);
    for code in [
        "admitted",
        "already_purchased",
        "sold_out",
        "not_started",
        "rate_limited",
    ] {
        assert!(
            told.contains_key(code),
            "the sale produced no {code}: {told:?}"
        );
    }
    assert!(
        buf.lock().unwrap().is_empty(),
        "nothing is flushed before {FLUSH_EVERY_REQUESTS} requests or 10 s"
    );
    // Requests of any route count towards the flush.
    for _ in 0..FLUSH_EVERY_REQUESTS as usize - requests {
        let path = format!("/vouchers/{open}");
        seckill_http::handle(&app, request("GET", &path, None, None, None)).await;
    }
    let http = std::mem::take(&mut *buf.lock().unwrap());
    assert!(
        !http.is_empty(),
        "the {FLUSH_EVERY_REQUESTS}th request flushed"
    );
    let docs = documents(&http);

    let mut counted: BTreeMap<String, f64> = BTreeMap::new();
    let mut latencies = Vec::new();
    for (dims, values) in &docs {
        if let Some(v) = values.get(names::ADMISSIONS) {
            assert_eq!(dims.keys().collect::<Vec<_>>(), ["outcome"], "{dims:?}");
            *counted.entry(dims["outcome"].clone()).or_default() += v.iter().sum::<f64>();
        } else {
            assert!(
                dims.is_empty(),
                "only admissions carry a dimension: {dims:?}"
            );
        }
        if let Some(v) = values.get(names::REDIS_LATENCY) {
            latencies.extend(v.iter().copied());
        }
        assert!(!values.contains_key(names::HTTP_5XX), "no 5xx here");
    }
    assert_eq!(
        counted, told,
        "admissions by outcome = what the buyers were told"
    );
    // Every answer that needed Redis has one latency; those answered from memory none.
    let from_redis = told["admitted"] + told["already_purchased"];
    assert!(
        latencies.len() as f64 >= from_redis && latencies.len() < requests,
        "{} latencies for {from_redis} Redis answers of {requests} requests",
        latencies.len()
    );
    assert!(
        latencies.iter().all(|ms| *ms > 0.0 && *ms < 5_000.0),
        "{latencies:?}"
    );

    // The drainer: one document per run, its gauges equal to the run's summary.
    let drainer = order_drainer::Drainer::connect(ctx.drainer_config())
        .await
        .expect("drainer");
    let (summary, ok) = order_drainer::run_once(&drainer).await;
    assert!(ok, "{summary:?}");
    let drained = std::mem::take(&mut *buf.lock().unwrap());
    let docs = documents(&drained);
    assert_eq!(docs.len(), 1, "one document per run");
    let (dims, values) = &docs[0];
    assert!(dims.is_empty());
    let admitted = told["admitted"];
    for (name, want) in [
        (names::DRAIN_INSERTED, admitted),
        (names::DRAIN_READ, admitted),
        (names::DRAIN_DEAD_LETTERED, 0.0),
        (names::DRAIN_EXPIRED, 0.0),
        (names::DRAIN_SETTLED, 0.0),
        (names::DRAIN_ERRORS, 0.0),
        (names::DRAIN_LAG, 0.0),
        (names::DRAIN_OLDEST_PENDING_AGE, 0.0),
        (names::DRAIN_RUN_TIME, summary.elapsed_ms as f64),
    ] {
        assert_eq!(values.get(name), Some(&vec![want]), "{name}: {values:?}");
    }
    assert!(values[names::DRAIN_BATCHES][0] >= 1.0, "{values:?}");
    assert_eq!(summary.inserted as f64, admitted);
    ctx.cleanup().await;
}

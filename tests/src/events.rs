//! Order events as a consumer sees them: a bus of the test's own on the stack's moto
//! (EventBridge and SQS emulated by others, made with AWS's own SDKs), with a rule to an
//! SQS queue the test reads, and a proxy in front of EventBridge that fails what a test
//! asks (one entry in N refused, as EventBridge answers per entry; the whole endpoint
//! down).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_eventbridge::Client as Events;
use aws_sdk_sqs::Client as Sqs;
use serde_json::{Value, json};

use crate::stack::StackEnv;

/// A bus of one test, its rule and the queue it feeds.
pub struct LocalBus {
    pub endpoint: String,
    pub bus: String,
    pub queue_url: String,
    sqs: Sqs,
}

async fn sdk(endpoint: &str) -> aws_config::SdkConfig {
    seckill_shared::adapters::data_api::sdk_config(true)
        .await
        .into_builder()
        .endpoint_url(endpoint)
        .build()
}

impl LocalBus {
    /// Makes the bus `name` (with its queue and a rule taking every `seckill.orders`
    /// event) on the stack's moto.
    pub async fn create(name: &str) -> LocalBus {
        let endpoint = StackEnv::load()
            .get_opt("EVENTS_ENDPOINT_URL")
            .expect("the stack runs moto (EVENTS_ENDPOINT_URL in .dev/stack.env)");
        let cfg = sdk(&endpoint).await;
        let (events, sqs) = (Events::new(&cfg), Sqs::new(&cfg));
        events
            .create_event_bus()
            .name(name)
            .send()
            .await
            .expect("bus made");
        let queue_url = sqs
            .create_queue()
            .queue_name(name)
            .send()
            .await
            .expect("queue made")
            .queue_url
            .expect("a queue url");
        let arn = sqs
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .expect("queue attributes")
            .attributes
            .and_then(|a| {
                a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn)
                    .cloned()
            })
            .expect("queue arn");
        let rule = format!("{name}-all");
        events
            .put_rule()
            .name(&rule)
            .event_bus_name(name)
            .event_pattern(
                json!({ "source": [seckill_shared::adapters::events::SOURCE] }).to_string(),
            )
            .send()
            .await
            .expect("rule made");
        events
            .put_targets()
            .rule(&rule)
            .event_bus_name(name)
            .targets(
                aws_sdk_eventbridge::types::Target::builder()
                    .id("queue")
                    .arn(arn)
                    .build()
                    .expect("a target"),
            )
            .send()
            .await
            .expect("target set");
        LocalBus {
            endpoint,
            bus: name.to_string(),
            queue_url,
            sqs,
        }
    }

    /// The drainer's settings to publish to this bus through `endpoint` (moto's, or a
    /// proxy's in front of it).
    pub fn config(&self, endpoint: &str) -> order_drainer::config::EventsConfig {
        order_drainer::config::EventsConfig {
            bus: self.bus.clone(),
            endpoint: Some(endpoint.to_string()),
        }
    }

    /// Every message the queue holds now, read and deleted (the events, as JSON).
    pub async fn take_all(&self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let got = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(10)
                .send()
                .await
                .expect("receive");
            let messages = got.messages.unwrap_or_default();
            if messages.is_empty() {
                return out;
            }
            for m in messages {
                let body = m.body.unwrap_or_default();
                out.push(serde_json::from_str(&body).expect("an event is JSON"));
                if let Some(handle) = m.receipt_handle {
                    self.sqs
                        .delete_message()
                        .queue_url(&self.queue_url)
                        .receipt_handle(handle)
                        .send()
                        .await
                        .expect("delete");
                }
            }
        }
    }

    /// Reads the queue until `want` holds for what was read (or `timeout` passes).
    pub async fn take_until(
        &self,
        got: &mut Vec<Value>,
        timeout: Duration,
        want: impl Fn(&[Value]) -> bool,
    ) {
        let t0 = Instant::now();
        loop {
            got.extend(self.take_all().await);
            if want(got) || t0.elapsed() > timeout {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What [`FaultProxy`] does to the calls it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Passes every call.
    None = 0,
    /// Refuses one `PutEvents` entry in ten (EventBridge's per-entry failure), passing
    /// the others.
    OneInTen = 1,
    /// Answers every call 503 (the endpoint down).
    Down = 2,
}

/// An HTTP proxy in front of EventBridge (moto) that fails calls as told.
pub struct FaultProxy {
    pub url: String,
    fault: Arc<AtomicU8>,
    /// Entries refused so far.
    pub refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: &str) -> FaultProxy {
        let fault = Arc::new(AtomicU8::new(Fault::None as u8));
        let refused = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(AtomicU64::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let client = reqwest::Client::new();
        let upstream = upstream.to_string();
        let state = (fault.clone(), refused.clone(), seen, client, upstream);
        let app = axum::Router::new().fallback(
            move |headers: http::HeaderMap, body: axum::body::Bytes| {
                let (fault, refused, seen, client, upstream) = state.clone();
                async move { forward(fault, refused, seen, client, upstream, headers, body).await }
            },
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        FaultProxy {
            url,
            fault,
            refused,
            task,
        }
    }

    pub fn set(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    fault: Arc<AtomicU8>,
    refused: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    client: reqwest::Client,
    upstream: String,
    headers: http::HeaderMap,
    body: axum::body::Bytes,
) -> (http::StatusCode, http::HeaderMap, Vec<u8>) {
    let json_type = || {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            "application/x-amz-json-1.1".parse().unwrap(),
        );
        h
    };
    let mode = fault.load(Ordering::SeqCst);
    if mode == Fault::Down as u8 {
        let body = json!({ "__type": "ServiceUnavailableException", "message": "down (the test's proxy)" });
        return (
            http::StatusCode::SERVICE_UNAVAILABLE,
            json_type(),
            body.to_string().into_bytes(),
        );
    }
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Which entries this call refuses (their positions), one in ten of all seen.
    let mut failed: Vec<usize> = Vec::new();
    if mode == Fault::OneInTen as u8 && target.ends_with("PutEvents") {
        let entries = body["Entries"].as_array().cloned().unwrap_or_default();
        let mut kept = Vec::new();
        for (i, e) in entries.into_iter().enumerate() {
            if seen.fetch_add(1, Ordering::SeqCst) % 10 == 9 {
                failed.push(i);
            } else {
                kept.push(e);
            }
        }
        body["Entries"] = Value::Array(kept);
    }
    let mut reply: Value = if body["Entries"].as_array().is_some_and(|e| e.is_empty()) {
        json!({ "FailedEntryCount": 0, "Entries": [] })
    } else {
        let mut req = client.post(format!("{upstream}/")).body(body.to_string());
        for (k, v) in &headers {
            if k != http::header::HOST && k != http::header::CONTENT_LENGTH {
                req = req.header(k, v);
            }
        }
        let res = req.send().await.expect("moto answers");
        let status = res.status();
        let text = res.bytes().await.unwrap_or_default().to_vec();
        if failed.is_empty() || !status.is_success() {
            return (
                http::StatusCode::from_u16(status.as_u16()).unwrap(),
                json_type(),
                text,
            );
        }
        serde_json::from_slice(&text).unwrap_or(Value::Null)
    };
    // The refused entries back in their places, as EventBridge reports them.
    let mut results: Vec<Value> = reply["Entries"].as_array().cloned().unwrap_or_default();
    for i in &failed {
        results.insert(
            (*i).min(results.len()),
            json!({ "ErrorCode": "InternalFailure", "ErrorMessage": "refused by the test's proxy" }),
        );
    }
    refused.fetch_add(failed.len() as u64, Ordering::SeqCst);
    let count = reply["FailedEntryCount"].as_u64().unwrap_or(0) + failed.len() as u64;
    reply = json!({ "FailedEntryCount": count, "Entries": results });
    (
        http::StatusCode::OK,
        json_type(),
        reply.to_string().into_bytes(),
    )
}

/// The events of `all` by order: (sequence, state, event id) in the order received.
pub fn by_order(all: &[Value]) -> HashMap<String, Vec<(u64, String, String)>> {
    let mut out: HashMap<String, Vec<(u64, String, String)>> = HashMap::new();
    for e in all {
        let d = &e["detail"];
        out.entry(d["order_id"].as_str().unwrap_or("").to_string())
            .or_default()
            .push((
                d["sequence"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
                d["state"].as_str().unwrap_or("").to_string(),
                d["event_id"].as_str().unwrap_or("").to_string(),
            ));
    }
    out
}

/// The schema of every event (schemas/order-events.schema.json), compiled.
pub fn schema() -> jsonschema::Validator {
    let text = include_str!("../../schemas/order-events.schema.json");
    let schema: Value = serde_json::from_str(text).expect("the schema is JSON");
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema compiles")
}

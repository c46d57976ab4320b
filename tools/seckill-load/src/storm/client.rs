//! The storm's HTTP side: calls to seckill-http through the local gateway as buyers and
//! the payment provider make them, each answer tallied, retries with backoff where a
//! client must retry (`503`, `429`, a transport error), and whatever a client should
//! never see kept for the report (a 5xx other than `503`, a body that is not JSON, a call
//! never answered).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::Method;
use seckill_shared::auth::mint_hs256;
use seckill_shared::domain::now_millis;
use seckill_shared::webhook::{self, Event};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// An answer: status and JSON body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }
    pub fn str(&self, field: &str) -> Option<String> {
        self.body[field].as_str().map(str::to_string)
    }
}

/// One request: what it is (for the tally), where, with what.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub what: &'a str,
    pub method: Method,
    pub path: &'a str,
    pub token: Option<&'a str>,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Vec<u8>>,
}

impl<'a> Call<'a> {
    pub fn new(what: &'a str, method: Method, path: &'a str) -> Call<'a> {
        Call {
            what,
            method,
            path,
            token: None,
            headers: Vec::new(),
            body: None,
        }
    }
    pub fn get(what: &'a str, path: &'a str) -> Call<'a> {
        Call::new(what, Method::GET, path)
    }
    pub fn post(what: &'a str, path: &'a str) -> Call<'a> {
        Call::new(what, Method::POST, path)
    }
    pub fn token(mut self, token: &'a str) -> Call<'a> {
        self.token = Some(token);
        self
    }
    pub fn header(mut self, name: &'static str, value: String) -> Call<'a> {
        self.headers.push((name, value));
        self
    }
    pub fn body(mut self, body: Vec<u8>) -> Call<'a> {
        self.body = Some(body);
        self
    }
}

/// What every call got, and what no client should get.
#[derive(Debug, Default)]
pub struct Tally {
    /// `"<what> <status>[ <code>]"` → count.
    pub answers: BTreeMap<String, u64>,
    /// Answers no client should see, with what was asked.
    pub unexpected: Vec<String>,
    /// Calls given up after their retries (never answered with something final).
    pub unanswered: Vec<String>,
    /// Retries after a `503`, `429` or transport error.
    pub retries: u64,
}

/// seckill-http through the gateway, for buyers and the provider.
pub struct Shop {
    http: reqwest::Client,
    base: String,
    jwt_secret: String,
    webhook_secret: Vec<u8>,
    /// Requests in flight at most (`--concurrency`).
    slots: Semaphore,
    pub tally: Mutex<Tally>,
}

/// How long one call may take before the client gives up on it (and retries).
const CALL_TIMEOUT: Duration = Duration::from_secs(35);

impl Shop {
    pub fn new(
        base: String,
        jwt_secret: String,
        webhook_secret: Vec<u8>,
        concurrency: usize,
    ) -> Shop {
        Shop {
            http: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT)
                .pool_max_idle_per_host(concurrency)
                .build()
                .expect("an HTTP client"),
            base: base.trim_end_matches('/').to_string(),
            jwt_secret,
            webhook_secret,
            slots: Semaphore::new(concurrency.max(1)),
            tally: Mutex::new(Tally::default()),
        }
    }

    /// A token for `user`, valid for an hour, admin if asked.
    pub fn token(&self, user: &str, admin: bool) -> String {
        mint_hs256(
            self.jwt_secret.as_bytes(),
            user,
            admin.then_some(seckill_shared::auth::ADMIN_SCOPE),
            now_millis() / 1000 + 3600,
        )
    }

    /// One attempt; `None` when no answer came (a transport error or the client's
    /// timeout). Tallied under the call's `what`.
    pub async fn once(&self, call: &Call<'_>) -> Option<Answer> {
        let _slot = self.slots.acquire().await.expect("never closed");
        let (what, method, path) = (call.what, &call.method, call.path);
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(t) = call.token {
            req = req.bearer_auth(t);
        }
        for (k, v) in &call.headers {
            req = req.header(*k, v);
        }
        if let Some(b) = &call.body {
            req = req
                .header("content-type", "application/json")
                .body(b.clone());
        }
        let Ok(res) = req.send().await else {
            self.count(format!("{what} no-answer"));
            return None;
        };
        let status = res.status().as_u16();
        let text = res.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let answer = Answer { status, body };
        let code = answer.code().to_string();
        self.count(if code.is_empty() {
            format!("{what} {status}")
        } else {
            format!("{what} {status} {code}")
        });
        if (status >= 500 && status != 503) || !answer.body.is_object() {
            let mut t = self.tally.lock().expect("tally");
            if t.unexpected.len() < 50 {
                t.unexpected
                    .push(format!("{method} {path} ({what}) -> {status} {text}"));
            } else {
                t.unexpected.push(String::new());
            }
        }
        Some(answer)
    }

    /// Calls until the answer is final (not `503`, `429`, nor missing), with backoff, for
    /// at most `patience`; `None` then (tallied as unanswered).
    pub async fn until_final(&self, call: &Call<'_>, patience: Duration) -> Option<Answer> {
        let label = || format!("{} {} ({})", call.method, call.path, call.what);
        let answer = |a: &Answer| !matches!(a.status, 429 | 503);
        self.retrying(patience, label, || self.once(call), answer)
            .await
    }

    /// Delivers a signed payment event as a provider does: again after a `5xx`, a
    /// `429` or no answer, with backoff, until a `2xx` or `4xx` (final for a provider),
    /// for at most `patience`. Signed at each delivery, as a provider does (the
    /// timestamp is checked).
    pub async fn deliver(&self, event: &Event, patience: Duration) -> Option<Answer> {
        let body = serde_json::to_vec(event).expect("an event serialises");
        let label = || format!("webhook {} of {}", event.id, event.data.payment_id);
        let attempt = || {
            let t = now_millis() / 1000;
            let signature = webhook::header(&[self.webhook_secret.as_slice()], t, &body);
            let call = Call::new("webhook", Method::POST, "/payments/webhook")
                .header(webhook::SIGNATURE_HEADER, signature)
                .body(body.clone());
            async move { self.once(&call).await }
        };
        let final_for_a_provider = |a: &Answer| a.status < 500 && a.status != 429;
        self.retrying(patience, label, attempt, final_for_a_provider)
            .await
    }

    /// Runs `attempt` until `is_final` says its answer is, with backoff, for at most
    /// `patience`; then `None`, tallied as unanswered under `label`.
    async fn retrying<F, Fut>(
        &self,
        patience: Duration,
        label: impl Fn() -> String,
        mut attempt: F,
        is_final: impl Fn(&Answer) -> bool,
    ) -> Option<Answer>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<Answer>>,
    {
        let give_up = Instant::now() + patience;
        for tries in 1u32.. {
            match attempt().await {
                Some(a) if is_final(&a) => return Some(a),
                _ if Instant::now() >= give_up => break,
                _ => {}
            }
            self.tally.lock().expect("tally").retries += 1;
            tokio::time::sleep(backoff(tries)).await;
        }
        self.tally.lock().expect("tally").unanswered.push(label());
        None
    }

    fn count(&self, key: String) {
        *self
            .tally
            .lock()
            .expect("tally")
            .answers
            .entry(key)
            .or_default() += 1;
    }
}

/// Full jitter over an exponential ceiling from 100 ms, at most 4 s.
fn backoff(attempt: u32) -> Duration {
    let ceiling = (100u64 << attempt.min(6)).min(4_000);
    Duration::from_millis(rand::random_range(ceiling / 2..=ceiling))
}

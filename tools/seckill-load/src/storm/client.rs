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
    /// timeout). Tallied under `what`.
    pub async fn once(
        &self,
        what: &str,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Option<Answer> {
        let _slot = self.slots.acquire().await.expect("never closed");
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let res = match req.send().await {
            Ok(res) => res,
            Err(_) => {
                self.count(format!("{what} no-answer"));
                return None;
            }
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
    #[allow(clippy::too_many_arguments)]
    pub async fn until_final(
        &self,
        what: &str,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, String)],
        body: Option<Vec<u8>>,
        patience: Duration,
    ) -> Option<Answer> {
        let give_up = Instant::now() + patience;
        let mut attempt = 0u32;
        loop {
            let answer = self
                .once(what, method.clone(), path, token, headers, body.clone())
                .await;
            match answer {
                Some(a) if !matches!(a.status, 429 | 503) => return Some(a),
                _ if Instant::now() >= give_up => {
                    self.tally
                        .lock()
                        .expect("tally")
                        .unanswered
                        .push(format!("{method} {path} ({what})"));
                    return None;
                }
                _ => {}
            }
            attempt += 1;
            self.tally.lock().expect("tally").retries += 1;
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    /// Delivers a signed payment event as a provider does: again after a `5xx`, a
    /// `429` or no answer, with backoff, until a `2xx` or `4xx` (final for a provider),
    /// for at most `patience`.
    pub async fn deliver(&self, event: &Event, patience: Duration) -> Option<Answer> {
        let body = serde_json::to_vec(event).expect("an event serialises");
        let give_up = Instant::now() + patience;
        let mut attempt = 0u32;
        loop {
            // Signed at each delivery, as a provider does (the timestamp is checked).
            let signature = webhook::header(
                &[self.webhook_secret.as_slice()],
                now_millis() / 1000,
                &body,
            );
            let answer = self
                .once(
                    "webhook",
                    Method::POST,
                    "/payments/webhook",
                    None,
                    &[(webhook::SIGNATURE_HEADER, signature)],
                    Some(body.clone()),
                )
                .await;
            match answer {
                Some(a) if a.status < 500 && a.status != 429 => return Some(a),
                _ if Instant::now() >= give_up => {
                    self.tally
                        .lock()
                        .expect("tally")
                        .unanswered
                        .push(format!("webhook {} of {}", event.id, event.data.payment_id));
                    return None;
                }
                _ => {}
            }
            attempt += 1;
            self.tally.lock().expect("tally").retries += 1;
            tokio::time::sleep(backoff(attempt)).await;
        }
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

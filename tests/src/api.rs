//! The running stack's seckill-http over real HTTP (`SECKILL_HTTP_URL`: the local API
//! Gateway in front of `cargo lambda watch`), as a client calls it: tokens signed with the stack's dev
//! secret, every answer JSON and checked against the contract (`docs/openapi.yaml`).

use std::time::Duration;

use reqwest::{Client, StatusCode};
use seckill_shared::auth::{ADMIN_SCOPE, mint_hs256};
use seckill_shared::domain::now_millis;
use serde_json::Value;

use crate::StackEnv;
use crate::contract::{contract, route_key};

/// A client of the stack's seckill-http.
pub struct Api {
    /// The stack this calls (its other addresses: drainer, database).
    pub env: StackEnv,
    /// The HTTP client, also for the stack's other endpoints.
    pub http: Client,
    base: String,
    secret: String,
}

/// The id (a decimal string) of a voucher as the API answers it.
///
/// # Panics
/// When it has none.
pub fn id_of(voucher: &Value) -> String {
    voucher["id"]
        .as_str()
        .expect("id is a decimal string")
        .to_string()
}

impl Api {
    /// The stack's seckill-http; panics (saying how to start it) without a stack.
    pub fn new() -> Api {
        let env = StackEnv::load();
        Api {
            base: env.seckill_http_url(),
            secret: env.dev_jwt_secret(),
            env,
            http: Client::new(),
        }
    }

    /// The base URL every path is appended to (`SECKILL_HTTP_URL`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A token for `sub`, valid for ten minutes, with the admin scope if asked.
    pub fn token(&self, sub: &str, admin: bool) -> String {
        mint_hs256(
            self.secret.as_bytes(),
            sub,
            admin.then_some(ADMIN_SCOPE),
            now_millis() / 1000 + 600,
        )
    }

    /// Creates a voucher as an admin: `title`, `stock`, on sale from `opens_in_ms` from
    /// now (negative: open already) for an hour, with the fields of `extra` besides (a
    /// payment step, ...). Returns the voucher as created.
    ///
    /// # Panics
    /// Unless the answer is `201 Created`.
    pub async fn create_voucher(
        &self,
        title: &str,
        stock: i64,
        opens_in_ms: i64,
        extra: Value,
    ) -> Value {
        let body = crate::harness::voucher_body(title, stock, opens_in_ms, extra);
        let token = self.token("ops", true);
        let (status, voucher) = self
            .call("POST", "/vouchers", Some(&token), Some(body))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{voucher}");
        voucher
    }

    /// `method path` with an optional bearer token and JSON body: the status and the JSON
    /// body, which must be `application/json` and match the contract.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(
                method.parse().expect("a method"),
                format!("{}{path}", self.base),
            )
            .timeout(Duration::from_secs(60));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req
            .send()
            .await
            .expect("seckill-http answers under cargo lambda watch");
        let status = res.status();
        assert_eq!(
            res.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{method} {path}"
        );
        let body: Value = res.json().await.expect("JSON body");
        // The route is matched on the path alone, as API Gateway does (no query).
        let route_path = path.split('?').next().unwrap_or(path);
        contract().assert(route_key(method, route_path), status.as_u16(), &body);
        (status, body)
    }
}

impl Default for Api {
    fn default() -> Api {
        Api::new()
    }
}

impl Api {
    /// One scheduled run of the stack's drainer (the EventBridge event to its invoke
    /// URL): its summary, after checking it reports no error.
    pub async fn drain(&self) -> Value {
        let event: Value =
            serde_json::from_str(include_str!("../fixtures/eventbridge-scheduled.json"))
                .expect("the fixture is JSON");
        let res = self
            .http
            .post(self.env.drainer_invoke_url())
            .json(&event)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .expect("the drainer answers its invoke URL");
        let status = res.status();
        let summary: Value = res.json().await.expect("the drainer answers JSON");
        assert_eq!(status, StatusCode::OK, "{summary}");
        assert_eq!(
            summary["errors"], 0,
            "the drain reports no error: {summary}"
        );
        summary
    }
}

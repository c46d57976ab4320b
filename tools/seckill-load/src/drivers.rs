//! The callers: one [`Driver`] per concurrent caller, each holding its own connections,
//! as one Lambda instance holds its own.
//!
//! - [`InProcess`]: the real seckill-http handler ([`seckill_http::handle`]) with its own
//!   [`seckill_http::App`], fed API Gateway v2 requests built from an event template,
//!   each carrying a bearer token the function verifies (no HTTP anywhere);
//! - [`AdapterCaller`]: our engine without the handler (order-id block + `lua/admit.lua`),
//!   to show what the handler itself costs;
//! - [`TutorialCaller`]: the tutorial's admission (INCR per-day id key, then EVALSHA of
//!   `lua/bench/tutorial_seckill.lua`; an error reply of the server is a refusal);
//! - [`FloorCaller`]: one EVALSHA of `lua/bench/noop.lua`.

use std::sync::{Arc, LazyLock};

use anyhow::Context;
use futures::future::try_join_all;
use http::header::AUTHORIZATION;
use lambda_http::{Body, Request, RequestExt};
use redis::{AsyncCommands, ErrorKind, Script};
use seckill_http::error::CODES;
use seckill_http::{App, Config};
use seckill_shared::adapters::redis::{OrderIds, RedisConn, RedisSales};
use seckill_shared::config::RedisConfig;
use seckill_shared::domain::{Admission, UserId, VoucherId, now_millis};
use serde::Deserialize;

use crate::record::Outcome;
use crate::workload::{Tokens, user_name};

static TUTORIAL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/bench/tutorial_seckill.lua")));
static NOOP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/bench/noop.lua")));

/// The tutorial's id epoch: 2022-01-01T00:00:00Z.
const TUTORIAL_EPOCH_SECS: i64 = 1_640_995_200;

/// An API Gateway HTTP API (payload 2.0) event, as API Gateway sends it to the function.
const APIGW_EVENT: &str = r#"{
  "version": "2.0",
  "routeKey": "$default",
  "rawPath": "/",
  "rawQueryString": "",
  "headers": {
    "accept": "application/json",
    "host": "bench.execute-api.us-east-1.amazonaws.com",
    "user-agent": "seckill-load",
    "x-forwarded-for": "203.0.113.7",
    "x-forwarded-port": "443",
    "x-forwarded-proto": "https"
  },
  "requestContext": {
    "accountId": "123456789012",
    "apiId": "bench",
    "domainName": "bench.execute-api.us-east-1.amazonaws.com",
    "domainPrefix": "bench",
    "http": {
      "method": "POST",
      "path": "/",
      "protocol": "HTTP/1.1",
      "sourceIp": "203.0.113.7",
      "userAgent": "seckill-load"
    },
    "requestId": "bench",
    "routeKey": "$default",
    "stage": "$default",
    "time": "22/Nov/2026:10:00:00 +0000",
    "timeEpoch": 1795341600000
  },
  "isBase64Encoded": false
}"#;

/// The API Gateway v2 event of `POST /vouchers/{voucher}/seckill` with `authorization`
/// (a whole header value) when given.
pub fn seckill_event(voucher: VoucherId, authorization: Option<&str>) -> serde_json::Value {
    let mut event: serde_json::Value =
        serde_json::from_str(APIGW_EVENT).expect("the embedded event template is JSON");
    let path = format!("/vouchers/{voucher}/seckill");
    event["rawPath"] = path.clone().into();
    event["requestContext"]["http"]["path"] = path.into();
    if let Some(a) = authorization {
        event["headers"]["authorization"] = a.into();
    }
    event
}

/// `n` callers, each made by `make` with connections of its own.
pub async fn many<F, Fut>(n: usize, make: F) -> anyhow::Result<Vec<Driver>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Driver>>,
{
    try_join_all((0..n).map(|_| make())).await
}

/// One caller.
pub enum Driver {
    InProcess(Box<InProcess>),
    Adapter(AdapterCaller),
    Tutorial(TutorialCaller),
    Floor(FloorCaller),
}

impl Driver {
    /// One attempt by user `user`.
    pub async fn attempt(&mut self, user: u32) -> Outcome {
        match self {
            Driver::InProcess(d) => d.attempt(user).await,
            Driver::Adapter(d) => d.attempt(user).await,
            Driver::Tutorial(d) => d.attempt(user).await,
            Driver::Floor(d) => d.attempt().await,
        }
    }
}

/// The handler in this process, with an App of its own.
pub struct InProcess {
    app: App,
    template: http::request::Parts,
    tokens: Arc<Tokens>,
}

impl InProcess {
    /// A caller of its own App configured by `cfg`, buying `voucher`.
    pub async fn driver(
        cfg: &Config,
        voucher: VoucherId,
        tokens: Arc<Tokens>,
    ) -> anyhow::Result<Driver> {
        let app = App::new(cfg).await;
        let event = seckill_event(voucher, None);
        let req: Request = lambda_http::request::from_str(&event.to_string())
            .context("the event template does not parse as an API Gateway v2 request")?;
        let (template, _) = req
            .with_lambda_context(lambda_http::Context::default())
            .into_parts();
        Ok(Driver::InProcess(Box::new(InProcess {
            app,
            template,
            tokens,
        })))
    }

    async fn attempt(&mut self, user: u32) -> Outcome {
        let mut req = Request::from_parts(self.template.clone(), Body::Empty);
        req.headers_mut()
            .insert(AUTHORIZATION, self.tokens.header(user).clone());
        let res = seckill_http::handle(&self.app, req).await;
        classify(res.status().as_u16(), res.body().as_ref())
    }
}

/// Our engine without the handler: the order-id block and the admission script.
pub struct AdapterCaller {
    sales: RedisSales,
    ids: OrderIds,
    voucher: VoucherId,
}

impl AdapterCaller {
    pub async fn driver(cfg: &RedisConfig, voucher: VoucherId) -> anyhow::Result<Driver> {
        Ok(Driver::Adapter(AdapterCaller {
            sales: RedisSales::new(connect(cfg).await?),
            ids: OrderIds::default(),
            voucher,
        }))
    }

    async fn attempt(&mut self, user: u32) -> Outcome {
        let Ok(user) = UserId::parse(&user_name(user)) else {
            return Outcome::Failed("invalid user id".into());
        };
        let now = now_millis();
        let id = match self.ids.next(&self.sales, self.voucher, now).await {
            Ok(id) => id,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        match self.sales.admit(self.voucher, &user, id).await {
            Ok(reply) => match reply.admission {
                Admission::Admitted { order_id, .. } => Outcome::Admitted(order_id.get()),
                Admission::SoldOut => Outcome::Code("sold_out"),
                Admission::AlreadyPurchased { .. } => Outcome::Code("already_purchased"),
                Admission::NotLoaded => Outcome::Code("not_found"),
                Admission::NotStarted => Outcome::Code("not_started"),
                Admission::Ended => Outcome::Code("ended"),
            },
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// The keys of the tutorial's admission for one voucher of one run.
#[derive(Debug, Clone)]
pub struct TutorialKeys {
    /// Prefix of every key of the run (`bench:<run>:`).
    pub prefix: String,
    pub voucher: i64,
}

impl TutorialKeys {
    pub fn stock(&self) -> String {
        format!("{}seckill:stock:{}", self.prefix, self.voucher)
    }
    pub fn buyers(&self) -> String {
        format!("{}seckill:order:{}", self.prefix, self.voucher)
    }
    pub fn stream(&self) -> String {
        format!("{}stream.orders", self.prefix)
    }
    /// The keys a run leaves behind.
    pub fn all(&self) -> [String; 3] {
        [self.stock(), self.buyers(), self.stream()]
    }
    /// The id counter of the UTC day of `t`.
    pub fn id_counter(&self, t: time::OffsetDateTime) -> String {
        format!(
            "{}icr:order:{:04}:{:02}:{:02}",
            self.prefix,
            t.year(),
            u8::from(t.month()),
            t.day()
        )
    }
}

/// The tutorial's admission.
pub struct TutorialCaller {
    conn: RedisConn,
    keys: Arc<TutorialKeys>,
}

impl TutorialCaller {
    pub async fn driver(cfg: &RedisConfig, keys: Arc<TutorialKeys>) -> anyhow::Result<Driver> {
        Ok(Driver::Tutorial(TutorialCaller {
            conn: connect(cfg).await?,
            keys,
        }))
    }

    async fn attempt(&mut self, user: u32) -> Outcome {
        let now = time::OffsetDateTime::now_utc();
        let count: i64 = match self.conn.incr(self.keys.id_counter(now), 1).await {
            Ok(c) => c,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let order_id = ((now.unix_timestamp() - TUTORIAL_EPOCH_SECS) << 32) | count;
        let code: Result<i64, _> = TUTORIAL
            .arg(self.keys.voucher)
            .arg(user_name(user))
            .arg(order_id)
            .arg(&self.keys.prefix)
            .invoke_async(&mut self.conn)
            .await;
        match code {
            Ok(0) => Outcome::Admitted(order_id),
            Ok(1) => Outcome::Code("sold_out"),
            Ok(2) => Outcome::Code("already_purchased"),
            Ok(other) => Outcome::Failed(format!("tutorial script answered {other}")),
            // A cluster of several shards refuses the script's undeclared keys: the
            // server's words (code and message), not the client's rendering of them.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                Outcome::Refused(match (e.code(), e.detail()) {
                    (Some(code), Some(detail)) => format!("{code} {detail}"),
                    _ => e.to_string(),
                })
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// The no-op script.
pub struct FloorCaller {
    conn: RedisConn,
}

impl FloorCaller {
    pub async fn driver(cfg: &RedisConfig) -> anyhow::Result<Driver> {
        Ok(Driver::Floor(FloorCaller {
            conn: connect(cfg).await?,
        }))
    }

    async fn attempt(&mut self) -> Outcome {
        match NOOP
            .prepare_invoke()
            .invoke_async::<i64>(&mut self.conn)
            .await
        {
            Ok(_) => Outcome::Code("ok"),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// A connection of a caller of its own.
async fn connect(cfg: &RedisConfig) -> anyhow::Result<RedisConn> {
    RedisConn::connect(cfg)
        .await
        .with_context(|| format!("cannot connect to Redis at {}", cfg.url))
}

#[derive(Deserialize)]
struct Reply {
    order_id: Option<String>,
    code: Option<String>,
}

/// Sorts a response of the seckill route into an outcome.
pub fn classify(status: u16, body: &[u8]) -> Outcome {
    let reply: Option<Reply> = serde_json::from_slice(body).ok();
    match (status, reply) {
        (
            202,
            Some(Reply {
                order_id: Some(id), ..
            }),
        ) => match id.parse::<i64>() {
            Ok(id) => Outcome::Admitted(id),
            Err(_) => Outcome::Failed(format!("202 with order_id {id:?}")),
        },
        (_, Some(Reply { code: Some(c), .. })) => match CODES.iter().find(|k| **k == c) {
            Some(k) => Outcome::Code(k),
            None => Outcome::Failed(format!("status {status} with unknown code {c:?}")),
        },
        _ => Outcome::Failed(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_sort_into_outcomes() {
        assert_eq!(
            classify(202, br#"{"order_id":"42","status":"pending"}"#),
            Outcome::Admitted(42)
        );
        assert_eq!(
            classify(409, br#"{"code":"sold_out","message":"sold out"}"#),
            Outcome::Code("sold_out")
        );
        assert!(matches!(classify(502, b"Bad Gateway"), Outcome::Failed(_)));
        assert!(matches!(
            classify(409, br#"{"code":"weird"}"#),
            Outcome::Failed(_)
        ));
    }

    #[test]
    fn the_event_template_is_a_seckill_request() {
        let v = VoucherId::new(77).unwrap();
        let e = seckill_event(v, Some("Bearer x"));
        let req = lambda_http::request::from_str(&e.to_string()).unwrap();
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(req.uri().path(), "/vouchers/77/seckill");
        assert_eq!(req.headers()["authorization"], "Bearer x");
    }
}

//! The callers: one [`Driver`] per concurrent caller, each holding its own connections,
//! as one Lambda instance holds its own.
//!
//! - [`Driver::InProcess`]: the real seckill-http handler ([`seckill_http::handle`])
//!   with its own [`seckill_http::App`], fed API Gateway v2 requests built from an event
//!   template, each carrying a bearer token the function verifies (no HTTP anywhere);
//! - [`Driver::Adapter`]: our engine without the handler (order-id block +
//!   `lua/admit.lua`), to show what the handler itself costs;
//! - [`Driver::Tutorial`]: the tutorial's admission (INCR per-day id key, then EVALSHA of
//!   `lua/bench/tutorial_seckill.lua`; an error reply of the server is a refusal);
//! - [`Driver::Floor`]: one EVALSHA of `lua/bench/noop.lua`.

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

/// The API Gateway v2 event of `POST /vouchers/{voucher}/seckill` (the tests' fixture of
/// an event as API Gateway sends it), with `authorization` (a whole header value).
pub fn seckill_event(voucher: VoucherId, authorization: Option<&str>) -> serde_json::Value {
    let mut event: serde_json::Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/apigw-v2-request.json"
    ))
    .expect("the tests' event fixture is JSON");
    let path = format!("/vouchers/{voucher}/seckill");
    event["rawPath"] = path.clone().into();
    event["requestContext"]["http"]["path"] = path.into();
    event["requestContext"]["http"]["method"] = "POST".into();
    if let Some(headers) = event["headers"].as_object_mut() {
        headers.remove("content-type");
        headers.extend(authorization.map(|a| ("authorization".to_string(), a.into())));
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
    /// The handler in this process, with an App of its own.
    InProcess(Box<InProcess>),
    /// Our engine without the handler: the order-id block and the admission script.
    Adapter {
        sales: RedisSales,
        ids: OrderIds,
        voucher: VoucherId,
    },
    /// The tutorial's admission.
    Tutorial {
        conn: RedisConn,
        keys: Arc<TutorialKeys>,
    },
    /// The no-op script.
    Floor(RedisConn),
}

pub struct InProcess {
    app: Arc<App>,
    template: http::request::Parts,
    tokens: Arc<Tokens>,
}

impl Driver {
    /// A caller of its own App configured by `cfg`, buying `voucher`.
    pub async fn in_process(
        cfg: &Config,
        voucher: VoucherId,
        tokens: Arc<Tokens>,
    ) -> anyhow::Result<Driver> {
        let app = Arc::new(App::new(cfg).await);
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

    /// The handler's App, for a caller of the real handler.
    pub fn app(&self) -> Option<Arc<App>> {
        match self {
            Driver::InProcess(d) => Some(d.app.clone()),
            _ => None,
        }
    }

    pub async fn adapter(cfg: &RedisConfig, voucher: VoucherId) -> anyhow::Result<Driver> {
        Ok(Driver::Adapter {
            sales: RedisSales::new(connect(cfg).await?),
            ids: OrderIds::default(),
            voucher,
        })
    }

    pub async fn tutorial(cfg: &RedisConfig, keys: Arc<TutorialKeys>) -> anyhow::Result<Driver> {
        let conn = connect(cfg).await?;
        Ok(Driver::Tutorial { conn, keys })
    }

    pub async fn floor(cfg: &RedisConfig) -> anyhow::Result<Driver> {
        Ok(Driver::Floor(connect(cfg).await?))
    }

    /// One attempt by user `user` (an error of the caller's own is [`Outcome::Failed`]).
    pub async fn attempt(&mut self, user: u32) -> Outcome {
        let outcome = async {
            Ok(match self {
                Driver::InProcess(d) => {
                    let mut req = Request::from_parts(d.template.clone(), Body::Empty);
                    req.headers_mut()
                        .insert(AUTHORIZATION, d.tokens.header(user).clone());
                    let res = seckill_http::handle(&d.app, req).await;
                    classify(res.status().as_u16(), res.body().as_ref())
                }
                Driver::Adapter {
                    sales,
                    ids,
                    voucher,
                } => {
                    let user = UserId::parse(&user_name(user)).context("invalid user id")?;
                    let id = ids.next(sales, *voucher, now_millis()).await?;
                    match sales.admit(*voucher, &user, id).await?.admission {
                        Admission::Admitted { order_id, .. } => Outcome::Admitted(order_id.get()),
                        Admission::SoldOut => Outcome::Code("sold_out"),
                        Admission::AlreadyPurchased { .. } => Outcome::Code("already_purchased"),
                        Admission::NotLoaded => Outcome::Code("not_found"),
                        Admission::NotStarted => Outcome::Code("not_started"),
                        Admission::Ended => Outcome::Code("ended"),
                    }
                }
                Driver::Tutorial { conn, keys } => tutorial_attempt(conn, keys, user).await,
                Driver::Floor(conn) => {
                    NOOP.prepare_invoke().invoke_async::<i64>(conn).await?;
                    Outcome::Code("ok")
                }
            })
        };
        outcome
            .await
            .unwrap_or_else(|e: anyhow::Error| Outcome::Failed(e.to_string()))
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

/// The tutorial's admission: INCR of the day's id counter, then its script.
async fn tutorial_attempt(conn: &mut RedisConn, keys: &TutorialKeys, user: u32) -> Outcome {
    let now = time::OffsetDateTime::now_utc();
    let count: i64 = match conn.incr(keys.id_counter(now), 1).await {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let order_id = ((now.unix_timestamp() - TUTORIAL_EPOCH_SECS) << 32) | count;
    let code: Result<i64, _> = TUTORIAL
        .arg(keys.voucher)
        .arg(user_name(user))
        .arg(order_id)
        .arg(&keys.prefix)
        .invoke_async(conn)
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

/// A Redis connection of its own (a caller's, or the run's).
pub(crate) async fn connect(cfg: &RedisConfig) -> anyhow::Result<RedisConn> {
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
    match serde_json::from_slice::<Reply>(body) {
        Ok(Reply {
            order_id: Some(id), ..
        }) if status == 202 => match id.parse::<i64>() {
            Ok(id) => Outcome::Admitted(id),
            Err(_) => Outcome::Failed(format!("202 with order_id {id:?}")),
        },
        Ok(Reply { code: Some(c), .. }) => match CODES.iter().find(|k| **k == c) {
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

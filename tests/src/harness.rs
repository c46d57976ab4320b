//! Backends of one's own for a test: a private Redis, a fresh database with the schema
//! applied through the Data API, and an in-process `data-api-local` in front of it; and
//! API Gateway v2 fixture requests for calling the handlers directly.
//!
//! As in AWS, the schema is applied with the master secret (the stack's admin user) and
//! the functions under test sign in as an application user of their own (made by
//! `migrate::ensure_app_user`, named like the database, with only the functions' grants
//! on it); the test's own fixture client [`Backends::db`] keeps the master secret.

use std::time::Duration;

use data_api_local::ServerConfig;
use lambda_http::{Body, Request, RequestExt, Response};
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::config::DataApiConfig;
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use seckill_shared::migrate;
use serde_json::{Value, json};

use crate::mysql::{
    LocalDataApi, app_secret, drop_database, drop_user, fresh_database, start_data_api,
    url_with_database,
};
use crate::redis::RedisServer;
use crate::stack::StackEnv;

/// The dev secret the harness configures.
pub const TEST_JWT_SECRET: &str = "harness-secret";

/// The payment webhook's secrets in tests: the current one (the provider signs with it)
/// and the previous one, still accepted (a rotation under way).
pub const TEST_WEBHOOK_SECRET: &str = "whsec_test_current_0123456789";
pub const TEST_WEBHOOK_PREVIOUS: &str = "whsec_test_previous_0123456789";

/// The waiting rooms' entry-token secrets in tests: the current one (tokens are signed
/// with it) and the previous one, still accepted.
pub const TEST_ENTRY_SECRET: &str = "entry_test_current_0123456789";
pub const TEST_ENTRY_PREVIOUS: &str = "entry_test_previous_0123456789";

/// The price of the tests' vouchers with a payment step (`price_minor`, `currency`).
pub const TEST_PRICE_MINOR: i64 = 1_999;
pub const TEST_CURRENCY: &str = "EUR";

/// A private Redis, a fresh migrated database and a Data API server for it.
pub struct Backends {
    pub redis: RedisServer,
    pub data_api: LocalDataApi,
    pub mysql_url: String,
    pub database: String,
    /// The fixture client: master secret, every right on the database.
    pub db: DataApi,
    /// The application user's secret, which the functions under test use.
    pub app_secret_arn: String,
    pub sales: RedisSales,
}

impl Backends {
    /// Starts everything; the database lives on the stack's MariaDB.
    pub async fn start() -> Backends {
        Backends::start_with(RedisServer::start()).await
    }

    /// The same with a Redis of the test's choosing (e.g. a cluster with replicas).
    pub async fn start_with(redis: RedisServer) -> Backends {
        let mysql_url = StackEnv::load().mysql_url();
        let database = fresh_database(&mysql_url).await;
        // The user is named like the database: one of its own per test.
        let app = app_secret(&database);
        let mut config = ServerConfig::new(url_with_database(&mysql_url, &database));
        config.secrets.push(app.clone());
        let data_api = start_data_api(config).await;
        let cfg = data_api_config(&data_api, &data_api.secret_arn, &database);
        let db = DataApi::connect(&cfg).await;
        migrate::apply(&db, &migrate::embedded())
            .await
            .expect("migrations apply to a fresh database");
        let user = migrate::AppUser::new(&app.username, &app.password).expect("a valid app user");
        migrate::ensure_app_user(&db, &user)
            .await
            .expect("the application user is made");
        let sales = RedisSales::new(redis.connect().await);
        Backends {
            redis,
            data_api,
            mysql_url,
            database,
            db,
            app_secret_arn: app.arn,
            sales,
        }
    }

    /// This database with the master secret (every right on it: DDL, fixtures).
    pub fn master_data_api_config(&self) -> DataApiConfig {
        data_api_config(&self.data_api, &self.data_api.secret_arn, &self.database)
    }

    /// How a function reaches this database: as the application user.
    pub fn data_api_config(&self) -> DataApiConfig {
        data_api_config(&self.data_api, &self.app_secret_arn, &self.database)
    }

    /// seckill-http's configuration for these backends.
    pub fn http_config(&self) -> seckill_http::Config {
        test_http_config(self.redis.config(), self.data_api_config())
    }

    /// Drops the database and its application user (Redis and the server stop when
    /// dropped).
    pub async fn cleanup(self) {
        drop_database(&self.mysql_url, &self.database).await;
        drop_user(&self.mysql_url, &self.database).await;
    }
}

fn data_api_config(data_api: &LocalDataApi, secret_arn: &str, database: &str) -> DataApiConfig {
    DataApiConfig {
        cluster_arn: data_api.resource_arn.clone(),
        secret_arn: secret_arn.to_string(),
        database: database.to_string(),
        endpoint: Some(data_api.server.url()),
        timeout: Duration::from_secs(10),
    }
}

/// A signed dev token for `sub`, valid for an hour.
pub fn token(sub: &str, admin: bool) -> String {
    let exp = time::OffsetDateTime::now_utc().unix_timestamp() + 3600;
    seckill_shared::auth::mint_hs256(
        TEST_JWT_SECRET.as_bytes(),
        sub,
        admin.then_some(seckill_shared::auth::ADMIN_SCOPE),
        exp,
    )
}

/// seckill-http's configuration for tests on these backends: tokens signed with
/// [`TEST_JWT_SECRET`], no rate limits (suites that test limits set their own).
pub fn test_http_config(
    redis: seckill_shared::config::RedisConfig,
    data_api: DataApiConfig,
) -> seckill_http::Config {
    seckill_http::Config {
        redis,
        data_api,
        dev_jwt_secret: Some(TEST_JWT_SECRET.to_string()),
        user_rate_per_sec: 0,
        user_rate_burst: 0,
        source_rate_per_sec: 0,
        source_rate_burst: 0,
        read_rate_per_sec: 0,
        read_rate_burst: 0,
        repair_part_rows: 100_000,
        in_lambda: false,
        webhook: seckill_http::payment::SecretSource::Inline(
            seckill_shared::webhook::Secrets::parse(&format!(
                "{TEST_WEBHOOK_SECRET},{TEST_WEBHOOK_PREVIOUS}"
            ))
            .expect("test secrets"),
        ),
        entry: seckill_http::secrets::SecretSource::Inline(
            seckill_shared::webhook::Secrets::parse(&format!(
                "{TEST_ENTRY_SECRET},{TEST_ENTRY_PREVIOUS}"
            ))
            .expect("test secrets"),
        ),
        // Checkout without a provider of its own (the stack's suites have Stripe).
        stripe: None,
        stripe_webhook: seckill_http::secrets::SecretSource::Missing,
        payment_grace_s: seckill_http::config::DEFAULT_PAYMENT_GRACE_S,
        edge: seckill_http::secrets::SecretSource::Missing,
    }
}

/// The body of a payment provider's event (`payment.succeeded` or `payment.failed`).
pub fn provider_event(
    kind: &str,
    order: &str,
    buyer: &str,
    payment_id: &str,
    amount_minor: i64,
    currency: &str,
) -> String {
    use seckill_shared::webhook::{Event, EventType, PaymentData};
    let event_type: EventType = serde_json::from_value(json!(kind)).expect("an event type");
    let data = PaymentData {
        payment_id: payment_id.to_string(),
        order_id: order.to_string(),
        buyer: buyer.to_string(),
        amount_minor,
        currency: currency.to_string(),
    };
    Event::created_now(format!("evt_{payment_id}_{kind}"), event_type, data).body()
}

/// `POST /payments/webhook` with `body` and, if given, the signature header (no token:
/// the provider has none).
pub fn webhook_request(body: &str, signature: Option<&str>) -> Request {
    let mut req = request("POST", "/payments/webhook", None, Some(body), None);
    if let Some(sig) = signature {
        req.headers_mut().insert(
            seckill_shared::webhook::SIGNATURE_HEADER,
            sig.parse().expect("an ASCII header"),
        );
    }
    req
}

/// The signature header the provider sends with `body` now, signed with `secret`.
pub fn signature_now(secret: &str, body: &str) -> String {
    let now = seckill_shared::domain::now_millis() / 1000;
    seckill_shared::webhook::header(&[secret.as_bytes()], now, body.as_bytes())
}

/// Delivers `body` to the webhook as the provider does: signed now with the current
/// secret.
pub async fn deliver(app: &seckill_http::App, body: &str) -> (u16, Value) {
    let sig = signature_now(TEST_WEBHOOK_SECRET, body);
    call(app, webhook_request(body, Some(&sig))).await
}

/// The provider confirms payment `payment_id` of `order` (bought by `buyer`) for the
/// tests' price: a signed `payment.succeeded`. The answer's `outcome` says what it did.
pub async fn provider_pays(
    app: &seckill_http::App,
    order: &str,
    buyer: &str,
    payment_id: &str,
) -> (u16, Value) {
    let body = provider_event(
        "payment.succeeded",
        order,
        buyer,
        payment_id,
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    deliver(app, &body).await
}

/// The API Gateway v2 event fixture, as API Gateway would send it for this call.
pub fn fixture_event() -> Value {
    serde_json::from_str(include_str!("../fixtures/apigw-v2-request.json"))
        .expect("fixture is JSON")
}

/// A request built from the fixture: method, path, optional bearer token, optional body,
/// optional JWT authorizer claims (what API Gateway passes after verifying a token).
pub fn request(
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&str>,
    claims: Option<Value>,
) -> Request {
    let mut event = fixture_event();
    event["rawPath"] = json!(path);
    event["requestContext"]["http"]["method"] = json!(method);
    event["requestContext"]["http"]["path"] = json!(path);
    // As API Gateway sends it: the route it matched and that route's path parameters
    // (a path matching no route keeps the fixture's `$default`).
    let parsed = method.parse().ok();
    if let Some(route) = parsed.and_then(|m| seckill_http::routes::Route::parse(&m, path)) {
        let (key, param) = route.key();
        event["routeKey"] = json!(key);
        event["requestContext"]["routeKey"] = json!(key);
        if let Some((name, value)) = param {
            event["pathParameters"] = json!({ name: value });
        }
    }
    if let Some(t) = bearer {
        event["headers"]["authorization"] = json!(format!("Bearer {t}"));
    }
    if let Some(b) = body {
        event["body"] = json!(b);
    }
    if let Some(c) = claims {
        event["requestContext"]["authorizer"] = json!({ "jwt": { "claims": c, "scopes": null } });
    }
    lambda_http::request::from_str(&event.to_string())
        .expect("fixture parses as an API Gateway v2 request")
        .with_lambda_context(lambda_http::Context::default())
}

/// Status and JSON body of a handler's response.
pub fn read(res: Response<Body>) -> (u16, Value) {
    let status = res.status().as_u16();
    assert_eq!(
        res.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json"),
        "every response is JSON"
    );
    let body: Value = serde_json::from_slice(res.body().as_ref()).expect("body is JSON");
    (status, body)
}

/// The handler's answer to `req`: status and JSON body, checked against the contract
/// (`docs/openapi.yaml`, [`crate::contract`]).
pub async fn call(app: &seckill_http::App, req: Request) -> (u16, Value) {
    let route = crate::contract::route_key_of(&req);
    // Boxed: the handler's state machine is large, and a test polling it inline on its
    // own thread's stack (debug build) can overflow it; the Lambda runtime spawns it.
    let (status, body) = read(Box::pin(seckill_http::handle(app, req)).await);
    crate::contract::contract().assert(route.as_deref(), status, &body);
    (status, body)
}

/// The body of `POST /vouchers`: `title`, `stock`, on sale from `opens_in_ms` from now
/// (negative: open already) for an hour, with the fields of `extra` besides (a payment
/// step, a waiting room, ...).
pub fn voucher_body(title: &str, stock: i64, opens_in_ms: i64, extra: Value) -> Value {
    let now = now_millis();
    let mut body = json!({
        "title": title,
        "stock": stock,
        "begins_at": format_rfc3339_millis(now + opens_in_ms),
        "ends_at": format_rfc3339_millis(now + 3_600_000),
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

/// `POST /vouchers` as an admin with `body`, through the handler: the created voucher
/// (the answer must be `201`).
pub async fn create_voucher(app: &seckill_http::App, body: &Value) -> Value {
    let (status, created) = call(
        app,
        request(
            "POST",
            "/vouchers",
            Some(&token("admin", true)),
            Some(&body.to_string()),
            None,
        ),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created
}

/// `POST /vouchers/{voucher}/seckill` as `user` (a valid token), through the handler.
pub async fn buy(
    app: &seckill_http::App,
    voucher: impl std::fmt::Display,
    user: &str,
) -> (u16, Value) {
    let path = format!("/vouchers/{voucher}/seckill");
    call(
        app,
        request("POST", &path, Some(&token(user, false)), None, None),
    )
    .await
}

//! The routes of the public HTTP contract (docs/http-api.md) and their handlers.
//!
//! [`handle`] is the whole function: tests call it with API Gateway v2 fixture events,
//! `main` hands it to `lambda_http::run`. Each handler returns `Result<_, ApiError>`; the
//! error becomes a response in exactly one place ([`ApiError::into_response`]).

use http::{Method, StatusCode};
use lambda_http::aws_lambda_events::query_map::QueryMap;
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response};
use seckill_shared::adapters::rate;
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{
    Admission, AdmitReply, Bucket, NewVoucher, OrderId, OrderStatus, PaymentTerms, UnixMillis,
    UserId, Voucher, VoucherId, format_rfc3339_millis, now_millis,
};
use seckill_shared::json;
use serde::Deserialize;
use serde_json::json;

use crate::app::App;
use crate::cache::Known;
use crate::error::{ApiError, json_response};
use crate::identity::{identify, require_admin};
use crate::limiter::Source;
use crate::payment;
use crate::repair::repair;
use seckill_shared::auth::Identity;

/// Every route: method, path pattern, whether it needs a token. The SAM template must
/// declare exactly these (a test compares them).
pub const ROUTES: &[(&str, &str, bool)] = &[
    ("POST", "/vouchers", true),
    ("GET", "/vouchers/{id}", false),
    ("POST", "/vouchers/{id}/seckill", true),
    ("GET", "/orders/{order_id}", true),
    ("GET", "/vouchers/{id}/order", true),
    ("POST", "/orders/{order_id}/pay", true),
    ("POST", "/orders/{order_id}/cancel", true),
    ("POST", "/payments/webhook", false),
];

/// The largest request body accepted (a voucher is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// A recognised route with its path parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    CreateVoucher,
    GetVoucher(&'a str),
    Seckill(&'a str),
    GetOrder(&'a str),
    /// The caller's order for a voucher.
    BuyerOrder(&'a str),
    /// Start paying an order (vouchers with a payment step).
    PayOrder(&'a str),
    /// Cancel an unpaid order (vouchers with a payment step).
    CancelOrder(&'a str),
    /// The payment provider's signed event.
    PaymentWebhook,
}

impl<'a> Route<'a> {
    /// The route of a request. Behind API Gateway that is the route it matched
    /// (`routeKey`, with its `pathParameters`): the one whose authorizer and scopes it
    /// enforced, so the function never answers a route other than the one API Gateway
    /// checked, whatever the raw path says. Without one (`$default`: `cargo lambda
    /// watch`, a Function URL) the method and path are matched ([`Route::parse`]).
    pub fn of(req: &'a Request) -> Option<Route<'a>> {
        match gateway_route_key(req) {
            Some(key) => Route::from_key(key, req.path_parameters_ref()),
            None => Route::parse(req.method(), req.uri().path()),
        }
    }

    /// The route named by an API Gateway route key (`"GET /vouchers/{id}"`, as in
    /// [`ROUTES`]), its parameter taken from `params`; `None` for any other key or a
    /// missing parameter.
    pub fn from_key(key: &str, params: Option<&'a QueryMap>) -> Option<Route<'a>> {
        let param = |name: &str| params.and_then(|p| p.first(name));
        Some(match key {
            "POST /vouchers" => Route::CreateVoucher,
            "GET /vouchers/{id}" => Route::GetVoucher(param("id")?),
            "POST /vouchers/{id}/seckill" => Route::Seckill(param("id")?),
            "GET /orders/{order_id}" => Route::GetOrder(param("order_id")?),
            "GET /vouchers/{id}/order" => Route::BuyerOrder(param("id")?),
            "POST /orders/{order_id}/pay" => Route::PayOrder(param("order_id")?),
            "POST /orders/{order_id}/cancel" => Route::CancelOrder(param("order_id")?),
            "POST /payments/webhook" => Route::PaymentWebhook,
            _ => return None,
        })
    }

    /// The API Gateway route key of this route and its path parameter (name, value):
    /// what API Gateway sends for it (test fixtures build their events with this).
    pub fn key(&self) -> (&'static str, Option<(&'static str, &'a str)>) {
        match *self {
            Route::CreateVoucher => ("POST /vouchers", None),
            Route::GetVoucher(id) => ("GET /vouchers/{id}", Some(("id", id))),
            Route::Seckill(id) => ("POST /vouchers/{id}/seckill", Some(("id", id))),
            Route::GetOrder(id) => ("GET /orders/{order_id}", Some(("order_id", id))),
            Route::BuyerOrder(id) => ("GET /vouchers/{id}/order", Some(("id", id))),
            Route::PayOrder(id) => ("POST /orders/{order_id}/pay", Some(("order_id", id))),
            Route::CancelOrder(id) => ("POST /orders/{order_id}/cancel", Some(("order_id", id))),
            Route::PaymentWebhook => ("POST /payments/webhook", None),
        }
    }

    /// Matches a method and path; a trailing slash is ignored.
    pub fn parse(method: &Method, path: &'a str) -> Option<Route<'a>> {
        // Up to four segments without allocating; a fourth means no route matches.
        let mut it = path.trim_matches('/').split('/');
        let segments = [it.next(), it.next(), it.next(), it.next()];
        match (method.as_str(), segments) {
            ("POST", [Some("vouchers"), None, ..]) => Some(Route::CreateVoucher),
            ("GET", [Some("vouchers"), Some(id), None, _]) => Some(Route::GetVoucher(id)),
            ("POST", [Some("vouchers"), Some(id), Some("seckill"), None]) => {
                Some(Route::Seckill(id))
            }
            ("GET", [Some("vouchers"), Some(id), Some("order"), None]) => {
                Some(Route::BuyerOrder(id))
            }
            ("GET", [Some("orders"), Some(id), None, _]) => Some(Route::GetOrder(id)),
            ("POST", [Some("orders"), Some(id), Some("pay"), None]) => Some(Route::PayOrder(id)),
            ("POST", [Some("orders"), Some(id), Some("cancel"), None]) => {
                Some(Route::CancelOrder(id))
            }
            ("POST", [Some("payments"), Some("webhook"), None, _]) => Some(Route::PaymentWebhook),
            _ => None,
        }
    }
}

impl Route<'_> {
    /// The method a declared path takes (each takes exactly one), `None` for a path no
    /// route declares.
    pub fn allowed_method(path: &str) -> Option<&'static str> {
        [Method::GET, Method::POST]
            .into_iter()
            .find(|m| Route::parse(m, path).is_some())
            .map(|m| if m == Method::GET { "GET" } else { "POST" })
    }

    /// What a successful answer on this route is called in the request log.
    fn success(&self) -> &'static str {
        match self {
            Route::CreateVoucher => "created",
            Route::Seckill(_) => "admitted",
            Route::PayOrder(_) => "payment_started",
            Route::CancelOrder(_) => "cancelled",
            Route::PaymentWebhook => "payment_event",
            Route::GetVoucher(_) | Route::GetOrder(_) | Route::BuyerOrder(_) => "ok",
        }
    }

    /// The voucher id as it appears in the path, for the request log.
    fn voucher_param(&self) -> &str {
        match self {
            Route::GetVoucher(id) | Route::Seckill(id) | Route::BuyerOrder(id) => id,
            Route::CreateVoucher
            | Route::GetOrder(_)
            | Route::PayOrder(_)
            | Route::CancelOrder(_)
            | Route::PaymentWebhook => "",
        }
    }
}

/// Handles one request. Never fails and never panics on input: every outcome is a JSON
/// response.
///
/// Each request is logged as one event, written after the answer is known. During a sale
/// almost every request is a `sold_out` (or `not_started`/`ended`), mostly answered from
/// this instance's memory in microseconds; those refusals are logged at DEBUG, because
/// formatting a log line would cost more than the answer and CloudWatch would bill a
/// line for each of a million refusals. Everything else is logged at INFO.
pub async fn handle(app: &App, req: Request) -> Response<Body> {
    let route = Route::of(&req);
    let result = match &route {
        // Boxed: the handlers' state machines together are large, and a caller that
        // polls this future on its own stack (a test's runtime, debug builds) must not
        // carry them there.
        Some(route) => Box::pin(dispatch(app, &req, route)).await,
        None => Err(no_route(&req)),
    };
    let (res, outcome, refusal) = match result {
        Ok(res) => (res, route.as_ref().map_or("ok", Route::success), false),
        Err(err) => {
            let (code, refusal) = (err.code(), err.is_sale_refusal());
            (err.into_response(), code, refusal)
        }
    };
    let voucher_id = route.as_ref().map_or("", Route::voucher_param);
    let status = res.status().as_u16();
    record_metrics(route.as_ref(), outcome, status);
    if refusal {
        tracing::debug!(status, outcome, voucher_id, "handled");
    } else {
        let request_id = req
            .lambda_context_ref()
            .map(|c| c.request_id.as_str())
            .unwrap_or_default();
        let method = req.method().as_str();
        tracing::info!(status, outcome, voucher_id, method, request_id, "handled");
    }
    res
}

/// The answer to a request no route matches: `405` with the method the path takes when
/// the path is declared (API Gateway itself answers such requests `404` in AWS: only
/// requests matching no route reach the function, through `$default` locally),
/// `404` otherwise.
fn no_route(req: &Request) -> ApiError {
    let (method, path) = (req.method(), req.uri().path());
    // A route key of someone else's (`ANY /{proxy+}`) says nothing about our paths.
    let allow = match gateway_route_key(req) {
        Some(_) => None,
        None => Route::allowed_method(path),
    };
    match allow {
        Some(allow) => ApiError::MethodNotAllowed {
            method: method.to_string(),
            allow,
        },
        None => ApiError::NotFound(format!("no route for {method} {path}")),
    }
}

/// The route API Gateway matched, unless it is the catch-all `$default` (`cargo lambda
/// watch`, a Function URL) or there is none.
fn gateway_route_key(req: &Request) -> Option<&str> {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => {
            ctx.route_key.as_deref().filter(|k| *k != "$default")
        }
        _ => None,
    }
}

/// The request in the EMF metrics (`seckill_shared::metrics`): admissions by outcome, 5xx
/// answers; flushed every few requests.
fn record_metrics(route: Option<&Route<'_>>, outcome: &'static str, status: u16) {
    use seckill_shared::metrics;
    if matches!(route, Some(Route::Seckill(_))) {
        metrics::admission(outcome);
    }
    if status >= 500 {
        metrics::http_5xx();
    }
    metrics::request_done();
}

async fn dispatch(app: &App, req: &Request, route: &Route<'_>) -> Result<Response<Body>, ApiError> {
    // On a protected route, who calls comes before what they ask: a request without a
    // valid token is 401 whatever its path holds, as behind API Gateway, whose authorizer
    // answers before the function runs.
    let who = || {
        let now = now_millis();
        identify(req, app.dev_secret.as_deref(), now_secs(now)).map(|caller| (caller, now))
    };
    match *route {
        Route::GetVoucher(id) => get_voucher(app, req, id.parse()?).await,
        Route::CreateVoucher => {
            let (caller, now) = who()?;
            create_voucher(app, req, &caller, now).await
        }
        Route::Seckill(id) => {
            let (caller, now) = who()?;
            seckill(app, &caller, now, id.parse()?).await
        }
        Route::GetOrder(id) => {
            let (caller, now) = who()?;
            let id = id.parse()?;
            limit_reads(app, &caller, now).await?;
            get_order(app, &caller, id).await
        }
        Route::BuyerOrder(id) => {
            let (caller, now) = who()?;
            let id = id.parse()?;
            limit_reads(app, &caller, now).await?;
            buyer_order(app, &caller, id).await
        }
        Route::PayOrder(id) => {
            let (caller, now) = who()?;
            payment::start_payment(app, &caller, now, id.parse()?).await
        }
        Route::CancelOrder(id) => {
            let (caller, now) = who()?;
            payment::cancel_order(app, &caller, now, id.parse()?).await
        }
        // No token: the provider signs its events (checked before anything is read).
        Route::PaymentWebhook => payment::webhook(app, req, now_millis()).await,
    }
}

/// A read of orders costs the database several queries: held per user in this instance
/// (as every authenticated route is), then across every instance (`lua/rate.lua`, one
/// Redis call), so warm instances do not multiply what one user may read. When Redis
/// cannot answer, the instance's own limit stands alone (the read goes on).
async fn limit_reads(app: &App, caller: &Identity, now: UnixMillis) -> Result<(), ApiError> {
    if !app.limiter.allow(&caller.user, now) {
        return Err(ApiError::RateLimited);
    }
    let allowed = match app.sales().await {
        Ok(sales) => {
            rate::allow(&sales.conn(), "reads", caller.user.as_str(), app.read_limit).await
        }
        Err(e) => Err(e),
    };
    match allowed {
        Ok(true) => Ok(()),
        Ok(false) => Err(ApiError::RateLimited),
        Err(error) => {
            tracing::warn!(%error, "shared rate limit unavailable; this instance's limit stands");
            Ok(())
        }
    }
}

/// The address API Gateway saw the request come from.
fn source_of(req: &Request) -> Source {
    Source::of(match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.http.source_ip.as_deref(),
        _ => None,
    })
}

fn now_secs(now: UnixMillis) -> i64 {
    now.div_euclid(1000)
}

/// The body of `POST /vouchers`. An optional field is absent or holds a value of its
/// type: `null` is refused, as the contract's schema says.
#[derive(Deserialize)]
struct CreateVoucherBody {
    title: String,
    #[serde(deserialize_with = "json::integral")]
    stock: i64,
    begins_at: String,
    ends_at: String,
    /// Opt-in payment step: seconds a buyer has to pay after admission.
    #[serde(default, deserialize_with = "json::optional_integral")]
    pay_within_s: Option<i64>,
    /// With `pay_within_s`: whether a buyer whose order was cancelled or expired may
    /// buy again (default false).
    #[serde(default, deserialize_with = "json::not_null")]
    rebuy_after_close: Option<bool>,
    /// With `pay_within_s` (required then): what a buyer pays, in the currency's minor
    /// unit, and the currency (ISO 4217).
    #[serde(default, deserialize_with = "json::optional_integral")]
    price_minor: Option<i64>,
    #[serde(default, deserialize_with = "json::not_null")]
    currency: Option<String>,
    /// Stock buckets, 1..=16 (default 1): the stock split over that many Redis hash
    /// slots, so one hot sale can use several cluster primaries.
    #[serde(default, deserialize_with = "json::optional_integral")]
    buckets: Option<i64>,
    /// Instead of `buckets`: the admissions per second expected at the sale's peak, from
    /// which the buckets are chosen (one per 10,000/s, at most 16).
    #[serde(default, deserialize_with = "json::optional_integral")]
    expected_peak_per_s: Option<i64>,
}

/// `POST /vouchers` (admin): writes the database, then preloads Redis.
async fn create_voucher(
    app: &App,
    req: &Request,
    caller: &Identity,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    require_admin(caller)?;
    if !app.admin_limiter.allow(&caller.user, now) {
        return Err(ApiError::RateLimited);
    }
    let body = req.body().as_ref();
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "body is larger than {MAX_BODY_BYTES} bytes"
        )));
    }
    let input: CreateVoucherBody = serde_json::from_slice(body).map_err(|e| {
        ApiError::InvalidRequest(format!(
            "body must be a JSON object with title, stock (integer), begins_at and ends_at (RFC 3339): {e}"
        ))
    })?;
    let mut new = NewVoucher::parse(
        &input.title,
        input.stock,
        &input.begins_at,
        &input.ends_at,
        now,
    )?
    .with_buckets(input.buckets, input.expected_peak_per_s)?;
    new.payment = PaymentTerms::parse(
        input.pay_within_s,
        input.rebuy_after_close,
        input.price_minor,
        input.currency.as_deref(),
    )?;
    let voucher = app.db.create_voucher(&new).await?;
    tracing::info!(
        voucher_id = voucher.id.get(),
        stock = voucher.stock,
        "voucher created"
    );
    app.cache.learn_voucher(&voucher);
    // The database row is the truth. If Redis cannot be preloaded now, the voucher is
    // still created: the first GET or purchase finds it missing in Redis and preloads it
    // from the database (see `repair`).
    let preloaded = match app.sales().await {
        Ok(sales) => sales.preload(&voucher).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = preloaded {
        tracing::warn!(%error, "voucher created but not preloaded; it will be preloaded on first use");
    }
    Ok(json_response(
        StatusCode::CREATED,
        &voucher_json(&voucher, voucher.db_stock_left),
    ))
}

/// `GET /vouchers/{id}` (anyone): the voucher with its live stock from Redis.
async fn get_voucher(app: &App, req: &Request, id: VoucherId) -> Result<Response<Body>, ApiError> {
    let now = now_millis();
    // No token here: the caller is its source address, held to a rate before anything
    // (even this instance's memory of unknown ids) is looked up.
    if !app.source_limiter.allow(&source_of(req), now) {
        return Err(ApiError::RateLimited);
    }
    if app.cache.short_circuit(id, now) == Some(Known::Missing) {
        return Err(not_found_voucher(id));
    }
    let Some(voucher) = voucher_of(app, id, now).await? else {
        return Err(not_found_voucher(id));
    };
    let sales = app.sales().await?;
    let stock_left = match sales.stock_left_all(&voucher).await? {
        Some(left) => left,
        // A sale that has ended (retired from Redis after its retention, or lost) sells
        // nothing more: the database's count is its answer. An anonymous read never
        // reloads a past sale (that would read all its orders, for anyone who asks).
        None if now >= voucher.window.ends_ms() => voucher.db_stock_left,
        None => {
            repair(app, id, now).await?;
            sales
                .stock_left_all(&voucher)
                .await?
                .unwrap_or(voucher.db_stock_left)
        }
    };
    Ok(json_response(
        StatusCode::OK,
        &voucher_json(&voucher, stock_left),
    ))
}

/// `POST /vouchers/{id}/seckill` (user): the admission, one Redis round trip.
async fn seckill(
    app: &App,
    caller: &Identity,
    now: UnixMillis,
    id: VoucherId,
) -> Result<Response<Body>, ApiError> {
    // Answers this instance already knows cost no Redis call.
    let (known, buckets) = app.cache.look(id, now);
    match known {
        Some(Known::NotStarted) => return Err(ApiError::NotStarted),
        Some(Known::Ended) => return Err(ApiError::Ended),
        Some(Known::SoldOut) => return Err(ApiError::SoldOut),
        Some(Known::Missing) => return Err(not_found_voucher(id)),
        None => {}
    }
    if !app.limiter.allow(&caller.user, now) {
        return Err(ApiError::RateLimited);
    }
    let sales = app.sales().await?;
    // Order ids are leased only for a voucher that exists: a voucher this instance has
    // not seen yet is first looked up in Redis (bucket 0's sale hash, which also says
    // how many stock buckets it has), then, if Redis lacks it, the database, so
    // requests for made-up voucher ids lease nothing and write nothing.
    let buckets = match buckets {
        Some(k) => k,
        None => match sale_buckets(app, sales, id).await? {
            Some(k) => k,
            None if repair(app, id, now).await? => match app.cache.voucher(id) {
                Some(v) => v.buckets,
                None => sales.sale_buckets(id).await?.unwrap_or(1),
            },
            None => return Err(not_found_voucher(id)),
        },
    };
    // The buyer's own bucket, always the same one: its buyers hash alone keeps one
    // order per user (invariant 2).
    let bucket = Bucket::of_user(id, buckets, caller.user.as_str());
    let order_id = app.ids.next(sales, id, now).await?;
    let asked = std::time::Instant::now();
    let answer = sales.admit(bucket, &caller.user, order_id).await;
    seckill_shared::metrics::redis_latency(asked.elapsed());
    let mut reply = answer?;
    if reply.admission == Admission::NotLoaded {
        if !repair(app, id, now).await? {
            return Err(not_found_voucher(id));
        }
        // Every admission call gets an order id of its own: a late copy of an earlier
        // call can then never admit under the id a later call decided (lua/admit.lua).
        let order_id = app.ids.next(sales, id, now).await?;
        reply = sales.admit(bucket, &caller.user, order_id).await?;
    }
    // Whether a sold-out answer is final (the voucher, not only this bucket, is empty).
    let mut final_sold_out = buckets == 1;
    if reply.admission == Admission::SoldOut && buckets > 1 {
        let attempt = Attempt {
            app,
            sales,
            bucket,
            user: &caller.user,
            first_id: order_id,
        };
        (reply, final_sold_out) = borrow_and_admit(&attempt, buckets, reply).await?;
    }
    let sold_out = match reply.admission {
        // One empty bucket of several is not a sold-out voucher.
        Admission::Admitted { stock_after, .. } => buckets == 1 && stock_after <= 0,
        Admission::SoldOut => final_sold_out,
        _ => false,
    };
    // The clock offset is measured against the time the answer arrived. A sale still
    // not loaded teaches nothing (and is answered below).
    if reply.admission != Admission::NotLoaded {
        app.cache
            .learn_sale(id, reply.window, sold_out, reply.server_ms, now_millis());
    }
    match reply.admission {
        Admission::Admitted { order_id, .. } => Ok(json_response(
            StatusCode::ACCEPTED,
            &json!({ "order_id": order_id.to_string(), "status": OrderStatus::Pending.as_str() }),
        )),
        Admission::SoldOut => Err(ApiError::SoldOut),
        Admission::NotStarted => Err(ApiError::NotStarted),
        Admission::Ended => Err(ApiError::Ended),
        Admission::AlreadyPurchased { order_id } => Err(ApiError::AlreadyPurchased { order_id }),
        // Still not loaded right after a preload: Redis lost it again; let the caller retry.
        Admission::NotLoaded => Err(ApiError::Unavailable(
            seckill_shared::error::StoreError::Unavailable {
                backend: "redis",
                detail: format!("voucher {id} not loaded after preload"),
            },
        )),
    }
}

/// One purchase attempt's parts that the borrowing loop needs. `first_id` is the order
/// id of the attempt's first admission call (it names the transfers); every later call
/// takes a new id, so that no copy of an earlier call can admit under the id a later
/// call decided.
#[derive(Clone, Copy)]
struct Attempt<'a> {
    app: &'a App,
    sales: &'a RedisSales,
    bucket: Bucket,
    user: &'a UserId,
    first_id: OrderId,
}

/// How long one attempt keeps borrowing at most, and in how many rounds. A round that
/// ends without a unit for this buyer means units went to other buyers of its bucket
/// or are on their way, so the sale moves on and the loop ends with it; the bounds only
/// stop an attempt that keeps losing the race from waiting without end.
const BORROW_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);
const MAX_BORROW_ROUNDS: u32 = 64;

/// How long an attempt waits for units on their way between two buckets (given by one,
/// not yet received by the other) before it looks again: one round trip lands them.
const TRANSIT_WAIT: std::time::Duration = std::time::Duration::from_millis(3);

/// The buyer's bucket is empty (`reply` said so). Unless the voucher is marked sold
/// out, borrows units from its other buckets and admits again, until admitted or the
/// voucher is sold out (docs/design.md, "Stock buckets"). Returns the last reply and,
/// for a refusal, whether it is final (the voucher is sold out: this instance may
/// remember it).
///
/// Units are always in some bucket's stock or in a donor's transfer record, but the
/// buckets are read one slot at a time, so a unit moving while they are read can hide:
/// - units on their way (open records), or a bucket Redis lost, are waited for (a few
///   ms) rather than answered sold out;
/// - no donor giving anything, the attempt looks at every bucket twice, a pause apart;
///   only when both looks find nothing and no transfer landed in between
///   ([`transfers::sold_out_between`]) is the voucher sold out, and marked so for every
///   instance;
/// - units borrowed and then taken by another buyer of the bucket before this one's
///   admission: a pause of random length before the next round, so two empty buckets
///   never pass the last unit back and forth in step.
///
/// Each admission call here has an order id of its own (see [`Attempt`]).
async fn borrow_and_admit(
    attempt: &Attempt<'_>,
    buckets: u16,
    mut reply: AdmitReply,
) -> Result<(AdmitReply, bool), ApiError> {
    let Attempt {
        app,
        sales,
        bucket,
        user,
        first_id,
    } = *attempt;
    let conn = sales.conn();
    let voucher = bucket.voucher();
    if transfers::is_marked_sold_out(&conn, voucher).await? {
        return Ok((reply, true));
    }
    let began = std::time::Instant::now();
    let mut round = 0;
    while round < MAX_BORROW_ROUNDS && began.elapsed() < BORROW_BUDGET {
        let id = transfers::transfer_id(first_id, round);
        round += 1;
        let borrowed = transfers::borrow(sales, buckets, bucket, &id).await?;
        if borrowed.units == 0 {
            if borrowed.open > 0 || borrowed.missing > 0 {
                // Units on their way, or a bucket Redis lost: wait for them to settle.
                tokio::time::sleep(TRANSIT_WAIT).await;
            } else {
                // Nothing given: units landed where this round did not look (its own
                // bucket included), or none are left.
                let first = transfers::units(&conn, voucher, buckets).await?;
                tokio::time::sleep(TRANSIT_WAIT).await;
                if first.total() == 0 {
                    let second = transfers::units(&conn, voucher, buckets).await?;
                    if transfers::sold_out_between(first, second) {
                        transfers::mark_sold_out(&conn, voucher).await?;
                        return Ok((reply, true));
                    }
                }
            }
        }
        let order_id = app.ids.next(sales, voucher, now_millis()).await?;
        reply = sales.admit(bucket, user, order_id).await?;
        if reply.admission != Admission::SoldOut {
            return Ok((reply, false));
        }
        if borrowed.units > 0 {
            // Another buyer of the bucket took the units first: let the next round
            // start at a moment of its own.
            let jitter = rand::random_range(0..=TRANSIT_WAIT.as_micros() as u64);
            tokio::time::sleep(std::time::Duration::from_micros(jitter)).await;
        }
    }
    // Units kept going to other buyers of the bucket, or kept moving, for every round:
    // a refusal that may come early, and not one to remember.
    tracing::warn!(%bucket, rounds = round, elapsed = ?began.elapsed(), "still no unit after borrowing for every round; answering sold out");
    Ok((reply, false))
}

/// `GET /orders/{order_id}` (the buyer): `confirmed`/`rejected` from the database,
/// `pending` while admitted in Redis and not yet drained. Another user's order is 404.
///
/// A pending order is found through its id, which names the voucher it was issued for
/// (the lease's `block → voucher` record), and then the caller's order for that voucher
/// ([`caller_order`]). If Redis lost the lease record the voucher cannot be named from
/// the id alone: the answer is 404 with a pointer to `GET /vouchers/{id}/order`, which
/// needs no such record.
async fn get_order(app: &App, caller: &Identity, id: OrderId) -> Result<Response<Body>, ApiError> {
    let not_found = || {
        ApiError::NotFound(format!(
            "order {id} not found (GET /vouchers/{{voucher_id}}/order finds your order for a voucher)"
        ))
    };
    if let Some((voucher, buyer, status, pay_by)) = app.db.order(id).await? {
        if buyer != caller.user {
            return Err(not_found());
        }
        let view = overlay_close(app, voucher, &caller.user, (id, status, pay_by)).await?;
        return Ok(order_json(voucher, view));
    }
    let Some(voucher) = app.sales().await?.voucher_of_order(id).await? else {
        return Err(not_found());
    };
    match caller_order(app, voucher, &caller.user).await? {
        Some(view) if view.0 == id => Ok(order_json(voucher, view)),
        _ => {
            // Not the buyer's current order: it may be one they cancelled or let expire
            // before it was drained (a voucher that lets them buy again no longer lists
            // it among the buyers).
            let bucket = buyer_bucket(app, voucher, &caller.user).await?;
            let (closed, _) = app
                .sales()
                .await?
                .payment_state(bucket, id, &caller.user)
                .await?;
            match closed {
                Some(c) => Ok(order_json(voucher, (id, c.status, Some(c.pay_by_ms)))),
                None => Err(not_found()),
            }
        }
    }
}

/// An order's status with what Redis decided since the database last heard of it: a
/// `pending` or `awaiting_payment` order may already be paid, cancelled or expired
/// (the drainer records closes on its next run), and a pending order's deadline is in
/// Redis only. Other statuses are final and cost no Redis call.
async fn overlay_close(
    app: &App,
    voucher: VoucherId,
    user: &UserId,
    view: OrderView,
) -> Result<OrderView, ApiError> {
    let (id, status, pay_by) = view;
    if !matches!(status, OrderStatus::Pending | OrderStatus::AwaitingPayment) {
        return Ok(view);
    }
    let bucket = buyer_bucket(app, voucher, user).await?;
    let (closed, deadline) = app.sales().await?.payment_state(bucket, id, user).await?;
    Ok(match closed {
        Some(c) => (id, c.status, Some(c.pay_by_ms)),
        None => (id, status, pay_by.or(deadline)),
    })
}

/// `GET /vouchers/{id}/order` (the buyer): the caller's order for a voucher, found by
/// (voucher, user): from the database once drained, else from the voucher's buyers hash
/// in Redis (`pending`). 404 when the caller holds none.
async fn buyer_order(
    app: &App,
    caller: &Identity,
    id: VoucherId,
) -> Result<Response<Body>, ApiError> {
    match caller_order(app, id, &caller.user).await? {
        Some(view) => Ok(order_json(id, view)),
        None => Err(ApiError::NotFound(format!(
            "you hold no order for voucher {id}"
        ))),
    }
}

/// The order `user` holds for `voucher` and its status. The database first (a drained
/// order, confirmed or rejected, even if Redis lost it), then the buyers hash (admitted,
/// `pending`), then the database again: the drainer may have committed between the two
/// reads, and a drained order's status is the database's.
async fn caller_order(
    app: &App,
    voucher: VoucherId,
    user: &UserId,
) -> Result<Option<OrderView>, ApiError> {
    let in_db = app.db.order_of_buyer(voucher, user).await?;
    let found = match in_db {
        // A drained order that still counts is the buyer's order.
        Some(found) if !found.1.returned_unit() => Some(found),
        // None drained, or only one they cancelled or let expire: a newer admitted order
        // (a voucher that lets them buy again) is theirs now.
        closed => match app
            .sales()
            .await?
            .order_of_buyer(buyer_bucket(app, voucher, user).await?, user)
            .await?
        {
            Some(held) if closed.is_none_or(|c| c.0 != held) => Some(
                // Drained meanwhile? The database's word then.
                match app.db.order_of_buyer(voucher, user).await? {
                    Some(found) if found.0 == held => found,
                    _ => (held, OrderStatus::Pending, None),
                },
            ),
            _ => closed,
        },
    };
    match found {
        Some(view) => Ok(Some(overlay_close(app, voucher, user, view).await?)),
        None => Ok(None),
    }
}

/// An order as a buyer sees it: id, status, payment deadline (vouchers with a payment
/// step).
type OrderView = (OrderId, OrderStatus, Option<UnixMillis>);

/// The voucher's row: from this instance's memory, else the database (remembered
/// either way, a missing one for a short while).
pub(crate) async fn voucher_of(
    app: &App,
    id: VoucherId,
    now: UnixMillis,
) -> Result<Option<Voucher>, ApiError> {
    if let Some(v) = app.cache.voucher(id) {
        return Ok(Some(v));
    }
    let found = app.db.voucher(id).await?;
    match &found {
        Some(v) => app.cache.learn_voucher(v),
        None => app.cache.learn_missing(id, now),
    }
    Ok(found)
}

/// The bucket `user` buys from in `voucher` (bucket 0 of a voucher the database does
/// not know: nothing is found there either).
async fn buyer_bucket(app: &App, voucher: VoucherId, user: &UserId) -> Result<Bucket, ApiError> {
    let now = now_millis();
    // This instance's memory, else bucket 0's sale hash (one Redis read, as an
    // admission makes), else the database.
    let buckets = match app.cache.look(voucher, now).1 {
        Some(k) => k,
        None => match sale_buckets(app, app.sales().await?, voucher).await? {
            Some(k) => k,
            None => voucher_of(app, voucher, now)
                .await?
                .map_or(1, |v| v.buckets),
        },
    };
    Ok(Bucket::of_user(voucher, buckets, user.as_str()))
}

/// The voucher's stock buckets as bucket 0's sale hash records them, remembered by this
/// instance; `None` when Redis does not have the sale.
async fn sale_buckets(
    app: &App,
    sales: &RedisSales,
    voucher: VoucherId,
) -> Result<Option<u16>, ApiError> {
    let found = sales.sale_buckets(voucher).await?;
    if let Some(k) = found {
        app.cache.learn_buckets(voucher, k);
    }
    Ok(found)
}

fn not_found_voucher(id: VoucherId) -> ApiError {
    ApiError::NotFound(format!("voucher {id} not found"))
}

fn voucher_json(v: &Voucher, stock_left: i64) -> serde_json::Value {
    let mut body = json!({
        "id": v.id.to_string(),
        "title": v.title,
        "stock": v.stock,
        "stock_left": stock_left.max(0),
        "begins_at": format_rfc3339_millis(v.window.begins_ms()),
        "ends_at": format_rfc3339_millis(v.window.ends_ms()),
    });
    if v.buckets > 1 {
        body["buckets"] = json!(v.buckets);
    }
    if let Some(p) = v.payment {
        body["pay_within_s"] = json!(p.pay_within_ms / 1000);
        body["rebuy_after_close"] = json!(p.rebuy_after_close);
        if let Some(price) = p.price {
            body["price_minor"] = json!(price.amount_minor());
            body["currency"] = json!(price.currency());
        }
    }
    body
}

fn order_json(voucher: VoucherId, (id, status, pay_by): OrderView) -> Response<Body> {
    let mut body = json!({ "order_id": id.to_string(), "voucher_id": voucher.to_string(), "status": status.as_str() });
    if let Some(ms) = pay_by {
        body["pay_by"] = json!(format_rfc3339_millis(ms));
    }
    json_response(StatusCode::OK, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_route_dispatches() {
        for (method, pattern, _) in ROUTES {
            let path = pattern.replace("{id}", "12").replace("{order_id}", "34");
            assert!(!path.contains('{'), "{pattern} has an unknown parameter");
            let method: Method = method.parse().unwrap();
            assert!(Route::parse(&method, &path).is_some(), "{method} {path}");
        }
        assert_eq!(
            Route::parse(&Method::GET, "/vouchers/12/"),
            Some(Route::GetVoucher("12"))
        );
        assert_eq!(Route::parse(&Method::DELETE, "/vouchers/12"), None);
        assert_eq!(Route::parse(&Method::GET, "/vouchers/12/seckill"), None);
        assert_eq!(Route::parse(&Method::GET, "/"), None);
        // Extra segments never match a shorter route.
        assert_eq!(Route::parse(&Method::POST, "/vouchers/12/seckill/x"), None);
        assert_eq!(Route::parse(&Method::GET, "/vouchers/12/x"), None);
        assert_eq!(Route::parse(&Method::GET, "/orders/34/x/y"), None);
        assert_eq!(
            Route::parse(&Method::GET, "/vouchers/12/order"),
            Some(Route::BuyerOrder("12"))
        );
        assert_eq!(Route::parse(&Method::POST, "/vouchers/12/order"), None);
        assert_eq!(Route::parse(&Method::GET, "/vouchers/12/order/1"), None);
        assert_eq!(Route::parse(&Method::POST, "/vouchers/x"), None);
        assert_eq!(
            Route::parse(&Method::POST, "/vouchers/12/seckill/"),
            Some(Route::Seckill("12"))
        );
    }

    #[test]
    fn every_declared_path_names_its_one_method_and_no_other_path_does() {
        for (method, pattern, _) in ROUTES {
            let path = pattern.replace("{id}", "12").replace("{order_id}", "34");
            assert_eq!(Route::allowed_method(&path), Some(*method), "{path}");
            assert_eq!(Route::allowed_method(&format!("{path}/")), Some(*method));
        }
        for path in [
            "/",
            "/vouchers/12/x",
            "/orders",
            "/payments",
            "/orders/34/pay/x",
        ] {
            assert_eq!(Route::allowed_method(path), None, "{path}");
        }
        let req = |method: &str, path: &str| {
            http::Request::builder()
                .method(method)
                .uri(path)
                .body(Body::Empty)
                .unwrap()
        };
        let err = no_route(&req("TRACE", "/vouchers"));
        assert_eq!(err.code(), "method_not_allowed");
        let res = err.into_response();
        assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(res.headers()[http::header::ALLOW], "POST");
        assert_eq!(no_route(&req("GET", "/nowhere")).code(), "not_found");
    }

    #[test]
    fn every_declared_route_key_dispatches_with_its_parameter() {
        for (method, pattern, _) in ROUTES {
            let key = format!("{method} {pattern}");
            let params: QueryMap = [("id", "12"), ("order_id", "34")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>()
                .into();
            let route = Route::from_key(&key, Some(&params))
                .unwrap_or_else(|| panic!("{key} is declared but not dispatched"));
            assert_eq!(route.key().0, key, "key() names the route it came from");
            // The path API Gateway would have matched gives the same route.
            let path = pattern.replace("{id}", "12").replace("{order_id}", "34");
            assert_eq!(Route::parse(&method.parse().unwrap(), &path), Some(route));
            // A route key without its parameter matches nothing.
            if pattern.contains('{') {
                assert_eq!(Route::from_key(&key, None), None, "{key}");
            }
        }
        assert_eq!(Route::from_key("GET /vouchers", None), None);
        assert_eq!(Route::from_key("$default", None), None);
        assert_eq!(Route::from_key("ANY /{proxy+}", None), None);
    }
}

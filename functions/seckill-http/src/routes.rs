//! The routes of the public HTTP contract (docs/http-api.md): which route a request is,
//! who calls, and the handler it goes to (`vouchers`, `admission`, `queue`, `orders`,
//! `payment`).
//!
//! [`handle`] is the whole function: tests call it with API Gateway v2 fixture events,
//! `main` hands it to `lambda_http::run`. Each handler returns `Result<_, ApiError>`; the
//! error becomes a response in exactly one place ([`ApiError::into_response`]).

use http::Method;
use lambda_http::aws_lambda_events::query_map::QueryMap;
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response};
use seckill_shared::auth::Identity;
use seckill_shared::domain::{UnixMillis, now_millis};

use crate::app::App;
use crate::error::{ApiError, json_response};
use crate::identity::identify;
use crate::{admission, operators, orders, pages, payment, queue, stripe, vouchers, webhook};

/// Every route: method, path pattern, whether it needs a token. The SAM template must
/// declare exactly these (a test compares them).
pub const ROUTES: &[(&str, &str, bool)] = &[
    ("POST", "/vouchers", true),
    ("GET", "/vouchers/{id}", false),
    ("POST", "/vouchers/{id}/seckill", true),
    ("POST", "/vouchers/{id}/queue", true),
    ("GET", "/vouchers/{id}/queue", true),
    ("GET", "/orders/{order_id}", true),
    ("GET", "/vouchers/{id}/order", true),
    ("POST", "/orders/{order_id}/pay", true),
    ("POST", "/orders/{order_id}/cancel", true),
    ("POST", "/payments/webhook", false),
    ("POST", "/payments/stripe", false),
    ("GET", "/status", true),
    ("GET", "/app/{file}", false),
];

/// A recognised route with its path parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    CreateVoucher,
    GetVoucher(&'a str),
    Seckill(&'a str),
    /// Join a voucher's waiting room.
    JoinQueue(&'a str),
    /// The caller's place in a voucher's waiting room.
    QueueStanding(&'a str),
    GetOrder(&'a str),
    /// The caller's order for a voucher.
    BuyerOrder(&'a str),
    /// Start paying an order (vouchers with a payment step).
    PayOrder(&'a str),
    /// Cancel an unpaid order (vouchers with a payment step).
    CancelOrder(&'a str),
    /// The payment provider's signed event.
    PaymentWebhook,
    /// Stripe's signed event, as Stripe sends it.
    StripeWebhook,
    /// The sales' figures for operators (admin).
    SaleStatus,
    /// A file of the buyer page or the live view.
    Page(&'a str),
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
            "POST /vouchers/{id}/queue" => Route::JoinQueue(param("id")?),
            "GET /vouchers/{id}/queue" => Route::QueueStanding(param("id")?),
            "GET /orders/{order_id}" => Route::GetOrder(param("order_id")?),
            "GET /vouchers/{id}/order" => Route::BuyerOrder(param("id")?),
            "POST /orders/{order_id}/pay" => Route::PayOrder(param("order_id")?),
            "POST /orders/{order_id}/cancel" => Route::CancelOrder(param("order_id")?),
            "POST /payments/webhook" => Route::PaymentWebhook,
            "POST /payments/stripe" => Route::StripeWebhook,
            "GET /status" => Route::SaleStatus,
            "GET /app/{file}" => Route::Page(param("file")?),
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
            Route::JoinQueue(id) => ("POST /vouchers/{id}/queue", Some(("id", id))),
            Route::QueueStanding(id) => ("GET /vouchers/{id}/queue", Some(("id", id))),
            Route::GetOrder(id) => ("GET /orders/{order_id}", Some(("order_id", id))),
            Route::BuyerOrder(id) => ("GET /vouchers/{id}/order", Some(("id", id))),
            Route::PayOrder(id) => ("POST /orders/{order_id}/pay", Some(("order_id", id))),
            Route::CancelOrder(id) => ("POST /orders/{order_id}/cancel", Some(("order_id", id))),
            Route::PaymentWebhook => ("POST /payments/webhook", None),
            Route::StripeWebhook => ("POST /payments/stripe", None),
            Route::SaleStatus => ("GET /status", None),
            Route::Page(file) => ("GET /app/{file}", Some(("file", file))),
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
            ("POST", [Some("vouchers"), Some(id), Some("queue"), None]) => {
                Some(Route::JoinQueue(id))
            }
            ("GET", [Some("vouchers"), Some(id), Some("queue"), None]) => {
                Some(Route::QueueStanding(id))
            }
            ("GET", [Some("orders"), Some(id), None, _]) => Some(Route::GetOrder(id)),
            ("POST", [Some("orders"), Some(id), Some("pay"), None]) => Some(Route::PayOrder(id)),
            ("POST", [Some("orders"), Some(id), Some("cancel"), None]) => {
                Some(Route::CancelOrder(id))
            }
            ("POST", [Some("payments"), Some("webhook"), None, _]) => Some(Route::PaymentWebhook),
            ("POST", [Some("payments"), Some("stripe"), None, _]) => Some(Route::StripeWebhook),
            ("GET", [Some("status"), None, ..]) => Some(Route::SaleStatus),
            ("GET", [Some("app"), Some(file), None, _]) => Some(Route::Page(file)),
            _ => None,
        }
    }
}

impl Route<'_> {
    /// The methods a declared path takes (the `Allow` header's value), `None` for a path
    /// no route declares.
    pub fn allowed_method(path: &str) -> Option<&'static str> {
        let get = Route::parse(&Method::GET, path).is_some();
        let post = Route::parse(&Method::POST, path).is_some();
        match (get, post) {
            (true, true) => Some("GET, POST"),
            (true, false) => Some("GET"),
            (false, true) => Some("POST"),
            (false, false) => None,
        }
    }

    /// What a successful answer on this route is called in the request log.
    fn success(&self) -> &'static str {
        match self {
            Route::CreateVoucher => "created",
            Route::Seckill(_) => "admitted",
            Route::PayOrder(_) => "payment_started",
            Route::CancelOrder(_) => "cancelled",
            Route::PaymentWebhook | Route::StripeWebhook => "payment_event",
            Route::JoinQueue(_) => "joined",
            Route::GetVoucher(_)
            | Route::GetOrder(_)
            | Route::BuyerOrder(_)
            | Route::QueueStanding(_)
            | Route::SaleStatus
            | Route::Page(_) => "ok",
        }
    }

    /// The voucher id as it appears in the path, for the request log.
    fn voucher_param(&self) -> &str {
        match self {
            Route::GetVoucher(id)
            | Route::Seckill(id)
            | Route::BuyerOrder(id)
            | Route::JoinQueue(id)
            | Route::QueueStanding(id) => id,
            Route::CreateVoucher
            | Route::GetOrder(_)
            | Route::PayOrder(_)
            | Route::CancelOrder(_)
            | Route::PaymentWebhook
            | Route::StripeWebhook
            | Route::SaleStatus
            | Route::Page(_) => "",
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
    // Behind the edge, nothing is served that did not come through it (crate::edge).
    let result = match (crate::edge::check(app, &req).await, &route) {
        (Err(refused), _) => Err(refused),
        (Ok(()), Some(route)) => dispatch(app, &req, route).await,
        (Ok(()), None) => Err(no_route(&req)),
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
        Route::GetVoucher(id) => vouchers::get_voucher(app, req, id.parse()?).await,
        // Admins only (the scope, then their own limit), before anything is read.
        Route::CreateVoucher => {
            let (caller, now) = who()?;
            app.admit_admin(&caller, now)?;
            vouchers::create_voucher(app, req, now).await
        }
        Route::Seckill(id) => {
            let (caller, now) = who()?;
            admission::seckill(app, req, &caller, now, id.parse()?).await
        }
        Route::JoinQueue(id) => {
            let (caller, now) = who()?;
            queue::standing(app, &caller, now, id.parse()?, true).await
        }
        Route::QueueStanding(id) => {
            let (caller, now) = who()?;
            queue::standing(app, &caller, now, id.parse()?, false).await
        }
        Route::GetOrder(id) => {
            let (caller, now) = who()?;
            let id = id.parse()?;
            limit_order_calls(app, &caller, now).await?;
            orders::get_order(app, &caller, id).await
        }
        Route::BuyerOrder(id) => {
            let (caller, now) = who()?;
            let id = id.parse()?;
            limit_order_calls(app, &caller, now).await?;
            orders::buyer_order(app, &caller, id).await
        }
        // The buyer's own order, with a payment step: one preamble for pay and cancel.
        Route::PayOrder(id) | Route::CancelOrder(id) => {
            let (caller, now) = who()?;
            let id = id.parse()?;
            limit_order_calls(app, &caller, now).await?;
            let order = payment::find_order(app, id, &caller.user, now).await?;
            match route {
                Route::PayOrder(_) => {
                    let mut body = payment::checkout(app, now, &order).await?;
                    stripe::attach_intent(app, &order, now, &mut body).await?;
                    Ok(json_response(http::StatusCode::OK, &body))
                }
                _ => payment::cancel_order(app, order).await,
            }
        }
        // No token: the provider signs its events (checked before anything is read).
        Route::PaymentWebhook => webhook::webhook(app, req, now_millis()).await,
        Route::StripeWebhook => stripe::webhook(app, req, now_millis()).await,
        Route::SaleStatus => {
            let (caller, now) = who()?;
            app.admit_admin(&caller, now)?;
            operators::status(app, req, now).await
        }
        // Static files: nothing is looked up, so no limit beyond API Gateway's.
        Route::Page(file) => pages::page(file, &app.page_policy),
    }
}

/// A call on an order (a read, a checkout, a cancel) costs the database a query or
/// more, whether the order exists or not: held per user in this instance (as every
/// authenticated route is), then across every instance (`lua/rate.lua`, one Redis call,
/// one budget for all four routes), so warm instances do not multiply what one user may
/// ask. When Redis cannot answer, the instance's own limit stands alone (the call goes
/// on).
async fn limit_order_calls(app: &App, caller: &Identity, now: UnixMillis) -> Result<(), ApiError> {
    if !app.limiter.allow(&caller.user, now) {
        return Err(ApiError::RateLimited);
    }
    app.take_shared_read(&caller.user).await
}

fn now_secs(now: UnixMillis) -> i64 {
    now.div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_route_dispatches() {
        for (method, pattern, _) in ROUTES {
            let path = pattern
                .replace("{id}", "12")
                .replace("{order_id}", "34")
                .replace("{file}", "sale.html");
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
        assert_eq!(
            Route::parse(&Method::GET, "/status"),
            Some(Route::SaleStatus)
        );
        assert_eq!(Route::parse(&Method::GET, "/app/x/y"), None);
        assert_eq!(Route::parse(&Method::POST, "/app/sale.html"), None);
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
    fn every_declared_path_names_its_methods_and_no_other_path_does() {
        for (_, pattern, _) in ROUTES {
            let mut methods: Vec<&str> = ROUTES
                .iter()
                .filter(|(_, p, _)| p == pattern)
                .map(|(m, _, _)| *m)
                .collect();
            methods.sort_unstable();
            let allow = methods.join(", ");
            let path = pattern
                .replace("{id}", "12")
                .replace("{order_id}", "34")
                .replace("{file}", "sale.html");
            assert_eq!(Route::allowed_method(&path), Some(allow.as_str()), "{path}");
            assert_eq!(
                Route::allowed_method(&format!("{path}/")),
                Some(allow.as_str())
            );
        }
        assert_eq!(
            Route::allowed_method("/vouchers/12/queue"),
            Some("GET, POST")
        );
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
        assert_eq!(res.status(), http::StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(res.headers()[http::header::ALLOW], "POST");
        assert_eq!(no_route(&req("GET", "/nowhere")).code(), "not_found");
    }

    #[test]
    fn every_declared_route_key_dispatches_with_its_parameter() {
        for (method, pattern, _) in ROUTES {
            let key = format!("{method} {pattern}");
            let params: QueryMap = [("id", "12"), ("order_id", "34"), ("file", "sale.html")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>()
                .into();
            let route = Route::from_key(&key, Some(&params))
                .unwrap_or_else(|| panic!("{key} is declared but not dispatched"));
            assert_eq!(route.key().0, key, "key() names the route it came from");
            // The path API Gateway would have matched gives the same route.
            let path = pattern
                .replace("{id}", "12")
                .replace("{order_id}", "34")
                .replace("{file}", "sale.html");
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

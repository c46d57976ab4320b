//! `api-gateway-local`: the API Gateway HTTP API's part on the local stack (see the
//! library's header): HTTP in, a payload format 2.0 event to the function through
//! `cargo lambda watch`'s Lambda Invoke API, its answer back out.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use api_gateway_local::in_flight::{InFlight, Place};
use api_gateway_local::{
    FunctionResponse, Incoming, MAX_PAYLOAD_BYTES, Outgoing, client_of, edge_limited, event_of,
    gateway_error, internal_error, response_of, route_key,
};
use aws_lambda_events::apigw::ApiGatewayV2httpRequest;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::Response;
use clap::Parser;
use http::StatusCode;
use seckill_http::limiter::RateLimiter;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Local API Gateway HTTP API in front of a function served by cargo lambda watch"
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:19100")]
    listen: SocketAddr,

    /// Base URL of the Lambda Invoke API (`cargo lambda watch`).
    #[arg(long, default_value = "http://127.0.0.1:19000")]
    lambda: String,

    /// The function every route invokes.
    #[arg(long, default_value = "seckill-http")]
    function: String,

    /// API Gateway's integration timeout (30 s for HTTP APIs): `503` past it, the wait
    /// for a place among the invocations in flight included.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,

    /// Invocations of the function in flight at once; the others wait in arrival order.
    /// Keep it below 100: cargo lambda watch 1.9 deadlocks for good once 100 invocations
    /// of one function wait in its queue (see `in_flight`).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..100))]
    max_in_flight: u16,

    /// A route's throttle, as the stage's RouteSettings: `"POST /payments/stripe=RATE,BURST"`
    /// (requests per second, burst); repeat for more routes. Others are not throttled.
    #[arg(long = "route-throttle", value_parser = parse_throttle)]
    route_throttle: Vec<(String, u32, u32)>,

    /// The edge's per-client limit on a group of routes, as the template's web ACL sets
    /// it: `"GET /vouchers/{id}+GET /app/{file}=RATE,BURST"` (requests per second and
    /// client, burst; the routes named share one bucket per client); repeat for more
    /// groups. Checked before the route throttles.
    #[arg(long = "client-limit", value_parser = parse_throttle)]
    client_limit: Vec<(String, u32, u32)>,
}

/// `"<route key>=<rate>,<burst>"`.
fn parse_throttle(s: &str) -> Result<(String, u32, u32), String> {
    let bad = || format!("{s:?} is not \"<METHOD /path>=<rate>,<burst>\"");
    let (key, limits) = s.rsplit_once('=').ok_or_else(bad)?;
    let (rate, burst) = limits.split_once(',').ok_or_else(bad)?;
    let (rate, burst) = (
        rate.trim().parse().map_err(|_| bad())?,
        burst.trim().parse().map_err(|_| bad())?,
    );
    if rate == 0 || burst == 0 {
        return Err(bad());
    }
    Ok((key.trim().to_string(), rate, burst))
}

struct Gateway {
    http: reqwest::Client,
    invoke_url: String,
    in_flight: InFlight,
    timeout: Duration,
    /// Route key → its token bucket (one key: the route's).
    throttles: HashMap<String, RateLimiter<()>>,
    /// Route key → the per-client buckets of its group (`--client-limit`).
    client_limits: HashMap<String, Arc<RateLimiter<IpAddr>>>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let gateway = Arc::new(Gateway {
        // No timeout of the client's own: an invocation holds its place until the watch
        // answers it, also after its caller was told 503 (see `handle`).
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .context("an HTTP client")?,
        invoke_url: format!(
            "{}/2015-03-31/functions/{}/invocations",
            cli.lambda.trim_end_matches('/'),
            cli.function
        ),
        in_flight: InFlight::new(cli.max_in_flight.into()),
        timeout: Duration::from_secs(cli.timeout_secs),
        throttles: cli
            .route_throttle
            .iter()
            .map(|(key, rate, burst)| (key.clone(), RateLimiter::new(*rate, *burst)))
            .collect(),
        client_limits: cli
            .client_limit
            .iter()
            .flat_map(|(keys, rate, burst)| {
                let bucket = Arc::new(RateLimiter::new(*rate, *burst));
                keys.split('+')
                    .map(move |key| (key.trim().to_string(), bucket.clone()))
            })
            .collect(),
    });
    let app = axum::Router::new().fallback(handle).with_state(gateway);
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cli.listen))?;
    tracing::info!(listen = %cli.listen, function = %cli.function, max_in_flight = cli.max_in_flight, "api-gateway-local up");
    let mut term = signal(SignalKind::terminate())?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
    .await?;
    Ok(())
}

async fn handle(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let arrived = tokio::time::Instant::now();
    let (parts, body) = req.into_parts();
    let now_ms = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    let key = route_key(&parts.method, parts.uri.path());
    let client = client_of(&parts.headers, peer.ip());
    let edge_limited_now = gw
        .client_limits
        .get(key)
        .is_some_and(|buckets| !buckets.allow(&client, now_ms));
    let throttled = !edge_limited_now
        && gw
            .throttles
            .get(key)
            .is_some_and(|bucket| !bucket.allow(&(), now_ms));
    let out = if edge_limited_now {
        edge_limited()
    } else if throttled {
        gateway_error(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests")
    } else {
        match axum::body::to_bytes(body, MAX_PAYLOAD_BYTES).await {
            Err(_) => gateway_error(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large"),
            Ok(body) => {
                let incoming = Incoming {
                    method: &parts.method,
                    path: parts.uri.path(),
                    query: parts.uri.query(),
                    headers: &parts.headers,
                    body: &body,
                    // The client as the edge tells it apart (see the library's header).
                    source_ip: client,
                    request_id: uuid::Uuid::new_v4().to_string(),
                    at_ms: now_ms,
                };
                let deadline = arrived + gw.timeout;
                match gw.in_flight.enter(deadline).await {
                    // The invocation runs as a task of its own that keeps its place until the
                    // watch answers: a caller told 503 at the integration timeout leaves its
                    // invocation queued at the watch all the same, and a place freed then
                    // would let the watch's queue grow past the bound (and wedge it).
                    Some(place) => {
                        let call = tokio::spawn(invoke(gw.clone(), event_of(&incoming), place));
                        match tokio::time::timeout_at(deadline, call).await {
                            Ok(Ok(out)) => out,
                            Ok(Err(e)) => {
                                tracing::error!(error = %e, "the invocation task failed");
                                internal_error()
                            }
                            Err(_) => {
                                tracing::warn!("the function did not answer in time");
                                gateway_error(
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "Service Unavailable",
                                )
                            }
                        }
                    }
                    None => {
                        tracing::warn!(
                            in_flight = gw.in_flight.taken(),
                            "no place among the invocations in flight within the integration timeout"
                        );
                        gateway_error(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable")
                    }
                }
            }
        }
    };
    let mut res = Response::new(Body::from(out.body));
    *res.status_mut() = out.status;
    for (name, value) in out.headers {
        res.headers_mut().append(name, value);
    }
    res
}

/// Invokes the function with `event`, holding `place` until the watch answers; API
/// Gateway's own `500` when the function fails.
async fn invoke(gw: Arc<Gateway>, event: ApiGatewayV2httpRequest, place: Place) -> Outgoing {
    let sent = gw.http.post(&gw.invoke_url).json(&event).send().await;
    let res = match sent {
        Ok(res) => res,
        Err(e) => {
            tracing::error!(error = %e, "invoke failed");
            return internal_error();
        }
    };
    let failed = !res.status().is_success() || res.headers().contains_key("x-amz-function-error");
    let bytes = res.bytes().await.unwrap_or_default();
    drop(place);
    if failed {
        tracing::error!(body = %String::from_utf8_lossy(&bytes), "the function failed");
        return internal_error();
    }
    match serde_json::from_slice::<FunctionResponse>(&bytes) {
        Ok(answer) => response_of(answer),
        Err(e) => {
            tracing::error!(error = %e, "the function's answer is not a payload format 2.0 response");
            internal_error()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_throttle;

    #[test]
    fn route_throttles_parse_as_the_stack_passes_them() {
        assert_eq!(
            parse_throttle("POST /payments/stripe=1500,3000"),
            Ok(("POST /payments/stripe".to_string(), 1500, 3000))
        );
        for bad in [
            "POST /payments/stripe",
            "POST /payments/stripe=1500",
            "POST /payments/stripe=0,10",
            "POST /payments/stripe=x,10",
        ] {
            assert!(parse_throttle(bad).is_err(), "{bad}");
        }
    }
}

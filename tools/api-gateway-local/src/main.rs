//! `api-gateway-local`: the API Gateway HTTP API's part on the local stack (see the
//! library's header): HTTP in, a payload format 2.0 event to the function through
//! `cargo lambda watch`'s Lambda Invoke API, its answer back out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use api_gateway_local::{
    FunctionResponse, Incoming, MAX_PAYLOAD_BYTES, Outgoing, event_of, gateway_error,
    internal_error, response_of,
};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::Response;
use clap::Parser;
use http::StatusCode;
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

    /// API Gateway's integration timeout (30 s for HTTP APIs): `503` past it.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

struct Gateway {
    http: reqwest::Client,
    invoke_url: String,
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
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(cli.timeout_secs))
            .pool_max_idle_per_host(256)
            .build()
            .context("an HTTP client")?,
        invoke_url: format!(
            "{}/2015-03-31/functions/{}/invocations",
            cli.lambda.trim_end_matches('/'),
            cli.function
        ),
    });
    let app = axum::Router::new().fallback(handle).with_state(gateway);
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cli.listen))?;
    tracing::info!(listen = %cli.listen, function = %cli.function, "api-gateway-local up");
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
    let (parts, body) = req.into_parts();
    let out = match axum::body::to_bytes(body, MAX_PAYLOAD_BYTES).await {
        Err(_) => gateway_error(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large"),
        Ok(body) => {
            let incoming = Incoming {
                method: &parts.method,
                path: parts.uri.path(),
                query: parts.uri.query(),
                headers: &parts.headers,
                body: &body,
                source_ip: peer.ip(),
                request_id: uuid::Uuid::new_v4().to_string(),
                at_ms: (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64,
            };
            invoke(&gw, &incoming).await
        }
    };
    let mut res = Response::new(Body::from(out.body));
    *res.status_mut() = out.status;
    for (name, value) in out.headers {
        res.headers_mut().append(name, value);
    }
    res
}

/// Invokes the function with the request's event; API Gateway's own `500`/`503` when
/// the function fails or does not answer in time.
async fn invoke(gw: &Gateway, req: &Incoming<'_>) -> Outgoing {
    let event = event_of(req);
    let sent = gw.http.post(&gw.invoke_url).json(&event).send().await;
    let res = match sent {
        Ok(res) => res,
        Err(e) if e.is_timeout() => {
            tracing::warn!(error = %e, "the function did not answer in time");
            return gateway_error(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable");
        }
        Err(e) => {
            tracing::error!(error = %e, "invoke failed");
            return internal_error();
        }
    };
    let failed = !res.status().is_success() || res.headers().contains_key("x-amz-function-error");
    let bytes = res.bytes().await.unwrap_or_default();
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

//! The edge in front of the API (template.yaml `EnableEdge`, seckill_http::edge, the
//! local gateway's per-client limit): only requests that came through it are served,
//! the anonymous read is limited per client as the distribution names the client, and a
//! client flooding the anonymous reads is stopped at the edge without touching anyone
//! else, over real HTTP through the local stack.

use std::collections::BTreeMap;
use std::sync::Arc;

use lambda_http::RequestExt as _;
use reqwest::StatusCode;
use seckill_http::App;
use seckill_http::edge::{EDGE_HEADER, VIEWER_HEADER};
use seckill_http::secrets::SecretSource;
use seckill_shared::webhook::Secrets;
use seckill_tests::api::{Api, id_of};
use seckill_tests::harness::{Backends, fixture_event, read, token};
use serde_json::{Value, json};

const CURRENT: &str = "edge-secret-current-0123456789";
const PREVIOUS: &str = "edge-secret-previous-012345678";

/// An event as API Gateway sends it behind the distribution: from one CloudFront
/// address, with the headers the distribution adds (`None`: left out).
fn through_edge(
    method: &str,
    path: &str,
    secret: Option<&str>,
    viewer: Option<&str>,
    bearer: Option<&str>,
) -> lambda_http::Request {
    let mut e = fixture_event();
    e["rawPath"] = json!(path);
    e["requestContext"]["http"]["method"] = json!(method);
    e["requestContext"]["http"]["path"] = json!(path);
    e["requestContext"]["http"]["sourceIp"] = json!("130.176.0.9");
    if let Some(s) = secret {
        e["headers"][EDGE_HEADER] = json!(s);
    }
    if let Some(v) = viewer {
        e["headers"][VIEWER_HEADER] = json!(v);
    }
    if let Some(t) = bearer {
        e["headers"]["authorization"] = json!(format!("Bearer {t}"));
    }
    lambda_http::request::from_str(&e.to_string())
        .expect("an API Gateway v2 event")
        .with_lambda_context(lambda_http::Context::default())
}

async fn answer(app: &App, req: lambda_http::Request) -> (u16, Value) {
    read(Box::pin(seckill_http::handle(app, req)).await)
}

async fn a_voucher(app: &App) -> String {
    let body = seckill_tests::harness::voucher_body("edge", 5, -1_000, json!({}));
    let req = seckill_tests::harness::request(
        "POST",
        "/vouchers",
        Some(&token("admin", true)),
        Some(&body.to_string()),
        None,
    );
    let (status, v) = answer(app, req).await;
    assert_eq!(status, 201, "{v}");
    id_of(&v)
}

/// With an origin secret configured, a request without it (or with a wrong one) is
/// `403 forbidden` on every route, before its token or its voucher is looked at; with
/// the current secret, the previous one (a rotation) or the distribution's `new,old`, it
/// is served. The anonymous read's cache header lets the edge keep it a second; a
/// buyer's answer is never marked public.
#[tokio::test]
async fn behind_the_edge_only_requests_through_it_are_served() {
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.edge = SecretSource::Inline(Secrets::parse(&format!("{CURRENT},{PREVIOUS}")).unwrap());
    let app = App::new(&cfg).await;
    let open = App::new(&b.http_config()).await;
    let id = a_voucher(&open).await;
    let voucher = format!("/vouchers/{id}");
    let buy = format!("/vouchers/{id}/seckill");
    let alice = token("alice", false);
    for secret in [
        None,
        Some("wrong-secret-0123456789abcdef"),
        Some(&CURRENT[..20]),
    ] {
        for (method, path, bearer) in [
            ("GET", voucher.as_str(), None),
            ("POST", buy.as_str(), Some(alice.as_str())),
            ("GET", "/vouchers/999999", None),
            ("GET", "/app/sale.html", None),
        ] {
            let (status, body) =
                answer(&app, through_edge(method, path, secret, None, bearer)).await;
            assert_eq!(
                (status, body["code"].as_str()),
                (403, Some("forbidden")),
                "{method} {path} with {secret:?}: {body}"
            );
        }
    }
    let rotation = format!("{CURRENT},{PREVIOUS}");
    for secret in [CURRENT, PREVIOUS, rotation.as_str()] {
        let res = Box::pin(seckill_http::handle(
            &app,
            through_edge("GET", &voucher, Some(secret), None, None),
        ))
        .await;
        assert_eq!(
            res.headers()
                .get("cache-control")
                .and_then(|v| v.to_str().ok()),
            Some(seckill_http::vouchers::READ_CACHE_CONTROL)
        );
        assert_eq!(read(res).0, 200, "with {secret:?}");
    }
    let res = Box::pin(seckill_http::handle(
        &app,
        through_edge("POST", &buy, Some(CURRENT), None, Some(&alice)),
    ))
    .await;
    assert!(
        res.headers()
            .get("cache-control")
            .is_none_or(|v| !v.to_str().unwrap_or("").contains("public")),
        "an admission is never marked public"
    );
    assert_eq!(read(res).0, 202);
    // Without an origin secret (no edge), the secret header means nothing either way.
    let (status, _) = answer(&open, through_edge("GET", &voucher, None, None, None)).await;
    assert_eq!(status, 200);
    b.cleanup().await;
}

/// Behind the edge every request comes from CloudFront's few addresses; the anonymous
/// read's per-address limit counts the viewer the distribution names instead, so one
/// viewer over its limit holds back nobody else behind the same edge server. Without
/// the edge, that header is the caller's own word and is ignored.
#[tokio::test]
async fn behind_the_edge_the_anonymous_read_is_limited_per_viewer() {
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.source_rate_per_sec = 1;
    cfg.source_rate_burst = 3;
    let plain = App::new(&cfg).await;
    cfg.edge = SecretSource::Inline(Secrets::parse(CURRENT).unwrap());
    let app = App::new(&cfg).await;
    let id = a_voucher(&plain).await;
    let voucher = format!("/vouchers/{id}");
    let mut statuses = BTreeMap::<&str, Vec<u16>>::new();
    for viewer in [
        "198.51.100.1:40000",
        "198.51.100.2:40001",
        "2001:db8::7:443",
    ] {
        for _ in 0..4 {
            let req = through_edge("GET", &voucher, Some(CURRENT), Some(viewer), None);
            statuses
                .entry(viewer)
                .or_default()
                .push(answer(&app, req).await.0);
        }
    }
    for (viewer, got) in &statuses {
        assert_eq!(got, &[200, 200, 200, 429], "{viewer}");
    }
    // No edge configured: the header is ignored and the one source address is limited.
    let mut got = Vec::new();
    for i in 0..4 {
        let viewer = format!("198.51.100.{}:1", 10 + i);
        let req = through_edge("GET", &voucher, None, Some(&viewer), None);
        got.push(answer(&plain, req).await.0);
    }
    assert_eq!(got, [200, 200, 200, 429]);
    b.cleanup().await;
}

/// Over real HTTP through the local stack's gateway, which emulates the web ACL's
/// per-client rule on the anonymous reads (the client is the first address of
/// `X-Forwarded-For`): one client flooding `GET /vouchers/{id}` far past the limit is
/// answered the web ACL's `429 rate_limited` while another client, reading the same
/// voucher all along, is always served, and so is a client arriving after the flood.
#[tokio::test]
async fn a_client_flooding_the_anonymous_reads_is_limited_without_touching_others() {
    let api = Arc::new(Api::new());
    let limit: usize = api
        .env
        .get("SECKILL_EDGE_READS_PER_CLIENT_MINUTE")
        .parse()
        .expect("a number");
    let id = id_of(&api.create_voucher("edge flood", 5, -1_000, json!({})).await);
    let url = format!("{}/vouchers/{id}", api.base());
    let flooder = format!("198.51.100.{}", 1 + rand::random::<u8>() % 100);
    let other = format!("203.0.113.{}", 1 + rand::random::<u8>() % 100);
    let get = |client: String| {
        let (api, url) = (api.clone(), url.clone());
        async move {
            let res = api
                .http
                .get(&url)
                .header("x-forwarded-for", format!("{client}, 10.0.0.1"))
                .send()
                .await
                .expect("the gateway answers");
            let status = res.status();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    };
    // The flood: twice the limit, 32 at a time; the other client reads once per batch.
    let mut edge_limited = 0;
    let mut served = 0;
    let mut others = Vec::new();
    for _ in 0..(2 * limit).div_ceil(32) {
        let batch = (0..32).map(|_| get(flooder.clone()));
        for (status, body) in futures::future::join_all(batch).await {
            match status {
                StatusCode::OK => served += 1,
                StatusCode::TOO_MANY_REQUESTS => {
                    assert_eq!(body["code"], "rate_limited", "{body}");
                    if body["message"] == "too many requests from your address, slow down" {
                        edge_limited += 1;
                    }
                }
                other => panic!("the flood got {other}: {body}"),
            }
        }
        others.push(get(other.clone()).await.0);
    }
    assert!(
        others.iter().all(|s| *s == StatusCode::OK),
        "the other client was held back: {others:?}"
    );
    // The edge let through at most its bucket (the limit, refilled at limit/60 a second
    // while the flood lasted) and stopped the rest.
    assert!(
        served <= limit,
        "{served} of the flood were served; the limit is {limit}"
    );
    assert!(
        edge_limited >= limit / 2,
        "only {edge_limited} of {} were stopped at the edge",
        2 * limit
    );
    let newcomer = format!("192.0.2.{}", 1 + rand::random::<u8>() % 100);
    assert_eq!(get(newcomer).await.0, StatusCode::OK);
}

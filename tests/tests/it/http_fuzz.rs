//! seckill-http's handler under 10,000 generated API Gateway v2 requests, against a
//! private Redis and a fresh database behind a real Data API server.
//!
//! What it proves: whatever a caller sends (any method, the real routes with ids at and
//! around every boundary of the order-id layout, 2^63-1, 2^64, negatives, non-digits,
//! unicode, percent-encoding, empty and doubled segments; valid, forged, expired and
//! malformed tokens and authorizer claims with odd `sub`s; bodies as text and as base64
//! with `isBase64Encoded: true` holding random bytes, broken and valid JSON, huge
//! numbers and bad RFC 3339 times; missing or odd headers), the handler returns
//! normally, never answers 5xx, and every answer is JSON whose errors carry a `code`
//! from the contract's list.
//!
//! Events stay within what API Gateway can send: a body flagged base64 is valid base64,
//! header values are legal HTTP header values, and `Host`/`X-Forwarded-Proto` are API
//! Gateway's own (lambda_http builds the URI from them and panics on an unparsable one,
//! which no client can cause because API Gateway sets them).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::FutureExt;
use lambda_http::{Body, Request, RequestExt, Response};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use seckill_http::error::CODES;
use seckill_http::{App, handle};
use seckill_shared::auth::{ADMIN_SCOPE, mint_hs256, sign_hs256};
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use seckill_tests::harness::{Backends, TEST_JWT_SECRET, fixture_event, token};
use serde_json::{Value, json};

/// Requests generated in all, shared by the strategies below. Fixed (not proptest's
/// default 256 or `PROPTEST_CASES`): the issue asks for at least 10,000, and a fixed
/// count with a fixed seed makes every run, in CI too, send the same requests. Against
/// the local backends they take a few seconds, so the count is not the limit on cost.
const TOTAL_CASES: u32 = 10_000;

/// The seed of every runner: the same requests on every run. Failure persistence is off
/// for the same reason (a regression file would change what the next run sends).
const SEED: [u8; 32] = *b"seckill-http-fuzz-issue-13-item4";

/// What the requests can aim at: real ids, so valid paths reach Redis and the database.
#[derive(Debug, Clone)]
struct Known {
    open_voucher: String,
    future_voucher: String,
    order: String,
}

/// The buyer who holds `Known::order`.
const BUYER: &str = "fuzz-buyer";

#[derive(Debug, Clone)]
enum Auth {
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// Any other `Authorization` value.
    Raw(String),
    /// Claims of API Gateway's JWT authorizer.
    Claims(Value),
}

#[derive(Clone)]
struct FuzzRequest {
    method: String,
    path: String,
    auth: Auth,
    body: Option<Vec<u8>>,
    base64: bool,
    /// Headers set (`Some`) or removed (`None`).
    headers: Vec<(String, Option<String>)>,
}

/// The body shown as text, so a failing case can be read.
impl std::fmt::Debug for FuzzRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuzzRequest")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("auth", &self.auth)
            .field("body", &self.body.as_deref().map(String::from_utf8_lossy))
            .field("base64", &self.base64)
            .field("headers", &self.headers)
            .finish()
    }
}

impl FuzzRequest {
    /// The event API Gateway would send for this request.
    fn event(&self) -> Value {
        let mut event = fixture_event();
        event["rawPath"] = json!(self.path);
        event["requestContext"]["http"]["method"] = json!(self.method);
        event["requestContext"]["http"]["path"] = json!(self.path);
        match &self.auth {
            Auth::None => {}
            Auth::Bearer(t) => event["headers"]["authorization"] = json!(format!("Bearer {t}")),
            Auth::Raw(v) => event["headers"]["authorization"] = json!(v),
            Auth::Claims(c) => {
                event["requestContext"]["authorizer"] =
                    json!({ "jwt": { "claims": c, "scopes": null } })
            }
        }
        if let Some(body) = &self.body {
            if self.base64 {
                event["body"] = json!(STANDARD.encode(body));
                event["isBase64Encoded"] = json!(true);
            } else {
                event["body"] = json!(String::from_utf8_lossy(body));
            }
        }
        for (name, value) in &self.headers {
            let headers = event["headers"].as_object_mut().expect("headers object");
            match value {
                Some(v) => headers.insert(name.clone(), json!(v)),
                None => headers.remove(name),
            };
        }
        event
    }
}

// ---- ids and paths ----

/// Ids at every boundary: of the order-id layout (`ms << 22 | slot << 10 | offset`;
/// 4294967296 is offset 0 of a block, which underflowed in the first layout), of i64 and
/// u64, and not ids at all.
const BOUNDARY_IDS: &[&str] = &[
    "0",
    "1",
    "-1",
    "1023",
    "1024",
    "4194303",
    "4194304",
    "4294967295",
    "4294967296",
    "4294967297",
    "9007199254740993",
    "9223372036854775806",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "99999999999999999999999999",
    "00000000000000000001",
    "0000000000000000000000004294967296",
    "",
    "+1",
    "1e3",
    "0x10",
    "1.0",
    " 1",
    "%31",
    "%2F",
    "%00",
    "%",
    "%zz",
    "١٢٣",
    "１２",
    "..",
    ".",
    "null",
];

/// A path segment where an id goes.
fn id_segment(known: &Known) -> BoxedStrategy<String> {
    prop_oneof![
        4 => proptest::sample::select(BOUNDARY_IDS).prop_map(str::to_string),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        // Ids of the layout (`ms << 22 | slot << 10 | offset`) at and next to its field
        // boundaries, where the first layout's sequence 0 underflowed.
        3 => (
            prop_oneof![Just(0_i64), Just(1), Just((1 << 41) - 1), 0..(1_i64 << 41)],
            prop_oneof![Just(0_i64), Just(4095), 0..4096_i64],
            prop_oneof![Just(0_i64), Just(1023), 0..1024_i64],
            -1..=1_i64,
        )
            .prop_map(|(ms, slot, offset, d)| {
                ((i128::from(ms) << 22 | i128::from(slot) << 10 | i128::from(offset)) + i128::from(d))
                    .to_string()
            }),
        2 => proptest::sample::select(vec![
            known.open_voucher.clone(),
            known.future_voucher.clone(),
            known.order.clone(),
        ]),
        1 => "[0-9]{1,30}",
        // Unicode as some clients send it, unencoded; never `?` or `#`, which end a path
        // on the wire and so never reach `rawPath`.
        1 => "\\PC{0,12}".prop_map(|s| s.replace(['?', '#'], "")),
        1 => proptest::collection::vec(any::<u8>(), 0..8)
            .prop_map(|b| b.iter().map(|b| format!("%{b:02X}")).collect()),
    ]
    .boxed()
}

/// A path of a real route with a fuzzed id, or a near miss.
fn path(known: &Known) -> BoxedStrategy<(String, &'static str)> {
    let templates: &[(&str, &str)] = &[
        ("/vouchers/{}", "GET"),
        ("/vouchers/{}/seckill", "POST"),
        ("/vouchers/{}/order", "GET"),
        ("/orders/{}", "GET"),
        ("/vouchers/{}/", "GET"),
        ("//orders//{}//", "GET"),
        ("/orders/{}/x", "GET"),
        ("/vouchers/{}/seckill/{}", "POST"),
        ("/vouchers/{}/refund", "POST"),
        ("/{}", "GET"),
        ("/vouchers", "POST"),
        ("/vouchers/", "POST"),
        ("/", "GET"),
        ("", "GET"),
    ];
    (
        proptest::sample::select(templates.to_vec()),
        id_segment(known),
    )
        .prop_map(|((t, m), id)| (t.replace("{}", &id), m))
        .boxed()
}

fn method(usual: &'static str) -> BoxedStrategy<String> {
    prop_oneof![
        6 => Just(usual.to_string()),
        1 => proptest::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
            .prop_map(str::to_string),
        // An extension method is any token; API Gateway passes it on.
        1 => "[A-Z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,11}",
    ]
    .boxed()
}

// ---- tokens ----

fn odd_sub() -> BoxedStrategy<String> {
    prop_oneof![
        proptest::sample::select(vec![
            " alice".to_string(),
            "alice ".to_string(),
            "a\u{0}b".to_string(),
            "a\nb".to_string(),
            "\u{7f}".to_string(),
            String::new(),
            "x".repeat(64),
            "x".repeat(65),
            "€".repeat(21),
            "€".repeat(22),
            "\u{feff}".to_string(),
            "😀".repeat(16),
            "😀".repeat(17),
        ]),
        "\\PC{1,20}",
        ".{0,70}",
    ]
    .boxed()
}

fn auth() -> BoxedStrategy<Auth> {
    let secret = TEST_JWT_SECRET.as_bytes();
    let now = now_millis() / 1000;
    prop_oneof![
        2 => Just(Auth::None),
        4 => prop_oneof![Just(BUYER.to_string()), "[a-z]{1,8}"]
            .prop_map(|sub| Auth::Bearer(token(&sub, false))),
        2 => "[a-z]{1,8}".prop_map(|sub| Auth::Bearer(token(&sub, true))),
        1 => Just(Auth::Bearer(mint_hs256(b"wrong-secret", BUYER, Some(ADMIN_SCOPE), now + 3600))),
        1 => (1..1_000_000_i64)
            .prop_map(move |ago| Auth::Bearer(mint_hs256(secret, BUYER, None, now - ago))),
        1 => proptest::sample::select(vec![
            json!({ "sub": BUYER, "exp": i64::MAX }),
            json!({ "sub": BUYER, "exp": i64::MIN }),
            json!({ "sub": BUYER, "exp": 1e300 }),
            json!({ "sub": BUYER, "exp": "soon" }),
            json!({ "sub": BUYER, "exp": now + 60, "nbf": i64::MAX }),
            json!({ "sub": BUYER, "exp": now + 60, "nbf": i64::MIN }),
            json!({ "sub": 42, "exp": now + 60 }),
            json!({ "sub": null, "exp": now + 60 }),
            json!({ "exp": now + 60 }),
            json!({ "sub": BUYER, "exp": now + 60, "scope": ["seckill/admin"] }),
            json!([1, 2]),
        ])
        .prop_map(move |claims| Auth::Bearer(sign_hs256(secret, &claims))),
        2 => odd_sub().prop_map(move |sub| Auth::Bearer(mint_hs256(secret, &sub, None, now + 3600))),
        1 => prop_oneof![
            "[A-Za-z0-9_-]{0,30}\\.[A-Za-z0-9_-]{0,30}\\.[A-Za-z0-9_-]{0,30}",
            "[ -~]{0,80}",
            "\\PC{0,40}",
            Just("a.b.c.d".to_string()),
            Just(String::new()),
        ]
        .prop_map(Auth::Bearer),
        1 => prop_oneof![
            Just("Bearer".to_string()),
            Just("Bearer  ".to_string()),
            Just("Basic YWxpY2U6cHc=".to_string()),
            Just(format!("bearer {}", token(BUYER, false))),
            Just(format!("BEARER {}", token(BUYER, false))),
            "[ -~]{0,60}",
        ]
        .prop_map(Auth::Raw),
        2 => (
            prop_oneof![Just(BUYER.to_string()), odd_sub()],
            prop_oneof![
                Just(None),
                Just(Some(ADMIN_SCOPE.to_string())),
                Just(Some(format!("openid {ADMIN_SCOPE}"))),
                "\\PC{0,30}".prop_map(Some),
            ],
            any::<bool>(),
        )
            .prop_map(|(sub, scope, with_sub)| {
                let mut claims = serde_json::Map::new();
                if with_sub {
                    claims.insert("sub".into(), json!(sub));
                }
                if let Some(scope) = scope {
                    claims.insert("scope".into(), json!(scope));
                }
                Auth::Claims(Value::Object(claims))
            }),
    ]
    .boxed()
}

// ---- bodies ----

fn rfc3339() -> BoxedStrategy<String> {
    let iso = |offset_ms: i64| format_rfc3339_millis(now_millis() + offset_ms);
    prop_oneof![
        3 => (-86_400_000_i64..86_400_000).prop_map(iso),
        3 => proptest::sample::select(vec![
            "0000-01-01T00:00:00Z",
            "0001-01-01T00:00:00Z",
            "1000-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999Z",
            "9999-12-31T23:59:59.999999999Z",
            "9999-12-31T23:59:59-23:59",
            "9999-12-31T23:59:59+23:59",
            "2026-02-30T00:00:00Z",
            "2026-11-22T23:59:60Z",
            "2026-11-22T10:00:00+25:00",
            "2026-11-22T10:00:00",
            "2026-11-22",
            "2026-11-22T10:00:00.1234567890123456789Z",
            "2026-11-22t10:00:00z",
            "",
            "tomorrow",
            "2038-01-19T03:14:08Z",
            "2094-08-01T00:00:00Z",
        ])
        .prop_map(str::to_string),
        1 => "\\PC{0,30}",
    ]
    .boxed()
}

/// JSON text of a field value, including numbers no integer type holds.
fn stock() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (1..=100_i64).prop_map(|n| n.to_string()),
        2 => proptest::sample::select(vec![
            "0", "-1", "10000000", "10000001", "9223372036854775807", "9223372036854775808",
            "-9223372036854775808", "18446744073709551616", "99999999999999999999999999999",
            "1e400", "1e18", "1.5", "-0", "\"5\"", "null", "true", "[]", "{}",
        ])
        .prop_map(str::to_string),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|f| serde_json::to_string(&f).unwrap_or_else(|_| "0".into())),
    ]
    .boxed()
}

fn title() -> BoxedStrategy<String> {
    prop_oneof![
        3 => Just("Coffee for 1 cent".to_string()),
        2 => "\\PC{0,40}",
        1 => ".{0,20}",
        1 => proptest::sample::select(vec![
            String::new(),
            "   ".to_string(),
            "x".repeat(200),
            "x".repeat(201),
            "😀".repeat(200),
            "a\u{0}b".to_string(),
        ]),
    ]
    .boxed()
}

fn body() -> BoxedStrategy<Vec<u8>> {
    let voucher = (title(), stock(), rfc3339(), rfc3339()).prop_map(|(t, s, b, e)| {
        format!(
            r#"{{"title":{},"stock":{s},"begins_at":{},"ends_at":{}}}"#,
            json!(t),
            json!(b),
            json!(e)
        )
    });
    // A voucher that is valid unless the times say otherwise: most creations succeed.
    let mostly_valid =
        (stock(), -120_000_i64..3_600_000, 1..7_200_000_i64).prop_map(|(s, begins, len)| {
            let iso = |o: i64| format_rfc3339_millis(now_millis() + o);
            format!(
                r#"{{"title":"fuzz","stock":{s},"begins_at":"{}","ends_at":"{}"}}"#,
                iso(begins),
                iso(begins + len)
            )
        });
    prop_oneof![
        4 => voucher.prop_map(String::into_bytes),
        2 => mostly_valid.prop_map(String::into_bytes),
        2 => proptest::collection::vec(any::<u8>(), 0..128),
        1 => proptest::sample::select(vec![
            "", "{}", "[]", "null", "{", "\"x\"", "{\"title\":\"t\"}",
            "{\"title\":\"t\",\"stock\":1,\"begins_at\":\"2026-11-22T10:00:00Z\",\"ends_at\":\"2099-01-01T00:00:00Z\",\"extra\":1}",
            "{\"title\":\"t\",\"title\":\"u\",\"stock\":1,\"begins_at\":\"2026-11-22T10:00:00Z\",\"ends_at\":\"2099-01-01T00:00:00Z\"}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => (0..200_usize).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d)).into_bytes()),
        1 => (16 * 1024 - 2..16 * 1024 + 2_usize).prop_map(|n| {
            let mut b = format!("{{\"title\":\"{}", "x".repeat(n)).into_bytes();
            b.truncate(n);
            b
        }),
    ]
    .boxed()
}

fn headers() -> BoxedStrategy<Vec<(String, Option<String>)>> {
    let one = prop_oneof![
        Just(("content-type".to_string(), None)),
        proptest::sample::select(vec![
            "text/plain",
            "application/octet-stream",
            "application/json; charset=latin1",
            "multipart/form-data; boundary=x",
            "",
        ])
        .prop_map(|v| ("content-type".to_string(), Some(v.to_string()))),
        Just(("host".to_string(), None)),
        Just(("user-agent".to_string(), None)),
        "[ -~]{0,40}".prop_map(|v| ("x-forwarded-for".to_string(), Some(v))),
        "[0-9]{0,25}".prop_map(|v| ("content-length".to_string(), Some(v))),
        "[ -~]{0,40}".prop_map(|v| ("accept".to_string(), Some(v))),
        ("x-[a-z]{1,10}", "\\PC{0,30}").prop_map(|(k, v)| (k, Some(v))),
    ];
    proptest::collection::vec(one, 0..3).boxed()
}

// ---- strategies sharing TOTAL_CASES ----

/// Routes with fuzzed ids, mostly with the route's own method and a usable token.
fn id_requests(known: &Known) -> BoxedStrategy<FuzzRequest> {
    (
        path(known),
        auth(),
        proptest::option::of(body()),
        any::<bool>(),
    )
        .prop_flat_map(|((path, usual), auth, body, base64)| {
            method(usual).prop_map(move |method| FuzzRequest {
                method,
                path: path.clone(),
                auth: auth.clone(),
                body: body.clone(),
                base64,
                headers: Vec::new(),
            })
        })
        .boxed()
}

/// The real ids of the seeded sale with every kind of token and claims.
fn token_requests(known: &Known) -> BoxedStrategy<FuzzRequest> {
    let paths = vec![
        ("GET".to_string(), format!("/orders/{}", known.order)),
        (
            "GET".to_string(),
            format!("/vouchers/{}/order", known.open_voucher),
        ),
        (
            "POST".to_string(),
            format!("/vouchers/{}/seckill", known.open_voucher),
        ),
        (
            "POST".to_string(),
            format!("/vouchers/{}/seckill", known.future_voucher),
        ),
        (
            "GET".to_string(),
            format!("/vouchers/{}", known.open_voucher),
        ),
        ("POST".to_string(), "/vouchers".to_string()),
    ];
    (
        proptest::sample::select(paths),
        auth(),
        proptest::option::of(body()),
        any::<bool>(),
    )
        .prop_map(|((method, path), auth, body, base64)| FuzzRequest {
            method,
            path,
            auth,
            body,
            base64,
            headers: Vec::new(),
        })
        .boxed()
}

/// `POST /vouchers` with fuzzed bodies, as text or base64, mostly as an admin.
fn body_requests() -> BoxedStrategy<FuzzRequest> {
    let admin = prop_oneof![
        6 => "[a-z]{1,8}".prop_map(|sub| Auth::Bearer(token(&sub, true))),
        1 => Just(Auth::Claims(json!({ "sub": "ops", "scope": ADMIN_SCOPE }))),
        1 => auth(),
    ];
    (
        admin,
        proptest::option::weighted(0.95, body()),
        any::<bool>(),
        headers(),
    )
        .prop_map(|(auth, body, base64, headers)| FuzzRequest {
            method: "POST".to_string(),
            path: "/vouchers".to_string(),
            auth,
            body,
            base64,
            headers,
        })
        .boxed()
}

/// Everything at once, with odd headers.
fn mixed_requests(known: &Known) -> BoxedStrategy<FuzzRequest> {
    (id_requests(known), headers())
        .prop_map(|(mut req, headers)| {
            req.headers = headers;
            req
        })
        .boxed()
}

// ---- the run ----

/// Calls the handler with one request and checks the answer.
fn check(
    rt: &tokio::runtime::Runtime,
    app: &App,
    fuzz: &FuzzRequest,
) -> Result<u16, TestCaseError> {
    let event = fuzz.event().to_string();
    let req: Request = lambda_http::request::from_str(&event)
        .map_err(|e| TestCaseError::fail(format!("not an event lambda_http accepts: {e}")))?
        .with_lambda_context(lambda_http::Context::default());
    let route = seckill_tests::contract::route_key_of(&req);
    let res: Response<Body> = rt
        .block_on(AssertUnwindSafe(handle(app, req)).catch_unwind())
        .map_err(|panic| {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            TestCaseError::fail(format!("the handler panicked: {msg}"))
        })?;
    let status = res.status().as_u16();
    let body = String::from_utf8_lossy(res.body().as_ref()).into_owned();
    prop_assert!(status < 500, "{status} {body}");
    prop_assert_eq!(
        res.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json"),
        "{} {}",
        status,
        body
    );
    let json: Value = serde_json::from_str(&body)
        .map_err(|e| TestCaseError::fail(format!("{status}: body is not JSON ({e}): {body}")))?;
    prop_assert!(json.is_object(), "{status} {body}");
    // The answer as the contract (docs/openapi.yaml) describes it: a listed status for
    // the route, a body of that status's schema (which holds the codes allowed).
    if let Err(e) = seckill_tests::contract::contract().check(route.as_deref(), status, &json) {
        return Err(TestCaseError::fail(e));
    }
    if status >= 400 {
        let code = json["code"].as_str().unwrap_or_default();
        prop_assert!(
            CODES.contains(&code),
            "{status}: code {code:?} not in the contract: {body}"
        );
        prop_assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{status}: no message: {body}"
        );
    }
    Ok(status)
}

#[test]
fn ten_thousand_generated_requests_never_panic_or_answer_5xx() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let b = rt.block_on(Backends::start());
    let app = rt.block_on(App::new(&b.http_config()));
    let known = rt.block_on(seed(&app));

    // Shares of TOTAL_CASES: ids weigh most (the bug was there), then bodies.
    let runs: [(&str, u32, BoxedStrategy<FuzzRequest>); 4] = [
        ("ids", TOTAL_CASES * 4 / 10, id_requests(&known)),
        ("tokens", TOTAL_CASES * 2 / 10, token_requests(&known)),
        ("bodies", TOTAL_CASES * 3 / 10, body_requests()),
        ("mixed", TOTAL_CASES / 10, mixed_requests(&known)),
    ];
    assert_eq!(runs.iter().map(|r| r.1).sum::<u32>(), TOTAL_CASES);
    let statuses: [AtomicU32; 6] = Default::default();
    let started = std::time::Instant::now();
    for (name, cases, strategy) in runs {
        let config = Config {
            cases,
            failure_persistence: None,
            // A failing case is shrunk, but not for ever: each step is a real request.
            max_shrink_iters: 200,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
        let result = runner.run(&strategy, |fuzz| {
            let status = check(&rt, &app, &fuzz)?;
            statuses[usize::from(status / 100).min(5)].fetch_add(1, Ordering::Relaxed);
            Ok(())
        });
        if let Err(e) = result {
            panic!("{name}: {e}");
        }
    }
    // Beyond the sample: every boundary id on every id route, with the buyer's valid
    // token, so the exact inputs of the issue are sent on every run whatever the seed.
    for id in BOUNDARY_IDS {
        for (method, path) in [
            ("GET", format!("/orders/{id}")),
            ("GET", format!("/vouchers/{id}")),
            ("GET", format!("/vouchers/{id}/order")),
            ("POST", format!("/vouchers/{id}/seckill")),
        ] {
            let fuzz = FuzzRequest {
                method: method.to_string(),
                path,
                auth: Auth::Bearer(token(BUYER, false)),
                body: None,
                base64: false,
                headers: Vec::new(),
            };
            if let Err(e) = check(&rt, &app, &fuzz) {
                panic!("{fuzz:?}: {e}");
            }
        }
    }
    let counts: Vec<u32> = statuses.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!(
        "{TOTAL_CASES} requests in {:?}: 2xx {}, 4xx {}",
        started.elapsed(),
        counts[2],
        counts[4]
    );
    // Every generated request was answered (proptest rejects none here), and the
    // generators reach past the edge: real successes, not only refusals.
    assert_eq!(counts[2] + counts[4], TOTAL_CASES, "{counts:?}");
    assert!(
        counts[2] >= TOTAL_CASES / 20,
        "too few successes: {counts:?}"
    );
    rt.block_on(b.cleanup());
}

/// An open sale with a real order held by [`BUYER`] and a sale not started yet.
async fn seed(app: &App) -> Known {
    let admin = token("fuzz-admin", true);
    let mut ids = Vec::new();
    for (begins, ends) in [(-1_000, 3_600_000), (3_600_000, 7_200_000)] {
        let body = json!({
            "title": "fuzz",
            "stock": 10_000_000,
            "begins_at": format_rfc3339_millis(now_millis() + begins),
            "ends_at": format_rfc3339_millis(now_millis() + ends),
        });
        let req = FuzzRequest {
            method: "POST".into(),
            path: "/vouchers".into(),
            auth: Auth::Bearer(admin.clone()),
            body: Some(body.to_string().into_bytes()),
            base64: false,
            headers: Vec::new(),
        };
        let res = handle(
            app,
            lambda_http::request::from_str(&req.event().to_string()).unwrap(),
        )
        .await;
        assert_eq!(res.status().as_u16(), 201);
        let v: Value = serde_json::from_slice(res.body().as_ref()).unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let buy = FuzzRequest {
        method: "POST".into(),
        path: format!("/vouchers/{}/seckill", ids[0]),
        auth: Auth::Bearer(token(BUYER, false)),
        body: None,
        base64: false,
        headers: Vec::new(),
    };
    let res = handle(
        app,
        lambda_http::request::from_str(&buy.event().to_string()).unwrap(),
    )
    .await;
    assert_eq!(res.status().as_u16(), 202);
    let v: Value = serde_json::from_slice(res.body().as_ref()).unwrap();
    Known {
        open_voucher: ids[0].clone(),
        future_voucher: ids[1].clone(),
        order: v["order_id"].as_str().unwrap().to_string(),
    }
}

//! `api-gateway-local`: what the API Gateway HTTP API does in front of seckill-http in
//! AWS, on loopback in front of `cargo lambda watch`.
//!
//! In AWS a request reaches the function as a payload format 2.0 event built by API
//! Gateway: the route it matched (`routeKey`, `pathParameters`), lower-case headers
//! (repeats joined by commas), the caller's address, and the body as text, or
//! base64-encoded with `isBase64Encoded` when it is not text. `cargo lambda watch`'s own
//! function URL builds a similar event, but answers `500` itself to a text-typed body
//! that is not UTF-8, so the function's answer to such bodies could not be tested over
//! HTTP. This server builds the event as API Gateway does and invokes the function
//! through the Lambda Invoke API that `cargo lambda watch` serves.
//!
//! One deliberate difference: a request matching no route reaches the function (as a
//! `$default` route would) instead of API Gateway's own `404 {"message":"Not Found"}`,
//! so the function's `404`/`405` answers can be checked locally.
//!
//! Route throttling (the stage's `RouteSettings`) is emulated for the routes it is given
//! (`--route-throttle`): a token bucket per route, as API Gateway's (rate per second,
//! burst), answering `429 {"message":"Too Many Requests"}` before the function is
//! invoked. Only what the local stack asks for: the payment webhooks' ceilings, so a
//! flood of junk at them is measured as in AWS.
//!
//! In front of that, the edge's per-client limit (template.yaml's WAF rate-based rule on
//! the anonymous reads, `Edge=Enabled`) is emulated for the routes it is given
//! (`--client-limit`): a token bucket per client and group of routes, answering the
//! web ACL's own `429` ([`edge_limited`]) before anything else counts the request. A
//! client is the first address of `X-Forwarded-For` (what a client behind the
//! distribution looks like, and how a test poses as many clients from one machine),
//! else the socket's peer. That client is also the event's `sourceIp`, the address the
//! function limits anonymous reads by: in AWS it reads the same client from the
//! distribution's `CloudFront-Viewer-Address` (seckill_http::edge). In AWS, WAF counts
//! the viewer's own address, which no header can forge; locally a test may pose as any
//! client. The window differs too (a bucket of `limit` refilled at `limit / 60` a second
//! here, at most `limit` requests in any minute there).

pub mod in_flight;

use std::collections::HashMap;
use std::net::IpAddr;

use aws_lambda_events::apigw::{
    ApiGatewayV2httpRequest, ApiGatewayV2httpRequestContext,
    ApiGatewayV2httpRequestContextHttpDescription,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use seckill_http::routes::Route;
use serde::Deserialize;

/// The client a request counts against at the edge: the first address of
/// `X-Forwarded-For` when it has a valid one, else the socket's peer.
pub fn client_of(headers: &HeaderMap, peer: IpAddr) -> IpAddr {
    headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .and_then(|first| first.trim().parse().ok())
        .unwrap_or(peer)
}

/// The web ACL's answer to a client over its limit (template.yaml, `EdgeWebAcl`'s
/// custom response): the API's own `429 rate_limited` body.
pub fn edge_limited() -> Outgoing {
    Outgoing {
        status: StatusCode::TOO_MANY_REQUESTS,
        headers: vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body: EDGE_LIMITED_BODY.as_bytes().to_vec(),
    }
}

/// The body of [`edge_limited`], as the template's web ACL sends it.
pub const EDGE_LIMITED_BODY: &str =
    r#"{"code":"rate_limited","message":"too many requests from your address, slow down"}"#;

/// The largest request payload API Gateway HTTP APIs accept (10 MB); larger is `413`.
pub const MAX_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;

/// The request as the gateway received it.
#[derive(Debug, Clone)]
pub struct Incoming<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    pub source_ip: IpAddr,
    pub request_id: String,
    /// Seconds since the epoch with milliseconds, when the request arrived.
    pub at_ms: i64,
}

/// Whether API Gateway passes a body of this `content-type` as text: text types and
/// JSON, and only when the bytes are UTF-8; anything else is base64-encoded.
fn is_text(content_type: Option<&str>, body: &[u8]) -> bool {
    let textual = content_type.is_none_or(|c| {
        let c = c.trim().to_ascii_lowercase();
        c.starts_with("text/")
            || c.starts_with("application/json")
            || c.contains("+json")
            || c.starts_with("application/xml")
            || c.starts_with("application/javascript")
            || c.starts_with("application/x-www-form-urlencoded")
    });
    textual && std::str::from_utf8(body).is_ok()
}

/// The route key and path parameters API Gateway would match, `$default` for none.
/// The route key a request matches (`"POST /payments/stripe"`), `$default` for none.
pub fn route_key(method: &Method, path: &str) -> &'static str {
    Route::parse(method, path).map_or("$default", |r| r.key().0)
}

fn route_of(method: &Method, path: &str) -> (String, HashMap<String, String>) {
    match Route::parse(method, path) {
        Some(route) => {
            let (key, param) = route.key();
            let params = param
                .map(|(name, value)| HashMap::from([(name.to_string(), value.to_string())]))
                .unwrap_or_default();
            (key.to_string(), params)
        }
        None => ("$default".to_string(), HashMap::new()),
    }
}

/// API Gateway's headers: names lower-case, a repeated header joined with commas, the
/// cookies moved to their own field.
fn headers_of(headers: &HeaderMap) -> (HeaderMap, Option<Vec<String>>) {
    let mut joined: HashMap<HeaderName, Vec<&[u8]>> = HashMap::new();
    for (name, value) in headers {
        joined
            .entry(name.clone())
            .or_default()
            .push(value.as_bytes());
    }
    let mut out = HeaderMap::new();
    let mut cookies = None;
    for (name, values) in joined {
        if name == http::header::COOKIE {
            let all: Vec<String> = values
                .iter()
                .flat_map(|v| {
                    String::from_utf8_lossy(v)
                        .split("; ")
                        .map(str::to_string)
                        .collect::<Vec<_>>()
                })
                .filter(|c| !c.is_empty())
                .collect();
            cookies = Some(all);
            continue;
        }
        let value = values.join(&b","[..]);
        if let Ok(value) = HeaderValue::from_bytes(&value) {
            out.insert(name, value);
        }
    }
    (out, cookies)
}

/// The payload format 2.0 event of a request.
#[allow(deprecated)] // `http_method`: set as well as `requestContext.http.method`.
pub fn event_of(req: &Incoming<'_>) -> ApiGatewayV2httpRequest {
    let (route_key, path_parameters) = route_of(req.method, req.path);
    let (headers, cookies) = headers_of(req.headers);
    let content_type = req
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let (body, is_base64_encoded) = if req.body.is_empty() {
        (None, false)
    } else if is_text(content_type, req.body) {
        (Some(String::from_utf8_lossy(req.body).into_owned()), false)
    } else {
        (Some(BASE64.encode(req.body)), true)
    };
    let raw_query = req.query.unwrap_or_default();

    let mut http_desc = ApiGatewayV2httpRequestContextHttpDescription::default();
    http_desc.method = req.method.clone();
    http_desc.path = Some(req.path.to_string());
    http_desc.protocol = Some("HTTP/1.1".into());
    http_desc.source_ip = Some(req.source_ip.to_string());
    http_desc.user_agent = req
        .headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);

    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.route_key = Some(route_key.clone());
    ctx.account_id = Some("000000000000".into());
    ctx.stage = Some("$default".into());
    ctx.request_id = Some(req.request_id.clone());
    ctx.apiid = Some("local".into());
    ctx.domain_name = headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    ctx.domain_prefix = Some("local".into());
    ctx.time = Some(clf_time(req.at_ms));
    ctx.time_epoch = req.at_ms;
    ctx.http = http_desc;

    let mut ev = ApiGatewayV2httpRequest::default();
    ev.version = Some("2.0".into());
    ev.http_method = req.method.clone();
    ev.route_key = Some(route_key);
    ev.raw_path = Some(req.path.to_string());
    ev.raw_query_string = Some(raw_query.to_string());
    ev.cookies = cookies;
    ev.headers = headers;
    ev.query_string_parameters = raw_query.parse().unwrap_or_default();
    ev.path_parameters = path_parameters;
    ev.request_context = ctx;
    ev.body = body;
    ev.is_base64_encoded = is_base64_encoded;
    ev
}

/// `27/Nov/2026:07:30:00 +0000`, the form of `requestContext.time`.
fn clf_time(at_ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(at_ms.div_euclid(1000))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][usize::from(u8::from(t.month())) - 1];
    format!(
        "{:02}/{month}/{}:{:02}:{:02}:{:02} +0000",
        t.day(),
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The function's answer (payload format 2.0 response).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionResponse {
    #[serde(default)]
    pub status_code: Option<u16>,
    #[serde(default)]
    pub headers: HashMap<String, String>,
    #[serde(default)]
    pub multi_value_headers: HashMap<String, Vec<String>>,
    #[serde(default)]
    pub cookies: Vec<String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub is_base64_encoded: bool,
}

/// The HTTP answer: status, headers, body.
#[derive(Debug)]
pub struct Outgoing {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Vec<u8>,
}

/// API Gateway's own answer when the function fails (an unhandled error, a malformed
/// answer, no answer): `500 {"message":"Internal Server Error"}`.
pub fn internal_error() -> Outgoing {
    gateway_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
}

/// One of API Gateway's own `{"message": ...}` answers.
pub fn gateway_error(status: StatusCode, message: &str) -> Outgoing {
    Outgoing {
        status,
        headers: vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body: serde_json::json!({ "message": message })
            .to_string()
            .into_bytes(),
    }
}

/// The HTTP answer of the function's response, as API Gateway turns it into one.
pub fn response_of(res: FunctionResponse) -> Outgoing {
    let Some(status) = res.status_code.and_then(|s| StatusCode::from_u16(s).ok()) else {
        return internal_error();
    };
    let body = match res.body {
        None => Vec::new(),
        Some(b) if res.is_base64_encoded => match BASE64.decode(b.as_bytes()) {
            Ok(bytes) => bytes,
            Err(_) => return internal_error(),
        },
        Some(b) => b.into_bytes(),
    };
    let mut headers = Vec::new();
    let singles = res.headers.into_iter().map(|(k, v)| (k, vec![v]));
    for (name, values) in singles.chain(res.multi_value_headers) {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for value in values {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.push((name.clone(), value));
            }
        }
    }
    for cookie in res.cookies {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            headers.push((http::header::SET_COOKIE, value));
        }
    }
    Outgoing {
        status,
        headers,
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming<'a>(
        method: &'a Method,
        path: &'a str,
        headers: &'a HeaderMap,
        body: &'a [u8],
    ) -> Incoming<'a> {
        Incoming {
            method,
            path,
            query: Some("a=1&a=2&b=x"),
            headers,
            body,
            source_ip: "192.0.2.7".parse().unwrap(),
            request_id: "req-1".into(),
            at_ms: 1_795_000_000_123,
        }
    }

    #[test]
    fn a_client_is_the_first_forwarded_address_else_the_peer() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(client_of(&h, peer), peer);
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("198.51.100.4, 10.0.0.1"),
        );
        assert_eq!(
            client_of(&h, peer),
            "198.51.100.4".parse::<IpAddr>().unwrap()
        );
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("junk, 10.0.0.1"),
        );
        assert_eq!(client_of(&h, peer), peer);
    }

    #[test]
    fn a_declared_route_is_named_with_its_parameter() {
        let headers = HeaderMap::new();
        let ev = event_of(&incoming(
            &Method::POST,
            "/vouchers/12/seckill",
            &headers,
            b"",
        ));
        assert_eq!(ev.route_key.as_deref(), Some("POST /vouchers/{id}/seckill"));
        assert_eq!(ev.request_context.route_key, ev.route_key);
        assert_eq!(ev.path_parameters["id"], "12");
        assert_eq!(
            ev.request_context.http.source_ip.as_deref(),
            Some("192.0.2.7")
        );
        assert_eq!(ev.body, None);
        assert_eq!(ev.query_string_parameters.all("a"), Some(vec!["1", "2"]));
        assert_eq!(
            ev.request_context.time.as_deref(),
            Some("18/Nov/2026:11:06:40 +0000")
        );
    }

    #[test]
    fn an_undeclared_method_or_path_goes_to_default() {
        let headers = HeaderMap::new();
        for (m, p) in [("TRACE", "/vouchers"), ("GET", "/nowhere")] {
            let m: Method = m.parse().unwrap();
            let ev = event_of(&incoming(&m, p, &headers, b""));
            assert_eq!(ev.route_key.as_deref(), Some("$default"));
            assert!(ev.path_parameters.is_empty());
        }
    }

    #[test]
    fn a_body_is_text_only_when_typed_as_text_and_utf8() {
        let mut json = HeaderMap::new();
        json.insert("content-type", HeaderValue::from_static("application/json"));
        let mut bin = HeaderMap::new();
        bin.insert(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        let none = HeaderMap::new();
        let cases: [(&HeaderMap, &[u8], bool); 5] = [
            (&json, br#"{"a":1}"#, false),
            (&json, b"\xff\xfe", true),
            (&none, "caf\u{e9}".as_bytes(), false),
            (&bin, br#"{"a":1}"#, true),
            (&none, b"\x80", true),
        ];
        for (headers, body, base64) in cases {
            let ev = event_of(&incoming(&Method::POST, "/vouchers", headers, body));
            assert_eq!(ev.is_base64_encoded, base64, "{body:?}");
            let got = ev.body.unwrap();
            let bytes = if base64 {
                BASE64.decode(got).unwrap()
            } else {
                got.into_bytes()
            };
            assert_eq!(bytes, body);
        }
    }

    #[test]
    fn repeated_headers_are_joined_and_cookies_moved() {
        let mut h = HeaderMap::new();
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        h.append("cookie", HeaderValue::from_static("k=v; k2=v2"));
        let ev = event_of(&incoming(&Method::GET, "/vouchers/1", &h, b""));
        assert_eq!(ev.headers["x-a"], "1,2");
        assert!(ev.headers.get("cookie").is_none());
        assert_eq!(
            ev.cookies,
            Some(vec!["k=v".to_string(), "k2=v2".to_string()])
        );
    }

    #[test]
    fn the_function_reads_the_event_back() {
        use lambda_http::RequestExt;
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let ev = event_of(&incoming(&Method::POST, "/orders/9/pay", &h, b"\xc3\x28"));
        let req = lambda_http::request::from_str(&serde_json::to_string(&ev).unwrap()).unwrap();
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri().path(), "/orders/9/pay");
        assert_eq!(req.path_parameters().first("order_id"), Some("9"));
        assert_eq!(req.body().as_ref(), b"\xc3\x28");
        assert_eq!(Route::of(&req), Some(Route::PayOrder("9")));
    }

    #[test]
    fn the_functions_answer_becomes_the_http_answer() {
        let out = response_of(FunctionResponse {
            status_code: Some(405),
            headers: HashMap::from([("allow".into(), "GET".into())]),
            body: Some(BASE64.encode(b"{}")),
            is_base64_encoded: true,
            ..Default::default()
        });
        assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(out.body, b"{}");
        assert!(out.headers.iter().any(|(n, v)| n == "allow" && v == "GET"));
        let bad = response_of(FunctionResponse::default());
        assert_eq!(bad.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}

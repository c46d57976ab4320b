//! The routes the pages stand on, over real HTTP against the running stack: the
//! operators' figures (`GET /status`, admin only, checked against the contract), the
//! server's clock on a voucher read, and the pages' files with their headers.

use reqwest::StatusCode;
use seckill_shared::domain::{now_millis, parse_rfc3339_millis};
use seckill_tests::api::{Api, id_of};
use serde_json::{Value, json};

async fn open_voucher(api: &Api, stock: i64) -> String {
    id_of(
        &api.create_voucher("live view", stock, -1_000, json!({}))
            .await,
    )
}

/// The one voucher of a `GET /status?voucher=ID` answer.
async fn figures(api: &Api, id: &str) -> Value {
    let (status, body) = api
        .call(
            "GET",
            &format!("/status?voucher={id}"),
            Some(&api.token("ops", true)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let all = body["vouchers"].as_array().expect("a list");
    assert_eq!(all.len(), 1, "{body}");
    all[0].clone()
}

#[tokio::test]
async fn live_view_status_shows_a_sale_admitted_then_drained_to_admins_only() {
    let api = Api::new();
    let id = open_voucher(&api, 3).await;
    let before = figures(&api, &id).await;
    assert_eq!(
        (
            &before["voucher"],
            &before["admitted"],
            &before["stock_left_redis"]
        ),
        (&json!(id), &json!(0), &json!(3)),
        "{before}"
    );
    for n in 0..2 {
        let buyer = format!("live-{n}-{}", now_millis());
        let (status, _) = api
            .call(
                "POST",
                &format!("/vouchers/{id}/seckill"),
                Some(&api.token(&buyer, false)),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let admitted = figures(&api, &id).await;
    assert_eq!(admitted["admitted"], 2, "{admitted}");
    assert_eq!(admitted["stock_left_redis"], 1, "{admitted}");
    assert_eq!(admitted["lag"], 2, "both wait for the drainer: {admitted}");
    assert!(admitted["oldest_unfinished_ms"].is_u64(), "{admitted}");
    assert_eq!(admitted["drained"], false);
    // The stack's own drainer may hold the voucher's lock at this moment (this run then
    // passes it by): the figures settle once whichever run has it commits.
    api.drain().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut drained = figures(&api, &id).await;
    while drained["drained"] != true && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        drained = figures(&api, &id).await;
    }
    assert_eq!(
        (
            &drained["confirmed"],
            &drained["lag"],
            &drained["pending"],
            &drained["oldest_unfinished_ms"],
            &drained["drained"],
            &drained["stock_left_db"],
        ),
        (
            &json!(2),
            &json!(0),
            &json!(0),
            &Value::Null,
            &json!(true),
            &json!(1)
        ),
        "{drained}"
    );

    // Buyers and strangers see nothing; a malformed list is the caller's mistake.
    let path = format!("/status?voucher={id}");
    let (status, body) = api
        .call("GET", &path, Some(&api.token("buyer", false)), None)
        .await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::FORBIDDEN, &json!("forbidden"))
    );
    let (status, _) = api.call("GET", &path, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let admin = api.token("ops", true);
    // The last: 23 characters, more than a path id may have (19), whatever its zeros.
    for bad in ["x", "1,,2", "0", "-4", "5,00000000573898144520671"] {
        let (status, body) = api
            .call("GET", &format!("/status?voucher={bad}"), Some(&admin), None)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let many: Vec<String> = (1..=51).map(|n| n.to_string()).collect();
    let (status, _) = api
        .call(
            "GET",
            &format!("/status?voucher={}", many.join(",")),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "at most 50 at once");
    // An unknown voucher is left out, not an error.
    let (status, body) = api
        .call("GET", "/status?voucher=987654321987", Some(&admin), None)
        .await;
    assert_eq!((status, &body["vouchers"]), (StatusCode::OK, &json!([])));
}

#[tokio::test]
async fn live_view_a_voucher_read_carries_the_servers_clock() {
    let api = Api::new();
    let id = open_voucher(&api, 1).await;
    let before = now_millis();
    let (status, v) = api
        .call("GET", &format!("/vouchers/{id}"), None, None)
        .await;
    let after = now_millis();
    assert_eq!(status, StatusCode::OK);
    let at = parse_rfc3339_millis(v["server_time"].as_str().expect("server_time"), "t")
        .expect("RFC 3339");
    assert!(
        (before..=after).contains(&at),
        "{before} <= {at} <= {after}"
    );
}

#[tokio::test]
async fn live_view_the_pages_are_served_with_their_types_and_a_strict_policy() {
    let api = Api::new();
    for (name, content_type, text) in seckill_http::pages::FILES {
        let res = api
            .http
            .get(format!("{}/app/{name}", api.base()))
            .send()
            .await
            .expect("an answer");
        assert_eq!(res.status(), StatusCode::OK, "{name}");
        let header = |h: &str| {
            res.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(header("content-type"), *content_type, "{name}");
        let policy = header("content-security-policy");
        assert!(
            policy.contains("script-src 'self'") && policy.contains("connect-src 'self'"),
            "{name}: {policy}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert_eq!(res.text().await.unwrap(), *text, "{name} as compiled in");
    }
    // Unknown and impossible names get the contract's JSON errors.
    for (path, want, code) in [
        ("/app/admin.html", StatusCode::NOT_FOUND, "not_found"),
        (
            "/app/..%2Fsecrets",
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/app/a%20b.html",
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
    ] {
        let (status, body) = api.call("GET", path, None, None).await;
        assert_eq!((status, &body["code"]), (want, &json!(code)), "{path}");
    }
    // No script of the page writes HTML from data: a title is always shown as text.
    for (name, _, text) in seckill_http::pages::FILES {
        assert!(
            !text.contains("innerHTML") && !text.contains("insertAdjacentHTML"),
            "{name} writes HTML"
        );
    }
}

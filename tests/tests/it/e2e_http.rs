//! The admission function over real HTTP, as served by `cargo lambda watch` in the local
//! stack (`SECKILL_HTTP_URL`), against the stack's Redis (cluster mode), MariaDB and Data
//! API server: create a voucher, buy, buy again, sell out, read the order's status.

use reqwest::StatusCode;
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use seckill_tests::api::Api;
use serde_json::json;

fn unique_user(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

#[tokio::test]
async fn a_sale_over_http() {
    let api = Api::new();
    let body = json!({
        "title": "e2e coffee",
        "stock": 2,
        "begins_at": format_rfc3339_millis(now_millis() - 1_000),
        "ends_at": format_rfc3339_millis(now_millis() + 3_600_000),
    });
    let (status, voucher) = api
        .call(
            "POST",
            "/vouchers",
            Some(&api.token("ops", true)),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{voucher}");
    let id = voucher["id"]
        .as_str()
        .expect("id is a decimal string")
        .to_string();

    let (status, v) = api
        .call("GET", &format!("/vouchers/{id}"), None, None)
        .await;
    assert_eq!(
        (status, v["stock_left"].clone()),
        (StatusCode::OK, json!(2))
    );

    let alice = unique_user("alice");
    let buy = format!("/vouchers/{id}/seckill");
    let (status, order) = api
        .call("POST", &buy, Some(&api.token(&alice, false)), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{order}");
    assert_eq!(order["status"], "pending");
    let order_id = order["order_id"]
        .as_str()
        .expect("order id is a decimal string")
        .to_string();

    let (status, dup) = api
        .call("POST", &buy, Some(&api.token(&alice, false)), None)
        .await;
    assert_eq!(
        (status, dup["code"].clone(), dup["order_id"].clone()),
        (
            StatusCode::CONFLICT,
            json!("already_purchased"),
            json!(order_id)
        ),
        "a second purchase names the order the buyer holds"
    );
    let (status, _) = api
        .call(
            "POST",
            &buy,
            Some(&api.token(&unique_user("bob"), false)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, out) = api
        .call(
            "POST",
            &buy,
            Some(&api.token(&unique_user("carol"), false)),
            None,
        )
        .await;
    assert_eq!(
        (status, out["code"].clone()),
        (StatusCode::CONFLICT, json!("sold_out"))
    );

    let (status, st) = api
        .call(
            "GET",
            &format!("/orders/{order_id}"),
            Some(&api.token(&alice, false)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{st}");
    assert_eq!(st["voucher_id"], json!(id));
    assert!(
        st["status"] == "pending" || st["status"] == "confirmed",
        "{st}"
    );
    let (status, _) = api
        .call(
            "GET",
            &format!("/orders/{order_id}"),
            Some(&api.token("someone-else", false)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, err) = api.call("POST", &buy, None, None).await;
    assert_eq!(
        (status, err["code"].clone()),
        (StatusCode::UNAUTHORIZED, json!("unauthorized"))
    );
    let (status, err) = api
        .call(
            "POST",
            "/vouchers",
            Some(&api.token("ops", true)),
            Some(json!({"title": 5})),
        )
        .await;
    assert_eq!(
        (status, err["code"].clone()),
        (StatusCode::BAD_REQUEST, json!("invalid_request"))
    );
}

/// The payment step over real HTTP: a voucher with `pay_within_s`, a payment repeated
/// with its idempotency key, a cancel whose unit sells again at once, the payment codes.
#[tokio::test]
async fn a_sale_with_payment_over_http() {
    let api = Api::new();
    let admin = api.token("ops", true);
    let body = json!({
        "title": "e2e pay later",
        "stock": 2,
        "begins_at": format_rfc3339_millis(now_millis() - 1_000),
        "ends_at": format_rfc3339_millis(now_millis() + 3_600_000),
        "pay_within_s": 600,
    });
    let (status, voucher) = api
        .call("POST", "/vouchers", Some(&admin), Some(body))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{voucher}");
    assert_eq!(voucher["pay_within_s"], 600);
    let vid = voucher["id"].as_str().unwrap().to_string();
    let (alice, bob, carol) = (
        api.token(&unique_user("alice"), false),
        api.token(&unique_user("bob"), false),
        api.token(&unique_user("carol"), false),
    );
    let buy = |t: String| {
        let api = &api;
        let path = format!("/vouchers/{vid}/seckill");
        async move { api.call("POST", &path, Some(&t), None).await }
    };
    let (s, a) = buy(alice.clone()).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{a}");
    let (s, b) = buy(bob.clone()).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    let (s, c) = buy(carol.clone()).await;
    assert_eq!(
        (s, c["code"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out"))
    );
    let (a, b) = (
        a["order_id"].as_str().unwrap(),
        b["order_id"].as_str().unwrap(),
    );

    // Pay with the header; the same key again is the same answer.
    for _ in 0..2 {
        let res = api
            .http
            .post(format!("{}/orders/{a}/pay", api.env.seckill_http_url()))
            .bearer_auth(&alice)
            .header("Idempotency-Key", "pi_e2e_1")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["status"], "paid", "{body}");
        assert!(body["pay_by"].is_string(), "{body}");
    }
    let path = format!("/orders/{a}/pay");
    let (s, e) = api
        .call(
            "POST",
            &path,
            Some(&alice),
            Some(json!({ "payment_ref": "pi_other" })),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_paid"))
    );
    let (s, e) = api
        .call(
            "POST",
            &path,
            Some(&bob),
            Some(json!({ "payment_ref": "x" })),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (s, e) = api
        .call("POST", &format!("/orders/{a}/cancel"), Some(&alice), None)
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_paid"))
    );

    // Bob cancels: his unit is on sale again at once.
    let (s, e) = api
        .call("POST", &format!("/orders/{b}/cancel"), Some(&bob), None)
        .await;
    assert_eq!(
        (s, e["status"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{e}"
    );
    let (s, e) = api
        .call(
            "POST",
            &format!("/orders/{b}/pay"),
            Some(&bob),
            Some(json!({ "payment_ref": "pi_b" })),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_cancelled"))
    );
    let (s, c) = buy(carol.clone()).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{c}");
    let c = c["order_id"].as_str().unwrap();
    for (token, id, want) in [
        (&alice, a, "paid"),
        (&bob, b, "cancelled"),
        (&carol, c, "pending"),
    ] {
        let (s, o) = api
            .call("GET", &format!("/orders/{id}"), Some(token), None)
            .await;
        assert_eq!(
            (s, o["status"].as_str()),
            (StatusCode::OK, Some(want)),
            "{o}"
        );
        assert!(o["pay_by"].is_string(), "{o}");
    }
}

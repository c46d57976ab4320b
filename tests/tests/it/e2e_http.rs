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

//! End to end through the local stack, as a client and the scheduler see it: buy over
//! HTTP (seckill-http under `cargo lambda watch`), invoke order-drainer through its Lambda
//! invoke URL with the EventBridge scheduled-event fixture, then `GET /orders/{id}` says
//! `confirmed` and the database holds exactly the orders and stock.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use reqwest::StatusCode;
use seckill_tests::api::{Api, id_of};
use serde_json::{Value, json};

/// The stack runs the drainer with its own DRAINER_MAX_RUN_MS (50 s when unset), so one
/// invocation may take that long.
const INVOKE_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn an_order_bought_over_http_is_confirmed_after_a_drainer_invocation() {
    let stack = Api::new();
    let vid = id_of(
        &stack
            .create_voucher("drainer end to end", 5, -60_000, json!({}))
            .await,
    );

    let run = format!("{:08x}", rand::random::<u32>());
    let mut orders = Vec::new();
    for i in 0..3 {
        let buyer = stack.token(&format!("e2e-drainer-{run}-{i}"), false);
        let (status, body) = stack
            .call(
                "POST",
                &format!("/vouchers/{vid}/seckill"),
                Some(&buyer),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["status"], "pending");
        orders.push((
            buyer,
            body["order_id"].as_str().expect("order id").to_string(),
        ));
    }

    // The scheduler's call.
    let event: Value =
        serde_json::from_str(include_str!("../../fixtures/eventbridge-scheduled.json"))
            .expect("fixture is JSON");
    let started = Instant::now();
    let res = stack
        .http
        .post(stack.env.drainer_invoke_url())
        .json(&event)
        .timeout(INVOKE_TIMEOUT)
        .send()
        .await
        .expect("the drainer answers its invoke URL");
    let status = res.status();
    let summary: Value = res.json().await.expect("JSON response");
    eprintln!("invocation took {:?}: {summary}", started.elapsed());
    assert_eq!(status, StatusCode::OK, "{summary}");
    assert_eq!(
        summary["errors"], 0,
        "the invocation reports success: {summary}"
    );
    for key in [
        "claimed",
        "read",
        "inserted",
        "duplicates",
        "rejected",
        "dead_lettered",
        "lag",
        "elapsed_ms",
    ] {
        assert!(
            summary[key].is_u64(),
            "summary field {key} missing: {summary}"
        );
    }

    for (buyer, id) in &orders {
        let (status, body) = stack
            .call("GET", &format!("/orders/{id}"), Some(buyer), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "confirmed", "{body}");
        assert_eq!(body["voucher_id"], vid.as_str());
    }

    // The database itself: three confirmed rows, stock 5 − 3.
    let mut db = seckill_tests::mysql::connect(&stack.env.mysql_url()).await;
    let vid_num: u64 = vid.parse().expect("numeric id");
    let rows: Vec<(u64, String)> = db
        .exec(
            "SELECT id, status FROM orders WHERE voucher_id = ? ORDER BY id",
            (vid_num,),
        )
        .await
        .expect("orders");
    let left: Option<i64> = db
        .exec_first("SELECT stock_left FROM vouchers WHERE id = ?", (vid_num,))
        .await
        .expect("stock");
    db.disconnect().await.ok();
    let mut want: Vec<(u64, String)> = orders
        .iter()
        .map(|(_, id)| (id.parse().expect("numeric"), "confirmed".to_string()))
        .collect();
    want.sort();
    assert_eq!(rows, want);
    assert_eq!(left, Some(2));
}

//! The admission function over real HTTP, as API Gateway invokes it in the local stack
//! (`SECKILL_HTTP_URL`: tools/api-gateway-local in front of `cargo lambda watch`), against the stack's Redis (cluster mode), MariaDB and Data
//! API server: create a voucher, buy, buy again, sell out, read the order's status.

use reqwest::StatusCode;
use seckill_shared::domain::now_millis;
use seckill_tests::api::{Api, id_of};
use serde_json::json;

fn unique_user(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

#[tokio::test]
async fn a_sale_over_http() {
    let api = Api::new();
    let id = id_of(&api.create_voucher("e2e coffee", 2, -1_000, json!({})).await);

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

/// The stack's webhook signing secret (`.dev/stack.env`), the provider's side of it.
fn webhook_secret(api: &Api) -> String {
    let list = api.env.get("SECKILL_PAYMENT_WEBHOOK_SECRET");
    list.split(',').next().unwrap_or_default().to_string()
}

/// The provider's event for `order` of `buyer`, signed with `secret` at `at` (unix s):
/// (body, signature header).
fn signed(
    secret: &str,
    at: i64,
    kind: &str,
    order: &str,
    buyer: &str,
    payment: &str,
    amount: i64,
) -> (String, String) {
    let body = seckill_tests::harness::provider_event(kind, order, buyer, payment, amount, "EUR");
    let sig = seckill_shared::webhook::header(&[secret.as_bytes()], at, body.as_bytes());
    (body, sig)
}

/// Delivers `body` with `signature` (if any) to the webhook over HTTP.
async fn deliver(
    api: &Api,
    body: &str,
    signature: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let mut req = api
        .http
        .post(format!("{}/payments/webhook", api.env.seckill_http_url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(sig) = signature {
        req = req.header(seckill_shared::webhook::SIGNATURE_HEADER, sig);
    }
    let res = req.send().await.expect("webhook answers");
    let status = res.status();
    (status, res.json().await.unwrap_or_default())
}

/// The payment step over real HTTP, paid the only way an order is paid: the provider's
/// signed webhook. The buyer's `pay` starts a payment and changes nothing; a signed
/// event pays; a bad signature, a stale timestamp, a body changed after signing and a
/// wrong amount are refused with a 4xx and change nothing (the wrong amount recorded
/// refused), a payment for an unknown order is recorded refused; the same
/// event ten times at once pays once; a payment id pays one order only; a cancel's unit
/// sells again at once, and a payment after the cancel is to refund.
#[tokio::test]
async fn a_sale_with_payment_over_http() {
    let api = Api::new();
    let secret = webhook_secret(&api);
    // Payment ids are unique in the stack's database, which outlives a run.
    let run = format!("{:08x}", rand::random::<u32>());
    let pid = |name: &str| format!("pi_e2e_{run}_{name}");
    let now_s = || now_millis() / 1000;
    let voucher = api
        .create_voucher(
            "e2e pay later",
            2,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 1250, "currency": "EUR"}),
        )
        .await;
    assert_eq!(voucher["pay_within_s"], 600);
    assert_eq!(voucher["price_minor"], 1250);
    let vid = voucher["id"].as_str().unwrap().to_string();
    // The orders stay `pending` (not drained) throughout: the stack's drainer, every
    // second, keeps off this voucher until the end (under load it drained one mid-test).
    let _held = api.env.hold_drainer_back(&vid);
    let (alice_id, bob_id, carol_id) = (
        unique_user("alice"),
        unique_user("bob"),
        unique_user("carol"),
    );
    let (alice, bob, carol) = (
        api.token(&alice_id, false),
        api.token(&bob_id, false),
        api.token(&carol_id, false),
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
    let status_of = |t: String, id: String| {
        let api = &api;
        async move {
            let (_, o) = api
                .call("GET", &format!("/orders/{id}"), Some(&t), None)
                .await;
            o["status"].as_str().unwrap_or_default().to_string()
        }
    };

    // The buyer starts paying: the checkout's figures; whatever they send, nothing is paid.
    let res = api
        .http
        .post(format!("{}/orders/{a}/pay", api.env.seckill_http_url()))
        .bearer_auth(&alice)
        .header("Idempotency-Key", &pid("1"))
        .json(&json!({ "payment_ref": &pid("1") }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let checkout: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        (
            checkout["amount_minor"].as_i64(),
            checkout["currency"].as_str()
        ),
        (Some(1250), Some("EUR")),
        "{checkout}"
    );
    assert!(checkout["pay_by"].is_string(), "{checkout}");
    assert_eq!(status_of(alice.clone(), a.to_string()).await, "pending");

    // Refused, each with a 4xx, and nothing changes.
    let (body, good) = signed(
        &secret,
        now_s(),
        "payment.succeeded",
        a,
        &alice_id,
        &pid("1"),
        1250,
    );
    let wrong_secret =
        seckill_shared::webhook::header(&[b"whsec_not_the_secret_000"], now_s(), body.as_bytes());
    let stale =
        seckill_shared::webhook::header(&[secret.as_bytes()], now_s() - 301, body.as_bytes());
    let changed = body.replace("1250", "1");
    for (what, body, sig, want) in [
        ("no signature", body.as_str(), None, 401),
        (
            "a wrong secret",
            body.as_str(),
            Some(wrong_secret.as_str()),
            401,
        ),
        (
            "a stale timestamp",
            body.as_str(),
            Some(stale.as_str()),
            401,
        ),
        (
            "a body changed after signing",
            changed.as_str(),
            Some(good.as_str()),
            401,
        ),
    ] {
        let (s, e) = deliver(&api, body, sig).await;
        assert_eq!(s.as_u16(), want, "{what}: {e}");
        assert_eq!(e["code"], "unauthorized", "{what}: {e}");
    }
    let (unknown, sig) = signed(
        &secret,
        now_s(),
        "payment.succeeded",
        "999999999999",
        &alice_id,
        &pid("x"),
        1250,
    );
    // An order nobody has (its id's lease long past): the money is recorded, refused,
    // listed for a refund; the provider stops sending.
    let (s, e) = deliver(&api, &unknown, Some(&sig)).await;
    assert_eq!(
        (s.as_u16(), e["outcome"].as_str(), e["order_id"].as_str()),
        (200, Some("refused"), Some("999999999999")),
        "{e}"
    );
    let (cheap, sig) = signed(
        &secret,
        now_s(),
        "payment.succeeded",
        a,
        &alice_id,
        &pid("cheap"),
        1,
    );
    let (s, e) = deliver(&api, &cheap, Some(&sig)).await;
    assert_eq!(
        (s.as_u16(), e["code"].as_str()),
        (422, Some("payment_mismatch")),
        "{e}"
    );
    assert_eq!(status_of(alice.clone(), a.to_string()).await, "pending");

    // The same signed event ten times at once: paid once, every delivery told so.
    let answers =
        futures::future::join_all((0..10).map(|_| deliver(&api, &body, Some(&good)))).await;
    for (s, e) in &answers {
        assert_eq!(
            (s.as_u16(), e["outcome"].as_str()),
            (200, Some("paid")),
            "{e}"
        );
    }
    assert_eq!(status_of(alice.clone(), a.to_string()).await, "paid");
    // A payment id pays one order: the same id for bob's order is refused.
    let (reused, sig) = signed(
        &secret,
        now_s(),
        "payment.succeeded",
        b,
        &bob_id,
        &pid("1"),
        1250,
    );
    let (s, e) = deliver(&api, &reused, Some(&sig)).await;
    assert_eq!(
        (s.as_u16(), e["code"].as_str()),
        (409, Some("payment_reused")),
        "{e}"
    );
    let (s, e) = api
        .call("POST", &format!("/orders/{a}/cancel"), Some(&alice), None)
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_paid"))
    );

    // Bob cancels: his unit is on sale again at once; a payment after that is to refund.
    let (s, e) = api
        .call("POST", &format!("/orders/{b}/cancel"), Some(&bob), None)
        .await;
    assert_eq!(
        (s, e["status"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{e}"
    );
    let (late, sig) = signed(
        &secret,
        now_s(),
        "payment.succeeded",
        b,
        &bob_id,
        &pid("bob"),
        1250,
    );
    let (s, e) = deliver(&api, &late, Some(&sig)).await;
    assert_eq!(
        (s.as_u16(), e["outcome"].as_str()),
        (200, Some("refund_due")),
        "{e}"
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

/// `seckill pay` plays the payment provider over real HTTP, signing with the stack's
/// secret: `--replay` delivers one signed event twice (paid once, both answers 200
/// `paid`); `--late` waits for the order's deadline, and that payment is recorded to
/// refund: the order stays expired, and `seckill status` and `seckill reconcile` list
/// the payment; an order cancelled and not drained yet (known to Redis only by its close
/// record) can be paid too, and that payment is listed to refund.
#[tokio::test]
async fn seckill_pay_pays_replays_and_pays_late_over_http() {
    use seckill_cli::ops::pay::{self, PayOptions};
    let api = Api::new();
    let vid = id_of(
        &api.create_voucher(
            "e2e seckill pay",
            3,
            -1_000,
            json!({"pay_within_s": 5, "price_minor": 500, "currency": "EUR"}),
        )
        .await,
    );
    let (alice, bob, carol) = (
        unique_user("alice"),
        unique_user("bob"),
        unique_user("carol"),
    );
    let mut orders = Vec::new();
    for user in [&alice, &bob, &carol] {
        let (s, o) = api
            .call(
                "POST",
                &format!("/vouchers/{vid}/seckill"),
                Some(&api.token(user, false)),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{o}");
        orders.push(o["order_id"].as_str().unwrap().parse().unwrap());
    }
    let b = seckill_cli::ops::Backends::from_env().await.unwrap();
    let secrets =
        seckill_shared::webhook::Secrets::parse(&api.env.get("SECKILL_PAYMENT_WEBHOOK_SECRET"))
            .unwrap();
    let url = api.env.seckill_http_url();
    let replay = PayOptions {
        replay: true,
        ..PayOptions::default()
    };
    let done = pay::pay(&b, &url, &secrets, orders[0], &replay)
        .await
        .unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0].event_id, done[1].event_id, "the same event twice");
    for d in &done {
        assert_eq!(
            (d.status, d.answer["outcome"].as_str()),
            (200, Some("paid")),
            "{d:?}"
        );
    }
    // Carol cancels; nothing is drained yet: only Redis's close record knows her.
    let (s, o) = api
        .call(
            "POST",
            &format!("/orders/{}/cancel", orders[2]),
            Some(&api.token(&carol, false)),
            None,
        )
        .await;
    assert_eq!(
        (s, o["status"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{o}"
    );
    let done = pay::pay(&b, &url, &secrets, orders[2], &PayOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (done[0].status, done[0].answer["outcome"].as_str()),
        (200, Some("refund_due")),
        "{:?}",
        done[0]
    );
    let late = PayOptions {
        late: true,
        ..PayOptions::default()
    };
    let done = pay::pay(&b, &url, &secrets, orders[1], &late)
        .await
        .unwrap();
    assert_eq!(
        (done[0].status, done[0].answer["outcome"].as_str()),
        (200, Some("refund_due")),
        "{:?}",
        done[0]
    );
    for (user, order, want) in [(&alice, orders[0], "paid"), (&bob, orders[1], "expired")] {
        let (s, o) = api
            .call(
                "GET",
                &format!("/orders/{order}"),
                Some(&api.token(user, false)),
                None,
            )
            .await;
        assert_eq!(
            (s, o["status"].as_str()),
            (StatusCode::OK, Some(want)),
            "{o}"
        );
    }
    let voucher: seckill_shared::domain::VoucherId = vid.parse().unwrap();
    let s = seckill_cli::ops::status::voucher_status(&b, voucher)
        .await
        .unwrap();
    assert_eq!(s.refunds_due, 2, "{s:?}");
    let report = seckill_cli::ops::reconcile::reconcile(&b, voucher, false)
        .await
        .unwrap();
    assert_eq!(report.refunds_due.len(), 2, "{report:?}");
    let mut refunded: Vec<String> = report
        .refunds_due
        .iter()
        .map(|r| r.order_id.clone())
        .collect();
    refunded.sort();
    let mut want = vec![orders[1].to_string(), orders[2].to_string()];
    want.sort();
    assert_eq!(refunded, want);
    assert!(
        seckill_cli::ops::reconcile::render(&report).contains("payments to refund: 2"),
        "{}",
        seckill_cli::ops::reconcile::render(&report)
    );
}

/// What API Gateway does before the function, and the function's answer to it: a body
/// that is not text reaches the function base64-encoded (the emulator's own function URL
/// answers such a JSON-typed body `500` itself) and is refused as the bad input it is; a
/// declared path asked with another method is `405` naming the method it takes.
#[tokio::test]
async fn bytes_that_are_not_text_and_undeclared_methods_get_the_functions_answer() {
    let api = Api::new();
    let not_utf8: &[u8] = b"\xff\xfe{\"title\": \"\xc3\x28\"}";
    let admin = api.token("ops", true);
    let secret = api.env.get("SECKILL_PAYMENT_WEBHOOK_SECRET");
    // Signed over these very bytes, as a provider would: the signature holds, the body
    // is no event.
    let sig = seckill_shared::webhook::header(&[secret.as_bytes()], now_millis() / 1000, not_utf8);
    for (path, content_type, auth, sig, want) in [
        ("/vouchers", "application/json", Some(&admin), None, 400),
        (
            "/vouchers",
            "application/octet-stream",
            Some(&admin),
            None,
            400,
        ),
        (
            "/payments/webhook",
            "application/json",
            None,
            Some(&sig),
            400,
        ),
        ("/payments/webhook", "application/json", None, None, 401),
    ] {
        let mut req = api
            .http
            .post(format!("{}{path}", api.base()))
            .header("content-type", content_type)
            .body(not_utf8.to_vec());
        if let Some(t) = auth {
            req = req.bearer_auth(t);
        }
        if let Some(s) = sig {
            req = req.header(seckill_shared::webhook::SIGNATURE_HEADER, s.as_str());
        }
        let res = req.send().await.expect("the gateway answers");
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.expect("a JSON answer");
        assert_eq!(status, want, "{path} {content_type}: {body}");
        let code = if want == 400 {
            "invalid_request"
        } else {
            "unauthorized"
        };
        assert_eq!(body["code"], code, "{path}: {body}");
        let route = seckill_tests::contract::route_key("POST", path);
        seckill_tests::contract::contract().assert(route, status, &body);
    }
    for (method, path, allow) in [
        ("TRACE", "/vouchers", "POST"),
        ("DELETE", "/orders/1", "GET"),
    ] {
        let res = api
            .http
            .request(method.parse().unwrap(), format!("{}{path}", api.base()))
            .send()
            .await
            .expect("the gateway answers");
        assert_eq!(res.status().as_u16(), 405, "{method} {path}");
        assert_eq!(res.headers()["allow"], allow);
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["code"], "method_not_allowed", "{body}");
        seckill_tests::contract::contract().assert(None, 405, &body);
    }
}

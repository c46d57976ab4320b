//! Stripe end to end, against the stack's localstripe, with Stripe's own SDK on the other
//! side (`seckill_tests::stripe`): checkout creates the order's one PaymentIntent, the
//! buyer's page confirms it with a test card, and the event Stripe would send (built from
//! the PaymentIntent as fetched, signed by the SDK's test helper) reaches
//! `POST /payments/stripe` over real HTTP.

use reqwest::StatusCode;
use seckill_shared::domain::now_millis;
use seckill_tests::api::{Api, id_of};
use seckill_tests::stripe::{CARD_3DS, CARD_DECLINED, CARD_OK, Sdk, intent_event};
use serde_json::{Value, json};

fn unique_user(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

/// Delivers a Stripe event `body` with `signature` (if any) to `POST /payments/stripe`.
async fn deliver(api: &Api, body: &str, signature: Option<&str>) -> (StatusCode, Value) {
    let mut req = api
        .http
        .post(format!("{}/payments/stripe", api.base()))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(sig) = signature {
        req = req.header("Stripe-Signature", sig);
    }
    let res = req.send().await.expect("the webhook answers");
    let status = res.status();
    let body: Value = res.json().await.unwrap_or_default();
    seckill_tests::contract::contract().assert(
        Some("POST /payments/stripe"),
        status.as_u16(),
        &body,
    );
    (status, body)
}

/// Stripe sends the event of PaymentIntent `intent` reaching `kind`, signed by its SDK.
async fn stripe_sends(api: &Api, sdk: &Sdk, kind: &str, intent: &Value) -> (StatusCode, Value) {
    let body = intent_event(kind, intent);
    let sig = sdk.sign(&sdk.webhook_secret, &body, None);
    deliver(api, &body, Some(&sig)).await
}

/// A buyer with a token, admitted to voucher `vid`: (token, order id).
async fn admitted(api: &Api, vid: &str, name: &str) -> (String, String, String) {
    let user = unique_user(name);
    let token = api.token(&user, false);
    let (s, a) = api
        .call(
            "POST",
            &format!("/vouchers/{vid}/seckill"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{a}");
    (user, token, a["order_id"].as_str().unwrap().to_string())
}

async fn checkout(api: &Api, token: &str, order: &str) -> Value {
    let (s, c) = api
        .call("POST", &format!("/orders/{order}/pay"), Some(token), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    c
}

async fn status_of(api: &Api, token: &str, order: &str) -> String {
    let (_, o) = api
        .call("GET", &format!("/orders/{order}"), Some(token), None)
        .await;
    o["status"].as_str().unwrap_or_default().to_string()
}

/// A sale paid by card through Stripe: checkout creates one PaymentIntent per order
/// (the same one however often, also for five checkouts at once) for the voucher's price
/// with the order in its metadata; 4242 confirms and its `payment_intent.succeeded` pays
/// (delivered twice: the same answer); a declined card's `payment_failed` leaves the
/// order open; a card that needs 3-D Secure pays once the buyer passes it.
#[tokio::test]
async fn stripe_a_card_payment_end_to_end() {
    let api = Api::new();
    let sdk = Sdk::new(&api.env);
    let voucher = api
        .create_voucher(
            "stripe card",
            3,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 1999, "currency": "EUR"}),
        )
        .await;
    let vid = id_of(&voucher);
    let (alice, alice_t, a) = admitted(&api, &vid, "alice").await;
    let (_, bob_t, b) = admitted(&api, &vid, "bob").await;
    let (_, carol_t, c) = admitted(&api, &vid, "carol").await;

    // Checkout: the order's PaymentIntent, for the price, naming the order and buyer.
    let first = checkout(&api, &alice_t, &a).await;
    assert_eq!(first["provider"], "stripe", "{first}");
    assert_eq!(
        (first["amount_minor"].as_i64(), first["currency"].as_str()),
        (Some(1999), Some("EUR"))
    );
    let pi = first["payment_intent"].as_str().unwrap().to_string();
    let held = sdk.intent(&pi);
    assert_eq!(
        (held["amount"].as_i64(), held["currency"].as_str()),
        (Some(1999), Some("eur"))
    );
    assert_eq!(held["metadata"]["order_id"], a.as_str());
    assert_eq!(held["metadata"]["buyer"], alice.as_str());
    assert_eq!(held["metadata"]["voucher_id"], vid.as_str());
    assert_eq!(first["client_secret"], held["client_secret"]);
    // Again, and five at once for another order: one PaymentIntent each.
    assert_eq!(
        checkout(&api, &alice_t, &a).await["payment_intent"],
        pi.as_str()
    );
    let five = futures::future::join_all((0..5).map(|_| checkout(&api, &bob_t, &b))).await;
    let bob_pi = five[0]["payment_intent"].as_str().unwrap().to_string();
    assert!(
        five.iter().all(|c| c["payment_intent"] == bob_pi.as_str()),
        "{five:?}"
    );
    assert_ne!(bob_pi, pi);

    // Alice pays with 4242: Stripe's event pays the order, twice the same.
    let paid = sdk.confirm(&pi, CARD_OK);
    assert_eq!(paid["status"], "succeeded", "{paid}");
    for _ in 0..2 {
        let (s, o) = stripe_sends(&api, &sdk, "payment_intent.succeeded", &paid).await;
        assert_eq!(s, StatusCode::OK, "{o}");
        assert_eq!(
            (o["outcome"].as_str(), o["payment_id"].as_str()),
            (Some("paid"), Some(pi.as_str()))
        );
        assert_eq!(o["order_id"], a.as_str());
    }
    assert_eq!(status_of(&api, &alice_t, &a).await, "paid");
    let (s, e) = api
        .call("POST", &format!("/orders/{a}/pay"), Some(&alice_t), None)
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_paid"))
    );

    // Bob's card is declined: the failure is recorded, the order stays open.
    let declined = sdk.confirm(&bob_pi, CARD_DECLINED);
    assert_eq!(declined["status"], "requires_payment_method", "{declined}");
    assert_eq!(declined["last_payment_error"]["code"], "card_declined");
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.payment_failed", &declined).await;
    assert_eq!(
        (s, o["outcome"].as_str()),
        (StatusCode::OK, Some("failed")),
        "{o}"
    );
    assert_ne!(status_of(&api, &bob_t, &b).await, "paid");
    assert_eq!(
        checkout(&api, &bob_t, &b).await["payment_intent"],
        bob_pi.as_str()
    );

    // Carol's card needs 3-D Secure: nothing until she passes it, then paid.
    let carol_pi = checkout(&api, &carol_t, &c).await["payment_intent"]
        .as_str()
        .unwrap()
        .to_string();
    let pending = sdk.confirm(&carol_pi, CARD_3DS);
    assert_eq!(pending["status"], "requires_action", "{pending}");
    let passed = sdk.authenticate(&carol_pi, true);
    assert_eq!(passed["status"], "succeeded", "{passed}");
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.succeeded", &passed).await;
    assert_eq!(
        (s, o["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{o}"
    );
    assert_eq!(status_of(&api, &carol_t, &c).await, "paid");
}

/// The endpoint's check against Stripe's own signing code: a header made by the SDK's
/// test helper verifies; one byte changed, a timestamp older than the tolerance, another
/// endpoint's secret, the generic format's header, or none, do not. Types not ours, and a
/// PaymentIntent no checkout of ours made, are answered 200 and change nothing.
#[tokio::test]
async fn stripe_signatures_are_stripes_own() {
    let api = Api::new();
    let sdk = Sdk::new(&api.env);
    let body = json!({
        "id": "evt_customer_1", "object": "event", "type": "customer.created",
        "created": now_millis() / 1000, "data": {"object": {"id": "cus_1", "object": "customer"}},
    })
    .to_string();
    let good = sdk.sign(&sdk.webhook_secret, &body, None);
    let (s, o) = deliver(&api, &body, Some(&good)).await;
    assert_eq!(
        (s, o["ignored"].as_str()),
        (StatusCode::OK, Some("customer.created")),
        "{o}"
    );

    let changed = body.replacen("cus_1", "cus_2", 1);
    let stale = sdk.sign(&sdk.webhook_secret, &body, Some(now_millis() / 1000 - 301));
    let other = sdk.sign("whsec_another_endpoints_secret_0000", &body, None);
    let generic = seckill_shared::webhook::header(
        &[sdk.webhook_secret.as_bytes()],
        now_millis() / 1000,
        body.as_bytes(),
    );
    for (what, body, sig) in [
        ("one byte changed", changed.as_str(), Some(good.as_str())),
        ("an old timestamp", body.as_str(), Some(stale.as_str())),
        (
            "another endpoint's secret",
            body.as_str(),
            Some(other.as_str()),
        ),
        ("no signature", body.as_str(), None),
    ] {
        let (s, e) = deliver(&api, body, sig).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized")),
            "{what}: {e}"
        );
    }
    // The generic format's header is not Stripe's: the right secret under the wrong name.
    let res = api
        .http
        .post(format!("{}/payments/stripe", api.base()))
        .header("Seckill-Signature", generic)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // A PaymentIntent of something else the shop sells (no order in its metadata).
    let foreign = json!({"id": "pi_elsewhere", "object": "payment_intent", "amount": 500,
                         "currency": "eur", "status": "succeeded", "metadata": {"sku": "mug"}});
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.succeeded", &foreign).await;
    assert_eq!(s, StatusCode::OK, "{o}");
    assert!(
        o["ignored"]
            .as_str()
            .unwrap()
            .contains("not a seckill checkout"),
        "{o}"
    );
}

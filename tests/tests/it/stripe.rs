//! Stripe end to end, against the stack's localstripe, with Stripe's own SDK on the other
//! side (`seckill_tests::stripe`): checkout creates the order's one PaymentIntent, the
//! buyer's page confirms it with a test card, and the event Stripe would send (built from
//! the PaymentIntent as fetched, signed by the SDK's test helper) reaches
//! `POST /payments/stripe` over real HTTP.

use std::time::Duration;

use reqwest::StatusCode;
use seckill_shared::adapters::payments::refunds::RefundProgress;
use seckill_shared::adapters::payments::{NewPayment, Outcome, Payments};
use seckill_shared::adapters::stripe::StripeApi;
use seckill_shared::domain::now_millis;
use seckill_shared::refunds::{self, Issued, STRIPE};
use seckill_tests::api::{Api, id_of};
use seckill_tests::harness::Backends;
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

/// A PaymentIntent of `amount` EUR at the stack's Stripe, paid with 4242, recorded in
/// `db`'s ledger as a Stripe payment to refund (as a late payment is): its id.
async fn paid_and_due(
    db: &seckill_shared::adapters::data_api::DataApi,
    api: &StripeApi,
    sdk: &Sdk,
    key: &str,
    order: i64,
) -> String {
    let order_id = seckill_shared::domain::OrderId::new(order).unwrap();
    let intent = api
        .create_intent(
            key,
            order_id,
            1999,
            "EUR",
            &[("order_id", &order.to_string())],
        )
        .await
        .expect("localstripe creates the PaymentIntent");
    assert_eq!(sdk.confirm(&intent.id, CARD_OK)["status"], "succeeded");
    let row = Payments(db)
        .record(
            &NewPayment {
                provider: STRIPE,
                payment_id: &intent.id,
                order: Some(order_id),
                voucher: None,
                amount_minor: 1999,
                currency: "EUR",
                event_id: "evt_test",
                received_ms: now_millis(),
            },
            Outcome::RefundDue,
            Some("the order was cancelled before the payment"),
        )
        .await
        .unwrap();
    assert_eq!(row.outcome, Outcome::RefundDue);
    intent.id
}

/// Where the ledger has payment `p`'s refund.
async fn progress(db: &seckill_shared::adapters::data_api::DataApi, p: &str) -> RefundProgress {
    Payments(db).refund_progress(p).await.unwrap().unwrap()
}

/// Time passes for payment `p`'s refund: its claim or back-off is over.
async fn make_due(db: &seckill_shared::adapters::data_api::DataApi, p: &str) {
    db.execute(
        "UPDATE payments SET refund_next_at = NOW(3) - INTERVAL 1 SECOND WHERE payment_id = :p",
        vec![seckill_shared::adapters::data_api::param::string("p", p)],
        None,
    )
    .await
    .unwrap();
}

/// Refunds reach Stripe exactly once, however runs fail and overlap (a fresh database, the
/// stack's localstripe; Stripe's SDK counts the refunds): a run that died after Stripe
/// took the refund and before the ledger knew (the answer lost) is followed by one that
/// finds that refund and asks for none; four runs at once refund each payment once; a
/// run that died right after claiming holds the payment off the others until its claim
/// ends, then it is refunded once; Stripe unreachable is an error kept with the payment
/// and a later try, backing off, never a refund lost or made twice.
#[tokio::test]
async fn stripe_refunds_are_issued_once_through_crashes_races_and_outages() {
    let env = seckill_tests::StackEnv::load();
    let sdk = Sdk::new(&env);
    let key = env.get("STRIPE_SECRET_KEY");
    let api = StripeApi::new(&env.get("STRIPE_API_BASE"));
    let backends = Backends::start().await;
    let db = &backends.db;
    let base = i64::from(rand::random::<u32>()) * 16 + 1;
    let lost = paid_and_due(db, &api, &sdk, &key, base).await;
    let raced: Vec<String> =
        futures::future::join_all((1..4).map(|i| paid_and_due(db, &api, &sdk, &key, base + i)))
            .await;
    let crashed = paid_and_due(db, &api, &sdk, &key, base + 5).await;
    let outage = paid_and_due(db, &api, &sdk, &key, base + 6).await;
    let ledger = Payments(db);

    // 1. A run claimed `lost`, Stripe took its refund, and the run died before recording
    // it. Once the claim is over, the next try finds Stripe's refund and asks again for none.
    assert!(ledger.claim_refund(&lost, now_millis()).await.unwrap());
    assert_eq!(progress(db, &lost).await.attempts, 1);
    let taken = api.refund(&key, &lost).await.unwrap();
    assert_eq!(
        refunds::issue_one(db, &api, &key, &lost).await.unwrap(),
        Issued::NotDue
    );
    make_due(db, &lost).await;
    assert_eq!(
        refunds::issue_one(db, &api, &key, &lost).await.unwrap(),
        Issued::Found(taken.id.clone())
    );
    let p = progress(db, &lost).await;
    assert_eq!(
        (p.outcome, p.refund_id.as_deref()),
        (Some(Outcome::RefundRequested), Some(taken.id.as_str()))
    );
    assert_eq!(sdk.refunds(&lost).len(), 1);

    // 2. `crashed` is claimed by a run that dies at once: the others leave it alone.
    assert!(ledger.claim_refund(&crashed, now_millis()).await.unwrap());

    // 3. Four runs at once over what is due: the three raced payments refunded once each.
    let runs = futures::future::join_all(
        (0..4).map(|_| refunds::issue_due(db, &api, &key, Duration::from_secs(20))),
    )
    .await;
    let requested: u64 = runs.iter().map(|r| r.as_ref().unwrap().requested).sum();
    // `outage` too (it is due as well): four refunds in all, whoever made them.
    assert_eq!(requested, 4, "{runs:?}");
    for p in raced.iter().chain([&outage]) {
        assert_eq!(sdk.refunds(p).len(), 1, "{p}");
        assert_eq!(
            progress(db, p).await.outcome,
            Some(Outcome::RefundRequested)
        );
    }
    assert!(
        sdk.refunds(&crashed).is_empty(),
        "a claimed payment was refunded by another run"
    );

    // 4. The crashed run's claim ends; then one refund.
    make_due(db, &crashed).await;
    let run = refunds::issue_due(db, &api, &key, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(run.requested, 1, "{run:?}");
    assert_eq!(sdk.refunds(&crashed).len(), 1);

    // 5. Stripe unreachable: the try fails, the error is kept, the next try backs off.
    let again = paid_and_due(db, &api, &sdk, &key, base + 7).await;
    let down = StripeApi::new("http://127.0.0.1:9");
    let run = refunds::issue_due(db, &down, &key, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!((run.requested, run.failed), (0, 1), "{run:?}");
    let p = progress(db, &again).await;
    assert_eq!((p.outcome, p.attempts), (Some(Outcome::RefundDue), 1));
    assert!(
        p.error
            .as_deref()
            .unwrap_or_default()
            .contains("unavailable"),
        "{p:?}"
    );
    let run = refunds::issue_due(db, &api, &key, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(run.requested, 0, "tried again before its back-off: {run:?}");
    make_due(db, &again).await;
    let run = refunds::issue_due(db, &api, &key, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(run.requested, 1, "{run:?}");
    assert_eq!(sdk.refunds(&again).len(), 1);
    let p = progress(db, &again).await;
    assert_eq!(
        (p.outcome, p.attempts, p.error),
        (Some(Outcome::RefundRequested), 2, None)
    );

    // Every payment refunded exactly once.
    for p in [&lost, &crashed, &outage, &again].into_iter().chain(&raced) {
        assert_eq!(sdk.refunds(p).len(), 1, "{p}");
    }
    backends.cleanup().await;
}

/// Over HTTP with the stack's drainer: a buyer cancels, then their page pays the
/// PaymentIntent anyway; the payment is `refund_due`, the drainer's runs refund it at
/// Stripe once, and Stripe's `charge.refunded` (built from the charge as fetched, signed
/// by the SDK) records it `refunded`, the same when delivered again; a partial refund
/// changes nothing.
#[tokio::test]
async fn stripe_a_payment_after_a_cancel_is_refunded_at_stripe() {
    let api = Api::new();
    let sdk = Sdk::new(&api.env);
    let voucher = api
        .create_voucher(
            "stripe refund",
            1,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 1999, "currency": "EUR"}),
        )
        .await;
    let vid = id_of(&voucher);
    let (_, token, order) = admitted(&api, &vid, "dora").await;
    let pi = checkout(&api, &token, &order).await["payment_intent"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, c) = api
        .call(
            "POST",
            &format!("/orders/{order}/cancel"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(
        (s, c["status"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let paid = sdk.confirm(&pi, CARD_OK);
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.succeeded", &paid).await;
    assert_eq!(
        (s, o["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{o}"
    );

    // The drainer's runs (the stack's, every second, and these) refund it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refund = loop {
        api.drain().await;
        if let Some(r) = sdk.refunds(&pi).first() {
            break r.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refund of {pi} at Stripe"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(
        (refund["amount"].as_i64(), refund["currency"].as_str()),
        (Some(1999), Some("eur"))
    );
    for _ in 0..3 {
        api.drain().await;
    }
    assert_eq!(sdk.refunds(&pi).len(), 1, "refunded twice");

    // Stripe's charge.refunded: a part of it changes nothing, the whole records it.
    let charge = sdk.charge(refund["charge"].as_str().unwrap());
    let mut part = charge.clone();
    part["refunded"] = json!(false);
    part["amount_refunded"] = json!(500);
    let (s, o) = stripe_sends(&api, &sdk, "charge.refunded", &part).await;
    assert_eq!(s, StatusCode::OK);
    assert!(o["ignored"].as_str().unwrap().contains("in part"), "{o}");
    for _ in 0..2 {
        let (s, o) = stripe_sends(&api, &sdk, "charge.refunded", &charge).await;
        assert_eq!(
            (s, o["outcome"].as_str()),
            (StatusCode::OK, Some("refunded")),
            "{o}"
        );
        assert_eq!(o["payment_id"], pi.as_str());
    }
}

/// The refunds a run may issue are read through `payments_to_refund` on a table never
/// analysed: the rows examined stay about the Stripe payments to refund, however many
/// other payments the ledger holds.
#[tokio::test]
async fn stripe_the_refunds_to_issue_are_read_through_their_index_never_analysed() {
    use mysql_async::params;
    use mysql_async::prelude::Queryable;
    use seckill_shared::adapters::payments::refunds::to_issue_sql;
    use seckill_tests::drainer::DrainCtx;
    use seckill_tests::mysql::{PaymentRow, handler_reads, insert_payments};
    let ctx = DrainCtx::start().await;
    let mut conn = ctx.mysql().await;
    let outcomes = [
        "paid",
        "refund_due",
        "failed",
        "refused",
        "refund_requested",
        "refunded",
    ];
    let rows: Vec<PaymentRow> = (0..20_000u64)
        .map(|i| {
            (
                format!("pay_{i:06}"),
                1_000_000 + i,
                1 + i % 200,
                outcomes[((i / 7) % 6) as usize],
                0,
            )
        })
        .collect();
    insert_payments(&mut conn, &rows).await;
    // One in 500 is Stripe's.
    conn.query_drop("UPDATE payments SET provider = 'stripe' WHERE MOD(order_id, 500) = 0")
        .await
        .unwrap();
    let due = rows
        .iter()
        .filter(|r| r.1 % 500 == 0 && matches!(r.3, "refund_due" | "refused"))
        .count() as u64;
    assert!(due > 0);
    let overhead = {
        let a = handler_reads(&mut conn).await;
        let b = handler_reads(&mut conn).await;
        b - a
    };
    let before = handler_reads(&mut conn).await;
    let now = seckill_shared::adapters::data_api::format_datetime(now_millis());
    let got: Vec<mysql_async::Row> = conn
        .exec(
            to_issue_sql(),
            params! { "provider" => "stripe", "now" => now },
        )
        .await
        .unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(got.len() as u64, due);
    assert!(
        examined <= 2 * due + 10,
        "{due} refunds to issue examined {examined} rows"
    );
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

/// The stack's grace for payments started at Stripe (`SECKILL_PAYMENT_GRACE_S`).
fn grace_ms(api: &Api) -> i64 {
    api.env
        .get("SECKILL_PAYMENT_GRACE_S")
        .parse::<i64>()
        .unwrap()
        * 1000
}

/// Sleeps until unix ms `at`.
async fn until(at: i64) {
    let wait = at - now_millis();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// A payment in progress holds its unit: a card confirmed before the
/// deadline whose event Stripe delivers after it, within the grace the checkout gave,
/// pays the order, and the order shows the deadline it was given all along; a checkout
/// whose card was declined, left unpaid past the grace, expires (its unit sells again)
/// and a payment after that is refunded at Stripe, once; an order nobody checked out
/// gets no grace.
#[tokio::test]
async fn stripe_a_payment_confirmed_in_time_pays_though_its_event_comes_late() {
    let api = Api::new();
    let sdk = Sdk::new(&api.env);
    let grace = grace_ms(&api);
    let voucher = api
        .create_voucher(
            "stripe grace",
            4,
            -1_000,
            json!({"pay_within_s": 6, "price_minor": 1999, "currency": "EUR"}),
        )
        .await;
    let vid = id_of(&voucher);
    let (_, ann_t, ann) = admitted(&api, &vid, "ann").await;
    let (_, ben_t, ben) = admitted(&api, &vid, "ben").await;
    let (_, cara_t, cara) = admitted(&api, &vid, "cara").await;
    let (_, dee_t, dee) = admitted(&api, &vid, "dee").await;
    let ann_checkout = checkout(&api, &ann_t, &ann).await;
    let ben_checkout = checkout(&api, &ben_t, &ben).await;
    let dee_checkout = checkout(&api, &dee_t, &dee).await;
    let pay_by = |c: &Value| {
        seckill_shared::domain::parse_rfc3339_millis(c["pay_by"].as_str().unwrap(), "pay_by")
            .unwrap()
    };
    let deadline = pay_by(&ann_checkout);
    assert!(
        now_millis() < pay_by(&dee_checkout),
        "the checkouts came after the deadline: the machine is too slow for this test"
    );
    // Ann confirms in time; Stripe's event comes after her deadline, within the grace.
    let paid = sdk.confirm(ann_checkout["payment_intent"].as_str().unwrap(), CARD_OK);
    assert_eq!(paid["status"], "succeeded");
    until(deadline + 500).await;
    // A checkout again in the grace: the same payment, the same deadline shown.
    let again = checkout(&api, &ann_t, &ann).await;
    assert_eq!(again["payment_intent"], ann_checkout["payment_intent"]);
    assert_eq!(pay_by(&again), deadline, "{again}");
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.succeeded", &paid).await;
    assert!(
        now_millis() < deadline + grace,
        "the event came after the grace: the machine is too slow for this test"
    );
    assert_eq!(
        (s, o["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{o}"
    );
    assert_eq!(status_of(&api, &ann_t, &ann).await, "paid");
    // Cara never checked out: no grace, expired at her deadline.
    let (s, e) = api
        .call("POST", &format!("/orders/{cara}/pay"), Some(&cara_t), None)
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_expired")),
        "{e}"
    );

    // Dee's card is declined: recorded, her order stays open. Dee's and Ben's graces end
    // unpaid: both expired, their units on sale again.
    let dee_pi = dee_checkout["payment_intent"].as_str().unwrap();
    let declined = sdk.confirm(dee_pi, CARD_DECLINED);
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.payment_failed", &declined).await;
    assert_eq!(
        (s, o["outcome"].as_str()),
        (StatusCode::OK, Some("failed")),
        "{o}"
    );
    assert_ne!(status_of(&api, &dee_t, &dee).await, "expired");
    until(pay_by(&dee_checkout).max(pay_by(&ben_checkout)) + grace + 500).await;
    for (who, token, order) in [("Ben", &ben_t, &ben), ("Dee", &dee_t, &dee)] {
        let mut expired = false;
        for _ in 0..20 {
            api.drain().await;
            if status_of(&api, token, order).await == "expired" {
                expired = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(expired, "{who}'s order outlived its grace");
    }
    let (_, _, _dan) = admitted(&api, &vid, "dan").await;
    // His page pays now anyway: to refund, and refunded at Stripe once.
    let ben_pi = ben_checkout["payment_intent"].as_str().unwrap().to_string();
    let late = sdk.confirm(&ben_pi, CARD_OK);
    let (s, o) = stripe_sends(&api, &sdk, "payment_intent.succeeded", &late).await;
    assert_eq!(
        (s, o["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{o}"
    );
    let deadline_at = std::time::Instant::now() + Duration::from_secs(30);
    while sdk.refunds(&ben_pi).is_empty() {
        assert!(
            std::time::Instant::now() < deadline_at,
            "no refund of {ben_pi}"
        );
        api.drain().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    api.drain().await;
    assert_eq!(sdk.refunds(&ben_pi).len(), 1);
}

/// The operators' commands against the stack: `seckill pay --stripe` checks out as the
/// buyer, pays with the card and delivers Stripe's event (twice with --replay: paid
/// once; a declined card: `failed`); `seckill refund` refuses a payment it cannot refund
/// (unknown, or taken by the generic provider) and refunds a Stripe payment to refund
/// exactly once, whoever (it, or the stack's drainer) gets there first.
#[tokio::test]
async fn stripe_seckill_pay_and_seckill_refund() {
    use seckill_cli::ops::stripe::{LocalStripe, pay, refund};
    let api = Api::new();
    let sdk = Sdk::new(&api.env);
    let stack = seckill_cli::stack_env::StackEnv::load(None).unwrap();
    let local = LocalStripe::from_stack(&stack).unwrap();
    let jwt = api.env.dev_jwt_secret();
    let key = api.env.get("STRIPE_SECRET_KEY");
    let base = api.env.get("STRIPE_API_BASE");
    let b = seckill_cli::ops::Backends::from_env().await.unwrap();
    let voucher = api
        .create_voucher(
            "stripe cli",
            3,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 1999, "currency": "EUR"}),
        )
        .await;
    let vid = id_of(&voucher);
    let (_, x_t, x) = admitted(&api, &vid, "xavi").await;
    let done = pay(&b, &local, &jwt, x.parse().unwrap(), CARD_OK, false, true)
        .await
        .unwrap();
    assert_eq!(done.len(), 2);
    for d in &done {
        assert_eq!(
            (d.status, d.answer["outcome"].as_str()),
            (200, Some("paid")),
            "{d:?}"
        );
    }
    assert_eq!(status_of(&api, &x_t, &x).await, "paid");
    let (_, y_t, y) = admitted(&api, &vid, "yara").await;
    let done = pay(
        &b,
        &local,
        &jwt,
        y.parse().unwrap(),
        CARD_DECLINED,
        false,
        false,
    )
    .await
    .unwrap();
    assert_eq!(done[0].answer["outcome"], "failed", "{done:?}");

    let unknown = refund(&b, &base, &key, "pi_nobody_has").await.unwrap_err();
    assert!(unknown.to_string().contains("no payment"), "{unknown}");
    // A generic-format payment to refund (Yara's order cancelled, then paid that way).
    let (s, _) = api
        .call("POST", &format!("/orders/{y}/cancel"), Some(&y_t), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let secrets =
        seckill_shared::webhook::Secrets::parse(&api.env.get("SECKILL_PAYMENT_WEBHOOK_SECRET"))
            .unwrap();
    let generic_id = format!("pay_cli_{:08x}", rand::random::<u32>());
    let opts = seckill_cli::ops::pay::PayOptions {
        payment_id: Some(generic_id.clone()),
        ..Default::default()
    };
    let d = seckill_cli::ops::pay::pay(
        &b,
        &api.env.seckill_http_url(),
        &secrets,
        y.parse().unwrap(),
        &opts,
    )
    .await
    .unwrap();
    assert_eq!(d[0].answer["outcome"], "refund_due", "{d:?}");
    let generic = refund(&b, &base, &key, &generic_id).await.unwrap_err();
    assert!(generic.to_string().contains("generic"), "{generic}");
    // Zoe's PaymentIntent paid after her cancel: refunded once, by whoever comes first.
    let (_, z_t, z) = admitted(&api, &vid, "zoe").await;
    let checkout = local.checkout(&z, &z_t).await.unwrap();
    let pi = checkout["payment_intent"].as_str().unwrap().to_string();
    let (s, _) = api
        .call("POST", &format!("/orders/{z}/cancel"), Some(&z_t), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let paid = local.confirm(&pi, CARD_OK).await.unwrap();
    assert_eq!(paid["status"], "succeeded", "{paid}");
    let late = local
        .send_event("payment_intent.succeeded", &paid)
        .await
        .unwrap();
    assert_eq!(late.answer["outcome"], "refund_due", "{late:?}");
    let issued = refund(&b, &base, &key, &pi).await.unwrap();
    assert!(
        matches!(
            issued,
            Issued::Requested(_) | Issued::Found(_) | Issued::NotDue
        ),
        "{issued:?}"
    );
    for _ in 0..3 {
        api.drain().await;
    }
    assert_eq!(sdk.refunds(&pi).len(), 1);
    let p = progress(&b.db, &pi).await;
    assert_eq!(p.outcome, Some(Outcome::RefundRequested), "{p:?}");
}

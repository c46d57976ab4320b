//! seckill-http's handler called directly with API Gateway v2 fixture events and
//! `Context::default()`, against a private Redis and a fresh database behind a real
//! Data API server: every route, every error code, every way a token can be wrong, and an
//! admission whose reply from Redis is lost.

use std::time::{Duration, Instant};

use lambda_http::RequestExt;
use redis::AsyncCommands;
use seckill_http::App;
use seckill_shared::adapters::data_api::param;
use seckill_shared::auth::{mint_hs256, sign_hs256};
use seckill_shared::domain::{
    OrderId, SaleWindow, UserId, Voucher, VoucherId, format_rfc3339_millis, now_millis,
};
use seckill_shared::keys::VoucherKeys;
use seckill_tests::harness::{
    Backends, TEST_CURRENCY, TEST_JWT_SECRET, TEST_PRICE_MINOR, buy, call, create_voucher, request,
    token,
};
use seckill_tests::redis::ReplyDropper;
use serde_json::{Value, json};

fn iso(offset_ms: i64) -> String {
    format_rfc3339_millis(now_millis() + offset_ms)
}

fn voucher_body(stock: i64, begins_offset_ms: i64, ends_offset_ms: i64) -> String {
    json!({ "title": "Coffee for 1 cent", "stock": stock, "begins_at": iso(begins_offset_ms), "ends_at": iso(ends_offset_ms) })
        .to_string()
}

async fn create(app: &App, stock: i64, begins: i64, ends: i64) -> String {
    let admin = token("admin", true);
    let (status, body) = call(
        app,
        request(
            "POST",
            "/vouchers",
            Some(&admin),
            Some(&voucher_body(stock, begins, ends)),
            None,
        ),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id is a string").to_string()
}

fn assert_error(res: (u16, Value), status: u16, code: &str) {
    assert_eq!(res.0, status, "{}", res.1);
    assert_eq!(res.1["code"], code, "{}", res.1);
    assert!(
        res.1["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        res.1
    );
}

#[tokio::test]
async fn create_and_read_a_voucher() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let begins = iso(-1_000);
    let ends = iso(3_600_000);
    let body = json!({ "title": "  Coffee  ", "stock": 3, "begins_at": begins, "ends_at": ends })
        .to_string();
    let (status, created) = call(
        &app,
        request(
            "POST",
            "/vouchers",
            Some(&token("root", true)),
            Some(&body),
            None,
        ),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    assert!(id.parse::<i64>().unwrap() > 0);
    assert_eq!(created["title"], "Coffee");
    assert_eq!(created["stock"], 3);
    assert_eq!(created["stock_left"], 3);
    assert_eq!(created["begins_at"], begins);
    assert_eq!(created["ends_at"], ends);

    // Anyone may read it, no token needed; stock_left comes from Redis.
    buy(&app, id, "alice").await;
    let (status, got) = call(
        &app,
        request("GET", &format!("/vouchers/{id}"), None, None, None),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(got["id"], id);
    assert_eq!(got["stock_left"], 2);

    // The database has the row, with all its stock (the drainer decrements it later).
    let v = b.db.voucher(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!((v.stock, v.db_stock_left), (3, 3));

    // An integer written with a zero fraction is that integer (JSON Schema's `integer`).
    let body = json!({ "title": "t", "stock": 4.0, "begins_at": iso(0), "ends_at": iso(60_000), "buckets": 2.0 });
    let (status, created) = call(
        &app,
        request(
            "POST",
            "/vouchers",
            Some(&token("root", true)),
            Some(&body.to_string()),
            None,
        ),
    )
    .await;
    assert_eq!((status, &created["stock"]), (201, &json!(4)), "{created}");
    b.cleanup().await;
}

#[tokio::test]
async fn voucher_creation_refuses_bad_input_with_400() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let admin = token("root", true);
    let bad_bodies = [
        "not json".to_string(),
        "{}".to_string(),
        json!({ "title": "", "stock": 1, "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
        json!({ "title": "x".repeat(201), "stock": 1, "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
        json!({ "title": "t", "stock": 0, "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
        json!({ "title": "t", "stock": 10_000_001, "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
        json!({ "title": "t", "stock": "5", "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
        json!({ "title": "t", "stock": 1.5, "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
        json!({ "title": "t", "stock": 1, "begins_at": iso(60_000), "ends_at": iso(0) }).to_string(),
        json!({ "title": "t", "stock": 1, "begins_at": iso(-120_000), "ends_at": iso(-60_000) }).to_string(),
        json!({ "title": "t", "stock": 1, "begins_at": "tomorrow", "ends_at": iso(60_000) }).to_string(),
        format!("{{\"title\": \"{}\"}}", "x".repeat(20_000)),
        // Present optional fields hold a value: `null` is not "absent".
        json!({ "title": "t", "stock": 1, "begins_at": iso(0), "ends_at": iso(60_000), "buckets": null }).to_string(),
        json!({ "title": "t", "stock": 1, "begins_at": iso(0), "ends_at": iso(60_000), "pay_within_s": null }).to_string(),
        json!({ "title": "t", "stock": 1, "begins_at": iso(0), "ends_at": iso(60_000), "rebuy_after_close": null }).to_string(),
        json!({ "title": "t", "stock": 9.3e18, "begins_at": iso(0), "ends_at": iso(60_000) }).to_string(),
    ];
    for body in bad_bodies {
        let res = call(
            &app,
            request("POST", "/vouchers", Some(&admin), Some(&body), None),
        )
        .await;
        assert_error(res, 400, "invalid_request");
    }
    let rows =
        b.db.execute("SELECT COUNT(*) FROM vouchers", vec![], None)
            .await
            .unwrap();
    assert_eq!(
        format!("{:?}", rows.records()[0][0]),
        "LongValue(0)",
        "nothing was written"
    );
    b.cleanup().await;
}

#[tokio::test]
async fn every_way_a_token_can_be_wrong_is_401_or_403() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let body = voucher_body(1, 0, 60_000);
    let now = now_millis() / 1000;
    let expired = mint_hs256(
        TEST_JWT_SECRET.as_bytes(),
        "root",
        Some("seckill/admin"),
        now - 1,
    );
    let wrong_key = mint_hs256(b"another-secret", "root", Some("seckill/admin"), now + 60);
    let no_exp = sign_hs256(
        TEST_JWT_SECRET.as_bytes(),
        &json!({ "sub": "root", "scope": "seckill/admin" }),
    );
    // A sub the database's unique key would confuse with another buyer's ("root" and
    // "root "), or with control characters.
    let padded = mint_hs256(
        TEST_JWT_SECRET.as_bytes(),
        "root ",
        Some("seckill/admin"),
        now + 60,
    );
    let control = mint_hs256(
        TEST_JWT_SECRET.as_bytes(),
        "ro\u{7}ot",
        Some("seckill/admin"),
        now + 60,
    );
    for t in [
        expired.as_str(),
        wrong_key.as_str(),
        no_exp.as_str(),
        padded.as_str(),
        control.as_str(),
        "garbage",
        "",
    ] {
        let res = call(
            &app,
            request("POST", "/vouchers", Some(t), Some(&body), None),
        )
        .await;
        assert_error(res, 401, "unauthorized");
    }
    assert_error(
        call(&app, request("POST", "/vouchers", None, Some(&body), None)).await,
        401,
        "unauthorized",
    );
    // A valid user token without the admin scope.
    let user = token("bob", false);
    assert_error(
        call(
            &app,
            request("POST", "/vouchers", Some(&user), Some(&body), None),
        )
        .await,
        403,
        "forbidden",
    );
    // The buyer routes need a token too.
    assert_error(
        call(
            &app,
            request("POST", "/vouchers/1/seckill", None, None, None),
        )
        .await,
        401,
        "unauthorized",
    );
    assert_error(
        call(&app, request("GET", "/orders/1", None, None, None)).await,
        401,
        "unauthorized",
    );
    assert_error(
        call(
            &app,
            request("POST", "/vouchers/1/seckill", Some(&expired), None, None),
        )
        .await,
        401,
        "unauthorized",
    );
    // The token comes before the path: a protected route with a malformed id is 401
    // without a valid token (as behind API Gateway, whose authorizer answers first), with
    // a dev secret configured and with neither a secret nor an authorizer.
    let mut bare = b.http_config();
    bare.dev_jwt_secret = None;
    let bare = App::new(&bare).await;
    for app in [&app, &bare] {
        for (method, path) in [
            ("POST", "/vouchers/abc/seckill"),
            ("GET", "/orders/-1"),
            ("GET", "/vouchers/0/order"),
            ("POST", "/orders/1.5/pay"),
            ("POST", "/orders/99999999999999999999/cancel"),
        ] {
            for t in [None, Some(expired.as_str())] {
                let res = call(app, request(method, path, t, None, None)).await;
                assert_error(res, 401, "unauthorized");
            }
        }
        // The one public route still answers a malformed id with 400.
        assert_error(
            call(app, request("GET", "/vouchers/abc", None, None, None)).await,
            400,
            "invalid_request",
        );
    }
    b.cleanup().await;
}

#[tokio::test]
async fn identity_comes_from_authorizer_claims_and_never_from_the_body() {
    let b = Backends::start().await;
    // As in AWS: no dev secret; API Gateway's authorizer has verified the token.
    let mut cfg = b.http_config();
    cfg.dev_jwt_secret = None;
    let app = App::new(&cfg).await;
    let admin = json!({ "sub": "ops", "scope": "openid seckill/admin" });
    let (status, v) = call(
        &app,
        request(
            "POST",
            "/vouchers",
            None,
            Some(&voucher_body(5, -1_000, 60_000)),
            Some(admin),
        ),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap();
    // A body naming another user changes nothing: the buyer is the claims' sub.
    let sneaky = json!({ "user_id": "mallory", "sub": "mallory" }).to_string();
    let (status, order) = call(
        &app,
        request(
            "POST",
            &format!("/vouchers/{id}/seckill"),
            None,
            Some(&sneaky),
            Some(json!({ "sub": "carol" })),
        ),
    )
    .await;
    assert_eq!(status, 202, "{order}");
    let vid: VoucherId = id.parse().unwrap();
    let carol = seckill_shared::domain::UserId::parse("carol").unwrap();
    let mallory = seckill_shared::domain::UserId::parse("mallory").unwrap();
    assert!(b.sales.order_of_buyer(vid, &carol).await.unwrap().is_some());
    assert!(
        b.sales
            .order_of_buyer(vid, &mallory)
            .await
            .unwrap()
            .is_none()
    );
    // A bearer token is not enough without the dev secret: only verified claims count.
    let forged = mint_hs256(b"anything", "mallory", None, now_millis() / 1000 + 60);
    assert_error(
        call(
            &app,
            request(
                "POST",
                &format!("/vouchers/{id}/seckill"),
                Some(&forged),
                None,
                None,
            ),
        )
        .await,
        401,
        "unauthorized",
    );
    // Claims without the admin scope cannot create vouchers.
    assert_error(
        call(
            &app,
            request(
                "POST",
                "/vouchers",
                None,
                Some(&voucher_body(5, 0, 60_000)),
                Some(json!({ "sub": "carol" })),
            ),
        )
        .await,
        403,
        "forbidden",
    );
    b.cleanup().await;
}

#[tokio::test]
async fn a_sale_from_admission_to_sold_out() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let id = create(&app, 2, -1_000, 3_600_000).await;

    let (status, first) = buy(&app, &id, "alice").await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["status"], "pending");
    let order_id = first["order_id"].as_str().unwrap();
    assert!(order_id.parse::<i64>().unwrap() > 0);

    // Again: 409, naming the order alice holds.
    let again = buy(&app, &id, "alice").await;
    assert_eq!(again.1["order_id"], order_id, "{}", again.1);
    assert_error(again, 409, "already_purchased");
    assert_eq!(buy(&app, &id, "bob").await.0, 202);
    assert_error(buy(&app, &id, "carol").await, 409, "sold_out");
    // A second instance, which has not seen the sale, hears sold_out from Redis, and
    // alice, once sold out, still hears which order she holds.
    let other = App::new(&b.http_config()).await;
    let again = buy(&other, &id, "alice").await;
    assert_eq!(again.1["order_id"], order_id, "{}", again.1);
    assert_error(again, 409, "already_purchased");
    assert_error(buy(&other, &id, "dave").await, 409, "sold_out");

    // Once this instance has seen sold out, it answers without Redis: take Redis away
    // (rename the sale) and the answer is still sold_out, not unavailable or not_found.
    let k = VoucherKeys::new(id.parse::<VoucherId>().unwrap());
    let _: () = b
        .sales
        .conn()
        .rename(&k.sale, format!("{}:hidden", k.sale))
        .await
        .unwrap();
    assert_error(buy(&app, &id, "erin").await, 409, "sold_out");
    b.cleanup().await;
}

/// A warm instance admits with one Redis call per purchase: once the admission script
/// answered for a sale, the voucher is known to exist, so no lookup precedes the script
/// (an admission's reply carries no window to remember it by).
#[tokio::test]
async fn a_warm_instance_admits_with_one_redis_call() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let id = create(&app, 100, -1_000, 3_600_000).await;
    // Another instance, which learns of the sale only from its first admission.
    let warm = App::new(&b.http_config()).await;
    assert_eq!(buy(&warm, &id, "u0").await.0, 202);
    let nodes = b.redis.nodes();
    for n in &nodes {
        let _: () = b
            .redis
            .query(n.port, redis::cmd("CONFIG").arg("RESETSTAT"))
            .unwrap();
    }
    for i in 1..=20 {
        assert_eq!(buy(&warm, &id, &format!("u{i}")).await.0, 202);
    }
    let stats = b.redis.commandstats();
    let calls = |name: &str| stats.get(name).map_or(0, |s| s.calls);
    // The order ids come from the block leased on the first purchase.
    assert_eq!(calls("evalsha"), 20, "one admission script per purchase");
    assert_eq!(calls("hget") + calls("hgetall"), 0, "no sale lookup");
    b.cleanup().await;
}

/// Backends, a [`ReplyDropper`] in front of their Redis, an app that reaches Redis only
/// through it (with `timeout` as its reply timeout, if given), and an open sale of 5
/// whose first purchase has loaded the admission script, so the next EVALSHA runs it.
async fn behind_a_reply_dropper(
    timeout: Option<Duration>,
) -> (Backends, ReplyDropper, App, String) {
    let b = Backends::start().await;
    let proxy = ReplyDropper::start(&b.redis).await;
    let mut cfg = b.http_config();
    cfg.redis.url = proxy.url();
    if let Some(timeout) = timeout {
        cfg.redis.timeout = timeout;
    }
    let app = App::new(&cfg).await;
    let id = create(&app, 5, -1_000, 3_600_000).await;
    assert_eq!(buy(&app, &id, "warmup").await.0, 202);
    (b, proxy, app, id)
}

/// The admission script runs but its reply is lost (the connection is cut right after
/// Redis answered, as by a reset or a failover): the cluster client sends the same
/// EVALSHA again, the script finds the buyer holding this very attempt's order id, and
/// the answer is that attempt's 202, not a 409. A later purchase is 409 naming it.
#[tokio::test]
async fn an_admission_whose_reply_is_lost_is_still_admitted() {
    let (b, proxy, app, id) = behind_a_reply_dropper(None).await;

    proxy.arm(&[b"EVALSHA", b":buyers"]);
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(proxy.dropped(), 1, "the admission's reply was lost");
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending");
    let order_id: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();

    // Admitted once: alice holds that order, one unit and one stream entry taken.
    let voucher: VoucherId = id.parse().unwrap();
    assert_eq!(
        b.sales
            .order_of_buyer(voucher, &UserId::parse("alice").unwrap())
            .await
            .unwrap(),
        Some(order_id)
    );
    assert_eq!(b.sales.stock_left(voucher).await.unwrap(), Some(3));
    let queued: usize = b
        .sales
        .conn()
        .xlen(VoucherKeys::new(voucher).orders)
        .await
        .unwrap();
    assert_eq!(queued, 2);

    let again = buy(&app, &id, "alice").await;
    assert_eq!(again.1["order_id"], order_id.to_string(), "{}", again.1);
    assert_error(again, 409, "already_purchased");
    b.cleanup().await;
}

/// The admission script runs but no reply ever comes (its connection goes silent), not
/// even to the request sent again on a new client: the answer is `503 unavailable`
/// naming the attempt's order id, because it may exist, and here it does. Once Redis
/// answers again, a retry names the same order.
#[tokio::test]
async fn an_admission_that_gets_no_reply_names_its_order_in_the_503() {
    let (b, proxy, app, id) = behind_a_reply_dropper(Some(Duration::from_millis(300))).await;

    proxy.mute(&[b"EVALSHA", b":buyers"], 2);
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(
        proxy.muted(),
        2,
        "the admission and its resend got no reply"
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "unavailable", "{body}");
    let named: OrderId = body["order_id"]
        .as_str()
        .expect("the 503 names the order")
        .parse()
        .unwrap();
    let voucher: VoucherId = id.parse().unwrap();
    assert_eq!(
        b.sales
            .order_of_buyer(voucher, &UserId::parse("alice").unwrap())
            .await
            .unwrap(),
        Some(named),
        "the named order is alice's"
    );

    // The client was just replaced; once it may be again, a retry gets through.
    tokio::time::sleep(seckill_shared::adapters::redis::REPLACE_AT_MOST_EVERY).await;
    let again = buy(&app, &id, "alice").await;
    assert_eq!(again.1["order_id"], named.to_string(), "{}", again.1);
    assert_error(again, 409, "already_purchased");
    b.cleanup().await;
}

/// A voucher on sale now for an hour with more fields of the request body (a payment
/// step), created through `POST /vouchers`.
async fn create_with(app: &App, stock: i64, more: Value) -> String {
    let mut body: Value = serde_json::from_str(&voucher_body(stock, -1_000, 3_600_000)).unwrap();
    for (k, v) in more.as_object().unwrap() {
        body[k] = v.clone();
    }
    let created = create_voucher(app, &body).await;
    created["id"].as_str().unwrap().to_string()
}

/// `POST /orders/{order}/cancel` as `user`: the order's status after it.
async fn cancel(app: &App, order: &str, user: &str) -> String {
    let (status, body) = call(
        app,
        request(
            "POST",
            &format!("/orders/{order}/cancel"),
            Some(&token(user, false)),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["status"].as_str().unwrap().to_string()
}

/// The voucher's stock in Redis, the order its buyer `user` holds there, and how many
/// entries its orders stream has.
async fn redis_sale(b: &Backends, id: &str, user: &str) -> (Option<i64>, Option<OrderId>, usize) {
    let voucher: VoucherId = id.parse().unwrap();
    let stock = b.sales.stock_left(voucher).await.unwrap();
    let held = b
        .sales
        .order_of_buyer(voucher, &UserId::parse(user).unwrap())
        .await
        .unwrap();
    let entries: usize = b
        .sales
        .conn()
        .xlen(VoucherKeys::new(voucher).orders)
        .await
        .unwrap();
    (stock, held, entries)
}

/// The first copy of an admission is held in the network until its resend was
/// answered `sold_out`; a cancel then brings a unit back, and only then does the first
/// copy reach Redis. It must write nothing: the buyer was told sold out.
#[tokio::test]
async fn a_late_first_copy_never_admits_an_attempt_its_resend_refused() {
    let (b, proxy, app, _) = behind_a_reply_dropper(Some(Duration::from_millis(300))).await;
    let id = create_with(
        &app,
        1,
        json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    // Sold out by another instance: this one has not learned it, so asks Redis.
    let mut cfg = b.http_config();
    cfg.redis.url = proxy.url();
    let other = App::new(&cfg).await;
    let (status, body) = buy(&other, &id, "first").await;
    assert_eq!(status, 202, "{body}");
    let first = body["order_id"].as_str().unwrap().to_string();

    proxy.hold(&[b"EVALSHA", b":buyers", b"alice"]);
    let answer = buy(&app, &id, "alice").await;
    assert_eq!(proxy.held(), 1, "the first copy was held");
    assert_error(answer, 409, "sold_out");
    assert_eq!(cancel(&app, &first, "first").await, "cancelled");
    assert_eq!(redis_sale(&b, &id, "alice").await, (Some(1), None, 1));

    proxy.release().await;
    assert_eq!(
        redis_sale(&b, &id, "alice").await,
        (Some(1), None, 1),
        "the late first copy wrote nothing"
    );
    b.cleanup().await;
}

/// The first copy is held until its resend admitted the order and the buyer cancelled
/// it (a voucher that lets a buyer buy again): the late first copy must not admit that
/// cancelled order again (no second stream entry, no unit taken), and the buyer's next
/// purchase is a new order.
#[tokio::test]
async fn a_late_first_copy_never_admits_again_an_order_cancelled_since() {
    let (b, proxy, app, _) = behind_a_reply_dropper(Some(Duration::from_millis(300))).await;
    let id = create_with(
        &app,
        2,
        json!({ "pay_within_s": 600, "rebuy_after_close": true, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    proxy.hold(&[b"EVALSHA", b":buyers", b"alice"]);
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(proxy.held(), 1, "the first copy was held");
    assert_eq!(status, 202, "the resend admitted: {body}");
    let order = body["order_id"].as_str().unwrap().to_string();
    assert_eq!(cancel(&app, &order, "alice").await, "cancelled");
    assert_eq!(redis_sale(&b, &id, "alice").await, (Some(2), None, 1));

    proxy.release().await;
    assert_eq!(
        redis_sale(&b, &id, "alice").await,
        (Some(2), None, 1),
        "the late first copy wrote nothing"
    );
    // The client was replaced for the held copy; once it may be again, a retry goes on.
    tokio::time::sleep(seckill_shared::adapters::redis::REPLACE_AT_MOST_EVERY).await;
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(status, 202, "{body}");
    assert_ne!(body["order_id"], order.as_str(), "a new order");
    b.cleanup().await;
}

/// The first copy admits but its answer never comes (its connection goes silent), and
/// the resend is held in the network; meanwhile the buyer, told a 503 naming the order,
/// looks it up and cancels it (another instance). When the resend arrives at last it
/// must not admit the closed order again: with a voucher that lets buyers buy again the
/// buyer is no longer in the buyers hash, and the resend would take a second unit for an
/// order already cancelled (lost for the sale, and the buyer held to a closed order).
#[tokio::test]
async fn a_late_resend_never_admits_again_an_order_cancelled_since() {
    let (b, proxy, app, _) = behind_a_reply_dropper(Some(Duration::from_millis(300))).await;
    let id = create_with(
        &app,
        2,
        json!({ "pay_within_s": 600, "rebuy_after_close": true, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    proxy.mute(&[b"EVALSHA", b":buyers", b"alice"], 1);
    proxy.hold(&[b"EVALSHA", b":buyers", b"alice", b"again"]);
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!((proxy.muted(), proxy.held()), (1, 1), "{body}");
    assert_eq!(status, 503, "no answer from either copy: {body}");
    let order = body["order_id"]
        .as_str()
        .expect("the 503 names the order")
        .to_string();
    assert_eq!(
        redis_sale(&b, &id, "alice").await,
        (Some(1), order.parse().ok(), 1),
        "the first copy admitted"
    );
    let other = App::new(&b.http_config()).await;
    assert_eq!(cancel(&other, &order, "alice").await, "cancelled");
    assert_eq!(redis_sale(&b, &id, "alice").await, (Some(2), None, 1));

    proxy.release().await;
    assert_eq!(
        redis_sale(&b, &id, "alice").await,
        (Some(2), None, 1),
        "the late resend wrote nothing"
    );
    let (status, body) = buy(&other, &id, "alice").await;
    assert_eq!(status, 202, "free to buy again: {body}");
    assert_ne!(body["order_id"], order.as_str(), "a new order");
    b.cleanup().await;
}

/// The first copy is held (no reply in time) and its resend fails with an error reply:
/// the answer is a 503 naming the attempt's order, because the held copy may still
/// run. Here it does, and the named order is the buyer's.
#[tokio::test]
async fn a_resend_that_fails_answers_503_naming_the_order() {
    let (b, proxy, app, id) = behind_a_reply_dropper(Some(Duration::from_millis(300))).await;
    proxy.hold(&[b"EVALSHA", b":buyers", b"alice"]);
    proxy.fail(&[b"EVALSHA", b":buyers", b"alice"], 1);
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(proxy.held(), 1, "the first copy was held");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "unavailable", "{body}");
    let named: OrderId = body["order_id"]
        .as_str()
        .unwrap_or_else(|| panic!("the 503 names the order: {body}"))
        .parse()
        .unwrap();
    assert_eq!(redis_sale(&b, &id, "alice").await.1, None);
    proxy.release().await;
    assert_eq!(
        redis_sale(&b, &id, "alice").await.1,
        Some(named),
        "the held copy ran late and admitted the order the 503 named"
    );
    b.cleanup().await;
}

/// The first copy is held (no reply in time) and its resend finds the slot split
/// between two nodes for longer than the client library's own retries last (`TRYAGAIN`
/// twenty times: the library sends at most fifteen copies of a request, within the
/// 2 s timeout here). The resend is sent again, still marked, until it gets through:
/// the buyer gets a 202, not a 503, and the held copy, arriving last, writes nothing.
#[tokio::test]
async fn a_resend_that_finds_its_slot_split_is_sent_again_until_it_gets_through() {
    let (b, proxy, app, id) = behind_a_reply_dropper(None).await;
    proxy.hold(&[b"EVALSHA", b":buyers", b"alice"]);
    proxy.fail_with(
        &[b"EVALSHA", b":buyers", b"alice"],
        20,
        b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
    );
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(proxy.held(), 1, "the first copy was held");
    assert_eq!(status, 202, "{body}");
    let order: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();
    let (stock, held, entries) = redis_sale(&b, &id, "alice").await;
    assert_eq!((stock, held, entries), (Some(3), Some(order), 2));
    proxy.release().await;
    assert_eq!(
        redis_sale(&b, &id, "alice").await,
        (Some(3), Some(order), 2),
        "the held copy wrote nothing"
    );
    b.cleanup().await;
}

/// Durable admissions: the script runs and the connection is cut before its reply,
/// while the only replica receives nothing more (its replication link, which goes
/// through the proxies too, is muted). The client sends the pipeline (script and
/// `WAIT`) again on a new connection; that copy finds the order already admitted. The
/// `WAIT` must still count the replicas holding the order, whichever connection wrote
/// it: no durable 202, a 503 naming the order. The copy writes a mark that the `WAIT`
/// covers (lua/admit.lua). Without it, Valkey 9.1 (the cluster pass) answered the new
/// connection's `WAIT` at once with the muted replica counted: a durable 202 nobody
/// held. (Redis 7.0's `WAIT` on a new connection waits for the primary's whole offset.)
#[tokio::test]
async fn a_durable_admission_resent_by_the_client_waits_for_the_replicas() {
    let b = Backends::start_with(seckill_tests::redis::RedisServer::cluster(1, 1)).await;
    let proxy = ReplyDropper::start(&b.redis).await;
    let mut cfg = b.http_config();
    cfg.redis.url = proxy.url();
    cfg.redis.durable = Some(seckill_shared::config::Durable {
        replicas: 1,
        timeout: Duration::from_millis(300),
    });
    let app = App::new(&cfg).await;
    let id = create(&app, 5, -1_000, 3_600_000).await;
    // The replica follows its primary's announced (proxy) address.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = buy(&app, &id, "warmup").await;
        if status == 202 || body["code"] == "already_purchased" {
            break;
        }
        assert!(Instant::now() < deadline, "no durable 202: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The replica acknowledges what it has every second: its link is muted from then on.
    proxy.mute(&[b"REPLCONF", b"ACK"], 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.muted() == 0 {
        assert!(
            Instant::now() < deadline,
            "the replication link was not muted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.arm(&[b"EVALSHA", b":buyers", b"alice"]);
    let (status, body) = buy(&app, &id, "alice").await;
    assert_eq!(proxy.dropped(), 1, "the admission's reply was lost");
    assert_eq!(status, 503, "no replica holds it: {body}");
    let named: OrderId = body["order_id"]
        .as_str()
        .unwrap_or_else(|| panic!("the 503 names the order: {body}"))
        .parse()
        .unwrap();
    assert_eq!(redis_sale(&b, &id, "alice").await.1, Some(named));
    b.cleanup().await;
}

#[tokio::test]
async fn not_started_and_ended_sales_are_refused() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let future = create(&app, 5, 3_600_000, 7_200_000).await;
    assert_error(buy(&app, &future, "alice").await, 409, "not_started");
    // The window is now cached: a second attempt needs no Redis.
    assert_error(buy(&app, &future, "alice").await, 409, "not_started");

    // An ended sale: preload one whose window has passed straight into Redis.
    let now = now_millis();
    let past = Voucher {
        id: VoucherId::new(987_654_321).unwrap(),
        title: "old".into(),
        stock: 5,
        db_stock_left: 5,
        window: SaleWindow::new(now - 7_200_000, now - 3_600_000).unwrap(),
        payment: None,
        buckets: 1,
        room: None,
    };
    b.sales.preload(&past).await.unwrap();
    assert_error(buy(&app, "987654321", "alice").await, 409, "ended");
    b.cleanup().await;
}

#[tokio::test]
async fn unknown_vouchers_orders_and_routes_are_404_and_bad_ids_400() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let user = token("alice", false);
    assert_error(
        call(&app, request("GET", "/vouchers/424242", None, None, None)).await,
        404,
        "not_found",
    );
    assert_error(buy(&app, "424243", "alice").await, 404, "not_found");
    // Made-up voucher ids lease no order ids: the lease clock was never written.
    for id in 500_000..500_020 {
        assert_error(buy(&app, &id.to_string(), "alice").await, 404, "not_found");
    }
    let clock: bool = redis::AsyncCommands::exists(
        &mut b.sales.conn(),
        seckill_shared::keys::IdKeys::for_day("20260101").clock,
    )
    .await
    .unwrap();
    assert!(
        !clock,
        "an order id was leased for a voucher that does not exist"
    );
    assert_error(
        call(
            &app,
            request("GET", "/orders/424242", Some(&user), None, None),
        )
        .await,
        404,
        "not_found",
    );
    for path in ["/", "/nope", "/vouchers/1/refund", "/orders"] {
        assert_error(
            call(&app, request("GET", path, Some(&user), None, None)).await,
            404,
            "not_found",
        );
    }
    // A declared path asked with another method: 405 naming the one it takes.
    for (method, path, allow) in [
        ("DELETE", "/vouchers/1", "GET"),
        ("TRACE", "/vouchers", "POST"),
        ("GET", "/payments/webhook", "POST"),
        ("PUT", "/orders/7/pay/", "POST"),
    ] {
        let req = request(method, path, Some(&user), None, None);
        let res = seckill_http::handle(&app, req).await;
        assert_eq!(res.headers()["allow"], allow, "{method} {path}");
        let (status, body) = seckill_tests::harness::read(res);
        seckill_tests::contract::contract().assert(None, status, &body);
        assert_error((status, body), 405, "method_not_allowed");
    }
    for bad in ["abc", "0", "-1", "1.5", "99999999999999999999", "%20"] {
        assert_error(
            call(
                &app,
                request("GET", &format!("/vouchers/{bad}"), None, None, None),
            )
            .await,
            400,
            "invalid_request",
        );
        assert_error(buy(&app, bad, "alice").await, 400, "invalid_request");
        assert_error(
            call(
                &app,
                request("GET", &format!("/orders/{bad}"), Some(&user), None, None),
            )
            .await,
            400,
            "invalid_request",
        );
    }
    b.cleanup().await;
}

/// Behind API Gateway the function answers the route API Gateway matched (and checked the
/// authorizer and scopes of), named by `routeKey` with its `pathParameters`, never a route
/// read from the raw path; `$default` (cargo lambda watch, a Function URL) falls back to
/// the path.
#[tokio::test]
async fn requests_are_dispatched_on_api_gateways_route_key_not_the_raw_path() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let voucher = create(&app, 5, -1_000, 60_000).await;
    let event = |method: &str, raw_path: &str, route_key: &str, params: Value| {
        let mut e = seckill_tests::harness::fixture_event();
        e["rawPath"] = json!(raw_path);
        e["requestContext"]["http"]["method"] = json!(method);
        e["requestContext"]["http"]["path"] = json!(raw_path);
        e["routeKey"] = json!(route_key);
        e["requestContext"]["routeKey"] = json!(route_key);
        e["pathParameters"] = params;
        e["headers"]["authorization"] = json!(format!("Bearer {}", token("alice", false)));
        lambda_http::request::from_str(&e.to_string())
            .expect("an API Gateway v2 event")
            .with_lambda_context(lambda_http::Context::default())
    };
    // The raw path says "buy"; API Gateway matched "read the voucher": a read it is, and
    // nothing was bought.
    let raw = format!("/vouchers/{voucher}/seckill");
    let (status, body) = call(
        &app,
        event("POST", &raw, "GET /vouchers/{id}", json!({ "id": voucher })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], voucher.as_str(), "{body}");
    assert_eq!(body["stock_left"], 5, "nothing was admitted: {body}");
    // The parameter comes from pathParameters, not from the path.
    let (status, body) = call(
        &app,
        event(
            "GET",
            "/vouchers/1",
            "GET /vouchers/{id}",
            json!({ "id": voucher }),
        ),
    )
    .await;
    assert_eq!(
        (status, body["id"].as_str()),
        (200, Some(voucher.as_str())),
        "{body}"
    );
    // A route key the function does not declare, or one without its parameter, is 404.
    for (key, params) in [
        ("ANY /{proxy+}", json!({ "proxy": "vouchers" })),
        ("GET /vouchers/{id}", Value::Null),
        ("POST /vouchers/{id}/refund", json!({ "id": voucher })),
    ] {
        assert_error(
            call(
                &app,
                event("GET", &format!("/vouchers/{voucher}"), key, params),
            )
            .await,
            404,
            "not_found",
        );
    }
    // $default: the method and path decide (as under cargo lambda watch).
    let (status, body) = call(&app, event("POST", &raw, "$default", Value::Null)).await;
    assert_eq!(status, 202, "{body}");
    b.cleanup().await;
}

#[tokio::test]
async fn order_status_is_pending_then_what_the_database_says_and_only_for_the_buyer() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let id = create(&app, 5, -1_000, 3_600_000).await;
    let (_, admitted) = buy(&app, &id, "alice").await;
    let order_id = admitted["order_id"].as_str().unwrap().to_string();
    let path = format!("/orders/{order_id}");

    let (status, pending) = call(
        &app,
        request("GET", &path, Some(&token("alice", false)), None, None),
    )
    .await;
    assert_eq!(status, 200, "{pending}");
    assert_eq!(
        pending,
        json!({ "order_id": order_id, "voucher_id": id, "status": "pending" })
    );
    // Another user's order does not exist for them.
    assert_error(
        call(
            &app,
            request("GET", &path, Some(&token("bob", false)), None, None),
        )
        .await,
        404,
        "not_found",
    );

    // What the drainer would write.
    b.db.execute(
        "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES (:id, :v, 'alice', 'confirmed', NOW(3))",
        vec![param::long("id", order_id.parse().unwrap()), param::long("v", id.parse().unwrap())],
        None,
    )
    .await
    .unwrap();
    let (_, confirmed) = call(
        &app,
        request("GET", &path, Some(&token("alice", false)), None, None),
    )
    .await;
    assert_eq!(confirmed["status"], "confirmed");
    assert_error(
        call(
            &app,
            request("GET", &path, Some(&token("bob", false)), None, None),
        )
        .await,
        404,
        "not_found",
    );

    let (_, second) = buy(&app, &id, "bob").await;
    let bob_order: OrderId = second["order_id"].as_str().unwrap().parse().unwrap();
    b.db.execute(
        "INSERT INTO orders (id, voucher_id, user_id, status, reason, admitted_at) VALUES (:id, :v, 'bob', 'rejected', 'db_stock_exhausted', NOW(3))",
        vec![param::long("id", bob_order.get()), param::long("v", id.parse().unwrap())],
        None,
    )
    .await
    .unwrap();
    let (_, rejected) = call(
        &app,
        request(
            "GET",
            &format!("/orders/{bob_order}"),
            Some(&token("bob", false)),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(rejected["status"], "rejected");
    b.cleanup().await;
}

#[tokio::test]
async fn a_voucher_missing_in_redis_is_repaired_from_the_database() {
    let b = Backends::start().await;
    // Created in the database only, as if Redis had been down at creation.
    let now = now_millis();
    let new = seckill_shared::domain::NewVoucher {
        title: "repair me".into(),
        stock: 4,
        window: SaleWindow::new(now - 1_000, now + 3_600_000).unwrap(),
        payment: None,
        buckets: 1,
        room: None,
    };
    let v = b.db.create_voucher(&new).await.unwrap();
    let app = App::new(&b.http_config()).await;
    let (status, res) = buy(&app, &v.id.to_string(), "alice").await;
    assert_eq!(status, 202, "{res}");
    assert_eq!(b.sales.stock_left(v.id).await.unwrap(), Some(3));
    let active: bool = b
        .sales
        .conn()
        .sismember("seckill:active", v.id.get())
        .await
        .unwrap();
    assert!(active, "the drainer will find it");

    // Same through GET /vouchers/{id} on another voucher.
    let w = b.db.create_voucher(&new).await.unwrap();
    let (status, got) = call(
        &app,
        request("GET", &format!("/vouchers/{}", w.id), None, None, None),
    )
    .await;
    assert_eq!((status, got["stock_left"].clone()), (200, json!(4)));
    assert_eq!(b.sales.stock_left(w.id).await.unwrap(), Some(4));
    b.cleanup().await;
}

#[tokio::test]
async fn one_user_hammering_one_instance_is_rate_limited() {
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.user_rate_per_sec = 1;
    cfg.user_rate_burst = 3;
    let app = App::new(&cfg).await;
    let id = create(&app, 10, -1_000, 3_600_000).await;
    let codes: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(buy(&app, &id, "bot").await.0);
        }
        v
    };
    assert_eq!(codes[0], 202);
    assert!(codes[1..3].iter().all(|c| *c == 409), "{codes:?}");
    assert_error(buy(&app, &id, "bot").await, 429, "rate_limited");
    // Other users are not affected.
    assert_eq!(buy(&app, &id, "human").await.0, 202);
    b.cleanup().await;
}

/// `GET /vouchers/{id}` needs no token, so its callers are counted by source address
/// (an IPv6 /64): past the burst a source gets 429 before anything is looked up, even
/// for made-up ids (which would otherwise each cost a database read); other sources are
/// not affected, and the limit refills.
#[tokio::test]
async fn anonymous_reads_are_rate_limited_per_source_address() {
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.source_rate_per_sec = 2;
    cfg.source_rate_burst = 4;
    let app = App::new(&cfg).await;
    let id = create(&app, 10, -1_000, 3_600_000).await;
    let voucher = format!("/vouchers/{id}");
    assert_eq!(statuses(&app, &voucher, "198.51.100.1", 4).await, [200; 4]);
    assert_error(
        call(&app, anonymous_get(&voucher, "198.51.100.1")).await,
        429,
        "rate_limited",
    );
    // Made-up ids from the limited source are refused before any lookup (a lookup would
    // have answered 404).
    assert_eq!(
        statuses(&app, "/vouchers/777777", "198.51.100.1", 20).await,
        [429; 20]
    );
    // Another address is not affected; one IPv6 /64 is one source.
    assert_eq!(statuses(&app, &voucher, "198.51.100.2", 1).await, [200]);
    assert_eq!(
        statuses(&app, &voucher, "2001:db8:7:7::1", 4).await,
        [200; 4]
    );
    assert_eq!(
        statuses(&app, &voucher, "2001:db8:7:7:ffff::9", 1).await,
        [429]
    );
    assert_eq!(statuses(&app, &voucher, "2001:db8:7:8::1", 1).await, [200]);
    // Two tokens a second: the limited source gets one through after 600 ms.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(statuses(&app, &voucher, "198.51.100.1", 1).await, [200]);
    b.cleanup().await;
}

/// Reads of orders cost several database queries, so a user's limit on them holds
/// across instances: two instances (two `App`s on one Redis) share one budget, where a
/// per-instance limit would have given each the whole of it. Other users keep theirs; the
/// budget refills; each read costs one Redis call for it (counted on the server).
#[tokio::test]
async fn reads_of_orders_are_limited_per_user_across_instances() {
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.read_rate_per_sec = 2;
    cfg.read_rate_burst = 4;
    let (one, two) = (App::new(&cfg).await, App::new(&cfg).await);
    let id = create(&one, 10, -1_000, 3_600_000).await;
    let (status, order) = buy(&one, &id, "reader").await;
    assert_eq!(status, 202, "{order}");
    let order_id = order["order_id"].as_str().unwrap().to_string();
    let reader = token("reader", false);
    let get = |app: &'static App, path: String| {
        let reader = reader.clone();
        async move {
            call(app, request("GET", &path, Some(&reader), None, None))
                .await
                .0
        }
    };
    let (one, two): (&'static App, &'static App) =
        (Box::leak(Box::new(one)), Box::leak(Box::new(two)));
    let order_path = format!("/orders/{order_id}");
    let mine = format!("/vouchers/{id}/order");
    let before = b.redis.script_calls();
    // The burst of 4, split over both instances and both read routes.
    assert_eq!(get(one, order_path.clone()).await, 200);
    assert_eq!(get(two, mine.clone()).await, 200);
    assert_eq!(get(two, order_path.clone()).await, 200);
    assert_eq!(get(one, mine.clone()).await, 200);
    assert_eq!(
        b.redis.script_calls() - before,
        4,
        "one script call per read"
    );
    // Spent, on either instance.
    for app in [one, two] {
        assert_error(
            call(app, request("GET", &order_path, Some(&reader), None, None)).await,
            429,
            "rate_limited",
        );
    }
    // Another user is not affected.
    let other = token("other", false);
    assert_eq!(
        call(two, request("GET", &mine, Some(&other), None, None))
            .await
            .0,
        404
    );
    // Two a second: one more after 600 ms.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(get(two, order_path.clone()).await, 200);
    b.cleanup().await;
}

/// A checkout or a cancel costs the database a query even for an order that does not
/// exist: both draw on the same per-user budget as the reads, across instances, so a
/// flood of made-up ids from one account spread over warm instances stays at that
/// budget (each instance's own limit alone would let every instance through).
#[tokio::test]
async fn checkouts_and_cancels_share_the_order_calls_limit_across_instances() {
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.read_rate_per_sec = 2;
    cfg.read_rate_burst = 4;
    let (one, two) = (App::new(&cfg).await, App::new(&cfg).await);
    let bot = token("bot", false);
    let made_up = ["/orders/123456/pay", "/orders/123457/cancel"];
    let mut answers = Vec::new();
    for i in 0..6 {
        let app = if i % 2 == 0 { &one } else { &two };
        let path = made_up[i / 2 % 2];
        let res = call(app, request("POST", path, Some(&bot), None, None)).await;
        answers.push((res.0, res.1["code"].as_str().unwrap_or("").to_string()));
    }
    let codes: Vec<(u16, &str)> = answers.iter().map(|(s, c)| (*s, c.as_str())).collect();
    assert_eq!(
        codes,
        [
            (404, "not_found"),
            (404, "not_found"),
            (404, "not_found"),
            (404, "not_found"),
            (429, "rate_limited"),
            (429, "rate_limited"),
        ]
    );
    // The reads share that budget: spent.
    assert_error(
        call(
            &one,
            request("GET", "/orders/123456", Some(&bot), None, None),
        )
        .await,
        429,
        "rate_limited",
    );
    // Another user is not affected.
    let other = token("other", false);
    let res = call(&two, request("POST", made_up[0], Some(&other), None, None)).await;
    assert_eq!(res.0, 404, "{}", res.1);
    b.cleanup().await;
}

/// `GET path` without a token from source address `ip`.
fn anonymous_get(path: &str, ip: &str) -> lambda_http::Request {
    let mut e = seckill_tests::harness::fixture_event();
    e["rawPath"] = json!(path);
    e["requestContext"]["http"]["path"] = json!(path);
    e["requestContext"]["http"]["sourceIp"] = json!(ip);
    lambda_http::request::from_str(&e.to_string())
        .expect("an API Gateway v2 event")
        .with_lambda_context(lambda_http::Context::default())
}

/// The statuses of `n` anonymous `GET path` from `ip`, one after the other.
async fn statuses(app: &App, path: &str, ip: &str, n: usize) -> Vec<u16> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(call(app, anonymous_get(path, ip)).await.0);
    }
    v
}

#[tokio::test]
async fn backends_down_is_a_quick_503() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let id = create(&app, 5, -1_000, 3_600_000).await;

    // Redis gone: nothing listens on its port any more.
    let mut cfg = b.http_config();
    cfg.redis.url = format!("redis://127.0.0.1:{}", seckill_tests::redis::free_port());
    cfg.redis.timeout = Duration::from_millis(200);
    let no_redis = App::new(&cfg).await;
    let started = Instant::now();
    assert_error(buy(&no_redis, &id, "alice").await, 503, "unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // Data API gone.
    let mut cfg = b.http_config();
    cfg.data_api.endpoint = Some(format!(
        "http://127.0.0.1:{}",
        seckill_tests::redis::free_port()
    ));
    cfg.data_api.timeout = Duration::from_millis(500);
    let no_db = App::new(&cfg).await;
    let started = Instant::now();
    let res = call(
        &no_db,
        request("GET", &format!("/vouchers/{id}"), None, None, None),
    )
    .await;
    assert_error(res.clone(), 503, "unavailable");
    assert!(
        !res.1.to_string().contains("127.0.0.1"),
        "no internals leak: {}",
        res.1
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    b.cleanup().await;
}

/// A purchase or a waiting-room call for a voucher no instance has seen costs the
/// database a read, and made-up ids are each new: those reads draw on the user's budget
/// of calls on orders, shared by every instance (two `App`s on one Redis), so a flood of
/// made-up ids from one account spread over warm instances stays at that budget, where
/// each instance's own limit would grant it once per instance. Beyond it `429`, with the
/// database not asked. A real sale is not held back (Redis knows it: no lookup), other
/// users keep theirs, and an id an instance learned is unknown is answered from its
/// memory (no Redis call at all).
#[tokio::test]
async fn made_up_voucher_ids_draw_on_the_shared_read_budget_across_instances() {
    const BURST: u32 = 6;
    let b = Backends::start().await;
    let mut cfg = b.http_config();
    cfg.read_rate_per_sec = 1;
    cfg.read_rate_burst = BURST;
    let (one, two) = (App::new(&cfg).await, App::new(&cfg).await);
    let real = create(&one, 10, -1_000, 3_600_000).await;
    let prober = token("prober", false);
    let base = 8_000_000_000u64 + u64::from(rand::random::<u32>());
    let made_up = |n: u64, what: &str| format!("/vouchers/{}/{what}", base + n);
    // Made-up ids over both instances and both routes, until refused on both.
    let began = Instant::now();
    let (mut looked_up, mut refused) = (0u32, [false, false]);
    for n in 0..4 * u64::from(BURST) {
        let i = (n % 2) as usize;
        let app = [&one, &two][i];
        let what = if n % 3 == 0 { "queue" } else { "seckill" };
        let res = call(
            app,
            request("POST", &made_up(n, what), Some(&prober), None, None),
        )
        .await;
        match res.0 {
            404 => looked_up += 1,
            429 => {
                assert_error(res, 429, "rate_limited");
                refused[i] = true;
            }
            _ => panic!("{n}: {}", res.1),
        }
        if refused == [true, true] {
            break;
        }
    }
    let refills = began.elapsed().as_secs() as u32 + 1;
    assert_eq!(
        refused,
        [true, true],
        "both instances refuse once it is spent"
    );
    assert!(
        (BURST..=BURST + refills).contains(&looked_up),
        "{looked_up} lookups: one budget of {BURST} (+{refills} refilled) for both instances"
    );
    // An id this instance learned is unknown: answered from memory, no Redis call.
    let before = b.redis.script_calls();
    assert_error(
        call(
            &two,
            request("POST", &made_up(1, "seckill"), Some(&prober), None, None),
        )
        .await,
        404,
        "not_found",
    );
    assert_eq!(b.redis.script_calls(), before, "no Redis call");
    // A real sale the second instance never saw: Redis knows it, no lookup, admitted.
    let (status, order) = buy(&two, &real, "prober").await;
    assert_eq!(status, 202, "{order}");
    // Another user keeps their own budget.
    let other = token("honest", false);
    assert_error(
        call(
            &two,
            request("POST", &made_up(1_000, "seckill"), Some(&other), None, None),
        )
        .await,
        404,
        "not_found",
    );
    // One a second: another lookup after a second and a bit.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_error(
        call(
            &one,
            request(
                "POST",
                &made_up(1_001, "seckill"),
                Some(&prober),
                None,
                None,
            ),
        )
        .await,
        404,
        "not_found",
    );
    b.cleanup().await;
}

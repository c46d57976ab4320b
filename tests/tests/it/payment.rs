//! The payment step against real parts: seckill-http's handler with fixture
//! events, the real scripts on a private Redis, the drainer in process and as a process
//! killed between its Redis and database steps, and a fresh database behind the Data API.
//!
//! What is proved: each order is closed once (paid xor cancelled xor expired, whoever
//! comes first), each returned unit goes back exactly once to Redis and to the database,
//! returned units are sold again within the sale, and a warm instance stops answering
//! `sold_out` within a second of a return.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use seckill_http::App;
use seckill_shared::adapters::redis::CloseAction;
use seckill_shared::domain::{
    Admission, NewVoucher, OrderId, PaymentRef, PaymentTerms, Price, SaleWindow, UserId, Voucher,
    VoucherId, format_rfc3339_millis, now_millis,
};
use seckill_shared::keys::VoucherKeys;
use seckill_tests::drainer::{DrainCtx, DrainerProcess};
use seckill_tests::harness::{
    TEST_CURRENCY, TEST_PRICE_MINOR, call, provider_pays, request, test_http_config, token,
};
use serde_json::{Value, json};

const FAILPOINT_TIMEOUT: Duration = Duration::from_secs(60);

/// A voucher on sale now (for an hour) with a payment window of `pay_within_s`,
/// preloaded into Redis.
async fn pay_voucher(ctx: &DrainCtx, stock: i64, pay_within_s: i64, rebuy: bool) -> Voucher {
    let now = now_millis();
    let new = NewVoucher {
        title: "pay test".into(),
        stock,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment: Some(PaymentTerms {
            pay_within_ms: pay_within_s * 1000,
            rebuy_after_close: rebuy,
            rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
            price: Some(Price::new(TEST_PRICE_MINOR, TEST_CURRENCY).unwrap()),
        }),
        buckets: 1,
        room: None,
    };
    let v = ctx.db().await.create_voucher(&new).await.expect("voucher");
    ctx.sales.preload(&v).await.expect("preload");
    v
}

async fn app_of(ctx: &DrainCtx) -> App {
    App::new(&test_http_config(ctx.redis.config(), ctx.data_api_config())).await
}

async fn buy(app: &App, voucher: impl std::fmt::Display, user: &str) -> (u16, Value) {
    let path = format!("/vouchers/{voucher}/seckill");
    call(
        app,
        request("POST", &path, Some(&token(user, false)), None, None),
    )
    .await
}

/// `user` buys from `voucher` and is admitted (`202`, pending): the order id.
async fn buy_pending(app: &App, voucher: impl std::fmt::Display, user: &str) -> String {
    let res = buy(app, voucher, user).await;
    assert_eq!(status(&res), (202, "pending"), "{user}: {}", res.1);
    res.1["order_id"].as_str().unwrap().to_string()
}

/// The payment provider confirms payment `reference` of `user`'s `order` (a signed
/// webhook event): the answer's `outcome` says what it did.
async fn pay(app: &App, order: &str, user: &str, reference: &str) -> (u16, Value) {
    provider_pays(app, order, user, reference).await
}

/// The buyer starts paying: what the checkout needs.
async fn checkout(app: &App, order: &str, user: &str) -> (u16, Value) {
    let path = format!("/orders/{order}/pay");
    call(
        app,
        request("POST", &path, Some(&token(user, false)), None, None),
    )
    .await
}

async fn cancel(app: &App, order: &str, user: &str) -> (u16, Value) {
    let path = format!("/orders/{order}/cancel");
    call(
        app,
        request("POST", &path, Some(&token(user, false)), None, None),
    )
    .await
}

async fn get_order(app: &App, order: &str, user: &str) -> (u16, Value) {
    let path = format!("/orders/{order}");
    call(
        app,
        request("GET", &path, Some(&token(user, false)), None, None),
    )
    .await
}

fn code(res: &(u16, Value)) -> (u16, &str) {
    (res.0, res.1["code"].as_str().unwrap_or(""))
}

fn status(res: &(u16, Value)) -> (u16, &str) {
    (res.0, res.1["status"].as_str().unwrap_or(""))
}

/// A webhook answer: its status and the payment's outcome.
fn outcome(res: &(u16, Value)) -> (u16, &str) {
    (res.0, res.1["outcome"].as_str().unwrap_or(""))
}

/// The order id of an admission's `202`.
fn admitted(res: (u16, Value)) -> String {
    assert_eq!(res.0, 202, "{}", res.1);
    res.1["order_id"].as_str().unwrap().to_string()
}

/// Redis loses the voucher's sale and buyers hashes (its other keys survive).
async fn lose_sale(ctx: &DrainCtx, v: VoucherId) {
    let k = VoucherKeys::new(v);
    let _: i64 = ctx.conn().del(&[&k.sale, &k.buyers]).await.unwrap();
}

/// A cancel of `order` (of `user`) racing its write as `lua/close.lua` leaves it on a
/// voucher that lets buyers buy again: closed, its buyer forgotten.
async fn cancel_racing_its_write(ctx: &DrainCtx, v: VoucherId, order: &str, user: &str) {
    let k = VoucherKeys::new(v);
    let close = format!("cancelled\n{}\n\n{user}", now_millis() + 600_000);
    let _: i64 = ctx.conn().hset(&k.closed, order, close).await.unwrap();
    let _: i64 = ctx.conn().hdel(&k.buyers, user).await.unwrap();
}

/// Runs the drainer in process until every close is in the database: nothing waits in
/// `to_settle`, no open order is past its deadline, nothing is pending or undelivered.
/// How many runs that takes depends on the machine (a run settles what its time allows),
/// so the bound is on progress: it fails when fifteen runs in a row leave as much to do.
async fn drain_until_settled(ctx: &DrainCtx, v: VoucherId) {
    let k = VoucherKeys::new(v);
    let mut last = String::new();
    let (mut left_before, mut stalled) = (u64::MAX, 0);
    for _ in 0..500 {
        let summary = quick_drain(ctx).await;
        assert_eq!(summary.errors, 0, "{summary:?}");
        let mut conn = ctx.conn();
        let waiting = ctx.streams.to_settle(v).await.unwrap().len();
        let due: u64 = conn
            .zcount(&k.deadlines, "-inf", now_millis())
            .await
            .unwrap();
        if waiting == 0 && due == 0 && summary.lag == 0 && summary.pending == 0 {
            return;
        }
        last = format!("{waiting} closes waiting, {due} orders due, {summary:?}");
        let left = waiting as u64 + due + summary.lag + summary.pending;
        stalled = if left < left_before { 0 } else { stalled + 1 };
        left_before = left_before.min(left);
        if stalled >= 15 {
            break;
        }
    }
    eprintln!("{last}");
    panic!("closes of voucher {v} stopped settling: {last}");
}

/// One in-process drainer run that stops soon when idle.
async fn quick_drain(ctx: &DrainCtx) -> order_drainer::Summary {
    let mut cfg = ctx.drainer_config();
    cfg.max_run = Duration::from_millis(400);
    ctx.drain(cfg).await
}

/// Sleeps until the unix time `ms`.
async fn sleep_until(ms: i64) {
    if let Ok(wait) = u64::try_from(ms - now_millis()) {
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// The voucher's orders in the database by status.
async fn status_counts(ctx: &DrainCtx, v: VoucherId) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (status, _) in ctx.orders_in_db(v).await.values() {
        *counts.entry(status.clone()).or_default() += 1;
    }
    counts
}

fn count(c: &BTreeMap<String, usize>, status: &str) -> usize {
    c.get(status).copied().unwrap_or(0)
}

/// The voucher's payments due for refund, as the operators' status says (`GET /status`).
async fn refunds_due(app: &App, v: VoucherId) -> i64 {
    let (code, body) = call(
        app,
        request(
            "GET",
            &format!("/status?voucher={v}"),
            Some(&token("ops", true)),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    body["vouchers"][0]["refunds_due"]
        .as_i64()
        .expect("refunds_due")
}

async fn redis_stock(ctx: &DrainCtx, v: VoucherId) -> i64 {
    ctx.sales.stock_left(v).await.unwrap().expect("sale loaded")
}

#[tokio::test]
async fn pay_cancel_and_expiry_follow_the_contract() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let admin = token("admin", true);
    let now = now_millis();
    let body = |extra: Value| {
        let mut b = json!({
            "title": "pay later",
            "stock": 3,
            "begins_at": format_rfc3339_millis(now - 1_000),
            "ends_at": format_rfc3339_millis(now + 3_600_000),
        });
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let price = || json!({ "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY });
    // Bad terms are a 400.
    for extra in [
        json!({ "pay_within_s": 0, "price_minor": 100, "currency": "EUR" }),
        json!({ "pay_within_s": 86_401, "price_minor": 100, "currency": "EUR" }),
        json!({ "rebuy_after_close": true }),
        json!({ "pay_within_s": "2", "price_minor": 100, "currency": "EUR" }),
        // A payment step needs a price, a price needs a payment step.
        json!({ "pay_within_s": 5 }),
        json!({ "pay_within_s": 5, "price_minor": 100 }),
        json!({ "price_minor": 100, "currency": "EUR" }),
        json!({ "pay_within_s": 5, "price_minor": 0, "currency": "EUR" }),
        json!({ "pay_within_s": 5, "price_minor": 100, "currency": "eur" }),
        json!({ "pay_within_s": 5, "price_minor": 100, "currency": "EURO" }),
    ] {
        let res = call(
            &app,
            request(
                "POST",
                "/vouchers",
                Some(&admin),
                Some(&body(extra.clone())),
                None,
            ),
        )
        .await;
        assert_eq!(code(&res), (400, "invalid_request"), "{extra}");
    }
    let (st, created) = call(
        &app,
        request(
            "POST",
            "/vouchers",
            Some(&admin),
            Some(&body({
                let mut terms = price();
                terms["pay_within_s"] = json!(5);
                terms
            })),
            None,
        ),
    )
    .await;
    assert_eq!(st, 201, "{created}");
    assert_eq!(created["pay_within_s"], 5);
    assert_eq!(created["rebuy_after_close"], false);
    assert_eq!(created["price_minor"], TEST_PRICE_MINOR);
    assert_eq!(created["currency"], TEST_CURRENCY);
    let vid = created["id"].as_str().unwrap().to_string();
    let v: VoucherId = vid.parse().unwrap();

    let mut orders = HashMap::new();
    for user in ["alice", "bob", "carol"] {
        orders.insert(user, buy_pending(&app, &vid, user).await);
    }
    let (a, b, c) = (&orders["alice"], &orders["bob"], &orders["carol"]);
    assert_eq!(code(&buy(&app, &vid, "dave").await), (409, "sold_out"));

    // A pending order shows its deadline.
    let res = get_order(&app, a, "alice").await;
    assert_eq!(status(&res), (200, "pending"));
    let pay_by = res.1["pay_by"].as_str().expect("pay_by").to_string();

    // The buyer starts a payment: what the checkout needs, and nothing changes. With
    // any body or header a buyer may send, it never pays.
    let res = checkout(&app, a, "alice").await;
    assert_eq!(status(&res), (200, "pending"), "{}", res.1);
    assert_eq!(res.1["pay_by"], pay_by.as_str());
    assert_eq!(res.1["amount_minor"], TEST_PRICE_MINOR);
    assert_eq!(res.1["currency"], TEST_CURRENCY);
    let mut req = request(
        "POST",
        &format!("/orders/{a}/pay"),
        Some(&token("alice", false)),
        Some(&json!({ "payment_ref": "pi_alice-1", "status": "paid" }).to_string()),
        None,
    );
    req.headers_mut()
        .insert("idempotency-key", "pi_alice-1".parse().unwrap());
    assert_eq!(status(&call(&app, req).await), (200, "pending"));
    assert_eq!(status(&get_order(&app, a, "alice").await), (200, "pending"));
    assert_eq!(
        code(&checkout(&app, a, "mallory").await),
        (404, "not_found")
    );

    // The provider says it is paid: the first close wins, a redelivery is told the same,
    // a second payment of a paid order is recorded to refund.
    let res = pay(&app, a, "alice", "pi_alice-1").await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);
    assert_eq!(
        outcome(&pay(&app, a, "alice", "pi_alice-1").await),
        (200, "paid")
    );
    assert_eq!(status(&get_order(&app, a, "alice").await), (200, "paid"));
    assert_eq!(
        code(&checkout(&app, a, "alice").await),
        (409, "already_paid")
    );
    assert_eq!(
        outcome(&pay(&app, a, "alice", "pi_other").await),
        (200, "refund_due")
    );
    assert_eq!(code(&cancel(&app, a, "alice").await), (409, "order_paid"));
    // A payment id outside the accepted form cannot close an order: recorded refused
    // (under a stand-in for the id), the money listed for a refund.
    assert_eq!(
        outcome(&pay(&app, a, "alice", "bad ref").await),
        (200, "refused")
    );
    // Another user's order does not exist for them; an event naming them waits for the
    // order's drain (the database then says whose it is).
    assert_eq!(
        code(&pay(&app, a, "mallory", "pi_m").await),
        (503, "unavailable")
    );
    assert_eq!(code(&cancel(&app, a, "mallory").await), (404, "not_found"));

    // Bob cancels before the drainer ran: his unit is back at once, once.
    assert_eq!(status(&cancel(&app, b, "bob").await), (200, "cancelled"));
    assert_eq!(status(&cancel(&app, b, "bob").await), (200, "cancelled"));
    assert_eq!(
        code(&checkout(&app, b, "bob").await),
        (409, "order_cancelled")
    );
    // Paid after he cancelled: recorded to refund; the order stays cancelled, the unit
    // stays on sale.
    assert_eq!(
        outcome(&pay(&app, b, "bob", "pi_bob").await),
        (200, "refund_due")
    );
    assert_eq!(status(&get_order(&app, b, "bob").await), (200, "cancelled"));
    assert_eq!(redis_stock(&ctx, v).await, 1);
    // No second purchase by default.
    assert_eq!(
        code(&buy(&app, &vid, "bob").await),
        (409, "already_purchased")
    );
    assert_eq!(status(&get_order(&app, b, "bob").await), (200, "cancelled"));

    drain_until_settled(&ctx, v).await;
    let rows = status_counts(&ctx, v).await;
    assert_eq!(
        (
            count(&rows, "paid"),
            count(&rows, "cancelled"),
            count(&rows, "awaiting_payment")
        ),
        (1, 1, 1),
        "{rows:?}"
    );
    assert_eq!(ctx.db_stock_left(v).await, 1, "alice and carol hold units");
    assert_eq!(
        status(&get_order(&app, c, "carol").await),
        (200, "awaiting_payment")
    );

    // Carol's deadline passes: a payment now expires her order instead, and is to be
    // refunded.
    let carol_by = get_order(&app, c, "carol").await.1["pay_by"]
        .as_str()
        .unwrap()
        .to_string();
    let carol_by = seckill_shared::domain::parse_rfc3339_millis(&carol_by, "pay_by").unwrap();
    sleep_until(carol_by + 50).await;
    assert_eq!(
        code(&checkout(&app, c, "carol").await),
        (409, "order_expired")
    );
    assert_eq!(
        outcome(&pay(&app, c, "carol", "pi_late").await),
        (200, "refund_due")
    );
    assert_eq!(
        code(&cancel(&app, c, "carol").await),
        (409, "order_expired")
    );
    let res = get_order(&app, c, "carol").await;
    assert_eq!(status(&res), (200, "expired"));
    assert!(res.1["pay_by"].is_string());
    assert_eq!(redis_stock(&ctx, v).await, 2);
    drain_until_settled(&ctx, v).await;
    let rows = status_counts(&ctx, v).await;
    assert_eq!(
        (
            count(&rows, "paid"),
            count(&rows, "cancelled"),
            count(&rows, "expired")
        ),
        (1, 1, 1),
        "{rows:?}"
    );
    assert_eq!(
        ctx.db_stock_left(v).await,
        2,
        "two units back in the database, once each"
    );
    let mut my = ctx.mysql().await;
    let pay_ref: Option<String> = my
        .exec_first(
            "SELECT pay_ref FROM orders WHERE id = ?",
            (a.parse::<i64>().unwrap(),),
        )
        .await
        .unwrap();
    assert_eq!(pay_ref.as_deref(), Some("pi_alice-1"));
    my.disconnect().await.ok();

    // The units are on sale again.
    assert_eq!(status(&buy(&app, &vid, "dave").await), (202, "pending"));
    assert_eq!(status(&buy(&app, &vid, "erin").await), (202, "pending"));
    assert_eq!(code(&buy(&app, &vid, "frank").await), (409, "sold_out"));
    // Carol's payment arrives (again, under another id) after her unit was sold again:
    // to refund; her order stays expired and the unit stays with its new buyer.
    assert_eq!(
        outcome(&pay(&app, c, "carol", "pi_later").await),
        (200, "refund_due")
    );
    assert_eq!(status(&get_order(&app, c, "carol").await), (200, "expired"));
    assert_eq!(redis_stock(&ctx, v).await, 0);
    assert_eq!(code(&buy(&app, &vid, "frank").await), (409, "sold_out"));
    drain_until_settled(&ctx, v).await;
    let rows = status_counts(&ctx, v).await;
    assert_eq!(
        (count(&rows, "expired"), count(&rows, "awaiting_payment")),
        (1, 2),
        "carol's stays expired; dave and erin hold the units: {rows:?}"
    );
    assert_eq!(ctx.db_stock_left(v).await, 0);
    // Every payment that came after its order closed is listed for a refund.
    let refunds: BTreeSet<String> = seckill_shared::adapters::payments::Payments(&ctx.db().await)
        .list(v, seckill_shared::adapters::payments::Outcome::RefundDue)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.payment_id)
        .collect();
    assert_eq!(
        refunds,
        BTreeSet::from(["pi_other", "pi_bob", "pi_late", "pi_later"].map(String::from))
    );

    // A voucher without a payment step keeps today's states.
    let (st, plain) = call(
        &app,
        request(
            "POST",
            "/vouchers",
            Some(&admin),
            Some(&body(json!({}))),
            None,
        ),
    )
    .await;
    assert_eq!(st, 201);
    assert!(plain.get("pay_within_s").is_none(), "{plain}");
    let pid = plain["id"].as_str().unwrap();
    let res = buy(&app, pid, "alice").await;
    let order = res.1["order_id"].as_str().unwrap();
    // A provider's payment for it took money all the same: recorded, to refund.
    let res = pay(&app, order, "alice", "pi_1").await;
    assert_eq!(outcome(&res), (200, "refused"), "{}", res.1);
    assert!(
        res.1["reason"]
            .as_str()
            .unwrap()
            .contains("takes no payment")
    );
    assert_eq!(
        code(&checkout(&app, order, "alice").await),
        (409, "payment_not_required")
    );
    assert_eq!(
        code(&cancel(&app, order, "alice").await),
        (409, "payment_not_required")
    );
    // Only its buyer learns that.
    assert_eq!(
        code(&checkout(&app, order, "mallory").await),
        (404, "not_found")
    );
    assert_eq!(
        outcome(&pay(&app, order, "mallory", "pi_2").await),
        (200, "refused")
    );
    let res = get_order(&app, order, "alice").await;
    assert_eq!(status(&res), (200, "pending"));
    assert!(res.1.get("pay_by").is_none());
    ctx.cleanup().await;
}

/// Redis loses the sale and buyers hashes of a voucher that lets a buyer buy again,
/// while the stream still holds a cancelled order and, after it, the same buyer's new
/// one (neither drained). The repair reads the buyers back from the stream: the
/// cancelled order names no buyer (its unit is back), so the buyer holds the new order,
/// and one who cancelled without buying again is free to buy. The stock stays exact.
#[tokio::test]
async fn a_repair_never_gives_a_buyer_back_an_order_they_cancelled() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 4, 600, true).await;
    let first = admitted(buy(&app, v.id, "gus").await);
    assert_eq!(
        status(&cancel(&app, &first, "gus").await),
        (200, "cancelled")
    );
    let second = admitted(buy(&app, v.id, "gus").await);
    let gone = admitted(buy(&app, v.id, "hal").await);
    assert_eq!(
        status(&cancel(&app, &gone, "hal").await),
        (200, "cancelled")
    );
    lose_sale(&ctx, v.id).await;

    // A fresh instance; gus's attempt finds the sale missing and repairs it.
    let app = app_of(&ctx).await;
    let res = buy(&app, v.id, "gus").await;
    assert_eq!(code(&res), (409, "already_purchased"), "{}", res.1);
    assert_eq!(
        res.1["order_id"],
        second.as_str(),
        "the order gus holds now"
    );
    let res = buy(&app, v.id, "hal").await;
    assert_eq!(status(&res), (202, "pending"), "hal buys again: {}", res.1);
    // Four units: gus's and hal's live orders hold two.
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(2));
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(ctx.db_stock_left(v.id).await, 2);
    ctx.cleanup().await;
}

/// A drained order cancelled in Redis, its close not yet written to the database, on a
/// voucher that lets a buyer buy again: then Redis loses the sale. The database still
/// counts the order's unit taken, while the repair (rightly) gives its buyer no order
/// back; the repair must open the sale at once with that unit on sale again, not refuse
/// every buyer (503, a full read each time) until the drainer settles the close. The
/// stock stays exact once it does.
#[tokio::test]
async fn a_repair_opens_at_once_beside_a_drained_order_cancelled_and_not_yet_settled() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 600, true).await;
    let first = buy_pending(&app, v.id, "jan").await;
    ctx.drain(ctx.drainer_config()).await;
    assert_eq!(ctx.db_stock_left(v.id).await, 2, "drained: the unit taken");
    assert_eq!(
        status(&cancel(&app, &first, "jan").await),
        (200, "cancelled")
    );
    lose_sale(&ctx, v.id).await;

    let app = app_of(&ctx).await;
    let res = buy(&app, v.id, "kim").await;
    assert_eq!(status(&res), (202, "pending"), "the sale opens: {}", res.1);
    let res = buy(&app, v.id, "jan").await;
    assert_eq!(status(&res), (202, "pending"), "jan buys again: {}", res.1);
    assert_ne!(res.1["order_id"], first.as_str());
    // Three units: jan's and kim's new orders hold two; the cancelled one is back.
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(1));
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(ctx.db_stock_left(v.id).await, 1);
    let res = buy(&app, v.id, "lea").await;
    assert_eq!(status(&res), (202, "pending"), "the last unit: {}", res.1);
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    let mut conn = ctx.mysql().await;
    let rejected: Vec<i64> = conn
        .exec(
            "SELECT id FROM orders WHERE voucher_id = ? AND status = 'rejected'",
            (v.id.get(),),
        )
        .await
        .unwrap();
    assert!(
        rejected.is_empty(),
        "an admitted order refused: {rejected:?}"
    );
    ctx.cleanup().await;
}

/// A repair of a voucher that lets buyers buy again, read in two parts (more buyers than
/// a part reads): the first part sees a drained order that Redis cancelled as still
/// holding its unit, and the database settles that close before the last part. The
/// repair must not count the unit back on top of the database's stock, which now has it:
/// Redis opens with exactly what the database has left.
#[tokio::test]
async fn a_repair_in_parts_never_counts_a_close_settled_between_them_twice() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 5_000, 600, true).await;
    // The first buyer by user id (the first page), drained, then cancelled in Redis.
    let first = buy_pending(&app, v.id, "aaa-first").await;
    ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        status(&cancel(&app, &first, "aaa-first").await),
        (200, "cancelled")
    );
    // 3,000 more buyers in the database: two pages, two parts.
    let mut my = ctx.mysql().await;
    let rows: Vec<(i64, String, &str)> = (0..3_000)
        .map(|i| (3_000_000 + i, format!("zz-{i:05}"), "confirmed"))
        .collect();
    for chunk in rows.chunks(1_000) {
        seckill_tests::mysql::insert_orders(&mut my, v.id.get(), chunk).await;
    }
    my.exec_drop(
        "UPDATE vouchers SET stock_left = stock_left - 3000 WHERE id = ?",
        (v.id.get(),),
    )
    .await
    .unwrap();
    lose_sale(&ctx, v.id).await;

    let mut cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    cfg.repair_part_rows = 1;
    let app = App::new(&cfg).await;
    let res = buy(&app, v.id, "newcomer").await;
    assert_eq!(code(&res), (503, "unavailable"), "part one: {}", res.1);
    // The close settled between the parts, as the drainer records it.
    my.exec_drop(
        "UPDATE orders SET status = 'cancelled' WHERE id = ?",
        (first.parse::<i64>().unwrap(),),
    )
    .await
    .unwrap();
    my.exec_drop(
        "UPDATE vouchers SET stock_left = stock_left + 1 WHERE id = ?",
        (v.id.get(),),
    )
    .await
    .unwrap();
    my.disconnect().await.ok();
    let mut res = buy(&app, v.id, "newcomer").await;
    for _ in 0..3 {
        if res.0 != 503 {
            break;
        }
        res = buy(&app, v.id, "newcomer").await;
    }
    assert_eq!(status(&res), (202, "pending"), "the last part: {}", res.1);
    // The database has 5,000 - 3,000 left; the newcomer holds one of them.
    assert_eq!(ctx.db_stock_left(v.id).await, 2_000);
    assert_eq!(
        ctx.sales.stock_left(v.id).await.unwrap(),
        Some(1_999),
        "Redis opens with what the database has left"
    );
    ctx.cleanup().await;
}

/// A rejected order (the database's stock short) that Redis closed all the same (a
/// cancel racing its write: the drainer read the closes, the cancel came, the row was
/// written rejected) holds its buyer in the database but took no unit. A repair of the
/// voucher (buyers may buy again) must neither count a unit back for it nor refuse to
/// open: Redis opens with what the database has left.
#[tokio::test]
async fn a_repair_counts_no_unit_back_for_a_rejected_order_closed_in_redis() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 600, true).await;
    let mut my = ctx.mysql().await;
    my.exec_drop(
        "UPDATE vouchers SET stock_left = 2 WHERE id = ?",
        (v.id.get(),),
    )
    .await
    .unwrap();
    my.disconnect().await.ok();
    let mut orders = Vec::new();
    for user in ["ann", "bob", "cy"] {
        orders.push(buy_pending(&app, v.id, user).await);
    }
    ctx.drain(ctx.drainer_config()).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (count(&rows, "awaiting_payment"), count(&rows, "rejected")),
        (2, 1),
        "{rows:?}"
    );
    cancel_racing_its_write(&ctx, v.id, &orders[2], "cy").await;
    lose_sale(&ctx, v.id).await;

    let app = app_of(&ctx).await;
    let res = buy(&app, v.id, "dee").await;
    assert_eq!(code(&res), (409, "sold_out"), "nothing is left: {}", res.1);
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(0));
    ctx.cleanup().await;
}

/// The same rejected and closed order, its buyer's rows spanning two pages of the
/// repair's read (the rejected order the last row of the first page, a later cancelled
/// order of the same buyer the first of the second): it is still known as rejected
/// when its buyer is returned with the second page.
#[tokio::test]
async fn a_rejected_order_at_a_page_boundary_is_still_known_rejected() {
    let ctx = DrainCtx::start().await;
    let v = pay_voucher(&ctx, 5_000, 600, true).await;
    let page = seckill_shared::adapters::data_api::SNAPSHOT_PAGE_ROWS;
    let mut my = ctx.mysql().await;
    let fillers: Vec<(i64, String, &str)> = (0..page - 1)
        .map(|i| (4_000_000 + i as i64, format!("a-{i:05}"), "confirmed"))
        .collect();
    for chunk in fillers.chunks(1_000) {
        seckill_tests::mysql::insert_orders(&mut my, v.id.get(), chunk).await;
    }
    let (rejected, cancelled) = (5_000_000_i64, 5_000_001_i64);
    seckill_tests::mysql::insert_orders(
        &mut my,
        v.id.get(),
        &[
            (rejected, "cy".to_string(), "rejected"),
            (cancelled, "cy".to_string(), "cancelled"),
        ],
    )
    .await;
    my.exec_drop(
        "UPDATE vouchers SET stock_left = stock_left - ? WHERE id = ?",
        (fillers.len() as i64, v.id.get()),
    )
    .await
    .unwrap();
    my.disconnect().await.ok();
    // Redis closed the rejected order (a racing cancel) and forgot its buyer; then lost
    // the sale.
    cancel_racing_its_write(&ctx, v.id, &rejected.to_string(), "cy").await;
    lose_sale(&ctx, v.id).await;

    let app = app_of(&ctx).await;
    let res = buy(&app, v.id, "newcomer").await;
    assert_eq!(status(&res), (202, "pending"), "{}", res.1);
    let left = 5_000 - fillers.len() as i64;
    assert_eq!(ctx.db_stock_left(v.id).await, left);
    assert_eq!(
        ctx.sales.stock_left(v.id).await.unwrap(),
        Some(left - 1),
        "what the database has left, less the newcomer's unit"
    );
    ctx.cleanup().await;
}

/// The same loss on a voucher that does not let a buyer buy again: a close keeps the
/// buyer, so the repair restores them from the stream with their cancelled order, and
/// they still cannot buy a second time.
#[tokio::test]
async fn without_rebuy_a_repair_keeps_a_buyer_who_cancelled_to_that_order() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 4, 600, false).await;
    let first = buy_pending(&app, v.id, "ida").await;
    assert_eq!(
        status(&cancel(&app, &first, "ida").await),
        (200, "cancelled")
    );
    lose_sale(&ctx, v.id).await;

    let app = app_of(&ctx).await;
    let res = buy(&app, v.id, "ida").await;
    assert_eq!(code(&res), (409, "already_purchased"), "{}", res.1);
    assert_eq!(res.1["order_id"], first.as_str(), "{}", res.1);
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_voucher_that_allows_it_lets_a_cancelled_buyer_buy_again() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 60, true).await;
    let id_of = |res: (u16, Value)| res.1["order_id"].as_str().unwrap().to_string();
    let mine = |user: &str| {
        let path = format!("/vouchers/{}/order", v.id);
        request("GET", &path, Some(&token(user, false)), None, None)
    };

    // Cancelled before it was drained: still shown as cancelled once the buyer is free.
    let early = id_of(buy(&app, v.id, "erin").await);
    assert_eq!(
        status(&cancel(&app, &early, "erin").await),
        (200, "cancelled")
    );
    assert_eq!(
        status(&get_order(&app, &early, "erin").await),
        (200, "cancelled")
    );
    assert_eq!(
        code(&get_order(&app, &early, "dave").await),
        (404, "not_found")
    );

    let first = id_of(buy(&app, v.id, "dave").await);
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(
        status(&cancel(&app, &first, "dave").await),
        (200, "cancelled")
    );
    drain_until_settled(&ctx, v.id).await;
    let res = buy(&app, v.id, "dave").await;
    assert_eq!(status(&res), (202, "pending"), "{}", res.1);
    let second = id_of(res);
    assert_ne!(first, second);
    // Before the new order is drained, the buyer's order is the new one, pending.
    let res = call(&app, mine("dave")).await;
    assert_eq!(res.1["order_id"], second.as_str(), "{}", res.1);
    assert_eq!(status(&res), (200, "pending"));
    assert_eq!(
        status(&get_order(&app, &second, "dave").await),
        (200, "pending")
    );
    assert_eq!(
        status(&get_order(&app, &first, "dave").await),
        (200, "cancelled")
    );
    // Still one live order per buyer.
    assert_eq!(
        code(&buy(&app, v.id, "dave").await),
        (409, "already_purchased")
    );
    drain_until_settled(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[&first.parse::<i64>().unwrap()].0, "cancelled");
    assert_eq!(rows[&second.parse::<i64>().unwrap()].0, "awaiting_payment");
    assert_eq!(ctx.db_stock_left(v.id).await, 2);
    let res = call(&app, mine("dave")).await;
    assert_eq!(
        res.1["order_id"],
        second.as_str(),
        "the live order is the buyer's order"
    );
    assert_eq!(status(&res), (200, "awaiting_payment"));
    ctx.cleanup().await;
}

/// A buyer cancels a drained order and buys again before the drainer has recorded the
/// cancel: the database still reads the old order `awaiting_payment`, yet the buyer's
/// order is the new one (pending), found by its id and by the voucher, never a 404.
#[tokio::test]
async fn a_new_order_bought_before_the_drainer_records_the_cancel_is_the_buyers() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 60, true).await;
    let mine = || {
        let path = format!("/vouchers/{}/order", v.id);
        request("GET", &path, Some(&token("gus", false)), None, None)
    };
    let first = admitted(buy(&app, v.id, "gus").await);
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(
        status(&cancel(&app, &first, "gus").await),
        (200, "cancelled")
    );
    let second = admitted(buy(&app, v.id, "gus").await);
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        rows[&first.parse::<i64>().unwrap()].0,
        "awaiting_payment",
        "the cancel is not in the database yet: {rows:?}"
    );

    let res = get_order(&app, &second, "gus").await;
    assert_eq!(status(&res), (200, "pending"), "{}", res.1);
    let res = call(&app, mine()).await;
    assert_eq!(res.1["order_id"], second.as_str(), "{}", res.1);
    assert_eq!(status(&res), (200, "pending"));
    assert_eq!(
        status(&get_order(&app, &first, "gus").await),
        (200, "cancelled")
    );
    assert_eq!(
        code(&get_order(&app, &second, "hal").await),
        (404, "not_found")
    );

    drain_until_settled(&ctx, v.id).await;
    let res = call(&app, mine()).await;
    assert_eq!(res.1["order_id"], second.as_str(), "{}", res.1);
    assert_eq!(status(&res), (200, "awaiting_payment"));
    assert_eq!(
        status(&get_order(&app, &second, "gus").await),
        (200, "awaiting_payment")
    );
    ctx.cleanup().await;
}

/// ≥ 5,000 orders whose payment and expiry race: the payments start around the first
/// deadlines and run past the last ones while drainers expire orders at the same time.
/// Every order ends paid xor expired, as its payer was told (the rare 503 sent again, as
/// a provider does); stock is conserved exactly in Redis and in the database, and the
/// expired units sell again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pay_and_expiry_racing_have_one_winner_per_order() {
    const N: usize = 5_000;
    let ctx = Arc::new(DrainCtx::start().await);
    let app = Arc::new(app_of(&ctx).await);
    let v = pay_voucher(&ctx, N as i64, 5, false).await;
    // Admitted over ~3 s (so deadlines spread over ~3 s), in 10 waves.
    let first = now_millis();
    let mut orders: Vec<(OrderId, String)> = Vec::with_capacity(N);
    for wave in 0..10 {
        let prefix = format!("r{wave}");
        let ids = ctx.admit(v.id, &prefix, N / 10).await;
        orders.extend(
            ids.into_iter()
                .enumerate()
                .map(|(i, id)| (id, format!("{prefix}-{i}"))),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let last = now_millis();
    // Some orders drained before the race (awaiting_payment rows), the rest not.
    quick_drain(&ctx).await;
    // At the middle deadline, pay from the latest admitted order back to the first:
    // the first payments beat their deadlines, the last ones come after theirs, and in
    // between payments and the sweeps race order by order.
    sleep_until((first + last) / 2 + 5_000).await;
    orders.reverse();
    let payers = {
        let app = app.clone();
        tokio::spawn(async move {
            futures::stream::iter(orders.into_iter())
                .map(|(id, user)| {
                    let app = app.clone();
                    async move {
                        // As a provider does: a 503 is sent again (the module's
                        // contract, crate::webhook), and counted.
                        let mut resent = 0;
                        loop {
                            let res =
                                pay(&app, &id.to_string(), &user, &format!("pi_{user}")).await;
                            if res.0 != 503 || resent == 5 {
                                break (id, res.0, res.1, resent);
                            }
                            resent += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                })
                .buffer_unordered(64)
                .collect::<Vec<_>>()
                .await
        })
    };
    let sweepers = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut expired = 0;
            for _ in 0..4 {
                let (a, b) = tokio::join!(
                    ctx.drain(ctx.drainer_config()),
                    ctx.drain(ctx.drainer_config())
                );
                expired += a.expired + b.expired;
            }
            expired
        })
    };
    let answers = payers.await.unwrap();
    let swept = sweepers.await.unwrap();
    drain_until_settled(&ctx, v.id).await;

    let mut told = BTreeMap::new();
    // A 503 is a passing state (a backend's hiccup, an order a concurrent drain is
    // writing), never how such a race is decided: rare, and the next delivery decides.
    let resent: usize = answers.iter().map(|a| a.3).sum();
    println!("{resent} deliveries answered 503 and sent again");
    assert!(resent <= N / 100, "{resent} deliveries answered 503");
    for (id, st, body, _) in &answers {
        let outcome = match (st, body["outcome"].as_str()) {
            (200, Some("paid")) => "paid",
            // Paid after its deadline: the order expired, the payment is to refund.
            (200, Some("refund_due")) => "expired",
            _ => panic!("order {id}: unexpected answer {st} {body}"),
        };
        told.insert(id.get(), outcome);
    }
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.len(), N);
    for (id, outcome) in &told {
        assert_eq!(
            rows[id].0, *outcome,
            "order {id} ended as its payer was told"
        );
    }
    let paid = told.values().filter(|o| **o == "paid").count();
    let expired = N - paid;
    println!("{paid} paid, {expired} expired ({swept} by the sweep)");
    assert!(
        paid > 0 && expired > 0,
        "the race had both outcomes: {paid} paid"
    );
    assert_eq!(redis_stock(&ctx, v.id).await, (N - paid) as i64);
    assert_eq!(ctx.db_stock_left(v.id).await, (N - paid) as i64);
    // Every late payment is listed for a refund, every other one paid its order.
    let ledger = seckill_shared::adapters::payments::Payments(&ctx.db().await)
        .counts(v.id)
        .await
        .unwrap();
    let mut by_outcome: BTreeMap<&str, u64> = BTreeMap::new();
    for (o, n) in ledger {
        by_outcome.insert(o.as_str(), n);
    }
    assert_eq!(
        by_outcome,
        BTreeMap::from([("paid", paid as u64), ("refund_due", expired as u64)]),
    );

    // The expired units are sold again, exactly that many.
    let resold = ctx.admit(v.id, "t", expired).await;
    let late = UserId::parse("too-late").unwrap();
    let id = ctx.ids.next(&ctx.sales, v.id, now_millis()).await.unwrap();
    let reply = ctx.sales.admit(v.id, &late, id).await.unwrap();
    assert_eq!(reply.admission, Admission::SoldOut);
    drain_until_settled(&ctx, v.id).await;
    // The resold orders have 5 s to pay, as the first: settling the race's closes can
    // take longer on a loaded machine, and then some of them expire in turn, giving their
    // unit back. Counted apart from the race's orders.
    let statuses = ctx.orders_in_db(v.id).await;
    let resold_ids: BTreeSet<i64> = resold.iter().map(|o| o.get()).collect();
    let mut race = BTreeMap::<String, usize>::new();
    let mut again = BTreeMap::<String, usize>::new();
    for (id, (status, _)) in &statuses {
        let side = if resold_ids.contains(id) {
            &mut again
        } else {
            &mut race
        };
        *side.entry(status.clone()).or_default() += 1;
    }
    assert_eq!(count(&race, "paid"), paid, "{race:?}");
    assert_eq!(count(&race, "expired"), expired, "{race:?}");
    let (waiting, lapsed) = (count(&again, "awaiting_payment"), count(&again, "expired"));
    assert_eq!(
        waiting + lapsed,
        resold.len(),
        "every resold order is written: {again:?}"
    );
    assert_eq!(
        paid + waiting + lapsed,
        N,
        "paid + awaiting + given back again = stock: {race:?} {again:?}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, lapsed as i64);
    assert_eq!(redis_stock(&ctx, v.id).await, lapsed as i64);
    Arc::into_inner(ctx).unwrap().cleanup().await;
}

/// A sale where 30 % of the winners never pay: their orders expire, their units sell
/// again within the sale, and the sale ends with every unit paid, nobody holding two
/// orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_where_a_third_never_pay_ends_with_every_unit_paid() {
    const STOCK: usize = 100;
    const USERS: usize = 600;
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    // Two seconds to pay: a payer pays the moment its 202 arrives (in the same task),
    // so its payment is never queued behind the round's other buyers: a round of 600
    // buys on a loaded machine can outlast a deadline, a request's latency does not.
    const PAY_WITHIN_S: i64 = 2;
    let v = pay_voucher(&ctx, STOCK as i64, PAY_WITHIN_S, false).await;
    let never_pays = |u: usize| u % 10 < 3;
    let mut holders: BTreeSet<usize> = BTreeSet::new();
    let (mut winners, mut paid) = (0, 0);
    for round in 1..=20 {
        let tries: Vec<usize> = (0..USERS).filter(|u| !holders.contains(u)).collect();
        let results: Vec<_> = futures::stream::iter(tries)
            .map(|u| {
                let app = &app;
                async move {
                    let user = format!("buyer-{u}");
                    let bought = buy(app, v.id, &user).await;
                    let mut paid = None;
                    if bought.0 == 202 && !never_pays(u) {
                        let order = bought.1["order_id"].as_str().unwrap_or_default();
                        paid = Some(pay(app, order, &user, &format!("pi_{u}")).await);
                    }
                    (u, bought, paid)
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for (u, res, payment) in results {
            match code(&res) {
                (202, _) => {
                    winners += 1;
                    holders.insert(u);
                    if let Some(res) = payment {
                        assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);
                        paid += 1;
                    }
                }
                (409, "sold_out") => {}
                other => panic!("buyer-{u}: {other:?}"),
            }
        }
        if paid == STOCK {
            println!("every unit paid after {round} rounds, {winners} winners");
            break;
        }
        // Past every open deadline (and the instance's 1 s sold-out memory): the
        // drainer expires the unpaid and gives their units back.
        tokio::time::sleep(Duration::from_millis(PAY_WITHIN_S as u64 * 1_000 + 100)).await;
        drain_until_settled(&ctx, v.id).await;
    }
    assert_eq!(paid, STOCK, "every unit ends paid");
    assert!(winners > STOCK, "units were sold again: {winners} winners");
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(count(&rows, "paid"), STOCK, "{rows:?}");
    assert_eq!(count(&rows, "expired"), winners - STOCK, "{rows:?}");
    assert_eq!(count(&rows, "awaiting_payment"), 0, "{rows:?}");
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    assert_eq!(redis_stock(&ctx, v.id).await, 0);
    let mut my = ctx.mysql().await;
    let most: Option<i64> = my
        .exec_first(
            "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM orders WHERE voucher_id = ? GROUP BY user_id) AS per_user",
            (v.id.get(),),
        )
        .await
        .unwrap();
    assert_eq!(most, Some(1), "nobody holds two orders");
    my.disconnect().await.ok();
    ctx.cleanup().await;
}

/// A warm instance that learned "sold out" admits again at most a second after another
/// instance returned a unit.
#[tokio::test]
async fn a_returned_unit_is_buyable_on_a_warm_instance_within_a_second() {
    let ctx = DrainCtx::start().await;
    let (warm, other) = (app_of(&ctx).await, app_of(&ctx).await);
    let v = pay_voucher(&ctx, 1, 60, false).await;
    let order = buy(&warm, v.id, "alice").await.1["order_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(code(&buy(&warm, v.id, "bob").await), (409, "sold_out"));
    assert_eq!(
        status(&cancel(&other, &order, "alice").await),
        (200, "cancelled")
    );
    let returned = Instant::now();
    loop {
        let res = buy(&warm, v.id, "bob").await;
        if res.0 == 202 {
            break;
        }
        assert_eq!(code(&res), (409, "sold_out"));
        assert!(
            returned.elapsed() < Duration::from_millis(1_200),
            "still sold out {:?} after the return",
            returned.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("bought again {:?} after the return", returned.elapsed());
    ctx.cleanup().await;
}

/// Closes the sweeper's crash test sets up: orders drained and not, paid, cancelled and
/// left to expire. Returns the voucher and the counts the end state must have.
async fn closes_to_sweep(ctx: &DrainCtx) -> (Voucher, [usize; 3]) {
    let v = pay_voucher(ctx, 40, 3, false).await;
    let drained = ctx.admit(v.id, "d", 30).await;
    quick_drain(ctx).await;
    let undrained = ctx.admit(v.id, "u", 10).await;
    let close = |prefix: &'static str, i: usize, id: OrderId, action: CloseAction| async move {
        let user = UserId::parse(&format!("{prefix}-{i}")).unwrap();
        let closed = ctx
            .sales
            .close(v.id, id, &user, &action)
            .await
            .unwrap()
            .expect("an open order");
        let want = match action {
            CloseAction::Pay(_) => "paid",
            CloseAction::Cancel => "cancelled",
        };
        assert_eq!(closed.status.as_str(), want, "closed before its deadline");
    };
    for (i, id) in drained.iter().enumerate().take(10) {
        close(
            "d",
            i,
            *id,
            CloseAction::Pay(PaymentRef::parse(&format!("pi-{i}")).unwrap()),
        )
        .await;
    }
    for (i, id) in drained.iter().enumerate().skip(10).take(5) {
        close("d", i, *id, CloseAction::Cancel).await;
    }
    for (i, id) in undrained.iter().enumerate().take(3) {
        close("u", i, *id, CloseAction::Cancel).await;
    }
    // Every other order's deadline passes (the last admitted ones' too).
    sleep_until(now_millis() + 3_100).await;
    (v, [10, 5 + 3, 15 + 7])
}

async fn assert_swept_once(ctx: &DrainCtx, v: &Voucher, [paid, cancelled, expired]: [usize; 3]) {
    let rows = status_counts(ctx, v.id).await;
    assert_eq!(
        (
            count(&rows, "paid"),
            count(&rows, "cancelled"),
            count(&rows, "expired")
        ),
        (paid, cancelled, expired),
        "{rows:?}"
    );
    assert_eq!(rows.values().sum::<usize>(), 40);
    let left = 40 - paid as i64;
    assert_eq!(
        ctx.db_stock_left(v.id).await,
        left,
        "each unit back in the database once"
    );
    assert_eq!(
        redis_stock(ctx, v.id).await,
        left,
        "each unit back in Redis once"
    );
    assert!(ctx.streams.to_settle(v.id).await.unwrap().is_empty());
}

/// The sweeper SIGKILLed between its Redis and database steps at several points in a
/// row (a crash loop); the next run finishes the job and nothing is returned twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweeper_killed_between_its_steps_again_and_again_returns_each_unit_once() {
    let ctx = DrainCtx::start().await;
    let (v, want) = closes_to_sweep(&ctx).await;
    let mut cfg = ctx.drainer_config();
    cfg.max_run = Duration::from_secs(10);
    let env = ctx.drainer_env(&cfg);
    for failpoint in [
        "after_expire",
        "after_settle",
        "before_commit",
        "after_commit",
        "after_settled",
    ] {
        let mut p = DrainerProcess::spawn(&env, Some(failpoint));
        p.wait_for_failpoint(failpoint, FAILPOINT_TIMEOUT);
        p.kill();
        // The killed run's open transaction (if any) holds the voucher row, as Aurora
        // would for 3 minutes: the next run rolls it back once it counts as abandoned.
        tokio::time::sleep(cfg.min_idle + Duration::from_millis(200)).await;
    }
    let mut last = cfg.clone();
    last.max_run = Duration::from_secs(3);
    let (ok, summary) =
        DrainerProcess::spawn(&ctx.drainer_env(&last), None).finish(Duration::from_secs(60));
    assert!(
        ok && summary.errors == 0,
        "the last run failed: {summary:?}"
    );
    drain_until_settled(&ctx, v.id).await;
    assert_swept_once(&ctx, &v, want).await;
    ctx.cleanup().await;
}

macro_rules! sweeper_cut_points {
    ($($test:ident => $failpoint:literal;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let ctx = DrainCtx::start().await;
            let (v, want) = closes_to_sweep(&ctx).await;
            let mut cfg = ctx.drainer_config();
            cfg.max_run = Duration::from_secs(10);
            let mut p = DrainerProcess::spawn(&ctx.drainer_env(&cfg), Some($failpoint));
            p.wait_for_failpoint($failpoint, FAILPOINT_TIMEOUT);
            p.kill();
            tokio::time::sleep(cfg.min_idle + Duration::from_millis(200)).await;
            drain_until_settled(&ctx, v.id).await;
            assert_swept_once(&ctx, &v, want).await;
            ctx.cleanup().await;
        }
    )*};
}

sweeper_cut_points! {
    sweeper_killed_after_expiring_in_redis => "after_expire";
    sweeper_killed_after_settling_before_commit => "after_settle";
    sweeper_killed_after_commit_before_forgetting => "after_commit";
}

/// Migration 0004 (and those after it: 0005, stock buckets) on a database that already
/// holds vouchers and orders: every row keeps its meaning (no payment step, one bucket,
/// statuses unchanged, one order per buyer still enforced), and the new columns read as
/// "no payment" and "one bucket".
#[tokio::test]
async fn the_payment_migration_keeps_existing_rows_valid() {
    let mysql_url = seckill_tests::StackEnv::load().mysql_url();
    let database = seckill_tests::mysql::fresh_database(&mysql_url).await;
    let mut db = seckill_tests::mysql::connect(&seckill_tests::mysql::url_with_database(
        &mysql_url, &database,
    ))
    .await;
    let all = seckill_shared::migrate::embedded();
    let (before, after): (Vec<_>, Vec<_>) = all.into_iter().partition(|m| m.version < 4);
    assert_eq!(after[0].version, 4, "this test starts at 0004");
    let run = |sql: Vec<String>| sql.into_iter();
    for statement in before.iter().flat_map(|m| run(m.statements())) {
        db.query_drop(statement).await.expect("an old migration");
    }
    db.query_drop(
        "INSERT INTO vouchers (id, title, stock, stock_left, begins_at, ends_at) \
         VALUES (7, 'old sale', 3, 1, '2026-01-01 00:00:00', '2026-01-02 00:00:00')",
    )
    .await
    .unwrap();
    db.query_drop(
        "INSERT INTO orders (id, voucher_id, user_id, status, reason, admitted_at) VALUES \
         (101, 7, 'ann', 'confirmed', NULL, '2026-01-01 00:00:01'), \
         (102, 7, 'ben', 'confirmed', NULL, '2026-01-01 00:00:02'), \
         (103, 7, 'cid', 'rejected', 'db_stock_exhausted', '2026-01-01 00:00:03')",
    )
    .await
    .unwrap();
    for statement in after.iter().flat_map(|m| run(m.statements())) {
        db.query_drop(statement)
            .await
            .expect("0004 and later apply over existing rows");
    }
    let voucher: Option<(Option<i64>, i64, i64, i64)> = db
        .query_first(
            "SELECT pay_within_ms, rebuy_after_close + 0, stock_left, buckets FROM vouchers WHERE id = 7",
        )
        .await
        .unwrap();
    assert_eq!(voucher, Some((None, 0, 1, 1)));
    let rows: Vec<(i64, String, Option<String>, Option<String>)> = db
        .query(
            "SELECT id, status, CONVERT(holder USING utf8mb4), CAST(pay_by AS CHAR) FROM orders ORDER BY id",
        )
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (101, "confirmed".into(), Some("ann".into()), None),
            (102, "confirmed".into(), Some("ben".into()), None),
            (103, "rejected".into(), Some("cid".into()), None),
        ]
    );
    // Still one order per buyer of a voucher.
    let again = db
        .query_drop(
            "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) \
             VALUES (104, 7, 'ann', 'confirmed', '2026-01-01 00:00:04')",
        )
        .await;
    assert!(
        again.is_err(),
        "a second live order of one buyer is refused"
    );
    db.disconnect().await.ok();
    seckill_tests::mysql::drop_database(&mysql_url, &database).await;
}

/// `seckill reconcile` through a payment sale with closes waiting for the drainer and a
/// buyer who bought again: no false discrepancy before or after the drainer settles.
#[tokio::test]
async fn reconcile_sees_no_discrepancy_in_a_payment_sale() {
    use seckill_cli::ops::Backends;
    use seckill_cli::ops::reconcile;
    let ctx = DrainCtx::start().await;
    let b = Backends::connect(&ctx.redis.config(), &ctx.data_api_config())
        .await
        .expect("backends");
    let v = pay_voucher(&ctx, 10, 60, true).await;
    let ids = ctx.admit(v.id, "p", 8).await;
    quick_drain(&ctx).await;
    let user = |i: usize| UserId::parse(&format!("p-{i}")).unwrap();
    let db = ctx.db().await;
    for (i, id) in ids.iter().enumerate().take(3) {
        // As the webhook does it: the payment recorded, the close, the payment decided.
        let pid = format!("pi-{i}");
        let payment = seckill_shared::adapters::payments::NewPayment {
            provider: seckill_shared::adapters::payments::GENERIC,
            payment_id: &pid,
            order: Some(*id),
            voucher: Some(v.id),
            amount_minor: TEST_PRICE_MINOR,
            currency: TEST_CURRENCY,
            event_id: &format!("evt-{i}"),
            received_ms: now_millis(),
        };
        let ledger = seckill_shared::adapters::payments::Payments(&db);
        let received = seckill_shared::adapters::payments::Outcome::Received;
        ledger.record(&payment, received, None).await.unwrap();
        let paid = CloseAction::Pay(PaymentRef::parse(&pid).unwrap());
        ctx.sales
            .close(v.id, *id, &user(i), &paid)
            .await
            .unwrap()
            .unwrap();
        let paid = seckill_shared::adapters::payments::Outcome::Paid;
        ledger.decide(&payment, paid, None).await.unwrap();
    }
    for (i, id) in ids.iter().enumerate().skip(3).take(2) {
        ctx.sales
            .close(v.id, *id, &user(i), &CloseAction::Cancel)
            .await
            .unwrap()
            .unwrap();
    }
    // p-3 buys again (the voucher allows it).
    let again = ctx.ids.next(&ctx.sales, v.id, now_millis()).await.unwrap();
    let reply = ctx.sales.admit(v.id, &user(3), again).await.unwrap();
    assert!(
        matches!(reply.admission, Admission::Admitted { .. }),
        "{reply:?}"
    );

    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert_eq!(r.closes_to_settle, 5);
    assert!(r.discrepancies.is_empty(), "{}", reconcile::render(&r));
    drain_until_settled(&ctx, v.id).await;
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert_eq!(r.closes_to_settle, 0);
    assert!(r.discrepancies.is_empty(), "{}", reconcile::render(&r));
    // The money matches both ways: three payments paid, three orders paid by them.
    assert!(r.unmatched_money.is_empty(), "{}", reconcile::render(&r));
    let st = seckill_cli::ops::status::voucher_status(&b, v.id)
        .await
        .unwrap();
    assert_eq!(
        (st.confirmed, st.awaiting_payment, st.paid, st.closed),
        (7, 4, 3, 2),
        "{st:?}"
    );
    let text = seckill_cli::ops::status::render(std::slice::from_ref(&st));
    assert!(
        text.contains("payment   awaiting 4, paid 3, cancelled or expired 2"),
        "{text}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 10 - 8 + 2 - 1);
    assert_eq!(redis_stock(&ctx, v.id).await, 10 - 8 + 2 - 1);
    ctx.cleanup().await;
}

/// Redis loses a payment sale (sale, buyers and deadlines): the repair restores the
/// deadlines of the orders the database holds and of those its stream holds undrained
/// (the drainer restores the same when it writes them), so every open order can still be
/// paid, cancelled or expire.
#[tokio::test]
async fn deadlines_lost_with_the_sale_come_back_with_the_repair_and_the_drain() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 6, 60, false).await;
    let mut orders = HashMap::new();
    for user in ["alice", "bob", "carol", "dave"] {
        let res = buy(&app, v.id, user).await;
        orders.insert(user, res.1["order_id"].as_str().unwrap().to_string());
    }
    drain_until_settled(&ctx, v.id).await;
    let res = buy(&app, v.id, "erin").await;
    orders.insert("erin", res.1["order_id"].as_str().unwrap().to_string());

    let k = VoucherKeys::new(v.id);
    let _: i64 = ctx
        .conn()
        .del(&[&k.sale, &k.buyers, &k.deadlines])
        .await
        .unwrap();
    let open = |ctx: &DrainCtx| {
        let k = k.clone();
        let mut conn = ctx.conn();
        async move {
            conn.zcount::<_, _, _, u64>(&k.deadlines, "-inf", "(+inf")
                .await
                .unwrap()
        }
    };
    // A read finds the sale missing and repairs it.
    let path = format!("/vouchers/{}", v.id);
    let (st, body) = call(&app, request("GET", &path, None, None, None)).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["stock_left"], 1);
    assert_eq!(
        open(&ctx).await,
        5,
        "the drained orders' deadlines are back, and erin's (not drained) from the stream"
    );
    quick_drain(&ctx).await;
    assert_eq!(
        open(&ctx).await,
        5,
        "erin's deadline stays once her order is written"
    );

    assert_eq!(
        outcome(&pay(&app, &orders["alice"], "alice", "pi_a").await),
        (200, "paid")
    );
    assert_eq!(
        status(&cancel(&app, &orders["erin"], "erin").await),
        (200, "cancelled")
    );
    assert_eq!(
        code(&buy(&app, v.id, "bob").await),
        (409, "already_purchased")
    );
    assert_eq!(redis_stock(&ctx, v.id).await, 2);
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (
            count(&rows, "paid"),
            count(&rows, "cancelled"),
            count(&rows, "awaiting_payment")
        ),
        (1, 1, 3),
        "{rows:?}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 2);

    // Redis forgets the closes and deadlines too (the sale's keys expired after their
    // retention, or were lost again): the database answers for closed orders, and an
    // order still awaiting payment gets its deadline back when it is paid.
    let _: i64 = ctx.conn().del(&[&k.closed, &k.deadlines]).await.unwrap();
    let (alice, erin, bob) = (&orders["alice"], &orders["erin"], &orders["bob"]);
    assert_eq!(
        outcome(&pay(&app, alice, "alice", "pi_a").await),
        (200, "paid")
    );
    assert_eq!(
        outcome(&pay(&app, alice, "alice", "pi_b").await),
        (200, "refund_due")
    );
    assert_eq!(
        code(&cancel(&app, alice, "alice").await),
        (409, "order_paid")
    );
    assert_eq!(
        outcome(&pay(&app, erin, "erin", "pi_e").await),
        (200, "refund_due")
    );
    assert_eq!(
        outcome(&pay(&app, bob, "bob", "pi_bob").await),
        (200, "paid")
    );
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (count(&rows, "paid"), count(&rows, "awaiting_payment")),
        (2, 2),
        "{rows:?}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 2);
    ctx.cleanup().await;
}

/// Migration 0004 stopped part-way or run twice at once (its row in `schema_migrations`
/// missing although its statements ran): running it again finishes without an error.
#[tokio::test]
async fn the_payment_migration_runs_again_after_stopping_part_way() {
    let ctx = DrainCtx::start().await;
    let mut my = ctx.mysql().await;
    my.query_drop("DELETE FROM schema_migrations WHERE version = 4")
        .await
        .unwrap();
    my.disconnect().await.ok();
    let applied =
        seckill_shared::migrate::apply(&ctx.db().await, &seckill_shared::migrate::embedded())
            .await
            .expect("0004 applies again over itself");
    assert_eq!(applied, vec![4]);
    ctx.cleanup().await;
}

/// An order of a payment voucher the database rejects (its stock could not cover it)
/// holds no unit there: it never expires and never gives Redis a unit back.
#[tokio::test]
async fn a_rejected_order_never_gives_redis_a_unit_back() {
    let ctx = DrainCtx::start().await;
    // Two seconds to pay: the first look must come before the deadline however slow
    // the drain on a loaded machine.
    let v = pay_voucher(&ctx, 5, 2, false).await;
    let mut my = ctx.mysql().await;
    my.exec_drop(
        "UPDATE vouchers SET stock_left = 2 WHERE id = ?",
        (v.id.get(),),
    )
    .await
    .unwrap();
    my.disconnect().await.ok();
    ctx.admit(v.id, "x", 3).await;
    quick_drain(&ctx).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (count(&rows, "awaiting_payment"), count(&rows, "rejected")),
        (2, 1),
        "{rows:?}"
    );
    sleep_until(now_millis() + 2_100).await;
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (count(&rows, "expired"), count(&rows, "rejected")),
        (2, 1),
        "{rows:?}"
    );
    assert_eq!(
        redis_stock(&ctx, v.id).await,
        2 + 2,
        "two expired units back, not three"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 2);
    ctx.cleanup().await;
}

/// Orders paid before the drain (the provider's money taken) that the database then
/// rejects, its stock short (as after a Redis loss): their payments are marked due for
/// refund when the drainer settles their closes, once, and the operators see them. Two
/// shapes: the payment decided before the drain read the close, and the order written
/// `rejected` while the payment was still on its way (its close settled later).
#[tokio::test]
async fn a_paid_order_the_database_rejects_has_its_payment_due_for_refund() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 5, 600, false).await;
    let mut my = ctx.mysql().await;
    my.exec_drop(
        "UPDATE vouchers SET stock_left = 0 WHERE id = ?",
        (v.id.get(),),
    )
    .await
    .unwrap();
    // Paid first, then drained: written rejected.
    let early = admitted(buy(&app, v.id, "pia").await);
    let (status, body) = pay(&app, &early, "pia", "pay-early").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("paid")),
        "{body}"
    );
    // Drained first (rejected), then paid: the webhook sees the rejected row.
    let late = admitted(buy(&app, v.id, "quin").await);
    drain_until_settled(&ctx, v.id).await;
    let (status, body) = pay(&app, &late, "quin", "pay-late").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("refund_due")),
        "{body}"
    );
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(count(&rows, "rejected"), 2, "{rows:?}");
    let outcomes: Vec<(String, String)> = my
        .exec(
            "SELECT payment_id, outcome FROM payments WHERE voucher_id = ? ORDER BY payment_id",
            (v.id.get(),),
        )
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            ("pay-early".to_string(), "refund_due".to_string()),
            ("pay-late".to_string(), "refund_due".to_string())
        ]
    );
    // Settling again changes nothing.
    drain_until_settled(&ctx, v.id).await;
    let due: Vec<String> = my
        .exec(
            "SELECT payment_id FROM payments WHERE voucher_id = ? AND outcome = 'refund_due'",
            (v.id.get(),),
        )
        .await
        .unwrap();
    assert_eq!(due.len(), 2);
    my.disconnect().await.ok();
    ctx.cleanup().await;
}

/// A cancel while Redis has lost the sale hash does not recreate it with a stock field
/// alone (which would pass for a live sale without a window); the repair rebuilds it and
/// Redis never holds more units than the database.
#[tokio::test]
async fn a_return_while_the_sale_is_lost_leaves_the_repair_to_rebuild_it() {
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 60, false).await;
    let order = buy(&app, v.id, "alice").await.1["order_id"]
        .as_str()
        .unwrap()
        .to_string();
    drain_until_settled(&ctx, v.id).await;
    let k = VoucherKeys::new(v.id);
    let _: i64 = ctx.conn().del(&[&k.sale, &k.deadlines]).await.unwrap();
    assert_eq!(
        status(&cancel(&app, &order, "alice").await),
        (200, "cancelled")
    );
    let exists: bool = ctx.conn().exists(&k.sale).await.unwrap();
    assert!(!exists, "the return did not recreate the sale hash");
    let (st, body) = call(
        &app,
        request("GET", &format!("/vouchers/{}", v.id), None, None, None),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    drain_until_settled(&ctx, v.id).await;
    let (redis, db) = (redis_stock(&ctx, v.id).await, ctx.db_stock_left(v.id).await);
    assert_eq!(db, 3, "the database got the unit back once");
    assert!(redis <= db, "redis {redis} never above the database {db}");
    assert_eq!(
        code(&buy(&app, v.id, "alice").await),
        (409, "already_purchased")
    );
    ctx.cleanup().await;
}

/// Without a retention (`DRAINER_RETENTION_S=0`), a finished sale is retired from the
/// drainer's active set only when `lua/expire_sale.lua` would let its keys expire:
/// while its orders still wait for payment it stays surveyed (else they would never
/// expire, and their units never come back); once they expired and their closes
/// reached the database, it is retired.
#[tokio::test]
async fn without_retention_a_finished_sale_with_open_orders_is_not_retired() {
    let ctx = DrainCtx::start().await;
    let v = pay_voucher(&ctx, 5, 2, false).await;
    let app = app_of(&ctx).await;
    for user in ["a", "b"] {
        let (status, body) = buy(&app, v.id, user).await;
        assert_eq!(status, 202, "{body}");
    }
    let _: () = ctx
        .conn()
        .hset(
            VoucherKeys::new(v.id).sale,
            "ends_ms",
            now_millis() - 120_000,
        )
        .await
        .unwrap();
    let mut cfg = ctx.drainer_config();
    cfg.retention = None;
    let s = ctx.drain(cfg.clone()).await;
    assert_eq!(
        (s.inserted, s.retired),
        (2, 0),
        "open orders: not retired {s:?}"
    );
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let mut retired = 0;
    for _ in 0..5 {
        let s = ctx.drain(cfg.clone()).await;
        retired += s.retired;
        if retired > 0 {
            break;
        }
    }
    assert_eq!(
        retired, 1,
        "retired once its orders expired and were settled"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 5, "both units came back");
    ctx.cleanup().await;
}

/// A failed attempt moved no money, so its amount is not held to the price: a `failed`
/// for another amount, then the provider's retried card succeeding for the price under
/// the same payment id, pays the order, and the row records the amount paid. (Before,
/// the failure was recorded `refused` for good, the success was refused too, and the
/// order expired unpaid.) The other way round, a success for the wrong amount after a
/// failed attempt is recorded `refused` with the amount taken (to give back), not left
/// `failed`.
#[tokio::test]
async fn a_failed_attempt_of_another_amount_never_blocks_its_payment_nor_hides_a_wrong_one() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    use seckill_tests::harness::{deliver, provider_event};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 2, 600, false).await;
    let mut orders = Vec::new();
    for user in ["eve", "fay"] {
        orders.push(buy_pending(&app, v.id, user).await);
    }
    let (eve, fay) = (&orders[0], &orders[1]);
    let ledger = |payment: &'static str| {
        let ctx = &ctx;
        async move {
            Payments(&ctx.db().await)
                .get(payment)
                .await
                .unwrap()
                .map(|p| p.outcome)
        }
    };
    let cheap = TEST_PRICE_MINOR - 1;

    let failed = provider_event(
        "payment.failed",
        eve,
        "eve",
        "pay_eve",
        cheap,
        TEST_CURRENCY,
    );
    assert_eq!(outcome(&deliver(&app, &failed).await), (200, "failed"));
    let ok = provider_event(
        "payment.succeeded",
        eve,
        "eve",
        "pay_eve",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(outcome(&deliver(&app, &ok).await), (200, "paid"));
    assert_eq!(status(&get_order(&app, eve, "eve").await), (200, "paid"));
    assert_eq!(ledger("pay_eve").await, Some(Outcome::Paid));
    let amount = |payment: &'static str| {
        let ctx = &ctx;
        async move {
            let p = Payments(&ctx.db().await)
                .get(payment)
                .await
                .unwrap()
                .unwrap();
            (p.amount_minor, p.currency)
        }
    };
    assert_eq!(
        amount("pay_eve").await,
        (TEST_PRICE_MINOR, TEST_CURRENCY.to_string()),
        "the amount paid, not the failed attempt's"
    );

    let failed = provider_event(
        "payment.failed",
        fay,
        "fay",
        "pay_fay",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(outcome(&deliver(&app, &failed).await), (200, "failed"));
    let wrong = provider_event(
        "payment.succeeded",
        fay,
        "fay",
        "pay_fay",
        cheap,
        TEST_CURRENCY,
    );
    assert_eq!(
        code(&deliver(&app, &wrong).await),
        (422, "payment_mismatch")
    );
    assert_eq!(ledger("pay_fay").await, Some(Outcome::Refused));
    assert_eq!(
        amount("pay_fay").await,
        (cheap, TEST_CURRENCY.to_string()),
        "the amount taken, to give back"
    );
    // Refused for good: the same payment id pays nothing later, and says so the same way.
    let late = provider_event(
        "payment.succeeded",
        fay,
        "fay",
        "pay_fay",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(code(&deliver(&app, &late).await), (422, "payment_mismatch"));
    assert_eq!(status(&get_order(&app, fay, "fay").await), (200, "pending"));
    assert_eq!(ledger("pay_fay").await, Some(Outcome::Refused));
    // Money taken that pays for nothing: the operators' figures count it to refund.
    assert_eq!(refunds_due(&app, v.id).await, 1);
    ctx.cleanup().await;
}

/// A `payment.failed` recorded whose decision has not run yet (its delivery died after
/// the record, or is still in flight), then a success of that payment id for the wrong
/// amount: the success is answered `503`, never a final `422` while the row could still
/// end `failed` (the money taken then listed nowhere); sent again once the failure is
/// decided, it is refused and counted among the refunds due.
#[tokio::test]
async fn a_wrong_amount_after_an_undecided_failure_is_refused_once_the_failure_is_decided() {
    use seckill_shared::adapters::payments::{NewPayment, Outcome, Payments};
    use seckill_tests::harness::{deliver, provider_event};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 2, 600, false).await;
    let order = admitted(buy(&app, v.id, "fay").await);
    let ledger = || {
        let ctx = &ctx;
        async move {
            Payments(&ctx.db().await)
                .get("pay_fay")
                .await
                .unwrap()
                .map(|p| p.outcome)
        }
    };
    // The failure's delivery recorded the row and died before deciding it.
    let db = ctx.db().await;
    let recorded = Payments(&db)
        .record(
            &NewPayment {
                provider: seckill_shared::adapters::payments::GENERIC,
                payment_id: "pay_fay",
                order: Some(order.parse().unwrap()),
                voucher: Some(v.id),
                amount_minor: TEST_PRICE_MINOR,
                currency: TEST_CURRENCY,
                event_id: "evt_failed",
                received_ms: now_millis(),
            },
            Outcome::Received,
            None,
        )
        .await
        .unwrap();
    assert_eq!(recorded.outcome, Outcome::Received);
    let cheap = TEST_PRICE_MINOR - 1;
    let wrong = provider_event(
        "payment.succeeded",
        &order,
        "fay",
        "pay_fay",
        cheap,
        TEST_CURRENCY,
    );
    assert_eq!(code(&deliver(&app, &wrong).await), (503, "unavailable"));
    assert_eq!(ledger().await, Some(Outcome::Received));
    // The provider sends the failure again: decided.
    let failed = provider_event(
        "payment.failed",
        &order,
        "fay",
        "pay_fay",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(outcome(&deliver(&app, &failed).await), (200, "failed"));
    // And the success again: refused for good, to be refunded.
    assert_eq!(
        code(&deliver(&app, &wrong).await),
        (422, "payment_mismatch")
    );
    assert_eq!(ledger().await, Some(Outcome::Refused));
    assert_eq!(
        status(&get_order(&app, &order, "fay").await),
        (200, "pending")
    );
    assert_eq!(refunds_due(&app, v.id).await, 1);
    ctx.cleanup().await;
}

/// A paid close Redis lost (a failover that dropped the write; the replica still holds
/// the order's deadline): the order expires at its deadline and its unit goes back on
/// sale, or its buyer pays it again with another payment. The payment recorded `paid`
/// by the lost close is then due for refund, counted in the operators' figures, never
/// left `paid` beside an expired order or beside the payment that paid it again.
#[tokio::test]
async fn a_paid_order_that_expires_after_redis_lost_its_paid_close_is_due_for_refund() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 600, false).await;
    let ann = admitted(buy(&app, v.id, "ann").await);
    let bea = admitted(buy(&app, v.id, "bea").await);
    drain_until_settled(&ctx, v.id).await;
    for (order, user, payment) in [(&ann, "ann", "pi_ann"), (&bea, "bea", "pi_bea1")] {
        let res = pay(&app, order, user, payment).await;
        assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);
    }
    // The failover: the replica never got the closes (nor their to-settle entries) and
    // still holds the deadlines; ann's is due at once.
    let k = VoucherKeys::new(v.id);
    let mut conn = ctx.conn();
    let due = now_millis() + 300;
    for (order, user, at) in [(&ann, "ann", due), (&bea, "bea", due + 600_000)] {
        let _: i64 = conn.hdel(&k.closed, order).await.unwrap();
        let _: i64 = conn.srem(&k.to_settle, order).await.unwrap();
        let member = seckill_shared::keys::deadline_member(order.parse().unwrap(), user);
        let _: i64 = conn.zadd(&k.deadlines, member, at).await.unwrap();
    }
    // bea, told her order is open again, pays it again.
    let res = pay(&app, &bea, "bea", "pi_bea2").await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);

    sleep_until(due + 100).await;
    drain_until_settled(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows[&ann.parse::<i64>().unwrap()].0, "expired", "{rows:?}");
    assert_eq!(rows[&bea.parse::<i64>().unwrap()].0, "paid", "{rows:?}");
    assert_eq!(
        redis_stock(&ctx, v.id).await,
        2,
        "ann's unit is back on sale"
    );
    let outcome_of = |payment: &'static str| {
        let ctx = &ctx;
        async move {
            Payments(&ctx.db().await)
                .get(payment)
                .await
                .unwrap()
                .unwrap()
                .outcome
        }
    };
    assert_eq!(outcome_of("pi_ann").await, Outcome::RefundDue);
    assert_eq!(outcome_of("pi_bea1").await, Outcome::RefundDue);
    assert_eq!(outcome_of("pi_bea2").await, Outcome::Paid);
    assert_eq!(refunds_due(&app, v.id).await, 2);
    // Settling again changes nothing.
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(outcome_of("pi_ann").await, Outcome::RefundDue);
    assert_eq!(outcome_of("pi_bea2").await, Outcome::Paid);
    ctx.cleanup().await;
}

/// The provider's success for an order admitted and not yet drained, while Redis has
/// lost the sale (its buyers and deadlines with it) and nothing repaired it yet: `503`,
/// which the provider sends again, never a `404` that would make it stop for good; once
/// the order is drained the same event pays it.
#[tokio::test]
async fn a_payment_for_an_order_of_a_lost_sale_is_answered_503_until_it_can_be_applied() {
    use seckill_shared::adapters::payments::Payments;
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 3, 600, false).await;
    let order = admitted(buy(&app, v.id, "eli").await);
    let k = VoucherKeys::new(v.id);
    let _: i64 = ctx
        .conn()
        .del(&[&k.sale, &k.buyers, &k.deadlines])
        .await
        .unwrap();
    let other = app_of(&ctx).await;
    let res = pay(&other, &order, "eli", "pi_eli").await;
    assert_eq!(code(&res), (503, "unavailable"), "{}", res.1);
    assert!(
        Payments(&ctx.db().await)
            .get("pi_eli")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        code(&checkout(&other, &order, "eli").await),
        (503, "unavailable")
    );
    assert_eq!(code(&pay(&other, &order, "stranger", "pi_x").await).0, 503);

    drain_until_settled(&ctx, v.id).await;
    let res = pay(&other, &order, "eli", "pi_eli").await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);
    assert_eq!(
        status(&get_order(&other, &order, "eli").await),
        (200, "paid")
    );
    ctx.cleanup().await;
}

/// The webhook's own rules, in process: an event signed with the previous secret is
/// accepted (a rotation under way); a `failed` event is recorded and leaves the order
/// open, and a later `succeeded` of the same payment pays it (a `failed` arriving after
/// that changes nothing); a wrong amount or currency is refused with a 4xx, recorded
/// `refused`, and pays nothing; a payment id recorded for one order is refused for
/// another; events no signature vouches for, or that are no payment event, change
/// nothing; a payment that cannot be applied is recorded `refused` and answered 200.
#[tokio::test]
async fn the_webhook_records_each_payment_once_and_refuses_what_it_cannot_apply() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    use seckill_tests::harness::{
        TEST_WEBHOOK_PREVIOUS, deliver, provider_event, signature_now, webhook_request,
    };
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 4, 600, false).await;
    let mut orders = Vec::new();
    for user in ["ann", "ben", "cid", "dee"] {
        orders.push(buy_pending(&app, v.id, user).await);
    }
    let [ann, ben, cid, dee] = [&orders[0], &orders[1], &orders[2], &orders[3]];
    let event =
        |kind: &str, order: &str, user: &str, payment: &str, amount: i64, currency: &str| {
            provider_event(kind, order, user, payment, amount, currency)
        };
    let ledger = |payment: &'static str| {
        let ctx = &ctx;
        async move {
            Payments(&ctx.db().await)
                .get(payment)
                .await
                .unwrap()
                .map(|p| {
                    (
                        p.outcome,
                        p.order.map(|o| o.to_string()).unwrap_or_default(),
                    )
                })
        }
    };

    // Signed with the previous secret: still accepted.
    let body = event(
        "payment.succeeded",
        ann,
        "ann",
        "pay_ann",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    let sig = signature_now(TEST_WEBHOOK_PREVIOUS, &body);
    let res = call(&app, webhook_request(&body, Some(&sig))).await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);
    assert_eq!(status(&get_order(&app, ann, "ann").await), (200, "paid"));

    // Failed, then succeeded, then a late `failed` of the same payment.
    let failed = event(
        "payment.failed",
        ben,
        "ben",
        "pay_ben",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(outcome(&deliver(&app, &failed).await), (200, "failed"));
    assert_eq!(status(&get_order(&app, ben, "ben").await), (200, "pending"));
    let ok = event(
        "payment.succeeded",
        ben,
        "ben",
        "pay_ben",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(outcome(&deliver(&app, &ok).await), (200, "paid"));
    assert_eq!(outcome(&deliver(&app, &failed).await), (200, "paid"));
    assert_eq!(status(&get_order(&app, ben, "ben").await), (200, "paid"));

    // A wrong amount, a wrong currency: refused, recorded, nothing paid.
    let cheap = event(
        "payment.succeeded",
        cid,
        "cid",
        "pay_cid_cheap",
        TEST_PRICE_MINOR - 1,
        TEST_CURRENCY,
    );
    assert_eq!(
        code(&deliver(&app, &cheap).await),
        (422, "payment_mismatch")
    );
    let dollars = event(
        "payment.succeeded",
        cid,
        "cid",
        "pay_cid_usd",
        TEST_PRICE_MINOR,
        "USD",
    );
    assert_eq!(
        code(&deliver(&app, &dollars).await),
        (422, "payment_mismatch")
    );
    assert_eq!(
        ledger("pay_cid_cheap").await,
        Some((Outcome::Refused, cid.to_string()))
    );
    assert_eq!(status(&get_order(&app, cid, "cid").await), (200, "pending"));

    // One payment id, two orders: the second is refused and changes nothing.
    let reused = event(
        "payment.succeeded",
        cid,
        "cid",
        "pay_ann",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(code(&deliver(&app, &reused).await), (409, "payment_reused"));
    assert_eq!(status(&get_order(&app, cid, "cid").await), (200, "pending"));
    assert_eq!(
        ledger("pay_ann").await,
        Some((Outcome::Paid, ann.to_string()))
    );

    // Nothing vouches for these, or they cannot be read: 4xx, nothing recorded.
    let dee_pays = event(
        "payment.succeeded",
        dee,
        "dee",
        "pay_dee",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    let stale = seckill_shared::webhook::header(
        &[seckill_tests::harness::TEST_WEBHOOK_SECRET.as_bytes()],
        now_millis() / 1000 - 600,
        dee_pays.as_bytes(),
    );
    let unknown_secret = signature_now("whsec_someone_else_0123456789", &dee_pays);
    for (what, body, sig) in [
        ("unsigned", dee_pays.clone(), None),
        ("stale", dee_pays.clone(), Some(stale)),
        ("another secret", dee_pays.clone(), Some(unknown_secret)),
        (
            "malformed header",
            dee_pays.clone(),
            Some("t=1,v1=xyz".to_string()),
        ),
    ] {
        let res = call(&app, webhook_request(&body, sig.as_deref())).await;
        assert_eq!(code(&res), (401, "unauthorized"), "{what}: {}", res.1);
    }
    // No payment event at all: refused, nothing recorded. An event that is a payment
    // but cannot be applied is recorded `refused` and answered 200 (the money listed
    // for a refund: the provider stops sending either way); one whose order may still
    // turn out to be its buyer's (not drained, and Redis does not show it as theirs)
    // is answered 503 until it is drained.
    for (what, body, want) in [
        ("not JSON", "{".to_string(), (400, "invalid_request")),
        (
            "an unknown type",
            dee_pays.replace("payment.succeeded", "payment.refunded"),
            (400, "invalid_request"),
        ),
        (
            "an order nobody has, of an id leased long ago",
            event(
                "payment.succeeded",
                "4242424242",
                "dee",
                "pay_x",
                TEST_PRICE_MINOR,
                TEST_CURRENCY,
            ),
            (200, "refused"),
        ),
        (
            "another buyer, the order not drained",
            event(
                "payment.succeeded",
                dee,
                "eve",
                "pay_y",
                TEST_PRICE_MINOR,
                TEST_CURRENCY,
            ),
            (503, "unavailable"),
        ),
        (
            "a buyer no user id can be, the order not drained",
            event(
                "payment.succeeded",
                dee,
                "d\u{1}ee",
                "pay_y",
                TEST_PRICE_MINOR,
                TEST_CURRENCY,
            ),
            (503, "unavailable"),
        ),
        // Fields outside the form the ledger's columns take: recorded all the same.
        (
            "a four-letter currency",
            event(
                "payment.succeeded",
                dee,
                "dee",
                "pay_dee_euro",
                TEST_PRICE_MINOR,
                "EURO",
            ),
            (200, "refused"),
        ),
        (
            "an amount with a fraction",
            with_field(
                &dee_pays.replace("pay_dee", "pay_dee_half"),
                &["data", "amount_minor"],
                json!(1999.5),
            ),
            (200, "refused"),
        ),
    ] {
        let res = deliver(&app, &body).await;
        let got = match want.0 {
            200 => outcome(&res),
            _ => code(&res),
        };
        assert_eq!(got, want, "{what}: {}", res.1);
    }
    assert_eq!(ledger("pay_dee").await, None);
    assert_eq!(
        ledger("pay_x").await,
        Some((Outcome::Refused, "4242424242".to_string()))
    );
    assert_eq!(ledger("pay_y").await, None);
    for refused in ["pay_dee_euro", "pay_dee_half"] {
        assert_eq!(
            ledger(refused).await,
            Some((Outcome::Refused, dee.to_string())),
            "{refused}"
        );
    }
    assert_eq!(status(&get_order(&app, dee, "dee").await), (200, "pending"));
    // And the real one pays, its amount written as JSON Schema's integers may be, its
    // event id longer than the ledger keeps (recorded by a stand-in).
    let float_amount = f64::from(u32::try_from(TEST_PRICE_MINOR).unwrap());
    let dee_pays = with_field(&dee_pays, &["data", "amount_minor"], json!(float_amount));
    let dee_pays = with_field(&dee_pays, &["id"], json!("e".repeat(129)));
    assert!(dee_pays.contains(".0"), "{dee_pays}");
    assert_eq!(outcome(&deliver(&app, &dee_pays).await), (200, "paid"));
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (count(&rows, "paid"), count(&rows, "awaiting_payment")),
        (3, 1),
        "{rows:?}"
    );
    ctx.cleanup().await;
}

/// Without a configured secret the webhook answers 503 (the provider keeps the event and
/// resends), never 2xx.
#[tokio::test]
async fn without_a_secret_the_webhook_is_unavailable() {
    let ctx = DrainCtx::start().await;
    let mut cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    cfg.webhook = seckill_http::payment::SecretSource::Missing;
    let app = App::new(&cfg).await;
    let body =
        seckill_tests::harness::provider_event("payment.succeeded", "1", "ann", "pay_1", 1, "EUR");
    let res = seckill_tests::harness::deliver(&app, &body).await;
    assert_eq!(code(&res), (503, "unavailable"), "{}", res.1);
    ctx.cleanup().await;
}

/// `body` (a JSON object) with the field at `path` set to `value`.
fn with_field(body: &str, path: &[&str], value: Value) -> String {
    let mut v: Value = serde_json::from_str(body).expect("a JSON event");
    let mut at = &mut v;
    for key in path {
        at = &mut at[*key];
    }
    *at = value;
    v.to_string()
}

/// The payments queries read one voucher's rows through their index on a table never
/// analysed: the rows they examine stay about the rows they match, however many payments
/// other vouchers have (20,000 here, over 200 vouchers).
#[tokio::test]
async fn payment_queries_examine_about_the_rows_they_match_on_a_table_never_analysed() {
    use mysql_async::params;
    use seckill_shared::adapters::payments::{COUNTS_SQL, list_sql};
    use seckill_tests::mysql::handler_reads;
    let ctx = DrainCtx::start().await;
    let mut conn = ctx.mysql().await;
    let outcomes = ["received", "paid", "refund_due", "failed", "refused"];
    // (payment id, order, voucher, outcome, age in seconds); vouchers interleaved.
    let rows: Vec<(String, u64, u64, &str, u64)> = (0..20_000u64)
        .map(|i| {
            let voucher = 1 + (i * 7_919) % 200;
            let outcome = outcomes[((i / 7) % 5) as usize];
            (
                format!("pay_{i:06}"),
                1_000_000 + i,
                voucher,
                outcome,
                (i * 31) % 86_400,
            )
        })
        .collect();
    seckill_tests::mysql::insert_payments(&mut conn, &rows).await;
    let overhead = {
        let a = handler_reads(&mut conn).await;
        let b = handler_reads(&mut conn).await;
        b - a
    };
    for voucher in [7u64, 200] {
        let of_voucher = rows.iter().filter(|r| r.2 == voucher).count() as u64;
        for outcome in ["refund_due", "paid"] {
            let matching = rows
                .iter()
                .filter(|r| r.2 == voucher && r.3 == outcome)
                .count() as u64;
            let before = handler_reads(&mut conn).await;
            let got: Vec<mysql_async::Row> = conn
                .exec(list_sql(), params! { "v" => voucher, "outcome" => outcome })
                .await
                .unwrap();
            let examined = handler_reads(&mut conn).await - before - overhead;
            assert_eq!(got.len() as u64, matching, "voucher {voucher} {outcome}");
            assert!(
                examined <= 2 * matching + 10,
                "listing {matching} {outcome} payments of voucher {voucher} examined {examined} rows"
            );
        }
        let before = handler_reads(&mut conn).await;
        let counts: Vec<(String, u64)> = conn
            .exec(COUNTS_SQL, params! { "v" => voucher })
            .await
            .unwrap();
        let examined = handler_reads(&mut conn).await - before - overhead;
        assert_eq!(counts.iter().map(|(_, n)| n).sum::<u64>(), of_voucher);
        assert!(
            examined <= 2 * of_voucher + 10,
            "counting voucher {voucher}'s {of_voucher} payments examined {examined} rows"
        );
    }

    // The settle's look for payments a lost paid close left `paid` (one statement per
    // chunk of 1,000 closes): the chunk's orders through the primary key, each one's
    // payments through `payments_by_order`; never the voucher's other payments.
    use seckill_shared::adapters::ledger::sql::{PAID_CLOSED_AGAIN, SALE_END};
    let voucher = 7u64;
    let orders: Vec<(i64, String, &str)> = rows
        .iter()
        .filter(|r| r.2 == voucher)
        .enumerate()
        .map(|(i, r)| {
            let status = ["expired", "paid", "awaiting_payment"][i % 3];
            (r.1 as i64, format!("buyer-{i}"), status)
        })
        .collect();
    seckill_tests::mysql::insert_orders(&mut conn, voucher as i64, &orders).await;
    let chunk: Vec<i64> = orders.iter().take(1_000).map(|o| o.0).collect();
    let expect = rows
        .iter()
        .filter(|r| chunk.contains(&(r.1 as i64)) && r.3 == "paid")
        // The expired orders' (the paid ones here have no reference that differs).
        .filter(|r| orders.iter().position(|o| o.0 == r.1 as i64).unwrap() % 3 == 0)
        .count();
    let before = handler_reads(&mut conn).await;
    let found: Vec<mysql_async::Row> = conn
        .exec(
            PAID_CLOSED_AGAIN,
            params! { "ids" => serde_json::to_string(&chunk).unwrap(), "v" => voucher },
        )
        .await
        .unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(found.len(), expect, "paid payments of closed orders");
    assert!(
        examined <= 4 * chunk.len() as u64 + 10,
        "{} closes examined {examined} rows",
        chunk.len()
    );
    // A sale's end and whether anything awaits payment: the first such row answers.
    conn.exec_drop(
        "INSERT INTO vouchers (id, title, stock, stock_left, begins_at, ends_at) \
         VALUES (7, 't', 10, 10, NOW(3) - INTERVAL 2 HOUR, NOW(3) - INTERVAL 1 HOUR)",
        (),
    )
    .await
    .unwrap();
    let before = handler_reads(&mut conn).await;
    let end: Vec<(mysql_async::Value, i64, i64)> = conn
        .exec(SALE_END, params! { "v" => voucher })
        .await
        .unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(end.len(), 1);
    assert_eq!(end[0].1, 1, "orders await payment");
    assert!(examined <= 10, "the sale's end examined {examined} rows");
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

/// The payment deadline Redis holds for `user`'s `order` (its member in `deadlines`).
async fn deadline_of(ctx: &DrainCtx, v: VoucherId, order: &str, user: &str) -> Option<i64> {
    let k = VoucherKeys::new(v);
    let score: Option<f64> = ctx
        .conn()
        .zscore(&k.deadlines, format!("{order}\n{user}"))
        .await
        .unwrap();
    score.map(|s| s as i64)
}

/// Redis loses a payment sale while an order waits undrained: the repair gives that
/// order its deadline back (its admission's, read from the stream), so the provider's
/// payment pays it, never "no longer open" for an order the database then writes
/// open. An undrained entry of an order the database holds closed (written, its ack
/// lost in a crash) gets none: it would expire, and give its unit back, a second time.
#[tokio::test]
async fn after_a_repair_a_payment_pays_an_order_not_yet_drained() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 4, 600, false).await;
    let k = VoucherKeys::new(v.id);
    // cy's order is written, then cancelled, the close recorded.
    let cy = admitted(buy(&app, v.id, "cy").await);
    drain_until_settled(&ctx, v.id).await;
    assert_eq!(status(&cancel(&app, &cy, "cy").await), (200, "cancelled"));
    drain_until_settled(&ctx, v.id).await;
    // bo's waits undrained, and so does a copy of cy's entry, delivered to a drainer
    // that died before its ack.
    let bo = admitted(buy(&app, v.id, "bo").await);
    let bo_deadline = deadline_of(&ctx, v.id, &bo, "bo").await.expect("admitted");
    ctx.xadd_raw(v.id, &[("order_id", &cy), ("user_id", "cy")])
        .await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("drainers")
        .arg("died")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(&k.orders)
        .arg(">")
        .query_async(&mut ctx.conn())
        .await
        .unwrap();
    assert_eq!(ctx.pending(v.id).await, 2);

    // Redis loses the sale, its buyers and its deadlines; a read repairs it.
    let _: i64 = ctx
        .conn()
        .del(&[&k.sale, &k.buyers, &k.deadlines])
        .await
        .unwrap();
    let (st, body) = call(
        &app,
        request("GET", &format!("/vouchers/{}", v.id), None, None, None),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        deadline_of(&ctx, v.id, &bo, "bo").await,
        Some(bo_deadline),
        "the undrained order's deadline is back, as its admission wrote it"
    );
    assert_eq!(
        deadline_of(&ctx, v.id, &cy, "cy").await,
        None,
        "an order the database holds cancelled gets no deadline"
    );

    let res = pay(&app, &bo, "bo", "pi_bo").await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);
    drain_until_settled(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    let of = |order: &str| rows[&order.parse::<i64>().unwrap()].0.clone();
    assert_eq!((of(&bo).as_str(), of(&cy).as_str()), ("paid", "cancelled"));
    let p = Payments(&ctx.db().await)
        .get("pi_bo")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.outcome, Outcome::Paid);
    // Units: bo holds one; cy's came back once (3 in the database; Redis the same).
    assert_eq!(ctx.db_stock_left(v.id).await, 3);
    assert_eq!(redis_stock(&ctx, v.id).await, 3);
    ctx.cleanup().await;
}

/// The repair's look at which undrained orders the database holds, and in which status,
/// reads each by its primary key on a table never analysed: the rows it examines stay
/// about the ids it is given, however many orders the voucher and others have.
#[tokio::test]
async fn undrained_order_statuses_are_read_by_key_never_analysed() {
    use mysql_async::params;
    use seckill_shared::adapters::data_api::orders::ORDER_STATUSES;
    use seckill_tests::mysql::handler_reads;
    let ctx = DrainCtx::start().await;
    let mut conn = ctx.mysql().await;
    // 30,000 orders of three vouchers; the statuses of 1,000 ids of one (every other one
    // of them held by the database).
    for v in 1..=3i64 {
        let orders: Vec<(i64, String, &str)> = (0..10_000i64)
            .map(|i| {
                let id = 1 + 3 * i + (v - 1);
                let status = ["awaiting_payment", "paid", "expired"][(i % 3) as usize];
                (id, format!("buyer-{id}"), status)
            })
            .collect();
        for chunk in orders.chunks(2_000) {
            seckill_tests::mysql::insert_orders(&mut conn, v, chunk).await;
        }
    }
    let overhead = {
        let a = handler_reads(&mut conn).await;
        let b = handler_reads(&mut conn).await;
        b - a
    };
    let ids: Vec<i64> = (0..1_000i64)
        .map(|i| if i % 2 == 0 { 1 + 3 * i } else { 1_000_000 + i })
        .collect();
    let before = handler_reads(&mut conn).await;
    let found: Vec<(i64, String)> = conn
        .exec(
            ORDER_STATUSES,
            params! { "ids" => serde_json::to_string(&ids).unwrap(), "v" => 1 },
        )
        .await
        .unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(found.len(), 500);
    assert!(
        examined <= 4 * 1_000 + 10,
        "the statuses of 1,000 orders examined {examined} rows"
    );
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

/// The operators' commands on this test's Redis and database.
async fn operators(ctx: &DrainCtx) -> seckill_cli::ops::Backends {
    seckill_cli::ops::Backends::connect(&ctx.redis.config(), &ctx.data_api_config())
        .await
        .expect("backends")
}

/// Signed events the webhook cannot use as they are: fields it does not know are
/// ignored (the payment is applied), a currency in lower case is read; an event that
/// cannot be applied (a currency, payment id, order id or amount outside the accepted
/// form, another buyer's order, an order of a voucher without a payment step) is
/// recorded `refused` with the reason and answered `200` (the provider stops, the money
/// is listed for a refund), the same on every delivery; a `payment.failed` of that kind
/// is recorded `failed`. Only a body that is no payment event at all is a `400`.
#[tokio::test]
async fn signed_events_the_webhook_cannot_use_are_recorded_and_answered_200() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    use seckill_tests::harness::{deliver, provider_event};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 6, 600, false).await;
    let mut orders = HashMap::new();
    for user in ["fa", "gu", "hy", "io"] {
        orders.insert(user, admitted(buy(&app, v.id, user).await));
    }
    // Written: whose each order is, the database says (an undrained order Redis does
    // not show as the event's buyer's is waited for; see the test above).
    drain_until_settled(&ctx, v.id).await;
    let event = |order: &str, user: &str, payment: &str, amount: i64, currency: &str| {
        provider_event("payment.succeeded", order, user, payment, amount, currency)
    };
    let row = |payment: String| {
        let ctx = &ctx;
        async move {
            Payments(&ctx.db().await)
                .get(&payment)
                .await
                .unwrap()
                .expect("recorded")
        }
    };

    // Fields the webhook does not know, at both levels: ignored, the order paid.
    let extra = with_field(
        &event(
            &orders["fa"],
            "fa",
            "pay_fa",
            TEST_PRICE_MINOR,
            TEST_CURRENCY,
        ),
        &["livemode"],
        json!(true),
    );
    let extra = with_field(&extra, &["data", "metadata"], json!({"cart": "7"}));
    assert_eq!(outcome(&deliver(&app, &extra).await), (200, "paid"));
    // A currency in lower case (as Stripe writes it) is the same currency.
    let lower = event(
        &orders["gu"],
        "gu",
        "pay_gu",
        TEST_PRICE_MINOR,
        &TEST_CURRENCY.to_lowercase(),
    );
    assert_eq!(outcome(&deliver(&app, &lower).await), (200, "paid"));
    // An event id longer than the ledger keeps is recorded by a stand-in; it pays.
    let long_id = with_field(
        &event(
            &orders["io"],
            "io",
            "pay_io",
            TEST_PRICE_MINOR,
            TEST_CURRENCY,
        ),
        &["id"],
        json!("e".repeat(129)),
    );
    assert_eq!(outcome(&deliver(&app, &long_id).await), (200, "paid"));

    let hy = orders["hy"].clone();
    let plain = ctx.voucher(2, 2).await;
    let plain_order = admitted(buy(&app, plain.id, "jo").await);
    // (what, event, the voucher and order recorded, a word of the reason)
    let cases = [
        (
            "a currency of four letters",
            event(&hy, "hy", "pay_hy_euro", TEST_PRICE_MINOR, "EURO"),
            Some(v.id),
            Some(hy.clone()),
            "\"EURO\"",
        ),
        (
            "an amount with a fraction",
            with_field(
                &event(&hy, "hy", "pay_hy_half", TEST_PRICE_MINOR, TEST_CURRENCY),
                &["data", "amount_minor"],
                json!(1999.5),
            ),
            Some(v.id),
            Some(hy.clone()),
            "1999.5",
        ),
        (
            "a payment id outside the accepted form",
            event(&hy, "hy", "pay hy!", TEST_PRICE_MINOR, TEST_CURRENCY),
            Some(v.id),
            Some(hy.clone()),
            "\"pay hy!\"",
        ),
        (
            "an order id outside the accepted form",
            event(
                "12ab",
                "hy",
                "pay_hy_order",
                TEST_PRICE_MINOR,
                TEST_CURRENCY,
            ),
            None,
            None,
            "\"12ab\"",
        ),
        (
            "another buyer's order",
            event(&hy, "zed", "pay_zed", TEST_PRICE_MINOR, TEST_CURRENCY),
            Some(v.id),
            Some(hy.clone()),
            "not \"zed\"'s",
        ),
        (
            "a buyer no user id can be",
            event(&hy, "h\u{1}y", "pay_ctl", TEST_PRICE_MINOR, TEST_CURRENCY),
            Some(v.id),
            Some(hy.clone()),
            "no user id",
        ),
        (
            "an order of a voucher without a payment step",
            event(
                &plain_order,
                "jo",
                "pay_jo",
                TEST_PRICE_MINOR,
                TEST_CURRENCY,
            ),
            Some(plain.id),
            Some(plain_order.clone()),
            "takes no payment",
        ),
    ];
    let mut refused_of_v = 0;
    for (what, body, voucher, order, word) in cases {
        let res = deliver(&app, &body).await;
        assert_eq!(outcome(&res), (200, "refused"), "{what}: {}", res.1);
        let reason = res.1["reason"].as_str().unwrap_or("");
        assert!(reason.contains(word), "{what}: {reason}");
        assert_eq!(
            res.1.get("order_id").and_then(Value::as_str),
            order.as_deref(),
            "{what}"
        );
        let payment = res.1["payment_id"].as_str().unwrap().to_string();
        let p = row(payment.clone()).await;
        assert_eq!(
            (p.outcome, p.voucher, p.order.map(|o| o.to_string())),
            (Outcome::Refused, voucher, order),
            "{what}"
        );
        refused_of_v += usize::from(voucher == Some(v.id));
        // Delivered again: the same answer, one row.
        assert_eq!(deliver(&app, &body).await, res, "{what}");
        if what.starts_with("a payment id") {
            assert!(payment.starts_with('#') && payment.len() == 65, "{payment}");
        }
    }
    assert_eq!(
        row("pay_hy_euro".into()).await.currency,
        seckill_shared::webhook::NO_CURRENCY
    );
    // A failed attempt of that kind took no money: recorded failed, nothing to refund.
    let failed = provider_event(
        "payment.failed",
        &hy,
        "hy",
        "pay_hy_failed",
        TEST_PRICE_MINOR,
        "€€€",
    );
    assert_eq!(outcome(&deliver(&app, &failed).await), (200, "failed"));
    // No payment event at all: refused, nothing recorded.
    for body in [
        "[1, 2]".to_string(),
        event(&hy, "hy", "pay_hy_x", TEST_PRICE_MINOR, TEST_CURRENCY)
            .replace("payment.succeeded", "payment.refunded"),
    ] {
        assert_eq!(code(&deliver(&app, &body).await), (400, "invalid_request"));
    }
    assert!(
        Payments(&ctx.db().await)
            .get("pay_hy_x")
            .await
            .unwrap()
            .is_none()
    );

    // hy's order is still open, and every refusal is listed for the operators.
    assert_eq!(
        status(&get_order(&app, &hy, "hy").await),
        (200, "awaiting_payment")
    );
    assert_eq!(refunds_due(&app, v.id).await, refused_of_v as i64);
    let b = operators(&ctx).await;
    let r = seckill_cli::ops::reconcile::reconcile(&b, v.id, false)
        .await
        .unwrap();
    assert_eq!(r.refunds_due.len(), refused_of_v);
    assert_eq!(r.unmatched_payments.len(), 1, "{:?}", r.unmatched_payments);
    assert_eq!(r.unmatched_payments[0].payment_id, "pay_hy_order");
    let text = seckill_cli::ops::status::render_unmatched(
        seckill_cli::ops::status::unmatched_refunds(&b)
            .await
            .unwrap(),
    );
    assert!(
        text.contains("payments of no known order to refund: 1"),
        "{text}"
    );
    drain_until_settled(&ctx, v.id).await;
    let rows = status_counts(&ctx, v.id).await;
    assert_eq!(
        (count(&rows, "paid"), count(&rows, "awaiting_payment")),
        (3, 1),
        "{rows:?}"
    );
    ctx.cleanup().await;
}

/// The queries behind the operators' list of payments of no voucher read through their
/// index on a table never analysed: the rows they examine stay about the rows they
/// return, however many payments vouchers have.
#[tokio::test]
async fn payments_of_no_voucher_are_read_through_their_index_never_analysed() {
    use mysql_async::params;
    use seckill_shared::adapters::payments::{NO_VOUCHER_COUNTS_SQL, no_voucher_list_sql};
    use seckill_tests::mysql::{PaymentRow, handler_reads};
    let ctx = DrainCtx::start().await;
    let mut conn = ctx.mysql().await;
    let outcomes = ["received", "paid", "refund_due", "failed", "refused"];
    // 20,000 payments over 200 vouchers, one in fifty of no voucher.
    let rows: Vec<PaymentRow<Option<u64>, Option<u64>>> = (0..20_000u64)
        .map(|i| {
            let voucher = (i % 50 != 0).then_some(1 + (i * 7_919) % 200);
            let order = (i % 100 != 0).then_some(1_000_000 + i);
            (
                format!("pay_{i:06}"),
                order,
                voucher,
                outcomes[((i / 7) % 5) as usize],
                0,
            )
        })
        .collect();
    seckill_tests::mysql::insert_payments(&mut conn, &rows).await;
    let overhead = {
        let a = handler_reads(&mut conn).await;
        let b = handler_reads(&mut conn).await;
        b - a
    };
    let unmatched = rows.iter().filter(|r| r.2.is_none()).count() as u64;
    for outcome in ["refused", "refund_due"] {
        let matching = rows
            .iter()
            .filter(|r| r.2.is_none() && r.3 == outcome)
            .count() as u64;
        let before = handler_reads(&mut conn).await;
        let got: Vec<mysql_async::Row> = conn
            .exec(no_voucher_list_sql(), params! { "outcome" => outcome })
            .await
            .unwrap();
        let examined = handler_reads(&mut conn).await - before - overhead;
        assert_eq!(got.len() as u64, matching, "{outcome}");
        assert!(
            examined <= 2 * matching + 10,
            "listing {matching} {outcome} payments of no voucher examined {examined} rows"
        );
    }
    let before = handler_reads(&mut conn).await;
    let counts: Vec<(String, u64)> = conn.query(NO_VOUCHER_COUNTS_SQL).await.unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(counts.iter().map(|(_, n)| n).sum::<u64>(), unmatched);
    assert!(
        examined <= 2 * unmatched + 10,
        "counting {unmatched} payments of no voucher examined {examined} rows"
    );
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

/// The provider's payment for an order whose id's lease record Redis lost (so no lookup
/// can place it until it is drained): `503` while it may still be drained, never a
/// `404` that ends the provider's resending; once written, the same event pays it. An
/// order id nobody has, paid longer ago than the webhook waits, is recorded `refused`
/// without a voucher, and the operators' `status` and `reconcile` list it.
#[tokio::test]
async fn a_payment_for_an_order_whose_lease_record_is_lost_waits_then_is_recorded() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    use seckill_shared::keys::IdKeys;
    use seckill_shared::order_id::{EPOCH_UNIX_MS, Lease, OrderIdParts, day_name};
    use seckill_tests::harness::{deliver, provider_event};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 4, 600, false).await;
    let eve = admitted(buy(&app, v.id, "eve").await);
    let parts = OrderIdParts::of(eve.parse().unwrap());
    let blocks = IdKeys::for_day(&day_name(parts.day())).blocks;
    let lost: i64 = ctx.conn().hdel(&blocks, parts.block_field()).await.unwrap();
    assert_eq!(lost, 1, "the lease record was there");
    let fresh = app_of(&ctx).await;
    let res = pay(&fresh, &eve, "eve", "pi_eve").await;
    assert_eq!(code(&res), (503, "unavailable"), "{}", res.1);
    let db = ctx.db().await;
    assert!(Payments(&db).get("pi_eve").await.unwrap().is_none());
    drain_until_settled(&ctx, v.id).await;
    let res = pay(&fresh, &eve, "eve", "pi_eve").await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);

    // An id of a lease seven hours ago that no record names, paid as long ago.
    let then = now_millis() - 7 * 3_600_000;
    let ghost = Lease::new(then - EPOCH_UNIX_MS, 9)
        .unwrap()
        .id(5)
        .unwrap()
        .to_string();
    let paid_then = |payment: &str| {
        let body = provider_event(
            "payment.succeeded",
            &ghost,
            "eve",
            payment,
            TEST_PRICE_MINOR,
            TEST_CURRENCY,
        );
        with_field(&body, &["created"], json!(then / 1000))
    };
    let res = deliver(&fresh, &paid_then("pi_ghost")).await;
    assert_eq!(outcome(&res), (200, "refused"), "{}", res.1);
    assert_eq!(res.1["order_id"], ghost.as_str());
    assert!(
        res.1["reason"].as_str().unwrap().contains("no order"),
        "{}",
        res.1
    );
    let p = Payments(&db).get("pi_ghost").await.unwrap().unwrap();
    assert_eq!(
        (p.outcome, p.voucher, p.order.map(|o| o.to_string())),
        (Outcome::Refused, None, Some(ghost.clone()))
    );
    // Delivered again: the same answer, the same row.
    let again = deliver(&fresh, &paid_then("pi_ghost")).await;
    assert_eq!(again, res);
    // The same id paid just now may still be drained: not decided yet.
    let now_body = provider_event(
        "payment.succeeded",
        &ghost,
        "eve",
        "pi_ghost_now",
        TEST_PRICE_MINOR,
        TEST_CURRENCY,
    );
    assert_eq!(
        code(&deliver(&fresh, &now_body).await),
        (503, "unavailable")
    );

    let b = operators(&ctx).await;
    assert_eq!(
        seckill_cli::ops::status::unmatched_refunds(&b)
            .await
            .unwrap(),
        1
    );
    let r = seckill_cli::ops::reconcile::reconcile(&b, v.id, false)
        .await
        .unwrap();
    let listed: Vec<&str> = r
        .unmatched_payments
        .iter()
        .map(|p| p.payment_id.as_str())
        .collect();
    assert_eq!(listed, ["pi_ghost"]);
    let text = seckill_cli::ops::reconcile::render(&r);
    assert!(text.contains("pi_ghost of order"), "{text}");
    ctx.cleanup().await;
}

/// An order Redis shows neither open nor closed (no close, no deadline: a repair that
/// did not restore it, or has not yet) and the database does not hold: while it waits
/// in its stream the provider's payment is answered `503` (recorded, undecided), never
/// `refund_due`; once the drainer wrote it (and gave it its deadline back) the same
/// event pays it. An order no stream holds any more (acked unwritten: dead-lettered) is
/// decided at once.
#[tokio::test]
async fn a_payment_for_an_order_redis_shows_neither_open_nor_closed_waits_for_its_drain() {
    use seckill_shared::adapters::payments::{Outcome, Payments};
    let ctx = DrainCtx::start().await;
    let app = app_of(&ctx).await;
    let v = pay_voucher(&ctx, 4, 600, false).await;
    let k = VoucherKeys::new(v.id);
    let dot = admitted(buy(&app, v.id, "dot").await);
    let _: i64 = ctx
        .conn()
        .zrem(&k.deadlines, format!("{dot}\ndot"))
        .await
        .unwrap();
    let ledger = |payment: &'static str| {
        let ctx = &ctx;
        async move {
            Payments(&ctx.db().await)
                .get(payment)
                .await
                .unwrap()
                .map(|p| p.outcome)
        }
    };
    for _ in 0..2 {
        let res = pay(&app, &dot, "dot", "pi_dot").await;
        assert_eq!(code(&res), (503, "unavailable"), "{}", res.1);
    }
    assert_eq!(ledger("pi_dot").await, Some(Outcome::Received));
    quick_drain(&ctx).await;
    assert!(deadline_of(&ctx, v.id, &dot, "dot").await.is_some());
    let res = pay(&app, &dot, "dot", "pi_dot").await;
    assert_eq!(outcome(&res), (200, "paid"), "{}", res.1);

    // Acked unwritten, as a dead letter is: no stream holds it, nothing will write it.
    let gil = admitted(buy(&app, v.id, "gil").await);
    let _: i64 = ctx
        .conn()
        .zrem(&k.deadlines, format!("{gil}\ngil"))
        .await
        .unwrap();
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("drainers")
        .arg("dead-letterer")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(&k.orders)
        .arg(">")
        .query_async(&mut ctx.conn())
        .await
        .unwrap();
    let ids: Vec<String> = read.keys[0].ids.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids.len(), 1);
    let _: i64 = ctx.conn().xack(&k.orders, "drainers", &ids).await.unwrap();
    let res = pay(&app, &gil, "gil", "pi_gil").await;
    assert_eq!(outcome(&res), (200, "refund_due"), "{}", res.1);
    assert_eq!(res.1["reason"], "the order is no longer open");
    ctx.cleanup().await;
}

/// With `rebuy_after_close`, a buyer's unpaid closes are bounded (`rebuy_limit`, 2 by
/// default): two cancels leave alice free to buy again, the third order is hers for good
/// (`already_purchased` names it), while others buy on. The bound outlives Redis: after
/// the drainer wrote the closes and Redis lost every key of the sale, the repair keeps
/// alice refused and lets carol, with one cancel, buy again.
#[tokio::test]
async fn cancels_and_rebuys_are_bounded_per_buyer_also_after_redis_loses_the_sale() {
    let ctx = DrainCtx::start().await;
    let v = pay_voucher(&ctx, 5, 600, true).await;
    assert_eq!(
        v.payment.map(|p| p.rebuy_limit),
        Some(seckill_shared::domain::DEFAULT_REBUY_LIMIT)
    );
    let app = app_of(&ctx).await;
    let mut last = String::new();
    for round in 0..3 {
        last = buy_pending(&app, v.id, "alice").await;
        assert_eq!(
            status(&cancel(&app, &last, "alice").await),
            (200, "cancelled"),
            "round {round}"
        );
    }
    let refused = buy(&app, v.id, "alice").await;
    assert_eq!(code(&refused), (409, "already_purchased"), "{}", refused.1);
    assert_eq!(refused.1["order_id"], json!(last));
    let carol = buy_pending(&app, v.id, "carol").await;
    assert_eq!(
        status(&cancel(&app, &carol, "carol").await),
        (200, "cancelled")
    );
    buy_pending(&app, v.id, "bob").await;

    drain_until_settled(&ctx, v.id).await;
    let k = VoucherKeys::new(v.id);
    let _: i64 = ctx.conn().del(&k.all()[..]).await.unwrap();
    let other = app_of(&ctx).await;
    let refused = buy(&other, v.id, "alice").await;
    assert_eq!(code(&refused), (409, "already_purchased"), "{}", refused.1);
    assert_eq!(
        refused.1["order_id"],
        json!(last),
        "the repair kept alice's last order"
    );
    buy_pending(&other, v.id, "carol").await;
    let again = buy(&other, v.id, "bob").await;
    assert_eq!(code(&again), (409, "already_purchased"), "{}", again.1);
    ctx.cleanup().await;
}

//! Repair after Redis lost a sale, through seckill-http's real
//! handler, a private cluster-mode redis-server, a fresh MariaDB database behind the Data
//! API server, and the real drainer in process.
//!
//! Each test admits buyers, drains some of them, makes Redis lose the sale (the sale hash
//! alone, the sale and buyers hashes, or everything with FLUSHALL), and then checks what
//! the repair that the next request runs must guarantee: every past buyer hears
//! `already_purchased` (not a new 202), Redis stock never exceeds the database's
//! `stock_left` minus the admitted orders not yet drained, every 202 after the repair ends
//! `confirmed` after a drain (none `rejected`), and the caller's order is found by
//! (voucher, user) as well as by id.

use std::collections::BTreeMap;

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use seckill_http::App;
use seckill_shared::domain::{OrderId, Voucher, VoucherId};
use seckill_shared::keys::VoucherKeys;
use seckill_tests::drainer::DrainCtx;
use seckill_tests::harness::{buy, call, request, test_http_config, token};
use seckill_tests::mysql::{handler_reads, insert_orders};
use serde_json::Value;

fn http_config(ctx: &DrainCtx) -> seckill_http::Config {
    test_http_config(ctx.redis.config(), ctx.data_api_config())
}

/// Buys as `user` and expects a 202; returns the order id.
async fn admitted(app: &App, voucher: VoucherId, user: &str) -> OrderId {
    let (status, body) = buy(app, voucher, user).await;
    assert_eq!(status, 202, "{user}: {body}");
    body["order_id"].as_str().unwrap().parse().unwrap()
}

async fn get(app: &App, path: &str, user: &str) -> (u16, Value) {
    call(
        app,
        request("GET", path, Some(&token(user, false)), None, None),
    )
    .await
}

/// `GET /vouchers/{id}/order` as `user`: (order id, status), or None on 404.
async fn order_of(app: &App, voucher: VoucherId, user: &str) -> Option<(OrderId, String)> {
    let (status, body) = get(app, &format!("/vouchers/{voucher}/order"), user).await;
    match status {
        200 => {
            assert_eq!(body["voucher_id"], voucher.to_string(), "{body}");
            Some((
                body["order_id"].as_str().unwrap().parse().unwrap(),
                body["status"].as_str().unwrap().to_string(),
            ))
        }
        404 => {
            assert_eq!(body["code"], "not_found", "{body}");
            None
        }
        other => panic!("GET /vouchers/{voucher}/order as {user}: {other} {body}"),
    }
}

/// `GET /orders/{id}` as `user`: the status, or None on 404.
async fn status_of(app: &App, order: OrderId, user: &str) -> Option<String> {
    let (status, body) = get(app, &format!("/orders/{order}"), user).await;
    match status {
        200 => Some(body["status"].as_str().unwrap().to_string()),
        404 => None,
        other => panic!("GET /orders/{order} as {user}: {other} {body}"),
    }
}

fn assert_code(res: (u16, Value), status: u16, code: &str, who: &str) {
    assert_eq!(
        (res.0, res.1["code"].as_str()),
        (status, Some(code)),
        "{who}: {}",
        res.1
    );
}

/// Runs the drainer in process until nothing is pending or undelivered; panics on a
/// drain error.
async fn drain_all(ctx: &DrainCtx, v: VoucherId) {
    for _ in 0..5 {
        let summary = ctx.drain(ctx.drainer_config()).await;
        assert_eq!(summary.errors, 0, "{summary:?}");
        if summary.pending == 0 && summary.lag == 0 && ctx.pending(v).await == 0 {
            return;
        }
    }
    panic!("voucher {v} did not drain in 5 runs");
}

/// The voucher's order rows by status.
fn by_status(rows: &BTreeMap<i64, (String, Option<String>)>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (status, _) in rows.values() {
        *out.entry(status.clone()).or_default() += 1;
    }
    out
}

async fn lose(ctx: &DrainCtx, v: VoucherId, keys: &[&str]) {
    let k = VoucherKeys::new(v);
    let names: Vec<&str> = keys
        .iter()
        .map(|name| match *name {
            "sale" => k.sale.as_str(),
            "buyers" => k.buyers.as_str(),
            "orders" => k.orders.as_str(),
            other => panic!("no key {other}"),
        })
        .collect();
    let _: i64 = ctx.conn().del(&names).await.unwrap();
}

/// The sale and buyers hashes are lost, the stream survives with two undrained orders:
/// the repair rebuilds the buyers from the database and the stream, and holds back the
/// stock of the undrained orders.
#[tokio::test]
async fn a_lost_sale_and_buyers_hash_are_rebuilt_and_undrained_orders_keep_their_stock() {
    let ctx = DrainCtx::start().await;
    let v: Voucher = ctx.voucher(10, 10).await;
    let app = App::new(&http_config(&ctx)).await;

    let mut orders = BTreeMap::new();
    for i in 0..4 {
        let user = format!("drained-{i}");
        orders.insert(user.clone(), admitted(&app, v.id, &user).await);
    }
    drain_all(&ctx, v.id).await;
    assert_eq!(ctx.db_stock_left(v.id).await, 6);
    for i in 0..2 {
        let user = format!("pending-{i}");
        orders.insert(user.clone(), admitted(&app, v.id, &user).await);
    }

    lose(&ctx, v.id, &["sale", "buyers"]).await;
    // A fresh instance (no memory of the sale) sees it first.
    let other = App::new(&http_config(&ctx)).await;
    for user in orders.keys() {
        assert_code(
            buy(&other, v.id, user).await,
            409,
            "already_purchased",
            user,
        );
    }
    // Database stock 6, two admitted orders not drained: 4 may still be sold.
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(4));
    let k = VoucherKeys::new(v.id);
    let buyers: BTreeMap<String, i64> = ctx.conn().hgetall(&k.buyers).await.unwrap();
    let want: BTreeMap<String, i64> = orders.iter().map(|(u, o)| (u.clone(), o.get())).collect();
    assert_eq!(buyers, want, "the buyers hash holds every past order");

    // Lookups by (voucher, user): drained ones confirmed, undrained ones pending.
    for (user, order) in &orders {
        let want = if user.starts_with("drained") {
            "confirmed"
        } else {
            "pending"
        };
        assert_eq!(
            order_of(&other, v.id, user).await,
            Some((*order, want.to_string())),
            "{user}"
        );
    }
    assert_eq!(order_of(&other, v.id, "stranger").await, None);

    let mut after = Vec::new();
    for i in 0..6 {
        let user = format!("after-{i}");
        let res = buy(&other, v.id, &user).await;
        if i < 4 {
            assert_eq!(res.0, 202, "{user}: {}", res.1);
            after.push((user, res.1["order_id"].as_str().unwrap().parse().unwrap()));
        } else {
            assert_code(res, 409, "sold_out", &user);
        }
    }
    drain_all(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        by_status(&rows),
        BTreeMap::from([("confirmed".to_string(), 10)]),
        "{rows:?}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    let everyone = after.iter().cloned().chain(orders.clone());
    for (user, order) in everyone {
        let (user, order) = (&user, &order);
        assert_eq!(
            status_of(&other, *order, user).await.as_deref(),
            Some("confirmed"),
            "{user}"
        );
        assert_eq!(
            order_of(&other, v.id, user).await,
            Some((*order, "confirmed".to_string()))
        );
        // Nobody else sees it.
        assert_eq!(status_of(&other, *order, "stranger").await, None);
    }
    assert!(ctx.dead_letters(v.id).await.is_empty());
    ctx.cleanup().await;
}

/// Before anything repairs it (no purchase came since the loss, or the sale is over and
/// is never repaired), a lost sale cannot tell a pending order from an unknown one: its
/// buyer hears `503` and asks again, never a `404` for an order the drainer will write;
/// a drained order is the database's word throughout, and once the drainer wrote the
/// pending one it is found again, and a caller with no order is told so again.
#[tokio::test]
async fn before_its_repair_a_lost_sale_never_answers_not_found_for_a_pending_order() {
    let ctx = DrainCtx::start().await;
    let v: Voucher = ctx.voucher(10, 10).await;
    let app = App::new(&http_config(&ctx)).await;
    let drained = admitted(&app, v.id, "early").await;
    drain_all(&ctx, v.id).await;
    let pending = admitted(&app, v.id, "late").await;

    lose(&ctx, v.id, &["sale", "buyers"]).await;
    let other = App::new(&http_config(&ctx)).await;
    for app in [&app, &other] {
        let by_id = get(app, &format!("/orders/{pending}"), "late").await;
        assert_code(by_id, 503, "unavailable", "late, by id");
        let by_voucher = get(app, &format!("/vouchers/{}/order", v.id), "late").await;
        assert_code(by_voucher, 503, "unavailable", "late, by voucher");
        assert_eq!(
            status_of(app, drained, "early").await.as_deref(),
            Some("confirmed")
        );
        assert_eq!(
            order_of(app, v.id, "early").await,
            Some((drained, "confirmed".to_string()))
        );
    }

    drain_all(&ctx, v.id).await;
    assert_eq!(
        status_of(&other, pending, "late").await.as_deref(),
        Some("confirmed")
    );
    assert_eq!(
        order_of(&other, v.id, "late").await,
        Some((pending, "confirmed".to_string()))
    );
    assert_eq!(status_of(&other, pending, "stranger").await, None);
    // Drained (the stream keeps its last entry, nothing waits in it): not found is the
    // truth again for whoever holds no order, with the sale still unrepaired.
    let k = VoucherKeys::new(v.id);
    let left: u64 = ctx.conn().xlen(&k.orders).await.unwrap();
    assert!(left > 0, "the drained stream is still there");
    assert_eq!(order_of(&other, v.id, "stranger").await, None);
    assert_eq!(order_of(&app, v.id, "stranger").await, None);
    ctx.cleanup().await;
}

/// Only the sale hash is lost (the buyers hash and the stream survive): the stock is the
/// database's minus the undrained orders, not the database's.
#[tokio::test]
async fn a_lost_sale_hash_alone_never_reopens_more_than_the_database_stock_minus_pending() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(6, 6).await;
    let app = App::new(&http_config(&ctx)).await;
    admitted(&app, v.id, "a").await;
    admitted(&app, v.id, "b").await;
    drain_all(&ctx, v.id).await;
    let pending = [
        admitted(&app, v.id, "c").await,
        admitted(&app, v.id, "d").await,
    ];
    lose(&ctx, v.id, &["sale"]).await;

    // GET /vouchers/{id} repairs too, and shows the live stock.
    let (status, body) = call(
        &app,
        request("GET", &format!("/vouchers/{}", v.id), None, None, None),
    )
    .await;
    assert_eq!(
        (status, body["stock_left"].as_i64()),
        (200, Some(2)),
        "{body}"
    );
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(2));
    assert_eq!(order_of(&app, v.id, "c").await.unwrap().0, pending[0]);
    admitted(&app, v.id, "e").await;
    admitted(&app, v.id, "f").await;
    assert_code(buy(&app, v.id, "g").await, 409, "sold_out", "g");
    drain_all(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        by_status(&rows),
        BTreeMap::from([("confirmed".to_string(), 6)]),
        "{rows:?}"
    );
    ctx.cleanup().await;
}

/// A sale of five that ended five seconds ago (clearly over, by any clock within the
/// skew bound) and whose sale, buyers and stream Redis no longer has.
async fn past_sale_gone_from_redis(ctx: &DrainCtx) -> Voucher {
    let v = ctx
        .voucher_at(5, seckill_shared::domain::now_millis() - 3_605_000)
        .await;
    lose(ctx, v.id, &["sale", "buyers", "orders"]).await;
    v
}

/// A sale that has ended and left Redis (retired after its retention, or lost) is read
/// from the database alone: an anonymous `GET /vouchers/{id}` answers its stock and never
/// starts a repair (which would read all its orders for anyone who asks, past sale after
/// past sale, their ids being sequential).
#[tokio::test]
async fn reading_a_sale_that_ended_and_left_redis_never_repairs_it() {
    let ctx = DrainCtx::start().await;
    let v = past_sale_gone_from_redis(&ctx).await;
    let app = App::new(&http_config(&ctx)).await;
    for _ in 0..3 {
        let (status, body) = call(
            &app,
            request("GET", &format!("/vouchers/{}", v.id), None, None, None),
        )
        .await;
        assert_eq!(
            (status, body["stock_left"].as_i64()),
            (200, Some(v.db_stock_left)),
            "{body}"
        );
    }
    assert_eq!(
        ctx.sales.stock_left(v.id).await.unwrap(),
        None,
        "not reopened"
    );
    let k = VoucherKeys::new(v.id);
    let exists: i64 = ctx
        .conn()
        .exists(&[k.sale.as_str(), k.buyers.as_str()])
        .await
        .unwrap();
    assert_eq!(exists, 0, "nothing written back");
    ctx.cleanup().await;
}

/// The same past sale asked for by a signed-in user, on every route that finds a sale
/// missing (a purchase, joining and looking at the waiting room): `409 ended` (a look
/// at the gone queue `404`), and
/// nothing is reopened or read back into Redis (a repair there would read every order
/// of any past sale for anyone with an account).
#[tokio::test]
async fn buying_or_queueing_for_a_sale_that_ended_and_left_redis_never_repairs_it() {
    let ctx = DrainCtx::start().await;
    let v = past_sale_gone_from_redis(&ctx).await;
    // Retired, as the drainer leaves a past sale.
    let _: i64 = ctx
        .conn()
        .srem(seckill_shared::keys::ACTIVE_VOUCHERS, v.id.get())
        .await
        .unwrap();
    for (method, path, status, code) in [
        ("POST", format!("/vouchers/{}/seckill", v.id), 409, "ended"),
        ("POST", format!("/vouchers/{}/queue", v.id), 409, "ended"),
        // Looking at one's place: the queue is gone with the sale.
        ("GET", format!("/vouchers/{}/queue", v.id), 404, "not_found"),
    ] {
        // A fresh instance each time: nothing learned by an earlier call helps.
        let app = App::new(&http_config(&ctx)).await;
        let res = call(
            &app,
            request(method, &path, Some(&token("late", false)), None, None),
        )
        .await;
        assert_code(res, status, code, &format!("{method} {path}"));
    }
    let k = VoucherKeys::new(v.id);
    let exists: i64 = ctx
        .conn()
        .exists(&[k.sale.as_str(), k.buyers.as_str()])
        .await
        .unwrap();
    assert_eq!(exists, 0, "nothing written back");
    let active: bool = ctx
        .conn()
        .sismember(seckill_shared::keys::ACTIVE_VOUCHERS, v.id.get())
        .await
        .unwrap();
    assert!(!active, "not put back among the sales the drainer visits");
    ctx.cleanup().await;
}

/// Redis loses everything (FLUSHALL: sale, buyers, stream, the active set, the order-id
/// leases): the drained buyers come back from the database, the stock is the database's,
/// and orders bought afterwards (whose ids' lease records are gone too) are found by
/// (voucher, user) while pending and by id once drained.
#[tokio::test]
async fn after_redis_lost_everything_past_buyers_are_refused_and_new_orders_confirmed() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(8, 8).await;
    let app = App::new(&http_config(&ctx)).await;
    let mut past = Vec::new();
    for i in 0..5 {
        let user = format!("early-{i}");
        past.push((user.clone(), admitted(&app, v.id, &user).await));
    }
    drain_all(&ctx, v.id).await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut ctx.conn())
        .await
        .unwrap();

    for (user, order) in &past {
        assert_code(buy(&app, v.id, user).await, 409, "already_purchased", user);
        assert_eq!(
            order_of(&app, v.id, user).await,
            Some((*order, "confirmed".to_string()))
        );
        assert_eq!(
            status_of(&app, *order, user).await.as_deref(),
            Some("confirmed")
        );
    }
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(3));
    let mut late = Vec::new();
    for i in 0..4 {
        let user = format!("late-{i}");
        let res = buy(&app, v.id, &user).await;
        if i < 3 {
            assert_eq!(res.0, 202, "{user}: {}", res.1);
            let order: OrderId = res.1["order_id"].as_str().unwrap().parse().unwrap();
            assert_eq!(
                order_of(&app, v.id, &user).await,
                Some((order, "pending".to_string()))
            );
            late.push((user, order));
        } else {
            assert_code(res, 409, "sold_out", &user);
        }
    }
    // The repair registered the voucher for the drainer again.
    drain_all(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        by_status(&rows),
        BTreeMap::from([("confirmed".to_string(), 8)]),
        "{rows:?}"
    );
    for (user, order) in &late {
        assert_eq!(
            status_of(&app, *order, user).await.as_deref(),
            Some("confirmed")
        );
    }
    ctx.cleanup().await;
}

/// Many instances meet the lost sale at once, past buyers and new ones mixed: repairs
/// run concurrently with each other and with the admissions that follow the first one.
/// No past buyer is admitted again, and no more is admitted than the stock allows.
#[tokio::test]
async fn concurrent_repairs_and_admissions_after_a_loss_admit_exactly_the_stock_left() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(40, 40).await;
    let app = App::new(&http_config(&ctx)).await;
    let mut past = Vec::new();
    for i in 0..10 {
        past.push(format!("old-{i}"));
        admitted(&app, v.id, &past[i]).await;
    }
    drain_all(&ctx, v.id).await;
    for i in 10..15 {
        past.push(format!("old-{i}"));
        admitted(&app, v.id, &past[i]).await;
    }
    // 30 in the database, 5 pending: 25 may still be sold.
    lose(&ctx, v.id, &["sale", "buyers"]).await;
    let instances: Vec<App> = futures::future::join_all((0..4).map(|_| {
        let cfg = http_config(&ctx);
        async move { App::new(&cfg).await }
    }))
    .await;
    let mut users: Vec<String> = (0..40).map(|i| format!("new-{i}")).collect();
    users.extend(past.iter().cloned());
    let results: Vec<(String, (u16, Value))> = futures::stream::iter(users.iter().enumerate())
        .map(|(i, user)| {
            let app = &instances[i % instances.len()];
            async move { (user.clone(), buy(app, v.id, user).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut new_admitted = 0;
    for (user, (status, body)) in &results {
        if user.starts_with("old") {
            // Never admitted again. Once the stock is gone, an instance that saw the
            // sell-out answers `sold_out` from memory without looking the buyer up.
            assert!(
                *status == 409
                    && (body["code"] == "already_purchased" || body["code"] == "sold_out"),
                "{user}: {status} {body}"
            );
        } else if *status == 202 {
            new_admitted += 1;
        } else {
            assert_code((*status, body.clone()), 409, "sold_out", user);
        }
    }
    // 40 new buyers for 25 units: exactly 25 admitted, never more.
    assert_eq!(new_admitted, 25);
    drain_all(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        by_status(&rows),
        BTreeMap::from([("confirmed".to_string(), 15 + new_admitted)]),
        "{rows:?}"
    );
    ctx.cleanup().await;
}

/// The orders are read back in pages that fit the Data API's 1 MiB response limit (the
/// local server enforces it): 4,500 orders with the longest, most escaped user ids.
#[tokio::test]
async fn repair_reads_thousands_of_orders_in_pages_within_the_response_limit() {
    const ROWS: usize = 4_500;
    let ctx = DrainCtx::start().await;
    // Known to the database only (as if Redis had lost it long ago).
    let v = ctx.voucher(5_000, 500).await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut ctx.conn())
        .await
        .unwrap();
    // 64 bytes each, half of them quotes and backslashes that JSON escapes.
    let user = |i: usize| format!("{i:0>8}{}", "\"\\".repeat(28));
    let mut conn = ctx.mysql().await;
    let rows: Vec<(i64, String, &str)> = (0..ROWS)
        .map(|i| (1_000_000 + i as i64, user(i), "confirmed"))
        .collect();
    for chunk in rows.chunks(500) {
        insert_orders(&mut conn, v.id.get(), chunk).await;
    }
    conn.disconnect().await.ok();

    let app = App::new(&http_config(&ctx)).await;
    assert_code(
        buy(&app, v.id, &user(ROWS - 1)).await,
        409,
        "already_purchased",
        "the last buyer",
    );
    let k = VoucherKeys::new(v.id);
    let buyers: usize = ctx.conn().hlen(&k.buyers).await.unwrap();
    assert_eq!(buyers, ROWS);
    let held: Option<i64> = ctx.conn().hget(&k.buyers, user(2_000)).await.unwrap();
    assert_eq!(held, Some(1_002_000));
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(500));
    ctx.cleanup().await;
}

/// A repair is bounded and resumable: with parts of 2,500 rows, a lost sale of 9,000
/// orders is read back over several requests, each reading at most its part (plus the
/// rest of its last page) and answering `503` until the last, which reopens the sale.
/// A part cut off mid-way (its Lambda killed; its lock then expires) loses at most the
/// page it was reading: the next request goes on from the progress saved after every
/// page. Nobody is lost, nothing is read twice but one buyer per part, and the reopened
/// stock is the database's.
#[tokio::test]
async fn a_repair_reads_in_bounded_parts_and_goes_on_after_a_part_dies() {
    const ORDERS: usize = 9_000;
    const PART: u64 = 2_500;
    let page = seckill_shared::adapters::data_api::SNAPSHOT_PAGE_ROWS as u64;
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10_000, 1_000).await;
    let user = |i: usize| format!("buyer-{i:05}");
    let mut conn = ctx.mysql().await;
    let rows: Vec<(i64, String, &str)> = (0..ORDERS)
        .map(|i| (2_000_000 + i as i64, user(i), "confirmed"))
        .collect();
    for chunk in rows.chunks(1_000) {
        insert_orders(&mut conn, v.id.get(), chunk).await;
    }
    conn.disconnect().await.ok();
    lose(&ctx, v.id, &["sale", "buyers", "orders"]).await;
    let mut cfg = http_config(&ctx);
    cfg.repair_part_rows = PART;
    let (one, two) = (App::new(&cfg).await, App::new(&cfg).await);
    let k = VoucherKeys::new(v.id);
    let progress = || async {
        let record: Option<String> = ctx.conn().get(&k.repair_progress).await.unwrap();
        record.map(|r| serde_json::from_str::<seckill_http::repair::Progress>(&r).unwrap())
    };

    // Part 1: two pages (4,000 rows >= 2,500), then 503 and the progress saved.
    let (status, body) = buy(&one, v.id, "newcomer").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    let p1 = progress().await.expect("progress saved");
    println!("after part 1: {p1:?}");
    assert_eq!(p1.parts, 1);
    assert!(p1.rows >= PART && p1.rows <= PART + page, "{p1:?}");
    assert_eq!(
        ctx.sales.stock_left(v.id).await.unwrap(),
        None,
        "not reopened yet"
    );
    let lock: bool = ctx.conn().exists(&k.repair).await.unwrap();
    assert!(!lock, "a part ends by releasing the lock");

    // Part 2 dies after its first page is saved: its future is dropped (the function
    // killed) and its lock is left to expire (deleted here, as the expiry would).
    let cut = tokio::select! {
        answer = buy(&two, v.id, "newcomer") => panic!("part 2 finished before the cut: {answer:?}"),
        p = async {
            loop {
                if let Some(p) = progress().await && p.rows > p1.rows {
                    return p;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        } => p,
    };
    println!("part 2 cut after: {cut:?}");
    assert_eq!(cut.parts, 2);
    let _: i64 = ctx.conn().del(&k.repair).await.unwrap();

    // The next requests go on from the cut, not from the beginning.
    let mut answers = Vec::new();
    for _ in 0..4 {
        let answer = buy(&one, v.id, "newcomer").await;
        answers.push(answer.0);
        if answer.0 != 503 {
            assert_eq!(answer.0, 202, "{}", answer.1);
            break;
        }
        let p = progress().await.expect("progress saved");
        assert!(
            p.rows - cut.rows <= PART + page,
            "a part read more than its bound: {p:?}"
        );
    }
    assert_eq!(answers.last(), Some(&202), "{answers:?}");
    assert!(answers.len() <= 3, "{answers:?}");
    assert!(
        progress().await.is_none(),
        "a finished repair forgets its progress"
    );
    // Every buyer is back, once; the stock is the database's, less the newcomer's unit.
    let buyers: usize = ctx.conn().hlen(&k.buyers).await.unwrap();
    assert_eq!(buyers, ORDERS + 1);
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(999));
    for i in [0, 2_499, 4_000, 6_001, ORDERS - 1] {
        assert_code(
            buy(&two, v.id, &user(i)).await,
            409,
            "already_purchased",
            &user(i),
        );
    }
    ctx.cleanup().await;
}

/// One instance repairs at a time (a lock in Redis); the others wait for it and then go
/// on. A lock left by a repairer that died only delays: requests answer a quick `503`
/// until it expires.
#[tokio::test]
async fn requests_wait_for_the_instance_that_repairs_and_a_dead_repairer_only_delays() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(5, 5).await;
    let (one, two) = (
        App::new(&http_config(&ctx)).await,
        App::new(&http_config(&ctx)).await,
    );
    let first = admitted(&one, v.id, "first").await;
    lose(&ctx, v.id, &["sale", "buyers"]).await;
    let k = VoucherKeys::new(v.id);
    let _: () = ctx
        .conn()
        .set(&k.repair, "a repairer that died")
        .await
        .unwrap();

    let started = std::time::Instant::now();
    assert_code(buy(&one, v.id, "early").await, 503, "unavailable", "early");
    let waited = started.elapsed().as_millis() as i64;
    assert!(
        (seckill_http::repair::REPAIR_WAIT_MS..seckill_http::repair::REPAIR_WAIT_MS + 2_000)
            .contains(&waited),
        "waited {waited} ms"
    );
    assert_eq!(
        ctx.sales.stock_left(v.id).await.unwrap(),
        None,
        "no repair ran"
    );

    // The lock expires while a request waits; another instance repairs; the waiting
    // request sees the sale come back and is admitted.
    let (waiting, repairing) = tokio::join!(buy(&one, v.id, "patient"), async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let _: i64 = ctx.conn().del(&k.repair).await.unwrap();
        buy(&two, v.id, "first").await
    });
    assert_eq!(waiting.0, 202, "{}", waiting.1);
    assert_code(repairing, 409, "already_purchased", "first");
    assert_eq!(order_of(&two, v.id, "first").await.unwrap().0, first);
    let lock: bool = ctx.conn().exists(&k.repair).await.unwrap();
    assert!(!lock, "the repairer released its lock");
    assert_eq!(ctx.sales.stock_left(v.id).await.unwrap(), Some(3));
    ctx.cleanup().await;
}

/// The sale snapshot (the repair's and reconcile's read of every order) costs rows linear
/// in what it returns whatever the table's statistics say. Measured on a table written
/// just now and never analysed, the way a lost hot sale's table looks to a repair: each
/// page query, run as the Data API server runs it (one statement on one connection),
/// reads at most about twice its rows (the index entry, then the row), counted by the
/// session's `Handler_read_*` counters. A plan that looked up each buyer's orders once
/// per row (a dependent subquery planned from stale statistics) read millions of rows
/// for 4,500. Also checks the pages through the real Data API: one order per buyer, the
/// one holding a unit, else the latest; a buyer whose rows fill more than a page.
#[tokio::test]
async fn snapshot_pages_examine_about_the_rows_they_return_on_a_table_never_analysed() {
    use mysql_async::params;
    const BUYERS: usize = 5_000;
    // One buyer's cancelled orders alone fill more than a page.
    const HEAVY: usize = seckill_shared::adapters::data_api::SNAPSHOT_PAGE_ROWS + 300;
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10_000, 5_000).await;
    let mut conn = ctx.mysql().await;
    let user = |i: usize| format!("buyer-{i:06}");
    // (id, user, status): every 7th buyer has a cancelled order before the one that
    // counts; buyer 0 has HEAVY cancelled orders and then one confirmed.
    let mut rows: Vec<(i64, String, &str)> = Vec::new();
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut next_id = 1_000_000i64;
    let mut id = || {
        next_id += 1;
        next_id
    };
    for _ in 0..HEAVY {
        rows.push((id(), user(0), "cancelled"));
    }
    for i in 0..BUYERS {
        if i % 7 == 0 {
            rows.push((id(), user(i), "cancelled"));
        }
        let counted = id();
        rows.push((counted, user(i), "confirmed"));
        expected.insert(user(i), counted);
    }
    // Orders in an order other than the index's: the buyers interleaved.
    rows.sort_by_key(|(id, _, _)| (id % 97, *id));
    for chunk in rows.chunks(1_000) {
        insert_orders(&mut conn, v.id.get(), chunk).await;
    }

    // The page query as the snapshot runs it, on one connection.
    let sql = seckill_shared::adapters::data_api::snapshot_page_sql();
    // What reading the counters itself adds.
    let overhead = {
        let a = handler_reads(&mut conn).await;
        let b = handler_reads(&mut conn).await;
        b - a
    };
    let (mut after, mut read) = ((String::new(), 0i64), 0usize);
    loop {
        let before = handler_reads(&mut conn).await;
        let page: Vec<(String, i64, i64, i64)> = conn
            .exec(
                sql.as_str(),
                params! { "v" => v.id.get(), "u" => after.0.clone(), "id" => after.1 },
            )
            .await
            .unwrap();
        let examined = handler_reads(&mut conn).await - before - overhead;
        assert!(
            examined <= 2 * page.len() as u64 + 10,
            "a page of {} rows after {after:?} examined {examined} rows",
            page.len()
        );
        read += page.len();
        match page.last() {
            Some((u, id, _, _))
                if page.len() == seckill_shared::adapters::data_api::SNAPSHOT_PAGE_ROWS =>
            {
                after = (u.clone(), *id);
            }
            _ => break,
        }
    }
    assert_eq!(read, rows.len(), "every row read once");
    conn.disconnect().await.ok();

    // The same through the Data API: one order per buyer.
    let db = ctx.db().await;
    let (_, mut snapshot) = db.sale_snapshot(v.id).await.unwrap().expect("voucher");
    let mut got: BTreeMap<String, i64> = BTreeMap::new();
    while let Some(page) = snapshot.next_page().await.unwrap() {
        for (u, id) in page {
            assert!(
                got.insert(u.clone(), id.get()).is_none(),
                "{u} listed twice"
            );
        }
    }
    snapshot.finish().await;
    assert_eq!(got, expected);
    ctx.cleanup().await;
}

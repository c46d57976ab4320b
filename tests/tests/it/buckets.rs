//! Stock buckets against real parts: a Redis Cluster of three primaries, the
//! handler with fixture events (several instances, each its own caches), the drainer in
//! process, and a fresh database behind the Data API.
//!
//! What is proved: a voucher split over three buckets lives on three primaries; its
//! units are each sold once, to one order per buyer, across buckets and retries; no
//! buyer is told `sold_out` while a unit was still to be sold; units moved between
//! buckets by a caller that died are delivered by the drainer once; every bucket's
//! orders reach the database; status adds the buckets up; a lost bucket is repaired
//! without selling a unit twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use seckill_http::App;
use seckill_http::admission::borrow_budget;
use seckill_http::costs::BorrowFigures;
use seckill_shared::adapters::redis::{RedisConn, RedisSales};
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{Bucket, VoucherId, format_rfc3339_millis, now_millis};
use seckill_shared::keys::{self, VoucherKeys};
use seckill_tests::drainer::DrainCtx;
use seckill_tests::harness::{
    TEST_CURRENCY, TEST_PRICE_MINOR, buy, call, create_voucher, provider_pays, request,
    test_http_config, token,
};
use seckill_tests::redis::{RedisServer, ReplyDropper};
use serde_json::json;

/// Creates a voucher of `stock` units in `buckets` buckets through `POST /vouchers`,
/// on sale now for an hour.
async fn create(app: &App, stock: i64, buckets: u16) -> VoucherId {
    create_with(app, stock, buckets, json!({})).await
}

/// The same with more fields of the request body (a payment step).
async fn create_with(app: &App, stock: i64, buckets: u16, more: serde_json::Value) -> VoucherId {
    let now = now_millis();
    let mut body = json!({
        "title": "bucketed sale",
        "stock": stock,
        "buckets": buckets,
        "begins_at": format_rfc3339_millis(now - 1_000),
        "ends_at": format_rfc3339_millis(now + 3_600_000),
    });
    for (k, v) in more.as_object().unwrap() {
        body[k] = v.clone();
    }
    let created = create_voucher(app, &body).await;
    assert_eq!(created["buckets"], json!(buckets), "{created}");
    created["id"].as_str().unwrap().parse().unwrap()
}

/// Each bucket's stock in Redis.
async fn stocks(ctx: &DrainCtx, voucher: VoucherId, buckets: u16) -> Vec<i64> {
    let mut out = Vec::new();
    for b in Bucket::all(voucher, buckets) {
        out.push(
            ctx.sales
                .stock_left(b)
                .await
                .unwrap()
                .expect("bucket loaded"),
        );
    }
    out
}

/// The voucher's orders in the database: (order id, user id, status).
async fn rows(ctx: &DrainCtx, voucher: VoucherId) -> Vec<(String, String, String)> {
    let mut conn = ctx.mysql().await;
    let rows: Vec<(i64, String, String)> = conn
        .exec(
            "SELECT id, CONVERT(user_id USING utf8mb4), status FROM orders WHERE voucher_id = ?",
            (voucher.get(),),
        )
        .await
        .expect("orders query");
    conn.disconnect().await.ok();
    rows.into_iter()
        .map(|(id, u, s)| (id.to_string(), u, s))
        .collect()
}

/// Redis loses one bucket: its sale, buyers, orders, transfers and received keys.
async fn lose_bucket(ctx: &DrainCtx, bucket: Bucket) {
    let k = VoucherKeys::new(bucket);
    let keys = [&k.sale, &k.buyers, &k.orders, &k.transfers, &k.received];
    let _: () = ctx.conn().del(&keys).await.unwrap();
}

/// Drains until every bucket's orders are in the database (or a minute passes).
async fn drain_all(ctx: &DrainCtx, voucher: VoucherId, expected: usize) {
    let t0 = Instant::now();
    loop {
        ctx.drain(ctx.drainer_config()).await;
        let rows = rows(ctx, voucher).await;
        if rows.len() >= expected || t0.elapsed() > Duration::from_secs(60) {
            return;
        }
    }
}

/// `lua/give.lua` alone from `donor` to `to`, as a mover that then died leaves it:
/// (units given, transfers open before).
async fn give(ctx: &DrainCtx, donor: Bucket, to: Bucket, id: &str) -> (i64, i64) {
    let k = VoucherKeys::new(donor);
    redis::Script::new(include_str!("../../../lua/give.lua"))
        .key(&k.sale)
        .key(&k.transfers)
        .key(&k.offers)
        .arg(id)
        .arg(to.to_string())
        .arg("")
        .invoke_async(&mut ctx.conn())
        .await
        .unwrap()
}

/// A transfer record's age is told by the server clock that stamped it, not by the
/// drainer's: against a server whose clock runs ten minutes ahead, a record stranded by
/// a caller that died is still delivered once it is [`transfers::STALE_TRANSFER_MS`]
/// old (by the drainer's clock it would be ten minutes in the future for ten minutes),
/// and a fresh one is still left to its living caller. Runs in the Valkey pass only
/// (see [`RedisServer::single_with_clock_ahead`]).
#[tokio::test]
async fn a_stranded_transfer_is_delivered_on_time_by_a_server_whose_clock_is_ahead() {
    const AHEAD_S: u64 = 600;
    let Some(redis) = RedisServer::single_with_clock_ahead(AHEAD_S) else {
        println!(
            "skipped: libfaketime cannot run Debian's redis-server; the Valkey pass runs this"
        );
        return;
    };
    let ctx = DrainCtx::start_with(redis).await;
    let mut conn = ctx.conn();
    let (server_s, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let local_s = (now_millis() / 1_000) as u64;
    assert!(
        server_s >= local_s + AHEAD_S - 5,
        "the server's clock is not ahead: {server_s} vs {local_s}"
    );
    let app = App::new(&test_http_config(ctx.redis.config(), ctx.data_api_config())).await;
    let voucher = create(&app, 10, 2).await;
    let [b0, b1]: [Bucket; 2] = Bucket::all(voucher, 2)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert_eq!(give(&ctx, b1, b0, "dead-caller.0").await, (3, 0));
    assert_eq!(
        transfers::finish_open(&ctx.sales, b1).await.unwrap(),
        0,
        "a fresh record is its living caller's to finish"
    );
    tokio::time::sleep(Duration::from_millis(
        transfers::STALE_TRANSFER_MS as u64 + 200,
    ))
    .await;
    assert_eq!(
        transfers::finish_open(&ctx.sales, b1).await.unwrap(),
        3,
        "a record stale by the server's clock is delivered"
    );
    assert_eq!(stocks(&ctx, voucher, 2).await, vec![8, 2]);
    assert_eq!(transfers::finish_open(&ctx.sales, b1).await.unwrap(), 0);
}

/// A durable client of `ctx`'s Redis (one replica must acknowledge, within 300 ms),
/// through a proxy that can lose a reply or mute the replica's link: its proxy, its
/// sales adapter and an app on it.
async fn durable_client(ctx: &DrainCtx) -> (ReplyDropper, RedisSales, App) {
    let proxy = ReplyDropper::start(&ctx.redis).await;
    let mut cfg = ctx.redis.config();
    cfg.url = proxy.url();
    let durable = seckill_shared::config::Durable {
        replicas: 1,
        timeout: Duration::from_millis(300),
    };
    cfg.durable = Some(durable);
    let sales =
        RedisSales::new(RedisConn::connect(&cfg).await.unwrap()).with_durability(Some(durable));
    let app = App::new(&test_http_config(cfg, ctx.data_api_config())).await;
    (proxy, sales, app)
}

/// Waits for a durable admission of `voucher`: the replica follows its primary's
/// announced (proxy) address, a durable 202 once it has.
async fn until_durable(app: &App, voucher: VoucherId) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = buy(app, voucher, "warmup").await;
        if status == 202 || body["code"] == "already_purchased" {
            return;
        }
        assert!(Instant::now() < deadline, "no durable 202: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A sale of 10 units over two buckets on a primary with one replica, its durable
/// client (see [`durable_client`]) admitting at last: the context, the client's proxy,
/// sales adapter and app, the voucher and its two buckets.
async fn durable_sale_of_two_buckets() -> (
    DrainCtx,
    ReplyDropper,
    RedisSales,
    App,
    VoucherId,
    [Bucket; 2],
) {
    let ctx = DrainCtx::start_with(RedisServer::cluster(1, 1)).await;
    let (proxy, sales, app) = durable_client(&ctx).await;
    let voucher = create(&app, 10, 2).await;
    let buckets: [Bucket; 2] = Bucket::all(voucher, 2)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    until_durable(&app, voucher).await;
    (ctx, proxy, sales, app, voucher, buckets)
}

/// Loads `script` on the node, so that a copy whose reply is lost runs (rather than
/// answering NOSCRIPT).
async fn load(ctx: &DrainCtx, script: &str) {
    let _: String = redis::Script::new(script)
        .prepare_invoke()
        .load_async(&mut ctx.conn())
        .await
        .unwrap();
}

/// Mutes the replica's link from now on: it acknowledges what it has every second, and
/// after its next acknowledgement nothing more reaches it.
async fn mute_the_replica(proxy: &ReplyDropper) {
    proxy.mute(&[b"REPLCONF", b"ACK"], 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.muted() == 0 {
        assert!(
            Instant::now() < deadline,
            "the replication link was not muted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A durable payment (the provider's webhook closing an order as paid) whose close runs
/// and whose reply is lost while the only replica receives nothing more: the client
/// sends the close and its `WAIT` again on a new connection, where the close finds the
/// order closed. That `WAIT` must count only the replicas holding the close, so the
/// payment is not confirmed (the provider's delivery is retried) rather than recorded
/// paid while a failover could still lose the close and sell the unit again. The close
/// writes its value again for the `WAIT` to cover (lua/close.lua).
#[tokio::test]
async fn a_durable_payment_resent_by_the_client_waits_for_the_replicas() {
    use seckill_shared::adapters::redis::CloseAction;
    use seckill_shared::domain::{OrderId, PaymentRef, UserId};

    let ctx = DrainCtx::start_with(RedisServer::cluster(1, 1)).await;
    let (proxy, sales, app) = durable_client(&ctx).await;
    let voucher = create_with(
        &app,
        10,
        2,
        json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    until_durable(&app, voucher).await;
    let (status, body) = buy(&app, voucher, "payer").await;
    assert_eq!(status, 202, "{body}");
    let order: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();
    mute_the_replica(&proxy).await;
    load(&ctx, include_str!("../../../lua/close.lua")).await;
    proxy.arm(&[b"EVALSHA", b":closed", order.to_string().as_bytes()]);
    let user = UserId::parse("payer").unwrap();
    let paid = CloseAction::Pay(PaymentRef::parse("pi-resent").unwrap());
    let bucket = Bucket::of_user(voucher, 2, user.as_str());
    let closed = sales.close(bucket, order, &user, &paid).await;
    assert_eq!(proxy.dropped(), 1, "the close's reply was lost");
    assert!(
        closed.is_err(),
        "a close no replica holds was reported held: {closed:?}"
    );
}

/// The drainer finishing a stranded transfer in durable mode: its take runs and the
/// connection is cut before the reply, while the only replica receives nothing more
/// (its replication link, through the proxies too, is muted). The client sends the
/// pipeline (take and `WAIT`) again on a new connection, where the take finds the
/// transfer already received. That `WAIT` must still count only the replicas holding
/// the receipt: the delivery is not held, so the donor's record stays for a later run
/// (deleting it would leave the units in no replica's bucket after a failover). The
/// take writes the receipt again for the `WAIT` to cover (lua/take.lua). Without that,
/// Valkey 9.1 (the cluster pass) answered the new connection's `WAIT` at once with the
/// muted replica counted. (Redis 7.0's `WAIT` on a new connection waits for the
/// primary's whole offset.)
#[tokio::test]
async fn a_durable_take_resent_by_the_client_waits_for_the_replicas() {
    let (ctx, proxy, sales, _app, voucher, [b0, b1]) = durable_sale_of_two_buckets().await;
    let given = give(&ctx, b1, b0, "dead-caller.0").await.0;
    assert!(given > 0, "nothing given");
    let before = stocks(&ctx, voucher, 2).await;
    tokio::time::sleep(Duration::from_millis(
        transfers::STALE_TRANSFER_MS as u64 + 200,
    ))
    .await;
    mute_the_replica(&proxy).await;
    load(&ctx, include_str!("../../../lua/take.lua")).await;
    proxy.arm(&[b"EVALSHA", b":received", b"dead-caller.0"]);
    let finished = transfers::finish_open(&sales, b1).await;
    assert_eq!(proxy.dropped(), 1, "the take's reply was lost");
    assert!(
        finished.is_err(),
        "a receipt no replica holds was reported held: {finished:?}"
    );
    assert_eq!(
        transfers::open_transfers(&ctx.conn(), b1, 0)
            .await
            .unwrap()
            .len(),
        1,
        "the donor's record stays until a replica holds the receipt"
    );
    assert_eq!(
        stocks(&ctx, voucher, 2).await,
        vec![before[0] + given, before[1]],
        "taken once"
    );
}

/// A durable borrow whose give runs and whose reply is lost while the only replica
/// receives nothing more (its link muted): the client sends the give and its `WAIT`
/// again on a new connection, where the give finds the transfer recorded. That `WAIT`
/// must still count only the replicas holding the record, so the borrow is not
/// reported held and takes nothing: the donor's record stays for the drainer (a
/// failover could otherwise give the donor its units back while the recipient kept
/// them). The give writes the record again for the `WAIT` to cover (lua/give.lua), as
/// the take does; without that, Valkey 9.1 (the cluster pass) answered at once with the
/// muted replica counted.
#[tokio::test]
async fn a_durable_give_resent_by_the_client_waits_for_the_replicas() {
    let (ctx, proxy, sales, _app, voucher, [b0, b1]) = durable_sale_of_two_buckets().await;
    let before = stocks(&ctx, voucher, 2).await;
    assert!(before[1] > 0, "the donor has units: {before:?}");
    mute_the_replica(&proxy).await;
    load(&ctx, include_str!("../../../lua/give.lua")).await;
    proxy.arm(&[b"EVALSHA", b":transfers", b"resent-give.0"]);
    let borrowed = transfers::borrow(&sales, 2, b0, "resent-give.0").await;
    assert_eq!(proxy.dropped(), 1, "the give's reply was lost");
    assert!(
        borrowed.is_err(),
        "a give no replica holds was reported held: {borrowed:?}"
    );
    let open = transfers::open_transfers(&ctx.conn(), b1, 0).await.unwrap();
    assert_eq!(open.len(), 1, "the donor's record stays: {open:?}");
    let after = stocks(&ctx, voucher, 2).await;
    assert_eq!(after[0], before[0], "the recipient took nothing");
    assert!(after[1] < before[1], "given once: {before:?} -> {after:?}");
}

/// One answer a buyer got: status, code, order id, when the request started and ended.
#[derive(Debug, Clone)]
struct Answer {
    user: String,
    status: u16,
    code: String,
    order: Option<String>,
    started: Instant,
    ended: Instant,
}

/// The proof: 1,000 units over 3 buckets on 3 primaries, 20,000 buyers, each
/// trying twice and a fifth of them a third time, from 8 instances at once.
#[tokio::test]
async fn a_sale_over_three_buckets_sells_each_unit_once_and_never_early() {
    const STOCK: i64 = 1_000;
    const BUYERS: usize = 20_000;
    const K: u16 = 3;
    if std::env::var_os("RUST_LOG").is_some() {
        seckill_shared::telemetry::init();
    }
    let redis = RedisServer::cluster(3, 0);
    let ctx = DrainCtx::start_with(redis).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let mut apps = Vec::new();
    for _ in 0..8 {
        apps.push(Arc::new(App::new(&cfg).await));
    }
    let voucher = create(&apps[0], STOCK, K).await;

    // Three buckets, three primaries, the stock split evenly.
    let owners: BTreeSet<u16> = Bucket::all(voucher, K)
        .map(|b| {
            ctx.redis
                .primary_of_slot(keys::slot(&VoucherKeys::new(b).sale))
        })
        .collect();
    assert_eq!(owners.len(), 3, "one bucket per primary");
    assert_eq!(stocks(&ctx, voucher, K).await, vec![334, 333, 333]);

    // Attempts: every buyer twice, every fifth a third time, shuffled (a fixed seed).
    let mut attempts: Vec<usize> = (0..BUYERS).flat_map(|u| [u, u]).collect();
    attempts.extend((0..BUYERS).step_by(5));
    let mut seed: u64 = 0x5eed;
    for i in (1..attempts.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        attempts.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    let answers = Arc::new(Mutex::new(Vec::with_capacity(attempts.len())));
    futures::stream::iter(attempts.into_iter().enumerate())
        .for_each_concurrent(64, |(n, u)| {
            let app = apps[n % apps.len()].clone();
            let answers = answers.clone();
            async move {
                let user = format!("buyer-{u}");
                let started = Instant::now();
                let (status, body) = buy(&app, voucher, &user).await;
                let ended = Instant::now();
                answers.lock().unwrap().push(Answer {
                    user,
                    status,
                    code: body["code"].as_str().unwrap_or_default().to_string(),
                    order: body["order_id"].as_str().map(str::to_string),
                    started,
                    ended,
                });
            }
        })
        .await;
    let answers = Arc::try_unwrap(answers).unwrap().into_inner().unwrap();

    let mut by_status: BTreeMap<(u16, String), u64> = BTreeMap::new();
    for a in &answers {
        *by_status.entry((a.status, a.code.clone())).or_default() += 1;
    }
    println!("3 buckets, {BUYERS} buyers: {by_status:?}");
    assert!(answers.iter().all(|a| a.status < 500), "{by_status:?}");

    // Exactly the stock admitted, each to a different buyer, each buyer's later
    // attempts told the same order.
    let won: HashMap<&str, &str> = answers
        .iter()
        .filter(|a| a.status == 202)
        .map(|a| (a.user.as_str(), a.order.as_deref().unwrap()))
        .collect();
    let admitted = answers.iter().filter(|a| a.status == 202).count();
    assert_eq!(admitted as i64, STOCK, "{by_status:?}");
    assert_eq!(won.len(), admitted, "a buyer admitted twice");
    for a in answers.iter().filter(|a| a.code == "already_purchased") {
        assert_eq!(
            won.get(a.user.as_str()).copied(),
            a.order.as_deref(),
            "{a:?}"
        );
    }
    // No early sold-out: a refusal that ended before an admitted request even began
    // was given while a unit (the one that request got) was still to be sold.
    let last_admitted_start = answers
        .iter()
        .filter(|a| a.status == 202)
        .map(|a| a.started)
        .max()
        .unwrap();
    let early = answers
        .iter()
        .filter(|a| a.code == "sold_out" && a.ended < last_admitted_start)
        .count();
    assert_eq!(early, 0, "sold-out answers while units were left");
    // Borrowing stayed within its budget of Redis calls in every attempt.
    let borrowing = apps
        .iter()
        .map(|a| a.borrowing())
        .fold(Default::default(), BorrowFigures::plus);
    println!(
        "borrowing: {borrowing:?}, mean {:.1} calls, budget {}",
        borrowing.mean_calls(),
        borrow_budget(K)
    );
    assert!(borrowing.attempts > 0, "the sale's end borrowed");
    assert!(
        borrowing.max_calls <= u64::from(borrow_budget(K)),
        "{borrowing:?}"
    );
    assert_eq!(stocks(&ctx, voucher, K).await, vec![0, 0, 0]);
    let conn = ctx.conn();
    for b in Bucket::all(voucher, K) {
        let open = transfers::open_transfers(&conn, b, 0).await.unwrap();
        assert!(open.is_empty(), "{b}: {open:?}");
    }

    // Every bucket's orders reach the database: the stock, once each, no buyer twice.
    drain_all(&ctx, voucher, admitted).await;
    let rows = rows(&ctx, voucher).await;
    let users: BTreeSet<&String> = rows.iter().map(|r| &r.1).collect();
    assert_eq!(rows.len(), admitted);
    assert_eq!(users.len(), admitted);
    assert!(rows.iter().all(|r| r.2 == "confirmed"));
    for (order, user, _) in &rows {
        assert_eq!(won.get(user.as_str()).copied(), Some(order.as_str()));
    }
    assert_eq!(ctx.db_stock_left(voucher).await, 0);

    // status adds the buckets up.
    let b = seckill_cli::ops::Backends::connect(&ctx.redis.config(), &ctx.data_api_config())
        .await
        .unwrap();
    let s = seckill_cli::ops::status::voucher_status(&b, voucher)
        .await
        .unwrap();
    assert_eq!(
        (s.buckets, s.admitted, s.confirmed),
        (K, STOCK as u64, STOCK as u64)
    );
    assert_eq!(
        (s.stock_left_redis, s.in_transit, s.pending, s.lag),
        (Some(0), 0, 0, 0)
    );
}

/// A caller that dies between the donor's give and the recipient's take leaves a
/// transfer record: the units are in neither bucket's stock until the drainer delivers
/// them, once, however often it runs.
#[tokio::test]
async fn units_given_by_a_caller_that_died_are_delivered_once_by_the_drainer() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let app = App::new(&test_http_config(ctx.redis.config(), ctx.data_api_config())).await;
    let voucher = create(&app, 10, 2).await;
    let [b0, b1]: [Bucket; 2] = Bucket::all(voucher, 2)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert_eq!(stocks(&ctx, voucher, 2).await, vec![5, 5]);
    // The give alone, as a caller that died right after it would leave it.
    let k1 = VoucherKeys::new(b1);
    assert_eq!(give(&ctx, b1, b0, "dead-caller.0").await, (3, 0));
    assert_eq!(stocks(&ctx, voucher, 2).await, vec![5, 2]);
    // Fresh records are the living callers' to finish.
    assert_eq!(transfers::finish_open(&ctx.sales, b1).await.unwrap(), 0);
    // Make the record old, as if its caller died seconds ago.
    let record: String = ctx
        .conn()
        .hget(&k1.transfers, "dead-caller.0")
        .await
        .unwrap();
    let old = record.replace(
        record.rsplit(' ').next().unwrap(),
        &(now_millis() - 60_000).to_string(),
    );
    let _: () = ctx
        .conn()
        .hset(&k1.transfers, "dead-caller.0", old)
        .await
        .unwrap();
    // status sees the units on their way.
    let b = seckill_cli::ops::Backends::connect(&ctx.redis.config(), &ctx.data_api_config())
        .await
        .unwrap();
    let s = seckill_cli::ops::status::voucher_status(&b, voucher)
        .await
        .unwrap();
    assert_eq!((s.stock_left_redis, s.in_transit), (Some(7), 3));
    for _ in 0..3 {
        ctx.drain(ctx.drainer_config()).await;
    }
    assert_eq!(stocks(&ctx, voucher, 2).await, vec![8, 2], "delivered once");
    assert!(
        transfers::open_transfers(&ctx.conn(), b1, 0)
            .await
            .unwrap()
            .is_empty()
    );
    // A retry of the delivered transfer adds nothing.
    let k0 = VoucherKeys::new(b0);
    let again: i64 = redis::Script::new(include_str!("../../../lua/take.lua"))
        .key(&k0.sale)
        .key(&k0.received)
        .arg("dead-caller.0")
        .arg(3)
        .invoke_async(&mut ctx.conn())
        .await
        .unwrap();
    assert_eq!(again, 0);
    assert_eq!(stocks(&ctx, voucher, 2).await, vec![8, 2]);
}

/// Borrowing is bounded in Redis calls: when the voucher's only units left sit in the
/// transfer records of a mover that died (nobody can buy them until the drainer
/// delivers them, two seconds later), a buyer whose bucket is empty asks the donors
/// round after round. Each round finds units on their way, so the attempt neither
/// admits nor proves the voucher sold out; it stops on its budget of Redis calls
/// ([`borrow_budget`]): counted by the instance and on the servers. (Before the budget,
/// one such request ran 64 rounds, three script calls each.)
#[tokio::test]
async fn a_buyer_borrowing_from_units_on_their_way_stays_within_its_call_budget() {
    const K: u16 = 3;
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create(&app, 3, K).await;
    assert_eq!(stocks(&ctx, voucher, K).await, vec![1, 1, 1]);
    let bucket = |i: u16| Bucket::new(voucher, i, K).unwrap();
    // Buckets 1 and 2 give their unit to bucket 0, and the mover dies before either
    // arrives; bucket 0's own unit is sold.
    assert_eq!(give(&ctx, bucket(1), bucket(0), "dead.1").await.0, 1);
    assert_eq!(give(&ctx, bucket(2), bucket(0), "dead.2").await.0, 1);
    let user_of = |i: u16| {
        (0..)
            .map(|n| format!("user-{i}-{n}"))
            .find(|u| Bucket::of_user(voucher, K, u).index() == i)
            .unwrap()
    };
    assert_eq!(buy(&app, voucher, &user_of(0)).await.0, 202);
    assert_eq!(stocks(&ctx, voucher, K).await, vec![0, 0, 0]);

    let before = ctx.redis.script_calls();
    let (status, body) = buy(&app, voucher, &user_of(1)).await;
    let scripts = ctx.redis.script_calls() - before;
    // Units remain (on their way): the refusal is not remembered, the voucher not
    // marked sold out.
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );
    let marked: bool = ctx.conn().exists(keys::sold_out(voucher)).await.unwrap();
    assert!(!marked, "units are on their way: not sold out");
    let f = app.borrowing();
    println!(
        "one attempt against units on their way: {f:?}, {scripts} script calls on the servers"
    );
    assert_eq!((f.attempts, f.spent), (1, 1), "{f:?}");
    assert!(f.max_calls <= u64::from(borrow_budget(K)), "{f:?}");
    // The servers' count: the first admission, and within the budget the gives and
    // admissions of every round (each a script call).
    assert!(
        scripts <= 1 + u64::from(borrow_budget(K)),
        "{scripts} script calls for one request (budget {})",
        borrow_budget(K)
    );
    assert!(scripts >= 4, "it did borrow: {scripts}");

    // Once the drainer delivers the stranded units, the next attempt buys one.
    tokio::time::sleep(Duration::from_millis(
        transfers::STALE_TRANSFER_MS as u64 + 100,
    ))
    .await;
    ctx.drain(ctx.drainer_config()).await;
    assert_eq!(stocks(&ctx, voucher, K).await, vec![2, 0, 0]);
    let (status, body) = buy(&app, voucher, &user_of(1)).await;
    assert_eq!(status, 202, "{body}");
}

/// A buyer whose bucket is empty borrows; once every bucket is empty the voucher is
/// marked sold out (one Redis call answers everyone's bucket afterwards), and a returned
/// unit clears the mark.
#[tokio::test]
async fn an_empty_bucket_borrows_and_the_last_unit_marks_the_voucher_sold_out() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create(&app, 4, 4).await;
    assert_eq!(stocks(&ctx, voucher, 4).await, vec![1, 1, 1, 1]);
    // Buyers of bucket 0 only: the first takes its unit, the next three borrow.
    let of_bucket0: Vec<String> = (0..)
        .map(|i| format!("zero-{i}"))
        .filter(|u| Bucket::of_user(voucher, 4, u).index() == 0)
        .take(5)
        .collect();
    for u in &of_bucket0[..4] {
        let (status, body) = buy(&app, voucher, u).await;
        assert_eq!(status, 202, "{u}: {body}");
    }
    assert_eq!(stocks(&ctx, voucher, 4).await, vec![0, 0, 0, 0]);
    let marked: bool = ctx.conn().exists(keys::sold_out(voucher)).await.unwrap();
    assert!(!marked, "no refusal yet, no mark");
    // Another instance: its buyer is refused, and the voucher is marked.
    let other = App::new(&cfg).await;
    let (status, body) = buy(&other, voucher, &of_bucket0[4]).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("sold_out")));
    let ttl: i64 = ctx.conn().pttl(keys::sold_out(voucher)).await.unwrap();
    assert!(
        ttl > 0 && ttl <= transfers::SOLD_OUT_MARK.as_millis() as i64,
        "{ttl}"
    );
    drain_all(&ctx, voucher, 4).await;
    assert_eq!(rows(&ctx, voucher).await.len(), 4);
    assert_eq!(ctx.db_stock_left(voucher).await, 0);
}

/// Redis loses one bucket (its keys deleted, as a failover to a replica that missed them
/// would) while the others live: the repair reopens it empty with its buyers, so no
/// buyer of it buys twice and no unit is sold twice; with every bucket lost, bucket 0
/// gets the whole of what is left.
#[tokio::test]
async fn a_lost_bucket_is_repaired_without_selling_a_unit_twice() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create(&app, 30, 3).await;
    let users: Vec<String> = (0..12).map(|i| format!("early-{i}")).collect();
    let mut held = HashMap::new();
    for u in &users {
        let (status, body) = buy(&app, voucher, u).await;
        assert_eq!(status, 202, "{body}");
        held.insert(u.clone(), body["order_id"].as_str().unwrap().to_string());
    }
    drain_all(&ctx, voucher, 12).await;
    // Bucket 2 lost (all its keys), buckets 0 and 1 live.
    let b2 = Bucket::all(voucher, 3).nth(2).unwrap();
    let before: i64 = stocks(&ctx, voucher, 3).await.iter().sum();
    lose_bucket(&ctx, b2).await;
    let lost_units = before - {
        let mut live = 0;
        for b in Bucket::all(voucher, 3).take(2) {
            live += ctx.sales.stock_left(b).await.unwrap().unwrap();
        }
        live
    };
    // Its earlier buyers are still told their order; nobody buys twice.
    for u in users
        .iter()
        .filter(|u| Bucket::of_user(voucher, 3, u) == b2)
    {
        let (status, body) = buy(&app, voucher, u).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (409, Some("already_purchased")),
            "{u}"
        );
        assert_eq!(body["order_id"].as_str(), Some(held[u].as_str()));
    }
    assert_eq!(
        ctx.sales.stock_left(b2).await.unwrap(),
        Some(0),
        "reopened empty"
    );
    // Everyone else buys what the live buckets hold: the lost bucket's units stay unsold.
    let mut sold = 0;
    for i in 0..100 {
        let (status, _) = buy(&app, voucher, &format!("late-{i}")).await;
        sold += i64::from(status == 202);
    }
    assert_eq!(sold, 30 - 12 - lost_units);
    drain_all(&ctx, voucher, (12 + sold) as usize).await;
    let rows = rows(&ctx, voucher).await;
    assert_eq!(rows.len() as i64, 12 + sold);
    assert!(
        rows.iter().all(|r| r.2 == "confirmed"),
        "nothing rejected: nothing oversold"
    );
    assert_eq!(ctx.db_stock_left(voucher).await, lost_units);

    // Every bucket lost: bucket 0 gets all the database has left.
    for b in Bucket::all(voucher, 3) {
        let k = VoucherKeys::new(b);
        let _: () = ctx.conn().del(&[&k.sale, &k.buyers]).await.unwrap();
    }
    let fresh = App::new(&cfg).await;
    let (status, body) = buy(&fresh, voucher, "after-the-loss").await;
    assert_eq!(status, 202, "{body}");
    let left: i64 = stocks(&ctx, voucher, 3).await.iter().sum();
    assert_eq!(
        left,
        lost_units - 1,
        "bucket 0 reopened with what the database has left"
    );
}

/// A voucher that lets a buyer buy again after a close forgets the buyers who cancelled,
/// while the units their sale borrowed between buckets stay moved: a bucket lost after
/// every order was cancelled (drained or not) must not be reopened with its full share
/// as if nothing had been sold (the live bucket holds the units it borrowed), or Redis
/// would admit more than the stock and the database reject the extra orders.
#[tokio::test]
async fn a_lost_bucket_of_a_rebuy_sale_whose_orders_were_all_cancelled_never_gets_its_share_again()
{
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    for drained in [false, true] {
        let app = App::new(&cfg).await;
        let voucher = create_with(
            &app,
            4,
            2,
            json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR,
                    "currency": TEST_CURRENCY, "rebuy_after_close": true }),
        )
        .await;
        // Three buyers of bucket 0 (share 2): the third borrows from bucket 1.
        let buyers: Vec<String> = (0..)
            .map(|i| format!("first-wave-{drained}-{i}"))
            .filter(|u| Bucket::of_user(voucher, 2, u).index() == 0)
            .take(3)
            .collect();
        let mut orders = Vec::new();
        for u in &buyers {
            let (status, body) = buy(&app, voucher, u).await;
            assert_eq!(status, 202, "{body}");
            orders.push(body["order_id"].as_str().unwrap().to_string());
        }
        if drained {
            drain_all(&ctx, voucher, 3).await;
        }
        for (u, o) in buyers.iter().zip(&orders) {
            let (status, body) = close(&app, o, u, false).await;
            assert_eq!((status, body["status"].as_str()), (200, Some("cancelled")));
        }
        if drained {
            // The closes written: the database has all its stock back, and no buyer.
            ctx.drain(ctx.drainer_config()).await;
            assert_eq!(ctx.db_stock_left(voucher).await, 4);
        }
        let live = stocks(&ctx, voucher, 2).await;
        assert_eq!(live.iter().sum::<i64>(), 4, "every unit back: {live:?}");
        assert!(live[1] < 2, "bucket 1 gave a unit away: {live:?}");
        // Bucket 1 lost, every key of it.
        lose_bucket(&ctx, Bucket::all(voucher, 2).nth(1).unwrap()).await;
        // A new crowd, a buyer of the lost bucket first (its repair then sees nothing
        // new sold): never more admitted than the stock, nothing the database refuses.
        let fresh = App::new(&cfg).await;
        let mut crowd: Vec<String> = (0..12)
            .map(|i| format!("second-wave-{drained}-{i}"))
            .collect();
        crowd.sort_by_key(|u| Bucket::of_user(voucher, 2, u).index() == 0);
        assert_eq!(Bucket::of_user(voucher, 2, &crowd[0]).index(), 1);
        let mut admitted = 0;
        for u in &crowd {
            let (status, body) = buy(&fresh, voucher, u).await;
            assert!(matches!(status, 202 | 409), "{status} {body}");
            admitted += usize::from(status == 202);
        }
        let after = stocks(&ctx, voucher, 2).await;
        assert!(
            admitted <= 4,
            "{admitted} admitted of a stock of 4 ({drained}): Redis holds {after:?}"
        );
        drain_all(&ctx, voucher, 3 * usize::from(drained) + admitted).await;
        let rejected = rows(&ctx, voucher)
            .await
            .into_iter()
            .filter(|r| r.2 == "rejected")
            .count();
        assert_eq!(rejected, 0, "an admitted order refused by the database");
    }
}

/// A drained order cancelled in its bucket (its close not yet written to the database)
/// on a voucher that lets buyers buy again, the unit it gave back then borrowed by
/// another bucket and sold there, and then the first bucket lost: its repair must not
/// count the given-back unit as its own (it moved on), or Redis sells it twice.
#[tokio::test]
async fn a_lost_bucket_never_reopens_with_a_returned_unit_that_moved_on() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create_with(
        &app,
        2,
        2,
        json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR,
                "currency": TEST_CURRENCY, "rebuy_after_close": true }),
    )
    .await;
    let of_bucket = |i: u16, n: usize| -> Vec<String> {
        (0..)
            .map(|j| format!("moved-on-{j}"))
            .filter(|u| Bucket::of_user(voucher, 2, u).index() == i)
            .take(n)
            .collect()
    };
    let (zero, one) = (of_bucket(0, 2), of_bucket(1, 2));
    // Bucket 1's buyer is drained, then cancels: the unit is back in bucket 1 only.
    let (status, body) = buy(&app, voucher, &one[0]).await;
    assert_eq!(status, 202, "{body}");
    drain_all(&ctx, voucher, 1).await;
    let order = body["order_id"].as_str().unwrap();
    let (status, body) = close(&app, order, &one[0], false).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("cancelled")));
    // Bucket 0 sells its unit, then borrows bucket 1's and sells it too.
    for u in &zero {
        let (status, body) = buy(&app, voucher, u).await;
        assert_eq!(status, 202, "{u}: {body}");
    }
    assert_eq!(stocks(&ctx, voucher, 2).await, vec![0, 0]);
    // Bucket 1's sale and buyers lost (its closes kept); its next buyer repairs it.
    let k1 = VoucherKeys::new(Bucket::all(voucher, 2).nth(1).unwrap());
    let _: () = ctx.conn().del(&[&k1.sale, &k1.buyers]).await.unwrap();
    let fresh = App::new(&cfg).await;
    let (status, body) = buy(&fresh, voucher, &one[1]).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("sold_out")),
        "both units are sold: {body}"
    );
    drain_all(&ctx, voucher, 3).await;
    let rows = rows(&ctx, voucher).await;
    assert!(
        rows.iter().all(|r| r.2 != "rejected"),
        "an admitted order refused: {rows:?}"
    );
}

/// `user`'s order paid (the provider's signed event) or cancelled (`POST
/// /orders/{order}/cancel`). A payment answers `status` from its `outcome`.
async fn close(app: &App, order: &str, user: &str, pay: bool) -> (u16, serde_json::Value) {
    if pay {
        let (status, mut body) = provider_pays(app, order, user, &format!("ref-{order}")).await;
        if body["outcome"] == "paid" {
            body["status"] = json!("paid");
        }
        return (status, body);
    }
    let path = format!("/orders/{order}/cancel");
    call(
        app,
        request("POST", &path, Some(&token(user, false)), None, None),
    )
    .await
}

/// A bucketed voucher with a payment step: orders are paid and cancelled in their
/// buyer's bucket, a cancelled unit clears the sold-out mark and is sold again (to a
/// buyer of another bucket, by borrowing), unpaid orders expire bucket by bucket in the
/// drainer's sweep, and Redis and the database agree on every unit at the end.
#[tokio::test]
async fn a_bucketed_sale_with_a_payment_step_returns_each_unit_once() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create_with(
        &app,
        6,
        3,
        json!({ "pay_within_s": 2, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    let mut orders = Vec::new();
    for i in 0..6 {
        let user = format!("payer-{i}");
        let (status, body) = buy(&app, voucher, &user).await;
        assert_eq!(status, 202, "{user}: {body}");
        orders.push((user, body["order_id"].as_str().unwrap().to_string()));
    }
    let buckets_used: BTreeSet<u16> = orders
        .iter()
        .map(|(u, _)| Bucket::of_user(voucher, 3, u).index())
        .collect();
    assert!(buckets_used.len() > 1, "buyers of several buckets");
    // Sold out, and marked so.
    let late = (0..)
        .map(|i| format!("late-{i}"))
        .find(|u| Bucket::of_user(voucher, 3, u) != Bucket::of_user(voucher, 3, &orders[0].0))
        .unwrap();
    let (status, body) = buy(&app, voucher, &late).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("sold_out")));
    let marked: bool = ctx.conn().exists(keys::sold_out(voucher)).await.unwrap();
    assert!(marked);
    // The first buyer cancels: the unit is back in their bucket and the mark is gone;
    // the late buyer, of another bucket, gets it.
    let (status, body) = close(&app, &orders[0].1, &orders[0].0, false).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let marked: bool = ctx.conn().exists(keys::sold_out(voucher)).await.unwrap();
    assert!(!marked, "a returned unit clears the mark");
    let (status, body) = buy(&app, voucher, &late).await;
    assert_eq!(status, 202, "{body}");
    // One buyer pays; the other four and the late buyer let their orders expire.
    let (status, body) = close(&app, &orders[1].1, &orders[1].0, true).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("paid")),
        "{body}"
    );
    drain_all(&ctx, voucher, 7).await;
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    for _ in 0..3 {
        ctx.drain(ctx.drainer_config()).await;
    }
    let rows = rows(&ctx, voucher).await;
    let mut by_status: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &rows {
        *by_status.entry(r.2.as_str()).or_default() += 1;
    }
    assert_eq!(
        by_status,
        BTreeMap::from([("cancelled", 1), ("expired", 5), ("paid", 1)])
    );
    // Every unit but the paid one is back, once, in Redis and in the database.
    assert_eq!(stocks(&ctx, voucher, 3).await.iter().sum::<i64>(), 5);
    assert_eq!(ctx.db_stock_left(voucher).await, 5);
    let (status, _) = buy(&app, voucher, "after-the-expiries").await;
    assert_eq!(status, 202);
}

/// A unit cancelled in one bucket (B) and sold by borrowing to a buyer of another (C),
/// drained in a run that reads C's new order before any sweep of B's close: the batch
/// transaction settles every bucket's closes under the voucher's row lock before its
/// insert, so the new order waits for payment (never `rejected` for a unit the database
/// did not yet know was back), and Redis and the database agree on every unit.
#[tokio::test]
async fn a_unit_cancelled_in_one_bucket_and_borrowed_by_another_is_drained_there_first() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create_with(
        &app,
        3,
        3,
        json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    // One buyer per bucket: every bucket sells its one unit.
    let of_bucket = |b: u16, prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|u| Bucket::of_user(voucher, 3, u).index() == b)
            .unwrap()
    };
    let mut orders = Vec::new();
    for b in 0..3 {
        let user = of_bucket(b, "buyer");
        let (status, body) = buy(&app, voucher, &user).await;
        assert_eq!(status, 202, "{user}: {body}");
        orders.push((user, body["order_id"].as_str().unwrap().to_string()));
    }
    assert_eq!(stocks(&ctx, voucher, 3).await, [0, 0, 0]);
    drain_all(&ctx, voucher, 3).await;
    assert_eq!(ctx.db_stock_left(voucher).await, 0);

    // A run long enough to poll the open sale's buckets after its survey (and to survey
    // again only after it ends): B's close is settled by C's batch, or not at all.
    let mut long = ctx.drainer_config();
    long.max_run = Duration::from_millis(3_000);
    let run = {
        let ctx = &ctx;
        async move { ctx.drain(long).await }
    };
    let act = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (b_user, b_order) = &orders[1];
        let (status, body) = close(&app, b_order, b_user, false).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (200, Some("cancelled")),
            "{body}"
        );
        let late = of_bucket(2, "late");
        let (status, body) = buy(&app, voucher, &late).await;
        assert_eq!(status, 202, "{late} borrows the returned unit: {body}");
        body["order_id"].as_str().unwrap().to_string()
    };
    let (_, late_order) = tokio::join!(run, act);
    let rows = rows(&ctx, voucher).await;
    let late_row = rows.iter().find(|r| r.0 == late_order);
    assert_eq!(
        late_row.map(|r| r.2.as_str()),
        Some("awaiting_payment"),
        "the borrowed unit's order after one run: {rows:?}"
    );
    assert_eq!(stocks(&ctx, voucher, 3).await.iter().sum::<i64>(), 0);
    assert_eq!(ctx.db_stock_left(voucher).await, 0, "{rows:?}");
    let mut by_status: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &rows {
        *by_status.entry(r.2.as_str()).or_default() += 1;
    }
    assert_eq!(
        by_status,
        BTreeMap::from([("awaiting_payment", 3), ("cancelled", 1)])
    );
}

/// `seckill reconcile` reads every bucket: a clean sale reports nothing; an admitted
/// order lost from its bucket's stream is found and re-enqueued into that bucket.
#[tokio::test]
async fn reconcile_reads_every_bucket() {
    use seckill_cli::ops::reconcile::{class, reconcile};
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    let voucher = create(&app, 30, 3).await;
    for i in 0..12 {
        let (status, _) = buy(&app, voucher, &format!("r-{i}")).await;
        assert_eq!(status, 202);
    }
    drain_all(&ctx, voucher, 12).await;
    let b = seckill_cli::ops::Backends::connect(&ctx.redis.config(), &ctx.data_api_config())
        .await
        .unwrap();
    let clean = reconcile(&b, voucher, false).await.unwrap();
    assert!(clean.discrepancies.is_empty(), "{clean:?}");
    assert_eq!((clean.buyers, clean.db_orders), (12, 12));
    // An admitted order of bucket 2 whose stream entry is lost before it was drained.
    let user = (0..)
        .map(|i| format!("lost-{i}"))
        .find(|u| Bucket::of_user(voucher, 3, u).index() == 2)
        .unwrap();
    let (status, body) = buy(&app, voucher, &user).await;
    assert_eq!(status, 202);
    let order = body["order_id"].as_str().unwrap().to_string();
    let k2 = VoucherKeys::new(Bucket::of_user(voucher, 3, &user));
    let entries: Vec<(String, Vec<(String, String)>)> = ctx
        .conn()
        .xrevrange_count(&k2.orders, "+", "-", 1)
        .await
        .unwrap();
    let _: i64 = ctx.conn().xdel(&k2.orders, &[&entries[0].0]).await.unwrap();
    let found = reconcile(&b, voucher, true).await.unwrap();
    let lost = found
        .class(class::ADMITTED_LOST)
        .expect("the lost order is found");
    assert_eq!(lost.count, 1, "{found:?}");
    assert!(found.clean_after(), "{found:?}");
    drain_all(&ctx, voucher, 13).await;
    let rows = rows(&ctx, voucher).await;
    assert!(
        rows.iter()
            .any(|r| r.0 == order && r.1 == user && r.2 == "confirmed")
    );
    let after = reconcile(&b, voucher, false).await.unwrap();
    assert!(after.discrepancies.is_empty(), "{after:?}");

    // A malformed entry in bucket 1's stream is dead-lettered there, and the operator's
    // tools find it there.
    let b1 = Bucket::all(voucher, 3).nth(1).unwrap();
    let _: String = ctx
        .conn()
        .xadd(
            VoucherKeys::new(b1).orders,
            "*",
            &[("order_id", "not-a-number")],
        )
        .await
        .unwrap();
    ctx.drain(ctx.drainer_config()).await;
    let letters = seckill_cli::ops::dead_letters::list(&b, voucher)
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].bucket, b1);
    assert!(letters[0].not_replayable.is_some());
    let s = seckill_cli::ops::status::voucher_status(&b, voucher)
        .await
        .unwrap();
    assert_eq!(s.dead_letters, 1);
    let found = reconcile(&b, voucher, false).await.unwrap();
    assert!(found.class(class::DEAD_LETTERED).is_some(), "{found:?}");
}

/// Before anything was sold, a bucket missing (a preload that stopped part-way, bucket
/// 0 last) gets its share back from the repair; a voucher may be created from an
/// expected peak rate; a give sent twice (a retried script) moves its units once.
#[tokio::test]
async fn a_preload_cut_short_a_peak_rate_and_a_retried_give() {
    let ctx = DrainCtx::start_with(RedisServer::cluster(3, 0)).await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let app = App::new(&cfg).await;
    // 25,000 admissions/s at the peak: one bucket per 10,000/s.
    let voucher = create_with(&app, 30, 3, json!({})).await;
    let from_peak = {
        let now = now_millis();
        let body = json!({
            "title": "from a peak rate",
            "stock": 30,
            "expected_peak_per_s": 25_000,
            "begins_at": format_rfc3339_millis(now - 1_000),
            "ends_at": format_rfc3339_millis(now + 3_600_000),
        });
        let req = request(
            "POST",
            "/vouchers",
            Some(&token("admin", true)),
            Some(&body.to_string()),
            None,
        );
        call(&app, req).await
    };
    assert_eq!(
        (from_peak.0, from_peak.1["buckets"].as_u64()),
        (201, Some(3)),
        "{}",
        from_peak.1
    );
    let both = json!({"title": "t", "stock": 30, "buckets": 2, "expected_peak_per_s": 1,
        "begins_at": format_rfc3339_millis(now_millis()), "ends_at": format_rfc3339_millis(now_millis() + 60_000)});
    let req = request(
        "POST",
        "/vouchers",
        Some(&token("admin", true)),
        Some(&both.to_string()),
        None,
    );
    assert_eq!(call(&app, req).await.0, 400);

    // The preload stopped before bucket 0: its keys never written.
    let b0 = VoucherKeys::new(voucher);
    let _: () = ctx
        .conn()
        .del(&[
            &b0.sale,
            &b0.buyers,
            &b0.orders,
            &b0.deadlines,
            &b0.closed,
            &b0.to_settle,
        ])
        .await
        .unwrap();
    let fresh = App::new(&cfg).await;
    let (status, body) = buy(&fresh, voucher, "first-buyer").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        stocks(&ctx, voucher, 3).await.iter().sum::<i64>(),
        29,
        "every share back"
    );

    // A give sent twice with one transfer id.
    let [_, b1, b2]: [Bucket; 3] = Bucket::all(voucher, 3)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let before = ctx.sales.stock_left(b1).await.unwrap().unwrap();
    let mut answers = Vec::new();
    for _ in 0..2 {
        answers.push(give(&ctx, b1, b2, "retried.0").await.0);
    }
    assert_eq!(
        answers[0], answers[1],
        "the retry answers the recorded units"
    );
    assert_eq!(
        ctx.sales.stock_left(b1).await.unwrap().unwrap(),
        before - answers[0]
    );
}

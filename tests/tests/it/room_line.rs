//! Returned units go to the line, not to the fastest: a voucher with a waiting room holds
//! a unit an order gives back (cancelled, expired) for the earliest waiting position
//! still looking (`lua/close.lua`, `lua/queue.lua`, `lua/admit.lua`; with several stock
//! buckets also `lua/give.lua` and `lua/take.lua`, which move it across slots),
//! against a private Redis and a fresh database, with function instances called with
//! fixture events.
//!
//! What is proved: bots behind in line that hammer the admission and the queue with
//! valid entry tokens never get a returned unit while someone ahead of them is still
//! looking; positions that stopped looking are skipped; an offer that lapses passes to
//! the next and is never made again to the one who let it lapse; a unit nobody in line
//! claims is free for anyone once its hold ends; nothing is oversold.

use redis::AsyncCommands;
use seckill_http::App;
use seckill_shared::adapters::redis::CloseAction;
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{Bucket, VoucherId};
use seckill_shared::keys;
use seckill_shared::protocol::sale_fields;
use seckill_tests::drainer::DrainCtx;
use seckill_tests::harness::{
    Backends, TEST_CURRENCY, TEST_PRICE_MINOR, call, request, test_http_config, token,
};
use serde_json::{Value, json};

use crate::waiting_room::{buy_with, create_room, queue, stock_left};

/// A room of `stock` units, everyone served at once, each order payable for 10 minutes.
async fn room_with_payment(app: &App, stock: i64) -> String {
    let pay =
        json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY });
    create_room(app, stock, 1_000, -100, pay).await
}

/// Joins `user` and returns their entry token (everyone is served at once here).
async fn join(app: &App, voucher: &str, user: &str) -> String {
    let (status, s) = queue(app, voucher, user, true).await;
    assert_eq!(
        (status, s["status"].as_str()),
        (200, Some("served")),
        "{user}: {s}"
    );
    s["entry_token"].as_str().unwrap().to_string()
}

async fn buy(app: &App, voucher: &str, user: &str, entry: &str) -> String {
    let (status, body) = buy_with(app, voucher, user, entry).await;
    assert_eq!(status, 202, "{user}: {body}");
    body["order_id"].as_str().unwrap().to_string()
}

async fn cancel(app: &App, user: &str, order: &str) {
    let path = format!("/orders/{order}/cancel");
    let (status, body) = call(
        app,
        request("POST", &path, Some(&token(user, false)), None, None),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
}

/// A look at the queue: its status and whether it carries an offer.
async fn look(app: &App, voucher: &str, user: &str) -> (String, Option<String>, Value) {
    let (status, s) = queue(app, voucher, user, false).await;
    assert_eq!(status, 200, "{user}: {s}");
    let offer = s["offer_expires_at"]
        .as_str()
        .map(|_| s["entry_token"].as_str().unwrap().to_string());
    (s["status"].as_str().unwrap().to_string(), offer, s)
}

/// Two units, bought by the first two in line; behind them a person (position 4) who
/// looks every few seconds, a position (3) that never looks again, and four bots
/// (5-8) hammering the queue and the admission with their valid tokens. Each unit that
/// comes back goes to the earliest position still looking: the person first, then the
/// first bot in line, never the bot that asks most; the silent position's token buys
/// nothing; the stock never goes below zero.
#[tokio::test]
async fn a_returned_unit_goes_to_the_earliest_position_still_looking_not_the_fastest() {
    let b = Backends::start().await;
    let (app, other) = (
        App::new(&b.http_config()).await,
        App::new(&b.http_config()).await,
    );
    let voucher = room_with_payment(&app, 2).await;
    let mut tokens = Vec::new();
    for u in [
        "a1", "a2", "silent3", "person4", "bot5", "bot6", "bot7", "bot8",
    ] {
        tokens.push((u, join(&app, &voucher, u).await));
    }
    let a1 = buy(&app, &voucher, "a1", &tokens[0].1).await;
    let a2 = buy(&other, &voucher, "a2", &tokens[1].1).await;
    // Everyone behind looks once and is told to wait (the silent one never looks).
    for (u, _) in &tokens[3..] {
        let (status, _, s) = look(&app, &voucher, u).await;
        assert_eq!(status, "sold_out", "{u}: {s}");
        assert_eq!(s["units_may_return"], true, "{s}");
    }

    cancel(&app, "a1", &a1).await;
    assert_eq!(stock_left(&app, &voucher).await, 1, "the unit is back");
    // The bots hammer, on both instances: nothing for them, no offer either.
    for app in [&app, &other] {
        for _ in 0..5 {
            for (u, t) in &tokens[4..] {
                let (status, body) = buy_with(app, &voucher, u, t).await;
                assert_eq!(
                    (status, body["code"].as_str()),
                    (409, Some("sold_out")),
                    "{u}: {body}"
                );
                let (status, offer, s) = look(app, &voucher, u).await;
                assert_eq!((status.as_str(), offer), ("sold_out", None), "{u}: {s}");
                assert_eq!(
                    s["expected_wait_ms"], 5_000,
                    "held units: look again soon: {s}"
                );
            }
        }
    }
    // The silent position's token buys nothing held.
    let (status, body) = buy_with(&app, &voucher, "silent3", &tokens[2].1).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );
    // The person looks, a few seconds later as people do: the unit is theirs.
    let (status, offer, s) = look(&other, &voucher, "person4").await;
    assert_eq!(status, "served", "{s}");
    let offer = offer.expect("an offer for the earliest position still looking");
    let person = buy(&app, &voucher, "person4", &offer).await;
    assert_eq!(stock_left(&app, &voucher).await, 0);

    // The second unit comes back: the first bot in line gets it, however often the
    // others ask first.
    cancel(&other, "a2", &a2).await;
    for _ in 0..3 {
        for (u, t) in tokens[5..].iter().rev() {
            let (status, body) = buy_with(&app, &voucher, u, t).await;
            assert_eq!(status, 409, "{u}: {body}");
            let (_, offer, s) = look(&app, &voucher, u).await;
            assert_eq!(offer, None, "{u} is behind bot5: {s}");
        }
    }
    let (status, offer, s) = look(&app, &voucher, "bot5").await;
    assert_eq!(status, "served", "{s}");
    buy(&other, &voucher, "bot5", &offer.unwrap()).await;
    // The person's order still holds its unit; nothing was sold twice.
    let (status, body) = buy_with(&app, &voucher, "person4", &tokens[3].1).await;
    assert_eq!(
        (status, body["order_id"].as_str()),
        (409, Some(person.as_str())),
        "{body}"
    );
    assert_eq!(stock_left(&app, &voucher).await, 0);
    let id: VoucherId = voucher.parse().unwrap();
    let k = seckill_shared::keys::VoucherKeys::new(id);
    let (stock, held): (i64, i64) = redis::pipe()
        .hget(&k.sale, sale_fields::STOCK)
        .hget(&k.sale, sale_fields::HELD)
        .query_async(&mut b.sales.conn())
        .await
        .unwrap();
    assert_eq!((stock, held), (0, 0));
    b.cleanup().await;
}

/// The queue script itself, with short windows (the real ones are a minute and more):
/// waiters whose last look is too old are skipped for the next still looking; an offer
/// that lapses passes on and is never made to its holder again; units nobody in line
/// takes are free for anyone once their hold ends.
#[tokio::test]
async fn offers_lapse_and_pass_on_and_a_hold_ends_for_anyone() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let voucher = room_with_payment(&app, 2).await;
    let id: VoucherId = voucher.parse().unwrap();
    let mut t = std::collections::BTreeMap::new();
    for u in ["u1", "u2", "w3", "w4", "w5", "late6"] {
        t.insert(u, join(&app, &voucher, u).await);
    }
    let u1 = buy(&app, &voucher, "u1", &t["u1"]).await;
    let u2 = buy(&app, &voucher, "u2", &t["u2"]).await;
    let script = redis::Script::new(include_str!("../../../lua/queue.lua"));
    let k = seckill_shared::keys::VoucherKeys::new(id);
    // One look with a 400 ms "still looking" window and 300 ms offers: the offer's lapse
    // time (0: none).
    let look = |user: &'static str| {
        let (script, k, mut conn) = (&script, &k, b.sales.conn());
        async move {
            let reply: Vec<i64> = script
                .key(&k.sale)
                .key(keys::queue(id))
                .key(keys::offers(id))
                .key(keys::waiters(id))
                .key(keys::looked(id))
                .key(&k.buyers)
                .arg(user)
                .arg("0")
                .arg(60_000)
                .arg(400)
                .arg(300)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            reply[9]
        }
    };
    for u in ["w3", "w4", "w5"] {
        assert_eq!(look(u).await, 0, "{u} waits");
    }
    cancel(&app, "u1", &u1).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // w3 and w4 stopped looking; w5 looks now: the unit is offered to w5.
    assert!(look("w5").await > 0, "w5 is the earliest still looking");
    assert_eq!(look("w3").await, 0, "w3 is back, but the unit is w5's now");
    // w5 lets the offer lapse: it passes to w3 (looking again), never back to w5.
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    assert!(look("w3").await > 0, "the lapsed offer passes on");
    assert_eq!(look("w5").await, 0);
    let (status, body) = buy_with(&app, &voucher, "w5", &t["w5"]).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );

    // w3 lets it lapse too, and the second unit comes back; nobody in line looks before
    // the hold ends: both units are anyone's, a buyer who never looked included.
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    cancel(&app, "u2", &u2).await;
    let _: () = b
        .sales
        .conn()
        .hset(&k.sale, sale_fields::HELD_UNTIL, 0)
        .await
        .unwrap();
    buy(&app, &voucher, "late6", &t["late6"]).await;
    buy(&app, &voucher, "w4", &t["w4"]).await;
    let (status, body) = buy_with(&app, &voucher, "w5", &t["w5"]).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );
    let (stock, held): (i64, i64) = redis::pipe()
        .hget(&k.sale, sale_fields::STOCK)
        .hget(&k.sale, sale_fields::HELD)
        .query_async(&mut b.sales.conn())
        .await
        .unwrap();
    assert_eq!((stock, held), (0, 0));
    b.cleanup().await;
}

/// The queue is lost mid-sale, twice: first its key alone, then every key of the sale
/// (as a Redis that lost everything). Each time, the first calls after the loss (on
/// two instances, newcomers joining among the queued looking) find the queue rebuilt
/// from the database before anyone gets a place: everyone keeps theirs, and the
/// newcomers come after the whole line, never inside it.
#[tokio::test]
async fn a_queue_lost_mid_sale_comes_back_in_the_same_order_and_nobody_jumps_it() {
    let b = Backends::start().await;
    let (one, two) = (
        App::new(&b.http_config()).await,
        App::new(&b.http_config()).await,
    );
    let voucher = create_room(&one, 5, 2, -100, json!({})).await;
    let id: VoucherId = voucher.parse().unwrap();
    let mut line = Vec::new();
    for i in 0..12 {
        let u = format!("q{i:02}");
        let (status, s) = queue(&one, &voucher, &u, true).await;
        assert_eq!(status, 200, "{s}");
        line.push((u, s["position"].as_u64().unwrap()));
    }
    assert_eq!(
        line.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        (1..=12).collect::<Vec<_>>()
    );
    let k = seckill_shared::keys::VoucherKeys::new(id);
    let mut conn = b.sales.conn();
    let mut next_newcomer = 0;
    for (loss, keys) in [
        ("the queue alone", vec![keys::queue(id)]),
        (
            "every key of the sale",
            k.all()
                .iter()
                .map(|k| k.to_string())
                .chain([
                    keys::queue(id),
                    keys::offers(id),
                    keys::waiters(id),
                    keys::looked(id),
                ])
                .collect(),
        ),
    ] {
        let _: i64 = conn.del(&keys).await.unwrap();
        // Newcomers join first, on both instances, while the queued look.
        let newcomers: Vec<String> = (0..4)
            .map(|i| format!("new{}", next_newcomer + i))
            .collect();
        next_newcomer += 4;
        let joins = newcomers.iter().enumerate().map(|(i, u)| {
            let app = if i % 2 == 0 { &one } else { &two };
            let voucher = voucher.clone();
            async move { (u.clone(), queue(app, &voucher, u, true).await) }
        });
        let looks = line.iter().enumerate().map(|(i, (u, _))| {
            let app = if i % 2 == 0 { &two } else { &one };
            let voucher = voucher.clone();
            async move { (u.clone(), queue(app, &voucher, u, false).await) }
        });
        let (joined, looked) = futures::join!(
            futures::future::join_all(joins),
            futures::future::join_all(looks)
        );
        let last = line.last().unwrap().1;
        for (u, (status, s)) in looked {
            // A call that met another instance's restore is asked again, as a client does.
            let s = if status == 503 {
                queue(&one, &voucher, &u, false).await.1
            } else {
                s
            };
            let held = line.iter().find(|(v, _)| *v == u).unwrap().1;
            assert_eq!(
                s["position"].as_u64(),
                Some(held),
                "{loss}: {u} kept their place: {s}"
            );
        }
        let mut given = Vec::new();
        for (u, (status, s)) in joined {
            let s = if status == 503 {
                queue(&two, &voucher, &u, true).await.1
            } else {
                s
            };
            let p = s["position"]
                .as_u64()
                .unwrap_or_else(|| panic!("{loss}: {u}: {s}"));
            assert!(
                p > last,
                "{loss}: newcomer {u} got {p}, inside the line of {last}"
            );
            given.push((u, p));
        }
        given.sort_by_key(|(_, p)| *p);
        assert_eq!(
            given.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
            (last + 1..=last + 4).collect::<Vec<_>>(),
            "{loss}"
        );
        line.extend(given);
    }
    // The database holds every place, once, and its queries read only the voucher's rows
    // by the primary key on a table never analysed.
    use mysql_async::prelude::Queryable;
    let mut db = seckill_tests::mysql::connect(&seckill_tests::mysql::url_with_database(
        &b.mysql_url,
        &b.database,
    ))
    .await;
    let rows: Vec<(u64, u64)> = db
        .exec(
            "SELECT COUNT(*), COUNT(DISTINCT position) FROM queue_positions WHERE voucher_id = ?",
            (id.get(),),
        )
        .await
        .unwrap();
    assert_eq!(rows, [(20, 20)]);
    use seckill_shared::adapters::data_api::queue::{MAX_POSITION_SQL, positions_page_sql};
    for sql in [MAX_POSITION_SQL.to_string(), positions_page_sql()] {
        let sql = sql
            .replace(":v", &id.get().to_string())
            .replace(":after", "3");
        let plan: Vec<mysql_async::Row> = db.query(format!("EXPLAIN {sql}")).await.unwrap();
        for row in plan {
            let key: Option<String> = row.get::<Option<String>, _>("key").flatten();
            let kind: Option<String> = row.get::<Option<String>, _>("type").flatten();
            assert!(
                key.as_deref() == Some("PRIMARY") || kind.is_none(),
                "{sql}: {kind:?} on {key:?}"
            );
        }
    }
    db.disconnect().await.ok();
    b.cleanup().await;
}

/// Each bucket's (stock, held) in Redis, and the open transfer records of every bucket.
async fn buckets_state(
    conn: &mut seckill_shared::adapters::redis::RedisConn,
    id: VoucherId,
    buckets: u16,
) -> (Vec<(i64, i64)>, usize) {
    let mut state = Vec::new();
    let mut open = 0;
    for bucket in Bucket::all(id, buckets) {
        let k = seckill_shared::keys::VoucherKeys::new(bucket);
        let (stock, held, records): (i64, Option<i64>, Vec<String>) = redis::pipe()
            .hget(&k.sale, sale_fields::STOCK)
            .hget(&k.sale, sale_fields::HELD)
            .hkeys(&k.transfers)
            .query_async(conn)
            .await
            .unwrap();
        state.push((stock, held.unwrap_or(0)));
        open += records.iter().filter(|r| *r != "~").count();
    }
    (state, open)
}

/// A room whose stock is split over three buckets keeps the same promise across slots.
/// Three units, one per bucket, bought by the first three in line; behind them two
/// people (positions 4 and 5, of buckets 2 and 1) and three bots, one per bucket, that
/// hammer the admission and the queue on two instances. A unit cancelled in bucket 1
/// goes to the line in bucket 0 at once, and home with its offer to the person ahead,
/// who buys it from bucket 2; a unit whose closer died right after the close (the
/// cancel recorded, its hand-over not made) is delivered to the line by the drainer's
/// survey, and goes to the next person. No bot ever gets one, nothing is oversold, and
/// no unit is left held or on its way.
#[tokio::test]
async fn a_room_of_several_buckets_gives_returned_units_to_the_line_across_slots() {
    const BUCKETS: u16 = 3;
    let ctx = DrainCtx::start().await;
    let cfg = test_http_config(ctx.redis.config(), ctx.data_api_config());
    let (app, other) = (App::new(&cfg).await, App::new(&cfg).await);
    let more = json!({
        "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY,
        "buckets": BUCKETS,
    });
    let voucher = create_room(&app, 3, 1_000, -100, more).await;
    let id: VoucherId = voucher.parse().unwrap();
    // Buyers named for the bucket they belong to.
    let named = |prefix: &str, bucket: u16| -> String {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|u| Bucket::of_user(id, BUCKETS, u).index() == bucket)
            .unwrap()
    };
    let (a, c, d) = (named("a", 1), named("c", 2), named("d", 0));
    let (p, q) = (named("person", 2), named("person-q", 1));
    let bots: Vec<String> = (0..BUCKETS)
        .map(|b| named(&format!("bot{b}-"), b))
        .collect();
    let mut tokens = std::collections::HashMap::new();
    for u in [&a, &c, &d, &p, &q].into_iter().chain(bots.iter()) {
        tokens.insert(u.clone(), join(&app, &voucher, u).await);
    }
    let a_order = buy(&app, &voucher, &a, &tokens[&a]).await;
    let c_order = buy(&other, &voucher, &c, &tokens[&c]).await;
    buy(&app, &voucher, &d, &tokens[&d]).await;
    // Everyone behind finds it sold out, and is told so by the queue.
    for u in [&p, &q].into_iter().chain(bots.iter()) {
        let (status, body) = buy_with(&other, &voucher, u, &tokens[u]).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (409, Some("sold_out")),
            "{u}: {body}"
        );
        let (status, offer, s) = look(&app, &voucher, u).await;
        assert_eq!((status.as_str(), offer), ("sold_out", None), "{u}: {s}");
    }
    let hammer = |round: usize| {
        let (bots, tokens, voucher) = (&bots, &tokens, &voucher);
        let apps = [&app, &other];
        async move {
            for _ in 0..round {
                for (i, u) in bots.iter().enumerate() {
                    let app = apps[i % 2];
                    let (status, body) = buy_with(app, voucher, u, &tokens[u]).await;
                    assert_eq!(
                        (status, body["code"].as_str()),
                        (409, Some("sold_out")),
                        "{u}: {body}"
                    );
                    let (status, offer, s) = look(apps[(i + 1) % 2], voucher, u).await;
                    assert_eq!((status.as_str(), offer), ("sold_out", None), "{u}: {s}");
                }
            }
        }
    };

    // Cancelled in bucket 1: held for the line in bucket 0 at once, nothing in transit.
    cancel(&app, &a, &a_order).await;
    let mut conn = ctx.conn();
    assert_eq!(
        buckets_state(&mut conn, id, BUCKETS).await,
        (vec![(1, 1), (0, 0), (0, 0)], 0)
    );
    hammer(3).await;
    let (_, offer, s) = look(&other, &voucher, &q).await;
    assert_eq!(offer, None, "q is behind p: {s}");
    let (status, offer, s) = look(&other, &voucher, &p).await;
    assert_eq!(status, "served", "{s}");
    buy(&app, &voucher, &p, &offer.expect("p's offer")).await;
    assert_eq!(
        buckets_state(&mut conn, id, BUCKETS).await,
        (vec![(0, 0), (0, 0), (0, 0)], 0),
        "the unit went home with p's offer to bucket 2 and was bought there"
    );

    // Closed in bucket 2 by a closer that died before the hand-over: the unit waits in
    // bucket 2's records, sold to nobody, until the drainer's survey delivers it.
    let c_id = c_order.parse().unwrap();
    let user = seckill_shared::domain::UserId::parse(&c).unwrap();
    let closed = ctx
        .sales
        .close(
            Bucket::of_user(id, BUCKETS, &c),
            c_id,
            &user,
            &CloseAction::Cancel,
        )
        .await
        .unwrap();
    assert!(closed.is_some());
    assert_eq!(
        buckets_state(&mut conn, id, BUCKETS).await,
        (vec![(0, 0), (0, 0), (0, 0)], 1)
    );
    hammer(2).await;
    tokio::time::sleep(std::time::Duration::from_millis(
        transfers::STALE_TRANSFER_MS as u64 + 200,
    ))
    .await;
    ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        buckets_state(&mut conn, id, BUCKETS).await,
        (vec![(1, 1), (0, 0), (0, 0)], 0)
    );
    hammer(2).await;
    let (status, offer, s) = look(&app, &voucher, &q).await;
    assert_eq!(status, "served", "{s}");
    buy(&other, &voucher, &q, &offer.expect("q's offer")).await;
    assert_eq!(
        buckets_state(&mut conn, id, BUCKETS).await,
        (vec![(0, 0), (0, 0), (0, 0)], 0)
    );
    hammer(1).await;
    assert_eq!(stock_left(&app, &voucher).await, 0);
}

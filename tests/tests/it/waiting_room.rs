//! The waiting room against real parts: a private Redis, a fresh database behind the
//! Data API, and several function instances called with fixture events.
//!
//! What is proved: positions are exactly 1..n in the order joins reached Redis (a join
//! that finished before another began holds the smaller position), a refresh or a retry
//! keeps one's place, entry follows position exactly, and nobody buys a voucher with a
//! room without an entry token of their own for that voucher; tokens of another buyer,
//! another voucher, expired, forged or not ours at all are refused before Redis is
//! asked; everybody still waiting learns of a sell-out on their next look; a voucher
//! without a room costs what it did. With the features it meets: a payment step (a
//! cancelled unit goes to the next in line) and a sale Redis lost (repaired from a
//! look; the line kept).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use rand::seq::SliceRandom;
use redis::AsyncCommands;
use seckill_http::App;
use seckill_shared::domain::{
    UserId, VoucherId, format_rfc3339_millis, now_millis, parse_rfc3339_millis,
};
use seckill_shared::entry;
use seckill_tests::harness::{
    Backends, TEST_CURRENCY, TEST_ENTRY_PREVIOUS, TEST_ENTRY_SECRET, TEST_PRICE_MINOR, buy, call,
    create_voucher, provider_pays, request, token, voucher_body,
};
use seckill_tests::redis::ReplyDropper;
use serde_json::{Value, json};

/// Creates a voucher with a waiting room of `rate` entries a second, on sale from
/// `begins_offset_ms` from now for an hour; `more` adds fields to the request.
pub(crate) async fn create_room(
    app: &App,
    stock: i64,
    rate: i64,
    begins_offset_ms: i64,
    more: Value,
) -> String {
    let mut body = voucher_body("queued sale", stock, begins_offset_ms, more);
    body["entry_rate_per_s"] = json!(rate);
    let created = create_voucher(app, &body).await;
    assert_eq!(created["entry_rate_per_s"], json!(rate), "{created}");
    created["id"].as_str().unwrap().to_string()
}

/// `POST` (join) or `GET` (look) `/vouchers/{id}/queue` as `user`.
pub(crate) async fn queue(app: &App, voucher: &str, user: &str, join: bool) -> (u16, Value) {
    let path = format!("/vouchers/{voucher}/queue");
    let method = if join { "POST" } else { "GET" };
    call(
        app,
        request(method, &path, Some(&token(user, false)), None, None),
    )
    .await
}

/// An admission as `user` carrying `entry` as `Seckill-Entry`.
pub(crate) async fn buy_with(app: &App, voucher: &str, user: &str, entry: &str) -> (u16, Value) {
    let path = format!("/vouchers/{voucher}/seckill");
    let mut req = request("POST", &path, Some(&token(user, false)), None, None);
    req.headers_mut()
        .insert("seckill-entry", entry.parse().expect("header value"));
    call(app, req).await
}

/// `user`'s look at the queue answers `sold_out`, saying whether a unit may come back
/// (orders still await payment; then it names when to look again, 1-30 s).
async fn assert_looks_sold_out(app: &App, voucher: &str, user: &str, may_return: bool) {
    let (status, s) = queue(app, voucher, user, false).await;
    assert_eq!(
        (
            status,
            s["status"].as_str(),
            s["units_may_return"].as_bool()
        ),
        (200, Some("sold_out"), Some(may_return)),
        "{user}: {s}"
    );
    let wait = s["expected_wait_ms"].as_i64().unwrap();
    if may_return {
        assert!((1_000..=30_000).contains(&wait), "{user}: {s}");
    } else {
        assert_eq!(wait, 0, "{user}: {s}");
    }
}

/// Buyers `<prefix>0` ... `<prefix>{n-1}` join one after the other and buy with their
/// entry token when served at once (until the voucher is sold out): the (buyer, order)
/// of every `202`.
async fn join_and_buy(app: &App, voucher: &str, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut bought = Vec::new();
    for i in 0..n {
        let u = format!("{prefix}{i}");
        let (status, s) = queue(app, voucher, &u, true).await;
        assert_eq!(status, 200, "{s}");
        let Some(t) = s["entry_token"].as_str() else {
            continue;
        };
        let res = buy_with(app, voucher, &u, t).await;
        if res.0 == 202 {
            bought.push((u, res.1["order_id"].as_str().unwrap().to_string()));
        }
    }
    bought
}

/// Units left as `GET /vouchers/{id}` says.
pub(crate) async fn stock_left(app: &App, voucher: &str) -> i64 {
    let (status, v) = call(
        app,
        request("GET", &format!("/vouchers/{voucher}"), None, None, None),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["stock_left"].as_i64().unwrap()
}

fn user(i: usize) -> String {
    format!("buyer-{i:06}")
}

/// One join as a caller saw it: the position it got, and the logical times it was sent
/// and answered (a shared counter: a join answered at `end` was over before any join
/// sent at `start >= end`).
#[derive(Debug, Clone, Copy)]
struct Join {
    position: u64,
    start: u64,
    end: u64,
}

/// 50,000 buyers join in shuffled order from 200 concurrent callers spread over four
/// instances: the positions are exactly 1..=50,000, one per buyer; a join that was
/// over before another began holds the smaller position; joining again keeps the
/// position; at one moment the served buyers are exactly the first positions and the
/// rest wait in position order; served buyers buy once with their own token, and
/// nobody buys without one.
#[tokio::test]
async fn fifty_thousand_joins_enter_in_arrival_order_and_only_with_a_token() {
    const BUYERS: usize = 50_000;
    const RATE: i64 = 100;
    let b = Backends::start().await;
    let apps: Vec<Arc<App>> = futures::future::join_all(
        (0..4).map(|_| async { Arc::new(App::new(&b.http_config()).await) }),
    )
    .await;
    // On sale since a second ago: about RATE more positions enter each second.
    let voucher = create_room(&apps[0], 300, RATE, -1_000, json!({})).await;

    let mut order: Vec<usize> = (0..BUYERS).collect();
    order.shuffle(&mut rand::rng());
    let clock = Arc::new(AtomicU64::new(0));
    let joins: Vec<(usize, Join)> = futures::stream::iter(order.into_iter().enumerate())
        .map(|(n, i)| {
            let app = apps[n % apps.len()].clone();
            let (clock, voucher) = (clock.clone(), voucher.clone());
            async move {
                let start = clock.load(Ordering::SeqCst);
                let (status, body) = queue(&app, &voucher, &user(i), true).await;
                let end = clock.fetch_add(1, Ordering::SeqCst) + 1;
                assert_eq!(status, 200, "{body}");
                let position = body["position"].as_u64().expect("a position");
                (
                    i,
                    Join {
                        position,
                        start,
                        end,
                    },
                )
            }
        })
        .buffer_unordered(200)
        .collect()
        .await;

    // Exactly 1..=BUYERS, each buyer once.
    let mut positions: Vec<u64> = joins.iter().map(|(_, j)| j.position).collect();
    positions.sort_unstable();
    assert!(
        positions.iter().copied().eq(1..=BUYERS as u64),
        "positions are not exactly 1..={BUYERS}"
    );
    // Arrival order: for each join, every join answered before it was sent holds a
    // smaller position.
    let mut by_end: Vec<Join> = joins.iter().map(|(_, j)| *j).collect();
    by_end.sort_by_key(|j| j.end);
    let mut max_before = Vec::with_capacity(by_end.len());
    let mut running = 0;
    for j in &by_end {
        running = running.max(j.position);
        max_before.push((j.end, running));
    }
    let mut checked_pairs = 0u64;
    for (_, j) in &joins {
        let done_before = max_before.partition_point(|(end, _)| *end <= j.start);
        if done_before > 0 {
            let (_, max) = max_before[done_before - 1];
            assert!(
                max < j.position,
                "a join sent after one that got {max} was answered {}",
                j.position
            );
            checked_pairs += done_before as u64;
        }
    }
    assert!(
        checked_pairs > BUYERS as u64,
        "the callers overlapped too little to check"
    );

    let pos: BTreeMap<u64, usize> = joins.iter().map(|(i, j)| (j.position, *i)).collect();
    let position_of: BTreeMap<usize, u64> = joins.iter().map(|(i, j)| (*i, j.position)).collect();
    // Joining again, from another instance, keeps the place.
    for i in (0..BUYERS).step_by(997) {
        let (status, again) = queue(&apps[(i + 1) % 4], &voucher, &user(i), true).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["position"].as_u64(), Some(position_of[&i]), "{again}");
    }

    // A look at every tenth position, many at once: each answers its own position, a
    // served one carries a token, and the time a position is served never goes back as
    // the position grows.
    let looks: Vec<(u64, Value)> = futures::stream::iter(
        pos.iter()
            .filter(|(p, _)| *p % 10 == 1)
            .map(|(p, i)| (*p, *i)),
    )
    .map(|(p, i)| {
        let app = apps[i % apps.len()].clone();
        let voucher = voucher.clone();
        async move {
            let (status, body) = queue(&app, &voucher, &user(i), false).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["position"].as_u64(), Some(p), "{body}");
            (p, body)
        }
    })
    .buffered(200)
    .collect()
    .await;
    let served_at =
        |b: &Value| parse_rfc3339_millis(b["served_at"].as_str().unwrap(), "t").unwrap();
    let mut last = i64::MIN;
    for (p, body) in &looks {
        let at = served_at(body);
        assert!(at >= last, "position {p} is served before an earlier one");
        last = at;
        match body["status"].as_str() {
            Some("served") => {
                assert!(body["entry_token"].is_string(), "{body}");
                assert_eq!(body["expected_wait_ms"], 0, "{body}");
            }
            Some("waiting") => {
                assert!(body.get("entry_token").is_none(), "{body}");
                assert!(body["expected_wait_ms"].as_i64().unwrap() > 0, "{body}");
            }
            other => panic!("position {p}: {other:?}"),
        }
    }
    // Looked at one by one from a later position down to the first: time only moves
    // on, so once one is served every earlier one is too (entry follows arrival).
    let served_now = looks
        .iter()
        .filter(|(_, b)| b["status"] == "served")
        .count()
        * 10;
    assert!(
        served_now >= RATE as usize,
        "the first second's worth enters at the start"
    );
    let top = (served_now + 1_000).min(BUYERS) as u64;
    let (mut seen_served, mut seen_waiting) = (0u64, 0u64);
    for p in (1..=top).rev() {
        let (_, body) = queue(&apps[0], &voucher, &user(pos[&p]), false).await;
        if body["status"] == "served" {
            seen_served += 1;
        } else {
            assert_eq!(
                seen_served,
                0,
                "position {p} waits after {} was served",
                p + 1
            );
            seen_waiting += 1;
        }
    }
    assert!(
        seen_served >= RATE as u64 && seen_waiting > 0,
        "{seen_served} {seen_waiting}"
    );

    // Nobody buys without a token; no look took a unit.
    for i in (0..BUYERS).step_by(499) {
        let (status, refused) = buy(&apps[i % 4], &voucher, &user(i)).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (403, Some("entry_required")),
            "{refused}"
        );
    }
    assert_eq!(stock_left(&apps[0], &voucher).await, 300);
    // Up to 60 served buy once each with their own token, from any instance; the
    // same token again is `already_purchased` (one order per buyer), and a served
    // buyer's token does not let a waiting one in.
    let mut orders = HashSet::new();
    let served: Vec<&(u64, Value)> = looks
        .iter()
        .filter(|(_, b)| b["status"] == "served")
        .take(60)
        .collect();
    assert!(served.len() >= 10, "only {} served looked at", served.len());
    for (p, body) in served.iter().copied() {
        let i = pos[p];
        let t = body["entry_token"].as_str().unwrap();
        let (status, admitted) = buy_with(&apps[i % 4], &voucher, &user(i), t).await;
        assert_eq!(status, 202, "{admitted}");
        assert!(orders.insert(admitted["order_id"].as_str().unwrap().to_string()));
        let (status, again) = buy_with(&apps[(i + 1) % 4], &voucher, &user(i), t).await;
        assert_eq!(
            (status, again["code"].as_str()),
            (409, Some("already_purchased"))
        );
        assert_eq!(again["order_id"], admitted["order_id"]);
        let waiting = pos[&(BUYERS as u64)];
        let (status, refused) = buy_with(&apps[0], &voucher, &user(waiting), t).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (403, Some("entry_required"))
        );
    }
    assert_eq!(orders.len(), served.len());
    assert_eq!(
        stock_left(&apps[0], &voucher).await,
        300 - served.len() as i64
    );
    b.cleanup().await;
}

/// Every token that is not this buyer's for this voucher, unexpired and signed by us, is
/// `403 entry_required`, and takes nothing: another buyer's, another voucher's, an
/// expired one, a forged signature, a stretched expiry, an `alg: none` JWT, garbage.
/// A token signed with the previous secret (a rotation under way) still enters.
#[tokio::test]
async fn tokens_of_another_buyer_or_voucher_expired_or_forged_are_refused() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let voucher = create_room(&app, 10, 1_000, -1_000, json!({})).await;
    let other = create_room(&app, 10, 1_000, -1_000, json!({})).await;
    let (status, alice) = queue(&app, &voucher, "alice", true).await;
    assert_eq!(
        (status, alice["status"].as_str()),
        (200, Some("served")),
        "{alice}"
    );
    let alices = alice["entry_token"].as_str().unwrap().to_string();
    let (_, on_other) = queue(&app, &other, "carol", true).await;
    let carols_other = on_other["entry_token"].as_str().unwrap().to_string();

    let v: VoucherId = voucher.parse().unwrap();
    let carol = UserId::parse("carol").unwrap();
    let now = now_millis();
    let secret = TEST_ENTRY_SECRET.as_bytes();
    let expired = entry::issue(secret, v, &carol, now - 1);
    let forged = entry::issue(b"not-the-functions-secret-at-all", v, &carol, now + 60_000);
    let stretched = {
        let real = entry::issue(secret, v, &carol, now + 60_000);
        let parts: Vec<&str> = real.split('.').collect();
        format!("e1.{voucher}.{}.{}", now + 86_400_000, parts[3])
    };
    let alg_none = {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.",
            b64.encode(r#"{"alg":"none","typ":"JWT"}"#),
            b64.encode(format!(
                r#"{{"sub":"carol","voucher":"{voucher}","exp":9999999999}}"#
            ))
        )
    };
    let cases = [
        ("alice's token", alices.clone()),
        ("carol's token for another voucher", carols_other),
        ("expired", expired),
        ("forged", forged),
        ("stretched expiry", stretched),
        ("alg none", alg_none),
        ("garbage", "hello".to_string()),
        ("empty", " ".to_string()),
    ];
    for (what, t) in &cases {
        let (status, refused) = buy_with(&app, &voucher, "carol", t).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (403, Some("entry_required")),
            "{what}: {refused}"
        );
    }
    let (status, refused) = buy(&app, &voucher, "carol").await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (403, Some("entry_required"))
    );
    assert_eq!(
        stock_left(&app, &voucher).await,
        10,
        "no refused token took a unit"
    );

    // Signed with the previous secret: still valid while both are configured.
    let previous = entry::issue(TEST_ENTRY_PREVIOUS.as_bytes(), v, &carol, now + 60_000);
    assert_eq!(buy_with(&app, &voucher, "carol", &previous).await.0, 202);
    // And alice's own token is hers.
    assert_eq!(buy_with(&app, &voucher, "alice", &alices).await.0, 202);
    b.cleanup().await;
}

/// The queue opens `queue_opens_before_s` before the start: a join earlier is
/// `409 queue_not_open`; once open, everybody waits until the start (no token before
/// it), and a look by someone who never joined is `404`. A voucher without a room has
/// no queue (`404`) and sells as before, without a token.
#[tokio::test]
async fn the_queue_opens_before_the_start_and_nobody_enters_before_it() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let later = create_room(&app, 5, 10, 600_000, json!({"queue_opens_before_s": 60})).await;
    let (status, early) = queue(&app, &later, "alice", true).await;
    assert_eq!(
        (status, early["code"].as_str()),
        (409, Some("queue_not_open")),
        "{early}"
    );
    let soon = create_room(&app, 5, 10, 30_000, json!({"queue_opens_before_s": 60})).await;
    let (status, waiting) = queue(&app, &soon, "alice", true).await;
    assert_eq!(
        (status, waiting["status"].as_str()),
        (200, Some("waiting")),
        "{waiting}"
    );
    assert_eq!(waiting["position"], 1);
    let wait = waiting["expected_wait_ms"].as_i64().unwrap();
    assert!(
        (25_000..=30_000).contains(&wait),
        "position 1 enters at the start: {wait}"
    );
    assert!(waiting.get("entry_token").is_none());
    let (status, never) = queue(&app, &soon, "bob", false).await;
    assert_eq!(
        (status, never["code"].as_str()),
        (404, Some("not_found")),
        "{never}"
    );

    let now = now_millis();
    let plain = create_voucher(
        &app,
        &json!({
            "title": "no room",
            "stock": 3,
            "begins_at": format_rfc3339_millis(now - 1_000),
            "ends_at": format_rfc3339_millis(now + 3_600_000),
        }),
    )
    .await;
    assert!(plain.get("entry_rate_per_s").is_none(), "{plain}");
    let plain = plain["id"].as_str().unwrap();
    let (status, none) = queue(&app, plain, "alice", true).await;
    assert_eq!(
        (status, none["code"].as_str()),
        (404, Some("not_found")),
        "{none}"
    );
    assert_eq!(buy(&app, plain, "alice").await.0, 202);
    b.cleanup().await;
}

/// Once the voucher is sold out, everybody still waiting learns it on their next look,
/// with one bucket and with several (where bucket 0 alone cannot tell).
#[tokio::test]
async fn once_sold_out_everybody_still_waiting_learns_it_on_their_next_look() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    for buckets in [1, 2] {
        // Two positions a second: the first two enter at once, the third waits 0.5 s.
        let voucher = create_room(&app, 2, 2, -100, json!({"buckets": buckets})).await;
        let mut tokens = Vec::new();
        for u in ["u1", "u2", "u3", "u4"] {
            let (status, s) = queue(&app, &voucher, u, true).await;
            assert_eq!(status, 200, "{s}");
            tokens.push(s["entry_token"].as_str().map(str::to_string));
        }
        for (u, t) in [("u1", &tokens[0]), ("u2", &tokens[1])] {
            let t = t.as_deref().expect("the first two are served at the start");
            assert_eq!(
                buy_with(&app, &voucher, u, t).await.0,
                202,
                "{buckets} buckets"
            );
        }
        for u in ["u3", "u4", "u1"] {
            let (status, s) = queue(&app, &voucher, u, false).await;
            assert_eq!(
                (status, s["status"].as_str()),
                (200, Some("sold_out")),
                "{buckets} buckets, {u}: {s}"
            );
            assert!(s.get("entry_token").is_none(), "{s}");
            // No payment step: nothing can come back, the wait is over.
            assert_eq!(s["units_may_return"], false, "{s}");
        }
    }
    b.cleanup().await;
}

/// Waiters keep looking at a sold-out voucher while units may come back (every 1-30 s,
/// orders await payment): with many stock buckets, a look then costs Redis a few
/// commands, counted on the server (the queue script with its reads and the waiter's
/// record, the sold-out mark, the caller's buyers hash, one deadline read per bucket),
/// not two reads of every bucket (three commands each) every time. Once nothing can come back, the mark alone never answers: a cancel's
/// unit is found, and the waiters are not sent away for good while it is on sale.
#[tokio::test]
async fn a_look_at_a_sold_out_room_of_many_buckets_costs_a_few_commands() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let pay = json!({
        "buckets": 16, "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY
    });
    let voucher = create_room(&app, 16, 1_000, -100, pay).await;
    let bought = join_and_buy(&app, &voucher, "w", 40).await;
    assert_eq!(bought.len(), 16, "every unit sold");
    let mark = format!("seckill:{{{voucher}}}:sold_out");
    let mut conn = b.redis.connect().await;
    // A fresh mark (its 5 s start now): this look reads every bucket twice and sets it.
    let _: i64 = conn.del(&mark).await.unwrap();
    assert_looks_sold_out(&app, &voucher, "w39", true).await;
    for u in ["w30", "w31", "w32"] {
        let before = b.redis.command_calls();
        assert_looks_sold_out(&app, &voucher, u, true).await;
        let spent = b.redis.command_calls() - before;
        // The script and its reads, with the caller's record as a waiter for returned
        // units (8), the mark, the caller's own bucket's buyers hash (the line is not
        // for buyers holding an order), a deadline read per bucket.
        assert!(spent <= 8 + 1 + 1 + 16, "{u}'s look cost {spent} commands");
    }

    // Every order but one paid... and that one cancelled while the mark stands (as if
    // set just after the cancel's return): no deadline is left, yet nobody is sent away
    // for good, and the unit is offered to the next in line.
    for (u, order) in &bought[1..] {
        assert_eq!(
            provider_pays(&app, order, u, &format!("pi_{u}")).await.0,
            200
        );
    }
    let (u, order) = &bought[0];
    let res = call(
        &app,
        request(
            "POST",
            &format!("/orders/{order}/cancel"),
            Some(&token(u, false)),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(res.0, 200, "{}", res.1);
    let _: () = conn.pset_ex(&mark, 1, 5_000).await.unwrap();
    let (status, s) = queue(&app, &voucher, "w30", false).await;
    assert_eq!(status, 200, "{s}");
    // The unit is held for the line: w30 is not sent away for good, and the earliest
    // waiter still looking (w16, the first refused) is served to buy it.
    assert_eq!(
        (s["status"].as_str(), s["units_may_return"].as_bool()),
        (Some("sold_out"), Some(true)),
        "the cancelled unit is held for the line: {s}"
    );
    let (status, s) = queue(&app, &voucher, "w16", false).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        s["status"], "served",
        "the cancelled unit is w16's to buy: {s}"
    );
    assert!(s["offer_expires_at"].is_string(), "{s}");
    b.cleanup().await;
}

/// A bucket whose sale Redis lost holds units nobody can count until an admission
/// repairs it: a look never answers `sold_out` then (that answer, with nothing to come
/// back, ends the waiters' wait for good and nobody would be served to buy, which is
/// what repairs it), sold-out mark or not.
#[tokio::test]
async fn a_room_with_a_bucket_redis_lost_is_never_told_sold_out() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let voucher = create_room(&app, 4, 100, -100, json!({"buckets": 2})).await;
    assert_eq!(join_and_buy(&app, &voucher, "l", 10).await.len(), 4);
    assert_looks_sold_out(&app, &voucher, "l9", false).await;
    let v: VoucherId = voucher.parse().unwrap();
    let lost = seckill_shared::domain::Bucket::new(v, 1, 2).unwrap();
    let key = seckill_shared::keys::VoucherKeys::new(lost).sale;
    let _: i64 = b.redis.connect().await.del(&key).await.unwrap();
    let (status, s) = queue(&app, &voucher, "l9", false).await;
    assert_eq!(status, 200, "{s}");
    assert_ne!(
        s["status"], "sold_out",
        "a lost bucket's units are unknown: {s}"
    );
    b.cleanup().await;
}

/// A room with a payment step: the buyers served first take every unit, so the next in
/// line is told `sold_out`; when one of them cancels, the unit is back and the next in
/// line, looking again, is served and buys it (paying like anyone). Nobody further back
/// gets in.
#[tokio::test]
async fn a_room_with_a_payment_step_lets_the_next_in_line_buy_a_cancelled_unit() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let voucher = create_room(
        &app,
        2,
        100,
        -100,
        json!({ "pay_within_s": 600, "price_minor": TEST_PRICE_MINOR, "currency": TEST_CURRENCY }),
    )
    .await;
    let mut entries = BTreeMap::new();
    for u in ["p1", "p2", "p3", "p4"] {
        let (status, s) = queue(&app, &voucher, u, true).await;
        assert_eq!(status, 200, "{s}");
        entries.insert(u, s["entry_token"].as_str().map(str::to_string));
    }
    let mut orders = BTreeMap::new();
    for u in ["p1", "p2"] {
        let (status, body) = buy_with(&app, &voucher, u, entries[u].as_deref().unwrap()).await;
        assert_eq!(status, 202, "{u}: {body}");
        orders.insert(u, body["order_id"].as_str().unwrap().to_string());
    }
    // p1 and p2 have not paid yet: their units may come back.
    assert_looks_sold_out(&app, &voucher, "p3", true).await;

    // p2 pays, p1 cancels: one unit comes back.
    let (status, paid) = provider_pays(&app, &orders["p2"], "p2", "ref-p2").await;
    assert_eq!(
        (status, paid["outcome"].as_str()),
        (200, Some("paid")),
        "{paid}"
    );
    let cancel = format!("/orders/{}/cancel", orders["p1"]);
    let (status, body) = call(
        &app,
        request("POST", &cancel, Some(&token("p1", false)), None, None),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    assert_eq!(stock_left(&app, &voucher).await, 1);

    // The next in line is served again and buys it; a token of p4 (never used) does
    // not get a unit that is gone.
    let (status, s) = queue(&app, &voucher, "p3", false).await;
    assert_eq!((status, s["status"].as_str()), (200, Some("served")), "{s}");
    let p3 = s["entry_token"]
        .as_str()
        .expect("a token for p3")
        .to_string();
    let (status, body) = buy_with(&app, &voucher, "p3", &p3).await;
    assert_eq!(status, 202, "{body}");
    let p3_order = body["order_id"].as_str().unwrap().to_string();
    let (status, body) = buy_with(&app, &voucher, "p4", entries["p4"].as_deref().unwrap()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );
    // p3 has not paid yet.
    assert_looks_sold_out(&app, &voucher, "p4", true).await;
    let (status, paid) = provider_pays(&app, &p3_order, "p3", "ref-p3").await;
    assert_eq!(
        (status, paid["outcome"].as_str()),
        (200, Some("paid")),
        "{paid}"
    );
    // Every order paid: sold out for good.
    assert_looks_sold_out(&app, &voucher, "p4", false).await;
    b.cleanup().await;
}

/// Redis loses a queued sale's hash (its queue survives): the next look repairs the
/// sale from the database (the room with it) and everyone keeps their place; the
/// served buy with their tokens, each once, and the stock is the database's.
#[tokio::test]
async fn a_room_whose_sale_redis_lost_keeps_its_line_and_sells_on() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let voucher = create_room(&app, 3, 100, -100, json!({})).await;
    let mut positions = BTreeMap::new();
    for u in ["r1", "r2", "r3", "r4"] {
        let (status, s) = queue(&app, &voucher, u, true).await;
        assert_eq!(status, 200, "{s}");
        positions.insert(u, s["position"].clone());
    }
    let (status, body) = {
        let (_, s) = queue(&app, &voucher, "r1", false).await;
        buy_with(&app, &voucher, "r1", s["entry_token"].as_str().unwrap()).await
    };
    assert_eq!(status, 202, "{body}");
    let r1_order = body["order_id"].clone();
    let id: VoucherId = voucher.parse().unwrap();
    let k = seckill_shared::keys::VoucherKeys::new(id);
    let _: i64 = redis::AsyncCommands::del(&mut b.sales.conn(), &[&k.sale, &k.buyers])
        .await
        .unwrap();

    // Another instance, which never saw the voucher, looks first: the repair brings
    // the sale back, room and all.
    let other = App::new(&b.http_config()).await;
    for u in ["r2", "r3", "r4", "r1"] {
        let (status, s) = queue(&other, &voucher, u, false).await;
        assert_eq!(status, 200, "{u}: {s}");
        assert_eq!(s["position"], positions[u], "{u} kept their place: {s}");
    }
    // r1's order survived in the stream: r1 still holds it, and the stock counts it.
    let (_, s) = queue(&other, &voucher, "r1", false).await;
    let t = s["entry_token"].as_str().expect("r1 is still served");
    let (status, body) = buy_with(&other, &voucher, "r1", t).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_purchased")),
        "{body}"
    );
    assert_eq!(body["order_id"], r1_order, "{body}");
    let mut tokens = BTreeMap::new();
    for u in ["r2", "r3"] {
        let (_, s) = queue(&other, &voucher, u, false).await;
        tokens.insert(u, s["entry_token"].as_str().expect("served").to_string());
    }
    // A token used twice buys once (tried while a unit is left: once sold out, the
    // instance answers `sold_out` from memory).
    let (status, body) = buy_with(&other, &voucher, "r2", &tokens["r2"]).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = buy_with(&other, &voucher, "r2", &tokens["r2"]).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_purchased")),
        "{body}"
    );
    let (status, body) = buy_with(&other, &voucher, "r3", &tokens["r3"]).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(stock_left(&other, &voucher).await, 0);
    assert_looks_sold_out(&other, &voucher, "r4", false).await;
    b.cleanup().await;
}

/// Lost replies where the room meets the admission: a join whose reply is lost is sent
/// again by the client and keeps one place (the next joiner is right behind it, no
/// gap), and a served buyer's admission whose reply is lost is admitted once, the
/// token used again naming the same order.
#[tokio::test]
async fn a_join_and_a_served_admission_whose_replies_are_lost_count_once() {
    let b = Backends::start().await;
    let proxy = ReplyDropper::start(&b.redis).await;
    let mut cfg = b.http_config();
    cfg.redis.url = proxy.url();
    let app = App::new(&cfg).await;
    let voucher = create_room(&app, 5, 100, -100, json!({})).await;
    // Warm up both scripts, so the dropped reply is the script's run, not a NOSCRIPT.
    let (_, s) = queue(&app, &voucher, "warmup", true).await;
    let t = s["entry_token"].as_str().unwrap().to_string();
    assert_eq!(buy_with(&app, &voucher, "warmup", &t).await.0, 202);

    proxy.arm(&[b"EVALSHA", b":queue"]);
    let (status, s) = queue(&app, &voucher, "alice", true).await;
    assert_eq!(proxy.dropped(), 1, "the join's reply was lost");
    assert_eq!((status, s["position"].as_i64()), (200, Some(2)), "{s}");
    let (status, s) = queue(&app, &voucher, "bob", true).await;
    assert_eq!(
        (status, s["position"].as_i64()),
        (200, Some(3)),
        "no gap: {s}"
    );

    let (_, s) = queue(&app, &voucher, "alice", false).await;
    let t = s["entry_token"].as_str().expect("alice served").to_string();
    proxy.arm(&[b"EVALSHA", b":buyers"]);
    let (status, body) = buy_with(&app, &voucher, "alice", &t).await;
    assert_eq!(proxy.dropped(), 2, "the admission's reply was lost");
    assert_eq!(status, 202, "{body}");
    let order = body["order_id"].clone();
    let (status, body) = buy_with(&app, &voucher, "alice", &t).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_purchased")),
        "{body}"
    );
    assert_eq!(body["order_id"], order);
    assert_eq!(stock_left(&app, &voucher).await, 3);
    b.cleanup().await;
}

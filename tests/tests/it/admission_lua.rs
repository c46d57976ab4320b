//! The admission script (`lua/admit.lua`) and order-id leasing against a real
//! cluster-mode redis-server: every outcome, races for the last units, one order per
//! user under concurrency, and order-id uniqueness across concurrent leasers and across
//! leases Redis forgets.

use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;
use redis::AsyncCommands;
use seckill_shared::adapters::redis::{OrderIds, RedisSales};
use seckill_shared::domain::{Admission, SaleWindow, UserId, Voucher, VoucherId, now_millis};
use seckill_shared::keys::{DRAIN_GROUP, IdKeys, VoucherKeys};
use seckill_shared::order_id;
use seckill_tests::redis::RedisServer;

const HOUR: i64 = 3_600_000;

/// A voucher on sale from a minute ago for an hour. The script judges the window by the
/// Redis server's clock (`TIME`), which is this machine's.
fn voucher(id: i64, stock: i64) -> Voucher {
    let now = now_millis();
    voucher_in(
        id,
        stock,
        SaleWindow::new(now - 60_000, now + HOUR).unwrap(),
    )
}

fn voucher_in(id: i64, stock: i64, window: SaleWindow) -> Voucher {
    Voucher {
        id: VoucherId::new(id).unwrap(),
        title: "test".into(),
        stock,
        db_stock_left: stock,
        window,
        payment: None,
        buckets: 1,
        room: None,
    }
}

/// The Redis server's clock, unix ms.
async fn redis_time(sales: &RedisSales) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut sales.conn())
        .await
        .unwrap();
    secs * 1000 + micros / 1000
}

fn user(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

async fn stream_len(sales: &RedisSales, v: VoucherId) -> usize {
    sales.conn().xlen(VoucherKeys::new(v).orders).await.unwrap()
}

#[tokio::test]
async fn every_outcome_of_the_script() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let ids = OrderIds::default();
    let v = voucher(11, 1);
    let alice = user("alice");
    let id = ids.next(&sales, v.id, now_millis()).await.unwrap();

    // Not loaded: no sale hash at all.
    assert_eq!(
        sales.admit(v.id, &alice, id).await.unwrap().admission,
        Admission::NotLoaded
    );

    // Not started and ended, by the server's clock.
    let now = now_millis();
    let future = voucher_in(16, 1, SaleWindow::new(now + HOUR, now + 2 * HOUR).unwrap());
    assert!(sales.preload(&future).await.unwrap());
    let early = sales.admit(future.id, &alice, id).await.unwrap();
    assert_eq!(early.admission, Admission::NotStarted);
    assert_eq!(
        early.window,
        Some(future.window),
        "the window comes back for caching"
    );
    let past = voucher_in(17, 1, SaleWindow::new(now - 2 * HOUR, now - HOUR).unwrap());
    assert!(sales.preload(&past).await.unwrap());
    assert_eq!(
        sales.admit(past.id, &alice, id).await.unwrap().admission,
        Admission::Ended
    );

    assert!(sales.preload(&v).await.unwrap());
    let before = redis_time(&sales).await;
    let ok = sales.admit(v.id, &alice, id).await.unwrap();
    let after = redis_time(&sales).await;
    assert_eq!(
        ok.admission,
        Admission::Admitted {
            order_id: id,
            stock_after: 0
        }
    );
    // An admission's reply is one integer: no window, no server time (the caller had
    // both already); a refusal carries them (above).
    assert_eq!((ok.window, ok.server_ms), (None, None));
    assert!(
        early
            .server_ms
            .is_some_and(|t| t < future.window.begins_ms())
    );

    // Same user again: already purchased, and told which order they hold.
    let id2 = ids.next(&sales, v.id, now_millis()).await.unwrap();
    assert_eq!(
        sales.admit(v.id, &alice, id2).await.unwrap().admission,
        Admission::AlreadyPurchased { order_id: id }
    );
    assert_eq!(
        sales
            .admit(v.id, &user("bob"), id2)
            .await
            .unwrap()
            .admission,
        Admission::SoldOut
    );
    assert_eq!(sales.stock_left(v.id).await.unwrap(), Some(0));
    assert_eq!(stream_len(&sales, v.id).await, 1);
    assert_eq!(sales.order_of_buyer(v.id, &alice).await.unwrap(), Some(id));

    // The stream entry carries the order and its buyer only; its id is the server's
    // time of the admission (the key names the voucher).
    let k = VoucherKeys::new(v.id);
    let entries: redis::streams::StreamRangeReply =
        sales.conn().xrange_all(&k.orders).await.unwrap();
    let e = &entries.ids[0];
    assert_eq!(e.get::<String>("order_id"), Some(id.to_string()));
    assert_eq!(e.get::<String>("user_id"), Some("alice".into()));
    assert_eq!(e.map.len(), 2, "{:?}", e.map);
    let entry_ms: i64 = e.id.split_once('-').unwrap().0.parse().unwrap();
    assert!(
        (before..=after).contains(&entry_ms),
        "entry {} for an admission between {before} and {after}",
        e.id
    );
}

/// The window is the Redis server's: a sale that opens in a moment is refused until the
/// server's clock reaches it and admitted right after, with no clock from the caller.
#[tokio::test]
async fn the_window_is_judged_by_the_redis_server_clock() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let ids = OrderIds::default();
    let begins = redis_time(&sales).await + 700;
    let v = voucher_in(18, 5, SaleWindow::new(begins, begins + 1_000).unwrap());
    sales.preload(&v).await.unwrap();
    let id = ids.next(&sales, v.id, now_millis()).await.unwrap();
    let early = sales.admit(v.id, &user("a"), id).await.unwrap();
    assert_eq!(early.admission, Admission::NotStarted);
    assert!(early.server_ms.is_some_and(|t| t < begins), "{early:?}");
    while redis_time(&sales).await < begins {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let on_time = sales.admit(v.id, &user("a"), id).await.unwrap();
    assert!(matches!(on_time.admission, Admission::Admitted { .. }));
    // Admitted by the server's clock at or after the start: the entry id is that time.
    let first: redis::streams::StreamRangeReply = sales
        .conn()
        .xrange_all(&VoucherKeys::new(v.id).orders)
        .await
        .unwrap();
    let admitted_ms: i64 = first.ids[0].id.split_once('-').unwrap().0.parse().unwrap();
    assert!(admitted_ms >= begins, "{admitted_ms} < {begins}");
    while redis_time(&sales).await < begins + 1_000 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let id2 = ids.next(&sales, v.id, now_millis()).await.unwrap();
    assert_eq!(
        sales.admit(v.id, &user("b"), id2).await.unwrap().admission,
        Admission::Ended
    );
}

#[tokio::test]
async fn a_missing_or_partial_sale_is_not_loaded_and_writes_nothing() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let v = VoucherId::new(12).unwrap();
    let k = VoucherKeys::new(v);
    let mut conn = sales.conn();
    // A sale hash without its stock field (e.g. half-written by hand).
    let _: () = conn
        .hset_multiple(&k.sale, &[("begins_ms", 0), ("ends_ms", i64::MAX)])
        .await
        .unwrap();
    let id = OrderIds::default()
        .next(&sales, v, now_millis())
        .await
        .unwrap();
    assert_eq!(
        sales.admit(v, &user("a"), id).await.unwrap().admission,
        Admission::NotLoaded
    );
    let buyers: usize = conn.hlen(&k.buyers).await.unwrap();
    let exists: bool = conn.exists(&k.orders).await.unwrap();
    assert_eq!((buyers, exists), (0, false));
}

#[tokio::test]
async fn preload_is_idempotent_and_never_resets_live_stock() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let v = voucher(13, 3);
    assert!(sales.preload(&v).await.unwrap());
    let id = OrderIds::default()
        .next(&sales, v.id, now_millis())
        .await
        .unwrap();
    sales.admit(v.id, &user("a"), id).await.unwrap();
    assert!(
        !sales.preload(&v).await.unwrap(),
        "second preload creates nothing"
    );
    assert_eq!(sales.stock_left(v.id).await.unwrap(), Some(2));
    // The drainers' group exists from the start (no NOGROUP for the drainer).
    let groups: redis::streams::StreamInfoGroupsReply = sales
        .conn()
        .xinfo_groups(VoucherKeys::new(v.id).orders)
        .await
        .unwrap();
    assert_eq!(groups.groups.len(), 1);
    assert_eq!(groups.groups[0].name, DRAIN_GROUP);
    let active: bool = sales.conn().sismember("seckill:active", 13).await.unwrap();
    assert!(active);
}

#[tokio::test]
async fn two_hundred_buyers_race_for_the_last_five_units() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let ids = Arc::new(OrderIds::default());
    let v = voucher(14, 5);
    sales.preload(&v).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200 {
        // Each task has its own connection, like separate Lambda instances.
        let sales = RedisSales::new(redis.connect().await);
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let id = ids.next(&sales, v.id, now_millis()).await.unwrap();
            sales
                .admit(v.id, &user(&format!("u{i}")), id)
                .await
                .unwrap()
                .admission
        }));
    }
    let mut admitted = 0;
    let mut sold_out = 0;
    for t in tasks {
        match t.await.unwrap() {
            Admission::Admitted { .. } => admitted += 1,
            Admission::SoldOut => sold_out += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((admitted, sold_out), (5, 195));
    assert_eq!(sales.stock_left(v.id).await.unwrap(), Some(0));
    assert_eq!(stream_len(&sales, v.id).await, 5);
    let buyers: usize = sales
        .conn()
        .hlen(VoucherKeys::new(v.id).buyers)
        .await
        .unwrap();
    assert_eq!(buyers, 5);
}

#[tokio::test]
async fn one_user_racing_fifty_times_is_admitted_once() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let ids = Arc::new(OrderIds::default());
    let v = voucher(15, 100);
    sales.preload(&v).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let sales = sales.clone();
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let id = ids.next(&sales, v.id, now_millis()).await.unwrap();
            sales.admit(v.id, &user("eve"), id).await.unwrap().admission
        }));
    }
    let mut admitted = Vec::new();
    let mut held = HashSet::new();
    for t in tasks {
        match t.await.unwrap() {
            Admission::Admitted { order_id, .. } => admitted.push(order_id),
            Admission::AlreadyPurchased { order_id } => {
                held.insert(order_id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 1);
    assert!(
        held.iter().all(|h| *h == admitted[0]),
        "every refusal names the one order"
    );
    assert_eq!(sales.stock_left(v.id).await.unwrap(), Some(99));
    assert_eq!(stream_len(&sales, v.id).await, 1);
}

#[tokio::test]
async fn an_order_id_leads_back_to_its_voucher() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let ids = OrderIds::default();
    let now = now_millis();
    for v in [21, 22, 23] {
        let v = VoucherId::new(v).unwrap();
        for _ in 0..1500 {
            let id = ids.next(&sales, v, now).await.unwrap();
            assert_eq!(sales.voucher_of_order(id).await.unwrap(), Some(v));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Many leasers (separate instances, each with its own connection) issuing ids at
    /// once, over several vouchers and across a day boundary, never issue the same id.
    #[test]
    fn concurrent_leasers_never_issue_the_same_id(
        instances in 2usize..12,
        per_instance in 100usize..1500,
        vouchers in 1i64..4,
        cross_midnight in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let redis = RedisServer::start();
            // 23:59:59.500 UTC, so half the ids may fall on the next day.
            let base = 1_795_391_999_500;
            let mut tasks = Vec::new();
            for i in 0..instances {
                let sales = RedisSales::new(redis.connect().await);
                tasks.push(tokio::spawn(async move {
                    let ids = OrderIds::default();
                    let mut out = Vec::with_capacity(per_instance);
                    for n in 0..per_instance {
                        let v = VoucherId::new(1 + (n as i64 + i as i64) % vouchers).unwrap();
                        let now = if cross_midnight { base + (n as i64 % 2) * 1_000 } else { base };
                        out.push(ids.next(&sales, v, now).await.unwrap());
                    }
                    out
                }));
            }
            let mut seen = HashSet::new();
            for t in tasks {
                for id in t.await.unwrap() {
                    assert!(id.get() > 0);
                    assert!(seen.insert(id), "duplicate order id {id}");
                }
            }
            assert_eq!(seen.len(), instances * per_instance);
        });
    }
}

/// Redis forgets leases: it is killed and restarted from a snapshot taken before them
/// (as after a crash with AOF `everysec`, or a failover to a replica that had not got
/// them), while instance A keeps issuing from the blocks it leased; instance B leases
/// after each restart. Round after round, no id is issued twice and no id leads to the
/// other instance's voucher. The same `now` for both makes the time in the ids equal
/// wherever it comes from the instances' clocks.
#[tokio::test]
async fn leases_redis_forgets_never_repeat_an_id() {
    let mut redis = RedisServer::start();
    let (a, b) = (OrderIds::default(), OrderIds::default());
    let (va, vb) = (VoucherId::new(41).unwrap(), VoucherId::new(42).unwrap());
    let now = now_millis();
    let mut issued = HashSet::new();
    for round in 0..4 {
        let sales = RedisSales::new(redis.connect().await);
        redis.save();
        // 1,500 ids: the rest of an earlier block, then new leases Redis will forget.
        let mut a_ids = Vec::new();
        for _ in 0..1500 {
            a_ids.push(a.next(&sales, va, now).await.unwrap());
        }
        assert_eq!(sales.voucher_of_order(a_ids[1499]).await.unwrap(), Some(va));
        drop(sales);
        redis.restart();
        let sales = RedisSales::new(redis.connect().await);
        let mut b_ids = Vec::new();
        for _ in 0..1500 {
            b_ids.push(b.next(&sales, vb, now).await.unwrap());
        }
        for id in a_ids.iter().chain(&b_ids) {
            assert!(id.get() > 0);
            assert!(
                issued.insert(*id),
                "round {round}: order id {id} issued twice"
            );
        }
        for id in &b_ids {
            assert_eq!(sales.voucher_of_order(*id).await.unwrap(), Some(vb));
        }
        for id in &a_ids {
            // A forgotten lease is unknown (the order is found in the database once
            // drained), never another voucher's.
            let found = sales.voucher_of_order(*id).await.unwrap();
            assert!(
                found.is_none() || found == Some(va),
                "round {round}: A's order {id} leads to voucher {found:?}"
            );
        }
    }
    assert_eq!(issued.len(), 4 * 3000);
}

/// A server whose clock is behind jumps its lease clock ahead; a loss after that (here:
/// a restart from a snapshot taken after the jump) repeats no id either, because the
/// stamps keep following the server's clock at that distance rather than counting slots
/// of one millisecond that the restarted server would count again.
#[tokio::test]
async fn leases_lost_after_a_clock_jump_never_repeat_an_id() {
    let mut redis = RedisServer::start();
    let (a, b) = (OrderIds::default(), OrderIds::default());
    let (va, vb) = (VoucherId::new(44).unwrap(), VoucherId::new(45).unwrap());
    let now = now_millis();
    let sales = RedisSales::new(redis.connect().await);
    // The state as a clock ten minutes ahead of this server's left it (a failover).
    let ahead = now - order_id::EPOCH_UNIX_MS + 600_000;
    let clock = IdKeys::for_day("").clock;
    let _: () = sales
        .conn()
        .hset_multiple(&clock, &[("ms", ahead), ("slot", 5), ("seen", ahead)])
        .await
        .unwrap();
    let first = a.next(&sales, va, now).await.unwrap();
    assert!(
        order_id::OrderIdParts::of(first).ms >= ahead + order_id::CLOCK_BEHIND_JUMP_MS,
        "jumped"
    );
    redis.save();
    let mut a_ids = vec![first];
    for _ in 0..3000 {
        a_ids.push(a.next(&sales, va, now).await.unwrap());
    }
    drop(sales);
    redis.restart();
    let sales = RedisSales::new(redis.connect().await);
    let mut issued: HashSet<_> = a_ids.iter().copied().collect();
    assert_eq!(issued.len(), a_ids.len());
    for _ in 0..3000 {
        let id = b.next(&sales, vb, now).await.unwrap();
        assert!(issued.insert(id), "order id {id} issued twice");
        assert_eq!(sales.voucher_of_order(id).await.unwrap(), Some(vb));
    }
}

/// The lease clock never goes back: a server whose clock reads earlier than the one that
/// wrote the clock's state (a failover to a clock that is behind) jumps past the latest
/// stamp it knows, once; a millisecond's slots used up move it on a millisecond; it
/// refuses to pass the end of the id epoch; and a wrong guess of the lease's day is
/// corrected.
#[tokio::test]
async fn the_lease_clock_never_goes_back() {
    let redis = RedisServer::start();
    let sales = RedisSales::new(redis.connect().await);
    let v = VoucherId::new(43).unwrap();
    let now = now_millis();
    let first = sales.lease_block(v, order_id::day_of(now)).await.unwrap();
    let second = sales.lease_block(v, order_id::day_of(now)).await.unwrap();
    assert!((second.ms, second.slot) > (first.ms, first.slot));

    // The state as a clock ten minutes ahead of this server's left it.
    let ahead = now - order_id::EPOCH_UNIX_MS + 600_000;
    let clock = IdKeys::for_day("").clock;
    let _: () = sales
        .conn()
        .hset_multiple(&clock, &[("ms", ahead), ("slot", 5), ("seen", ahead)])
        .await
        .unwrap();
    let ahead_day = order_id::day_of(order_id::EPOCH_UNIX_MS + ahead);
    let jumped = sales.lease_block(v, ahead_day).await.unwrap();
    assert_eq!(
        (jumped.ms, jumped.slot),
        (ahead + order_id::CLOCK_BEHIND_JUMP_MS, 0),
        "stamps the lost writes of the clock ahead may have used are skipped"
    );
    // Only one jump: then the stamps follow this server's clock, as far ahead.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let after = sales.lease_block(v, ahead_day).await.unwrap();
    assert!(
        after.ms >= jumped.ms + 20 && after.ms < jumped.ms + 5_000,
        "{jumped:?} then {after:?}"
    );

    // The last slot of a millisecond used: the clock moves on a millisecond.
    let last_slot = i64::from(order_id::SLOTS_PER_MS) - 1;
    let _: () = sales
        .conn()
        .hset_multiple(&clock, &[("ms", ahead), ("slot", last_slot), ("skew", 0)])
        .await
        .unwrap();
    let next = sales.lease_block(v, ahead_day).await.unwrap();
    assert_eq!((next.ms, next.slot), (ahead + 1, 0));

    // At the end of the id epoch (2094) leasing fails, and changes nothing.
    let end = (1_i64 << 41) - 1;
    let _: () = sales
        .conn()
        .hset_multiple(&clock, &[("ms", end), ("slot", last_slot), ("skew", 0)])
        .await
        .unwrap();
    let end_day = order_id::day_of(order_id::EPOCH_UNIX_MS + end);
    assert!(sales.lease_block(v, end_day).await.is_err());
    let state: Vec<i64> = redis::cmd("HMGET")
        .arg(&clock)
        .arg("ms")
        .arg("slot")
        .query_async(&mut sales.conn())
        .await
        .unwrap();
    assert_eq!(state, [end, last_slot]);

    // A guess of the day three days off still leases, in the right day's block map.
    let _: () = sales.conn().del(&clock).await.unwrap();
    let lease = sales
        .lease_block(v, order_id::day_of(now) - 3)
        .await
        .unwrap();
    assert_eq!(
        sales.voucher_of_order(lease.id(9).unwrap()).await.unwrap(),
        Some(v)
    );
}

/// The production shape of the connection: TLS (`rediss://`) to a cluster, as on
/// ElastiCache Serverless. Also proves the TLS crypto provider is set up, which rustls
/// would otherwise refuse to choose in a build that links two.
#[tokio::test]
async fn admission_over_tls_to_a_cluster() {
    let redis = RedisServer::start_tls();
    assert!(redis.url().starts_with("rediss://"));
    let sales = RedisSales::new(redis.connect().await);
    let v = voucher(31, 1);
    sales.preload(&v).await.unwrap();
    let id = OrderIds::default()
        .next(&sales, v.id, now_millis())
        .await
        .unwrap();
    let reply = sales.admit(v.id, &user("tls"), id).await.unwrap();
    assert_eq!(
        reply.admission,
        Admission::Admitted {
            order_id: id,
            stock_after: 0
        }
    );

    // The same server without the CA: the certificate is refused, quickly.
    let mut cfg = redis.config();
    cfg.tls_ca_file = None;
    assert!(
        seckill_shared::adapters::redis::RedisConn::connect(&cfg)
            .await
            .is_err()
    );
}

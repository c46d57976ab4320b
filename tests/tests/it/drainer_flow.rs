//! The order drainer in process against real backends: a private cluster-mode Redis fed
//! by the real admission script, a fresh MariaDB database reached through the real Data
//! API client and server. Every expectation is an exact count or set.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use seckill_shared::domain::{OrderId, SaleWindow, UserId, Voucher, VoucherId, now_millis};
use seckill_shared::keys::{ACTIVE_VOUCHERS, DRAIN_GROUP, VoucherKeys};
use seckill_tests::drainer::DrainCtx;

fn id_set(ids: &[OrderId]) -> BTreeSet<i64> {
    ids.iter().map(|i| i.get()).collect()
}

fn confirmed(rows: &std::collections::BTreeMap<i64, (String, Option<String>)>) -> usize {
    rows.values().filter(|(s, _)| s == "confirmed").count()
}

/// The stream's entries as (stream id, order_id field), in stream order.
async fn stream_orders(ctx: &DrainCtx, v: VoucherId) -> Vec<(String, i64)> {
    let reply: redis::streams::StreamRangeReply = ctx
        .conn()
        .xrange_all(VoucherKeys::new(v).orders)
        .await
        .expect("XRANGE");
    reply
        .ids
        .into_iter()
        .filter_map(|e| {
            let order: Option<String> = e.get("order_id");
            Some((e.id, order?.parse().ok()?))
        })
        .collect()
}

/// Reads `count` entries as another consumer and never acks them: a drainer that died.
async fn ghost_read(ctx: &DrainCtx, v: VoucherId, count: usize) -> Vec<String> {
    let opts = redis::streams::StreamReadOptions::default()
        .group(DRAIN_GROUP, "ghost")
        .count(count);
    let reply: redis::streams::StreamReadReply = ctx
        .conn()
        .xread_options(&[VoucherKeys::new(v).orders], &[">"], &opts)
        .await
        .expect("XREADGROUP");
    reply
        .keys
        .into_iter()
        .flat_map(|k| k.ids.into_iter().map(|e| e.id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sale_of_2000_admissions_drains_to_exactly_2000_rows() {
    const TOTAL: i64 = 3_000;
    const SOLD: usize = 2_000;
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(TOTAL, TOTAL).await;
    let admitted = ctx.admit(v.id, "buyer", SOLD).await;

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = order_drainer::config::defaults::BATCH_SIZE;
    cfg.max_run = Duration::from_secs(3);
    cfg.idle_poll = Duration::from_millis(20);
    let drainer = order_drainer::Drainer::connect(cfg).await.expect("connect");
    let started = Instant::now();
    // Invocations one after the other (as the schedule would run them) until the stream
    // is drained; normally the first does it all.
    let run = tokio::spawn(async move {
        let mut runs = Vec::new();
        loop {
            let s = order_drainer::run_once(&drainer).await.0;
            let done = s.lag == 0 && s.pending == 0;
            runs.push(s);
            if done || runs.len() >= 8 {
                return runs;
            }
        }
    });

    // Time until every row is there, watched from outside.
    let mut conn = ctx.mysql().await;
    let drained_after = loop {
        let n: Option<i64> = mysql_async::prelude::Queryable::exec_first(
            &mut conn,
            "SELECT COUNT(*) FROM orders WHERE voucher_id = ?",
            (v.id.get(),),
        )
        .await
        .expect("count");
        if n == Some(SOLD as i64) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "only {n:?} rows after 25 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    conn.disconnect().await.ok();
    let runs = run.await.expect("drain task");
    eprintln!(
        "drained {SOLD} orders in {:.0} ms: {:.0} rows/s (batch {}); runs {runs:?}",
        drained_after.as_secs_f64() * 1000.0,
        SOLD as f64 / drained_after.as_secs_f64(),
        order_drainer::config::defaults::BATCH_SIZE
    );
    let total = |f: fn(&order_drainer::Summary) -> u64| runs.iter().map(f).sum::<u64>();
    let last = runs.last().expect("one run at least");

    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.len(), SOLD, "exactly one row per admission");
    assert_eq!(confirmed(&rows), SOLD);
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        id_set(&admitted)
    );
    assert_eq!(ctx.db_stock_left(v.id).await, TOTAL - SOLD as i64);
    assert_eq!(total(|s| s.read), SOLD as u64);
    assert_eq!(total(|s| s.inserted), SOLD as u64);
    assert_eq!(
        (
            total(|s| s.duplicates),
            total(|s| s.rejected),
            total(|s| s.dead_lettered),
            total(|s| s.claimed),
            total(|s| s.errors)
        ),
        (0, 0, 0, 0, 0),
        "{runs:?}"
    );
    assert_eq!((last.lag, last.pending), (0, 0), "{runs:?}");
    assert_eq!(ctx.pending(v.id).await, 0);
    // Trimmed down to the last delivered entry; the spent consumers are gone.
    assert_eq!(ctx.stream_ids(v.id).await.len(), 1);
    assert_eq!(total(|s| s.trimmed), SOLD as u64 - 1);
    let consumers: redis::streams::StreamInfoConsumersReply = ctx
        .conn()
        .xinfo_consumers(VoucherKeys::new(v.id).orders, DRAIN_GROUP)
        .await
        .expect("XINFO CONSUMERS");
    assert!(consumers.consumers.is_empty(), "{:?}", consumers.consumers);
    ctx.cleanup().await;
}

#[tokio::test]
async fn redelivery_of_a_committed_batch_inserts_nothing_and_moves_no_stock() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    let admitted = ctx.admit(v.id, "u", 30).await;
    let entries = stream_orders(&ctx, v.id).await;
    assert_eq!(entries.len(), 30);
    // The raw entries, to append again exactly as admission wrote them.
    let raw: redis::streams::StreamRangeReply = ctx
        .conn()
        .xrange_all(VoucherKeys::new(v.id).orders)
        .await
        .unwrap();

    let first = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((first.inserted, first.errors), (30, 0), "{first:?}");
    let rows_before = ctx.orders_in_db(v.id).await;
    assert_eq!(rows_before.len(), 30);
    assert_eq!(ctx.db_stock_left(v.id).await, 70);

    // The whole committed batch comes again (same order ids, new stream entries), plus
    // five genuinely new admissions behind it.
    for e in &raw.ids {
        let fields: Vec<(String, String)> = ["order_id", "user_id"]
            .iter()
            .map(|f| (f.to_string(), e.get::<String>(f).expect("field")))
            .collect();
        let _: String = ctx
            .conn()
            .xadd(VoucherKeys::new(v.id).orders, "*", &fields)
            .await
            .unwrap();
    }
    let second = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        (
            second.read,
            second.inserted,
            second.duplicates,
            second.rejected,
            second.errors
        ),
        (30, 0, 30, 0, 0),
        "{second:?}"
    );
    assert_eq!(ctx.orders_in_db(v.id).await, rows_before, "no row changed");
    assert_eq!(ctx.db_stock_left(v.id).await, 70, "no stock moved");

    let more = ctx.admit(v.id, "late", 5).await;
    let third = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((third.inserted, third.duplicates), (5, 0), "{third:?}");
    let rows = ctx.orders_in_db(v.id).await;
    let mut want = id_set(&admitted);
    want.extend(id_set(&more));
    assert_eq!(rows.keys().copied().collect::<BTreeSet<_>>(), want);
    assert_eq!(ctx.db_stock_left(v.id).await, 65);
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

#[tokio::test]
async fn poison_entries_are_dead_lettered_and_their_neighbours_commit() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    let vid = v.id.get().to_string();
    let mut good = ctx.admit(v.id, "before", 5).await;
    let now = now_millis().to_string();
    let poison: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "bad_fields: missing user_id",
            vec![
                ("order_id", "77"),
                ("voucher_id", &vid),
                ("admitted_ms", &now),
            ],
        ),
        (
            "bad_fields: invalid order_id",
            vec![
                ("order_id", "abc"),
                ("voucher_id", &vid),
                ("user_id", "p"),
                ("admitted_ms", &now),
            ],
        ),
        ("bad_fields: missing order_id", vec![("junk", "x")]),
        (
            "voucher_mismatch",
            vec![
                ("order_id", "78"),
                ("voucher_id", "999999"),
                ("user_id", "q"),
                ("admitted_ms", &now),
            ],
        ),
    ];
    let mut poison_ids = HashMap::new();
    for (reason, fields) in &poison {
        poison_ids.insert(ctx.xadd_raw(v.id, fields).await, *reason);
    }
    good.extend(ctx.admit(v.id, "after", 5).await);

    // A voucher Redis sells but the database does not know.
    let ghost = Voucher {
        id: VoucherId::new(v.id.get() + 1_000_000).unwrap(),
        title: "not in the database".into(),
        stock: 10,
        db_stock_left: 10,
        window: SaleWindow::new(now_millis() - 60_000, now_millis() + 3_600_000).unwrap(),
        payment: None,
        buckets: 1,
        room: None,
    };
    ctx.sales.preload(&ghost).await.unwrap();
    let orphans = ctx.admit(ghost.id, "orphan", 3).await;

    // Discovery through the active set finds both vouchers.
    let summary = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(summary.vouchers, 2, "{summary:?}");
    assert_eq!(summary.inserted, 10, "{summary:?}");
    assert_eq!(summary.dead_lettered, 4 + 3, "{summary:?}");
    assert_eq!(summary.errors, 0, "{summary:?}");

    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.keys().copied().collect::<BTreeSet<_>>(), id_set(&good));
    assert_eq!(confirmed(&rows), 10);
    assert_eq!(ctx.db_stock_left(v.id).await, 90);

    let dead = ctx.dead_letters(v.id).await;
    assert_eq!(dead.len(), 4, "{dead:?}");
    for d in &dead {
        let source = d.get("source_id").expect("source_id");
        let want = poison_ids.get(source).expect("a poison entry");
        assert_eq!(d.get("reason").map(String::as_str), Some(*want), "{d:?}");
        assert_eq!(d.get("deliveries").map(String::as_str), Some("1"));
        // The original fields travel with the dead letter.
        let (_, fields) = poison.iter().find(|(r, _)| r == want).unwrap();
        for (f, val) in fields {
            assert_eq!(d.get(*f).map(String::as_str), Some(*val), "{d:?}");
        }
    }
    let orphan_dead = ctx.dead_letters(ghost.id).await;
    assert_eq!(orphan_dead.len(), 3);
    let dead_orders: BTreeSet<i64> = orphan_dead
        .iter()
        .map(|d| {
            assert_eq!(d.get("reason").map(String::as_str), Some("unknown_voucher"));
            d.get("order_id").unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(dead_orders, id_set(&orphans));
    // Their buyers see `rejected`, not `pending` forever.
    let orphan_rows = ctx.orders_in_db(ghost.id).await;
    assert_eq!(
        orphan_rows.keys().copied().collect::<BTreeSet<_>>(),
        id_set(&orphans)
    );
    for row in orphan_rows.values() {
        assert_eq!(
            row,
            &("rejected".to_string(), Some("unknown_voucher".to_string()))
        );
    }
    assert_eq!(ctx.pending(v.id).await, 0);
    assert_eq!(ctx.pending(ghost.id).await, 0);

    // Nothing is dead-lettered twice.
    let again = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        (again.dead_lettered, again.inserted, again.errors),
        (0, 0, 0)
    );
    assert_eq!(ctx.dead_letters(v.id).await.len(), 4);
    ctx.cleanup().await;
}

#[tokio::test]
async fn entries_delivered_many_times_are_still_written_never_dead_lettered() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    let admitted = ctx.admit(v.id, "u", 3).await;
    let read = ghost_read(&ctx, v.id, 3).await;
    assert_eq!(read.len(), 3);
    // One entry went through fifty crashed or timed-out deliveries: nothing is wrong
    // with it, so it must be written like the others (invariant 3).
    let entries = stream_orders(&ctx, v.id).await;
    let (worn_id, worn_order) = entries[1].clone();
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(VoucherKeys::new(v.id).orders)
        .arg(DRAIN_GROUP)
        .arg("ghost")
        .arg(0)
        .arg(&worn_id)
        .arg("RETRYCOUNT")
        .arg(50)
        .arg("JUSTID")
        .query_async(&mut ctx.conn())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let summary = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        (
            summary.claimed,
            summary.inserted,
            summary.dead_lettered,
            summary.errors
        ),
        (3, 3, 0, 0),
        "{summary:?}"
    );
    assert!(ctx.dead_letters(v.id).await.is_empty());
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        id_set(&admitted)
    );
    assert_eq!(
        rows.get(&worn_order),
        Some(&("confirmed".to_string(), None))
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 7);
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

/// A sale of ten whose one order is drained.
async fn drained_sale_of_one(ctx: &DrainCtx) -> Voucher {
    let v = ctx.voucher(10, 10).await;
    ctx.admit(v.id, "u", 1).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.errors), (1, 0), "{s:?}");
    v
}

/// An admitted order found nowhere, for an operator to requeue (a fresh id of `v`).
async fn order_for_an_operator(
    ctx: &DrainCtx,
    v: VoucherId,
) -> seckill_shared::domain::AdmittedOrder {
    seckill_shared::domain::AdmittedOrder {
        id: ctx.ids.next(&ctx.sales, v, now_millis()).await.unwrap(),
        voucher: v,
        user: UserId::parse("lost-0").unwrap(),
        admitted_ms: now_millis(),
    }
}

/// An order an operator requeues (`seckill reconcile --repair`) into a retired sale's
/// stream (its keys expiring, the voucher out of the active set, as the drainer leaves
/// a finished sale) stays there: the stream loses its expiry, the voucher is active
/// again, and the next run writes the order.
#[tokio::test]
async fn an_order_requeued_into_a_retired_sale_stays_and_is_drained() {
    let ctx = DrainCtx::start().await;
    let v = drained_sale_of_one(&ctx).await;
    let k = VoucherKeys::new(v.id);
    let mut conn = ctx.conn();
    let _: bool = conn.expire(&k.orders, 600).await.unwrap();
    let _: i64 = conn.srem(ACTIVE_VOUCHERS, v.id.get()).await.unwrap();
    let lost = order_for_an_operator(&ctx, v.id).await;
    ctx.streams.requeue(v.id.into(), &lost).await.unwrap();
    let ttl: i64 = conn.ttl(&k.orders).await.unwrap();
    assert_eq!(ttl, -1, "the stream keeps no expiry");
    let active: bool = conn.sismember(ACTIVE_VOUCHERS, v.id.get()).await.unwrap();
    assert!(active, "the voucher is active again");
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.errors), (1, 0), "{s:?}");
    assert!(ctx.orders_in_db(v.id).await.contains_key(&lost.id.get()));
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

/// A drainer's retirement of a drained sale is two calls (the check with the expiries,
/// then the removal from the active set); an operator's requeue lands between them,
/// its own activation before the removal. The removal must not leave the new entry
/// where no run looks: the voucher stays active and the next run writes it.
#[tokio::test]
async fn an_order_requeued_while_its_sale_is_being_retired_is_still_drained() {
    let ctx = DrainCtx::start().await;
    let v = drained_sale_of_one(&ctx).await;
    let expiring = ctx
        .streams
        .expire_finished(v.id, Some(Duration::from_secs(600)))
        .await
        .unwrap();
    assert!(expiring, "drained: the sale may be retired");
    let lost = order_for_an_operator(&ctx, v.id).await;
    ctx.streams.requeue(v.id.into(), &lost).await.unwrap();
    let retired = ctx.streams.retire(v.id).await.unwrap();
    assert!(!retired, "an entry arrived after the check: not retired");
    let mut conn = ctx.conn();
    let active: bool = conn.sismember(ACTIVE_VOUCHERS, v.id.get()).await.unwrap();
    assert!(active, "the voucher is still visited");
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.errors), (1, 0), "{s:?}");
    assert!(ctx.orders_in_db(v.id).await.contains_key(&lost.id.get()));
    // Drained now: the retirement goes through.
    assert!(ctx.streams.expire_finished(v.id, None).await.unwrap());
    assert!(ctx.streams.retire(v.id).await.unwrap());
    let active: bool = conn.sismember(ACTIVE_VOUCHERS, v.id.get()).await.unwrap();
    assert!(!active);
    ctx.cleanup().await;
}

/// A statement the database refuses ends its transaction (Aurora terminates it), so the
/// drainer's rollback after it is answered "Transaction ... is not found": by today's
/// Data API as `TransactionNotFoundException`, by earlier versions as a
/// `BadRequestException` of the same text. Both mean the transaction is over, and its
/// record goes: none is left behind for later runs to try to roll back.
#[tokio::test]
async fn a_transaction_the_data_api_says_is_gone_in_either_form_leaves_no_record() {
    let mut ctx = DrainCtx::start().await;
    ctx.stop_data_api().await;
    ctx.start_data_api_with(|c| c.not_found_as_bad_request = true)
        .await;
    let v = ctx.voucher(10, 10).await;
    ctx.refuse_users("poison").await;
    ctx.admit(v.id, "poison", 1).await;
    ctx.admit(v.id, "good", 2).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.dead_lettered, s.errors), (2, 1, 0), "{s:?}");
    let open: u64 = ctx
        .conn()
        .hlen(VoucherKeys::new(v.id).drain_tx)
        .await
        .unwrap();
    assert_eq!(open, 0, "no transaction record left: {s:?}");
    ctx.cleanup().await;
}

/// The Data API's answer to a statement that ran is lost (a 503 from a proxy that gave up
/// waiting, a connection cut after the request went out): the statement must not be sent
/// again inside its transaction, or the stock update would take the batch's units twice
/// and the database refuse later orders Redis admitted. Sent once, the failure rolls the
/// transaction back, and the drainer writes the batch again: stock taken once. Then the
/// same for the stock update of a group of small sales.
#[tokio::test]
async fn a_statement_whose_answer_was_lost_is_never_sent_again_in_its_transaction() {
    use data_api_local::LostAnswers;
    for (what, sql, sales) in [
        (
            "one sale",
            "UPDATE vouchers SET stock_left = stock_left - :n",
            1,
        ),
        (
            "a group of sales",
            "SET v.stock_left = v.stock_left - j.n",
            3,
        ),
    ] {
        let mut ctx = DrainCtx::start().await;
        let lost = LostAnswers::new(sql, 1);
        let fault = lost.clone();
        ctx.stop_data_api().await;
        ctx.start_data_api_with(move |c| c.lose_answers = Some(fault))
            .await;
        let mut vouchers = Vec::new();
        for _ in 0..sales {
            let v = ctx.voucher(10, 10).await;
            ctx.admit(v.id, "lost-answer", 4).await;
            vouchers.push(v);
        }
        for _ in 0..5 {
            ctx.drain(ctx.drainer_config()).await;
            let mut written = 0;
            for v in &vouchers {
                written += ctx.orders_in_db(v.id).await.len();
            }
            if written == 4 * sales {
                break;
            }
        }
        assert_eq!(lost.left(), 0, "{what}: an answer was lost");
        for v in &vouchers {
            assert_eq!(ctx.orders_in_db(v.id).await.len(), 4, "{what}");
            assert_eq!(
                ctx.db_stock_left(v.id).await,
                6,
                "{what}: four units taken once"
            );
        }
        ctx.cleanup().await;
    }
}

/// An order refused alone with an error whose text says permanent, by a fault that then
/// passes (the database takes an ordinary row meanwhile): it is tried alone once more
/// and written, not dead-lettered; an order is blamed only when refused again.
#[tokio::test]
async fn an_order_refused_alone_by_a_fault_that_passes_is_written_not_dead_lettered() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    // Refused in its batch and then alone: twice.
    ctx.refuse_users_times("flaky", 2).await;
    ctx.admit(v.id, "flaky", 1).await;
    ctx.admit(v.id, "steady", 1).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.dead_lettered, s.errors), (2, 0, 0), "{s:?}");
    assert!(ctx.dead_letters(v.id).await.is_empty());
    assert_eq!(ctx.db_stock_left(v.id).await, 8);
    ctx.cleanup().await;
}

/// Every order of a read refused on its own (two here, a batch's worth in the second
/// run, first deliveries and then claimed ones): the database still takes an ordinary
/// row, so the orders are at fault and each is dead-lettered with the reason; the sale
/// goes on. (Taken for the database's fault because all were refused, they stayed
/// pending and, claimable, kept the sale's newer orders from ever being read.)
#[tokio::test]
async fn orders_that_are_all_refused_alone_are_dead_lettered_and_the_sale_goes_on() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    ctx.refuse_users("poison").await;
    let poison = ctx.admit(v.id, "poison", 2).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.dead_lettered, s.errors), (0, 2, 0), "{s:?}");
    let dead: BTreeSet<i64> = ctx
        .dead_letters(v.id)
        .await
        .iter()
        .filter_map(|d| d.get("order_id")?.parse().ok())
        .collect();
    assert_eq!(dead, id_set(&poison));

    // Three more refused and three good ones behind them: the good ones land.
    ctx.admit(v.id, "poisoned", 3).await;
    let good = ctx.admit(v.id, "good", 3).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.dead_lettered, s.errors), (3, 3, 0), "{s:?}");
    assert_eq!(
        ctx.orders_in_db(v.id)
            .await
            .keys()
            .copied()
            .collect::<BTreeSet<_>>(),
        id_set(&good)
    );
    assert_eq!(ctx.pending(v.id).await, 0);
    assert_eq!(ctx.db_stock_left(v.id).await, 97);
    ctx.cleanup().await;
}

/// A warm Lambda instance keeps its consumer name from one invocation to the next. A
/// transaction an earlier invocation left open under that name (its commit and its
/// rollback both failed) holds the voucher's row; the next invocation rolls it back
/// like any other run's, instead of skipping it as its own and failing on the lock
/// until the Data API drops it.
#[tokio::test]
async fn a_warm_instance_rolls_back_the_transaction_its_earlier_invocation_left_open() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    let consumer = "drainer-warm-instance";
    let tx = ctx
        .hold_the_voucher_row(v.id, Some((consumer, now_millis() - 60_000)))
        .await;
    let admitted = ctx.admit(v.id, "u", 3).await;
    let cfg = ctx.drainer_config();
    let drainer = order_drainer::Drainer::connect(cfg.clone())
        .await
        .expect("drainer connects");
    let s = drainer
        .run(consumer, Instant::now() + cfg.max_run + cfg.safety_margin)
        .await;
    println!("{s:?}");
    assert_eq!(
        (s.inserted, s.aborted_transactions, s.errors),
        (3, 1, 0),
        "{s:?}"
    );
    assert_eq!(
        ctx.orders_in_db(v.id)
            .await
            .keys()
            .copied()
            .collect::<BTreeSet<_>>(),
        id_set(&admitted)
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 7);
    // The held transaction is gone: rolling it back again finds nothing to do.
    ctx.db().await.rollback(&tx).await;
    ctx.cleanup().await;
}

#[tokio::test]
async fn an_order_the_database_refuses_alone_is_dead_lettered_and_its_batch_commits() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    ctx.refuse_users("poison").await;
    let mut good = ctx.admit(v.id, "a", 10).await;
    let poison = ctx.admit(v.id, "poison", 1).await;
    good.extend(ctx.admit(v.id, "b", 10).await);

    let summary = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        (summary.inserted, summary.dead_lettered, summary.errors),
        (20, 1, 0),
        "{summary:?}"
    );
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.keys().copied().collect::<BTreeSet<_>>(), id_set(&good));
    let dead = ctx.dead_letters(v.id).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        dead[0].get("order_id").map(String::as_str),
        Some(poison[0].to_string().as_str())
    );
    let reason = dead[0].get("reason").cloned().unwrap_or_default();
    assert!(
        reason.starts_with("refused: ") && reason.contains("refused by a test trigger"),
        "{reason}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 80);
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

/// A batch whose search for a refused order runs out of the invocation's time leaves the
/// rest of it pending, and the batch read ahead behind it is not committed either: the
/// voucher's batches reach the database in the order read, or a later buyer could take
/// the database's last unit from an earlier one.
#[tokio::test]
async fn a_batch_cut_short_by_the_run_s_time_holds_back_the_batch_read_behind_it() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    // The refusal takes 2 s: longer than the run has left after it.
    ctx.refuse_users_after("slow", 2).await;
    let mut first = ctx.admit(v.id, "a", 9).await;
    let slow = ctx.admit(v.id, "slow", 1).await;
    first.extend(&slow);
    let second = ctx.admit(v.id, "b", 10).await;
    let cfg = order_drainer::Config {
        batch_size: 10,
        ..ctx.drainer_config()
    };

    let summary = ctx.drain(cfg.clone()).await;
    let rows = ctx.orders_in_db(v.id).await;
    let behind = id_set(&second);
    assert!(
        rows.keys().all(|id| !behind.contains(id)),
        "the batch read behind the unfinished one was committed: {rows:?} ({summary:?})"
    );
    assert!(rows.is_empty(), "{rows:?} ({summary:?})");
    assert_eq!(
        summary.errors, 0,
        "running out of time is no error: {summary:?}"
    );

    // Later runs (with time to spare) finish both batches, in order.
    let cfg = order_drainer::Config {
        max_run: std::time::Duration::from_secs(20),
        ..cfg
    };
    for _ in 0..3 {
        ctx.drain(cfg.clone()).await;
        if ctx.pending(v.id).await == 0 {
            break;
        }
    }
    let rows = ctx.orders_in_db(v.id).await;
    let good: Vec<OrderId> = first
        .iter()
        .chain(&second)
        .copied()
        .filter(|id| *id != slow[0])
        .collect();
    assert_eq!(rows.keys().copied().collect::<BTreeSet<_>>(), id_set(&good));
    assert_eq!(ctx.dead_letters(v.id).await.len(), 1);
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_database_that_refuses_every_order_dead_letters_none() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    // Every row refused (a broken schema, a bad migration): `LIKE '%'`.
    ctx.refuse_users("").await;

    // A lone order first (a quiet sale: a batch of one), then a batch of several. The
    // refusal is the database's fault, not the orders': they all stay pending, and the
    // invocation fails loudly.
    let mut admitted = ctx.admit(v.id, "lone", 1).await;
    let down = ctx.drain(ctx.drainer_config()).await;
    assert!(down.errors >= 1, "{down:?}");
    assert_eq!((down.inserted, down.dead_lettered), (0, 0), "{down:?}");
    admitted.extend(ctx.admit(v.id, "u", 6).await);
    let down = ctx.drain(ctx.drainer_config()).await;
    assert!(down.errors >= 1, "{down:?}");
    assert_eq!((down.inserted, down.dead_lettered), (0, 0), "{down:?}");
    assert!(ctx.dead_letters(v.id).await.is_empty());
    assert!(ctx.orders_in_db(v.id).await.is_empty());
    // The voucher stopped at the lone order's failure: the six wait unread.
    assert_eq!((down.pending, down.lag), (1, 6), "{down:?}");

    // Fixed: released entries are claimed by the very next run, and land.
    {
        use mysql_async::prelude::Queryable;
        let mut conn = ctx.mysql().await;
        conn.query_drop("DROP TRIGGER refuse_").await.unwrap();
        conn.disconnect().await.ok();
    }
    let back = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((back.inserted, back.errors), (7, 0), "{back:?}");
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        id_set(&admitted)
    );
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

#[tokio::test]
async fn orders_beyond_the_database_stock_are_rejected_and_stock_never_goes_negative() {
    let ctx = DrainCtx::start().await;
    // Redis sells 100, the database only has 30 left (e.g. Redis lost state).
    let v = ctx.voucher(100, 30).await;
    ctx.admit(v.id, "u", 50).await;
    let order_in_stream: Vec<i64> = stream_orders(&ctx, v.id)
        .await
        .into_iter()
        .map(|(_, o)| o)
        .collect();
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 20; // the stock runs out in the middle of the second batch
    let summary = ctx.drain(cfg.clone()).await;
    assert_eq!(
        (summary.inserted, summary.rejected, summary.errors),
        (30, 20, 0),
        "{summary:?}"
    );
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.len(), 50);
    for (i, id) in order_in_stream.iter().enumerate() {
        let want = if i < 30 {
            ("confirmed".to_string(), None)
        } else {
            (
                "rejected".to_string(),
                Some("db_stock_exhausted".to_string()),
            )
        };
        assert_eq!(rows.get(id), Some(&want), "order #{i} of the stream");
    }
    assert_eq!(ctx.db_stock_left(v.id).await, 0);

    // More admissions with no database stock at all: all rejected, stock stays 0.
    ctx.admit(v.id, "late", 5).await;
    let summary = ctx.drain(cfg).await;
    assert_eq!((summary.inserted, summary.rejected), (0, 5), "{summary:?}");
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    assert_eq!(ctx.orders_in_db(v.id).await.len(), 55);
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

#[tokio::test]
async fn trimming_never_removes_an_unacked_or_undelivered_entry() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, 100).await;
    let first = ctx.admit(v.id, "a", 30).await;
    // A drainer died holding the ten oldest entries.
    let held = ghost_read(&ctx, v.id, 10).await;
    assert_eq!(held.len(), 10);

    let mut patient = ctx.drainer_config();
    patient.min_idle = Duration::from_secs(600); // not claimed in this run
    let s = ctx.drain(patient.clone()).await;
    assert_eq!((s.read, s.inserted, s.pending), (20, 20, 10), "{s:?}");
    let ids = ctx.stream_ids(v.id).await;
    assert_eq!(
        ids.len(),
        30,
        "nothing below the oldest pending entry may go"
    );
    for h in &held {
        assert!(ids.contains(h), "pending entry {h} was trimmed");
    }

    // New, undelivered entries; trimming directly changes nothing either.
    let second = ctx.admit(v.id, "b", 10).await;
    let t = ctx.streams.trim(v.id).await.unwrap();
    assert_eq!(t.removed, 0);
    assert_eq!(ctx.stream_ids(v.id).await.len(), 40);

    // After min-idle the held entries are recovered; then everything may go but the last
    // delivered entry.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        (s.claimed, s.read, s.inserted, s.errors),
        (10, 10, 20, 0),
        "{s:?}"
    );
    assert_eq!(ctx.stream_ids(v.id).await.len(), 1);
    let mut want = id_set(&first);
    want.extend(id_set(&second));
    assert_eq!(
        ctx.orders_in_db(v.id)
            .await
            .keys()
            .copied()
            .collect::<BTreeSet<_>>(),
        want
    );

    // No pending entries but undelivered ones: the bound is the last-delivered id.
    ctx.admit(v.id, "c", 5).await;
    let before = ctx.stream_ids(v.id).await; // 1 old + 5 new
    let delivered = ghost_read(&ctx, v.id, 2).await;
    let _: u64 = ctx
        .conn()
        .xack(VoucherKeys::new(v.id).orders, DRAIN_GROUP, &delivered)
        .await
        .unwrap();
    let t = ctx.streams.trim(v.id).await.unwrap();
    assert_eq!(t.min_id.as_deref(), Some(delivered[1].as_str()));
    assert_eq!(t.removed, 2, "the old entry and the first acked one");
    let after = ctx.stream_ids(v.id).await;
    assert_eq!(
        after,
        before[2..].to_vec(),
        "the undelivered entries all remain"
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn data_api_outage_loses_nothing_and_every_order_lands_after_restart() {
    let mut ctx = DrainCtx::start().await;
    let v = ctx.voucher(2_000, 2_000).await;
    let admitted = ctx.admit(v.id, "u", 1_000).await;

    // Pointed at a closed port from the start: nothing written, nothing acked, and the
    // invocation reports failure.
    let mut cfg = ctx.drainer_config();
    cfg.data_api.endpoint = Some("http://127.0.0.1:9".into());
    cfg.data_api.timeout = Duration::from_secs(2);
    let down = ctx.drain(cfg).await;
    assert!(down.errors >= 1, "{down:?}");
    assert!(order_drainer::outcome(down.clone()).is_err());
    assert_eq!(down.inserted, 0);
    assert_eq!(
        ctx.pending(v.id).await,
        down.read,
        "what was read stays pending"
    );
    assert!(ctx.orders_in_db(v.id).await.is_empty());

    // Stopped in the middle of a drain.
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 20;
    cfg.max_run = Duration::from_secs(30);
    cfg.data_api.timeout = Duration::from_secs(2);
    let drainer = order_drainer::Drainer::connect(cfg).await.unwrap();
    let run = tokio::spawn(async move { order_drainer::run_once(&drainer).await.0 });
    let started = Instant::now();
    loop {
        let n = ctx.orders_in_db(v.id).await.len();
        if n >= 100 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "only {n} rows");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ctx.stop_data_api().await;
    let cut = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the drain stops soon after the outage")
        .unwrap();
    assert!(cut.errors >= 1, "{cut:?}");
    let landed = ctx.orders_in_db(v.id).await.len();
    assert!(
        landed < 1_000,
        "the outage came too late to test anything: {cut:?}"
    );
    assert_eq!(cut.inserted as usize, landed, "{cut:?}");

    // Back up: after min-idle every order lands exactly once.
    ctx.start_data_api().await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut cfg = ctx.drainer_config();
    cfg.max_run = Duration::from_secs(5);
    let back = ctx.drain(cfg).await;
    assert_eq!(back.errors, 0, "{back:?}");
    assert!(back.claimed >= 1, "{back:?}");
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        id_set(&admitted)
    );
    assert_eq!(confirmed(&rows), 1_000);
    assert_eq!(ctx.db_stock_left(v.id).await, 1_000);
    assert_eq!(ctx.pending(v.id).await, 0);
    assert_eq!(back.lag, 0);
    ctx.cleanup().await;
}

#[tokio::test]
async fn ended_and_drained_sales_are_retired_and_missing_groups_recreated() {
    let ctx = DrainCtx::start().await;
    let open = ctx.voucher(10, 10).await;
    let ended = ctx.voucher(10, 10).await;
    let stuck = ctx.voucher(10, 10).await;
    ctx.admit(open.id, "o", 2).await;
    let ended_orders = ctx.admit(ended.id, "e", 3).await;
    ctx.admit(stuck.id, "s", 2).await;
    // The sales of `ended` and `stuck` are over; `stuck` has an entry a dead drainer holds.
    for v in [ended.id, stuck.id] {
        let _: () = ctx
            .conn()
            .hset(VoucherKeys::new(v).sale, "ends_ms", now_millis() - 120_000)
            .await
            .unwrap();
    }
    ghost_read(&ctx, stuck.id, 1).await;
    // Someone destroyed the group of `ended`: the drainer recreates it at position 0.
    let _: i64 = ctx
        .conn()
        .xgroup_destroy(VoucherKeys::new(ended.id).orders, DRAIN_GROUP)
        .await
        .unwrap();

    let mut cfg = ctx.drainer_config();
    cfg.min_idle = Duration::from_secs(600);
    let s = ctx.drain(cfg).await;
    assert_eq!(
        (s.inserted, s.retired, s.errors),
        (2 + 3 + 1, 1, 0),
        "{s:?}"
    );
    assert_eq!(
        ctx.orders_in_db(ended.id)
            .await
            .keys()
            .copied()
            .collect::<BTreeSet<_>>(),
        id_set(&ended_orders)
    );
    let active: BTreeSet<i64> = ctx.conn().smembers(ACTIVE_VOUCHERS).await.unwrap();
    assert_eq!(active, BTreeSet::from([open.id.get(), stuck.id.get()]));

    // The retired sale's keys expire after the retention period (7 days here); the open
    // sale's and the stuck one's (an undrained order) never get an expiry.
    let ttl = |key: String| {
        let mut conn = ctx.conn();
        async move { conn.pttl::<_, i64>(key).await.unwrap() }
    };
    let week_ms = 7 * 24 * 3_600 * 1_000;
    let k = VoucherKeys::new(ended.id);
    for key in [k.sale.clone(), k.buyers.clone(), k.orders.clone()] {
        let left = ttl(key.clone()).await;
        assert!(
            left > week_ms - 60_000 && left <= week_ms,
            "{key} expires in {left} ms"
        );
    }
    // Asked directly, the script itself refuses a stream with an undrained order.
    assert!(
        !ctx.streams
            .expire_finished(stuck.id, Some(Duration::from_secs(60)))
            .await
            .unwrap()
    );
    for v in [open.id, stuck.id] {
        let k = VoucherKeys::new(v);
        for key in [k.sale, k.buyers, k.orders] {
            assert_eq!(ttl(key.clone()).await, -1, "{key} must not expire");
        }
    }
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_finished_sale_keeps_its_dead_letters_and_expires_only_once_drained() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    ctx.admit(v.id, "u", 2).await;
    ctx.xadd_raw(v.id, &[("junk", "1")]).await;
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
    cfg.retention = Some(Duration::from_secs(60));
    let runs = drain_until_retired(&ctx, &cfg, &[v.id]).await;
    assert_eq!(
        (sum(&runs, |s| s.inserted), sum(&runs, |s| s.dead_lettered)),
        (2, 1),
        "{runs:?}"
    );
    let active: BTreeSet<i64> = ctx.conn().smembers(ACTIVE_VOUCHERS).await.unwrap();
    assert!(!active.contains(&v.id.get()), "retired: {runs:?}");
    let k = VoucherKeys::new(v.id);
    let mut conn = ctx.conn();
    let orders_ttl: i64 = conn.pttl(&k.orders).await.unwrap();
    assert!(orders_ttl > 0 && orders_ttl <= 60_000, "{orders_ttl}");
    // The dead letter waits for an operator: no expiry.
    assert_eq!(conn.pttl::<_, i64>(&k.dead).await.unwrap(), -1);

    // Retention 0 keeps everything.
    let w = ctx.voucher(10, 10).await;
    ctx.admit(w.id, "u", 1).await;
    let _: () = conn
        .hset(
            VoucherKeys::new(w.id).sale,
            "ends_ms",
            now_millis() - 120_000,
        )
        .await
        .unwrap();
    cfg.retention = None;
    let s = ctx.drain(cfg).await;
    assert_eq!((s.inserted, s.retired), (1, 1), "{s:?}");
    assert_eq!(
        conn.pttl::<_, i64>(&VoucherKeys::new(w.id).orders)
            .await
            .unwrap(),
        -1
    );
    ctx.cleanup().await;
}

/// The database says voucher `v`'s sale ended two minutes ago (Redis is left as it is).
async fn ended_in_db(ctx: &DrainCtx, v: VoucherId) {
    ctx.db()
        .await
        .execute(
            "UPDATE vouchers SET begins_at = UTC_TIMESTAMP(3) - INTERVAL 2 HOUR, \
             ends_at = UTC_TIMESTAMP(3) - INTERVAL 2 MINUTE WHERE id = :id",
            vec![seckill_shared::adapters::data_api::param::long(
                "id",
                v.get(),
            )],
            None,
        )
        .await
        .unwrap();
}

/// Runs the drainer until none of `gone` is in the active set any more (at most four
/// runs): a run retires in what is left of its time once drained, so on a loaded
/// machine the retirement may fall to the next run (and a retirement done as the run's
/// time ends may go uncounted in its summary: the active set is what tells). Every
/// run's summary.
async fn drain_until_retired(
    ctx: &DrainCtx,
    cfg: &order_drainer::Config,
    gone: &[VoucherId],
) -> Vec<order_drainer::Summary> {
    let mut runs = Vec::new();
    while runs.len() < 4 {
        runs.push(ctx.drain(cfg.clone()).await);
        let active: BTreeSet<i64> = ctx.conn().smembers(ACTIVE_VOUCHERS).await.unwrap();
        if gone.iter().all(|v| !active.contains(&v.get())) {
            break;
        }
    }
    runs
}

/// A figure summed over `runs`.
fn sum(runs: &[order_drainer::Summary], figure: impl Fn(&order_drainer::Summary) -> u64) -> u64 {
    runs.iter().map(figure).sum()
}

/// A bucket the active set lists without its sale hash (Redis lost the sale after it
/// ended; a sale whose preload never happened) is retired once drained and over by the
/// database's end, its keys given the retention's expiry, instead of being probed by every
/// run for good; one that lost its hash while its sale is open stays, and so does one
/// whose orders still await payment in the database, until their deadlines, given back
/// to Redis, have expired them.
#[tokio::test]
async fn a_drained_sale_without_its_sale_hash_is_retired_by_the_database_end() {
    let ctx = DrainCtx::start().await;
    let lost_after_end = ctx.voucher(10, 10).await;
    let admitted = ctx.admit(lost_after_end.id, "l", 2).await;
    ended_in_db(&ctx, lost_after_end.id).await;
    let never_loaded = ctx.voucher_at(10, now_millis() - 3_720_000).await;
    let open_lost = ctx.voucher(10, 10).await;
    ctx.admit(open_lost.id, "o", 1).await;
    // Over and lost too, but an order awaits payment in the database (its deadline lost
    // with the sale): a payment or a cancel may still close it there, to be settled. Its
    // time to pay outlasts the first runs, however slow a loaded machine makes them.
    const PAY_WITHIN_MS: i64 = 20_000;
    let now = now_millis();
    let unpaid = ctx
        .voucher_of(&seckill_shared::domain::NewVoucher {
            title: "unpaid".into(),
            stock: 10,
            window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
            payment: Some(seckill_shared::domain::PaymentTerms {
                pay_within_ms: PAY_WITHIN_MS,
                rebuy_after_close: false,
                rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
                price: None,
            }),
            buckets: 1,
            room: None,
        })
        .await;
    let admitted_at = now_millis();
    ctx.admit(unpaid.id, "u", 1).await;
    ended_in_db(&ctx, unpaid.id).await;
    for v in [lost_after_end.id, never_loaded.id, open_lost.id, unpaid.id] {
        let k = VoucherKeys::new(v);
        let _: i64 = ctx.conn().del(&[&k.sale, &k.buyers]).await.unwrap();
    }

    let mut cfg = ctx.drainer_config();
    cfg.retention = Some(Duration::from_secs(60));
    let runs = drain_until_retired(&ctx, &cfg, &[lost_after_end.id, never_loaded.id]).await;
    assert_eq!(
        (sum(&runs, |s| s.inserted), sum(&runs, |s| s.errors)),
        (4, 0),
        "{runs:?}"
    );
    let rows = ctx.orders_in_db(unpaid.id).await;
    assert_eq!(
        rows.values().next().unwrap().0,
        "awaiting_payment",
        "{rows:?}"
    );
    let _: i64 = ctx
        .conn()
        .del(VoucherKeys::new(unpaid.id).deadlines)
        .await
        .unwrap();
    assert_eq!(
        ctx.orders_in_db(lost_after_end.id)
            .await
            .keys()
            .copied()
            .collect::<BTreeSet<_>>(),
        id_set(&admitted)
    );
    let active: BTreeSet<i64> = ctx.conn().smembers(ACTIVE_VOUCHERS).await.unwrap();
    assert!(active.contains(&open_lost.id.get()), "{active:?}");
    assert!(active.contains(&unpaid.id.get()), "{active:?}");
    for v in [lost_after_end.id, never_loaded.id] {
        assert!(!active.contains(&v.get()), "{v} still active: {active:?}");
        let orders_ttl: i64 = ctx.conn().pttl(VoucherKeys::new(v).orders).await.unwrap();
        assert!(
            orders_ttl == -2 || (orders_ttl > 0 && orders_ttl <= 60_000),
            "{v}: the stream expires in {orders_ttl} ms"
        );
    }
    let open_ttl: i64 = ctx
        .conn()
        .pttl(VoucherKeys::new(open_lost.id).orders)
        .await
        .unwrap();
    assert_eq!(open_ttl, -1, "an open sale's stream never expires");
    // The next run: the unpaid order's deadline is gone from Redis too, so only the
    // database tells that it still awaits payment; nothing retires, and the deadline is
    // given back (an ended sale is never repaired: nothing else would expire it).
    let s = ctx.drain(cfg.clone()).await;
    assert_eq!((s.retired, s.errors), (0, 0), "{s:?}");
    let active: BTreeSet<i64> = ctx.conn().smembers(ACTIVE_VOUCHERS).await.unwrap();
    assert!(active.contains(&unpaid.id.get()), "{active:?}");
    let deadlines: u64 = ctx
        .conn()
        .zcard(VoucherKeys::new(unpaid.id).deadlines)
        .await
        .unwrap();
    assert_eq!(deadlines, 1, "the unpaid order's deadline is back");
    // Past it, the sweep expires the order, the close is settled, and the sale retires.
    let wait = admitted_at + PAY_WITHIN_MS + 200 - now_millis();
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    let mut retired = false;
    for _ in 0..3 {
        let s = ctx.drain(cfg.clone()).await;
        assert_eq!(s.errors, 0, "{s:?}");
        let active: BTreeSet<i64> = ctx.conn().smembers(ACTIVE_VOUCHERS).await.unwrap();
        if !active.contains(&unpaid.id.get()) {
            retired = true;
            break;
        }
    }
    assert!(
        retired,
        "the sale over retires once its unpaid order expired"
    );
    let rows = ctx.orders_in_db(unpaid.id).await;
    assert_eq!(rows.values().next().unwrap().0, "expired", "{rows:?}");
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_fixed_voucher_list_limits_the_drain() {
    let ctx = DrainCtx::start().await;
    let a = ctx.voucher(10, 10).await;
    let b = ctx.voucher(10, 10).await;
    ctx.admit(a.id, "a", 2).await;
    ctx.admit(b.id, "b", 2).await;
    let mut cfg = ctx.drainer_config();
    cfg.vouchers = Some(vec![b.id]);
    let s = ctx.drain(cfg).await;
    assert_eq!((s.vouchers, s.inserted), (1, 2), "{s:?}");
    assert!(ctx.orders_in_db(a.id).await.is_empty());
    assert_eq!(ctx.orders_in_db(b.id).await.len(), 2);
    // The user ids in the database are the buyers' own.
    let mut conn = ctx.mysql().await;
    let users: Vec<String> = mysql_async::prelude::Queryable::exec(
        &mut conn,
        "SELECT user_id FROM orders ORDER BY user_id",
        (),
    )
    .await
    .unwrap();
    conn.disconnect().await.ok();
    let want: Vec<String> = ["b-0", "b-1"]
        .iter()
        .map(|u| UserId::parse(u).unwrap().to_string())
        .collect();
    assert_eq!(users, want);
    ctx.cleanup().await;
}

#[tokio::test]
async fn rows_carry_the_admitted_user_and_time_exactly() {
    use mysql_async::prelude::Queryable;
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    // Ids that break naive quoting, JSON escaping, placeholder parsing or 3-byte UTF-8.
    let users = [
        "quote\"d",
        "back\\slash",
        "it's",
        "'; DROP TABLE orders; --",
        "a:b :s :rows",
        "$[*].u",
        "😀 emoji € ü",
        &"é".repeat(32), // 64 bytes, the longest id
    ];
    let now = now_millis();
    let mut want = BTreeSet::new();
    for (i, u) in users.iter().enumerate() {
        UserId::parse(u).expect("a valid user id");
        let id = ctx.ids.next(&ctx.sales, v.id, now).await.unwrap();
        // Distinct milliseconds, one of them on a whole second. The admission script
        // stamps Redis's own clock, so the entries are written as it writes them
        // (same fields), with chosen times.
        let at = now - now % 1000 - i as i64 * 7;
        ctx.xadd_raw(
            v.id,
            &[
                ("order_id", &id.to_string()),
                ("voucher_id", &v.id.to_string()),
                ("user_id", u),
                ("admitted_ms", &at.to_string()),
            ],
        )
        .await;
        want.insert((id.get(), u.to_string(), at));
    }
    let summary = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((summary.inserted, summary.errors), (8, 0), "{summary:?}");
    let mut conn = ctx.mysql().await;
    // Times are stored as UTC.
    conn.query_drop("SET time_zone = '+00:00'").await.unwrap();
    let rows: Vec<(i64, String, i64)> = conn
        .exec(
            "SELECT id, user_id, CAST(UNIX_TIMESTAMP(admitted_at) * 1000 AS SIGNED) \
             FROM orders WHERE voucher_id = ?",
            (v.id.get(),),
        )
        .await
        .unwrap();
    conn.disconnect().await.ok();
    assert_eq!(rows.into_iter().collect::<BTreeSet<_>>(), want);
    assert_eq!(ctx.db_stock_left(v.id).await, 2);
    ctx.cleanup().await;
}

/// Ten thousand open sales with two orders each, and three hot sales of 500 at the top
/// of the id range (the old drainer visited vouchers in id order and spent its run on
/// per-voucher maintenance, so these waited for many runs). Every order must land within
/// a few runs, the hot sales in the first, and no run may overrun its time budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_open_sales_drain_within_a_few_runs_hot_ones_first() {
    use futures::StreamExt;
    const SMALL: i64 = 10_000;
    const PER_SMALL: usize = 2;
    const HOT: i64 = 3;
    const PER_HOT: usize = 500;
    let ctx = DrainCtx::start().await;
    let small = ctx.many_vouchers(1, SMALL, 10).await;
    let hot = ctx.many_vouchers(1_000_000, HOT, PER_HOT as i64).await;
    let hot_ids: Vec<OrderId> = futures::stream::iter(&hot)
        .map(|v| ctx.admit(v.id, "hot", PER_HOT))
        .buffer_unordered(3)
        .collect::<Vec<_>>()
        .await
        .concat();
    let small_ids: Vec<OrderId> = futures::stream::iter(&small)
        .map(|v| ctx.admit(v.id, "u", PER_SMALL))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .concat();
    let total = hot_ids.len() + small_ids.len();

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    cfg.concurrency = 8;
    cfg.max_run = Duration::from_secs(10);
    cfg.safety_margin = Duration::from_secs(2);
    // The deadline each run is given (`--once`: max run + safety margin): no batch may
    // start that would not end before it, and the finish step stops there.
    let budget = cfg.max_run + cfg.safety_margin;
    let mut runs = Vec::new();
    let db_count = |ctx: &DrainCtx| {
        let url = crate_url(ctx);
        async move {
            use mysql_async::prelude::Queryable;
            let mut conn = seckill_tests::mysql::connect(&url).await;
            let n: Option<u64> = conn
                .query_first("SELECT COUNT(*) FROM orders")
                .await
                .unwrap();
            let hot_rows: Option<u64> = conn
                .query_first("SELECT COUNT(*) FROM orders WHERE voucher_id >= 1000000")
                .await
                .unwrap();
            conn.disconnect().await.ok();
            (n.unwrap_or(0) as usize, hot_rows.unwrap_or(0) as usize)
        }
    };
    for run in 1..=8 {
        let s = ctx.drain(cfg.clone()).await;
        // The run's own clock, from the moment it was given its deadline.
        let took = Duration::from_millis(s.elapsed_ms);
        println!(
            "run {run}: {took:?} probed {} read {} inserted {} errors {} lag {}",
            s.probed, s.read, s.inserted, s.errors, s.lag
        );
        assert!(
            took <= budget,
            "run {run} took {took:?}, over its budget {budget:?}: {s:?}"
        );
        assert_eq!((s.errors, s.dead_lettered), (0, 0), "run {run}: {s:?}");
        let (rows, hot_rows) = db_count(&ctx).await;
        if run == 1 {
            assert_eq!(
                hot_rows,
                hot_ids.len(),
                "hot sales drain in the first run: {s:?}"
            );
        }
        runs.push(s);
        if rows == total {
            break;
        }
    }
    let (rows, _) = db_count(&ctx).await;
    assert_eq!(
        rows,
        total,
        "every order within {} runs: {runs:#?}",
        runs.len()
    );
    // The small sales are written in groups (a transaction per 100 orders here, not
    // per sale): counted in transactions, which no machine's speed changes (one per
    // small sale would be 10,000 of them; grouped, 215 to 705 here, more when a run's
    // time cuts rounds short). In runs: one takes them
    // all here, a loaded CI machine needed two or three (one transaction per small sale
    // took five or six on this one).
    let transactions: u64 = runs.iter().map(|s| s.batches).sum();
    assert!(
        transactions as usize <= total / 10,
        "{transactions} transactions for {total} orders: {runs:#?}"
    );
    assert!(runs.len() <= 4, "took {} runs", runs.len());
    let inserted: u64 = runs.iter().map(|s| s.inserted).sum();
    assert_eq!(inserted as usize, total);
    // Nearly all in groups: a read left alone at the end of a round drains alone.
    let grouped: u64 = runs.iter().map(|s| s.grouped).sum();
    assert!(
        grouped as usize >= small_ids.len() * 9 / 10,
        "{grouped} of {} small sales' orders in groups",
        small_ids.len()
    );
    ctx.cleanup().await;
}

fn crate_url(ctx: &DrainCtx) -> String {
    seckill_tests::mysql::url_with_database(&ctx.mysql_url, &ctx.database)
}

#[tokio::test]
async fn a_killed_runs_transaction_is_rolled_back_once_old_and_a_live_one_is_waited_for() {
    let ctx = DrainCtx::start().await;
    let mut cfg = ctx.drainer_config();
    cfg.min_idle = Duration::from_secs(2);

    // Recorded a minute ago by a run that is gone: rolled back at once, the sale drains.
    let v = ctx.voucher(100, 100).await;
    let admitted = ctx.admit(v.id, "u", 10).await;
    ctx.hold_the_voucher_row(v.id, Some(("ghost", now_millis() - 60_000)))
        .await;
    let s = ctx.drain(cfg.clone()).await;
    assert_eq!(
        (s.aborted_transactions, s.inserted, s.errors),
        (1, 10, 0),
        "{s:?}"
    );
    assert_eq!(ctx.orders_in_db(v.id).await.len(), admitted.len());
    assert_eq!(
        ctx.conn()
            .hlen::<_, u64>(VoucherKeys::new(v.id).drain_tx)
            .await
            .unwrap(),
        0,
        "the abandoned transaction's record is gone"
    );

    // Recorded just now (a live batch of an overlapping run): left alone; this run gives
    // its entries back and fails, losing nothing; once the holder is old, it goes.
    let w = ctx.voucher(100, 100).await;
    let admitted = ctx.admit(w.id, "u", 10).await;
    ctx.hold_the_voucher_row(w.id, Some(("live", now_millis())))
        .await;
    let s = ctx.drain(cfg.clone()).await;
    assert!(s.errors >= 1, "{s:?}");
    assert_eq!(
        (s.aborted_transactions, s.inserted, s.dead_lettered),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.released, 10, "{s:?}");
    tokio::time::sleep(cfg.min_idle).await;
    let s = ctx.drain(cfg.clone()).await;
    assert_eq!(
        (s.aborted_transactions, s.inserted, s.errors),
        (1, 10, 0),
        "{s:?}"
    );
    assert_eq!(ctx.orders_in_db(w.id).await.len(), admitted.len());
    assert_eq!(ctx.pending(w.id).await, 0);
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_refused_order_leaves_the_stock_to_its_neighbours_in_stream_order() {
    let ctx = DrainCtx::start().await;
    // Five units in the database for eleven admitted orders, one of them refused.
    let v = ctx.voucher(100, 5).await;
    ctx.refuse_users("poison").await;
    let mut in_order = Vec::new();
    for (prefix, n) in [("a", 2), ("poison", 1), ("b", 8)] {
        for id in ctx.admit(v.id, prefix, n).await {
            in_order.push(id);
        }
    }
    // Stream order, not admission-call order, decides who gets the units (read before
    // the drain trims the stream).
    let stream: Vec<i64> = stream_orders(&ctx, v.id)
        .await
        .into_iter()
        .map(|(_, o)| o)
        .collect();
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!(
        (s.inserted, s.rejected, s.dead_lettered, s.errors),
        (5, 5, 1, 0),
        "{s:?}"
    );
    let rows = ctx.orders_in_db(v.id).await;
    let dead = ctx.dead_letters(v.id).await;
    let poison: i64 = dead[0]["order_id"].parse().unwrap();
    let good: Vec<i64> = stream.into_iter().filter(|o| *o != poison).collect();
    assert_eq!(good.len(), 10);
    for (i, o) in good.iter().enumerate() {
        let want = if i < 5 { "confirmed" } else { "rejected" };
        assert_eq!(rows[o].0, want, "order {i} of the stream: {rows:?}");
    }
    assert!(!rows.contains_key(&poison));
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    assert_eq!(in_order.len(), 11);
    ctx.cleanup().await;
}

/// User ids are compared byte for byte everywhere, as Redis compares them: buyers whose
/// ids differ only by trailing spaces or case are different buyers in the orders table
/// too (its user_id was a PAD SPACE column, where `alice` and `alice ` were one key: the
/// second order could never be written and was dead-lettered as a duplicate buyer,
/// though Redis had told both buyers 202). The drain plans exactly the rows the
/// database takes (inserted = admitted, no error), so nothing stalls either. Each is written, confirmed, found again by
/// its own id, and the repair's paged read (`user_id > :after`) skips none of them.
#[tokio::test]
async fn user_ids_differing_only_in_trailing_spaces_or_case_are_different_buyers() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    let users = [
        "alice",
        "alice ",
        "alice  ",
        "Alice",
        "alice\u{3000}",
        "álice",
    ];
    let mut orders = HashMap::new();
    for u in users {
        let user = UserId::parse(u).unwrap();
        let id = ctx.ids.next(&ctx.sales, v.id, now_millis()).await.unwrap();
        let reply = ctx.sales.admit(v.id, &user, id).await.unwrap();
        assert!(
            matches!(
                reply.admission,
                seckill_shared::domain::Admission::Admitted { .. }
            ),
            "{u:?}: {:?}",
            reply.admission
        );
        orders.insert(u, id);
    }
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.errors), (users.len() as u64, 0), "{s:?}");
    assert!(
        ctx.dead_letters(v.id).await.is_empty(),
        "no buyer is dead-lettered"
    );
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(confirmed(&rows), users.len());
    assert_eq!(ctx.db_stock_left(v.id).await, 10 - users.len() as i64);

    let db = ctx.db().await;
    for (u, id) in &orders {
        let user = UserId::parse(u).unwrap();
        let (found, ..) = db
            .order_of_buyer(v.id, &user)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{u:?} has no order"));
        assert_eq!(found, *id, "{u:?} finds its own order");
        let (_, stored, ..) = db.order(*id).await.unwrap().expect("order");
        assert_eq!(stored.as_str(), *u, "the id comes back byte for byte");
    }
    let (_, mut snapshot) = db.sale_snapshot(v.id).await.unwrap().expect("voucher");
    let mut seen = Vec::new();
    while let Some(page) = snapshot.next_page().await.unwrap() {
        seen.extend(page);
    }
    snapshot.finish().await;
    let mut want: Vec<(String, OrderId)> =
        orders.iter().map(|(u, id)| (u.to_string(), *id)).collect();
    want.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    assert_eq!(
        seen, want,
        "the paged read returns every buyer once, in byte order"
    );
    ctx.cleanup().await;
}

/// A voucher on sale now (for an hour) whose orders wait `pay_within_s` for payment and
/// whose buyers may buy again after a close, preloaded into Redis.
async fn rebuy_voucher(ctx: &DrainCtx, stock: i64, pay_within_s: i64) -> Voucher {
    use seckill_shared::domain::{NewVoucher, PaymentTerms, Price};
    use seckill_tests::harness::{TEST_CURRENCY, TEST_PRICE_MINOR};
    let now = now_millis();
    ctx.voucher_of(&NewVoucher {
        title: "rebuy test".into(),
        stock,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment: Some(PaymentTerms {
            pay_within_ms: pay_within_s * 1_000,
            rebuy_after_close: true,
            rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
            price: Some(Price::new(TEST_PRICE_MINOR, TEST_CURRENCY).unwrap()),
        }),
        buckets: 1,
        room: None,
    })
    .await
}

/// Cancels each of `ids` (the orders of `<prefix>-<i>`) through `lua/close.lua`.
async fn cancel_all(ctx: &DrainCtx, v: VoucherId, prefix: &str, ids: &[OrderId]) {
    use seckill_shared::adapters::redis::CloseAction;
    for (i, id) in ids.iter().enumerate() {
        let user = UserId::parse(&format!("{prefix}-{i}")).unwrap();
        let closed = ctx
            .sales
            .close(v, *id, &user, &CloseAction::Cancel)
            .await
            .unwrap()
            .expect("an open order");
        assert_eq!(closed.status.as_str(), "cancelled");
    }
}

/// `n` orders of `<prefix>-<i>` admitted and cancelled before any drain, as
/// `lua/admit.lua` and `lua/close.lua` leave them on a voucher that lets buyers buy
/// again: the order's stream entry, its close in the closed hash and in `to_settle`
/// (the unit and the buyer's place taken and given back: the stock and the buyers hash
/// as before). Written in pipelines: the backlog a database outage longer than the pay
/// window leaves behind, in a second rather than 2n script calls.
async fn cancelled_before_their_drain(
    ctx: &DrainCtx,
    v: VoucherId,
    prefix: &str,
    n: usize,
    pay_within_ms: i64,
) {
    let k = VoucherKeys::new(v);
    let mut conn = ctx.conn();
    for start in (0..n).step_by(1_000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 1_000).min(n) {
            let id = ctx.ids.next(&ctx.sales, v, now_millis()).await.unwrap();
            let user = format!("{prefix}-{i}");
            let close = format!("cancelled\n{}\n\n{user}", now_millis() + pay_within_ms);
            pipe.cmd("XADD")
                .arg(&k.orders)
                .arg("*")
                .arg("order_id")
                .arg(id.get())
                .arg("user_id")
                .arg(&user)
                .ignore();
            pipe.hset(&k.closed, id.get(), close).ignore();
            pipe.sadd(&k.to_settle, id.get()).ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
}

/// More closes wait to be settled than a transaction records
/// (`SETTLE_PER_TRANSACTION`), twice as many, all of orders not drained yet (their
/// buyers cancelled them before a drain: a database outage longer than the pay window
/// leaves that behind, or a mass expiry). Before them in the stream: twenty buyers of
/// drained orders who cancelled and bought again, and twenty buyers of the units twenty
/// others gave back; the database has no unit left but those twenty. Each new order must
/// find its buyer's old order closed in the database and the units back: none
/// dead-lettered `duplicate_buyer` (a 202 with no row), none written `rejected` though
/// its unit exists. (Before, each transaction recorded the closes `to_settle` happened
/// to list first, closes of orders without a row among them: about half the closes that
/// mattered were left out, run after run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_of_undrained_orders_never_starve_the_closes_a_batch_needs() {
    use seckill_shared::adapters::ledger::SETTLE_PER_TRANSACTION;
    const PAY_WITHIN_S: i64 = 600;
    let ctx = DrainCtx::start().await;
    let v = rebuy_voucher(&ctx, 40, PAY_WITHIN_S).await;
    let old_rebuy = ctx.admit(v.id, "rebuy", 20).await;
    let old_gone = ctx.admit(v.id, "gone", 20).await;
    let s = ctx.drain(ctx.drainer_config()).await;
    assert_eq!((s.inserted, s.errors), (40, 0), "{s:?}");
    assert_eq!(ctx.db_stock_left(v.id).await, 0);

    cancel_all(&ctx, v.id, "rebuy", &old_rebuy).await;
    let new_rebuy = ctx.admit(v.id, "rebuy", 20).await;
    cancel_all(&ctx, v.id, "gone", &old_gone).await;
    let new_buyers = ctx.admit(v.id, "new", 20).await;
    let backlog = 2 * SETTLE_PER_TRANSACTION;
    cancelled_before_their_drain(&ctx, v.id, "outage", backlog, PAY_WITHIN_S * 1_000).await;
    assert_eq!(
        ctx.streams.to_settle(v.id).await.unwrap().len(),
        40 + backlog
    );

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 2_000;
    cfg.max_run = Duration::from_secs(4);
    let mut runs = 0;
    loop {
        let s = ctx.drain(cfg.clone()).await;
        assert_eq!(s.errors, 0, "{s:?}");
        runs += 1;
        let waiting = ctx.streams.to_settle(v.id).await.unwrap().len();
        if waiting == 0 && s.lag == 0 && s.pending == 0 {
            break;
        }
        assert!(runs < 20, "still {waiting} closes to settle: {s:?}");
    }

    let rows = ctx.orders_in_db(v.id).await;
    let dead: Vec<String> = ctx
        .dead_letters(v.id)
        .await
        .iter()
        .map(|d| format!("{}: {}", d["user_id"], d["reason"]))
        .collect();
    let rejected: Vec<i64> = rows
        .iter()
        .filter(|(_, (s, _))| s == "rejected")
        .map(|(id, _)| *id)
        .collect();
    assert!(
        dead.is_empty() && rejected.is_empty(),
        "{} new orders dead-lettered ({dead:?}), {} written rejected",
        dead.len(),
        rejected.len()
    );
    for id in new_rebuy.iter().chain(&new_buyers) {
        assert_eq!(rows[&id.get()].0, "awaiting_payment", "order {id}");
    }
    for id in old_rebuy.iter().chain(&old_gone) {
        assert_eq!(rows[&id.get()].0, "cancelled", "order {id}");
    }
    assert_eq!(rows.len(), 80 + backlog, "every order exactly one row");
    assert_eq!(ctx.db_stock_left(v.id).await, 0, "forty units held, once");
    ctx.cleanup().await;
}

/// A drainer whose Redis connection passes a reply dropper, the batches ten orders, and
/// nothing of its consumer claimable during the test (the lost replies' orders must come
/// back by their own way, not by the claim threshold).
struct DroppingDrainer {
    proxy: seckill_tests::redis::ReplyDropper,
    drainer: order_drainer::Drainer,
    cfg: order_drainer::Config,
    consumer: &'static str,
}

impl DroppingDrainer {
    async fn start(ctx: &DrainCtx, consumer: &'static str) -> DroppingDrainer {
        let proxy = seckill_tests::redis::ReplyDropper::start(&ctx.redis).await;
        let mut cfg = ctx.drainer_config();
        cfg.redis.url = proxy.url();
        cfg.batch_size = 10;
        // Longer than the test.
        cfg.min_idle = Duration::from_secs(120);
        let drainer = order_drainer::Drainer::connect(cfg.clone())
            .await
            .expect("drainer connects");
        DroppingDrainer {
            proxy,
            drainer,
            cfg,
            consumer,
        }
    }

    async fn run(&self) -> order_drainer::Summary {
        let deadline = Instant::now() + self.cfg.max_run + self.cfg.safety_margin;
        self.drainer.run(self.consumer, deadline).await
    }
}

/// The ids of the voucher's rows of `status`.
async fn ids_with(ctx: &DrainCtx, voucher: VoucherId, status: &str) -> BTreeSet<i64> {
    let rows = ctx.orders_in_db(voucher).await;
    rows.into_iter()
        .filter(|(_, (s, _))| s == status)
        .map(|(id, _)| id)
        .collect()
}

/// The survey's probe reads a batch of a sale's new orders in its own call. Its reply is
/// lost (the connection cut after Redis ran it): the orders wait pending for the
/// drainer's consumer, unseen, idle for less than the claim threshold. They must still
/// be drained before the orders admitted after them, whether the client sent the probe
/// again (its second copy finding them) or the run ended with the voucher stopped and
/// the next run of the same instance finds them: with the database's stock short of
/// the orders, the order of writing decides who gets the units, and the
/// earlier-admitted orders must be the confirmed ones. (Before, the next read took the
/// newer orders, which got the units; the lost ones waited for the claim threshold and
/// were then written `rejected`.)
#[tokio::test]
async fn orders_whose_probe_reply_was_lost_are_drained_before_newer_ones() {
    let ctx = DrainCtx::start().await;
    // Redis sells 20, the database holds 10.
    let v = ctx.voucher(20, 10).await;
    let d = DroppingDrainer::start(&ctx, "drainer-lost-probe").await;
    // The scripts are loaded: the probe's next EVALSHA runs it.
    let s = d.run().await;
    assert_eq!(s.errors, 0, "{s:?}");

    let early = ctx.admit(v.id, "early", 10).await;
    let late = ctx.admit(v.id, "late", 10).await;
    // The probe reads a batch: the ten early orders.
    let orders = VoucherKeys::new(v.id).orders;
    d.proxy
        .arm(&[b"EVALSHA", orders.as_bytes(), d.consumer.as_bytes()]);
    let first = d.run().await;
    println!("{first:?}");
    assert_eq!(
        d.proxy.dropped(),
        1,
        "the probe's reply was lost: {first:?}"
    );
    let second = d.run().await;
    assert_eq!(second.errors, 0, "{second:?}");

    assert_eq!(
        ids_with(&ctx, v.id, "confirmed").await,
        id_set(&early),
        "the earlier orders get the database's ten units ({first:?}, {second:?})"
    );
    assert_eq!(ids_with(&ctx, v.id, "rejected").await, id_set(&late));
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    assert_eq!(ctx.pending(v.id).await, 0, "nothing left pending");
    assert!(ctx.dead_letters(v.id).await.is_empty());
    drop(d);
    ctx.cleanup().await;
}

/// The same for a read of the drain rounds (the next batch, read while the one before
/// is written): its reply is lost after Redis ran it, and the client sends it again.
/// The orders the first copy read are drained before the ones admitted after them, so
/// the earlier-admitted orders get the database's units. (Before, a plain XREADGROUP
/// sent twice handed out the next batch too: it was written first, and the lost one
/// waited for the claim threshold.)
#[tokio::test]
async fn orders_whose_read_reply_was_lost_are_drained_before_newer_ones() {
    let ctx = DrainCtx::start().await;
    // Redis sells 30, the database holds 20.
    let v = ctx.voucher(30, 20).await;
    let d = DroppingDrainer::start(&ctx, "drainer-lost-read").await;
    let first = ctx.admit(v.id, "first", 10).await;
    let second = ctx.admit(v.id, "second", 10).await;
    let third = ctx.admit(v.id, "third", 10).await;
    // The probe reads the first ten; the read of the next ten (lua/read.lua, while the
    // first ten are written) loses its reply.
    let read = redis::Script::new(include_str!("../../../lua/read.lua"));
    // Loaded: the read's first EVALSHA runs it (a NOSCRIPT answer would be the one lost).
    let _: String = read
        .prepare_invoke()
        .load_async(&mut ctx.conn())
        .await
        .unwrap();
    let orders = VoucherKeys::new(v.id).orders;
    d.proxy.arm(&[
        read.get_hash().as_bytes(),
        orders.as_bytes(),
        d.consumer.as_bytes(),
    ]);
    let one = d.run().await;
    println!("{one:?}");
    assert_eq!(d.proxy.dropped(), 1, "a read's reply was lost: {one:?}");
    let two = d.run().await;
    assert_eq!(two.errors, 0, "{two:?}");

    let earlier: BTreeSet<i64> = id_set(&first).union(&id_set(&second)).copied().collect();
    assert_eq!(
        ids_with(&ctx, v.id, "confirmed").await,
        earlier,
        "the earlier orders get the database's twenty units ({one:?}, {two:?})"
    );
    assert_eq!(ids_with(&ctx, v.id, "rejected").await, id_set(&third));
    assert_eq!(ctx.pending(v.id).await, 0, "nothing left pending");
    drop(d);
    ctx.cleanup().await;
}

/// The Data API's answer to a commit is lost: the transaction committed, the drainer
/// told `503` (a proxy that gave up waiting, a connection cut after the request went
/// out), so it cannot tell whether its batch is in the database. For one sale's batch
/// and for a group of small sales' orders in one transaction: the entries stay pending,
/// and the next run finds their rows and acks them as duplicates. Then a rollback's
/// answer lost (a copy of a committed order's entry delivered again: its batch rolls
/// back). Every order exactly one row, each stock taken once, nothing dead-lettered,
/// and a run after that changes nothing.
#[tokio::test]
async fn a_commit_or_rollback_whose_answer_was_lost_writes_each_order_once() {
    use data_api_local::{LostAnswers, LostCall};
    for (what, call, sales) in [
        ("one sale's commit", LostCall::Commit, 1),
        ("a group's commit", LostCall::Commit, 3),
        ("a rollback", LostCall::Rollback, 1),
    ] {
        let mut ctx = DrainCtx::start().await;
        let lost = LostAnswers::of(call.clone(), 1);
        let fault = lost.clone();
        ctx.stop_data_api().await;
        ctx.start_data_api_with(move |c| c.lose_answers = Some(fault))
            .await;
        let mut vouchers = Vec::new();
        for _ in 0..sales {
            let v = ctx.voucher(10, 10).await;
            let ids = ctx.admit(v.id, "lost-end", 4).await;
            vouchers.push((v, ids));
        }
        let first = ctx.drain(ctx.drainer_config()).await;
        if call == LostCall::Commit {
            assert_eq!(lost.left(), 0, "{what}: its answer was lost: {first:?}");
            assert!(first.errors > 0, "{what}: the run says so: {first:?}");
            assert_eq!(first.inserted, 0, "{what}: nothing counted as written");
        } else {
            assert_eq!((first.inserted, first.errors), (4, 0), "{what}: {first:?}");
            // A committed order's entry once more: its batch has nothing to write.
            let (v, ids) = &vouchers[0];
            let order = ids[0].get().to_string();
            ctx.xadd_raw(v.id, &[("order_id", &order), ("user_id", "lost-end-0")])
                .await;
        }
        let second = ctx.drain(ctx.drainer_config()).await;
        assert_eq!(lost.left(), 0, "{what}: its answer was lost: {second:?}");
        let again = if call == LostCall::Commit {
            4 * sales
        } else {
            1
        };
        assert_eq!(
            (second.inserted, second.duplicates, second.errors),
            (0, again as u64, 0),
            "{what}: found as duplicates, not written again: {second:?}"
        );
        let rows = async |v: VoucherId| (ctx.orders_in_db(v).await, ctx.db_stock_left(v).await);
        let mut after = Vec::new();
        for (v, ids) in &vouchers {
            let (orders, stock) = rows(v.id).await;
            assert_eq!(orders.keys().copied().collect::<BTreeSet<_>>(), id_set(ids));
            assert_eq!(confirmed(&orders), 4, "{what}");
            assert_eq!(stock, 6, "{what}: four units taken once");
            assert!(ctx.dead_letters(v.id).await.is_empty(), "{what}");
            assert_eq!(ctx.pending(v.id).await, 0, "{what}");
            after.push((orders, stock));
        }
        let third = ctx.drain(ctx.drainer_config()).await;
        assert_eq!(
            (
                third.inserted,
                third.duplicates,
                third.dead_lettered,
                third.errors
            ),
            (0, 0, 0, 0),
            "{what}: {third:?}"
        );
        for ((v, _), before) in vouchers.iter().zip(after) {
            assert_eq!(rows(v.id).await, before, "{what}: nothing changed");
        }
        ctx.cleanup().await;
    }
}

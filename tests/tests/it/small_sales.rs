//! Many small sales drained in one transaction (the drainer's group commit), against
//! real parts: a private Redis, the Data API over the stack's MariaDB, the drainer in
//! process and as a process killed at its failpoints.
//!
//! What is proved: small sales' orders are written together, each voucher within its own
//! database stock; a sale that is not the plain case (stock short of its orders, a
//! poison entry, a voucher the database does not have, a payment step) is drained alone,
//! and its neighbours still together; a bucketed voucher's small reads take its row's
//! stock once per order; a row held by another transaction or an order the database
//! refuses sends the group alone and holds back no other sale, but never past the run's
//! time; sales delivered again are found as duplicates; a group killed before its commit
//! is rolled back by the next run and one killed after it is acked as duplicates: every
//! order exactly once, every stock taken once.

use std::collections::BTreeMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use order_drainer::Summary;
use seckill_shared::domain::{OrderId, Voucher, VoucherId, now_millis};
use seckill_tests::drainer::{DrainCtx, DrainerProcess};
use seckill_tests::mysql::handler_reads;

/// Rows per voucher by status: voucher id -> (confirmed, rejected).
async fn rows_by_voucher(ctx: &DrainCtx) -> BTreeMap<i64, (usize, usize)> {
    let mut conn = ctx.mysql().await;
    let rows: Vec<(i64, String, u64)> = conn
        .query("SELECT voucher_id, status, COUNT(*) FROM orders GROUP BY voucher_id, status")
        .await
        .unwrap();
    conn.disconnect().await.ok();
    let mut out: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
    for (v, status, n) in rows {
        let e = out.entry(v).or_default();
        match status.as_str() {
            "confirmed" => e.0 += n as usize,
            "rejected" => e.1 += n as usize,
            other => panic!("unexpected status {other}"),
        }
    }
    out
}

/// `n` vouchers of 10 units from `first`, two buyers admitted to each.
async fn small_sales(ctx: &DrainCtx, first: i64, n: i64) -> (Vec<Voucher>, Vec<OrderId>) {
    let vouchers = ctx.many_vouchers(first, n, 10).await;
    let mut ids = Vec::new();
    for v in &vouchers {
        ids.extend(ctx.admit(v.id, "buyer", 2).await);
    }
    (vouchers, ids)
}

/// Spawns a drainer process with `cfg` that stops at `failpoint`, kills it there, and
/// waits out the claim threshold; `times` times in a row.
async fn kill_at(ctx: &DrainCtx, cfg: &order_drainer::Config, failpoint: &str, times: usize) {
    for _ in 0..times {
        let mut p = DrainerProcess::spawn(&ctx.drainer_env(cfg), Some(failpoint));
        p.wait_for_failpoint(failpoint, Duration::from_secs(60));
        p.kill();
        tokio::time::sleep(cfg.min_idle + Duration::from_millis(200)).await;
    }
}

/// Every sale of [`small_sales`] has its two orders confirmed once, its stock taken once
/// (10 - 2) and nothing pending; `label` names the case in a failure.
async fn assert_each_sale_drained_once(ctx: &DrainCtx, vouchers: &[Voucher], label: &str) {
    let rows = rows_by_voucher(ctx).await;
    for v in vouchers {
        assert_eq!(
            rows.get(&v.id.get()).copied(),
            Some((2, 0)),
            "{label} {}",
            v.id
        );
        assert_eq!(ctx.db_stock_left(v.id).await, 8, "{label} {}", v.id);
        assert_eq!(ctx.pending(v.id).await, 0, "{label} {}", v.id);
    }
}

#[tokio::test]
async fn small_sales_drain_together_and_one_that_is_not_plain_drains_alone() {
    let ctx = DrainCtx::start().await;
    let (mut vouchers, _) = small_sales(&ctx, 1, 40).await;
    let (short, poisoned) = (vouchers[3].id, vouchers[17].id);
    // A sale Redis has and the database does not (its orders are dead-lettered).
    let unknown = VoucherId::new(9_999).unwrap();
    let ghost = Voucher {
        id: unknown,
        ..vouchers[0].clone()
    };
    ctx.sales.preload(&ghost).await.unwrap();
    ctx.admit(unknown, "buyer", 2).await;
    vouchers.push(ghost);
    let mut conn = ctx.mysql().await;
    // Redis admitted two, the database has one unit left: one confirmed, one rejected.
    conn.query_drop(format!(
        "UPDATE vouchers SET stock_left = 1 WHERE id = {short}"
    ))
    .await
    .unwrap();
    conn.disconnect().await.ok();
    ctx.xadd_raw(poisoned, &[("garbage", "1")]).await;

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    let s = ctx.drain(cfg).await;
    println!("{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    // The 38 plain sales' 76 orders in groups (one transaction, or a few if the round
    // read them in parts); the three others alone.
    assert_eq!(s.grouped, 76, "{s:?}");
    assert!(s.batches <= 3 + 6, "{s:?}");
    assert_eq!(
        s.dead_lettered, 3,
        "the poison entry and the unknown voucher's two"
    );
    assert_eq!(s.rejected, 1, "{s:?}");

    let rows = rows_by_voucher(&ctx).await;
    for v in &vouchers {
        let want = match v.id {
            id if id == short => (1, 1),
            // Its buyers see `rejected` rows (written before the dead letters).
            id if id == unknown => (0, 2),
            _ => (2, 0),
        };
        assert_eq!(
            rows.get(&v.id.get()).copied().unwrap_or_default(),
            want,
            "{}",
            v.id
        );
        if v.id != unknown {
            let left = if v.id == short { 0 } else { 8 };
            assert_eq!(ctx.db_stock_left(v.id).await, left, "{}", v.id);
            assert_eq!(ctx.pending(v.id).await, 0, "{}", v.id);
        }
    }
    assert_eq!(ctx.dead_letters(poisoned).await.len(), 1);
    assert_eq!(ctx.dead_letters(unknown).await.len(), 2);
    ctx.cleanup().await;
}

/// A voucher row held by another transaction (no record of it: it is not this
/// drainer's to roll back) sends its group alone: every other sale commits on its own,
/// the held one stays pending, and drains once the row is free.
#[tokio::test]
async fn a_held_row_sends_its_group_alone_and_holds_back_no_other_sale() {
    let ctx = DrainCtx::start().await;
    let (vouchers, ids) = small_sales(&ctx, 1, 10).await;
    let held = vouchers[4].id;
    let tx = ctx.hold_the_voucher_row(held, None).await;
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    cfg.max_run = Duration::from_secs(4);
    let s = ctx.drain(cfg.clone()).await;
    println!("{s:?}");
    assert_eq!((s.inserted, s.grouped), (18, 0), "{s:?}");
    assert_eq!(s.dead_lettered, 0);
    assert_eq!(ctx.pending(held).await, 2, "the held sale stays pending");
    let rows = rows_by_voucher(&ctx).await;
    assert_eq!(rows.len(), 9);

    ctx.db().await.rollback(&tx).await;
    cfg.min_idle = Duration::from_millis(1);
    let s = ctx.drain(cfg).await;
    assert_eq!(s.errors, 0, "{s:?}");
    let rows = rows_by_voucher(&ctx).await;
    assert_eq!(rows.values().map(|r| r.0).sum::<usize>(), ids.len());
    assert_eq!(ctx.db_stock_left(held).await, 8);
    ctx.cleanup().await;
}

/// An order the database refuses (a trigger) inside a group: the group's insert fails
/// whole, so every sale goes alone, where the refused order is found by splitting its own
/// sale's batch and dead-lettered with the reason; every other sale commits in the same
/// run, and the run counts no error. (Before, the refusal failed the group: all twenty
/// sales stayed pending for the next run to claim.)
#[tokio::test]
async fn an_order_refused_in_a_group_is_found_alone_and_holds_back_no_other_sale() {
    let ctx = DrainCtx::start().await;
    let (vouchers, _) = small_sales(&ctx, 1, 20).await;
    let refused_in = vouchers[7].id;
    ctx.refuse_users("poison").await;
    let poison = ctx.admit(refused_in, "poison", 1).await;
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    let s = ctx.drain(cfg).await;
    println!("{s:?}");
    assert_eq!((s.inserted, s.dead_lettered, s.errors), (40, 1, 0), "{s:?}");
    assert_each_sale_drained_once(&ctx, &vouchers, "refusal").await;
    let dead = ctx.dead_letters(refused_in).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        dead[0].get("order_id").map(String::as_str),
        Some(poison[0].to_string().as_str())
    );
    let reason = dead[0].get("reason").cloned().unwrap_or_default();
    assert!(reason.contains("refused by a test trigger"), "{reason}");
    ctx.cleanup().await;
}

/// A group that goes alone too late in the run (its insert refused after 2 s by a
/// trigger that sleeps first) leaves every sale pending when no batch fits in the time
/// left: none of them starts a transaction of its own past the run's end (before, the
/// twenty went one after another, the slow one for seconds more). The next run drains
/// them all.
#[tokio::test]
async fn a_group_sent_alone_too_late_in_the_run_leaves_its_sales_for_the_next() {
    let ctx = DrainCtx::start().await;
    let (vouchers, _) = small_sales(&ctx, 1, 20).await;
    let slow_sale = vouchers[5].id;
    ctx.refuse_users_after("slow", 2).await;
    ctx.admit(slow_sale, "slow", 1).await;
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    cfg.max_run = Duration::from_millis(3_000);
    let s = ctx.drain(cfg.clone()).await;
    println!("{s:?}");
    assert_eq!(
        (s.inserted, s.dead_lettered, s.released, s.errors),
        (0, 0, 41, 0),
        "{s:?}"
    );
    assert!(s.elapsed_ms < 3_000, "the run kept to its time: {s:?}");

    let mut conn = ctx.mysql().await;
    conn.query_drop("DROP TRIGGER refuse_slow").await.unwrap();
    conn.disconnect().await.ok();
    cfg.min_idle = Duration::from_millis(1);
    let s = ctx.drain(cfg).await;
    assert_eq!((s.inserted, s.errors), (41, 0), "{s:?}");
    for v in &vouchers {
        let want = if v.id == slow_sale { 3 } else { 2 };
        assert_eq!(ctx.orders_in_db(v.id).await.len(), want, "{}", v.id);
        assert_eq!(ctx.db_stock_left(v.id).await, 10 - want as i64, "{}", v.id);
        assert_eq!(ctx.pending(v.id).await, 0, "{}", v.id);
    }
    ctx.cleanup().await;
}

/// Small sales of every kind in one round: plain ones, one with a payment step and one
/// whose stock is split over two buckets, each bucket with a small read. The plain
/// sales are written together; the payment sale's orders wait for payment (never
/// `confirmed` by a group) with their deadline; the bucketed voucher's row takes each of
/// its four orders once, whichever way its two buckets went.
#[tokio::test]
async fn payment_and_bucketed_sales_among_small_ones_keep_their_own_rules() {
    use seckill_shared::domain::{Bucket, NewVoucher, PaymentTerms, Price, SaleWindow};
    use seckill_tests::harness::{TEST_CURRENCY, TEST_PRICE_MINOR};

    let ctx = DrainCtx::start().await;
    let (plain, _) = small_sales(&ctx, 1, 10).await;
    let now = now_millis();
    let sale = |title: &str, payment, buckets| NewVoucher {
        title: title.into(),
        stock: 10,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment,
        buckets,
        room: None,
    };
    let terms = PaymentTerms {
        pay_within_ms: 600_000,
        rebuy_after_close: false,
        rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
        price: Some(Price::new(TEST_PRICE_MINOR, TEST_CURRENCY).unwrap()),
    };
    let paid = ctx.voucher_of(&sale("pay", Some(terms), 1)).await.id;
    ctx.admit(paid, "payer", 2).await;
    let split = ctx.voucher_of(&sale("buckets", None, 2)).await.id;
    let buckets: Vec<Bucket> = Bucket::all(split, 2).collect();
    ctx.admit_to(buckets[0], "first", 2).await;
    ctx.admit_to(buckets[1], "second", 2).await;

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    let s = ctx.drain(cfg).await;
    println!("{s:?}");
    assert_eq!((s.inserted, s.errors), (20 + 2 + 4, 0), "{s:?}");
    assert!(s.grouped >= 20, "the plain sales went together: {s:?}");
    for v in &plain {
        let statuses: Vec<String> = ctx
            .orders_in_db(v.id)
            .await
            .into_values()
            .map(|(status, _)| status)
            .collect();
        assert_eq!(statuses, vec!["confirmed".to_string(); 2], "{}", v.id);
        assert_eq!(ctx.db_stock_left(v.id).await, 8, "{}", v.id);
        assert_eq!(ctx.pending(v.id).await, 0, "{}", v.id);
    }

    let mut conn = ctx.mysql().await;
    let rows: Vec<(String, bool)> = conn
        .exec(
            "SELECT status, pay_by IS NOT NULL FROM orders WHERE voucher_id = ?",
            (paid.get(),),
        )
        .await
        .unwrap();
    conn.disconnect().await.ok();
    assert_eq!(
        rows,
        vec![("awaiting_payment".to_string(), true); 2],
        "the payment sale's orders"
    );
    assert_eq!(ctx.db_stock_left(paid).await, 8, "their units are held");
    assert_eq!(ctx.pending(paid).await, 0);

    let statuses: Vec<String> = ctx
        .orders_in_db(split)
        .await
        .into_values()
        .map(|(status, _)| status)
        .collect();
    assert_eq!(statuses, vec!["confirmed".to_string(); 4]);
    assert_eq!(
        ctx.db_stock_left(split).await,
        6,
        "each order took one unit"
    );
    for b in buckets {
        assert_eq!(ctx.pending(b).await, 0, "{b}");
    }
    ctx.cleanup().await;
}

/// Small sales drained together, then delivered again as new entries (their drain
/// groups set back to the start: what a group made again after a failover that lost its
/// last-delivered id does; the streams keep what the first run did not trim): the
/// second run's group finds its orders in the database (a count short of the plan), and
/// each sale alone then writes nothing, takes no stock and acks everything as
/// duplicates.
#[tokio::test]
async fn small_sales_delivered_again_are_found_as_duplicates_and_change_nothing() {
    use redis::AsyncCommands;
    use seckill_shared::keys::{DRAIN_GROUP, VoucherKeys};

    let ctx = DrainCtx::start().await;
    let (vouchers, ids) = small_sales(&ctx, 1, 20).await;
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 100;
    let s = ctx.drain(cfg.clone()).await;
    assert_eq!((s.inserted, s.grouped, s.errors), (40, 40, 0), "{s:?}");
    for v in &vouchers {
        let _: () = ctx
            .conn()
            .xgroup_setid(VoucherKeys::new(v.id).orders, DRAIN_GROUP, "0")
            .await
            .unwrap();
    }
    let kept: usize = futures::future::join_all(vouchers.iter().map(|v| ctx.stream_ids(v.id)))
        .await
        .iter()
        .map(Vec::len)
        .sum();
    assert!(
        kept >= vouchers.len(),
        "an entry of every sale is delivered again: {kept}"
    );
    // One run takes them all here; on a loaded machine its time may end first, and what
    // it gave back (`released`) is the next run's.
    let mut runs = Vec::new();
    while runs.len() < 4 && runs.iter().map(|s: &Summary| s.duplicates).sum::<u64>() < kept as u64 {
        runs.push(ctx.drain(cfg.clone()).await);
    }
    println!("{runs:?}");
    let sum = |f: fn(&Summary) -> u64| runs.iter().map(f).sum::<u64>();
    let counts = (
        sum(|s| s.inserted),
        sum(|s| s.duplicates),
        sum(|s| s.rejected),
        sum(|s| s.dead_lettered),
        sum(|s| s.errors),
    );
    assert_eq!(counts, (0, kept as u64, 0, 0, 0), "{runs:?}");
    // Every entry taken once (read, or claimed again after a run gave it back).
    assert_eq!(
        sum(|s| s.read) + sum(|s| s.claimed) - sum(|s| s.released),
        kept as u64,
        "{runs:?}"
    );
    assert_eq!(sum(|s| s.grouped), 0, "{runs:?}");
    assert_eq!(ids.len(), 40);
    assert_each_sale_drained_once(&ctx, &vouchers, "again").await;
    ctx.cleanup().await;
}

/// A drainer process killed in the middle of a group: after its lock (the open
/// transaction holds every member's row, as Aurora keeps it for 3 minutes) and after its
/// commit (nothing acked). The next run rolls the first back (it was recorded with every
/// member's stream) and acks the second as duplicates: each order once, each stock taken
/// once.
// Multi-threaded: the test blocks a thread waiting for the process's failpoint while the
// Data API server it started keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_killed_before_or_after_its_commit_loses_and_doubles_nothing() {
    for failpoint in ["after_lock", "after_commit"] {
        let ctx = DrainCtx::start().await;
        let (vouchers, ids) = small_sales(&ctx, 1, 20).await;
        let mut cfg = ctx.drainer_config();
        cfg.batch_size = 100;
        cfg.min_idle = Duration::from_secs(1);
        cfg.max_run = Duration::from_secs(10);
        kill_at(&ctx, &cfg, failpoint, 1).await;

        let started = now_millis();
        let mut recovery = cfg.clone();
        recovery.max_run = Duration::from_secs(5);
        let (ok, s) = DrainerProcess::spawn(&ctx.drainer_env(&recovery), None)
            .finish(Duration::from_secs(60));
        println!(
            "{failpoint}: recovery {s:?} in {} ms",
            now_millis() - started
        );
        assert!(ok && s.errors == 0, "{failpoint}: {s:?}");
        match failpoint {
            "after_commit" => assert_eq!((s.duplicates, s.inserted), (40, 0), "{s:?}"),
            _ => {
                assert_eq!(s.inserted, 40, "{s:?}");
                assert!(
                    s.aborted_transactions >= 1,
                    "the group's transaction rolled back: {s:?}"
                );
            }
        }
        assert_each_sale_drained_once(&ctx, &vouchers, failpoint).await;
        assert_eq!(
            ctx.orders_in_db(VoucherId::new(1).unwrap()).await.len(),
            2,
            "{failpoint}"
        );
        assert_eq!(ids.len(), 40);
        ctx.cleanup().await;
    }
}

/// The group's statements read only the group's rows whatever the table's statistics
/// say, on a table written just now and never analysed: the lock of a group and the
/// stock update of the same (run as the Data API server runs them, one statement on one
/// connection, with the drainer's own SQL and names) examine a few rows for each of the
/// group's vouchers (`Handler_read_*`), through the primary key (`EXPLAIN`: the JSON
/// parameter read whole, then `eq_ref` on the key for each of its ids). Two shapes: 250
/// of 5,000 vouchers, and 30 of 40, a group that is most of its table (without an index
/// hint the update then read every row, locking them all: two groups written at once
/// deadlocked).
#[tokio::test]
async fn the_group_statements_read_only_their_rows_on_a_table_never_analysed() {
    for (table, group, step) in [(5_000, 250, 19), (40, 30, 1)] {
        let ctx = DrainCtx::start().await;
        ctx.many_vouchers(1, table, 10).await;
        let ids: Vec<VoucherId> = (0..group)
            .map(|i| VoucherId::new(1 + (i * step) % table).unwrap())
            .collect();
        group_statements_read_only_their_rows(&ctx, &ids).await;
        ctx.cleanup().await;
    }
}

/// See [`the_group_statements_read_only_their_rows_on_a_table_never_analysed`].
async fn group_statements_read_only_their_rows(ctx: &DrainCtx, ids: &[VoucherId]) {
    use seckill_shared::adapters::ledger::sql;
    let mut conn = ctx.mysql().await;
    let overhead = {
        let a = handler_reads(&mut conn).await;
        handler_reads(&mut conn).await - a
    };
    conn.query_drop("BEGIN").await.unwrap();

    // The JSON parameter read in its order, each voucher's row found through the key.
    let by_primary_key = vec![
        (Some("ALL".into()), None),
        (Some("eq_ref".into()), Some("PRIMARY".into())),
    ];
    let (lock, params) = sql::lock_vouchers(ids);
    let plan = plan_of(&mut conn, &lock, named(params.clone())).await;
    assert_eq!(plan, by_primary_key, "the lock of {} rows", ids.len());
    let before = handler_reads(&mut conn).await;
    let locked: Vec<(i64, i64)> = conn
        .exec(
            lock.replace(
                "SELECT v.id, v.stock_left, v.pay_within_ms, v.buckets",
                "SELECT v.id, v.stock_left",
            ),
            named(params),
        )
        .await
        .unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(locked.len(), ids.len());
    assert!(
        examined <= 2 * ids.len() as u64 + 10,
        "the lock examined {examined} rows"
    );

    let takes: Vec<(VoucherId, i64)> = ids.iter().map(|v| (*v, 2)).collect();
    let (update, params) = sql::take_stocks(&takes);
    let plan = plan_of(&mut conn, &update, named(params.clone())).await;
    assert_eq!(plan, by_primary_key, "the update of {} rows", ids.len());
    let before = handler_reads(&mut conn).await;
    conn.exec_drop(&update, named(params)).await.unwrap();
    let updated = conn.affected_rows();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(updated, ids.len() as u64, "every row's guard held");
    // Twice the lock's reads: a multi-table UPDATE whose updated table is not the first
    // of the join notes the rows it found (the JSON parameter's, each voucher's by key)
    // and reads them again by position from that list to update them: 4n + 2 here, still
    // only the group's rows. A table scan for each of them would be n x table.
    assert!(
        examined <= 4 * ids.len() as u64 + 10,
        "the update examined {examined} rows"
    );
    conn.query_drop("ROLLBACK").await.unwrap();
    conn.disconnect().await.ok();
}

/// Data API parameters as the database's own client binds them (named, as the Data API
/// server does): the statements run with the product's SQL text and values.
fn named(params: Vec<aws_sdk_rdsdata::types::SqlParameter>) -> mysql_async::Params {
    use aws_sdk_rdsdata::types::Field;
    let map: std::collections::HashMap<Vec<u8>, mysql_async::Value> = params
        .iter()
        .map(|p| {
            let v = match p.value().unwrap() {
                Field::LongValue(n) => mysql_async::Value::from(*n),
                Field::StringValue(s) => mysql_async::Value::from(s.as_str()),
                other => panic!("a statement here binds {other:?}"),
            };
            (p.name().unwrap().as_bytes().to_vec(), v)
        })
        .collect();
    mysql_async::Params::Named(map)
}

/// The statements on the orders table read only about the rows they return on a table
/// written just now and never analysed, whatever the optimizer makes of the missing
/// statistics (each names its index): 30,000 orders of one sale (one in fifteen unpaid,
/// the others confirmed or cancelled) beside a sale of 100, and each statement run with
/// the product's own SQL (`Handler_read_*` counts what it examined): the buyer's order,
/// the repair's page of unpaid orders, the live view's counts of the small sale, the
/// drainer's lookup of a chunk's collisions, and its settlement of closes (which locks
/// what it reads).
#[tokio::test]
async fn the_order_statements_read_only_their_rows_on_a_table_never_analysed() {
    use seckill_shared::adapters::data_api::orders;
    use seckill_shared::adapters::data_api::param;
    use seckill_shared::adapters::ledger::sql;
    use seckill_shared::domain::{AdmittedOrder, ClosedOrder, OrderStatus, UserId};

    let ctx = DrainCtx::start().await;
    ctx.many_vouchers(1, 2, 100_000).await;
    let mut conn = ctx.mysql().await;
    conn.query_drop(
        "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at, pay_by) \
         SELECT seq, IF(seq > 30000, 2, 1), CONCAT('buyer-', seq), \
         CASE WHEN seq % 15 = 0 THEN 'awaiting_payment' WHEN seq % 2 = 0 THEN 'cancelled' \
         ELSE 'confirmed' END, NOW(3), IF(seq % 15 = 0, NOW(3) + INTERVAL 10 MINUTE, NULL) \
         FROM seq_1_to_30100",
    )
    .await
    .unwrap();
    let overhead = {
        let a = handler_reads(&mut conn).await;
        handler_reads(&mut conn).await - a
    };
    let v1 = VoucherId::new(1).unwrap();
    let mut examined = async |sql: &str, params: mysql_async::Params| -> (usize, u64) {
        let before = handler_reads(&mut conn).await;
        let rows: Vec<mysql_async::Row> = conn.exec(sql, params).await.unwrap();
        let n = rows.len();
        (n, handler_reads(&mut conn).await - before - overhead)
    };

    let by_buyer = vec![param::long("v", 1), param::string("u", "buyer-7")];
    let (n, read) = examined(orders::ORDER_OF_BUYER, named(by_buyer)).await;
    assert_eq!(n, 1);
    assert!(read <= 10, "the buyer's order examined {read} rows");

    let page = vec![param::long("v", 1), param::long("after", 0)];
    let (n, read) = examined(&orders::awaiting_payment_sql(), named(page)).await;
    assert_eq!(n, 2_000, "one in fifteen of 30,000");
    assert!(
        read <= 2 * 2_000 + 10,
        "a page of 2,000 unpaid examined {read} rows"
    );

    let counts = vec![param::long("v", 2)];
    let (n, read) = examined(orders::ORDER_STATUS_COUNTS, named(counts)).await;
    assert_eq!(n, 3);
    assert!(
        read <= 2 * 100 + 10,
        "the counts of 100 orders examined {read} rows"
    );

    // A chunk of 1,000 orders: ids found by key, buyers by (voucher, holder).
    let chunk: Vec<AdmittedOrder> = (0..1_000)
        .map(|i| {
            let id = 1 + 29 * i;
            AdmittedOrder {
                id: OrderId::new(id).unwrap(),
                voucher: v1,
                user: UserId::parse(&format!("buyer-{}", id + 1)).unwrap(),
                admitted_ms: now_millis(),
            }
        })
        .collect();
    let (lookup, params) = sql::existing_orders(v1, &chunk);
    let (n, read) = examined(&lookup, named(params)).await;
    assert!(n >= 1_000, "{n} collisions");
    assert!(
        read <= 6 * 1_000 + 10,
        "the chunk's lookup examined {read} rows"
    );

    // The closes of 500 unpaid orders, and which of 1,000 are settled.
    let unpaid: Vec<OrderId> = (1..=500).map(|i| OrderId::new(15 * i).unwrap()).collect();
    let ids: Vec<i64> = unpaid
        .iter()
        .map(|o| o.get())
        .chain((1..=500).map(|i| 2 * i + 1))
        .collect();
    let settled = vec![
        param::string("rows", &serde_json::to_string(&ids).unwrap()),
        param::long("v", 1),
    ];
    let (n, read) = examined(sql::SETTLED_ORDERS, named(settled)).await;
    let confirmed = (1..=500)
        .map(|i| 2 * i + 1)
        .filter(|id| id % 15 != 0)
        .count();
    assert_eq!(n, confirmed, "the odd ids but the unpaid ones");
    assert!(
        read <= 4 * 1_000 + 10,
        "which of 1,000 are settled examined {read} rows"
    );

    let closed = ClosedOrder {
        status: OrderStatus::Cancelled,
        pay_by_ms: now_millis(),
        payment_ref: String::new(),
        user: "buyer".into(),
    };
    let closes: Vec<(OrderId, &ClosedOrder)> = unpaid.iter().map(|o| (*o, &closed)).collect();
    let (update, params) = sql::settle_closes(v1, &closes, true);
    conn.query_drop("BEGIN").await.unwrap();
    let before = handler_reads(&mut conn).await;
    conn.exec_drop(&update, named(params)).await.unwrap();
    let updated = conn.affected_rows();
    let read = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(updated, 500);
    assert!(
        read <= 4 * 500 + 10,
        "the closes of 500 examined {read} rows"
    );
    conn.query_drop("ROLLBACK").await.unwrap();
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

/// `EXPLAIN` of `sql`: each table's access type and key.
async fn plan_of(
    conn: &mut mysql_async::Conn,
    sql: &str,
    params: mysql_async::Params,
) -> Vec<(Option<String>, Option<String>)> {
    let plan: Vec<mysql_async::Row> = conn.exec(format!("EXPLAIN {sql}"), params).await.unwrap();
    plan.into_iter()
        .map(|r| {
            let column = |name| r.get::<Option<String>, _>(name).flatten();
            (column("type"), column("key"))
        })
        .collect()
}

/// The survey's probe reads the new orders it finds in its own call (a small sale then
/// costs one call until its ack, not two); it reads nothing when not asked, nothing new
/// for a caller that holds entries of its own (a read whose reply was lost left them:
/// they go first), and nothing new while older entries wait to be claimed (those are
/// recovered first, and the new ones read after them).
#[tokio::test]
async fn the_survey_probe_reads_new_orders_in_its_own_call_but_not_past_claimable_ones() {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    ctx.admit(v.id, "s", 3).await;
    let (me, patient) = ("survey-test", Duration::from_secs(60));
    let p = ctx
        .streams
        .probe(v.id, me, patient, false, 100)
        .await
        .unwrap();
    assert_eq!(
        (p.entries.len(), p.undelivered, p.pending),
        (3, 3, 0),
        "read in the probe; its figures are from before the read"
    );
    assert!(p.entries.iter().all(|e| e.deliveries == 1));
    assert_eq!(ctx.pending(v.id).await, 3, "pending for the caller now");

    ctx.admit(v.id, "t", 2).await;
    let p = ctx
        .streams
        .probe(v.id, me, patient, false, 0)
        .await
        .unwrap();
    assert_eq!(
        (p.entries.len(), p.undelivered),
        (0, 2),
        "not asked to read"
    );
    // The caller holds the first three: it is told so, and nothing new is read.
    let p = ctx
        .streams
        .probe(v.id, me, patient, false, 100)
        .await
        .unwrap();
    assert!(p.own_pending);
    assert_eq!((p.entries.len(), p.undelivered), (0, 2));
    // At most what was asked, for a caller holding none.
    let p = ctx
        .streams
        .probe(v.id, "second", patient, false, 1)
        .await
        .unwrap();
    assert!(!p.own_pending);
    assert_eq!(p.entries.len(), 1);
    assert_eq!(ctx.pending(v.id).await, 4);

    // Four entries pending and idle past a zero threshold: claimable. The new one
    // stays unread.
    ctx.admit(v.id, "u", 1).await;
    let p = ctx
        .streams
        .probe(v.id, "another", Duration::ZERO, false, 100)
        .await
        .unwrap();
    assert!(p.claimable);
    assert_eq!((p.entries.len(), p.undelivered), (0, 2));
    assert_eq!(ctx.pending(v.id).await, 4);
    ctx.cleanup().await;
}

/// The probe's "undelivered" and "fully delivered" agree with the stream whether Redis
/// can tell the group's lag or not (an undelivered entry deleted: the lag is unknown,
/// then, once the rest is read, an estimate that can stay above zero): both follow the
/// stream's newest entry once it was delivered, so such a sale retires and shows no lag.
#[tokio::test]
async fn the_probe_tells_what_waits_whether_or_not_redis_knows_the_lag() {
    use redis::AsyncCommands;
    use seckill_shared::keys::{self, VoucherKeys};

    let ctx = DrainCtx::start().await;
    let (me, patient) = ("lag-test", Duration::from_secs(60));
    let lag = |v: VoucherId| {
        let mut conn = ctx.conn();
        async move {
            let groups: redis::streams::StreamInfoGroupsReply =
                conn.xinfo_groups(VoucherKeys::new(v).orders).await.unwrap();
            let g = groups
                .groups
                .into_iter()
                .find(|g| g.name == keys::DRAIN_GROUP);
            g.expect("the drain group").lag
        }
    };
    let figures = |p: &seckill_shared::adapters::order_stream::Probe| {
        (p.undelivered, p.fully_delivered, p.pending, p.entries.len())
    };
    // The survey's probe of `v`, reading up to `read` new entries.
    let streams = &ctx.streams;
    let probe = |v: VoucherId, read: usize| streams.probe(v, me, patient, false, read);

    // Lag known.
    let v = ctx.voucher(10, 10).await;
    ctx.admit(v.id, "k", 2).await;
    let p = probe(v.id, 0).await.unwrap();
    assert_eq!(figures(&p), (2, false, 0, 0));
    assert_eq!(lag(v.id).await, Some(2), "Redis knows the lag here");
    let p = probe(v.id, 100).await.unwrap();
    assert_eq!(figures(&p), (2, false, 0, 2), "read in the same call");
    let p = probe(v.id, 100).await.unwrap();
    assert_eq!(
        figures(&p),
        (0, true, 2, 0),
        "all delivered, nothing more read"
    );

    // Lag unknown: of three orders one is read, and the next (undelivered) deleted.
    let w = ctx.voucher(10, 10).await;
    let ids = ctx.admit(w.id, "u", 3).await;
    assert_eq!(ids.len(), 3);
    let p = probe(w.id, 1).await.unwrap();
    assert_eq!(figures(&p), (3, false, 0, 1));
    let orders = VoucherKeys::new(w.id).orders;
    let all: redis::streams::StreamRangeReply = ctx.conn().xrange_all(&orders).await.unwrap();
    let second = all.ids[1].id.clone();
    let _: i64 = ctx.conn().xdel(&orders, &[&second]).await.unwrap();
    assert_eq!(lag(w.id).await, None, "Redis cannot tell the lag now");
    let p = probe(w.id, 0).await.unwrap();
    assert_eq!(
        (p.undelivered, p.fully_delivered, p.pending),
        (1, false, 1),
        "the newest entry is not delivered: one waits (length 2 less 1 pending)"
    );
    let p = probe(w.id, 100).await.unwrap();
    assert!(
        p.own_pending && p.entries.is_empty(),
        "the caller holds the first"
    );
    let p = streams
        .probe(w.id, "lag-test-2", patient, false, 100)
        .await
        .unwrap();
    assert_eq!(p.entries.len(), 1, "the third order is read");
    assert_eq!(p.entries[0].id, all.ids[2].id);
    let p = probe(w.id, 100).await.unwrap();
    // Redis's lag may stay above zero after a deletion (an estimate): the probe must
    // not follow it, or the sale would never retire, and would be read again and show
    // a lag forever.
    assert_eq!(
        figures(&p),
        (0, true, 2, 0),
        "all delivered, nothing more read"
    );
    // The operators' figures (sale status, reconcile) agree.
    let stats = ctx.streams.stats(w.id).await.unwrap().expect("stats");
    assert_eq!(
        (stats.undelivered, stats.fully_delivered, stats.pending),
        (0, true, 2)
    );
    ctx.cleanup().await;
}

/// The probe's short way (a survey's probe of a stream with nothing pending and fewer
/// entries than it may read: no XINFO, the read tells what waited) gives the figures the
/// full look gives, and leaves the group as the full look would: a stream whose orders
/// were all read and acked gets no consumer of the caller's from a read that found
/// nothing; one that holds more entries than the probe may read, or pending ones, is
/// looked at in full.
#[tokio::test]
async fn the_probes_short_way_agrees_with_the_full_look() {
    use redis::AsyncCommands;
    use seckill_shared::keys::{DRAIN_GROUP, VoucherKeys};

    let ctx = DrainCtx::start().await;
    let (me, patient) = ("short-way", Duration::from_secs(60));
    let streams = &ctx.streams;
    let probe = |v: VoucherId, read: usize| streams.probe(v, me, patient, false, read);
    let figures = |p: &seckill_shared::adapters::order_stream::Probe| {
        (p.undelivered, p.fully_delivered, p.pending, p.entries.len())
    };
    let consumers = |v: VoucherId| {
        let mut conn = ctx.conn();
        async move {
            let reply: redis::streams::StreamInfoConsumersReply = conn
                .xinfo_consumers(VoucherKeys::new(v).orders, DRAIN_GROUP)
                .await
                .unwrap();
            reply
                .consumers
                .into_iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
        }
    };

    // Two new orders: the full look (not asked to read) and the short way agree.
    let v = ctx.voucher(10, 10).await;
    ctx.admit(v.id, "a", 2).await;
    let full = probe(v.id, 0).await.unwrap();
    let short = probe(v.id, 100).await.unwrap();
    assert_eq!(figures(&full), (2, false, 0, 0));
    assert_eq!(figures(&short), (2, false, 0, 2), "read in the same call");
    assert_eq!(
        (
            short.length,
            short.ends_ms,
            short.claimable,
            short.oldest_idle_ms
        ),
        (full.length, full.ends_ms, false, None)
    );
    // Acked: nothing pending, the entries still in the stream (not trimmed yet).
    let ids: Vec<&str> = short.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(streams.ack(v.id, &ids).await.unwrap(), 2);
    let _: i64 = ctx
        .conn()
        .xgroup_delconsumer(VoucherKeys::new(v.id).orders, DRAIN_GROUP, me)
        .await
        .unwrap();
    let p = probe(v.id, 100).await.unwrap();
    assert_eq!(figures(&p), (0, true, 0, 0), "nothing waits");
    assert_eq!(p.length, 2);
    assert!(
        consumers(v.id).await.is_empty(),
        "a read that found nothing left no consumer"
    );
    // A consumer the caller already had stays.
    ctx.admit(v.id, "b", 1).await;
    assert_eq!(figures(&probe(v.id, 100).await.unwrap()), (1, false, 0, 1));
    assert_eq!(consumers(v.id).await, vec![me.to_string()]);

    // More entries than the probe may read: the full look, the lag from Redis.
    let w = ctx.voucher(10, 10).await;
    ctx.admit(w.id, "c", 3).await;
    assert_eq!(figures(&probe(w.id, 3).await.unwrap()), (3, false, 0, 3));
    ctx.admit(w.id, "d", 2).await;
    // Pending entries: the full look (their idle time, whether they can be claimed),
    // and a read for a caller holding none of them.
    let p = streams
        .probe(w.id, "short-way-2", patient, false, 100)
        .await
        .unwrap();
    assert_eq!(figures(&p), (2, false, 3, 2));
    assert!(p.oldest_idle_ms.is_some() && !p.claimable && !p.own_pending);

    // An undelivered entry deleted with nothing pending: the read counts what waits
    // exactly, where Redis cannot tell the lag.
    let x = ctx.voucher(10, 10).await;
    ctx.admit(x.id, "e", 3).await;
    let orders = VoucherKeys::new(x.id).orders;
    let all: redis::streams::StreamRangeReply = ctx.conn().xrange_all(&orders).await.unwrap();
    let _: i64 = ctx.conn().xdel(&orders, &[&all.ids[0].id]).await.unwrap();
    assert_eq!(figures(&probe(x.id, 100).await.unwrap()), (2, false, 0, 2));
    assert_eq!(figures(&probe(x.id, 100).await.unwrap()), (0, true, 2, 0));

    // No stream, no group yet: the full look makes them.
    let y = ctx.voucher(10, 10).await;
    let _: i64 = ctx.conn().del(VoucherKeys::new(y.id).orders).await.unwrap();
    assert_eq!(figures(&probe(y.id, 100).await.unwrap()), (0, true, 0, 0));
    assert!(consumers(y.id).await.is_empty());
    ctx.admit(y.id, "f", 1).await;
    assert_eq!(figures(&probe(y.id, 100).await.unwrap()), (1, false, 0, 1));
    ctx.cleanup().await;
}

/// The deadlines, closed and to-settle keys must exist whenever a script may name them
/// (a slot migrating refuses a script naming a key its source lacks). Preloading makes
/// them and says so in the sale hash; a sale preloaded before that (no mark) gets them
/// from the drainer's first probe, which marks it, so later probes write nothing.
#[tokio::test]
async fn a_sale_preloaded_without_its_sentinels_gets_them_from_one_probe() {
    use redis::AsyncCommands;
    use seckill_shared::keys::VoucherKeys;
    use seckill_shared::protocol::sale_fields::SENTINELS;

    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(10, 10).await;
    let k = VoucherKeys::new(v.id);
    let sentinel_keys = [&k.deadlines, &k.closed, &k.to_settle];
    let existing = || {
        let mut conn = ctx.conn();
        let keys = sentinel_keys.map(|k| k.to_string());
        async move { conn.exists::<_, usize>(&keys).await.unwrap() }
    };
    let marked = || {
        let mut conn = ctx.conn();
        let sale = k.sale.clone();
        async move { conn.hexists::<_, _, bool>(&sale, SENTINELS).await.unwrap() }
    };
    assert_eq!((existing().await, marked().await), (3, true), "preloaded");

    // As preloaded before the mark: the keys and the mark missing.
    let _: i64 = ctx.conn().del(&sentinel_keys).await.unwrap();
    let _: i64 = ctx.conn().hdel(&k.sale, SENTINELS).await.unwrap();
    let probe = || {
        ctx.streams
            .probe(v.id, "sentinels", Duration::from_secs(60), false, 100)
    };
    probe().await.unwrap();
    assert_eq!((existing().await, marked().await), (3, true), "made once");

    // Marked: the probe leaves the keys alone (one deleted stays deleted).
    let _: i64 = ctx.conn().del(&k.closed).await.unwrap();
    probe().await.unwrap();
    assert_eq!(existing().await, 2);
    ctx.cleanup().await;
}

/// With many small sales, a group is written as soon as the survey's probes have read
/// enough sales to fill it, not after the last probe; a hot sale its probe read drains
/// at once, batch after batch; a voucher whose pending entries can be claimed is not
/// written early: it is recovered first, and its new orders go to the first round after
/// that. Every order once, every stock taken once, nothing left pending.
#[tokio::test]
async fn groups_are_written_while_the_survey_still_probes_but_claimable_sales_wait() {
    let ctx = DrainCtx::start().await;
    // 120 sales of two orders: with batches of 20, a group is ten sales.
    let (vouchers, small_ids) = small_sales(&ctx, 1, 120).await;
    let hot = ctx.voucher(100, 100).await;
    let hot_ids = ctx.admit(hot.id, "hot", 50).await;
    // Three orders read by a consumer that died (pending, idle), then two new ones.
    let stuck = ctx.voucher(10, 10).await;
    ctx.admit(stuck.id, "old", 3).await;
    let p = ctx
        .streams
        .probe(
            stuck.id,
            "a-dead-drainer",
            Duration::from_secs(60),
            false,
            100,
        )
        .await
        .unwrap();
    assert_eq!(p.entries.len(), 3);
    ctx.admit(stuck.id, "new", 2).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 20;
    cfg.min_idle = Duration::from_millis(10);
    let s = ctx.drain(cfg).await;
    println!("{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    assert_eq!(s.claimed, 3, "{s:?}");
    assert_eq!(s.inserted, 240 + 50 + 5, "{s:?}");
    // Eleven groups of ten sales filled while the probes went on (the ten sales read
    // last wait for the first round, with nothing after them to fill their group), and
    // the hot sale's 50; not the claimable sale's.
    assert_eq!(s.during_survey, 220 + 50, "{s:?}");
    assert!(s.grouped >= 220, "{s:?}");

    assert_each_sale_drained_once(&ctx, &vouchers, "small").await;
    let rows = rows_by_voucher(&ctx).await;
    assert_eq!(rows.get(&hot.id.get()).copied(), Some((50, 0)));
    assert_eq!(ctx.db_stock_left(hot.id).await, 50);
    assert_eq!(rows.get(&stuck.id.get()).copied(), Some((5, 0)));
    assert_eq!(ctx.db_stock_left(stuck.id).await, 5);
    for v in [hot.id, stuck.id] {
        assert_eq!(ctx.pending(v).await, 0, "{v}");
    }
    assert_eq!(small_ids.len() + hot_ids.len(), 290);
    ctx.cleanup().await;
}

/// A drainer killed inside a group it started while its survey still probed (groups of
/// five sales fill during the survey here), before or after the commit, twice in a row
/// (the first recovery run is killed at the same point too): the next run rolls the
/// open transactions back or acks the committed orders as duplicates; every order
/// exactly once, every stock taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drainer_killed_in_a_group_written_during_its_survey_loses_and_doubles_nothing() {
    for failpoint in ["after_lock", "after_commit"] {
        let ctx = DrainCtx::start().await;
        let (vouchers, ids) = small_sales(&ctx, 1, 40).await;
        let mut cfg = ctx.drainer_config();
        cfg.batch_size = 10;
        cfg.min_idle = Duration::from_secs(1);
        cfg.max_run = Duration::from_secs(10);
        kill_at(&ctx, &cfg, failpoint, 2).await;

        let mut recovery = cfg.clone();
        recovery.max_run = Duration::from_secs(5);
        let mut inserted = 0;
        for _ in 0..3 {
            let (ok, s) = DrainerProcess::spawn(&ctx.drainer_env(&recovery), None)
                .finish(Duration::from_secs(60));
            println!("{failpoint}: recovery {s:?}");
            assert!(ok && s.errors == 0, "{failpoint}: {s:?}");
            inserted += s.inserted;
        }
        assert_each_sale_drained_once(&ctx, &vouchers, failpoint).await;
        if failpoint == "after_lock" {
            assert_eq!(inserted, 80, "nothing committed before the recovery runs");
        }
        assert_eq!(ids.len(), 80);
        ctx.cleanup().await;
    }
}

/// A survey's probes travel as a pipeline where one node serves every slot (and, on a
/// cluster of several, each alone): when the nodes have forgotten the probe script (a
/// restart, a failover to a replica that never ran it), each probe meets NOSCRIPT in
/// its pipeline and is sent again alone, which loads it. The run drains every sale
/// whole, without an error, and the acks of its groups (pipelined too) follow.
#[tokio::test]
async fn probes_sent_as_a_pipeline_load_the_script_the_nodes_forgot() {
    let ctx = DrainCtx::start().await;
    let (vouchers, _) = small_sales(&ctx, 1, 30).await;
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 20;
    let drainer = order_drainer::Drainer::connect(cfg)
        .await
        .expect("drainer connects");
    // Loaded by a probe of an empty sale, then forgotten everywhere.
    let empty = ctx.voucher(10, 10).await;
    ctx.streams
        .probe(empty.id, "warm", Duration::from_secs(60), false, 0)
        .await
        .expect("a probe alone loads the script");
    for node in ctx.redis.nodes() {
        let _: () = ctx
            .redis
            .query(node.port, redis::cmd("SCRIPT").arg("FLUSH"))
            .expect("SCRIPT FLUSH");
    }
    let (s, ok) = order_drainer::run_once(&drainer).await;
    println!("{s:?}");
    assert!(ok && s.errors == 0, "{s:?}");
    assert_eq!(s.inserted, 60, "{s:?}");
    assert_each_sale_drained_once(&ctx, &vouchers, "after SCRIPT FLUSH").await;
    ctx.cleanup().await;
}

/// The drainer's lookup of which orders of a backlog of closes have a row
/// (`sql::ORDER_ROWS`, asked when more closes wait than a transaction records) reads one
/// row per id through the primary key, whatever the statistics say, on a table written
/// just now and never analysed: 30,000 orders of one sale beside 100 of another, the
/// largest statement's 10,000 ids (half with a row of the sale, the others none, or the
/// other sale's), examining about one row per id (`Handler_read_*`), `eq_ref` on the key.
#[tokio::test]
async fn the_lookup_of_the_rows_of_closes_reads_one_row_per_id_on_a_table_never_analysed() {
    use seckill_shared::adapters::data_api::param;
    use seckill_shared::adapters::ledger::sql;

    let ctx = DrainCtx::start().await;
    ctx.many_vouchers(1, 2, 100_000).await;
    let mut conn = ctx.mysql().await;
    conn.query_drop(
        "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at, pay_by) \
         SELECT seq, IF(seq > 30000, 2, 1), CONCAT('buyer-', seq), \
         IF(seq % 3 = 0, 'awaiting_payment', 'cancelled'), NOW(3), NOW(3) \
         FROM seq_1_to_30100",
    )
    .await
    .unwrap();
    let overhead = {
        let a = handler_reads(&mut conn).await;
        handler_reads(&mut conn).await - a
    };
    // Every sixth order of sale 1 (5,000), ids no order has (4,950), sale 2's 50.
    let ids: Vec<i64> = (1..=5_000)
        .map(|i| 6 * i)
        .chain((1..=4_950).map(|i| 100_000 + i))
        .chain(30_001..=30_050)
        .collect();
    assert_eq!(ids.len(), sql::IDS_PER_ROW_LOOKUP);
    let params = named(vec![
        param::string("ids", &serde_json::to_string(&ids).unwrap()),
        param::long("v", 1),
    ]);
    let plan = plan_of(&mut conn, sql::ORDER_ROWS, params.clone()).await;
    assert_eq!(
        plan,
        vec![
            (Some("ALL".into()), None),
            (Some("eq_ref".into()), Some("PRIMARY".into()))
        ],
        "the ids read in order, each row found through the key"
    );
    let before = handler_reads(&mut conn).await;
    let rows: Vec<(i64, i64)> = conn.exec(sql::ORDER_ROWS, params).await.unwrap();
    let examined = handler_reads(&mut conn).await - before - overhead;
    assert_eq!(rows.len(), 5_000, "only sale 1's rows");
    // Every sixth order is a multiple of three: all of them await payment.
    assert!(
        rows.iter()
            .all(|(id, awaiting)| id % 6 == 0 && *awaiting == 1)
    );
    assert!(
        examined <= 2 * ids.len() as u64 + 10,
        "10,000 ids examined {examined} rows"
    );
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

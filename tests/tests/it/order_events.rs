//! Order events end to end: a sale's transitions, written by the database's triggers in
//! each transition's own transaction (migrations/0013_order_events.sql), published by
//! the drainer to EventBridge (the stack's moto, a bus of the test's own with a rule to
//! an SQS queue), read from that queue as a consumer would, and checked against
//! schemas/order-events.schema.json.
//!
//! What is proved: every order's every transition (confirmed, awaiting payment, paid,
//! cancelled, expired, rejected, a refund due) reaches the consumer once by id, in order
//! per order; and through a drainer killed after its commit and before it published, one
//! killed before its commit, `PutEvents` refusing one entry in ten, and the endpoint down
//! for longer than two drain runs, every event arrives, none twice by id, none for a
//! transition that rolled back.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use seckill_http::App;
use seckill_shared::domain::{
    NewVoucher, PaymentTerms, Price, SaleWindow, Voucher, VoucherId, now_millis,
};
use seckill_tests::drainer::{DrainCtx, DrainerProcess};
use seckill_tests::events::{Fault, FaultProxy, LocalBus, by_order, schema};
use seckill_tests::harness::{
    TEST_CURRENCY, TEST_PRICE_MINOR, call, provider_pays, request, test_http_config, token,
};
use serde_json::Value;

/// A voucher on sale now for an hour; with a payment window of `pay_s` when given.
async fn voucher(ctx: &DrainCtx, stock: i64, pay_s: Option<i64>) -> Voucher {
    let now = now_millis();
    let new = NewVoucher {
        title: "events".into(),
        stock,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment: pay_s.map(|s| PaymentTerms {
            pay_within_ms: s * 1_000,
            rebuy_after_close: false,
            rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
            price: Some(Price::new(TEST_PRICE_MINOR, TEST_CURRENCY).unwrap()),
        }),
        buckets: 1,
        room: None,
    };
    ctx.voucher_of(&new).await
}

async fn buy(app: &App, v: VoucherId, user: &str) -> String {
    let (status, body) = call(
        app,
        request(
            "POST",
            &format!("/vouchers/{v}/seckill"),
            Some(&token(user, false)),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(status, 202, "{user}: {body}");
    body["order_id"].as_str().unwrap().to_string()
}

/// The database's orders of `v`: id -> status.
async fn rows(ctx: &DrainCtx, v: VoucherId) -> HashMap<String, String> {
    let mut my = ctx.mysql().await;
    let rows: Vec<(u64, String)> = my
        .exec(
            "SELECT id, status FROM orders WHERE voucher_id = ?",
            (v.get(),),
        )
        .await
        .unwrap();
    my.disconnect().await.ok();
    rows.into_iter()
        .map(|(id, s)| (id.to_string(), s))
        .collect()
}

/// Events still owed (the outbox's depth).
async fn owed(ctx: &DrainCtx) -> u64 {
    ctx.db().await.outbox_depth().await.unwrap().0
}

/// Every event valid, none twice by id, each order's in sequence order.
fn check_stream(all: &[Value]) {
    let validator = schema();
    let mut ids = HashSet::new();
    for e in all {
        let errors: Vec<String> = validator.iter_errors(e).map(|x| x.to_string()).collect();
        assert!(errors.is_empty(), "{e}: {errors:?}");
        let id = e["detail"]["event_id"].as_str().unwrap().to_string();
        assert!(ids.insert(id.clone()), "{id} arrived twice");
    }
    for (order, events) in by_order(all) {
        let seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
        let mut sorted = seqs.clone();
        sorted.sort();
        assert_eq!(
            seqs, sorted,
            "order {order}'s events out of order: {events:?}"
        );
    }
}

/// One of each: a sale without a payment step (confirmed), one with (paid, cancelled,
/// expired) and one whose database stock is gone (rejected, and the payment of a
/// rejected order due back). Each order's transitions arrive once, in order.
#[tokio::test]
async fn every_transition_of_a_sale_reaches_the_consumer_once_in_order() {
    let ctx = DrainCtx::start().await;
    let bus = LocalBus::create(&format!("seckill-{}", ctx.database)).await;
    let app = App::new(&test_http_config(ctx.redis.config(), ctx.data_api_config())).await;
    let mut cfg = ctx.drainer_config();
    cfg.events = Some(bus.config(&bus.endpoint));

    let plain = voucher(&ctx, 5, None).await;
    let paying = voucher(&ctx, 5, Some(3)).await;
    let gone = voucher(&ctx, 5, Some(600)).await;
    let mut my = ctx.mysql().await;
    my.exec_drop(
        "UPDATE vouchers SET stock_left = 0 WHERE id = ?",
        (gone.id.get(),),
    )
    .await
    .unwrap();
    my.disconnect().await.ok();

    let confirmed = buy(&app, plain.id, "c1").await;
    let paid = buy(&app, paying.id, "p1").await;
    let cancelled = buy(&app, paying.id, "p2").await;
    let expired = buy(&app, paying.id, "p3").await;
    let rejected = buy(&app, gone.id, "r1").await;
    // Paid before its drain: written paid, owed its awaiting_payment first.
    let (status, body) = provider_pays(&app, &paid, "p1", "pay-p1").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("paid")),
        "{body}"
    );
    ctx.drain(cfg.clone()).await;
    let (status, body) = call(
        &app,
        request(
            "POST",
            &format!("/orders/{cancelled}/cancel"),
            Some(&token("p2", false)),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Paid after its rejection: a refund is due.
    let (status, body) = provider_pays(&app, &rejected, "r1", "pay-r1").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("refund_due")),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    for _ in 0..6 {
        ctx.drain(cfg.clone()).await;
    }
    assert_eq!(rows(&ctx, paying.id).await[&expired], "expired");
    assert_eq!(owed(&ctx).await, 0, "every event owed was published");

    let expected: Vec<(&str, Vec<&str>)> = vec![
        (&confirmed, vec!["confirmed"]),
        (&paid, vec!["awaiting_payment", "paid"]),
        (&cancelled, vec!["awaiting_payment", "cancelled"]),
        (&expired, vec!["awaiting_payment", "expired"]),
        (&rejected, vec!["rejected", "refund_due"]),
    ];
    let total: usize = expected.iter().map(|(_, s)| s.len()).sum();
    let mut got = Vec::new();
    bus.take_until(&mut got, Duration::from_secs(20), |g| g.len() >= total)
        .await;
    check_stream(&got);
    let orders = by_order(&got);
    for (order, states) in &expected {
        let seen: Vec<&str> = orders
            .get(*order)
            .map(|e| e.iter().map(|(_, s, _)| s.as_str()).collect())
            .unwrap_or_default();
        assert_eq!(&seen, states, "order {order}");
    }
    assert_eq!(got.len(), total, "nothing else arrived");
    let refund = got
        .iter()
        .find(|e| e["detail-type"] == "RefundDue")
        .expect("the refund's event");
    assert_eq!(refund["detail"]["amount_minor"], TEST_PRICE_MINOR);
    assert_eq!(refund["detail"]["payment_id"], "pay-r1");
    let paid_event = got
        .iter()
        .find(|e| e["detail-type"] == "OrderPaid")
        .unwrap();
    assert_eq!(
        paid_event["detail"]["amount_minor"], TEST_PRICE_MINOR,
        "the voucher's price"
    );

    // The publisher's reads, on tables never analysed: the outbox by its primary key,
    // each voucher by its own.
    use seckill_shared::adapters::events::{OUTBOX_DEPTH_SQL, OUTBOX_PAGE_SQL};
    let mut my = ctx.mysql().await;
    for sql in [
        OUTBOX_PAGE_SQL.replace(":n", "200"),
        OUTBOX_DEPTH_SQL.to_string(),
    ] {
        let plan: Vec<mysql_async::Row> = my.query(format!("EXPLAIN {sql}")).await.unwrap();
        for row in plan {
            let table: Option<String> = row.get::<Option<String>, _>("table").flatten();
            let key: Option<String> = row.get::<Option<String>, _>("key").flatten();
            if matches!(table.as_deref(), Some("e" | "order_events" | "v" | "o")) {
                assert_eq!(key.as_deref(), Some("PRIMARY"), "{sql}: {table:?}");
            }
        }
    }
    my.disconnect().await.ok();
    ctx.cleanup().await;
}

/// Orders of a voucher without a payment step (one event each), through every fault at
/// once in turn: a drainer killed after its commit (EventBridge down, so nothing went
/// out) and one killed before its commit, then `PutEvents` refusing one entry in ten,
/// then the endpoint down for two whole runs. At the end every order in the database has
/// its one event at the consumer, none twice, and nothing else arrived.
// Several threads: the child drainer calls this process's Data API server while the
// test waits for its failpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_once_through_crashes_refused_entries_and_an_outage() {
    let ctx = DrainCtx::start().await;
    let bus = LocalBus::create(&format!("seckill-{}", ctx.database)).await;
    let proxy = FaultProxy::start(&bus.endpoint).await;
    let mut cfg = ctx.drainer_config();
    cfg.events = Some(bus.config(&proxy.url));
    let v = voucher(&ctx, 400, None).await;
    // Fewer units in the database than in Redis: the last orders are rejected.
    let mut my = ctx.mysql().await;
    my.exec_drop(
        "UPDATE vouchers SET stock_left = 330 WHERE id = ?",
        (v.id.get(),),
    )
    .await
    .unwrap();
    my.disconnect().await.ok();
    let mut got = Vec::new();

    // Killed after its commit, EventBridge down: the events wait in the outbox.
    ctx.admit(v.id, "crash", 60).await;
    proxy.set(Fault::Down);
    let mut child = DrainerProcess::spawn(&ctx.drainer_env(&cfg), Some("after_commit"));
    child.wait_for_failpoint("after_commit", Duration::from_secs(60));
    child.kill();
    let committed = rows(&ctx, v.id).await.len();
    assert!(committed > 0, "a batch committed before the kill");
    assert_eq!(
        owed(&ctx).await as usize,
        committed,
        "its events are owed, none published"
    );
    // Killed before its commit: its transaction rolls back, and with it its events.
    ctx.admit(v.id, "rolled", 40).await;
    let mut child = DrainerProcess::spawn(&ctx.drainer_env(&cfg), Some("after_insert"));
    child.wait_for_failpoint("after_insert", Duration::from_secs(60));
    child.kill();

    // One entry in ten refused: retried until taken.
    proxy.set(Fault::OneInTen);
    ctx.admit(v.id, "some", 150).await;
    for _ in 0..8 {
        ctx.drain(cfg.clone()).await;
        if owed(&ctx).await == 0 && rows(&ctx, v.id).await.len() == 250 {
            break;
        }
    }
    assert!(
        proxy.refused.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the proxy refused entries"
    );
    bus.take_until(&mut got, Duration::from_secs(20), |g| g.len() >= 250)
        .await;

    // Down for two whole runs: nothing goes out, nothing is lost.
    proxy.set(Fault::Down);
    ctx.admit(v.id, "late", 150).await;
    for _ in 0..2 {
        let s = ctx.drain(cfg.clone()).await;
        assert_eq!(
            s.errors, 0,
            "an outage of EventBridge is no drain error: {s:?}"
        );
        assert!(s.events.as_ref().is_some_and(|e| e.published == 0), "{s:?}");
    }
    assert_eq!(rows(&ctx, v.id).await.len(), 400);
    assert!(owed(&ctx).await > 0);
    proxy.set(Fault::None);
    for _ in 0..4 {
        ctx.drain(cfg.clone()).await;
        if owed(&ctx).await == 0 {
            break;
        }
    }
    assert_eq!(owed(&ctx).await, 0);

    let db = rows(&ctx, v.id).await;
    bus.take_until(&mut got, Duration::from_secs(30), |g| g.len() >= db.len())
        .await;
    check_stream(&got);
    let orders = by_order(&got);
    for (order, status) in &db {
        let states: Vec<&str> = orders
            .get(order)
            .map(|e| e.iter().map(|(_, s, _)| s.as_str()).collect())
            .unwrap_or_default();
        assert_eq!(states, [status.as_str()], "order {order}");
    }
    assert_eq!(
        got.len(),
        db.len(),
        "no event for a transition that did not commit"
    );
    assert!(db.values().any(|s| s == "rejected") && db.values().any(|s| s == "confirmed"));
    ctx.cleanup().await;
}

/// The schema and the code name the same events both ways: every state the code
/// publishes has its `detail-type` in the schema with that state, every event the schema
/// describes is one the code can send, and what the code would never send (a field too
/// many, a paid order without its amount, a missing id) the schema refuses.
#[test]
fn the_schema_and_the_code_name_the_same_events() {
    use seckill_shared::adapters::events::{OutboxRow, detail_type};
    let text = include_str!("../../../schemas/order-events.schema.json");
    let doc: Value = serde_json::from_str(text).unwrap();
    let defs = doc["$defs"].as_object().unwrap();
    let states = [
        "confirmed",
        "awaiting_payment",
        "paid",
        "cancelled",
        "expired",
        "rejected",
        "refund_due",
        "refused",
        "refund_requested",
        "refunded",
    ];
    let mut named: HashMap<&str, HashSet<&str>> = HashMap::new();
    for state in states {
        named
            .entry(detail_type(state).unwrap())
            .or_default()
            .insert(state);
    }
    let in_schema: HashSet<&str> = defs.keys().map(String::as_str).collect();
    assert_eq!(in_schema, named.keys().copied().collect(), "detail-types");
    for (kind, want) in &named {
        let state = &defs[*kind]["properties"]["detail"]["properties"]["state"];
        let listed: HashSet<&str> = match state.get("const") {
            Some(c) => [c.as_str().unwrap()].into(),
            None => state["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect(),
        };
        assert_eq!(&listed, want, "{kind}");
    }
    // Events as the code writes them, in the envelope a consumer gets: valid.
    let validator = schema();
    let envelope = |row: &OutboxRow| {
        serde_json::json!({
            "version": "0", "id": "x", "detail-type": detail_type(&row.state).unwrap(),
            "source": seckill_shared::adapters::events::SOURCE, "account": "123456789012",
            "time": "2026-12-03T00:00:00Z", "region": "us-east-1", "resources": [],
            "detail": row.detail(),
        })
    };
    for state in states {
        let refund = state.starts_with("refund") || state == "refused";
        let row = OutboxRow {
            id: 7,
            event_id: format!("9:{state}"),
            order_id: 9,
            voucher_id: 3,
            user_id: "buyer".into(),
            state: state.into(),
            reason: refund.then(|| "cancelled first".to_string()),
            amount_minor: Some(199),
            currency: Some("EUR".into()),
            payment_id: refund.then(|| "pi_1".to_string()),
            occurred_at: 1_800_000_000_000,
        };
        let e = envelope(&row);
        assert!(validator.is_valid(&e), "{state}: {e}");
        // What the code never sends, the schema refuses.
        let mut extra = e.clone();
        extra["detail"]["surprise"] = serde_json::json!(1);
        assert!(!validator.is_valid(&extra), "{state}: a field too many");
        let mut no_id = e.clone();
        no_id["detail"].as_object_mut().unwrap().remove("event_id");
        assert!(!validator.is_valid(&no_id), "{state}: no event_id");
        if state == "paid" {
            let mut no_money = e.clone();
            no_money["detail"]
                .as_object_mut()
                .unwrap()
                .remove("amount_minor");
            assert!(
                !validator.is_valid(&no_money),
                "a payment without its amount"
            );
        }
    }
}

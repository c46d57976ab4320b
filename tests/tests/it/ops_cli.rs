//! The operator commands (`seckill status`, `dead-letters`, `reconcile`) through their
//! library functions, against a private Redis, a fresh database and the real drainer.

use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use seckill_cli::ops::Backends;
use seckill_cli::ops::dead_letters::{self, Replay};
use seckill_cli::ops::reconcile::{self, class};
use seckill_cli::ops::status;
use seckill_shared::domain::VoucherId;
use seckill_shared::keys::VoucherKeys;
use seckill_tests::drainer::DrainCtx;

async fn backends(ctx: &DrainCtx) -> Backends {
    Backends::connect(&ctx.redis.config(), &ctx.data_api_config())
        .await
        .expect("backends")
}

async fn sql(ctx: &DrainCtx, statement: &str) {
    let mut conn = ctx.mysql().await;
    conn.query_drop(statement).await.expect(statement);
    conn.disconnect().await.ok();
}

#[tokio::test]
async fn status_numbers_match_the_database_after_a_sale() {
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    // The database holds 25 units of the 50 Redis sells: 5 of 30 orders end rejected.
    let v = ctx.voucher(50, 25).await;
    ctx.admit(v.id, "buyer", 30).await;

    let before = status::voucher_status(&b, v.id).await.unwrap();
    assert_eq!((before.admitted, before.confirmed, before.lag), (30, 0, 30));
    assert_eq!(before.stock_left_redis, Some(20));
    assert!(!before.drained && before.oldest_unfinished_ms.is_some());

    ctx.drain(ctx.drainer_config()).await;
    let all = status::status(&b, &[]).await.unwrap();
    assert_eq!(all.len(), 1, "every active voucher: {all:?}");
    let s = &all[0];
    let rows = ctx.orders_in_db(v.id).await;
    let confirmed = rows.values().filter(|(s, _)| s == "confirmed").count() as u64;
    let rejected = rows.values().filter(|(s, _)| s == "rejected").count() as u64;
    assert_eq!(s.voucher, v.id.get());
    assert_eq!(
        (s.admitted, s.confirmed, s.rejected),
        (30, confirmed, rejected)
    );
    assert_eq!((confirmed, rejected), (25, 5));
    assert_eq!(s.stock_left_db, Some(ctx.db_stock_left(v.id).await));
    assert_eq!(s.stock_left_redis, Some(20));
    assert_eq!((s.pending, s.lag, s.dead_letters), (0, 0, 0));
    assert!(s.drained && s.active && s.oldest_unfinished_ms.is_none());
    assert_eq!(s.phase, "open");
    let text = status::render(&all);
    assert!(
        text.contains("admitted 30, confirmed 25, rejected 5"),
        "{text}"
    );
    let json = serde_json::to_value(&all).unwrap();
    assert_eq!(json[0]["confirmed"], 25);

    let missing = status::voucher_status(&b, VoucherId::new(999_999).unwrap()).await;
    let err = format!("{:#}", missing.unwrap_err());
    assert!(err.contains("voucher 999999 does not exist"), "{err}");
    ctx.cleanup().await;
}

/// `status --watch` keeps refreshing while the sale still has orders to settle and
/// returns by itself once it is sold out and drained.
#[tokio::test]
async fn watch_returns_once_the_sale_is_sold_out_and_drained() {
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    let v = ctx.voucher(20, 20).await;
    ctx.admit(v.id, "watched", 20).await; // sold out in Redis, nothing in the database
    let every = std::time::Duration::from_millis(50);
    let watching = {
        let b = backends(&ctx).await;
        tokio::spawn(async move { status::watch(&b, &[v.id], every).await })
    };
    // Many refreshes later it is still watching: 20 orders wait for the drainer.
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    assert!(
        !watching.is_finished(),
        "watch returned before the orders were drained"
    );
    ctx.drain(ctx.drainer_config()).await;
    let s = status::voucher_status(&b, v.id).await.unwrap();
    assert_eq!((s.confirmed, s.lag, s.stock_left_redis), (20, 0, Some(0)));
    tokio::time::timeout(std::time::Duration::from_secs(10), watching)
        .await
        .expect("watch returns once the sale is drained")
        .unwrap()
        .expect("watch succeeds");

    // A voucher that does not exist is an error, not an endless watch.
    let missing = VoucherId::new(999_998).unwrap();
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        status::watch(&b, &[missing], every),
    )
    .await
    .expect("watch of a missing voucher returns")
    .unwrap_err();
    assert!(format!("{err:#}").contains("does not exist"), "{err:#}");
    ctx.cleanup().await;
}

#[tokio::test]
async fn unreachable_backends_and_wrong_credentials_are_named() {
    let ctx = DrainCtx::start().await;
    let mut redis = ctx.redis.config();
    redis.url = format!("redis://127.0.0.1:{}", seckill_tests::redis::free_port());
    let err = Backends::connect(&redis, &ctx.data_api_config())
        .await
        .err()
        .unwrap();
    assert!(format!("{err:#}").contains("Redis"), "{err:#}");
    let mut data = ctx.data_api_config();
    data.database = "no_such_database_here".into();
    let err = Backends::connect(&ctx.redis.config(), &data)
        .await
        .err()
        .unwrap();
    assert!(
        format!("{err:#}").contains("database no_such_database_here"),
        "{err:#}"
    );

    // Wrong credentials: a Redis password the server does not take, a secret the Data
    // API does not know. Each error names the backend and what to check, and never
    // prints the password.
    let mut redis = ctx.redis.config();
    redis.url = redis.url.replacen("redis://", "redis://nobody:wrong@", 1);
    let err = Backends::connect(&redis, &ctx.data_api_config())
        .await
        .err()
        .unwrap();
    let text = format!("{err:#}");
    assert!(text.contains("cannot reach Redis"), "{text}");
    assert!(
        text.contains("AuthenticationFailed") && !text.contains("wrong"),
        "{text}"
    );
    let mut data = ctx.data_api_config();
    data.secret_arn = format!("{}-not-this-one", data.secret_arn);
    let err = Backends::connect(&ctx.redis.config(), &data)
        .await
        .err()
        .unwrap();
    let text = format!("{err:#}");
    assert!(text.contains("refused the connection"), "{text}");
    assert!(text.contains("DB_SECRET_ARN"), "{text}");
    ctx.cleanup().await;
}

/// A dead letter replayed after its cause is fixed is committed once, with its own
/// order id and buyer, also when two replays race and when the first replay fails again.
#[tokio::test]
async fn a_replayed_dead_letter_is_committed_exactly_once() {
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    let v = ctx.voucher(100, 100).await;
    sql(
        &ctx,
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON orders FOR EACH ROW \
         IF NEW.user_id LIKE 'poison%' THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by a test trigger'; END IF",
    )
    .await;
    ctx.admit(v.id, "a", 5).await;
    let poison = ctx.admit(v.id, "poison", 1).await[0];
    ctx.xadd_raw(v.id, &[("order_id", "x")]).await;
    ctx.drain(ctx.drainer_config()).await;

    let listed = dead_letters::list(&b, v.id).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let refused = listed
        .iter()
        .find(|d| d.reason.starts_with("refused: "))
        .unwrap();
    assert_eq!(
        refused.order_id.as_deref(),
        Some(poison.to_string().as_str())
    );
    assert_eq!(refused.user_id.as_deref(), Some("poison-0"));
    assert_eq!(refused.not_replayable, None);
    let bad = listed
        .iter()
        .find(|d| d.reason.starts_with("bad_fields"))
        .unwrap();
    assert!(
        bad.not_replayable
            .as_deref()
            .unwrap()
            .contains("would fail again")
    );

    // Not fixed yet: the replayed entry fails again and comes back with the same order.
    let done = dead_letters::replay(&b, v.id, std::slice::from_ref(&refused.id))
        .await
        .unwrap();
    assert!(matches!(done[..], [Replay::Replayed { .. }]), "{done:?}");
    ctx.drain(ctx.drainer_config()).await;
    let again = dead_letters::list(&b, v.id).await.unwrap();
    let back = again
        .iter()
        .find(|d| d.reason.starts_with("refused: "))
        .unwrap();
    assert_ne!(back.id, refused.id);
    assert_eq!(back.order_id, refused.order_id);
    // Its admission time survives the replay: the admitted entry held it in its id, and
    // the replayed entry (a new id) carries it as a field.
    assert!(refused.admitted_ms.is_some());
    assert_eq!(back.admitted_ms, refused.admitted_ms);

    // Fixed: two replays race, one wins; the bad-fields letter is refused and stays.
    sql(&ctx, "DROP TRIGGER refuse_poison").await;
    let (r1, r2) = tokio::join!(
        dead_letters::replay(&b, v.id, &[]),
        dead_letters::replay(&b, v.id, &[])
    );
    let replayed = r1
        .unwrap()
        .into_iter()
        .chain(r2.unwrap())
        .filter(|r| matches!(r, Replay::Replayed { .. }))
        .count();
    assert_eq!(replayed, 1);
    // Replaying the same id once more finds nothing.
    let third = dead_letters::replay(&b, v.id, std::slice::from_ref(&back.id))
        .await
        .unwrap();
    assert!(matches!(third[..], [Replay::Missing { .. }]), "{third:?}");
    ctx.drain(ctx.drainer_config()).await;

    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(
        rows.get(&poison.get()).map(|r| r.0.as_str()),
        Some("confirmed")
    );
    assert_eq!(rows.len(), 6);
    assert_eq!(ctx.db_stock_left(v.id).await, 94);
    let left = dead_letters::list(&b, v.id).await.unwrap();
    assert_eq!(left.len(), 1, "only the unparseable one stays: {left:?}");
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

async fn reconcile_twice(ctx: &DrainCtx, b: &Backends, v: VoucherId, expect: &str) {
    let found = reconcile::reconcile(b, v, false).await.unwrap();
    assert!(
        found.class(expect).is_some(),
        "{expect} not found: {found:#?}"
    );
    assert!(!found.clean_after());
    let fixed = reconcile::reconcile(b, v, true).await.unwrap();
    assert!(fixed.clean_after(), "{fixed:#?}");
    ctx.drain(ctx.drainer_config()).await;
    let after = reconcile::reconcile(b, v, false).await.unwrap();
    assert!(after.discrepancies.is_empty(), "{after:#?}");
}

#[tokio::test]
async fn reconcile_finds_and_repairs_each_seeded_discrepancy() {
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    let v = ctx.voucher(50, 50).await;
    let k = VoucherKeys::new(v.id);
    ctx.admit(v.id, "buyer", 20).await;
    let clean = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert!(clean.discrepancies.is_empty(), "{clean:#?}");

    // A stream entry deleted before it was drained.
    let first = ctx.stream_ids(v.id).await[0].clone();
    let _: i64 = ctx.conn().xdel(&k.orders, &[&first]).await.unwrap();
    reconcile_twice(&ctx, &b, v.id, class::ADMITTED_LOST).await;
    assert_eq!(ctx.orders_in_db(v.id).await.len(), 20);

    // A row deleted from the database (its unit given back, as a restore would).
    let (id, _) = ctx.orders_in_db(v.id).await.into_iter().next().unwrap();
    sql(&ctx, &format!("DELETE FROM orders WHERE id = {id}")).await;
    sql(
        &ctx,
        &format!(
            "UPDATE vouchers SET stock_left = stock_left + 1 WHERE id = {}",
            v.id
        ),
    )
    .await;
    reconcile_twice(&ctx, &b, v.id, class::ADMITTED_LOST).await;
    assert!(ctx.orders_in_db(v.id).await.contains_key(&id));

    // A buyer lost from the buyers hash.
    let _: i64 = ctx.conn().hdel(&k.buyers, "buyer-3").await.unwrap();
    reconcile_twice(&ctx, &b, v.id, class::DB_NOT_IN_REDIS).await;

    // Stock changed by hand: found, not repaired.
    let _: i64 = ctx.conn().hincr(&k.sale, "stock", 5).await.unwrap();
    let r = reconcile::reconcile(&b, v.id, true).await.unwrap();
    assert!(
        r.class(class::REDIS_STOCK).is_some() && !r.clean_after(),
        "{r:#?}"
    );
    let _: i64 = ctx.conn().hincr(&k.sale, "stock", -5).await.unwrap();

    // A corrupt entry: found while undrained, then as a dead letter; never "repaired".
    ctx.xadd_raw(v.id, &[("order_id", "1"), ("voucher_id", "x")])
        .await;
    let r = reconcile::reconcile(&b, v.id, true).await.unwrap();
    assert!(
        r.class(class::UNPARSEABLE).is_some() && !r.clean_after(),
        "{r:#?}"
    );
    ctx.drain(ctx.drainer_config()).await;
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert_eq!(r.discrepancies.len(), 1, "{r:#?}");
    assert_eq!(r.class(class::DEAD_LETTERED).map(|d| d.count), Some(1));
    assert_eq!(ctx.orders_in_db(v.id).await.len(), 20);
    ctx.cleanup().await;
}

/// A voucher that lets a buyer buy again after a close: a buyer who cancelled left the
/// buyers hash on purpose. Reconcile must not take that for a lost buyer, neither while
/// the cancelled order is still undrained in the stream nor when the database still
/// reads it `awaiting_payment` after Redis's `to_settle` no longer lists it (the
/// drainer settled it between reconcile's two reads): `--repair` would restore the
/// buyer and refuse them for good (`already_purchased`).
#[tokio::test]
async fn reconcile_leaves_a_buyer_who_cancelled_free_to_buy_again() {
    use seckill_shared::domain::{NewVoucher, PaymentTerms, Price, SaleWindow, now_millis};
    use seckill_tests::harness::{
        TEST_CURRENCY, TEST_PRICE_MINOR, buy, call, request, test_http_config, token,
    };
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    let now = now_millis();
    // A sale of five with a payment step, with or without rebuy after a close.
    let pay_sale = |rebuy_after_close: bool| NewVoucher {
        title: "rebuy".into(),
        stock: 5,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment: Some(PaymentTerms {
            pay_within_ms: 600_000,
            rebuy_after_close,
            rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
            price: Some(Price::new(TEST_PRICE_MINOR, TEST_CURRENCY).unwrap()),
        }),
        buckets: 1,
        room: None,
    };
    let v = ctx.voucher_of(&pay_sale(true)).await;
    let app =
        seckill_http::App::new(&test_http_config(ctx.redis.config(), ctx.data_api_config())).await;
    let cancel = |order: String, user: &'static str| {
        let app = &app;
        async move {
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
    };
    let order_of = |res: (u16, serde_json::Value)| {
        assert_eq!(res.0, 202, "{}", res.1);
        res.1["order_id"].as_str().unwrap().to_string()
    };
    let k = VoucherKeys::new(v.id);

    // Drained as awaiting payment, then cancelled; its close settled by the drainer
    // right after reconcile read the database (simulated: Redis forgets it is to
    // settle, the row still reads awaiting_payment).
    let late = order_of(buy(&app, v.id, "late").await);
    ctx.drain(ctx.drainer_config()).await;
    cancel(late.clone(), "late").await;
    let _: i64 = ctx.conn().srem(&k.to_settle, &late).await.unwrap();

    // Cancelled before the drainer saw it: undrained in the stream, out of the buyers.
    let early = order_of(buy(&app, v.id, "early").await);
    cancel(early, "early").await;
    let r = reconcile::reconcile(&b, v.id, true).await.unwrap();
    for c in [class::STREAM_NOT_IN_BUYERS, class::DB_NOT_IN_REDIS] {
        assert!(r.class(c).is_none(), "{c}: {r:#?}");
    }
    // Without rebuy a close keeps its buyer: one lost with a cancelled order is a
    // discrepancy, and restored.
    let w = ctx.voucher_of(&pay_sale(false)).await;
    let kept = order_of(buy(&app, w.id, "kept").await);
    cancel(kept.clone(), "kept").await;
    let _: i64 = ctx
        .conn()
        .hdel(VoucherKeys::new(w.id).buyers, "kept")
        .await
        .unwrap();
    let r = reconcile::reconcile(&b, w.id, true).await.unwrap();
    assert!(r.class(class::STREAM_NOT_IN_BUYERS).is_some(), "{r:#?}");
    let held: Option<String> = ctx
        .conn()
        .hget(VoucherKeys::new(w.id).buyers, "kept")
        .await
        .unwrap();
    assert_eq!(held, Some(kept), "restored with the order they cancelled");
    for user in ["early", "late"] {
        let held: Option<String> = ctx.conn().hget(&k.buyers, user).await.unwrap();
        assert_eq!(held, None, "{user} not restored");
        let (status, body) = buy(&app, v.id, user).await;
        assert_eq!(status, 202, "{user} buys again: {body}");
    }
    ctx.cleanup().await;
}

/// A sale of `stock` with a payment step (ten minutes to pay, the test price), in the
/// database and preloaded.
async fn payment_sale(ctx: &DrainCtx, stock: i64) -> seckill_shared::domain::Voucher {
    use seckill_shared::domain::{NewVoucher, PaymentTerms, Price, SaleWindow, now_millis};
    use seckill_tests::harness::{TEST_CURRENCY, TEST_PRICE_MINOR};
    let now = now_millis();
    ctx.voucher_of(&NewVoucher {
        title: "money".into(),
        stock,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment: Some(PaymentTerms {
            pay_within_ms: 600_000,
            rebuy_after_close: false,
            rebuy_limit: seckill_shared::domain::DEFAULT_REBUY_LIMIT,
            price: Some(Price::new(TEST_PRICE_MINOR, TEST_CURRENCY).unwrap()),
        }),
        buckets: 1,
        room: None,
    })
    .await
}

async fn http_app(ctx: &DrainCtx) -> seckill_http::App {
    use seckill_tests::harness::test_http_config;
    seckill_http::App::new(&test_http_config(ctx.redis.config(), ctx.data_api_config())).await
}

/// `user` buys on `app`: the order id of the `202`.
async fn bought(app: &seckill_http::App, v: VoucherId, user: &str) -> String {
    let (status, body) = seckill_tests::harness::buy(app, v, user).await;
    assert_eq!(status, 202, "{body}");
    body["order_id"].as_str().unwrap().to_string()
}

/// The provider's success for `order` of `user`, paid by `payment`: the outcome it was
/// told.
async fn paid(app: &seckill_http::App, order: &str, user: &str, payment: &str) -> String {
    let (status, body) = seckill_tests::harness::provider_pays(app, order, user, payment).await;
    assert_eq!(status, 200, "{body}");
    body["outcome"].as_str().unwrap().to_string()
}

/// Drainer runs until no close waits in Redis and nothing waits in the stream.
async fn drain_settled(ctx: &DrainCtx, v: VoucherId) {
    for _ in 0..20 {
        let summary = ctx.drain(ctx.drainer_config()).await;
        let waiting = ctx.streams.to_settle(v).await.unwrap().len();
        if waiting == 0 && summary.lag == 0 && summary.pending == 0 {
            return;
        }
    }
    panic!("voucher {v} not settled after 20 drainer runs");
}

/// The payment rows of the voucher: id → outcome.
async fn payment_outcomes(
    ctx: &DrainCtx,
    v: VoucherId,
) -> std::collections::BTreeMap<String, String> {
    let mut conn = ctx.mysql().await;
    let rows: Vec<(String, String)> = conn
        .exec(
            "SELECT payment_id, outcome FROM payments WHERE voucher_id = ?",
            (v.get(),),
        )
        .await
        .unwrap();
    conn.disconnect().await.ok();
    rows.into_iter().collect()
}

/// An order paid before the drainer saw it, then dead-lettered (the database refuses
/// its row): its payment stays `paid` and is listed (reconcile names the dead letter
/// and the replay to do, status counts it), never left with no order and nowhere to be
/// seen. Its dead letter carries the paid close, so once Redis forgot the close (the
/// sale's keys expire after the retention; a failover) a replay still writes the order
/// `paid` by that payment: not open again, not paid twice. While a paid close is on its
/// way (undrained, or replayed and undrained) nothing is listed.
#[tokio::test]
async fn a_dead_lettered_paid_order_keeps_its_payment_listed_and_is_replayed_paid() {
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    let v = payment_sale(&ctx, 5).await;
    let app = http_app(&ctx).await;
    ctx.refuse_users("poison").await;
    let fine = bought(&app, v.id, "fine").await;
    let poison = bought(&app, v.id, "poison-1").await;
    for (order, user, payment) in [
        (&fine, "fine", "pi_fine"),
        (&poison, "poison-1", "pi_poison"),
    ] {
        assert_eq!(paid(&app, order, user, payment).await, "paid");
    }
    // Paid, not yet drained: on its way, nothing unmatched.
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert!(r.unmatched_money.is_empty(), "{}", reconcile::render(&r));

    drain_settled(&ctx, v.id).await;
    let rows = ctx.orders_in_db(v.id).await;
    assert_eq!(rows.len(), 1, "only fine's order is written: {rows:?}");
    let letters = dead_letters::list(&b, v.id).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].reason.starts_with("refused: "), "{letters:?}");
    assert_eq!(letters[0].closed.as_deref(), Some("paid by pi_poison"));
    assert!(
        dead_letters::render_list(v.id, &letters).contains("closed paid by pi_poison"),
        "{}",
        dead_letters::render_list(v.id, &letters)
    );
    assert_eq!(
        payment_outcomes(&ctx, v.id).await["pi_poison"],
        "paid",
        "the money is kept for a replay"
    );

    // Listed: reconcile names the payment, its dead letter and what to do; status counts it.
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    let text = reconcile::render(&r);
    assert_eq!(r.unmatched_money.len(), 1, "{text}");
    let m = &r.unmatched_money[0];
    assert_eq!(
        (
            m.class.as_str(),
            m.payment_id.as_deref(),
            m.order_id.as_str()
        ),
        (
            "paid_payment_without_its_order",
            Some("pi_poison"),
            poison.as_str()
        ),
        "{text}"
    );
    assert!(m.found.contains(&letters[0].id), "{text}");
    assert!(
        m.what_to_do.contains(&format!(
            "seckill dead-letters replay {} --id {}",
            v.id, letters[0].id
        )),
        "{text}"
    );
    assert_eq!(
        (m.amount_minor, m.currency.as_deref()),
        (Some(1_999), Some("EUR"))
    );
    assert!(text.contains("money not matched both ways: 1"), "{text}");
    assert!(!r.clean_after(), "unmatched money is not clean");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["unmatched_money"][0]["payment_id"], "pi_poison");
    let st = status::voucher_status(&b, v.id).await.unwrap();
    assert_eq!(
        (st.unmatched_money, st.paid, st.refunds_due),
        (1, 1, 0),
        "{st:?}"
    );
    let text = status::render(std::slice::from_ref(&st));
    assert!(text.contains("not matched both ways 1"), "{text}");
    assert_eq!(serde_json::to_value(&st).unwrap()["unmatched_money"], 1);

    // Redis forgets the order's close, then the cause is fixed and the dead letter
    // replayed: on its way again (not listed), then written paid by its payment.
    let k = VoucherKeys::new(v.id);
    let _: i64 = ctx.conn().hdel(&k.closed, &poison).await.unwrap();
    sql(&ctx, "DROP TRIGGER refuse_poison").await;
    let done = dead_letters::replay(&b, v.id, &[]).await.unwrap();
    assert!(matches!(done[..], [Replay::Replayed { .. }]), "{done:?}");
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert!(r.unmatched_money.is_empty(), "{}", reconcile::render(&r));
    drain_settled(&ctx, v.id).await;

    let mut conn = ctx.mysql().await;
    let row: Option<(String, Option<String>)> = conn
        .exec_first(
            "SELECT status, pay_ref FROM orders WHERE id = ?",
            (&poison,),
        )
        .await
        .unwrap();
    conn.disconnect().await.ok();
    assert_eq!(
        row,
        Some(("paid".to_string(), Some("pi_poison".to_string()))),
        "the replayed order is paid by the payment that paid it"
    );
    // Paid once: another payment of it is to be refunded, the first stays paid.
    assert_eq!(
        paid(&app, &poison, "poison-1", "pi_poison_again").await,
        "refund_due"
    );
    let outcomes = payment_outcomes(&ctx, v.id).await;
    assert_eq!(
        (outcomes["pi_poison"].as_str(), outcomes["pi_fine"].as_str()),
        ("paid", "paid"),
        "{outcomes:?}"
    );
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert!(r.unmatched_money.is_empty(), "{}", reconcile::render(&r));
    assert_eq!(r.refunds_due.len(), 1, "{}", reconcile::render(&r));
    let st = status::voucher_status(&b, v.id).await.unwrap();
    assert_eq!(
        (st.unmatched_money, st.paid, st.refunds_due),
        (0, 2, 1),
        "{st:?}"
    );
    assert_eq!(ctx.db_stock_left(v.id).await, 3);
    ctx.cleanup().await;
}

/// Money planted out of step, found both ways: a payment `paid` whose order has no row,
/// a payment still `received` twenty minutes after it was recorded (one a minute old is
/// still on its way), an order `paid` whose payment says `failed`, and one paid by a
/// payment never recorded; each listed by reconcile with what to do, counted by status.
/// A paid order that matches its payment, and a paid close still on its way, are not.
#[tokio::test]
async fn reconcile_finds_money_planted_out_of_step_both_ways() {
    use seckill_tests::harness::{TEST_CURRENCY, TEST_PRICE_MINOR};
    let ctx = DrainCtx::start().await;
    let b = backends(&ctx).await;
    let v = payment_sale(&ctx, 10).await;
    let app = http_app(&ctx).await;
    // Two orders paid through the provider and written; a third paid, not yet drained.
    let ann = bought(&app, v.id, "ann").await;
    let bob = bought(&app, v.id, "bob").await;
    drain_settled(&ctx, v.id).await;
    assert_eq!(paid(&app, &ann, "ann", "pi_ann").await, "paid");
    assert_eq!(paid(&app, &bob, "bob", "pi_bob").await, "paid");
    drain_settled(&ctx, v.id).await;
    let cat = bought(&app, v.id, "cat").await;
    assert_eq!(paid(&app, &cat, "cat", "pi_cat").await, "paid");
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert!(r.unmatched_money.is_empty(), "{}", reconcile::render(&r));

    // Planted: money with no order, undecided payments old and new, paid orders whose
    // payment says otherwise.
    let ghost_order = ann.parse::<i64>().unwrap() + 1_000_000;
    let planted = format!(
        "INSERT INTO payments (payment_id, order_id, voucher_id, amount_minor, currency, outcome, \
         event_id, received_at) VALUES \
         ('pi_ghost', {ghost_order}, {v}, {TEST_PRICE_MINOR}, '{TEST_CURRENCY}', 'paid', 'ev_1', UTC_TIMESTAMP(3)), \
         ('pi_stuck', {ghost_order} + 1, {v}, {TEST_PRICE_MINOR}, '{TEST_CURRENCY}', 'received', 'ev_2', \
          UTC_TIMESTAMP(3) - INTERVAL 20 MINUTE), \
         ('pi_fresh', {ghost_order} + 2, {v}, {TEST_PRICE_MINOR}, '{TEST_CURRENCY}', 'received', 'ev_3', \
          UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE)",
        v = v.id
    );
    sql(&ctx, &planted).await;
    sql(
        &ctx,
        "UPDATE payments SET outcome = 'failed' WHERE payment_id = 'pi_bob'",
    )
    .await;
    sql(
        &ctx,
        &format!(
            "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at, pay_ref) \
             VALUES ({}, {}, 'dan', 'paid', UTC_TIMESTAMP(3), 'pi_nowhere')",
            ghost_order + 3,
            v.id
        ),
    )
    .await;

    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    let text = reconcile::render(&r);
    let found: std::collections::BTreeMap<&str, &reconcile::UnmatchedMoney> = r
        .unmatched_money
        .iter()
        .map(|m| (m.payment_id.as_deref().unwrap_or("-"), m))
        .collect();
    let names: Vec<&str> = found.keys().copied().collect();
    assert_eq!(
        names,
        ["pi_bob", "pi_ghost", "pi_nowhere", "pi_stuck"],
        "{text}"
    );
    let ghost = found["pi_ghost"];
    assert_eq!(ghost.class, "paid_payment_without_its_order");
    assert_eq!(ghost.order_id, ghost_order.to_string());
    assert!(ghost.found.contains("no row"), "{text}");
    assert_eq!(ghost.what_to_do, "refund the payment", "{text}");
    let stuck = found["pi_stuck"];
    assert_eq!(stuck.class, "payment_undecided");
    assert!(stuck.found.contains("never decided"), "{text}");
    assert!(
        stuck.what_to_do.contains("send the payment's event again"),
        "{text}"
    );
    let bob_found = found["pi_bob"];
    assert_eq!(
        (bob_found.class.as_str(), bob_found.order_id.as_str()),
        ("paid_order_without_its_payment", bob.as_str())
    );
    assert!(bob_found.found.ends_with("which is failed"), "{text}");
    assert!(bob_found.what_to_do.contains("with the provider"), "{text}");
    assert!(found["pi_nowhere"].found.contains("not recorded"), "{text}");
    assert_eq!(found["pi_nowhere"].amount_minor, None);
    assert!(!r.clean_after());
    assert!(text.contains("money not matched both ways: 4"), "{text}");
    let st = status::voucher_status(&b, v.id).await.unwrap();
    assert_eq!(st.unmatched_money, 4, "{st:?}");

    // Put right, nothing is listed; cat's close, settled now, never was.
    sql(
        &ctx,
        "DELETE FROM payments WHERE payment_id IN ('pi_ghost', 'pi_stuck')",
    )
    .await;
    sql(
        &ctx,
        "UPDATE payments SET outcome = 'paid' WHERE payment_id = 'pi_bob'",
    )
    .await;
    sql(
        &ctx,
        &format!("DELETE FROM orders WHERE id = {}", ghost_order + 3),
    )
    .await;
    drain_settled(&ctx, v.id).await;
    let r = reconcile::reconcile(&b, v.id, false).await.unwrap();
    assert!(r.unmatched_money.is_empty(), "{}", reconcile::render(&r));
    assert!(r.clean_after(), "{}", reconcile::render(&r));
    let st = status::voucher_status(&b, v.id).await.unwrap();
    assert_eq!((st.unmatched_money, st.paid), (0, 3), "{st:?}");
    ctx.cleanup().await;
}

/// The two looks of the money check, on tables written just now and never analysed:
/// each reads the voucher's own rows it checks (its payments `paid` or `received`, its
/// paid orders) once, with one primary-key look at the other table each, never another
/// voucher's rows nor the table, whatever the statistics say.
#[tokio::test]
async fn money_checks_examine_only_the_rows_they_check_on_tables_never_analysed() {
    use mysql_async::params;
    use seckill_shared::adapters::data_api::format_datetime;
    use seckill_shared::adapters::payments::unmatched::{
        unmatched_paid_orders_sql, unmatched_payments_sql,
    };
    use seckill_shared::domain::now_millis;
    use seckill_tests::mysql::handler_reads;
    let ctx = DrainCtx::start().await;
    let mut conn = ctx.mysql().await;
    let outcomes = ["received", "paid", "refund_due", "failed", "refused"];
    // (i, payment id, order, voucher, outcome, age in seconds); vouchers interleaved.
    // Ages never near the 15 minutes after which a received payment is overdue.
    let rows: Vec<(u64, String, u64, u64, &str, u64)> = (0..20_000u64)
        .map(|i| {
            let age = (i * 31) % 86_400;
            let age = if (850..950).contains(&age) {
                age + 200
            } else {
                age
            };
            (
                i,
                format!("pay_{i:06}"),
                1_000_000 + i,
                1 + (i * 7_919) % 200,
                outcomes[((i / 7) % 5) as usize],
                age,
            )
        })
        .collect();
    let payments: Vec<_> = rows
        .iter()
        .map(|(_, p, o, v, outcome, age)| (p.clone(), *o, *v, *outcome, *age))
        .collect();
    seckill_tests::mysql::insert_payments(&mut conn, &payments).await;
    // Orders of each voucher's payments, by eighths: five paid by their payment, one paid
    // by another reference, one awaiting payment; the last has no row.
    let order_of = |i: u64| -> Option<(&'static str, Option<String>)> {
        match (i / 200) % 8 {
            0..=4 => Some(("paid", Some(format!("pay_{i:06}")))),
            5 => Some(("paid", Some(format!("other_{i}")))),
            6 => Some(("awaiting_payment", None)),
            _ => None,
        }
    };
    let with_rows: Vec<_> = rows.iter().filter(|r| order_of(r.0).is_some()).collect();
    for chunk in with_rows.chunks(1_000) {
        let values = vec!["(?, ?, ?, ?, ?, UTC_TIMESTAMP(3))"; chunk.len()].join(",");
        let params: Vec<mysql_async::Value> = chunk
            .iter()
            .flat_map(|(i, _, o, v, ..)| {
                let (status, pay_ref) = order_of(*i).unwrap();
                [
                    (*o).into(),
                    (*v).into(),
                    format!("buyer-{i}").into(),
                    status.into(),
                    pay_ref.into(),
                ]
            })
            .collect();
        conn.exec_drop(
            format!(
                "INSERT INTO orders (id, voucher_id, user_id, status, pay_ref, admitted_at) \
                 VALUES {values}"
            ),
            params,
        )
        .await
        .unwrap();
    }
    let overhead = {
        let a = handler_reads(&mut conn).await;
        let b = handler_reads(&mut conn).await;
        b - a
    };
    let before = format_datetime(now_millis() - 15 * 60 * 1000);
    for voucher in [7u64, 200] {
        let mine: Vec<_> = rows.iter().filter(|r| r.3 == voucher).collect();
        // From the payments: each paid or received payment once, its order by key.
        let checked = mine
            .iter()
            .filter(|r| matches!(r.4, "paid" | "received"))
            .count() as u64;
        let expect = mine
            .iter()
            .filter(|r| match r.4 {
                "paid" => (r.0 / 200) % 8 > 4,
                "received" => r.5 > 900,
                _ => false,
            })
            .count();
        let at = handler_reads(&mut conn).await;
        let got: Vec<mysql_async::Row> = conn
            .exec(
                unmatched_payments_sql(),
                params! { "v" => voucher, "before" => before.clone() },
            )
            .await
            .unwrap();
        let examined = handler_reads(&mut conn).await - at - overhead;
        assert_eq!(got.len(), expect, "voucher {voucher}'s unmatched payments");
        assert!(
            examined <= 2 * checked + 10,
            "checking {checked} payments of voucher {voucher} examined {examined} rows"
        );
        // From the orders: each paid order once, its payment by key.
        let paid_orders: Vec<_> = mine
            .iter()
            .filter(|r| order_of(r.0).is_some_and(|(s, _)| s == "paid"))
            .collect();
        let expect = paid_orders
            .iter()
            .filter(|r| (r.0 / 200) % 8 == 5 || !matches!(r.4, "paid" | "received"))
            .count();
        let at = handler_reads(&mut conn).await;
        let got: Vec<mysql_async::Row> = conn
            .exec(unmatched_paid_orders_sql(), params! { "v" => voucher })
            .await
            .unwrap();
        let examined = handler_reads(&mut conn).await - at - overhead;
        assert_eq!(
            got.len(),
            expect,
            "voucher {voucher}'s unmatched paid orders"
        );
        let checked = paid_orders.len() as u64;
        assert!(
            examined <= 2 * checked + 10,
            "checking {checked} paid orders of voucher {voucher} examined {examined} rows"
        );
    }
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

//! Stale truths, against a private Redis and a fresh database behind
//! the real Data API server: an instance's sold-out memory expires so stock that comes
//! back can be sold, and the database refuses to delete a voucher whose sale has started
//! or that has orders (migration 0002), while the drainer can still record orders of
//! unknown vouchers.

use std::time::Duration;

use redis::AsyncCommands;
use seckill_http::App;
use seckill_http::cache::SOLD_OUT_TTL_MS;
use seckill_shared::adapters::data_api::{DataApi, param};
use seckill_shared::domain::{NewVoucher, SaleWindow, VoucherId, now_millis};
use seckill_shared::error::StoreError;
use seckill_shared::keys::VoucherKeys;
use seckill_tests::harness::{Backends, buy};

async fn voucher(db: &DataApi, begins_offset_ms: i64) -> VoucherId {
    let now = now_millis();
    let new = NewVoucher {
        title: "stale truths".into(),
        stock: 1,
        window: SaleWindow::new(now + begins_offset_ms, now + 7_200_000).unwrap(),
        payment: None,
        buckets: 1,
        room: None,
    };
    db.create_voucher(&new).await.unwrap().id
}

/// Stock that comes back after a sell-out (here an operator adds units in Redis) is sold
/// by an instance that saw the sell-out, once its memory of it expires.
#[tokio::test]
async fn stock_that_comes_back_after_a_sell_out_is_sold() {
    let b = Backends::start().await;
    let app = App::new(&b.http_config()).await;
    let v = voucher(&b.db, -1_000).await;
    assert_eq!(buy(&app, v, "alice").await.0, 202);
    let (status, body) = buy(&app, v, "bob").await;
    assert_eq!((status, body["code"].as_str()), (409, Some("sold_out")));

    let k = VoucherKeys::new(v);
    let _: i64 = b.sales.conn().hincr(&k.sale, "stock", 2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(SOLD_OUT_TTL_MS as u64 + 50)).await;
    let (status, body) = buy(&app, v, "bob").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(buy(&app, v, "carol").await.0, 202);
    let (status, body) = buy(&app, v, "dave").await;
    assert_eq!((status, body["code"].as_str()), (409, Some("sold_out")));
    b.cleanup().await;
}

async fn delete(db: &DataApi, v: VoucherId) -> Result<i64, StoreError> {
    db.execute(
        "DELETE FROM vouchers WHERE id = :id",
        vec![param::long("id", v.get())],
        None,
    )
    .await
    .map(|out| out.number_of_records_updated())
}

fn assert_refused(res: Result<i64, StoreError>, why: &str) {
    match res {
        Err(StoreError::Database(msg)) => {
            assert!(msg.contains("voucher_delete_refused"), "{msg}");
            assert!(msg.contains(why), "{msg}");
        }
        other => panic!("DELETE should be refused ({why}): {other:?}"),
    }
}

/// Through the Data API, as an operator's script would: a started sale or a voucher with
/// orders cannot be deleted; a voucher not yet on sale and without orders can.
#[tokio::test]
async fn deleting_a_started_or_ordered_voucher_is_refused_by_the_database() {
    let b = Backends::start().await;
    let started = voucher(&b.db, -1_000).await;
    assert_refused(delete(&b.db, started).await, "its sale has started");

    let later = voucher(&b.db, 3_600_000).await;
    b.db.execute(
        "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES (77, :v, 'early', 'confirmed', NOW(3))",
        vec![param::long("v", later.get())],
        None,
    )
    .await
    .unwrap();
    assert_refused(delete(&b.db, later).await, "it has orders");

    let mistake = voucher(&b.db, 3_600_000).await;
    assert_eq!(delete(&b.db, mistake).await.unwrap(), 1);
    assert!(b.db.voucher(mistake).await.unwrap().is_none());
    assert!(b.db.voucher(started).await.unwrap().is_some());
    assert!(b.db.voucher(later).await.unwrap().is_some());

    // Orders of a voucher the database does not know can still be recorded (the
    // drainer records them as rejected): the guard is a trigger, not a foreign key.
    b.db.execute(
        "INSERT INTO orders (id, voucher_id, user_id, status, reason, admitted_at) VALUES (78, :v, 'x', 'rejected', 'unknown_voucher', NOW(3))",
        vec![param::long("v", mistake.get())],
        None,
    )
    .await
    .unwrap();
    b.cleanup().await;
}

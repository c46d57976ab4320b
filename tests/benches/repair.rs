//! What reading a whole sale back from the database costs: the repair of a sale Redis
//! lost and `seckill reconcile`, both over the sale snapshot (`DataApi::sale_snapshot`),
//! on a table of 200,000 orders written just now and never analysed (the way a lost hot
//! sale's table looks), against seckill-http's 10 s function timeout and a plain read of
//! the same rows measured in the same run (one `SELECT user_id, id` straight from
//! MariaDB: the floor). The repair runs in bounded parts (`SECKILL_REPAIR_PART_ROWS`,
//! 100,000 by default): one row per request, each part's rows and time.
//!
//! Rows examined are MariaDB's `Handler_read_*` counters (global: the stack's MariaDB
//! serves nothing else while this runs). Needs the local stack (`scripts/stack.sh up`).
//!
//! `cargo bench -p seckill-tests --bench repair [-- ORDERS]`

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use mysql_async::prelude::Queryable;
use seckill_http::App;
use seckill_shared::domain::{NewVoucher, SaleWindow, now_millis};
use seckill_tests::harness::{Backends, buy};
use seckill_tests::mysql::{connect, insert_orders, url_with_database};
use seckill_tests::redis::RedisServer;

const DEFAULT_ORDERS: usize = 200_000;
/// seckill-http's function timeout (template.yaml).
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The sum of the `Handler_read_*` counters of `scope` (`GLOBAL` or `SESSION`).
async fn handler_reads(conn: &mut mysql_async::Conn, scope: &str) -> u64 {
    let rows: Vec<(String, String)> = conn
        .query(format!("SHOW {scope} STATUS LIKE 'Handler_read%'"))
        .await
        .expect("status");
    rows.iter()
        .map(|(_, n)| n.parse::<u64>().unwrap_or(0))
        .sum()
}

struct Row {
    what: String,
    time: Duration,
    examined: u64,
    returned: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let orders: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(DEFAULT_ORDERS);
    let b = Backends::start_with(RedisServer::single()).await;
    let now = now_millis();
    let voucher =
        b.db.create_voucher(&NewVoucher {
            title: "repair bench".into(),
            stock: orders as i64 + 1_000,
            window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
            payment: None,
            buckets: 1,
            room: None,
        })
        .await
        .expect("voucher");
    let url = url_with_database(&b.mysql_url, &b.database);
    let mut conn = connect(&url).await;
    conn.exec_drop(
        "UPDATE vouchers SET stock_left = 1000 WHERE id = ?",
        (voucher.id.get(),),
    )
    .await
    .unwrap();

    // The sale's orders, in admission order (buyers interleaved), never analysed.
    let bar = ProgressBar::new(orders as u64).with_style(
        ProgressStyle::with_template("writing orders {bar:40} {pos}/{len} {elapsed}").unwrap(),
    );
    for start in (0..orders).step_by(5_000) {
        let n = 5_000.min(orders - start);
        let rows: Vec<(i64, String, &str)> = (start..start + n)
            .map(|i| {
                let user = format!("user-{:08}", (i * 7_919) % orders);
                (1_000_000 + i as i64, user, "confirmed")
            })
            .collect();
        insert_orders(&mut conn, voucher.id.get(), &rows).await;
        bar.inc(n as u64);
    }
    bar.finish();

    let mut rows = Vec::new();
    // The floor: every row of the sale in one plain read.
    let before = handler_reads(&mut conn, "SESSION").await;
    let t0 = Instant::now();
    let read: Vec<(Vec<u8>, i64)> = conn
        .exec(
            "SELECT user_id, id FROM orders WHERE voucher_id = ?",
            (voucher.id.get(),),
        )
        .await
        .unwrap();
    rows.push(Row {
        what: "floor: one SELECT of every row".into(),
        time: t0.elapsed(),
        examined: handler_reads(&mut conn, "SESSION").await - before,
        returned: read.len() as u64,
    });

    // The snapshot alone, through the Data API, page by page.
    let before = handler_reads(&mut conn, "GLOBAL").await;
    let t0 = Instant::now();
    let (_, mut snapshot) = b.db.sale_snapshot(voucher.id).await.unwrap().unwrap();
    let mut returned = 0;
    while let Some(page) = snapshot.next_page().await.unwrap() {
        returned += page.len() as u64;
    }
    snapshot.finish().await;
    rows.push(Row {
        what: "sale snapshot (Data API pages)".into(),
        time: t0.elapsed(),
        examined: handler_reads(&mut conn, "GLOBAL").await - before,
        returned,
    });

    // The repair: the requests after Redis lost the sale rebuild it, each reading its
    // part (at most SECKILL_REPAIR_PART_ROWS rows, then one page) and answering 503
    // until the last, which reopens the sale and admits.
    let app = App::new(&b.http_config()).await;
    let mut part = 0;
    loop {
        part += 1;
        let buyers_before = b.sales.buyer_count(voucher.id).await.unwrap();
        let before = handler_reads(&mut conn, "GLOBAL").await;
        let t0 = Instant::now();
        let (status, body) = buy(&app, voucher.id, "a-new-buyer").await;
        let took = t0.elapsed();
        assert!(
            status == 202 || (status == 503 && part < 10),
            "repair part {part}: {status} {body}"
        );
        let buyers = b.sales.buyer_count(voucher.id).await.unwrap();
        rows.push(Row {
            what: format!("repair part {part} ({status})"),
            time: took,
            examined: handler_reads(&mut conn, "GLOBAL").await - before,
            returned: buyers - buyers_before,
        });
        if status == 202 {
            break;
        }
    }

    // `seckill reconcile` of the repaired sale.
    let ops = seckill_cli::ops::Backends::connect(&b.redis.config(), &b.data_api_config())
        .await
        .unwrap();
    let before = handler_reads(&mut conn, "GLOBAL").await;
    let t0 = Instant::now();
    let report = seckill_cli::ops::reconcile::reconcile(&ops, voucher.id, false)
        .await
        .unwrap();
    rows.push(Row {
        what: "reconcile".into(),
        time: t0.elapsed(),
        examined: handler_reads(&mut conn, "GLOBAL").await - before,
        returned: report.db_orders,
    });
    conn.disconnect().await.ok();

    let floor = rows[0].time.as_secs_f64();
    println!("\nA sale of {orders} orders, table never analysed");
    println!(
        "{:<34} {:>10} {:>9} {:>14} {:>10} {:>10}",
        "step", "time ms", "x floor", "rows examined", "returned", "of 10 s"
    );
    for r in &rows {
        println!(
            "{:<34} {:>10.1} {:>9.2} {:>14} {:>10} {:>9.1}%",
            r.what,
            r.time.as_secs_f64() * 1e3,
            r.time.as_secs_f64() / floor,
            r.examined,
            r.returned,
            100.0 * r.time.as_secs_f64() / FUNCTION_TIMEOUT.as_secs_f64()
        );
    }
    b.cleanup().await;
}

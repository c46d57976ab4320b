//! The drain's baselines: the tutorial's consumer (one order per Data API transaction)
//! and the database floor (multi-row INSERTs straight into MariaDB).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;
use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use redis::streams::StreamReadReply;
use seckill_cli::scratch_db::mysql;
use seckill_shared::adapters::data_api::{field, format_datetime, param};
use seckill_shared::domain::now_millis;

use super::checks::db_checks;
use super::results::{DrainRun, RunClock};
use crate::admission::tutorial_keys;
use crate::backends::Bench;
use crate::drivers::{Driver, TutorialKeys, many};
use crate::engine::{Ui, run};
use crate::workload::{Plan, user_name};

/// The tutorial's admission fills a stream of its own (the admission runs' orders sit
/// in the run's global stream), then the tutorial's consumer drains it.
pub(super) async fn drain_tutorial(bench: &Bench, n: u64, ui: &Ui) -> anyhow::Result<DrainRun> {
    let voucher = bench.voucher("bench drain tutorial", n as i64).await?;
    let prefix = format!("{}drain:", bench.prefix());
    let keys = tutorial_keys(bench, &prefix, voucher.id, n as i64).await?;
    let drivers = many(16, || Driver::tutorial(&bench.tutorial_redis, keys.clone())).await?;
    let plan = Arc::new(Plan::distinct(n));
    let what = ["drain", "tutorial fill", "redis"];
    let filled = run(drivers, plan, what, n as i64, None, ui).await?;
    let run = if let Some(e) = filled.error {
        let mut run = DrainRun::new("tutorial", 1, 1, 0, Duration::ZERO, Vec::new());
        run.error = Some(format!(
            "filling its stream with the tutorial's admission: {e}"
        ));
        run
    } else {
        anyhow::ensure!(
            filled.admitted == n,
            "the tutorial admitted {} of {n}",
            filled.admitted
        );
        let mut conn = bench.tutorial.clone();
        let _: () = conn
            .xgroup_create_mkstream(keys.stream(), "g1", "0")
            .await?;
        let bar = ui.bar(n, "drain tutorial");
        let start = Instant::now();
        let done = tutorial_consume(bench, &keys, &bar, start + ui.max_run).await?;
        let elapsed = start.elapsed();
        bar.finish_and_clear();
        let checks = db_checks(bench, voucher.id, n, Some(0)).await?;
        DrainRun::new("tutorial", 1, 1, done, elapsed, checks)
    };
    bench.release_voucher(voucher.id).await?;
    bench.release_keys(&keys.all()).await?;
    Ok(run)
}

/// The tutorial's consumer loop; returns the orders it processed.
async fn tutorial_consume(
    bench: &Bench,
    keys: &TutorialKeys,
    bar: &ProgressBar,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let mut conn = bench.tutorial.clone();
    let db = &bench.db;
    let opts = redis::streams::StreamReadOptions::default()
        .group("g1", "c1")
        .count(1);
    let mut done = 0u64;
    while Instant::now() < deadline {
        let reply: StreamReadReply = conn.xread_options(&[keys.stream()], &[">"], &opts).await?;
        let Some(entry) = reply.keys.into_iter().flat_map(|k| k.ids).next() else {
            break;
        };
        let fields = (
            entry.get::<String>("userId"),
            entry.get("voucherId"),
            entry.get("id"),
        );
        let (Some(user), Some(voucher), Some(id)) = fields else {
            anyhow::bail!(
                "tutorial stream entry {} lacks userId, voucherId or id",
                entry.id
            );
        };
        let tx = db.begin().await?;
        let count = db
            .execute(
                "SELECT COUNT(*) FROM orders WHERE user_id = :u AND voucher_id = :v",
                vec![param::string("u", &user), param::long("v", voucher)],
                Some(&tx),
            )
            .await?;
        let bought = count.records().first().and_then(|r| r.first());
        let updated = match bought.and_then(field::long).unwrap_or(0) {
            0 => db
                .execute(
                    "UPDATE vouchers SET stock_left = stock_left - 1 WHERE id = :v AND stock_left > 0",
                    vec![param::long("v", voucher)],
                    Some(&tx),
                )
                .await?
                .number_of_records_updated(),
            _ => 0,
        };
        if updated == 0 {
            db.rollback(&tx).await;
        } else {
            db.execute(
                "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES (:id, :v, :u, 'confirmed', :a)",
                vec![
                    param::long("id", id),
                    param::long("v", voucher),
                    param::string("u", &user),
                    param::timestamp("a", now_millis()),
                ],
                Some(&tx),
            )
            .await?;
            db.commit(&tx).await?;
        }
        let _: i64 = conn.xack(keys.stream(), "g1", &[&entry.id]).await?;
        done += 1;
        bar.set_position(done);
    }
    Ok(done)
}

/// The floor's `round`-th run (its order ids are the round's own: ids are unique across
/// vouchers).
pub(super) async fn drain_floor(
    bench: &Bench,
    n: u64,
    batch: usize,
    round: usize,
) -> anyhow::Result<DrainRun> {
    let first_id = (1_i64 << 40) + ((round as i64) << 32);
    let voucher = bench.voucher("bench drain floor", n as i64).await?;
    let mut conn = mysql(&bench.mysql_url).await?;
    let admitted = format_datetime(now_millis());
    let clock = RunClock::start();
    for first in (0..n).step_by(batch) {
        let rows: Vec<String> = (first..(first + batch as u64).min(n))
            .map(|k| {
                let (id, user) = (first_id + k as i64, user_name(k as u32));
                format!("({id},{},'{user}','confirmed','{admitted}')", voucher.id)
            })
            .collect();
        conn.query_drop(format!(
            "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES {}",
            rows.join(",")
        ))
        .await
        .context("database floor INSERT")?;
    }
    let stopped = clock.stop();
    conn.disconnect().await.ok();
    let checks = db_checks(bench, voucher.id, n, None).await?;
    bench.release_voucher(voucher.id).await?;
    Ok(DrainRun::timed("db-floor", batch, 1, n, stopped, checks))
}

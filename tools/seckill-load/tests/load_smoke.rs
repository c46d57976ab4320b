//! CI smoke of the load tool: the quick sale, in process, against a private Redis (the
//! tests' `RedisServer`: one node or a cluster, as the run's settings say) and a fresh
//! database behind an in-process Data API server, with the tutorial baseline; then a
//! small drain with its baselines. Asserts the invariants and that every attempt was
//! answered, never a speed.

use seckill_load::admission::{self, SaleOptions};
use seckill_load::backends::Bench;
use seckill_load::drain::{self, DrainOptions};
use seckill_load::engine::Ui;
use seckill_load::record::Check;
use seckill_tests::harness::Backends;
use seckill_tests::mysql::url_with_database;
use seckill_tests::redis::RedisServer;

/// The benchmark on the test's backends. The tutorial baseline only runs on a Redis
/// whose one node owns every slot (see `Bench::use_tutorial_redis`): when the test's
/// Redis is a cluster of several nodes, the tutorial gets a node of its own, returned to
/// be kept as long as the benchmark.
async fn bench_on(b: &Backends, run_id: &str) -> (Bench, Option<RedisServer>) {
    let mysql = url_with_database(&b.mysql_url, &b.database);
    // The benchmark applies the schema itself (DDL): the master secret, not the
    // application user the handler tests use.
    let http = seckill_http::Config {
        data_api: b.master_data_api_config(),
        ..b.http_config()
    };
    let mut bench = Bench::attach(http, mysql, run_id.to_string())
        .await
        .expect("the benchmark attaches to the test backends");
    let tutorial = (b.redis.nodes().len() > 1).then(RedisServer::single);
    if let Some(single) = &tutorial {
        bench
            .use_tutorial_redis(single.config())
            .await
            .expect("the tutorial's Redis answers");
    }
    (bench, tutorial)
}

/// Every check of the run `what` held, and it ran some.
fn assert_checks(what: String, checks: &[Check]) {
    assert!(!checks.is_empty(), "{what} ran no checks");
    for c in checks {
        assert!(c.ok, "{what}: {} ({})", c.name, c.detail);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_sale_keeps_every_invariant() {
    let backends = Backends::start().await;
    let (bench, _tutorial) = bench_on(&backends, "smoke-sale").await;
    let o = SaleOptions {
        stock: 100,
        attempts: 20_000,
        users: 4_000,
        callers: 16,
        seed: 7,
        baseline: true,
    };
    let r = admission::sale(&bench, &o, &Ui::quiet())
        .await
        .expect("the sale runs");
    let tutorial = r.tutorial.as_ref().expect("the baseline ran");
    for run in [&r.ours, tutorial] {
        assert_checks(format!("{} {}", run.scenario, run.variant), &run.checks);
        assert_eq!(
            run.completed, o.attempts,
            "{}: every attempt answered",
            run.variant
        );
        assert_eq!(
            run.outcomes.get("failed"),
            None,
            "{}: {:?}",
            run.variant,
            run.failure_samples
        );
        assert_eq!(
            run.admitted, 100,
            "{}: more buyers than stock sell it all",
            run.variant
        );
        assert!(run.sell_out_s.is_some());
    }
    bench.cleanup().await.expect("cleanup");
    backends.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_drain_commits_every_order_once() {
    let backends = Backends::start().await;
    let (bench, _tutorial) = bench_on(&backends, "smoke-drain").await;
    let o = DrainOptions {
        orders: 600,
        batch_sizes: vec![100, 1000],
        tutorial_orders: 60,
        floor_batch: 250,
        floor_rounds: 2,
        // Pinning needs the stack's pid files; this smoke test's backends have none.
        pinned_rounds: 0,
        baseline: true,
        sales: vec![1, 3],
        spread_rounds: 2,
    };
    let r = drain::drain(&bench, &o, &Ui::quiet())
        .await
        .expect("the drain runs");
    assert_eq!(r.ours.len(), 2);
    assert!(r.tutorial.is_some() && r.db_floor.is_some());
    // Two rounds side by side with the floor, the order alternating; each floor run
    // writes its own order ids (a second run with the first's ids would fail).
    let order: Vec<bool> = r.floor_rounds.iter().map(|f| f.floor_first).collect();
    assert_eq!(order, [true, false]);
    let median = r.median_round().expect("a median round");
    assert_eq!(
        r.db_floor.as_ref().map(|f| f.elapsed_s),
        Some(median.floor.elapsed_s)
    );
    // Two rounds of the spread, the second in reverse order; each ratio within a round.
    assert_eq!(
        r.spread
            .iter()
            .map(|s| (s.round, s.sales, s.orders))
            .collect::<Vec<_>>(),
        vec![(0, 1, 600), (0, 3, 600), (1, 3, 600), (1, 1, 600)]
    );
    let (pairs, median) = r.spread_pairs(3);
    assert_eq!(pairs.len(), 2);
    assert!(pairs.iter().all(|p| p.single.round == p.many.round));
    assert!(median.is_some());
    for run in r.runs() {
        let what = format!("drain {} batch {}", run.variant, run.batch_size);
        assert_checks(what, &run.checks);
    }
    bench.cleanup().await.expect("cleanup");
    backends.cleanup().await;
}

//! Crash recovery of the order drainer: a real `order-drainer --once` process is frozen
//! at a named failpoint (`DRAINER_FAILPOINT`) and SIGKILLed there; after the claim
//! threshold a fresh process recovers. For every cut point the end state is the same,
//! exact one: every admitted order in the database exactly once (confirmed up to the
//! database stock, the rest rejected), the stock taken exactly once, the poison entry
//! dead-lettered exactly once, nothing pending.
//!
//! Needs the binary: `cargo build --bin order-drainer` (`scripts/test.sh` builds it).

use std::collections::BTreeSet;
use std::time::Duration;

use seckill_shared::domain::now_millis;
use seckill_tests::drainer::{DrainCtx, DrainerProcess};

/// Orders admitted before and after the poison entry.
const HALF: usize = 20;
/// The database stock: the last orders of the stream are rejected.
const DB_STOCK: i64 = 35;
const BATCH: usize = 10;
const FAILPOINT_TIMEOUT: Duration = Duration::from_secs(60);

async fn crash_and_recover(failpoint: &str, claim_first: bool) {
    let ctx = DrainCtx::start().await;
    let v = ctx.voucher(100, DB_STOCK).await;
    let mut admitted = ctx.admit(v.id, "a", HALF).await;
    let vid = v.id.get().to_string();
    let now = now_millis().to_string();
    ctx.xadd_raw(
        v.id,
        &[
            ("order_id", "oops"),
            ("voucher_id", &vid),
            ("user_id", "p"),
            ("admitted_ms", &now),
        ],
    )
    .await;
    admitted.extend(ctx.admit(v.id, "b", HALF).await);

    let mut cfg = ctx.drainer_config();
    cfg.batch_size = BATCH;
    cfg.max_run = Duration::from_secs(10);
    let env = ctx.drainer_env(&cfg);

    if claim_first {
        // Leave a batch pending and idle, so the next process has something to claim.
        let mut p = DrainerProcess::spawn(&env, Some("after_read"));
        p.wait_for_failpoint("after_read", FAILPOINT_TIMEOUT);
        p.kill();
        tokio::time::sleep(cfg.min_idle + Duration::from_millis(200)).await;
    }

    let name = failpoint.split(':').next().unwrap_or(failpoint);
    let mut p = DrainerProcess::spawn(&env, Some(failpoint));
    p.wait_for_failpoint(name, FAILPOINT_TIMEOUT);
    p.kill();

    // After the claim threshold a fresh invocation recovers. The killed process's open
    // transaction (if any) still holds its row locks, as Aurora's would for 3 minutes:
    // the recovery must roll it back itself, within its short run.
    tokio::time::sleep(cfg.min_idle + Duration::from_millis(200)).await;
    let mut recovery_cfg = cfg.clone();
    recovery_cfg.max_run = Duration::from_secs(3);
    let (ok, summary) = DrainerProcess::spawn(&ctx.drainer_env(&recovery_cfg), None)
        .finish(Duration::from_secs(60));
    assert!(ok && summary.errors == 0, "recovery failed: {summary:?}");

    let rows = ctx.orders_in_db(v.id).await;
    let want: BTreeSet<i64> = admitted.iter().map(|i| i.get()).collect();
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        want,
        "every admitted order exactly once ({failpoint}); recovery {summary:?}"
    );
    let confirmed = rows.values().filter(|(s, _)| s == "confirmed").count();
    let rejected = rows
        .values()
        .filter(|(s, r)| s == "rejected" && r.as_deref() == Some("db_stock_exhausted"))
        .count();
    assert_eq!(
        (confirmed, rejected),
        (DB_STOCK as usize, 2 * HALF - DB_STOCK as usize),
        "{failpoint}"
    );
    assert_eq!(
        ctx.db_stock_left(v.id).await,
        0,
        "stock taken exactly once ({failpoint})"
    );
    let dead = ctx.dead_letters(v.id).await;
    assert_eq!(dead.len(), 1, "one dead letter ({failpoint}): {dead:?}");
    assert_eq!(
        dead[0].get("reason").map(String::as_str),
        Some("bad_fields: invalid order_id")
    );
    assert_eq!(
        ctx.pending(v.id).await,
        0,
        "nothing left pending ({failpoint})"
    );
    assert_eq!(summary.lag, 0, "{failpoint}: {summary:?}");
    ctx.cleanup().await;
}

macro_rules! cut_points {
    ($($test:ident => $failpoint:literal $(, claim_first = $claim:literal)?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crash_and_recover($failpoint, false $(|| $claim)?).await;
        }
    )*};
}

cut_points! {
    killed_after_claiming => "after_claim", claim_first = true;
    killed_after_reading_the_second_batch => "after_read:2";
    killed_before_dead_lettering => "before_dead_letter";
    killed_after_dead_lettering => "after_dead_letter";
    killed_before_beginning_the_second_transaction => "before_begin:2";
    killed_after_beginning_the_third_transaction => "after_begin:3";
    killed_holding_the_voucher_lock => "after_lock";
    killed_after_inserting_rejected_rows => "after_insert:5";
    killed_after_taking_stock => "after_stock_update:2";
    killed_just_before_commit => "before_commit:4";
    killed_after_commit_before_ack => "after_commit:2";
    killed_after_ack => "after_ack";
    killed_before_trimming => "before_trim";
    killed_after_trimming => "after_trim";
}

/// Kill moments from a small xorshift generator; the seed is printed (and can be set with
/// `SECKILL_TEST_SEED`) so a failing storm can be replayed.
struct Moments(u64);

impl Moments {
    fn seeded() -> Moments {
        let seed = std::env::var("SECKILL_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| now_millis() as u64 | 1);
        println!("kill moments: SECKILL_TEST_SEED={seed}");
        Moments(seed)
    }

    /// A duration in `[lo, hi)` milliseconds.
    fn between(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(lo + self.0 % (hi - lo))
    }
}

/// The highest delivery count among the voucher's pending entries.
async fn max_deliveries(ctx: &DrainCtx, voucher: seckill_shared::domain::VoucherId) -> u64 {
    let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(seckill_shared::keys::VoucherKeys::new(voucher).orders)
        .arg(seckill_shared::keys::DRAIN_GROUP)
        .arg("-")
        .arg("+")
        .arg(100_000)
        .query_async(&mut ctx.conn())
        .await
        .expect("XPENDING");
    rows.iter().map(|r| r.3).max().unwrap_or(0)
}

/// Drains in process until nothing is pending or undelivered, at most `within`; returns
/// the summaries.
async fn drain_clean(
    ctx: &DrainCtx,
    cfg: &order_drainer::Config,
    within: Duration,
) -> Vec<order_drainer::Summary> {
    let started = std::time::Instant::now();
    let mut runs = Vec::new();
    loop {
        let s = ctx.drain(cfg.clone()).await;
        let done = s.errors == 0 && s.pending == 0 && s.lag == 0;
        runs.push(s);
        if done {
            return runs;
        }
        assert!(
            started.elapsed() < within,
            "not drained within {within:?}: {runs:#?}"
        );
        tokio::time::sleep(cfg.min_idle + Duration::from_millis(100)).await;
    }
}

/// A crash loop during a live sale: admissions arrive in waves while `order-drainer
/// --once` is started and SIGKILLed again and again at random moments (holding row
/// locks, mid-commit, mid-claim: wherever it happens to be), two runs overlapping. Each
/// restart claims what the last one left, so delivery counts climb past any retry cap. Then one clean drain
/// must land every admitted order exactly once, quickly (the killed runs' transactions
/// still hold their row locks, as Aurora keeps them for 3 minutes), and dead-letter
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_loop_during_a_sale_loses_and_dead_letters_nothing() {
    const WAVES: usize = 3;
    const PER_WAVE: usize = 500;
    const KILLS: usize = 16;
    let ctx = DrainCtx::start().await;
    let total = (WAVES * PER_WAVE) as i64;
    let v = ctx.voucher(total, total).await;
    let mut cfg = ctx.drainer_config();
    cfg.batch_size = 10;
    // Far shorter than a run on purpose: each restart claims everything pending, the
    // live run's entries included, so the two race for the same orders.
    cfg.min_idle = Duration::from_millis(1);
    cfg.max_run = Duration::from_secs(5);
    let env = ctx.drainer_env(&cfg);
    let mut moments = Moments::seeded();

    let sale = async {
        let mut ids = Vec::new();
        for wave in 0..WAVES {
            ids.extend(ctx.admit(v.id, &format!("w{wave}"), PER_WAVE).await);
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
        ids
    };
    let storm = async {
        // Two drainers overlap most of the time (a slow run and the next scheduled one);
        // the older is killed at a random moment, so every kill lands somewhere else.
        let mut alive = std::collections::VecDeque::new();
        let (mut kills, mut peak) = (0, 0);
        while kills < KILLS {
            alive.push_back(DrainerProcess::spawn(&env, None));
            tokio::time::sleep(moments.between(100, 900)).await;
            if alive.len() == 2 {
                alive.pop_front().expect("two alive").kill();
                kills += 1;
                peak = peak.max(max_deliveries(&ctx, v.id).await);
            }
        }
        for p in alive {
            p.kill();
        }
        peak
    };
    let (admitted, peak) = tokio::join!(sale, storm);
    println!("highest delivery count during the storm: {peak}");
    assert!(
        ctx.dead_letters(v.id).await.is_empty(),
        "dead letters during the storm"
    );

    let mut clean = cfg.clone();
    clean.min_idle = Duration::from_millis(300);
    clean.max_run = Duration::from_secs(10);
    let runs = drain_clean(&ctx, &clean, Duration::from_secs(60)).await;

    let rows = ctx.orders_in_db(v.id).await;
    let want: BTreeSet<i64> = admitted.iter().map(|i| i.get()).collect();
    assert_eq!(want.len(), WAVES * PER_WAVE);
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        want,
        "every admitted order exactly once; clean runs {runs:#?}"
    );
    assert!(rows.values().all(|(s, _)| s == "confirmed"), "{runs:#?}");
    assert_eq!(ctx.db_stock_left(v.id).await, 0, "stock taken exactly once");
    assert!(ctx.dead_letters(v.id).await.is_empty(), "{runs:#?}");
    assert_eq!(ctx.pending(v.id).await, 0);
    ctx.cleanup().await;
}

/// The database is down for longer than five claim cycles: every run claims the entries
/// the last one released, fails, and gives them back. Their delivery counts pass any cap,
/// yet when the database returns every order lands and nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_of_many_claim_cycles_dead_letters_nothing() {
    const ORDERS: usize = 300;
    const CYCLES: usize = 8;
    let mut ctx = DrainCtx::start().await;
    let v = ctx.voucher(ORDERS as i64, ORDERS as i64).await;
    let admitted = ctx.admit(v.id, "u", ORDERS).await;

    ctx.stop_data_api().await;
    let outage_cfg = |ctx: &DrainCtx| {
        let mut cfg = ctx.drainer_config();
        cfg.batch_size = 100;
        cfg.min_idle = Duration::from_millis(300);
        cfg.max_run = Duration::from_millis(800);
        cfg.data_api.timeout = Duration::from_millis(500);
        cfg
    };
    for cycle in 0..CYCLES {
        let s = ctx.drain(outage_cfg(&ctx)).await;
        assert!(s.errors >= 1, "cycle {cycle}: {s:?}");
        assert_eq!(
            (s.inserted, s.dead_lettered),
            (0, 0),
            "cycle {cycle}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
    }
    let peak = max_deliveries(&ctx, v.id).await;
    assert!(peak > 5, "the outage must outlast any delivery cap: {peak}");
    assert!(ctx.dead_letters(v.id).await.is_empty());
    assert!(ctx.orders_in_db(v.id).await.is_empty());

    ctx.start_data_api().await;
    let runs = drain_clean(&ctx, &outage_cfg(&ctx), Duration::from_secs(30)).await;
    let rows = ctx.orders_in_db(v.id).await;
    let want: BTreeSet<i64> = admitted.iter().map(|i| i.get()).collect();
    assert_eq!(
        rows.keys().copied().collect::<BTreeSet<_>>(),
        want,
        "{runs:#?}"
    );
    assert!(rows.values().all(|(s, _)| s == "confirmed"));
    assert_eq!(ctx.db_stock_left(v.id).await, 0);
    assert!(ctx.dead_letters(v.id).await.is_empty(), "{runs:#?}");
    ctx.cleanup().await;
}

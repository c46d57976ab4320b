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

    // After the claim threshold (and the test Data API's idle-transaction rollback, which
    // frees the killed process's row lock), a fresh invocation recovers.
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

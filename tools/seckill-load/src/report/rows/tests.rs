//! The report's rows: what each comparison shows, from made-up results.

use super::*;
use crate::admission::SaleReport;
use crate::drain::fixtures::{round, run};
use crate::drain::{DrainReport, DrainRun};

#[test]
fn a_refused_baseline_reads_failed_with_the_servers_error_and_exits_3() {
    use crate::admission::SaleOptions;
    use crate::record::{Outcome, Recorder, RunMeta, merge};
    use std::time::Duration;
    let run = |variant: &str, outcome: Outcome| {
        let mut rec = Recorder::new();
        let ms = Duration::from_millis(1);
        rec.record(1, outcome, ms, ms);
        merge(RunMeta::sale(variant, 1, 1), vec![rec], ms)
    };
    let refused = "ERR Attempted to access a non local key in a cluster node script";
    let mut r = Results {
        sale: Some(SaleReport {
            options: SaleOptions {
                stock: 1,
                attempts: 1,
                users: 1,
                callers: 1,
                seed: 1,
                baseline: true,
            },
            ours: run("ours", Outcome::Admitted(7)),
            tutorial: Some(run("tutorial", Outcome::Refused(refused.into()))),
        }),
        ..Results::default()
    };
    let row = &rows(&r)[0];
    assert_eq!(row.ratio, "FAILED");
    assert_eq!(row.baseline, format!("FAILED: {refused}"));
    assert_eq!(r.failed().len(), 1);
    assert_eq!(r.exit_status(), 3);
    if let Some(s) = r.sale.as_mut() {
        s.tutorial = Some(run("tutorial", Outcome::Admitted(8)));
    }
    assert!(rows(&r)[0].ratio.ends_with('×'));
    assert_eq!(r.exit_status(), 0);
}

/// The rows the table shows for a drain whose label contains `about` (`floor`: the
/// floor rows; `1 sale`: the spread rows, each against one sale).
fn drain_rows(drain: DrainReport, about: &str) -> Vec<crate::report::Row> {
    let results = crate::report::Results {
        drain: Some(drain),
        ..crate::report::Results::default()
    };
    let rows = crate::report::rows(&results).into_iter();
    rows.filter(|r| r.what.contains(about)).collect()
}

#[test]
fn the_table_compares_the_median_round_or_an_old_report_s_one_floor_run() {
    let rounds = DrainReport {
        ours: vec![run("ours", 300.0)],
        floor_rounds: vec![round(100.0, 200.0), round(20.0, 100.0), round(90.0, 100.0)],
        ..DrainReport::default()
    };
    let rows = drain_rows(rounds, "floor");
    assert_eq!(rows.len(), 2, "{rows:?}");
    // The median round's ratio, not the sweep's best (300) against any floor.
    assert_eq!(
        (rows[0].ratio.as_str(), rows[0].met),
        ("0.50×", Some(false))
    );
    assert!(rows[0].what.contains("median of 3"), "{}", rows[0].what);
    assert!(rows[1].ours.starts_with("0.50× (100 vs 200, floor first)"));
    let old = DrainReport {
        ours: vec![run("ours", 300.0)],
        db_floor: Some(run("db-floor", 400.0)),
        ..DrainReport::default()
    };
    let rows = drain_rows(old, "floor");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].ratio.as_str(), rows[0].met), ("0.75×", Some(true)));
}

fn spread(round: usize, sales: usize, orders_per_s: f64) -> DrainRun {
    DrainRun {
        round,
        sales,
        ..run("spread", orders_per_s)
    }
}

#[test]
fn each_spread_ratio_is_taken_within_a_round_and_the_median_round_reported() {
    let drain = DrainReport {
        ours: vec![run("ours", 300.0)],
        // Ratios of 10,000 sales: 0.40, 0.60, 0.50 (round 1 ran in reverse order:
        // its runs are found by their round, not their place). A round without its
        // one-sale run counts for nothing.
        spread: vec![
            spread(0, 1, 100.0),
            spread(0, 10000, 40.0),
            spread(1, 10000, 90.0),
            spread(1, 1, 150.0),
            spread(2, 1, 80.0),
            spread(2, 10000, 40.0),
            spread(3, 10000, 10.0),
        ],
        ..DrainReport::default()
    };
    let rows = drain_rows(drain, "1 sale");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows[0].what.contains("median of 3"), "{}", rows[0].what);
    assert_eq!((rows[0].ratio.as_str(), rows[0].met), ("0.50×", Some(true)));
    assert_eq!(
        rows[1].ours,
        "0.40× (40 vs 100); 0.60× (90 vs 150); 0.50× (40 vs 80)"
    );
    // A report from before the rounds: one of each, no rounds row.
    let old = DrainReport {
        ours: vec![run("ours", 300.0)],
        spread: vec![spread(0, 1, 100.0), spread(0, 10, 95.0)],
        ..DrainReport::default()
    };
    let rows = drain_rows(old, "1 sale");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(!rows[0].what.contains("median"), "{}", rows[0].what);
    assert_eq!((rows[0].ratio.as_str(), rows[0].met), ("0.95×", Some(true)));
}

#[test]
fn the_database_s_own_work_is_shown_when_its_cpu_was_read() {
    let mut timed = round(100.0, 200.0);
    // Ours: 1,000 orders in 10 s with 3 s of database CPU (busy 30 %; at a busy
    // database 333 orders/s, 1.67x the floor's 200); the floor: 5 s in 4.5 s of CPU.
    timed.ours.db_cpu_s = Some(3.0);
    timed.floor.db_cpu_s = Some(4.5);
    let drain = DrainReport {
        ours: vec![run("ours", 300.0)],
        floor_rounds: vec![timed, round(20.0, 100.0)],
        ..DrainReport::default()
    };
    let rows = drain_rows(drain, "floor");
    let share = rows.iter().find(|r| r.what.contains("own work"));
    let share = share.expect("a row of the database's own work");
    // Only the round that read the database's CPU is listed.
    assert_eq!(
        share.ours,
        "ours 3000.0 µs, 30 %; floor 4500.0 µs, 90 %; 1.67×"
    );
    let untimed = DrainReport {
        ours: vec![run("ours", 300.0)],
        floor_rounds: vec![round(20.0, 100.0)],
        ..DrainReport::default()
    };
    assert!(
        drain_rows(untimed, "floor")
            .iter()
            .all(|r| !r.what.contains("own work"))
    );
}

#[test]
fn the_other_cpu_s_work_and_the_lower_bound_are_shown_for_pinned_rounds() {
    // Ours: 1,000 orders in 10 s, the database 3 s of CPU (bound 1.67x the floor's
    // 200/s) and the other CPU 8 s (125/s at full: 0.62x): at best 0.62x. The
    // floor's 5 s with the other CPU busy 1 s.
    let mut pinned = round(100.0, 200.0);
    pinned.ours.db_cpu_s = Some(3.0);
    pinned.ours.rest_cpu_s = Some(8.0);
    pinned.floor.db_cpu_s = Some(4.5);
    pinned.floor.rest_cpu_s = Some(1.0);
    // A round whose database bound is the lower one: 1,000 orders in 50 s, 20 s of
    // the database (50/s: 0.5x the floor's 100) and 2 s of the other CPU (5x).
    let mut db_bound = round(20.0, 100.0);
    db_bound.ours.db_cpu_s = Some(20.0);
    db_bound.ours.rest_cpu_s = Some(2.0);
    db_bound.floor.rest_cpu_s = Some(1.0);
    let drain = DrainReport {
        ours: vec![run("ours", 300.0)],
        floor_rounds: vec![round(20.0, 100.0)],
        pinned_rounds: vec![pinned, db_bound, round(50.0, 100.0)],
        ..DrainReport::default()
    };
    let rows = drain_rows(drain, "floor");
    let other = rows.iter().find(|r| r.what.contains("other CPU"));
    let other = other.expect("a row of the other CPU's work");
    // The round that read no CPU is left out.
    assert_eq!(
        other.ours,
        "ours 8000.0 µs, 80 %; floor 1000.0 µs, 20 %; 0.62×; at best 0.62×; \
         ours 2000.0 µs, 4 %; floor 1000.0 µs, 10 %; 5.00×; at best 0.50×"
    );
    let unpinned = DrainReport {
        ours: vec![run("ours", 300.0)],
        floor_rounds: vec![round(20.0, 100.0)],
        ..DrainReport::default()
    };
    assert!(
        drain_rows(unpinned, "floor")
            .iter()
            .all(|r| !r.what.contains("other CPU"))
    );
}

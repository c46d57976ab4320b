//! The drain side: `drain` (N admitted orders waiting in streams, moved into the
//! database) and the admission-to-commit latency while one drainer invocation runs.
//!
//! - **ours**: one invocation of the real drain cycle ([`order_drainer::Drainer::run`])
//!   in this process, restricted to the run's voucher (`DRAINER_VOUCHERS`), through the
//!   stack's Data API server, for each batch size of a sweep; the best one is picked.
//!   The clock stops when the stream's group has nothing undelivered or pending (every
//!   entry committed, then acked); the invocation, by then idle-polling, is dropped.
//! - **tutorial consumer**: COUNT 1 per XREADGROUP; per order one Data API transaction
//!   (count query for (user, voucher), `UPDATE ... stock_left = stock_left - 1 WHERE
//!   stock_left > 0`, INSERT, commit), then XACK; one consumer, as in the tutorial.
//! - **database floor**: multi-row INSERTs straight into MariaDB (mysql_async, no Data
//!   API), one connection. Compared in `floor_rounds` rounds, each a run of the floor
//!   and a run of ours (the sweep's best batch size) back to back, the order alternating:
//!   the floor's rate moves a lot between runs on a shared machine (and with the size of
//!   the table, which every run grows), so each ratio is taken from two neighbouring
//!   runs on the same table, and the round with the median ratio stands for the drain.
//! - **database on its own core**: the same rounds again with the stack's MariaDB pinned
//!   to one CPU and everything else to the other ([`crate::pinning`]), as production
//!   has the database on another machine; both settings are reported.
//! - **spread**: the same N orders spread evenly over 1, 10, 100 and 10,000 sales at
//!   once, one invocation of ours (the sweep's best batch size, `DRAINER_CONCURRENCY`
//!   at its default) draining them all: how the rate holds when many sales drain
//!   together. In `spread_rounds` rounds (the order reversed every other round); each
//!   size's ratio to one sale is taken within a round, and the round with the median
//!   ratio is reported, as for the floor.
//!
//! Every variant is checked afterwards: the database holds exactly the N orders, one per
//! user, and the voucher's stock went down by N.

mod baselines;
mod checks;
mod commit_latency;
mod ours;
mod results;

use order_drainer::config::defaults;

use self::baselines::{drain_floor, drain_tutorial};
use self::ours::drain_sales;
use crate::backends::Bench;
use crate::engine::Ui;

pub use self::commit_latency::commit_latency;
pub(crate) use self::ours::filled;
#[cfg(test)]
pub(crate) use self::results::fixtures;
pub use self::results::{
    CommitLatencyOptions, CommitLatencyReport, DrainOptions, DrainReport, DrainRun, FloorRound,
};

/// `count` rounds of the floor and ours side by side (numbered from `first`), the order
/// alternating.
async fn floor_rounds(
    bench: &Bench,
    o: &DrainOptions,
    best: usize,
    count: usize,
    first: usize,
    ui: &Ui,
) -> anyhow::Result<Vec<FloorRound>> {
    let mut rounds = Vec::new();
    for round in (first..first + count).take_while(|_| !ui.stopped()) {
        let floor_first = round % 2 == 0;
        let floor_run = || drain_floor(bench, o.orders, o.floor_batch, round);
        let ours_run = || drain_sales(bench, "ours", o.orders, 1, best, ui);
        let (floor, ours) = if floor_first {
            let floor = floor_run().await?;
            (floor, ours_run().await?)
        } else {
            let ours = ours_run().await?;
            (floor_run().await?, ours)
        };
        rounds.push(FloorRound {
            floor_first,
            floor,
            ours,
        });
    }
    Ok(rounds)
}

/// `drain`: the sweep of ours, then the baselines.
pub async fn drain(bench: &Bench, o: &DrainOptions, ui: &Ui) -> anyhow::Result<DrainReport> {
    anyhow::ensure!(
        o.orders >= 1 && !o.batch_sizes.is_empty() && (o.floor_rounds >= 1 || !o.baseline),
        "sizes must be positive"
    );
    let mut report = DrainReport {
        options: o.clone(),
        ..DrainReport::default()
    };
    for &b in o.batch_sizes.iter().take_while(|_| !ui.stopped()) {
        let run = drain_sales(bench, "ours", o.orders, 1, b, ui).await?;
        report.ours.push(run);
    }
    let best = report.best().map_or(defaults::BATCH_SIZE, |r| r.batch_size);
    for round in 0..o.spread_rounds.max(1) {
        // The order reversed every other round: a size run first in one round runs
        // last in the next, so no size always meets the machine fresh or tired.
        let mut sizes = o.sales.clone();
        if round % 2 == 1 {
            sizes.reverse();
        }
        for &k in sizes.iter().take_while(|_| !ui.stopped()) {
            let run = drain_sales(bench, "spread", o.orders, k, best, ui).await?;
            report.spread.push(DrainRun { round, ..run });
        }
    }
    if o.baseline && !ui.stopped() {
        report.tutorial = Some(drain_tutorial(bench, o.tutorial_orders, ui).await?);
        report.floor_rounds = floor_rounds(bench, o, best, o.floor_rounds, 0, ui).await?;
        report.db_floor = report.median_round().map(|r| r.floor.clone());
        if o.pinned_rounds > 0 && !ui.stopped() {
            match crate::pinning::pin_database() {
                Ok(pinned) => {
                    eprintln!("  drain: {}", pinned.description);
                    report.pinning = Some(pinned.description.clone());
                    // Rounds numbered on from the shared ones: each floor run writes a
                    // table of its own.
                    let first = o.floor_rounds;
                    report.pinned_rounds =
                        floor_rounds(bench, o, best, o.pinned_rounds, first, ui).await?;
                    drop(pinned);
                }
                Err(e) => {
                    eprintln!("  drain: the database was not pinned: {e}");
                    report.pinning = Some(format!("not pinned: {e}"));
                }
            }
        }
    }
    for r in report.runs() {
        let error = r
            .error
            .as_deref()
            .map_or(String::new(), |e| format!(": FAILED: {e}"));
        eprintln!(
            "  drain  {:<8} {:>3} sale(s), batch {:>5}: {:>7} orders in {:>6.2} s = {:>8.0} orders/s{error}",
            r.variant, r.sales, r.batch_size, r.orders, r.elapsed_s, r.orders_per_s
        );
    }
    Ok(report)
}

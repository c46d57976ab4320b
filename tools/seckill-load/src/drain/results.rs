//! What the drain benchmarks measure: the options of the drain and admission-to-commit
//! scenarios, each drain run, the rounds against the database floor, and the reports.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::record::{Check, Latency, RunResult};

/// Sizes of the drain scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize, clap::Args)]
pub struct DrainOptions {
    /// Orders waiting in the stream for each run of ours and for the database floor
    #[arg(long, default_value_t = 20_000)]
    pub orders: u64,
    /// `DRAINER_BATCH_SIZE` values to sweep
    #[arg(long, value_delimiter = ',', default_value = "100,250,500,1000,2000")]
    pub batch_sizes: Vec<usize>,
    /// Orders the tutorial consumer drains (it is slow; its rate is steady)
    #[arg(long, default_value_t = 3_000)]
    pub tutorial_orders: u64,
    /// Rows per INSERT of the database floor
    #[arg(long, default_value_t = 1_000)]
    pub floor_batch: usize,
    /// Rounds of the comparison with the database floor (a floor run and a run of ours
    /// side by side in each; the median round's ratio is reported)
    #[arg(long, default_value_t = 3)]
    #[serde(default = "three")]
    pub floor_rounds: usize,
    /// Rounds of the same comparison with the database on a CPU of its own (the
    /// stack's MariaDB pinned to CPU 0, everything else to CPU 1, with taskset), as
    /// production has it on another machine; 0: none
    #[arg(long, default_value_t = 3)]
    #[serde(default)]
    pub pinned_rounds: usize,
    /// Run the tutorial consumer and the database floor too.
    #[arg(skip = true)]
    pub baseline: bool,
    /// Numbers of sales the N orders are spread over, each drained by one invocation
    /// (10,000 sales of 2 orders: the shop-review app's many small sales)
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,10000")]
    #[serde(default)]
    pub sales: Vec<usize>,
    /// Rounds of those runs (each round drains one sale and every larger number of
    /// sales, in reverse order every other round); each ratio to one sale is taken
    /// within a round, and the round with the median ratio is reported (seven: with
    /// three, one slow round of the one sale in three moved the median by a fifth)
    #[arg(long, default_value_t = 7)]
    #[serde(default = "one")]
    pub spread_rounds: usize,
}

/// One drain run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainRun {
    /// `ours`, `tutorial`, `db-floor`, `spread`.
    pub variant: String,
    pub batch_size: usize,
    /// Sales the orders were spread over (1 but for `spread`).
    #[serde(default = "one")]
    pub sales: usize,
    pub orders: u64,
    pub elapsed_s: f64,
    pub orders_per_s: f64,
    /// The drainer's own summary of the invocation (ours).
    pub summary: Option<serde_json::Value>,
    pub checks: Vec<Check>,
    /// The CPU seconds the stack's MariaDB spent while the clock ran (ours and the
    /// floor; none without a local stack's MariaDB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_cpu_s: Option<f64>,
    /// The busy seconds of the CPU everything but the database is pinned to in the
    /// pinned rounds, while the clock ran (see [`crate::pinning::rest_cpu`]; kept for
    /// every run, read only for the pinned ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest_cpu_s: Option<f64>,
    /// The round of a spread run (0 for every other run, and in reports written
    /// before the spread had rounds).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: usize,
    /// Why the variant FAILED on this server (the tutorial consumer, when the server
    /// refused the tutorial's admission script that fills its stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DrainReport {
    pub options: DrainOptions,
    pub ours: Vec<DrainRun>,
    pub tutorial: Option<DrainRun>,
    /// The floor run of the median round (a report written before rounds existed: the
    /// only floor run, made after every run of ours).
    pub db_floor: Option<DrainRun>,
    /// The rounds of the comparison with the floor, in the order they ran.
    #[serde(default)]
    pub floor_rounds: Vec<FloorRound>,
    /// Ours over 1, 10, 100 sales at once.
    #[serde(default)]
    pub spread: Vec<DrainRun>,
    /// The rounds with the database on its own CPU, and what was pinned where (or why
    /// nothing was).
    #[serde(default)]
    pub pinned_rounds: Vec<FloorRound>,
    #[serde(default)]
    pub pinning: Option<String>,
}

/// A run of the database floor and a run of ours next to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorRound {
    pub floor_first: bool,
    pub floor: DrainRun,
    pub ours: DrainRun,
}

impl FloorRound {
    /// Ours over the floor.
    pub fn ratio(&self) -> f64 {
        self.ours.orders_per_s / self.floor.orders_per_s.max(1e-9)
    }

    /// Ours over the floor were the database the drain's only limit: ours at the
    /// database's CPU per order with the database busy throughout (orders / the
    /// database's CPU seconds), over the floor's measured rate. What the database's own
    /// work allows; the rest of the gap is the way to it (round trips, the drainer, Redis).
    pub fn database_bound(&self) -> Option<f64> {
        self.bound(self.ours.db_cpu_s)
    }

    /// The same for the other CPU in a pinned round: ours were Redis, the drainer and
    /// the Data API server busy throughout on their one CPU (orders / that CPU's busy
    /// seconds), over the floor's rate. With [`FloorRound::database_bound`], what a
    /// perfect overlap of the two sides would reach: the lower of the two.
    pub fn rest_bound(&self) -> Option<f64> {
        self.bound(self.ours.rest_cpu_s)
    }

    /// Ours at `busy_s` seconds of one side's work kept busy throughout (orders over
    /// those seconds), over the floor's rate.
    fn bound(&self, busy_s: Option<f64>) -> Option<f64> {
        let ours_at_full = self.ours.orders as f64 / busy_s.filter(|s| *s > 0.0)?;
        Some(ours_at_full / self.floor.orders_per_s.max(1e-9))
    }
}

/// The item with the median `ratio` (the lower middle one of an even count): the
/// round that stands for a comparison made in rounds (the floor's, the spread's).
fn median_by<T: Copy>(items: impl IntoIterator<Item = T>, ratio: impl Fn(&T) -> f64) -> Option<T> {
    let mut items: Vec<T> = items.into_iter().collect();
    items.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    items.get(items.len().saturating_sub(1) / 2).copied()
}

/// The round with the median ratio of ours to the floor.
fn median(rounds: &[FloorRound]) -> Option<&FloorRound> {
    median_by(rounds, |r| r.ratio())
}

fn one() -> usize {
    1
}

fn three() -> usize {
    3
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One round's spread runs: `sales` sales at once against one sale, both of one round.
#[derive(Debug, Clone, Copy)]
pub struct SpreadPair<'a> {
    pub single: &'a DrainRun,
    pub many: &'a DrainRun,
}

impl SpreadPair<'_> {
    /// The many sales' rate over the one sale's.
    pub fn ratio(&self) -> f64 {
        self.many.orders_per_s / self.single.orders_per_s.max(1e-9)
    }
}

/// A run's clock: its time, and the database's CPU time over the same span (see
/// [`crate::pinning::database_cpu`]).
pub(crate) struct RunClock {
    pub(crate) started: Instant,
    db_cpu: Option<f64>,
    rest_cpu: Option<f64>,
}

/// What a [`RunClock`] read when it stopped.
#[derive(Clone, Copy)]
pub(crate) struct Stopped {
    pub(crate) elapsed: Duration,
    /// The database's CPU seconds since the start; `None` without a local stack's
    /// MariaDB.
    pub(crate) db_cpu_s: Option<f64>,
    /// CPU 1's busy seconds since the start ([`crate::pinning::rest_cpu`]).
    pub(crate) rest_cpu_s: Option<f64>,
}

impl RunClock {
    pub(crate) fn start() -> RunClock {
        let db_cpu = crate::pinning::database_cpu();
        let rest_cpu = crate::pinning::rest_cpu();
        RunClock {
            started: Instant::now(),
            db_cpu,
            rest_cpu,
        }
    }

    pub(crate) fn stop(&self) -> Stopped {
        let elapsed = self.started.elapsed();
        let end = crate::pinning::database_cpu();
        let db_cpu_s = self.db_cpu.zip(end).map(|(s, e)| (e - s).max(0.0));
        let rest_end = crate::pinning::rest_cpu();
        let rest_cpu_s = self.rest_cpu.zip(rest_end).map(|(s, e)| (e - s).max(0.0));
        Stopped {
            elapsed,
            db_cpu_s,
            rest_cpu_s,
        }
    }
}

impl DrainRun {
    /// A run measured by a [`RunClock`].
    pub(crate) fn timed(
        variant: &str,
        batch_size: usize,
        sales: usize,
        orders: u64,
        stopped: Stopped,
        checks: Vec<Check>,
    ) -> DrainRun {
        DrainRun {
            db_cpu_s: stopped.db_cpu_s,
            rest_cpu_s: stopped.rest_cpu_s,
            ..DrainRun::new(variant, batch_size, sales, orders, stopped.elapsed, checks)
        }
    }

    pub(crate) fn new(
        variant: &str,
        batch_size: usize,
        sales: usize,
        orders: u64,
        elapsed: Duration,
        checks: Vec<Check>,
    ) -> DrainRun {
        DrainRun {
            variant: variant.into(),
            batch_size,
            sales,
            orders,
            elapsed_s: elapsed.as_secs_f64(),
            orders_per_s: orders as f64 / elapsed.as_secs_f64().max(1e-9),
            summary: None,
            checks,
            db_cpu_s: None,
            rest_cpu_s: None,
            round: 0,
            error: None,
        }
    }

    /// The database's CPU per order, in microseconds.
    pub fn db_cpu_per_order_us(&self) -> Option<f64> {
        self.per_order_us(self.db_cpu_s)
    }

    /// The share of the run's time the database spent on a CPU (1.0: one core busy
    /// throughout).
    pub fn db_busy(&self) -> Option<f64> {
        self.share(self.db_cpu_s)
    }

    /// CPU 1's busy time per order, in microseconds (pinned runs: everything but the
    /// database).
    pub fn rest_cpu_per_order_us(&self) -> Option<f64> {
        self.per_order_us(self.rest_cpu_s)
    }

    /// The share of the run's time CPU 1 was busy.
    pub fn rest_busy(&self) -> Option<f64> {
        self.share(self.rest_cpu_s)
    }

    /// `cpu_s` seconds of CPU per order, in microseconds.
    fn per_order_us(&self, cpu_s: Option<f64>) -> Option<f64> {
        cpu_s.map(|s| s * 1e6 / (self.orders.max(1) as f64))
    }

    /// `cpu_s` seconds of CPU as a share of the run's time.
    fn share(&self, cpu_s: Option<f64>) -> Option<f64> {
        cpu_s.map(|s| s / self.elapsed_s.max(1e-9))
    }
}

impl DrainReport {
    /// The round with the median ratio of ours to the floor (the lower middle one of
    /// an even count).
    pub fn median_round(&self) -> Option<&FloorRound> {
        median(&self.floor_rounds)
    }

    /// The median round with the database on its own CPU.
    pub fn median_pinned_round(&self) -> Option<&FloorRound> {
        median(&self.pinned_rounds)
    }

    /// The sizes of the spread runs above one sale, in the order first run.
    pub fn spread_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = Vec::new();
        for r in self.spread.iter().filter(|r| r.sales > 1) {
            if !sizes.contains(&r.sales) {
                sizes.push(r.sales);
            }
        }
        sizes
    }

    /// Every round's pair of `sales` sales against one sale (rounds missing either run
    /// are left out), and the pair with the median ratio (the lower middle one).
    pub fn spread_pairs(&self, sales: usize) -> (Vec<SpreadPair<'_>>, Option<SpreadPair<'_>>) {
        let rounds: std::collections::BTreeSet<usize> =
            self.spread.iter().map(|r| r.round).collect();
        let find = |round: usize, k: usize| {
            self.spread
                .iter()
                .find(|r| r.round == round && r.sales == k)
        };
        let pairs: Vec<SpreadPair<'_>> = rounds
            .into_iter()
            .filter_map(|round| {
                Some(SpreadPair {
                    single: find(round, 1)?,
                    many: find(round, sales)?,
                })
            })
            .collect();
        let median = median_by(pairs.iter().copied(), SpreadPair::ratio);
        (pairs, median)
    }

    /// Our fastest batch size.
    pub fn best(&self) -> Option<&DrainRun> {
        self.ours
            .iter()
            .max_by(|a, b| a.orders_per_s.total_cmp(&b.orders_per_s))
    }

    pub fn runs(&self) -> impl Iterator<Item = &DrainRun> {
        self.ours
            .iter()
            .chain(self.tutorial.iter())
            .chain(self.spread.iter())
            .chain(self.floor_rounds.iter().flat_map(|r| [&r.floor, &r.ours]))
            // A report from before the rounds: its one floor run.
            .chain(
                self.db_floor
                    .iter()
                    .filter(|_| self.floor_rounds.is_empty()),
            )
    }
}

/// Options of the admission-to-commit measurement.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct CommitLatencyOptions {
    /// Admissions per second while the drainer runs (paced)
    #[arg(long, default_value_t = 1_000.0)]
    pub rate: f64,
    /// For this long
    #[arg(long, default_value_t = 15.0)]
    pub seconds: f64,
    /// Callers of the paced admissions
    #[arg(id = "latency_callers", long = "latency-callers", default_value_t = 16)]
    pub callers: usize,
    /// DRAINER_BATCH_SIZE of the invocation (0: the drain sweep's best, else the
    /// drainer's default)
    #[arg(id = "latency_batch", long = "latency-batch", default_value_t = 0)]
    pub batch_size: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommitLatencyReport {
    pub options: CommitLatencyOptions,
    /// The paced admissions through the in-process handler.
    pub admissions: RunResult,
    pub committed: u64,
    /// Commit (the row's `created_at`, set by the INSERT inside the committing
    /// transaction) minus admission (`admitted_at`, the handler's clock), both at
    /// millisecond precision.
    pub latency: Latency,
    /// Seconds from the end of the admissions until the last order was committed.
    pub drained_after_s: f64,
    pub summary: Option<serde_json::Value>,
    pub checks: Vec<Check>,
}

/// Made-up drain runs for the unit tests here and in the report's rows.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A run of 1,000 orders at `orders_per_s`.
    pub(crate) fn run(variant: &str, orders_per_s: f64) -> DrainRun {
        let elapsed = Duration::from_secs_f64(1000.0 / orders_per_s);
        DrainRun::new(variant, 1000, 1, 1000, elapsed, Vec::new())
    }

    /// A round against the floor, the floor first.
    pub(crate) fn round(ours: f64, floor: f64) -> FloorRound {
        FloorRound {
            floor_first: true,
            floor: run("db-floor", floor),
            ours: run("ours", ours),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{round, run};
    use super::*;

    #[test]
    fn the_median_round_is_the_middle_ratio_not_the_middle_rate() {
        let report = DrainReport {
            // Ratios 0.5, 0.2, 0.9: the median is the first round, whereas the middle
            // floor rate (100) and the middle rate of ours (90) are other rounds'.
            floor_rounds: vec![round(100.0, 200.0), round(20.0, 100.0), round(90.0, 100.0)],
            ..DrainReport::default()
        };
        let m = report.median_round().expect("three rounds");
        assert!((m.ratio() - 0.5).abs() < 1e-9, "{}", m.ratio());
        assert_eq!(m.floor.orders_per_s.round(), 200.0);
        // Every round's two runs are listed (their checks count).
        assert_eq!(report.runs().count(), 6);
        let even = DrainReport {
            floor_rounds: vec![round(60.0, 100.0), round(40.0, 100.0)],
            ..DrainReport::default()
        };
        let m = even.median_round().expect("two rounds");
        assert!(
            (m.ratio() - 0.4).abs() < 1e-9,
            "the lower middle: {}",
            m.ratio()
        );
        assert!(DrainReport::default().median_round().is_none());
    }

    #[test]
    fn a_report_from_before_the_rounds_still_reads() {
        let floor = serde_json::to_value(run("db-floor", 100.0)).expect("a run");
        let old = serde_json::json!({
            "options": {"orders": 10, "batch_sizes": [5], "tutorial_orders": 1,
                        "floor_batch": 5, "baseline": true},
            "ours": [], "tutorial": null, "db_floor": floor
        });
        let report: DrainReport = serde_json::from_value(old).expect("old report");
        assert!(report.floor_rounds.is_empty() && report.median_round().is_none());
        assert_eq!(report.options.floor_rounds, 3);
        // Its one floor run is still listed, with its checks.
        let variants: Vec<&str> = report.runs().map(|r| r.variant.as_str()).collect();
        assert_eq!(variants, ["db-floor"]);
    }
}

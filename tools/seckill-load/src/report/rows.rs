//! The table of ratios of everything measured: the rows of each benchmark (sale, admit
//! path, drain, admission-to-commit, buckets, footprint) against its baseline or target.

use super::results::Results;
use super::row::Row;
use crate::admission::AdmitReport;
use crate::drain::FloorRound;
use crate::figures::{count, mib, micros, p50_p99, ratio, secs, thousands};
use crate::record::RunResult;

/// Redis's command time per admission of a run (INFO commandstats).
fn redis_us(r: &RunResult) -> Option<f64> {
    r.cpu.as_ref().and_then(|c| c.redis_command_us_per_attempt)
}

/// The table of ratios of everything measured.
pub fn rows(r: &Results) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(s) = &r.sale {
        let (o, ours) = (&s.options, &s.ours);
        if let Some(t) = &s.tutorial {
            let what = format!(
                "sale mix (S={}, A={}, U={}, C={}): ours vs tutorial admission",
                o.stock, o.attempts, o.users, o.callers
            );
            let rates = (ours.attempts_per_s, t.attempts_per_s, t.error.as_deref());
            rows.push(Row::rate(what, "attempts/s", 5.0, rates));
        }
        rows.push(Row::latency("sale", ours));
        if let Some(t) = ours.sell_out_s {
            let tutorial = s.tutorial.as_ref().filter(|t| t.error.is_none());
            let tutorial = tutorial.and_then(|t| t.sell_out_s);
            let tutorial = tutorial.map_or(String::new(), |tt| format!(" (tutorial {tt:.3} s)"));
            let ours = format!("{t:.3} s{tutorial}");
            rows.push(Row::new("sale: ours sold out after", ours));
        }
    }
    if let Some(a) = &r.admit {
        admit_rows(&mut rows, a);
    }
    if let Some(d) = &r.drain
        && let Some(best) = d.best()
    {
        let (n, b) = (d.options.orders, best.batch_size);
        if let Some(t) = &d.tutorial {
            let what = format!("drain (N={n}): ours (batch {b}) vs tutorial consumer");
            let rates = (best.orders_per_s, t.orders_per_s, t.error.as_deref());
            rows.push(Row::rate(what, "orders/s", 20.0, rates));
        }
        // The target: one sale drains at 0.6x a direct INSERT or better.
        if let Some(m) = d.median_round() {
            let what = format!(
                "drain (N={n}): ours (batch {}) vs database floor (multi-row INSERT, {} rows), median of {} side-by-side rounds",
                m.ours.batch_size,
                m.floor.batch_size,
                d.floor_rounds.len()
            );
            let rates = (m.ours.orders_per_s, m.floor.orders_per_s, None);
            rows.push(Row::rate(what, "orders/s", 0.6, rates));
            let rounds = d.floor_rounds.iter().map(|r| {
                let (o, f) = (
                    thousands(r.ours.orders_per_s),
                    thousands(r.floor.orders_per_s),
                );
                let first = if r.floor_first {
                    "floor first"
                } else {
                    "ours first"
                };
                format!("{:.2}× ({o} vs {f}, {first})", r.ratio())
            });
            let rounds: Vec<String> = rounds.collect();
            rows.push(Row::new("drain: rounds vs the floor", rounds.join("; ")));
            if let Some(text) = database_share(&d.floor_rounds) {
                rows.push(Row::new(
                    "drain: the database's own work (its CPU per order and share of the run; ours were the database busy throughout, vs the floor)",
                    text,
                ));
            }
            // As production runs it: the database on a machine (here a CPU) of its own.
            if let Some(m) = d.median_pinned_round() {
                let what = format!(
                    "drain (N={n}): ours (batch {}) vs database floor, the database on a CPU of its own (taskset), median of {} rounds",
                    m.ours.batch_size,
                    d.pinned_rounds.len()
                );
                let rates = (m.ours.orders_per_s, m.floor.orders_per_s, None);
                rows.push(Row::rate(what, "orders/s", 0.8, rates));
                let rounds: Vec<String> = d
                    .pinned_rounds
                    .iter()
                    .map(|r| {
                        format!(
                            "{:.2}× ({} vs {})",
                            r.ratio(),
                            thousands(r.ours.orders_per_s),
                            thousands(r.floor.orders_per_s)
                        )
                    })
                    .collect();
                rows.push(Row::new(
                    "drain: rounds vs the floor, database pinned",
                    rounds.join("; "),
                ));
                if let Some(text) = database_share(&d.pinned_rounds) {
                    rows.push(Row::new(
                        "drain: the database's own work, pinned rounds (its CPU per order and share of the run; ours were the database busy throughout, vs the floor)",
                        text,
                    ));
                }
                if let Some(text) = rest_share(&d.pinned_rounds) {
                    rows.push(Row::new(
                        "drain: the other CPU's work, pinned rounds (Redis, the drainer, the Data API server: its busy time per order and share of the run, ours and the floor; ours were it busy throughout, vs the floor; at best, both sides busy throughout)",
                        text,
                    ));
                }
            } else if let Some(why) = d.pinning.as_deref() {
                rows.push(Row::new("drain: database on its own CPU", why.to_string()));
            }
        } else if let Some(f) = &d.db_floor {
            // A report from before the rounds: one floor run after every run of ours.
            let what = format!(
                "drain (N={n}): ours (batch {b}) vs database floor (multi-row INSERT, {} rows)",
                f.batch_size
            );
            let rates = (best.orders_per_s, f.orders_per_s, None);
            rows.push(Row::rate(what, "orders/s", 0.6, rates));
        }
        let sweep = d
            .ours
            .iter()
            .map(|o| (o.batch_size, thousands(o.orders_per_s)));
        let sweep: Vec<String> = sweep.map(|(b, x)| format!("{b}: {x}")).collect();
        rows.push(Row::new(
            "drain: batch-size sweep (orders/s)",
            sweep.join(", "),
        ));
        for k in d.spread_sizes() {
            let (pairs, median) = d.spread_pairs(k);
            let Some(m) = median else { continue };
            let rounds = match pairs.len() {
                1 => String::new(),
                n => format!(", median of {n} side-by-side rounds"),
            };
            let what = format!(
                "drain (N={}): {k} sales at once vs 1 sale (batch {}){rounds}",
                m.many.orders, m.many.batch_size
            );
            let rates = (m.many.orders_per_s, m.single.orders_per_s, None);
            // Up to a hundred sales drain at nearly one sale's rate; thousands of tiny
            // sales (a handful of orders each) at half of it, written in groups.
            let target = if k <= 100 { 0.9 } else { 0.5 };
            rows.push(Row::rate(what, "orders/s", target, rates));
            if pairs.len() > 1 {
                let each: Vec<String> = pairs
                    .iter()
                    .map(|p| {
                        let (many, one) = (p.many.orders_per_s, p.single.orders_per_s);
                        format!(
                            "{:.2}× ({} vs {})",
                            p.ratio(),
                            thousands(many),
                            thousands(one)
                        )
                    })
                    .collect();
                rows.push(Row::new(
                    format!("drain: rounds, {k} sales vs 1 sale"),
                    each.join("; "),
                ));
            }
        }
    }
    if let Some(l) = &r.commit_latency {
        let what = format!(
            "admission-to-commit latency p50 / p99 ({} admissions at {}/s, one drainer invocation)",
            l.committed, l.options.rate
        );
        let [p50, p99] = [l.latency.p50_us, l.latency.p99_us].map(secs);
        let ours = format!("{p50:.3} / {p99:.3} s");
        let met = l.latency.p99_us <= 2_000_000 && l.committed > 0;
        rows.push(Row::new(what, ours).target("p99 ≤ 2 s".into(), Some(met)));
    }
    if let Some(b) = &r.buckets {
        bucket_rows(&mut rows, b);
    }
    for b in r.footprint.iter().flat_map(|f| &f.binaries) {
        let what = format!(
            "{}: release binary size / peak RSS ({})",
            b.name, b.workload
        );
        let (size, peak) = (b.size_bytes as f64 / 1048576.0, mib(b.peak_rss_kib));
        rows.push(Row::new(what, format!("{size:.1} MiB / {peak}")));
    }
    rows
}

/// The rows of one hot voucher over stock buckets.
fn bucket_rows(rows: &mut Vec<Row>, b: &crate::buckets::BucketsReport) {
    let one = b.runs.iter().find(|x| x.buckets == 1);
    for x in &b.runs {
        let what = format!(
            "buckets k={}: Redis command time per admission, and admissions/s",
            x.buckets
        );
        let ours = format!(
            "{}, {} /s",
            micros(x.us_per_admission),
            thousands(x.run.attempts_per_s)
        );
        let row = Row::new(what, ours);
        rows.push(match one.filter(|o| o.buckets != x.buckets) {
            Some(o) => row.vs(
                format!("k=1: {}", micros(o.us_per_admission)),
                format!("{:.2}×", x.us_per_admission / o.us_per_admission.max(1e-9)),
            ),
            None => row,
        });
        let nodes = x.node_us.len();
        if x.buckets > 1 && nodes > 1 {
            let (hi, lo) = x.spread_pct;
            let what = format!(
                "buckets k={}: busiest / idlest of the {} primaries it can load vs an even split",
                x.buckets,
                nodes.min(usize::from(x.buckets))
            );
            let met = hi <= 15.0 && lo >= -15.0;
            rows.push(
                Row::new(what, format!("{hi:+.1} % / {lo:+.1} %"))
                    .target("within ±15 %".into(), Some(met)),
            );
        }
    }
    if let Some(s) = &b.sale {
        let what = format!(
            "bucket sale ({} units, {} buckets, {} attempts): sold_out answers while units were left",
            s.stock.unwrap_or(0),
            b.options.counts.iter().max().copied().unwrap_or(1),
            s.completed
        );
        rows.push(
            Row::new(what, s.early_sold_out.to_string())
                .target("0".into(), Some(s.early_sold_out == 0)),
        );
    }
    if let Some(x) = &b.sale_borrowing {
        rows.push(
            Row::new(
                "bucket sale: Redis calls per borrowing attempt (mean / max; attempts; stopped on the budget)",
                format!(
                    "{:.1} / {}; {} attempts; {} stopped",
                    x.mean_calls, x.max_calls, x.attempts, x.spent
                ),
            )
            .target(
                format!("max <= {}", x.budget),
                Some(x.max_calls <= u64::from(x.budget)),
            ),
        );
    }
    if let (Some(e1), Some(c1), Some(c16)) = (
        b.ecpu_per_admission(1),
        b.ceiling(1),
        b.ceiling(*crate::buckets::CEILING_BUCKETS.end()),
    ) {
        rows.push(Row::new(
            "ceiling on paper, ElastiCache Serverless, one voucher (30,000 ECPU/s per slot; ECPU per admission = its Redis CPU / a SET's)",
            format!(
                "{e1:.1} ECPU/admission: k=1 {} /s … k=16 {} /s",
                thousands(c1),
                thousands(c16)
            ),
        ));
    }
}

/// The admit path's rows.
fn admit_rows(rows: &mut Vec<Row>, a: &AdmitReport) {
    let (o, ours) = (&a.options, &a.ours);
    let title = |b: &str| {
        format!(
            "admit path (A={}, C={}, median of {}): ours vs {b}",
            o.attempts, o.callers, o.rounds
        )
    };
    if let Some(t) = &a.tutorial {
        let rates = (ours.attempts_per_s, t.attempts_per_s, t.error.as_deref());
        let what = title("tutorial admission");
        rows.push(Row::rate(what, "admissions/s", 1.0, rates));
    }
    if let Some(f) = &a.floor {
        let rates = (ours.attempts_per_s, f.attempts_per_s, None);
        let what = title("floor (no-op EVALSHA)");
        rows.push(Row::rate(what, "calls/s", 0.6, rates));
    }
    if let Some(ours_us) = redis_us(ours) {
        for (name, other) in [("tutorial admission", &a.tutorial), ("floor", &a.floor)] {
            let what = format!(
                "admit path, Redis command time per admission (INFO commandstats): ours vs {name}; the ratio is how many more admissions one Redis core executes with ours"
            );
            let row = Row::new(what, micros(ours_us));
            if let Some(e) = other.as_ref().and_then(|r| r.error.as_deref()) {
                rows.push(row.failed(e));
            } else if let Some(base_us) = other.as_ref().and_then(redis_us) {
                rows.push(row.vs(micros(base_us), ratio(base_us, ours_us)));
            }
        }
        let runs = [
            ("ours", Some(ours)),
            ("ours without the handler", a.ours_adapter.as_ref()),
            ("tutorial", a.tutorial.as_ref()),
            ("floor", a.floor.as_ref()),
            ("ours durable", a.ours_durable.as_ref()),
        ];
        let parts: Vec<String> = runs
            .into_iter()
            .filter_map(|(n, r)| {
                let cpu = r.filter(|r| r.error.is_none())?.cpu.as_ref()?;
                Some(format!("{n} {}", micros(cpu.process_us_per_attempt)))
            })
            .collect();
        rows.push(Row::new(
            "admit path, CPU per attempt of the calling process (callers + in-process handlers)",
            parts.join(", "),
        ));
    }
    let per_s = |r: &RunResult| format!("{} admissions/s", thousands(r.attempts_per_s));
    if let Some(ad) = &a.ours_adapter {
        let what = "admit path: ours through the handler vs ours without it (adapter only)";
        let x = ratio(ours.attempts_per_s, ad.attempts_per_s);
        rows.push(Row::new(what, per_s(ours)).vs(per_s(ad), x));
    }
    rows.push(Row::latency("admit", ours));
    // Durable admissions against ours in the same run: the ratios are durable /
    // asynchronous, so a throughput ratio below 1 and latency ratios above 1 are what
    // waiting for a replica costs.
    let Some(d) = &a.ours_durable else {
        return;
    };
    let what = |m: &str| {
        format!("admit path, {m}: ours with durable admissions (REDIS_DURABLE_REPLICAS=1) vs ours")
    };
    let x = ratio(d.attempts_per_s, ours.attempts_per_s);
    rows.push(Row::new(what("throughput"), per_s(d)).vs(per_s(ours), x));
    let (dl, ol) = (&d.latency, &ours.latency);
    let x = |d: u64, o: u64| ratio(d as f64, o.max(1) as f64);
    let x = format!("{} / {}", x(dl.p50_us, ol.p50_us), x(dl.p99_us, ol.p99_us));
    rows.push(Row::new(what("latency p50 / p99"), p50_p99(dl)).vs(p50_p99(ol), x));
    if let (Some(du), Some(ou)) = (redis_us(d), redis_us(ours)) {
        let what = what("Redis command time per admission (INFO commandstats, every primary)");
        rows.push(Row::new(what, micros(du)).vs(micros(ou), ratio(du, ou)));
    }
    let unconfirmed = d.outcomes.get("unavailable").copied().unwrap_or(0);
    rows.push(Row::new(
        "admit path, ours with durable admissions: answered 503 unavailable (a replica did not acknowledge in time)",
        format!("{} of {}", count(unconfirmed), count(d.completed)),
    ));
}

/// Per round, what the database itself did: its CPU per order and how busy it was in
/// ours and in the floor, and ours over the floor were the database busy throughout
/// ([`FloorRound::database_bound`]); `None` when no round knows the database's CPU.
fn database_share(rounds: &[FloorRound]) -> Option<String> {
    let parts: Vec<String> = rounds
        .iter()
        .filter_map(|r| {
            let (o, f) = (&r.ours, &r.floor);
            Some(format!(
                "ours {:.1} µs, {:.0} %; floor {:.1} µs, {:.0} %; {:.2}×",
                o.db_cpu_per_order_us()?,
                o.db_busy()? * 100.0,
                f.db_cpu_per_order_us()?,
                f.db_busy()? * 100.0,
                r.database_bound()?
            ))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Per pinned round, what the other CPU did (Redis, the drainer, the Data API server):
/// its busy time per order and share of the run in ours and in the floor, ours over
/// the floor were it busy throughout ([`FloorRound::rest_bound`]), and the lower of
/// that and the database's bound: what a perfect overlap of the two sides would reach.
fn rest_share(rounds: &[FloorRound]) -> Option<String> {
    let parts: Vec<String> = rounds
        .iter()
        .filter_map(|r| {
            let (o, f) = (&r.ours, &r.floor);
            let rest = r.rest_bound()?;
            let best = r.database_bound().map_or(rest, |db| db.min(rest));
            Some(format!(
                "ours {:.1} µs, {:.0} %; floor {:.1} µs, {:.0} %; {:.2}×; at best {:.2}×",
                o.rest_cpu_per_order_us()?,
                o.rest_busy()? * 100.0,
                f.rest_cpu_per_order_us()?,
                f.rest_busy()? * 100.0,
                rest,
                best
            ))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::admission::SaleReport;
    use crate::drain::{DrainReport, DrainRun, FloorRound};

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

    fn run(variant: &str, orders_per_s: f64) -> DrainRun {
        let elapsed = Duration::from_secs_f64(1000.0 / orders_per_s);
        DrainRun::new(variant, 1000, 1, 1000, elapsed, Vec::new())
    }

    fn round(ours: f64, floor: f64) -> FloorRound {
        FloorRound {
            floor_first: true,
            floor: run("db-floor", floor),
            ours: run("ours", ours),
        }
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
}

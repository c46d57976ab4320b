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
mod tests;

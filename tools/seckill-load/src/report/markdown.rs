//! The generated part of `docs/benchmarks.md`: when and where the run measured, the
//! table of ratios, the sale's chart, and the details of every run.

use std::fmt::Write as _;

use super::results::Results;
use super::row::Row;
use crate::figures::{count, mib, ms, p50_p99, secs, thousands};

/// The generated part of `docs/benchmarks.md`: when, where, the table, the chart and the
/// details of every run.
pub fn results_markdown(r: &Results, rows: &[Row], svg_link: &str) -> String {
    let mut s = format!(
        "Measured {} – {} with `{}`.\n\n",
        r.started_at, r.finished_at, r.command
    );
    let _ = writeln!(s, "- machine at the start: {}", r.machine_before.describe());
    if let Some(m) = &r.machine_after {
        let _ = writeln!(s, "- machine at the end: {}", m.describe());
    }
    s.push_str("\n| measurement | ours | baseline | ratio | target | met |\n|---|---:|---:|---:|---|:-:|\n");
    for r in rows {
        let met = r.met.map_or("", |met| if met { "yes" } else { "**no**" });
        let (what, ours, base, ratio) = (&r.what, &r.ours, &r.baseline, &r.ratio);
        let _ = writeln!(
            s,
            "| {what} | {ours} | {base} | {ratio} | {} | {met} |",
            r.target
        );
    }
    s.push('\n');
    if r.sale.is_some() {
        let _ = writeln!(s, "![the sale's timeline]({svg_link})\n");
    }
    s.push_str("<details><summary>every run</summary>\n\n");
    s.push_str("| scenario | variant | callers | attempts | elapsed | per second | admitted | outcomes | p50 | p90 | p99 | p99.9 | max |\n|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
    for x in r.runs() {
        let outcomes = x.outcomes.iter().map(|(k, v)| format!("{k} {}", count(*v)));
        let l = &x.latency;
        let mut cells = vec![
            x.scenario.clone(),
            x.variant.clone(),
            x.callers.to_string(),
            count(x.completed),
            format!("{:.2} s", x.elapsed_s),
            thousands(x.attempts_per_s),
            count(x.admitted),
            outcomes.collect::<Vec<_>>().join(", "),
        ];
        let lat = [l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us];
        cells.extend(lat.map(|us| format!("{:.2} ms", ms(us))));
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    if let Some(a) = r.admit.as_ref().filter(|a| a.rounds.len() > 1) {
        s.push_str("\nadmit rounds (per second):\n\n");
        for (i, round) in a.rounds.iter().enumerate() {
            let parts = round.iter().map(|(v, x)| format!("{v} {}", thousands(*x)));
            let parts = parts.collect::<Vec<_>>().join(", ");
            let _ = writeln!(s, "- round {}: {parts}", i + 1);
        }
    }
    if let Some(d) = &r.drain {
        s.push_str("\n| drain | sales | batch | orders | elapsed | orders/s |\n|---|---:|---:|---:|---:|---:|\n");
        for x in d.runs() {
            let (orders, per_s) = (count(x.orders), thousands(x.orders_per_s));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {orders} | {:.2} s | {per_s} |",
                x.variant, x.sales, x.batch_size, x.elapsed_s
            );
        }
    }
    if let Some(l) = &r.commit_latency {
        let (o, lat, drained) = (&l.options, &l.latency, l.drained_after_s);
        let [p50, p90, p99, max] = [lat.p50_us, lat.p90_us, lat.p99_us, lat.max_us].map(secs);
        let _ = writeln!(
            s,
            "\nadmission-to-commit: {} admissions at {}/s for {} s from {} callers, one drainer invocation with batch {}: p50 {p50:.3} s, p90 {p90:.3} s, p99 {p99:.3} s, max {max:.3} s; the stream was empty {drained:.2} s after the last admission.",
            count(l.committed),
            o.rate,
            o.seconds,
            o.callers,
            o.batch_size
        );
    }
    if let Some(b) = &r.buckets {
        s.push_str("\n| buckets | admissions/s | server µs/admission | server time per node |\n|---:|---:|---:|---|\n");
        for x in &b.runs {
            let total: f64 = x.node_us.values().sum();
            let nodes: Vec<String> = x
                .node_us
                .iter()
                .map(|(n, us)| format!("{n} {:.0} %", us / total.max(1e-9) * 100.0))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} | {} |",
                x.buckets,
                thousands(x.run.attempts_per_s),
                x.us_per_admission,
                nodes.join(", ")
            );
        }
        if let Some(set) = b.set_us {
            let _ = writeln!(
                s,
                "\nCeiling on paper for one voucher on ElastiCache Serverless: a slot serves at most 30,000 ECPU/s (AWS, {}); a SET sent alone cost Redis {set:.2} µs of CPU here, network I/O included (1 ECPU), so an admission of the run with the fewest buckets costs its Redis CPU / {set:.2} µs = {} ECPU, and k buckets in k slots give k times one slot's ceiling:\n",
                crate::buckets::ECPU_PER_SLOT_SOURCE,
                b.ecpu_per_admission(1)
                    .map_or("?".into(), |e| format!("{e:.1}"))
            );
            s.push_str(
                "| buckets | ECPU per admission | admissions/s per voucher |\n|---:|---:|---:|\n",
            );
            for k in crate::buckets::CEILING_BUCKETS {
                if let (Some(e), Some(c)) = (b.ecpu_per_admission(k), b.ceiling(k)) {
                    let _ = writeln!(s, "| {k} | {e:.1} | {} |", thousands(c));
                }
            }
        }
        if let Some(us) = b.redis_us_per_admission() {
            let primaries = crate::buckets::NODE_PRIMARIES;
            let _ = writeln!(
                s,
                "\nOn a node-based cluster of n primaries (self-designed, cluster mode), on paper: one primary's Redis thread at full CPU takes 1 s / {us:.2} µs (Redis CPU per admission measured here, network I/O included) = {} admissions/s, and a voucher of k buckets spreads its buyers evenly over them, so the primary holding the most of its buckets (ceil(k / n), the placement splitting them as evenly as they divide) saturates first: k / ceil(k / n) primaries' worth. A faster or slower CPU scales every cell:\n",
                thousands(1e6 / us)
            );
            let head: Vec<String> = primaries.iter().map(|n| format!("n = {n}")).collect();
            let _ = writeln!(s, "| buckets | {} |", head.join(" | "));
            let _ = writeln!(s, "|---:|{}", "---:|".repeat(primaries.len()));
            for k in crate::buckets::CEILING_BUCKETS {
                let cells: Vec<String> = primaries
                    .iter()
                    .map(|&n| b.node_ceiling(k, n).map_or("?".into(), thousands))
                    .collect();
                let _ = writeln!(s, "| {k} | {} |", cells.join(" | "));
            }
        }
    }
    if let Some(f) = &r.footprint {
        s.push_str("\n| function (release) | size | peak RSS | RSS at the end | workload | invocations/s | latency p50 / p99 |\n|---|---:|---:|---:|---|---:|---:|\n");
        for b in &f.binaries {
            let _ = writeln!(
                s,
                "| {} | {:.2} MiB | {} | {} | {} | {} | {} |",
                b.name,
                b.size_bytes as f64 / 1048576.0,
                mib(b.peak_rss_kib),
                mib(b.rss_kib),
                b.workload,
                b.invocations_per_s.map_or(String::new(), thousands),
                b.latency.as_ref().map_or(String::new(), p50_p99)
            );
        }
    }
    let checks = r.checks();
    let bad: Vec<_> = checks.iter().filter(|(_, c)| !c.ok).collect();
    let see_below = if bad.is_empty() { "" } else { " — SEE BELOW" };
    let (held, total) = (checks.len() - bad.len(), checks.len());
    let _ = writeln!(s, "\nInvariant checks: {held} of {total} held{see_below}.");
    for (run, c) in bad {
        let _ = writeln!(s, "- **violated** in {run}: {}: {}", c.name, c.detail);
    }
    for (run, e) in r.failed() {
        let _ = writeln!(s, "\nBaseline **FAILED** on this server: {run}: {e}");
    }
    s.push_str("\n</details>\n");
    s
}

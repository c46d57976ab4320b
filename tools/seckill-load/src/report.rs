//! The results of a benchmark run: the JSON document, the machine it ran on, the printed
//! summary of each variant and the table of ratios (plain text and Markdown).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::admission::{AdmitReport, SaleReport};
use crate::drain::{CommitLatencyReport, DrainReport};
use crate::footprint::FootprintReport;
use crate::record::{Check, RunResult};

/// Everything one invocation of the tool measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    pub tool: String,
    pub command: String,
    pub started_at: String,
    pub finished_at: String,
    pub machine_before: Machine,
    pub machine_after: Option<Machine>,
    pub sale: Option<SaleReport>,
    pub admit: Option<AdmitReport>,
    pub drain: Option<DrainReport>,
    pub commit_latency: Option<CommitLatencyReport>,
    pub footprint: Option<FootprintReport>,
}

impl Results {
    /// Every invariant check of every run, with the run it belongs to.
    pub fn checks(&self) -> Vec<(String, Check)> {
        let mut runs: Vec<&RunResult> = Vec::new();
        if let Some(s) = &self.sale {
            runs.push(&s.ours);
            runs.extend(s.tutorial.iter());
        }
        if let Some(a) = &self.admit {
            runs.push(&a.ours);
            runs.extend(a.ours_adapter.iter());
            runs.extend(a.tutorial.iter());
            runs.extend(a.floor.iter());
        }
        if let Some(l) = &self.commit_latency {
            runs.push(&l.admissions);
        }
        let mut out: Vec<(String, Check)> = runs
            .iter()
            .flat_map(|r| {
                r.checks
                    .iter()
                    .map(move |c| (format!("{} {}", r.scenario, r.variant), c.clone()))
            })
            .collect();
        if let Some(d) = &self.drain {
            for r in d.runs() {
                for c in &r.checks {
                    out.push((
                        format!("drain {} (batch {})", r.variant, r.batch_size),
                        c.clone(),
                    ));
                }
            }
        }
        if let Some(l) = &self.commit_latency {
            for c in &l.checks {
                out.push(("commit-latency".to_string(), c.clone()));
            }
        }
        out
    }

    /// True when every invariant held.
    pub fn all_ok(&self) -> bool {
        self.checks().iter().all(|(_, c)| c.ok)
    }
}

/// The machine and how busy it was.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    pub at: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_gib: f64,
    pub mem_available_gib: f64,
    pub loadavg: [f64; 3],
    /// Compiler and linker processes running (other builds share the CPUs).
    pub builders: usize,
    pub kernel: String,
    pub redis_version: Option<String>,
    pub mariadb_version: Option<String>,
}

impl Machine {
    /// Reads /proc (Linux).
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib = |key: &str| -> f64 {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let mut l = load
            .split_whitespace()
            .take(3)
            .map(|v| v.parse::<f64>().unwrap_or(0.0));
        Machine {
            at: now_rfc3339(),
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            mem_total_gib: kib("MemTotal:") / 1048576.0,
            mem_available_gib: kib("MemAvailable:") / 1048576.0,
            loadavg: [
                l.next().unwrap_or(0.0),
                l.next().unwrap_or(0.0),
                l.next().unwrap_or(0.0),
            ],
            builders: count_builders(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            redis_version: None,
            mariadb_version: None,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} × {}, {:.1} GiB RAM ({:.1} GiB available), Linux {}, load average {:.2} / {:.2} / {:.2}, {} compiler/linker processes running{}{}",
            self.nproc,
            self.cpu_model,
            self.mem_total_gib,
            self.mem_available_gib,
            self.kernel,
            self.loadavg[0],
            self.loadavg[1],
            self.loadavg[2],
            self.builders,
            self.redis_version
                .as_ref()
                .map_or(String::new(), |v| format!(", Redis {v}")),
            self.mariadb_version
                .as_ref()
                .map_or(String::new(), |v| format!(", MariaDB {v}")),
        )
    }
}

/// Processes named like compilers or linkers (rustc, cc1, ld, ...).
fn count_builders() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .filter(|c| {
            matches!(
                c.trim(),
                "rustc" | "cc1" | "cc1plus" | "ld" | "ld.lld" | "collect2" | "cc" | "clang"
            )
        })
        .count()
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The printed summary of one variant.
pub fn summary(r: &RunResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} / {} ({}, {} callers): {} of {} attempts in {:.2} s = {:.0} attempts/s",
        r.scenario,
        r.variant,
        r.target,
        r.callers,
        r.completed,
        r.planned,
        r.elapsed_s,
        r.attempts_per_s
    );
    let codes: Vec<String> = r.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        s,
        "  admitted {}{}; outcomes: {}",
        r.admitted,
        r.stock
            .map_or(String::new(), |st| format!(" of stock {st}")),
        codes.join(", ")
    );
    let l = &r.latency;
    let _ = writeln!(
        s,
        "  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        ms(l.p50_us),
        ms(l.p90_us),
        ms(l.p99_us),
        ms(l.p999_us),
        ms(l.max_us)
    );
    if let Some(t) = r.sell_out_s {
        let _ = writeln!(s, "  sold out after {t:.3} s");
    }
    if let Some(c) = &r.cpu {
        let _ = writeln!(
            s,
            "  CPU per attempt: Redis {} (executing commands {}), this process {:.1} µs",
            c.redis_us_per_attempt
                .map_or("n/a".to_string(), |u| format!("{u:.1} µs")),
            c.redis_command_us_per_attempt
                .map_or("n/a".to_string(), |u| format!("{u:.1} µs")),
            c.process_us_per_attempt
        );
    }
    for f in &r.failure_samples {
        let _ = writeln!(s, "  failure: {f}");
    }
    for c in &r.checks {
        let _ = writeln!(
            s,
            "  [{}] {}: {}",
            if c.ok { "ok" } else { "VIOLATED" },
            c.name,
            c.detail
        );
    }
    s
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// One row of the ratio table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub what: String,
    pub ours: String,
    pub baseline: String,
    pub ratio: String,
    pub target: String,
    /// `None`: nothing to compare with a target.
    pub met: Option<bool>,
}

fn ratio_row(what: &str, ours: f64, base: f64, unit: &str, target: f64) -> Row {
    let ratio = if base > 0.0 { ours / base } else { f64::NAN };
    Row {
        what: what.into(),
        ours: format!("{} {unit}", thousands(ours)),
        baseline: format!("{} {unit}", thousands(base)),
        ratio: format!("{ratio:.2}×"),
        target: format!("≥ {target}×"),
        met: Some(ratio >= target),
    }
}

fn value_row(what: &str, value: String, target: &str, met: Option<bool>) -> Row {
    Row {
        what: what.into(),
        ours: value,
        baseline: String::new(),
        ratio: String::new(),
        target: target.into(),
        met,
    }
}

/// The table of ratios of everything measured.
pub fn rows(r: &Results) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(s) = &r.sale {
        if let Some(t) = &s.tutorial {
            rows.push(ratio_row(
                &format!(
                    "sale mix (S={}, A={}, U={}, C={}): ours vs tutorial admission",
                    s.options.stock, s.options.attempts, s.options.users, s.options.callers
                ),
                s.ours.attempts_per_s,
                t.attempts_per_s,
                "attempts/s",
                5.0,
            ));
        }
        rows.push(value_row(
            &format!("sale: ours ({}) latency p50 / p99", s.ours.target),
            format!(
                "{:.2} / {:.2} ms",
                ms(s.ours.latency.p50_us),
                ms(s.ours.latency.p99_us)
            ),
            "p99 ≤ 5 ms",
            Some(s.ours.latency.p99_us <= 5_000),
        ));
        if let Some(t) = s.ours.sell_out_s {
            rows.push(value_row(
                "sale: ours sold out after",
                format!(
                    "{:.3} s{}",
                    t,
                    s.tutorial
                        .as_ref()
                        .and_then(|t| t.sell_out_s)
                        .map_or(String::new(), |tt| format!(" (tutorial {tt:.3} s)"))
                ),
                "",
                None,
            ));
        }
    }
    if let Some(a) = &r.admit {
        let title = |b: &str| {
            format!(
                "admit path (A={}, C={}, median of {}): ours vs {b}",
                a.options.attempts, a.options.callers, a.options.rounds
            )
        };
        if let Some(t) = &a.tutorial {
            rows.push(ratio_row(
                &title("tutorial admission"),
                a.ours.attempts_per_s,
                t.attempts_per_s,
                "admissions/s",
                1.0,
            ));
        }
        if let Some(f) = &a.floor {
            rows.push(ratio_row(
                &title("floor (no-op EVALSHA)"),
                a.ours.attempts_per_s,
                f.attempts_per_s,
                "calls/s",
                0.6,
            ));
        }
        let redis_us = |r: &RunResult| r.cpu.as_ref().and_then(|c| c.redis_command_us_per_attempt);
        if let Some(ours_us) = redis_us(&a.ours) {
            for (name, other) in [("tutorial admission", &a.tutorial), ("floor", &a.floor)] {
                if let Some(base_us) = other.as_ref().and_then(redis_us) {
                    rows.push(Row {
                        what: format!(
                            "admit path, Redis command time per admission (INFO commandstats): ours vs {name}; the ratio is how many more admissions one Redis core executes with ours"
                        ),
                        ours: format!("{ours_us:.1} µs"),
                        baseline: format!("{base_us:.1} µs"),
                        ratio: format!("{:.2}×", base_us / ours_us.max(1e-9)),
                        target: String::new(),
                        met: None,
                    });
                }
            }
            let proc_us = |r: &RunResult| r.cpu.as_ref().map(|c| c.process_us_per_attempt);
            let parts: Vec<String> = [
                Some(("ours", &a.ours)),
                a.ours_adapter
                    .as_ref()
                    .map(|r| ("ours without the handler", r)),
                a.tutorial.as_ref().map(|r| ("tutorial", r)),
                a.floor.as_ref().map(|r| ("floor", r)),
            ]
            .into_iter()
            .flatten()
            .filter_map(|(n, r)| proc_us(r).map(|u| format!("{n} {u:.1} µs")))
            .collect();
            rows.push(value_row(
                "admit path, CPU per attempt of the calling process (callers + in-process handlers)",
                parts.join(", "),
                "",
                None,
            ));
        }
        if let Some(ad) = &a.ours_adapter {
            rows.push(Row {
                what: "admit path: ours through the handler vs ours without it (adapter only)"
                    .into(),
                ours: format!("{} admissions/s", thousands(a.ours.attempts_per_s)),
                baseline: format!("{} admissions/s", thousands(ad.attempts_per_s)),
                ratio: format!(
                    "{:.2}×",
                    a.ours.attempts_per_s / ad.attempts_per_s.max(1e-9)
                ),
                target: String::new(),
                met: None,
            });
        }
        rows.push(value_row(
            &format!("admit: ours ({}) latency p50 / p99", a.ours.target),
            format!(
                "{:.2} / {:.2} ms",
                ms(a.ours.latency.p50_us),
                ms(a.ours.latency.p99_us)
            ),
            "p99 ≤ 5 ms",
            Some(a.ours.latency.p99_us <= 5_000),
        ));
    }
    if let Some(d) = &r.drain
        && let Some(best) = d.best()
    {
        if let Some(t) = &d.tutorial {
            rows.push(ratio_row(
                &format!(
                    "drain (N={}): ours (batch {}) vs tutorial consumer",
                    d.options.orders, best.batch_size
                ),
                best.orders_per_s,
                t.orders_per_s,
                "orders/s",
                20.0,
            ));
        }
        if let Some(f) = &d.db_floor {
            rows.push(ratio_row(
                &format!(
                    "drain (N={}): ours (batch {}) vs database floor (multi-row INSERT, {} rows)",
                    d.options.orders, best.batch_size, f.batch_size
                ),
                best.orders_per_s,
                f.orders_per_s,
                "orders/s",
                0.5,
            ));
        }
        let sweep: Vec<String> = d
            .ours
            .iter()
            .map(|o| format!("{}: {}", o.batch_size, thousands(o.orders_per_s)))
            .collect();
        rows.push(value_row(
            "drain: batch-size sweep (orders/s)",
            sweep.join(", "),
            "",
            None,
        ));
        if let Some(single) = d.spread.iter().find(|r| r.sales == 1) {
            for many in d.spread.iter().filter(|r| r.sales > 1) {
                rows.push(ratio_row(
                    &format!(
                        "drain (N={}): {} sales at once vs 1 sale (batch {})",
                        many.orders, many.sales, many.batch_size
                    ),
                    many.orders_per_s,
                    single.orders_per_s,
                    "orders/s",
                    0.5,
                ));
            }
        }
    }
    if let Some(l) = &r.commit_latency {
        rows.push(value_row(
            &format!(
                "admission-to-commit latency p50 / p99 ({} admissions at {}/s, one drainer invocation)",
                l.committed, l.options.rate
            ),
            format!("{:.3} / {:.3} s", l.latency.p50_us as f64 / 1e6, l.latency.p99_us as f64 / 1e6),
            "p99 ≤ 2 s",
            Some(l.latency.p99_us <= 2_000_000 && l.committed > 0),
        ));
    }
    if let Some(f) = &r.footprint {
        for b in &f.binaries {
            rows.push(value_row(
                &format!(
                    "{}: release binary size / peak RSS ({})",
                    b.name, b.workload
                ),
                format!(
                    "{:.1} MiB / {}",
                    b.size_bytes as f64 / 1048576.0,
                    b.peak_rss_kib.map_or("n/a".to_string(), |k| format!(
                        "{:.1} MiB",
                        k as f64 / 1024.0
                    ))
                ),
                "",
                None,
            ));
        }
    }
    rows
}

/// The ratio table as Markdown.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| measurement | ours | baseline | ratio | target | met |\n|---|---:|---:|---:|---|:-:|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.what,
            r.ours,
            r.baseline,
            r.ratio,
            r.target,
            match r.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "",
            }
        );
    }
    s
}

/// The ratio table as aligned plain text.
pub fn text_table(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let met = match r.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        };
        let _ = writeln!(s, "{}", r.what);
        if r.baseline.is_empty() {
            let _ = writeln!(s, "    {:<40} {:>10} {}", r.ours, r.target, met);
        } else {
            let target = if r.target.is_empty() {
                String::new()
            } else {
                format!("   (target {})", r.target)
            };
            let _ = writeln!(
                s,
                "    {} vs {} = {}{target} {}",
                r.ours, r.baseline, r.ratio, met
            );
        }
    }
    s
}

/// 12345.6 → "12,346".
pub fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let n = v.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Outcome counts as "a 1, b 2".
pub fn outcomes_line(o: &BTreeMap<String, u64>) -> String {
    o.iter()
        .map(|(k, v)| format!("{k} {}", thousands(*v as f64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The generated part of `docs/benchmarks.md`: when, where, the table, the chart and the
/// details of every run.
pub fn results_markdown(r: &Results, rows: &[Row], svg_link: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Measured {} – {} with `{}`.\n",
        r.started_at, r.finished_at, r.command
    );
    let _ = writeln!(s, "- machine at the start: {}", r.machine_before.describe());
    if let Some(m) = &r.machine_after {
        let _ = writeln!(s, "- machine at the end: {}", m.describe());
    }
    let _ = writeln!(s, "\n{}", markdown_table(rows));
    if r.sale.is_some() {
        let _ = writeln!(s, "![the sale's timeline]({svg_link})\n");
    }
    let _ = writeln!(s, "<details><summary>every run</summary>\n");
    let _ = writeln!(
        s,
        "| scenario | variant | callers | attempts | elapsed | per second | admitted | outcomes | p50 | p90 | p99 | p99.9 | max |\n|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
    );
    let mut runs: Vec<&RunResult> = Vec::new();
    if let Some(x) = &r.sale {
        runs.push(&x.ours);
        runs.extend(x.tutorial.iter());
    }
    if let Some(x) = &r.admit {
        runs.push(&x.ours);
        runs.extend(x.ours_adapter.iter());
        runs.extend(x.tutorial.iter());
        runs.extend(x.floor.iter());
    }
    if let Some(x) = &r.commit_latency {
        runs.push(&x.admissions);
    }
    for x in runs {
        let l = &x.latency;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} s | {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            x.scenario,
            x.variant,
            x.callers,
            thousands(x.completed as f64),
            x.elapsed_s,
            thousands(x.attempts_per_s),
            thousands(x.admitted as f64),
            outcomes_line(&x.outcomes),
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us)
        );
    }
    if let Some(a) = &r.admit
        && a.rounds.len() > 1
    {
        let _ = writeln!(s, "\nadmit rounds (per second):\n");
        for (i, round) in a.rounds.iter().enumerate() {
            let parts: Vec<String> = round
                .iter()
                .map(|(v, x)| format!("{v} {}", thousands(*x)))
                .collect();
            let _ = writeln!(s, "- round {}: {}", i + 1, parts.join(", "));
        }
    }
    if let Some(d) = &r.drain {
        let _ = writeln!(
            s,
            "\n| drain | sales | batch | orders | elapsed | orders/s |\n|---|---:|---:|---:|---:|---:|"
        );
        for x in d.runs() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} s | {} |",
                x.variant,
                x.sales,
                x.batch_size,
                thousands(x.orders as f64),
                x.elapsed_s,
                thousands(x.orders_per_s)
            );
        }
    }
    if let Some(l) = &r.commit_latency {
        let _ = writeln!(
            s,
            "\nadmission-to-commit: {} admissions at {}/s for {} s from {} callers, one drainer invocation with batch {}: p50 {:.3} s, p90 {:.3} s, p99 {:.3} s, max {:.3} s; the stream was empty {:.2} s after the last admission.",
            thousands(l.committed as f64),
            l.options.rate,
            l.options.seconds,
            l.options.callers,
            l.options.batch_size,
            l.latency.p50_us as f64 / 1e6,
            l.latency.p90_us as f64 / 1e6,
            l.latency.p99_us as f64 / 1e6,
            l.latency.max_us as f64 / 1e6,
            l.drained_after_s
        );
    }
    if let Some(f) = &r.footprint {
        let _ = writeln!(
            s,
            "\n| function (release) | size | peak RSS | RSS at the end | workload | invocations/s | latency p50 / p99 |\n|---|---:|---:|---:|---|---:|---:|"
        );
        for b in &f.binaries {
            let kib = |k: Option<u64>| {
                k.map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
            };
            let _ = writeln!(
                s,
                "| {} | {:.2} MiB | {} | {} | {} | {} | {} |",
                b.name,
                b.size_bytes as f64 / 1048576.0,
                kib(b.peak_rss_kib),
                kib(b.rss_kib),
                b.workload,
                b.invocations_per_s.map_or(String::new(), thousands),
                b.latency.as_ref().map_or(String::new(), |l| format!(
                    "{:.2} / {:.2} ms",
                    ms(l.p50_us),
                    ms(l.p99_us)
                ))
            );
        }
    }
    let checks = r.checks();
    let bad: Vec<_> = checks.iter().filter(|(_, c)| !c.ok).collect();
    let _ = writeln!(
        s,
        "\nInvariant checks: {} of {} held{}.",
        checks.len() - bad.len(),
        checks.len(),
        if bad.is_empty() { "" } else { " — SEE BELOW" }
    );
    for (run, c) in bad {
        let _ = writeln!(s, "- **violated** in {run}: {}: {}", c.name, c.detail);
    }
    let _ = writeln!(s, "\n</details>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separate() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(-1000.0), "-1,000");
    }

    #[test]
    fn the_machine_is_described() {
        let m = Machine::read();
        assert!(m.nproc >= 1);
        assert!(m.describe().contains("load average"));
    }
}

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
            runs.extend(a.ours_durable.iter());
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

    /// The baselines that FAILED on this server, with the server's error.
    pub fn failed(&self) -> Vec<(String, String)> {
        let sale = self.sale.as_ref().and_then(|s| s.tutorial.as_ref());
        let admit = self.admit.as_ref().and_then(|a| a.tutorial.as_ref());
        let drain = self.drain.as_ref().and_then(|d| d.tutorial.as_ref());
        [
            ("sale tutorial", sale.and_then(|r| r.error.clone())),
            ("admit tutorial", admit.and_then(|r| r.error.clone())),
            ("drain tutorial", drain.and_then(|r| r.error.clone())),
        ]
        .into_iter()
        .filter_map(|(run, e)| Some((run.to_string(), e?)))
        .collect()
    }

    /// The process's exit status: 2 when an invariant was violated, else 3 when a
    /// baseline FAILED on this server, else 0.
    pub fn exit_status(&self) -> u8 {
        if !self.all_ok() {
            2
        } else if !self.failed().is_empty() {
            3
        } else {
            0
        }
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

/// One line about a finished variant.
pub fn one_line(r: &RunResult) -> String {
    format!(
        "{:<6} {:<13} {:>9} attempts in {:>6.2} s = {:>9.0}/s, admitted {:>7}, p50 {:>7.3} ms, p99 {:>7.3} ms{}",
        r.scenario,
        r.variant,
        r.completed,
        r.elapsed_s,
        r.attempts_per_s,
        r.admitted,
        r.latency.p50_us as f64 / 1000.0,
        r.latency.p99_us as f64 / 1000.0,
        if r.checks.iter().all(|c| c.ok) {
            String::new()
        } else {
            "  INVARIANT VIOLATED".into()
        }
    )
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

/// A comparison whose baseline FAILED on this server: its error instead of a figure.
fn failed_row(what: &str, ours: String, error: &str, target: &str) -> Row {
    Row {
        what: what.into(),
        ours,
        baseline: format!("FAILED: {error}"),
        ratio: "FAILED".into(),
        target: target.into(),
        met: None,
    }
}

/// `ratio_row`, or `failed_row` when the baseline run has an error.
fn compare_row(what: &str, ours: f64, base: &RunResult, unit: &str, target: f64) -> Row {
    match &base.error {
        Some(e) => failed_row(
            what,
            format!("{} {unit}", thousands(ours)),
            e,
            &format!("≥ {target}×"),
        ),
        None => ratio_row(what, ours, base.attempts_per_s, unit, target),
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
            rows.push(compare_row(
                &format!(
                    "sale mix (S={}, A={}, U={}, C={}): ours vs tutorial admission",
                    s.options.stock, s.options.attempts, s.options.users, s.options.callers
                ),
                s.ours.attempts_per_s,
                t,
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
                        .filter(|t| t.error.is_none())
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
            rows.push(compare_row(
                &title("tutorial admission"),
                a.ours.attempts_per_s,
                t,
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
                let what = format!(
                    "admit path, Redis command time per admission (INFO commandstats): ours vs {name}; the ratio is how many more admissions one Redis core executes with ours"
                );
                if let Some(e) = other.as_ref().and_then(|r| r.error.as_deref()) {
                    rows.push(failed_row(&what, format!("{ours_us:.1} µs"), e, ""));
                } else if let Some(base_us) = other.as_ref().and_then(redis_us) {
                    rows.push(Row {
                        what,
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
                a.ours_durable.as_ref().map(|r| ("ours durable", r)),
            ]
            .into_iter()
            .flatten()
            .filter(|(_, r)| r.error.is_none())
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
        if let Some(d) = &a.ours_durable {
            durable_rows(&mut rows, &a.ours, d);
        }
    }
    if let Some(d) = &r.drain
        && let Some(best) = d.best()
    {
        if let Some(t) = &d.tutorial {
            let what = format!(
                "drain (N={}): ours (batch {}) vs tutorial consumer",
                d.options.orders, best.batch_size
            );
            rows.push(match &t.error {
                Some(e) => failed_row(
                    &what,
                    format!("{} orders/s", thousands(best.orders_per_s)),
                    e,
                    "≥ 20×",
                ),
                None => ratio_row(&what, best.orders_per_s, t.orders_per_s, "orders/s", 20.0),
            });
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

/// Durable admissions (`ours-durable`) against ours in the same run: the ratios are
/// durable / asynchronous, so a throughput ratio below 1 and latency ratios above 1 are
/// what waiting for a replica costs.
fn durable_rows(rows: &mut Vec<Row>, ours: &RunResult, d: &RunResult) {
    let what = |m: &str| {
        format!("admit path, {m}: ours with durable admissions (REDIS_DURABLE_REPLICAS=1) vs ours")
    };
    rows.push(Row {
        what: what("throughput"),
        ours: format!("{} admissions/s", thousands(d.attempts_per_s)),
        baseline: format!("{} admissions/s", thousands(ours.attempts_per_s)),
        ratio: format!("{:.2}×", d.attempts_per_s / ours.attempts_per_s.max(1e-9)),
        target: String::new(),
        met: None,
    });
    let (dl, ol) = (&d.latency, &ours.latency);
    rows.push(Row {
        what: what("latency p50 / p99"),
        ours: format!("{:.2} / {:.2} ms", ms(dl.p50_us), ms(dl.p99_us)),
        baseline: format!("{:.2} / {:.2} ms", ms(ol.p50_us), ms(ol.p99_us)),
        ratio: format!(
            "{:.2}× / {:.2}×",
            dl.p50_us as f64 / ol.p50_us.max(1) as f64,
            dl.p99_us as f64 / ol.p99_us.max(1) as f64
        ),
        target: String::new(),
        met: None,
    });
    let redis_us = |r: &RunResult| r.cpu.as_ref().and_then(|c| c.redis_command_us_per_attempt);
    if let (Some(du), Some(ou)) = (redis_us(d), redis_us(ours)) {
        rows.push(Row {
            what: what("Redis command time per admission (INFO commandstats, every primary)"),
            ours: format!("{du:.1} µs"),
            baseline: format!("{ou:.1} µs"),
            ratio: format!("{:.2}×", du / ou.max(1e-9)),
            target: String::new(),
            met: None,
        });
    }
    let unconfirmed = d.outcomes.get("unavailable").copied().unwrap_or(0);
    rows.push(value_row(
        "admit path, ours with durable admissions: answered 503 unavailable (a replica did not acknowledge in time)",
        format!("{} of {}", thousands(unconfirmed as f64), thousands(d.completed as f64)),
        "",
        None,
    ));
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
        runs.extend(x.ours_durable.iter());
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
    for (run, e) in r.failed() {
        let _ = writeln!(s, "\nBaseline **FAILED** on this server: {run}: {e}");
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
    fn a_refused_baseline_reads_failed_with_the_servers_error_and_exits_3() {
        use crate::admission::SaleOptions;
        use crate::record::{Outcome, Recorder, RunMeta, merge};
        use std::time::Duration;
        let run = |variant: &str, outcome: Outcome| {
            let mut rec = Recorder::new();
            let ms = Duration::from_millis(1);
            rec.record(1, outcome, ms, ms);
            let meta = RunMeta {
                variant: variant.into(),
                target: "redis".into(),
                scenario: "sale".into(),
                callers: 1,
                planned: 1,
                users: 1,
                stock: Some(1),
            };
            merge(meta, vec![rec], ms)
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

    #[test]
    fn the_machine_is_described() {
        let m = Machine::read();
        assert!(m.nproc >= 1);
        assert!(m.describe().contains("load average"));
    }
}

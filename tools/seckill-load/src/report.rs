//! The results of a benchmark run: the JSON document, the machine it ran on, one line per
//! finished variant and the table of ratios (plain text and Markdown).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::admission::{AdmitReport, SaleReport};
use crate::drain::{CommitLatencyReport, DrainReport};
use crate::footprint::FootprintReport;
use crate::record::{Check, Latency, RunResult};

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
    /// Every admission run (sale, admit, the paced admissions of commit-latency), in the
    /// order the details table lists them.
    pub fn runs(&self) -> Vec<&RunResult> {
        let mut runs = Vec::new();
        if let Some(s) = &self.sale {
            runs.push(&s.ours);
            runs.extend(&s.tutorial);
        }
        if let Some(a) = &self.admit {
            runs.push(&a.ours);
            let others = [&a.ours_adapter, &a.tutorial, &a.floor, &a.ours_durable];
            runs.extend(others.into_iter().flatten());
        }
        if let Some(l) = &self.commit_latency {
            runs.push(&l.admissions);
        }
        runs
    }

    /// Every invariant check of every run, with the run it belongs to.
    pub fn checks(&self) -> Vec<(String, Check)> {
        let mut out: Vec<(String, Check)> = Vec::new();
        let mut add = |run: String, checks: &[Check]| {
            out.extend(checks.iter().map(|c| (run.clone(), c.clone())));
        };
        for r in self.runs() {
            add(format!("{} {}", r.scenario, r.variant), &r.checks);
        }
        for r in self.drain.iter().flat_map(|d| d.runs()) {
            add(
                format!("drain {} (batch {})", r.variant, r.batch_size),
                &r.checks,
            );
        }
        if let Some(l) = &self.commit_latency {
            add("commit-latency".into(), &l.checks);
        }
        out
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
        if self.checks().iter().any(|(_, c)| !c.ok) {
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
        ms(r.latency.p50_us),
        ms(r.latency.p99_us),
        if r.checks.iter().all(|c| c.ok) {
            ""
        } else {
            "  INVARIANT VIOLATED"
        }
    )
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// "p50 / p99 ms" of a latency.
fn p50_p99(l: &Latency) -> String {
    format!("{:.2} / {:.2} ms", ms(l.p50_us), ms(l.p99_us))
}

/// A ratio as the table prints it.
fn times(x: f64) -> String {
    format!("{x:.2}×")
}

/// One row of the ratio table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    pub what: String,
    pub ours: String,
    pub baseline: String,
    pub ratio: String,
    pub target: String,
    /// `None`: nothing to compare with a target.
    pub met: Option<bool>,
}

impl Row {
    /// A figure of ours alone, with a target when there is one.
    fn value(what: &str, ours: String, target: &str, met: Option<bool>) -> Row {
        Row {
            what: what.into(),
            ours,
            target: target.into(),
            met,
            ..Row::default()
        }
    }

    /// Ours against a baseline, with no target.
    fn versus(what: &str, ours: String, baseline: String, ratio: String) -> Row {
        Row {
            what: what.into(),
            ours,
            baseline,
            ratio,
            ..Row::default()
        }
    }

    /// A comparison whose baseline FAILED on this server: its error instead of a figure.
    fn failed(what: &str, ours: String, error: &str, target: &str) -> Row {
        Row {
            baseline: format!("FAILED: {error}"),
            ratio: "FAILED".into(),
            ..Row::value(what, ours, target, None)
        }
    }

    /// Rates of ours and a baseline in `unit` against a target ratio, or FAILED when
    /// the baseline has an error.
    fn rate(what: &str, ours: f64, base: f64, error: Option<&str>, unit: &str, target: f64) -> Row {
        let ours_text = format!("{} {unit}", thousands(ours));
        let target_text = format!("≥ {target}×");
        if let Some(e) = error {
            return Row::failed(what, ours_text, e, &target_text);
        }
        let ratio = if base > 0.0 { ours / base } else { f64::NAN };
        Row {
            target: target_text,
            met: Some(ratio >= target),
            ..Row::versus(
                what,
                ours_text,
                format!("{} {unit}", thousands(base)),
                times(ratio),
            )
        }
    }
}

/// Redis's command time per admission of a run (INFO commandstats).
fn redis_us(r: &RunResult) -> Option<f64> {
    r.cpu.as_ref().and_then(|c| c.redis_command_us_per_attempt)
}

/// The table of ratios of everything measured.
pub fn rows(r: &Results) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(s) = &r.sale {
        if let Some(t) = &s.tutorial {
            let o = &s.options;
            rows.push(Row::rate(
                &format!(
                    "sale mix (S={}, A={}, U={}, C={}): ours vs tutorial admission",
                    o.stock, o.attempts, o.users, o.callers
                ),
                s.ours.attempts_per_s,
                t.attempts_per_s,
                t.error.as_deref(),
                "attempts/s",
                5.0,
            ));
        }
        rows.push(Row::value(
            &format!("sale: ours ({}) latency p50 / p99", s.ours.target),
            p50_p99(&s.ours.latency),
            "p99 ≤ 5 ms",
            Some(s.ours.latency.p99_us <= 5_000),
        ));
        if let Some(t) = s.ours.sell_out_s {
            let tutorial = s.tutorial.as_ref().filter(|t| t.error.is_none());
            let tutorial = tutorial.and_then(|t| t.sell_out_s);
            rows.push(Row::value(
                "sale: ours sold out after",
                format!(
                    "{t:.3} s{}",
                    tutorial.map_or(String::new(), |tt| format!(" (tutorial {tt:.3} s)"))
                ),
                "",
                None,
            ));
        }
    }
    if let Some(a) = &r.admit {
        admit_rows(&mut rows, a);
    }
    if let Some(d) = &r.drain
        && let Some(best) = d.best()
    {
        let n = d.options.orders;
        if let Some(t) = &d.tutorial {
            rows.push(Row::rate(
                &format!(
                    "drain (N={n}): ours (batch {}) vs tutorial consumer",
                    best.batch_size
                ),
                best.orders_per_s,
                t.orders_per_s,
                t.error.as_deref(),
                "orders/s",
                20.0,
            ));
        }
        if let Some(f) = &d.db_floor {
            rows.push(Row::rate(
                &format!(
                    "drain (N={n}): ours (batch {}) vs database floor (multi-row INSERT, {} rows)",
                    best.batch_size, f.batch_size
                ),
                best.orders_per_s,
                f.orders_per_s,
                None,
                "orders/s",
                0.5,
            ));
        }
        let sweep: Vec<String> = d
            .ours
            .iter()
            .map(|o| format!("{}: {}", o.batch_size, thousands(o.orders_per_s)))
            .collect();
        rows.push(Row::value(
            "drain: batch-size sweep (orders/s)",
            sweep.join(", "),
            "",
            None,
        ));
        if let Some(single) = d.spread.iter().find(|r| r.sales == 1) {
            for many in d.spread.iter().filter(|r| r.sales > 1) {
                rows.push(Row::rate(
                    &format!(
                        "drain (N={}): {} sales at once vs 1 sale (batch {})",
                        many.orders, many.sales, many.batch_size
                    ),
                    many.orders_per_s,
                    single.orders_per_s,
                    None,
                    "orders/s",
                    0.5,
                ));
            }
        }
    }
    if let Some(l) = &r.commit_latency {
        rows.push(Row::value(
            &format!(
                "admission-to-commit latency p50 / p99 ({} admissions at {}/s, one drainer invocation)",
                l.committed, l.options.rate
            ),
            format!("{:.3} / {:.3} s", secs(l.latency.p50_us), secs(l.latency.p99_us)),
            "p99 ≤ 2 s",
            Some(l.latency.p99_us <= 2_000_000 && l.committed > 0),
        ));
    }
    for b in r.footprint.iter().flat_map(|f| &f.binaries) {
        let peak = b.peak_rss_kib;
        rows.push(Row::value(
            &format!(
                "{}: release binary size / peak RSS ({})",
                b.name, b.workload
            ),
            format!(
                "{:.1} MiB / {}",
                b.size_bytes as f64 / 1048576.0,
                peak.map_or("n/a".to_string(), |k| format!(
                    "{:.1} MiB",
                    k as f64 / 1024.0
                ))
            ),
            "",
            None,
        ));
    }
    rows
}

/// The admit path's rows.
fn admit_rows(rows: &mut Vec<Row>, a: &AdmitReport) {
    let o = &a.options;
    let title = |b: &str| {
        format!(
            "admit path (A={}, C={}, median of {}): ours vs {b}",
            o.attempts, o.callers, o.rounds
        )
    };
    let ours = &a.ours;
    if let Some(t) = &a.tutorial {
        rows.push(Row::rate(
            &title("tutorial admission"),
            ours.attempts_per_s,
            t.attempts_per_s,
            t.error.as_deref(),
            "admissions/s",
            1.0,
        ));
    }
    if let Some(f) = &a.floor {
        rows.push(Row::rate(
            &title("floor (no-op EVALSHA)"),
            ours.attempts_per_s,
            f.attempts_per_s,
            None,
            "calls/s",
            0.6,
        ));
    }
    if let Some(ours_us) = redis_us(ours) {
        for (name, other) in [("tutorial admission", &a.tutorial), ("floor", &a.floor)] {
            let what = format!(
                "admit path, Redis command time per admission (INFO commandstats): ours vs {name}; the ratio is how many more admissions one Redis core executes with ours"
            );
            let ours_text = format!("{ours_us:.1} µs");
            if let Some(e) = other.as_ref().and_then(|r| r.error.as_deref()) {
                rows.push(Row::failed(&what, ours_text, e, ""));
            } else if let Some(base_us) = other.as_ref().and_then(redis_us) {
                let ratio = times(base_us / ours_us.max(1e-9));
                rows.push(Row::versus(
                    &what,
                    ours_text,
                    format!("{base_us:.1} µs"),
                    ratio,
                ));
            }
        }
        let parts: Vec<String> = [
            Some(("ours", ours)),
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
        .filter_map(|(n, r)| {
            Some(format!(
                "{n} {:.1} µs",
                r.cpu.as_ref()?.process_us_per_attempt
            ))
        })
        .collect();
        rows.push(Row::value(
            "admit path, CPU per attempt of the calling process (callers + in-process handlers)",
            parts.join(", "),
            "",
            None,
        ));
    }
    let per_s = |r: &RunResult| format!("{} admissions/s", thousands(r.attempts_per_s));
    if let Some(ad) = &a.ours_adapter {
        rows.push(Row::versus(
            "admit path: ours through the handler vs ours without it (adapter only)",
            per_s(ours),
            per_s(ad),
            times(ours.attempts_per_s / ad.attempts_per_s.max(1e-9)),
        ));
    }
    rows.push(Row::value(
        &format!("admit: ours ({}) latency p50 / p99", ours.target),
        p50_p99(&ours.latency),
        "p99 ≤ 5 ms",
        Some(ours.latency.p99_us <= 5_000),
    ));
    // Durable admissions against ours in the same run: the ratios are durable /
    // asynchronous, so a throughput ratio below 1 and latency ratios above 1 are what
    // waiting for a replica costs.
    let Some(d) = &a.ours_durable else {
        return;
    };
    let what = |m: &str| {
        format!("admit path, {m}: ours with durable admissions (REDIS_DURABLE_REPLICAS=1) vs ours")
    };
    rows.push(Row::versus(
        &what("throughput"),
        per_s(d),
        per_s(ours),
        times(d.attempts_per_s / ours.attempts_per_s.max(1e-9)),
    ));
    let (dl, ol) = (&d.latency, &ours.latency);
    rows.push(Row::versus(
        &what("latency p50 / p99"),
        p50_p99(dl),
        p50_p99(ol),
        format!(
            "{} / {}",
            times(dl.p50_us as f64 / ol.p50_us.max(1) as f64),
            times(dl.p99_us as f64 / ol.p99_us.max(1) as f64)
        ),
    ));
    if let (Some(du), Some(ou)) = (redis_us(d), redis_us(ours)) {
        rows.push(Row::versus(
            &what("Redis command time per admission (INFO commandstats, every primary)"),
            format!("{du:.1} µs"),
            format!("{ou:.1} µs"),
            times(du / ou.max(1e-9)),
        ));
    }
    let unconfirmed = d.outcomes.get("unavailable").copied().unwrap_or(0);
    rows.push(Row::value(
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
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {met} |",
            r.what, r.ours, r.baseline, r.ratio, r.target
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
            let _ = writeln!(s, "    {:<40} {:>10} {met}", r.ours, r.target);
        } else {
            let target = match r.target.as_str() {
                "" => String::new(),
                t => format!("   (target {t})"),
            };
            let _ = writeln!(
                s,
                "    {} vs {} = {}{target} {met}",
                r.ours, r.baseline, r.ratio
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
    for x in r.runs() {
        let l = &x.latency;
        let outcomes: Vec<String> = x
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {}", thousands(*v as f64)))
            .collect();
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
            outcomes.join(", "),
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us)
        );
    }
    if let Some(a) = r.admit.as_ref().filter(|a| a.rounds.len() > 1) {
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
        let (o, lat) = (&l.options, &l.latency);
        let _ = writeln!(
            s,
            "\nadmission-to-commit: {} admissions at {}/s for {} s from {} callers, one drainer invocation with batch {}: p50 {:.3} s, p90 {:.3} s, p99 {:.3} s, max {:.3} s; the stream was empty {:.2} s after the last admission.",
            thousands(l.committed as f64),
            o.rate,
            o.seconds,
            o.callers,
            o.batch_size,
            secs(lat.p50_us),
            secs(lat.p90_us),
            secs(lat.p99_us),
            secs(lat.max_us),
            l.drained_after_s
        );
    }
    if let Some(f) = &r.footprint {
        let _ = writeln!(
            s,
            "\n| function (release) | size | peak RSS | RSS at the end | workload | invocations/s | latency p50 / p99 |\n|---|---:|---:|---:|---|---:|---:|"
        );
        let mib =
            |k: Option<u64>| k.map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
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

//! The results of a benchmark run: the JSON document, the machine it ran on, one line per
//! finished variant and the table of ratios (plain text and Markdown).

use std::fmt::Write as _;

use seckill_shared::domain::{format_rfc3339_millis, now_millis};
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
    /// One hot voucher over stock buckets.
    #[serde(default)]
    pub buckets: Option<crate::buckets::BucketsReport>,
}

impl Results {
    /// Every admission run (sale, admit, the paced admissions of commit-latency), in the
    /// order the details table lists them.
    pub fn runs(&self) -> Vec<&RunResult> {
        let (sale, admit) = (self.sale.as_ref(), self.admit.as_ref());
        let runs = [
            sale.map(|s| &s.ours),
            sale.and_then(|s| s.tutorial.as_ref()),
            admit.map(|a| &a.ours),
            admit.and_then(|a| a.ours_adapter.as_ref()),
            admit.and_then(|a| a.tutorial.as_ref()),
            admit.and_then(|a| a.floor.as_ref()),
            admit.and_then(|a| a.ours_durable.as_ref()),
            self.commit_latency.as_ref().map(|l| &l.admissions),
        ];
        let mut runs: Vec<&RunResult> = runs.into_iter().flatten().collect();
        if let Some(b) = &self.buckets {
            runs.extend(b.runs.iter().map(|r| &r.run));
            runs.extend(b.sale.as_ref());
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
            let run = format!("drain {} (batch {})", r.variant, r.batch_size);
            add(run, &r.checks);
        }
        if let Some(l) = &self.commit_latency {
            add("commit-latency".into(), &l.checks);
        }
        out
    }

    /// The baselines that FAILED on this server, with the server's error.
    pub fn failed(&self) -> Vec<(String, String)> {
        let (s, a, d) = (self.sale.as_ref(), self.admit.as_ref(), self.drain.as_ref());
        let errors = [
            s.and_then(|s| s.tutorial.as_ref()?.error.as_ref()),
            a.and_then(|a| a.tutorial.as_ref()?.error.as_ref()),
            d.and_then(|d| d.tutorial.as_ref()?.error.as_ref()),
        ];
        let runs = ["sale", "admit", "drain"].into_iter().zip(errors);
        runs.filter_map(|(run, e)| Some((format!("{run} tutorial"), e?.clone())))
            .collect()
    }

    /// The process's exit status: 2 when an invariant was violated, else 3 when a
    /// baseline FAILED on this server, else 0.
    pub fn exit_status(&self) -> u8 {
        match self.checks().iter().any(|(_, c)| !c.ok) {
            true => 2,
            false if !self.failed().is_empty() => 3,
            false => 0,
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
        let proc = |f: &str| std::fs::read_to_string(format!("/proc/{f}")).unwrap_or_default();
        let cpuinfo = proc("cpuinfo");
        let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name"));
        let model = model.and_then(|l| Some(l.split_once(':')?.1.trim()));
        let meminfo = proc("meminfo");
        let gib = |key: &str| -> f64 {
            let kib = meminfo.lines().find_map(|l| l.strip_prefix(key));
            let kib = kib.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
            kib.unwrap_or(0.0) / 1048576.0
        };
        let loadavg = proc("loadavg");
        let mut load = loadavg.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
        Machine {
            at: format_rfc3339_millis(now_millis()),
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: model.unwrap_or("unknown").to_string(),
            mem_total_gib: gib("MemTotal:"),
            mem_available_gib: gib("MemAvailable:"),
            loadavg: std::array::from_fn(|_| load.next().unwrap_or(0.0)),
            builders: count_builders(),
            kernel: proc("sys/kernel/osrelease").trim().to_string(),
            redis_version: None,
            mariadb_version: None,
        }
    }

    pub fn describe(&self) -> String {
        let (m, [l1, l5, l15]) = (self, self.loadavg);
        let mut s = format!(
            "{} × {}, {:.1} GiB RAM ({:.1} GiB available), Linux {}, load average {l1:.2} / {l5:.2} / {l15:.2}, {} compiler/linker processes running",
            m.nproc, m.cpu_model, m.mem_total_gib, m.mem_available_gib, m.kernel, m.builders
        );
        for (name, v) in [("Redis", &m.redis_version), ("MariaDB", &m.mariadb_version)] {
            if let Some(v) = v {
                let _ = write!(s, ", {name} {v}");
            }
        }
        s
    }
}

/// Processes named like compilers or linkers (rustc, cc1, ld, ...).
fn count_builders() -> usize {
    let names = [
        "rustc", "cc1", "cc1plus", "ld", "ld.lld", "collect2", "cc", "clang",
    ];
    // Every process's directory (and self, which is no builder).
    let dir = std::fs::read_dir("/proc").into_iter().flatten();
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|c| names.contains(&c.trim()))
        .count()
}

/// One line about a finished variant.
pub fn one_line(r: &RunResult) -> String {
    let (p50, p99) = (ms(r.latency.p50_us), ms(r.latency.p99_us));
    let violated = match r.checks.iter().all(|c| c.ok) {
        true => "",
        false => "  INVARIANT VIOLATED",
    };
    format!(
        "{:<6} {:<13} {:>9} attempts in {:>6.2} s = {:>9.0}/s, admitted {:>7}, p50 {p50:>7.3} ms, p99 {p99:>7.3} ms{violated}",
        r.scenario, r.variant, r.completed, r.elapsed_s, r.attempts_per_s, r.admitted
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

/// `a / b` as the table prints a ratio.
fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}×", a / b.max(1e-9))
}

fn micros(us: f64) -> String {
    format!("{us:.1} µs")
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// One row of the ratio table.
#[derive(Debug, Default)]
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
    /// A figure of ours alone.
    fn new(what: impl Into<String>, ours: String) -> Row {
        Row {
            what: what.into(),
            ours,
            ..Row::default()
        }
    }

    /// With a target, met or missed (`None`: not compared).
    fn target(mut self, target: String, met: Option<bool>) -> Row {
        (self.target, self.met) = (target, met);
        self
    }

    /// Against a baseline.
    fn vs(mut self, baseline: String, ratio: String) -> Row {
        (self.baseline, self.ratio) = (baseline, ratio);
        self
    }

    /// Against a baseline that FAILED on this server: its error instead of a figure.
    fn failed(self, error: &str) -> Row {
        self.vs(format!("FAILED: {error}"), "FAILED".into())
    }

    /// Rates of ours and a baseline in `unit` against a target ratio, or FAILED when
    /// the baseline has an error.
    fn rate(what: String, unit: &str, target: f64, (ours, base, error): Rates) -> Row {
        let row = Row::new(what, format!("{} {unit}", thousands(ours)));
        let target_text = format!("≥ {target}×");
        if let Some(e) = error {
            return row.failed(e).target(target_text, None);
        }
        let x = if base > 0.0 { ours / base } else { f64::NAN };
        let row = row.vs(format!("{} {unit}", thousands(base)), format!("{x:.2}×"));
        row.target(target_text, Some(x >= target))
    }

    /// "SCENARIO: ours (TARGET) latency p50 / p99" against 5 ms.
    fn latency(scenario: &str, r: &RunResult) -> Row {
        let what = format!("{scenario}: ours ({}) latency p50 / p99", r.target);
        let met = r.latency.p99_us <= 5_000;
        Row::new(what, p50_p99(&r.latency)).target("p99 ≤ 5 ms".into(), Some(met))
    }
}

/// Ours, the baseline, and the baseline's error when it FAILED.
type Rates<'a> = (f64, f64, Option<&'a str>);

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
        if let Some(single) = d.spread.iter().find(|r| r.sales == 1) {
            for many in d.spread.iter().filter(|r| r.sales > 1) {
                let what = format!(
                    "drain (N={}): {} sales at once vs 1 sale (batch {})",
                    many.orders, many.sales, many.batch_size
                );
                let rates = (many.orders_per_s, single.orders_per_s, None);
                rows.push(Row::rate(what, "orders/s", 0.5, rates));
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

/// The ratio table as aligned plain text.
pub fn text_table(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let met = r.met.map_or("", |met| if met { "met" } else { "MISSED" });
        let (what, ours, base, ratio) = (&r.what, &r.ours, &r.baseline, &r.ratio);
        let _ = match (base.is_empty(), r.target.as_str()) {
            (true, t) => writeln!(s, "{what}\n    {ours:<40} {t:>10} {met}"),
            (false, "") => writeln!(s, "{what}\n    {ours} vs {base} = {ratio} {met}"),
            (false, t) => writeln!(
                s,
                "{what}\n    {ours} vs {base} = {ratio}   (target {t}) {met}"
            ),
        };
    }
    s
}

/// 12345.6 → "12,346".
fn thousands(v: f64) -> String {
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

fn count(n: u64) -> String {
    thousands(n as f64)
}

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
                "\nCeiling on paper for one voucher on ElastiCache Serverless: a slot serves at most 30,000 ECPU/s; a SET sent alone cost Redis {set:.2} µs of CPU here, network I/O included (1 ECPU), so an admission of the run with the fewest buckets costs its Redis CPU / {set:.2} µs = {} ECPU, and k buckets in k slots give k times one slot's ceiling:\n",
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

    #[test]
    fn the_machine_is_described() {
        let m = Machine::read();
        assert!(m.nproc >= 1);
        assert!(m.describe().contains("load average"));
    }
}

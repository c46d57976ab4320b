//! A row of the table of ratios (a figure of ours, against a baseline or a target) and
//! the table as aligned plain text.

use std::fmt::Write as _;

use crate::figures::{p50_p99, thousands};
use crate::record::RunResult;

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
    pub(super) fn new(what: impl Into<String>, ours: String) -> Row {
        Row {
            what: what.into(),
            ours,
            ..Row::default()
        }
    }

    /// With a target, met or missed (`None`: not compared).
    pub(super) fn target(mut self, target: String, met: Option<bool>) -> Row {
        (self.target, self.met) = (target, met);
        self
    }

    /// Against a baseline.
    pub(super) fn vs(mut self, baseline: String, ratio: String) -> Row {
        (self.baseline, self.ratio) = (baseline, ratio);
        self
    }

    /// Against a baseline that FAILED on this server: its error instead of a figure.
    pub(super) fn failed(self, error: &str) -> Row {
        self.vs(format!("FAILED: {error}"), "FAILED".into())
    }

    /// Rates of ours and a baseline in `unit` against a target ratio, or FAILED when
    /// the baseline has an error.
    pub(super) fn rate(what: String, unit: &str, target: f64, (ours, base, error): Rates) -> Row {
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
    pub(super) fn latency(scenario: &str, r: &RunResult) -> Row {
        let what = format!("{scenario}: ours ({}) latency p50 / p99", r.target);
        let met = r.latency.p99_us <= 5_000;
        Row::new(what, p50_p99(&r.latency)).target("p99 ≤ 5 ms".into(), Some(met))
    }
}

/// Ours, the baseline, and the baseline's error when it FAILED.
type Rates<'a> = (f64, f64, Option<&'a str>);

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

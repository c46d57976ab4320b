//! How the tool writes figures: milliseconds and seconds from microseconds, ratios,
//! thousands separators, sizes in MiB, and the one line printed per finished variant.

use crate::record::{Latency, RunResult};

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

pub(crate) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

pub(crate) fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// "p50 / p99 ms" of a latency.
pub(crate) fn p50_p99(l: &Latency) -> String {
    format!("{:.2} / {:.2} ms", ms(l.p50_us), ms(l.p99_us))
}

/// `a / b` as the table prints a ratio.
pub(crate) fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}×", a / b.max(1e-9))
}

pub(crate) fn micros(us: f64) -> String {
    format!("{us:.1} µs")
}

pub(crate) fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// 12345.6 → "12,346".
pub(crate) fn thousands(v: f64) -> String {
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

pub(crate) fn count(n: u64) -> String {
    thousands(n as f64)
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
}

//! What one caller saw, and the merged result of a run: each caller keeps its own
//! [`Recorder`] (no sharing on the hot path), merged into a [`RunResult`] with exact
//! percentiles and a timeline binned logarithmically in time from 1 ms (a sale sells out
//! in milliseconds, then answers `sold_out` for a minute).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Slowest latency recorded (longer ones are clamped to it).
const MAX_LATENCY_US: u64 = 120_000_000;
/// The first timeline bin ends here; later bins grow geometrically.
const FIRST_BIN_S: f64 = 0.001;
/// Timeline bins of a run.
const TIMELINE_BINS: usize = 120;
/// The admitted flag in an event's latency word.
const ADMITTED_BIT: u32 = 1 << 31;
/// The `sold_out` flag in an event's latency word.
const SOLD_OUT_BIT: u32 = 1 << 30;
/// The latency in an event's latency word.
const LATENCY_MASK: u32 = !(ADMITTED_BIT | SOLD_OUT_BIT);

/// The outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted with this order id (`0` when the target does not return one).
    Admitted(i64),
    /// Answered with an error code of the contract (`sold_out`, `already_purchased`, ...)
    /// or, for the floor, `ok`.
    Code(&'static str),
    /// An unexpected answer or a transport failure.
    Failed(String),
    /// An error reply of the server refusing the command (a cluster node refusing a
    /// script's undeclared keys): the variant cannot run on this server.
    Refused(String),
}

/// One caller's record.
#[derive(Default)]
pub struct Recorder {
    /// (end since the start in µs, latency in µs | [`ADMITTED_BIT`] | [`SOLD_OUT_BIT`]).
    events: Vec<(u32, u32)>,
    outcomes: BTreeMap<&'static str, u64>,
    admitted_users: Vec<u32>,
    order_ids: Vec<i64>,
    last_admit: Option<Duration>,
    first_sold_out: Option<Duration>,
    failure_samples: Vec<String>,
    refusal: Option<String>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Records attempt by `user` that ended `at` after the start and took `latency`.
    pub fn record(&mut self, user: u32, outcome: Outcome, latency: Duration, at: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, MAX_LATENCY_US);
        let at_us = at.as_micros().min(u128::from(u32::MAX)) as u32;
        let key = match &outcome {
            Outcome::Admitted(_) => "admitted",
            Outcome::Code(code) => code,
            Outcome::Failed(_) => "failed",
            Outcome::Refused(_) => "refused",
        };
        *self.outcomes.entry(key).or_default() += 1;
        let admitted = match key {
            "admitted" => ADMITTED_BIT,
            "sold_out" => SOLD_OUT_BIT,
            _ => 0,
        };
        self.events.push((at_us, us as u32 | admitted));
        match outcome {
            Outcome::Admitted(id) => {
                self.admitted_users.push(user);
                self.order_ids.push(id);
                self.last_admit = self.last_admit.max(Some(at));
            }
            Outcome::Code("sold_out") => {
                self.first_sold_out.get_or_insert(at);
            }
            Outcome::Failed(why) if self.failure_samples.len() < 3 => {
                self.failure_samples.push(why);
            }
            Outcome::Refused(why) => {
                self.refusal.get_or_insert(why);
            }
            _ => {}
        }
    }
}

/// Latency percentiles, in microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

/// One bin of the timeline chart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Start and end of the bin, seconds since the start.
    pub from_s: f64,
    pub to_s: f64,
    pub attempts_per_s: f64,
    pub admitted_per_s: f64,
    /// p99 latency of the attempts that ended in the bin.
    pub p99_ms: f64,
}

/// One invariant checked after a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn new(name: &str, ok: bool, detail: impl Into<String>) -> Check {
        Check {
            name: name.to_string(),
            ok,
            detail: detail.into(),
        }
    }
}

/// The merged result of one variant of one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    /// `ours`, `ours-adapter`, `tutorial`, `floor`.
    pub variant: String,
    /// `in-process`, `url`, `redis`.
    pub target: String,
    pub scenario: String,
    pub callers: usize,
    pub planned: u64,
    pub completed: u64,
    pub users: u64,
    pub stock: Option<i64>,
    pub elapsed_s: f64,
    pub attempts_per_s: f64,
    pub admitted: u64,
    /// Count of every outcome: `admitted`, each rejection code, `failed`.
    pub outcomes: BTreeMap<String, u64>,
    pub failure_samples: Vec<String>,
    pub latency: Latency,
    /// Seconds from the start until the stock was gone: the first `sold_out` answer or the
    /// last admission (when every unit was seen admitted), whichever came first.
    pub sell_out_s: Option<f64>,
    /// `sold_out` answers that ended before an admitted attempt began: refusals given
    /// while a unit was still to be sold (stock buckets aim at 0).
    #[serde(default)]
    pub early_sold_out: u64,
    pub timeline: Vec<TimelinePoint>,
    /// CPU the run cost Redis and this process (callers and in-process handlers).
    pub cpu: Option<CpuUse>,
    pub checks: Vec<Check>,
    /// The server's first refusal ([`Outcome::Refused`]): the variant FAILED on this
    /// server, and its figures and checks measure nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Users admitted, sorted (not serialised).
    #[serde(skip)]
    pub admitted_users: Vec<u32>,
    /// Order ids returned with admissions, sorted (not serialised).
    #[serde(skip)]
    pub order_ids: Vec<i64>,
}

/// CPU time spent during a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CpuUse {
    /// Redis's `used_cpu_user + used_cpu_sys` (INFO cpu) over every primary, if known.
    pub redis_s: Option<f64>,
    /// This process (the callers, and the handlers when in process).
    pub process_s: f64,
    pub redis_us_per_attempt: Option<f64>,
    pub process_us_per_attempt: f64,
    /// Redis's time executing the callers' commands per attempt (INFO commandstats `usec`
    /// of [`CLIENT_COMMANDS`], every primary, without network I/O).
    #[serde(default)]
    pub redis_command_us_per_attempt: Option<f64>,
}

/// The commands the callers of the admit path send. A script's `usec` already includes
/// the commands it runs, which commandstats lists again under their own names: summing
/// every line would count them twice (no script in `lua/` calls these: a test checks).
pub const CLIENT_COMMANDS: [&str; 6] = ["evalsha", "eval", "evalsha_ro", "eval_ro", "incr", "wait"];

/// A point in CPU time.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    redis_s: Option<f64>,
    redis_command_us: Option<f64>,
    process_s: f64,
}

impl CpuSample {
    /// This process's CPU time (`/proc/self/stat`, 100 ticks a second) and the server's,
    /// summed over the `INFO cpu` and `INFO commandstats` texts of every primary.
    pub fn take(cpu: &[String], commandstats: &[String]) -> CpuSample {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may hold spaces) start at state (3).
        let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        // utime is field 14 and stime 15 of the whole line: 11 and 12 after the name.
        let ticks = after.split_whitespace().skip(11).take(2);
        let process_s = ticks.filter_map(|v| v.parse::<f64>().ok()).sum::<f64>() / 100.0;
        let get = |info: &str, k: &str| crate::redis_info::info_field(info, k)?.parse::<f64>().ok();
        let used = |info: &String| Some(get(info, "used_cpu_user")? + get(info, "used_cpu_sys")?);
        let redis_s = cpu.iter().map(used).sum::<Option<f64>>();
        let redis_command_us = (!commandstats.is_empty()).then(|| {
            let stats = crate::redis_info::commandstats(commandstats.iter().map(String::as_str));
            CLIENT_COMMANDS
                .iter()
                .filter_map(|name| stats.get(*name))
                .map(|s| s.usec)
                .sum()
        });
        CpuSample {
            redis_s: redis_s.filter(|_| !cpu.is_empty()),
            redis_command_us,
            process_s,
        }
    }

    /// The CPU spent from `self` to `later` over `attempts` attempts.
    pub fn until(&self, later: &CpuSample, attempts: u64) -> CpuUse {
        let (n, a, b) = (attempts.max(1) as f64, self, later);
        let redis_s = a.redis_s.zip(b.redis_s).map(|(x, y)| (y - x).max(0.0));
        let process_s = (b.process_s - a.process_s).max(0.0);
        let command_us = a.redis_command_us.zip(b.redis_command_us);
        let command_us = command_us.filter(|(x, y)| y >= x && *y > 0.0);
        CpuUse {
            redis_s,
            process_s,
            redis_us_per_attempt: redis_s.map(|s| s * 1e6 / n),
            process_us_per_attempt: process_s * 1e6 / n,
            redis_command_us_per_attempt: command_us.map(|(x, y)| (y - x) / n),
        }
    }
}

/// What a run was, for [`merge`].
pub struct RunMeta {
    pub variant: String,
    pub target: String,
    pub scenario: String,
    pub callers: usize,
    pub planned: u64,
    pub users: u64,
    pub stock: Option<i64>,
}

#[cfg(test)]
impl RunMeta {
    /// A sale of `stock` units: `n` users, one attempt each, from `n` callers.
    pub(crate) fn sale(variant: &str, n: u64, stock: i64) -> RunMeta {
        RunMeta {
            variant: variant.into(),
            target: "in-process".into(),
            scenario: "sale".into(),
            callers: n as usize,
            planned: n,
            users: n,
            stock: Some(stock),
        }
    }
}

/// Merges the callers' records of a run that took `elapsed`.
pub fn merge(meta: RunMeta, recorders: Vec<Recorder>, elapsed: Duration) -> RunResult {
    let mut all = Recorder::new();
    for r in recorders {
        all.events.extend(r.events);
        for (k, v) in r.outcomes {
            *all.outcomes.entry(k).or_default() += v;
        }
        all.admitted_users.extend(r.admitted_users);
        all.order_ids.extend(r.order_ids);
        if all.failure_samples.len() < 5 {
            all.failure_samples.extend(r.failure_samples);
        }
        all.last_admit = all.last_admit.max(r.last_admit);
        all.first_sold_out = earliest(all.first_sold_out, r.first_sold_out);
        all.refusal = all.refusal.or(r.refusal);
    }
    all.admitted_users.sort_unstable();
    all.order_ids.sort_unstable();
    let completed = all.events.len() as u64;
    let latencies = all.events.iter().map(|(_, w)| u64::from(w & LATENCY_MASK));
    // Refusals given while a unit was still to be sold: `sold_out` answers that ended
    // before an admitted attempt even began (the unit it got existed, unclaimed by any
    // attempt under way, when the refusal was given).
    let last_admitted_start = all
        .events
        .iter()
        .filter(|(_, w)| w & ADMITTED_BIT != 0)
        .map(|(end, w)| end.saturating_sub(w & LATENCY_MASK))
        .max();
    let early_sold_out = last_admitted_start.map_or(0, |start| {
        let early = |(end, w): &&(u32, u32)| w & SOLD_OUT_BIT != 0 && *end < start;
        all.events.iter().filter(early).count() as u64
    });
    let admitted = all.outcomes.get("admitted").copied().unwrap_or(0);
    let sold_out = meta.stock.is_some_and(|s| admitted as i64 >= s);
    // Both the first `sold_out` answer and the last admission end after the stock ran
    // out; the earlier of them is the closer bound.
    let sell_out = earliest(all.first_sold_out, all.last_admit.filter(|_| sold_out));
    let outcomes = all.outcomes.into_iter().map(|(k, v)| (k.into(), v));
    RunResult {
        variant: meta.variant,
        target: meta.target,
        scenario: meta.scenario,
        callers: meta.callers,
        planned: meta.planned,
        completed,
        users: meta.users,
        stock: meta.stock,
        elapsed_s: elapsed.as_secs_f64(),
        attempts_per_s: completed as f64 / elapsed.as_secs_f64().max(1e-9),
        admitted,
        outcomes: outcomes.collect(),
        failure_samples: all.failure_samples,
        latency: latency_of_values(latencies),
        sell_out_s: sell_out.map(|d| d.as_secs_f64()),
        early_sold_out,
        timeline: timeline(all.events, elapsed),
        cpu: None,
        checks: Vec::new(),
        error: all.refusal,
        admitted_users: all.admitted_users,
        order_ids: all.order_ids,
    }
}

fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    a.into_iter().chain(b).min()
}

/// Exact percentiles (nearest rank) of microsecond values, clamped to 1 µs ..
/// [`MAX_LATENCY_US`].
pub fn latency_of_values(values: impl IntoIterator<Item = u64>) -> Latency {
    let clamped = values.into_iter().map(|v| v.clamp(1, MAX_LATENCY_US));
    let mut v: Vec<u64> = clamped.collect();
    v.sort_unstable();
    let Some(&max_us) = v.last() else {
        return Latency::default();
    };
    let n = v.len();
    let q = |q: f64| v[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
    Latency {
        p50_us: q(0.50),
        p90_us: q(0.90),
        p99_us: q(0.99),
        p999_us: q(0.999),
        max_us,
        mean_us: v.iter().sum::<u64>() as f64 / n as f64,
    }
}

/// Bins the attempts by end time, geometrically from [`FIRST_BIN_S`] to the end.
fn timeline(events: Vec<(u32, u32)>, elapsed: Duration) -> Vec<TimelinePoint> {
    let total = elapsed.as_secs_f64();
    if events.is_empty() || total <= 0.0 {
        return Vec::new();
    }
    let edges = bin_edges(total);
    let mut bins: Vec<(u64, Vec<u32>)> = vec![(0, Vec::new()); edges.len() - 1];
    for (at_us, word) in events {
        let t = f64::from(at_us) / 1e6;
        let i = edges[1..].partition_point(|e| *e <= t).min(bins.len() - 1);
        bins[i].0 += u64::from(word & ADMITTED_BIT != 0);
        bins[i].1.push(word & LATENCY_MASK);
    }
    bins.into_iter()
        .enumerate()
        .filter(|(_, (_, lat))| !lat.is_empty())
        .map(|(i, (admitted, lat))| {
            let w = edges[i + 1] - edges[i];
            let p99 = latency_of_values(lat.iter().map(|&us| u64::from(us))).p99_us;
            TimelinePoint {
                from_s: edges[i],
                to_s: edges[i + 1],
                attempts_per_s: lat.len() as f64 / w,
                admitted_per_s: admitted as f64 / w,
                p99_ms: p99 as f64 / 1000.0,
            }
        })
        .collect()
}

/// `0, 1 ms, ..., total`: geometric after the first.
fn bin_edges(total: f64) -> Vec<f64> {
    if total <= FIRST_BIN_S * 2.0 {
        return vec![0.0, total];
    }
    let n = TIMELINE_BINS - 1;
    let ratio = (total / FIRST_BIN_S).powf(1.0 / n as f64);
    let mut edges = vec![0.0];
    edges.extend((0..n).map(|k| FIRST_BIN_S * ratio.powi(k as i32)));
    edges.push(total);
    edges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_cover_the_run_geometrically() {
        let e = bin_edges(60.0);
        assert_eq!(e.len(), TIMELINE_BINS + 1);
        assert_eq!(e[0], 0.0);
        assert!((e[1] - FIRST_BIN_S).abs() < 1e-12);
        assert!(e.windows(2).all(|w| w[0] < w[1]), "{e:?}");
        assert_eq!(*e.last().unwrap(), 60.0);
        assert_eq!(bin_edges(0.001), vec![0.0, 0.001]);
    }

    #[test]
    fn server_time_is_summed_over_every_primary() {
        let cpu =
            |s: f64| format!("used_cpu_sys:{s}\nused_cpu_user:{s}\nused_cpu_sys_children:9\n");
        // The script's inner HSETNX is part of its EVALSHA time: not counted again.
        let cmds = |us: u64| {
            format!(
                "cmdstat_evalsha:calls=1,usec={us},usec_per_call=1\ncmdstat_hsetnx:calls=1,usec=7,usec_per_call=7\n"
            )
        };
        let before = CpuSample::take(&[cpu(1.0), cpu(2.0)], &[cmds(100), cmds(200)]);
        let after = CpuSample::take(&[cpu(1.5), cpu(2.5)], &[cmds(300), cmds(600)]);
        let used = before.until(&after, 10);
        assert!((used.redis_s.unwrap() - 2.0).abs() < 1e-9, "{used:?}");
        assert!((used.redis_command_us_per_attempt.unwrap() - 60.0).abs() < 1e-9);
        assert!(CpuSample::take(&[], &[]).redis_s.is_none());
    }

    #[test]
    fn inner_commands_are_not_client_commands() {
        let lua = concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua");
        let mut read = 0;
        for dir in ["", "/bench", "/lib"] {
            for entry in std::fs::read_dir(format!("{lua}{dir}")).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|x| x != "lua") {
                    continue;
                }
                // Either quote: the check looks for single-quoted calls.
                let text = std::fs::read_to_string(&path).unwrap();
                let text = text.to_lowercase().replace('"', "'");
                read += 1;
                for name in CLIENT_COMMANDS {
                    for call in ["call", "pcall"] {
                        let inner = format!("redis.{call}('{name}'");
                        assert!(!text.contains(&inner), "{} runs {name}", path.display());
                    }
                }
            }
        }
        assert!(read >= 8, "read {read} scripts");
    }

    #[test]
    fn merging_counts_outcomes_and_sell_out() {
        let (us, ms) = (Duration::from_micros, Duration::from_millis);
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        a.record(1, Outcome::Admitted(10), us(100), ms(5));
        b.record(2, Outcome::Admitted(11), us(300), ms(250));
        b.record(3, Outcome::Code("sold_out"), us(5), ms(260));
        let r = merge(RunMeta::sale("ours", 3, 2), vec![a, b], ms(300));
        assert_eq!(r.completed, 3);
        assert_eq!(r.admitted, 2);
        assert_eq!(r.outcomes["sold_out"], 1);
        assert_eq!(r.admitted_users, vec![1, 2]);
        assert_eq!(r.sell_out_s, Some(0.25));
        assert_eq!(r.timeline.len(), 3);
        let counted: f64 = r
            .timeline
            .iter()
            .map(|p| p.attempts_per_s * (p.to_s - p.from_s))
            .sum();
        assert!((counted - 3.0).abs() < 1e-6, "{counted}");
        assert!(r.latency.max_us >= 300);
    }
}

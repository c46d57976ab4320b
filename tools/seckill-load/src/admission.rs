//! The admission scenarios, each with its baselines in the same run, on the same Redis,
//! with the same number of callers and the same sequence of users:
//!
//! - `sale`: a voucher of `stock` units; `attempts` attempts by `users` distinct users
//!   (with repeats) from `callers` callers. Ours vs the tutorial's admission.
//! - `admit`: the stock never runs out and every attempt is a new user, so every attempt
//!   is an admission. Ours, ours without the handler, the tutorial's admission and the
//!   no-op floor, in `rounds` rounds whose order rotates; the round with the median rate
//!   stands for each variant. When Redis's primaries have replicas, also ours with
//!   durable admissions (`ours-durable`: `REDIS_DURABLE_REPLICAS=1`, in process).
//!
//! After each variant the invariants are checked against Redis: nobody admitted beyond
//! the stock, nobody admitted twice, Redis stock + admitted = initial stock. A baseline
//! whose commands the server refuses (the tutorial's script on a cluster of several
//! shards) is not checked: it FAILED, with the server's error ([`RunResult::error`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::Context;
use redis::AsyncCommands;
use seckill_http::Config;
use seckill_shared::config::{EnvReader, RedisConfig};
use seckill_shared::domain::{Voucher, VoucherId};
use seckill_shared::keys::VoucherKeys;
use seckill_shared::protocol::sale_fields;
use serde::{Deserialize, Serialize};

use crate::backends::Bench;
use crate::drivers::{Driver, TutorialKeys, many};
use crate::engine::{Ui, run};
use crate::figures::one_line;
use crate::record::{Check, RunResult};
use crate::redis_info::{info_field, redis_infos};
use crate::workload::{Plan, Tokens};

/// Sizes of a sale (the command line's defaults are the full sizes).
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct SaleOptions {
    /// Units on sale
    #[arg(long, default_value_t = 1_000)]
    pub stock: i64,
    /// Purchase attempts
    #[arg(long, default_value_t = 1_000_000)]
    pub attempts: u64,
    /// Distinct users making them (with repeats)
    #[arg(long, default_value_t = 200_000)]
    pub users: u32,
    /// Concurrent callers, each with its own connections (one Lambda instance each)
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    /// Seed of the sale's user sequence
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run the tutorial's admission too.
    #[arg(skip = true)]
    pub baseline: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SaleReport {
    pub options: SaleOptions,
    pub ours: RunResult,
    pub tutorial: Option<RunResult>,
}

/// Sizes of the admit path.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct AdmitOptions {
    /// Admissions per round (each a new user; the stock never runs out)
    #[arg(
        id = "admit_attempts",
        long = "admit-attempts",
        default_value_t = 200_000
    )]
    pub attempts: u64,
    /// Concurrent callers of the admit path
    #[arg(id = "admit_callers", long = "admit-callers", default_value_t = 64)]
    pub callers: usize,
    /// Rounds; the median round stands for each variant
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Run the baselines (tutorial, floor) and ours without the handler too.
    #[arg(skip = true)]
    pub baseline: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdmitReport {
    pub options: AdmitOptions,
    /// The median round of each variant.
    pub ours: RunResult,
    pub ours_adapter: Option<RunResult>,
    pub tutorial: Option<RunResult>,
    pub floor: Option<RunResult>,
    /// Ours with durable admissions (`REDIS_DURABLE_REPLICAS=1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours_durable: Option<RunResult>,
    /// Why `ours_durable` did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_skipped: Option<String>,
    /// Attempts per second of every round, per variant.
    pub rounds: Vec<Vec<(String, f64)>>,
}

/// `sale`: ours, then the tutorial's admission, over the same sequence of users.
pub async fn sale(bench: &Bench, o: &SaleOptions, ui: &Ui) -> anyhow::Result<SaleReport> {
    anyhow::ensure!(
        o.stock >= 1 && o.attempts >= 1 && o.callers >= 1,
        "sizes must be positive"
    );
    let plan = Arc::new(Plan::mixed(o.attempts, o.users, o.seed));
    let tokens = bench.tokens(plan.users());
    let voucher = bench.voucher("bench sale", o.stock).await?;
    let drivers = ours_drivers(&bench.http, voucher.id, &tokens, o.callers).await?;
    let what = ["sale", "ours", "in-process"];
    let mut ours = run(drivers, plan.clone(), what, o.stock, None, ui).await?;
    check_ours(bench, &voucher, &mut ours).await?;
    eprintln!("  {}", one_line(&ours));
    let mut tutorial = None;
    if o.baseline {
        let t = self::tutorial(bench, "sale", voucher.id, o.stock, plan, o.callers, ui).await?;
        eprintln!("  {}", one_line(&t));
        tutorial = Some(t);
    }
    Ok(SaleReport {
        options: o.clone(),
        ours,
        tutorial,
    })
}

/// `admit`: every attempt is a new user and the stock never runs out.
pub async fn admit(bench: &Bench, o: &AdmitOptions, ui: &Ui) -> anyhow::Result<AdmitReport> {
    anyhow::ensure!(
        o.attempts >= 1 && o.callers >= 1 && o.rounds >= 1,
        "sizes must be positive"
    );
    let plan = Arc::new(Plan::distinct(o.attempts));
    let stock = o.attempts as i64;
    let tokens = bench.tokens(plan.users());
    // Each variant, with the configuration of its handlers in this process (ours).
    let mut variants: Vec<(&str, Option<Config>)> = vec![("ours", Some(bench.http.clone()))];
    if o.baseline {
        variants.extend([("ours-adapter", None), ("tutorial", None), ("floor", None)]);
    }
    let durable = durable_config(bench).await;
    match &durable {
        Ok(cfg) => variants.push(("ours-durable", Some(cfg.clone()))),
        Err(why) => eprintln!("  admit: ours-durable skipped: {why}"),
    }
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); variants.len()];
    for round in 0..o.rounds as usize {
        for k in (0..variants.len()).take_while(|_| !ui.stopped()) {
            let idx = (k + round) % variants.len();
            let (variant, cfg) = &variants[idx];
            let target = if cfg.is_some() { "in-process" } else { "redis" };
            let what = ["admit", variant, target];
            let (redis, callers) = (&bench.http.redis, o.callers);
            let r = match (*variant, cfg) {
                ("tutorial", _) => {
                    let id = VoucherId::new(1_000 + round as i64).context("round voucher id")?;
                    tutorial(bench, "admit", id, stock, plan.clone(), callers, ui).await?
                }
                ("floor", _) => {
                    let drivers = many(callers, || Driver::floor(redis)).await?;
                    let mut r = run(drivers, plan.clone(), what, stock, None, ui).await?;
                    r.checks.push(Check::new(
                        "every call answered",
                        r.outcomes.get("ok").copied().unwrap_or(0) == r.completed,
                        format!("{:?}", r.outcomes),
                    ));
                    r
                }
                (_, cfg) => {
                    let v = bench.voucher("bench admit", stock).await?;
                    let drivers = match cfg {
                        Some(cfg) => ours_drivers(cfg, v.id, &tokens, callers).await?,
                        None => many(callers, || Driver::adapter(redis, v.id)).await?,
                    };
                    let mut r = run(drivers, plan.clone(), what, stock, None, ui).await?;
                    check_ours(bench, &v, &mut r).await?;
                    r
                }
            };
            eprintln!("  {}", one_line(&r));
            results[idx].push(r);
        }
    }
    let rounds = (0..o.rounds as usize)
        .map(|i| {
            variants
                .iter()
                .zip(&results)
                .filter_map(|((v, _), rs)| rs.get(i).map(|r| (v.to_string(), r.attempts_per_s)))
                .collect()
        })
        .collect();
    let mut medians: HashMap<&str, RunResult> = variants
        .iter()
        .zip(results)
        .filter_map(|((v, _), rs)| Some((*v, median_round(rs)?)))
        .collect();
    Ok(AdmitReport {
        options: o.clone(),
        ours: medians
            .remove("ours")
            .context("the run was stopped before ours ran")?,
        ours_adapter: medians.remove("ours-adapter"),
        tutorial: medians.remove("tutorial"),
        floor: medians.remove("floor"),
        ours_durable: medians.remove("ours-durable"),
        durable_skipped: durable.err(),
        rounds,
    })
}

/// The tutorial's admission of `voucher` (keys under the run's prefix) over `plan` in
/// `scenario`, checked unless the server refused it; its keys are deleted afterwards.
async fn tutorial(
    bench: &Bench,
    scenario: &str,
    voucher: VoucherId,
    stock: i64,
    plan: Arc<Plan>,
    callers: usize,
    ui: &Ui,
) -> anyhow::Result<RunResult> {
    let keys = tutorial_keys(bench, &bench.prefix(), voucher, stock).await?;
    let drivers = many(callers, || {
        Driver::tutorial(&bench.tutorial_redis, keys.clone())
    });
    let mut c = bench.tutorial.clone();
    // The tutorial's one stream is shared by every voucher of the run.
    let before: i64 = c.xlen(keys.stream()).await?;
    let what = [scenario, "tutorial", "redis"];
    let mut r = run(drivers.await?, plan, what, stock, None, ui).await?;
    if r.error.is_none() {
        let left: Option<i64> = c.get(keys.stock()).await?;
        let buyers: i64 = c.scard(keys.buyers()).await?;
        let queued: i64 = c.xlen(keys.stream()).await?;
        r.checks = checks(&r, stock, left, buyers, queued - before);
    }
    bench.release_keys(&keys.all()).await?;
    Ok(r)
}

/// seckill-http's configuration with durable admissions (`REDIS_DURABLE_REPLICAS=1`, the
/// function's default timeout), or why `ours-durable` cannot run here.
async fn durable_config(bench: &Bench) -> Result<Config, String> {
    // The fewest replicas of a primary (`None`: no primary answered).
    let infos = redis_infos(&bench.redis, "replication").await;
    let replicas = infos
        .iter()
        .map(|i| info_field(i, "connected_slaves")?.parse::<u32>().ok());
    let n = replicas.min().flatten();
    if n.is_none_or(|n| n < 1) {
        return Err(format!(
            "it needs a replica per Redis primary (WAIT 1) and the primaries have {} (the cluster stack has one: SECKILL_REDIS_TOPOLOGY=cluster)",
            n.map_or("an unknown number".into(), |n| n.to_string())
        ));
    }
    let mut cfg = bench.http.clone();
    // Read as the function reads it, so its default timeout applies.
    let env = [
        ("REDIS_URL", cfg.redis.url.as_str()),
        ("REDIS_DURABLE_REPLICAS", "1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    cfg.redis.durable = RedisConfig::read(&mut EnvReader::from_map(env.into())).durable;
    Ok(cfg)
}

/// The round with the median rate (the lower middle of an even count). Every round's
/// failed checks and first refusal are kept on it, so they are reported.
fn median_round(mut rs: Vec<RunResult>) -> Option<RunResult> {
    let error = rs.iter().find_map(|r| r.error.clone());
    let failed: Vec<Check> = rs
        .iter()
        .flat_map(|r| r.checks.iter().filter(|c| !c.ok).cloned())
        .collect();
    rs.sort_by(|a, b| a.attempts_per_s.total_cmp(&b.attempts_per_s));
    let mut m = rs.swap_remove(rs.len().checked_sub(1)? / 2);
    m.error = m.error.or(error);
    let key = |c: &Check| (c.name.clone(), c.detail.clone());
    let mut seen: HashSet<_> = m.checks.iter().map(key).collect();
    m.checks
        .extend(failed.into_iter().filter(|c| seen.insert(key(c))));
    Some(m)
}

/// `callers` handlers in this process, each an instance of its own configured by `cfg`.
pub(crate) async fn ours_drivers(
    cfg: &Config,
    voucher: VoucherId,
    tokens: &Arc<Tokens>,
    callers: usize,
) -> anyhow::Result<Vec<Driver>> {
    many(callers, || Driver::in_process(cfg, voucher, tokens.clone())).await
}

/// The tutorial's keys under `prefix` (one "deployment" of the tutorial: one global
/// stream and one id counter per prefix), its stock set, every key tracked for cleanup.
pub(crate) async fn tutorial_keys(
    bench: &Bench,
    prefix: &str,
    voucher: VoucherId,
    stock: i64,
) -> anyhow::Result<Arc<TutorialKeys>> {
    let keys = TutorialKeys {
        prefix: prefix.to_string(),
        voucher: voucher.get(),
    };
    let now = time::OffsetDateTime::now_utc();
    for key in keys.all().into_iter().chain([
        keys.id_counter(now),
        keys.id_counter(now + time::Duration::days(1)),
    ]) {
        bench.track_key(key);
    }
    let _: () = bench.tutorial.clone().set(keys.stock(), stock).await?;
    Ok(Arc::new(keys))
}

/// Checks an admission run of ours against Redis, then frees the voucher's keys.
async fn check_ours(bench: &Bench, v: &Voucher, r: &mut RunResult) -> anyhow::Result<()> {
    let k = VoucherKeys::new(v.id);
    let mut c = bench.redis.clone();
    let left: Option<i64> = c.hget(&k.sale, sale_fields::STOCK).await?;
    let buyers: i64 = c.hlen(&k.buyers).await?;
    let queued: i64 = c.xlen(&k.orders).await?;
    r.checks = checks(r, v.stock, left, buyers, queued);
    bench.release_voucher(v.id).await
}

/// The invariants of an admission run. `left`: units Redis says are left; `recorded`:
/// buyers Redis recorded; `queued`: orders queued in the stream.
///
/// An attempt answered `unavailable` (or lost in transport) may or may not have been
/// admitted, so the client's count of admissions is only bounded by those.
pub fn checks(
    r: &RunResult,
    initial: i64,
    left: Option<i64>,
    admitted: i64,
    queued: i64,
) -> Vec<Check> {
    let seen = r.admitted as i64;
    let ambiguous = (r.outcomes.get("unavailable").copied().unwrap_or(0)
        + r.outcomes.get("failed").copied().unwrap_or(0)) as i64;
    let mut users = r.admitted_users.clone();
    users.dedup();
    let mut ids = r.order_ids.clone();
    ids.dedup();
    vec![
        Check::new(
            "admitted <= stock",
            seen <= initial && admitted <= initial,
            format!("answers admitted {seen}, Redis recorded {admitted}, stock {initial}"),
        ),
        Check::new(
            "no user admitted twice",
            users.len() == r.admitted_users.len() && queued == admitted,
            format!(
                "{} admissions to {} distinct users; {queued} orders queued for {admitted} recorded buyers",
                r.admitted_users.len(),
                users.len(),
            ),
        ),
        Check::new(
            "order ids unique",
            ids.len() == r.order_ids.len(),
            format!("{} ids, {} distinct", r.order_ids.len(), ids.len()),
        ),
        Check::new(
            "stock left + admitted = initial",
            left.is_some_and(|left| left + admitted == initial),
            left.map_or("the sale's stock is missing".into(), |left| {
                format!("{left} left + {admitted} admitted vs {initial} initial")
            }),
        ),
        Check::new(
            "answers agree with Redis",
            seen <= admitted && admitted <= seen + ambiguous,
            format!(
                "{seen} admissions answered, {admitted} recorded, {ambiguous} ambiguous answers"
            ),
        ),
    ]
}

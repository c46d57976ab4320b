//! The `buckets` scenario: one hot voucher over k stock buckets.
//!
//! For each k of `--bucket-counts` (default 1, 2, 3): a voucher of k buckets whose
//! stock never runs out, `--bucket-attempts` admissions of distinct users through the
//! in-process handler. Redis's cost is read on the server, per node: `INFO
//! commandstats` before and after (`usec` of the commands callers send, as in the
//! admit scenario), so the run gives the server time per admission and how it spread
//! over the primaries (the largest and smallest share against an even split).
//!
//! Then a sale over the largest k (`--bucket-sale-*`: stock, attempts, users), whose
//! report counts the `sold_out` answers given while a unit was still to be sold
//! (`early_sold_out`, target 0), and the invariants are checked over every bucket.
//!
//! The ceiling on paper for one voucher on ElastiCache Serverless follows from these
//! figures: a slot serves at most [`ECPU_PER_SLOT`] ECPU/s (AWS's published figure);
//! an admission costs (Redis CPU per admission) / (Redis CPU per `SET` of a small value
//! sent alone, the 1-ECPU command, measured in the same run) ECPUs, both with their
//! network I/O, as ElastiCache bills vCPU time; k buckets in k slots multiply the
//! ceiling by k (the borrowing at the end of a sale is a few calls per bucket: the
//! sale reports them, counted per attempt by its instances, against the budget).

use std::collections::BTreeMap;
use std::sync::Arc;

use redis::AsyncCommands;
use seckill_http::admission::borrow_budget;
use seckill_http::costs::BorrowFigures;
use seckill_shared::adapters::redis::RedisConn;
use seckill_shared::domain::{Bucket, Voucher};
use seckill_shared::keys::VoucherKeys;
use seckill_shared::protocol::sale_fields;
use serde::{Deserialize, Serialize};

use crate::admission::{checks, ours_drivers};
use crate::backends::Bench;
use crate::engine::{Ui, run};
use crate::figures::one_line;
use crate::record::{CLIENT_COMMANDS, RunResult};
use crate::workload::Plan;

/// ECPU per second one ElastiCache Serverless slot serves at most (AWS's published
/// per-slot limit; reads from replicas raise it for reads only).
pub const ECPU_PER_SLOT: f64 = 30_000.0;

/// Bucket counts the ceiling table covers.
pub const CEILING_BUCKETS: std::ops::RangeInclusive<u16> = 1..=16;

/// Primaries of the node-based clusters the second ceiling table covers.
pub const NODE_PRIMARIES: [u16; 5] = [1, 3, 6, 12, 16];

/// Where AWS states the per-slot limit (the ElastiCache developer guide, "Scaling
/// ElastiCache Serverless").
pub const ECPU_PER_SLOT_SOURCE: &str =
    "https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/Scaling.html";

/// Sizes of the buckets scenario.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct BucketsOptions {
    /// Admissions per bucket count (each a new user; the stock never runs out)
    #[arg(
        id = "bucket_attempts",
        long = "bucket-attempts",
        default_value_t = 100_000
    )]
    pub attempts: u64,
    /// Concurrent callers (in-process handlers, one Lambda instance each)
    #[arg(id = "bucket_callers", long = "bucket-callers", default_value_t = 64)]
    pub callers: usize,
    /// Bucket counts to measure
    #[arg(
        id = "bucket_counts",
        long = "bucket-counts",
        value_delimiter = ',',
        default_values_t = [1u16, 2, 3]
    )]
    pub counts: Vec<u16>,
    /// Units of the sale over the largest bucket count
    #[arg(
        id = "bucket_sale_stock",
        long = "bucket-sale-stock",
        default_value_t = 1_000
    )]
    pub sale_stock: i64,
    /// Attempts of that sale
    #[arg(
        id = "bucket_sale_attempts",
        long = "bucket-sale-attempts",
        default_value_t = 200_000
    )]
    pub sale_attempts: u64,
    /// Distinct users of that sale
    #[arg(
        id = "bucket_sale_users",
        long = "bucket-sale-users",
        default_value_t = 40_000
    )]
    pub sale_users: u32,
}

/// One bucket count's admissions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BucketRun {
    pub buckets: u16,
    pub run: RunResult,
    /// Server time of the callers' commands per node (`host:port` → µs), this run.
    pub node_us: BTreeMap<String, f64>,
    /// Server time per admission, every node.
    pub us_per_admission: f64,
    /// The busiest and the idlest node's share against an even split over the nodes
    /// that worked (+12.0 = 12 % above), in %.
    pub spread_pct: (f64, f64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BucketsReport {
    pub options: BucketsOptions,
    pub runs: Vec<BucketRun>,
    /// Redis CPU µs per `SET` of a small value sent alone (the 1-ECPU reference).
    pub set_us: Option<f64>,
    /// The sale over the largest bucket count.
    pub sale: Option<RunResult>,
    /// What that sale's borrowing cost, counted by its instances.
    #[serde(default)]
    pub sale_borrowing: Option<SaleBorrowing>,
}

/// The Redis calls of the borrowing attempts (an admission whose own bucket was empty)
/// of the bucket sale, over all its instances, against the per-attempt budget.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SaleBorrowing {
    pub attempts: u64,
    pub mean_calls: f64,
    pub max_calls: u64,
    /// Attempts that stopped on the budget (answered a `sold_out` not remembered).
    pub spent: u64,
    pub budget: u32,
}

impl BucketsReport {
    /// ECPUs per admission: Redis CPU per admission over a SET's, both with their network
    /// I/O (ElastiCache bills vCPU time against a small SET's). Taken from the run with
    /// the fewest buckets: every bucket runs the same script, and on one machine the runs
    /// with more buckets also pay for several busy Redis processes sharing its cores,
    /// which a service giving each slot its own share does not.
    pub fn ecpu_per_admission(&self, _buckets: u16) -> Option<f64> {
        let set = self.set_us.filter(|s| *s > 0.0)?;
        let run = self.runs.iter().min_by_key(|r| r.buckets)?;
        Some(run.run.cpu.as_ref()?.redis_us_per_attempt? / set)
    }

    /// Admissions per second one voucher of `buckets` buckets can reach on ElastiCache
    /// Serverless, on paper.
    pub fn ceiling(&self, buckets: u16) -> Option<f64> {
        Some(f64::from(buckets) * ECPU_PER_SLOT / self.ecpu_per_admission(buckets)?)
    }

    /// Redis CPU per admission (µs, network I/O included), from the run with the fewest
    /// buckets (see [`Self::ecpu_per_admission`]).
    pub fn redis_us_per_admission(&self) -> Option<f64> {
        let run = self.runs.iter().min_by_key(|r| r.buckets)?;
        run.run
            .cpu
            .as_ref()?
            .redis_us_per_attempt
            .filter(|us| *us > 0.0)
    }

    /// Admissions per second one voucher of `buckets` buckets can reach on a node-based
    /// cluster of `primaries` primaries, on paper: each primary's one Redis thread at
    /// full CPU (this machine's) serves 1 s / (Redis CPU per admission). Buyers spread
    /// evenly over the buckets, and the buckets over the primaries as evenly as they
    /// divide, so the primary holding the most buckets (`ceil(k / n)`) saturates first:
    /// `k / ceil(k / n)` primaries' worth.
    pub fn node_ceiling(&self, buckets: u16, primaries: u16) -> Option<f64> {
        let per_primary = 1e6 / self.redis_us_per_admission()?;
        let busiest = buckets.div_ceil(primaries.max(1));
        Some(f64::from(buckets) / f64::from(busiest) * per_primary)
    }
}

/// `buckets`: the admissions for each bucket count, the SET reference, the sale.
pub async fn buckets(bench: &Bench, o: &BucketsOptions, ui: &Ui) -> anyhow::Result<BucketsReport> {
    anyhow::ensure!(
        o.attempts >= 1 && o.callers >= 1 && !o.counts.is_empty(),
        "sizes must be positive"
    );
    let plan = Arc::new(Plan::distinct(o.attempts));
    let tokens = bench.tokens(plan.users());
    let mut runs = Vec::new();
    for &k in &o.counts {
        if ui.stopped() {
            break;
        }
        let stock = o.attempts as i64;
        let v = bench
            .voucher_in_buckets(&format!("bench buckets {k}"), stock, k)
            .await?;
        let drivers = ours_drivers(&bench.http, v.id, &tokens, o.callers).await?;
        let before = node_usec(bench).await;
        let what = ["buckets", &format!("ours-k{k}"), "in-process"];
        let mut r = run(drivers, plan.clone(), what, stock, None, ui).await?;
        let after = node_usec(bench).await;
        check(bench, &v, &mut r).await?;
        let node_us: BTreeMap<String, f64> = after
            .iter()
            .map(|(node, us)| (node.clone(), us - before.get(node).copied().unwrap_or(0.0)))
            .collect();
        let total: f64 = node_us.values().sum();
        let us_per_admission = total / r.admitted.max(1) as f64;
        // An even split over min(k, nodes) nodes: k buckets can load at most k nodes.
        let working = node_us.len().min(usize::from(k)).max(1);
        let mut shares: Vec<f64> = node_us.values().map(|us| us / total.max(1e-9)).collect();
        shares.sort_by(|a, b| b.total_cmp(a));
        shares.truncate(working);
        let even = 1.0 / working as f64;
        let pct = |s: f64| (s / even - 1.0) * 100.0;
        let spread_pct = (
            pct(shares.first().copied().unwrap_or(even)),
            pct(shares.last().copied().unwrap_or(even)),
        );
        eprintln!(
            "  {}; server {us_per_admission:.2} µs/admission; per node {:?}",
            one_line(&r),
            node_us
                .iter()
                .map(|(n, us)| format!("{n} {:.0}%", us / total.max(1e-9) * 100.0))
                .collect::<Vec<_>>()
        );
        runs.push(BucketRun {
            buckets: k,
            run: r,
            node_us,
            us_per_admission,
            spread_pct,
        });
    }
    let set_us = set_reference(bench).await?;
    let (mut sale, mut sale_borrowing) = (None, None);
    if let Some(&k) = o.counts.iter().max()
        && !ui.stopped()
    {
        let plan = Arc::new(Plan::mixed(o.sale_attempts, o.sale_users, 7));
        let tokens = bench.tokens(plan.users());
        let v = bench
            .voucher_in_buckets(&format!("bench bucket sale {k}"), o.sale_stock, k)
            .await?;
        let drivers = ours_drivers(&bench.http, v.id, &tokens, o.callers).await?;
        let apps: Vec<_> = drivers.iter().filter_map(|d| d.app()).collect();
        let what = ["bucket-sale", &format!("ours-k{k}"), "in-process"];
        let mut r = run(drivers, plan, what, o.sale_stock, None, ui).await?;
        check(bench, &v, &mut r).await?;
        let f = apps
            .iter()
            .map(|a| a.borrowing())
            .fold(BorrowFigures::default(), BorrowFigures::plus);
        let b = SaleBorrowing {
            attempts: f.attempts,
            mean_calls: f.mean_calls(),
            max_calls: f.max_calls,
            spent: f.spent,
            budget: borrow_budget(k),
        };
        eprintln!(
            "  {}; sold_out answers while units were left: {}; borrowing: {} attempts, {:.1} Redis calls each, at most {} (budget {}), {} stopped on it",
            one_line(&r),
            r.early_sold_out,
            b.attempts,
            b.mean_calls,
            b.max_calls,
            b.budget,
            b.spent
        );
        sale = Some(r);
        sale_borrowing = Some(b);
    }
    Ok(BucketsReport {
        options: o.clone(),
        runs,
        set_us,
        sale,
        sale_borrowing,
    })
}

/// The server time of the callers' commands so far, per node (`INFO commandstats`).
async fn node_usec(bench: &Bench) -> BTreeMap<String, f64> {
    let reply = redis::cmd("INFO")
        .arg("commandstats")
        .query_async::<redis::Value>(&mut bench.redis.clone())
        .await;
    let texts: Vec<(String, String)> = match reply {
        Ok(redis::Value::Map(pairs)) => pairs
            .into_iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        Ok(v) => text(v)
            .map(|t| ("redis".to_string(), t))
            .into_iter()
            .collect(),
        Err(_) => Vec::new(),
    };
    texts
        .into_iter()
        .map(|(node, info)| (node, client_usec(&info)))
        .collect()
}

fn text(v: redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b).ok(),
        redis::Value::SimpleString(t) | redis::Value::VerbatimString { text: t, .. } => Some(t),
        _ => None,
    }
}

/// `usec` of [`CLIENT_COMMANDS`] in one node's `INFO commandstats`.
fn client_usec(info: &str) -> f64 {
    let stats = crate::redis_info::commandstats([info]);
    CLIENT_COMMANDS
        .iter()
        .filter_map(|name| stats.get(*name))
        .map(|s| s.usec)
        .sum()
}

/// Redis CPU (`INFO cpu`, every node, network I/O included) per `SET` of a 16-byte
/// value sent alone, the 1-ECPU command: 16 connections of their own, 2,000 SETs each,
/// one round trip per SET, as the admissions are sent.
async fn set_reference(bench: &Bench) -> anyhow::Result<Option<f64>> {
    const CONNECTIONS: usize = 16;
    const EACH: usize = 2_000;
    let key = format!("{}ecpu-reference", bench.prefix());
    bench.track_key(key.clone());
    let cpu = |infos: Vec<String>| -> f64 {
        let field = |info: &str, name: &str| -> f64 {
            crate::redis_info::info_field(info, name)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        infos
            .iter()
            .map(|i| field(i, "used_cpu_user") + field(i, "used_cpu_sys"))
            .sum()
    };
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(RedisConn::connect(&bench.http.redis).await?);
    }
    let before = cpu(crate::redis_info::redis_infos(&bench.redis, "cpu").await);
    futures::future::try_join_all(conns.into_iter().map(|mut c| {
        let key = key.clone();
        async move {
            for i in 0..EACH {
                let _: () = c.set(&key, format!("{i:016}")).await?;
            }
            anyhow::Ok(())
        }
    }))
    .await?;
    let after = cpu(crate::redis_info::redis_infos(&bench.redis, "cpu").await);
    let _: i64 = bench.redis.clone().del(&key).await?;
    let per_set_us = (after - before) * 1e6 / (CONNECTIONS * EACH) as f64;
    Ok((per_set_us > 0.0).then_some(per_set_us))
}

/// Checks a bucketed run against Redis (every bucket), then frees the voucher's keys.
async fn check(bench: &Bench, v: &Voucher, r: &mut RunResult) -> anyhow::Result<()> {
    let mut c = bench.redis.clone();
    let (mut left, mut buyers, mut queued) = (0i64, 0i64, 0i64);
    for b in Bucket::all(v.id, v.buckets) {
        let k = VoucherKeys::new(b);
        let stock: Option<i64> = c.hget(&k.sale, sale_fields::STOCK).await?;
        left += stock.unwrap_or(0);
        buyers += c.hlen::<_, i64>(&k.buyers).await?;
        queued += c.xlen::<_, i64>(&k.orders).await?;
    }
    r.checks = checks(r, v.stock, Some(left), buyers, queued);
    bench.release_voucher(v.id).await
}

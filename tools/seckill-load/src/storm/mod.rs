//! `seckill-load storm`: a whole sale at once, seeded and repeatable, against the running
//! local stack, ending with the whole ledger checked.
//!
//! One voucher with every feature on (stock buckets, the waiting room, the payment step,
//! buying again after a close), its buyers over real HTTP through the local gateway at a
//! concurrency of the caller's choosing: they join the room, wait to be served, buy with
//! the entry token, then pay as a provider delivers (three copies at once, a failure then
//! a success, late, twice, the wrong amount first), cancel and buy again, or let the
//! order expire; a second wave buys what came back. Drainers run as the schedule runs
//! them and beside it (overlapping runs), and the plan's faults strike on a timeline
//! drawn from the seed: drainer runs SIGKILLed, a database outage longer than the pay
//! window, answers lost (Data API calls and buyers' HTTP answers), a graceful primary
//! failover and a slot move on the cluster stack. At the end the sale is brought to
//! rest and [`ledger::check`] compares the database and Redis with what everybody was
//! told. The seed is printed; `--seed` replays a plan (docs/testing.md).
//!
//! `--seconds N` is the soak: storms one after another, each with the next seed, until N
//! seconds have passed or one fails.

pub mod buyer;
pub mod client;
pub mod context;
pub mod faults;
pub mod ledger;
pub mod plan;

pub use self::context::Storm;
pub use self::plan::StormOptions;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use seckill_cli::ops::Backends;
use seckill_cli::stack_env::StackEnv;
use seckill_shared::domain::{Bucket, VoucherId, format_rfc3339_millis, now_millis};
use seckill_shared::keys::{VoucherKeys, slot};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use self::buyer::BuyerLog;
use self::client::{Call, Shop};
use self::faults::{DrainerCounts, Machinery};
use self::ledger::Ledger;
use self::plan::Plan;

/// What one storm did and found.
#[derive(Debug, Serialize)]
pub struct StormReport {
    pub seed: u64,
    pub voucher: String,
    pub cluster: bool,
    pub plan: PlanSummary,
    pub answers: std::collections::BTreeMap<String, u64>,
    pub retries: u64,
    pub drainers: DrainerCounts,
    pub fault_errors: Vec<String>,
    pub ledger: Ledger,
    pub elapsed_ms: u64,
    /// The sale at rest, to check its ledger again ([`StormReport::check_again`]).
    #[serde(skip)]
    pub rest: Option<AtRest>,
}

/// A storm's sale at rest and what its buyers were told: what the ledger is checked on.
pub struct AtRest {
    storm: Arc<Storm>,
    logs: Vec<BuyerLog>,
}

impl std::fmt::Debug for AtRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AtRest(voucher {}, {} buyers)",
            self.storm.voucher,
            self.logs.len()
        )
    }
}

/// The plan, counted.
#[derive(Debug, Serialize)]
pub struct PlanSummary {
    pub buyers: usize,
    pub fates: std::collections::BTreeMap<String, u64>,
    pub faults: Vec<String>,
}

impl StormReport {
    /// Whether every promise held.
    pub fn passed(&self) -> bool {
        self.ledger.failures.is_empty() && self.fault_errors.is_empty()
    }

    /// Checks the ledger again as it stands now, against what the buyers were told: how
    /// a test proves the check finds a fault planted after the storm.
    pub async fn check_again(&self) -> anyhow::Result<Ledger> {
        let rest = self
            .rest
            .as_ref()
            .context("this report keeps no sale at rest")?;
        ledger::check(&rest.storm, &rest.logs).await
    }

    /// The report as text: the seed first, then what broke.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let f = &self.ledger.figures;
        let _ = writeln!(
            out,
            "storm seed {} on voucher {} ({} stack), {:.1} s: {}",
            self.seed,
            self.voucher,
            if self.cluster {
                "cluster"
            } else {
                "single-node"
            },
            self.elapsed_ms as f64 / 1000.0,
            if self.passed() { "PASSED" } else { "FAILED" }
        );
        let _ = writeln!(
            out,
            "  plan: {} buyers {:?}",
            self.plan.buyers, self.plan.fates
        );
        for fault in &self.plan.faults {
            let _ = writeln!(out, "  fault: {fault}");
        }
        let _ = writeln!(
            out,
            "  drainers: {} scheduled runs ({} reported errors), {} runs beside them, {} killed",
            self.drainers.scheduled,
            self.drainers.scheduled_failed,
            self.drainers.overlapping,
            self.drainers.killed
        );
        let _ = writeln!(
            out,
            "  answers ({} retries): {:?}",
            self.retries, self.answers
        );
        let _ = writeln!(
            out,
            "  ledger: stock {}, left {} (database) / {} (Redis), rows {:?}, payments {:?}, {} refunds listed, {} dead letters, at rest after {:.1} s",
            f.stock,
            f.stock_left_db,
            f.stock_left_redis,
            f.rows,
            f.payments,
            f.refunds_listed,
            f.dead_letters,
            f.settle_ms as f64 / 1000.0
        );
        for n in &self.ledger.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        for e in &self.fault_errors {
            let _ = writeln!(out, "  FAULT MACHINERY: {e}");
        }
        for e in &self.ledger.failures {
            let _ = writeln!(out, "  BROKEN: {e}");
        }
        if !self.passed() {
            let _ = writeln!(
                out,
                "  replay: seckill-load storm --seed {} (with the same sizes and faults)",
                self.seed
            );
        }
        out
    }
}

/// The order-drainer binary beside this executable (or in its parent folder, for test
/// binaries under `target/debug/deps`).
fn drainer_bin(explicit: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("order-drainer");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "no order-drainer binary beside {}: build it (cargo build --bin order-drainer) or give --drainer-bin",
        exe.display()
    )
}

/// Runs storms as `opts` asks (one, or a soak); each report in order.
pub async fn run(env: &StackEnv, opts: StormOptions) -> anyhow::Result<Vec<StormReport>> {
    let opts = opts.normalise();
    let first = opts.seed.unwrap_or_else(rand::random);
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut seed = first;
    loop {
        eprintln!("storm: seed {seed}");
        let report = one(env, &opts, seed).await?;
        eprint!("{}", report.render());
        let passed = report.passed();
        out.push(report);
        if !passed || t0.elapsed() >= Duration::from_secs(opts.seconds) {
            return Ok(out);
        }
        seed = seed.wrapping_add(1);
    }
}

/// One storm of `seed`.
pub async fn one(env: &StackEnv, opts: &StormOptions, seed: u64) -> anyhow::Result<StormReport> {
    let t0 = Instant::now();
    let machinery = Arc::new(Machinery::new(
        env,
        drainer_bin(opts.drainer_bin.as_ref())?,
    )?);
    let plan = Plan::draw(seed, opts, machinery.cluster());
    let webhook_secret = env.get("SECKILL_PAYMENT_WEBHOOK_SECRET")?;
    let webhook_secret = webhook_secret
        .split(',')
        .next()
        .unwrap_or_default()
        .as_bytes()
        .to_vec();
    let shop = Shop::new(
        env.get("SECKILL_HTTP_URL")?,
        env.get("SECKILL_DEV_JWT_SECRET")?,
        webhook_secret,
        opts.concurrency,
    );
    // The sale: queue open now, sale a few seconds from now, long enough for the
    // second wave, the late payers and the rebuyers.
    let lead_ms = 3_000;
    let begins = now_millis() + lead_ms;
    let window_ms = opts.pay_window_s as i64 * 1000;
    let price = 1250;
    let body = json!({
        "title": format!("storm {seed}"),
        "stock": opts.stock,
        "begins_at": format_rfc3339_millis(begins),
        "ends_at": format_rfc3339_millis(begins + window_ms * 8 + 120_000),
        "pay_within_s": opts.pay_window_s,
        "price_minor": price,
        "currency": "EUR",
        "rebuy_after_close": true,
        "buckets": opts.buckets,
        "entry_rate_per_s": opts.entry_rate,
        "queue_opens_before_s": 60,
    });
    let admin = shop.token("storm-admin", true);
    let create = Call::post("create", "/vouchers")
        .token(&admin)
        .body(serde_json::to_vec(&body)?);
    let created = shop
        .until_final(&create, Duration::from_secs(60))
        .await
        .context("creating the storm's voucher: no answer")?;
    if created.status != 201 {
        bail!(
            "creating the storm's voucher: {} {}",
            created.status,
            created.body
        );
    }
    let voucher = created.str("id").context("the voucher's id")?;
    let vid: VoucherId = voucher.parse()?;
    let storm = Arc::new(Storm {
        opts: opts.clone(),
        voucher: voucher.clone(),
        price: Some(price),
        shop,
        backends: Backends::from_stack(env).await?,
        mysql: mysql_async::Pool::new(env.get("MYSQL_URL")?.as_str()),
    });
    let sale_start = Instant::now() + Duration::from_millis(lead_ms as u64);
    let slots: Vec<u16> = Bucket::all(vid, opts.buckets)
        .map(|b| slot(&VoucherKeys::new(b).sale))
        .collect();

    // Drainers, and the faults on their timeline.
    let drainers = tokio::spawn(machinery.clone().drain_while_running());
    let fault_errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let faults = {
        let (m, errors, plan) = (machinery.clone(), fault_errors.clone(), plan.clone());
        tokio::spawn(async move {
            let all = plan.faults.iter().map(|f| {
                let (m, errors, slots) = (m.clone(), errors.clone(), slots.clone());
                async move {
                    tokio::time::sleep_until(sale_start + f.at).await;
                    let slot_of = |b: u16| slots[usize::from(b) % slots.len()];
                    if let Err(e) = m.inject(&f.fault, slot_of).await {
                        errors
                            .lock()
                            .expect("errors")
                            .push(format!("{:?} at {:?}: {e:#}", f.fault, f.at));
                    }
                }
            });
            futures::future::join_all(all).await;
        })
    };

    // The buyers: the first wave at once (the room orders them), the second once units
    // have come back.
    let bar = if opts.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(plan.buyers.len() as u64).with_style(
            ProgressStyle::with_template(
                "storm [{bar:30}] {pos}/{len} buyers done {elapsed_precise} {msg}",
            )?
            .progress_chars("=> "),
        )
    };
    let second_at = sale_start + Duration::from_millis(window_ms as u64 + 2_000);
    let tasks: Vec<_> = plan
        .buyers
        .iter()
        .cloned()
        .map(|b| {
            let (storm, bar) = (storm.clone(), bar.clone());
            tokio::spawn(async move {
                if b.second_wave {
                    tokio::time::sleep_until(second_at).await;
                }
                let log = buyer::run(&storm, &b).await;
                bar.inc(1);
                log
            })
        })
        .collect();
    let mut logs: Vec<BuyerLog> = Vec::with_capacity(tasks.len());
    for t in tasks {
        logs.push(t.await.context("a buyer task")?);
    }
    bar.finish_and_clear();
    faults.await.context("the fault task")?;
    machinery.stop_drainers();
    drainers.await.context("the drainer task")?;

    // Rest, then the ledger.
    let limit = Duration::from_secs(opts.pay_window_s * 3 + 180);
    let (ledger, settle_ms) = match ledger::settle(&storm, &machinery, limit).await {
        Ok(took) => (ledger::check(&storm, &logs).await?, took.as_millis() as u64),
        Err(why) => {
            let mut l = ledger::check(&storm, &logs).await?;
            l.failures.insert(0, why);
            (l, limit.as_millis() as u64)
        }
    };
    let mut ledger = ledger;
    ledger.figures.settle_ms = settle_ms;
    let (answers, retries) = {
        let tally = storm.shop.tally.lock().expect("tally");
        (tally.answers.clone(), tally.retries)
    };
    let mut fates = std::collections::BTreeMap::new();
    for b in &plan.buyers {
        let name = format!(
            "{:?}{}",
            b.fate,
            if b.second_wave { " (2nd wave)" } else { "" }
        );
        *fates.entry(name).or_default() += 1;
    }
    let fault_errors = fault_errors.lock().expect("errors").clone();
    Ok(StormReport {
        seed,
        voucher,
        cluster: machinery.cluster(),
        plan: PlanSummary {
            buyers: plan.buyers.len(),
            fates,
            faults: plan
                .faults
                .iter()
                .map(|f| format!("{:?} at +{:.1} s", f.fault, f.at.as_secs_f64()))
                .collect(),
        },
        answers,
        retries,
        drainers: machinery.counts(),
        fault_errors,
        ledger,
        elapsed_ms: t0.elapsed().as_millis() as u64,
        rest: Some(AtRest { storm, logs }),
    })
}

//! seckill-load: the command line of the load tool and benchmarks.
//!
//! `seckill-load bench` runs every scenario (or those of `--only`) against the local
//! stack and prints the table of ratios; `seckill-load report` turns a results file into
//! the table, `docs/benchmarks.md`'s results section and the sale's chart again. See
//! `--help` of each, and `docs/benchmarks.md` for the method. Exit status: see
//! [`Results::exit_status`]; 1 on any other failure (backends unreachable, bad arguments).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use order_drainer::config::defaults::BATCH_SIZE;
use seckill_cli::stack_env::StackEnv;
use seckill_load::admission::{self, AdmitOptions, SaleOptions};
use seckill_load::backends::Bench;
use seckill_load::buckets::{self, BucketsOptions};
use seckill_load::drain::{self, CommitLatencyOptions, DrainOptions};
use seckill_load::engine::Ui;
use seckill_load::footprint::{self, FootprintOptions};
use seckill_load::report::{self, Machine, Results};
use seckill_load::{redis_info, svg};
use seckill_shared::domain::{format_rfc3339_millis, now_millis};

#[derive(Parser)]
#[command(
    name = "seckill-load",
    version,
    about = "Load tool and benchmarks of the seckill engine: ours against the tutorial design and the floor, in one run",
    after_help = "Default sizes are the issue's (sale S=1,000 A=1,000,000 U=200,000 C=64); --quick runs a smoke-sized version in well under a minute. Results: --json FILE, --svg FILE (the sale's timeline). Exit status 2 when an invariant is violated, 3 when a baseline FAILED on this server (shown in the table with the server's error), 1 on other errors."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct Global {
    /// The local stack's KEY=VALUE file (default: $SECKILL_STACK_ENV, else .dev/stack.env
    /// here or in a parent folder; variables of the same name override it)
    #[arg(long, global = true, value_name = "FILE")]
    stack_env: Option<PathBuf>,
    /// Write all results as JSON
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the sale's timeline (attempts/s, admitted/s, p99 latency, sell-out) as SVG
    #[arg(long, global = true, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Smoke-test sizes (a run of every scenario takes well under a minute)
    #[arg(long, global = true)]
    quick: bool,
    /// Skip the baselines (tutorial, floor)
    #[arg(long, global = true)]
    no_baseline: bool,
}

/// The scenarios of a run.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Sale,
    Admit,
    Drain,
    CommitLatency,
    Footprint,
    /// One hot voucher over 1, 2, 3 stock buckets: server cost and per-primary load
    /// (meaningful on the cluster stack), and a sale's early refusals.
    Buckets,
}

/// The smoke sizes of --quick: the defaults of these arguments (by id) before parsing,
/// so that sizes given on the command line still win.
const QUICK: &[(&str, &str)] = &[
    ("stock", "100"),
    ("attempts", "20000"),
    ("users", "4000"),
    ("callers", "16"),
    ("admit_attempts", "5000"),
    ("admit_callers", "16"),
    ("rounds", "1"),
    ("orders", "2000"),
    ("batch_sizes", "100,500"),
    ("tutorial_orders", "300"),
    ("floor_rounds", "1"),
    ("pinned_rounds", "1"),
    ("sales", "1,10,100"),
    ("spread_rounds", "1"),
    ("rate", "300"),
    ("seconds", "3"),
    ("latency_callers", "8"),
    ("requests", "1000"),
    ("footprint_orders", "1000"),
    ("bucket_attempts", "5000"),
    ("bucket_callers", "16"),
    ("bucket_sale_stock", "100"),
    ("bucket_sale_attempts", "10000"),
    ("bucket_sale_users", "3000"),
];

// Parsed once per process: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Every scenario in one run (or those of --only), then the table of ratios
    Bench(BenchArgs),
    /// Print the table of a results file; with --markdown, write it into a benchmarks
    /// page (between its results markers); with --svg, draw its sale's timeline
    Report(ReportArgs),
    /// What one sale costs on AWS, service by service, next to the tutorial design,
    /// from measured per-request figures and a price list with its sources
    Cost(seckill_load::cost::CostOptions),
    /// A paced crowd of buyers over real HTTP against the running stack's seckill-http,
    /// to watch a sale happen (the live view, `seckill status --watch`)
    Rush(seckill_load::rush::RushOptions),
    /// A whole sale at once with every feature and fault, seeded, ending with the
    /// ledger checked (exit 2 when a promise broke); --seconds for a soak
    Storm(seckill_load::storm::StormOptions),
    /// Stripe's real events beside a flood of junk at POST /payments/stripe: their
    /// latency and how many apply in time, without junk, with it under the template's
    /// route ceiling, and under the old one (exit 2 when the template's lets one fail)
    Flood(seckill_load::flood::FloodOptions),
    /// Who gets the units that come back to a sold-out room: bots at their limit or
    /// people ahead in line; and the page's voucher reads under a flood (exit 2 when a
    /// returned unit overtook a waiter still looking)
    Fairness(seckill_load::fairness::FairnessOptions),
}

#[derive(Args)]
struct BenchArgs {
    /// Run only these scenarios (the drain's best batch size then sets
    /// commit-latency's only if the drain ran)
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Scenario>,
    #[command(flatten)]
    sale: SaleOptions,
    #[command(flatten)]
    admit: AdmitOptions,
    #[command(flatten)]
    drain: DrainOptions,
    #[command(flatten)]
    latency: CommitLatencyOptions,
    #[command(flatten)]
    footprint: FootprintOptions,
    #[command(flatten)]
    buckets: BucketsOptions,
}

#[derive(Args)]
struct ReportArgs {
    /// A JSON file written by --json
    #[arg(long)]
    input: PathBuf,
    /// The page to update (created from a template when missing)
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// The chart to link from the page, relative to it
    #[arg(long, default_value = "benchmarks-sale.svg")]
    svg_link: String,
}

/// Parses the command line, with the smoke sizes as defaults under --quick.
fn parse(args: &[String]) -> Result<Cli, clap::Error> {
    let mut command = Cli::command();
    if args.iter().any(|a| a == "--quick") {
        command = command.mut_subcommand("bench", |mut bench| {
            for (id, quick) in QUICK {
                bench = bench.mut_arg(*id, |a| a.default_value(*quick));
            }
            bench
        });
    }
    Cli::from_arg_matches(&command.try_get_matches_from(args)?)
}

/// `cost`: prints the bill as Markdown (and writes it as JSON with --json).
fn cost_cmd(g: &Global, o: &seckill_load::cost::CostOptions) -> anyhow::Result<u8> {
    let bill = seckill_load::cost::bill(o)?;
    print!("{}", seckill_load::cost::markdown(&bill));
    if let Some(path) = &g.json {
        std::fs::write(path, serde_json::to_vec_pretty(&bill)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(0)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let cli = parse(&args).unwrap_or_else(|e| e.exit());
    let status = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| match cli.cmd {
            Cmd::Bench(b) => rt.block_on(bench_cmd(&cli.global, b)),
            Cmd::Report(r) => report_cmd(&cli.global, &r),
            Cmd::Cost(o) => cost_cmd(&cli.global, &o),
            Cmd::Rush(o) => rt.block_on(rush_cmd(&cli.global, &o)),
            Cmd::Storm(o) => rt.block_on(storm_cmd(&cli.global, o)),
            Cmd::Flood(o) => rt.block_on(flood_cmd(&cli.global, &o)),
            Cmd::Fairness(o) => rt.block_on(fairness_cmd(&cli.global, &o)),
        });
    match status {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `rush`: the crowd, then its answers (as JSON with --json); 2 on an answer no buyer
/// should see.
async fn rush_cmd(g: &Global, o: &seckill_load::rush::RushOptions) -> anyhow::Result<u8> {
    let stack = StackEnv::load(g.stack_env.as_deref())?;
    let summary = seckill_load::rush::rush(&stack, o).await?;
    println!(
        "{} buyers in {:.1} s: {:?}; {} retries after 503/429; {} unexpected answers",
        o.buyers,
        summary.elapsed_ms as f64 / 1000.0,
        summary.answers,
        summary.retries,
        summary.unexpected
    );
    if let Some(path) = &g.json {
        write_file(path, &serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(if summary.unexpected > 0 { 2 } else { 0 })
}

/// `flood`: the three rows, then the table (as JSON with --json); 2 when a real event
/// failed to apply in time under the template's ceiling.
async fn flood_cmd(g: &Global, o: &seckill_load::flood::FloodOptions) -> anyhow::Result<u8> {
    let stack = StackEnv::load(g.stack_env.as_deref())?;
    let report = seckill_load::flood::flood(&stack, o).await?;
    print!("{}", report.render());
    if let Some(path) = &g.json {
        write_file(path, &serde_json::to_string_pretty(&report)?)?;
    }
    let held = report.rows.get(1).is_some_and(|r| r.applied == r.events);
    Ok(if held { 0 } else { 2 })
}

/// `fairness`: both runs' table (and JSON with --json); 2 when the line let a returned
/// unit overtake a waiter still looking.
async fn fairness_cmd(
    g: &Global,
    o: &seckill_load::fairness::FairnessOptions,
) -> anyhow::Result<u8> {
    let stack = StackEnv::load(g.stack_env.as_deref())?;
    let report = seckill_load::fairness::fairness(&stack, o).await?;
    print!("{}", report.render());
    if let Some(path) = &g.json {
        write_file(path, &serde_json::to_string_pretty(&report)?)?;
    }
    Ok(if report.line.overtakes == 0 { 0 } else { 2 })
}

/// `storm`: one storm or a soak, each report printed (and all as JSON with --json); 2
/// when a promise broke.
async fn storm_cmd(g: &Global, o: seckill_load::storm::StormOptions) -> anyhow::Result<u8> {
    let stack = StackEnv::load(g.stack_env.as_deref())?;
    let reports = seckill_load::storm::run(&stack, o).await?;
    if let Some(path) = &g.json {
        write_file(path, &serde_json::to_string_pretty(&reports)?)?;
    }
    let failed = reports.iter().filter(|r| !r.passed()).count();
    println!(
        "{} storm(s), {} failed; seeds {:?}",
        reports.len(),
        failed,
        reports.iter().map(|r| r.seed).collect::<Vec<_>>()
    );
    Ok(if failed > 0 { 2 } else { 0 })
}

/// Runs every scenario asked for; `Ok` with the exit status.
async fn bench_cmd(g: &Global, mut b: BenchArgs) -> anyhow::Result<u8> {
    let baseline = !g.no_baseline;
    (b.sale.baseline, b.admit.baseline, b.drain.baseline) = (baseline, baseline, baseline);
    // The handler's logs as in Lambda (AWS_LAMBDA_LOG_FORMAT=JSON, RUST_LOG=info), written
    // nowhere: formatting them is part of what a request costs.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .without_time()
        .with_target(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .try_init();
    let stack = StackEnv::load(g.stack_env.as_deref())?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_on_ctrl_c = stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted: finishing the current run, then cleaning up");
            stop_on_ctrl_c.store(true, Ordering::Relaxed);
        }
    });
    let mut results = Results {
        tool: format!("seckill-load {}", env!("CARGO_PKG_VERSION")),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_at: format_rfc3339_millis(now_millis()),
        machine_before: Machine::read(),
        ..Results::default()
    };
    let bench = Bench::on_stack(&stack).await?;
    eprintln!(
        "benchmark database {} on the stack's MariaDB through the Data API at {}; Redis {}; key prefix {}",
        bench.database(),
        bench.data_api_url(),
        bench.http.redis.url,
        bench.prefix()
    );
    versions(&bench, &mut results.machine_before).await;
    eprintln!("machine: {}", results.machine_before.describe());
    let ui = Ui {
        progress: true,
        stop,
        max_run: Duration::from_secs(600),
        redis_probe: Some(bench.redis.clone()),
    };
    let runs = |x: Scenario| b.only.is_empty() || b.only.contains(&x);
    let (s, a, d, l) = (&b.sale, &b.admit, &b.drain, &mut b.latency);
    let outcome = async {
        if runs(Scenario::Sale) {
            eprintln!(
                "sale: stock {}, {} attempts by {} users from {} callers",
                s.stock, s.attempts, s.users, s.callers
            );
            results.sale = Some(admission::sale(&bench, s, &ui).await?);
        }
        if runs(Scenario::Admit) {
            eprintln!(
                "admit: {} admissions per round from {} callers, {} round(s)",
                a.attempts, a.callers, a.rounds
            );
            results.admit = Some(admission::admit(&bench, a, &ui).await?);
        }
        if runs(Scenario::Drain) {
            eprintln!(
                "drain: {} orders per run, batch sizes {:?}; tutorial consumer {} orders",
                d.orders, d.batch_sizes, d.tutorial_orders
            );
            results.drain = Some(drain::drain(&bench, d, &ui).await?);
        }
        if runs(Scenario::CommitLatency) {
            // 0: the drain's best batch size, when it ran.
            if l.batch_size == 0 {
                let best = results.drain.as_ref().and_then(|d| d.best());
                l.batch_size = best.map_or(BATCH_SIZE, |b| b.batch_size);
            }
            results.commit_latency = Some(drain::commit_latency(&bench, l, &ui).await?);
        }
        if runs(Scenario::Footprint) {
            results.footprint = Some(footprint::footprint(&bench, &b.footprint, &ui).await?);
        }
        if runs(Scenario::Buckets) {
            let o = &b.buckets;
            eprintln!(
                "buckets: {} admissions for each of {:?} buckets from {} callers; a sale of {} units over {} buckets",
                o.attempts,
                o.counts,
                o.callers,
                o.sale_stock,
                o.counts.iter().max().copied().unwrap_or(1)
            );
            results.buckets = Some(buckets::buckets(&bench, o, &ui).await?);
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = bench.cleanup().await {
        eprintln!("warning: cleanup failed: {e:#}");
    }
    outcome?;
    results.finished_at = format_rfc3339_millis(now_millis());
    let mut after = Machine::read();
    after.redis_version = results.machine_before.redis_version.clone();
    after.mariadb_version = results.machine_before.mariadb_version.clone();
    results.machine_after = Some(after);
    finish(g, &results)
}

async fn versions(b: &Bench, m: &mut Machine) {
    let info = redis_info::redis_infos(&b.redis, "server").await;
    let field = |k: &str| info.first().and_then(|i| redis_info::info_field(i, k));
    // Valkey answers redis_version 7.2.4 (for clients) and its own in valkey_version.
    m.redis_version = match (field("redis_version"), field("valkey_version")) {
        (r, Some(v)) => Some(format!("{} (Valkey {v})", r.unwrap_or("?"))),
        (r, None) => r.map(str::to_string),
    };
    let out = b.db.execute("SELECT VERSION()", vec![], None).await;
    let version = out.as_ref().ok().and_then(|o| o.records().first()?.first());
    m.mariadb_version = version.and_then(seckill_shared::adapters::data_api::field::string);
}

/// Prints the table, writes the files; `Ok` with the exit status.
fn finish(g: &Global, results: &Results) -> anyhow::Result<u8> {
    let rows = report::rows(results);
    if !rows.is_empty() {
        println!("\n{}", report::text_table(&rows));
    }
    if let Some(path) = &g.json {
        write_file(path, &serde_json::to_string_pretty(results)?)?;
        eprintln!("results written to {}", path.display());
    }
    draw(g, results)?;
    let checks = results.checks();
    for (run, c) in checks.iter().filter(|(_, c)| !c.ok) {
        eprintln!("INVARIANT VIOLATED in {run}: {}: {}", c.name, c.detail);
    }
    if checks.iter().all(|(_, c)| c.ok) {
        eprintln!("all invariants held ({} checks)", checks.len());
    }
    for (run, e) in results.failed() {
        eprintln!("BASELINE FAILED on this server in {run}: {e}");
    }
    Ok(results.exit_status())
}

/// Draws the sale's timeline when --svg asks for it.
fn draw(g: &Global, results: &Results) -> anyhow::Result<()> {
    if let Some(path) = &g.svg {
        match svg::sale_chart(results, path)? {
            true => eprintln!("timeline drawn to {}", path.display()),
            false => eprintln!("warning: --svg draws the sale's timeline; no sale ran"),
        }
    }
    Ok(())
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

const BEGIN: &str =
    "<!-- results:begin (written by `seckill-load report`; do not edit by hand) -->";
const END: &str = "<!-- results:end -->";

fn report_cmd(g: &Global, r: &ReportArgs) -> anyhow::Result<u8> {
    let input = &r.input;
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("cannot read {}", input.display()))?;
    let results: Results = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a seckill-load results file", input.display()))?;
    let rows = report::rows(&results);
    println!("{}", report::text_table(&rows));
    draw(g, &results)?;
    if let Some(md) = &r.markdown {
        let block = format!(
            "{BEGIN}\n{}\n{END}",
            report::results_markdown(&results, &rows, &r.svg_link)
        );
        let page = match std::fs::read_to_string(md) {
            Ok(old) => match (old.find(BEGIN), old.find(END)) {
                (Some(a), Some(b)) if a < b => {
                    format!("{}{block}{}", &old[..a], &old[b + END.len()..])
                }
                _ => bail!(
                    "{} has no results markers ({BEGIN} ... {END}); add them where the results go",
                    md.display()
                ),
            },
            Err(_) => format!("# Benchmarks\n\n{block}\n"),
        };
        write_file(md, &page)?;
        eprintln!("{} updated", md.display());
    }
    Ok(results.exit_status())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(line: &str) -> (SaleOptions, DrainOptions) {
        let args: Vec<String> = line.split(' ').map(String::from).collect();
        match parse(&args).expect("the line parses").cmd {
            Cmd::Bench(b) => (b.sale, b.drain),
            Cmd::Report(_)
            | Cmd::Cost(_)
            | Cmd::Rush(_)
            | Cmd::Storm(_)
            | Cmd::Flood(_)
            | Cmd::Fairness(_) => {
                panic!("not bench")
            }
        }
    }

    #[test]
    fn quick_sizes_are_defaults_that_given_sizes_override() {
        Cli::command().debug_assert();
        let (sale, drain) = bench("seckill-load bench --stock 7");
        assert_eq!((sale.stock, sale.attempts), (7, 1_000_000));
        assert_eq!(drain.batch_sizes, [100, 250, 500, 1000, 2000]);
        let (sale, drain) = bench("seckill-load --quick bench --stock 7 --sales 1,2");
        assert_eq!((sale.stock, sale.attempts, sale.users), (7, 20_000, 4_000));
        assert_eq!(
            (drain.batch_sizes, drain.sales),
            (vec![100, 500], vec![1, 2])
        );
        // Every id of the table is an argument of bench.
        let command = Cli::command();
        let bench = command.find_subcommand("bench").expect("bench");
        for (id, _) in QUICK {
            assert!(bench.get_arguments().any(|a| a.get_id() == *id), "{id}");
        }
    }
}

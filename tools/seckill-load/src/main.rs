//! seckill-load: the command line of the load tool and benchmarks.
//!
//! `seckill-load bench` runs every scenario (or those of `--only`) against the local
//! stack and prints the table of ratios; `seckill-load report` turns a results file into
//! the table, `docs/benchmarks.md`'s results section and the sale's chart again. See
//! `--help` of each, and `docs/benchmarks.md` for the method.
//!
//! Exit status: 0 when every invariant held and every variant ran, 2 when an invariant
//! was violated, 3 when every invariant held but a baseline FAILED on this server (the
//! tutorial's script on a Redis cluster of several shards: the table shows FAILED and
//! the server's error), 1 on any other failure (backends unreachable, bad arguments,
//! ...).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use seckill_cli::stack_env::StackEnv;
use seckill_load::admission::{self, AdmitOptions, SaleOptions};
use seckill_load::backends::{self, Bench};
use seckill_load::drain::{self, CommitLatencyOptions, DrainOptions};
use seckill_load::engine::Ui;
use seckill_load::footprint::{self, FootprintOptions};
use seckill_load::report::{self, Machine, Results};
use seckill_load::svg;

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
    /// Seed of the sale's user sequence
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
}

/// The scenarios of a run.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Sale,
    Admit,
    Drain,
    CommitLatency,
    Footprint,
}

#[derive(Args, Clone, Default)]
struct SaleArgs {
    /// Units on sale [default: 1000]
    #[arg(long)]
    stock: Option<i64>,
    /// Purchase attempts [default: 1000000]
    #[arg(long)]
    attempts: Option<u64>,
    /// Distinct users making them (with repeats) [default: 200000]
    #[arg(long)]
    users: Option<u32>,
    /// Concurrent callers, each with its own connections (one Lambda instance each)
    /// [default: 64]
    #[arg(long)]
    callers: Option<usize>,
}

#[derive(Args, Clone, Default)]
struct AdmitArgs {
    /// Admissions per round (each a new user; the stock never runs out) [default: 200000]
    #[arg(long = "admit-attempts")]
    attempts: Option<u64>,
    /// Concurrent callers [default: 64]
    #[arg(long = "admit-callers")]
    callers: Option<usize>,
    /// Rounds; the median round stands for each variant [default: 3]
    #[arg(long)]
    rounds: Option<u32>,
}

#[derive(Args, Clone, Default)]
struct DrainArgs {
    /// Orders waiting in the stream per run [default: 20000]
    #[arg(long)]
    orders: Option<u64>,
    /// DRAINER_BATCH_SIZE values to sweep [default: 100,250,500,1000,2000]
    #[arg(long, value_delimiter = ',')]
    batch_sizes: Option<Vec<usize>>,
    /// Orders for the tutorial consumer [default: 3000]
    #[arg(long)]
    tutorial_orders: Option<u64>,
    /// Rows per INSERT of the database floor
    #[arg(long, default_value_t = 1000)]
    floor_batch: usize,
    /// Sales the orders are spread over, each count drained by one invocation
    /// [default: 1,10,100]
    #[arg(long, value_delimiter = ',')]
    sales: Option<Vec<usize>>,
}

#[derive(Args, Clone, Default)]
struct LatencyArgs {
    /// Admissions per second while the drainer runs [default: 1000]
    #[arg(long)]
    rate: Option<f64>,
    /// For this long [default: 15]
    #[arg(long)]
    seconds: Option<f64>,
    /// Callers of the paced admissions [default: 16]
    #[arg(long = "latency-callers")]
    callers: Option<usize>,
    /// DRAINER_BATCH_SIZE of the invocation (default: the drain sweep's best, else the drainer's default)
    #[arg(long = "latency-batch")]
    batch_size: Option<usize>,
}

#[derive(Args, Clone)]
struct FootprintArgs {
    /// The seckill-http release binary
    #[arg(long, default_value = "target/release/seckill-http")]
    http_bin: PathBuf,
    /// The order-drainer release binary
    #[arg(long, default_value = "target/release/order-drainer")]
    drainer_bin: PathBuf,
    /// Admissions sent to seckill-http [default: 20000]
    #[arg(long)]
    requests: Option<u64>,
    /// Orders for the drainer's invocation [default: 20000]
    #[arg(long = "footprint-orders")]
    orders: Option<u64>,
}

// Parsed once per process: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Every scenario in one run (or those of --only), then the table of ratios
    Bench {
        /// Run only these scenarios (the drain's best batch size then sets
        /// commit-latency's only if the drain ran)
        #[arg(long, value_enum, value_delimiter = ',')]
        only: Vec<Scenario>,
        #[command(flatten)]
        sale: SaleArgs,
        #[command(flatten)]
        admit: AdmitArgs,
        #[command(flatten)]
        drain: DrainArgs,
        #[command(flatten)]
        latency: LatencyArgs,
        #[command(flatten)]
        footprint: FootprintArgs,
    },
    /// Print the table of a results file; with --markdown, write it into a benchmarks
    /// page (between its results markers); with --svg, draw its sale's timeline
    Report {
        /// A JSON file written by --json
        #[arg(long)]
        input: PathBuf,
        /// The page to update (created from a template when missing)
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// The chart to link from the page, relative to it
        #[arg(long, default_value = "benchmarks-sale.svg")]
        svg_link: String,
    },
}

/// Default sizes: (full, quick).
struct Sizes {
    quick: bool,
}

impl Sizes {
    fn n(&self, given: Option<u64>, full: u64, quick: u64) -> u64 {
        given.unwrap_or(if self.quick { quick } else { full })
    }

    fn c(&self, given: Option<usize>, full: usize, quick: usize) -> usize {
        given.unwrap_or(if self.quick { quick } else { full })
    }

    fn sale(&self, a: &SaleArgs, seed: u64, baseline: bool) -> SaleOptions {
        SaleOptions {
            stock: self.n(a.stock.map(|s| s.max(0) as u64), 1_000, 100) as i64,
            attempts: self.n(a.attempts, 1_000_000, 20_000),
            users: self.n(a.users.map(u64::from), 200_000, 4_000) as u32,
            callers: self.c(a.callers, 64, 16),
            seed,
            baseline,
        }
    }

    fn admit(&self, a: &AdmitArgs, baseline: bool) -> AdmitOptions {
        AdmitOptions {
            attempts: self.n(a.attempts, 200_000, 5_000),
            callers: self.c(a.callers, 64, 16),
            rounds: a.rounds.unwrap_or(if self.quick { 1 } else { 3 }),
            baseline,
        }
    }

    fn drain(&self, a: &DrainArgs, baseline: bool) -> DrainOptions {
        DrainOptions {
            orders: self.n(a.orders, 20_000, 2_000),
            batch_sizes: a.batch_sizes.clone().unwrap_or_else(|| {
                if self.quick {
                    vec![100, 500]
                } else {
                    vec![100, 250, 500, 1000, 2000]
                }
            }),
            tutorial_orders: self.n(a.tutorial_orders, 3_000, 300),
            floor_batch: a.floor_batch.max(1),
            baseline,
            sales: a.sales.clone().unwrap_or_else(|| vec![1, 10, 100]),
        }
    }

    fn latency(&self, a: &LatencyArgs, best_batch: Option<usize>) -> CommitLatencyOptions {
        CommitLatencyOptions {
            rate: a.rate.unwrap_or(if self.quick { 300.0 } else { 1_000.0 }),
            seconds: a.seconds.unwrap_or(if self.quick { 3.0 } else { 15.0 }),
            callers: self.c(a.callers, 16, 8),
            batch_size: a
                .batch_size
                .or(best_batch)
                .unwrap_or(order_drainer::config::defaults::BATCH_SIZE),
        }
    }

    fn footprint(&self, a: &FootprintArgs) -> FootprintOptions {
        FootprintOptions {
            http_bin: a.http_bin.clone(),
            drainer_bin: a.drainer_bin.clone(),
            requests: self.n(a.requests, 20_000, 1_000),
            orders: self.n(a.orders, 20_000, 1_000),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Runs the command; `Ok` with the exit status ([`Results::exit_status`]).
async fn run(cli: Cli) -> anyhow::Result<u8> {
    let g = &cli.global;
    let Cmd::Bench {
        only,
        sale: s,
        admit: a,
        drain: d,
        latency: l,
        footprint: f,
    } = &cli.cmd
    else {
        let Cmd::Report {
            input,
            markdown,
            svg_link,
        } = &cli.cmd
        else {
            unreachable!("two commands")
        };
        return report_cmd(g, input, markdown.as_deref(), svg_link);
    };
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
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: finishing the current run, then cleaning up");
                stop.store(true, Ordering::Relaxed);
            }
        });
    }
    let mut results = Results {
        tool: format!("seckill-load {}", env!("CARGO_PKG_VERSION")),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_at: report::now_rfc3339(),
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
    let runs = |x: Scenario| only.is_empty() || only.contains(&x);
    let sizes = Sizes { quick: g.quick };
    let baseline = !g.no_baseline;
    let outcome = async {
        if runs(Scenario::Sale) {
            let o = sizes.sale(s, g.seed, baseline);
            eprintln!(
                "sale: stock {}, {} attempts by {} users from {} callers",
                o.stock, o.attempts, o.users, o.callers
            );
            results.sale = Some(admission::sale(&bench, &o, &ui).await?);
        }
        if runs(Scenario::Admit) {
            let o = sizes.admit(a, baseline);
            eprintln!(
                "admit: {} admissions per round from {} callers, {} round(s)",
                o.attempts, o.callers, o.rounds
            );
            results.admit = Some(admission::admit(&bench, &o, &ui).await?);
        }
        if runs(Scenario::Drain) {
            let o = sizes.drain(d, baseline);
            eprintln!(
                "drain: {} orders per run, batch sizes {:?}; tutorial consumer {} orders",
                o.orders, o.batch_sizes, o.tutorial_orders
            );
            results.drain = Some(drain::drain(&bench, &o, &ui).await?);
        }
        if runs(Scenario::CommitLatency) {
            let best = results
                .drain
                .as_ref()
                .and_then(|d| d.best())
                .map(|b| b.batch_size);
            let o = sizes.latency(l, best);
            results.commit_latency = Some(drain::commit_latency(&bench, &o, &ui).await?);
        }
        if runs(Scenario::Footprint) {
            let o = sizes.footprint(f);
            results.footprint = Some(footprint::footprint(&bench, &o, &ui).await?);
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = bench.cleanup().await {
        eprintln!("warning: cleanup failed: {e:#}");
    }
    outcome?;
    results.finished_at = report::now_rfc3339();
    let mut after = Machine::read();
    after.redis_version = results.machine_before.redis_version.clone();
    after.mariadb_version = results.machine_before.mariadb_version.clone();
    results.machine_after = Some(after);
    finish(g, &results)
}

async fn versions(b: &Bench, m: &mut Machine) {
    let info = backends::redis_info(&b.redis, "server").await;
    let field = |k: &str| info.as_deref().and_then(|i| backends::info_field(i, k));
    // Valkey answers redis_version 7.2.4 (for clients) and its own in valkey_version.
    m.redis_version = match (field("redis_version"), field("valkey_version")) {
        (r, Some(v)) => Some(format!("{} (Valkey {v})", r.unwrap_or("?"))),
        (r, None) => r.map(str::to_string),
    };
    if let Ok(out) = b.db.execute("SELECT VERSION()", vec![], None).await {
        m.mariadb_version = out
            .records()
            .first()
            .and_then(|r| r.first())
            .and_then(seckill_shared::adapters::data_api::field::string);
    }
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
    let violated: Vec<_> = results
        .checks()
        .into_iter()
        .filter(|(_, c)| !c.ok)
        .collect();
    for (run, c) in &violated {
        eprintln!("INVARIANT VIOLATED in {run}: {}: {}", c.name, c.detail);
    }
    if violated.is_empty() {
        eprintln!("all invariants held ({} checks)", results.checks().len());
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

fn report_cmd(
    g: &Global,
    input: &Path,
    markdown: Option<&Path>,
    svg_link: &str,
) -> anyhow::Result<u8> {
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("cannot read {}", input.display()))?;
    let results: Results = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a seckill-load results file", input.display()))?;
    let rows = report::rows(&results);
    println!("{}", report::text_table(&rows));
    draw(g, &results)?;
    if let Some(md) = markdown {
        let block = format!(
            "{BEGIN}\n{}\n{END}",
            report::results_markdown(&results, &rows, svg_link)
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

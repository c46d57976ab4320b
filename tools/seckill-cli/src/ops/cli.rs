//! The arguments of the operator subcommands and how their results are printed; the
//! logic is in the sibling modules.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::{Backends, dead_letters, reconcile, status, voucher_arg};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The voucher; every active voucher when omitted.
    pub voucher: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Refresh with a progress bar of the sale until it is drained.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
}

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Show each dead letter and why it failed.
    List {
        voucher: String,
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back on the orders stream (all, or those named by --id), once.
    Replay {
        voucher: String,
        /// A dead letter's id (repeatable); all of the voucher's when omitted.
        #[arg(long = "id")]
        ids: Vec<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    pub voucher: String,
    /// Fix the discrepancies that can be fixed without risk.
    #[arg(long)]
    pub repair: bool,
    #[arg(long)]
    pub json: bool,
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub async fn run_status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let ids = match &args.voucher {
        Some(v) => vec![voucher_arg(v)?],
        None => vec![],
    };
    let b = Backends::from_env().await?;
    if args.watch {
        status::watch(
            &b,
            &ids,
            std::time::Duration::from_secs_f64(args.interval.max(0.1)),
        )
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let all = status::status(&b, &ids).await?;
    if args.json {
        print_json(&all)?;
    } else {
        print!("{}", status::render(&all));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run_dead_letters(cmd: DeadLettersCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DeadLettersCommand::List { voucher, json } => {
            let voucher = voucher_arg(&voucher)?;
            let b = Backends::from_env().await?;
            let all = dead_letters::list(&b, voucher).await?;
            if json {
                print_json(&all)?;
            } else {
                print!("{}", dead_letters::render_list(voucher, &all));
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Replay { voucher, ids, json } => {
            let voucher = voucher_arg(&voucher)?;
            let b = Backends::from_env().await?;
            let done = dead_letters::replay(&b, voucher, &ids).await?;
            if json {
                print_json(&done)?;
            } else {
                print!("{}", dead_letters::render_replay(&done));
            }
            let refused = done
                .iter()
                .any(|r| !matches!(r, dead_letters::Replay::Replayed { .. }));
            Ok(if refused {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

pub async fn run_reconcile(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let voucher = voucher_arg(&args.voucher)?;
    let b = Backends::from_env().await?;
    let report = reconcile::reconcile(&b, voucher, args.repair).await?;
    if args.json {
        print_json(&report)?;
    } else {
        print!("{}", reconcile::render(&report));
    }
    Ok(if report.clean_after() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

//! `seckill`: operator commands.
//!
//! - `seckill migrate`: applies `migrations/` through the RDS Data API, locally (against
//!   `tools/data-api-local`) and in AWS (against the Aurora cluster) alike;
//! - `seckill token`: mints an HS256 token with the local dev secret;
//! - `seckill demo`: runs a small sale over HTTP against the local stack;
//! - `seckill status`, `seckill dead-letters`, `seckill reconcile`: operating a sale
//!   (`seckill_cli::ops`).

mod demo;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use seckill_cli::migrate::{self, MigrateConfig};
use seckill_cli::ops::cli;
use seckill_shared::auth;
use seckill_shared::config::EnvReader;

#[derive(Parser)]
#[command(
    name = "seckill",
    about = "Operator commands for the seckill flash-sale engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a small flash sale end to end over the HTTP API and check the invariants.
    Demo(demo::DemoArgs),
    /// Apply pending migrations through the Data API with the master secret, then make the
    /// functions' database user from its own secret (reads DB_CLUSTER_ARN, DB_NAME, the
    /// master secret DB_MASTER_SECRET_ARN, else DB_SECRET_ARN, the application user's
    /// secret DB_APP_SECRET_ARN, optional DATA_API_URL and SECRETS_MANAGER_URL, and the
    /// standard AWS credentials and region).
    Migrate {
        /// Apply to this database instead of DB_NAME.
        #[arg(long)]
        database: Option<String>,
        /// The application user's secret, instead of DB_APP_SECRET_ARN.
        #[arg(long)]
        app_secret_arn: Option<String>,
    },
    /// Print a signed dev token (HS256 with SECKILL_DEV_JWT_SECRET) for local calls.
    Token {
        /// The user id (the `sub` claim).
        #[arg(long)]
        sub: String,
        /// Add the `seckill/admin` scope.
        #[arg(long)]
        admin: bool,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl: i64,
        #[arg(long, env = "SECKILL_DEV_JWT_SECRET", hide_env_values = true)]
        secret: String,
    },
    /// Per voucher: stock in Redis and the database, admitted, confirmed, rejected,
    /// pending, dead letters, window (every active voucher when none is named).
    Status(cli::StatusArgs),
    /// List dead letters and why they failed, or replay them through the drainer.
    #[command(subcommand)]
    DeadLetters(cli::DeadLettersCommand),
    /// Compare buyers, stream, dead letters and orders table; `--repair` the safe classes.
    Reconcile(cli::ReconcileArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    seckill_shared::telemetry::init();
    match Cli::parse().command {
        Command::Status(args) => return cli::run_status(args).await,
        Command::DeadLetters(cmd) => return cli::run_dead_letters(cmd).await,
        Command::Reconcile(args) => return cli::run_reconcile(args).await,
        Command::Demo(args) => demo::run(args).await?,
        Command::Migrate {
            database,
            app_secret_arn,
        } => {
            let mut env = EnvReader::from_env();
            let mut cfg = MigrateConfig::read(&mut env);
            if let Some(db) = database {
                cfg.data_api.database = db;
            }
            if app_secret_arn.is_some() {
                cfg.app_secret_arn = app_secret_arn;
            }
            env.finish()?;
            print!("{}", migrate::run(&cfg).await?);
        }
        Command::Token {
            sub,
            admin,
            ttl,
            secret,
        } => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
            let scope = admin.then_some(auth::ADMIN_SCOPE);
            println!(
                "{}",
                auth::mint_hs256(secret.as_bytes(), &sub, scope, now + ttl)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

//! `seckill`: operator commands. Their arguments and printing; the logic is in the
//! library (`seckill_cli::migrate`, `seckill_cli::ops`), but for `demo` and `token`.

mod demo;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use seckill_cli::migrate::{self, MigrateConfig};
use seckill_cli::ops::dead_letters::{self, Replay};
use seckill_cli::ops::{Backends, pay, reconcile, status, stripe, voucher_arg};
use seckill_shared::auth;
use seckill_shared::config::EnvReader;
use serde::Serialize;

/// Operator commands for the seckill flash-sale engine
#[derive(Parser)]
#[command(name = "seckill")]
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
    Status {
        /// The voucher; every active voucher when omitted.
        voucher: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Refresh with a progress bar of the sale until it is drained.
        #[arg(long)]
        watch: bool,
        /// Seconds between refreshes with --watch.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// List dead letters and why they failed, or replay them through the drainer.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
    /// Pay an order as the payment provider does: a signed `payment.succeeded` event sent
    /// to the webhook (reads SECKILL_HTTP_URL and SECKILL_PAYMENT_WEBHOOK_SECRET, from
    /// `.dev/stack.env` on the local stack). Exit status 2 unless every answer is 2xx.
    ///
    /// With --stripe: the buyer checks out, pays the order's PaymentIntent at the local
    /// Stripe with --card, and Stripe's event goes to POST /payments/stripe (reads
    /// STRIPE_API_BASE, STRIPE_SECRET_KEY, STRIPE_WEBHOOK_SECRET, SECKILL_DEV_JWT_SECRET).
    Pay {
        order: String,
        #[command(flatten)]
        opts: pay::PayOptions,
        #[command(flatten)]
        stripe: stripe::StripeOptions,
        #[arg(long)]
        json: bool,
    },
    /// Issue (or retry) a payment's refund now through Stripe, as a drainer run does
    /// (reads STRIPE_SECRET_KEY and STRIPE_API_BASE, default Stripe's own). Exit status
    /// 2 unless Stripe took the refund.
    Refund {
        payment_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Compare buyers, stream, dead letters and orders table; `--repair` the safe classes.
    Reconcile {
        voucher: String,
        /// Fix the discrepancies that can be fixed without risk.
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DeadLetters {
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

/// Prints `value` as JSON with `--json`, else in the text form `text` renders.
fn print<T: Serialize + ?Sized>(
    json: bool,
    value: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", text(value));
    }
    Ok(())
}

/// Exit status 2 when something is left for an operator to do.
fn exit_code(done: bool) -> ExitCode {
    ExitCode::from(if done { 0 } else { 2 })
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    seckill_shared::telemetry::init();
    match Command::parse() {
        Command::Status {
            voucher,
            json,
            watch,
            interval,
        } => {
            let ids = voucher.as_deref().map(voucher_arg).transpose()?;
            let b = Backends::from_env().await?;
            if watch {
                let every = Duration::from_secs_f64(interval.max(0.1));
                status::watch(&b, ids.as_slice(), every).await?;
            } else {
                let all = status::status(&b, ids.as_slice()).await?;
                print(json, all.as_slice(), status::render)?;
                if !json {
                    print!(
                        "{}",
                        status::render_unmatched(status::unmatched_refunds(&b).await?)
                    );
                    print!(
                        "{}",
                        status::render_events_owed(status::events_owed(&b).await?)
                    );
                }
            }
        }
        Command::DeadLetters(DeadLetters::List { voucher, json }) => {
            let voucher = voucher_arg(&voucher)?;
            let all = dead_letters::list(&Backends::from_env().await?, voucher).await?;
            print(json, &all, |all| dead_letters::render_list(voucher, all))?;
        }
        Command::DeadLetters(DeadLetters::Replay { voucher, ids, json }) => {
            let voucher = voucher_arg(&voucher)?;
            let done = dead_letters::replay(&Backends::from_env().await?, voucher, &ids).await?;
            print(json, done.as_slice(), dead_letters::render_replay)?;
            let replayed = done.iter().all(|r| matches!(r, Replay::Replayed { .. }));
            return Ok(exit_code(replayed));
        }
        Command::Reconcile {
            voucher,
            repair,
            json,
        } => {
            let voucher = voucher_arg(&voucher)?;
            let b = Backends::from_env().await?;
            let report = reconcile::reconcile(&b, voucher, repair).await?;
            print(json, &report, reconcile::render)?;
            return Ok(exit_code(report.clean_after()));
        }
        Command::Pay {
            order,
            opts,
            stripe,
            json,
        } => {
            let order = order
                .parse()
                .ok()
                .with_context(|| format!("{order:?} is not an order id"))?;
            let stack = seckill_cli::stack_env::StackEnv::load(None)?;
            let b = Backends::from_env().await?;
            let done = if stripe.stripe {
                let local = stripe::LocalStripe::from_stack(&stack)?;
                let jwt = stack.get("SECKILL_DEV_JWT_SECRET")?;
                stripe::pay(
                    &b,
                    &local,
                    &jwt,
                    order,
                    &stripe.card,
                    opts.late,
                    opts.replay,
                )
                .await?
            } else {
                let url = stack.get("SECKILL_HTTP_URL")?;
                let secrets = seckill_shared::webhook::Secrets::parse(
                    &stack.get("SECKILL_PAYMENT_WEBHOOK_SECRET")?,
                )
                .map_err(|e| anyhow::anyhow!("SECKILL_PAYMENT_WEBHOOK_SECRET: {e}"))?;
                pay::pay(&b, &url, &secrets, order, &opts).await?
            };
            print(json, done.as_slice(), pay::render)?;
            return Ok(exit_code(
                done.iter().all(|d| (200..300).contains(&d.status)),
            ));
        }
        Command::Refund { payment_id, json } => {
            let stack = seckill_cli::stack_env::StackEnv::load(None)?;
            let key = stack.get("STRIPE_SECRET_KEY")?;
            let base = stack
                .optional("STRIPE_API_BASE")
                .unwrap_or_else(|| seckill_shared::adapters::stripe::DEFAULT_API_BASE.into());
            let b = Backends::from_env().await?;
            let issued = stripe::refund(&b, &base, &key, &payment_id).await?;
            let taken = matches!(
                issued,
                seckill_shared::refunds::Issued::Requested(_)
                    | seckill_shared::refunds::Issued::Found(_)
            );
            let shown = format!("{issued:?}");
            print(json, &shown, |s| format!("payment {payment_id}: {s}\n"))?;
            return Ok(exit_code(taken));
        }
        Command::Demo(args) => demo::run(args).await?,
        Command::Migrate {
            database,
            app_secret_arn,
        } => {
            let mut env = EnvReader::from_env();
            let mut cfg = MigrateConfig::read(&mut env);
            cfg.data_api.database = database.unwrap_or(cfg.data_api.database);
            cfg.app_secret_arn = app_secret_arn.or(cfg.app_secret_arn);
            env.finish()?;
            print!("{}", migrate::run(&cfg).await?);
        }
        Command::Token {
            sub,
            admin,
            ttl,
            secret,
        } => {
            let expires = seckill_shared::domain::now_millis() / 1000 + ttl;
            let scope = admin.then_some(auth::ADMIN_SCOPE);
            let token = auth::mint_hs256(secret.as_bytes(), &sub, scope, expires);
            println!("{token}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

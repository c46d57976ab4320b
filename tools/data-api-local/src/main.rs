//! `data-api-local`: the RDS Data API on loopback over a local MariaDB.

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use data_api_local::{DEFAULT_RESOURCE_ARN, DEFAULT_SECRET_ARN, ServerConfig};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Parser)]
#[command(version, about = "Local RDS Data API server over MariaDB/MySQL")]
struct Cli {
    /// Address to listen on; must be a loopback address.
    #[arg(long, default_value = "127.0.0.1:18080")]
    listen: SocketAddr,

    /// mysql://user:password@host:port/database (the default database of requests).
    #[arg(long, env = "MYSQL_URL", hide_env_values = true)]
    mysql_url: String,

    /// The cluster ARN callers must send as resourceArn.
    #[arg(long, env = "DB_CLUSTER_ARN", default_value = DEFAULT_RESOURCE_ARN)]
    resource_arn: String,

    /// The secret ARN whose calls sign in as the user of --mysql-url (the master secret).
    #[arg(long, env = "DB_SECRET_ARN", default_value = DEFAULT_SECRET_ARN)]
    secret_arn: String,

    /// More secrets: a file of `ARN USERNAME PASSWORD` lines, readable by its owner
    /// only. Calls carrying such an ARN sign in as that user (same host and port).
    #[arg(long)]
    secrets_file: Option<std::path::PathBuf>,

    /// Roll back a transaction after this many seconds without a call.
    #[arg(long, default_value_t = 180)]
    transaction_timeout_secs: u64,

    /// Cancel a statement after this many seconds (StatementTimeoutException).
    #[arg(long, default_value_t = 45)]
    statement_timeout_secs: u64,

    /// Serve `POST /_local/faults` (an outage, lost answers) for whole-sale tests.
    #[arg(long)]
    fault_control: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not for log files of the stack script.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    let cli = Cli::parse();
    let secrets = match &cli.secrets_file {
        Some(path) => data_api_local::secrets::read_secrets_file(path)?,
        None => Vec::new(),
    };
    let config = ServerConfig {
        mysql_url: cli.mysql_url,
        resource_arn: cli.resource_arn,
        secret_arn: cli.secret_arn,
        secrets,
        transaction_idle_timeout: Duration::from_secs(cli.transaction_timeout_secs),
        statement_timeout: Duration::from_secs(cli.statement_timeout_secs),
        not_found_as_bad_request: false,
        lose_answers: None,
        faults: cli.fault_control.then(Default::default),
    };
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cli.listen))?;
    let mut sigterm = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let server = data_api_local::serve(listener, config)?;
    // Scripts wait for this exact line.
    println!("data-api-local listening on {}", server.url());
    tokio::select! {
        // A failed SIGINT listener disables only its branch.
        Ok(()) = tokio::signal::ctrl_c() => {},
        _ = sigterm.recv() => {},
    }
    tracing::info!("shutting down");
    server.shutdown().await
}

//! A local server speaking the AWS RDS Data API wire protocol (what `aws-sdk-rdsdata`
//! sends: rest-json POSTs to `/Execute`, `/BatchExecute`, `/BeginTransaction`,
//! `/CommitTransaction`, `/RollbackTransaction`) over a real MariaDB/MySQL, so the
//! production Data API code runs unchanged locally and in CI.
//!
//! SigV4 signatures are not verified (any credentials work); the resource ARN must be
//! the configured one, and the secret ARN one of the configured secrets: the server
//! signs in to MariaDB as that secret's user, as the Data API does. It also answers
//! Secrets Manager's `GetSecretValue` for those secrets (`POST /`, the JSON 1.1
//! protocol), so `seckill migrate` reads the application user's secret as in AWS. Aurora's limits and error kinds are reproduced
//! so tests see them: 4 MiB requests, 1 MiB responses, 65,536-character SQL, statement
//! timeout, idle transaction timeout.
//!
//! Modules: [`wire`] (JSON shapes), [`sql`] (`:name` placeholders), [`values`] (value
//! and type conversions), [`database`] (pools, statements, timeouts), [`transactions`]
//! (open transactions and the idle reaper), [`secrets`] (secret ARNs and their MariaDB
//! users), [`server`] (routes), [`error`] (error mapping).

pub mod database;
pub mod error;
pub mod secrets;
pub mod server;
pub mod sql;
pub mod transactions;
pub mod values;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub const DEFAULT_RESOURCE_ARN: &str = "arn:aws:rds:us-east-1:000000000000:cluster:seckill-local";
pub const DEFAULT_SECRET_ARN: &str =
    "arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local";
/// Aurora rolls back a transaction after 3 minutes without a call.
pub const DEFAULT_TRANSACTION_IDLE_TIMEOUT: Duration = Duration::from_secs(180);
/// Aurora cancels a call after 45 seconds.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(45);

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `mysql://user:password@host:port/database`; the database is the default for
    /// requests that name none.
    pub mysql_url: String,
    pub resource_arn: String,
    /// The secret whose user is the one of `mysql_url` (the master secret).
    pub secret_arn: String,
    /// More secrets, each signing in as its own MariaDB user (an application user).
    pub secrets: Vec<secrets::SecretCredentials>,
    pub transaction_idle_timeout: Duration,
    pub statement_timeout: Duration,
}

impl ServerConfig {
    /// The defaults of the local stack (`docs/design.md`) for the given MySQL URL.
    pub fn new(mysql_url: impl Into<String>) -> Self {
        ServerConfig {
            mysql_url: mysql_url.into(),
            resource_arn: DEFAULT_RESOURCE_ARN.to_string(),
            secret_arn: DEFAULT_SECRET_ARN.to_string(),
            secrets: Vec::new(),
            transaction_idle_timeout: DEFAULT_TRANSACTION_IDLE_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
        }
    }
}

/// Serves on `listener` until the process ends.
pub async fn serve(listener: TcpListener, config: ServerConfig) -> anyhow::Result<()> {
    serve_with_shutdown(listener, config, std::future::pending()).await
}

/// Serves on `listener` until `shutdown` completes, then finishes the calls in flight,
/// rolls back open transactions and closes the MariaDB connections.
///
/// The listener must be bound to a loopback address: the server accepts any
/// credentials, so it must not be reachable from elsewhere.
pub async fn serve_with_shutdown(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let db = database::Database::new(&config.mysql_url)?;
    let secrets = secrets::SecretStore::new(&config, db.url_credentials())?;
    serve_state(listener, config, db, Arc::new(secrets), shutdown).await
}

async fn serve_state(
    listener: TcpListener,
    config: ServerConfig,
    db: database::Database,
    secrets: Arc<secrets::SecretStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "refusing to listen on {addr}: data-api-local accepts any credentials and must stay on loopback"
    );
    let transactions = Arc::new(transactions::Registry::new(config.transaction_idle_timeout));
    let reaper = transactions.spawn_reaper();
    let state = Arc::new(server::AppState {
        config,
        db,
        secrets,
        transactions: transactions.clone(),
    });
    let served = axum::serve(listener, server::router(state.clone()))
        .with_graceful_shutdown(shutdown)
        .await;
    reaper.abort();
    transactions.rollback_all().await;
    state.db.disconnect_all().await;
    served.context("HTTP server failed")
}

/// A server running in this process (for tests).
pub struct RunningServer {
    addr: SocketAddr,
    secrets: Arc<secrets::SecretStore>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the SDK's `endpoint_url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds a secret, or changes the user or password of one (as rotating it in Secrets
    /// Manager would): later calls with it sign in with these credentials.
    pub fn set_secret(&self, secret: secrets::SecretCredentials) {
        self.secrets.set(secret);
    }

    /// Stops accepting calls, waits for those in flight, and cleans up.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.context("server task panicked")?
    }
}

/// Starts a server on `127.0.0.1:0` in the current runtime. Dropping the handle leaves
/// it running until the runtime ends.
pub async fn spawn(config: ServerConfig) -> anyhow::Result<RunningServer> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let db = database::Database::new(&config.mysql_url)?;
    let secrets = Arc::new(secrets::SecretStore::new(&config, db.url_credentials())?);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_state(
        listener,
        config,
        db,
        secrets.clone(),
        async move {
            // Only an explicit `shutdown()` stops it; a dropped handle does not.
            if rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        },
    ));
    Ok(RunningServer {
        addr,
        secrets,
        shutdown: Some(tx),
        task,
    })
}

//! A local server speaking the AWS RDS Data API wire protocol (what `aws-sdk-rdsdata`
//! sends: rest-json POSTs to `/Execute`, `/BatchExecute`, `/BeginTransaction`,
//! `/CommitTransaction`, `/RollbackTransaction`) over a real MariaDB/MySQL, so the
//! production Data API code runs unchanged locally and in CI.
//!
//! SigV4 signatures are not verified (any credentials work); the resource ARN must be
//! the configured one, and the secret ARN one of the configured secrets: the server
//! signs in to MariaDB as that secret's user, as the Data API does. It also answers
//! Secrets Manager's `GetSecretValue` for those secrets (`POST /`, the JSON 1.1
//! protocol), so `seckill migrate` reads the application user's secret as in AWS.
//! Aurora's limits and error kinds are reproduced so tests see them: 4 MiB requests,
//! 1 MiB responses, 65,536-character SQL, statement timeout, idle transaction timeout.

pub mod config;
pub mod database;
pub mod error;
pub mod faults;
pub mod limits;
pub mod lock;
pub mod secrets;
pub mod server;
pub mod sql;
pub mod values;
pub mod wire;

use std::iter;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub use crate::config::{
    DEFAULT_RESOURCE_ARN, DEFAULT_SECRET_ARN, LostAnswers, LostCall, ServerConfig,
};
use crate::server::AppState;

/// A server running in this process.
pub struct RunningServer {
    addr: SocketAddr,
    state: Arc<AppState>,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    /// `http://127.0.0.1:PORT`, the SDK's `endpoint_url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds a secret, or changes the user or password of one (as rotating it in Secrets
    /// Manager would): later calls with it sign in with these credentials.
    pub fn set_secret(&self, secret: secrets::SecretCredentials) {
        self.state.secrets.set(secret);
    }

    /// Stops accepting calls, waits for those in flight, rolls back open transactions
    /// and closes the MariaDB connections.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(());
        self.task.await.context("server task panicked")?
    }
}

/// Serves on `listener` in the current runtime until [`RunningServer::shutdown`]
/// (dropping the handle leaves it running until the runtime ends).
///
/// The listener must be bound to a loopback address: the server accepts any
/// credentials, so it must not be reachable from elsewhere.
pub fn serve(listener: TcpListener, config: ServerConfig) -> anyhow::Result<RunningServer> {
    let addr = listener.local_addr()?;
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "refusing to listen on {addr}: data-api-local accepts any credentials and must stay on loopback"
    );
    let db = database::Database::new(&config)?;
    let master = db.url_secret(&config.secret_arn);
    let secrets = secrets::SecretStore::new(iter::once(master).chain(config.secrets.clone()))?;
    let state = Arc::new(AppState {
        config,
        db,
        secrets,
    });
    let (shutdown, stop) = oneshot::channel::<()>();
    let served = state.clone();
    let task = tokio::spawn(async move {
        let reaping = served.clone();
        let reaper = tokio::spawn(async move { reaping.db.reap_idle_transactions().await });
        let stopped = async move {
            // Only an explicit `shutdown()` stops it; a dropped handle does not.
            if stop.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let result = axum::serve(listener, server::router(served.clone()))
            .with_graceful_shutdown(stopped)
            .await;
        reaper.abort();
        served.db.close().await;
        result.context("HTTP server failed")
    });
    Ok(RunningServer {
        addr,
        state,
        shutdown,
        task,
    })
}

/// Starts a server on `127.0.0.1:0` (for tests).
pub async fn spawn(config: ServerConfig) -> anyhow::Result<RunningServer> {
    serve(TcpListener::bind(("127.0.0.1", 0)).await?, config)
}

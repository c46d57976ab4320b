//! MariaDB access: one connection pool per user and database name (created on first use,
//! signing in with the credentials of the call's secret); the open transactions, each
//! holding a connection of its own until commit, rollback, an error that aborts it, or
//! the idle timeout; running one statement and reading its result; and the statement
//! timeout (cancelled with `KILL QUERY` from another connection, as Aurora does).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::{Protocol, Queryable};
use mysql_async::{Column, Conn, Opts, OptsBuilder, Params, Pool, QueryResult, Value};
use tokio::sync::OwnedMutexGuard;

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::limits::MAX_RESPONSE_BYTES;
use crate::lock::lock;
use crate::secrets::SecretCredentials;
use crate::sql::PlaceholderSql;
use crate::values;
use crate::wire::{Field, ResultSetOptions};

/// MariaDB's "This command is not supported in the prepared statement protocol yet".
const ER_UNSUPPORTED_PS: u16 = 1295;

/// Aurora runs Data API sessions in UTC; so do we, whatever the host's zone.
const SESSION_SETUP: &str = "SET time_zone = '+00:00'";

pub struct Database {
    /// The MySQL URL's options; its database is the default of calls that name none.
    base: Opts,
    /// Keyed by the credentials too: a changed password makes a new pool.
    pools: Mutex<HashMap<(SecretCredentials, String), Pool>>,
    /// Open transactions by id.
    transactions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Transaction>>>>,
    statement_timeout: Duration,
    transaction_idle_timeout: Duration,
}

/// An open transaction: the connection `START TRANSACTION` ran on, and the start or end
/// of its last call (the idle timeout counts from there).
///
/// It sits behind an async mutex, so calls on one transaction run one after the other.
/// Whoever ends it takes the connection out; a call queued behind the ending one then
/// finds `None` and answers `TransactionNotFoundException`, like a call that arrives later.
pub struct Transaction {
    pub conn: Option<Conn>,
    pub last_used: Instant,
}

pub type HeldTransaction = OwnedMutexGuard<Transaction>;

pub fn transaction_not_found(id: &str) -> ApiError {
    ApiError::TransactionNotFound(format!("Transaction {id} is not found"))
}

impl Database {
    pub fn new(config: &ServerConfig) -> anyhow::Result<Self> {
        let base = Opts::from_url(&config.mysql_url)
            .map_err(|e| anyhow::anyhow!("invalid MySQL URL: {e}"))?;
        Ok(Database {
            base,
            pools: Mutex::default(),
            transactions: Mutex::default(),
            statement_timeout: config.statement_timeout,
            transaction_idle_timeout: config.transaction_idle_timeout,
        })
    }

    /// The secret `arn` holding the user and password of the MySQL URL.
    pub fn url_secret(&self, arn: &str) -> SecretCredentials {
        SecretCredentials {
            arn: arn.to_string(),
            username: self.base.user().unwrap_or_default().to_string(),
            password: self.base.pass().unwrap_or_default().to_string(),
        }
    }

    /// The URL's options, signed in as `creds`, in database `db_name`.
    fn opts(&self, creds: &SecretCredentials, db_name: Option<&str>) -> OptsBuilder {
        OptsBuilder::from_opts(self.base.clone())
            .user(Some(&creds.username))
            .pass(Some(&creds.password))
            .db_name(db_name)
    }

    /// A pooled connection to `database` (the request's, else the URL's), signed in as
    /// `creds`. Returned to the pool on drop, where mysql_async resets it
    /// (`COM_RESET_CONNECTION`), so an abandoned transaction never leaks to the next user.
    pub async fn conn(
        &self,
        creds: &SecretCredentials,
        database: Option<&str>,
    ) -> Result<Conn, ApiError> {
        let name = database
            .filter(|d| !d.is_empty())
            .or(self.base.db_name())
            .unwrap_or("");
        if name.len() > 64 {
            return Err(ApiError::bad_request(
                "Database name is longer than 64 characters",
            ));
        }
        let pool = lock(&self.pools)
            .entry((creds.clone(), name.to_string()))
            .or_insert_with(|| {
                let db_name = (!name.is_empty()).then_some(name);
                Pool::new(self.opts(creds, db_name).setup(vec![SESSION_SETUP]))
            })
            .clone();
        Ok(pool.get_conn().await?)
    }

    /// Starts a transaction on a connection of its own; returns its id.
    pub async fn begin(
        &self,
        creds: &SecretCredentials,
        database: Option<&str>,
    ) -> Result<String, ApiError> {
        let mut conn = self.conn(creds, database).await?;
        conn.query_drop("START TRANSACTION").await?;
        let id = uuid::Uuid::new_v4().to_string();
        let tx = Transaction {
            conn: Some(conn),
            last_used: Instant::now(),
        };
        lock(&self.transactions).insert(id.clone(), Arc::new(tokio::sync::Mutex::new(tx)));
        Ok(id)
    }

    /// Waits for the calls ahead on transaction `id`, then holds it.
    pub async fn transaction(&self, id: &str) -> Result<HeldTransaction, ApiError> {
        let tx = lock(&self.transactions).get(id).cloned();
        let mut held = tx
            .ok_or_else(|| transaction_not_found(id))?
            .lock_owned()
            .await;
        held.last_used = Instant::now();
        match held.conn {
            Some(_) => Ok(held),
            None => Err(transaction_not_found(id)),
        }
    }

    /// Ends transaction `id` (which the caller holds): forgets it and hands back its
    /// connection for COMMIT or ROLLBACK.
    pub fn end(&self, id: &str, held: &mut HeldTransaction) -> Result<Conn, ApiError> {
        lock(&self.transactions).remove(id);
        held.conn.take().ok_or_else(|| transaction_not_found(id))
    }

    /// Ends the transaction and rolls it back (after an error inside it, or idleness).
    pub async fn abort(&self, id: &str, held: &mut HeldTransaction) {
        if let Ok(mut conn) = self.end(id, held)
            && let Err(err) = conn.query_drop("ROLLBACK").await
        {
            // Dropping the connection rolls back on the server anyway (the pool resets
            // or discards it).
            tracing::warn!(%err, "ROLLBACK failed");
        }
    }

    /// Rolls back, often enough that it happens within a tenth of the timeout, every
    /// transaction idle for longer than the idle timeout. One that a call holds is busy,
    /// not idle.
    pub async fn reap_idle_transactions(&self) {
        let every = (self.transaction_idle_timeout / 10)
            .clamp(Duration::from_millis(20), Duration::from_secs(5));
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let open: Vec<_> = lock(&self.transactions)
                .iter()
                .map(|(id, tx)| (id.clone(), tx.clone()))
                .collect();
            for (id, tx) in open {
                if let Ok(mut held) = tx.try_lock_owned()
                    && held.last_used.elapsed() >= self.transaction_idle_timeout
                {
                    tracing::info!(transaction_id = %id, "rolling back idle transaction");
                    self.abort(&id, &mut held).await;
                }
            }
        }
    }

    /// Rolls back every open transaction and closes the connections (at shutdown).
    pub async fn close(&self) {
        let open = std::mem::take(&mut *lock(&self.transactions));
        for (id, tx) in open {
            self.abort(&id, &mut tx.lock_owned().await).await;
        }
        let pools = std::mem::take(&mut *lock(&self.pools));
        for pool in pools.into_values() {
            if let Err(err) = pool.disconnect().await {
                tracing::debug!(%err, "pool disconnect");
            }
        }
    }

    /// Runs `work` (which owns a connection whose server id is `connection_id`) as its
    /// own task, so that it can outlive the call when `continue_after_timeout` is set.
    ///
    /// After the statement timeout the caller gets `StatementTimeoutException`. Unless the
    /// call asked to continue, the running statement is killed and this waits for the work
    /// to release its connection, so the connection is usable again when this returns.
    pub async fn with_timeout<T, F, Fut>(
        &self,
        creds: &SecretCredentials,
        connection_id: u32,
        continue_after_timeout: bool,
        work: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Deadline) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let timeout = self.statement_timeout;
        let decided = Arc::new(AtomicBool::new(false));
        let mut task = tokio::spawn(work(Deadline(decided.clone())));
        let joined = match tokio::time::timeout(timeout, &mut task).await {
            Ok(joined) => joined,
            // The work finished right at the deadline: its result stands.
            Err(_) if decided.swap(true, Ordering::AcqRel) => task.await,
            Err(_) => {
                let fate = if continue_after_timeout {
                    "left running (continueAfterTimeout)"
                } else {
                    self.kill_query(creds, connection_id).await;
                    // The work sees the timeout and rolls back; wait for it.
                    let _ = task.await;
                    "cancelled"
                };
                let message = format!(
                    "The statement exceeded the timeout of {} seconds and was {fate}",
                    timeout.as_secs_f64()
                );
                return Err(ApiError::StatementTimeout(message, connection_id));
            }
        };
        joined.map_err(|e| ApiError::Internal(format!("statement task failed: {e}")))?
    }

    /// Cancels the statement running on connection `id` (which `creds` signed in: a
    /// user may always cancel its own statements).
    async fn kill_query(&self, creds: &SecretCredentials, id: u32) {
        let killed = async {
            // Its own connection, in no database: the user may have rights on none but
            // the call's.
            let mut admin = Conn::new(self.opts(creds, None)).await?;
            admin.query_drop(format!("KILL QUERY {id}")).await?;
            admin.disconnect().await.ok();
            Ok::<_, ApiError>(())
        };
        if let Err(err) = killed.await {
            tracing::warn!(
                connection_id = id,
                error_code = err.wire().0,
                "KILL QUERY failed"
            );
        }
    }
}

/// What one statement produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Columns of the result set, `None` when the statement returns no rows (DML, DDL).
    pub columns: Option<Arc<[Column]>>,
    pub rows: Vec<Vec<Field>>,
    pub affected_rows: u64,
    /// The AUTO_INCREMENT value the statement generated, if any.
    pub last_insert_id: Option<u64>,
}

/// Runs the statement once per set of bound values and reads all of each result. Rows
/// are converted as they stream in; once they pass the response size limit the rest is
/// read and discarded (the connection must be drained) and the call fails like Aurora's.
pub async fn run_sets(
    conn: &mut Conn,
    sql: &PlaceholderSql,
    sets: Vec<Vec<Value>>,
    options: ResultSetOptions,
) -> Result<Vec<Outcome>, ApiError> {
    let sql = sql.sql.as_str();
    let mut outcomes = Vec::with_capacity(sets.len());
    for values in sets {
        let plain = values.is_empty();
        let outcome = match conn.exec_iter(sql, Params::from(values)).await {
            Ok(result) => collect(result, options).await,
            // A few statements cannot be prepared; without parameters they can run as a
            // plain query just as well.
            Err(mysql_async::Error::Server(e)) if e.code == ER_UNSUPPORTED_PS && plain => {
                collect(conn.query_iter(sql).await?, options).await
            }
            Err(e) => Err(e.into()),
        };
        outcomes.push(outcome?);
    }
    Ok(outcomes)
}

async fn collect<P: Protocol>(
    mut result: QueryResult<'_, 'static, P>,
    options: ResultSetOptions,
) -> Result<Outcome, ApiError> {
    let columns = result.columns().filter(|c| !c.is_empty());
    let mut outcome = Outcome::default();
    // Only a statement without a result set has read its OK packet here; for a SELECT
    // the connection still reports the previous statement's counts.
    if columns.is_none() {
        outcome.affected_rows = result.affected_rows();
        outcome.last_insert_id = result.last_insert_id().filter(|id| *id != 0);
    }
    // The first failure while converting; the rows still have to be drained.
    let mut failure: Option<ApiError> = None;
    if let Some(columns) = &columns {
        let mut size = 0usize;
        while let Some(row) = result.next().await? {
            if failure.is_some() {
                continue;
            }
            let fields = (row.unwrap_raw().into_iter().zip(columns.iter()))
                .map(|(value, column)| {
                    values::to_field(value.unwrap_or(Value::NULL), column, options)
                })
                .collect::<Result<Vec<_>, _>>();
            size += fields
                .iter()
                .flatten()
                .map(Field::approximate_size)
                .sum::<usize>();
            match fields {
                Ok(fields) if size <= MAX_RESPONSE_BYTES => outcome.rows.push(fields),
                other => {
                    failure = Some(other.err().unwrap_or_else(response_too_large));
                    outcome.rows = Vec::new();
                }
            }
        }
    }
    // Further result sets (a CALL returns one more) are read and ignored.
    result.drop_result().await?;
    outcome.columns = columns;
    failure.map_or(Ok(outcome), Err)
}

pub fn response_too_large() -> ApiError {
    ApiError::bad_request("Database returned more than the allowed response size limit")
}

/// Handed to the work running under a statement timeout: the work calls [`finish`]
/// once its statements are done and before it makes them permanent (COMMIT).
///
/// [`finish`]: Deadline::finish
pub struct Deadline(Arc<AtomicBool>);

impl Deadline {
    /// `true` if the work finished in time. `false` means the caller has already been
    /// told `StatementTimeoutException`: the work must undo what it did.
    pub fn finish(&self) -> bool {
        // Whoever decides first, the work or the timeout, wins.
        !self.0.swap(true, Ordering::AcqRel)
    }
}

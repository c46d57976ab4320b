//! MariaDB access: one connection pool per user and database name (created on first use,
//! signing in with the credentials of the call's secret), running
//! one statement and reading its result, and the statement timeout (cancelled with
//! `KILL QUERY` from another connection, as Aurora cancels a timed-out call).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::{Protocol, Queryable};
use mysql_async::{Column, Conn, Opts, OptsBuilder, Params, Pool, QueryResult, Value};

use crate::error::ApiError;
use crate::secrets::Credentials;
use crate::server::MAX_RESPONSE_BYTES;
use crate::sql::PlaceholderSql;
use crate::values;
use crate::wire::{Field, ResultSetOptions};

/// MariaDB's "This command is not supported in the prepared statement protocol yet".
const ER_UNSUPPORTED_PS: u16 = 1295;

/// Aurora runs Data API sessions in UTC; so do we, whatever the host's zone.
const SESSION_SETUP: &str = "SET time_zone = '+00:00'";

pub struct Database {
    base: Opts,
    default_database: Option<String>,
    /// Keyed by the credentials too: a changed password makes a new pool.
    pools: Mutex<HashMap<(Credentials, String), Pool>>,
}

impl Database {
    pub fn new(mysql_url: &str) -> anyhow::Result<Self> {
        let base =
            Opts::from_url(mysql_url).map_err(|e| anyhow::anyhow!("invalid MySQL URL: {e}"))?;
        let default_database = base.db_name().map(str::to_string);
        Ok(Database {
            base,
            default_database,
            pools: Mutex::new(HashMap::new()),
        })
    }

    /// The user and password of the MySQL URL.
    pub fn url_credentials(&self) -> Credentials {
        Credentials {
            username: self.base.user().unwrap_or_default().to_string(),
            password: self.base.pass().unwrap_or_default().to_string(),
        }
    }

    /// The pool for `database` (the request's `database`, else the URL's), signed in as
    /// `creds`.
    fn pool(&self, creds: &Credentials, database: Option<&str>) -> Result<Pool, ApiError> {
        let name = database
            .filter(|d| !d.is_empty())
            .or(self.default_database.as_deref())
            .unwrap_or("");
        if name.len() > 64 {
            return Err(ApiError::bad_request(
                "Database name is longer than 64 characters",
            ));
        }
        // A poisoned lock only means another request panicked while inserting; the map
        // itself is still usable.
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let pool = pools
            .entry((creds.clone(), name.to_string()))
            .or_insert_with(|| {
                let db_name = (!name.is_empty()).then(|| name.to_string());
                Pool::new(
                    OptsBuilder::from_opts(self.base.clone())
                        .user(Some(creds.username.clone()))
                        .pass(Some(creds.password.clone()))
                        .db_name(db_name)
                        .setup(vec![SESSION_SETUP]),
                )
            });
        Ok(pool.clone())
    }

    /// A pooled connection. Returned to the pool on drop, where mysql_async resets it
    /// (`COM_RESET_CONNECTION`), so an abandoned transaction never leaks to the next user.
    pub async fn conn(
        &self,
        creds: &Credentials,
        database: Option<&str>,
    ) -> Result<Conn, ApiError> {
        Ok(self.pool(creds, database)?.get_conn().await?)
    }

    /// Cancels the statement running on connection `id` (which `creds` signed in: a
    /// user may always cancel its own statements).
    pub async fn kill_query(&self, creds: &Credentials, id: u32) {
        let killed = async {
            // Its own connection, in no database: the user may have rights on none but
            // the call's.
            let mut admin = Conn::new(
                OptsBuilder::from_opts(self.base.clone())
                    .user(Some(creds.username.clone()))
                    .pass(Some(creds.password.clone()))
                    .db_name(None::<String>),
            )
            .await?;
            admin.query_drop(format!("KILL QUERY {id}")).await?;
            admin.disconnect().await.ok();
            Ok::<_, ApiError>(())
        };
        if let Err(err) = killed.await {
            tracing::warn!(
                connection_id = id,
                error_code = err.code(),
                "KILL QUERY failed"
            );
        }
    }

    pub async fn disconnect_all(&self) {
        let pools: Vec<Pool> = self
            .pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, pool)| pool)
            .collect();
        for pool in pools {
            if let Err(err) = pool.disconnect().await {
                tracing::debug!(%err, "pool disconnect");
            }
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

/// Runs the statement once per set of bound values and reads all of each result.
pub async fn run_sets(
    conn: &mut Conn,
    sql: &PlaceholderSql,
    sets: Vec<Vec<Value>>,
    options: ResultSetOptions,
) -> Result<Vec<Outcome>, ApiError> {
    let mut outcomes = Vec::with_capacity(sets.len());
    for values in sets {
        outcomes.push(run_statement(conn, sql, values, options).await?);
    }
    Ok(outcomes)
}

/// Runs one statement. Rows are converted as they stream in; once they pass the response
/// size limit the rest is read and discarded (the connection must be drained) and the
/// call fails like Aurora's.
async fn run_statement(
    conn: &mut Conn,
    sql: &PlaceholderSql,
    values: Vec<Value>,
    options: ResultSetOptions,
) -> Result<Outcome, ApiError> {
    let sql = sql.sql.as_str();
    if !values.is_empty() {
        let result = conn.exec_iter(sql, Params::Positional(values)).await?;
        return collect(result, options).await;
    }
    match conn.exec_iter(sql, Params::Empty).await {
        Ok(result) => collect(result, options).await,
        // A few statements cannot be prepared; without parameters they can run as a
        // plain query just as well.
        Err(mysql_async::Error::Server(e)) if e.code == ER_UNSUPPORTED_PS => {
            collect(conn.query_iter(sql).await?, options).await
        }
        Err(e) => Err(e.into()),
    }
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
            let mut fields = Vec::with_capacity(columns.len());
            for (value, column) in row.unwrap_raw().into_iter().zip(columns.iter()) {
                match values::to_field(value.unwrap_or(Value::NULL), column, options) {
                    Ok(field) => {
                        size += field.approximate_size();
                        fields.push(field);
                    }
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
            }
            if size > MAX_RESPONSE_BYTES {
                failure = Some(response_too_large());
            }
            if failure.is_none() {
                outcome.rows.push(fields);
            } else {
                outcome.rows = Vec::new();
            }
        }
    }
    // Further result sets (a CALL returns one more) are read and ignored.
    result.drop_result().await?;
    match failure {
        Some(err) => Err(err),
        None => {
            outcome.columns = columns;
            Ok(outcome)
        }
    }
}

pub fn response_too_large() -> ApiError {
    ApiError::bad_request("Database returned more than the allowed response size limit")
}

const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const TIMED_OUT: u8 = 2;

/// Handed to the work running under a statement timeout: the work calls [`finish`]
/// once its statements are done and before it makes them permanent (COMMIT).
///
/// [`finish`]: Deadline::finish
pub struct Deadline {
    state: Arc<AtomicU8>,
}

impl Deadline {
    /// `true` if the work finished in time. `false` means the caller has already been
    /// told `StatementTimeoutException`: the work must undo what it did.
    pub fn finish(&self) -> bool {
        self.state
            .compare_exchange(RUNNING, FINISHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl Database {
    /// Runs `work` (which owns a connection whose server id is `connection_id`) as its
    /// own task, so that it can outlive the call when `continue_after_timeout` is set.
    ///
    /// After `timeout` the caller gets `StatementTimeoutException`. Unless the call asked
    /// to continue, the running statement is killed and this waits for the work to
    /// release its connection, so the connection is usable again when this returns.
    pub async fn with_timeout<T, F, Fut>(
        &self,
        creds: &Credentials,
        connection_id: u32,
        timeout: Duration,
        continue_after_timeout: bool,
        work: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Deadline) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let state = Arc::new(AtomicU8::new(RUNNING));
        let mut task = tokio::spawn(work(Deadline {
            state: state.clone(),
        }));
        let joined = match tokio::time::timeout(timeout, &mut task).await {
            Ok(joined) => joined,
            Err(_elapsed) => {
                let timed_out = state
                    .compare_exchange(RUNNING, TIMED_OUT, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
                if !timed_out {
                    // The work finished right at the deadline: its result stands.
                    task.await
                } else {
                    if !continue_after_timeout {
                        self.kill_query(creds, connection_id).await;
                        // The work sees the timeout and rolls back; wait for it.
                        let _ = task.await;
                    }
                    return Err(ApiError::StatementTimeout {
                        message: format!(
                            "The statement exceeded the timeout of {} seconds and was {}",
                            timeout.as_secs_f64(),
                            if continue_after_timeout {
                                "left running (continueAfterTimeout)"
                            } else {
                                "cancelled"
                            }
                        ),
                        db_connection_id: connection_id,
                    });
                }
            }
        };
        joined.map_err(|e| ApiError::Internal(format!("statement task failed: {e}")))?
    }
}

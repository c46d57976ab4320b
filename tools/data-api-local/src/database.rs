//! MariaDB access: one connection pool per user and database name (created on first use,
//! signing in with the credentials of the call's secret), running
//! one statement and reading its result, and the statement timeout (cancelled with
//! `KILL QUERY` from another connection, as Aurora cancels a timed-out call).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The MySQL URL's options; its database is the default of calls that name none.
    base: Opts,
    /// Keyed by the credentials too: a changed password makes a new pool.
    pools: Mutex<HashMap<(Credentials, String), Pool>>,
}

impl Database {
    pub fn new(mysql_url: &str) -> anyhow::Result<Self> {
        let base =
            Opts::from_url(mysql_url).map_err(|e| anyhow::anyhow!("invalid MySQL URL: {e}"))?;
        Ok(Database {
            base,
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

    /// The URL's options, signed in as `creds`, in database `db_name`.
    fn opts(&self, creds: &Credentials, db_name: Option<&str>) -> OptsBuilder {
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
        creds: &Credentials,
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
        // A poisoned lock only means another request panicked while inserting; the map
        // itself is still usable.
        let pool = (self.pools.lock().unwrap_or_else(|p| p.into_inner()))
            .entry((creds.clone(), name.to_string()))
            .or_insert_with(|| {
                let db_name = (!name.is_empty()).then_some(name);
                Pool::new(self.opts(creds, db_name).setup(vec![SESSION_SETUP]))
            })
            .clone();
        Ok(pool.get_conn().await?)
    }

    /// Cancels the statement running on connection `id` (which `creds` signed in: a
    /// user may always cancel its own statements).
    pub async fn kill_query(&self, creds: &Credentials, id: u32) {
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
                error_code = err.code(),
                "KILL QUERY failed"
            );
        }
    }

    pub async fn disconnect_all(&self) {
        let pools = std::mem::take(&mut *self.pools.lock().unwrap_or_else(|p| p.into_inner()));
        for pool in pools.into_values() {
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
        let decided = Arc::new(AtomicBool::new(false));
        let mut task = tokio::spawn(work(Deadline(decided.clone())));
        let joined = match tokio::time::timeout(timeout, &mut task).await {
            Ok(joined) => joined,
            Err(_elapsed) => {
                if decided.swap(true, Ordering::AcqRel) {
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

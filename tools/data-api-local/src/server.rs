//! HTTP routes of the Data API and the operations behind them.
//!
//! Each operation reads the raw body itself (so a too-large or malformed body becomes a
//! `BadRequestException` rather than axum's plain-text rejection), checks the ARNs,
//! validates everything it can before touching MariaDB, and answers JSON or an
//! [`ApiError`].
//!
//! Every request first passes [`only_local_clients`]: the server accepts any SigV4
//! signature, so it must not be drivable from a web page in the developer's browser: no
//! `Origin` (browsers send it on cross-origin and on every `POST`; the SDK never does),
//! the SDK's content type (`application/json`, or `application/x-amz-json-1.1` for
//! Secrets Manager's `POST /`; a page can send neither without a preflight, which this
//! server never answers), and a loopback `Host` (a rebound DNS name keeps its own).
//!
//! `POST /` with `X-Amz-Target: secretsmanager.GetSecretValue` answers Secrets Manager
//! for the secrets this server knows: `{"username": ..., "password": ...}`, or a plain
//! secret's string.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};
use serde::Serialize;
use serde_json::json;

use crate::config::{LostCall, ServerConfig};
use crate::database::{
    self, Database, Deadline, Outcome, response_too_large, transaction_not_found,
};
use crate::error::ApiError;
use crate::limits::{MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES, MAX_SQL_CHARS};
use crate::secrets::{SecretCredentials, SecretStore};
use crate::sql::{self, PlaceholderSql};
use crate::values;
use crate::wire::{ExecuteStatementResponse, Field, RecordsFormat, Request, ResultSetOptions};

/// The content type of Secrets Manager's JSON 1.1 protocol.
pub const SECRETS_MANAGER_CONTENT_TYPE: &str = "application/x-amz-json-1.1";

pub struct AppState {
    pub config: ServerConfig,
    pub db: Database,
    pub secrets: SecretStore,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/Execute", operation("ExecuteStatement", execute))
        .route(
            "/BatchExecute",
            operation("BatchExecuteStatement", batch_execute),
        )
        .route("/BeginTransaction", operation("BeginTransaction", begin))
        .route(
            "/CommitTransaction",
            operation("CommitTransaction", |app, req| {
                end(app, req, LostCall::Commit, "Transaction Committed")
            }),
        )
        .route(
            "/RollbackTransaction",
            operation("RollbackTransaction", |app, req| {
                end(app, req, LostCall::Rollback, "Rollback Complete")
            }),
        )
        // The deprecated ExecuteSql (Aurora Serverless v1 only) is not offered.
        .route(
            "/ExecuteSql",
            operation("ExecuteSql", |_, _| async {
                Err(ApiError::bad_request(
                    "ExecuteSql is not supported; use ExecuteStatement",
                ))
            }),
        )
        .route("/", post(secrets_manager))
        .route(
            "/_local/faults",
            axum::routing::get(faults_read).post(faults_set),
        )
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(middleware::from_fn(only_local_clients))
        .with_state(state)
}

/// `GET /_local/faults`: the faults in force ([`crate::faults`]); 404 without
/// `--fault-control`.
async fn faults_read(State(app): State<Arc<AppState>>) -> Response {
    match &app.config.faults {
        Some(f) => axum::Json(f.read()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `POST /_local/faults`: sets the faults ([`crate::faults::FaultRequest`]).
async fn faults_set(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(f) = &app.config.faults else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match serde_json::from_slice::<crate::faults::FaultRequest>(&body) {
        Ok(req) => {
            let state = f.set(&req);
            tracing::warn!(?state, "faults set");
            axum::Json(state).into_response()
        }
        Err(e) => ApiError::bad_request(format!("a fault request: {e}")).into_response(),
    }
}

/// Refuses what a browser could send (see the module header); passes the SDK's calls.
async fn only_local_clients(request: HttpRequest, next: Next) -> Response {
    match local_client_problem(request.uri().path(), request.headers()) {
        None => next.run(request).await,
        Some(problem) => {
            tracing::warn!(
                problem,
                "refused a request that did not come from a local SDK client"
            );
            ApiError::Forbidden(problem).into_response()
        }
    }
}

/// Why a request's headers are not those of a local SDK client, if they are not.
fn local_client_problem(path: &str, headers: &HeaderMap) -> Option<String> {
    if headers.contains_key(header::ORIGIN) {
        return Some("requests with an Origin header (from a browser) are refused".into());
    }
    let content_type = match path {
        "/" => SECRETS_MANAGER_CONTENT_TYPE,
        _ => "application/json",
    };
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let sent_type = header(header::CONTENT_TYPE).and_then(|v| v.split(';').next());
    if !sent_type.is_some_and(|v| v.trim().eq_ignore_ascii_case(content_type)) {
        return Some(format!("the body must be {content_type}"));
    }
    let host = header(header::HOST).unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let loopback = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| "the Host must be a loopback address or localhost".into())
}

type Body = Result<Bytes, BytesRejection>;

/// The route of one Data API operation: parses the body, runs `op`, and logs one line
/// per call. Never logs parameter values or error texts (MariaDB echoes values, e.g.
/// "Duplicate entry 'alice' ...").
fn operation<Op, Fut>(name: &'static str, op: Op) -> MethodRouter<Arc<AppState>>
where
    Op: FnOnce(Arc<AppState>, Request) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, ApiError>> + Send + 'static,
{
    post(
        move |State(app): State<Arc<AppState>>, body: Body| async move {
            let started = Instant::now();
            let legacy = app.config.not_found_as_bad_request;
            let faults = app.config.faults.clone();
            let result = match &faults {
                Some(f) if f.in_outage() => Err(ApiError::DatabaseUnavailable(
                    "the database is unreachable (a test's outage)".into(),
                )),
                _ => async { op(app, parse(body)?).await }.await,
            };
            let result = match result {
                Ok(_) if faults.as_ref().is_some_and(|f| f.lose_answer()) => {
                    Err(ApiError::ServiceUnavailable(
                        "the answer was lost after the call ran (a test's fault)".into(),
                    ))
                }
                other => other,
            };
            let result = match result {
                Err(ApiError::TransactionNotFound(m)) if legacy => Err(ApiError::BadRequest(m)),
                other => other,
            };
            let elapsed_ms = started.elapsed().as_millis();
            match result {
                Ok(json) => {
                    tracing::info!(operation = name, status = 200, elapsed_ms, "ok");
                    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
                }
                Err(err) => {
                    let (error, status, _) = err.wire();
                    let mysql_code = match &err {
                        ApiError::Database(_, code) => Some(*code),
                        _ => None,
                    };
                    tracing::info!(
                        operation = name,
                        status = status.as_u16(),
                        error,
                        mysql_code,
                        elapsed_ms,
                        "failed"
                    );
                    err.into_response()
                }
            }
        },
    )
}

fn parse(body: Body) -> Result<Request, ApiError> {
    let bytes = body.map_err(|rejection| {
        ApiError::bad_request(if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!("Request size exceeds the Data API limit of {MAX_REQUEST_BYTES} bytes (4 MiB)")
        } else {
            format!("Could not read the request body: {rejection}")
        })
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Malformed request body: {e}")))
}

/// The JSON body, within the response size limit.
fn respond<T: Serialize>(body: &T) -> Result<Vec<u8>, ApiError> {
    let json = serde_json::to_vec(body)
        .map_err(|e| ApiError::Internal(format!("could not serialise the response: {e}")))?;
    if json.len() > MAX_RESPONSE_BYTES {
        return Err(response_too_large());
    }
    Ok(json)
}

/// The resource ARN must be the one this server was started with and the secret one it
/// knows: a caller configured for another cluster or secret must fail here as it would
/// against AWS. Returns the secret's credentials, the user the call signs in as.
fn check_arns(app: &AppState, req: &Request) -> Result<SecretCredentials, ApiError> {
    let resource_arn = req
        .resource_arn
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("resourceArn is required"))?;
    let secret_arn = req
        .secret_arn
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("secretArn is required"))?;
    if resource_arn != app.config.resource_arn {
        return Err(ApiError::bad_request(format!(
            "Invalid resourceArn {resource_arn}: this server serves {}",
            app.config.resource_arn
        )));
    }
    app.secrets
        .get(secret_arn)
        .filter(|s| !s.is_plain())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Invalid secretArn {secret_arn}: this server accepts {}",
                app.secrets.arns().join(", ")
            ))
        })
}

fn check_sql(sql: Option<&str>) -> Result<PlaceholderSql, ApiError> {
    let sql = sql
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("sql is required"))?;
    if sql.chars().count() > MAX_SQL_CHARS {
        return Err(ApiError::bad_request(format!(
            "SQL statement exceeds the maximum length of {MAX_SQL_CHARS} characters"
        )));
    }
    sql::parse(sql)
}

fn generated_fields(outcome: &Outcome) -> Result<Vec<Field>, ApiError> {
    outcome
        .last_insert_id
        .map(|id| {
            i64::try_from(id).map(Field::LongValue).map_err(|_| {
                ApiError::UnsupportedResult(format!("Generated key {id} does not fit a longValue"))
            })
        })
        .into_iter()
        .collect()
}

async fn execute(app: Arc<AppState>, req: Request) -> Result<Vec<u8>, ApiError> {
    let creds = check_arns(&app, &req)?;
    let sql = check_sql(req.sql.as_deref())?;
    let values = values::bind(&sql.names, &req.parameters)?;
    let text = req.sql.as_deref().unwrap_or_default();
    let lose = app
        .config
        .lose_answers
        .as_ref()
        .is_some_and(|l| l.take(text));
    let outcome = run(&app, &creds, &req, sql, vec![values], false).await?;
    if lose {
        return Err(ApiError::ServiceUnavailable(
            "the answer was lost after the statement ran (a test's fault)".into(),
        ));
    }
    let outcome = outcome.into_iter().next().unwrap_or_default();
    let generated_fields = generated_fields(&outcome)?;
    let column_metadata = match (&outcome.columns, req.include_result_metadata) {
        (Some(columns), true) => Some(columns.iter().map(values::column_metadata).collect()),
        _ => None,
    };
    let (records, formatted_records) = match (&outcome.columns, req.format_records_as) {
        (None, _) => (None, None),
        (Some(_), RecordsFormat::None) => (Some(outcome.rows), None),
        (Some(columns), RecordsFormat::Json) => (None, Some(format_json(columns, &outcome.rows))),
    };
    respond(&ExecuteStatementResponse {
        records,
        column_metadata,
        number_of_records_updated: outcome.affected_rows,
        generated_fields,
        formatted_records,
    })
}

/// `formattedRecords`: a JSON array of objects keyed by column label.
fn format_json(columns: &[mysql_async::Column], rows: &[Vec<Field>]) -> String {
    let records: Vec<serde_json::Map<String, serde_json::Value>> = rows
        .iter()
        .map(|row| {
            let labels = columns.iter().map(|c| c.name_str().into_owned());
            labels.zip(row.iter().map(Field::to_json)).collect()
        })
        .collect();
    serde_json::Value::from(records).to_string()
}

/// No row counts: Aurora reports only the generated keys of each parameter set.
async fn batch_execute(app: Arc<AppState>, req: Request) -> Result<Vec<u8>, ApiError> {
    let creds = check_arns(&app, &req)?;
    let sql = check_sql(req.sql.as_deref())?;
    // Every set is validated before the first one runs.
    let sets: Vec<Vec<Value>> = req
        .parameter_sets
        .iter()
        .map(|set| values::bind(&sql.names, set))
        .collect::<Result<_, _>>()?;
    // Like Aurora: with no parameter set there is nothing to run.
    let outcomes = match sets.is_empty() {
        true => Vec::new(),
        false => run(&app, &creds, &req, sql, sets, true).await?,
    };
    let update_results = outcomes
        .iter()
        .map(|outcome| Ok(json!({ "generatedFields": generated_fields(outcome)? })))
        .collect::<Result<Vec<_>, ApiError>>()?;
    respond(&json!({ "updateResults": update_results }))
}

/// Runs the statement once per set of values under the statement timeout: in the call's
/// transaction, which an error from the database or a cancelled statement ends (rolled
/// back), or else on a pooled connection: ExecuteStatement autocommitted, a batch
/// (`batch`) in a transaction of its own (all or none). A batch, as in the real API, has
/// no `continueAfterTimeout` nor `resultSetOptions`.
async fn run(
    app: &Arc<AppState>,
    creds: &SecretCredentials,
    req: &Request,
    sql: PlaceholderSql,
    sets: Vec<Vec<Value>>,
    batch: bool,
) -> Result<Vec<Outcome>, ApiError> {
    let continue_after_timeout = !batch && req.continue_after_timeout;
    let options = match batch {
        true => ResultSetOptions::default(),
        false => req.result_set_options,
    };
    let Some(id) = req.transaction_id.clone() else {
        let mut conn = app.db.conn(creds, req.database.as_deref()).await?;
        let connection_id = conn.id();
        let work = |deadline: Deadline| async move {
            if !batch {
                // Autocommit: a killed statement is rolled back by MariaDB itself.
                return database::run_sets(&mut conn, &sql, sets, options).await;
            }
            conn.query_drop("START TRANSACTION").await?;
            let result = database::run_sets(&mut conn, &sql, sets, options).await;
            let in_time = deadline.finish();
            if result.is_ok() && in_time {
                conn.query_drop("COMMIT").await?;
            } else {
                // Failed, or too late (the caller already got the timeout error and
                // ignores this result). Were ROLLBACK to fail, the pool's reset of the
                // connection would roll back as well.
                let _ = conn.query_drop("ROLLBACK").await;
            }
            result
        };
        return (app.db)
            .with_timeout(creds, connection_id, continue_after_timeout, work)
            .await;
    };
    let mut tx = app.db.transaction(&id).await?;
    let connection_id = tx.conn.as_ref().map_or(0, Conn::id);
    let state = app.clone();
    let work = |deadline: Deadline| async move {
        let result = match tx.conn.as_mut() {
            Some(conn) => database::run_sets(conn, &sql, sets, options).await,
            None => Err(transaction_not_found(&id)),
        };
        tx.last_used = Instant::now();
        let in_time = deadline.finish();
        let failed = result.as_ref().is_err_and(ApiError::aborts_transaction);
        if failed || (!in_time && !continue_after_timeout) {
            state.db.abort(&id, &mut tx).await;
        }
        result
    };
    (app.db)
        .with_timeout(creds, connection_id, continue_after_timeout, work)
        .await
}

async fn begin(app: Arc<AppState>, req: Request) -> Result<Vec<u8>, ApiError> {
    let creds = check_arns(&app, &req)?;
    let transaction_id = app.db.begin(&creds, req.database.as_deref()).await?;
    respond(&json!({ "transactionId": transaction_id }))
}

/// CommitTransaction and RollbackTransaction: runs `statement` and ends the transaction
/// (`call` says which, for [`ServerConfig::lose_answers`]).
async fn end(
    app: Arc<AppState>,
    req: Request,
    call: LostCall,
    status: &'static str,
) -> Result<Vec<u8>, ApiError> {
    // The transaction's connection is signed in already; the secret must still be known.
    check_arns(&app, &req)?;
    let id = req
        .transaction_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::bad_request("transactionId is required"))?;
    let mut tx = app.db.transaction(&id).await?;
    let mut conn = app.db.end(&id, &mut tx)?;
    let statement = match call {
        LostCall::Rollback => "ROLLBACK",
        _ => "COMMIT",
    };
    conn.query_drop(statement).await?;
    let lose = app
        .config
        .lose_answers
        .as_ref()
        .is_some_and(|l| l.take_end(&call));
    if lose {
        return Err(ApiError::ServiceUnavailable(format!(
            "the answer was lost after the {} (a test's fault)",
            statement.to_lowercase()
        )));
    }
    respond(&json!({ "transactionStatus": status }))
}

/// `POST /` with `X-Amz-Target: secretsmanager.<Operation>`: only GetSecretValue, for the
/// secrets this server knows (by ARN). Errors in the JSON 1.1 form (`__type`).
async fn secrets_manager(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let result = match target {
        "secretsmanager.GetSecretValue" => get_secret_value(&app, body),
        other => Err((
            "UnknownOperationException",
            format!("X-Amz-Target {other:?} is not supported: only secretsmanager.GetSecretValue"),
        )),
    };
    let (status, json) = match result {
        Ok(json) => {
            tracing::info!(operation = "GetSecretValue", status = 200, "ok");
            (StatusCode::OK, json)
        }
        Err((code, message)) => {
            tracing::info!(operation = target, status = 400, error = code, "failed");
            let body = json!({ "__type": code, "message": message });
            (StatusCode::BAD_REQUEST, body)
        }
    };
    let content_type = [(header::CONTENT_TYPE, SECRETS_MANAGER_CONTENT_TYPE)];
    (status, content_type, json.to_string()).into_response()
}

fn get_secret_value(
    app: &AppState,
    body: Body,
) -> Result<serde_json::Value, (&'static str, String)> {
    let invalid = |m: String| ("InvalidParameterException", m);
    let bytes = body.map_err(|e| invalid(format!("Could not read the request body: {e}")))?;
    let req: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("Malformed request body: {e}")))?;
    let id = (req["SecretId"].as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("SecretId is required".to_string()))?;
    let creds = app.secrets.get(id).ok_or_else(|| {
        (
            "ResourceNotFoundException",
            "Secrets Manager can't find the specified secret.".to_string(),
        )
    })?;
    let secret_string = if creds.is_plain() {
        creds.password.clone()
    } else {
        json!({ "username": creds.username, "password": creds.password }).to_string()
    };
    Ok(json!({
        "ARN": id,
        "Name": id.rsplit(':').next().unwrap_or(id),
        "VersionId": "00000000-0000-0000-0000-000000000000",
        "SecretString": secret_string,
        "VersionStages": ["AWSCURRENT"],
        "CreatedDate": 0.0,
    }))
}

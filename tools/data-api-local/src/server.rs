//! HTTP routes of the Data API and the operations behind them.
//!
//! Each handler reads the raw body itself (so a too-large or malformed body becomes a
//! `BadRequestException` in the API's format rather than axum's plain-text rejection),
//! checks the ARNs, validates everything it can before touching MariaDB, and answers
//! with the JSON body or an [`ApiError`].
//!
//! Every request first passes [`only_local_clients`]: the server has no authentication
//! (it accepts any SigV4 signature), so it must not be drivable from a web page in the
//! developer's browser: no `Origin` (browsers send it on cross-origin and on every
//! `POST`; the SDK never does), the SDK's `application/json` body (a page can send
//! `text/plain` without a preflight), and a loopback `Host` (a rebound DNS name pointing
//! at 127.0.0.1 keeps its own name in `Host`). Secrets Manager's route (`POST /`) takes
//! the SDK's `application/x-amz-json-1.1` instead, which a page cannot send without a
//! preflight either (and this server answers no preflight).
//!
//! `POST /` with `X-Amz-Target: secretsmanager.GetSecretValue` answers Secrets Manager's
//! GetSecretValue (the JSON 1.1 protocol `aws-sdk-secretsmanager` speaks) for the secrets
//! this server knows: `{"username": ..., "password": ...}` as `SecretString`.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use mysql_async::Value;
use mysql_async::prelude::Queryable;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ServerConfig;
use crate::database::{self, Database, Outcome, response_too_large};
use crate::error::ApiError;
use crate::secrets::{Credentials, SecretStore};
use crate::sql::{self, PlaceholderSql};
use crate::transactions::Registry;
use crate::values::{self, ResultOptions};
use crate::wire::*;

/// Data API request limit (headers and JSON included; we count the body).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Data API response limit.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Data API SQL text limit, in characters.
pub const MAX_SQL_CHARS: usize = 65_536;

pub struct AppState {
    pub config: ServerConfig,
    pub db: Database,
    pub secrets: Arc<SecretStore>,
    pub transactions: Arc<Registry>,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/Execute", post(execute_statement))
        .route("/BatchExecute", post(batch_execute_statement))
        .route("/BeginTransaction", post(begin_transaction))
        .route("/CommitTransaction", post(commit_transaction))
        .route("/RollbackTransaction", post(rollback_transaction))
        .route("/ExecuteSql", post(execute_sql))
        .route("/", post(secrets_manager))
        // One byte over the limit is enough to tell that the body is too large.
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES + 1))
        .layer(middleware::from_fn(only_local_clients))
        .with_state(state)
}

/// Refuses what a browser could send (see the module header); passes the SDK's calls.
async fn only_local_clients(request: Request, next: Next) -> Response {
    let content_type = if request.uri().path() == "/" {
        SECRETS_MANAGER_CONTENT_TYPE
    } else {
        "application/json"
    };
    match local_client_problem_for(request.headers(), content_type) {
        None => next.run(request).await,
        Some(problem) => {
            tracing::warn!(
                problem,
                "refused a request that did not come from a local SDK client"
            );
            ApiError::Forbidden(problem.to_string()).into_response()
        }
    }
}

/// Why a request's headers are not those of a local SDK client, if they are not.
pub fn local_client_problem(headers: &HeaderMap) -> Option<&'static str> {
    local_client_problem_for(headers, "application/json")
}

/// Like [`local_client_problem`], for a route whose body is of `content_type`.
pub fn local_client_problem_for(headers: &HeaderMap, content_type: &str) -> Option<&'static str> {
    if headers.contains_key(header::ORIGIN) {
        return Some("requests with an Origin header (from a browser) are refused");
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(content_type));
    if !json {
        return Some(if content_type == "application/json" {
            "the body must be application/json"
        } else {
            "the body must be application/x-amz-json-1.1"
        });
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let loopback = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Some("the Host must be a loopback address or localhost");
    }
    None
}

type Body = Result<Bytes, BytesRejection>;

async fn execute_statement(State(app): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    finish("ExecuteStatement", started, execute(&app, body).await)
}

async fn batch_execute_statement(State(app): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    finish(
        "BatchExecuteStatement",
        started,
        batch_execute(&app, body).await,
    )
}

async fn begin_transaction(State(app): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    finish("BeginTransaction", started, begin(&app, body).await)
}

async fn commit_transaction(State(app): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    finish(
        "CommitTransaction",
        started,
        end(&app, body, End::Commit).await,
    )
}

async fn rollback_transaction(State(app): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    finish(
        "RollbackTransaction",
        started,
        end(&app, body, End::Rollback).await,
    )
}

/// The deprecated ExecuteSql (Aurora Serverless v1 only) is not offered.
async fn execute_sql() -> Response {
    let started = Instant::now();
    finish(
        "ExecuteSql",
        started,
        Err(ApiError::bad_request(
            "ExecuteSql is not supported; use ExecuteStatement",
        )),
    )
}

/// The HTTP response, and one log line per call. Never logs parameter values or error
/// texts (MariaDB echoes values, e.g. "Duplicate entry 'alice' ...").
fn finish(
    operation: &'static str,
    started: Instant,
    result: Result<Vec<u8>, ApiError>,
) -> Response {
    let elapsed_ms = started.elapsed().as_millis();
    match result {
        Ok(json) => {
            tracing::info!(operation, status = 200, elapsed_ms, "ok");
            let mut response = (StatusCode::OK, json).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(err) => {
            let mysql_code = match &err {
                ApiError::Database { code, .. } => Some(*code),
                _ => None,
            };
            tracing::info!(
                operation,
                status = err.status().as_u16(),
                error = err.code(),
                mysql_code,
                elapsed_ms,
                "failed"
            );
            err.into_response()
        }
    }
}

fn parse<T: DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::bad_request(format!(
                "Request size exceeds the Data API limit of {MAX_REQUEST_BYTES} bytes (4 MiB)"
            ))
        } else {
            ApiError::bad_request(format!("Could not read the request body: {rejection}"))
        }
    })?;
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(ApiError::bad_request(format!(
            "Request size exceeds the Data API limit of {MAX_REQUEST_BYTES} bytes (4 MiB)"
        )));
    }
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
fn check_arns(
    config: &ServerConfig,
    secrets: &SecretStore,
    resource_arn: Option<&str>,
    secret_arn: Option<&str>,
) -> Result<Credentials, ApiError> {
    let resource_arn =
        resource_arn.ok_or_else(|| ApiError::bad_request("resourceArn is required"))?;
    let secret_arn = secret_arn.ok_or_else(|| ApiError::bad_request("secretArn is required"))?;
    if resource_arn != config.resource_arn {
        return Err(ApiError::bad_request(format!(
            "Invalid resourceArn {resource_arn}: this server serves {}",
            config.resource_arn
        )));
    }
    secrets.get(secret_arn).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Invalid secretArn {secret_arn}: this server accepts {}",
            secrets.arns().join(", ")
        ))
    })
}

fn check_sql(sql: Option<String>) -> Result<PlaceholderSql, ApiError> {
    let sql = sql
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("sql is required"))?;
    if sql.chars().count() > MAX_SQL_CHARS {
        return Err(ApiError::bad_request(format!(
            "SQL statement exceeds the maximum length of {MAX_SQL_CHARS} characters"
        )));
    }
    sql::parse(&sql).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn result_options(options: Option<ResultSetOptions>) -> Result<ResultOptions, ApiError> {
    let options = options.unwrap_or_default();
    let decimal_as_number = match options.decimal_return_type.as_deref() {
        None | Some("STRING") => false,
        Some("DOUBLE_OR_LONG") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid decimalReturnType '{other}': expected STRING or DOUBLE_OR_LONG"
            )));
        }
    };
    let long_as_string = match options.long_return_type.as_deref() {
        None | Some("LONG") => false,
        Some("STRING") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid longReturnType '{other}': expected LONG or STRING"
            )));
        }
    };
    Ok(ResultOptions {
        decimal_as_number,
        long_as_string,
    })
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

async fn execute(app: &AppState, body: Body) -> Result<Vec<u8>, ApiError> {
    let req: ExecuteStatementRequest = parse(body)?;
    let creds = check_arns(
        &app.config,
        &app.secrets,
        req.resource_arn.as_deref(),
        req.secret_arn.as_deref(),
    )?;
    let sql = check_sql(req.sql)?;
    let values = values::bind(&sql.names, &req.parameters)?;
    let options = result_options(req.result_set_options)?;
    let as_json = match req.format_records_as.as_deref() {
        None | Some("NONE") => false,
        Some("JSON") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid formatRecordsAs '{other}': expected NONE or JSON"
            )));
        }
    };
    let timeout = app.config.statement_timeout;
    let continue_after_timeout = req.continue_after_timeout;

    let outcome = match req.transaction_id.as_deref() {
        Some(id) => {
            let tx = app.transactions.get(id)?;
            let mut slot = tx.lock().await?;
            let connection_id = slot.as_ref().map_or(0, |c| c.id());
            let registry = app.transactions.clone();
            let tx_id = tx.id.clone();
            let result = app
                .db
                .with_timeout(
                    &creds,
                    connection_id,
                    timeout,
                    continue_after_timeout,
                    |deadline| async move {
                        let result = match slot.as_mut() {
                            Some(conn) => {
                                database::run_statement(
                                    conn,
                                    &sql,
                                    values,
                                    options,
                                    MAX_RESPONSE_BYTES,
                                )
                                .await
                            }
                            None => Err(crate::transactions::not_found(&tx_id)),
                        };
                        let in_time = deadline.finish();
                        let failed = result.as_ref().is_err_and(ApiError::aborts_transaction);
                        if failed || (!in_time && !continue_after_timeout) {
                            registry.abort(&tx_id, &mut slot).await;
                        }
                        result
                    },
                )
                .await;
            tx.touch();
            result?
        }
        None => {
            let mut conn = app.db.conn(&creds, req.database.as_deref()).await?;
            let connection_id = conn.id();
            app.db
                .with_timeout(
                    &creds,
                    connection_id,
                    timeout,
                    continue_after_timeout,
                    |_deadline| async move {
                        // Autocommit: a killed statement is rolled back by MariaDB itself.
                        database::run_statement(
                            &mut conn,
                            &sql,
                            values,
                            options,
                            MAX_RESPONSE_BYTES,
                        )
                        .await
                    },
                )
                .await?
        }
    };

    let generated_fields = generated_fields(&outcome)?;
    let column_metadata = match (&outcome.columns, req.include_result_metadata) {
        (Some(columns), true) => Some(columns.iter().map(values::column_metadata).collect()),
        _ => None,
    };
    let (records, formatted_records) = match (&outcome.columns, as_json) {
        (None, _) => (None, None),
        (Some(_), false) => (Some(outcome.rows), None),
        (Some(columns), true) => (None, Some(format_json(columns, &outcome.rows)?)),
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
fn format_json(columns: &[mysql_async::Column], rows: &[Vec<Field>]) -> Result<String, ApiError> {
    let labels: Vec<String> = columns.iter().map(|c| c.name_str().into_owned()).collect();
    let objects: Vec<serde_json::Map<String, serde_json::Value>> = rows
        .iter()
        .map(|row| {
            labels
                .iter()
                .cloned()
                .zip(row.iter().map(Field::to_json))
                .collect()
        })
        .collect();
    serde_json::to_string(&objects)
        .map_err(|e| ApiError::Internal(format!("could not format records as JSON: {e}")))
}

async fn batch_execute(app: &AppState, body: Body) -> Result<Vec<u8>, ApiError> {
    let req: BatchExecuteStatementRequest = parse(body)?;
    let creds = check_arns(
        &app.config,
        &app.secrets,
        req.resource_arn.as_deref(),
        req.secret_arn.as_deref(),
    )?;
    let sql = check_sql(req.sql)?;
    // Every set is validated before the first one runs.
    let sets: Vec<Vec<Value>> = req
        .parameter_sets
        .iter()
        .map(|set| values::bind(&sql.names, set))
        .collect::<Result<_, _>>()?;
    if sets.is_empty() {
        // Like Aurora: with no parameter set there is nothing to run.
        return respond(&BatchExecuteStatementResponse {
            update_results: Vec::new(),
        });
    }
    let timeout = app.config.statement_timeout;

    let update_results = match req.transaction_id.as_deref() {
        Some(id) => {
            let tx = app.transactions.get(id)?;
            let mut slot = tx.lock().await?;
            let connection_id = slot.as_ref().map_or(0, |c| c.id());
            let registry = app.transactions.clone();
            let tx_id = tx.id.clone();
            let result = app
                .db
                .with_timeout(
                    &creds,
                    connection_id,
                    timeout,
                    false,
                    |deadline| async move {
                        let result = match slot.as_mut() {
                            Some(conn) => run_sets(conn, &sql, sets).await,
                            None => Err(crate::transactions::not_found(&tx_id)),
                        };
                        let in_time = deadline.finish();
                        if !in_time || result.as_ref().is_err_and(ApiError::aborts_transaction) {
                            registry.abort(&tx_id, &mut slot).await;
                        }
                        result
                    },
                )
                .await;
            tx.touch();
            result?
        }
        None => {
            let mut conn = app.db.conn(&creds, req.database.as_deref()).await?;
            let connection_id = conn.id();
            app.db
                .with_timeout(
                    &creds,
                    connection_id,
                    timeout,
                    false,
                    |deadline| async move {
                        // All sets or none: one implicit transaction.
                        conn.query_drop("START TRANSACTION").await?;
                        let result = run_sets(&mut conn, &sql, sets).await;
                        let in_time = deadline.finish();
                        match result {
                            Ok(results) if in_time => {
                                conn.query_drop("COMMIT").await?;
                                Ok(results)
                            }
                            other => {
                                // Failed, or too late (the caller already got the timeout
                                // error and ignores this result). Were ROLLBACK to fail, the
                                // pool's reset of the connection would roll back as well.
                                let _ = conn.query_drop("ROLLBACK").await;
                                other
                            }
                        }
                    },
                )
                .await?
        }
    };
    respond(&BatchExecuteStatementResponse { update_results })
}

/// Runs the statement once per parameter set. No row counts: Aurora reports only the
/// generated keys of each set.
async fn run_sets(
    conn: &mut mysql_async::Conn,
    sql: &PlaceholderSql,
    sets: Vec<Vec<Value>>,
) -> Result<Vec<UpdateResult>, ApiError> {
    let mut results = Vec::with_capacity(sets.len());
    for values in sets {
        let outcome = database::run_statement(
            conn,
            sql,
            values,
            ResultOptions::default(),
            MAX_RESPONSE_BYTES,
        )
        .await?;
        results.push(UpdateResult {
            generated_fields: generated_fields(&outcome)?,
        });
    }
    Ok(results)
}

async fn begin(app: &AppState, body: Body) -> Result<Vec<u8>, ApiError> {
    let req: BeginTransactionRequest = parse(body)?;
    let creds = check_arns(
        &app.config,
        &app.secrets,
        req.resource_arn.as_deref(),
        req.secret_arn.as_deref(),
    )?;
    let mut conn = app.db.conn(&creds, req.database.as_deref()).await?;
    conn.query_drop("START TRANSACTION").await?;
    let transaction_id = app.transactions.insert(conn);
    tracing::debug!(%transaction_id, "transaction started");
    respond(&BeginTransactionResponse { transaction_id })
}

#[derive(Clone, Copy)]
enum End {
    Commit,
    Rollback,
}

async fn end(app: &AppState, body: Body, how: End) -> Result<Vec<u8>, ApiError> {
    let req: EndTransactionRequest = parse(body)?;
    // The transaction's connection is signed in already; the secret must still be known.
    let _creds = check_arns(
        &app.config,
        &app.secrets,
        req.resource_arn.as_deref(),
        req.secret_arn.as_deref(),
    )?;
    let id = req
        .transaction_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::bad_request("transactionId is required"))?;
    let tx = app.transactions.get(&id)?;
    let mut slot = tx.lock().await?;
    let mut conn = app.transactions.end(&id, &mut slot)?;
    let (statement, status) = match how {
        End::Commit => ("COMMIT", "Transaction Committed"),
        End::Rollback => ("ROLLBACK", "Rollback Complete"),
    };
    conn.query_drop(statement).await?;
    respond(&EndTransactionResponse {
        transaction_status: status.to_string(),
    })
}

/// The content type of Secrets Manager's JSON 1.1 protocol.
pub const SECRETS_MANAGER_CONTENT_TYPE: &str = "application/x-amz-json-1.1";

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
            let body = serde_json::json!({ "__type": code, "message": message });
            (StatusCode::BAD_REQUEST, body.to_string().into_bytes())
        }
    };
    let mut response = (status, json).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(SECRETS_MANAGER_CONTENT_TYPE),
    );
    response
}

fn get_secret_value(app: &AppState, body: Body) -> Result<Vec<u8>, (&'static str, String)> {
    #[derive(serde::Deserialize)]
    struct GetSecretValueRequest {
        #[serde(rename = "SecretId")]
        secret_id: Option<String>,
    }
    let invalid = |m: String| ("InvalidParameterException", m);
    let bytes = body.map_err(|e| invalid(format!("Could not read the request body: {e}")))?;
    let req: GetSecretValueRequest = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("Malformed request body: {e}")))?;
    let id = req
        .secret_id
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("SecretId is required".to_string()))?;
    let creds = app.secrets.get(&id).ok_or_else(|| {
        (
            "ResourceNotFoundException",
            "Secrets Manager can't find the specified secret.".to_string(),
        )
    })?;
    let secret_string = serde_json::json!({
        "username": creds.username,
        "password": creds.password,
    })
    .to_string();
    let name = id.rsplit(':').next().unwrap_or(&id).to_string();
    let out = serde_json::json!({
        "ARN": id,
        "Name": name,
        "VersionId": "00000000-0000-0000-0000-000000000000",
        "SecretString": secret_string,
        "VersionStages": ["AWSCURRENT"],
        "CreatedDate": 0.0,
    });
    Ok(out.to_string().into_bytes())
}

//! [`DataApi`], the client bound to one cluster, secret and database, and the plumbing
//! every statement goes through: one statement, and a transaction begun, committed or
//! rolled back.
//!
//! Invariants kept here: every call is sent once and bounded by the configured timeout,
//! and every failure leaves through [`store_error`], so callers see transient and
//! permanent errors told apart.
//!
//! Once, because the SDK's own retries (standard mode: after a timeout, a cut
//! connection, a 500/502/503/504) would send a statement again whose first copy may have
//! run: inside a transaction a stock update then takes its units twice, and a close's
//! settlement counts its units back twice. Only the caller knows what may be sent again:
//! the drainer rolls a failed transaction back and writes the batch anew; a buyer's
//! request answered 503 is asked again by the client. The one exception is an
//! autocommit statement the database answered as a lock's victim
//! ([`super::is_lock_victim`]): that answer says nothing of it stayed, so it is sent
//! again, at most [`VICTIM_ATTEMPTS`] times in all, rather than turning the passing
//! deadlock of two writers into a 503.

use aws_config::BehaviorVersion;
use aws_sdk_rdsdata::Client;
use aws_sdk_rdsdata::config::retry::RetryConfig;
use aws_sdk_rdsdata::config::{Credentials, Region};
use aws_sdk_rdsdata::error::ProvideErrorMetadata;
use aws_sdk_rdsdata::operation::execute_statement::ExecuteStatementOutput;
use aws_sdk_rdsdata::types::SqlParameter;
use aws_smithy_types::timeout::TimeoutConfig;

use super::errors::{is_lock_victim, says_transaction_not_found, store_error};
use crate::config::DataApiConfig;
use crate::error::StoreError;

/// How many times in all an autocommit statement is sent while the database answers it
/// as a lock's victim.
pub const VICTIM_ATTEMPTS: u32 = 4;

/// A Data API client bound to one cluster, secret and database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DataApi {
    client: Client,
    cluster_arn: String,
    secret_arn: String,
    database: String,
}

/// The AWS SDK's shared configuration for a client of this project. Against a local
/// endpoint (`local`: data-api-local, which also answers Secrets Manager) it needs no AWS
/// credentials or region: the local server accepts any signature.
pub async fn sdk_config(local: bool) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if local {
        loader = loader.credentials_provider(Credentials::new(
            "local",
            "local",
            None,
            None,
            "seckill-local",
        ));
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            loader = loader.region(Region::new("us-east-1"));
        }
    }
    loader.load().await
}

impl DataApi {
    /// Builds the client once per cold start: region and credentials from the standard
    /// AWS environment, a bound on each call, no retry by the SDK (see the module's
    /// header).
    pub async fn connect(cfg: &DataApiConfig) -> DataApi {
        let shared = sdk_config(cfg.endpoint.is_some()).await;
        let mut builder = aws_sdk_rdsdata::config::Builder::from(&shared)
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(cfg.timeout)
                    .build(),
            )
            .retry_config(RetryConfig::disabled());
        if let Some(endpoint) = &cfg.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        DataApi {
            client: Client::from_conf(builder.build()),
            cluster_arn: cfg.cluster_arn.clone(),
            secret_arn: cfg.secret_arn.clone(),
            database: cfg.database.clone(),
        }
    }

    /// The database this client works in.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Runs one statement, inside `transaction` when given. An autocommit statement
    /// chosen as a lock's victim is sent again (the module's header).
    pub async fn execute(
        &self,
        sql: &str,
        params: Vec<SqlParameter>,
        transaction: Option<&str>,
    ) -> Result<ExecuteStatementOutput, StoreError> {
        if transaction.is_some() {
            return self.send(sql, params, transaction).await;
        }
        let mut attempt = 1;
        loop {
            match self.send(sql, params.clone(), None).await {
                Err(e) if attempt < VICTIM_ATTEMPTS && is_lock_victim(&e) => {
                    tracing::debug!(attempt, error = %e, "autocommit statement was a lock's victim, sending it again");
                    // Apart a little and more each time, so the winner finishes first.
                    let jitter = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::from(d.subsec_nanos() % 10));
                    let pause = 5 * u64::from(attempt) + jitter;
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn send(
        &self,
        sql: &str,
        params: Vec<SqlParameter>,
        transaction: Option<&str>,
    ) -> Result<ExecuteStatementOutput, StoreError> {
        self.client
            .execute_statement()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .database(&self.database)
            .sql(sql)
            .set_parameters(Some(params))
            .set_transaction_id(transaction.map(str::to_string))
            .send()
            .await
            .map_err(store_error)
    }

    /// The first column of the first row of `sql` as a string (`None`: no row, or `NULL`).
    pub async fn first_string(
        &self,
        sql: &str,
        params: Vec<SqlParameter>,
    ) -> Result<Option<String>, StoreError> {
        let out = self.execute(sql, params, None).await?;
        Ok(out
            .records()
            .first()
            .and_then(|r| r.first())
            .and_then(super::values::field::string))
    }

    /// Begins a transaction; the caller must commit or roll back.
    pub async fn begin(&self) -> Result<String, StoreError> {
        let out = self
            .client
            .begin_transaction()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .database(&self.database)
            .send()
            .await
            .map_err(store_error)?;
        out.transaction_id
            .ok_or_else(|| StoreError::Corrupt("BeginTransaction returned no id".into()))
    }

    pub async fn commit(&self, transaction: &str) -> Result<(), StoreError> {
        self.client
            .commit_transaction()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .transaction_id(transaction)
            .send()
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Rolls back; errors are only logged, since the server also rolls back abandoned
    /// transactions on its own.
    pub async fn rollback(&self, transaction: &str) {
        if let Err(err) = self.try_rollback(transaction).await {
            tracing::warn!(error = %err, "rollback failed");
        }
    }

    /// Rolls back and says how it went: `Ok(true)` rolled back, `Ok(false)` the server
    /// no longer knew the transaction (committed, rolled back or expired already).
    pub async fn try_rollback(&self, transaction: &str) -> Result<bool, StoreError> {
        match self
            .client
            .rollback_transaction()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .transaction_id(transaction)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(err)
                if matches!(
                    err.code(),
                    Some("TransactionNotFoundException" | "NotFoundException")
                ) || (err.code() == Some("BadRequestException")
                    && err.message().is_some_and(says_transaction_not_found)) =>
            {
                Ok(false)
            }
            Err(err) => Err(store_error(err)),
        }
    }
}

//! Secrets Manager: a secret's string, read with GetSecretValue (in AWS, or from the
//! local stack's data-api-local, which answers the same protocol); and where a function
//! finds a set of secrets ([`SecretSource`]: by ARN or given inline), one reader for both
//! functions' configurations.

use std::time::Duration;

use aws_sdk_secretsmanager::config::timeout::TimeoutConfig;
use aws_sdk_secretsmanager::error::DisplayErrorContext;

use super::data_api::sdk_config;
use crate::config::EnvReader;
use crate::error::StoreError;
use crate::webhook::Secrets;

/// Where a function finds a set of secrets (`current[,previous]`).
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// None configured: what needs them is unavailable (answers 503, or is skipped).
    Missing,
    /// Given in the configuration (tests, local use without Secrets Manager).
    Inline(Secrets),
    /// A Secrets Manager secret whose string is `current[,previous]`. `endpoint`:
    /// Secrets Manager's URL, locally.
    SecretsManager {
        arn: String,
        endpoint: Option<String>,
    },
}

impl SecretSource {
    /// The set named by the ARN variable `arn_var` (read from Secrets Manager, at
    /// `endpoint` when given) or given inline by the list variable `list_var`
    /// (`current[,previous]`), not both; a problem is reported to `env`.
    pub fn read(
        env: &mut EnvReader,
        arn_var: &str,
        list_var: &str,
        endpoint: &Option<String>,
    ) -> SecretSource {
        match (env.optional(arn_var), env.optional(list_var)) {
            (Some(_), Some(_)) => {
                env.problem(format!("set {arn_var} or {list_var}, not both"));
                SecretSource::Missing
            }
            (Some(arn), None) => SecretSource::SecretsManager {
                arn,
                endpoint: endpoint.clone(),
            },
            (None, Some(list)) => match Secrets::parse(&list) {
                Ok(secrets) => SecretSource::Inline(secrets),
                Err(e) => {
                    env.problem(format!("{list_var}: {e}"));
                    SecretSource::Missing
                }
            },
            (None, None) => SecretSource::Missing,
        }
    }

    /// Whether the secrets are read from Secrets Manager.
    pub fn by_arn(&self) -> bool {
        matches!(self, SecretSource::SecretsManager { .. })
    }

    /// The secrets, read once now (`None` when none are configured). Callers that
    /// serve requests hold them between reads (seckill-http's `HeldSecrets`).
    pub async fn fetch(&self) -> Result<Option<Secrets>, StoreError> {
        match self {
            SecretSource::Missing => Ok(None),
            SecretSource::Inline(s) => Ok(Some(s.clone())),
            SecretSource::SecretsManager { arn, endpoint } => {
                let text = secret_string(arn, endpoint.as_deref()).await?;
                Secrets::parse(&text)
                    .map(Some)
                    .map_err(|e| StoreError::Corrupt(format!("the secret {arn}: {e}")))
            }
        }
    }
}

/// The string of secret `arn` (its current version). `endpoint`: Secrets Manager's URL
/// when it is not AWS's (the local stack).
pub async fn secret_string(arn: &str, endpoint: Option<&str>) -> Result<String, StoreError> {
    let shared = sdk_config(endpoint.is_some()).await;
    let mut builder = aws_sdk_secretsmanager::config::Builder::from(&shared).timeout_config(
        TimeoutConfig::builder()
            .operation_timeout(Duration::from_secs(5))
            .build(),
    );
    builder.set_endpoint_url(endpoint.map(str::to_string));
    let client = aws_sdk_secretsmanager::Client::from_conf(builder.build());
    let out = client
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(|e| StoreError::Unavailable {
            backend: "secrets manager",
            detail: format!("GetSecretValue {arn}: {}", DisplayErrorContext(&e)),
        })?;
    out.secret_string()
        .map(str::to_string)
        .ok_or_else(|| StoreError::Corrupt(format!("secret {arn} has no SecretString")))
}

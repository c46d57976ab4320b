//! Secrets Manager: a secret's string, read with GetSecretValue (in AWS, or from the
//! local stack's data-api-local, which answers the same protocol).

use std::time::Duration;

use aws_sdk_secretsmanager::config::timeout::TimeoutConfig;
use aws_sdk_secretsmanager::error::DisplayErrorContext;

use super::data_api::sdk_config;
use crate::error::StoreError;

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

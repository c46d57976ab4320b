//! The payment webhook's signing secrets: where the function finds them
//! ([`SecretSource`], part of the [`Config`](crate::config::Config)) and how an instance
//! holds them between reads ([`WebhookSecrets`]).

use std::time::{Duration, Instant};

use seckill_shared::webhook::Secrets;
use tokio::sync::Mutex;

use crate::error::ApiError;

/// Where the function finds the webhook's signing secrets.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// None configured: the webhook answers 503 (the provider resends later).
    Missing,
    /// Given in the configuration (tests, local use without Secrets Manager).
    Inline(Secrets),
    /// A Secrets Manager secret whose string is `current[,previous]`, read at the first
    /// event and again every [`SECRET_REFRESH`] (a rotation reaches every instance
    /// within that time). `endpoint`: Secrets Manager's URL, locally.
    SecretsManager {
        arn: String,
        endpoint: Option<String>,
    },
}

/// How long an instance keeps the secrets it read before reading them again.
pub const SECRET_REFRESH: Duration = Duration::from_secs(300);

/// The webhook's secrets as an instance holds them.
pub struct WebhookSecrets {
    source: SecretSource,
    read: Mutex<Option<(Instant, Secrets)>>,
}

impl WebhookSecrets {
    pub fn new(source: SecretSource) -> WebhookSecrets {
        WebhookSecrets {
            source,
            read: Mutex::new(None),
        }
    }

    /// The secrets to check a signature with, read from their source if need be.
    pub(crate) async fn get(&self) -> Result<Secrets, ApiError> {
        let (arn, endpoint) = match &self.source {
            SecretSource::Inline(s) => return Ok(s.clone()),
            SecretSource::Missing => {
                return Err(ApiError::Unavailable(
                    seckill_shared::error::StoreError::Unavailable {
                        backend: "secrets",
                        detail: "no payment webhook secret configured (PAYMENT_WEBHOOK_SECRET_ARN)"
                            .into(),
                    },
                ));
            }
            SecretSource::SecretsManager { arn, endpoint } => (arn, endpoint.as_deref()),
        };
        let mut read = self.read.lock().await;
        if let Some((at, secrets)) = read.as_ref()
            && at.elapsed() < SECRET_REFRESH
        {
            return Ok(secrets.clone());
        }
        let text = seckill_shared::adapters::secrets::secret_string(arn, endpoint).await?;
        let secrets = Secrets::parse(&text).map_err(|e| {
            ApiError::Unavailable(seckill_shared::error::StoreError::Corrupt(format!(
                "the payment webhook secret {arn}: {e}"
            )))
        })?;
        *read = Some((Instant::now(), secrets.clone()));
        Ok(secrets)
    }
}

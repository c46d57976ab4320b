//! Signing secrets an instance holds: the payment webhook's and the waiting rooms'
//! entry tokens'. Where the function finds each ([`SecretSource`], part of the
//! [`Config`](crate::config::Config)) and how an instance holds them between reads
//! ([`HeldSecrets`]): a rotation (`new,old`) reaches every instance within
//! [`SECRET_REFRESH`].

use std::time::{Duration, Instant};

use seckill_shared::webhook::Secrets;
use tokio::sync::Mutex;

use crate::error::ApiError;

/// Where the function finds a set of signing secrets.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// None configured: what needs them answers 503 (the webhook's provider resends
    /// later; a waiting room cannot hand out or check entry tokens).
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

/// One set of secrets as an instance holds them.
pub struct HeldSecrets {
    source: SecretSource,
    /// What they are and the variable that names them, for errors and logs.
    what: &'static str,
    read: Mutex<Option<(Instant, Secrets)>>,
}

impl HeldSecrets {
    /// `what` names them in errors, e.g. "payment webhook secret
    /// (PAYMENT_WEBHOOK_SECRET_ARN)".
    pub fn new(source: SecretSource, what: &'static str) -> HeldSecrets {
        HeldSecrets {
            source,
            what,
            read: Mutex::new(None),
        }
    }

    /// The secrets to sign or check with, read from their source if need be.
    pub(crate) async fn get(&self) -> Result<Secrets, ApiError> {
        let (arn, endpoint) = match &self.source {
            SecretSource::Inline(s) => return Ok(s.clone()),
            SecretSource::Missing => {
                return Err(ApiError::Unavailable(
                    seckill_shared::error::StoreError::Unavailable {
                        backend: "secrets",
                        detail: format!("no {} configured", self.what),
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
                "the {} {arn}: {e}",
                self.what
            )))
        })?;
        *read = Some((Instant::now(), secrets.clone()));
        Ok(secrets)
    }
}

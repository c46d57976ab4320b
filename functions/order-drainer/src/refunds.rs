//! Each run's refunds (`seckill_shared::refunds`): beside the drain, for the run's time,
//! the Stripe payments to refund are refunded through Stripe's API, once each. The
//! drain comes first in everything: refunds only wait on Stripe and the Data API, never
//! on the run's batches, and a Stripe that cannot be reached, or a key that cannot be
//! read, ends this run's refunds with a warning (the next run tries again); it never
//! counts as a drain error.

use std::time::Instant;

use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::stripe::StripeApi;
use seckill_shared::refunds::{RefundRun, issue_due};

use seckill_shared::adapters::secrets::SecretSource;

use crate::config::{Config, StripeRefunds};

/// The refunds of a run whose drain ends by `deadline` (less the safety margin, at most
/// `max_run` from now): `None` without Stripe, or when its key could not be read.
pub async fn beside(
    refunder: Option<&Refunder>,
    db: &DataApi,
    cfg: &Config,
    deadline: Instant,
) -> Option<RefundRun> {
    let until = deadline
        .checked_sub(cfg.safety_margin)
        .unwrap_or(deadline)
        .min(Instant::now() + cfg.max_run);
    refunder?.run(db, until).await
}

/// The Stripe client a drainer keeps (built once per cold start), with its key's source.
pub struct Refunder {
    api: StripeApi,
    key: SecretSource,
}

impl Refunder {
    pub fn new(cfg: &StripeRefunds) -> Refunder {
        Refunder {
            api: StripeApi::new(&cfg.api_base),
            key: cfg.key.clone(),
        }
    }

    /// Refunds what is due until `until`; `None` when the key could not be read.
    pub async fn run(&self, db: &DataApi, until: Instant) -> Option<RefundRun> {
        let key = match self.key.fetch().await {
            Ok(Some(secrets)) => String::from_utf8_lossy(secrets.current()).into_owned(),
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(%error, "stripe key not read: no refunds this run");
                return None;
            }
        };
        let budget = until.saturating_duration_since(Instant::now());
        match issue_due(db, &self.api, &key, budget).await {
            Ok(run) => Some(run),
            Err(error) => {
                tracing::warn!(%error, "refunds stopped by the database: the next run goes on");
                None
            }
        }
    }
}

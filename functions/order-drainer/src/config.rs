//! Configuration of order-drainer, read once per cold start (`docs/design.md` lists the
//! names). Every problem is reported at once.

use std::time::Duration;

use seckill_shared::adapters::secrets::SecretSource;
use seckill_shared::config::{
    ConfigError, DataApiConfig, EnvReader, RedisConfig, backend_env_vars_and,
};
use seckill_shared::domain::VoucherId;

/// Defaults, chosen for a 60 s function timeout on a one-minute schedule.
pub mod defaults {
    /// XREADGROUP COUNT: one Data API transaction per this many orders.
    pub const BATCH_SIZE: usize = 1_000;
    /// XAUTOCLAIM min-idle-time: above the function timeout (60 s), so a live drainer's
    /// entries are never taken from it mid-batch.
    pub const MIN_IDLE_MS: u64 = 120_000;
    /// Vouchers drained at once (each has at most one batch in flight).
    pub const CONCURRENCY: usize = 8;
    /// How long a finished, drained sale's Redis keys are kept (7 days).
    pub const RETENTION_S: u64 = 7 * 24 * 3_600;
    /// Stop starting work this long before the Lambda deadline.
    pub const SAFETY_MARGIN_MS: u64 = 5_000;
    /// The longest one invocation drains (50 s of a one-minute schedule period).
    pub const MAX_RUN_MS: u64 = 50_000;
    /// Pause between polls when every stream is empty.
    pub const IDLE_POLL_MS: u64 = 200;
}

/// The largest accepted batch: one batch is one Data API transaction (chunked statements).
pub const MAX_BATCH_SIZE: usize = 10_000;

/// The most vouchers drained at once: each holds a Data API transaction while it commits.
pub const MAX_CONCURRENCY: usize = 64;

/// The environment variables [`Config::read`] reads itself, besides the backends'
/// ([`seckill_shared::config::BACKEND_ENV_VARS`]); [`env_vars`] is all of them.
const OWN_ENV_VARS: &[&str] = &[
    "DRAINER_BATCH_SIZE",
    "DRAINER_MIN_IDLE_MS",
    "DRAINER_CONCURRENCY",
    "DRAINER_RETENTION_S",
    "DRAINER_SAFETY_MARGIN_MS",
    "DRAINER_MAX_RUN_MS",
    "DRAINER_IDLE_POLL_MS",
    "DRAINER_VOUCHERS",
    "STRIPE_API_BASE",
    "STRIPE_SECRET_KEY_ARN",
    "STRIPE_SECRET_KEY",
    "SECRETS_MANAGER_URL",
    "EVENT_BUS_NAME",
    "EVENTS_ENDPOINT_URL",
];

/// The drainer's settings, read once per cold start: where the backends are, and how
/// much one run drains and for how long.
#[derive(Debug, Clone)]
pub struct Config {
    pub redis: RedisConfig,
    pub data_api: DataApiConfig,
    /// `DRAINER_BATCH_SIZE`: entries per XREADGROUP / XAUTOCLAIM page and per
    /// transaction.
    pub batch_size: usize,
    /// `DRAINER_MIN_IDLE_MS`: how long an entry stays pending before another invocation
    /// claims it. Must exceed the function timeout.
    pub min_idle: Duration,
    /// `DRAINER_CONCURRENCY`: vouchers drained at once. One voucher's batches stay
    /// serial (its row lock), so this is what lets many small sales drain together.
    pub concurrency: usize,
    /// `DRAINER_RETENTION_S`: how long a retired sale's Redis keys are kept (buyers,
    /// stream, sale; not a non-empty dead-letter stream); 0 keeps them forever.
    pub retention: Option<Duration>,
    /// `DRAINER_SAFETY_MARGIN_MS`: no new batch starts closer than this to the deadline.
    pub safety_margin: Duration,
    /// `DRAINER_MAX_RUN_MS`: the longest one invocation keeps draining.
    pub max_run: Duration,
    /// `DRAINER_IDLE_POLL_MS`: pause between polls when every stream is empty.
    pub idle_poll: Duration,
    /// `DRAINER_VOUCHERS` (optional, comma-separated ids): drain only these vouchers
    /// instead of the active set (operators draining one sale; test isolation).
    pub vouchers: Option<Vec<VoucherId>>,
    /// Stripe's API (`STRIPE_API_BASE`, default Stripe's own) and its secret key
    /// (`STRIPE_SECRET_KEY_ARN`, read each run from Secrets Manager at
    /// `SECRETS_MANAGER_URL` when given; or `STRIPE_SECRET_KEY`): each run refunds the
    /// Stripe payments to refund (`crate::refunds`). `None`: no refunds issued.
    pub stripe: Option<StripeRefunds>,
    /// `EVENT_BUS_NAME` (and `EVENTS_ENDPOINT_URL`, a local endpoint such as moto's): each
    /// run publishes the order events the database owes to this bus (`crate::events`).
    /// `None`: they wait in the outbox (`seckill status` shows its depth).
    pub events: Option<EventsConfig>,
}

/// Where the drainer publishes order events.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    pub bus: String,
    /// EventBridge's URL when not AWS's own (the local stack's moto).
    pub endpoint: Option<String>,
}

/// Where the drainer calls Stripe for refunds, and with which key.
#[derive(Debug, Clone)]
pub struct StripeRefunds {
    pub api_base: String,
    /// The secret key (its current one calls Stripe).
    pub key: SecretSource,
}

/// Every environment variable [`Config::read`] reads: the only ones the SAM template may
/// give the drainer (with `RUST_LOG`), as for seckill-http.
pub fn env_vars() -> Vec<&'static str> {
    backend_env_vars_and(OWN_ENV_VARS)
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::read(EnvReader::from_env())
    }

    pub fn read(mut env: EnvReader) -> Result<Config, ConfigError> {
        let redis = RedisConfig::read(&mut env);
        let data_api = DataApiConfig::read(&mut env);
        let batch_size = env.parse_or("DRAINER_BATCH_SIZE", defaults::BATCH_SIZE);
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            env.problem(format!(
                "DRAINER_BATCH_SIZE must be between 1 and {MAX_BATCH_SIZE}"
            ));
        }
        let min_idle_ms = env.parse_or("DRAINER_MIN_IDLE_MS", defaults::MIN_IDLE_MS);
        if min_idle_ms == 0 {
            env.problem("DRAINER_MIN_IDLE_MS must be positive");
        }
        let concurrency = env.parse_or("DRAINER_CONCURRENCY", defaults::CONCURRENCY);
        if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
            env.problem(format!(
                "DRAINER_CONCURRENCY must be between 1 and {MAX_CONCURRENCY}"
            ));
        }
        let retention_s = env.parse_or("DRAINER_RETENTION_S", defaults::RETENTION_S);
        let safety_margin = env.parse_or("DRAINER_SAFETY_MARGIN_MS", defaults::SAFETY_MARGIN_MS);
        let max_run = env.parse_or("DRAINER_MAX_RUN_MS", defaults::MAX_RUN_MS);
        let idle_poll = env.parse_or("DRAINER_IDLE_POLL_MS", defaults::IDLE_POLL_MS);
        let vouchers = env.optional("DRAINER_VOUCHERS").map(|list| {
            let mut ids = Vec::new();
            for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match part.parse::<VoucherId>() {
                    Ok(id) => ids.push(id),
                    Err(_) => env.problem(format!("DRAINER_VOUCHERS has a bad id {part:?}")),
                }
            }
            ids
        });
        let endpoint = env.optional("SECRETS_MANAGER_URL");
        let key = SecretSource::read(
            &mut env,
            "STRIPE_SECRET_KEY_ARN",
            "STRIPE_SECRET_KEY",
            &endpoint,
        );
        if endpoint.is_some() && !key.by_arn() {
            env.problem("SECRETS_MANAGER_URL is set but STRIPE_SECRET_KEY_ARN is not");
        }
        let api_base = env.optional("STRIPE_API_BASE");
        let stripe = match key {
            SecretSource::Missing => {
                if api_base.is_some() {
                    env.problem("STRIPE_API_BASE is set but no Stripe key (STRIPE_SECRET_KEY_ARN or STRIPE_SECRET_KEY)");
                }
                None
            }
            key => Some(StripeRefunds {
                api_base: api_base
                    .unwrap_or_else(|| seckill_shared::adapters::stripe::DEFAULT_API_BASE.into()),
                key,
            }),
        };
        let bus = env.optional("EVENT_BUS_NAME");
        let events_endpoint = env.optional("EVENTS_ENDPOINT_URL");
        if bus.is_none() && events_endpoint.is_some() {
            env.problem("EVENTS_ENDPOINT_URL is set but EVENT_BUS_NAME is not");
        }
        let events = bus.map(|bus| EventsConfig {
            bus,
            endpoint: events_endpoint,
        });
        let cfg = Config {
            redis,
            data_api,
            batch_size,
            min_idle: Duration::from_millis(min_idle_ms),
            concurrency,
            retention: (retention_s > 0).then(|| Duration::from_secs(retention_s)),
            safety_margin: Duration::from_millis(safety_margin),
            max_run: Duration::from_millis(max_run),
            idle_poll: Duration::from_millis(idle_poll),
            vouchers,
            stripe,
            events,
        };
        env.finish()?;
        if cfg.min_idle <= cfg.max_run {
            // Not fatal (tests shorten it on purpose; a batch taken over is deduplicated
            // by the database), but in production it means wasted double work.
            tracing::warn!(
                min_idle_ms,
                max_run_ms = max_run,
                "DRAINER_MIN_IDLE_MS does not exceed DRAINER_MAX_RUN_MS: live batches may be claimed by another invocation"
            );
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(pairs: &[(&str, &str)]) -> EnvReader {
        seckill_shared::config::minimal_env_with(pairs)
    }

    #[test]
    fn defaults_apply() {
        let c = Config::read(reader(&[])).unwrap();
        assert_eq!(c.batch_size, 1_000);
        assert_eq!(c.min_idle, Duration::from_secs(120));
        assert_eq!(c.concurrency, 8);
        assert_eq!(c.retention, Some(Duration::from_secs(7 * 24 * 3_600)));
        let keep = Config::read(reader(&[("DRAINER_RETENTION_S", "0")])).unwrap();
        assert_eq!(keep.retention, None);
        assert_eq!(c.safety_margin, Duration::from_secs(5));
        assert_eq!(c.max_run, Duration::from_secs(50));
        assert_eq!(c.idle_poll, Duration::from_millis(200));
        assert_eq!(c.vouchers, None);
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let err = Config::read(reader(&[
            ("DRAINER_BATCH_SIZE", "0"),
            ("DRAINER_MIN_IDLE_MS", "soon"),
            ("DRAINER_CONCURRENCY", "0"),
            ("DRAINER_VOUCHERS", "1, x ,3"),
        ]))
        .unwrap_err();
        assert_eq!(err.problems.len(), 4, "{err}");
    }

    #[test]
    fn voucher_lists_parse() {
        let c = Config::read(reader(&[("DRAINER_VOUCHERS", "7, 9")])).unwrap();
        let ids: Vec<i64> = c.vouchers.unwrap().iter().map(|v| v.get()).collect();
        assert_eq!(ids, vec![7, 9]);
    }
}

/// Keeps [`env_vars`] equal to what [`Config::read`] reads.
#[cfg(test)]
mod env_vars {
    use super::*;

    #[test]
    fn env_vars_lists_exactly_what_read_reads() {
        seckill_shared::config::check_env_vars(&env_vars(), Config::read);
    }
}

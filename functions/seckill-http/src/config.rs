//! Configuration of seckill-http, read once per cold start.

use seckill_shared::config::{
    ConfigError, DataApiConfig, EnvReader, RedisConfig, backend_env_vars_and,
};

use crate::secrets::SecretSource;

/// The environment variables [`Config::read`] reads itself, besides the backends'
/// ([`seckill_shared::config::BACKEND_ENV_VARS`]); [`env_vars`] is all of them.
const OWN_ENV_VARS: &[&str] = &[
    "SECKILL_DEV_JWT_SECRET",
    "SECKILL_DEV_JWT_IN_LAMBDA",
    "AWS_LAMBDA_FUNCTION_NAME",
    "SECKILL_USER_RATE_PER_SEC",
    "SECKILL_USER_RATE_BURST",
    "SECKILL_SOURCE_RATE_PER_SEC",
    "SECKILL_SOURCE_RATE_BURST",
    "SECKILL_USER_READ_RATE_PER_SEC",
    "SECKILL_USER_READ_RATE_BURST",
    "SECKILL_REPAIR_PART_ROWS",
    "PAYMENT_WEBHOOK_SECRET_ARN",
    "PAYMENT_WEBHOOK_SECRETS",
    "ENTRY_TOKEN_SECRET_ARN",
    "ENTRY_TOKEN_SECRETS",
    "SECRETS_MANAGER_URL",
    "STRIPE_API_BASE",
    "STRIPE_SECRET_KEY_ARN",
    "STRIPE_SECRET_KEY",
    "STRIPE_WEBHOOK_SECRET_ARN",
    "STRIPE_WEBHOOK_SECRET",
    "STRIPE_PUBLISHABLE_KEY",
    "STRIPE_JS_URL",
    "SECKILL_PAYMENT_GRACE_S",
    "EDGE_ORIGIN_SECRET_ARN",
    "EDGE_ORIGIN_SECRET",
];

/// Every environment variable [`Config::read`] reads (the backends' and its own). The SAM
/// template may set only these (and `RUST_LOG`, read by the logging setup);
/// `tests/tests/it/template.rs` checks that, and the `env_vars` unit test keeps this list
/// equal to what `read` really reads.
pub fn env_vars() -> Vec<&'static str> {
    backend_env_vars_and(OWN_ENV_VARS)
}

/// Everything the function needs from its environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub redis: RedisConfig,
    pub data_api: DataApiConfig,
    /// Local development only: verify HS256 tokens with this secret. Unset in AWS, where
    /// API Gateway's JWT authorizer verifies tokens.
    pub dev_jwt_secret: Option<String>,
    /// Admission attempts per second one user may send through one instance (0: no
    /// limit), and the burst allowed above that rate.
    pub user_rate_per_sec: u32,
    pub user_rate_burst: u32,
    /// Anonymous reads (`GET /vouchers/{id}`) per second one source address (an IPv6
    /// /64) may send through one instance (0: no limit), and the burst above that rate.
    pub source_rate_per_sec: u32,
    pub source_rate_burst: u32,
    /// Reads of orders per user and second across all instances (Redis-backed), and the
    /// burst above it; 0: no limit.
    pub read_rate_per_sec: u32,
    pub read_rate_burst: u32,
    /// Order rows one request's part of a repair reads at most before it saves its
    /// progress and leaves the rest to the next request (see `repair`).
    pub repair_part_rows: u64,
    /// Running inside AWS Lambda or an emulator of it (`AWS_LAMBDA_FUNCTION_NAME` set).
    pub in_lambda: bool,
    /// The payment webhook's signing secrets: a Secrets Manager secret
    /// (`PAYMENT_WEBHOOK_SECRET_ARN`, with `SECRETS_MANAGER_URL` locally), or given
    /// directly (`PAYMENT_WEBHOOK_SECRETS`, `current[,previous]`), not both.
    pub webhook: SecretSource,
    /// The waiting rooms' entry-token secrets, the same way (`ENTRY_TOKEN_SECRET_ARN` or
    /// `ENTRY_TOKEN_SECRETS`).
    pub entry: SecretSource,
    /// Stripe's API at `STRIPE_API_BASE` (default Stripe's own) with the secret key
    /// (`STRIPE_SECRET_KEY_ARN` or `STRIPE_SECRET_KEY`): checkout creates a PaymentIntent
    /// per order. `None` (no key): checkout answers the terms only, as before.
    pub stripe: Option<StripeConfig>,
    /// Stripe's webhook endpoint secrets (`whsec_...`: `STRIPE_WEBHOOK_SECRET_ARN` or
    /// `STRIPE_WEBHOOK_SECRET`), checking `POST /payments/stripe`.
    pub stripe_webhook: SecretSource,
    /// How long past its deadline an order whose payment was started at Stripe stays
    /// payable (`SECKILL_PAYMENT_GRACE_S`, default [`DEFAULT_PAYMENT_GRACE_S`]; 0: none).
    pub payment_grace_s: u64,
    /// The secret the edge's distribution sends with every request
    /// (`EDGE_ORIGIN_SECRET_ARN` or `EDGE_ORIGIN_SECRET`; `crate::edge`). Missing: no
    /// edge in front, every request is served.
    pub edge: SecretSource,
}

/// A payment started at Stripe before the deadline (3-D Secure, a slow bank, a late
/// event) is given five minutes: Stripe's own tolerance for a signed event's age.
pub const DEFAULT_PAYMENT_GRACE_S: u64 = 300;

/// Where Stripe's API is and the key that calls it.
#[derive(Debug, Clone)]
pub struct StripeConfig {
    pub api_base: String,
    pub key: SecretSource,
    /// What the buyer page needs to confirm a PaymentIntent with Stripe.js; `None` (no
    /// `STRIPE_PUBLISHABLE_KEY`): the page leaves the payment to the shop's own page.
    pub page: Option<StripePage>,
}

/// Stripe.js for the buyer page: the publishable key (`pk_...`, not a secret: every
/// buyer's browser holds it) and where the script is (`STRIPE_JS_URL`, default
/// [`DEFAULT_STRIPE_JS_URL`]; the local stack's localstripe serves a stand-in).
#[derive(Debug, Clone)]
pub struct StripePage {
    pub publishable_key: String,
    pub js_url: String,
}

/// Stripe.js, always loaded from Stripe's own origin (Stripe asks that it never be
/// bundled or hosted elsewhere).
pub const DEFAULT_STRIPE_JS_URL: &str = "https://js.stripe.com/v3/";

impl Config {
    /// Reads the process environment; every problem is reported at once.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::read(EnvReader::from_env())
    }

    pub fn read(mut env: EnvReader) -> Result<Config, ConfigError> {
        let dev_jwt_secret = env.optional("SECKILL_DEV_JWT_SECRET");
        // Lambda sets AWS_LAMBDA_FUNCTION_NAME. A dev secret there would let anyone who
        // learns it mint any identity, bypassing the API's JWT authorizer, so it is
        // refused unless explicitly allowed (the local stack under `cargo lambda watch`,
        // which emulates Lambda, allows it).
        let in_lambda = env.optional("AWS_LAMBDA_FUNCTION_NAME").is_some();
        let allowed = match env.optional("SECKILL_DEV_JWT_IN_LAMBDA").as_deref() {
            None => false,
            Some("allow") => true,
            Some(_) => {
                env.problem("SECKILL_DEV_JWT_IN_LAMBDA must be `allow` or unset");
                false
            }
        };
        if dev_jwt_secret.is_some() && in_lambda && !allowed {
            env.problem(
                "SECKILL_DEV_JWT_SECRET is set inside AWS Lambda: remove it (API Gateway's JWT \
                 authorizer verifies tokens there), or set SECKILL_DEV_JWT_IN_LAMBDA=allow \
                 for a local emulator",
            );
        }
        let endpoint = env.optional("SECRETS_MANAGER_URL");
        let webhook = SecretSource::read(
            &mut env,
            "PAYMENT_WEBHOOK_SECRET_ARN",
            "PAYMENT_WEBHOOK_SECRETS",
            &endpoint,
        );
        let entry = SecretSource::read(
            &mut env,
            "ENTRY_TOKEN_SECRET_ARN",
            "ENTRY_TOKEN_SECRETS",
            &endpoint,
        );
        let stripe_key = SecretSource::read(
            &mut env,
            "STRIPE_SECRET_KEY_ARN",
            "STRIPE_SECRET_KEY",
            &endpoint,
        );
        let stripe_webhook = SecretSource::read(
            &mut env,
            "STRIPE_WEBHOOK_SECRET_ARN",
            "STRIPE_WEBHOOK_SECRET",
            &endpoint,
        );
        let edge = SecretSource::read(
            &mut env,
            "EDGE_ORIGIN_SECRET_ARN",
            "EDGE_ORIGIN_SECRET",
            &endpoint,
        );
        let api_base = env.optional("STRIPE_API_BASE");
        let page = StripePage::read(&mut env);
        let stripe = match stripe_key {
            SecretSource::Missing => {
                if api_base.is_some() {
                    env.problem("STRIPE_API_BASE is set but no Stripe key (STRIPE_SECRET_KEY_ARN or STRIPE_SECRET_KEY)");
                }
                if page.is_some() {
                    env.problem("STRIPE_PUBLISHABLE_KEY is set but no Stripe key (STRIPE_SECRET_KEY_ARN or STRIPE_SECRET_KEY)");
                }
                None
            }
            key => Some(StripeConfig {
                api_base: api_base
                    .unwrap_or_else(|| seckill_shared::adapters::stripe::DEFAULT_API_BASE.into()),
                key,
                page,
            }),
        };
        let any_arn = webhook.by_arn()
            || entry.by_arn()
            || stripe_webhook.by_arn()
            || edge.by_arn()
            || stripe.as_ref().is_some_and(|s| s.key.by_arn());
        if endpoint.is_some() && !any_arn {
            env.problem(
                "SECRETS_MANAGER_URL is set but no secret is read by ARN \
                 (PAYMENT_WEBHOOK_SECRET_ARN, ENTRY_TOKEN_SECRET_ARN, STRIPE_SECRET_KEY_ARN, \
                 STRIPE_WEBHOOK_SECRET_ARN, EDGE_ORIGIN_SECRET_ARN)",
            );
        }
        let cfg = Config {
            redis: RedisConfig::read(&mut env),
            data_api: DataApiConfig::read(&mut env),
            dev_jwt_secret,
            user_rate_per_sec: env.parse_or("SECKILL_USER_RATE_PER_SEC", 5),
            user_rate_burst: env.parse_or("SECKILL_USER_RATE_BURST", 10),
            source_rate_per_sec: env.parse_or("SECKILL_SOURCE_RATE_PER_SEC", 50),
            source_rate_burst: env.parse_or("SECKILL_SOURCE_RATE_BURST", 100),
            read_rate_per_sec: env.parse_or("SECKILL_USER_READ_RATE_PER_SEC", 10),
            read_rate_burst: env.parse_or("SECKILL_USER_READ_RATE_BURST", 20),
            repair_part_rows: env.parse_or("SECKILL_REPAIR_PART_ROWS", 100_000),
            in_lambda,
            webhook,
            entry,
            stripe,
            stripe_webhook,
            payment_grace_s: env.parse_or("SECKILL_PAYMENT_GRACE_S", DEFAULT_PAYMENT_GRACE_S),
            edge,
        };
        env.finish()?;
        Ok(cfg)
    }
}

impl StripePage {
    /// `STRIPE_PUBLISHABLE_KEY` and `STRIPE_JS_URL`; the URL alone is a mistake.
    fn read(env: &mut EnvReader) -> Option<StripePage> {
        let key = env.optional("STRIPE_PUBLISHABLE_KEY");
        let js_url = env.optional("STRIPE_JS_URL");
        if let Some(k) = &key
            && !k.starts_with("pk_")
        {
            // A secret key here would be handed to every buyer's browser.
            env.problem("STRIPE_PUBLISHABLE_KEY must be a publishable key (pk_...)");
        }
        if let Some(u) = &js_url
            && origin_of(u).is_none()
        {
            env.problem(
                "STRIPE_JS_URL must be an http(s) URL with a path (https://js.stripe.com/v3/)",
            );
        }
        match (key, js_url) {
            (Some(publishable_key), js_url) => Some(StripePage {
                publishable_key,
                js_url: js_url.unwrap_or_else(|| DEFAULT_STRIPE_JS_URL.into()),
            }),
            (None, Some(_)) => {
                env.problem("STRIPE_JS_URL is set but no STRIPE_PUBLISHABLE_KEY");
                None
            }
            (None, None) => None,
        }
    }
}

/// The origin (`scheme://host[:port]`) of an http(s) URL, for the pages' content
/// security policy; `None` for anything else (a URL that could not be named there).
pub fn origin_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let host_len = rest.find('/').unwrap_or(rest.len());
    let host = &rest[..host_len];
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':';
    if host.is_empty() || !host.bytes().all(plain) {
        return None;
    }
    Some(&url[..url.len() - rest.len() + host_len])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::read(seckill_shared::config::minimal_env_with(pairs))
    }

    #[test]
    fn the_dev_secret_is_refused_inside_lambda_unless_allowed() {
        let secret = ("SECKILL_DEV_JWT_SECRET", "s3cret");
        let lambda = ("AWS_LAMBDA_FUNCTION_NAME", "seckill-http");
        assert!(read(&[secret]).unwrap().dev_jwt_secret.is_some());
        assert!(read(&[lambda]).unwrap().dev_jwt_secret.is_none());
        let err = read(&[secret, lambda]).unwrap_err();
        assert!(err.to_string().contains("SECKILL_DEV_JWT_SECRET"), "{err}");
        assert!(
            read(&[secret, lambda, ("SECKILL_DEV_JWT_IN_LAMBDA", "allow")])
                .unwrap()
                .dev_jwt_secret
                .is_some()
        );
    }

    #[test]
    fn the_page_s_stripe_needs_a_publishable_key_and_a_plain_origin() {
        let key = ("STRIPE_SECRET_KEY", "sk_test_0123456789abcdef");
        let pk = ("STRIPE_PUBLISHABLE_KEY", "pk_test_y");
        let page = |vars: &[(&str, &str)]| read(vars).map(|c| c.stripe.unwrap().page);
        let p = page(&[key, pk]).unwrap().unwrap();
        assert_eq!(p.js_url, DEFAULT_STRIPE_JS_URL);
        assert!(page(&[key]).unwrap().is_none());
        for bad in [
            vec![key, ("STRIPE_PUBLISHABLE_KEY", "sk_test_y")],
            vec![key, ("STRIPE_JS_URL", "http://127.0.0.1:1/v3/")],
            vec![key, pk, ("STRIPE_JS_URL", "javascript:alert(1)")],
            vec![key, pk, ("STRIPE_JS_URL", "https://x.test; script-src *")],
            vec![pk],
        ] {
            assert!(read(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            origin_of("https://js.stripe.com/v3/"),
            Some("https://js.stripe.com")
        );
        assert_eq!(
            origin_of("http://127.0.0.1:12111/js.stripe.com/v3/"),
            Some("http://127.0.0.1:12111")
        );
        assert_eq!(
            origin_of("https://api.stripe.com"),
            Some("https://api.stripe.com")
        );
        assert_eq!(origin_of("ftp://x/"), None);
    }

    #[test]
    fn env_vars_lists_exactly_what_read_reads() {
        seckill_shared::config::check_env_vars(&env_vars(), Config::read);
    }
}

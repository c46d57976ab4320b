//! The function's state, built once per cold start and shared by every request.

use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::rate::{self, Limit};
use seckill_shared::adapters::redis::{OrderIds, RedisConn, RedisSales};
use seckill_shared::adapters::stripe::StripeApi;
use seckill_shared::auth::Identity;
use seckill_shared::config::RedisConfig;
use seckill_shared::domain::{UnixMillis, UserId};
use seckill_shared::error::StoreError;
use tokio::sync::OnceCell;

use crate::cache::VoucherCache;
use crate::config::{Config, StripePage};
use crate::costs::{BorrowCosts, BorrowFigures};
use crate::error::ApiError;
use crate::identity::require_admin;
use crate::limiter::{RateLimiter, Source};
use crate::pages::Policy;
use crate::positions::PositionWriter;
use crate::secrets::{HeldSecrets, SecretSource};

/// Admin requests (voucher creations, the live view's polls) one admin may make per
/// second through one instance, and the burst.
pub const ADMIN_RATE_PER_SEC: u32 = 100;
pub const ADMIN_RATE_BURST: u32 = 200;

/// Stripe's API, and the secret key its calls carry (held as the other secrets are).
pub(crate) struct Stripe {
    pub api: StripeApi,
    pub key: HeldSecrets,
    /// What the buyer page confirms a payment with (publishable key, Stripe.js).
    pub page: Option<StripePage>,
}

/// Clients and per-instance memory.
pub struct App {
    redis_cfg: RedisConfig,
    // Connected on first use and kept: a Redis that is down at cold start must turn into
    // quick 503s that heal by themselves, not a function that fails to initialise.
    redis: OnceCell<RedisSales>,
    pub(crate) db: DataApi,
    pub(crate) ids: OrderIds,
    pub(crate) cache: VoucherCache,
    pub(crate) dev_secret: Option<Vec<u8>>,
    /// Requests per user on every authenticated route, in this instance.
    pub(crate) limiter: RateLimiter,
    /// Admin requests per admin, in this instance: [`ADMIN_RATE_PER_SEC`], high enough
    /// for a shop setting up thousands of small sales by script (or a few operators'
    /// live views polling once a second), a limit all the same.
    pub(crate) admin_limiter: RateLimiter,
    /// Reads of orders per user, across every instance (Redis).
    pub(crate) read_limit: Limit,
    /// Anonymous reads per source address.
    pub(crate) source_limiter: RateLimiter<Source>,
    /// The payment webhook's signing secrets.
    pub(crate) webhook: HeldSecrets,
    /// The waiting rooms' entry-token secrets.
    pub(crate) entry_secrets: HeldSecrets,
    /// Stripe's API and key, when checkout creates PaymentIntents.
    pub(crate) stripe: Option<Stripe>,
    /// The pages' content security policy (Stripe's origins where the page pays there).
    pub(crate) page_policy: Policy,
    /// Stripe's webhook endpoint secrets (`POST /payments/stripe`).
    pub(crate) stripe_webhook: HeldSecrets,
    /// The origin secret the edge's distribution sends (`crate::edge`); `None`: no edge,
    /// every request is served.
    pub(crate) edge: Option<HeldSecrets>,
    /// How long past its deadline an order whose payment started at Stripe stays
    /// payable (`lua/grace.lua`).
    pub(crate) payment_grace_ms: u64,
    /// Redis calls of the borrowing attempts this instance ran.
    pub(crate) borrowing: BorrowCosts,
    /// Order rows one request's part of a repair reads at most.
    pub(crate) repair_part_rows: u64,
    /// Waiting-room positions on their way to the database.
    pub(crate) positions: PositionWriter,
}

impl App {
    /// Lets an admin's request through: the caller holds the admin scope (else `403`)
    /// and is within [`ADMIN_RATE_PER_SEC`] in this instance (else `429`).
    pub(crate) fn admit_admin(&self, caller: &Identity, now: UnixMillis) -> Result<(), ApiError> {
        require_admin(caller)?;
        if !self.admin_limiter.allow(&caller.user, now) {
            return Err(ApiError::RateLimited);
        }
        Ok(())
    }

    /// Takes one of `user`'s database reads from the budget every instance shares
    /// (`lua/rate.lua`: one Redis call): `429` when it is spent. The reads it bounds cost
    /// the database whatever the answer (an order by id, a voucher no instance knows), so
    /// warm instances must not multiply what one user may ask. When Redis cannot answer,
    /// the call goes on (each instance's own limit, taken before, still stands).
    pub(crate) async fn take_shared_read(&self, user: &UserId) -> Result<(), ApiError> {
        let allowed = match self.sales().await {
            Ok(sales) => rate::allow(&sales.conn(), "reads", user.as_str(), self.read_limit).await,
            Err(e) => Err(e),
        };
        match allowed {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::RateLimited),
            Err(error) => {
                tracing::warn!(%error, "shared rate limit unavailable; this instance's limit stands");
                Ok(())
            }
        }
    }

    /// Builds the clients. Tries Redis once now so the first request is fast, but a
    /// failure here is only logged.
    pub async fn new(cfg: &Config) -> App {
        let app = App {
            redis_cfg: cfg.redis.clone(),
            redis: OnceCell::new(),
            db: DataApi::connect(&cfg.data_api).await,
            ids: OrderIds::default(),
            cache: VoucherCache::default(),
            dev_secret: cfg.dev_jwt_secret.as_ref().map(|s| s.as_bytes().to_vec()),
            limiter: RateLimiter::new(cfg.user_rate_per_sec, cfg.user_rate_burst),
            source_limiter: RateLimiter::new(cfg.source_rate_per_sec, cfg.source_rate_burst),
            admin_limiter: RateLimiter::new(ADMIN_RATE_PER_SEC, ADMIN_RATE_BURST),
            read_limit: Limit {
                per_sec: cfg.read_rate_per_sec,
                burst: cfg.read_rate_burst,
            },
            webhook: HeldSecrets::new(
                cfg.webhook.clone(),
                "payment webhook secret (PAYMENT_WEBHOOK_SECRET_ARN)",
            ),
            entry_secrets: HeldSecrets::new(
                cfg.entry.clone(),
                "entry-token secret (ENTRY_TOKEN_SECRET_ARN)",
            ),
            stripe: cfg.stripe.as_ref().map(|s| Stripe {
                api: StripeApi::new(&s.api_base),
                key: HeldSecrets::new(s.key.clone(), "Stripe secret key (STRIPE_SECRET_KEY_ARN)"),
                page: s.page.clone(),
            }),
            page_policy: Policy::new(cfg.stripe.as_ref().and_then(|s| {
                s.page
                    .as_ref()
                    .map(|p| (p.js_url.as_str(), s.api_base.as_str()))
            })),
            stripe_webhook: HeldSecrets::new(
                cfg.stripe_webhook.clone(),
                "Stripe webhook secret (STRIPE_WEBHOOK_SECRET_ARN)",
            ),
            edge: (!matches!(cfg.edge, SecretSource::Missing)).then(|| {
                HeldSecrets::new(
                    cfg.edge.clone(),
                    "edge origin secret (EDGE_ORIGIN_SECRET_ARN)",
                )
            }),
            payment_grace_ms: cfg.payment_grace_s.saturating_mul(1000),
            borrowing: BorrowCosts::default(),
            repair_part_rows: cfg.repair_part_rows.max(1),
            positions: PositionWriter::default(),
        };
        if let Err(err) = app.sales().await {
            tracing::warn!(error = %err, "redis not reachable at start; will retry per request");
        }
        app
    }

    /// What this instance's borrowing attempts cost Redis so far (tests, benchmarks).
    pub fn borrowing(&self) -> BorrowFigures {
        self.borrowing.figures()
    }

    /// The Redis sale adapter, connecting on first use.
    pub(crate) async fn sales(&self) -> Result<&RedisSales, StoreError> {
        self.redis
            .get_or_try_init(|| async {
                RedisConn::connect(&self.redis_cfg)
                    .await
                    .map(|conn| RedisSales::new(conn).with_durability(self.redis_cfg.durable))
            })
            .await
    }
}

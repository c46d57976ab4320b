//! Stripe's API, the calls the shop makes (form-encoded POSTs, JSON answers): creating
//! and reading a PaymentIntent at checkout, and refunds. And the `checkouts` table
//! (`migrations/0009_checkouts.sql`): the one PaymentIntent each order's checkout hands
//! out.
//!
//! Every call that moves or promises money carries an `Idempotency-Key` derived from
//! what it is for (the order, the payment), so a call sent again after its answer was
//! lost is the same call at Stripe. The keys hold there for 24 hours and a local fake
//! may ignore them: what must hold for good is kept on our side too (the `checkouts`
//! row; a refund is looked for before one is asked for again).

use std::time::Duration;

use serde::Deserialize;

use super::data_api::{DataApi, param};
use crate::domain::{OrderId, UnixMillis};
use crate::error::StoreError;

/// Stripe's API, unless told otherwise (`STRIPE_API_BASE`: the local stack's fake).
pub const DEFAULT_API_BASE: &str = "https://api.stripe.com";

/// One call's bound: Stripe answers in well under a second; a buyer's checkout is not
/// held longer than this.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The idempotency key of order `order`'s PaymentIntent.
pub fn intent_key(order: OrderId) -> String {
    format!("seckill-order-{order}")
}

/// The idempotency key of payment `payment_id`'s refund.
pub fn refund_key(payment_id: &str) -> String {
    format!("seckill-refund-{payment_id}")
}

/// Why a call to Stripe did not give an answer to use.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    /// Not reached, timed out, rate limited or a 5xx: the same call may succeed later.
    #[error("stripe unavailable: {0}")]
    Unavailable(String),
    /// Stripe refused the call (a 4xx other than 429): sending it again changes nothing.
    #[error("stripe refused the call ({status}): {message}")]
    Refused { status: u16, message: String },
}

/// A PaymentIntent, as far as checkout needs it: what the buyer's page confirms.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Intent {
    pub id: String,
    pub client_secret: String,
}

/// A refund, as far as the ledger needs it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Refund {
    pub id: String,
    /// `succeeded`, `pending`, `requires_action`, `failed` or `canceled`.
    pub status: String,
}

#[derive(Deserialize)]
struct List<T> {
    data: Vec<T>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    message: String,
}

/// Stripe's API at `base`, with one HTTP client (rustls) built once per cold start.
#[derive(Clone)]
pub struct StripeApi {
    base: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for StripeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StripeApi({})", self.base)
    }
}

impl StripeApi {
    pub fn new(base: &str) -> StripeApi {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("an HTTP client with rustls builds");
        StripeApi {
            base: base.trim_end_matches('/').to_string(),
            http,
        }
    }

    /// Creates the PaymentIntent of `order` (its idempotency key: [`intent_key`]) for
    /// `amount_minor` of `currency`, with `metadata` (what its events send back).
    pub async fn create_intent(
        &self,
        key: &str,
        order: OrderId,
        amount_minor: i64,
        currency: &str,
        metadata: &[(&str, &str)],
    ) -> Result<Intent, StripeError> {
        let mut form = vec![
            ("amount".to_string(), amount_minor.to_string()),
            ("currency".to_string(), currency.to_ascii_lowercase()),
        ];
        for (k, v) in metadata {
            form.push((format!("metadata[{k}]"), (*v).to_string()));
        }
        let req = self
            .http
            .post(format!("{}/v1/payment_intents", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", intent_key(order))
            .form(&form);
        send(req).await
    }

    /// The PaymentIntent `id`.
    pub async fn intent(&self, key: &str, id: &str) -> Result<Intent, StripeError> {
        let req = self
            .http
            .get(format!("{}/v1/payment_intents/{id}", self.base))
            .bearer_auth(key);
        send(req).await
    }

    /// Refunds PaymentIntent `payment_id` in full (idempotency key: [`refund_key`]).
    pub async fn refund(&self, key: &str, payment_id: &str) -> Result<Refund, StripeError> {
        let req = self
            .http
            .post(format!("{}/v1/refunds", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", refund_key(payment_id))
            .form(&[("payment_intent", payment_id)]);
        send(req).await
    }

    /// The refunds of PaymentIntent `payment_id`, newest first.
    pub async fn refunds(&self, key: &str, payment_id: &str) -> Result<Vec<Refund>, StripeError> {
        let req = self
            .http
            .get(format!("{}/v1/refunds", self.base))
            .bearer_auth(key)
            .query(&[("payment_intent", payment_id), ("limit", "100")]);
        send::<List<Refund>>(req).await.map(|l| l.data)
    }
}

async fn send<T: serde::de::DeserializeOwned>(
    req: reqwest::RequestBuilder,
) -> Result<T, StripeError> {
    let resp = req
        .send()
        .await
        .map_err(|e| StripeError::Unavailable(e.to_string()))?;
    let status = resp.status();
    let body = resp
        .bytes()
        .await
        .map_err(|e| StripeError::Unavailable(e.to_string()))?;
    if status.is_success() {
        return serde_json::from_slice(&body)
            .map_err(|e| StripeError::Unavailable(format!("an answer not understood: {e}")));
    }
    let message = serde_json::from_slice::<ErrorBody>(&body)
        .map(|b| b.error.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
    if status.as_u16() == 429 || status.is_server_error() {
        return Err(StripeError::Unavailable(format!("{status}: {message}")));
    }
    Err(StripeError::Refused {
        status: status.as_u16(),
        message,
    })
}

/// The `checkouts` table: the provider's payment each order's checkout hands out.
pub struct Checkouts<'a>(pub &'a DataApi);

impl Checkouts<'_> {
    /// The payment recorded for `order`'s checkout, if any.
    pub async fn get(&self, order: OrderId) -> Result<Option<String>, StoreError> {
        self.0
            .first_string(
                "SELECT payment_id FROM checkouts WHERE order_id = :o",
                vec![param::long("o", order.get())],
            )
            .await
    }

    /// Records `payment_id` as `order`'s checkout unless one is recorded already, and
    /// returns the one that stands (the first recorded).
    pub async fn record(
        &self,
        order: OrderId,
        provider: &str,
        payment_id: &str,
        now: UnixMillis,
    ) -> Result<String, StoreError> {
        self.0
            .execute(
                "INSERT IGNORE INTO checkouts (order_id, provider, payment_id, created_at) \
                 VALUES (:o, :provider, :p, :at)",
                vec![
                    param::long("o", order.get()),
                    param::string("provider", provider),
                    param::string("p", payment_id),
                    param::timestamp("at", now),
                ],
                None,
            )
            .await?;
        self.get(order)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("checkout of order {order} vanished")))
    }
}

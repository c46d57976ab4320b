//! The buyer's card and Stripe's events, played against the local stack's Stripe
//! (localstripe, `STRIPE_API_BASE`): `seckill pay --stripe ORDER` checks out as the
//! order's buyer (a dev token), confirms the order's PaymentIntent with a test card, and
//! sends the event Stripe would send (localstripe sends none for PaymentIntents) to
//! `POST /payments/stripe`, signed with the stack's `STRIPE_WEBHOOK_SECRET`; `seckill
//! refund PAYMENT` issues (or retries) one refund now. The demo pays this way too.

use std::time::Duration;

use anyhow::{Context as _, bail};
use seckill_shared::domain::{OrderId, now_millis};
use seckill_shared::webhook::{self, Secrets};
use serde_json::Value;

use super::Backends;
use super::pay::{Delivery, local_only, payable, wait_past_deadline};

/// Stripe's test card that succeeds.
pub const CARD_OK: &str = "4242424242424242";

/// The local stack's Stripe and seckill-http, as the buyer and Stripe reach them.
pub struct LocalStripe {
    pub api_base: String,
    pub key: String,
    pub webhook_secret: Secrets,
    /// seckill-http's base URL.
    pub url: String,
    http: reqwest::Client,
}

/// What `seckill pay --stripe` does (its flags).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StripeOptions {
    /// Pay through the local Stripe (localstripe): checkout, a card, Stripe's event.
    #[arg(long)]
    pub stripe: bool,
    /// The test card (Stripe's numbers: 4000000000000341 is declined).
    #[arg(long, default_value = CARD_OK, requires = "stripe")]
    pub card: String,
}

impl LocalStripe {
    pub fn new(url: &str, api_base: &str, key: &str, webhook_secret: &str) -> anyhow::Result<Self> {
        local_only(url)?;
        local_only(api_base)?;
        Ok(LocalStripe {
            api_base: api_base.trim_end_matches('/').to_string(),
            key: key.to_string(),
            webhook_secret: Secrets::parse(webhook_secret)
                .map_err(|e| anyhow::anyhow!("STRIPE_WEBHOOK_SECRET: {e}"))?,
            url: url.trim_end_matches('/').to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }

    /// From the local stack's `.dev/stack.env`.
    pub fn from_stack(stack: &crate::stack_env::StackEnv) -> anyhow::Result<Self> {
        LocalStripe::new(
            &stack.get("SECKILL_HTTP_URL")?,
            &stack.get("STRIPE_API_BASE")?,
            &stack.get("STRIPE_SECRET_KEY")?,
            &stack.get("STRIPE_WEBHOOK_SECRET")?,
        )
    }

    async fn stripe(
        &self,
        method: reqwest::Method,
        path: &str,
        form: &[(&str, &str)],
    ) -> anyhow::Result<Value> {
        let res = self
            .http
            .request(method, format!("{}{path}", self.api_base))
            .bearer_auth(&self.key)
            .form(form)
            .send()
            .await
            .with_context(|| format!("stripe {path}"))?;
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("stripe {path}: {status} {body}");
        }
        Ok(body)
    }

    /// The PaymentIntent `id`.
    pub async fn intent(&self, id: &str) -> anyhow::Result<Value> {
        self.stripe_get(&format!("/v1/payment_intents/{id}")).await
    }

    /// `GET path` of Stripe's API (with its query).
    pub async fn stripe_get(&self, path: &str) -> anyhow::Result<Value> {
        self.stripe(reqwest::Method::GET, path, &[]).await
    }

    /// The buyer's page: `card` attached to PaymentIntent `id`, confirmed; the
    /// PaymentIntent after (a declined card leaves it `requires_payment_method`).
    pub async fn confirm(&self, id: &str, card: &str) -> anyhow::Result<Value> {
        let year = (time::OffsetDateTime::now_utc().year() + 3).to_string();
        let method = self
            .stripe(
                reqwest::Method::POST,
                "/v1/payment_methods",
                &[
                    ("type", "card"),
                    ("card[number]", card),
                    ("card[exp_month]", "12"),
                    ("card[exp_year]", &year),
                    ("card[cvc]", "123"),
                ],
            )
            .await?;
        let pm = method["id"].as_str().context("a payment method id")?;
        let path = format!("/v1/payment_intents/{id}");
        self.stripe(reqwest::Method::POST, &path, &[("payment_method", pm)])
            .await?;
        // A declined card answers 402; the PaymentIntent then says so.
        let _ = self
            .stripe(reqwest::Method::POST, &format!("{path}/confirm"), &[])
            .await;
        self.intent(id).await
    }

    /// Sends the event Stripe would send about `object` reaching `kind`, signed with the
    /// endpoint's secret, to `POST /payments/stripe`.
    pub async fn send_event(&self, kind: &str, object: &Value) -> anyhow::Result<Delivery> {
        let id = format!("evt_{:016x}", rand::random::<u64>());
        let body =
            webhook::stripe::event(&id, kind, now_millis() / 1000, object.clone()).to_string();
        let signature = webhook::header(
            &[self.webhook_secret.current()],
            now_millis() / 1000,
            body.as_bytes(),
        );
        let url = format!("{}/payments/stripe", self.url);
        let res = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header(webhook::stripe::SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        Ok(Delivery {
            event_id: id,
            payment_id: object["id"].as_str().unwrap_or_default().to_string(),
            status: res.status().as_u16(),
            answer: res.json().await.unwrap_or(Value::Null),
        })
    }

    /// `POST /orders/{order}/pay` as the buyer holding `token`: the checkout's answer.
    pub async fn checkout(&self, order: &str, token: &str) -> anyhow::Result<Value> {
        let res = self
            .http
            .post(format!("{}/orders/{order}/pay", self.url))
            .bearer_auth(token)
            .send()
            .await?;
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("checkout of order {order}: {status} {body}");
        }
        Ok(body)
    }

    /// Pays with `card` the PaymentIntent a checkout answered, and sends Stripe's event
    /// (`payment_intent.succeeded`, or `.payment_failed` for a declined card), `copies`
    /// times.
    pub async fn pay_checkout(
        &self,
        checkout: &Value,
        card: &str,
        copies: usize,
    ) -> anyhow::Result<Vec<Delivery>> {
        let Some(pi) = checkout["payment_intent"].as_str() else {
            bail!("the checkout names no PaymentIntent (is Stripe configured?): {checkout}");
        };
        let intent = self.confirm(pi, card).await?;
        let kind = match intent["status"].as_str() {
            Some("succeeded") => "payment_intent.succeeded",
            _ => "payment_intent.payment_failed",
        };
        let mut out = Vec::new();
        for _ in 0..copies {
            out.push(self.send_event(kind, &intent).await?);
        }
        Ok(out)
    }
}

/// `seckill pay --stripe ORDER`: checkout as the buyer (a dev token made with
/// `jwt_secret`), pay with the card, Stripe's event (twice with `replay`; after the
/// order's deadline with `late`).
pub async fn pay(
    b: &Backends,
    stripe: &LocalStripe,
    jwt_secret: &str,
    order: OrderId,
    card: &str,
    late: bool,
    replay: bool,
) -> anyhow::Result<Vec<Delivery>> {
    let p = payable(b, order).await?;
    let token = seckill_shared::auth::mint_hs256(
        jwt_secret.as_bytes(),
        p.buyer.as_str(),
        None,
        now_millis() / 1000 + 600,
    );
    let checkout = stripe.checkout(&order.to_string(), &token).await?;
    if late {
        wait_past_deadline(&p).await?;
    }
    stripe
        .pay_checkout(&checkout, card, if replay { 2 } else { 1 })
        .await
}

/// `seckill refund PAYMENT`: the payment's refund issued (or retried) now, through
/// Stripe at `api_base` with `key` (the stack's localstripe, or Stripe itself): its next
/// try made due, then one try, as a drainer run makes it.
pub async fn refund(
    b: &Backends,
    api_base: &str,
    key: &str,
    payment_id: &str,
) -> anyhow::Result<seckill_shared::refunds::Issued> {
    use seckill_shared::adapters::payments::Payments;
    let ledger = Payments(&b.db);
    let Some(progress) = ledger.refund_progress(payment_id).await? else {
        bail!("no payment {payment_id} is recorded");
    };
    if progress.provider != seckill_shared::refunds::STRIPE {
        bail!(
            "payment {payment_id} was taken by the {} provider: refund it there (seckill calls Stripe only)",
            progress.provider
        );
    }
    ledger.retry_refund_now(payment_id).await?;
    let api = seckill_shared::adapters::stripe::StripeApi::new(api_base);
    Ok(seckill_shared::refunds::issue_one(&b.db, &api, key, payment_id).await?)
}

//! The demo's sales with a payment step (one paid the generic provider's way, with its
//! signed events; one paid by card through the local Stripe, refund included), and the
//! calls every demo sale makes: a voucher, an admission, the drainer's scheduled event.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use reqwest::Client;
use seckill_shared::domain::format_rfc3339_millis;
use serde_json::{Value, json};

use seckill_cli::ops::stripe::{self, LocalStripe};

/// The EventBridge scheduled event the demo invokes the drainer with.
pub(super) const SCHEDULED_EVENT: &str =
    include_str!("../../../../tests/fixtures/eventbridge-scheduled.json");

/// Where the demo's calls go (the stack's `SECKILL_HTTP_URL` and `DRAINER_INVOKE_URL`).
pub(super) struct Stack<'a> {
    pub url: &'a str,
    pub drainer_url: &'a str,
}

/// Creates a voucher as the demo's admin: its id.
pub(super) async fn create_voucher(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    body: &Value,
) -> anyhow::Result<String> {
    let voucher: Value = http
        .post(format!("{}/vouchers", stack.url))
        .bearer_auth(token("demo-admin", true))
        .json(body)
        .send()
        .await?
        .json()
        .await?;
    Ok(voucher["id"]
        .as_str()
        .with_context(|| format!("no voucher id in {voucher}"))?
        .to_string())
}

/// A voucher of 2 units with a payment step (60 s) at `price_minor` EUR: its id.
async fn payment_voucher(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    title: &str,
    price_minor: i64,
) -> anyhow::Result<String> {
    let now = seckill_shared::domain::now_millis;
    let body = json!({
        "title": title,
        "stock": 2,
        "begins_at": format_rfc3339_millis(now() - 1_000),
        "ends_at": format_rfc3339_millis(now() + 600_000),
        "pay_within_s": 60,
        "price_minor": price_minor,
        "currency": "EUR",
    });
    create_voucher(stack, http, token, &body).await
}

/// `user` buys voucher `id` once: the order id of its `202`.
pub(super) async fn admit(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    id: &str,
    user: &str,
) -> anyhow::Result<String> {
    let admitted: Value = http
        .post(format!("{}/vouchers/{id}/seckill", stack.url))
        .bearer_auth(token(user, false))
        .send()
        .await?
        .json()
        .await?;
    Ok(admitted["order_id"]
        .as_str()
        .with_context(|| format!("not admitted: {admitted}"))?
        .to_string())
}

/// `user` cancels `order` (its answer shown).
async fn cancel(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    user: &str,
    order: &str,
) -> anyhow::Result<()> {
    let cancel: Value = http
        .post(format!("{}/orders/{order}/cancel", stack.url))
        .bearer_auth(token(user, false))
        .send()
        .await?
        .json()
        .await?;
    println!("  order {order} cancelled: {}", cancel["status"]);
    Ok(())
}

/// A sale paid by card through the local Stripe: the first buyer's checkout creates the
/// order's PaymentIntent, 4242 pays it and Stripe's event (delivered twice) pays the
/// order once; the second buyer cancels, then their page pays the PaymentIntent anyway:
/// that payment is to refund, and the drainer's next runs refund it at Stripe, once;
/// Stripe's `charge.refunded` records it refunded.
pub(super) async fn card_sale(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    run_id: &str,
    stripe: &LocalStripe,
) -> anyhow::Result<()> {
    let id = payment_voucher(
        stack,
        http,
        token,
        &format!("Demo sale {run_id}: pay by card"),
        1999,
    )
    .await?;
    println!("\ncard payments (Stripe): voucher {id}, 2 units at 19.99 EUR, pay within 60 s");
    let mut checkouts = Vec::new();
    for n in ["card", "slow-page"] {
        let user = format!("demo-{run_id}-{n}");
        let order = admit(stack, http, token, &id, &user).await?;
        let checkout = stripe.checkout(&order, &token(&user, false)).await?;
        checkouts.push((user, order, checkout));
    }
    let (_, paid, checkout) = &checkouts[0];
    println!(
        "  checkout of order {paid}: PaymentIntent {}",
        checkout["payment_intent"]
    );
    for d in stripe.pay_checkout(checkout, stripe::CARD_OK, 2).await? {
        println!(
            "  card 4242 paid; Stripe's event for order {paid}: {}",
            d.answer
        );
        ensure!(
            d.answer["outcome"] == "paid",
            "the card payment was not applied: {}",
            d.answer
        );
    }
    let (user, late, checkout) = &checkouts[1];
    cancel(stack, http, token, user, late).await?;
    let pi = checkout["payment_intent"]
        .as_str()
        .context("a PaymentIntent")?;
    let answer = &stripe.pay_checkout(checkout, stripe::CARD_OK, 1).await?[0].answer;
    println!("  its PaymentIntent paid anyway (a slow page): {answer}");
    ensure!(
        answer["outcome"] == "refund_due",
        "a payment after a cancel was applied: {answer}"
    );
    // The drainer's runs refund it (the stack invokes one every second; one more here).
    let deadline = Instant::now() + Duration::from_secs(30);
    let refund = loop {
        http.post(stack.drainer_url)
            .header("content-type", "application/json")
            .body(SCHEDULED_EVENT)
            .send()
            .await?;
        let refunds = stripe
            .stripe_get(&format!("/v1/refunds?payment_intent={pi}"))
            .await?;
        if let Some(r) = refunds["data"].as_array().and_then(|l| l.first()) {
            break r.clone();
        }
        ensure!(
            Instant::now() < deadline,
            "no refund of {pi} at Stripe after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "  the drainer refunded it at Stripe: {} ({} {})",
        refund["id"], refund["amount"], refund["currency"]
    );
    let charge = stripe
        .stripe_get(&format!(
            "/v1/charges/{}",
            refund["charge"].as_str().unwrap_or_default()
        ))
        .await?;
    let d = stripe.send_event("charge.refunded", &charge).await?;
    println!("  Stripe's charge.refunded: {}", d.answer);
    ensure!(
        d.answer["outcome"] == "refunded",
        "the refund was not recorded: {}",
        d.answer
    );
    println!(
        "ok: paid by card once though told twice; the late card payment refunded at Stripe (seckill status {id})"
    );
    Ok(())
}

/// A sale with a payment step: two buyers; the first starts paying and the provider's
/// signed event pays (delivered twice, as providers do: paid once); the second cancels,
/// and a payment arriving after that is recorded to refund, never applied.
pub(super) async fn payment_sale(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    run_id: &str,
    secret: &str,
) -> anyhow::Result<()> {
    use seckill_shared::webhook;
    let secrets =
        webhook::Secrets::parse(secret).map_err(|e| anyhow::anyhow!("webhook secret: {e}"))?;
    let now = seckill_shared::domain::now_millis;
    let id = payment_voucher(
        stack,
        http,
        token,
        &format!("Demo sale {run_id}: pay within a minute"),
        199,
    )
    .await?;
    println!("\npayment step: voucher {id}, 2 units at 1.99 EUR, pay within 60 s");
    let mut orders = Vec::new();
    for n in ["payer", "canceller"] {
        let user = format!("demo-{run_id}-{n}");
        let order = admit(stack, http, token, &id, &user).await?;
        orders.push((user, order));
    }
    let ((payer, paid), (canceller, cancelled)) = (&orders[0], &orders[1]);
    let checkout: Value = http
        .post(format!("{}/orders/{paid}/pay", stack.url))
        .bearer_auth(token(payer, false))
        .send()
        .await?
        .json()
        .await?;
    println!("  checkout of order {paid}: {checkout}");
    cancel(stack, http, token, canceller, cancelled).await?;
    let event = |order: &str, user: &str, payment: &str| {
        let data = webhook::PaymentData {
            payment_id: payment.to_string(),
            order_id: order.to_string(),
            buyer: user.to_string(),
            amount_minor: 199,
            currency: "EUR".to_string(),
        };
        let kind = webhook::EventType::Succeeded;
        webhook::Event::created_now(format!("evt_{payment}"), kind, data).body()
    };
    let secrets = &secrets;
    let deliver = |body: String| async move {
        let sig = webhook::header(&[secrets.current()], now() / 1000, body.as_bytes());
        let res = http
            .post(format!("{}/payments/webhook", stack.url))
            .header(webhook::SIGNATURE_HEADER, sig)
            .body(body)
            .send()
            .await?;
        anyhow::Ok(res.json::<Value>().await?)
    };
    let first = event(paid, payer, &format!("pay_demo_{run_id}_1"));
    for n in 1..=2 {
        let answer = deliver(first.clone()).await?;
        println!("  provider event for order {paid} (delivery {n}): {answer}");
        ensure!(
            answer["outcome"] == "paid",
            "the payment was not applied: {answer}"
        );
    }
    let late = deliver(event(cancelled, canceller, &format!("pay_demo_{run_id}_2"))).await?;
    println!("  provider event for the cancelled order {cancelled}: {late}");
    ensure!(
        late["outcome"] == "refund_due",
        "a payment after a cancel was applied: {late}"
    );
    println!(
        "ok: paid once though delivered twice; the late payment is listed to refund (seckill status {id})"
    );
    Ok(())
}

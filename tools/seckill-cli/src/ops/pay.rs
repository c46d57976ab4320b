//! `seckill pay ORDER`: the payment provider, played locally. Finds the order's buyer and
//! price, builds the provider's `payment.succeeded` (or `payment.failed`) event, signs it
//! as the provider does ([`seckill_shared::webhook`]) with the stack's webhook secret,
//! and delivers it to `POST /payments/webhook` over HTTP: `--late` waits for the
//! order's deadline to pass first, `--replay` delivers the same signed event twice, as a
//! provider redelivering would.

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use seckill_shared::domain::{
    Bucket, ClosedOrder, OrderId, Price, UnixMillis, UserId, VoucherId, now_millis,
};
use seckill_shared::keys::VoucherKeys;
use seckill_shared::webhook::{self, Event, EventType, PaymentData, Secrets};
use serde::Serialize;

use super::{Backend, Backends};

/// What to send (also `seckill pay`'s flags).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PayOptions {
    /// Wait until the order's payment deadline has passed first (a late payment).
    #[arg(long)]
    pub late: bool,
    /// Deliver the same signed event twice (a provider redelivering).
    #[arg(long)]
    pub replay: bool,
    /// Send `payment.failed` instead of `payment.succeeded`.
    #[arg(long)]
    pub failed: bool,
    /// The provider's payment id (default: a new one).
    #[arg(long)]
    pub payment_id: Option<String>,
    /// Pay this amount (minor units) instead of the voucher's price.
    #[arg(long)]
    pub amount_minor: Option<i64>,
    /// Pay in this currency instead of the voucher's.
    #[arg(long)]
    pub currency: Option<String>,
}

/// The order as the provider needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payable {
    pub order: OrderId,
    pub voucher: VoucherId,
    pub buyer: UserId,
    pub price: Option<Price>,
    pub pay_by: Option<UnixMillis>,
}

/// One delivery and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    pub event_id: String,
    pub payment_id: String,
    pub status: u16,
    pub answer: serde_json::Value,
}

/// The order's voucher, buyer, price and deadline: from its database row, else from
/// Redis (the voucher from the order id's lease, the buyer from the voucher's payment
/// deadlines, each bucket scanned for `<order>\n*`, or, for an order closed (paid,
/// cancelled, expired) and not drained yet, from its close record: a payment for it is
/// what a provider sends late, and must be listed to refund).
pub async fn payable(b: &Backends, order: OrderId) -> anyhow::Result<Payable> {
    let (voucher, buyer, pay_by) = match b.db.order(order).await.db()? {
        Some((voucher, buyer, _, pay_by)) => (voucher, buyer, pay_by),
        None => {
            let voucher = b
                .sales
                .voucher_of_order(order)
                .await
                .redis()?
                .ok_or_else(|| {
                    anyhow!("order {order} is unknown (neither the database nor Redis has it)")
                })?;
            let buckets = b.voucher(voucher).await?.map_or(1, |v| v.buckets);
            let (buyer, deadline) = buyer_in_redis(b, voucher, buckets, order)
                .await?
                .ok_or_else(|| {
                    anyhow!("order {order} is neither awaiting payment nor closed in Redis")
                })?;
            (voucher, buyer, Some(deadline))
        }
    };
    let price = b
        .voucher(voucher)
        .await?
        .and_then(|v| v.payment)
        .and_then(|p| p.price);
    Ok(Payable {
        order,
        voucher,
        buyer,
        price,
        pay_by,
    })
}

/// The buyer and deadline of an order not yet in the database: from the payment
/// deadlines while it is open, else from its close record.
async fn buyer_in_redis(
    b: &Backends,
    voucher: VoucherId,
    buckets: u16,
    order: OrderId,
) -> anyhow::Result<Option<(UserId, UnixMillis)>> {
    let pattern = format!("{order}\n*");
    for bucket in Bucket::all(voucher, buckets) {
        let key = VoucherKeys::new(bucket).deadlines;
        let mut cursor = 0u64;
        loop {
            let (next, found): (u64, Vec<(String, f64)>) = redis::cmd("ZSCAN")
                .arg(&key)
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut b.sales.conn())
                .await
                .context("redis: ZSCAN of the payment deadlines")?;
            if let Some((member, deadline)) = found.into_iter().next() {
                let user = member.split_once('\n').map_or("", |(_, u)| u);
                return Ok(Some((UserId::parse(user)?, deadline as UnixMillis)));
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    for bucket in Bucket::all(voucher, buckets) {
        let key = VoucherKeys::new(bucket).closed;
        let record: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg(order.get())
            .query_async(&mut b.sales.conn())
            .await
            .context("redis: HGET of the closed orders")?;
        if let Some(closed) = record.as_deref().and_then(ClosedOrder::parse) {
            return Ok(Some((UserId::parse(&closed.user)?, closed.pay_by_ms)));
        }
    }
    Ok(None)
}

/// The event the provider sends for `p`.
pub fn event(p: &Payable, opts: &PayOptions) -> anyhow::Result<Event> {
    let (amount_minor, currency) = match (opts.amount_minor, &opts.currency, p.price) {
        (Some(a), Some(c), _) => (a, c.clone()),
        (a, c, Some(price)) => (
            a.unwrap_or(price.amount_minor()),
            c.clone().unwrap_or_else(|| price.currency().to_string()),
        ),
        _ => bail!(
            "voucher {} has no price: give --amount-minor and --currency",
            p.voucher
        ),
    };
    let kind = if opts.failed {
        EventType::Failed
    } else {
        EventType::Succeeded
    };
    Ok(Event::created_now(
        format!("evt_{}", random_hex()),
        kind,
        PaymentData {
            payment_id: opts
                .payment_id
                .clone()
                .unwrap_or_else(|| format!("pay_{}", random_hex())),
            order_id: p.order.to_string(),
            buyer: p.buyer.as_str().to_string(),
            amount_minor,
            currency,
        },
    ))
}

/// Waits until `p`'s payment deadline has passed (`--late`).
pub async fn wait_past_deadline(p: &Payable) -> anyhow::Result<()> {
    let Some(pay_by) = p.pay_by else {
        bail!("order {} has no payment deadline to be late for", p.order);
    };
    let wait = pay_by + 200 - now_millis();
    if wait > 0 {
        eprintln!(
            "waiting {:.1} s for order {}'s deadline to pass",
            wait as f64 / 1000.0,
            p.order
        );
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
    Ok(())
}

/// Refuses any seckill-http but one on this machine: a signed `payment.succeeded` pays an
/// order, and this command plays a provider that took no money. Pointed by mistake at a
/// deployed API with its real secret in the environment, it would mark real orders paid.
pub fn local_only(base_url: &str) -> anyhow::Result<()> {
    let url =
        reqwest::Url::parse(base_url).with_context(|| format!("{base_url:?} is not a URL"))?;
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let local = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !local {
        bail!(
            "seckill pay plays the payment provider for the local stack only; {base_url} is not on this machine"
        );
    }
    Ok(())
}

fn random_hex() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Pays order `order` through the webhook at `base_url` (the seckill-http base URL),
/// signing with the current secret of `secrets`.
pub async fn pay(
    b: &Backends,
    base_url: &str,
    secrets: &Secrets,
    order: OrderId,
    opts: &PayOptions,
) -> anyhow::Result<Vec<Delivery>> {
    local_only(base_url)?;
    let p = payable(b, order).await?;
    if opts.late {
        wait_past_deadline(&p).await?;
    }
    let event = event(&p, opts)?;
    let body = serde_json::to_vec(&event)?;
    let signature = webhook::header(&[secrets.current()], now_millis() / 1000, &body);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut out = Vec::new();
    for _ in 0..if opts.replay { 2 } else { 1 } {
        out.push(deliver(&http, base_url, &signature, &body, &event).await?);
    }
    Ok(out)
}

/// Sends one signed event.
pub async fn deliver(
    http: &reqwest::Client,
    base_url: &str,
    signature: &str,
    body: &[u8],
    event: &Event,
) -> anyhow::Result<Delivery> {
    let url = format!("{}/payments/webhook", base_url.trim_end_matches('/'));
    let res = http
        .post(&url)
        .header("content-type", "application/json")
        .header(webhook::SIGNATURE_HEADER, signature)
        .body(body.to_vec())
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = res.status().as_u16();
    let answer = res.json().await.unwrap_or(serde_json::Value::Null);
    Ok(Delivery {
        event_id: event.id.clone(),
        payment_id: event.data.payment_id.clone(),
        status,
        answer,
    })
}

/// The text form of `seckill pay`.
pub fn render(all: &[Delivery]) -> String {
    let mut out = String::new();
    for d in all {
        out.push_str(&format!(
            "{} {} -> {} {}\n",
            d.event_id, d.payment_id, d.status, d.answer
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::local_only;

    #[test]
    fn the_provider_is_played_for_this_machine_only() {
        for url in [
            "http://127.0.0.1:19100",
            "http://localhost:9000/",
            "http://[::1]:8080",
            "http://127.0.0.2",
        ] {
            assert!(local_only(url).is_ok(), "{url}");
        }
        for url in [
            "https://abc123.execute-api.eu-west-1.amazonaws.com",
            "http://10.0.0.5:9000",
            "http://localhost.example.com",
            "not a url",
        ] {
            assert!(local_only(url).is_err(), "{url}");
        }
    }
}

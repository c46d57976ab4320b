//! The demo's last stage: the order events its sales owed, read from the stack's consumer
//! queue (moto's SQS, fed by the bus's rule) as the rest of a shop would read them, after
//! one more sale whose order expires unpaid. Each of the demo's orders has its
//! transitions there once by id, in order (docs/design.md, "Order events").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use aws_sdk_sqs::Client as Sqs;
use reqwest::Client;
use seckill_shared::domain::format_rfc3339_millis;
use serde_json::{Value, json};

use super::sales::{SCHEDULED_EVENT, Stack, admit, create_voucher};

/// How long the demo reads the queue at most, and how long it waits for more after a
/// read that found none.
const READ_FOR: Duration = Duration::from_secs(45);
const QUIET: Duration = Duration::from_secs(3);

/// An order left to expire (a 1 s payment window), the drainer run until everything owed
/// is published, then every event of this run's vouchers (ids from `first_voucher` on:
/// ids grow) read from `queue_url` and checked.
pub(super) async fn check(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    run_id: &str,
    first_voucher: u64,
    (endpoint, queue_url): (&str, &str),
    mysql_url: Option<&str>,
) -> anyhow::Result<()> {
    let now = seckill_shared::domain::now_millis;
    let id = create_voucher(
        stack,
        http,
        token,
        &json!({
            "title": format!("Demo sale {run_id}: pay within a second"),
            "stock": 1,
            "begins_at": format_rfc3339_millis(now() - 1_000),
            "ends_at": format_rfc3339_millis(now() + 600_000),
            "pay_within_s": 1,
            "price_minor": 100,
            "currency": "EUR",
        }),
    )
    .await?;
    let order = admit(stack, http, token, &id, &format!("demo-{run_id}-late")).await?;
    println!("\norder events: order {order} of voucher {id} left to expire unpaid");
    if let Some(url) = mysql_url {
        reject_one(stack, http, token, run_id, url).await?;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for _ in 0..3 {
        http.post(stack.drainer_url)
            .header("content-type", "application/json")
            .body(SCHEDULED_EVENT)
            .send()
            .await?;
    }

    let cfg = seckill_shared::adapters::data_api::sdk_config(true)
        .await
        .into_builder()
        .endpoint_url(endpoint)
        .build();
    let sqs = Sqs::new(&cfg);
    let mine = read(&sqs, queue_url, first_voucher, &order).await?;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids = HashSet::new();
    let mut by_order: HashMap<String, Vec<u64>> = HashMap::new();
    for e in &mine {
        *kinds
            .entry(e["detail-type"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
        let d = &e["detail"];
        let event_id = d["event_id"].as_str().unwrap_or("").to_string();
        ensure!(
            ids.insert(event_id.clone()),
            "event {event_id} arrived twice"
        );
        by_order
            .entry(d["order_id"].as_str().unwrap_or("").to_string())
            .or_default()
            .push(
                d["sequence"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
            );
    }
    for (o, seqs) in &by_order {
        ensure!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "order {o}'s events out of order: {seqs:?}"
        );
    }
    println!(
        "  {} events of {} orders read from the consumer queue, each once, in order per order:",
        mine.len(),
        by_order.len()
    );
    for (kind, n) in &kinds {
        println!("    {kind:<22} {n}");
    }
    for want in [
        "OrderConfirmed",
        "OrderAwaitingPayment",
        "OrderPaid",
        "OrderCancelled",
        "OrderExpired",
        "OrderRejected",
        "RefundDue",
    ] {
        ensure!(
            kinds.contains_key(want),
            "no {want} event arrived: {kinds:?}"
        );
    }
    Ok(())
}

/// A sale whose database stock is gone when its order is drained (as after a database
/// restored from an older backup, the stack's MariaDB changed directly): the order is
/// admitted in Redis, then written `rejected`.
async fn reject_one(
    stack: &Stack<'_>,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    run_id: &str,
    mysql_url: &str,
) -> anyhow::Result<()> {
    use mysql_async::prelude::Queryable;
    let now = seckill_shared::domain::now_millis;
    let id = create_voucher(
        stack,
        http,
        token,
        &json!({
            "title": format!("Demo sale {run_id}: the database's stock is gone"),
            "stock": 1,
            "begins_at": format_rfc3339_millis(now() - 1_000),
            "ends_at": format_rfc3339_millis(now() + 600_000),
        }),
    )
    .await?;
    let mut db = seckill_cli::scratch_db::mysql(mysql_url).await?;
    db.exec_drop(
        "UPDATE vouchers SET stock_left = 0 WHERE id = ?",
        (id.parse::<u64>()?,),
    )
    .await?;
    db.disconnect().await.ok();
    let order = admit(stack, http, token, &id, &format!("demo-{run_id}-unlucky")).await?;
    println!(
        "  order {order} of voucher {id} admitted; the database's stock for it set to 0 first"
    );
    Ok(())
}

/// Reads (and deletes) the queue until the expired order's event is in and nothing more
/// comes for [`QUIET`]: the events of this run's vouchers.
async fn read(
    sqs: &Sqs,
    queue_url: &str,
    first_voucher: u64,
    expired: &str,
) -> anyhow::Result<Vec<Value>> {
    let started = Instant::now();
    let mut quiet_since = Instant::now();
    let mut mine = Vec::new();
    loop {
        let got = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .send()
            .await
            .context("reading the consumer queue (EVENTS_QUEUE_URL)")?;
        let messages = got.messages.unwrap_or_default();
        let empty = messages.is_empty();
        if !empty {
            quiet_since = Instant::now();
        }
        let mut handles = Vec::new();
        for (i, m) in messages.into_iter().enumerate() {
            let event: Value = serde_json::from_str(m.body().unwrap_or("")).unwrap_or(Value::Null);
            let voucher = event["detail"]["voucher_id"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok());
            if voucher.is_some_and(|v| v >= first_voucher) {
                mine.push(event);
            }
            if let Some(h) = m.receipt_handle {
                handles.push(
                    aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(h)
                        .build()?,
                );
            }
        }
        if !handles.is_empty() {
            sqs.delete_message_batch()
                .queue_url(queue_url)
                .set_entries(Some(handles))
                .send()
                .await?;
        }
        let expired_in = mine
            .iter()
            .any(|e| e["detail"]["order_id"] == expired && e["detail"]["state"] == "expired");
        if (expired_in && quiet_since.elapsed() >= QUIET) || started.elapsed() >= READ_FOR {
            return Ok(mine);
        }
        if empty {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

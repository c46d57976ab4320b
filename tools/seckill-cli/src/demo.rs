//! `seckill demo`: a small flash sale over the real HTTP API, end to end: a voucher, a
//! rush of buyers (some pressing twice), the drainer until the orders are in the
//! database, then the invariants checked from the outside.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use reqwest::{Client, StatusCode};
use seckill_shared::auth;
use seckill_shared::domain::format_rfc3339_millis;
use serde_json::{Value, json};

use seckill_cli::ops::stripe::LocalStripe;

mod events;
mod sales;
use sales::{SCHEDULED_EVENT, Stack, card_sale, create_voucher, payment_sale};

/// What the demo needs to know.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Base URL of seckill-http (the stack's SECKILL_HTTP_URL).
    #[arg(long, env = "SECKILL_HTTP_URL")]
    url: String,
    /// The drainer's Lambda invoke URL (the stack's DRAINER_INVOKE_URL).
    #[arg(long, env = "DRAINER_INVOKE_URL")]
    drainer_url: String,
    #[arg(long, env = "SECKILL_DEV_JWT_SECRET", hide_env_values = true)]
    secret: String,
    /// Units on sale.
    #[arg(long, default_value_t = 100)]
    stock: i64,
    /// Distinct buyers; each presses "buy" once, every fifth presses twice.
    #[arg(long, default_value_t = 400)]
    buyers: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// The payment webhook's signing secret (the stack's): with it, the demo also runs a
    /// sale with a payment step, paid the way the provider pays.
    #[arg(long, env = "SECKILL_PAYMENT_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// The local Stripe (the stack's localstripe): with it and the two below, the demo
    /// also runs a sale paid by card, refund included.
    #[arg(long, env = "STRIPE_API_BASE")]
    stripe_api_base: Option<String>,
    #[arg(long, env = "STRIPE_SECRET_KEY", hide_env_values = true)]
    stripe_secret_key: Option<String>,
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    stripe_webhook_secret: Option<String>,
    /// The order events' endpoint and consumer queue (the stack's moto): with both, the
    /// demo ends by reading its orders' events as the rest of a shop would.
    #[arg(long, env = "EVENTS_ENDPOINT_URL")]
    events_endpoint: Option<String>,
    #[arg(long, env = "EVENTS_QUEUE_URL")]
    events_queue_url: Option<String>,
    /// The stack's MariaDB (MYSQL_URL): with it, the order-events stage also has an order
    /// rejected (its voucher's database stock set to 0 first, directly).
    #[arg(long, env = "MYSQL_URL", hide_env_values = true)]
    mysql_url: Option<String>,
}

/// A progress bar drawn with `template`.
fn bar(len: usize, template: &str) -> ProgressBar {
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(len as u64).with_style(style)
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let http = Client::builder().timeout(Duration::from_secs(30)).build()?;
    let stack = Stack {
        url: &args.url,
        drainer_url: &args.drainer_url,
    };
    let now = seckill_shared::domain::now_millis;
    let token = |sub: &str, admin: bool| {
        let scope = admin.then_some(auth::ADMIN_SCOPE);
        auth::mint_hs256(args.secret.as_bytes(), sub, scope, now() / 1000 + 3600)
    };
    let run_id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);

    // 1. The voucher.
    let body = json!({
        "title": format!("Demo sale {run_id}: coffee for 1 cent"),
        "stock": args.stock,
        "begins_at": format_rfc3339_millis(now() - 1_000),
        "ends_at": format_rfc3339_millis(now() + 600_000),
    });
    let res = http
        .post(format!("{}/vouchers", args.url))
        .bearer_auth(token("demo-admin", true))
        .json(&body)
        .send()
        .await
        .with_context(|| {
            format!(
                "seckill-http is not answering at {}; is the stack up (scripts/stack.sh up)?",
                args.url
            )
        })?;
    let status = res.status();
    let voucher: Value = res.json().await?;
    ensure!(
        status == StatusCode::CREATED,
        "creating the voucher failed: {status} {voucher}"
    );
    let id = voucher["id"].as_str().context("voucher id")?.to_string();
    println!("created voucher {id}: {} units, on sale now", args.stock);

    // 2. The rush: every buyer once, every fifth twice, in shuffled order.
    let user = |i: usize| format!("demo-{run_id}-user-{i}");
    let mut attempts: Vec<String> = (0..args.buyers).map(user).collect();
    attempts.extend((0..args.buyers).step_by(5).map(user));
    let n = attempts.len() as u64;
    attempts.shuffle(&mut rand::rng());
    let rush_bar = bar(
        attempts.len(),
        "{spinner} rush {bar:40} {pos}/{len} attempts {per_sec} [{elapsed}]",
    );
    let started = Instant::now();
    let buy_url = format!("{}/vouchers/{id}/seckill", args.url);
    let (http, buy_url, rush_bar, token) = (&http, &buy_url, &rush_bar, &token);
    // Per attempt: `admitted` and the order id, or the refusal's code.
    let results: Vec<(String, String, Option<String>)> = futures::stream::iter(attempts)
        .map(|user| async move {
            let res = http.post(buy_url).bearer_auth(token(&user, false)).send();
            let (code, order) = match res.await {
                Ok(res) => {
                    let status = res.status();
                    let body = res.json::<Value>().await.unwrap_or(Value::Null);
                    let text = |key| body[key].as_str().unwrap_or("?").to_string();
                    if status == StatusCode::ACCEPTED {
                        ("admitted".to_string(), Some(text("order_id")))
                    } else {
                        (text("code"), None)
                    }
                }
                Err(e) => (format!("transport: {e}"), None),
            };
            rush_bar.inc(1);
            (user, code, order)
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    rush_bar.finish_and_clear();
    let rush = started.elapsed();

    let mut by_code: BTreeMap<String, usize> = BTreeMap::new();
    let mut admitted: Vec<(String, String)> = Vec::new();
    for (user, code, order) in results {
        *by_code.entry(code).or_default() += 1;
        admitted.extend(order.map(|order| (user, order)));
    }
    println!(
        "{n} attempts by {} buyers in {:.2?} ({:.0}/s):",
        args.buyers,
        rush,
        n as f64 / rush.as_secs_f64()
    );
    for (code, count) in &by_code {
        println!("  {code:<18} {count}");
    }

    // 3. Drain: invoke the drainer as the schedule would, until every order is in the database.
    let drain_bar = bar(
        admitted.len(),
        "{spinner} drain {bar:40} {pos}/{len} orders confirmed [{elapsed}]",
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let summary = loop {
        let res = http
            .post(&args.drainer_url)
            .header("content-type", "application/json")
            .body(SCHEDULED_EVENT)
            .send()
            .await
            .with_context(|| format!("order-drainer is not answering at {}", args.drainer_url))?;
        let summary: Value = res.json().await.unwrap_or(Value::Null);
        statuses.clear();
        for (user, order) in &admitted {
            let res = http
                .get(format!("{}/orders/{order}", args.url))
                .bearer_auth(token(user, false))
                .send()
                .await?;
            let body: Value = res.json().await.unwrap_or(Value::Null);
            *statuses
                .entry(body["status"].as_str().unwrap_or("?").to_string())
                .or_default() += 1;
        }
        let pending = statuses.get("pending").copied().unwrap_or(0);
        drain_bar.set_position((admitted.len() - pending) as u64);
        if pending == 0 || Instant::now() > deadline {
            break summary;
        }
    };
    drain_bar.finish_and_clear();
    println!("drainer's last summary: {summary}");
    println!("order statuses: {statuses:?}");

    // 4. The invariants, checked from the outside.
    let v: Value = http
        .get(format!("{}/vouchers/{id}", args.url))
        .send()
        .await?
        .json()
        .await?;
    let unique: HashSet<&String> = admitted.iter().map(|(u, _)| u).collect();
    let expected = (args.stock as usize).min(args.buyers);
    println!("stock_left in Redis: {}", v["stock_left"]);
    ensure!(
        admitted.len() == expected,
        "admitted {} orders, expected exactly {expected}",
        admitted.len()
    );
    ensure!(unique.len() == admitted.len(), "a buyer was admitted twice");
    ensure!(
        v["stock_left"] == json!(args.stock - admitted.len() as i64),
        "Redis stock does not add up: {v}"
    );
    ensure!(
        statuses.get("confirmed").copied().unwrap_or(0) == admitted.len(),
        "not every admitted order was confirmed: {statuses:?}"
    );
    println!(
        "ok: {} admitted of {} units, nobody twice, every order confirmed in the database",
        admitted.len(),
        args.stock
    );
    if let Some(secret) = &args.webhook_secret {
        payment_sale(&stack, http, token, &run_id, secret).await?;
    }
    if let (Some(base), Some(key), Some(whsec)) = (
        &args.stripe_api_base,
        &args.stripe_secret_key,
        &args.stripe_webhook_secret,
    ) {
        let stripe = LocalStripe::new(&args.url, base, key, whsec)?;
        card_sale(&stack, http, token, &run_id, &stripe).await?;
    }
    room_sale(&args, http, token, &run_id).await?;
    if let (Some(endpoint), Some(queue)) = (&args.events_endpoint, &args.events_queue_url) {
        let first: u64 = id.parse().context("voucher id")?;
        let mysql = args.mysql_url.as_deref();
        events::check(
            &stack,
            http,
            token,
            &run_id,
            first,
            (endpoint, queue),
            mysql,
        )
        .await?;
    }
    Ok(())
}

/// A sale with a waiting room: 20 units, 5 buyers let in per second from a start 3 s
/// away. 60 buyers join in shuffled order before the start and get positions; once it
/// opens, buying without an entry token is refused; each buyer looks again when their
/// expected wait is
/// over and buys with the token once served. Entry follows position, so the 20 units go
/// to positions 1..=20, and everybody still waiting then learns the sale is sold out.
async fn room_sale(
    args: &DemoArgs,
    http: &Client,
    token: &impl Fn(&str, bool) -> String,
    run_id: &str,
) -> anyhow::Result<()> {
    const UNITS: usize = 20;
    const BUYERS: usize = 60;
    let now = seckill_shared::domain::now_millis;
    let body = json!({
        "title": format!("Demo sale {run_id}: queue first"),
        "stock": UNITS,
        "begins_at": format_rfc3339_millis(now() + 3_000),
        "ends_at": format_rfc3339_millis(now() + 600_000),
        "entry_rate_per_s": 5,
        "queue_opens_before_s": 60,
    });
    let id = create_voucher(
        &Stack {
            url: &args.url,
            drainer_url: &args.drainer_url,
        },
        http,
        token,
        &body,
    )
    .await?;
    println!("\nwaiting room: voucher {id}, {UNITS} units, 5 buyers let in per second from 3 s on");
    let queue_url = format!("{}/vouchers/{id}/queue", args.url);
    let buy_url = format!("{}/vouchers/{id}/seckill", args.url);
    let mut users: Vec<String> = (0..BUYERS)
        .map(|i| format!("demo-{run_id}-queued-{i}"))
        .collect();
    users.shuffle(&mut rand::rng());
    let mut positions = BTreeMap::new();
    for user in &users {
        let standing: Value = http
            .post(&queue_url)
            .bearer_auth(token(user, false))
            .send()
            .await?
            .json()
            .await?;
        let p = standing["position"].as_u64().context("a position")?;
        positions.insert(p, user.clone());
    }
    println!(
        "  {BUYERS} buyers joined: positions 1..={}",
        positions.keys().last().copied().unwrap_or(0)
    );
    // Once the sale is open, a purchase without an entry token is refused.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let refused: Value = http
        .post(&buy_url)
        .bearer_auth(token(&users[0], false))
        .send()
        .await?
        .json()
        .await?;
    println!("  buying without an entry token: {}", refused["code"]);
    ensure!(
        refused["code"] == "entry_required",
        "bought without a token: {refused}"
    );

    // Every buyer waits their turn, then buys with their token.
    let bar = bar(
        BUYERS,
        "{spinner} room {bar:40} {pos}/{len} buyers done [{elapsed}]",
    );
    let (queue_url, buy_url, bar) = (&queue_url, &buy_url, &bar);
    let outcomes: Vec<(u64, String)> = futures::stream::iter(positions.clone())
        .map(|(p, user)| async move {
            let outcome = loop {
                let standing: Value = match http
                    .get(queue_url)
                    .bearer_auth(token(&user, false))
                    .send()
                    .await
                {
                    Ok(res) => res.json().await.unwrap_or(Value::Null),
                    Err(e) => break format!("transport: {e}"),
                };
                match standing["status"].as_str() {
                    Some("waiting") => {
                        let wait = standing["expected_wait_ms"].as_u64().unwrap_or(200);
                        tokio::time::sleep(Duration::from_millis(wait.clamp(20, 5_000))).await;
                    }
                    Some("served") => {
                        let t = standing["entry_token"].as_str().unwrap_or_default();
                        let res = http
                            .post(buy_url)
                            .bearer_auth(token(&user, false))
                            .header("seckill-entry", t)
                            .send()
                            .await;
                        break match res {
                            Ok(r) if r.status() == StatusCode::ACCEPTED => "admitted".to_string(),
                            Ok(r) => r.json::<Value>().await.map_or("?".into(), |b| {
                                b["code"].as_str().unwrap_or("?").to_string()
                            }),
                            Err(e) => format!("transport: {e}"),
                        };
                    }
                    other => break format!("told {}", other.unwrap_or("?")),
                }
            };
            bar.inc(1);
            (p, outcome)
        })
        .buffer_unordered(BUYERS)
        .collect()
        .await;
    bar.finish_and_clear();
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, o) in &outcomes {
        *tally.entry(o.as_str()).or_default() += 1;
    }
    println!("  outcomes: {tally:?}");
    let admitted: Vec<u64> = outcomes
        .iter()
        .filter(|(_, o)| o == "admitted")
        .map(|(p, _)| *p)
        .collect();
    ensure!(
        admitted.len() == UNITS && admitted.iter().all(|p| *p as usize <= UNITS),
        "the units did not go to positions 1..={UNITS}: {admitted:?}"
    );
    ensure!(
        outcomes
            .iter()
            .all(|(p, o)| *p as usize <= UNITS || o == "told sold_out" || o == "sold_out"),
        "a buyer after the sell-out was not told so: {outcomes:?}"
    );
    println!(
        "ok: the {UNITS} units went to positions 1..={UNITS} in turn; the others were told sold out"
    );
    Ok(())
}

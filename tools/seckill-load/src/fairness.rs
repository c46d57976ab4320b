//! `seckill-load fairness`: who gets the units that come back to a sold-out sale with a
//! waiting room, bots polling at their limit or people looking every few seconds, over
//! real HTTP against the running stack; and whether the buyer page can still read the
//! voucher while one client floods that read.
//!
//! One sale, run twice in the same run: with one stock bucket and with three, whose
//! returned units must cross slots to reach the line in bucket 0 and the offered buyer's
//! own bucket after it (`lua/queue.lua`, `lua/close.lua`, `lua/give.lua`). (Until
//! 2026-12-03 a room of several buckets gave returned units to whoever asked first: the
//! runs of docs/benchmarks.md before then measured that as the baseline.) Everyone joins the room in a seeded random order;
//! the first `stock` positions buy at once and then pay, cancel, or let their order
//! expire; the rest wait. Bots look and try to buy as fast as their per-user limit lets
//! them; people follow the page's rule (look again after `expected_wait_ms`, with
//! jitter) and buy when served. Meanwhile one client floods `GET /vouchers/{id}` through
//! the gateway (its per-client limit, the edge's), and each person's page reads it at
//! every look from an address of its own.
//!
//! Reported per run: the units that came back and who bought them; **overtakes**, a
//! returned unit bought by someone while a waiter ahead of them in line was still looking
//! (the line must make this 0); people overtaken by a bot; and the share of the people's
//! voucher reads answered 200 under the flood.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use seckill_cli::stack_env::StackEnv;
use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use seckill_shared::webhook::{Event, EventType, PaymentData};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::storm::client::{Call, Shop};

/// The scenario's sizes.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct FairnessOptions {
    /// Units on sale
    #[arg(long, default_value_t = 12)]
    pub stock: u32,
    /// Bot accounts: look and try to buy as fast as their limit allows
    #[arg(long, default_value_t = 20)]
    pub bots: u32,
    /// People: look every few seconds, as the buyer page does
    #[arg(long, default_value_t = 30)]
    pub people: u32,
    /// Of the first buyers, the share that cancel (the same share let the order expire;
    /// the rest pay)
    #[arg(long, default_value_t = 0.33)]
    pub return_share: f64,
    /// Seconds a buyer has to pay
    #[arg(long, default_value_t = 20)]
    pub pay_window_s: u64,
    /// Seconds each run lasts at most
    #[arg(long, default_value_t = 90)]
    pub seconds: u64,
    /// Reads a second the flooding client sends at GET /vouchers/{id}
    #[arg(long, default_value_t = 100)]
    pub flood_per_s: u32,
    /// The seed of the join order and the first buyers' fates
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// No progress bars
    #[arg(long)]
    pub quiet: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessRun {
    pub buckets: u16,
    pub voucher: String,
    /// Units given back by a cancel or an expiry.
    pub returned: u32,
    /// Units bought after the sell-out, by people and by bots.
    pub rebought_by_people: u32,
    pub rebought_by_bots: u32,
    /// Returned units bought while a waiter ahead of the buyer was still looking.
    pub overtakes: u32,
    /// Of those, a person overtaken by a bot.
    pub people_overtaken_by_bots: u32,
    /// The people's voucher reads: answered 200, and all.
    pub page_reads_ok: u64,
    pub page_reads: u64,
    /// The flooding client's reads: refused 429 at the edge, and all.
    pub flood_limited: u64,
    pub flood_sent: u64,
}

impl FairnessRun {
    /// The share of returned units that went to the earliest waiter still looking.
    pub fn in_line_share(&self) -> f64 {
        let bought = self.rebought_by_people + self.rebought_by_bots;
        if bought == 0 {
            return 1.0;
        }
        f64::from(bought - self.overtakes.min(bought)) / f64::from(bought)
    }
}

/// Both runs.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessReport {
    pub options: FairnessOptions,
    /// One bucket: the line for returned units.
    pub line: FairnessRun,
    /// Three buckets: the same line across slots.
    pub buckets: FairnessRun,
}

impl FairnessReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "Fairness: {} units, {} bots at their limit, {} people looking every few seconds (seed {})\n\n",
            self.options.stock, self.options.bots, self.options.people, self.options.seed
        );
        s.push_str("| run | returned | bought by people | by bots | overtakes | people overtaken by bots | in line | page reads ok | flood refused |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (name, r) in [
            ("line (1 bucket)", &self.line),
            ("line (3 buckets)", &self.buckets),
        ] {
            s.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {:.0} % | {}/{} | {}/{} |\n",
                r.returned,
                r.rebought_by_people,
                r.rebought_by_bots,
                r.overtakes,
                r.people_overtaken_by_bots,
                r.in_line_share() * 100.0,
                r.page_reads_ok,
                r.page_reads,
                r.flood_limited,
                r.flood_sent
            ));
        }
        s
    }
}

/// An account in line.
#[derive(Debug, Clone)]
struct Account {
    user: String,
    bot: bool,
    position: u64,
    token: String,
    entry: Option<String>,
}

/// What the first buyers do with their order.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Pay,
    Cancel,
    Expire,
}

/// The sale's shared record: who is still looking, and every purchase after sell-out.
#[derive(Default)]
struct Record {
    /// Positions still waiting (looking), bot or not.
    waiting: BTreeMap<u64, bool>,
    /// Every purchase of a returned unit.
    rebought: Vec<Rebought>,
    page_reads: u64,
    page_reads_ok: u64,
}

/// A purchase of a returned unit: (position, bot, the positions still waiting ahead of
/// it then, each with whether it is a bot).
type Rebought = (u64, bool, Vec<(u64, bool)>);

/// Both runs, one after the other.
pub async fn fairness(env: &StackEnv, o: &FairnessOptions) -> anyhow::Result<FairnessReport> {
    let line = run(env, o, 1).await?;
    let buckets = run(env, o, 3).await?;
    Ok(FairnessReport {
        options: o.clone(),
        line,
        buckets,
    })
}

async fn run(env: &StackEnv, o: &FairnessOptions, buckets: u16) -> anyhow::Result<FairnessRun> {
    if o.stock < 2 || o.bots + o.people == 0 {
        bail!("the scenario needs two units and somebody waiting");
    }
    let secret = env.get("SECKILL_PAYMENT_WEBHOOK_SECRET")?;
    let secret = secret
        .split(',')
        .next()
        .unwrap_or_default()
        .as_bytes()
        .to_vec();
    let base = env.get("SECKILL_HTTP_URL")?;
    let shop = Arc::new(Shop::new(
        base.clone(),
        env.get("SECKILL_DEV_JWT_SECRET")?,
        secret,
        256,
    ));
    let lead_ms = 2_000;
    let begins = now_millis() + lead_ms;
    let body = json!({
        "title": format!("fairness {} ({buckets} buckets)", o.seed),
        "stock": o.stock,
        "begins_at": format_rfc3339_millis(begins),
        "ends_at": format_rfc3339_millis(begins + (o.seconds as i64 + 60) * 1000),
        "pay_within_s": o.pay_window_s,
        "price_minor": 500,
        "currency": "EUR",
        "buckets": buckets,
        "entry_rate_per_s": 10_000,
        "queue_opens_before_s": 60,
    });
    let admin = shop.token("fairness-admin", true);
    let created = shop
        .until_final(
            &Call::post("create", "/vouchers")
                .token(&admin)
                .body(serde_json::to_vec(&body)?),
            Duration::from_secs(30),
        )
        .await
        .context("creating the voucher: no answer")?;
    if created.status != 201 {
        bail!("creating the voucher: {} {}", created.status, created.body);
    }
    let voucher = created.str("id").context("the voucher's id")?;

    // Everyone joins, in a seeded order: positions 1..n.
    let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed.wrapping_add(u64::from(buckets)));
    let run_tag = rng.random::<u32>();
    let mut users: Vec<(String, bool)> = (0..o.bots)
        .map(|i| (format!("fair-{run_tag:08x}-bot{i}"), true))
        .chain((0..o.people).map(|i| (format!("fair-{run_tag:08x}-person{i}"), false)))
        .collect();
    users.shuffle(&mut rng);
    let queue = format!("/vouchers/{voucher}/queue");
    let mut accounts = Vec::new();
    for (user, bot) in users {
        let token = shop.token(&user, false);
        let joined = shop
            .until_final(
                &Call::post("join", &queue).token(&token),
                Duration::from_secs(30),
            )
            .await
            .context("a join: no answer")?;
        let position = joined.body["position"].as_u64().context("a position")?;
        accounts.push(Account {
            user,
            bot,
            position,
            token,
            entry: None,
        });
    }
    accounts.sort_by_key(|a| a.position);
    let first = o.stock as usize;
    let fates: Vec<Fate> = (0..first)
        .map(|_| {
            let x: f64 = rng.random();
            if x < o.return_share {
                Fate::Cancel
            } else if x < 2.0 * o.return_share {
                Fate::Expire
            } else {
                Fate::Pay
            }
        })
        .collect();
    let returned = fates.iter().filter(|f| **f != Fate::Pay).count() as u32;
    let record = Arc::new(Mutex::new(Record::default()));
    record.lock().expect("record").waiting = accounts[first..]
        .iter()
        .map(|a| (a.position, a.bot))
        .collect();

    let wait = Duration::from_millis((begins - now_millis()).max(0) as u64);
    tokio::time::sleep(wait).await;
    let deadline = Instant::now() + Duration::from_secs(o.seconds);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bar = progress(o, u64::from(returned), buckets);

    // The drainer, as the schedule runs it (expiries are its sweep), and the flood.
    let drainer = tokio::spawn(drain_every_second(
        env.get("DRAINER_INVOKE_URL")?,
        stop.clone(),
    ));
    let flood = tokio::spawn(flood_reads(
        base.clone(),
        voucher.clone(),
        o.flood_per_s,
        stop.clone(),
    ));

    // Everyone is served at the start: the waiters take their entry token first (a bot
    // keeps using its own), then the first positions buy every unit, then live out
    // their fate while the others wait for a unit to come back.
    let look = format!("/vouchers/{voucher}/queue");
    for a in &mut accounts[first..] {
        let s = shop
            .until_final(
                &Call::get("look", &look).token(&a.token),
                Duration::from_secs(30),
            )
            .await;
        a.entry = s.and_then(|s| s.str("entry_token"));
    }
    let mut tasks = Vec::new();
    for (a, fate) in accounts[..first].iter().cloned().zip(fates) {
        let order = buy_first(&shop, &voucher, &a).await;
        let shop = shop.clone();
        tasks.push(tokio::spawn(async move {
            if let Some(order) = order {
                live_out(&shop, &a, &order, fate).await;
            }
        }));
    }
    for a in accounts[first..].iter().cloned() {
        let (shop, voucher, record, bar) =
            (shop.clone(), voucher.clone(), record.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            waiter(&shop, &voucher, a, deadline, &record, &bar, returned).await;
        }));
    }
    for t in tasks {
        t.await.context("a buyer's task")?;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drainer.await.context("the drainer's task")?;
    let (flood_limited, flood_sent) = flood.await.context("the flood's task")?;
    bar.finish_and_clear();
    let r = record.lock().expect("record");
    // An overtake: a purchase while someone ahead was still looking who never got a
    // unit (someone ahead who got one too, a moment later, was not passed over).
    let got: std::collections::BTreeSet<u64> = r.rebought.iter().map(|p| p.0).collect();
    let passed_over = |ahead: &Vec<(u64, bool)>, people_only: bool| {
        ahead
            .iter()
            .any(|(p, bot)| !(got.contains(p) || people_only && *bot))
    };
    Ok(FairnessRun {
        buckets,
        voucher,
        returned,
        rebought_by_people: r.rebought.iter().filter(|p| !p.1).count() as u32,
        rebought_by_bots: r.rebought.iter().filter(|p| p.1).count() as u32,
        overtakes: r
            .rebought
            .iter()
            .filter(|p| passed_over(&p.2, false))
            .count() as u32,
        people_overtaken_by_bots: r
            .rebought
            .iter()
            .filter(|p| p.1 && passed_over(&p.2, true))
            .count() as u32,
        page_reads_ok: r.page_reads_ok,
        page_reads: r.page_reads,
        flood_limited,
        flood_sent,
    })
}

fn progress(o: &FairnessOptions, returned: u64, buckets: u16) -> ProgressBar {
    if o.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(returned);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} returned units bought",
        )
        .expect("a template"),
    );
    bar.set_prefix(format!("{buckets} bucket(s)"));
    bar
}

/// A first position's purchase at the start: its order id.
async fn buy_first(shop: &Shop, voucher: &str, a: &Account) -> Option<String> {
    let patience = Duration::from_secs(30);
    let look = format!("/vouchers/{voucher}/queue");
    let s = shop
        .until_final(&Call::get("look", &look).token(&a.token), patience)
        .await?;
    let buy = format!("/vouchers/{voucher}/seckill");
    let call = Call::post("buy", &buy)
        .token(&a.token)
        .header("seckill-entry", s.str("entry_token")?);
    shop.until_final(&call, patience).await?.str("order_id")
}

/// A first buyer pays (the provider's event, once the order is drained), cancels after
/// a moment, or lets the order expire.
async fn live_out(shop: &Shop, a: &Account, order: &str, fate: Fate) {
    let patience = Duration::from_secs(30);
    match fate {
        Fate::Expire => {}
        Fate::Cancel => {
            tokio::time::sleep(Duration::from_millis(1_000 + rand::random::<u64>() % 2_000)).await;
            let path = format!("/orders/{order}/cancel");
            shop.until_final(&Call::post("cancel", &path).token(&a.token), patience)
                .await;
        }
        Fate::Pay => {
            let path = format!("/orders/{order}/pay");
            let Some(checkout) = shop
                .until_final(&Call::post("checkout", &path).token(&a.token), patience)
                .await
            else {
                return;
            };
            let data = PaymentData {
                payment_id: format!("pay_{}", a.user),
                order_id: order.to_string(),
                buyer: a.user.clone(),
                amount_minor: checkout.body["amount_minor"].as_i64().unwrap_or(0),
                currency: checkout.str("currency").unwrap_or_default(),
            };
            let event = Event::created_now(
                format!("evt_{}", rand::random::<u64>()),
                EventType::Succeeded,
                data,
            );
            shop.deliver(&event, patience).await;
        }
    }
}

/// Waits in line until a returned unit is theirs (or the run ends): a bot looks and tries
/// to buy with its first token as fast as its limit lets it, a person looks when told
/// and buys when served; each person's look reads the voucher as the page does.
async fn waiter(
    shop: &Shop,
    voucher: &str,
    mut a: Account,
    deadline: Instant,
    record: &Mutex<Record>,
    bar: &ProgressBar,
    returned: u32,
) {
    let look = format!("/vouchers/{voucher}/queue");
    let buy = format!("/vouchers/{voucher}/seckill");
    let read = format!("/vouchers/{voucher}");
    let client_address = format!(
        "10.{}.{}.{}",
        a.position / 65_536 % 256,
        a.position / 256 % 256,
        a.position % 256
    );
    while Instant::now() < deadline {
        let done = record.lock().expect("record").rebought.len() as u32 >= returned;
        if done {
            break;
        }
        let standing = shop.once(&Call::get("look", &look).token(&a.token)).await;
        let mut wait_ms = if a.bot { 200 } else { 3_000 };
        if let Some(s) = &standing
            && s.status == 200
        {
            if let Some(t) = s.str("entry_token") {
                a.entry = Some(t);
            }
            if s.str("status").as_deref() != Some("served") && !a.bot {
                wait_ms = s.body["expected_wait_ms"]
                    .as_u64()
                    .unwrap_or(3_000)
                    .clamp(1_000, 5_000);
            }
        }
        if !a.bot {
            let page = shop
                .once(
                    &Call::get("page read", &read)
                        .header("x-forwarded-for", client_address.clone()),
                )
                .await;
            let mut r = record.lock().expect("record");
            r.page_reads += 1;
            r.page_reads_ok += u64::from(page.is_some_and(|p| p.status == 200));
        }
        let served = standing
            .as_ref()
            .is_some_and(|s| s.str("status").as_deref() == Some("served"));
        if let Some(entry) = a.entry.clone()
            && (served || a.bot)
        {
            let call = Call::post("buy", &buy)
                .token(&a.token)
                .header("seckill-entry", entry);
            if let Some(answer) = shop.once(&call).await
                && answer.status == 202
            {
                // Paid at once, as the one who waited for it would: no unit comes back
                // twice.
                if let Some(order) = answer.str("order_id") {
                    live_out(shop, &a, &order, Fate::Pay).await;
                }
                let mut r = record.lock().expect("record");
                r.waiting.remove(&a.position);
                let ahead = r
                    .waiting
                    .range(..a.position)
                    .map(|(p, b)| (*p, *b))
                    .collect();
                r.rebought.push((a.position, a.bot, ahead));
                bar.inc(1);
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(wait_ms + rand::random::<u64>() % 250)).await;
    }
    record.lock().expect("record").waiting.remove(&a.position);
}

/// Invokes the stack's drainer once a second until `stop`.
async fn drain_every_second(url: String, stop: Arc<std::sync::atomic::AtomicBool>) {
    let http = reqwest::Client::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let event =
            json!({ "detail-type": "Scheduled Event", "source": "aws.events", "detail": {} });
        let _ = http.post(&url).json(&event).send().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One client flooding the anonymous voucher read through the gateway at `per_s`: how
/// many of its reads the edge refused (429), and how many it sent.
async fn flood_reads(
    base: String,
    voucher: String,
    per_s: u32,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (u64, u64) {
    if per_s == 0 {
        return (0, 0);
    }
    let http = reqwest::Client::new();
    let url = format!("{}/vouchers/{voucher}", base.trim_end_matches('/'));
    let (mut limited, mut sent) = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_s);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tick.tick().await;
        sent += 1;
        let res = http
            .get(&url)
            .header("x-forwarded-for", "198.51.100.66")
            .send()
            .await;
        if res.is_ok_and(|r| r.status() == 429) {
            limited += 1;
        }
    }
    (limited, sent)
}

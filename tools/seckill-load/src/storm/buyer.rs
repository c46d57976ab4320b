//! One buyer over HTTP, as a person's client does it: join the waiting room, wait to be
//! served, buy with the entry token, then live out the plan's [`Fate`]: pay (the provider
//! delivering each event three times at once), fail then pay, pay late, pay twice, pay
//! the wrong amount first, cancel and buy again, or let the order expire. What the buyer
//! was told is kept for the ledger check.

use std::time::Duration;

use seckill_shared::domain::now_millis;
use seckill_shared::webhook::{Event, EventType, PaymentData};
use serde::Serialize;
use tokio::time::Instant;

use super::client::{Answer, Call};
use super::context::Storm;
use super::plan::{BuyerPlan, Fate};

/// A payment the provider took (or tried to take) for an order.
#[derive(Debug, Clone, Serialize)]
pub struct PaymentSent {
    pub payment_id: String,
    pub order_id: String,
    /// The provider took the money (a success), of the voucher's price.
    pub succeeded: bool,
    pub right_amount: bool,
    /// The final answer: `<status> <outcome or code>`, or `none`.
    pub answer: String,
    /// Sent after the order's deadline.
    pub late: bool,
}

/// What one buyer was told.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BuyerLog {
    pub user: String,
    /// Order ids the buyer was told are theirs (`202`, or `already_purchased`), in order.
    pub orders: Vec<String>,
    /// Order ids named by a `503` as possibly admitted.
    pub maybe: Vec<String>,
    /// Orders the buyer cancelled (answered 200).
    pub cancelled: Vec<String>,
    pub payments: Vec<PaymentSent>,
    /// The buyer's last word on buying: `admitted`, `sold_out`, `ended`, ...
    pub outcome: String,
}

/// How long a buyer keeps asking one thing through `503`s and `429`s: longer than the
/// storm's database outage.
fn patience(storm: &Storm) -> Duration {
    Duration::from_secs(storm.opts.pay_window_s * 4 + 60)
}

/// Runs one buyer's plan.
pub async fn run(storm: &Storm, plan: &BuyerPlan) -> BuyerLog {
    let mut log = BuyerLog {
        user: plan.user.clone(),
        ..BuyerLog::default()
    };
    let token = storm.shop.token(&plan.user, false);
    let Some(order) = buy(storm, plan, &token, &mut log).await else {
        return log;
    };
    let how = match plan.fate {
        Fate::Pay => Some(PayHow::Once),
        Fate::FailThenPay => Some(PayHow::FailFirst),
        Fate::PayLate => Some(PayHow::Late),
        Fate::PayTwice => Some(PayHow::Twice),
        Fate::WrongAmountThenPay => Some(PayHow::WrongFirst),
        Fate::Expire | Fate::Cancel { .. } => None,
    };
    if let Some(how) = how {
        pay(storm, &plan.user, &token, &order, &mut log, how).await;
        return log;
    }
    // Expire: the order is left to its deadline.
    if let Fate::Cancel { rebuy } = plan.fate {
        let path = format!("/orders/{order}/cancel");
        let answer = storm
            .shop
            .until_final(&Call::post("cancel", &path).token(&token), patience(storm))
            .await;
        if answer.as_ref().is_some_and(|a| a.status == 200) {
            log.cancelled.push(order.clone());
            if rebuy
                && let Some(again) = buy(storm, plan, &token, &mut log).await
                && again != order
            {
                pay(storm, &plan.user, &token, &again, &mut log, PayHow::Once).await;
            }
        }
    }
    log
}

/// Joins the room, waits to be served, buys. `Some(order id)` once the buyer holds an
/// order (told by a `202`, or by `already_purchased` after a lost answer).
async fn buy(storm: &Storm, plan: &BuyerPlan, token: &str, log: &mut BuyerLog) -> Option<String> {
    let v = storm.voucher.clone();
    let give_up = Instant::now() + patience(storm);
    let mut lose_next = plan.lose_reply;
    // An answer was lost since the buyer last knew where they stand: a refusal now may
    // hide an order the lost call made (an instance that knows the sale sold out says
    // so before anything else), so the buyer looks their order up, as the reference
    // client does.
    let mut lost = false;
    let mut entry: Option<String> = None;
    loop {
        if Instant::now() >= give_up {
            log.outcome = "gave_up".into();
            return None;
        }
        let Some(pass) = entry.clone() else {
            match served(storm, &v, token).await {
                Ok(t) => entry = Some(t),
                Err(outcome) => {
                    log.outcome = outcome;
                    return None;
                }
            }
            continue;
        };
        let path = format!("/vouchers/{v}/seckill");
        let call = Call::post("seckill", &path)
            .token(token)
            .header("seckill-entry", pass);
        let answer = storm.shop.once(&call).await;
        if lose_next {
            // The answer is lost on its way back: the client never reads it and asks
            // again (the server did whatever it did).
            lose_next = false;
            lost = true;
            continue;
        }
        let Some(a) = answer else {
            lost = true;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if lost && a.status == 409 && a.code() != "already_purchased" {
            let path = format!("/vouchers/{v}/order");
            let mine = storm
                .shop
                .until_final(&Call::get("my order", &path).token(token), patience(storm))
                .await;
            if let Some(id) = mine
                .filter(|m| m.status == 200)
                .and_then(|m| m.str("order_id"))
                && !log.orders.contains(&id)
                && !log.cancelled.contains(&id)
            {
                log.orders.push(id.clone());
                log.outcome = "admitted".into();
                return Some(id);
            }
        }
        lost = false;
        match (a.status, a.code()) {
            (202, _) | (409, "already_purchased") => {
                let id = a.str("order_id")?;
                if !log.orders.contains(&id) {
                    log.orders.push(id.clone());
                }
                log.outcome = "admitted".into();
                return Some(id);
            }
            (503, _) => {
                if let Some(id) = a.str("order_id") {
                    log.maybe.push(id);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (429, _) => tokio::time::sleep(Duration::from_millis(300)).await,
            // The pass lapsed or was refused: ask the room again.
            (403, "entry_required") => entry = None,
            (409, "sold_out") if plan.second_wave => {
                // Units may come back (unpaid orders expire): look again as told.
                entry = None;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (409, code) => {
                log.outcome = code.to_string();
                return None;
            }
            (s, code) => {
                log.outcome = format!("{s} {code}");
                return None;
            }
        }
    }
}

/// Joins the queue and looks until served: the entry token, or why not (`sold_out`
/// without units to come back, `ended`, ...).
async fn served(storm: &Storm, v: &str, token: &str) -> Result<String, String> {
    let path = format!("/vouchers/{v}/queue");
    let joined = storm
        .shop
        .until_final(
            &Call::post("queue join", &path).token(token),
            patience(storm),
        )
        .await
        .ok_or_else(|| "queue_unanswered".to_string())?;
    if joined.status != 200 {
        return Err(format!("queue {} {}", joined.status, joined.code()));
    }
    let mut standing = joined;
    let give_up = Instant::now() + patience(storm);
    loop {
        match standing.str("status").as_deref() {
            Some("served") => {
                if let Some(t) = standing.str("entry_token") {
                    return Ok(t);
                }
            }
            Some("sold_out") if !standing.body["units_may_return"].as_bool().unwrap_or(false) => {
                return Err("sold_out".into());
            }
            Some("ended") => return Err("ended".into()),
            _ => {}
        }
        if Instant::now() >= give_up {
            return Err("never_served".into());
        }
        let wait = standing.body["expected_wait_ms"].as_u64().unwrap_or(500);
        tokio::time::sleep(Duration::from_millis(wait.clamp(200, 2_000))).await;
        standing = match storm
            .shop
            .until_final(
                &Call::get("queue look", &path).token(token),
                patience(storm),
            )
            .await
        {
            Some(a) if a.status == 200 => a,
            Some(a) => return Err(format!("queue {} {}", a.status, a.code())),
            None => return Err("queue_unanswered".into()),
        };
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PayHow {
    Once,
    FailFirst,
    Late,
    Twice,
    WrongFirst,
}

/// Checks out, then has the provider take the money as `how` says.
async fn pay(storm: &Storm, user: &str, token: &str, order: &str, log: &mut BuyerLog, how: PayHow) {
    let path = format!("/orders/{order}/pay");
    let Some(checkout) = storm
        .shop
        .until_final(&Call::post("checkout", &path).token(token), patience(storm))
        .await
    else {
        return;
    };
    if checkout.status != 200 {
        // An order already closed (expired during an outage): nothing to pay.
        return;
    }
    let amount = checkout.body["amount_minor"].as_i64().unwrap_or(0);
    let currency = checkout.str("currency").unwrap_or_default();
    let pay_by = checkout
        .str("pay_by")
        .and_then(|t| seckill_shared::domain::parse_rfc3339_millis(&t, "pay_by").ok())
        .unwrap_or(0);
    let payment = |kind: EventType, id: &str, amount_minor: i64| {
        let data = PaymentData {
            payment_id: id.to_string(),
            order_id: order.to_string(),
            buyer: user.to_string(),
            amount_minor,
            currency: currency.clone(),
        };
        Event::created_now(format!("evt_{}", rand::random::<u64>()), kind, data)
    };
    // What the provider sends, in order: (kind, which payment, amount, copies at once).
    let (a, b) = (
        format!("pay_{user}_{order}_a"),
        format!("pay_{user}_{order}_b"),
    );
    let (ok, failed) = (EventType::Succeeded, EventType::Failed);
    let steps: Vec<(EventType, &str, i64, usize)> = match how {
        PayHow::Once => vec![(ok, &a, amount, 3)],
        PayHow::FailFirst => vec![(failed, &a, amount, 1), (ok, &a, amount, 1)],
        PayHow::Late => vec![(ok, &a, amount, 1)],
        PayHow::Twice => vec![(ok, &a, amount, 1), (ok, &b, amount, 1)],
        PayHow::WrongFirst => vec![(ok, &a, amount + 1, 1), (ok, &b, amount, 1)],
    };
    if how == PayHow::Late {
        let wait = pay_by + 1_500 - now_millis();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
    }
    for (kind, id, amount_minor, copies) in steps {
        send(storm, log, payment(kind, id, amount_minor), copies, pay_by).await;
    }
}

/// The provider delivers `event` `copies` times at once, each until final; records the
/// payment once with the answer of its last copy.
async fn send(storm: &Storm, log: &mut BuyerLog, event: Event, copies: usize, pay_by: i64) {
    let late = now_millis() >= pay_by;
    let patience = patience(storm);
    let answers =
        futures::future::join_all((0..copies).map(|_| storm.shop.deliver(&event, patience))).await;
    let answer = answers
        .iter()
        .flatten()
        .map(describe)
        .next_back()
        .unwrap_or_else(|| "none".into());
    let right_amount = storm.price.is_none_or(|p| p == event.data.amount_minor);
    // Every copy must say the same (the same event, decided once).
    let said: std::collections::BTreeSet<String> = answers.iter().flatten().map(describe).collect();
    if said.len() > 1 {
        storm
            .shop
            .tally
            .lock()
            .expect("tally")
            .unexpected
            .push(format!(
                "copies of event {} answered differently: {said:?}",
                event.id
            ));
    }
    log.payments.push(PaymentSent {
        payment_id: event.data.payment_id.clone(),
        order_id: event.data.order_id.clone(),
        succeeded: event.kind == EventType::Succeeded,
        right_amount,
        answer,
        late,
    });
}

fn describe(a: &Answer) -> String {
    let what = a.str("outcome").unwrap_or_else(|| a.code().to_string());
    format!("{} {what}", a.status)
}

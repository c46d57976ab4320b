//! `seckill dead-letters list|replay VOUCHER`: why entries could not be written, and
//! putting them back on the orders stream, each at most once (one Redis script), for the
//! drainer to write like any admission (an order Redis had closed, as it was closed: a
//! paid one paid by its payment); those that would fail again are refused.

use order_drainer::plan::parse_entry;
use seckill_shared::domain::{Bucket, ClosedOrder, DeadLetter, OrderStatus, VoucherId};
use seckill_shared::protocol::fields;
use serde::Serialize;

use super::{Backend, Backends, or_dash};

/// One dead letter, for people and for `--json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterView {
    /// Its id in the dead-letter stream (what `replay --id` takes).
    pub id: String,
    /// Its id in the orders stream when it was dead-lettered.
    pub source_id: String,
    pub reason: String,
    pub deliveries: u64,
    pub order_id: Option<String>,
    pub user_id: Option<String>,
    pub admitted_ms: Option<String>,
    /// The order's row, when the database has one: `confirmed` or `rejected`.
    pub in_database: Option<String>,
    /// How Redis had closed the order when it was dead-lettered (vouchers with a payment
    /// step): `paid by <payment>`, `cancelled`, `expired`; a replay writes it so.
    pub closed: Option<String>,
    /// Why a replay would be refused; `None`: it can be replayed.
    pub not_replayable: Option<String>,
    /// The dead letter itself, what a replay writes back.
    #[serde(skip)]
    pub dead: DeadLetter,
    /// The stock bucket whose streams hold it (`<voucher>` or `<voucher>.<b>.<salt>`).
    #[serde(skip)]
    pub bucket: Bucket,
}

/// Every dead letter of the voucher (of every stock bucket), with why it failed and
/// whether it can be replayed.
pub async fn list(b: &Backends, voucher: VoucherId) -> anyhow::Result<Vec<DeadLetterView>> {
    let db_voucher = b.voucher(voucher).await?;
    let k = db_voucher.as_ref().map_or(1, |v| v.buckets);
    let mut all = Vec::new();
    for bucket in Bucket::all(voucher, k) {
        let letters = b.streams.dead_letters(bucket).await.redis()?;
        all.extend(letters.into_iter().map(|d| (bucket, d)));
    }
    let mut out = Vec::with_capacity(all.len());
    for (bucket, dead) in all {
        let (in_database, refusal) = match parse_entry(voucher, &dead.entry) {
            Err(reason) => (None, Some(format!("would fail again: {}", reason.text()))),
            Ok(order) => {
                let row = b.db.order(order.id).await.db()?;
                // A cancelled or expired order no longer keeps its buyer from another.
                let holder =
                    b.db.order_of_buyer(voucher, &order.user)
                        .await
                        .db()?
                        .filter(|(_, status, _)| !status.returned_unit());
                let refusal = match (&row, holder) {
                    (Some((v, u, ..)), _) if *v != voucher || *u != order.user => {
                        Some("its order id belongs to another order in the database".to_string())
                    }
                    (None, Some((other, ..))) => Some(format!(
                        "the buyer already holds order {other} in the database"
                    )),
                    _ => None,
                };
                (row.map(|(_, _, s, _)| s.as_str().to_string()), refusal)
            }
        };
        let no_voucher = db_voucher
            .is_none()
            .then(|| "the database has no such voucher".into());
        let text = |name| Some(String::from_utf8_lossy(dead.entry.field(name)?).into_owned());
        out.push(DeadLetterView {
            id: dead.id.clone(),
            source_id: dead.entry.id.clone(),
            reason: dead.reason.clone(),
            deliveries: dead.deliveries,
            order_id: text(fields::ORDER_ID),
            user_id: text(fields::USER_ID),
            admitted_ms: text(fields::ADMITTED_MS)
                .or_else(|| dead.entry.id_ms().map(|ms| ms.to_string())),
            in_database,
            closed: dead
                .close
                .as_deref()
                .and_then(ClosedOrder::parse)
                .map(|c| match c.status {
                    OrderStatus::Paid => format!("paid by {}", c.payment_ref),
                    other => other.as_str().to_string(),
                }),
            not_replayable: refusal.or(no_voucher),
            dead,
            bucket,
        });
    }
    Ok(out)
}

/// What a replay did with one dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Replay {
    /// Back on the orders stream under `entry_id`; the dead letter is gone.
    Replayed {
        id: String,
        entry_id: String,
        order_id: Option<String>,
    },
    /// Left where it is: it would fail again.
    Refused { id: String, why: String },
    /// No such dead letter (never existed, or replayed already).
    Missing { id: String },
}

/// Replays the dead letters `ids` of the voucher (all of them when empty).
pub async fn replay(
    b: &Backends,
    voucher: VoucherId,
    ids: &[String],
) -> anyhow::Result<Vec<Replay>> {
    let listed = list(b, voucher).await?;
    let wanted: Vec<String> = if ids.is_empty() {
        listed.iter().map(|v| v.id.clone()).collect()
    } else {
        ids.to_vec()
    };
    let mut out = Vec::with_capacity(wanted.len());
    for id in wanted {
        let Some(v) = listed.iter().find(|v| v.id == id) else {
            out.push(Replay::Missing { id });
            continue;
        };
        if let Some(why) = v.not_replayable.clone() {
            out.push(Replay::Refused { id, why });
            continue;
        }
        let dead = &v.dead;
        out.push(
            match b.streams.replay_dead_letter(v.bucket, dead).await.redis()? {
                Some(entry_id) => Replay::Replayed {
                    id,
                    entry_id,
                    order_id: v.order_id.clone(),
                },
                None => Replay::Missing { id },
            },
        );
    }
    Ok(out)
}

/// The text form of `list`.
pub fn render_list(voucher: VoucherId, all: &[DeadLetterView]) -> String {
    let mut out = format!("voucher {voucher}: {} dead letter(s)\n", all.len());
    for v in all {
        out.push_str(&format!(
            "  {}  order {}  user {}  reason {:?}  deliveries {}  database {}  {}{}\n",
            v.id,
            or_dash(v.order_id.as_ref()),
            or_dash(v.user_id.as_ref()),
            v.reason,
            v.deliveries,
            or_dash(v.in_database.as_ref()),
            v.closed
                .as_ref()
                .map_or(String::new(), |c| format!("closed {c}  ")),
            v.not_replayable
                .as_deref()
                .map_or("replayable".to_string(), |w| format!("not replayable: {w}")),
        ));
    }
    out
}

/// The text form of `replay`.
pub fn render_replay(all: &[Replay]) -> String {
    let mut out = String::new();
    for r in all {
        out.push_str(&match r {
            Replay::Replayed { id, entry_id, order_id } => format!(
                "{id}: replayed as orders entry {entry_id} (order {}); the drainer writes it once\n",
                order_id.as_deref().unwrap_or("-")
            ),
            Replay::Refused { id, why } => format!("{id}: not replayed: {why}\n"),
            Replay::Missing { id } => format!("{id}: no such dead letter (replayed already?)\n"),
        });
    }
    if all.is_empty() {
        out.push_str("nothing to replay\n");
    }
    out
}

//! What `seckill reconcile` says of the money: each payment `paid` without its paid
//! order, payment never decided, and paid order without its payment
//! ([`seckill_shared::sale_status::money`], which leaves out what is on its way), with
//! what the records hold instead and what an operator does about it. A paid order that
//! was dead-lettered is named by its dead letter, and whether a replay can write it
//! (paid by its payment: the dead letter carries its close).

use std::fmt::Write as _;

use seckill_shared::adapters::payments::unmatched::{Mismatch, Unmatched};
use seckill_shared::domain::{OrderStatus, VoucherId, now_millis};
use seckill_shared::sale_status::money;
use serde::Serialize;

use crate::ops::dead_letters::{self, DeadLetterView};
use crate::ops::status::human_ms;
use crate::ops::{Backend, Backends};

/// A payment, or a paid order, that the other side does not match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UnmatchedMoney {
    /// `paid_payment_without_its_order`, `payment_undecided` or
    /// `paid_order_without_its_payment`.
    pub class: String,
    /// The payment (`None`: a paid order that names none).
    pub payment_id: Option<String>,
    pub order_id: String,
    /// The payment's amount and currency, when it is recorded.
    pub amount_minor: Option<i64>,
    pub currency: Option<String>,
    /// What the records hold instead.
    pub found: String,
    /// What an operator does about it.
    pub what_to_do: String,
}

/// The voucher's unmatched money (`buckets`: its stock buckets), each explained.
pub(super) async fn listed(
    b: &Backends,
    voucher: VoucherId,
    buckets: u16,
) -> anyhow::Result<Vec<UnmatchedMoney>> {
    let unmatched = money::unmatched(&b.streams, &b.db, voucher, buckets)
        .await
        .db()?;
    // A paid order without a row may be a dead letter: those are read now, after the
    // money (an order dead-lettered since reconcile read the dead letters is one too).
    let no_row = unmatched
        .iter()
        .any(|u| u.mismatch == Mismatch::PaidWithoutItsOrder && u.order_row.is_none());
    let letters = match no_row {
        true => dead_letters::list(b, voucher).await?,
        false => Vec::new(),
    };
    Ok(unmatched
        .iter()
        .map(|u| explained(voucher, u, &letters))
        .collect())
}

/// The text form, appended to `out`.
pub(super) fn render(out: &mut String, all: &[UnmatchedMoney]) {
    if all.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "money not matched both ways: {}  (not repaired automatically)",
        all.len()
    );
    for m in all {
        let amount = match (m.amount_minor, &m.currency) {
            (Some(a), Some(c)) => format!(" ({a} {c})"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "    {}: payment {}{amount} of order {}: {}\n        to do: {}",
            m.class,
            m.payment_id.as_deref().unwrap_or("-"),
            m.order_id,
            m.found,
            m.what_to_do
        );
    }
}

/// What one unmatched payment or paid order means, and what to do about it.
fn explained(voucher: VoucherId, u: &Unmatched, letters: &[DeadLetterView]) -> UnmatchedMoney {
    let order = u.order;
    let payment = u.payment_id.as_deref().unwrap_or("-");
    let (found, what_to_do) = match u.mismatch {
        Mismatch::PaidWithoutItsOrder => paid_without_its_order(voucher, u, letters),
        Mismatch::Undecided => {
            let age = u
                .received_ms
                .map(|at| human_ms(u64::try_from(now_millis() - at).unwrap_or(0)));
            let paid_by_it = matches!(&u.order_row,
                Some((OrderStatus::Paid, Some(r))) if Some(r) == u.payment_id.as_ref());
            let found = format!(
                "recorded {} ago and never decided{}",
                age.as_deref().unwrap_or("long"),
                if paid_by_it {
                    format!("; order {order} is paid by it")
                } else {
                    String::new()
                }
            );
            let todo = match paid_by_it {
                true => {
                    "have the provider send the payment's event again: it is then recorded paid"
                }
                false => {
                    "have the provider send the payment's event again (it is then decided); \
                     if none comes and the money was taken, refund the payment"
                }
            };
            (found, todo.to_string())
        }
        Mismatch::PaidOrderWithoutItsPayment => {
            let found = match (&u.payment_id, &u.payment, u.payment_for) {
                (None, ..) => format!("order {order} is paid but names no payment"),
                (Some(r), None, _) => {
                    format!("order {order} is paid by {r}, which is not recorded")
                }
                (Some(r), Some(_), Some(other)) => {
                    format!("order {order} is paid by {r}, which is recorded for order {other}")
                }
                (Some(r), Some((.., outcome)), None) => {
                    format!(
                        "order {order} is paid by {r}, which is {}",
                        outcome.as_str()
                    )
                }
            };
            let todo = format!(
                "check {payment} with the provider: if it took the money for order {order}, \
                 the payment's record is wrong; if not, the order holds its unit unpaid"
            );
            (found, todo)
        }
    };
    UnmatchedMoney {
        class: u.mismatch.as_str().to_string(),
        payment_id: u.payment_id.clone(),
        order_id: order.to_string(),
        amount_minor: u.payment.as_ref().map(|(a, ..)| *a),
        currency: u.payment.as_ref().map(|(_, c, _)| c.clone()),
        found,
        what_to_do,
    }
}

/// (what the records hold, what to do) for a payment `paid` whose order is not paid by
/// it.
fn paid_without_its_order(
    voucher: VoucherId,
    u: &Unmatched,
    letters: &[DeadLetterView],
) -> (String, String) {
    let order = u.order;
    let refund = "refund the payment".to_string();
    match &u.order_row {
        None => {
            let id = order.to_string();
            let letter = letters
                .iter()
                .find(|l| l.order_id.as_deref() == Some(id.as_str()));
            match letter {
                Some(l) => {
                    let found = format!(
                        "order {order} has no row: it is dead letter {} ({})",
                        l.id, l.reason
                    );
                    let todo = match &l.not_replayable {
                        None => format!(
                            "replay it once its cause is fixed (`seckill dead-letters replay \
                             {voucher} --id {}`): the drainer writes it paid by this payment; \
                             or refund the payment",
                            l.id
                        ),
                        Some(why) => {
                            format!(
                                "refund the payment: the dead letter cannot be replayed ({why})"
                            )
                        }
                    };
                    (found, todo)
                }
                None => (
                    format!(
                        "order {order} has no row and is not on its way (no close waits for \
                         the drainer, no dead letter)"
                    ),
                    refund,
                ),
            }
        }
        Some((OrderStatus::AwaitingPayment, _)) => (
            format!(
                "order {order} still awaits payment and no close waits for the drainer \
                 (the paid close was lost)"
            ),
            "wait for the order's deadline: when the order expires or is paid again, the \
             drainer marks this payment refund_due (refund it then); if neither happens, \
             refund it"
                .to_string(),
        ),
        Some((OrderStatus::Paid, Some(other))) => (
            format!("order {order} is paid by another payment, {other}: paid twice"),
            refund,
        ),
        Some((OrderStatus::Rejected, _)) => (
            format!("order {order} is rejected: it never held a unit"),
            refund,
        ),
        Some((status @ (OrderStatus::Cancelled | OrderStatus::Expired), _)) => (
            format!(
                "order {order} is {}: its unit went back on sale",
                status.as_str()
            ),
            refund,
        ),
        Some((status, _)) => (
            format!(
                "order {order} is {} (or of another voucher)",
                status.as_str()
            ),
            "check the order and the payment with the provider; refund the payment if it did \
             not pay this order"
                .to_string(),
        ),
    }
}

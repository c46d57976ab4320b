//! The payments ledger: one row per payment the provider told us of, keyed by the
//! provider's payment id (`migrations/0006_payments.sql`).
//!
//! The primary key is what makes a payment pay at most one order: the first event of a
//! payment records it for its order, and an event naming the same payment id for
//! another order finds that row and is refused. Outcomes only move forward
//! ([`Outcome::may_follow`]), so events arriving twice or out of order (a `failed`
//! after a `succeeded`) never undo a decision. A payment that arrives after its order
//! closed is kept as `refund_due`: listed for an operator, never applied.
//!
//! The ledger is also checked against the orders both ways ([`Payments::unmatched`]):
//! every payment `paid` must name an order row `paid` by it, every order `paid` a
//! payment `paid` for it; what does not match, and payments still `received` long after
//! they were recorded, are found for the operators (`seckill status`, `seckill
//! reconcile`).
//!
//! A payment whose event names no order any voucher has (an order id outside the
//! accepted form, or one nobody found: `migrations/0008_unmatched_payments.sql`) is
//! recorded too, without a voucher (and without an order when it named none readably):
//! [`Payments::of_no_voucher`] lists those for the operators, since no voucher's list can.

use aws_sdk_rdsdata::types::Field;

use super::data_api::{DataApi, field, param};
use crate::domain::{OrderId, Price, UnixMillis, VoucherId};
use crate::error::StoreError;

/// Where a recorded payment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Recorded; what it did to its order not yet decided.
    Received,
    /// It paid its order.
    Paid,
    /// It came after its order closed, or after another payment paid it: to refund.
    RefundDue,
    /// The provider says this attempt failed.
    Failed,
    /// It cannot be applied: its amount or currency was not the voucher's price, or its
    /// event was outside the accepted form or named no order of its buyer (the reason
    /// says which). Money taken for nothing: to refund.
    Refused,
    /// To refund (it was `refund_due` or `refused`, the reason says why), and the
    /// provider took the refund request ([`refunds`]).
    RefundRequested,
    /// The provider says the money went back.
    Refunded,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Received,
        Outcome::Paid,
        Outcome::RefundDue,
        Outcome::Failed,
        Outcome::Refused,
        Outcome::RefundRequested,
        Outcome::Refunded,
    ];

    /// The outcomes of money to give back that has not gone back yet: what operators
    /// count as "to refund".
    pub const TO_REFUND: [Outcome; 3] = [
        Outcome::RefundDue,
        Outcome::Refused,
        Outcome::RefundRequested,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Received => "received",
            Outcome::Paid => "paid",
            Outcome::RefundDue => "refund_due",
            Outcome::Failed => "failed",
            Outcome::Refused => "refused",
            Outcome::RefundRequested => "refund_requested",
            Outcome::Refunded => "refunded",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// Whether a payment that stands at `self` is decided for good: later events
    /// about it change nothing.
    pub fn is_final(self) -> bool {
        !matches!(self, Outcome::Received | Outcome::Failed)
    }

    /// The outcomes a row may move to `self` from: forward only. A failed attempt may
    /// still succeed (the provider retries a card), for the price or for another
    /// amount (refused); nothing else moves back. A row still `received` (its delivery
    /// died before deciding) is decided by that delivery's retry, never refused by
    /// another event: the close Redis may already have made for it stands.
    fn may_follow(self) -> &'static [&'static str] {
        match self {
            Outcome::Received => &[],
            Outcome::Failed => &["received"],
            Outcome::Refused => &["failed"],
            Outcome::Paid | Outcome::RefundDue => &["received", "failed"],
            // The refund's own steps ([`refunds`]), never an event's decision.
            Outcome::RefundRequested | Outcome::Refunded => &[],
        }
    }
}

/// A payment as the provider described it, for an order (`None`: the event named no
/// order readably; `voucher` `None`: no voucher has the order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPayment<'a> {
    /// Who took the payment: [`GENERIC`] (the generic format) or `stripe`.
    pub provider: &'a str,
    pub payment_id: &'a str,
    pub order: Option<OrderId>,
    pub voucher: Option<VoucherId>,
    pub amount_minor: i64,
    pub currency: &'a str,
    pub event_id: &'a str,
    pub received_ms: UnixMillis,
}

/// A payment's row (`order` and `voucher` as in [`NewPayment`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRow {
    pub payment_id: String,
    pub order: Option<OrderId>,
    pub voucher: Option<VoucherId>,
    pub amount_minor: i64,
    pub currency: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
}

impl PaymentRow {
    /// The amount as a [`Price`], if it is a valid one.
    pub fn price(&self) -> Option<Price> {
        Price::new(self.amount_minor, &self.currency).ok()
    }
}

const COLUMNS: &str = "payment_id, order_id, voucher_id, amount_minor, currency, outcome, reason";

/// The most rows [`Payments::list`] returns.
pub const LIST_LIMIT: usize = 1_000;

/// [`Payments::list`]'s query (`:v` the voucher, `:outcome`): public so a test can
/// count the rows it examines on a table never analysed.
pub fn list_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM payments FORCE INDEX (payments_by_voucher_outcome) \
         WHERE voucher_id = :v AND outcome = :outcome \
         ORDER BY received_at, payment_id LIMIT {LIST_LIMIT}"
    )
}

/// [`Payments::counts`]'s query (`:v` the voucher).
pub const COUNTS_SQL: &str = "SELECT outcome, COUNT(*) FROM payments FORCE INDEX (payments_by_voucher_outcome) \
     WHERE voucher_id = :v GROUP BY outcome";

/// [`Payments::of_no_voucher`]'s query (`:outcome`): the rows without a voucher, through the
/// same index (its NULLs are one range of it), never the table.
pub fn no_voucher_list_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM payments FORCE INDEX (payments_by_voucher_outcome) \
         WHERE voucher_id IS NULL AND outcome = :outcome \
         ORDER BY received_at, payment_id LIMIT {LIST_LIMIT}"
    )
}

/// [`Payments::of_no_voucher_counts`]'s query.
pub const NO_VOUCHER_COUNTS_SQL: &str = "SELECT outcome, COUNT(*) FROM payments FORCE INDEX (payments_by_voucher_outcome) \
     WHERE voucher_id IS NULL GROUP BY outcome";

/// The longest reason recorded (`payments.reason`): a longer one is cut, never a write
/// the database refuses (which the provider would be answered 503 for, for ever).
pub const MAX_REASON_CHARS: usize = 255;

/// `reason` as recorded: at most [`MAX_REASON_CHARS`] characters.
fn reason_param(reason: Option<&str>) -> aws_sdk_rdsdata::types::SqlParameter {
    match reason {
        Some(r) => param::string(
            "reason",
            &r.chars().take(MAX_REASON_CHARS).collect::<String>(),
        ),
        None => param::null("reason"),
    }
}

/// An optional id as a parameter (`NULL` when absent).
fn id_param(name: &str, id: Option<i64>) -> aws_sdk_rdsdata::types::SqlParameter {
    id.map_or_else(|| param::null(name), |id| param::long(name, id))
}

/// The provider of the generic format (`POST /payments/webhook`): its payments are
/// refunded by an operator, seckill cannot call it.
pub const GENERIC: &str = "generic";

pub mod refunds;
pub mod unmatched;

/// The payments ledger, through the Data API.
pub struct Payments<'a>(pub &'a DataApi);

impl Payments<'_> {
    /// Records `p` as `outcome` (`received`, or `refused` with `reason`) unless its
    /// payment id is recorded already; returns the payment's row as it stands: this one,
    /// or the earlier one (which may name another order).
    pub async fn record(
        &self,
        p: &NewPayment<'_>,
        outcome: Outcome,
        reason: Option<&str>,
    ) -> Result<PaymentRow, StoreError> {
        self.0
            .execute(
                "INSERT IGNORE INTO payments (payment_id, order_id, voucher_id, amount_minor, currency, \
                 outcome, reason, event_id, received_at, decided_at, provider) \
                 VALUES (:p, :o, :v, :amount, :currency, :outcome, :reason, :event, :at, \
                 IF(:outcome = 'received', NULL, :at), :provider)",
                vec![
                    param::string("provider", p.provider),
                    param::string("p", p.payment_id),
                    id_param("o", p.order.map(OrderId::get)),
                    id_param("v", p.voucher.map(VoucherId::get)),
                    param::long("amount", p.amount_minor),
                    param::string("currency", p.currency),
                    param::string("outcome", outcome.as_str()),
                    reason_param(reason),
                    param::string("event", p.event_id),
                    param::timestamp("at", p.received_ms),
                ],
                None,
            )
            .await?;
        self.get(p.payment_id).await?.ok_or_else(|| {
            StoreError::Corrupt(format!("payment {} recorded but not found", p.payment_id))
        })
    }

    /// A payment by the provider's id.
    pub async fn get(&self, payment_id: &str) -> Result<Option<PaymentRow>, StoreError> {
        let out = self
            .0
            .execute(
                &format!("SELECT {COLUMNS} FROM payments WHERE payment_id = :p"),
                vec![param::string("p", payment_id)],
                None,
            )
            .await?;
        out.records().first().map(|r| row(r)).transpose()
    }

    /// Moves the payment to `outcome` (with `reason`) if it may go there from where it
    /// stands ([`Outcome::may_follow`]), as event `p` decides it: the row takes that
    /// event's amount and currency (a failed attempt's may differ from the money the
    /// success took), and its voucher if it had none (recorded before its order was
    /// found). Returns the row as it stands after.
    pub async fn decide(
        &self,
        p: &NewPayment<'_>,
        outcome: Outcome,
        reason: Option<&str>,
    ) -> Result<PaymentRow, StoreError> {
        let payment_id = p.payment_id;
        let from = outcome.may_follow();
        if !from.is_empty() {
            let allowed = from
                .iter()
                .map(|o| format!("'{o}'"))
                .collect::<Vec<_>>()
                .join(", ");
            self.0
                .execute(
                    &format!(
                        "UPDATE payments SET outcome = :outcome, reason = :reason, event_id = :event, \
                         amount_minor = :amount, currency = :currency, decided_at = :at, \
                         voucher_id = COALESCE(voucher_id, :v) \
                         WHERE payment_id = :p AND outcome IN ({allowed})"
                    ),
                    vec![
                        param::string("outcome", outcome.as_str()),
                        reason_param(reason),
                        id_param("v", p.voucher.map(VoucherId::get)),
                        param::string("event", p.event_id),
                        param::long("amount", p.amount_minor),
                        param::string("currency", p.currency),
                        param::timestamp("at", p.received_ms),
                        param::string("p", payment_id),
                    ],
                    None,
                )
                .await?;
        }
        self.get(payment_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("payment {payment_id} vanished")))
    }

    /// The payments of `voucher` at `outcome`, oldest first, at most [`LIST_LIMIT`]
    /// ([`LIST_SQL`]: the voucher's rows at that outcome through the
    /// `(voucher_id, outcome)` index, never the table).
    pub async fn list(
        &self,
        voucher: VoucherId,
        outcome: Outcome,
    ) -> Result<Vec<PaymentRow>, StoreError> {
        let out = self
            .0
            .execute(
                &list_sql(),
                vec![
                    param::long("v", voucher.get()),
                    param::string("outcome", outcome.as_str()),
                ],
                None,
            )
            .await?;
        out.records().iter().map(|r| row(r)).collect()
    }

    /// How many payments of `voucher` stand at each outcome (outcomes with none are left
    /// out).
    pub async fn counts(&self, voucher: VoucherId) -> Result<Vec<(Outcome, u64)>, StoreError> {
        let out = self
            .0
            .execute(COUNTS_SQL, vec![param::long("v", voucher.get())], None)
            .await?;
        outcome_counts(out.records())
    }

    /// The payments of no voucher (their event named no order any voucher has) at
    /// `outcome`, oldest first, at most [`LIST_LIMIT`] ([`no_voucher_list_sql`]).
    pub async fn of_no_voucher(&self, outcome: Outcome) -> Result<Vec<PaymentRow>, StoreError> {
        let out = self
            .0
            .execute(
                &no_voucher_list_sql(),
                vec![param::string("outcome", outcome.as_str())],
                None,
            )
            .await?;
        out.records().iter().map(|r| row(r)).collect()
    }

    /// How many payments of no voucher stand at each outcome ([`NO_VOUCHER_COUNTS_SQL`]).
    pub async fn of_no_voucher_counts(&self) -> Result<Vec<(Outcome, u64)>, StoreError> {
        let out = self.0.execute(NO_VOUCHER_COUNTS_SQL, vec![], None).await?;
        outcome_counts(out.records())
    }
}

/// Rows of `(outcome, count)`.
fn outcome_counts(records: &[Vec<Field>]) -> Result<Vec<(Outcome, u64)>, StoreError> {
    let bad = || StoreError::Corrupt("payments count: unexpected row".into());
    records
        .iter()
        .map(|r| match r.as_slice() {
            [outcome, n] => Ok((
                field::string(outcome)
                    .and_then(|o| Outcome::parse(&o))
                    .ok_or_else(bad)?,
                field::long(n)
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(bad)?,
            )),
            _ => Err(bad()),
        })
        .collect()
}

/// A column holding an id or `NULL`: `Some(None)` for `NULL`, `None` for anything else
/// than a positive id.
fn nullable_id<T>(f: &Field, id: impl Fn(i64) -> Option<T>) -> Option<Option<T>> {
    match f {
        Field::IsNull(true) => Some(None),
        f => field::long(f).and_then(id).map(Some),
    }
}

fn row(r: &[Field]) -> Result<PaymentRow, StoreError> {
    let bad = || StoreError::Corrupt("payments row: unexpected shape".into());
    let [
        payment_id,
        order,
        voucher,
        amount,
        currency,
        outcome,
        reason,
    ] = r
    else {
        return Err(bad());
    };
    Ok(PaymentRow {
        payment_id: field::string(payment_id).ok_or_else(bad)?,
        order: nullable_id(order, OrderId::new).ok_or_else(bad)?,
        voucher: nullable_id(voucher, VoucherId::new).ok_or_else(bad)?,
        amount_minor: field::long(amount).ok_or_else(bad)?,
        currency: field::string(currency).ok_or_else(bad)?,
        outcome: field::string(outcome)
            .and_then(|o| Outcome::parse(&o))
            .ok_or_else(bad)?,
        reason: field::string(reason),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_only_move_forward() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            // A final outcome is never left.
            for next in Outcome::ALL {
                if o.is_final() {
                    assert!(
                        !next.may_follow().contains(&o.as_str()),
                        "{o:?} -> {next:?}"
                    );
                }
            }
        }
        assert!(Outcome::Paid.may_follow().contains(&"failed"));
        assert!(!Outcome::Failed.may_follow().contains(&"paid"));
    }
}

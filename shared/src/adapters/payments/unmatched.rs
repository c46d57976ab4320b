//! The ledger checked against the orders both ways ([`Payments::unmatched`]): every
//! payment `paid` must name an order row `paid` by it, every order `paid` a payment
//! `paid` for it; what does not match, and payments still `received` long after they
//! were recorded, are found for the operators.

use super::{LIST_LIMIT, Outcome, Payments};
use crate::adapters::data_api::{field, param};
use crate::domain::{OrderId, OrderStatus, UnixMillis, VoucherId};
use crate::error::StoreError;

/// The most rows each query of [`Payments::unmatched`] returns.
pub const UNMATCHED_LIMIT: usize = LIST_LIMIT;

/// [`Payments::unmatched`]'s look from the payments (`:v` the voucher, `:before` the
/// time before which a payment still `received` is overdue): the voucher's payments
/// `paid` whose order row is missing, of another voucher, not `paid`, or `paid` by
/// another reference, and those still `received` since before `:before`, each with what
/// its order row holds. Through the `(voucher_id, outcome)` index, each payment's order
/// through the primary key: it reads each of the voucher's payments at those two
/// outcomes once (a mismatch between two tables has no index of its own), never another
/// voucher's nor the table. Oldest first.
pub fn unmatched_payments_sql() -> String {
    format!(
        "SELECT p.payment_id, p.order_id, p.amount_minor, p.currency, p.outcome, \
     o.status, o.pay_ref, p.received_at \
     FROM payments AS p FORCE INDEX (payments_by_voucher_outcome) \
     LEFT JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = p.order_id \
     WHERE p.voucher_id = :v AND p.outcome IN ('paid', 'received') \
     AND ((p.outcome = 'paid' AND (o.id IS NULL OR o.voucher_id <> p.voucher_id \
     OR o.status <> 'paid' OR NOT (o.pay_ref <=> p.payment_id))) \
     OR (p.outcome = 'received' AND p.received_at < :before)) \
     ORDER BY p.received_at, p.payment_id LIMIT {UNMATCHED_LIMIT}"
    )
}

/// [`Payments::unmatched`]'s look from the orders (`:v` the voucher): the voucher's
/// orders `paid` whose reference names no payment, a payment of another order, or one
/// that is neither `paid` nor `received` (a payment still `received` is on its way, and
/// overdue it is found from the payments). Through the `(voucher_id, status)` index,
/// each order's payment through the primary key: each paid order of the voucher read
/// once. In order id order.
pub fn unmatched_paid_orders_sql() -> String {
    format!(
        "SELECT o.pay_ref, o.id, p.amount_minor, p.currency, p.outcome, p.order_id \
     FROM orders AS o FORCE INDEX (orders_by_voucher_status) \
     LEFT JOIN payments AS p FORCE INDEX (PRIMARY) ON p.payment_id = o.pay_ref \
     WHERE o.voucher_id = :v AND o.status = 'paid' \
     AND (p.payment_id IS NULL OR p.order_id <> o.id OR p.outcome NOT IN ('paid', 'received')) \
     ORDER BY o.id LIMIT {UNMATCHED_LIMIT}"
    )
}

/// How a payment and its order fail to name each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mismatch {
    /// A payment `paid` whose order row is missing, or not `paid` by it.
    PaidWithoutItsOrder,
    /// A payment still `received` (never decided) long after it was recorded: a crash
    /// between its record and its close, and no delivery of its event since.
    Undecided,
    /// An order `paid` whose payment is not recorded `paid` for it.
    PaidOrderWithoutItsPayment,
}

impl Mismatch {
    /// Its name, as operators read it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mismatch::PaidWithoutItsOrder => "paid_payment_without_its_order",
            Mismatch::Undecided => "payment_undecided",
            Mismatch::PaidOrderWithoutItsPayment => "paid_order_without_its_payment",
        }
    }
}

/// A payment, or a paid order, that the other side does not match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unmatched {
    pub mismatch: Mismatch,
    /// The payment: its id, or the reference the paid order holds (`None`: it holds
    /// none).
    pub payment_id: Option<String>,
    /// The order: the one the payment is for, or the paid order.
    pub order: OrderId,
    /// The payment's row: amount, currency and outcome (`None`: no such payment).
    pub payment: Option<(i64, String, Outcome)>,
    /// What the order's row holds: its status and reference (`None`: no such order).
    /// For a paid order, `paid` and its reference.
    pub order_row: Option<(OrderStatus, Option<String>)>,
    /// The order the payment row is recorded for, when it is another than `order`.
    pub payment_for: Option<OrderId>,
    /// When a payment still `received` was recorded (unix ms).
    pub received_ms: Option<UnixMillis>,
}

impl Payments<'_> {
    /// What does not match between `voucher`'s payments and its orders: payments `paid`
    /// without their paid order, payments still `received` since before `overdue_before`
    /// (unix ms), paid orders without their payment ([`unmatched_payments_sql`],
    /// [`unmatched_paid_orders_sql`]; at most [`UNMATCHED_LIMIT`] of each). A plain read:
    /// what is only on its way (a paid close the drainer has not written yet) is here
    /// too; telling it apart is the caller's ([`crate::sale_status::money`]).
    pub async fn unmatched(
        &self,
        voucher: VoucherId,
        overdue_before: UnixMillis,
    ) -> Result<Vec<Unmatched>, StoreError> {
        let bad = || StoreError::Corrupt("unmatched payments: unexpected row".into());
        let out = self
            .0
            .execute(
                &unmatched_payments_sql(),
                vec![
                    param::long("v", voucher.get()),
                    param::timestamp("before", overdue_before),
                ],
                None,
            )
            .await?;
        let mut found = Vec::new();
        for r in out.records() {
            let [
                id,
                order,
                amount,
                currency,
                outcome,
                status,
                pay_ref,
                received,
            ] = r.as_slice()
            else {
                return Err(bad());
            };
            let outcome = field::string(outcome)
                .and_then(|o| Outcome::parse(&o))
                .ok_or_else(bad)?;
            let order_row = match field::string(status) {
                None => None,
                Some(st) => Some((
                    OrderStatus::parse(&st).ok_or_else(bad)?,
                    field::string(pay_ref),
                )),
            };
            found.push(Unmatched {
                mismatch: match outcome {
                    Outcome::Received => Mismatch::Undecided,
                    _ => Mismatch::PaidWithoutItsOrder,
                },
                payment_id: Some(field::string(id).ok_or_else(bad)?),
                order: field::long(order).and_then(OrderId::new).ok_or_else(bad)?,
                payment: Some((
                    field::long(amount).ok_or_else(bad)?,
                    field::string(currency).ok_or_else(bad)?,
                    outcome,
                )),
                order_row,
                payment_for: None,
                received_ms: (outcome == Outcome::Received)
                    .then(|| field::datetime(received))
                    .flatten(),
            });
        }
        let out = self
            .0
            .execute(
                &unmatched_paid_orders_sql(),
                vec![param::long("v", voucher.get())],
                None,
            )
            .await?;
        for r in out.records() {
            let [pay_ref, order, amount, currency, outcome, payment_for] = r.as_slice() else {
                return Err(bad());
            };
            let order = field::long(order).and_then(OrderId::new).ok_or_else(bad)?;
            let pay_ref = field::string(pay_ref);
            let payment = match field::string(outcome) {
                None => None,
                Some(o) => Some((
                    field::long(amount).ok_or_else(bad)?,
                    field::string(currency).ok_or_else(bad)?,
                    Outcome::parse(&o).ok_or_else(bad)?,
                )),
            };
            found.push(Unmatched {
                mismatch: Mismatch::PaidOrderWithoutItsPayment,
                payment_id: pay_ref.clone(),
                order,
                payment,
                order_row: Some((OrderStatus::Paid, pay_ref)),
                payment_for: field::long(payment_for)
                    .and_then(OrderId::new)
                    .filter(|o| *o != order),
                received_ms: None,
            });
        }
        Ok(found)
    }
}

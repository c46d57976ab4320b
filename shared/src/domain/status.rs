//! An order's status as a buyer sees it, and how a close (`lua/close.lua`) decided an
//! order of a voucher with a payment step.
//!
//! [`OrderStatus`] names match the database's ENUM and the API's strings; a
//! [`ClosedOrder`] is only ever paid, cancelled or expired.

use super::clock::UnixMillis;

/// What a buyer sees of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Admitted by Redis, not yet written to the database.
    Pending,
    /// In the database, holding a unit of stock.
    Confirmed,
    /// Admitted by Redis but refused by the database (its stock could not cover it).
    Rejected,
    /// Vouchers with a payment step: holding a unit until paid or its deadline passes.
    AwaitingPayment,
    /// Paid before the deadline: keeps its unit.
    Paid,
    /// Cancelled by the buyer before paying: its unit went back on sale.
    Cancelled,
    /// Not paid by the deadline: its unit went back on sale.
    Expired,
}

impl OrderStatus {
    /// Every status (the database's ENUM holds all but `pending`).
    pub const ALL: [OrderStatus; 7] = [
        OrderStatus::Pending,
        OrderStatus::Confirmed,
        OrderStatus::Rejected,
        OrderStatus::AwaitingPayment,
        OrderStatus::Paid,
        OrderStatus::Cancelled,
        OrderStatus::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::Rejected => "rejected",
            OrderStatus::AwaitingPayment => "awaiting_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Expired => "expired",
        }
    }

    /// The status a name spells, as the database and the API write it.
    pub fn parse(s: &str) -> Option<OrderStatus> {
        OrderStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the order gave its unit back (cancelled or expired).
    pub fn returned_unit(self) -> bool {
        matches!(self, OrderStatus::Cancelled | OrderStatus::Expired)
    }
}

/// How an order of a voucher with a payment step was closed, as `lua/close.lua` decided
/// it, once: the state, the deadline, the payment reference (paid only) and the buyer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedOrder {
    /// [`OrderStatus::Paid`], [`OrderStatus::Cancelled`] or [`OrderStatus::Expired`].
    pub status: OrderStatus,
    pub pay_by_ms: UnixMillis,
    pub payment_ref: String,
    pub user: String,
}

impl ClosedOrder {
    /// Parses the value the close script writes: `<state>\n<deadline>\n<ref>\n<user>`.
    pub fn parse(value: &str) -> Option<ClosedOrder> {
        let mut it = value.splitn(4, '\n');
        let status = OrderStatus::parse(it.next()?)?;
        if !matches!(
            status,
            OrderStatus::Paid | OrderStatus::Cancelled | OrderStatus::Expired
        ) {
            return None;
        }
        Some(ClosedOrder {
            status,
            pay_by_ms: it.next()?.parse().ok()?,
            payment_ref: it.next()?.to_string(),
            user: it.next()?.to_string(),
        })
    }
}

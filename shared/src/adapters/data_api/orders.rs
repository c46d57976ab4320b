//! The `orders` table as buyers and the payment step read it: a buyer's order, an order
//! by id, its payment reference, the orders awaiting payment, the statuses of a list of
//! orders, the counts per status.
//!
//! Invariant kept here: a status read back is one the database holds (`pending` exists
//! only in Redis); a row of an unexpected shape is [`StoreError::Corrupt`].

use std::collections::HashMap;

use aws_sdk_rdsdata::types::Field;

use super::client::DataApi;
use super::snapshot::SNAPSHOT_PAGE_ROWS;
use super::values::{USER_ID_TEXT, field, param};
use crate::domain::{OrderId, OrderStatus, UnixMillis, UserId, VoucherId};
use crate::error::StoreError;

/// The buyer's order of a voucher ([`DataApi::order_of_buyer`]): the one still holding
/// a unit, else the latest. Every statement here names its index: a table just written
/// may have no statistics, and three indexes begin with `voucher_id`.
pub const ORDER_OF_BUYER: &str = "SELECT id, status, pay_by FROM orders FORCE INDEX (orders_by_buyer) \
    WHERE voucher_id = :v AND user_id = :u ORDER BY holder IS NULL, id DESC LIMIT 1";

/// A page of the voucher's unpaid orders after `:after` ([`DataApi::awaiting_payment`]):
/// a range of `(voucher_id, status, id)` that is already in id order, never a walk of
/// the primary key in id order that the optimizer may prefer for the `ORDER BY ... LIMIT`.
pub fn awaiting_payment_sql() -> String {
    format!(
        "SELECT id, {USER_ID_TEXT}, pay_by FROM orders FORCE INDEX (orders_by_voucher_status) \
         WHERE voucher_id = :v AND status = 'awaiting_payment' AND id > :after \
         ORDER BY id LIMIT {SNAPSHOT_PAGE_ROWS}"
    )
}

/// The voucher's orders counted by status ([`DataApi::order_status_counts`]), from the
/// one index that covers the query (the live view asks every second).
pub const ORDER_STATUS_COUNTS: &str = "SELECT status, COUNT(*) FROM orders \
    FORCE INDEX (orders_by_voucher_status) WHERE voucher_id = :v GROUP BY status";

/// The orders of voucher `:v` among `:ids` (a JSON array of ids) that the database
/// holds, with their status ([`DataApi::order_statuses`]): each found through the
/// primary key from the parameter, whatever the table's statistics say.
pub const ORDER_STATUSES: &str = "SELECT o.id, o.status FROM JSON_TABLE(:ids, '$[*]' COLUMNS (\
    id BIGINT UNSIGNED PATH '$' ERROR ON EMPTY)) AS j \
    STRAIGHT_JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = j.id \
    WHERE o.voucher_id = :v";

/// Orders per [`ORDER_STATUSES`] statement: a JSON parameter well within the Data API's
/// request limit.
pub const ORDER_STATUSES_PER_CALL: usize = 1_000;

impl DataApi {
    /// Which of `orders` (of `voucher`) the database holds, and in which status; an
    /// order it does not hold is not in the map.
    pub async fn order_statuses(
        &self,
        voucher: VoucherId,
        orders: &[OrderId],
    ) -> Result<HashMap<OrderId, OrderStatus>, StoreError> {
        let mut found = HashMap::new();
        for chunk in orders.chunks(ORDER_STATUSES_PER_CALL) {
            let ids: Vec<i64> = chunk.iter().map(|o| o.get()).collect();
            let ids = serde_json::to_string(&ids).expect("ids serialise");
            let out = self
                .execute(
                    ORDER_STATUSES,
                    vec![param::string("ids", &ids), param::long("v", voucher.get())],
                    None,
                )
                .await?;
            for row in out.records() {
                let bad = || StoreError::Corrupt("order statuses: unexpected row".into());
                let [id, status] = row.as_slice() else {
                    return Err(bad());
                };
                found.insert(
                    field::long(id).and_then(OrderId::new).ok_or_else(bad)?,
                    parse_status(status).ok_or_else(bad)?,
                );
            }
        }
        Ok(found)
    }

    /// The order `user` holds for `voucher` in the database: (order id, status, payment
    /// deadline). The one still counting when the buyer also has closed ones (a voucher
    /// that allows buying again), else their latest.
    pub async fn order_of_buyer(
        &self,
        voucher: VoucherId,
        user: &UserId,
    ) -> Result<Option<(OrderId, OrderStatus, Option<UnixMillis>)>, StoreError> {
        let out = self
            .execute(
                ORDER_OF_BUYER,
                vec![
                    param::long("v", voucher.get()),
                    param::string("u", user.as_str()),
                ],
                None,
            )
            .await?;
        let Some(row) = out.records().first() else {
            return Ok(None);
        };
        let bad = || {
            StoreError::Corrupt(format!(
                "order of {user} for voucher {voucher} has an unexpected shape"
            ))
        };
        let [id, status, pay_by] = row.as_slice() else {
            return Err(bad());
        };
        let id = field::long(id).and_then(OrderId::new).ok_or_else(bad)?;
        let status = parse_status(status).ok_or_else(bad)?;
        Ok(Some((id, status, field::datetime(pay_by))))
    }

    /// An order as the database has it: (voucher, buyer, status, payment deadline).
    pub async fn order(
        &self,
        id: OrderId,
    ) -> Result<Option<(VoucherId, UserId, OrderStatus, Option<UnixMillis>)>, StoreError> {
        let out = self
            .execute(
                &format!(
                    "SELECT voucher_id, {USER_ID_TEXT}, status, pay_by FROM orders WHERE id = :id"
                ),
                vec![param::long("id", id.get())],
                None,
            )
            .await?;
        let Some(row) = out.records().first() else {
            return Ok(None);
        };
        let bad = || StoreError::Corrupt(format!("orders row {id} has an unexpected shape"));
        let [voucher, user, status, pay_by] = row.as_slice() else {
            return Err(bad());
        };
        let voucher = field::long(voucher)
            .and_then(VoucherId::new)
            .ok_or_else(bad)?;
        let user = field::string(user)
            .and_then(|u| UserId::parse(&u).ok())
            .ok_or_else(bad)?;
        let status = parse_status(status).ok_or_else(bad)?;
        Ok(Some((voucher, user, status, field::datetime(pay_by))))
    }

    /// The payment reference recorded with a paid order.
    pub async fn payment_ref(&self, id: OrderId) -> Result<Option<String>, StoreError> {
        self.first_string(
            "SELECT pay_ref FROM orders WHERE id = :id",
            vec![param::long("id", id.get())],
        )
        .await
    }

    /// A page of the voucher's orders waiting for payment, after order id `after` (0 for
    /// the first): (order, buyer, deadline), at most [`SNAPSHOT_PAGE_ROWS`].
    pub async fn awaiting_payment(
        &self,
        voucher: VoucherId,
        after: i64,
    ) -> Result<Vec<(OrderId, String, UnixMillis)>, StoreError> {
        let out = self
            .execute(
                &awaiting_payment_sql(),
                vec![param::long("v", voucher.get()), param::long("after", after)],
                None,
            )
            .await?;
        let bad = || StoreError::Corrupt("awaiting_payment page: unexpected row".into());
        out.records()
            .iter()
            .map(|row| match row.as_slice() {
                [id, user, pay_by] => Ok((
                    field::long(id).and_then(OrderId::new).ok_or_else(bad)?,
                    field::string(user).ok_or_else(bad)?,
                    field::datetime(pay_by).ok_or_else(bad)?,
                )),
                _ => Err(bad()),
            })
            .collect()
    }

    /// How many orders of the voucher the database holds: (holding a unit, rejected).
    /// Holding: `confirmed`, `awaiting_payment` and `paid`; a cancelled or expired order
    /// gave its unit back and counts in neither.
    pub async fn order_counts(&self, voucher: VoucherId) -> Result<(u64, u64), StoreError> {
        let counts = self.order_status_counts(voucher).await?;
        let of = |st: OrderStatus| counts.get(&st).copied().unwrap_or(0);
        Ok((
            of(OrderStatus::Confirmed) + of(OrderStatus::AwaitingPayment) + of(OrderStatus::Paid),
            of(OrderStatus::Rejected),
        ))
    }

    /// How many orders of the voucher the database holds in each status.
    pub async fn order_status_counts(
        &self,
        voucher: VoucherId,
    ) -> Result<HashMap<OrderStatus, u64>, StoreError> {
        let out = self
            .execute(
                ORDER_STATUS_COUNTS,
                vec![param::long("v", voucher.get())],
                None,
            )
            .await?;
        let mut counts = HashMap::new();
        for row in out.records() {
            let [status, n] = row.as_slice() else {
                return Err(StoreError::Corrupt("order counts: unexpected row".into()));
            };
            let n = field::long(n)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(0);
            if let Some(status) = parse_status(status) {
                counts.insert(status, n);
            }
        }
        Ok(counts)
    }
}

fn parse_status(f: &Field) -> Option<OrderStatus> {
    field::string(f)
        .as_deref()
        .and_then(OrderStatus::parse)
        .filter(|s| *s != OrderStatus::Pending)
}

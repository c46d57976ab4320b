//! The order ledger: the statements the order drainer runs against the database, through
//! the RDS Data API, inside one transaction per batch.
//!
//! The transaction ([`LedgerTx`]) is a sequence the drainer drives step by step (so it
//! can decide between steps and crash tests can cut between them):
//! [`lock_voucher`](LedgerTx::lock_voucher) (`SELECT ... FOR UPDATE NOWAIT`, which
//! serialises concurrent drainers of one voucher and never waits behind a lock), [`existing_orders`](LedgerTx::existing_orders),
//! [`insert_orders`](LedgerTx::insert_orders), [`take_stock`](LedgerTx::take_stock),
//! [`commit`](LedgerTx::commit); for vouchers with a payment step,
//! [`rows_of`](LedgerTx::rows_of) and [`settle`](LedgerTx::settle) before the insert.
//!
//! Invariants kept here:
//! - counts are exact: inserts are `INSERT IGNORE ... SELECT` over `JSON_TABLE` (one JSON
//!   parameter holds a chunk's rows) through ExecuteStatement,
//!   whose `numberOfRecordsUpdated` is the number of rows inserted (BatchExecuteStatement
//!   reports no counts);
//! - the stock decrement is guarded (`stock_left >= n`) and reports whether it applied;
//! - every statement stays under the Data API limits (SQL ≤ 65,536 characters, request
//!   ≤ 4 MiB, response ≤ 1 MiB): lists are chunked at [`MAX_ROWS_PER_STATEMENT`];
//! - every value is a named parameter, never spliced into SQL.
//!
//! The statements' text and parameters are all in [`sql`]; this module runs them.

pub mod sql;

use std::collections::HashMap;

use self::sql::MAX_ROWS_PER_STATEMENT;
use super::data_api::{DataApi, field, param};
use crate::domain::{
    AdmittedOrder, ClosedOrder, ExistingOrder, OrderId, OrderStatus, UnixMillis, UserId, VoucherId,
};
use crate::error::StoreError;

/// The ledger of orders, over one Data API client.
#[derive(Clone, Debug)]
pub struct Ledger {
    api: DataApi,
}

impl Ledger {
    pub fn new(api: DataApi) -> Ledger {
        Ledger { api }
    }

    /// The Data API client (for the run's work beside orders: refunds).
    pub fn api(&self) -> &DataApi {
        &self.api
    }

    /// Begins a batch transaction. The caller must [`commit`](LedgerTx::commit) or
    /// [`rollback`](LedgerTx::rollback) it (the server rolls back an abandoned one after
    /// 3 idle minutes, holding its locks until then).
    pub async fn begin(&self) -> Result<LedgerTx<'_>, StoreError> {
        let id = self.api.begin().await?;
        Ok(LedgerTx { api: &self.api, id })
    }

    /// Rolls back a transaction this client did not begin (one a killed drainer left
    /// open, holding its row locks until the server's 3-minute expiry). `Ok(false)` when
    /// it had already ended.
    pub async fn abort_abandoned(&self, transaction: &str) -> Result<bool, StoreError> {
        self.api.try_rollback(transaction).await
    }

    /// When voucher `id`'s sale ends, as the database has it, and whether any of its
    /// orders still awaits payment there; `None` when it has no such voucher. (For a sale
    /// Redis holds no sale hash of, whose deadlines Redis may have lost with it: see the
    /// drainer's retirement.)
    pub async fn sale_end(&self, id: VoucherId) -> Result<Option<SaleEnd>, StoreError> {
        let out = self
            .api
            .execute(sql::SALE_END, vec![param::long("v", id.get())], None)
            .await?;
        let Some(row) = out.records().first() else {
            return Ok(None);
        };
        let bad = || StoreError::Corrupt(format!("voucher {id}'s end reads {row:?}"));
        let [ends, unpaid, buckets] = row.as_slice() else {
            return Err(bad());
        };
        Ok(Some(SaleEnd {
            ends_ms: field::datetime(ends).ok_or_else(bad)?,
            unpaid: field::long(unpaid).ok_or_else(bad)? != 0,
            buckets: field::long(buckets)
                .and_then(|k| u16::try_from(k).ok())
                .filter(|k| (1..=crate::domain::MAX_BUCKETS).contains(k))
                .ok_or_else(bad)?,
        }))
    }

    /// A page of voucher `id`'s orders awaiting payment after order `after` (id order):
    /// (order, buyer, deadline).
    pub async fn awaiting_payment(
        &self,
        id: VoucherId,
        after: i64,
    ) -> Result<Vec<(OrderId, String, UnixMillis)>, StoreError> {
        self.api.awaiting_payment(id, after).await
    }

    /// Whether the `orders` table accepts an ordinary row: inserts a made-up `rejected`
    /// order (a fresh id near the top of the range, a user id no buyer has) in a
    /// transaction and rolls it back, so nothing stays. The drainer asks this before it
    /// blames one order for a refusal: when the database refuses this row too, the fault
    /// is the database's (schema, rights, a trigger), not the order's.
    pub async fn accepts_an_ordinary_row(&self, voucher: VoucherId) -> Result<bool, StoreError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let probe = AdmittedOrder {
            id: OrderId::new(i64::MAX - i64::from(nanos)).expect("positive"),
            voucher,
            user: UserId::parse("seckill-canary").expect("a valid user id"),
            admitted_ms: crate::domain::now_millis(),
        };
        let tx = self.begin().await?;
        let (sql, params) = sql::insert_orders(&[probe], OrderStatus::Rejected, Some("canary"));
        let outcome = self.api.execute(&sql, params, Some(&tx.id)).await;
        tx.rollback().await;
        match outcome {
            Ok(_) => Ok(true),
            Err(StoreError::Database(detail)) => {
                tracing::warn!(%voucher, detail, "the orders table refuses an ordinary row");
                Ok(false)
            }
            Err(other) => Err(other),
        }
    }

    /// Records orders as `rejected` with `reason`, outside any batch transaction and
    /// idempotently (`INSERT IGNORE`: an order already in the database, confirmed or not,
    /// is left as it is). Returns the rows inserted.
    pub async fn record_rejected(
        &self,
        orders: &[AdmittedOrder],
        reason: &str,
    ) -> Result<u64, StoreError> {
        let mut inserted = 0;
        for chunk in orders.chunks(MAX_ROWS_PER_STATEMENT) {
            inserted +=
                insert_chunk(&self.api, None, chunk, OrderStatus::Rejected, Some(reason)).await?;
        }
        Ok(inserted)
    }
}

/// Closes one transaction records at most (ten statements' worth): a backlog after a
/// mass expiry is settled over several transactions, each well within a run.
pub const SETTLE_PER_TRANSACTION: usize = 10 * MAX_ROWS_PER_STATEMENT;

/// A sale's end as the database has it ([`Ledger::sale_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleEnd {
    pub ends_ms: UnixMillis,
    /// Some order of the voucher still awaits payment.
    pub unpaid: bool,
    /// How many stock buckets the voucher's stock is split over.
    pub buckets: u16,
}

/// The voucher row as a batch transaction locked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedVoucher {
    pub stock_left: i64,
    /// The payment window; `None` for a voucher whose orders end `confirmed`.
    pub pay_within_ms: Option<i64>,
    /// How many stock buckets the voucher's stock is split over in Redis.
    pub buckets: u16,
}

/// One open batch transaction.
#[derive(Debug)]
pub struct LedgerTx<'a> {
    api: &'a DataApi,
    id: String,
}

impl LedgerTx<'_> {
    /// The Data API transaction id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Locks the voucher row and reads its database stock; `None` when the voucher does
    /// not exist. Holding this lock until commit makes batches of one voucher serial.
    ///
    /// `NOWAIT`: when another transaction holds the row, fail at once (a transient
    /// "lock wait" error) instead of waiting up to `innodb_lock_wait_timeout` (50 s).
    /// The holder may be a killed drainer's transaction, which the Data API keeps open
    /// for 3 minutes; the caller decides whether to wait a little or to roll it back.
    pub async fn lock_voucher(
        &self,
        voucher: VoucherId,
    ) -> Result<Option<LockedVoucher>, StoreError> {
        let out = self
            .api
            .execute(
                sql::LOCK_VOUCHER,
                sql::lock_voucher(voucher),
                Some(&self.id),
            )
            .await?;
        match out.records().first().map(|r| r.as_slice()) {
            None => Ok(None),
            Some([left, pay_within, buckets]) => {
                let stock_left = field::long(left).ok_or_else(|| {
                    StoreError::Corrupt(format!("stock_left of voucher {voucher} is not a number"))
                })?;
                let buckets = field::long(buckets)
                    .and_then(|k| u16::try_from(k).ok())
                    .filter(|k| (1..=crate::domain::MAX_BUCKETS).contains(k))
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!("buckets of voucher {voucher} out of range"))
                    })?;
                Ok(Some(LockedVoucher {
                    stock_left,
                    pay_within_ms: field::long(pay_within),
                    buckets,
                }))
            }
            Some(_) => Err(StoreError::Corrupt(
                "SELECT stock_left returned an unexpected shape".into(),
            )),
        }
    }

    /// Locks the rows of several distinct vouchers at once (in the order of `ids`: pass
    /// them sorted; `NOWAIT`, like [`lock_voucher`](Self::lock_voucher)) and reads each
    /// one's stock, payment window and buckets, in no promised order. Vouchers the
    /// database does not have are missing from the answer.
    /// At most [`sql::MAX_VOUCHERS_PER_STATEMENT`] ids.
    pub async fn lock_vouchers(
        &self,
        ids: &[VoucherId],
    ) -> Result<Vec<(VoucherId, LockedVoucher)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (statement, params) = sql::lock_vouchers(ids);
        let out = self.api.execute(&statement, params, Some(&self.id)).await?;
        let bad = || StoreError::Corrupt("locking vouchers returned an unexpected row".into());
        let mut locked = Vec::with_capacity(ids.len());
        for row in out.records() {
            let [id, left, pay_within, buckets] = row.as_slice() else {
                return Err(bad());
            };
            let id = field::long(id).and_then(VoucherId::new).ok_or_else(bad)?;
            let buckets = field::long(buckets)
                .and_then(|k| u16::try_from(k).ok())
                .filter(|k| (1..=crate::domain::MAX_BUCKETS).contains(k))
                .ok_or_else(bad)?;
            locked.push((
                id,
                LockedVoucher {
                    stock_left: field::long(left).ok_or_else(bad)?,
                    pay_within_ms: field::long(pay_within),
                    buckets,
                },
            ));
        }
        Ok(locked)
    }

    /// Marks `refund_due` the payments a lost paid close left `paid` among the orders
    /// `ids` (a JSON array) of `voucher` whose close was just recorded: found with a
    /// plain read ([`sql::PAID_CLOSED_AGAIN`]), then updated through their primary key.
    async fn refund_paid_closed_again(
        &self,
        voucher: VoucherId,
        ids: &str,
    ) -> Result<(), StoreError> {
        let out = self
            .api
            .execute(
                sql::PAID_CLOSED_AGAIN,
                vec![param::string("ids", ids), param::long("v", voucher.get())],
                Some(&self.id),
            )
            .await?;
        let mut refunds: Vec<(String, &str)> = Vec::new();
        for row in out.records() {
            let [id, paid] = row.as_slice() else {
                return Err(StoreError::Corrupt(format!("a paid payment reads {row:?}")));
            };
            let id = field::string(id)
                .ok_or_else(|| StoreError::Corrupt(format!("a payment id reads {id:?}")))?;
            let reason = match field::long(paid) {
                Some(0) => sql::CLOSED_PAID_REASON,
                _ => sql::PAID_TWICE_REASON,
            };
            refunds.push((id, reason));
        }
        if !refunds.is_empty() {
            let rows: Vec<(&str, &str)> = refunds.iter().map(|(i, r)| (i.as_str(), *r)).collect();
            let (sql, params) = sql::refund_payments(&rows);
            let out = self.api.execute(&sql, params, Some(&self.id)).await?;
            tracing::warn!(%voucher, refunds = out.number_of_records_updated(), "orders closed again after a paid close Redis lost: payments due for refund");
        }
        Ok(())
    }

    /// Takes `n` units of each voucher's database stock where it has them, in one
    /// statement; returns how many vouchers' rows were updated (all of them unless a
    /// guard refused). At most [`sql::MAX_VOUCHERS_PER_STATEMENT`] vouchers.
    pub async fn take_stocks(&self, takes: &[(VoucherId, i64)]) -> Result<u64, StoreError> {
        if takes.is_empty() {
            return Ok(0);
        }
        let (statement, params) = sql::take_stocks(takes);
        let out = self.api.execute(&statement, params, Some(&self.id)).await?;
        Ok(out.number_of_records_updated() as u64)
    }

    /// Records the closes Redis decided for orders of `voucher` (at most
    /// [`SETTLE_PER_TRANSACTION`] of them: the caller passes no more; see
    /// [`sql::settle_closes`]) and gives their units back to the database stock. Returns
    /// the units given back and the orders whose close the database now holds (the
    /// others have no row yet: their batch has not been drained).
    pub async fn settle(
        &self,
        voucher: VoucherId,
        closes: &[(OrderId, ClosedOrder)],
    ) -> Result<(u64, Vec<OrderId>), StoreError> {
        let mut returned = 0;
        let mut done = Vec::new();
        for chunk in closes.chunks(MAX_ROWS_PER_STATEMENT) {
            let pairs: Vec<(OrderId, &ClosedOrder)> = chunk.iter().map(|(i, c)| (*i, c)).collect();
            for gives_back in [false, true] {
                if !pairs
                    .iter()
                    .any(|(_, c)| c.status.returned_unit() == gives_back)
                {
                    continue;
                }
                let (sql, params) = sql::settle_closes(voucher, &pairs, gives_back);
                let out = self.api.execute(&sql, params, Some(&self.id)).await?;
                if gives_back {
                    returned += u64::try_from(out.number_of_records_updated()).unwrap_or(0);
                }
            }
            // A payment recorded paid whose paid close Redis lost: the order expired,
            // was cancelled or was paid again since.
            let ids: Vec<i64> = chunk.iter().map(|(i, _)| i.get()).collect();
            let ids = serde_json::to_string(&ids).expect("ids serialise");
            self.refund_paid_closed_again(voucher, &ids).await?;
            // A paid order the database holds rejected: the money is to be refunded.
            let paid: Vec<(OrderId, &str)> = chunk
                .iter()
                .filter(|(_, c)| c.status == OrderStatus::Paid && !c.payment_ref.is_empty())
                .map(|(i, c)| (*i, c.payment_ref.as_str()))
                .collect();
            if !paid.is_empty() {
                let (sql, params) = sql::refund_rejected_paid(voucher, &paid);
                let out = self.api.execute(&sql, params, Some(&self.id)).await?;
                let refunds = out.number_of_records_updated();
                if refunds > 0 {
                    tracing::warn!(%voucher, refunds, "paid orders the database rejected: payments due for refund");
                }
            }
            let out = self
                .api
                .execute(
                    sql::SETTLED_ORDERS,
                    vec![param::string("rows", &ids), param::long("v", voucher.get())],
                    Some(&self.id),
                )
                .await?;
            done.extend(
                out.records()
                    .iter()
                    .filter_map(|r| r.first().and_then(field::long).and_then(OrderId::new)),
            );
        }
        if returned > 0 {
            let n = i64::try_from(returned).unwrap_or(i64::MAX);
            self.api
                .execute(
                    sql::RETURN_STOCK,
                    vec![param::long("n", n), param::long("v", voucher.get())],
                    Some(&self.id),
                )
                .await?;
        }
        Ok((returned, done))
    }

    /// Which of the orders `ids` of `voucher` have a row, and whether it still awaits
    /// payment (see [`sql::ORDER_ROWS`]); orders without a row are missing from the
    /// answer. In statements of [`sql::IDS_PER_ROW_LOOKUP`] ids.
    pub async fn rows_of(
        &self,
        voucher: VoucherId,
        ids: &[OrderId],
    ) -> Result<HashMap<OrderId, bool>, StoreError> {
        let mut rows = HashMap::new();
        for chunk in ids.chunks(sql::IDS_PER_ROW_LOOKUP) {
            let ids: Vec<i64> = chunk.iter().map(|i| i.get()).collect();
            let ids = serde_json::to_string(&ids).expect("ids serialise");
            let out = self
                .api
                .execute(
                    sql::ORDER_ROWS,
                    vec![param::string("ids", &ids), param::long("v", voucher.get())],
                    Some(&self.id),
                )
                .await?;
            for row in out.records() {
                let bad = || StoreError::Corrupt(format!("an order's row reads {row:?}"));
                let [id, awaiting] = row.as_slice() else {
                    return Err(bad());
                };
                let id = field::long(id).and_then(OrderId::new).ok_or_else(bad)?;
                rows.insert(id, field::long(awaiting).ok_or_else(bad)? != 0);
            }
        }
        Ok(rows)
    }

    /// Inserts orders of a voucher with a payment step, each with its own status,
    /// `INSERT IGNORE`, in chunks; returns the rows actually inserted.
    pub async fn insert_payment_orders(
        &self,
        rows: &[sql::PaymentRow<'_>],
    ) -> Result<u64, StoreError> {
        let mut inserted = 0;
        for chunk in rows.chunks(MAX_ROWS_PER_STATEMENT) {
            let (sql, params) = sql::insert_payment_orders(chunk);
            let out = self.api.execute(&sql, params, Some(&self.id)).await?;
            inserted += u64::try_from(out.number_of_records_updated()).unwrap_or(0);
        }
        Ok(inserted)
    }

    /// The existing orders that collide with `orders`: same id, or same buyer of
    /// `voucher`.
    pub async fn existing_orders(
        &self,
        voucher: VoucherId,
        orders: &[AdmittedOrder],
    ) -> Result<Vec<ExistingOrder>, StoreError> {
        let mut found = Vec::new();
        for chunk in orders.chunks(MAX_ROWS_PER_STATEMENT) {
            let (sql, params) = sql::existing_orders(voucher, chunk);
            let out = self.api.execute(&sql, params, Some(&self.id)).await?;
            for row in out.records() {
                let bad = || StoreError::Corrupt("orders lookup returned an unexpected row".into());
                let [id, v, user, live] = row.as_slice() else {
                    return Err(bad());
                };
                found.push(ExistingOrder {
                    id: field::long(id).and_then(OrderId::new).ok_or_else(bad)?,
                    voucher: field::long(v).and_then(VoucherId::new).ok_or_else(bad)?,
                    user: field::string(user).ok_or_else(bad)?,
                    live: field::long(live).ok_or_else(bad)? != 0,
                });
            }
        }
        // A row can match two chunks (by id in one, by buyer in another).
        found.sort_by_key(|e| e.id);
        found.dedup_by_key(|e| e.id);
        Ok(found)
    }

    /// Inserts `orders` with `status` (and `reason`), `INSERT IGNORE`, in chunks; returns
    /// the number of rows actually inserted (the caller compares it with what it
    /// expected: fewer means a concurrent writer got there first).
    pub async fn insert_orders(
        &self,
        orders: &[AdmittedOrder],
        status: OrderStatus,
        reason: Option<&str>,
    ) -> Result<u64, StoreError> {
        let mut inserted = 0;
        for chunk in orders.chunks(MAX_ROWS_PER_STATEMENT) {
            inserted += insert_chunk(self.api, Some(&self.id), chunk, status, reason).await?;
        }
        Ok(inserted)
    }

    /// Takes `n` units of the voucher's database stock if it has them; false when the
    /// guard refused (the stock moved since [`lock_voucher`](Self::lock_voucher), which
    /// the lock should make impossible).
    pub async fn take_stock(&self, voucher: VoucherId, n: i64) -> Result<bool, StoreError> {
        let out = self
            .api
            .execute(sql::TAKE_STOCK, sql::take_stock(voucher, n), Some(&self.id))
            .await?;
        Ok(out.number_of_records_updated() == 1)
    }

    pub async fn commit(&self) -> Result<(), StoreError> {
        self.api.commit(&self.id).await
    }

    /// Rolls back and says how it went: `Ok(true)` rolled back, `Ok(false)` the server
    /// no longer knew it; an error when the server may still hold it open.
    pub async fn try_rollback(&self) -> Result<bool, StoreError> {
        self.api.try_rollback(&self.id).await
    }

    /// Rolls back; failures are logged only (the server rolls back on its own).
    pub async fn rollback(self) {
        self.api.rollback(&self.id).await
    }
}

async fn insert_chunk(
    api: &DataApi,
    transaction: Option<&str>,
    chunk: &[AdmittedOrder],
    status: OrderStatus,
    reason: Option<&str>,
) -> Result<u64, StoreError> {
    if chunk.is_empty() {
        return Ok(0);
    }
    let (sql, params) = sql::insert_orders(chunk, status, reason);
    let out = api.execute(&sql, params, transaction).await?;
    u64::try_from(out.number_of_records_updated()).map_err(|_| {
        StoreError::Corrupt(format!(
            "INSERT reported {} rows",
            out.number_of_records_updated()
        ))
    })
}

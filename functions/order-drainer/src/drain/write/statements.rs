//! The statements of one attempt at a batch transaction, between its begin and its
//! commit: lock the voucher row (`NOWAIT`), record the closes Redis decided (vouchers
//! with a payment step; which ones, [`settle`](super::settle)), look up colliding rows
//! when asked, [`plan::split`], insert the `confirmed` and `rejected` rows with exact
//! counts, take the stock with a guard. What the attempt came to is an [`Attempt`];
//! beginning, committing and retrying are the caller's ([`write`](super)).

use std::collections::HashSet;

use seckill_shared::adapters::ledger::LedgerTx;
use seckill_shared::adapters::ledger::sql::PaymentRow;
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::domain::{AdmittedOrder, Bucket, ClosedOrder, OrderId, OrderStatus};
use seckill_shared::error::StoreError;

use super::settle::{self, Settled};
use crate::drain::run::Run;
use crate::error::DrainError;
use crate::failpoint;
use crate::plan::{self, DB_STOCK_EXHAUSTED, Split};

/// How one attempt at a batch transaction ended (before commit).
pub(super) enum Attempt {
    /// The batch's plan, and the closes settled in the same transaction (vouchers with a
    /// payment step).
    Planned(Split, Settled),
    UnknownVoucher,
    Raced(String),
    /// The voucher row is locked by another transaction.
    Locked(StoreError),
}

/// The statements of one attempt, up to (not including) the commit; without
/// `look_up`, planned as if no order of the batch were in the database yet.
pub(super) async fn plan_and_write(
    streams: &OrderStreams,
    run: &Run,
    tx: &LedgerTx<'_>,
    voucher: Bucket,
    orders: &[AdmittedOrder],
    look_up: bool,
) -> Result<Attempt, DrainError> {
    let db = |step, e| DrainError::store(step, Some(voucher), e);
    let locked = match tx.lock_voucher(voucher.voucher()).await {
        Ok(Some(locked)) => locked,
        Ok(None) => return Ok(Attempt::UnknownVoucher),
        Err(e @ StoreError::Locked { .. }) => return Ok(Attempt::Locked(e)),
        Err(e) => return Err(db("locking the voucher", e)),
    };
    failpoint::hit("after_lock");
    let mut stock_left = locked.stock_left;
    // Vouchers with a payment step: first record the closes Redis decided so far, in
    // every bucket of the voucher, under this row lock, so that a unit given back in
    // Redis and sold again (in its own bucket, or in another by borrowing) is back in
    // the database before its new order is written (else the database stock would
    // refuse the new order), and a buyer who closed an order and bought again holds it
    // no more. Then learn which orders of the batch are closed.
    let (settled, closes) = match locked.pay_within_ms {
        None => (Settled::default(), Vec::new()),
        Some(_) => {
            let settled = settle::settle(streams, tx, voucher, locked.buckets, orders).await?;
            stock_left += i64::try_from(settled.returned).unwrap_or(0);
            let ids: Vec<OrderId> = orders.iter().map(|o| o.id).collect();
            let closes = streams
                .closed_orders(voucher, &ids)
                .await
                .map_err(|e| db("reading closed orders", e))?;
            (settled, closes)
        }
    };
    let existing = if look_up {
        tx.existing_orders(voucher.voucher(), orders)
            .await
            .map_err(|e| db("looking up existing orders", e))?
    } else {
        Vec::new()
    };
    let gave_back: HashSet<OrderId> = orders
        .iter()
        .zip(&closes)
        .filter(|(_, c)| c.as_ref().is_some_and(|c| c.status.returned_unit()))
        .map(|(o, _)| o.id)
        .collect();
    let split = plan::split(voucher.voucher(), orders, &existing, stock_left, &gave_back);
    // The row is held and Redis is not needed before the insert: the next batch may
    // be read now, while the database writes this one.
    run.open_read_ahead(voucher);

    if let Some(pay_within_ms) = locked.pay_within_ms
        && let Some(raced) =
            write_payment_rows(streams, tx, voucher, orders, &split, &closes, pay_within_ms).await?
    {
        return Ok(Attempt::Raced(raced));
    }
    let confirmed = if locked.pay_within_ms.is_some() {
        &[][..]
    } else {
        &split.confirmed[..]
    };
    for (indexes, status, reason) in [
        (confirmed, OrderStatus::Confirmed, None),
        (
            &split.rejected[..],
            OrderStatus::Rejected,
            Some(DB_STOCK_EXHAUSTED),
        ),
    ] {
        if indexes.is_empty() {
            continue;
        }
        let rows: Vec<AdmittedOrder> = indexes.iter().map(|&i| orders[i].clone()).collect();
        let inserted = tx
            .insert_orders(&rows, status, reason)
            .await
            .map_err(|e| db("inserting orders", e))?;
        failpoint::hit("after_insert");
        if inserted != rows.len() as u64 {
            return Ok(Attempt::Raced(format!(
                "{inserted} of {} {} rows inserted",
                rows.len(),
                status.as_str()
            )));
        }
        if status == OrderStatus::Rejected && locked.pay_within_ms.is_some() {
            // A rejected order holds no unit in the database: it must not expire and
            // give Redis one back (were this attempt rolled back and the order
            // written awaiting payment after all, its deadline is restored then).
            let gone: Vec<_> = rows.iter().map(|o| (o.id, o.user.as_str())).collect();
            streams
                .drop_deadlines(voucher, &gone)
                .await
                .map_err(|e| db("dropping deadlines", e))?;
        }
    }
    let take = split.confirmed.len() as i64;
    if take > 0 {
        let taken = tx
            .take_stock(voucher.voucher(), take)
            .await
            .map_err(|e| db("taking stock", e))?;
        if !taken {
            return Ok(Attempt::Raced(format!("stock guard refused {take} units")));
        }
        failpoint::hit("after_stock_update");
    }
    Ok(Attempt::Planned(split, settled))
}

/// Writes the orders of a voucher with a payment step the plan covers: `confirmed`
/// ones wait for payment (or are paid already), `closed` ones as Redis closed them;
/// then restores their deadlines in case Redis lost them. `Some(detail)` when the
/// row count differs from the plan.
async fn write_payment_rows(
    streams: &OrderStreams,
    tx: &LedgerTx<'_>,
    voucher: Bucket,
    orders: &[AdmittedOrder],
    split: &Split,
    closes: &[Option<ClosedOrder>],
    pay_within_ms: i64,
) -> Result<Option<String>, DrainError> {
    let rows: Vec<PaymentRow<'_>> = split
        .confirmed
        .iter()
        .chain(&split.closed)
        .map(|&i| {
            let closed = closes.get(i).and_then(Option::as_ref);
            PaymentRow {
                order: &orders[i],
                status: closed.map_or(OrderStatus::AwaitingPayment, |c| c.status),
                pay_by_ms: orders[i].admitted_ms + pay_within_ms,
                payment_ref: closed
                    .filter(|c| c.status == OrderStatus::Paid)
                    .map(|c| c.payment_ref.as_str()),
            }
        })
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let err = |step, e| DrainError::store(step, Some(voucher), e);
    let inserted = tx
        .insert_payment_orders(&rows)
        .await
        .map_err(|e| err("inserting orders", e))?;
    failpoint::hit("after_insert");
    if inserted != rows.len() as u64 {
        return Ok(Some(format!(
            "{inserted} of {} payment rows inserted",
            rows.len()
        )));
    }
    // The admission wrote these deadlines; if Redis lost them since, the orders would
    // never expire. Restoring them is harmless otherwise.
    let open: Vec<_> = rows
        .iter()
        .filter(|r| r.status == OrderStatus::AwaitingPayment)
        .map(|r| (r.order.id, r.order.user.as_str(), r.pay_by_ms))
        .collect();
    streams
        .restore_deadlines(voucher, &open)
        .await
        .map_err(|e| err("restoring deadlines", e))?;
    Ok(None)
}

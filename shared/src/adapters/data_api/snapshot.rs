//! A consistent read of one voucher's sale: its row, then every buyer's order as of the
//! same instant, page by page ([`DataApi::sale_snapshot`], [`SaleSnapshot`]), folded
//! into the one order per buyer the buyers hash holds ([`BuyerRows`]).
//!
//! Invariants kept here: the read is one read-only transaction, so a drainer committing
//! meanwhile changes neither the stock nor the orders it reports, and it is ended by a
//! rollback, never a commit; a page reads at most [`SNAPSHOT_PAGE_ROWS`] + 1 rows of
//! one index range, whatever the table's statistics say.

use std::collections::HashSet;

use super::client::DataApi;
use super::values::{USER_ID_TEXT, field, param};
use crate::domain::{OrderId, Voucher, VoucherId};
use crate::error::StoreError;

impl DataApi {
    /// Opens a consistent read of one voucher's sale: its row (with `stock_left`) now,
    /// and then, page by page ([`SaleSnapshot::next_page`]), every order of it as of the
    /// same instant. `None` when the voucher does not exist.
    ///
    /// It is one read-only transaction (InnoDB's REPEATABLE READ: every read sees the
    /// snapshot taken at the first), so a drainer committing meanwhile changes neither
    /// the stock nor the orders it reports. Plain reads take no locks.
    pub async fn sale_snapshot(
        &self,
        id: VoucherId,
    ) -> Result<Option<(Voucher, SaleSnapshot<'_>)>, StoreError> {
        self.sale_snapshot_after(id, None).await
    }

    /// [`Self::sale_snapshot`], its orders starting after the buyer `after` (every
    /// order of that buyer and of those before it left out): the rest of a read that an
    /// earlier snapshot began and stopped after `after` ([`SaleSnapshot::read_through`]).
    /// The voucher row and the orders are then as of this snapshot's instant.
    pub async fn sale_snapshot_after(
        &self,
        id: VoucherId,
        after: Option<&str>,
    ) -> Result<Option<(Voucher, SaleSnapshot<'_>)>, StoreError> {
        // (buyer, i64::MAX): no order id is larger, so the page query's
        // `user_id = :u AND id > :id` matches none of that buyer's rows.
        let start = match after {
            Some(user) => (user.to_string(), i64::MAX),
            None => (String::new(), 0),
        };
        let transaction = self.begin().await?;
        match self.voucher_in(id, Some(&transaction)).await {
            Ok(Some(v)) => {
                let rebuy = v.payment.map_or(0, |p| p.rebuys());
                Ok(Some((
                    v,
                    SaleSnapshot {
                        api: self,
                        transaction,
                        voucher: id,
                        buyers: BuyerRows::new(rebuy),
                        after: Some(start),
                        rows: 0,
                        rejected: HashSet::new(),
                    },
                )))
            }
            Ok(None) => {
                self.rollback(&transaction).await;
                Ok(None)
            }
            Err(e) => {
                self.rollback(&transaction).await;
                Err(e)
            }
        }
    }
}

/// Rows per page of [`SaleSnapshot::next_page`]. A row of the response is a user id
/// (at most 64 bytes, at most 128 once JSON escapes quotes and backslashes), an order id
/// and two flags, with about 100 bytes of JSON around them: at most ~240 bytes, so a page
/// stays under ~480 KiB, well within the Data API's 1 MiB response limit.
pub const SNAPSHOT_PAGE_ROWS: usize = 2_000;

/// One page of a voucher's orders in buyer order, after the row (`:u`, `:id`): every
/// row a range of the `orders_by_buyer (voucher_id, user_id)` index (InnoDB appends the
/// primary key `id` to it) reads in index order, so a page examines at most
/// [`SNAPSHOT_PAGE_ROWS`] + 1 rows whatever the table's statistics say. No per-row
/// subquery: which of a buyer's orders counts is decided by [`BuyerRows`], in Rust.
/// `FORCE INDEX` because a table just written is planned from stale statistics, and a
/// plan that sorts instead would read every remaining row of the voucher per page.
pub fn snapshot_page_sql() -> String {
    format!(
        "SELECT {USER_ID_TEXT}, id, holder IS NOT NULL, status = 'rejected' \
         FROM orders FORCE INDEX (orders_by_buyer) \
         WHERE voucher_id = :v AND (user_id > :u OR (user_id = :u AND id > :id)) \
         ORDER BY user_id, id LIMIT {SNAPSHOT_PAGE_ROWS}"
    )
}

/// An open consistent read of one voucher's orders (see [`DataApi::sale_snapshot`]).
/// Call [`finish`](Self::finish) when done (the server would roll an abandoned one back
/// after 3 idle minutes).
#[derive(Debug)]
pub struct SaleSnapshot<'a> {
    api: &'a DataApi,
    transaction: String,
    voucher: VoucherId,
    /// Which of a buyer's orders count (the voucher's payment terms, read in the same
    /// transaction).
    buyers: BuyerRows,
    /// The last row read, (user id, order id): keyset pagination in index order; `None`
    /// once the last page was read.
    after: Option<(String, i64)>,
    /// Rows the page queries returned so far.
    rows: u64,
    /// The rejected orders read so far (few: the database's stock ran short): they hold
    /// their buyer (`holder` set) but took no unit of the database's stock. Kept over
    /// every page, since a buyer whose rows span two pages is returned with the second.
    rejected: HashSet<OrderId>,
}

/// Folds a voucher's order rows, read in (buyer, order id) order, into the one order per
/// buyer that the voucher's buyers hash holds: the buyer's order still holding a unit
/// (`holder` set: at most one per buyer, a unique key), else their latest; a buyer whose
/// orders are all closed (cancelled or expired) counts only when the voucher does not let
/// them buy again, or when they closed more than its rebuy limit (then they may not:
/// `lua/close.lua` frees a buyer for their first `limit` unpaid closes only). Rows of one buyer may span two pages: the last buyer of a page is
/// kept until a row of another buyer (or the end) shows that all of theirs were read.
#[derive(Debug, Default)]
pub struct BuyerRows {
    /// The voucher's rebuy limit (0: a buyer never buys again).
    rebuys: u8,
    /// The buyer being read: (user id, order that counts so far, it holds a unit).
    current: Option<(String, OrderId, bool)>,
    /// The current buyer's orders that hold no unit (closed, or rejected).
    closed: u32,
    /// The last buyer all of whose rows were read (counted or not).
    done_through: Option<String>,
}

impl BuyerRows {
    /// Folds for a voucher with this rebuy limit (0: a buyer never buys again).
    pub fn new(rebuys: u8) -> Self {
        Self {
            rebuys,
            current: None,
            closed: 0,
            done_through: None,
        }
    }

    /// Takes the next row; returns the buyer before it once this row is of another.
    pub fn push(&mut self, user: String, order: OrderId, holds: bool) -> Option<(String, OrderId)> {
        if let Some((u, best, best_holds)) = &mut self.current
            && *u == user
        {
            self.closed += u32::from(!holds);
            // Rows come in id order: a later closed order replaces an earlier closed
            // one, nothing replaces the holding one.
            if !*best_holds {
                *best = order;
                *best_holds = holds;
            }
            return None;
        }
        let closed = std::mem::replace(&mut self.closed, u32::from(!holds));
        let done = self.current.replace((user, order, holds));
        done.and_then(|d| self.completed(d, closed))
    }

    /// The last buyer, once every row was read.
    pub fn finish(&mut self) -> Option<(String, OrderId)> {
        let last = self.current.take();
        let closed = std::mem::take(&mut self.closed);
        last.and_then(|d| self.completed(d, closed))
    }

    /// The last buyer all of whose rows were read.
    pub fn done_through(&self) -> Option<&str> {
        self.done_through.as_deref()
    }

    fn completed(
        &mut self,
        done: (String, OrderId, bool),
        closed: u32,
    ) -> Option<(String, OrderId)> {
        self.done_through = Some(done.0.clone());
        let (user, order, holds) = done;
        (holds || self.rebuys == 0 || closed > u32::from(self.rebuys)).then_some((user, order))
    }
}

impl SaleSnapshot<'_> {
    /// The next page of (user id, order id) of the voucher's buyers, in user id order;
    /// `None` after the last. These are the buyers the voucher's buyers hash holds (see
    /// [`BuyerRows`]): one order per buyer, confirmed or rejected or awaiting payment
    /// (either way the buyer holds an order); a buyer with a cancelled or expired order
    /// and a new one is listed with the new one. A page holds at most
    /// about [`SNAPSHOT_PAGE_ROWS`] buyers.
    pub async fn next_page(&mut self) -> Result<Option<Vec<(String, OrderId)>>, StoreError> {
        let mut page = Vec::new();
        while let Some((after_user, after_id)) = self.after.take() {
            let out = self
                .api
                .execute(
                    &snapshot_page_sql(),
                    vec![
                        param::long("v", self.voucher.get()),
                        param::string("u", &after_user),
                        param::long("id", after_id),
                    ],
                    Some(&self.transaction),
                )
                .await?;
            let bad = || StoreError::Corrupt("orders page returned an unexpected row".into());
            let mut last = None;
            for row in out.records() {
                let [user, id, holds, rejected] = row.as_slice() else {
                    return Err(bad());
                };
                let user = field::string(user).ok_or_else(bad)?;
                let id = field::long(id).and_then(OrderId::new).ok_or_else(bad)?;
                let holds = field::long(holds).ok_or_else(bad)? != 0;
                if field::long(rejected).ok_or_else(bad)? != 0 {
                    self.rejected.insert(id);
                }
                last = Some((user.clone(), id.get()));
                page.extend(self.buyers.push(user, id, holds));
            }
            self.rows += out.records().len() as u64;
            if out.records().len() < SNAPSHOT_PAGE_ROWS {
                page.extend(self.buyers.finish());
            } else {
                self.after = last;
            }
            // A page that completed no buyer (one buyer's rows filled it) reads on.
            if !page.is_empty() {
                break;
            }
        }
        Ok(Some(page).filter(|p| !p.is_empty()))
    }

    /// Whether `order` (of a page returned) is rejected: it holds its buyer, but the
    /// database's stock never counted a unit for it.
    pub fn rejected(&self, order: OrderId) -> bool {
        self.rejected.contains(&order)
    }

    /// Rows the page queries returned so far (what the read cost the database: each
    /// page examines its rows plus one).
    pub fn rows_read(&self) -> u64 {
        self.rows
    }

    /// The last buyer whose orders were all read and returned by [`Self::next_page`]:
    /// a read stopped here goes on with [`DataApi::sale_snapshot_after`] this buyer,
    /// missing nobody and reading nobody twice. `None` before the first buyer.
    pub fn read_through(&self) -> Option<&str> {
        self.buyers.done_through()
    }

    /// Ends the read. It wrote nothing, so a rollback ends it as a commit would; and
    /// seckill-http, whose only transaction this is, is then not allowed to commit any
    /// (template.yaml grants it no rds-data:CommitTransaction).
    pub async fn finish(self) {
        if let Err(error) = self.api.try_rollback(&self.transaction).await {
            tracing::warn!(%error, "ending a read-only snapshot failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(rebuy: u8, rows: &[(&str, i64, bool)]) -> Vec<(String, i64)> {
        let mut f = BuyerRows::new(rebuy);
        let mut out: Vec<(String, OrderId)> = rows
            .iter()
            .filter_map(|(u, id, holds)| f.push(u.to_string(), OrderId::new(*id).unwrap(), *holds))
            .collect();
        out.extend(f.finish());
        out.into_iter().map(|(u, id)| (u, id.get())).collect()
    }

    #[test]
    fn a_buyer_counts_with_the_order_holding_a_unit_else_the_latest() {
        let rows = [
            ("a", 1, false),
            ("a", 5, true),
            ("a", 9, false),
            ("b", 2, false),
            ("b", 3, false),
            ("c", 4, true),
        ];
        assert_eq!(
            fold(0, &rows),
            [("a".into(), 5), ("b".into(), 3), ("c".into(), 4)]
        );
        // A voucher that lets a buyer buy again forgets a buyer whose orders all closed,
        // while they closed fewer than its limit.
        assert_eq!(fold(2, &rows), [("a".into(), 5), ("c".into(), 4)]);
        // "b" closed two: with a limit of 1 they hold their last order for good.
        assert_eq!(
            fold(1, &rows),
            [("a".into(), 5), ("b".into(), 3), ("c".into(), 4)]
        );
        assert!(fold(0, &[]).is_empty());
    }

    #[test]
    fn a_read_goes_on_after_the_last_buyer_whose_rows_were_all_read() {
        let mut f = BuyerRows::new(2);
        let id = |n| OrderId::new(n).unwrap();
        assert_eq!(f.done_through(), None);
        f.push("a".into(), id(1), true);
        // "a" is done once a row of "b" comes, though "b"'s rows may go on.
        assert_eq!(f.done_through(), None);
        f.push("b".into(), id(2), false);
        assert_eq!(f.done_through(), Some("a"));
        // "b" is not counted (closed, may buy again), but it was read through.
        assert_eq!(f.push("c".into(), id(3), false), None);
        assert_eq!(f.done_through(), Some("b"));
        f.finish();
        assert_eq!(f.done_through(), Some("c"));
    }
}

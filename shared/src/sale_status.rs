//! A sale's numbers as Redis and the database see them now: what `seckill status` prints
//! and what the operators' live view (`GET /status`, admin) shows.
//!
//! Read-only: nothing here writes, so an operator polling it during a sale changes
//! nothing the admission or the drainer decides. The database part counts one voucher's
//! orders by status (its index on `voucher_id`), so it costs a read of that voucher's
//! rows: meant for operators, a few times a second at most, not for buyers. It also
//! checks the voucher's payments and paid orders against each other ([`money`]: each
//! payment `paid` and each paid order read once more, through their indexes).

pub mod money;

use futures::{StreamExt, TryStreamExt};
use serde::{Serialize, Serializer};

use crate::adapters::data_api::DataApi;
use crate::adapters::order_stream::{OrderStreams, StreamStats, id_less};
use crate::adapters::payments::{Outcome, Payments};
use crate::adapters::redis::RedisSales;
use crate::adapters::transfers;
use crate::domain::{Bucket, OrderStatus, Phase, SaleWindow, VoucherId, now_millis};
use crate::error::StoreError;

/// One voucher's sale, as Redis and the database see it now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VoucherStatus {
    /// A decimal string in JSON, as every id of the API.
    #[serde(serialize_with = "decimal")]
    pub voucher: i64,
    /// From the database (`None`: the database has no such voucher).
    pub title: Option<String>,
    /// `not_started`, `open`, `ended` (by this machine's clock), or `unknown`.
    pub phase: String,
    pub begins_ms: Option<i64>,
    pub ends_ms: Option<i64>,
    /// Units on sale (database `stock`, else Redis `total`).
    pub stock: Option<i64>,
    /// Units Redis can still admit, over every bucket (`None`: Redis has no sale hash).
    pub stock_left_redis: Option<i64>,
    /// Stock buckets (1 unless the voucher was created with more).
    pub buckets: u16,
    /// Units on their way between two buckets (given, not yet received).
    pub in_transit: i64,
    /// Units the database can still confirm.
    pub stock_left_db: Option<i64>,
    /// Buyers Redis admitted (its buyers hash).
    pub admitted: u64,
    /// Orders in the database holding a unit: `confirmed`, and for a voucher with a
    /// payment step `awaiting_payment` and `paid` (cancelled and expired ones gave it
    /// back).
    pub confirmed: u64,
    pub rejected: u64,
    /// Vouchers with a payment step: of `confirmed`, those waiting for payment and
    /// those paid; and the orders cancelled or expired (their unit went back), with
    /// the expired ones also on their own.
    pub awaiting_payment: u64,
    pub paid: u64,
    pub closed: u64,
    pub expired: u64,
    /// Payments to refund: confirmed by the provider after their order had closed, for
    /// an order another payment paid, or for an order the database rejected (recorded
    /// `refund_due`), and successes of the wrong amount (recorded `refused`): money taken
    /// that pays for nothing, not back yet (`refund_requested` included).
    pub refunds_due: u64,
    /// Of those, the refunds the provider took and has not confirmed yet
    /// (`refund_requested`).
    pub refunds_requested: u64,
    /// Payments the provider says were refunded (`refunded`).
    pub refunded: u64,
    /// Money not matched both ways ([`money`]): payments `paid` whose order is not
    /// `paid` by them (no row: dead-lettered, lost; or a row that says otherwise),
    /// payments still `received` 15 minutes after they were recorded, and paid orders
    /// whose payment is not `paid` for them; what is only on its way to the database is
    /// not counted. `seckill reconcile` lists each, with what to do. Counted up to
    /// [`crate::adapters::payments::unmatched::UNMATCHED_LIMIT`] of each look.
    pub unmatched_money: u64,
    /// Entries not yet acked: delivered to a drainer (`pending`) or not yet read (`lag`).
    pub pending: u64,
    pub lag: u64,
    /// Entries in the orders stream (acked ones stay until trimmed).
    pub stream_length: u64,
    /// Age of the oldest entry not yet acked, by its stream id (admission time): the
    /// drain's lag in time.
    pub oldest_unfinished_ms: Option<u64>,
    pub dead_letters: u64,
    /// In the set the drainer visits.
    pub active: bool,
    /// Nothing waits in the stream.
    pub drained: bool,
}

fn decimal<S: Serializer>(id: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

/// Where a sale's numbers live: Redis (the sale, its streams) and the database.
#[derive(Clone, Copy)]
pub struct SaleSources<'a> {
    pub sales: &'a RedisSales,
    pub streams: &'a OrderStreams,
    pub db: &'a DataApi,
}

impl SaleSources<'_> {
    /// The status of `voucher`; `None` when neither the database nor Redis knows it.
    pub async fn voucher_status(
        &self,
        voucher: VoucherId,
    ) -> Result<Option<VoucherStatus>, StoreError> {
        let db_voucher = self.db.voucher(voucher).await?;
        let sale = self.sales.sale_state(voucher).await?;
        if db_voucher.is_none() && sale.is_none() {
            return Ok(None);
        }
        let buckets = db_voucher.as_ref().map_or(1, |v| v.buckets);
        // Every bucket's Redis numbers, added up (a voucher of one bucket: its own).
        let mut admitted = 0;
        let mut stats = StreamStats {
            fully_delivered: true,
            lag_exact: true,
            ..StreamStats::default()
        };
        let mut oldest: Option<String> = None;
        let mut dead_letters = 0;
        let mut active = true;
        for bucket in Bucket::all(voucher, buckets) {
            admitted += self.sales.buyer_count(bucket).await?;
            let one = self.streams.stats(bucket).await?.unwrap_or_default();
            stats.length += one.length;
            stats.pending += one.pending;
            stats.undelivered += one.undelivered;
            stats.lag_exact &= one.lag_exact;
            stats.fully_delivered &= one.fully_delivered;
            if let Some(id) = self.streams.oldest_unfinished(bucket).await?
                && oldest.as_ref().is_none_or(|o| id_less(&id, o))
            {
                oldest = Some(id);
            }
            dead_letters += self.streams.dead_letter_count(bucket).await?;
            active &= self.streams.is_active(bucket).await?;
        }
        // Stock and units on their way over every bucket (none without bucket 0's sale).
        let units = transfers::units(self.sales.conn_ref(), voucher, buckets).await?;
        let stock_left_redis = sale.and_then(|s| s.stock).map(|_| units.stock);
        let counts = self.db.order_status_counts(voucher).await?;
        let of = |st: OrderStatus| counts.get(&st).copied().unwrap_or(0);
        let (awaiting_payment, paid) = (of(OrderStatus::AwaitingPayment), of(OrderStatus::Paid));
        let expired = of(OrderStatus::Expired);
        let outcomes = Payments(self.db).counts(voucher).await?;
        let count = |want: &[Outcome]| -> u64 {
            outcomes
                .iter()
                .filter(|(o, _)| want.contains(o))
                .map(|(_, n)| n)
                .sum()
        };
        let refunds_due = count(&Outcome::TO_REFUND);
        let refunds_requested = count(&[Outcome::RefundRequested]);
        let refunded = count(&[Outcome::Refunded]);
        // Every voucher: one without a payment step has no payment nor paid order, and
        // its two index lookups find nothing at once.
        let unmatched_money = money::unmatched(self.streams, self.db, voucher, buckets)
            .await?
            .len() as u64;
        let now = now_millis();
        let (begins_ms, ends_ms) = match (&db_voucher, sale) {
            (Some(v), _) => (Some(v.window.begins_ms()), Some(v.window.ends_ms())),
            (None, s) => (s.and_then(|s| s.begins_ms), s.and_then(|s| s.ends_ms)),
        };
        let window = begins_ms
            .zip(ends_ms)
            .and_then(|(b, e)| SaleWindow::new(b, e).ok());
        let phase = match window.map(|w| w.phase(now)) {
            Some(Phase::NotStarted) => "not_started",
            Some(Phase::Open) => "open",
            Some(Phase::Ended) => "ended",
            None => "unknown",
        };
        Ok(Some(VoucherStatus {
            voucher: voucher.get(),
            title: db_voucher.as_ref().map(|v| v.title.clone()),
            phase: phase.to_string(),
            begins_ms,
            ends_ms,
            stock: db_voucher
                .as_ref()
                .map(|v| v.stock)
                .or(sale.and_then(|s| s.total)),
            stock_left_redis,
            buckets,
            in_transit: units.in_transit,
            stock_left_db: db_voucher.as_ref().map(|v| v.db_stock_left),
            admitted,
            confirmed: of(OrderStatus::Confirmed) + awaiting_payment + paid,
            rejected: of(OrderStatus::Rejected),
            awaiting_payment,
            paid,
            closed: of(OrderStatus::Cancelled) + expired,
            expired,
            refunds_due,
            refunds_requested,
            refunded,
            unmatched_money,
            pending: stats.pending,
            lag: stats.undelivered,
            stream_length: stats.length,
            // How long ago the entry was written: its id is `<ms>-<seq>`.
            oldest_unfinished_ms: oldest.map(|id| {
                let ms = id.split('-').next().and_then(|m| m.parse().ok());
                u64::try_from(now - ms.unwrap_or(now)).unwrap_or(0)
            }),
            dead_letters,
            active,
            drained: stats.pending == 0 && stats.undelivered == 0 && stats.fully_delivered,
        }))
    }

    /// The vouchers the drainer visits, the newest (highest ids) `most` of them, in id
    /// order.
    pub async fn active(&self, most: usize) -> Result<Vec<VoucherId>, StoreError> {
        let mut ids: Vec<VoucherId> = (self.streams.active_vouchers().await?.0)
            .into_iter()
            .map(|b| b.voucher())
            .collect();
        ids.dedup();
        Ok(ids.split_off(ids.len().saturating_sub(most)))
    }

    /// The status of `vouchers` (those known), in that order.
    pub async fn status(&self, vouchers: &[VoucherId]) -> Result<Vec<VoucherStatus>, StoreError> {
        let all =
            futures::stream::iter(vouchers.iter().copied()).then(|id| self.voucher_status(id));
        let all: Vec<Option<VoucherStatus>> = all.try_collect().await?;
        Ok(all.into_iter().flatten().collect())
    }
}

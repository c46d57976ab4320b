//! `seckill status [VOUCHER]`: each sale's numbers in Redis and in the database.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use futures::{StreamExt, TryStreamExt};
use seckill_shared::adapters::order_stream::{StreamStats, id_less};
use seckill_shared::adapters::payments::{Outcome, Payments};
use seckill_shared::adapters::transfers;
use seckill_shared::domain::{Bucket, OrderStatus, Phase, SaleWindow, VoucherId, now_millis};
use serde::Serialize;

use super::{Backend, Backends, or_dash};

/// One voucher's sale, as Redis and the database see it now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VoucherStatus {
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
    /// those paid; and the orders cancelled or expired (their unit went back).
    pub awaiting_payment: u64,
    pub paid: u64,
    pub closed: u64,
    /// Payments the provider confirmed after their order had closed (or for an order
    /// another payment paid): recorded `refund_due`, to refund.
    pub refunds_due: u64,
    /// Entries not yet acked: delivered to a drainer (`pending`) or not yet read (`lag`).
    pub pending: u64,
    pub lag: u64,
    /// Entries in the orders stream (acked ones stay until trimmed).
    pub stream_length: u64,
    /// Age of the oldest entry not yet acked, by its stream id (admission time).
    pub oldest_unfinished_ms: Option<u64>,
    pub dead_letters: u64,
    /// In the set the drainer visits.
    pub active: bool,
    /// Nothing waits in the stream.
    pub drained: bool,
}

/// The status of `voucher` (an error when nothing knows it).
pub async fn voucher_status(b: &Backends, voucher: VoucherId) -> anyhow::Result<VoucherStatus> {
    let db_voucher = b.voucher(voucher).await?;
    let sale = b.sales.sale_state(voucher).await.redis()?;
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
    for bucket in Bucket::all(voucher, buckets) {
        admitted += b.sales.buyer_count(bucket).await.redis()?;
        let one = b.streams.stats(bucket).await.redis()?.unwrap_or_default();
        stats.length += one.length;
        stats.pending += one.pending;
        stats.undelivered += one.undelivered;
        stats.lag_exact &= one.lag_exact;
        stats.fully_delivered &= one.fully_delivered;
        if let Some(id) = b.streams.oldest_unfinished(bucket).await.redis()?
            && oldest.as_ref().is_none_or(|o| id_less(&id, o))
        {
            oldest = Some(id);
        }
        dead_letters += b.streams.dead_letter_count(bucket).await.redis()?;
    }
    // Stock and units on their way over every bucket (none without bucket 0's sale).
    let units = transfers::units(b.sales.conn_ref(), voucher, buckets)
        .await
        .redis()?;
    let stock_left_redis = sale.and_then(|s| s.stock).map(|_| units.stock);
    let in_transit = units.in_transit;
    let mut active = true;
    for bucket in Bucket::all(voucher, buckets) {
        active &= b.streams.is_active(bucket).await.redis()?;
    }
    let counts = b.db.order_status_counts(voucher).await.db()?;
    let of = |st: OrderStatus| counts.get(&st).copied().unwrap_or(0);
    let (awaiting_payment, paid) = (of(OrderStatus::AwaitingPayment), of(OrderStatus::Paid));
    let confirmed = of(OrderStatus::Confirmed) + awaiting_payment + paid;
    let rejected = of(OrderStatus::Rejected);
    let closed = of(OrderStatus::Cancelled) + of(OrderStatus::Expired);
    let refunds_due = Payments(&b.db)
        .counts(voucher)
        .await
        .db()?
        .into_iter()
        .filter(|(o, _)| *o == Outcome::RefundDue)
        .map(|(_, n)| n)
        .sum();
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
    Ok(VoucherStatus {
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
        in_transit,
        stock_left_db: db_voucher.as_ref().map(|v| v.db_stock_left),
        admitted,
        confirmed,
        rejected,
        awaiting_payment,
        paid,
        closed,
        refunds_due,
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
    })
}

/// The status of `vouchers`, or of every active voucher when empty.
pub async fn status(b: &Backends, vouchers: &[VoucherId]) -> anyhow::Result<Vec<VoucherStatus>> {
    let ids: Vec<VoucherId> = if vouchers.is_empty() {
        let mut ids: Vec<VoucherId> = (b.streams.active_vouchers().await.redis()?.0)
            .into_iter()
            .map(|b| b.voucher())
            .collect();
        ids.dedup();
        ids
    } else {
        vouchers.to_vec()
    };
    let all = futures::stream::iter(ids).then(|id| voucher_status(b, id));
    all.try_collect().await
}

/// A duration in ms, for people: `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn human_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// The text form: a few lines per voucher.
pub fn render(all: &[VoucherStatus]) -> String {
    let mut out = String::new();
    if all.is_empty() {
        out.push_str("no active vouchers\n");
    }
    for s in all {
        let title = s
            .title
            .as_deref()
            .map_or("(not in the database)".to_string(), |t| format!("{t:?}"));
        let inactive = match s.active {
            true => "",
            false => "  (not active: the drainer does not visit it)",
        };
        let _ = writeln!(
            out,
            "voucher {}  {title}  {}{inactive}\n  \
             stock     {} on sale; left in redis {}, in database {}\n  \
             orders    admitted {}, confirmed {}, rejected {}, dead letters {}\n  \
             stream    pending {}, lag {}, oldest unfinished {}, length {}{}",
            s.voucher,
            s.phase,
            or_dash(s.stock),
            or_dash(s.stock_left_redis),
            or_dash(s.stock_left_db),
            s.admitted,
            s.confirmed,
            s.rejected,
            s.dead_letters,
            s.pending,
            s.lag,
            or_dash(s.oldest_unfinished_ms.map(human_ms)),
            s.stream_length,
            if s.drained { "  (drained)" } else { "" }
        );
        if s.buckets > 1 {
            let _ = writeln!(
                out,
                "  buckets   {} (units on their way between buckets: {})",
                s.buckets, s.in_transit
            );
        }
        if s.awaiting_payment + s.paid + s.closed + s.refunds_due > 0 {
            let _ = writeln!(
                out,
                "  payment   awaiting {}, paid {}, cancelled or expired {} (units given back), \
                 payments to refund {}",
                s.awaiting_payment, s.paid, s.closed, s.refunds_due
            );
        }
    }
    out
}

/// `--watch`: a progress bar per voucher (orders settled in the database out of those
/// admitted), refreshed until every watched sale is over or sold out and drained.
pub async fn watch(
    b: &Backends,
    vouchers: &[VoucherId],
    every: std::time::Duration,
) -> anyhow::Result<()> {
    use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
    let style =
        ProgressStyle::with_template("voucher {prefix:>6} [{bar:40}] {pos}/{len} settled  {msg}")?
            .progress_chars("=> ");
    let multi = MultiProgress::new();
    let mut bars: BTreeMap<i64, ProgressBar> = BTreeMap::new();
    loop {
        let all = status(b, vouchers).await?;
        let mut done = !all.is_empty();
        for s in &all {
            let bar = bars.entry(s.voucher).or_insert_with(|| {
                let bar = ProgressBar::new(0).with_style(style.clone());
                multi.add(bar.with_prefix(s.voucher.to_string()))
            });
            let settled = s.confirmed + s.rejected + s.closed + s.dead_letters;
            bar.set_length(s.admitted.max(settled).max(1));
            bar.set_position(settled);
            bar.set_message(format!(
                "admitted {}, confirmed {}, rejected {}, dead {}, pending {}, lag {}, stock left {} ({})",
                s.admitted,
                s.confirmed,
                s.rejected,
                s.dead_letters,
                s.pending,
                s.lag,
                or_dash(s.stock_left_redis),
                s.phase
            ));
            let over = s.phase == "ended" || s.stock_left_redis == Some(0);
            done &= over && s.drained;
        }
        if done {
            bars.values().for_each(ProgressBar::finish);
            return Ok(());
        }
        tokio::time::sleep(every).await;
    }
}

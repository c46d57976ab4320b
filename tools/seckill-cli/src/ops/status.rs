//! `seckill status [VOUCHER]`: each sale's numbers in Redis and in the database.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::bail;
use seckill_shared::adapters::payments::{Outcome, Payments};
use seckill_shared::domain::VoucherId;
use seckill_shared::sale_status::SaleSources;
pub use seckill_shared::sale_status::VoucherStatus;

use super::{Backends, or_dash};

impl Backends {
    fn sources(&self) -> SaleSources<'_> {
        SaleSources {
            sales: &self.sales,
            streams: &self.streams,
            db: &self.db,
        }
    }
}

/// The status of `voucher` (an error when nothing knows it).
pub async fn voucher_status(b: &Backends, voucher: VoucherId) -> anyhow::Result<VoucherStatus> {
    match b.sources().voucher_status(voucher).await? {
        Some(s) => Ok(s),
        None => bail!("voucher {voucher} does not exist (neither the database nor Redis has it)"),
    }
}

/// The status of `vouchers`, or of every active voucher when empty.
pub async fn status(b: &Backends, vouchers: &[VoucherId]) -> anyhow::Result<Vec<VoucherStatus>> {
    if vouchers.is_empty() {
        let all = b.sources().active(usize::MAX).await?;
        return Ok(b.sources().status(&all).await?);
    }
    let mut all = Vec::with_capacity(vouchers.len());
    for &v in vouchers {
        all.push(voucher_status(b, v).await?);
    }
    Ok(all)
}

/// Payments to refund whose event named no order any voucher has (recorded without a
/// voucher, so no voucher's figures count them; `seckill reconcile` lists each).
pub async fn unmatched_refunds(b: &Backends) -> anyhow::Result<u64> {
    Ok(Payments(&b.db)
        .of_no_voucher_counts()
        .await?
        .into_iter()
        .filter(|(o, _)| Outcome::TO_REFUND.contains(o))
        .map(|(_, n)| n)
        .sum())
}

/// The text form of [`unmatched_refunds`]: a line after the vouchers, none when there
/// are none.
pub fn render_unmatched(n: u64) -> String {
    match n {
        0 => String::new(),
        n => format!(
            "payments of no known order to refund: {n} (seckill reconcile VOUCHER lists them)\n"
        ),
    }
}

/// The order events still owed to the bus (the outbox's depth) and the oldest one's age
/// in ms (docs/design.md, "Order events").
pub async fn events_owed(b: &Backends) -> anyhow::Result<(u64, u64)> {
    let (depth, oldest) = b.db.outbox_depth().await?;
    let age = oldest.map_or(0, |at| {
        (seckill_shared::domain::now_millis() - at).max(0) as u64
    });
    Ok((depth, age))
}

/// The text form of [`events_owed`]: a line after the vouchers.
pub fn render_events_owed((depth, age): (u64, u64)) -> String {
    match depth {
        0 => "order events: none owed (every transition published)\n".to_string(),
        n => format!(
            "order events: {n} owed, the oldest for {} (the drainer publishes them)\n",
            human_ms(age)
        ),
    }
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
             orders    {}\n  \
             stream    {}, oldest unfinished {}, length {}{}",
            s.voucher,
            s.phase,
            or_dash(s.stock),
            or_dash(s.stock_left_redis),
            or_dash(s.stock_left_db),
            orders(s),
            stream(s),
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
        if s.awaiting_payment + s.paid + s.closed + s.refunds_due + s.refunded + s.unmatched_money
            > 0
        {
            let _ = writeln!(
                out,
                "  payment   awaiting {}, paid {}, cancelled or expired {} (units given back), \
                 payments to refund {} (refund requested {}), refunded {}",
                s.awaiting_payment,
                s.paid,
                s.closed,
                s.refunds_due,
                s.refunds_requested,
                s.refunded
            );
        }
        if s.unmatched_money > 0 {
            let _ = writeln!(
                out,
                "  money     not matched both ways {} (payments and paid orders: `seckill \
                 reconcile {}` lists each, with what to do)",
                s.unmatched_money, s.voucher
            );
        }
    }
    out
}

/// What became of a sale's orders, for the report and the watch alike.
fn orders(s: &VoucherStatus) -> String {
    format!(
        "admitted {}, confirmed {}, rejected {}, dead letters {}",
        s.admitted, s.confirmed, s.rejected, s.dead_letters
    )
}

/// How far the drainer is behind on a sale's stream.
fn stream(s: &VoucherStatus) -> String {
    format!("pending {}, lag {}", s.pending, s.lag)
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
                "{}, {}, stock left {} ({})",
                orders(s),
                stream(s),
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

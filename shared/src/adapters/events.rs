//! Order events for the rest of the shop (docs/design.md, "Order events"): the outbox
//! the database's triggers fill in the transaction of each transition
//! (migrations/0013_order_events.sql), and its publication to EventBridge.
//!
//! Invariants kept here:
//! - at least once: a row is deleted only after EventBridge took its entry (PutEvents
//!   answers per entry; a failed entry keeps its row for the next try);
//! - in order per order: an order's events are published in `sequence` order, never two
//!   of one order in one `PutEvents` call (its entries succeed or fail one by one), and
//!   once one of an order's events fails, its later ones wait for the next try;
//! - the same transition is always the same `event_id`, so a consumer drops a repeat.

use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use serde_json::json;

use super::data_api::{DataApi, field, param};
use crate::domain::{UnixMillis, format_rfc3339_millis};
use crate::error::StoreError;

/// The `source` of every event.
pub const SOURCE: &str = "seckill.orders";

/// The most entries one `PutEvents` call carries (EventBridge's limit).
pub const ENTRIES_PER_CALL: usize = 10;

/// Outbox rows one read takes, in publishing order.
pub const OUTBOX_PAGE: i64 = 200;

/// The outbox's first rows, by its primary key (named: a table never analysed must not
/// be read any other way). An order's amount is its voucher's price, joined here (the triggers read nothing, so
/// a batch's writes cost what they did); a refund's is its payment's, in the row.
/// A refund whose payment came before its order was drained had no buyer to copy: the
/// order's, when it is written by the time the row is published.
pub const OUTBOX_PAGE_SQL: &str = "SELECT e.id, e.event_id, e.order_id, e.voucher_id, \
     CONVERT(COALESCE(NULLIF(e.user_id, ''), o.user_id, '') USING utf8mb4), e.state, \
     e.reason, COALESCE(e.amount_minor, v.price_minor), COALESCE(e.currency, v.currency), \
     e.payment_id, e.occurred_at FROM order_events e FORCE INDEX (PRIMARY) \
     LEFT JOIN vouchers v ON v.id = e.voucher_id LEFT JOIN orders o ON o.id = e.order_id \
     ORDER BY e.id LIMIT :n";

/// The most rows [`DataApi::outbox_depth`] counts: an outbox this deep is told as
/// "at least this many", and a count costs a bounded read whatever the backlog.
pub const OUTBOX_COUNT_CAP: i64 = 100_000;

/// The outbox's depth (counted up to [`OUTBOX_COUNT_CAP`]) and its first row's time (the
/// oldest: ids grow with commits), each read on the primary key.
pub const OUTBOX_DEPTH_SQL: &str = "SELECT \
     (SELECT COUNT(*) FROM (SELECT id FROM order_events FORCE INDEX (PRIMARY) LIMIT 100000) t), \
     (SELECT occurred_at FROM order_events FORCE INDEX (PRIMARY) ORDER BY id LIMIT 1)";

/// One row of the outbox: an event owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The publishing order, and the event's `sequence`.
    pub id: u64,
    pub event_id: String,
    pub order_id: u64,
    pub voucher_id: u64,
    pub user_id: String,
    pub state: String,
    pub reason: Option<String>,
    pub amount_minor: Option<i64>,
    pub currency: Option<String>,
    pub payment_id: Option<String>,
    pub occurred_at: UnixMillis,
}

/// The `detail-type` of an event of `state` (an order's status or a refund's payment
/// outcome); `None` for a state that is owed no event.
pub fn detail_type(state: &str) -> Option<&'static str> {
    Some(match state {
        "confirmed" => "OrderConfirmed",
        "awaiting_payment" => "OrderAwaitingPayment",
        "paid" => "OrderPaid",
        "cancelled" => "OrderCancelled",
        "expired" => "OrderExpired",
        "rejected" => "OrderRejected",
        "refund_due" | "refused" => "RefundDue",
        "refund_requested" => "RefundRequested",
        "refunded" => "Refunded",
        _ => return None,
    })
}

impl OutboxRow {
    /// The event's `detail`: ids as decimal strings, the buyer, the state, the money
    /// where money moved (a paid order, a refund), and the stable `event_id` and
    /// `sequence` a consumer orders and deduplicates by.
    pub fn detail(&self) -> serde_json::Value {
        let mut d = json!({
            "event_id": self.event_id,
            "sequence": self.id.to_string(),
            "order_id": self.order_id.to_string(),
            "voucher_id": self.voucher_id.to_string(),
            "user_id": self.user_id,
            "state": self.state,
            "occurred_at": format_rfc3339_millis(self.occurred_at),
        });
        let money = matches!(
            self.state.as_str(),
            "paid" | "refund_due" | "refused" | "refund_requested" | "refunded"
        );
        if let (true, Some(amount), Some(currency)) = (money, self.amount_minor, &self.currency) {
            d["amount_minor"] = json!(amount);
            d["currency"] = json!(currency);
        }
        if let Some(reason) = &self.reason {
            d["reason"] = json!(reason);
        }
        if let Some(payment) = &self.payment_id {
            d["payment_id"] = json!(payment);
        }
        d
    }

    /// The `PutEvents` entry for the bus `bus`.
    pub fn entry(&self, bus: &str) -> PutEventsRequestEntry {
        PutEventsRequestEntry::builder()
            .event_bus_name(bus)
            .source(SOURCE)
            .detail_type(detail_type(&self.state).unwrap_or("OrderEvent"))
            .detail(self.detail().to_string())
            .build()
    }
}

/// Splits `rows` (in publishing order) into `PutEvents` calls of at most
/// [`ENTRIES_PER_CALL`] entries, none holding two events of one order: an order's next
/// event goes to a later call than its previous one, so a failure of the earlier never
/// lets the later through first (see [`Publication::failed`]).
pub fn calls(rows: &[OutboxRow]) -> Vec<Vec<&OutboxRow>> {
    let mut out: Vec<Vec<&OutboxRow>> = Vec::new();
    // The call each order's last event went to.
    let mut last: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for row in rows {
        // The first call from `earliest` with room; past the last one, a new call.
        let earliest = last.get(&row.order_id).map_or(0, |c| c + 1);
        let call = (earliest..out.len())
            .find(|c| out[*c].len() < ENTRIES_PER_CALL)
            .unwrap_or_else(|| {
                out.push(Vec::new());
                out.len() - 1
            });
        out[call].push(row);
        last.insert(row.order_id, call);
    }
    out
}

impl DataApi {
    /// The outbox's first [`OUTBOX_PAGE`] rows, in publishing order.
    pub async fn outbox_page(&self) -> Result<Vec<OutboxRow>, StoreError> {
        let out = self
            .execute(OUTBOX_PAGE_SQL, vec![param::long("n", OUTBOX_PAGE)], None)
            .await?;
        out.records()
            .iter()
            .map(|r| {
                let bad = || StoreError::Corrupt(format!("an order_events row reads {r:?}"));
                let [
                    id,
                    event_id,
                    order,
                    voucher,
                    user,
                    state,
                    reason,
                    amount,
                    currency,
                    payment,
                    at,
                ] = r.as_slice()
                else {
                    return Err(bad());
                };
                let unsigned = |f| field::long(f).and_then(|n| u64::try_from(n).ok());
                Ok(OutboxRow {
                    id: unsigned(id).ok_or_else(bad)?,
                    event_id: field::string(event_id).ok_or_else(bad)?,
                    order_id: unsigned(order).ok_or_else(bad)?,
                    voucher_id: unsigned(voucher).ok_or_else(bad)?,
                    user_id: field::string(user).unwrap_or_default(),
                    state: field::string(state).ok_or_else(bad)?,
                    reason: field::string(reason),
                    amount_minor: field::long(amount),
                    currency: field::string(currency),
                    payment_id: field::string(payment),
                    occurred_at: field::datetime(at).ok_or_else(bad)?,
                })
            })
            .collect()
    }

    /// Deletes published rows of the outbox (by primary key).
    pub async fn delete_published(&self, ids: &[u64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(ids).unwrap_or_default();
        self.execute(
            "DELETE FROM order_events WHERE id IN \
             (SELECT j.id FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) j)",
            vec![param::string("ids", &list)],
            None,
        )
        .await?;
        Ok(())
    }

    /// How many events are owed (at most [`OUTBOX_COUNT_CAP`]), and since when the
    /// oldest (`None`: none).
    pub async fn outbox_depth(&self) -> Result<(u64, Option<UnixMillis>), StoreError> {
        let out = self.execute(OUTBOX_DEPTH_SQL, vec![], None).await?;
        let row = out.records().first().cloned().unwrap_or_default();
        let depth = row
            .first()
            .and_then(field::long)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        Ok((depth, row.get(1).and_then(field::datetime)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, order: u64, state: &str) -> OutboxRow {
        OutboxRow {
            id,
            event_id: format!("{order}:{state}"),
            order_id: order,
            voucher_id: 7,
            user_id: "u".into(),
            state: state.into(),
            reason: None,
            amount_minor: Some(1_000),
            currency: Some("EUR".into()),
            payment_id: None,
            occurred_at: 1_800_000_000_000,
        }
    }

    #[test]
    fn no_call_holds_two_events_of_one_order_and_each_order_keeps_its_order() {
        let mut rows = Vec::new();
        for i in 0..25 {
            rows.push(row(i, i % 3, "awaiting_payment"));
        }
        let split = calls(&rows);
        let mut seen: std::collections::HashMap<u64, (usize, u64)> = Default::default();
        for (c, call) in split.iter().enumerate() {
            assert!(call.len() <= ENTRIES_PER_CALL);
            let mut orders: Vec<u64> = call.iter().map(|r| r.order_id).collect();
            orders.sort();
            orders.dedup();
            assert_eq!(orders.len(), call.len(), "call {c}: {call:?}");
            for r in call {
                if let Some((before, id)) = seen.get(&r.order_id) {
                    assert!(*before < c && *id < r.id);
                }
                seen.insert(r.order_id, (c, r.id));
            }
        }
        assert_eq!(split.iter().map(Vec::len).sum::<usize>(), 25);
        // Many orders, one event each: ten a call.
        let many: Vec<OutboxRow> = (0..25).map(|i| row(i, i, "confirmed")).collect();
        assert_eq!(
            calls(&many).iter().map(Vec::len).collect::<Vec<_>>(),
            [10, 10, 5]
        );
    }

    #[test]
    fn the_depth_query_counts_up_to_its_cap() {
        assert!(OUTBOX_DEPTH_SQL.contains(&format!("LIMIT {OUTBOX_COUNT_CAP})")));
    }

    #[test]
    fn money_is_told_where_it_moved_and_ids_are_decimal_strings() {
        let paid = row(12, 99, "paid").detail();
        assert_eq!(paid["order_id"], "99");
        assert_eq!(paid["sequence"], "12");
        assert_eq!(paid["amount_minor"], 1_000);
        let confirmed = row(13, 98, "awaiting_payment").detail();
        assert!(confirmed.get("amount_minor").is_none());
        assert_eq!(detail_type("refused"), Some("RefundDue"));
        assert_eq!(detail_type("received"), None);
    }
}

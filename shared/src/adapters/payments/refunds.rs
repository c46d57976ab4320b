//! The ledger's side of refunds (`migrations/0010_refunds.sql`): which payments a run
//! may refund now, claiming one before the provider is called, and the steps a refund
//! goes through: `refund_due` / `refused` → `refund_requested` (the provider took the
//! request; its refund id kept) → `refunded` (the provider says the money went back).
//!
//! Exactly once rests on three things: the claim (`refund_next_at` moved past the call
//! in one conditional `UPDATE`, so two runs at once never both call for one payment),
//! the provider's idempotency key per payment, and the caller looking for a refund the
//! provider already holds before asking again (a call whose answer was lost). A failed
//! call leaves the payment where it stood, with its error and the time of its next try
//! (backing off), listed for the operators meanwhile.

use super::{COLUMNS, Outcome, PaymentRow, Payments, row};
use crate::adapters::data_api::param;
use crate::domain::UnixMillis;
use crate::error::StoreError;

/// The outcomes a refund starts from.
const DUE: &str = "'refund_due', 'refused'";

/// The most payments one [`Payments::refunds_to_issue`] returns.
pub const ISSUE_LIMIT: usize = 100;

/// [`Payments::refunds_to_issue`]'s query (`:provider`, `:now`): the provider's payments
/// to refund whose next try is due, through `payments_to_refund` (the rows of those two
/// outcomes of that provider, never the table), the longest waiting first.
pub fn to_issue_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM payments FORCE INDEX (payments_to_refund) \
         WHERE provider = :provider AND outcome IN ({DUE}) \
         AND (refund_next_at IS NULL OR refund_next_at <= :now) \
         ORDER BY refund_next_at, received_at LIMIT {ISSUE_LIMIT}"
    )
}

/// How long a claim keeps other runs off a payment: longer than the provider's calls
/// take (two of them, five seconds each at most) with room for a slow database.
pub const CLAIM_MS: i64 = 60_000;

/// When a refund that failed `attempts` times is tried again: after 30 s, doubling, at
/// most an hour later.
pub fn retry_after_ms(attempts: u32) -> i64 {
    let doublings = attempts.saturating_sub(1).min(7);
    (30_000_i64 << doublings).min(3_600_000)
}

impl Payments<'_> {
    /// The payments of `provider` to refund whose next try is due at `now`, at most
    /// [`ISSUE_LIMIT`].
    pub async fn refunds_to_issue(
        &self,
        provider: &str,
        now: UnixMillis,
    ) -> Result<Vec<PaymentRow>, StoreError> {
        let out = self
            .0
            .execute(
                &to_issue_sql(),
                vec![
                    param::string("provider", provider),
                    param::timestamp("now", now),
                ],
                None,
            )
            .await?;
        out.records().iter().map(|r| row(r)).collect()
    }

    /// Claims payment `payment_id`'s refund for one try at `now` (its attempts counted):
    /// true when this caller may call the provider for it, false when it is no longer to
    /// refund, or another run holds it, or its next try is not due.
    pub async fn claim_refund(
        &self,
        payment_id: &str,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        let out = self
            .0
            .execute(
                &format!(
                    "UPDATE payments SET refund_attempts = refund_attempts + 1, \
                     refund_next_at = :until \
                     WHERE payment_id = :p AND outcome IN ({DUE}) \
                     AND (refund_next_at IS NULL OR refund_next_at <= :now)"
                ),
                vec![
                    param::timestamp("until", now.saturating_add(CLAIM_MS)),
                    param::string("p", payment_id),
                    param::timestamp("now", now),
                ],
                None,
            )
            .await?;
        Ok(out.number_of_records_updated() == 1)
    }

    /// The provider took the refund request (`refund_id`): `refund_requested`.
    pub async fn refund_requested(
        &self,
        payment_id: &str,
        refund_id: &str,
        now: UnixMillis,
    ) -> Result<Option<PaymentRow>, StoreError> {
        self.0
            .execute(
                &format!(
                    "UPDATE payments SET outcome = 'refund_requested', refund_id = :r, \
                     refund_error = NULL, refund_next_at = NULL, decided_at = :now \
                     WHERE payment_id = :p AND outcome IN ({DUE})"
                ),
                vec![
                    param::string("r", refund_id),
                    param::timestamp("now", now),
                    param::string("p", payment_id),
                ],
                None,
            )
            .await?;
        self.get(payment_id).await
    }

    /// A try failed with `error`: tried again at `next_ms`.
    pub async fn refund_failed(
        &self,
        payment_id: &str,
        error: &str,
        next_ms: UnixMillis,
    ) -> Result<(), StoreError> {
        let error: String = error.chars().take(super::MAX_REASON_CHARS).collect();
        let params = vec![
            param::string("e", &error),
            param::timestamp("next", next_ms),
            param::string("p", payment_id),
        ];
        self.0
            .execute(
                &format!(
                    "UPDATE payments SET refund_error = :e, refund_next_at = :next \
                     WHERE payment_id = :p AND outcome IN ({DUE})"
                ),
                params,
                None,
            )
            .await?;
        Ok(())
    }

    /// The provider says payment `payment_id`'s money went back (event `event_id`):
    /// `refunded`, from any step of a refund. `None` when no such payment is recorded;
    /// otherwise the row as it stands (a payment that was not to refund, `paid` say,
    /// is left as it is: the caller tells the operators).
    pub async fn refunded(
        &self,
        payment_id: &str,
        event_id: &str,
        now: UnixMillis,
    ) -> Result<Option<PaymentRow>, StoreError> {
        self.0
            .execute(
                &format!(
                    "UPDATE payments SET outcome = 'refunded', event_id = :e, \
                     refund_error = NULL, refund_next_at = NULL, decided_at = :now \
                     WHERE payment_id = :p AND outcome IN ({DUE}, 'refund_requested')"
                ),
                vec![
                    param::string("e", event_id),
                    param::timestamp("now", now),
                    param::string("p", payment_id),
                ],
                None,
            )
            .await?;
        self.get(payment_id).await
    }

    /// An operator's "try this refund again now": its next try made due.
    pub async fn retry_refund_now(&self, payment_id: &str) -> Result<bool, StoreError> {
        let out = self
            .0
            .execute(
                &format!(
                    "UPDATE payments SET refund_next_at = NULL \
                     WHERE payment_id = :p AND outcome IN ({DUE})"
                ),
                vec![param::string("p", payment_id)],
                None,
            )
            .await?;
        Ok(out.number_of_records_updated() == 1)
    }

    /// A refund's progress as the ledger holds it: (provider, refund id, attempts, last
    /// error).
    pub async fn refund_progress(
        &self,
        payment_id: &str,
    ) -> Result<Option<RefundProgress>, StoreError> {
        use crate::adapters::data_api::field;
        let out = self
            .0
            .execute(
                "SELECT provider, refund_id, refund_attempts, refund_error, outcome \
                 FROM payments WHERE payment_id = :p",
                vec![param::string("p", payment_id)],
                None,
            )
            .await?;
        let Some([provider, refund_id, attempts, error, outcome]) =
            out.records().first().map(Vec::as_slice)
        else {
            return Ok(None);
        };
        Ok(Some(RefundProgress {
            provider: field::string(provider).unwrap_or_default(),
            refund_id: field::string(refund_id),
            attempts: field::long(attempts).unwrap_or(0),
            error: field::string(error),
            outcome: field::string(outcome).and_then(|o| Outcome::parse(&o)),
        }))
    }
}

/// What the ledger holds of a payment's refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundProgress {
    pub provider: String,
    pub refund_id: Option<String>,
    pub attempts: i64,
    pub error: Option<String>,
    pub outcome: Option<Outcome>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_an_hour() {
        assert_eq!(retry_after_ms(1), 30_000);
        assert_eq!(retry_after_ms(2), 60_000);
        assert_eq!(retry_after_ms(5), 480_000);
        assert_eq!(retry_after_ms(8), 3_600_000);
        assert_eq!(retry_after_ms(u32::MAX), 3_600_000);
        assert!(retry_after_ms(0) > 0);
    }
}

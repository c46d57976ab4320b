//! Refunds issued, exactly once: every payment to refund (`refund_due`, `refused`) that
//! Stripe took is refunded through Stripe's API by the drainer's runs ([`issue_due`]) or
//! an operator (`seckill refund`, [`issue_one`]).
//!
//! One try of one payment: claim it in the ledger (no other run calls for it meanwhile),
//! look for a refund Stripe already holds for its PaymentIntent (a request whose answer
//! was lost: never asked again), else ask for one with the payment's idempotency key;
//! then record `refund_requested` with the refund's id. Stripe's `charge.refunded` later
//! records `refunded`. A crash anywhere leaves the payment to refund, claimed for at most
//! a minute; a failed call keeps its error and is tried again, backing off to an hour. A
//! Stripe that cannot be reached ends the run's refunds at once: the next run tries again.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::adapters::data_api::DataApi;
use crate::adapters::payments::Payments;
use crate::adapters::payments::refunds::retry_after_ms;
use crate::adapters::stripe::{StripeApi, StripeError};
use crate::domain::now_millis;
use crate::error::StoreError;

/// The provider whose payments these refunds are (the ledger's `provider`).
pub const STRIPE: &str = "stripe";

/// What one try of one payment did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issued {
    /// Stripe took the request now: the refund's id.
    Requested(String),
    /// Stripe held a refund already (an earlier request whose answer was lost): its id.
    Found(String),
    /// Not tried: no longer to refund, or another run holds it, or its next try is not due.
    NotDue,
    /// Stripe refused the request (kept as the payment's error; tried again later).
    Refused(String),
    /// Stripe could not be reached (tried again later).
    Unavailable(String),
}

/// One run's refunds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRun {
    /// Refunds Stripe took in this run (asked now, or found already held).
    pub requested: u64,
    /// Tries Stripe refused or could not answer.
    pub failed: u64,
    /// Payments still due when the run stopped (its budget spent, or Stripe unreachable).
    pub left: u64,
}

/// One try of payment `payment_id`'s refund (see the module).
pub async fn issue_one(
    db: &DataApi,
    stripe: &StripeApi,
    key: &str,
    payment_id: &str,
) -> Result<Issued, StoreError> {
    let ledger = Payments(db);
    let now = now_millis();
    if !ledger.claim_refund(payment_id, now).await? {
        return Ok(Issued::NotDue);
    }
    let held = match stripe.refunds(key, payment_id).await {
        Ok(list) => list
            .into_iter()
            .find(|r| !matches!(r.status.as_str(), "failed" | "canceled")),
        Err(e) => return failed(&ledger, payment_id, e).await,
    };
    let issued = match held {
        Some(refund) => Issued::Found(refund.id),
        None => match stripe.refund(key, payment_id).await {
            Ok(refund) => Issued::Requested(refund.id),
            Err(e) => return failed(&ledger, payment_id, e).await,
        },
    };
    let (Issued::Found(id) | Issued::Requested(id)) = &issued else {
        return Ok(issued);
    };
    ledger
        .refund_requested(payment_id, id, now_millis())
        .await?;
    tracing::info!(payment = payment_id, refund = id, "refund requested");
    Ok(issued)
}

/// Records a failed try (the next one backing off by the attempts made) and says how it
/// failed.
async fn failed(
    ledger: &Payments<'_>,
    payment_id: &str,
    e: StripeError,
) -> Result<Issued, StoreError> {
    let attempt = ledger
        .refund_progress(payment_id)
        .await?
        .map_or(1, |p| u32::try_from(p.attempts).unwrap_or(u32::MAX));
    let next = now_millis().saturating_add(retry_after_ms(attempt));
    ledger
        .refund_failed(payment_id, &e.to_string(), next)
        .await?;
    tracing::warn!(payment = payment_id, attempt, error = %e, "refund not taken; tried again later");
    Ok(match e {
        StripeError::Unavailable(why) => Issued::Unavailable(why),
        StripeError::Refused { message, .. } => Issued::Refused(message),
    })
}

/// The refunds due now, one after another, for at most `budget`: a run's share of
/// Stripe. Stops at the first try Stripe could not answer.
pub async fn issue_due(
    db: &DataApi,
    stripe: &StripeApi,
    key: &str,
    budget: Duration,
) -> Result<RefundRun, StoreError> {
    let started = Instant::now();
    let due = Payments(db).refunds_to_issue(STRIPE, now_millis()).await?;
    let mut run = RefundRun {
        left: due.len() as u64,
        ..RefundRun::default()
    };
    for payment in due {
        if started.elapsed() >= budget {
            break;
        }
        run.left -= 1;
        match issue_one(db, stripe, key, &payment.payment_id).await? {
            Issued::Requested(_) | Issued::Found(_) => run.requested += 1,
            Issued::NotDue => {}
            Issued::Refused(_) => run.failed += 1,
            Issued::Unavailable(_) => {
                run.failed += 1;
                break;
            }
        }
    }
    Ok(run)
}

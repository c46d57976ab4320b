//! The drainer's one error type.
//!
//! What matters downstream is whether a failure is transient (leave the entries pending,
//! stop the voucher for this invocation, retry on a later one) or permanent (leave them
//! pending too: their delivery count grows until they are dead-lettered). Either way the
//! invocation reports failure at the end so the scheduler's metrics and alarms see it.

use seckill_shared::domain::VoucherId;
use seckill_shared::error::StoreError;

/// A failure of the drainer.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// Redis or the database failed during `step`.
    #[error("{step} failed{}: {source}", voucher_suffix(.voucher))]
    Store {
        step: &'static str,
        voucher: Option<VoucherId>,
        #[source]
        source: StoreError,
    },
    /// Row counts differed from the plan on every attempt: another drainer kept writing
    /// the same orders concurrently. The entries stay pending.
    #[error("batch of voucher {voucher} lost {attempts} races with a concurrent writer")]
    Raced { voucher: VoucherId, attempts: u32 },
    /// The invocation finished but not everything went well; the summary lists why.
    #[error("drain finished with {count} error(s), first: {first}")]
    Incomplete { count: usize, first: String },
}

fn voucher_suffix(voucher: &Option<VoucherId>) -> String {
    voucher
        .map(|v| format!(" for voucher {v}"))
        .unwrap_or_default()
}

impl DrainError {
    pub fn store(step: &'static str, voucher: Option<VoucherId>, source: StoreError) -> DrainError {
        DrainError::Store {
            step,
            voucher,
            source,
        }
    }

    /// True when retrying later can help (the backend was unavailable, or a race).
    pub fn is_transient(&self) -> bool {
        match self {
            DrainError::Store { source, .. } => source.is_transient(),
            DrainError::Raced { .. } => true,
            DrainError::Incomplete { .. } => false,
        }
    }
}

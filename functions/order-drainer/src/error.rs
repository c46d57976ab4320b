//! The drainer's one error type.
//!
//! What matters downstream is whether a failure is transient (the backend was unavailable,
//! a lock was held: retry later) or permanent, and whether it is a *refusal*: the database
//! rejecting the rows of one insert, which may be one order's fault. A refusal makes the
//! drainer split the batch to find the order; any other failure leaves the whole batch
//! pending (released for the next run), however often it happens: no failure ever counts
//! against an entry. Either way the invocation reports failure at the end so the
//! scheduler's metrics and alarms see it.

use seckill_shared::domain::Bucket;
use seckill_shared::error::StoreError;

/// The step name of the insert statements, the only step whose refusals can be an
/// order's fault.
pub const INSERTING: &str = "inserting orders";

/// A failure of the drainer.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// Redis or the database failed during `step`.
    #[error("{step} failed{}: {source}", voucher_suffix(.voucher))]
    Store {
        step: &'static str,
        voucher: Option<Bucket>,
        #[source]
        source: StoreError,
    },
    /// Row counts differed from the plan on every attempt: another drainer kept writing
    /// the same orders concurrently. The entries stay pending.
    #[error("batch of voucher {voucher} lost {attempts} races with a concurrent writer")]
    Raced { voucher: Bucket, attempts: u32 },
    /// The invocation finished but not everything went well; the summary lists why.
    #[error("drain finished with {count} error(s), first: {first}")]
    Incomplete { count: usize, first: String },
}

/// True when `error` says the database chose the statement as a lock's victim (a
/// deadlock, or the AUTO-INC lock a deadlock kept from it): the batch's transaction,
/// rolled back, may be tried again at once.
pub fn is_deadlock_victim(error: &StoreError) -> bool {
    seckill_shared::adapters::data_api::is_lock_victim(error)
}

fn voucher_suffix(voucher: &Option<Bucket>) -> String {
    voucher
        .map(|v| format!(" for voucher {v}"))
        .unwrap_or_default()
}

impl DrainError {
    pub fn store(step: &'static str, voucher: Option<Bucket>, source: StoreError) -> DrainError {
        DrainError::Store {
            step,
            voucher,
            source,
        }
    }

    /// True when the database chose this transaction as a deadlock's victim: InnoDB
    /// rolled all of it back, so the batch may be tried again at once.
    pub fn is_deadlock(&self) -> bool {
        match self {
            DrainError::Store { source, .. } => is_deadlock_victim(source),
            _ => false,
        }
    }

    /// True when the database refused the rows of an insert with a permanent error: the
    /// refusal may be one order's fault (too long a value, a constraint, a trigger), so
    /// the batch is worth splitting. Refusals of any other statement are the database's.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            DrainError::Store {
                step: INSERTING,
                source: StoreError::Database(_),
                ..
            }
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadlock_victim_is_told_from_other_failures() {
        let err = |detail: &str| {
            DrainError::store(
                "inserting orders",
                None,
                StoreError::Unavailable {
                    backend: "data api",
                    detail: detail.into(),
                },
            )
        };
        assert!(
            err("DatabaseErrorException: Deadlock found when trying to get lock; try restarting transaction")
                .is_deadlock()
        );
        assert!(
            err("DatabaseErrorException: Failed to read auto-increment value from storage engine")
                .is_deadlock()
        );
        assert!(!err("DatabaseErrorException: Lock wait timeout exceeded").is_deadlock());
        assert!(!err("connection refused").is_deadlock());
    }
}

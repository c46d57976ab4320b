//! How a Data API failure is sorted, once: transient (the service, the network or the
//! database is not there right now, or a row lock is held) or permanent (the database
//! refused the statement).
//!
//! Invariant kept here: a passing state of the database (a lock wait, a deadlock, a
//! failover, a scaling event) is never sorted as permanent, so the drainer never
//! dead-letters the orders of a batch for it.

use aws_sdk_rdsdata::error::{ProvideErrorMetadata, SdkError};

use crate::error::StoreError;

/// Sorts an SDK failure into transient (the service, network or database is not there
/// right now) and permanent (the database refused the statement).
pub fn store_error<E, R>(err: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    match &err {
        SdkError::ServiceError(service) => {
            let e = service.err();
            let code = e.code().unwrap_or("Unknown");
            let message = e.message().unwrap_or("").to_string();
            match code {
                "DatabaseErrorException" if is_lock_conflict(&message) => StoreError::Locked {
                    backend: "data api",
                    detail: format!("{code}: {message}"),
                },
                // Aurora also reports a lost or failing-over connection as a bad request
                // ("Communications link failure"): sorted by its text, not its name.
                "DatabaseErrorException" | "BadRequestException"
                    if is_transient_database_error(&message) =>
                {
                    StoreError::Unavailable {
                        backend: "data api",
                        detail: format!("{code}: {message}"),
                    }
                }
                "DatabaseErrorException"
                | "BadRequestException"
                | "ForbiddenException"
                | "AccessDeniedException" => StoreError::Database(format!("{code}: {message}")),
                _ => StoreError::Unavailable {
                    backend: "data api",
                    detail: format!("{code}: {message}"),
                },
            }
        }
        _ => StoreError::Unavailable {
            backend: "data api",
            detail: aws_smithy_types::error::display::DisplayErrorContext(&err).to_string(),
        },
    }
}

/// MySQL errors that the Data API reports as `DatabaseErrorException` although a later
/// retry can succeed: lock waits (including `NOWAIT`), deadlocks, a writer that turned
/// read-only during an Aurora failover, a connection killed or lost mid-statement, a
/// transaction Aurora aborted while scaling or the Data API no longer knows, and any
/// error that itself asks to be retried. Sorting them as permanent would make the drainer
/// blame (and dead-letter) the orders of a batch for what is the database's passing state.
pub fn is_transient_database_error(message: &str) -> bool {
    const PASSING: &[&str] = &[
        "lock wait timeout",
        "deadlock found",
        "nowait is set",
        "try restarting transaction",
        "read-only",
        "read only",
        "connection was killed",
        "query execution was interrupted",
        "server shutdown in progress",
        "lost connection",
        "server has gone away",
        "too many connections",
        "communications link failure",
        "database is resuming",
        // "Table definition has changed, please retry transaction" (1412), Aurora's
        // "... aborted due to Seamless Scaling. Please retry.", and their kin.
        "please retry",
        "retry transaction",
        "seamless scaling",
        // 1467: InnoDB could not take the AUTO-INC lock (a deadlock's victim waiting for
        // it, or its wait timed out), an auto-increment column far from its limit.
        "failed to read auto-increment value",
        // MariaDB 1020: a row changed under a consistent read; the next attempt reads it.
        "record has changed since last read",
        // The server short of something for a while: transactions (1637), memory (1037,
        // 1038, 1041), threads (1135), connections of the user (1203), disk or a
        // temporary table's room (1021, 1114); a statement to prepare again (1615).
        "too many active concurrent transactions",
        "out of memory",
        "out of sort memory",
        "can't create a new thread",
        "max_user_connections",
        "disk full",
        "is full",
        "needs to be re-prepared",
    ];
    let lower = message.to_ascii_lowercase();
    // The transaction expired or went with a failover: the batch's next attempt begins
    // a new one.
    says_transaction_not_found(message) || PASSING.iter().any(|p| lower.contains(p))
}

/// Whether `error` says the database chose its statement as a lock's victim: a deadlock
/// (InnoDB rolled its whole transaction back), or the AUTO-INC lock a deadlock or a lock
/// wait kept from it (1467, its statement rolled back). Either way nothing of the
/// statement stayed: an autocommit statement may be sent again at once, and a
/// transaction, rolled back, begun anew. MySQL's message is passed on by the Data API
/// with no code of its own.
pub fn is_lock_victim(error: &StoreError) -> bool {
    let lower = error.to_string().to_ascii_lowercase();
    lower.contains("deadlock found") || lower.contains("failed to read auto-increment value")
}

/// Whether an error's text says the Data API no longer knows the transaction (it
/// committed, rolled back, expired, or went with a failover). The service has said so
/// as `TransactionNotFoundException` and, in earlier versions, as a
/// `BadRequestException` with this text: the text is the one both share.
pub fn says_transaction_not_found(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("transaction") && lower.contains("not found")
}

/// Whether a database error's text says a row lock was held by another transaction
/// (`NOWAIT`, or a lock wait that timed out), as opposed to the database being
/// unreachable.
fn is_lock_conflict(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("lock wait timeout") || lower.contains("nowait is set")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_row_lock_is_told_apart_from_an_unreachable_database() {
        assert!(is_lock_conflict(
            "Lock wait timeout exceeded; try restarting transaction"
        ));
        assert!(is_lock_conflict(
            "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set."
        ));
        assert!(!is_lock_conflict("Communications link failure"));
        assert!(!is_lock_conflict("Duplicate entry '1' for key 'PRIMARY'"));
    }

    #[test]
    fn passing_database_states_are_transient_and_data_errors_are_not() {
        for transient in [
            "Lock wait timeout exceeded; try restarting transaction",
            "Deadlock found when trying to get lock; try restarting transaction",
            "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set.",
            "The MySQL server is running with the --read-only option so it cannot execute this statement",
            "Connection was killed",
            "Communications link failure\n\nThe last packet sent successfully to the server was 0 milliseconds ago.",
            "Table definition has changed, please retry transaction",
            "The last transaction was aborted due to Seamless Scaling. Please retry.",
            "Transaction AQC9dZ8l... is not found",
            "Record has changed since last read in table 'orders'",
            "Too many active concurrent transactions",
            "Out of memory; check if mysqld or some other process uses all available memory",
            "Out of sort memory, consider increasing server sort buffer size",
            "Can't create a new thread (errno 11); if you are not out of available memory",
            "User app already has more than 'max_user_connections' active connections",
            "The table '#sql-temptable-1' is full",
            "Prepared statement needs to be re-prepared",
            "Failed to read auto-increment value from storage engine",
        ] {
            assert!(is_transient_database_error(transient), "{transient}");
        }
        for permanent in [
            "Duplicate entry '1' for key 'PRIMARY'",
            "Data too long for column 'user_id' at row 1",
            "CONSTRAINT `vouchers_stock_left_nonnegative` failed for `seckill`.`vouchers`",
            "Table 'seckill.orders' doesn't exist",
        ] {
            assert!(!is_transient_database_error(permanent), "{permanent}");
        }
    }

    /// `message` as the Data API answers a database error: `DatabaseErrorException`.
    fn database_error(message: &str) -> StoreError {
        use aws_sdk_rdsdata::error::ErrorMetadata;
        use aws_sdk_rdsdata::operation::execute_statement::ExecuteStatementError;
        use aws_sdk_rdsdata::types::error::DatabaseErrorException;
        let meta = ErrorMetadata::builder()
            .code("DatabaseErrorException")
            .message(message)
            .build();
        let e = DatabaseErrorException::builder()
            .message(message)
            .meta(meta)
            .build();
        store_error(SdkError::service_error(
            ExecuteStatementError::DatabaseErrorException(e),
            (),
        ))
    }

    #[test]
    fn the_data_apis_answers_are_sorted_as_the_drainer_needs() {
        // Permanent: the statement was refused, and may be one order's fault.
        let refused = database_error("Duplicate entry '1' for key 'PRIMARY'");
        assert!(matches!(refused, StoreError::Database(_)), "{refused:?}");
        // A lock's victims are transient, never a refusal: no order is blamed for them.
        for victim in [
            "Deadlock found when trying to get lock; try restarting transaction",
            "Failed to read auto-increment value from storage engine",
        ] {
            let e = database_error(victim);
            assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
            assert!(is_lock_victim(&e), "{e:?}");
        }
        let held = database_error("Lock wait timeout exceeded; try restarting transaction");
        assert!(matches!(held, StoreError::Locked { .. }), "{held:?}");
        assert!(!is_lock_victim(&held));
    }

    #[test]
    fn a_deadlock_or_an_auto_increment_lock_lost_is_a_lock_victim_and_nothing_else_is() {
        let err = |m: &str| StoreError::Unavailable {
            backend: "data api",
            detail: format!("DatabaseErrorException: {m}"),
        };
        assert!(is_lock_victim(&err(
            "Deadlock found when trying to get lock; try restarting transaction"
        )));
        assert!(is_lock_victim(&err(
            "Failed to read auto-increment value from storage engine"
        )));
        // A lock wait that timed out on a row keeps the transaction's earlier statements:
        // not a victim (the drainer waits and tries the lock again).
        assert!(!is_lock_victim(&err(
            "Lock wait timeout exceeded; try restarting transaction"
        )));
        assert!(!is_lock_victim(&err("Communications link failure")));
        assert!(!is_lock_victim(&StoreError::Database(
            "DatabaseErrorException: Duplicate entry '1' for key 'PRIMARY'".into()
        )));
    }
}

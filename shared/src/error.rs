//! The error of the adapter layer: what can go wrong talking to Redis or the database.
//!
//! Entry points map it to their own errors (the HTTP layer to `503 unavailable`, the
//! drainer to "leave pending and retry"). The distinction that matters downstream is
//! whether retrying later can help.

/// A failure of Redis or the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Timed out, refused, resuming, throttled: retrying later can help.
    #[error("{backend} unavailable: {detail}")]
    Unavailable {
        backend: &'static str,
        detail: String,
    },
    /// A row was locked by another transaction (`NOWAIT`, or a lock wait that timed out):
    /// retrying later can help, and the holder may be worth looking for.
    #[error("{backend} row locked: {detail}")]
    Locked {
        backend: &'static str,
        detail: String,
    },
    /// The admission of `order_id` may have happened but cannot be promised: in durable
    /// mode the script admitted it but fewer replicas than required acknowledged the
    /// write in time (a failover could still lose it); in any mode Redis gave no reply
    /// in time (the script may have run). Not a refusal: the order may well exist.
    #[error("admission of order {order_id} not confirmed: {detail}")]
    Unconfirmed {
        order_id: crate::domain::OrderId,
        detail: String,
    },
    /// The database refused a statement (constraint, syntax): retrying will not help.
    #[error("database refused the statement: {0}")]
    Database(String),
    /// Data came back in a shape the code does not expect.
    #[error("unexpected data: {0}")]
    Corrupt(String),
}

impl StoreError {
    pub fn redis(err: redis::RedisError) -> StoreError {
        StoreError::Unavailable {
            backend: "redis",
            detail: err.to_string(),
        }
    }

    /// True when a later retry may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. }
                | StoreError::Locked { .. }
                | StoreError::Unconfirmed { .. }
        )
    }
}

impl From<redis::RedisError> for StoreError {
    fn from(err: redis::RedisError) -> StoreError {
        StoreError::redis(err)
    }
}

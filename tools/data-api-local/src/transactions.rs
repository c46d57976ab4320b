//! Open transactions: each holds its own MariaDB connection (with `START TRANSACTION`
//! run on it) until commit, rollback, an error that aborts it, or the idle timeout.
//!
//! A transaction's connection sits behind an async mutex, so calls on one transaction
//! run one after the other. The connection is an `Option`: whoever ends the transaction
//! takes it out, and a call that was queued behind the ending one then finds `None` and
//! answers `TransactionNotFoundException`, like a call that arrives later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use tokio::sync::OwnedMutexGuard;

use crate::error::ApiError;

pub type Slot = Option<Conn>;

pub struct Transaction {
    pub id: String,
    slot: Arc<tokio::sync::Mutex<Slot>>,
    last_used: Mutex<Instant>,
}

impl Transaction {
    /// Records a call: the idle timeout counts from the last call's start or end.
    pub fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Waits for the calls ahead on this transaction, then holds its connection.
    pub async fn lock(&self) -> Result<OwnedMutexGuard<Slot>, ApiError> {
        let guard = self.slot.clone().lock_owned().await;
        guard
            .is_some()
            .then_some(guard)
            .ok_or_else(|| not_found(&self.id))
    }
}

pub fn not_found(id: &str) -> ApiError {
    ApiError::TransactionNotFound(format!("Transaction {id} is not found"))
}

pub struct Registry {
    open: Mutex<HashMap<String, Arc<Transaction>>>,
    idle_timeout: Duration,
}

impl Registry {
    pub fn new(idle_timeout: Duration) -> Self {
        Registry {
            open: Mutex::new(HashMap::new()),
            idle_timeout,
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Transaction>>> {
        // Nothing panics while holding this lock; recover the map if something did.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection on which `START TRANSACTION` ran; returns its id.
    pub fn insert(&self, conn: Conn) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let tx = Arc::new(Transaction {
            id: id.clone(),
            slot: Arc::new(tokio::sync::Mutex::new(Some(conn))),
            last_used: Mutex::new(Instant::now()),
        });
        self.open().insert(id.clone(), tx);
        id
    }

    pub fn get(&self, id: &str) -> Result<Arc<Transaction>, ApiError> {
        let tx = self.open().get(id).cloned().ok_or_else(|| not_found(id))?;
        tx.touch();
        Ok(tx)
    }

    /// Ends the transaction whose connection `slot` holds (the caller holds its lock):
    /// forgets it and hands back the connection for COMMIT or ROLLBACK.
    pub fn end(&self, id: &str, slot: &mut OwnedMutexGuard<Slot>) -> Result<Conn, ApiError> {
        self.open().remove(id);
        slot.take().ok_or_else(|| not_found(id))
    }

    /// Ends the transaction and rolls it back (after an error inside it, or idleness).
    pub async fn abort(&self, id: &str, slot: &mut OwnedMutexGuard<Slot>) {
        let Ok(mut conn) = self.end(id, slot) else {
            return;
        };
        if let Err(err) = conn.query_drop("ROLLBACK").await {
            // Dropping the connection rolls back on the server anyway (the pool resets
            // or discards it).
            tracing::warn!(%err, "ROLLBACK failed");
        }
    }

    /// Rolls back every transaction idle for longer than the timeout. One that is busy
    /// (a call holds its connection) is not idle.
    pub async fn reap_idle(&self) {
        let candidates: Vec<Arc<Transaction>> = self
            .open()
            .values()
            .filter(|tx| tx.idle_for() >= self.idle_timeout)
            .cloned()
            .collect();
        for tx in candidates {
            let Ok(mut slot) = tx.slot.clone().try_lock_owned() else {
                continue;
            };
            // Re-check under the lock: a call may have finished in between.
            if tx.idle_for() < self.idle_timeout {
                continue;
            }
            tracing::info!(transaction_id = %tx.id, "rolling back idle transaction");
            self.abort(&tx.id, &mut slot).await;
        }
    }

    /// Runs [`reap_idle`](Self::reap_idle) often enough that a transaction is rolled
    /// back within a tenth of the timeout after it expires.
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let registry = Arc::clone(self);
        let every =
            (self.idle_timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(5));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                registry.reap_idle().await;
            }
        })
    }

    /// Rolls back everything still open (at shutdown).
    pub async fn rollback_all(&self) {
        let all: Vec<Arc<Transaction>> = self.open().drain().map(|(_, tx)| tx).collect();
        for tx in all {
            self.abort(&tx.id, &mut tx.slot.clone().lock_owned().await)
                .await;
        }
    }
}

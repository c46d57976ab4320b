//! Locking the std mutexes of the server's shared maps (connection pools, open
//! transactions, secrets) whether or not a panic poisoned them.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Nothing panics while holding these locks; recover the map if something did.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

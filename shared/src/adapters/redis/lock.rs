//! Short locks in Redis: one key set with `SET NX PX` under its holder's name, for a
//! bounded time, and given back only by that holder. They spare work done twice at once
//! (a sale's repair, a queue's restore, a run's event publication); what each lock
//! guards, and why its time is what it is, is its caller's to say.
//!
//! One key, no hash tag needed: each call touches that key alone (cluster-safe).

use super::conn::RedisConn;
use crate::error::StoreError;

/// Takes `key` for `ttl_ms` under `holder`; false when another holder has it.
pub async fn try_lock(
    conn: &RedisConn,
    key: &str,
    holder: &str,
    ttl_ms: u64,
) -> Result<bool, StoreError> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(holder)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(&mut conn.clone())
        .await?;
    Ok(set.is_some())
}

/// Gives `key` back if `holder` still has it: a lock that timed out and was taken by
/// another holder is left alone.
pub async fn unlock(conn: &RedisConn, key: &str, holder: &str) -> Result<(), StoreError> {
    let held: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn.clone())
        .await?;
    if held.as_deref() == Some(holder) {
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn.clone())
            .await?;
    }
    Ok(())
}

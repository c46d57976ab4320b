//! Rate limits that hold across function instances: one Redis key per caller and route
//! class (`lua/rate.lua`, GCRA), for the routes where a caller multiplied by the number
//! of warm instances would cost the database (reads of orders).
//!
//! One script call per request, on the caller's own slot (its key carries a digest of
//! the caller as its hash tag: cluster-safe, and callers spread over the slots). The key
//! expires once the caller is back to a full burst, so Redis holds only recent callers.

use std::sync::LazyLock;

use redis::Script;
use sha2::{Digest, Sha256};

use crate::adapters::redis::RedisConn;
use crate::error::StoreError;

static RATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/rate.lua")));

/// A limit: `per_sec` requests per second with bursts of `burst`; `per_sec == 0` is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub per_sec: u32,
    pub burst: u32,
}

/// The key of `caller`'s limit on `class`: its hash tag is a digest of the caller (a user
/// id may hold `{` or `}`, and must not pick its slot).
pub fn key(class: &str, caller: &str) -> String {
    let digest = Sha256::digest(caller.as_bytes());
    let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("seckill:rate:{{{tag}}}:{class}")
}

/// Takes one request of `caller` on `class` against `limit`, for every instance at once:
/// false when over it.
pub async fn allow(
    conn: &RedisConn,
    class: &str,
    caller: &str,
    limit: Limit,
) -> Result<bool, StoreError> {
    if limit.per_sec == 0 {
        return Ok(true);
    }
    let interval_ms = (1000 / u64::from(limit.per_sec)).max(1);
    let burst_ms = interval_ms * u64::from(limit.burst.max(1) - 1);
    let allowed: i64 = RATE
        .key(key(class, caller))
        .arg(interval_ms)
        .arg(burst_ms)
        .invoke_async(&mut conn.clone())
        .await?;
    Ok(allowed == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{hash_tag, slot};

    #[test]
    fn a_callers_key_has_a_tag_of_its_own_whatever_the_caller_holds() {
        let k = key("reads", "al{ice}");
        assert_eq!(hash_tag(&k).len(), 16, "{k}");
        assert!(k.ends_with(":reads"));
        assert_eq!(key("reads", "alice"), key("reads", "alice"));
        assert_ne!(slot(&key("reads", "alice")), slot(&key("reads", "bob")));
    }
}

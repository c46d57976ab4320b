//! Which Redis Cluster slot a key lands on, and the salts that place a voucher's bucket
//! tags on the slot space.
//!
//! [`slot`] and [`hash_tag`] follow the Redis Cluster specification exactly (CRC16 of
//! the hash tag), so the code can tell which primary a key lives on without asking.
//! [`bucket_salt`] is a pure function of the voucher, the bucket and the bucket count:
//! bucket keys are derived, never stored, so a salt once given never changes (the
//! tests pin its values).

use crate::domain::ids::VoucherId;

/// How many hash slots a Redis Cluster has.
pub const SLOTS: u16 = 16_384;

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag, modulo [`SLOTS`].
pub fn slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for b in hash_tag(key).bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// How far (in slots) a bucket may sit from its place in the lattice
/// ([`bucket_salt`]): small enough that buckets stay at least `SLOTS / k - 64` apart
/// (more than `SLOTS / n` for every k < n <= 16), large enough that a salt is found in
/// about `SLOTS / 64` = 256 tries.
const BUCKET_WINDOW: u32 = 64;

/// The salt in the hash tag of bucket `index` (>= 1) of a voucher of `buckets` buckets
/// (`{<voucher>.<index>.<salt>}`, see [`Bucket`](crate::domain::Bucket)): the smallest
/// one that puts bucket b within [`BUCKET_WINDOW`] slots of `home + b * SLOTS / k` (mod
/// `SLOTS`), home being the slot of the voucher's own tag (bucket 0). The k buckets then
/// form a lattice of step `SLOTS / k`, each window leaning towards the middle of its
/// k-th, so on a cluster whose n primaries own equal contiguous slot ranges (what
/// `--cluster create` makes):
/// - n = k: one bucket per primary (each bucket stays in its own k-th);
/// - n > k: no two buckets on one primary (they are more than `SLOTS / n` apart);
/// - n < k: as even as k buckets over n primaries go.
///
/// Random tags would put two of three buckets on one of three primaries more often than
/// not. The search (about 256 CRC16s) runs once per bucket and process (memoised).
pub fn bucket_salt(voucher: VoucherId, index: u16, buckets: u16) -> u16 {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    /// (voucher, index, buckets) → salt.
    type Salts = HashMap<(VoucherId, u16, u16), u16>;
    static FOUND: LazyLock<Mutex<Salts>> = LazyLock::new(Mutex::default);
    if index == 0 || buckets <= 1 {
        return 0;
    }
    let memo = |m: &Mutex<HashMap<_, u16>>| {
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(voucher, index, buckets))
            .copied()
    };
    if let Some(salt) = memo(&FOUND) {
        return salt;
    }
    let (k, slots) = (u32::from(buckets), u32::from(SLOTS));
    let home = u32::from(slot(&voucher.to_string()));
    // Lean inwards: a home in the lower half of its k-th takes windows above each
    // lattice point, one in the upper half windows below, so no window crosses into the
    // next k-th (every lattice point sits at home's offset in its own k-th).
    let offset = home * k % slots;
    let upward = offset < slots / 2;
    let target = (home + (u32::from(index) * slots).div_ceil(k)) % slots;
    let near = |s: u32| {
        let d = if upward {
            (s + slots - target) % slots
        } else {
            (target + slots - s) % slots
        };
        d < BUCKET_WINDOW
    };
    let salt = (0..u16::MAX)
        .find(|salt| near(u32::from(slot(&format!("{voucher}.{index}.{salt}")))))
        .unwrap_or(0);
    FOUND
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((voucher, index, buckets), salt);
    salt
}

/// The hash tag of a key: what Redis Cluster hashes to pick its slot.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot("123456789"), 0x31c3);
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
    }

    /// Bucket keys are derived, never stored: a change to [`bucket_salt`] renames the
    /// keys of every live bucketed sale (its buyers and stock would vanish from view).
    /// These values pin it; change them only with a migration of live sales.
    #[test]
    fn bucket_salts_never_change() {
        let salt = |v: i64, i: u16, k: u16| bucket_salt(VoucherId::new(v).unwrap(), i, k);
        assert_eq!(
            [
                salt(1, 1, 2),
                salt(42, 1, 3),
                salt(42, 2, 3),
                salt(777, 15, 16)
            ],
            [106, 267, 49, 1]
        );
        assert_eq!(salt(42, 0, 3), 0);
    }

    #[test]
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("a{b}c"), "b");
        assert_eq!(hash_tag("a{}c"), "a{}c");
        assert_eq!(hash_tag("abc"), "abc");
        assert_eq!(hash_tag("{x}{y}"), "x");
    }
}

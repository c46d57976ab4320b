//! The Lua scripts of the sale, loaded once per process (`redis::Script` sends EVALSHA
//! and reloads a script on NOSCRIPT by itself).
//!
//! The cluster client tells some requests apart by their script's hash (an admission is
//! resent marked as a resend, a give never: see `cluster.rs`), so those scripts live
//! here, below both the connection and the calls that run them; that is also why
//! `lua/give.lua`, run by the transfers between buckets, is defined here.

use std::sync::LazyLock;

use redis::Script;

pub(super) static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/admit.lua")));
pub(super) static PRELOAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/preload.lua")));
pub(super) static RESTORE_BUYERS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/restore_buyers.lua")));
pub(super) static LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/lease.lua")));
/// `lua/close.lua`: paying, cancelling and expiring orders (also run by the drainer).
pub(crate) static CLOSE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/close.lua")));

/// `lua/grace.lua`: a checkout's payment in progress holds its unit past the deadline.
pub(crate) static GRACE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/grace.lua")));

/// `lua/give.lua`, for [`crate::adapters::transfers`] (the Redis adapter never sends it
/// twice: see its `resendable`).
pub(crate) static GIVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/give.lua")));

//! A sale as Redis holds it: what one admission attempt was told, what reopening a lost
//! sale found, and the numbers of a sale hash.

use super::clock::UnixMillis;
use super::ids::OrderId;
use super::voucher::SaleWindow;

/// What the admission script decided for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Stock taken, buyer recorded, order queued.
    Admitted {
        order_id: OrderId,
        stock_after: i64,
    },
    /// Redis has no sale for this voucher (never preloaded, or lost).
    NotLoaded,
    NotStarted,
    Ended,
    SoldOut,
    /// The user already holds `order_id` for this voucher.
    AlreadyPurchased {
        order_id: OrderId,
    },
}

/// What the admission script answered. A refusal also carries the sale window when
/// Redis knows it (so the instance can answer `not_started` / `ended` later without
/// calling Redis) and the Redis server's clock that decided it; an admission carries
/// neither (its reply is kept to one integer: the caller reached Redis, so the sale was
/// open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitReply {
    pub admission: Admission,
    pub window: Option<SaleWindow>,
    /// The server time (`TIME`, unix ms) the script judged the window by, on refusals.
    pub server_ms: Option<UnixMillis>,
}

/// What reopening a sale found (`RedisSales::reopen`, `lua/preload.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reopen {
    /// The sale hash was created now.
    Created,
    /// The sale was already there (live stock, left as it is).
    AlreadyLive,
    /// The buyers hash holds fewer buyers than the database settled: Redis lost data
    /// again during the repair. Nothing was written; repair again.
    BuyersLost,
}

/// A sale hash's numbers (`lua/preload.lua` writes them); `None` for a field that is
/// missing or not a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleState {
    pub stock: Option<i64>,
    pub total: Option<i64>,
    pub begins_ms: Option<UnixMillis>,
    pub ends_ms: Option<UnixMillis>,
}

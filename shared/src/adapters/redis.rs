//! The Redis adapter: connections and the sale's atomic scripts.
//!
//! [`RedisConn`] hides whether Redis runs as one node or as a cluster (ElastiCache
//! Serverless is always cluster mode; the local stack runs cluster mode too). Scripts are
//! kept in `lua/` and run with `redis::Script`, which sends EVALSHA and reloads the
//! script on NOSCRIPT by itself. Every script receives all its keys in `KEYS`, built by
//! [`crate::keys`] with one hash tag per call (invariant 4).
//!
//! The parts, each in its own child module: `conn` (the connection), `cluster` (the
//! cluster client's replacement and resends), `redirect` (MOVED and ASK), `scripts`
//! (the Lua scripts), `pipelined` (many commands as pipelines where one node serves
//! every slot), `sales` (the handle, admission and closes), `load` (loading, repairing
//! and reading a sale) and `order_ids` (leased order ids); this module only re-exports
//! them.

mod cluster;
mod conn;
mod load;
pub mod lock;
mod order_ids;
mod pipelined;
mod redirect;
mod sales;
mod scripts;

pub use cluster::{Cluster, REPLACE_AT_MOST_EVERY, SPLIT_SLOT_BUDGET};
pub use conn::{RedisConn, install_crypto_provider};
pub use load::{RESTORE_STREAM_PAGE, Restored};
pub use order_ids::OrderIds;
pub use pipelined::{AfterFailure, MAX_PER_PIPELINE};
pub use sales::{CloseAction, RedisSales, admission_of};
pub(crate) use scripts::{CLOSE, GIVE};

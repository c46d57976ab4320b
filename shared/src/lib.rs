//! The library both seckill functions stand on.
//!
//! - [`domain`]: ids, vouchers, sale windows, admission outcomes, parsed once at the edge;
//! - [`order_id`]: the time-prefixed order id layout and block leasing;
//! - [`auth`]: identities from verified tokens only (invariant 5);
//! - [`keys`]: Redis key names, one hash tag per voucher (invariant 4);
//! - [`protocol`]: what Rust and the Lua scripts share: result codes, stream and hash
//!   fields, mirrored by a header in each script;
//! - [`adapters`]: Redis and the RDS Data API, the only code that does I/O;
//! - [`migrate`]: the schema, applied through the Data API;
//! - [`sale_status`]: a sale's numbers in Redis and the database, for operators;
//! - [`webhook`]: the payment provider's signed events (the only way an order is paid);
//! - [`json`]: how request bodies read integers and absent fields (as the contract's
//!   schema does);
//! - [`config`], [`error`], [`telemetry`]: typed configuration, adapter errors, logging.

pub mod adapters;
pub mod auth;
pub mod config;
pub mod domain;
pub mod entry;
pub mod error;
pub mod json;
pub mod keys;
pub mod metrics;
pub mod migrate;
pub mod order_id;
pub mod protocol;
pub mod refunds;
pub mod sale_status;
pub mod telemetry;
pub mod webhook;

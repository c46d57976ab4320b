//! The database adapter: Aurora MySQL through the RDS Data API (`aws-sdk-rdsdata`).
//!
//! Locally the same client talks to `tools/data-api-local` through an endpoint override,
//! so tests run the production code path. Every value is bound as a named parameter,
//! never spliced into SQL. Errors are sorted once, in [`store_error`], into transient
//! (retry later) and permanent.
//!
//! The parts, each in its own child module: `client` (the client and transactions),
//! `errors` (sorting failures), `values` (parameters, fields, timestamps), `vouchers`
//! and `orders` (their tables' statements) and `snapshot` (a consistent read of a sale);
//! this module only re-exports them.

mod client;
mod errors;
pub mod orders;
pub mod queue;
mod snapshot;
mod values;
mod vouchers;

pub use client::{DataApi, sdk_config};
pub use errors::{is_lock_victim, is_transient_database_error, store_error};
pub use snapshot::{BuyerRows, SNAPSHOT_PAGE_ROWS, SaleSnapshot, snapshot_page_sql};
pub use values::{USER_ID_TEXT, field, format_datetime, param, parse_datetime};

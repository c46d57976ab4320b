//! Support for the end-to-end and integration suites.
//!
//! Every suite runs against real parts: the local stack started by `scripts/stack.sh up`
//! (Redis in cluster mode, MariaDB, the local Data API server, `cargo lambda watch`),
//! whose addresses are read from `.dev/stack.env` (or the same names in the environment).
//! A suite that cannot find the stack fails loudly instead of skipping: a test that
//! cannot fail is a defect.

pub mod api;
pub mod browser;
pub mod contract;
pub mod drainer;
pub mod events;
pub mod harness;
pub mod mysql;
pub mod pinned;
pub mod redis;
pub mod stack;
pub mod stripe;

pub use stack::StackEnv;

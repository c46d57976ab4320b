//! Adapters: the only code that talks to Redis or the database.

pub mod closes;
pub mod data_api;
pub mod events;
pub mod ledger;
pub mod order_stream;
pub mod payments;
pub mod queue;
pub mod rate;
pub mod redis;
pub mod secrets;
pub mod stripe;
pub mod transfers;

//! seckill-http: the admission function behind the public HTTP API.
//!
//! The admission path, top to bottom ([`routes::handle`] → [`admission`]): verify the caller
//! ([`identity`]), answer from this instance's memory if it can ([`cache`]), apply the
//! per-user rate limit ([`limiter`]), take an order id from a leased block, run the one
//! atomic Lua script, answer `202` with the order id. The database is written later by
//! order-drainer. The other routes: [`vouchers`], [`queue`], [`orders`], [`payment`],
//! [`webhook`] (the payment provider's events), [`operators`] (the live view's figures)
//! and [`pages`] (the buyer page and the live view).
//!
//! Modules refer only downwards: [`routes`] → the handlers ([`vouchers`], [`admission`],
//! [`orders`], [`webhook`] → [`payment`]) → [`repair`] and [`lookup`] → [`app`] → [`config`]; the
//! leaves ([`error`], [`request`], [`identity`], [`cache`], [`limiter`],
//! [`secrets`], [`costs`]) refer to none of these. [`queue`] (the waiting room) is a handler too,
//! and the admission asks it for the entry check.

pub mod admission;
pub mod app;
pub mod cache;
pub mod config;
pub mod costs;
pub mod edge;
pub mod error;
pub mod identity;
pub mod limiter;
pub mod lookup;
pub mod operators;
pub mod orders;
pub mod pages;
pub mod payment;
pub(crate) mod positions;
pub mod queue;
pub mod repair;
pub mod request;
pub mod routes;
pub mod secrets;
pub mod stripe;
pub mod vouchers;
pub mod webhook;

pub use app::App;
pub use config::Config;
pub use routes::handle;

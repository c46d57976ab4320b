//! The consumer side of the orders streams: what the order drainer asks of Redis.
//!
//! Admission (`lua/admit.lua`) appends one entry per admitted order to
//! `seckill:{<vid>}:orders`; the drainer reads them through the consumer group
//! [`crate::keys::DRAIN_GROUP`]. This module keeps the stream invariants the drainer
//! relies on:
//!
//! - the group exists before any read: preloading a sale makes it, and
//!   [`OrderStreams::probe`], the drainer's first call on every stream, makes it again
//!   where it is missing, so `NOGROUP` never happens;
//! - an entry leaves the pending list only by [`OrderStreams::ack`] (after its batch is
//!   committed) or by [`OrderStreams::dead_letter`], which copies it to
//!   `seckill:{<vid>}:dead` and acks it in one script (`lua/dead_letter.lua`), so an
//!   entry is never acked without being either in the database or in the dead letters;
//!   [`OrderStreams::release`] gives unfinished entries back without acking them;
//! - [`OrderStreams::trim`] removes only entries every group has acked and that were
//!   delivered (`lua/trim.lua`, `XTRIM MINID` below both bounds), never `MAXLEN`;
//! - every script gets all its keys in `KEYS`, with the voucher's one hash tag.
//!
//! Entry fields are kept as raw bytes: a malformed entry must reach the dead-letter stream
//! exactly as it was written, not as a lossy re-encoding.
//!
//! The parts, each in its own child module: `reading` (the handle, and entries handed
//! out), `finishing` (ack, dead letter, trim), `survey` (the active set, probes, stats,
//! retiring a sale), `drain_tx` (open drainer transactions), `operator` (an operator's
//! reads, replays and requeues), `parse` (stream replies) and `scripts`; this module
//! only re-exports them.

mod drain_tx;
mod finishing;
mod operator;
mod parse;
mod reading;
mod scripts;
mod survey;

pub use finishing::Trimmed;
pub use operator::RANGE_PAGE;
pub use parse::{ClaimPage, id_less};
pub use reading::OrderStreams;
pub use survey::{Probe, REAP_PER_PROBE, StreamStats};

//! Orders between admission and the database: an admitted order as its stream entry
//! holds it, parsed or not yet parsed, an order row it collides with, and a dead letter.
//!
//! A [`StreamEntry`] keeps its fields as raw bytes: a malformed entry must reach the
//! dead-letter stream exactly as it was written, not as a lossy re-encoding. Its field
//! names are [`crate::protocol::fields`].

use super::clock::UnixMillis;
use super::ids::{OrderId, UserId, VoucherId};

/// An order admitted by Redis, parsed from its stream entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmittedOrder {
    pub id: OrderId,
    pub voucher: VoucherId,
    pub user: UserId,
    pub admitted_ms: UnixMillis,
}

/// An order row that already exists and collides with an order of the batch, by id or
/// by (voucher, user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingOrder {
    pub id: OrderId,
    pub voucher: VoucherId,
    pub user: String,
    /// Still counts as the buyer's order (not cancelled or expired): only such an order
    /// keeps its buyer from holding another.
    pub live: bool,
}

/// One entry of an orders stream as Redis holds it, not yet parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEntry {
    /// The stream id (`<ms>-<seq>`).
    pub id: String,
    /// Field/value pairs in stream order, as raw bytes.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Times delivered to a consumer, this delivery included (1 for a first read;
    /// from XPENDING for a claimed entry; 0 when Redis no longer reported it).
    pub deliveries: u64,
}

impl StreamEntry {
    /// The milliseconds part of the entry's id (`<ms>-<seq>`): when the server appended
    /// it, which for an admission's entry is the admission time.
    pub fn id_ms(&self) -> Option<UnixMillis> {
        self.id.split_once('-').and_then(|(ms, _)| ms.parse().ok())
    }

    /// The value of the first field called `name`.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }
}

/// One entry of a dead-letter stream (written by `lua/dead_letter.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream.
    pub id: String,
    /// Why it was dead-lettered (`reason`; empty when the entry has none).
    pub reason: String,
    /// Deliveries before it was dead-lettered (`deliveries`; 0 when unknown).
    pub deliveries: u64,
    /// The orders-stream entry as it was admitted: `id` is its orders-stream id
    /// (`source_id`), `fields` its original fields, without the ones the dead letter
    /// added.
    pub entry: StreamEntry,
    /// The close Redis had decided for the order when it was dead-lettered (`close`, as
    /// `lua/close.lua` writes it; [`crate::domain::ClosedOrder::parse`] reads it): `None`
    /// for an order still open, or of a voucher without a payment step. A replay puts
    /// it back.
    pub close: Option<String>,
}

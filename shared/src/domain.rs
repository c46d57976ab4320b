//! Domain types, parsed once at the edge ("parse, don't validate").
//!
//! A value of one of these types is valid by construction: a [`VoucherId`] is a positive
//! 63-bit integer, a [`UserId`] is a non-empty string of at most 64 bytes without control
//! characters, a [`SaleWindow`] begins before it ends. Everything past the HTTP edge can
//! rely on that and never re-checks.
//!
//! Each kind of value lives in a child module (`ids`, `bucket`, `clock`, `status`,
//! `order`, `sale`, `voucher`, `room`); this module only re-exports them.

mod bucket;
mod clock;
pub(crate) mod ids;
mod order;
mod room;
mod sale;
mod status;
mod voucher;

pub use bucket::{Bucket, MAX_BUCKETS, PLANNED_ADMISSIONS_PER_BUCKET};
pub use clock::{UnixMillis, format_rfc3339_millis, now_millis, parse_rfc3339_millis};
pub use ids::{MAX_USER_ID_BYTES, OrderId, PaymentRef, UserId, ValidationError, VoucherId};
pub use order::{AdmittedOrder, DeadLetter, ExistingOrder, StreamEntry};
pub use room::{
    DEFAULT_QUEUE_OPENS_BEFORE_S, ENTRY_TOKEN_TTL_MS, MAX_ENTRY_RATE_PER_S,
    MAX_QUEUE_OPENS_BEFORE_S, Standing, WaitingRoom,
};
pub use sale::{Admission, AdmitReply, Reopen, SaleState};
pub use status::{ClosedOrder, OrderStatus};
pub use voucher::{
    DEFAULT_REBUY_LIMIT, MAX_PAY_WITHIN_S, MAX_PRICE_MINOR, MAX_REBUY_LIMIT, MAX_SALE_TIME_MS,
    MAX_STOCK, MAX_TITLE_CHARS, NewVoucher, PaymentTerms, Phase, Price, SaleWindow, Voucher,
};

//! Moving stock between the buckets of one voucher (docs/design.md "Stock
//! buckets").
//!
//! A buyer always buys from their own bucket ([`Bucket::of_user`]). When it runs dry
//! while other buckets still hold units, the instance serving that buyer borrows: a
//! donor gives half of its stock and writes the transfer down (`lua/give.lua`, one
//! script), the recipient adds it at most once (`lua/take.lua`, keyed by the transfer
//! id), and only then is the donor's record deleted. Units are never created (a give
//! takes them out first) and never lost: a record stays until its units arrived, and
//! [`finish_open`] (the drainer's survey) completes records their caller left behind.
//!
//! A sale with a waiting room keeps returned units for its line, in bucket 0 where the
//! line is (`lua/queue.lua`): a unit given back in another bucket travels there as a
//! transfer of its own (`lua/close.lua` records it, [`deliver_returned`] delivers it, to
//! be held), and an offered buyer of another bucket takes one home with their offer
//! ([`claim_offer`]). Neither is a unit anyone may borrow ([`units`] leaves them out).
//!
//! Once every bucket was found empty with no transfer open, [`mark_sold_out`] sets the
//! voucher's sold-out mark in bucket 0's slot, so instances that learn the voucher's own
//! bucket is empty stop asking every other bucket in turn.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script};

use super::redis::{GIVE, RedisConn, RedisSales};
use crate::domain::UserId;
use crate::domain::{Bucket, OrderId, UnixMillis, VoucherId};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::{DEADLINES_SENTINEL, sale_fields, transfer};

static TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/take.lua")));
static TRANSFER_RECORDS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/transfer_records.lua")));

/// How long the voucher's sold-out mark lives unless a returned unit deletes it first.
/// A mark set just after a unit came back (a race with the return's delete) is wrong
/// for at most this long.
pub const SOLD_OUT_MARK: Duration = Duration::from_secs(5);

/// A transfer record older than this is finished by the drainer: the instance that
/// gave it finishes it within one round trip unless it died.
pub const STALE_TRANSFER_MS: i64 = 2_000;

/// What one [`borrow`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Borrowed {
    /// Units added to the recipient now.
    pub units: i64,
    /// Transfers that were open (units on their way) at the donors asked.
    pub open: u64,
    /// Donors whose sale is not loaded (lost; a repair brings them back).
    pub missing: u16,
    /// Redis calls (round trips) this borrow made: a give per donor asked, and for
    /// units given, the take and the donor record's delete.
    pub calls: u32,
}

/// Borrows for `to` from the other buckets of its voucher (`buckets` in all), asking
/// each in turn from the next one on, until one gives units. `transfer` must be unique
/// per call (a transfer id is received once: reusing one would drop units).
///
/// In durable mode each step waits for the replicas like an admission, and the next
/// step starts only once the one before is held: a give the replicas did not take is
/// left to the drainer (whose take then waits too), so a failover can undo a step but
/// never leave units both in their recipient and back in their donor.
pub async fn borrow(
    sales: &RedisSales,
    buckets: u16,
    to: Bucket,
    transfer: &str,
) -> Result<Borrowed, StoreError> {
    let mut out = Borrowed::default();
    for step in 1..buckets {
        let index = (to.index() + step) % buckets;
        let Some(donor) = Bucket::new(to.voucher(), index, buckets) else {
            continue;
        };
        let k = VoucherKeys::new(donor);
        let mut call = GIVE.key(&k.sale);
        call.key(&k.transfers)
            .key(&k.offers)
            .arg(transfer)
            .arg(to.to_string())
            .arg("");
        out.calls += 1;
        let ((given, open), acked): ((i64, u64), _) = sales.invoke_durable(&call).await?;
        held(sales, acked, "give")?;
        out.open += open;
        if given == transfer::NOT_LOADED {
            out.missing += 1;
            continue;
        }
        if given > 0 {
            out.calls += 2;
            if deliver(sales, donor, to, transfer, given, &Purpose::Anyone).await? {
                out.units = given;
            }
            return Ok(out);
        }
    }
    Ok(out)
}

/// Takes the returned unit `user` was offered in the line (bucket 0's offers, a sale
/// with a waiting room) to their own bucket `to`, held there for them until the offer
/// lapses (`lua/give.lua`, then `lua/take.lua`): true when units arrived, and the buyer's
/// admission in `to` may use them. Without a live offer this is a borrow from bucket 0
/// alone (its units not held, if any). False when nothing came (or `to` is bucket 0,
/// where the admission uses the offer in place). Three calls when units move, one
/// otherwise.
pub async fn claim_offer(
    sales: &RedisSales,
    to: Bucket,
    user: &UserId,
    transfer: &str,
) -> Result<bool, StoreError> {
    if to.index() == 0 {
        return Ok(false);
    }
    let home = Bucket::from(to.voucher());
    let k = VoucherKeys::new(home);
    let mut call = GIVE.key(&k.sale);
    call.key(&k.transfers)
        .key(&k.offers)
        .arg(transfer)
        .arg(to.to_string())
        .arg(user.as_str());
    let ((given, _open), acked): ((i64, u64), _) = sales.invoke_durable(&call).await?;
    held(sales, acked, "give")?;
    if given <= 0 {
        return Ok(false);
    }
    // What the record says the unit is for: the offer as the donor wrote it.
    let record: Option<String> = sales
        .conn_ref()
        .clone()
        .hget(&k.transfers, transfer)
        .await?;
    match record.as_deref().and_then(parse_record) {
        Some(r) => deliver(sales, home, to, transfer, r.units, &r.purpose).await,
        // Delivered already (the drainer finished a record this call left).
        None => Ok(false),
    }
}

/// Delivers every returned unit `donor` holds on its way to the line in bucket 0
/// (`lua/close.lua` records them), whatever their age: the closer calls it right after
/// a close that gave a unit back, the drainer after its sweep's expiries. Returns the
/// units delivered (and already received ones).
pub async fn deliver_returned(sales: &RedisSales, donor: Bucket) -> Result<i64, StoreError> {
    if donor.index() == 0 {
        return Ok(0);
    }
    let mut units = 0;
    for r in open_transfers(sales.conn_ref(), donor, 0).await? {
        if r.purpose == Purpose::Line
            && deliver(sales, donor, r.to, &r.id, r.units, &r.purpose).await?
        {
            units += r.units;
        }
    }
    Ok(units)
}

/// An error unless the replicas that acknowledged a step are enough (durable mode).
fn held(sales: &RedisSales, acked: Option<u32>, step: &str) -> Result<(), StoreError> {
    match (sales.durable(), acked) {
        (Some(d), Some(acked)) if !d.held_by(acked) => Err(StoreError::Unavailable {
            backend: "redis",
            detail: format!(
                "{step} of a transfer acknowledged by {acked} of {} replica(s); the drainer finishes it",
                d.replicas
            ),
        }),
        _ => Ok(()),
    }
}

/// Adds a recorded transfer to its recipient (at most once) and deletes the donor's
/// record; false when the recipient's sale is not loaded (the record stays).
async fn deliver(
    sales: &RedisSales,
    donor: Bucket,
    to: Bucket,
    transfer: &str,
    units: i64,
    purpose: &Purpose,
) -> Result<bool, StoreError> {
    let k = VoucherKeys::new(to);
    let mut call = TAKE.key(&k.sale);
    call.key(&k.received)
        .key(&k.offers)
        .arg(transfer)
        .arg(units);
    match purpose {
        Purpose::Anyone => call.arg(""),
        Purpose::Line => call.arg(transfer::LINE),
        Purpose::Offer { lapses, user } => call.arg(transfer::OFFER).arg(*lapses).arg(user),
    };
    let (taken, acked): (i64, _) = sales.invoke_durable(&call).await?;
    if taken == transfer::NOT_LOADED {
        tracing::warn!(%donor, %to, transfer, "a transfer's recipient is not loaded; its record stays");
        return Ok(false);
    }
    held(sales, acked, "take")?;
    let _: i64 = sales
        .conn_ref()
        .clone()
        .hdel(VoucherKeys::new(donor).transfers, transfer)
        .await?;
    Ok(true)
}

/// What units on their way between two buckets are for (a transfer record's words after
/// the third, `lua/give.lua`, `lua/close.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    /// Borrowed stock: anyone of the recipient bucket may buy them.
    Anyone,
    /// A unit an order gave back, going to bucket 0 to be held for the waiting room's
    /// line.
    Line,
    /// A held unit going with its offer to the offered buyer's bucket, held there for
    /// them until the offer lapses.
    Offer { lapses: UnixMillis, user: String },
}

/// One open transfer record of a donor bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTransfer {
    pub id: String,
    pub to: Bucket,
    pub units: i64,
    /// When the donor's server clock stamped it.
    pub at: UnixMillis,
    pub purpose: Purpose,
}

/// Transfer records of `donor` older than `older_than_ms` by the donor's server clock,
/// the one that stamped them (`lua/transfer_records.lua`). Malformed records are skipped
/// (and logged).
pub async fn open_transfers(
    conn: &RedisConn,
    donor: Bucket,
    older_than_ms: i64,
) -> Result<Vec<OpenTransfer>, StoreError> {
    let (now, all): (UnixMillis, Vec<(String, String)>) = TRANSFER_RECORDS
        .key(VoucherKeys::new(donor).transfers)
        .invoke_async(&mut conn.clone())
        .await?;
    Ok(records_older_than(donor, all, now, older_than_ms))
}

/// The records of `all` (a donor's transfers hash) at least `older_than_ms` old at
/// `now`, both by the server's clock (0: every record).
fn records_older_than(
    donor: Bucket,
    all: Vec<(String, String)>,
    now: UnixMillis,
    older_than_ms: i64,
) -> Vec<OpenTransfer> {
    let mut out = Vec::new();
    for (id, record) in all {
        if id == DEADLINES_SENTINEL {
            continue;
        }
        let parsed = parse_record(&record).filter(|r| r.to.voucher() == donor.voucher());
        match parsed {
            Some(r) if older_than_ms <= 0 || now - r.at >= older_than_ms => {
                out.push(OpenTransfer { id, ..r })
            }
            Some(_) => {}
            None => tracing::error!(%donor, id, record, "malformed transfer record left alone"),
        }
    }
    out
}

/// Finishes the transfers `donor` recorded more than [`STALE_TRANSFER_MS`] ago (their
/// caller died or lost its connection): each is added to its recipient at most once,
/// then its record is deleted. Returns the units delivered (and already received ones).
pub async fn finish_open(sales: &RedisSales, donor: Bucket) -> Result<i64, StoreError> {
    let mut units = 0;
    for r in open_transfers(sales.conn_ref(), donor, STALE_TRANSFER_MS).await? {
        if deliver(sales, donor, r.to, &r.id, r.units, &r.purpose).await? {
            units += r.units;
        }
    }
    Ok(units)
}

/// Where a voucher's units are in Redis: in its buckets' stock, or on their way between
/// two buckets (in a donor's open transfer records), and how many transfers its buckets
/// have received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Units {
    pub stock: i64,
    pub in_transit: i64,
    /// Transfers received over every bucket (their `received` hashes' sizes): only ever
    /// grows during a sale, by one each time units land in a bucket.
    pub received: u64,
    /// Buckets whose sale Redis does not hold (lost, or not loaded): their units are
    /// unknown, counted 0.
    pub missing: u64,
}

impl Units {
    /// Every unit Redis can still sell.
    pub fn total(self) -> i64 {
        self.stock + self.in_transit
    }
}

/// Whether two looks at a voucher's buckets ([`units`]), `second` begun after `first`
/// ended, prove that Redis has no unit of it left: both found none, and no bucket
/// received a transfer in between.
///
/// A look reads the buckets one at a time, so a unit moving from a bucket not yet read
/// (its stock, then its transfer record) into one already read hides from that look;
/// but it can only land there after that bucket's stock was read, so after its
/// `received` count was (each bucket's count is read first), and before the look
/// ended: the landing adds to the count the second look reads. With no landing in
/// between, the first look missed nothing, and units are never made: the voucher is
/// sold out. (A unit given back by a payment's cancel or expiry while the looks run can
/// still hide; the return deletes the sold-out mark, and a mark set just after it is
/// wrong for at most its 5 s: see [`SOLD_OUT_MARK`].)
pub fn sold_out_between(first: Units, second: Units) -> bool {
    first.total() == 0 && second.total() == 0 && first.received == second.received
}

/// The voucher's units over every bucket (one round trip per bucket, all at once; a
/// bucket whose sale is not loaded counts 0). A unit given by a donor is in the donor's
/// record until its recipient's stock has it, so one bucket's read never misses a unit
/// moving out of it; a unit moving between two buckets read at different instants can
/// still be missed ([`sold_out_between`] tells when two looks cannot have).
///
/// Units held for a waiting room's line are not counted, nor are those on their way to
/// it or with an offer: only their line's buyers may have them (lua/admit.lua's rule,
/// `held` until `held_until`, then those live offers hold; the offers read by this
/// process's clock, which only shifts by its skew when an offer lapses).
pub async fn units(
    conn: &RedisConn,
    voucher: VoucherId,
    buckets: u16,
) -> Result<Units, StoreError> {
    let each = futures::future::try_join_all(Bucket::all(voucher, buckets).map(|b| async move {
        let k = VoucherKeys::new(b);
        // `received` first: the three reads are not one atomic step, and a landing
        // after the count was read must show in the next look's count, whether or not
        // this look's stock read saw its units (see `sold_out_between`).
        let now = crate::domain::now_millis();
        type Sale = (Option<i64>, Option<i64>, Option<i64>);
        let (received, (stock, held, held_until), records, offered, (secs, micros)): (
            u64,
            Sale,
            Vec<String>,
            i64,
            (i64, i64),
        ) = redis::pipe()
            .hlen(&k.received)
            .cmd("HMGET")
            .arg(&k.sale)
            .arg(sale_fields::STOCK)
            .arg(sale_fields::HELD)
            .arg(sale_fields::HELD_UNTIL)
            .hvals(&k.transfers)
            .zcount(&k.offers, format!("({now}"), "+inf")
            .cmd("TIME")
            .query_async(&mut conn.clone())
            .await?;
        let in_transit = records
            .iter()
            .filter_map(|r| parse_record(r))
            .filter(|r| r.purpose == Purpose::Anyone)
            .map(|r| r.units)
            .sum();
        let held = held.unwrap_or(0).max(0);
        let reserved = if secs * 1000 + micros / 1000 < held_until.unwrap_or(0) {
            held
        } else {
            held.min(offered)
        };
        Ok::<Units, StoreError>(Units {
            stock: (stock.unwrap_or(0) - reserved).max(0),
            in_transit,
            received,
            missing: u64::from(stock.is_none()),
        })
    }))
    .await?;
    Ok(each.iter().fold(Units::default(), |a, u| Units {
        stock: a.stock + u.stock,
        in_transit: a.in_transit + u.in_transit,
        received: a.received + u.received,
        missing: a.missing + u.missing,
    }))
}

/// A transfer record (`<recipient> <units> <given at ms>`, then its purpose when the
/// units are not for anyone: `line`, or `offer <lapses ms> <user>`; written by
/// `lua/give.lua` and `lua/close.lua`), with an empty id; `None` for the sentinel or
/// anything malformed.
fn parse_record(record: &str) -> Option<OpenTransfer> {
    let mut parts = record.splitn(6, ' ');
    let to: Bucket = parts.next()?.parse().ok()?;
    let units: i64 = parts.next()?.parse().ok()?;
    let at: i64 = parts.next()?.parse().ok()?;
    let purpose = match parts.next() {
        None => Purpose::Anyone,
        Some(transfer::LINE) => Purpose::Line,
        Some(transfer::OFFER) => {
            let lapses = parts.next()?.parse().ok()?;
            let user = parts.next().filter(|u| !u.is_empty())?.to_string();
            Purpose::Offer { lapses, user }
        }
        Some(_) => return None,
    };
    (units > 0).then_some(OpenTransfer {
        id: String::new(),
        to,
        units,
        at,
        purpose,
    })
}

/// Whether the voucher's sold-out mark is set.
pub async fn is_marked_sold_out(conn: &RedisConn, voucher: VoucherId) -> Result<bool, StoreError> {
    Ok(conn.clone().exists(keys::sold_out(voucher)).await?)
}

/// Sets the voucher's sold-out mark for [`SOLD_OUT_MARK`].
pub async fn mark_sold_out(conn: &RedisConn, voucher: VoucherId) -> Result<(), StoreError> {
    let _: () = conn
        .clone()
        .pset_ex(keys::sold_out(voucher), 1, SOLD_OUT_MARK.as_millis() as u64)
        .await?;
    Ok(())
}

/// Deletes the voucher's sold-out mark: a unit came back to one of its buckets.
pub async fn clear_sold_out(conn: &RedisConn, voucher: VoucherId) -> Result<(), StoreError> {
    let _: i64 = conn.clone().del(keys::sold_out(voucher)).await?;
    Ok(())
}

/// A transfer id: unique per give (the attempt's order id, and which of its borrowing
/// rounds), so a recipient never mistakes one transfer for another.
pub fn transfer_id(order: OrderId, round: u32) -> String {
    format!("{order}.{round}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(stock: i64, in_transit: i64, received: u64) -> Units {
        Units {
            stock,
            in_transit,
            received,
            missing: 0,
        }
    }

    #[test]
    fn a_record_s_age_is_told_by_the_clock_that_stamped_it() {
        let donor = Bucket::new(VoucherId::new(9).unwrap(), 0, 2).unwrap();
        let to = Bucket::new(VoucherId::new(9).unwrap(), 1, 2).unwrap();
        // Stamped by a server clock far from this process's: only the server's now
        // tells which records are old.
        let at = 5_000_000_000_000;
        let all = vec![
            ("old".to_string(), format!("{to} 3 {at}")),
            ("new".to_string(), format!("{to} 1 {}", at + 1_500)),
            ("bad".to_string(), "junk".to_string()),
        ];
        let old = records_older_than(donor, all.clone(), at + 2_000, STALE_TRANSFER_MS);
        assert_eq!(
            old,
            vec![OpenTransfer {
                id: "old".to_string(),
                to,
                units: 3,
                at,
                purpose: Purpose::Anyone
            }]
        );
        assert_eq!(records_older_than(donor, all, at, 0).len(), 2);
    }

    #[test]
    fn a_record_says_whether_its_units_are_for_the_line_or_one_offered_buyer() {
        let v = VoucherId::new(9).unwrap();
        let line = parse_record(&format!("{v} 1 1000 line")).unwrap();
        assert_eq!(
            (line.to, line.units, line.purpose),
            (Bucket::from(v), 1, Purpose::Line)
        );
        let to = Bucket::new(v, 2, 3).unwrap();
        let offer = parse_record(&format!("{to} 1 1000 offer 91000 user with spaces")).unwrap();
        assert_eq!(
            offer.purpose,
            Purpose::Offer {
                lapses: 91_000,
                user: "user with spaces".to_string()
            }
        );
        assert!(parse_record(&format!("{to} 1 1000 offer 91000")).is_none());
        assert!(parse_record(&format!("{to} 1 1000 gift")).is_none());
    }

    #[test]
    fn two_empty_looks_with_no_landing_between_make_a_sold_out_voucher() {
        assert!(sold_out_between(look(0, 0, 7), look(0, 0, 7)));
    }

    #[test]
    fn a_unit_seen_by_either_look_is_not_sold_out() {
        assert!(!sold_out_between(look(1, 0, 7), look(0, 0, 7)));
        assert!(!sold_out_between(look(0, 1, 7), look(0, 0, 7)));
        assert!(!sold_out_between(look(0, 0, 7), look(1, 0, 7)));
        assert!(!sold_out_between(look(0, 0, 7), look(0, 2, 7)));
    }

    #[test]
    fn a_transfer_landing_between_two_empty_looks_may_have_hidden_units() {
        // Both looks saw nothing, but a bucket received a transfer in between: the
        // first look may have read the recipient before the units landed and the
        // donor after its record was deleted.
        assert!(!sold_out_between(look(0, 0, 7), look(0, 0, 8)));
    }
}

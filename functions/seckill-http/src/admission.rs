//! The admission, `POST /vouchers/{id}/seckill`, top to bottom: answers this instance
//! already knows, the caller's rate, the voucher's buckets and waiting room, the entry
//! token when it has a room, an order id from a leased block, the one admission script
//! (`lua/admit.lua`), and for a voucher of several stock buckets whose bucket ran dry,
//! borrowing from the others.

use http::StatusCode;
use lambda_http::{Body, Request, Response};
use seckill_shared::adapters::redis::RedisSales;
use seckill_shared::adapters::transfers;
use seckill_shared::auth::Identity;
use seckill_shared::domain::{
    Admission, AdmitReply, Bucket, OrderId, OrderStatus, UnixMillis, UserId, VoucherId, now_millis,
};
use serde_json::json;

use crate::app::App;
use crate::cache::Known;
use crate::error::{ApiError, json_response};
use crate::lookup::{not_found_voucher, not_loaded, sale_shape};
use crate::queue::check_entry;
use crate::repair::repair;

/// `POST /vouchers/{id}/seckill` (user): the admission, one Redis round trip.
pub(crate) async fn seckill(
    app: &App,
    req: &Request,
    caller: &Identity,
    now: UnixMillis,
    id: VoucherId,
) -> Result<Response<Body>, ApiError> {
    // Answers this instance already knows cost no Redis call.
    let (known, shape) = app.cache.look(id, now);
    // Except a sold-out room: a unit that came back there is held for the one caller it
    // is offered to (lua/queue.lua), whom only Redis knows.
    let line = shape.is_some_and(|s| s.room.is_some());
    match known {
        Some(Known::NotStarted) => return Err(ApiError::NotStarted),
        Some(Known::Ended) => return Err(ApiError::Ended),
        Some(Known::SoldOut) if !line => return Err(ApiError::SoldOut),
        Some(Known::Missing) => return Err(not_found_voucher(id)),
        Some(Known::SoldOut) | None => {}
    }
    if !app.limiter.allow(&caller.user, now) {
        return Err(ApiError::RateLimited);
    }
    let sales = app.sales().await?;
    // Order ids are leased only for a voucher that exists: a voucher this instance has
    // not seen yet is first looked up in Redis (bucket 0's sale hash, which also says
    // how many stock buckets it has and whether it has a waiting room), then, if Redis
    // lacks it, the database, so requests for made-up voucher ids lease nothing and
    // write nothing.
    let shape = match shape {
        Some(shape) => shape,
        None => match sale_shape(app, sales, id).await? {
            Some(shape) => shape,
            None if repair(app, id, now, Some(&caller.user)).await? => {
                match app.cache.look(id, now).1 {
                    Some(shape) => shape,
                    None => sale_shape(app, sales, id)
                        .await?
                        .ok_or_else(|| not_loaded(id))?,
                }
            }
            None => return Err(not_found_voucher(id)),
        },
    };
    // A voucher with a waiting room lets in only buyers whose turn came: their entry
    // token, checked in memory before anything is leased or asked of Redis.
    if shape.room.is_some() {
        check_entry(app, req, caller, id, now).await?;
    }
    let buckets = shape.buckets;
    // The buyer's own bucket, always the same one: its buyers hash alone keeps one
    // order per user (invariant 2).
    let bucket = Bucket::of_user(id, buckets, caller.user.as_str());
    let order_id = app.ids.next(sales, id, now).await?;
    let asked = std::time::Instant::now();
    let answer = sales.admit(bucket, &caller.user, order_id).await;
    seckill_shared::metrics::redis_latency(asked.elapsed());
    let mut reply = answer?;
    if reply.admission == Admission::NotLoaded {
        if !repair(app, id, now, Some(&caller.user)).await? {
            return Err(not_found_voucher(id));
        }
        // Every admission call gets an order id of its own: a late copy of an earlier
        // call can then never admit under the id a later call decided (lua/admit.lua).
        let order_id = app.ids.next(sales, id, now).await?;
        reply = sales.admit(bucket, &caller.user, order_id).await?;
    }
    // Whether a sold-out answer is final (the voucher, not only this bucket, is empty).
    let mut final_sold_out = buckets == 1;
    if reply.admission == Admission::SoldOut && buckets > 1 {
        let attempt = Attempt {
            app,
            sales,
            bucket,
            user: &caller.user,
            first_id: order_id,
            line: shape.room.is_some(),
        };
        (reply, final_sold_out) = borrow_and_admit(&attempt, buckets, reply).await?;
    }
    let sold_out = match reply.admission {
        // One empty bucket of several is not a sold-out voucher.
        Admission::Admitted { stock_after, .. } => buckets == 1 && stock_after <= 0,
        Admission::SoldOut => final_sold_out,
        _ => false,
    };
    // The clock offset is measured against the time the answer arrived. A sale still
    // not loaded teaches nothing (and is answered below).
    if reply.admission != Admission::NotLoaded {
        app.cache
            .learn_sale(id, reply.window, sold_out, reply.server_ms, now_millis());
    }
    match reply.admission {
        Admission::Admitted { order_id, .. } => Ok(json_response(
            StatusCode::ACCEPTED,
            &json!({ "order_id": order_id.to_string(), "status": OrderStatus::Pending.as_str() }),
        )),
        Admission::SoldOut => Err(ApiError::SoldOut),
        Admission::NotStarted => Err(ApiError::NotStarted),
        Admission::Ended => Err(ApiError::Ended),
        Admission::AlreadyPurchased { order_id } => Err(ApiError::AlreadyPurchased { order_id }),
        // Still not loaded right after a preload: Redis lost it again; let the caller retry.
        Admission::NotLoaded => Err(not_loaded(id)),
    }
}

/// One purchase attempt's parts that the borrowing loop needs. `first_id` is the order
/// id of the attempt's first admission call (it names the transfers); every later call
/// takes a new id, so that no copy of an earlier call can admit under the id a later
/// call decided.
#[derive(Clone, Copy)]
struct Attempt<'a> {
    app: &'a App,
    sales: &'a RedisSales,
    bucket: Bucket,
    user: &'a UserId,
    first_id: OrderId,
    /// The voucher has a waiting room, whose line may hold a returned unit offered to
    /// this buyer in bucket 0.
    line: bool,
}

/// How long one attempt keeps borrowing at most, and how many Redis calls it may make
/// ([`borrow_budget`]). A round that ends without a unit for this buyer means units went
/// to other buyers of its bucket or are on their way, so the sale moves on and the loop
/// ends with it; the bounds only stop an attempt that keeps losing the race from
/// waiting, and calling Redis, without end.
const BORROW_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// The most one borrowing round can cost in Redis calls (round trips) for a voucher of
/// `k` buckets: a give per other bucket, the take and the donor record's delete, two
/// looks at every bucket (one pipelined call each), and the admission. Order ids come
/// from leased blocks (one lease serves many ids), not counted here.
pub const fn round_calls(k: u16) -> u32 {
    let k = k as u32;
    (k - 1) + 2 + 2 * k + 1
}

/// The Redis calls one attempt may spend borrowing for a voucher of `k` buckets: four
/// rounds at their dearest, plus reading and setting the sold-out mark. Most rounds
/// cost less (a give that finds units on their way is `k` calls with the admission), so
/// an attempt may run more rounds than four; it never starts one that could overrun.
pub const fn borrow_budget(k: u16) -> u32 {
    4 * round_calls(k) + 2
}

/// How long an attempt waits for units on their way between two buckets (given by one,
/// not yet received by the other) before it looks again: one round trip lands them.
const TRANSIT_WAIT: std::time::Duration = std::time::Duration::from_millis(3);

/// The buyer's bucket is empty (`reply` said so). Unless the voucher is marked sold
/// out, borrows units from its other buckets and admits again, until admitted or the
/// voucher is sold out (docs/design.md, "Stock buckets"). Returns the last reply and,
/// for a refusal, whether it is final (the voucher is sold out: this instance may
/// remember it).
///
/// Units are always in some bucket's stock or in a donor's transfer record, but the
/// buckets are read one slot at a time, so a unit moving while they are read can hide:
/// - units on their way (open records), or a bucket Redis lost, are waited for (a few
///   ms) rather than answered sold out;
/// - no donor giving anything, the attempt looks at every bucket twice, a pause apart;
///   only when both looks find nothing and no transfer landed in between
///   ([`transfers::sold_out_between`]) is the voucher sold out, and marked so for every
///   instance;
/// - units borrowed and then taken by another buyer of the bucket before this one's
///   admission: a pause of random length before the next round, so two empty buckets
///   never pass the last unit back and forth in step.
///
/// Each admission call here has an order id of its own (see [`Attempt`]).
async fn borrow_and_admit(
    attempt: &Attempt<'_>,
    buckets: u16,
    mut reply: AdmitReply,
) -> Result<(AdmitReply, bool), ApiError> {
    let Attempt {
        app,
        sales,
        bucket,
        user,
        first_id,
        line,
    } = *attempt;
    let conn = sales.conn();
    let voucher = bucket.voucher();
    let mut calls = Calls {
        made: 1,
        costs: &app.borrowing,
        spent: false,
    };
    // A returned unit the line offered this buyer waits in bucket 0 (lua/queue.lua):
    // taken home with the offer, then bought from their own bucket like any unit. Held
    // units are nobody else's, so a sold-out mark does not stand in the way.
    if line && bucket.index() > 0 {
        let id = transfers::transfer_id(first_id, u32::MAX);
        calls.made += 1;
        if transfers::claim_offer(sales, bucket, user, &id).await? {
            calls.made += 3;
            let order_id = app.ids.next(sales, voucher, now_millis()).await?;
            reply = sales.admit(bucket, user, order_id).await?;
            if reply.admission != Admission::SoldOut {
                return Ok(calls.done((reply, false)));
            }
        }
    }
    if transfers::is_marked_sold_out(&conn, voucher).await? {
        return Ok(calls.done((reply, true)));
    }
    let budget = borrow_budget(buckets);
    let began = std::time::Instant::now();
    let mut round = 0;
    while calls.made + round_calls(buckets) <= budget && began.elapsed() < BORROW_TIME {
        let id = transfers::transfer_id(first_id, round);
        round += 1;
        let borrowed = transfers::borrow(sales, buckets, bucket, &id).await?;
        calls.made += borrowed.calls;
        if borrowed.units == 0 {
            if borrowed.open > 0 || borrowed.missing > 0 {
                // Units on their way, or a bucket Redis lost: wait for them to settle.
                tokio::time::sleep(TRANSIT_WAIT).await;
            } else {
                // Nothing given: units landed where this round did not look (its own
                // bucket included), or none are left.
                let first = transfers::units(&conn, voucher, buckets).await?;
                calls.made += u32::from(buckets);
                tokio::time::sleep(TRANSIT_WAIT).await;
                if first.total() == 0 {
                    let second = transfers::units(&conn, voucher, buckets).await?;
                    calls.made += u32::from(buckets);
                    if transfers::sold_out_between(first, second) {
                        transfers::mark_sold_out(&conn, voucher).await?;
                        calls.made += 1;
                        return Ok(calls.done((reply, true)));
                    }
                }
            }
        }
        let order_id = app.ids.next(sales, voucher, now_millis()).await?;
        reply = sales.admit(bucket, user, order_id).await?;
        calls.made += 1;
        if reply.admission != Admission::SoldOut {
            return Ok(calls.done((reply, false)));
        }
        if borrowed.units > 0 {
            // Another buyer of the bucket took the units first: let the next round
            // start at a moment of its own.
            let jitter = rand::random_range(0..=TRANSIT_WAIT.as_micros() as u64);
            tokio::time::sleep(std::time::Duration::from_micros(jitter)).await;
        }
    }
    // Units kept going to other buyers of the bucket, or kept moving, for every round
    // the budget allowed: a refusal that may come early, and not one to remember.
    tracing::warn!(%bucket, rounds = round, calls = calls.made, elapsed = ?began.elapsed(), "still no unit within the borrowing budget; answering sold out");
    calls.spent = true;
    Ok(calls.done((reply, false)))
}

/// The Redis calls one borrowing attempt made so far, recorded in the instance's
/// [`BorrowCosts`](crate::costs::BorrowCosts) when it ends (by any path but an error).
struct Calls<'a> {
    made: u32,
    costs: &'a crate::costs::BorrowCosts,
    spent: bool,
}

impl Calls<'_> {
    fn done<T>(&self, answer: T) -> T {
        self.costs.record(self.made, self.spent);
        answer
    }
}

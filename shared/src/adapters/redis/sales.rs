//! [`RedisSales`], the sale state of vouchers in Redis, and what a buyer asks of it: an
//! admission (`lua/admit.lua`) and the payment or cancellation of an order
//! (`lua/close.lua`).
//!
//! Invariants kept here: the sale window is judged by the Redis server's clock, never the
//! caller's; an admission that may have run but cannot be vouched for (no reply in
//! time, or too few replicas acknowledged it in durable mode) is
//! [`StoreError::Unconfirmed`], never a refusal, and so is a close too few replicas
//! acknowledged; a lost reply found again by a resend names the attempt's own order id
//! and counts as admitted ([`admission_of`]).

use redis::Value;

use super::conn::RedisConn;
use super::scripts::{ADMIT, CLOSE, GRACE};
use crate::config::Durable;
use crate::domain::{
    Admission, AdmitReply, Bucket, ClosedOrder, OrderId, PaymentRef, SaleWindow, UnixMillis,
    UserId, VoucherId,
};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};
use crate::protocol::{admit, close};

/// What a buyer asks of their order of a voucher with a payment step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseAction {
    Pay(PaymentRef),
    Cancel,
}

/// The admission script's reply: the stock left when admitted, else a table of code,
/// detail, window begins/ends, stock left, server ms.
enum AdmitWire {
    Admitted(i64),
    Other(i64, String, i64, i64, i64, i64),
}

impl redis::FromRedisValue for AdmitWire {
    fn from_redis_value(v: Value) -> Result<AdmitWire, redis::ParsingError> {
        Ok(match v {
            Value::Int(left) => AdmitWire::Admitted(left),
            other => {
                let (code, detail, begins, ends, left, server_ms) =
                    redis::FromRedisValue::from_redis_value(other)?;
                AdmitWire::Other(code, detail, begins, ends, left, server_ms)
            }
        })
    }
}

/// The sale state of vouchers in Redis.
#[derive(Clone)]
pub struct RedisSales {
    pub(super) conn: RedisConn,
    durable: Option<Durable>,
}

impl RedisSales {
    pub fn new(conn: RedisConn) -> RedisSales {
        RedisSales {
            conn,
            durable: None,
        }
    }

    /// Admissions wait for `durable.replicas` replicas to hold their write before they
    /// count as admitted (see [`Self::admit`]); `None` keeps replication asynchronous.
    pub fn with_durability(mut self, durable: Option<Durable>) -> RedisSales {
        self.durable = durable;
        self
    }

    pub fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The durability admissions wait for (`None`: replication stays asynchronous).
    pub fn durable(&self) -> Option<Durable> {
        self.durable
    }

    /// The connection, borrowed.
    pub fn conn_ref(&self) -> &RedisConn {
        &self.conn
    }

    /// Runs the admission script (`lua/admit.lua`): one round trip, atomic. The sale
    /// window is judged by the Redis server's clock, never the caller's.
    ///
    /// In durable mode the script and a `WAIT replicas timeout` travel in one pipeline,
    /// so the wait runs on the very node and connection that ran the script, and a
    /// pipeline the client sends again (a lost connection, a redirect) sends both again.
    /// (A `WAIT` sent on its own, routed to the slot's primary, can reach a newly promoted
    /// primary that never saw the script and answer at once: the failover test lost a
    /// 202 that way.) An admission fewer replicas acknowledged in time is reported
    /// [`StoreError::Unconfirmed`]: the caller must not promise it, because a failover now
    /// could lose it. So is, in any mode, an admission that got no reply in time: it may
    /// have run, so the caller names the order instead of denying it.
    pub async fn admit(
        &self,
        voucher: impl Into<Bucket>,
        user: &UserId,
        order_id: OrderId,
    ) -> Result<AdmitReply, StoreError> {
        let voucher: Bucket = voucher.into();
        let [sale, buyers, orders, deadlines, closed, offers] = VoucherKeys::admission(voucher);
        let mut call = ADMIT.key(&sale);
        call.key(&buyers)
            .key(&orders)
            .key(&deadlines)
            .key(&closed)
            .key(&offers)
            .arg(user.as_str())
            .arg(order_id.get());
        let (wire, acked): (AdmitWire, Option<u32>) = match self.invoke_durable_raw(&call).await {
            Ok(reply) => reply,
            // No reply in time, or the connection lost after the request went out: the
            // script may have run (its reply lost, or the request still queued
            // somewhere), so this order may exist. Named, not promised.
            Err(e) if e.is_timeout() || e.is_io_error() || e.is_connection_dropped() => {
                return Err(StoreError::Unconfirmed {
                    order_id,
                    detail: format!("no reply from redis in time ({e}); it may have run"),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let (admission, window, server_ms) = match wire {
            AdmitWire::Admitted(left) => (
                admission_of(voucher.voucher(), order_id, admit::ADMITTED, "", left)?,
                None,
                None,
            ),
            AdmitWire::Other(code, detail, begins, ends, left, server_ms) => (
                admission_of(voucher.voucher(), order_id, code, &detail, left)?,
                SaleWindow::new(begins, ends).ok(),
                Some(server_ms),
            ),
        };
        if let (Some(d), Some(acked), Admission::Admitted { .. }) =
            (self.durable, acked, &admission)
            && !d.held_by(acked)
        {
            return Err(StoreError::Unconfirmed {
                order_id,
                detail: format!(
                    "only {acked} of {} replica(s) acknowledged within {} ms",
                    d.replicas,
                    d.timeout.as_millis()
                ),
            });
        }
        Ok(AdmitReply {
            admission,
            window,
            server_ms,
        })
    }

    /// Runs a script that writes; in durable mode with a `WAIT` in the same pipeline
    /// (see [`Self::admit`]), returning how many replicas acknowledged it.
    ///
    /// [`Self::durable`] says whether that count is enough.
    pub(crate) async fn invoke_durable<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<(T, Option<u32>), StoreError> {
        Ok(self.invoke_durable_raw(call).await?)
    }

    /// [`Self::invoke_durable`] with the client's error as it came.
    async fn invoke_durable_raw<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<(T, Option<u32>)> {
        let mut conn = self.conn.clone();
        let Some(d) = self.durable else {
            return Ok((call.invoke_async(&mut conn).await?, None));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(call).add_command(d.wait_cmd());
        let reply = match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // A primary that never ran the script (new, or promoted): load it on
                // every primary, then send the pipeline again.
                call.load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        let (value, acked): (T, u32) = reply;
        Ok((value, Some(acked)))
    }

    /// Pays or cancels `user`'s order `order` of `voucher` (`lua/close.lua`): the order's
    /// close as Redis decided it, now or earlier (the caller compares it with what was
    /// asked), or `None` when `user` holds no open order `order` there (another user's,
    /// unknown, or a voucher without a payment step). A payment at or after the deadline
    /// expires the order instead. In durable mode a close too few replicas acknowledged
    /// is [`StoreError::Unconfirmed`]: a failover could still undo it.
    pub async fn close(
        &self,
        voucher: impl Into<Bucket>,
        order: OrderId,
        user: &UserId,
        action: &CloseAction,
    ) -> Result<Option<ClosedOrder>, StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let mut call = CLOSE.key(&k.sale);
        call.key(&k.buyers)
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.to_settle)
            .key(&k.grace)
            .key(&k.rebuys)
            .key(&k.transfers);
        match action {
            CloseAction::Pay(r) => call
                .arg(close::PAY)
                .arg(order.get())
                .arg(user.as_str())
                .arg(r.as_str()),
            CloseAction::Cancel => call.arg(close::CANCEL).arg(order.get()).arg(user.as_str()),
        };
        let (value, acked): (Option<String>, Option<u32>) = self.invoke_durable(&call).await?;
        let Some(value) = value else {
            return Ok(None);
        };
        let closed = ClosedOrder::parse(&value).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "closed order {order} of voucher {voucher}: {value:?}"
            ))
        })?;
        if closed.user != user.as_str() {
            return Ok(None);
        }
        if let (Some(d), Some(acked)) = (self.durable, acked)
            && !d.held_by(acked)
        {
            return Err(StoreError::Unconfirmed {
                order_id: order,
                detail: format!("close acknowledged by {acked} of {} replica(s)", d.replicas),
            });
        }
        Ok(Some(closed))
    }

    /// Where `user`'s order `order` of `voucher` stands in its payment step, in one round
    /// trip: its close if it was closed (and it is `user`'s), and its deadline while it
    /// is open: the one it was given, also when a checkout moved its expiry past it
    /// ([`RedisSales::grace`]). (`None`, `None` for vouchers without a payment step.)
    pub async fn payment_state(
        &self,
        voucher: impl Into<Bucket>,
        order: OrderId,
        user: &UserId,
    ) -> Result<(Option<ClosedOrder>, Option<UnixMillis>), StoreError> {
        let voucher: Bucket = voucher.into();
        let k = VoucherKeys::new(voucher);
        let (closed, expiry, given): (Option<String>, Option<f64>, Option<i64>) = redis::pipe()
            .hget(&k.closed, order.get())
            .zscore(&k.deadlines, keys::deadline_member(order, user.as_str()))
            .hget(&k.grace, order.get())
            .query_async(&mut self.conn.clone())
            .await?;
        let closed = closed
            .as_deref()
            .and_then(ClosedOrder::parse)
            .filter(|c| c.user == user.as_str());
        let deadline = expiry.map(|e| given.unwrap_or(e as UnixMillis));
        Ok((closed, deadline))
    }

    /// A payment started at the provider holds `user`'s open order `order` past its
    /// deadline by `grace_ms`, once (`lua/grace.lua`): the success delivered after the
    /// deadline, within the grace, still pays. Returns (expiry, deadline given) in unix
    /// ms, equal when no grace is given (asked at or after the deadline); `None` when
    /// the order is not open here.
    pub async fn grace(
        &self,
        voucher: impl Into<Bucket>,
        order: OrderId,
        user: &UserId,
        grace_ms: u64,
    ) -> Result<Option<(UnixMillis, UnixMillis)>, StoreError> {
        let k = VoucherKeys::new(voucher.into());
        let reply: Option<(i64, i64)> = GRACE
            .key(&k.deadlines)
            .key(&k.closed)
            .key(&k.grace)
            .arg(order.get())
            .arg(user.as_str())
            .arg(grace_ms)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(reply)
    }
}

/// What the admission script's reply means for the attempt that issued `order_id`.
///
/// [`admit::ALREADY_BOUGHT`] naming this very attempt's `order_id` is a success: the
/// script ran and admitted it, its reply was lost (connection reset, failover) and the
/// same EVALSHA was sent again, which the cluster client does by itself after a dropped
/// connection. Order ids are never issued twice, so no other attempt can hold that id.
pub fn admission_of(
    voucher: VoucherId,
    order_id: OrderId,
    code: i64,
    detail: &str,
    stock_after: i64,
) -> Result<Admission, StoreError> {
    let held = || {
        detail.parse::<OrderId>().map_err(|_| {
            StoreError::Corrupt(format!("buyers hash of voucher {voucher} holds {detail:?}"))
        })
    };
    Ok(match code {
        admit::ADMITTED => Admission::Admitted {
            order_id,
            stock_after,
        },
        admit::NOT_LOADED => Admission::NotLoaded,
        admit::NOT_STARTED => Admission::NotStarted,
        admit::ENDED => Admission::Ended,
        admit::SOLD_OUT => Admission::SoldOut,
        // A copy of an attempt that another copy already decided, and whose answer
        // was lost with it. The buyer's order, if any, is what counts (as for code 5,
        // below); with none, the attempt was refused (or its order closed since): a
        // retry decides anew.
        admit::SUPERSEDED if detail.is_empty() => {
            return Err(StoreError::Unavailable {
                backend: "redis",
                detail: format!(
                    "order {order_id}: another copy decided it and its answer was lost"
                ),
            });
        }
        admit::ALREADY_BOUGHT | admit::SUPERSEDED => match held()? {
            held if held == order_id => Admission::Admitted {
                order_id,
                stock_after,
            },
            held => Admission::AlreadyPurchased { order_id: held },
        },
        other => {
            return Err(StoreError::Corrupt(format!(
                "admission script answered code {other}"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_superseded_copy_reports_the_buyer_s_order_or_nothing() {
        let v = VoucherId::new(7).unwrap();
        let mine = OrderId::new(41).unwrap();
        assert!(matches!(
            admission_of(v, mine, admit::SUPERSEDED, "", 3),
            Err(StoreError::Unavailable { .. })
        ));
        assert_eq!(
            admission_of(v, mine, admit::SUPERSEDED, "42", 3).unwrap(),
            Admission::AlreadyPurchased {
                order_id: OrderId::new(42).unwrap()
            }
        );
    }

    #[test]
    fn a_retried_admission_that_finds_its_own_order_is_admitted() {
        let v = VoucherId::new(7).unwrap();
        let mine = OrderId::new(41).unwrap();
        let other = OrderId::new(42).unwrap();
        assert_eq!(
            admission_of(v, mine, 5, "41", 3).unwrap(),
            Admission::Admitted {
                order_id: mine,
                stock_after: 3
            }
        );
        assert_eq!(
            admission_of(v, mine, 5, "42", 3).unwrap(),
            Admission::AlreadyPurchased { order_id: other }
        );
        assert_eq!(
            admission_of(v, mine, 0, "", 0).unwrap(),
            Admission::Admitted {
                order_id: mine,
                stock_after: 0
            }
        );
        assert_eq!(admission_of(v, mine, 4, "", 0).unwrap(), Admission::SoldOut);
        assert!(matches!(
            admission_of(v, mine, 5, "garbage", 0),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            admission_of(v, mine, 9, "", 0),
            Err(StoreError::Corrupt(_))
        ));
    }
}

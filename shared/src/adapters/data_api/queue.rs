//! The `queue_positions` table: each waiting-room position a join was answered with,
//! written before the answer, so that a queue Redis lost is rebuilt in the same order
//! (seckill-http's `queue`). Invariant kept here: a position belongs to one buyer and a
//! buyer holds one position per voucher (the table's keys); writing one again is a
//! no-op, never an error.

use super::client::DataApi;
use super::values::{USER_ID_TEXT, field, param};
use crate::domain::{UserId, VoucherId, now_millis};
use crate::error::StoreError;

/// Positions one page of a restore reads.
pub const POSITIONS_PAGE: i64 = 5_000;

/// The highest position of a voucher (`:v`): the primary key's last entry for it. The
/// index is named: on a table never analysed the optimizer may take the buyer key's
/// `voucher_id` prefix instead and read every row of the voucher.
pub const MAX_POSITION_SQL: &str = "SELECT COALESCE(MAX(position), 0) FROM queue_positions \
     FORCE INDEX (PRIMARY) WHERE voucher_id = :v";

/// A page of a voucher's (`:v`) positions after `:after`, on the primary key (named, as
/// for [`MAX_POSITION_SQL`]: the buyer key would read the voucher's rows and sort them).
pub fn positions_page_sql() -> String {
    format!(
        "SELECT {USER_ID_TEXT}, position FROM queue_positions FORCE INDEX (PRIMARY) \
         WHERE voucher_id = :v AND position > :after ORDER BY position LIMIT {POSITIONS_PAGE}"
    )
}

impl DataApi {
    /// Records that each user holds their position in their voucher's queue, one
    /// statement for all: (voucher, user, position). A row already there (a join sent
    /// again) is kept as it is: IGNORE, and the values are checked before (ids, a
    /// position from Redis), so nothing else is ignored. No upsert: the application user
    /// may insert here, never update.
    pub async fn record_positions(
        &self,
        rows: &[(VoucherId, UserId, u64)],
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let values: Vec<String> = (0..rows.len())
            .map(|i| format!("(:v{i}, :p{i}, :u{i}, :at)"))
            .collect();
        let mut params = vec![param::timestamp("at", now_millis())];
        for (i, (voucher, user, position)) in rows.iter().enumerate() {
            params.push(param::long(&format!("v{i}"), voucher.get()));
            params.push(param::long(
                &format!("p{i}"),
                i64::try_from(*position).unwrap_or(i64::MAX),
            ));
            params.push(param::string(&format!("u{i}"), user.as_str()));
        }
        self.execute(
            &format!(
                "INSERT IGNORE INTO queue_positions (voucher_id, position, user_id, joined_at) VALUES {}",
                values.join(", ")
            ),
            params,
            None,
        )
        .await?;
        Ok(())
    }

    /// The highest position recorded for the voucher (0: none).
    pub async fn max_position(&self, voucher: VoucherId) -> Result<u64, StoreError> {
        let out = self
            .execute(
                MAX_POSITION_SQL,
                vec![param::long("v", voucher.get())],
                None,
            )
            .await?;
        out.records()
            .first()
            .and_then(|r| r.first())
            .and_then(field::long)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| StoreError::Corrupt("MAX(position) returned no number".into()))
    }

    /// Up to [`POSITIONS_PAGE`] (user id, position) of the voucher's queue after
    /// position `after`, in position order.
    pub async fn positions_after(
        &self,
        voucher: VoucherId,
        after: u64,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let out = self
            .execute(
                &positions_page_sql(),
                vec![
                    param::long("v", voucher.get()),
                    param::long("after", i64::try_from(after).unwrap_or(i64::MAX)),
                ],
                None,
            )
            .await?;
        let bad = || StoreError::Corrupt("queue_positions page returned an unexpected row".into());
        out.records()
            .iter()
            .map(|row| match row.as_slice() {
                [user, position] => Ok((
                    field::string(user).ok_or_else(bad)?,
                    field::long(position)
                        .and_then(|p| u64::try_from(p).ok())
                        .ok_or_else(bad)?,
                )),
                _ => Err(bad()),
            })
            .collect()
    }
}

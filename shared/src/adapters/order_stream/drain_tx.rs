//! The registry of open drainer transactions (`drain_tx`), one per voucher in bucket
//! 0's slot: a transaction holds the voucher's row lock, so a drainer finds there the
//! transaction of a run that was killed, and rolls it back. A group transaction (many
//! small sales' rows at once) is recorded once, in the registry of groups
//! ([`keys::DRAIN_GROUP_TX`]), which a drainer reads beside the voucher's: two calls per
//! group instead of two per voucher in it.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::reading::OrderStreams;
use crate::domain::{Bucket, UnixMillis};
use crate::error::StoreError;
use crate::keys::{self, VoucherKeys};

impl OrderStreams {
    /// Records an open drainer transaction of `voucher` (see [`VoucherKeys::drain_tx`]),
    /// in bucket 0's registry for every bucket: a transaction holds the voucher's row
    /// lock, so a run blocked while draining any bucket must find it there.
    /// The record expires an hour after the voucher's latest transaction: entries left
    /// by killed runs do not pile up on a sale nobody drains any more.
    pub async fn register_tx(
        &self,
        voucher: impl Into<Bucket>,
        transaction: &str,
        consumer: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        // One registry per voucher, whatever the bucket: the row lock is the voucher's.
        let k = VoucherKeys::new(voucher.voucher());
        let _: () = redis::pipe()
            .hset(&k.drain_tx, transaction, format!("{consumer} {now}"))
            .ignore()
            .expire(&k.drain_tx, 3_600)
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Forgets an ended transaction.
    pub async fn unregister_tx(
        &self,
        voucher: impl Into<Bucket>,
        transaction: &str,
    ) -> Result<(), StoreError> {
        let voucher: Bucket = voucher.into();
        // One registry per voucher, whatever the bucket: the row lock is the voucher's.
        let k = VoucherKeys::new(voucher.voucher());
        let _: i64 = self.conn.clone().hdel(&k.drain_tx, transaction).await?;
        Ok(())
    }

    /// Records an open group transaction, once for all its vouchers (see
    /// [`keys::DRAIN_GROUP_TX`]); expires like a voucher's registry.
    pub async fn register_group_tx(
        &self,
        transaction: &str,
        consumer: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let _: () = redis::pipe()
            .hset(
                keys::DRAIN_GROUP_TX,
                transaction,
                format!("{consumer} {now}"),
            )
            .ignore()
            .expire(keys::DRAIN_GROUP_TX, 3_600)
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Forgets an ended group transaction.
    pub async fn unregister_group_tx(&self, transaction: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .conn
            .clone()
            .hdel(keys::DRAIN_GROUP_TX, transaction)
            .await?;
        Ok(())
    }

    /// The open drainer transactions that may hold `voucher`'s row: its own registry's
    /// and every group's (transaction id, consumer, when it began; 0 when the record
    /// does not say).
    pub async fn registered_txs(
        &self,
        voucher: impl Into<Bucket>,
    ) -> Result<Vec<(String, String, UnixMillis)>, StoreError> {
        let voucher: Bucket = voucher.into();
        // One registry per voucher, whatever the bucket: the row lock is the voucher's.
        let k = VoucherKeys::new(voucher.voucher());
        let mut all: HashMap<String, String> = self.conn.clone().hgetall(&k.drain_tx).await?;
        let groups: HashMap<String, String> =
            self.conn.clone().hgetall(keys::DRAIN_GROUP_TX).await?;
        all.extend(groups);
        Ok(all
            .into_iter()
            .map(|(tx, v)| {
                let (consumer, begun) = v.split_once(' ').unwrap_or((&v, "0"));
                (tx, consumer.to_string(), begun.parse().unwrap_or(0))
            })
            .collect())
    }
}

//! The `vouchers` table: a voucher inserted with all its stock left, and read back by
//! id.
//!
//! Invariant kept here: a row read back is a valid [`Voucher`] or
//! [`StoreError::Corrupt`] (a sale window that does not begin before it ends, a bucket
//! count outside `1..=MAX_BUCKETS` or a price the domain refuses never leaves here).

use aws_sdk_rdsdata::types::Field;

use super::client::DataApi;
use super::values::{field, param};
use crate::domain::{
    DEFAULT_REBUY_LIMIT, MAX_BUCKETS, MAX_REBUY_LIMIT, NewVoucher, PaymentTerms, Price, SaleWindow,
    Voucher, VoucherId, WaitingRoom,
};
use crate::error::StoreError;

impl DataApi {
    /// Inserts a voucher with all its stock left; returns it with its new id.
    pub async fn create_voucher(&self, v: &NewVoucher) -> Result<Voucher, StoreError> {
        let pay_within = match v.payment {
            Some(p) => param::long("pay_within_ms", p.pay_within_ms),
            None => param::null("pay_within_ms"),
        };
        let rebuy = v.payment.is_some_and(|p| p.rebuy_after_close);
        let rebuy_limit = v.payment.map_or(DEFAULT_REBUY_LIMIT, |p| p.rebuy_limit);
        let (price, currency) = match v.payment.and_then(|p| p.price) {
            Some(p) => (
                param::long("price_minor", p.amount_minor()),
                param::string("currency", p.currency()),
            ),
            None => (param::null("price_minor"), param::null("currency")),
        };
        let out = self
            .execute(
                "INSERT INTO vouchers (title, stock, stock_left, begins_at, ends_at, pay_within_ms, rebuy_after_close, rebuy_limit, buckets, price_minor, currency, entry_rate_per_s, queue_opens_before_s) \
                 VALUES (:title, :stock, :stock, :begins_at, :ends_at, :pay_within_ms, :rebuy, :rebuy_limit, :buckets, :price_minor, :currency, :entry_rate, :opens_before)",
                vec![
                    param::string("title", &v.title),
                    param::long("stock", v.stock),
                    param::timestamp("begins_at", v.window.begins_ms()),
                    param::timestamp("ends_at", v.window.ends_ms()),
                    pay_within,
                    param::long("rebuy", i64::from(rebuy)),
                    param::long("rebuy_limit", i64::from(rebuy_limit)),
                    param::long("buckets", i64::from(v.buckets)),
                    price,
                    currency,
                    v.room.map_or(param::null("entry_rate"), |r| {
                        param::long("entry_rate", i64::from(r.entry_rate_per_s()))
                    }),
                    v.room.map_or(param::null("opens_before"), |r| {
                        param::long("opens_before", i64::from(r.opens_before_s()))
                    }),
                ],
                None,
            )
            .await?;
        let id = match out.generated_fields().first() {
            Some(Field::LongValue(id)) => VoucherId::new(*id),
            _ => None,
        }
        .ok_or_else(|| StoreError::Corrupt("INSERT INTO vouchers generated no id".into()))?;
        Ok(Voucher {
            id,
            title: v.title.clone(),
            stock: v.stock,
            db_stock_left: v.stock,
            window: v.window,
            payment: v.payment,
            buckets: v.buckets,
            room: v.room,
        })
    }

    /// A voucher by id.
    pub async fn voucher(&self, id: VoucherId) -> Result<Option<Voucher>, StoreError> {
        self.voucher_in(id, None).await
    }

    /// A voucher by id, inside `transaction` when given.
    pub(super) async fn voucher_in(
        &self,
        id: VoucherId,
        transaction: Option<&str>,
    ) -> Result<Option<Voucher>, StoreError> {
        let out = self
            .execute(
                "SELECT id, title, stock, stock_left, begins_at, ends_at, pay_within_ms, rebuy_after_close + 0, rebuy_limit, buckets, price_minor, currency, entry_rate_per_s, queue_opens_before_s \
                 FROM vouchers WHERE id = :id",
                vec![param::long("id", id.get())],
                transaction,
            )
            .await?;
        let Some(row) = out.records().first() else {
            return Ok(None);
        };
        let bad = || StoreError::Corrupt(format!("vouchers row {id} has an unexpected shape"));
        let [
            _,
            title,
            stock,
            left,
            begins,
            ends,
            pay_within,
            rebuy,
            rebuy_limit,
            buckets,
            price,
            currency,
            entry_rate,
            opens_before,
        ] = row.as_slice()
        else {
            return Err(bad());
        };
        let price = match (field::long(price), field::string(currency)) {
            (Some(amount), Some(currency)) => {
                Some(Price::new(amount, &currency).map_err(|_| bad())?)
            }
            _ => None,
        };
        let payment = field::long(pay_within).map(|ms| PaymentTerms {
            pay_within_ms: ms,
            rebuy_after_close: field::long(rebuy).unwrap_or(0) != 0,
            rebuy_limit: field::long(rebuy_limit)
                .and_then(|n| u8::try_from(n).ok())
                .filter(|n| (1..=MAX_REBUY_LIMIT).contains(n))
                .unwrap_or(DEFAULT_REBUY_LIMIT),
            price,
        });
        let window = SaleWindow::new(
            field::datetime(begins).ok_or_else(bad)?,
            field::datetime(ends).ok_or_else(bad)?,
        )
        .map_err(|_| bad())?;
        Ok(Some(Voucher {
            id,
            title: field::string(title).ok_or_else(bad)?,
            stock: field::long(stock).ok_or_else(bad)?,
            db_stock_left: field::long(left).ok_or_else(bad)?,
            window,
            payment,
            buckets: field::long(buckets)
                .and_then(|k| u16::try_from(k).ok())
                .filter(|k| (1..=MAX_BUCKETS).contains(k))
                .ok_or_else(bad)?,
            room: match (field::long(entry_rate), field::long(opens_before)) {
                (Some(rate), Some(opens)) => {
                    Some(WaitingRoom::from_stored(rate, opens).ok_or_else(bad)?)
                }
                _ => None,
            },
        }))
    }
}

//! The database adapter: Aurora MySQL through the RDS Data API (`aws-sdk-rdsdata`).
//!
//! Locally the same client talks to `tools/data-api-local` through an endpoint override,
//! so tests run the production code path. Every value is bound as a named parameter,
//! never spliced into SQL. Errors are sorted once, in [`store_error`], into transient
//! (retry later) and permanent.

use std::collections::HashMap;

use aws_config::BehaviorVersion;
use aws_sdk_rdsdata::Client;
use aws_sdk_rdsdata::config::{Credentials, Region};
use aws_sdk_rdsdata::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_rdsdata::operation::execute_statement::ExecuteStatementOutput;
use aws_sdk_rdsdata::types::{Field, SqlParameter, TypeHint};
use aws_smithy_types::timeout::TimeoutConfig;
use time::PrimitiveDateTime;
use time::macros::format_description;

use crate::config::DataApiConfig;
use crate::domain::{
    MAX_BUCKETS, NewVoucher, OrderId, OrderStatus, PaymentTerms, Price, SaleWindow, UnixMillis,
    UserId, Voucher, VoucherId, WaitingRoom,
};
use crate::error::StoreError;

/// A Data API client bound to one cluster, secret and database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DataApi {
    client: Client,
    cluster_arn: String,
    secret_arn: String,
    database: String,
}

/// The AWS SDK's shared configuration for a client of this project. Against a local
/// endpoint (`local`: data-api-local, which also answers Secrets Manager) it needs no AWS
/// credentials or region: the local server accepts any signature.
pub async fn sdk_config(local: bool) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if local {
        loader = loader.credentials_provider(Credentials::new(
            "local",
            "local",
            None,
            None,
            "seckill-local",
        ));
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            loader = loader.region(Region::new("us-east-1"));
        }
    }
    loader.load().await
}

impl DataApi {
    /// Builds the client once per cold start: region and credentials from the standard
    /// AWS environment, a bound on each call (retries included).
    pub async fn connect(cfg: &DataApiConfig) -> DataApi {
        let shared = sdk_config(cfg.endpoint.is_some()).await;
        let mut builder = aws_sdk_rdsdata::config::Builder::from(&shared).timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(cfg.timeout)
                .build(),
        );
        if let Some(endpoint) = &cfg.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        DataApi {
            client: Client::from_conf(builder.build()),
            cluster_arn: cfg.cluster_arn.clone(),
            secret_arn: cfg.secret_arn.clone(),
            database: cfg.database.clone(),
        }
    }

    /// The database this client works in.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Runs one statement, inside `transaction` when given.
    pub async fn execute(
        &self,
        sql: &str,
        params: Vec<SqlParameter>,
        transaction: Option<&str>,
    ) -> Result<ExecuteStatementOutput, StoreError> {
        self.client
            .execute_statement()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .database(&self.database)
            .sql(sql)
            .set_parameters(Some(params))
            .set_transaction_id(transaction.map(str::to_string))
            .send()
            .await
            .map_err(store_error)
    }

    /// Begins a transaction; the caller must commit or roll back.
    pub async fn begin(&self) -> Result<String, StoreError> {
        let out = self
            .client
            .begin_transaction()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .database(&self.database)
            .send()
            .await
            .map_err(store_error)?;
        out.transaction_id
            .ok_or_else(|| StoreError::Corrupt("BeginTransaction returned no id".into()))
    }

    pub async fn commit(&self, transaction: &str) -> Result<(), StoreError> {
        self.client
            .commit_transaction()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .transaction_id(transaction)
            .send()
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Rolls back; errors are only logged, since the server also rolls back abandoned
    /// transactions on its own.
    pub async fn rollback(&self, transaction: &str) {
        if let Err(err) = self.try_rollback(transaction).await {
            tracing::warn!(error = %err, "rollback failed");
        }
    }

    /// Rolls back and says how it went: `Ok(true)` rolled back, `Ok(false)` the server
    /// no longer knew the transaction (committed, rolled back or expired already).
    pub async fn try_rollback(&self, transaction: &str) -> Result<bool, StoreError> {
        match self
            .client
            .rollback_transaction()
            .resource_arn(&self.cluster_arn)
            .secret_arn(&self.secret_arn)
            .transaction_id(transaction)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(err)
                if matches!(
                    err.code(),
                    Some("TransactionNotFoundException" | "NotFoundException")
                ) =>
            {
                Ok(false)
            }
            Err(err) => Err(store_error(err)),
        }
    }

    /// Inserts a voucher with all its stock left; returns it with its new id.
    pub async fn create_voucher(&self, v: &NewVoucher) -> Result<Voucher, StoreError> {
        let pay_within = match v.payment {
            Some(p) => param::long("pay_within_ms", p.pay_within_ms),
            None => param::null("pay_within_ms"),
        };
        let rebuy = v.payment.is_some_and(|p| p.rebuy_after_close);
        let (price, currency) = match v.payment.and_then(|p| p.price) {
            Some(p) => (
                param::long("price_minor", p.amount_minor()),
                param::string("currency", p.currency()),
            ),
            None => (param::null("price_minor"), param::null("currency")),
        };
        let out = self
            .execute(
                "INSERT INTO vouchers (title, stock, stock_left, begins_at, ends_at, pay_within_ms, rebuy_after_close, buckets, price_minor, currency, entry_rate_per_s, queue_opens_before_s) \
                 VALUES (:title, :stock, :stock, :begins_at, :ends_at, :pay_within_ms, :rebuy, :buckets, :price_minor, :currency, :entry_rate, :opens_before)",
                vec![
                    param::string("title", &v.title),
                    param::long("stock", v.stock),
                    param::timestamp("begins_at", v.window.begins_ms()),
                    param::timestamp("ends_at", v.window.ends_ms()),
                    pay_within,
                    param::long("rebuy", i64::from(rebuy)),
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
    async fn voucher_in(
        &self,
        id: VoucherId,
        transaction: Option<&str>,
    ) -> Result<Option<Voucher>, StoreError> {
        let out = self
            .execute(
                "SELECT id, title, stock, stock_left, begins_at, ends_at, pay_within_ms, rebuy_after_close + 0, buckets, price_minor, currency, entry_rate_per_s, queue_opens_before_s \
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

    /// Opens a consistent read of one voucher's sale: its row (with `stock_left`) now,
    /// and then, page by page ([`SaleSnapshot::next_page`]), every order of it as of the
    /// same instant. `None` when the voucher does not exist.
    ///
    /// It is one read-only transaction (InnoDB's REPEATABLE READ: every read sees the
    /// snapshot taken at the first), so a drainer committing meanwhile changes neither
    /// the stock nor the orders it reports. Plain reads take no locks.
    pub async fn sale_snapshot(
        &self,
        id: VoucherId,
    ) -> Result<Option<(Voucher, SaleSnapshot<'_>)>, StoreError> {
        let transaction = self.begin().await?;
        match self.voucher_in(id, Some(&transaction)).await {
            Ok(Some(v)) => {
                let rebuy = v.payment.is_some_and(|p| p.rebuy_after_close);
                Ok(Some((
                    v,
                    SaleSnapshot {
                        api: self,
                        transaction,
                        voucher: id,
                        buyers: BuyerRows::new(rebuy),
                        after: Some((String::new(), 0)),
                    },
                )))
            }
            Ok(None) => {
                self.rollback(&transaction).await;
                Ok(None)
            }
            Err(e) => {
                self.rollback(&transaction).await;
                Err(e)
            }
        }
    }

    /// The order `user` holds for `voucher` in the database: (order id, status, payment
    /// deadline). The one still counting when the buyer also has closed ones (a voucher
    /// that allows buying again), else their latest.
    pub async fn order_of_buyer(
        &self,
        voucher: VoucherId,
        user: &UserId,
    ) -> Result<Option<(OrderId, OrderStatus, Option<UnixMillis>)>, StoreError> {
        let out = self
            .execute(
                "SELECT id, status, pay_by FROM orders WHERE voucher_id = :v AND user_id = :u \
                 ORDER BY holder IS NULL, id DESC LIMIT 1",
                vec![
                    param::long("v", voucher.get()),
                    param::string("u", user.as_str()),
                ],
                None,
            )
            .await?;
        let Some(row) = out.records().first() else {
            return Ok(None);
        };
        let bad = || {
            StoreError::Corrupt(format!(
                "order of {user} for voucher {voucher} has an unexpected shape"
            ))
        };
        let [id, status, pay_by] = row.as_slice() else {
            return Err(bad());
        };
        let id = field::long(id).and_then(OrderId::new).ok_or_else(bad)?;
        let status = parse_status(status).ok_or_else(bad)?;
        Ok(Some((id, status, field::datetime(pay_by))))
    }

    /// An order as the database has it: (voucher, buyer, status, payment deadline).
    pub async fn order(
        &self,
        id: OrderId,
    ) -> Result<Option<(VoucherId, UserId, OrderStatus, Option<UnixMillis>)>, StoreError> {
        let out = self
            .execute(
                &format!(
                    "SELECT voucher_id, {USER_ID_TEXT}, status, pay_by FROM orders WHERE id = :id"
                ),
                vec![param::long("id", id.get())],
                None,
            )
            .await?;
        let Some(row) = out.records().first() else {
            return Ok(None);
        };
        let bad = || StoreError::Corrupt(format!("orders row {id} has an unexpected shape"));
        let [voucher, user, status, pay_by] = row.as_slice() else {
            return Err(bad());
        };
        let voucher = field::long(voucher)
            .and_then(VoucherId::new)
            .ok_or_else(bad)?;
        let user = field::string(user)
            .and_then(|u| UserId::parse(&u).ok())
            .ok_or_else(bad)?;
        let status = parse_status(status).ok_or_else(bad)?;
        Ok(Some((voucher, user, status, field::datetime(pay_by))))
    }

    /// The payment reference recorded with a paid order.
    pub async fn payment_ref(&self, id: OrderId) -> Result<Option<String>, StoreError> {
        let out = self
            .execute(
                "SELECT pay_ref FROM orders WHERE id = :id",
                vec![param::long("id", id.get())],
                None,
            )
            .await?;
        Ok(out
            .records()
            .first()
            .and_then(|r| r.first())
            .and_then(field::string))
    }

    /// A page of the voucher's orders waiting for payment, after order id `after` (0 for
    /// the first): (order, buyer, deadline), at most [`SNAPSHOT_PAGE_ROWS`].
    pub async fn awaiting_payment(
        &self,
        voucher: VoucherId,
        after: i64,
    ) -> Result<Vec<(OrderId, String, UnixMillis)>, StoreError> {
        let out = self
            .execute(
                &format!(
                    "SELECT id, {USER_ID_TEXT}, pay_by FROM orders WHERE voucher_id = :v \
                     AND status = 'awaiting_payment' AND id > :after ORDER BY id LIMIT {SNAPSHOT_PAGE_ROWS}"
                ),
                vec![param::long("v", voucher.get()), param::long("after", after)],
                None,
            )
            .await?;
        let bad = || StoreError::Corrupt("awaiting_payment page: unexpected row".into());
        out.records()
            .iter()
            .map(|row| match row.as_slice() {
                [id, user, pay_by] => Ok((
                    field::long(id).and_then(OrderId::new).ok_or_else(bad)?,
                    field::string(user).ok_or_else(bad)?,
                    field::datetime(pay_by).ok_or_else(bad)?,
                )),
                _ => Err(bad()),
            })
            .collect()
    }

    /// How many orders of the voucher the database holds: (holding a unit, rejected).
    /// Holding: `confirmed`, `awaiting_payment` and `paid`; a cancelled or expired order
    /// gave its unit back and counts in neither.
    pub async fn order_counts(&self, voucher: VoucherId) -> Result<(u64, u64), StoreError> {
        let counts = self.order_status_counts(voucher).await?;
        let of = |st: OrderStatus| counts.get(&st).copied().unwrap_or(0);
        Ok((
            of(OrderStatus::Confirmed) + of(OrderStatus::AwaitingPayment) + of(OrderStatus::Paid),
            of(OrderStatus::Rejected),
        ))
    }

    /// How many orders of the voucher the database holds in each status.
    pub async fn order_status_counts(
        &self,
        voucher: VoucherId,
    ) -> Result<HashMap<OrderStatus, u64>, StoreError> {
        let out = self
            .execute(
                "SELECT status, COUNT(*) FROM orders WHERE voucher_id = :v GROUP BY status",
                vec![param::long("v", voucher.get())],
                None,
            )
            .await?;
        let mut counts = HashMap::new();
        for row in out.records() {
            let [status, n] = row.as_slice() else {
                return Err(StoreError::Corrupt("order counts: unexpected row".into()));
            };
            let n = field::long(n)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(0);
            if let Some(status) = parse_status(status) {
                counts.insert(status, n);
            }
        }
        Ok(counts)
    }
}

/// `orders.user_id` as text in a select list. The column is binary (compared byte for
/// byte, as Redis does: migrations/0003_user_id_binary.sql), and the Data API returns a
/// binary column as a blob; converted, it comes back as the string it was written from.
pub const USER_ID_TEXT: &str = "CONVERT(user_id USING utf8mb4)";

/// Rows per page of [`SaleSnapshot::next_page`]. A row of the response is a user id
/// (at most 64 bytes, at most 128 once JSON escapes quotes and backslashes), an order id
/// and a flag, with about 100 bytes of JSON around them: at most ~240 bytes, so a page
/// stays under ~480 KiB, well within the Data API's 1 MiB response limit.
pub const SNAPSHOT_PAGE_ROWS: usize = 2_000;

/// One page of a voucher's orders in buyer order, after the row (`:u`, `:id`): every
/// row a range of the `orders_by_buyer (voucher_id, user_id)` index (InnoDB appends the
/// primary key `id` to it) reads in index order, so a page examines at most
/// [`SNAPSHOT_PAGE_ROWS`] + 1 rows whatever the table's statistics say. No per-row
/// subquery: which of a buyer's orders counts is decided by [`BuyerRows`], in Rust.
/// `FORCE INDEX` because a table just written is planned from stale statistics, and a
/// plan that sorts instead would read every remaining row of the voucher per page.
pub fn snapshot_page_sql() -> String {
    format!(
        "SELECT {USER_ID_TEXT}, id, holder IS NOT NULL FROM orders FORCE INDEX (orders_by_buyer) \
         WHERE voucher_id = :v AND (user_id > :u OR (user_id = :u AND id > :id)) \
         ORDER BY user_id, id LIMIT {SNAPSHOT_PAGE_ROWS}"
    )
}

/// An open consistent read of one voucher's orders (see [`DataApi::sale_snapshot`]).
/// Call [`finish`](Self::finish) when done (the server would roll an abandoned one back
/// after 3 idle minutes).
#[derive(Debug)]
pub struct SaleSnapshot<'a> {
    api: &'a DataApi,
    transaction: String,
    voucher: VoucherId,
    /// Which of a buyer's orders count (the voucher's payment terms, read in the same
    /// transaction).
    buyers: BuyerRows,
    /// The last row read, (user id, order id): keyset pagination in index order; `None`
    /// once the last page was read.
    after: Option<(String, i64)>,
}

/// Folds a voucher's order rows, read in (buyer, order id) order, into the one order per
/// buyer that the voucher's buyers hash holds: the buyer's order still holding a unit
/// (`holder` set: at most one per buyer, a unique key), else their latest; a buyer whose
/// orders are all closed (cancelled or expired) counts only when the voucher does not let
/// them buy again. Rows of one buyer may span two pages: the last buyer of a page is
/// kept until a row of another buyer (or the end) shows that all of theirs were read.
#[derive(Debug, Default)]
pub struct BuyerRows {
    rebuy_after_close: bool,
    /// The buyer being read: (user id, order that counts so far, it holds a unit).
    current: Option<(String, OrderId, bool)>,
}

impl BuyerRows {
    /// Folds for a voucher that does (or does not) let a buyer buy again after a close.
    pub fn new(rebuy_after_close: bool) -> Self {
        Self {
            rebuy_after_close,
            current: None,
        }
    }

    /// Takes the next row; returns the buyer before it once this row is of another.
    pub fn push(&mut self, user: String, order: OrderId, holds: bool) -> Option<(String, OrderId)> {
        if let Some((u, best, best_holds)) = &mut self.current
            && *u == user
        {
            // Rows come in id order: a later closed order replaces an earlier closed
            // one, nothing replaces the holding one.
            if !*best_holds {
                *best = order;
                *best_holds = holds;
            }
            return None;
        }
        let done = self.current.replace((user, order, holds));
        done.and_then(|d| self.counted(d))
    }

    /// The last buyer, once every row was read.
    pub fn finish(&mut self) -> Option<(String, OrderId)> {
        let last = self.current.take();
        last.and_then(|d| self.counted(d))
    }

    fn counted(&self, (user, order, holds): (String, OrderId, bool)) -> Option<(String, OrderId)> {
        (holds || !self.rebuy_after_close).then_some((user, order))
    }
}

impl SaleSnapshot<'_> {
    /// The next page of (user id, order id) of the voucher's buyers, in user id order;
    /// `None` after the last. These are the buyers the voucher's buyers hash holds (see
    /// [`BuyerRows`]): one order per buyer, confirmed or rejected or awaiting payment
    /// (either way the buyer holds an order); a buyer with a cancelled or expired order
    /// and a new one is listed with the new one. A page holds at most
    /// about [`SNAPSHOT_PAGE_ROWS`] buyers.
    pub async fn next_page(&mut self) -> Result<Option<Vec<(String, OrderId)>>, StoreError> {
        let mut page = Vec::new();
        while let Some((after_user, after_id)) = self.after.take() {
            let out = self
                .api
                .execute(
                    &snapshot_page_sql(),
                    vec![
                        param::long("v", self.voucher.get()),
                        param::string("u", &after_user),
                        param::long("id", after_id),
                    ],
                    Some(&self.transaction),
                )
                .await?;
            let bad = || StoreError::Corrupt("orders page returned an unexpected row".into());
            let mut last = None;
            for row in out.records() {
                let [user, id, holds] = row.as_slice() else {
                    return Err(bad());
                };
                let user = field::string(user).ok_or_else(bad)?;
                let id = field::long(id).and_then(OrderId::new).ok_or_else(bad)?;
                let holds = field::long(holds).ok_or_else(bad)? != 0;
                last = Some((user.clone(), id.get()));
                page.extend(self.buyers.push(user, id, holds));
            }
            if out.records().len() < SNAPSHOT_PAGE_ROWS {
                page.extend(self.buyers.finish());
            } else {
                self.after = last;
            }
            // A page that completed no buyer (one buyer's rows filled it) reads on.
            if !page.is_empty() {
                break;
            }
        }
        Ok(Some(page).filter(|p| !p.is_empty()))
    }

    /// Ends the read. It wrote nothing, so a rollback ends it as a commit would; and
    /// seckill-http, whose only transaction this is, is then not allowed to commit any
    /// (template.yaml grants it no rds-data:CommitTransaction).
    pub async fn finish(self) {
        if let Err(error) = self.api.try_rollback(&self.transaction).await {
            tracing::warn!(%error, "ending a read-only snapshot failed");
        }
    }
}

fn parse_status(f: &Field) -> Option<OrderStatus> {
    field::string(f)
        .as_deref()
        .and_then(OrderStatus::parse)
        .filter(|s| *s != OrderStatus::Pending)
}

/// Sorts an SDK failure into transient (the service, network or database is not there
/// right now) and permanent (the database refused the statement).
pub fn store_error<E, R>(err: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    match &err {
        SdkError::ServiceError(service) => {
            let e = service.err();
            let code = e.code().unwrap_or("Unknown");
            let message = e.message().unwrap_or("").to_string();
            match code {
                "DatabaseErrorException" if is_lock_conflict(&message) => StoreError::Locked {
                    backend: "data api",
                    detail: format!("{code}: {message}"),
                },
                // Aurora also reports a lost or failing-over connection as a bad request
                // ("Communications link failure"): sorted by its text, not its name.
                "DatabaseErrorException" | "BadRequestException"
                    if is_transient_database_error(&message) =>
                {
                    StoreError::Unavailable {
                        backend: "data api",
                        detail: format!("{code}: {message}"),
                    }
                }
                "DatabaseErrorException"
                | "BadRequestException"
                | "ForbiddenException"
                | "AccessDeniedException" => StoreError::Database(format!("{code}: {message}")),
                _ => StoreError::Unavailable {
                    backend: "data api",
                    detail: format!("{code}: {message}"),
                },
            }
        }
        _ => StoreError::Unavailable {
            backend: "data api",
            detail: aws_smithy_types::error::display::DisplayErrorContext(&err).to_string(),
        },
    }
}

/// MySQL errors that the Data API reports as `DatabaseErrorException` although a later
/// retry can succeed: lock waits (including `NOWAIT`), deadlocks, a writer that turned
/// read-only during an Aurora failover, a connection killed or lost mid-statement, a
/// transaction Aurora aborted while scaling or the Data API no longer knows, and any
/// error that itself asks to be retried. Sorting them as permanent would make the drainer
/// blame (and dead-letter) the orders of a batch for what is the database's passing state.
pub fn is_transient_database_error(message: &str) -> bool {
    const PASSING: &[&str] = &[
        "lock wait timeout",
        "deadlock found",
        "nowait is set",
        "try restarting transaction",
        "read-only",
        "read only",
        "connection was killed",
        "query execution was interrupted",
        "server shutdown in progress",
        "lost connection",
        "server has gone away",
        "too many connections",
        "communications link failure",
        "database is resuming",
        // "Table definition has changed, please retry transaction" (1412), Aurora's
        // "... aborted due to Seamless Scaling. Please retry.", and their kin.
        "please retry",
        "retry transaction",
        "seamless scaling",
        // MariaDB 1020: a row changed under a consistent read; the next attempt reads it.
        "record has changed since last read",
    ];
    let lower = message.to_ascii_lowercase();
    // The transaction expired or went with a failover: the batch's next attempt begins
    // a new one.
    let lost_transaction = lower.contains("transaction") && lower.contains("not found");
    lost_transaction || PASSING.iter().any(|p| lower.contains(p))
}

/// Whether a database error's text says a row lock was held by another transaction
/// (`NOWAIT`, or a lock wait that timed out), as opposed to the database being
/// unreachable.
fn is_lock_conflict(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("lock wait timeout") || lower.contains("nowait is set")
}

/// Named parameters.
pub mod param {
    use super::*;

    pub fn long(name: &str, v: i64) -> SqlParameter {
        SqlParameter::builder()
            .name(name)
            .value(Field::LongValue(v))
            .build()
    }

    pub fn string(name: &str, v: &str) -> SqlParameter {
        SqlParameter::builder()
            .name(name)
            .value(Field::StringValue(v.to_string()))
            .build()
    }

    pub fn null(name: &str) -> SqlParameter {
        SqlParameter::builder()
            .name(name)
            .value(Field::IsNull(true))
            .build()
    }

    /// A UTC instant, as the Data API's TIMESTAMP type hint wants it.
    pub fn timestamp(name: &str, ms: UnixMillis) -> SqlParameter {
        SqlParameter::builder()
            .name(name)
            .value(Field::StringValue(super::format_datetime(ms)))
            .type_hint(TypeHint::Timestamp)
            .build()
    }
}

/// Reading fields of a record.
pub mod field {
    use super::*;

    pub fn long(f: &Field) -> Option<i64> {
        match f {
            Field::LongValue(v) => Some(*v),
            Field::StringValue(s) => s.parse().ok(),
            _ => None,
        }
    }

    pub fn string(f: &Field) -> Option<String> {
        match f {
            Field::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    }

    pub fn datetime(f: &Field) -> Option<UnixMillis> {
        match f {
            Field::StringValue(s) => super::parse_datetime(s),
            _ => None,
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS.fff` in UTC, the Data API's TIMESTAMP text form.
pub fn format_datetime(ms: UnixMillis) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// Parses the Data API's DATETIME text (with or without fractional seconds) as UTC.
pub fn parse_datetime(s: &str) -> Option<UnixMillis> {
    let with_fraction =
        format_description!("[year]-[month]-[day] [hour]:[minute]:[second].[subsecond]");
    let without = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    let t = PrimitiveDateTime::parse(s, with_fraction)
        .or_else(|_| PrimitiveDateTime::parse(s, without))
        .ok()?
        .assume_utc();
    Some((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(rebuy: bool, rows: &[(&str, i64, bool)]) -> Vec<(String, i64)> {
        let mut f = BuyerRows::new(rebuy);
        let mut out: Vec<(String, OrderId)> = rows
            .iter()
            .filter_map(|(u, id, holds)| f.push(u.to_string(), OrderId::new(*id).unwrap(), *holds))
            .collect();
        out.extend(f.finish());
        out.into_iter().map(|(u, id)| (u, id.get())).collect()
    }

    #[test]
    fn a_buyer_counts_with_the_order_holding_a_unit_else_the_latest() {
        let rows = [
            ("a", 1, false),
            ("a", 5, true),
            ("a", 9, false),
            ("b", 2, false),
            ("b", 3, false),
            ("c", 4, true),
        ];
        assert_eq!(
            fold(false, &rows),
            [("a".into(), 5), ("b".into(), 3), ("c".into(), 4)]
        );
        // A voucher that lets a buyer buy again forgets a buyer whose orders all closed.
        assert_eq!(fold(true, &rows), [("a".into(), 5), ("c".into(), 4)]);
        assert!(fold(false, &[]).is_empty());
    }

    #[test]
    fn datetimes_round_trip_through_the_text_form() {
        let ms = 1_795_391_999_123;
        let s = format_datetime(ms);
        assert_eq!(s, "2026-11-22 23:59:59.123");
        assert_eq!(parse_datetime(&s), Some(ms));
        assert_eq!(parse_datetime("2026-11-22 23:59:59"), Some(ms - 123));
        assert_eq!(parse_datetime("2026-11-22 23:59:59.1"), Some(ms - 23));
        assert_eq!(parse_datetime("garbage"), None);
    }

    #[test]
    fn a_held_row_lock_is_told_apart_from_an_unreachable_database() {
        assert!(is_lock_conflict(
            "Lock wait timeout exceeded; try restarting transaction"
        ));
        assert!(is_lock_conflict(
            "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set."
        ));
        assert!(!is_lock_conflict("Communications link failure"));
        assert!(!is_lock_conflict("Duplicate entry '1' for key 'PRIMARY'"));
    }

    #[test]
    fn passing_database_states_are_transient_and_data_errors_are_not() {
        for transient in [
            "Lock wait timeout exceeded; try restarting transaction",
            "Deadlock found when trying to get lock; try restarting transaction",
            "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set.",
            "The MySQL server is running with the --read-only option so it cannot execute this statement",
            "Connection was killed",
            "Communications link failure\n\nThe last packet sent successfully to the server was 0 milliseconds ago.",
            "Table definition has changed, please retry transaction",
            "The last transaction was aborted due to Seamless Scaling. Please retry.",
            "Transaction AQC9dZ8l... is not found",
            "Record has changed since last read in table 'orders'",
        ] {
            assert!(is_transient_database_error(transient), "{transient}");
        }
        for permanent in [
            "Duplicate entry '1' for key 'PRIMARY'",
            "Data too long for column 'user_id' at row 1",
            "CONSTRAINT `vouchers_stock_left_nonnegative` failed for `seckill`.`vouchers`",
            "Table 'seckill.orders' doesn't exist",
        ] {
            assert!(!is_transient_database_error(permanent), "{permanent}");
        }
    }
}

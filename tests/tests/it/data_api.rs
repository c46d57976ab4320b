//! `data-api-local` through the real `aws-sdk-rdsdata` client, against the stack's
//! MariaDB (`MYSQL_URL` of `.dev/stack.env`). Each test starts its own server in
//! process on `127.0.0.1:0` over a fresh database, so tests run in parallel.
//!
//! Every expectation is an exact value (records, counts, error kinds and texts), so a
//! server that drifts from the Data API's wire behaviour fails here.

use std::time::{Duration, Instant};

use aws_sdk_rdsdata::error::ProvideErrorMetadata;
use aws_sdk_rdsdata::operation::batch_execute_statement::BatchExecuteStatementError;
use aws_sdk_rdsdata::operation::commit_transaction::CommitTransactionError;
use aws_sdk_rdsdata::operation::execute_statement::builders::ExecuteStatementFluentBuilder;
use aws_sdk_rdsdata::operation::execute_statement::{
    ExecuteStatementError, ExecuteStatementOutput,
};
use aws_sdk_rdsdata::primitives::Blob;
use aws_sdk_rdsdata::types::{
    DecimalReturnType, Field, LongReturnType, RecordsFormatType, ResultSetOptions, SqlParameter,
    TypeHint,
};
use data_api_local::ServerConfig;
use mysql_async::prelude::Queryable;
use seckill_tests::StackEnv;
use seckill_tests::mysql::{
    LocalDataApi, connect, drop_database, fresh_database, start_data_api, url_with_database,
};

/// A server over a fresh database, and the URLs to check its effects directly.
struct Ctx {
    api: LocalDataApi,
    database: String,
    mysql_url: String,
}

impl Ctx {
    async fn new() -> Ctx {
        Ctx::with(|_| {}).await
    }

    async fn with(adjust: impl FnOnce(&mut ServerConfig)) -> Ctx {
        let mysql_url = StackEnv::load().mysql_url();
        let database = fresh_database(&mysql_url).await;
        let mut config = ServerConfig::new(url_with_database(&mysql_url, &database));
        adjust(&mut config);
        Ctx {
            api: start_data_api(config).await,
            database,
            mysql_url,
        }
    }

    /// An ExecuteStatement call with the ARNs and database filled in.
    fn stmt(&self, sql: &str) -> ExecuteStatementFluentBuilder {
        self.api
            .client
            .execute_statement()
            .resource_arn(&self.api.resource_arn)
            .secret_arn(&self.api.secret_arn)
            .database(&self.database)
            .sql(sql)
    }

    async fn run(&self, sql: &str) -> ExecuteStatementOutput {
        self.stmt(sql)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)))
    }

    async fn begin(&self) -> String {
        self.api
            .client
            .begin_transaction()
            .resource_arn(&self.api.resource_arn)
            .secret_arn(&self.api.secret_arn)
            .database(&self.database)
            .send()
            .await
            .expect("BeginTransaction")
            .transaction_id()
            .expect("transactionId")
            .to_string()
    }

    /// What another session (straight to MariaDB) reads: committed data only.
    async fn count_direct(&self, sql: &str) -> i64 {
        let mut conn = connect(&url_with_database(&self.mysql_url, &self.database)).await;
        let n: Option<i64> = conn.query_first(sql).await.expect("direct query");
        conn.disconnect().await.ok();
        n.expect("one row")
    }

    async fn cleanup(self) {
        self.api.server.shutdown().await.expect("server shuts down");
        drop_database(&self.mysql_url, &self.database).await;
    }
}

fn param(name: &str, value: Field) -> SqlParameter {
    SqlParameter::builder().name(name).value(value).build()
}

fn hinted(name: &str, value: &str, hint: TypeHint) -> SqlParameter {
    SqlParameter::builder()
        .name(name)
        .value(Field::StringValue(value.to_string()))
        .type_hint(hint)
        .build()
}

fn s(v: &str) -> Field {
    Field::StringValue(v.to_string())
}

fn null() -> Field {
    Field::IsNull(true)
}

/// "Code: message" of an SDK error, for assertions and panic texts.
fn describe<E: ProvideErrorMetadata>(err: &E) -> String {
    format!(
        "{}: {}",
        err.code().unwrap_or("<no code>"),
        err.message().unwrap_or("<no message>")
    )
}

/// Asserts that a service error is of one kind (`Enum::Variant`), showing its code and
/// message when not.
macro_rules! assert_kind {
    ($err:expr, $($kind:ident)::+) => {
        assert!(matches!($err, $($kind)::+(_)), "{}", describe(&$err))
    };
}

/// The service error of a call that must fail.
fn fails<T: std::fmt::Debug, E, R>(result: Result<T, aws_sdk_rdsdata::error::SdkError<E, R>>) -> E
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match result {
        Ok(out) => panic!("expected an error, got {out:?}"),
        Err(err) => match err {
            aws_sdk_rdsdata::error::SdkError::ServiceError(service) => service.into_err(),
            other => panic!("expected a service error, got {other:?}"),
        },
    }
}

const KINDS_TABLE: &str = "CREATE TABLE kinds (
    id INT NOT NULL PRIMARY KEY,
    big BIGINT NULL,
    ubig BIGINT UNSIGNED NULL,
    i INT NULL,
    dec_ DECIMAL(10,2) NULL,
    dbl DOUBLE NULL,
    vc VARCHAR(64) NULL,
    txt TEXT NULL,
    bl BLOB NULL,
    flag BOOLEAN NULL,
    bitv BIT(1) NULL,
    dt DATETIME(3) NULL,
    d DATE NULL,
    t TIME NULL,
    js JSON NULL,
    en ENUM('confirmed','rejected') NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

const KINDS_INSERT: &str = "INSERT INTO kinds VALUES
    (:id, :big, :ubig, :i, :dec, :dbl, :vc, :txt, :bl, :flag, :bitv, :dt, :d, :t, :js, :en)";

const KINDS_COLUMNS: &[&str] = &[
    "big", "ubig", "i", "dec", "dbl", "vc", "txt", "bl", "flag", "bitv", "dt", "d", "t", "js", "en",
];

async fn create_kinds(ctx: &Ctx) {
    ctx.run(KINDS_TABLE).await;
    let full = vec![
        param("id", Field::LongValue(1)),
        param("big", Field::LongValue(i64::MIN)),
        param("ubig", Field::LongValue(i64::MAX)),
        param("i", Field::LongValue(-2_147_483_648)),
        hinted("dec", "12345678.90", TypeHint::Decimal),
        param("dbl", Field::DoubleValue(1.25)),
        param("vc", s("héllo ✓")),
        param("txt", s("line one\nline two")),
        param("bl", Field::BlobValue(Blob::new(vec![0u8, 1, 2, 255]))),
        param("flag", Field::BooleanValue(true)),
        param("bitv", Field::BooleanValue(true)),
        hinted("dt", "2026-03-04 05:06:07.089", TypeHint::Timestamp),
        hinted("d", "2026-12-31", TypeHint::Date),
        hinted("t", "23:59:58", TypeHint::Time),
        hinted("js", r#"{"a": [1, 2]}"#, TypeHint::Json),
        param("en", s("rejected")),
    ];
    let out = ctx
        .stmt(KINDS_INSERT)
        .set_parameters(Some(full))
        .send()
        .await;
    assert_eq!(out.expect("insert full row").number_of_records_updated(), 1);

    let mut nulls = vec![param("id", Field::LongValue(2))];
    nulls.extend(KINDS_COLUMNS.iter().map(|c| param(c, null())));
    let out = ctx
        .stmt(KINDS_INSERT)
        .set_parameters(Some(nulls))
        .send()
        .await;
    assert_eq!(out.expect("insert null row").number_of_records_updated(), 1);
}

#[tokio::test]
async fn every_value_type_round_trips_including_nulls() {
    let ctx = Ctx::new().await;
    create_kinds(&ctx).await;

    let out = ctx
        .run(
            "SELECT id, big, ubig, i, dec_, dbl, vc, txt, bl, flag, bitv, dt, d, t, js, en \
             FROM kinds ORDER BY id",
        )
        .await;
    let mut expected_nulls = vec![Field::LongValue(2)];
    expected_nulls.extend(KINDS_COLUMNS.iter().map(|_| null()));
    assert_eq!(
        out.records(),
        &[
            vec![
                Field::LongValue(1),
                Field::LongValue(i64::MIN),
                Field::LongValue(i64::MAX),
                Field::LongValue(-2_147_483_648),
                s("12345678.90"),
                Field::DoubleValue(1.25),
                s("héllo ✓"),
                s("line one\nline two"),
                Field::BlobValue(Blob::new(vec![0u8, 1, 2, 255])),
                // BOOLEAN is TINYINT(1): a long, as on Aurora MySQL.
                Field::LongValue(1),
                Field::BooleanValue(true),
                s("2026-03-04 05:06:07.089"),
                s("2026-12-31"),
                s("23:59:58"),
                s(r#"{"a": [1, 2]}"#),
                s("rejected"),
            ],
            expected_nulls,
        ]
    );
    assert_eq!(out.number_of_records_updated(), 0);
    assert!(out.column_metadata().is_empty(), "metadata only on request");
    // Sessions run in UTC like Aurora's, whatever the host's zone.
    assert_eq!(
        ctx.run("SELECT @@session.time_zone").await.records(),
        &[vec![s("+00:00")]]
    );
    assert_eq!(out.formatted_records(), None);
    ctx.cleanup().await;
}

#[tokio::test]
async fn result_set_options_change_number_types() {
    let ctx = Ctx::new().await;
    let sql = "SELECT CAST(12.5 AS DECIMAL(5,2)), CAST(7 AS DECIMAL(5,0)), 42, \
               CAST(18446744073709551615 AS UNSIGNED)";
    let out = ctx
        .stmt(sql)
        .result_set_options(
            ResultSetOptions::builder()
                .decimal_return_type(DecimalReturnType::DoubleOrLong)
                .long_return_type(LongReturnType::String)
                .build(),
        )
        .send()
        .await
        .expect("execute");
    assert_eq!(
        out.records(),
        &[vec![
            Field::DoubleValue(12.5),
            Field::LongValue(7),
            s("42"),
            s("18446744073709551615"),
        ]]
    );

    // By default a BIGINT UNSIGNED above i64::MAX cannot be a longValue.
    let err = fails(ctx.stmt(sql).send().await);
    assert_kind!(err, ExecuteStatementError::UnsupportedResultException);
    ctx.cleanup().await;
}

#[tokio::test]
async fn include_result_metadata_describes_columns() {
    let ctx = Ctx::new().await;
    create_kinds(&ctx).await;
    let out = ctx
        .stmt("SELECT id AS ident, vc, dec_, dt, ubig, bl FROM kinds WHERE id = 1")
        .include_result_metadata(true)
        .send()
        .await
        .expect("execute");
    let got: Vec<_> = out
        .column_metadata()
        .iter()
        .map(|m| {
            (
                m.name().unwrap_or_default().to_string(),
                m.label().unwrap_or_default().to_string(),
                m.type_name().unwrap_or_default().to_string(),
                m.r#type(),
                m.nullable(),
                m.precision(),
                m.scale(),
                m.is_signed(),
                m.table_name().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let row = |name: &str, label: &str, ty: &str, jdbc, nullable, precision, scale, signed| {
        (
            name.to_string(),
            label.to_string(),
            ty.to_string(),
            jdbc,
            nullable,
            precision,
            scale,
            signed,
            "kinds".to_string(),
        )
    };
    assert_eq!(
        got,
        vec![
            row("id", "ident", "INT", 4, 0, 11, 0, true),
            row("vc", "vc", "VARCHAR", 12, 1, 64, 0, false),
            row("dec_", "dec_", "DECIMAL", 3, 1, 10, 2, true),
            row("dt", "dt", "DATETIME", 93, 1, 23, 3, false),
            row("ubig", "ubig", "BIGINT UNSIGNED", -5, 1, 20, 0, false),
            row("bl", "bl", "BLOB", -4, 1, 65535, 0, false),
        ]
    );
    assert_eq!(out.records().len(), 1);
    ctx.cleanup().await;
}

#[tokio::test]
async fn format_records_as_json() {
    let ctx = Ctx::new().await;
    create_kinds(&ctx).await;
    let out = ctx
        .stmt("SELECT id, vc, dec_, flag, bitv, dt, bl, dbl FROM kinds ORDER BY id")
        .format_records_as(RecordsFormatType::Json)
        .send()
        .await
        .expect("execute");
    assert!(out.records.is_none(), "no records when formatted as JSON");
    let json: serde_json::Value =
        serde_json::from_str(out.formatted_records().expect("formattedRecords")).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!([
            {"id": 1, "vc": "héllo ✓", "dec_": "12345678.90", "flag": 1, "bitv": true,
             "dt": "2026-03-04 05:06:07.089", "bl": "AAEC/w==", "dbl": 1.25},
            {"id": 2, "vc": null, "dec_": null, "flag": null, "bitv": null,
             "dt": null, "bl": null, "dbl": null},
        ])
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn every_type_hint_validates_and_binds() {
    let ctx = Ctx::new().await;
    ctx.run(
        "CREATE TABLE hints (ts DATETIME(3), d DATE, t TIME(3), dec_ DECIMAL(12,4), \
         js JSON, u CHAR(36))",
    )
    .await;
    let insert = "INSERT INTO hints VALUES (:ts, :d, :t, :dec, :js, :u)";
    let good = vec![
        hinted("ts", "2026-01-31 23:59:59.5", TypeHint::Timestamp),
        hinted("d", "2024-02-29", TypeHint::Date),
        hinted("t", "01:02:03.250", TypeHint::Time),
        hinted("dec", "-12345678.1234", TypeHint::Decimal),
        hinted("js", r#"[{"k": "v"}]"#, TypeHint::Json),
        hinted("u", "123e4567-e89b-12d3-a456-426614174000", TypeHint::Uuid),
    ];
    ctx.stmt(insert)
        .set_parameters(Some(good.clone()))
        .send()
        .await
        .expect("valid hinted values");
    let out = ctx.run("SELECT ts, d, t, dec_, js, u FROM hints").await;
    assert_eq!(
        out.records(),
        &[vec![
            s("2026-01-31 23:59:59.500"),
            s("2024-02-29"),
            s("01:02:03.250"),
            s("-12345678.1234"),
            s(r#"[{"k": "v"}]"#),
            s("123e4567-e89b-12d3-a456-426614174000"),
        ]]
    );

    let bad = [
        ("ts", "2026-01-31T23:59:59Z", TypeHint::Timestamp),
        ("ts", "2026-02-30 00:00:00", TypeHint::Timestamp),
        ("d", "2025-02-29", TypeHint::Date),
        ("d", "31/12/2026", TypeHint::Date),
        ("t", "25:00:00", TypeHint::Time),
        ("dec", "12,5", TypeHint::Decimal),
        ("js", "{not json", TypeHint::Json),
        ("u", "123e4567e89b12d3a456426614174000", TypeHint::Uuid),
    ];
    for (name, value, hint) in bad {
        let params: Vec<SqlParameter> = good
            .iter()
            .map(|p| {
                if p.name() == Some(name) {
                    hinted(name, value, hint.clone())
                } else {
                    p.clone()
                }
            })
            .collect();
        let err = fails(ctx.stmt(insert).set_parameters(Some(params)).send().await);
        assert!(
            matches!(err, ExecuteStatementError::BadRequestException(_)),
            "{value} as {hint:?}: {}",
            describe(&err)
        );
        assert!(
            err.message().unwrap_or_default().contains(name),
            "message names the parameter: {}",
            describe(&err)
        );
    }
    assert_eq!(
        ctx.count_direct("SELECT COUNT(*) FROM hints").await,
        1,
        "no bad value was stored"
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn records_updated_and_generated_fields() {
    let ctx = Ctx::new().await;
    ctx.run(
        "CREATE TABLE c (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, \
         k VARCHAR(10) NOT NULL UNIQUE, n INT NOT NULL)",
    )
    .await;

    let one = ctx
        .stmt("INSERT INTO c (k, n) VALUES (:k, 1)")
        .parameters(param("k", s("a")))
        .send()
        .await
        .expect("insert");
    assert_eq!(one.number_of_records_updated(), 1);
    assert_eq!(one.generated_fields(), &[Field::LongValue(1)]);

    let two = ctx
        .run("INSERT INTO c (k, n) VALUES ('b', 1), ('c', 1)")
        .await;
    assert_eq!(two.number_of_records_updated(), 2);
    assert_eq!(two.generated_fields(), &[Field::LongValue(2)]);

    let update = ctx.run("UPDATE c SET n = n + 1").await;
    assert_eq!(update.number_of_records_updated(), 3);
    assert_eq!(update.generated_fields(), &[] as &[Field]);

    let duplicate = ctx.run("INSERT IGNORE INTO c (k, n) VALUES ('a', 5)").await;
    assert_eq!(duplicate.number_of_records_updated(), 0);
    assert_eq!(duplicate.generated_fields(), &[] as &[Field]);

    let mixed = ctx
        .run("INSERT IGNORE INTO c (k, n) VALUES ('a', 1), ('d', 1), ('b', 1), ('e', 1)")
        .await;
    assert_eq!(mixed.number_of_records_updated(), 2);

    let select = ctx.run("SELECT k, n FROM c ORDER BY k").await;
    assert_eq!(select.number_of_records_updated(), 0);
    assert_eq!(
        select.records(),
        &[
            vec![s("a"), Field::LongValue(2)],
            vec![s("b"), Field::LongValue(2)],
            vec![s("c"), Field::LongValue(2)],
            vec![s("d"), Field::LongValue(1)],
            vec![s("e"), Field::LongValue(1)],
        ]
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn duplicate_key_is_a_database_error() {
    let ctx = Ctx::new().await;
    ctx.run("CREATE TABLE u (k VARCHAR(10) PRIMARY KEY)").await;
    ctx.run("INSERT INTO u VALUES ('x')").await;
    let err = fails(
        ctx.stmt("INSERT INTO u VALUES (:k)")
            .parameters(param("k", s("x")))
            .send()
            .await,
    );
    assert_kind!(err, ExecuteStatementError::DatabaseErrorException);
    assert_eq!(err.message(), Some("Duplicate entry 'x' for key 'PRIMARY'"));

    let syntax = fails(ctx.stmt("SELEC 1").send().await);
    assert_kind!(syntax, ExecuteStatementError::DatabaseErrorException);
    ctx.cleanup().await;
}

#[tokio::test]
async fn batch_execute_gives_one_result_per_set_and_is_all_or_nothing() {
    let ctx = Ctx::new().await;
    ctx.run("CREATE TABLE b (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(10) UNIQUE)")
        .await;
    let batch = |keys: &[&str]| {
        ctx.api
            .client
            .batch_execute_statement()
            .resource_arn(&ctx.api.resource_arn)
            .secret_arn(&ctx.api.secret_arn)
            .database(&ctx.database)
            .sql("INSERT INTO b (k) VALUES (:k)")
            .set_parameter_sets(Some(keys.iter().map(|k| vec![param("k", s(k))]).collect()))
    };

    let out = batch(&["a", "b", "c"]).send().await.expect("batch");
    let generated: Vec<&[Field]> = out
        .update_results()
        .iter()
        .map(|r| r.generated_fields())
        .collect();
    assert_eq!(
        generated,
        vec![
            &[Field::LongValue(1)][..],
            &[Field::LongValue(2)][..],
            &[Field::LongValue(3)][..],
        ]
    );

    // The second set collides: the first must not stay behind.
    let err = fails(batch(&["d", "a"]).send().await);
    assert_kind!(err, BatchExecuteStatementError::DatabaseErrorException);
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM b").await, 3);

    // Inside a transaction: visible only after commit.
    let tx = ctx.begin().await;
    let out = batch(&["e", "f"])
        .transaction_id(&tx)
        .send()
        .await
        .expect("batch in tx");
    assert_eq!(out.update_results().len(), 2);
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM b").await, 3);
    ctx.api
        .client
        .commit_transaction()
        .resource_arn(&ctx.api.resource_arn)
        .secret_arn(&ctx.api.secret_arn)
        .transaction_id(&tx)
        .send()
        .await
        .expect("commit");
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM b").await, 5);
    ctx.cleanup().await;
}

#[tokio::test]
async fn commit_is_visible_and_rollback_is_not() {
    let ctx = Ctx::new().await;
    ctx.run("CREATE TABLE tx (k VARCHAR(10) PRIMARY KEY)").await;
    let client = &ctx.api.client;

    let tx = ctx.begin().await;
    ctx.stmt("INSERT INTO tx VALUES ('one')")
        .transaction_id(&tx)
        .send()
        .await
        .expect("insert in tx");
    let inside = ctx
        .stmt("SELECT COUNT(*) FROM tx")
        .transaction_id(&tx)
        .send()
        .await
        .expect("select in tx");
    assert_eq!(inside.records(), &[vec![Field::LongValue(1)]]);
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM tx").await, 0);
    let committed = client
        .commit_transaction()
        .resource_arn(&ctx.api.resource_arn)
        .secret_arn(&ctx.api.secret_arn)
        .transaction_id(&tx)
        .send()
        .await
        .expect("commit");
    assert_eq!(
        committed.transaction_status(),
        Some("Transaction Committed")
    );
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM tx").await, 1);

    // A finished transaction is gone.
    let again = fails(
        client
            .commit_transaction()
            .resource_arn(&ctx.api.resource_arn)
            .secret_arn(&ctx.api.secret_arn)
            .transaction_id(&tx)
            .send()
            .await,
    );
    assert_kind!(again, CommitTransactionError::TransactionNotFoundException);

    let tx = ctx.begin().await;
    ctx.stmt("INSERT INTO tx VALUES ('two')")
        .transaction_id(&tx)
        .send()
        .await
        .expect("insert in tx");
    let rolled = client
        .rollback_transaction()
        .resource_arn(&ctx.api.resource_arn)
        .secret_arn(&ctx.api.secret_arn)
        .transaction_id(&tx)
        .send()
        .await
        .expect("rollback");
    assert_eq!(rolled.transaction_status(), Some("Rollback Complete"));
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM tx").await, 1);

    let unknown = fails(
        ctx.stmt("SELECT 1")
            .transaction_id("no-such-tx")
            .send()
            .await,
    );
    assert_kind!(unknown, ExecuteStatementError::TransactionNotFoundException);
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_database_error_ends_the_transaction_and_rolls_it_back() {
    let ctx = Ctx::new().await;
    ctx.run("CREATE TABLE tx (k VARCHAR(10) PRIMARY KEY)").await;
    ctx.run("INSERT INTO tx VALUES ('taken')").await;
    let tx = ctx.begin().await;
    ctx.stmt("INSERT INTO tx VALUES ('mine')")
        .transaction_id(&tx)
        .send()
        .await
        .expect("insert in tx");
    let dup = fails(
        ctx.stmt("INSERT INTO tx VALUES ('taken')")
            .transaction_id(&tx)
            .send()
            .await,
    );
    assert!(matches!(
        dup,
        ExecuteStatementError::DatabaseErrorException(_)
    ));
    let after = fails(ctx.stmt("SELECT 1").transaction_id(&tx).send().await);
    assert_kind!(after, ExecuteStatementError::TransactionNotFoundException);
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM tx").await, 1);

    // A request error (checked before the database) leaves the transaction alone.
    let tx = ctx.begin().await;
    let bad = fails(ctx.stmt("SELECT :missing").transaction_id(&tx).send().await);
    assert!(matches!(bad, ExecuteStatementError::BadRequestException(_)));
    ctx.stmt("SELECT 1")
        .transaction_id(&tx)
        .send()
        .await
        .expect("transaction still open");
    ctx.cleanup().await;
}

#[tokio::test]
async fn an_idle_transaction_expires_and_is_rolled_back() {
    let ctx = Ctx::with(|c| c.transaction_idle_timeout = Duration::from_secs(1)).await;
    ctx.run("CREATE TABLE tx (k VARCHAR(10) PRIMARY KEY)").await;
    let tx = ctx.begin().await;
    ctx.stmt("INSERT INTO tx VALUES ('lost')")
        .transaction_id(&tx)
        .send()
        .await
        .expect("insert in tx");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let err = fails(ctx.stmt("SELECT 1").transaction_id(&tx).send().await);
    assert_kind!(err, ExecuteStatementError::TransactionNotFoundException);
    assert_eq!(
        err.message(),
        Some(format!("Transaction {tx} is not found").as_str())
    );
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM tx").await, 0);
    // Rolled back, not merely forgotten: its row lock is gone, so another session can
    // insert the same key at once.
    let mut conn = connect(&url_with_database(&ctx.mysql_url, &ctx.database)).await;
    conn.query_drop("SET SESSION innodb_lock_wait_timeout = 2")
        .await
        .expect("set lock wait timeout");
    conn.query_drop("INSERT INTO tx VALUES ('lost')")
        .await
        .expect("the expired transaction holds no lock");
    conn.disconnect().await.ok();
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_slow_statement_times_out_and_is_killed() {
    let ctx = Ctx::with(|c| c.statement_timeout = Duration::from_secs(1)).await;
    let started = Instant::now();
    let err = fails(ctx.stmt("SELECT SLEEP(20)").send().await);
    let elapsed = started.elapsed();
    let ExecuteStatementError::StatementTimeoutException(timeout) = &err else {
        panic!("expected StatementTimeoutException, got {}", describe(&err));
    };
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    let connection_id = timeout.db_connection_id();
    assert!(connection_id > 0);
    // KILL QUERY stopped it: that connection runs nothing any more.
    let running = ctx
        .count_direct(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE ID = {connection_id} AND INFO LIKE 'SELECT SLEEP%'"
        ))
        .await;
    assert_eq!(running, 0);
    // The server is fine afterwards.
    assert_eq!(
        ctx.run("SELECT 1").await.records(),
        &[vec![Field::LongValue(1)]]
    );

    // continueAfterTimeout: the caller gets the timeout, the statement still completes.
    ctx.run("CREATE TABLE late (k VARCHAR(10))").await;
    let err = fails(
        ctx.stmt("INSERT INTO late SELECT 'done' FROM DUAL WHERE SLEEP(2) = 0")
            .continue_after_timeout(true)
            .send()
            .await,
    );
    assert_kind!(err, ExecuteStatementError::StatementTimeoutException);
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM late").await, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctx.count_direct("SELECT COUNT(*) FROM late").await == 0 {
        assert!(
            Instant::now() < deadline,
            "the continued statement never finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ctx.count_direct("SELECT COUNT(*) FROM late").await, 1);
    ctx.cleanup().await;
}

#[tokio::test]
async fn wrong_arns_are_rejected() {
    let ctx = Ctx::new().await;
    let wrong_cluster = fails(
        ctx.stmt("SELECT 1")
            .resource_arn("arn:aws:rds:us-east-1:000000000000:cluster:other")
            .send()
            .await,
    );
    assert_kind!(wrong_cluster, ExecuteStatementError::BadRequestException);
    let wrong_secret = fails(
        ctx.stmt("SELECT 1")
            .secret_arn("arn:aws:secretsmanager:us-east-1:000000000000:secret:other")
            .send()
            .await,
    );
    assert_kind!(wrong_secret, ExecuteStatementError::BadRequestException);
    let begin = ctx
        .api
        .client
        .begin_transaction()
        .resource_arn("arn:aws:rds:us-east-1:000000000000:cluster:other")
        .secret_arn(&ctx.api.secret_arn)
        .send()
        .await;
    assert!(begin.is_err());
    ctx.cleanup().await;
}

#[tokio::test]
async fn size_limits_are_enforced() {
    let ctx = Ctx::new().await;

    // SQL: 65,536 characters pass, one more does not.
    let at_limit = format!("SELECT 1{}", " ".repeat(65_536 - 8));
    assert_eq!(at_limit.chars().count(), 65_536);
    ctx.run(&at_limit).await;
    let over = fails(ctx.stmt(&format!("{at_limit} ")).send().await);
    assert_kind!(over, ExecuteStatementError::BadRequestException);
    assert!(
        over.message().unwrap_or_default().contains("65536"),
        "{}",
        describe(&over)
    );

    // Request: a 5 MiB parameter is over the 4 MiB limit.
    let huge = fails(
        ctx.stmt("SELECT LENGTH(:p)")
            .parameters(param("p", s(&"x".repeat(5 * 1024 * 1024))))
            .send()
            .await,
    );
    assert_kind!(huge, ExecuteStatementError::BadRequestException);
    assert!(
        huge.message().unwrap_or_default().contains("4 MiB"),
        "{}",
        describe(&huge)
    );

    // Response: 1 MiB.
    let fits = ctx.run("SELECT REPEAT('x', 900000)").await;
    assert_eq!(fits.records(), &[vec![s(&"x".repeat(900_000))]]);
    let too_big = fails(ctx.stmt("SELECT REPEAT('x', 1100000)").send().await);
    assert_kind!(too_big, ExecuteStatementError::BadRequestException);
    assert_eq!(
        too_big.message(),
        Some("Database returned more than the allowed response size limit")
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn parameters_are_bound_never_spliced() {
    let ctx = Ctx::new().await;
    ctx.run("CREATE TABLE notes (body VARCHAR(200) NOT NULL)")
        .await;
    let nasty = "x'); DROP TABLE notes; -- :k \" \\ ";
    ctx.stmt("INSERT INTO notes VALUES (:body)")
        .parameters(param("body", s(nasty)))
        .send()
        .await
        .expect("insert");
    let out = ctx
        .stmt("SELECT body, ':body', :n + :n FROM notes WHERE body = :body")
        .parameters(param("body", s(nasty)))
        .parameters(param("n", Field::LongValue(2)))
        .send()
        .await
        .expect("select");
    assert_eq!(
        out.records(),
        &[vec![s(nasty), s(":body"), Field::LongValue(4)]]
    );

    let missing = fails(
        ctx.stmt("SELECT :a, :b")
            .parameters(param("a", null()))
            .send()
            .await,
    );
    assert_kind!(missing, ExecuteStatementError::BadRequestException);
    assert_eq!(
        missing.message(),
        Some("No value specified for parameter: b")
    );

    let unused = fails(
        ctx.stmt("SELECT 1")
            .parameters(param("a", null()))
            .send()
            .await,
    );
    assert_eq!(unused.message(), Some("Cannot find parameter: a"));

    let array = fails(
        ctx.stmt("SELECT :a")
            .parameters(param(
                "a",
                Field::ArrayValue(aws_sdk_rdsdata::types::ArrayValue::LongValues(vec![Some(
                    1,
                )])),
            ))
            .send()
            .await,
    );
    assert!(matches!(
        array,
        ExecuteStatementError::BadRequestException(_)
    ));
    ctx.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_database_is_database_unavailable() {
    // Port 1 on loopback: nothing listens there.
    let api = start_data_api(ServerConfig::new(
        "mysql://seckill:seckill@127.0.0.1:1/seckill",
    ))
    .await;
    let err = fails(
        api.client
            .execute_statement()
            .resource_arn(&api.resource_arn)
            .secret_arn(&api.secret_arn)
            .sql("SELECT 1")
            .send()
            .await,
    );
    assert_kind!(err, ExecuteStatementError::DatabaseUnavailableException);
    api.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn the_database_member_picks_the_database() {
    let ctx = Ctx::new().await;
    let other = fresh_database(&ctx.mysql_url).await;
    let current = |db: Option<&str>| {
        let mut call = ctx.stmt("SELECT DATABASE()");
        call = call.set_database(db.map(str::to_string));
        call.send()
    };
    let out = current(Some(&other)).await.expect("other database");
    assert_eq!(out.records(), &[vec![s(&other)]]);
    // Without `database`, the one of the server's MySQL URL.
    let out = current(None).await.expect("default database");
    assert_eq!(out.records(), &[vec![s(&ctx.database)]]);
    drop_database(&ctx.mysql_url, &other).await;
    ctx.cleanup().await;
}

/// The server has no authentication, so what a web page in the developer's browser can
/// send must be refused: a cross-origin `text/plain` POST (no preflight), any request
/// carrying an `Origin`, and a rebound DNS name (its own name in `Host`). The same call
/// as the SDK makes it passes.
#[tokio::test]
async fn requests_a_browser_could_send_are_refused() {
    let ctx = Ctx::new().await;
    let url = format!("{}/Execute", ctx.api.server.url());
    let body = serde_json::json!({
        "resourceArn": ctx.api.resource_arn,
        "secretArn": ctx.api.secret_arn,
        "database": ctx.database,
        "sql": "SELECT 1",
    })
    .to_string();
    let http = reqwest::Client::new();
    let send = |content_type: &'static str, extra: Option<(&'static str, &'static str)>| {
        let mut req = http
            .post(&url)
            .header("content-type", content_type)
            .body(body.clone());
        if let Some((k, v)) = extra {
            req = req.header(k, v);
        }
        async move {
            let res = req.send().await.expect("the server answers");
            let status = res.status().as_u16();
            let kind = res
                .headers()
                .get("x-amzn-errortype")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            (status, kind)
        }
    };
    // The SDK's shape passes (the control: the refusals below are about the headers).
    assert_eq!(send("application/json", None).await.0, 200);
    for (content_type, extra) in [
        ("text/plain", None),
        ("application/x-www-form-urlencoded", None),
        ("application/json", Some(("origin", "http://evil.example"))),
        ("application/json", Some(("origin", "null"))),
        ("application/json", Some(("host", "evil.example:18080"))),
        ("application/json", Some(("host", "127.0.0.1.evil.example"))),
    ] {
        assert_eq!(
            send(content_type, extra).await,
            (403, "ForbiddenException".to_string()),
            "{content_type} {extra:?}"
        );
    }
    ctx.cleanup().await;
}

//! Least privilege for the database: `seckill migrate` (the very code of the
//! command, `seckill_cli::migrate::run`) runs the migrations with the master secret,
//! reads the application user's secret through Secrets Manager's GetSecretValue (here
//! `data-api-local`, which knows both secrets) and makes that user. Through the Data API
//! with the application secret, the user then does everything the functions do and
//! nothing else: no DROP, DELETE, CREATE, nor another database.
//!
//! Each test has a fresh database on the stack's MariaDB and its own in-process
//! `data-api-local`.

use std::time::Duration;

use data_api_local::ServerConfig;
use data_api_local::secrets::SecretCredentials;
use seckill_cli::migrate::{MigrateConfig, run};
use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::adapters::ledger::Ledger;
use seckill_shared::config::DataApiConfig;
use seckill_shared::domain::{
    AdmittedOrder, NewVoucher, OrderId, OrderStatus, SaleWindow, UserId, now_millis,
};
use seckill_shared::error::StoreError;
use seckill_tests::StackEnv;
use seckill_tests::mysql::{
    LocalDataApi, app_secret, drop_database, drop_user, fresh_database, random_password,
    start_data_api, url_with_database,
};

struct Ctx {
    mysql_url: String,
    database: String,
    api: LocalDataApi,
    app: SecretCredentials,
}

impl Ctx {
    async fn start() -> Ctx {
        let mysql_url = StackEnv::load().mysql_url();
        let database = fresh_database(&mysql_url).await;
        let app = app_secret(&database);
        let mut config = ServerConfig::new(url_with_database(&mysql_url, &database));
        config.secrets.push(app.clone());
        let api = start_data_api(config).await;
        Ctx {
            mysql_url,
            database,
            api,
            app,
        }
    }

    fn data_api(&self, secret_arn: &str) -> DataApiConfig {
        DataApiConfig {
            cluster_arn: self.api.resource_arn.clone(),
            secret_arn: secret_arn.to_string(),
            database: self.database.clone(),
            endpoint: Some(self.api.server.url()),
            timeout: Duration::from_secs(10),
        }
    }

    /// `seckill migrate` with the master secret and the application user's secret, as
    /// the stack runs it.
    async fn migrate(&self) -> anyhow::Result<seckill_cli::migrate::Report> {
        run(&MigrateConfig {
            data_api: self.data_api(&self.api.secret_arn),
            app_secret_arn: Some(self.app.arn.clone()),
            secrets_manager_url: Some(self.api.server.url()),
        })
        .await
    }

    async fn app_db(&self) -> DataApi {
        DataApi::connect(&self.data_api(&self.app.arn)).await
    }

    async fn cleanup(self) {
        drop_database(&self.mysql_url, &self.database).await;
        drop_user(&self.mysql_url, &self.database).await;
    }
}

fn open_voucher() -> NewVoucher {
    let now = now_millis();
    NewVoucher {
        title: "app user".into(),
        stock: 5,
        window: SaleWindow::new(now - 60_000, now + 3_600_000).unwrap(),
        payment: None,
        buckets: 1,
        room: None,
    }
}

/// What the functions do, through the application user: seckill-http's statements and
/// read-only snapshot, the drainer's batch transaction (row lock, inserts, stock).
async fn do_what_the_functions_do(db: &DataApi) {
    let v = db
        .create_voucher(&open_voucher())
        .await
        .expect("INSERT vouchers");
    assert_eq!(db.voucher(v.id).await.unwrap().unwrap().stock, 5);

    let ledger = Ledger::new(db.clone());
    let order = AdmittedOrder {
        id: OrderId::new(rand::random::<u32>() as i64 + 1).unwrap(),
        voucher: v.id,
        user: UserId::parse("alice").unwrap(),
        admitted_ms: now_millis(),
    };
    assert!(ledger.accepts_an_ordinary_row(v.id).await.unwrap());
    let tx = ledger.begin().await.expect("BeginTransaction");
    assert_eq!(
        tx.lock_voucher(v.id)
            .await
            .expect("SELECT ... FOR UPDATE")
            .map(|l| l.stock_left),
        Some(5)
    );
    assert!(
        tx.existing_orders(v.id, std::slice::from_ref(&order))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        tx.insert_orders(std::slice::from_ref(&order), OrderStatus::Confirmed, None)
            .await
            .expect("INSERT orders"),
        1
    );
    assert!(tx.take_stock(v.id, 1).await.expect("UPDATE vouchers"));
    tx.commit().await.expect("CommitTransaction");

    assert_eq!(
        db.order(order.id).await.unwrap().map(|(_, _, s, _)| s),
        Some(OrderStatus::Confirmed)
    );
    assert!(
        db.order_of_buyer(v.id, &order.user)
            .await
            .unwrap()
            .is_some()
    );
    let (snapshot_voucher, mut snapshot) = db.sale_snapshot(v.id).await.unwrap().unwrap();
    assert_eq!(snapshot_voucher.db_stock_left, 4);
    assert_eq!(
        snapshot.next_page().await.unwrap().map(|p| p.len()),
        Some(1)
    );
    snapshot.finish().await;
}

/// The statement is refused for lack of a privilege (not for another reason).
async fn refused(db: &DataApi, sql: &str) {
    match db.execute(sql, vec![], None).await {
        Err(StoreError::Database(message)) => assert!(
            message.to_ascii_lowercase().contains("denied"),
            "{sql}: refused, but not for lack of a privilege: {message}"
        ),
        other => panic!("{sql}: the application user must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn after_migrate_the_app_user_does_what_the_functions_do_and_nothing_else() {
    let ctx = Ctx::start().await;
    let report = ctx.migrate().await.expect("seckill migrate");
    let lines = report.app_user.expect("the application user was made");
    assert!(lines.iter().any(|l| l.contains(&ctx.database)), "{lines:?}");

    let db = ctx.app_db().await;
    do_what_the_functions_do(&db).await;

    // A second database the master user can reach, with a table in it.
    let other = fresh_database(&ctx.mysql_url).await;
    let master = DataApi::connect(&ctx.data_api(&ctx.api.secret_arn)).await;
    master
        .execute(&format!("CREATE TABLE `{other}`.t (x INT)"), vec![], None)
        .await
        .unwrap();

    refused(&db, "DROP TABLE orders").await;
    refused(&db, "DELETE FROM orders").await;
    refused(&db, "DELETE FROM vouchers").await;
    refused(&db, "CREATE TABLE intruder (x INT)").await;
    refused(&db, "ALTER TABLE orders ADD COLUMN x INT").await;
    refused(&db, "TRUNCATE TABLE orders").await;
    refused(&db, "SELECT * FROM schema_migrations").await;
    refused(&db, &format!("SELECT * FROM `{other}`.t")).await;
    refused(&db, &format!("INSERT INTO `{other}`.t VALUES (1)")).await;
    refused(&db, "CREATE USER 'intruder'@'%'").await;
    // The rows are all still there.
    assert_eq!(
        master
            .execute("SELECT COUNT(*) FROM orders", vec![], None)
            .await
            .unwrap()
            .records()[0][0],
        aws_sdk_rdsdata::types::Field::LongValue(1)
    );

    drop_database(&ctx.mysql_url, &other).await;
    ctx.cleanup().await;
}

#[tokio::test]
async fn migrate_is_idempotent_and_a_rotated_password_takes_effect_when_it_runs_again() {
    let ctx = Ctx::start().await;
    let first = ctx.migrate().await.expect("first run");
    assert!(!first.applied.is_empty());
    let again = ctx.migrate().await.expect("second run");
    assert!(again.applied.is_empty(), "nothing left to apply");
    assert!(again.app_user.is_some());
    do_what_the_functions_do(&ctx.app_db().await).await;

    // The secret's password changes (a rotation): until migrate runs, the user still has
    // the old one and the functions cannot sign in.
    let rotated = SecretCredentials {
        password: random_password(),
        ..ctx.app.clone()
    };
    ctx.api.server.set_secret(rotated);
    let stale = ctx.app_db().await;
    assert!(
        stale.execute("SELECT 1", vec![], None).await.is_err(),
        "the old password is still in the database"
    );
    ctx.migrate().await.expect("run after the rotation");
    do_what_the_functions_do(&ctx.app_db().await).await;
    ctx.cleanup().await;
}

#[tokio::test]
async fn migrate_refuses_an_app_secret_it_cannot_use_safely() {
    let ctx = Ctx::start().await;
    // A password that would need quoting in CREATE USER.
    ctx.api.server.set_secret(SecretCredentials {
        password: "abc'; DROP TABLE orders; --".into(),
        ..ctx.app.clone()
    });
    let err = ctx
        .migrate()
        .await
        .expect_err("a password with punctuation");
    assert!(format!("{err:#}").contains("letters and digits"), "{err:#}");
    // The migrations ran (master secret); the user was not made.
    let app = ctx.app_db().await;
    assert!(app.execute("SELECT 1", vec![], None).await.is_err());

    // The master secret given as the application user's secret.
    let err = run(&MigrateConfig {
        data_api: ctx.data_api(&ctx.api.secret_arn),
        app_secret_arn: Some(ctx.api.secret_arn.clone()),
        secrets_manager_url: Some(ctx.api.server.url()),
    })
    .await
    .expect_err("the master secret as the app secret");
    assert!(format!("{err:#}").contains("master secret"), "{err:#}");

    // Another secret naming the master user.
    let admin_user = ctx
        .mysql_url
        .trim_start_matches("mysql://")
        .split(['@', ':'])
        .next()
        .unwrap()
        .to_string();
    let master_user = SecretCredentials {
        arn: format!("{}-alias", ctx.app.arn),
        username: admin_user,
        password: random_password(),
    };
    ctx.api.server.set_secret(master_user.clone());
    let err = run(&MigrateConfig {
        data_api: ctx.data_api(&ctx.api.secret_arn),
        app_secret_arn: Some(master_user.arn),
        secrets_manager_url: Some(ctx.api.server.url()),
    })
    .await
    .expect_err("a secret naming the master user");
    assert!(
        format!("{err:#}").contains("the user migrations run as"),
        "{err:#}"
    );
    ctx.cleanup().await;
}

/// A secret the server does not know is refused, by the Data API and by Secrets Manager.
#[tokio::test]
async fn an_unknown_secret_is_refused() {
    let ctx = Ctx::start().await;
    let unknown = "arn:aws:secretsmanager:us-east-1:000000000000:secret:nobody";
    let db = DataApi::connect(&ctx.data_api(unknown)).await;
    assert!(db.execute("SELECT 1", vec![], None).await.is_err());
    let err = seckill_cli::migrate::read_app_user(unknown, Some(&ctx.api.server.url()))
        .await
        .expect_err("unknown secret");
    assert!(format!("{err:#}").contains("ResourceNotFound"), "{err:#}");
    let user = seckill_cli::migrate::read_app_user(&ctx.app.arn, Some(&ctx.api.server.url()))
        .await
        .expect("GetSecretValue");
    assert_eq!(user.username, ctx.app.username);
    ctx.cleanup().await;
}

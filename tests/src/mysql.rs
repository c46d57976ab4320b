//! MariaDB and Data API helpers for suites that need a database of their own.
//!
//! Each test gets a fresh database (`seckill_t_<random>`; the stack's `seckill` user has
//! every right on `seckill%`), so tests run in parallel without seeing each other's rows,
//! and an in-process `data-api-local` on `127.0.0.1:0` reached through the real
//! `aws-sdk-rdsdata` client.

use aws_sdk_rdsdata::config::retry::RetryConfig;
use aws_sdk_rdsdata::config::{BehaviorVersion, Credentials, Region};
use data_api_local::{RunningServer, ServerConfig};
use mysql_async::prelude::Queryable;
use seckill_cli::scratch_db;

/// Creates an empty database with a unique name (`seckill_t_…`) and returns the name.
///
/// # Panics
/// When MariaDB cannot be reached or refuses: the suite cannot run without it.
pub async fn fresh_database(mysql_url: &str) -> String {
    scratch_db::create_database(mysql_url, "seckill_t_")
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Drops a database made by [`fresh_database`].
pub async fn drop_database(mysql_url: &str, name: &str) {
    assert!(name.starts_with("seckill_t_"), "refusing to drop {name}");
    scratch_db::drop_database(mysql_url, name)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// An application user's secret for the local Data API server: the ARN
/// `...:secret:<username>-app`, the user `username`, a random password of letters and
/// digits (what `migrate::AppUser` accepts).
pub fn app_secret(username: &str) -> data_api_local::secrets::SecretCredentials {
    data_api_local::secrets::SecretCredentials {
        arn: format!("arn:aws:secretsmanager:us-east-1:000000000000:secret:{username}-app"),
        username: username.to_string(),
        password: random_password(),
    }
}

/// 32 random letters and digits.
pub fn random_password() -> String {
    use rand::Rng as _;
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(32)
        .map(char::from)
        .collect()
}

/// Drops the user `name`@`%` made for a database of [`fresh_database`] (if it exists).
pub async fn drop_user(mysql_url: &str, name: &str) {
    assert!(
        name.starts_with("seckill_t_"),
        "refusing to drop user {name}"
    );
    let mut conn = connect(mysql_url).await;
    conn.query_drop(format!("DROP USER IF EXISTS '{name}'@'%'"))
        .await
        .unwrap_or_else(|e| panic!("DROP USER {name} failed: {e}"));
    conn.disconnect().await.ok();
}

/// `mysql_url` with its database replaced by `database`.
///
/// # Panics
/// When the URL does not start with `mysql://`.
pub fn url_with_database(mysql_url: &str, database: &str) -> String {
    seckill_cli::stack_env::url_with_database(mysql_url, database)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A direct MariaDB connection (not through the Data API), e.g. to check what another
/// session sees.
pub async fn connect(mysql_url: &str) -> mysql_async::Conn {
    scratch_db::mysql(mysql_url)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A payment row for [`insert_payments`]: payment id, order, voucher, outcome, age in
/// seconds.
pub type PaymentRow<O = u64, V = u64> = (String, O, V, &'static str, u64);

/// Writes payment rows `(payment id, order, voucher, outcome, age in seconds)` straight
/// into `payments` (1999 EUR each, the event id `ev_<payment id>`, received that long
/// ago), 1,000 to an INSERT: fixtures for what the webhook would have recorded. Order
/// and voucher are ids, or `Option`s of them for a payment that names none (`NULL`).
pub async fn insert_payments<O, V>(conn: &mut mysql_async::Conn, rows: &[PaymentRow<O, V>])
where
    O: Clone + Into<mysql_async::Value>,
    V: Clone + Into<mysql_async::Value>,
{
    use mysql_async::prelude::Queryable;
    for chunk in rows.chunks(1_000) {
        let values =
            vec!["(?, ?, ?, 1999, 'EUR', ?, ?, UTC_TIMESTAMP(3) - INTERVAL ? SECOND)"; chunk.len()]
                .join(",");
        let params: Vec<mysql_async::Value> = chunk
            .iter()
            .flat_map(|(p, o, v, outcome, age)| {
                [
                    p.clone().into(),
                    o.clone().into(),
                    v.clone().into(),
                    (*outcome).into(),
                    format!("ev_{p}").into(),
                    (*age).into(),
                ]
            })
            .collect();
        conn.exec_drop(
            format!(
                "INSERT INTO payments (payment_id, order_id, voucher_id, amount_minor, currency, \
                 outcome, event_id, received_at) VALUES {values}"
            ),
            params,
        )
        .await
        .unwrap_or_else(|e| panic!("inserting {} payment rows: {e}", chunk.len()));
    }
}

/// Writes order rows `(id, user, status)` of `voucher` straight into `orders` (admitted
/// now), in one multi-row INSERT: fixtures for what the drainer would have written.
pub async fn insert_orders(
    conn: &mut mysql_async::Conn,
    voucher: i64,
    rows: &[(i64, String, &str)],
) {
    use mysql_async::prelude::Queryable;
    let values = vec!["(?, ?, ?, ?, NOW(3))"; rows.len()].join(",");
    let params: Vec<mysql_async::Value> = rows
        .iter()
        .flat_map(|(id, user, status)| {
            [
                (*id).into(),
                voucher.into(),
                user.clone().into(),
                (*status).into(),
            ]
        })
        .collect();
    conn.exec_drop(
        format!(
            "INSERT INTO orders (id, voucher_id, user_id, status, admitted_at) VALUES {values}"
        ),
        params,
    )
    .await
    .unwrap_or_else(|e| panic!("inserting {} orders: {e}", rows.len()));
}

/// Rows the session's handlers have read so far (`Handler_read%`): what a query examined,
/// as a difference, whatever the optimizer's statistics say.
pub async fn handler_reads(conn: &mut mysql_async::Conn) -> u64 {
    use mysql_async::prelude::Queryable;
    let rows: Vec<(String, String)> = conn
        .query("SHOW SESSION STATUS LIKE 'Handler_read%'")
        .await
        .unwrap();
    rows.iter().map(|(_, n)| n.parse::<u64>().unwrap()).sum()
}

/// An SDK client for a Data API endpoint, configured as the functions are locally
/// (region us-east-1, dummy static credentials), with retries off so that each call
/// maps to exactly one request and errors surface at once.
pub fn data_api_client(endpoint_url: &str) -> aws_sdk_rdsdata::Client {
    let config = aws_sdk_rdsdata::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "test"))
        .endpoint_url(endpoint_url)
        .retry_config(RetryConfig::disabled())
        .build();
    aws_sdk_rdsdata::Client::from_conf(config)
}

/// A `data-api-local` started in this process on `127.0.0.1:0`, and a client for it.
pub struct LocalDataApi {
    pub server: RunningServer,
    pub client: aws_sdk_rdsdata::Client,
    pub resource_arn: String,
    pub secret_arn: String,
}

/// Starts `data-api-local` with `config` (see [`ServerConfig::new`] for the defaults).
///
/// # Panics
/// When the server cannot start.
pub async fn start_data_api(config: ServerConfig) -> LocalDataApi {
    let resource_arn = config.resource_arn.clone();
    let secret_arn = config.secret_arn.clone();
    let server = data_api_local::spawn(config)
        .await
        .expect("data-api-local starts");
    let client = data_api_client(&server.url());
    LocalDataApi {
        server,
        client,
        resource_arn,
        secret_arn,
    }
}

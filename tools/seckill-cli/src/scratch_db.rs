//! Databases of one's own on the stack's MariaDB (whose MySQL user may do anything on
//! `seckill%`), for a benchmark run (`seckill_b_…`) or a test (`seckill_t_…`): made empty
//! with a random name, dropped at the end; [`drop_database`] drops nothing else.

use anyhow::Context;
use mysql_async::prelude::Queryable;

/// The prefixes of scratch databases: benchmark runs and tests.
pub const PREFIXES: [&str; 2] = ["seckill_b_", "seckill_t_"];

/// A direct MariaDB connection (not through the Data API).
pub async fn mysql(url: &str) -> anyhow::Result<mysql_async::Conn> {
    let opts = mysql_async::Opts::from_url(url).with_context(|| format!("bad MySQL URL {url}"))?;
    mysql_async::Conn::new(opts)
        .await
        .with_context(|| format!("cannot connect to MariaDB at {url}"))
}

/// Runs one statement on its own connection.
async fn admin(url: &str, sql: String) -> anyhow::Result<()> {
    let mut conn = mysql(url).await?;
    conn.query_drop(&sql).await.with_context(|| {
        format!("{sql} failed (the MySQL user needs rights on seckill% databases)")
    })?;
    conn.disconnect().await.ok();
    Ok(())
}

/// Creates an empty database `<prefix><random hex>` through `admin_url` and returns its
/// name.
pub async fn create_database(admin_url: &str, prefix: &str) -> anyhow::Result<String> {
    anyhow::ensure!(PREFIXES.contains(&prefix), "not a scratch prefix: {prefix}");
    let name = format!("{prefix}{:016x}", rand::random::<u64>());
    admin(admin_url, format!("CREATE DATABASE `{name}`")).await?;
    Ok(name)
}

/// Drops a database made by [`create_database`].
pub async fn drop_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        PREFIXES.iter().any(|p| name.starts_with(p)),
        "refusing to drop {name}"
    );
    admin(admin_url, format!("DROP DATABASE IF EXISTS `{name}`")).await
}

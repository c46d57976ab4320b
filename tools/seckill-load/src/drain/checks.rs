//! The invariants every drain variant is checked against afterwards, read from the
//! database: each order committed once, no user twice, the stock taken exactly.

use seckill_shared::adapters::data_api::{field, param};
use seckill_shared::domain::VoucherId;

use crate::backends::Bench;
use crate::record::Check;

/// The database holds exactly `n` orders of `voucher`, one per user, all confirmed,
/// and (when given) the voucher's database stock is `left`.
pub(super) async fn db_checks(
    bench: &Bench,
    voucher: VoucherId,
    n: u64,
    left: Option<i64>,
) -> anyhow::Result<Vec<Check>> {
    let out = bench
        .db
        .execute(
            "SELECT COUNT(*), COUNT(DISTINCT user_id), COALESCE(SUM(status = 'confirmed'), 0) FROM orders WHERE voucher_id = :v",
            vec![param::long("v", voucher.get())],
            None,
        )
        .await?;
    let long = |i: usize| out.records().first()?.get(i).and_then(field::long);
    let [rows, users, confirmed] = [0, 1, 2].map(|i| long(i).unwrap_or(-1));
    let mut checks = vec![
        Check::new(
            "every order committed once",
            rows == n as i64 && confirmed == n as i64,
            format!("{rows} rows ({confirmed} confirmed) for {n} admitted orders"),
        ),
        Check::new(
            "no user twice",
            users == rows,
            format!("{users} distinct users in {rows} rows"),
        ),
    ];
    if let Some(left) = left {
        let v = bench.db.voucher(voucher).await?;
        let have = v.as_ref().map(|v| v.db_stock_left);
        checks.push(Check::new(
            "database stock taken exactly",
            have == Some(left),
            format!("stock_left {have:?}, expected {left}"),
        ));
    }
    Ok(checks)
}

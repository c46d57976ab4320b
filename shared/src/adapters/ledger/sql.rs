//! The drainer's SQL, all of it: every statement the order ledger
//! ([`super::Ledger`], [`super::LedgerTx`]) runs, with the parameters it binds.
//!
//! Invariants kept here:
//! - every value is a named parameter, never spliced into the SQL (the only text built
//!   per call is the list of parameter names of [`existing_orders`]);
//! - inserts are `INSERT IGNORE`, so a redelivered order changes nothing, and their row
//!   count is exact (one ExecuteStatement per chunk);
//! - the stock decrement carries its own guard (`stock_left >= :n`);
//! - a statement over at most [`MAX_ROWS_PER_STATEMENT`] rows stays within the Data API's
//!   limits (SQL ≤ 65,536 characters, request ≤ 4 MiB, response ≤ 1 MiB; tested below).

use aws_sdk_rdsdata::types::SqlParameter;

use crate::adapters::data_api::{USER_ID_TEXT, format_datetime, param};
use crate::domain::{AdmittedOrder, ClosedOrder, OrderId, OrderStatus, UnixMillis, VoucherId};

/// Rows (or ids) per statement. At most ~45 characters of SQL and ~400 bytes of request
/// per row, so 1,000 rows stay far below 65,536 characters and 4 MiB; a lookup returns at
/// most 2,000 short rows, far below 1 MiB.
pub const MAX_ROWS_PER_STATEMENT: usize = 1_000;

/// The longest `reason` the `orders` table holds.
pub const MAX_REASON_CHARS: usize = 64;

/// Locks the voucher row and reads its database stock, payment window and bucket count
/// (`:v`). `NOWAIT`: a row held by another transaction fails at once instead of waiting
/// up to `innodb_lock_wait_timeout`.
pub const LOCK_VOUCHER: &str =
    "SELECT stock_left, pay_within_ms, buckets FROM vouchers WHERE id = :v FOR UPDATE NOWAIT";

/// The parameters of [`LOCK_VOUCHER`].
pub fn lock_voucher(voucher: VoucherId) -> Vec<SqlParameter> {
    vec![param::long("v", voucher.get())]
}

/// Vouchers one transaction of several small sales locks at most (the drainer's group
/// commit): their ids travel as one JSON parameter of about 20 bytes each, far below
/// the Data API's 4 MiB.
pub const MAX_VOUCHERS_PER_STATEMENT: usize = 250;

/// [`LOCK_VOUCHER`] for several distinct vouchers at once: `ids` are one JSON
/// parameter, read in their order by `JSON_TABLE`, each row found through the primary
/// key (`STRAIGHT_JOIN`, `FORCE INDEX`: whatever the statistics say, and on a table
/// never analysed, exactly these rows are read and locked, in the order given: the
/// caller sorts them), `NOWAIT` like the single lock. `(id, stock_left, pay_within_ms,
/// buckets)`, in no promised order (no `ORDER BY`: its sort would read every row again).
///
/// One parameter and the same SQL text for every group, not one parameter per voucher
/// (`IN (:v0, ..., :v249)`, a text per group size): the drainer, the Data API and the
/// database parsed and bound 250 parameters a statement, a large part of what a small
/// sale cost (docs/how-it-works.md, step 4a).
pub fn lock_vouchers(ids: &[VoucherId]) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "SELECT v.id, v.stock_left, v.pay_within_ms, v.buckets \
        FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$' ERROR ON EMPTY)) AS j \
        STRAIGHT_JOIN vouchers AS v FORCE INDEX (PRIMARY) ON v.id = j.id \
        FOR UPDATE NOWAIT";
    let ids: Vec<i64> = ids.iter().map(|v| v.get()).collect();
    let ids = serde_json::to_string(&ids).expect("numbers serialise");
    (SQL.to_string(), vec![param::string("ids", &ids)])
}

/// [`TAKE_STOCK`] for several vouchers in one statement: each voucher's row takes its
/// own count, guarded by its own `stock_left >= n`; every row updated, or fewer when a
/// guard refused (the caller compares). The vouchers must be distinct (a row is
/// updated at most once by a multi-table `UPDATE`); the drainer's groups are.
///
/// The counts travel as one JSON parameter `[[voucher, n], ...]`, joined to the rows
/// through the primary key in the parameter's order (`STRAIGHT_JOIN`,
/// `FORCE INDEX (PRIMARY)`): an `UPDATE` locks every row it reads, and without the
/// forced plan MariaDB read (and locked) the whole table when the group's ids were a
/// large part of it (the earlier `IN` form on a never-analysed table of 31 rows: two
/// groups written at once deadlocked). Each row's count is found by the join, not by
/// a `CASE` of 250 arms evaluated twice per row.
pub fn take_stocks(takes: &[(VoucherId, i64)]) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "UPDATE JSON_TABLE(:takes, '$[*]' COLUMNS (\
        id BIGINT UNSIGNED PATH '$[0]' ERROR ON EMPTY, \
        n INT PATH '$[1]' ERROR ON EMPTY)) AS j \
        STRAIGHT_JOIN vouchers AS v FORCE INDEX (PRIMARY) ON v.id = j.id \
        SET v.stock_left = v.stock_left - j.n WHERE v.stock_left >= j.n";
    let takes: Vec<(i64, i64)> = takes.iter().map(|(v, n)| (v.get(), *n)).collect();
    let takes = serde_json::to_string(&takes).expect("numbers serialise");
    (SQL.to_string(), vec![param::string("takes", &takes)])
}

/// Takes `:n` units of voucher `:v`'s stock, only if it has them: one row updated, or
/// none when the guard refused.
pub const TAKE_STOCK: &str =
    "UPDATE vouchers SET stock_left = stock_left - :n WHERE id = :v AND stock_left >= :n";

/// The parameters of [`TAKE_STOCK`].
pub fn take_stock(voucher: VoucherId, n: i64) -> Vec<SqlParameter> {
    vec![param::long("n", n), param::long("v", voucher.get())]
}

/// One row of [`insert_orders`] as `JSON_TABLE` reads it: `[id, voucher, user,
/// admitted_at]`, a JSON array rather than an object, because MariaDB then matches no
/// key names: the statement took about a quarter less of the server's CPU per row
/// (`mariadb` client, 20,000 rows in 2,000-row transactions: 19-23 against 25-28
/// centiseconds), and the database's CPU is what limits one sale's drain.
type Row<'a> = (i64, i64, &'a str, String);

/// `INSERT IGNORE INTO orders ... SELECT ... FROM JSON_TABLE(:rows, ...)` for one chunk.
///
/// The rows travel as one JSON string parameter, not four parameters per row: the Data
/// API request shrinks to a third, and neither side builds, signs, parses and binds
/// thousands of parameters per batch (which cost more than the insert itself).
/// `JSON_TABLE` is in MySQL 8 (Aurora MySQL 3) and MariaDB 10.6+; `ERROR ON EMPTY`
/// makes a row with a missing field fail the statement instead of inserting a NULL.
/// The values are still never spliced into the SQL.
pub fn insert_orders(
    chunk: &[AdmittedOrder],
    status: OrderStatus,
    reason: Option<&str>,
) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "INSERT IGNORE INTO orders (id, voucher_id, user_id, status, reason, admitted_at) \
        SELECT j.id, j.v, j.u, :s, :r, j.a FROM JSON_TABLE(:rows, '$[*]' COLUMNS (\
        id BIGINT UNSIGNED PATH '$[0]' ERROR ON EMPTY, \
        v BIGINT UNSIGNED PATH '$[1]' ERROR ON EMPTY, \
        u VARCHAR(64) PATH '$[2]' ERROR ON EMPTY, \
        a DATETIME(3) PATH '$[3]' ERROR ON EMPTY)) AS j";
    let rows: Vec<Row<'_>> = chunk
        .iter()
        .map(|o| {
            let admitted = format_datetime(o.admitted_ms);
            (o.id.get(), o.voucher.get(), o.user.as_str(), admitted)
        })
        .collect();
    let rows = serde_json::to_string(&rows).expect("rows of numbers and strings serialise");
    let params = vec![
        param::string("s", status.as_str()),
        match reason {
            Some(r) => param::string("r", &truncate_chars(r, MAX_REASON_CHARS)),
            None => param::null("r"),
        },
        param::string("rows", &rows),
    ];
    (SQL.to_string(), params)
}

/// The lookup of orders colliding with one chunk, by id or by buyer of `voucher`.
pub fn existing_orders(voucher: VoucherId, chunk: &[AdmittedOrder]) -> (String, Vec<SqlParameter>) {
    let ids: Vec<String> = (0..chunk.len()).map(|i| format!(":i{i}")).collect();
    let users: Vec<String> = (0..chunk.len()).map(|i| format!(":u{i}")).collect();
    // A UNION rather than `OR`: each half is a range on its own index (primary key;
    // unique (voucher, holder)), named, since lists of up to a chunk's 1,000 values are
    // past the index dives (`eq_range_index_dive_limit`, 200) and the optimizer would
    // otherwise weigh the three indexes that begin with voucher_id by the table's
    // statistics, which a table just written may not have. By holder, not user: a
    // buyer's cancelled or expired order (holder NULL) does not collide with their new
    // one.
    let sql = format!(
        "SELECT id, voucher_id, {USER_ID_TEXT}, holder IS NOT NULL FROM orders FORCE INDEX (PRIMARY) \
         WHERE id IN ({}) \
         UNION SELECT id, voucher_id, {USER_ID_TEXT}, 1 FROM orders FORCE INDEX (orders_one_holder) \
         WHERE voucher_id = :v AND holder IN ({})",
        ids.join(","),
        users.join(",")
    );
    let mut params = Vec::with_capacity(1 + chunk.len() * 2);
    params.push(param::long("v", voucher.get()));
    for (i, o) in chunk.iter().enumerate() {
        params.push(param::long(&format!("i{i}"), o.id.get()));
        params.push(param::string(&format!("u{i}"), o.user.as_str()));
    }
    (sql, params)
}

/// One row of [`insert_payment_orders`]: an order of a voucher with a payment step, its
/// status (`awaiting_payment`, or the close Redis already decided), its deadline and
/// payment reference.
pub struct PaymentRow<'a> {
    pub order: &'a AdmittedOrder,
    pub status: OrderStatus,
    pub pay_by_ms: UnixMillis,
    pub payment_ref: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct PayRow<'a> {
    i: i64,
    v: i64,
    u: &'a str,
    a: String,
    s: &'static str,
    p: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    r: Option<&'a str>,
}

/// `INSERT IGNORE` of orders of a voucher with a payment step, each with its own status,
/// deadline and reference (`JSON_TABLE` as in [`insert_orders`], but over objects: a
/// row's reference may be absent); a closed order gets `closed_at` now.
pub fn insert_payment_orders(chunk: &[PaymentRow<'_>]) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "INSERT IGNORE INTO orders \
        (id, voucher_id, user_id, status, pay_by, pay_ref, closed_at, admitted_at) \
        SELECT j.id, j.v, j.u, j.s, j.p, j.r, \
        IF(j.s IN ('paid', 'cancelled', 'expired'), UTC_TIMESTAMP(3), NULL), j.a \
        FROM JSON_TABLE(:rows, '$[*]' COLUMNS (\
        id BIGINT UNSIGNED PATH '$.i' ERROR ON EMPTY, \
        v BIGINT UNSIGNED PATH '$.v' ERROR ON EMPTY, \
        u VARCHAR(64) PATH '$.u' ERROR ON EMPTY, \
        a DATETIME(3) PATH '$.a' ERROR ON EMPTY, \
        s VARCHAR(20) PATH '$.s' ERROR ON EMPTY, \
        p DATETIME(3) PATH '$.p' ERROR ON EMPTY, \
        r VARCHAR(128) PATH '$.r')) AS j";
    let rows: Vec<PayRow<'_>> = chunk
        .iter()
        .map(|row| PayRow {
            i: row.order.id.get(),
            v: row.order.voucher.get(),
            u: row.order.user.as_str(),
            a: format_datetime(row.order.admitted_ms),
            s: row.status.as_str(),
            p: format_datetime(row.pay_by_ms),
            r: row.payment_ref,
        })
        .collect();
    let rows = serde_json::to_string(&rows).expect("rows of numbers and strings serialise");
    (SQL.to_string(), vec![param::string("rows", &rows)])
}

/// Records closes Redis decided (`lua/close.lua`) on orders of voucher `:v` still
/// `awaiting_payment`: `paid` with its reference, or `cancelled` / `expired`. Only rows
/// still awaiting payment change, so a close recorded once is never recorded again; the
/// row count of the `cancelled` / `expired` statement is the units to give back.
///
/// The rows are found from the parameter through the primary key (`STRAIGHT_JOIN`,
/// `FORCE INDEX`), as [`take_stocks`] finds its vouchers: an `UPDATE` locks what it
/// reads, and starting from the voucher's `awaiting_payment` rows instead would read and
/// lock every unpaid order of the sale.
pub fn settle_closes(
    voucher: VoucherId,
    closes: &[(OrderId, &ClosedOrder)],
    returned: bool,
) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "UPDATE JSON_TABLE(:rows, '$[*]' COLUMNS (\
        id BIGINT UNSIGNED PATH '$.i' ERROR ON EMPTY, \
        s VARCHAR(20) PATH '$.s' ERROR ON EMPTY, \
        r VARCHAR(128) PATH '$.r')) AS j \
        STRAIGHT_JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = j.id \
        SET o.status = j.s, o.pay_ref = j.r, o.closed_at = UTC_TIMESTAMP(3) \
        WHERE o.voucher_id = :v AND o.status = 'awaiting_payment'";
    #[derive(serde::Serialize)]
    struct Close<'a> {
        i: i64,
        s: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        r: Option<&'a str>,
    }
    let rows: Vec<Close<'_>> = closes
        .iter()
        .filter(|(_, c)| c.status.returned_unit() == returned)
        .map(|(id, c)| Close {
            i: id.get(),
            s: c.status.as_str(),
            r: (c.status == OrderStatus::Paid).then_some(c.payment_ref.as_str()),
        })
        .collect();
    let rows = serde_json::to_string(&rows).expect("rows of numbers and strings serialise");
    (
        SQL.to_string(),
        vec![
            param::string("rows", &rows),
            param::long("v", voucher.get()),
        ],
    )
}

/// Marks for refund the payments of orders Redis closed as paid but the database holds
/// `rejected` (its stock could not cover them: they never held a unit, yet the provider
/// took the money). `paid` is `[[order id, payment id], ...]`; a payment row moves only
/// from `received` or `paid`, and only for its own order, so a second run changes
/// nothing. The row count is the payments newly due for refund.
pub fn refund_rejected_paid(
    voucher: VoucherId,
    paid: &[(OrderId, &str)],
) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "UPDATE JSON_TABLE(:paid, '$[*]' COLUMNS (\
        id BIGINT UNSIGNED PATH '$[0]' ERROR ON EMPTY, \
        ref VARCHAR(128) PATH '$[1]' ERROR ON EMPTY)) AS j \
        STRAIGHT_JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = j.id \
        STRAIGHT_JOIN payments AS p FORCE INDEX (PRIMARY) ON p.payment_id = j.ref \
        SET p.outcome = 'refund_due', p.reason = :r, p.decided_at = UTC_TIMESTAMP(3) \
        WHERE o.voucher_id = :v AND o.status = 'rejected' AND p.order_id = o.id \
        AND p.outcome IN ('received', 'paid')";
    let paid: Vec<(i64, &str)> = paid.iter().map(|(o, r)| (o.get(), *r)).collect();
    let paid = serde_json::to_string(&paid).expect("numbers and strings serialise");
    (
        SQL.to_string(),
        vec![
            param::string("paid", &paid),
            param::string("r", REJECTED_PAID_REASON),
            param::long("v", voucher.get()),
        ],
    )
}

/// The payments recorded `paid` of orders of voucher `:v` (`:ids`, a JSON array of the
/// order ids whose close was just recorded) that the database now holds `cancelled` or
/// `expired`, or `paid` by another payment, and whether the order is paid (the second
/// column). Redis decides every close once, so such a payment paid the order in a close
/// Redis lost since (a failover that dropped the write, the sale rebuilt from an
/// `awaiting_payment` row); the order was then closed again: expired or cancelled (its
/// unit back on sale), or paid a second time. The money taken is to be given back
/// ([`refund_payments`]), not kept `paid`. A plain read: only the rows found are then
/// locked (through their primary key), never the gaps of `payments_by_order` between
/// the orders that have none, where webhooks insert.
pub const PAID_CLOSED_AGAIN: &str = "SELECT p.payment_id, o.status = 'paid' FROM JSON_TABLE(:ids, '$[*]' COLUMNS (\
    id BIGINT UNSIGNED PATH '$' ERROR ON EMPTY)) AS j \
    STRAIGHT_JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = j.id \
    STRAIGHT_JOIN payments AS p FORCE INDEX (payments_by_order) ON p.order_id = o.id \
    WHERE o.voucher_id = :v AND p.outcome = 'paid' \
    AND (o.status IN ('cancelled', 'expired') OR (o.status = 'paid' AND p.payment_id <> o.pay_ref))";

/// Marks payments `refund_due` with a reason each (`[[payment id, reason], ...]`), each
/// found through its primary key, from `paid` only: a second run changes nothing.
pub fn refund_payments(rows: &[(&str, &str)]) -> (String, Vec<SqlParameter>) {
    const SQL: &str = "UPDATE JSON_TABLE(:rows, '$[*]' COLUMNS (\
        id VARCHAR(128) PATH '$[0]' ERROR ON EMPTY, \
        r VARCHAR(255) PATH '$[1]' ERROR ON EMPTY)) AS j \
        STRAIGHT_JOIN payments AS p FORCE INDEX (PRIMARY) ON p.payment_id = j.id \
        SET p.outcome = 'refund_due', p.reason = j.r, p.decided_at = UTC_TIMESTAMP(3) \
        WHERE p.outcome = 'paid'";
    let rows = serde_json::to_string(rows).expect("strings serialise");
    (SQL.to_string(), vec![param::string("rows", &rows)])
}

/// Why a payment of an order closed after it was paid is due for refund.
pub const CLOSED_PAID_REASON: &str = "the order was cancelled or expired after it was paid (its paid close was lost): its unit went back on sale";

/// Why a payment of an order another payment paid since is due for refund.
pub const PAID_TWICE_REASON: &str =
    "another payment paid the order after this one's close was lost: paid twice";

/// Voucher `:v`'s end, whether any of its orders awaits payment (through the
/// `(voucher_id, status)` index, named: the first such row answers), and its buckets.
pub const SALE_END: &str = "SELECT v.ends_at, EXISTS (SELECT 1 FROM orders FORCE INDEX (orders_by_voucher_status) \
    WHERE voucher_id = :v AND status = 'awaiting_payment'), v.buckets FROM vouchers AS v WHERE v.id = :v";

/// Why a payment of a rejected order is due for refund.
pub const REJECTED_PAID_REASON: &str =
    "the order was rejected (the database stock could not cover it) after it was paid";

/// Gives `:n` units back to voucher `:v`'s database stock (closes recorded by
/// [`settle_closes`]); the table's CHECK keeps `stock_left <= stock`.
pub const RETURN_STOCK: &str = "UPDATE vouchers SET stock_left = stock_left + :n WHERE id = :v";

/// Which of the orders `:rows` (a JSON array of ids) of voucher `:v` the database holds
/// closed or refused (anything but `awaiting_payment`): their close is recorded. Each
/// found through the primary key from the parameter, whatever the statistics say.
pub const SETTLED_ORDERS: &str = "SELECT o.id FROM JSON_TABLE(:rows, '$[*]' COLUMNS (\
    id BIGINT UNSIGNED PATH '$' ERROR ON EMPTY)) AS j \
    STRAIGHT_JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = j.id \
    WHERE o.voucher_id = :v AND o.status <> 'awaiting_payment'";

/// Ids per [`ORDER_ROWS`] statement: about 20 bytes of parameter each, and at most a row
/// of about 55 bytes of response each (10,000: about 550 KB, within the Data API's
/// 1 MiB; tested on the real server by `drainer_flow`'s backlog of closes).
pub const IDS_PER_ROW_LOOKUP: usize = 10_000;

/// Which of the orders `:ids` (a JSON array of ids) of voucher `:v` have a row, and
/// whether it still awaits payment: `(id, status = 'awaiting_payment')`. Each found
/// through the primary key from the parameter (`STRAIGHT_JOIN`, `FORCE INDEX`), whatever
/// the statistics say; a plain read (the rows of a voucher's orders are written only
/// under its row lock, which the caller holds). The drainer asks it of the closes
/// waiting in `to_settle` when more wait than a transaction records: a close of an
/// order without a row has nothing to record yet.
pub const ORDER_ROWS: &str = "SELECT o.id, o.status = 'awaiting_payment' FROM JSON_TABLE(:ids, '$[*]' COLUMNS (\
    id BIGINT UNSIGNED PATH '$' ERROR ON EMPTY)) AS j \
    STRAIGHT_JOIN orders AS o FORCE INDEX (PRIMARY) ON o.id = j.id \
    WHERE o.voucher_id = :v";

fn truncate_chars(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{OrderId, UserId};

    fn order(i: i64) -> AdmittedOrder {
        AdmittedOrder {
            id: OrderId::new(i64::MAX - i).unwrap(),
            voucher: VoucherId::new(i64::MAX).unwrap(),
            user: UserId::parse(&"€".repeat(21)).unwrap(),
            admitted_ms: 1_795_391_999_123,
        }
    }

    #[test]
    fn the_largest_statements_stay_within_the_data_api_limits() {
        let chunk: Vec<_> = (0..MAX_ROWS_PER_STATEMENT as i64).map(order).collect();
        let (sql, params) = insert_orders(&chunk, OrderStatus::Rejected, Some("x"));
        assert!(sql.chars().count() < 65_536, "{} chars", sql.len());
        assert_eq!(params.len(), 3);
        // The request is the SQL and the parameters, with room to spare for the JSON
        // around them.
        let values: usize = params
            .iter()
            .filter_map(|p| p.value.as_ref()?.as_string_value().ok())
            .map(String::len)
            .sum();
        let request = sql.len() + values + 1024;
        assert!(request < 4 * 1024 * 1024, "{request} bytes");
        let (sql, params) = existing_orders(chunk[0].voucher, &chunk);
        assert!(sql.chars().count() < 65_536);
        assert_eq!(params.len(), 1 + 2 * chunk.len());
        let ids: Vec<VoucherId> = (0..MAX_VOUCHERS_PER_STATEMENT as i64)
            .map(|i| VoucherId::new(i64::MAX - i).unwrap())
            .collect();
        let (sql, params) = lock_vouchers(&ids);
        assert!(sql.chars().count() < 65_536);
        assert_eq!(params.len(), 1);
        let takes: Vec<(VoucherId, i64)> = ids.iter().map(|v| (*v, i64::MAX)).collect();
        let (sql, params) = take_stocks(&takes);
        assert!(sql.chars().count() < 65_536, "{} chars", sql.len());
        assert_eq!(params.len(), 1);
        let json = string_param(&params, "takes");
        assert!(json.len() < 64 * 1024, "{} bytes", json.len());
    }

    fn string_param<'a>(params: &'a [SqlParameter], name: &str) -> &'a str {
        params
            .iter()
            .find(|p| p.name() == Some(name))
            .and_then(|p| p.value.as_ref()?.as_string_value().ok())
            .unwrap_or_else(|| panic!("a string parameter {name}"))
    }

    #[test]
    fn the_group_statements_carry_each_voucher_s_own_count_as_one_parameter() {
        let v = |i| VoucherId::new(i).unwrap();
        let (sql, params) = take_stocks(&[(v(7), 2), (v(9), 1)]);
        assert_eq!(string_param(&params, "takes"), "[[7,2],[9,1]]");
        assert!(
            sql.ends_with("SET v.stock_left = v.stock_left - j.n WHERE v.stock_left >= j.n"),
            "{sql}"
        );
        // Every group, whatever its size, sends the same text.
        assert_eq!(sql, take_stocks(&[(v(1), 1)]).0);
        let (sql, params) = lock_vouchers(&[v(1), v(3)]);
        assert_eq!(string_param(&params, "ids"), "[1,3]");
        assert!(sql.ends_with("ON v.id = j.id FOR UPDATE NOWAIT"), "{sql}");
    }

    #[test]
    fn insert_rows_are_arrays_in_the_order_of_the_statement_s_paths() {
        let o = order(7);
        let (sql, params) = insert_orders(std::slice::from_ref(&o), OrderStatus::Confirmed, None);
        let rows = params
            .iter()
            .find(|p| p.name() == Some("rows"))
            .and_then(|p| p.value.as_ref()?.as_string_value().ok())
            .expect("a rows parameter");
        let rows: serde_json::Value = serde_json::from_str(rows).unwrap();
        let expected = serde_json::json!([[
            o.id.get(),
            o.voucher.get(),
            o.user.as_str(),
            format_datetime(o.admitted_ms)
        ]]);
        assert_eq!(rows, expected);
        for (i, column) in ["id BIGINT", "v BIGINT", "u VARCHAR", "a DATETIME"]
            .iter()
            .enumerate()
        {
            // `<name> <type> PATH '$[i]' ERROR ON EMPTY`: the column reads element i.
            let at = sql.find(column).expect(column);
            let end = at + sql[at..].find(" ERROR ON EMPTY").expect("ERROR ON EMPTY");
            let path = format!("PATH '$[{i}]'");
            assert!(sql[at..end].ends_with(&path), "{column}: {}", &sql[at..end]);
        }
    }

    #[test]
    fn reasons_are_cut_to_the_column_width() {
        assert_eq!(
            truncate_chars(&"é".repeat(70), MAX_REASON_CHARS)
                .chars()
                .count(),
            64
        );
    }
}

//! Reading Redis `INFO`: the text of a section from every primary, and one field of it
//! (replication, CPU and command statistics of a run).

use seckill_shared::adapters::redis::RedisConn;

/// The text of `INFO <section>` of every primary (the cluster client sends INFO to each
/// primary and answers with a map of their replies; a plain connection has one).
pub async fn redis_infos(conn: &RedisConn, section: &str) -> Vec<String> {
    let reply = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn.clone())
        .await;
    reply.map_or_else(|_| Vec::new(), texts)
}

/// The texts in a reply, however nested.
fn texts(v: redis::Value) -> Vec<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b).into_iter().collect(),
        redis::Value::SimpleString(text) | redis::Value::VerbatimString { text, .. } => vec![text],
        redis::Value::Map(pairs) => pairs.into_iter().flat_map(|(_, v)| texts(v)).collect(),
        redis::Value::Array(items) => items.into_iter().flat_map(texts).collect(),
        _ => Vec::new(),
    }
}

/// A field of INFO text.
pub fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

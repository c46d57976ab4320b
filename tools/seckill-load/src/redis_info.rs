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

/// One command's counters in `INFO commandstats`, summed over the nodes read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CommandStat {
    pub calls: u64,
    /// Microseconds the server spent running it (network I/O not included).
    pub usec: f64,
    /// Calls that failed inside the command (a script's `NOSCRIPT` among them).
    pub failed_calls: u64,
}

/// The commands of `INFO commandstats` texts (one a node), summed by name: lower case,
/// without the `cmdstat_` prefix (`cmdstat_evalsha:calls=5,usec=80,...,failed_calls=1`).
/// The one reader of that section for the benchmarks and the tests.
pub fn commandstats<'a>(
    infos: impl IntoIterator<Item = &'a str>,
) -> std::collections::BTreeMap<String, CommandStat> {
    let mut out = std::collections::BTreeMap::<String, CommandStat>::new();
    for line in infos.into_iter().flat_map(str::lines) {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
        };
        let count = |key: &str| field(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let s = out.entry(name.to_string()).or_default();
        s.calls += count("calls");
        s.failed_calls += count("failed_calls");
        s.usec += field("usec")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_summed_over_nodes_by_name() {
        let a = "# Commandstats\r\ncmdstat_evalsha:calls=5,usec=80,usec_per_call=16.00,rejected_calls=0,failed_calls=1\r\ncmdstat_hsetnx:calls=2,usec=3,usec_per_call=1.50\r\n";
        let b =
            "cmdstat_evalsha:calls=7,usec=20.5,usec_per_call=2.9,rejected_calls=1,failed_calls=0\n";
        let s = commandstats([a, b]);
        assert_eq!(s.len(), 2);
        let e = s["evalsha"];
        assert_eq!((e.calls, e.failed_calls), (12, 1));
        assert!((e.usec - 100.5).abs() < 1e-9);
        assert_eq!(s["hsetnx"].calls, 2);
        assert!(commandstats(["# Commandstats\n"]).is_empty());
    }
}

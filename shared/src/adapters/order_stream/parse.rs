//! Stream replies as Redis sends them, read into entries: XRANGE, XCLAIM, the entries
//! `lua/read.lua` and `lua/probe.lua` read, XAUTOCLAIM (Redis 6.2 and 7), and stream
//! ids compared.
//!
//! Entry fields stay raw bytes, and a reply of an unexpected shape is
//! [`StoreError::Corrupt`], never a panic.

use redis::Value;

use crate::domain::StreamEntry;
use crate::error::StoreError;

/// One page of an XAUTOCLAIM scan.
#[derive(Debug, Clone, Default)]
pub struct ClaimPage {
    /// Entries now owned by the claiming consumer, with their delivery counts.
    pub entries: Vec<StreamEntry>,
    /// Ids that were pending but no longer exist in the stream: Redis dropped them from
    /// the pending list itself, there is nothing to process.
    pub deleted: Vec<String>,
    /// Where the next page starts; `None` when the scan reached the end (`0-0`).
    pub next: Option<String>,
}

/// Orders stream ids (`<ms>-<seq>`) numerically; ids that do not parse sort first.
pub fn id_less(a: &str, b: &str) -> bool {
    fn parts(id: &str) -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    }
    parts(a) < parts(b)
}

fn corrupt(what: &str, v: &Value) -> StoreError {
    StoreError::Corrupt(format!("unexpected {what} reply: {v:?}"))
}

fn bytes_of(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

pub(super) fn string_of(v: Value) -> Option<String> {
    bytes_of(v).and_then(|b| String::from_utf8(b).ok())
}

/// `[id, [f1, v1, f2, v2, ...]]` → an entry; `None` for an entry whose fields are nil (it
/// was deleted while pending).
fn parse_entry(v: Value) -> Result<Option<StreamEntry>, StoreError> {
    let items = match v {
        Value::Array(items) => items,
        Value::Nil => return Ok(None),
        other => return Err(corrupt("stream entry", &other)),
    };
    let [id, body] = <[Value; 2]>::try_from(items)
        .map_err(|items| corrupt("stream entry", &Value::Array(items)))?;
    let id = string_of(id.clone()).ok_or_else(|| corrupt("stream entry id", &id))?;
    let flat = match body {
        Value::Array(flat) => flat,
        Value::Nil => return Ok(None),
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => return Err(corrupt("stream entry fields", &other)),
    };
    if flat.len() % 2 != 0 {
        return Err(StoreError::Corrupt(format!(
            "stream entry {id} has an odd number of field items"
        )));
    }
    let mut fields = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(f), Some(v)) = (it.next(), it.next()) {
        let f = bytes_of(f).ok_or_else(|| StoreError::Corrupt(format!("entry {id}: field")))?;
        let v = bytes_of(v).ok_or_else(|| StoreError::Corrupt(format!("entry {id}: value")))?;
        fields.push((f, v));
    }
    Ok(Some(StreamEntry {
        id,
        fields,
        deliveries: 0,
    }))
}

pub(super) fn parse_entries(v: Value) -> Result<Vec<StreamEntry>, StoreError> {
    match v {
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if let Some(e) = parse_entry(item)? {
                    out.push(e);
                }
            }
            Ok(out)
        }
        Value::Nil => Ok(Vec::new()),
        other => Err(corrupt("stream entries", &other)),
    }
}

/// XAUTOCLAIM: `[next, entries]` (Redis 6.2) or `[next, entries, deleted ids]` (7+).
pub(super) fn parse_autoclaim(v: Value) -> Result<ClaimPage, StoreError> {
    let Value::Array(items) = v else {
        return Err(corrupt("XAUTOCLAIM", &v));
    };
    if !(2..=3).contains(&items.len()) {
        return Err(corrupt("XAUTOCLAIM", &Value::Array(items)));
    }
    let mut it = items.into_iter();
    let next = it
        .next()
        .and_then(string_of)
        .ok_or_else(|| StoreError::Corrupt("XAUTOCLAIM cursor".into()))?;
    let entries = parse_entries(it.next().unwrap_or(Value::Nil))?;
    let deleted = match it.next() {
        Some(Value::Array(ids)) => ids.into_iter().filter_map(string_of).collect(),
        _ => Vec::new(),
    };
    Ok(ClaimPage {
        entries,
        deleted,
        next: (next != "0-0").then_some(next),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, kv: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(kv.iter().map(|s| bulk(s)).collect()),
        ])
    }

    #[test]
    fn entries_parse_with_their_fields_and_deleted_ones_are_skipped() {
        // What XRANGE, XCLAIM and lua/read.lua return: entries, a deleted one as nil.
        let reply = Value::Array(vec![
            entry("1-0", &["order_id", "5"]),
            Value::Nil,
            Value::Array(vec![bulk("2-0"), Value::Nil]),
            Value::Array(vec![bulk("3-0"), Value::Map(vec![(bulk("x"), bulk("y"))])]),
        ]);
        let got = parse_entries(reply).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].field("order_id"), Some(&b"5"[..]));
        assert_eq!(
            (got[1].id.as_str(), got[1].field("x")),
            ("3-0", Some(&b"y"[..]))
        );
        assert!(parse_entries(Value::Nil).unwrap().is_empty());
        assert!(parse_entries(Value::Int(3)).is_err());
    }

    #[test]
    fn autoclaim_reply_reports_cursor_entries_and_deleted_ids() {
        let reply = Value::Array(vec![
            bulk("7-0"),
            Value::Array(vec![entry("5-0", &["f", "v"]), Value::Nil]),
            Value::Array(vec![bulk("6-0")]),
        ]);
        let page = parse_autoclaim(reply).unwrap();
        assert_eq!(page.next.as_deref(), Some("7-0"));
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.deleted, vec!["6-0".to_string()]);
        let end = parse_autoclaim(Value::Array(vec![bulk("0-0"), Value::Array(vec![])])).unwrap();
        assert_eq!(end.next, None);
    }

    #[test]
    fn stream_ids_compare_numerically() {
        assert!(id_less("9-0", "10-0"));
        assert!(id_less("10-9", "10-10"));
        assert!(!id_less("10-10", "10-10"));
        assert!(id_less("0-0", "1-0"));
    }

    #[test]
    fn odd_field_lists_are_corrupt_not_panics() {
        let bad = Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("lonely")])]);
        assert!(parse_entry(bad).is_err());
        assert!(parse_entry(Value::Array(vec![bulk("1-0")])).is_err());
    }
}

//! How values cross the Data API: named parameters in ([`param`]), the fields of a
//! record out ([`field`]), the TIMESTAMP text form both ways, and the binary `user_id`
//! column read back as text ([`USER_ID_TEXT`]).
//!
//! Invariant kept here: every value is bound as a named parameter, never spliced into
//! SQL; instants travel in UTC.

use aws_sdk_rdsdata::types::{Field, SqlParameter, TypeHint};
use time::PrimitiveDateTime;
use time::macros::format_description;

use crate::domain::UnixMillis;

/// `orders.user_id` as text in a select list. The column is binary (compared byte for
/// byte, as Redis does: migrations/0003_user_id_binary.sql), and the Data API returns a
/// binary column as a blob; converted, it comes back as the string it was written from.
pub const USER_ID_TEXT: &str = "CONVERT(user_id USING utf8mb4)";

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
            .value(Field::StringValue(format_datetime(ms)))
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
            Field::StringValue(s) => parse_datetime(s),
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
}

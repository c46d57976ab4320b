//! Conversions between Data API values and MySQL values.
//!
//! - Parameters: a `Field` (plus an optional `typeHint`) becomes a `mysql_async::Value`
//!   bound to a prepared statement. Type hints validate the string's format the way
//!   Aurora does (a bad one is a `BadRequestException`, not a silent NULL or zero date).
//! - Results: each value is mapped by the column's server-side metadata (type, flags,
//!   character set), mirroring what Aurora MySQL returns: integers as `longValue`,
//!   DECIMAL as `stringValue`, temporal types as strings, binary strings as `blobValue`.
//!   Both the binary protocol (typed values) and the text protocol (all bytes) are
//!   understood, since statements that cannot be prepared run as plain queries.

use std::collections::{HashMap, HashSet};

use mysql_async::consts::{ColumnFlags, ColumnType};
use mysql_async::{Column, Value};
use serde::Deserialize;
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;

use crate::error::ApiError;
use crate::wire::{
    DecimalReturnType, Field, LongReturnType, ResultSetOptions, SqlParameter, TypeHint,
};

/// The character set number MySQL uses for binary strings (BLOB, VARBINARY, ...).
const BINARY_CHARSET: u16 = 63;

/// Every text column comes back in the connection's character set, utf8mb4, whose
/// `column_length` counts 4 bytes a character.
const UTF8MB4_MAX_BYTES: u32 = 4;

/// The values for the `?` placeholders of a statement, in order.
///
/// `names` are the placeholders found in the SQL (repeats allowed). Like Aurora, a
/// parameter that the SQL does not use is an error, and so is a placeholder without a
/// parameter: binding NULL for it would hide the mistake.
pub fn bind(names: &[String], params: &[SqlParameter]) -> Result<Vec<Value>, ApiError> {
    let mut by_name: HashMap<&str, Value> = HashMap::with_capacity(params.len());
    for param in params {
        let name = param
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::bad_request("Parameter name is required"))?;
        let value = parameter_value(name, param)?;
        if by_name.insert(name, value).is_some() {
            return Err(ApiError::bad_request(format!(
                "Parameter '{name}' is specified more than once"
            )));
        }
    }
    // A set, not a scan of `names` per parameter: a multi-row INSERT has thousands of
    // placeholders, and the scan made binding quadratic.
    let used: HashSet<&str> = names.iter().map(String::as_str).collect();
    if let Some(unused) = params
        .iter()
        .filter_map(|p| p.name.as_deref())
        .find(|n| !used.contains(n))
    {
        return Err(ApiError::bad_request(format!(
            "Cannot find parameter: {unused}"
        )));
    }
    names
        .iter()
        .map(|name| {
            by_name.get(name.as_str()).cloned().ok_or_else(|| {
                ApiError::bad_request(format!("No value specified for parameter: {name}"))
            })
        })
        .collect()
}

/// One parameter's value, validated against its type hint.
fn parameter_value(name: &str, param: &SqlParameter) -> Result<Value, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("Parameter \"{name}\"{why}"));
    let raw = (param.value.as_ref())
        .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
        .ok_or_else(|| bad(" has value with no field set".into()))?;
    if raw.get("arrayValue").is_some() {
        return Err(bad(": array parameters are not supported".into()));
    }
    // From the borrowed value: a string parameter can be megabytes (a batch of rows).
    let field = Field::deserialize(raw).map_err(|e| bad(format!(": invalid value: {e}")))?;
    match (field, param.type_hint) {
        (Field::IsNull(true), _) => Ok(Value::NULL),
        (Field::IsNull(false), _) => Err(bad(": isNull must be true when given".into())),
        (Field::StringValue(s), Some(hint)) => {
            hinted_value(&s, hint).map_err(|why| bad(format!(" with typeHint {hint:?}: {why}")))
        }
        (_, Some(hint)) => Err(bad(format!(": typeHint {hint:?} requires a stringValue"))),
        (Field::BooleanValue(b), None) => Ok(Value::Int(i64::from(b))),
        (Field::LongValue(n), None) => Ok(Value::Int(n)),
        (Field::DoubleValue(f), None) => Ok(Value::Double(f)),
        (Field::StringValue(s), None) => Ok(Value::Bytes(s.into_bytes())),
        (Field::BlobValue(b), None) => Ok(Value::Bytes(b)),
    }
}

/// Validates a hinted string and binds it as MySQL will store it: temporal hints as
/// temporal values (so a TIMESTAMP lands in a DATETIME column exactly), the others as
/// strings MySQL converts itself.
pub fn hinted_value(s: &str, hint: TypeHint) -> Result<Value, String> {
    let text = || Value::Bytes(s.as_bytes().to_vec());
    // `[year]` would also read a sign, which MySQL dates never have.
    let unsigned = || match s.starts_with(['+', '-']) {
        true => Err("expected a year without a sign".to_string()),
        false => Ok(s),
    };
    match hint {
        TypeHint::Date => {
            let date = time::Date::parse(unsigned()?, DATE)
                .map_err(|e| format!("expected YYYY-MM-DD: {e}"))?;
            Ok(date_time(date, time::Time::MIDNIGHT))
        }
        TypeHint::Time => {
            let t =
                time::Time::parse(s, TIME).map_err(|e| format!("expected HH:MM:SS[.FFF]: {e}"))?;
            let (h, mi, sec, us) = t.as_hms_micro();
            Ok(Value::Time(false, 0, h, mi, sec, us))
        }
        TypeHint::Timestamp => {
            let t = time::PrimitiveDateTime::parse(unsigned()?, TIMESTAMP)
                .map_err(|e| format!("expected YYYY-MM-DD HH:MM:SS[.FFF]: {e}"))?;
            Ok(date_time(t.date(), t.time()))
        }
        // `[+-]digits[.digits][e[+-]digits]`: what f64 reads, less `inf` and `NaN`.
        TypeHint::Decimal
            if s.bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse::<f64>()
                .map(|_| text())
                .map_err(|_| "not a decimal number".into())
        }
        TypeHint::Decimal => Err("not a decimal number".into()),
        TypeHint::Json => serde_json::from_str::<serde_json::Value>(s)
            .map(|_| text())
            .map_err(|e| format!("not valid JSON: {e}")),
        // Only the canonical 8-4-4-4-12 form, as java.util.UUID reads it.
        TypeHint::Uuid if s.len() == 36 && uuid::Uuid::try_parse(s).is_ok() => Ok(text()),
        TypeHint::Uuid => Err("expected a UUID like 123e4567-e89b-12d3-a456-426614174000".into()),
    }
}

const DATE: &[BorrowedFormatItem<'_>] = format_description!("[year]-[month]-[day]");
/// 1 to 9 fraction digits, kept to microseconds (MySQL's precision).
const TIME: &[BorrowedFormatItem<'_>] =
    format_description!("[hour]:[minute]:[second][optional [.[subsecond]]]");
const TIMESTAMP: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second][optional [.[subsecond]]]");

/// A DATE or DATETIME value (the year has four digits, so it fits).
fn date_time(date: time::Date, t: time::Time) -> Value {
    let (h, mi, sec, us) = t.as_hms_micro();
    let year = u16::try_from(date.year()).unwrap_or_default();
    Value::Date(year, date.month().into(), date.day(), h, mi, sec, us)
}

/// What a column holds, as far as the Data API's value mapping cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Integer,
    Decimal,
    Float,
    DateTime,
    Date,
    Time,
    Bit,
    Text,
    Binary,
    Null,
}

/// A column's kind, SQL type name and JDBC type (`java.sql.Types`), as Aurora MySQL
/// reports them (through Connector/J).
fn describe(column: &Column) -> (Kind, &'static str, i32) {
    use ColumnType::*;
    use Kind::*;
    let binary = column.character_set() == BINARY_CHARSET;
    let string_kind = if binary { Binary } else { Text };
    let blob = matches!(
        column.column_type(),
        MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB | MYSQL_TYPE_BLOB
    );
    // TINY, plain, MEDIUM or LONG by the length (of a TEXT in characters).
    let size = match column.column_length() / if binary { 1 } else { UTF8MB4_MAX_BYTES } {
        0..=255 => 0,
        256..=65_535 => 1,
        65_536..=16_777_215 => 2,
        _ => 3,
    };
    let flags = column.flags();
    match column.column_type() {
        MYSQL_TYPE_TINY => (Integer, "TINYINT", -6),
        MYSQL_TYPE_SHORT => (Integer, "SMALLINT", 5),
        MYSQL_TYPE_INT24 => (Integer, "MEDIUMINT", 4),
        MYSQL_TYPE_LONG => (Integer, "INT", 4),
        MYSQL_TYPE_LONGLONG => (Integer, "BIGINT", -5),
        MYSQL_TYPE_YEAR => (Integer, "YEAR", 91),
        MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => (Decimal, "DECIMAL", 3),
        MYSQL_TYPE_FLOAT => (Float, "FLOAT", 7),
        MYSQL_TYPE_DOUBLE => (Float, "DOUBLE", 8),
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => (DateTime, "TIMESTAMP", 93),
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => (DateTime, "DATETIME", 93),
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => (Date, "DATE", 91),
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => (Time, "TIME", 92),
        MYSQL_TYPE_BIT => (Bit, "BIT", -7),
        MYSQL_TYPE_NULL => (Null, "NULL", 0),
        MYSQL_TYPE_JSON => (Text, "JSON", -1),
        // ENUM and SET columns arrive as strings with a flag.
        _ if flags.contains(ColumnFlags::ENUM_FLAG) => (string_kind, "ENUM", 1),
        _ if flags.contains(ColumnFlags::SET_FLAG) => (string_kind, "SET", 1),
        MYSQL_TYPE_ENUM => (Text, "ENUM", 1),
        MYSQL_TYPE_SET => (Text, "SET", 1),
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING if binary => (Binary, "VARBINARY", -3),
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => (Text, "VARCHAR", 12),
        MYSQL_TYPE_STRING if binary => (Binary, "BINARY", -2),
        MYSQL_TYPE_STRING => (Text, "CHAR", 1),
        _ if blob && binary => (
            Binary,
            ["TINYBLOB", "BLOB", "MEDIUMBLOB", "LONGBLOB"][size],
            -4,
        ),
        _ if blob => (
            Text,
            ["TINYTEXT", "TEXT", "MEDIUMTEXT", "LONGTEXT"][size],
            -1,
        ),
        MYSQL_TYPE_GEOMETRY => (Binary, "GEOMETRY", -2),
        _ => (Binary, "UNKNOWN", 1111),
    }
}

/// One result value as a `Field`.
pub fn to_field(
    value: Value,
    column: &Column,
    options: ResultSetOptions,
) -> Result<Field, ApiError> {
    if value == Value::NULL {
        return Ok(Field::IsNull(true));
    }
    let long_as_string = options.long_return_type == LongReturnType::String;
    Ok(match (describe(column).0, value) {
        (Kind::Integer, Value::Int(n)) if !long_as_string => Field::LongValue(n),
        (Kind::Integer, value) => {
            let text = lossy_text(value);
            match text.parse::<i64>() {
                _ if long_as_string => Field::StringValue(text),
                Ok(n) => Field::LongValue(n),
                Err(_) => {
                    return Err(ApiError::UnsupportedResult(format!(
                        "Column '{}' holds {text}, which does not fit a longValue; use longReturnType STRING",
                        column.name_str()
                    )));
                }
            }
        }
        (Kind::Decimal, value) if options.decimal_return_type == DecimalReturnType::String => {
            Field::StringValue(lossy_text(value))
        }
        (Kind::Float, Value::Double(f)) => Field::DoubleValue(f),
        // DOUBLE_OR_LONG: a scale-0 DECIMAL that fits i64 is a long, else a double. A FLOAT
        // through its shortest decimal form: 1.1, not 1.100000023841858.
        (kind @ (Kind::Decimal | Kind::Float), value) => {
            let text = lossy_text(value);
            match text.parse::<i64>() {
                Ok(n) if kind == Kind::Decimal && column.decimals() == 0 => Field::LongValue(n),
                _ => Field::DoubleValue(text.parse().map_err(|_| {
                    ApiError::Internal(format!("unreadable number from MariaDB: {text}"))
                })?),
            }
        }
        (Kind::DateTime, Value::Date(y, mo, d, h, mi, s, us)) => Field::StringValue(format!(
            "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}{}",
            fraction(us, column.decimals())
        )),
        (Kind::Date, Value::Date(y, mo, d, ..)) => {
            Field::StringValue(format!("{y:04}-{mo:02}-{d:02}"))
        }
        (Kind::Time, Value::Time(negative, days, h, mi, s, us)) => {
            let hours = days * 24 + u32::from(h);
            let sign = if negative { "-" } else { "" };
            Field::StringValue(format!(
                "{sign}{hours:02}:{mi:02}:{s:02}{}",
                fraction(us, column.decimals())
            ))
        }
        (Kind::Bit, Value::Bytes(bytes)) => {
            let n = bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
            if column.column_length() == 1 {
                Field::BooleanValue(n != 0)
            } else {
                Field::LongValue(i64::try_from(n).map_err(|_| {
                    ApiError::UnsupportedResult(format!(
                        "BIT value of column '{}' does not fit a longValue",
                        column.name_str()
                    ))
                })?)
            }
        }
        (Kind::Binary, Value::Bytes(bytes)) => Field::BlobValue(bytes),
        (Kind::Null, _) => Field::IsNull(true),
        // Text columns, and temporal values that arrived as text (text protocol).
        (_, other) => Field::StringValue(lossy_text(other)),
    })
}

/// `.fff` with as many digits as the column declares (DATETIME(3) → 3).
fn fraction(micros: u32, decimals: u8) -> String {
    let six = format!("{micros:06}");
    match decimals {
        0 => String::new(),
        1..=6 => format!(".{}", &six[..usize::from(decimals)]),
        // An expression without a fixed scale: show what is there.
        _ if micros == 0 => String::new(),
        _ => format!(".{six}"),
    }
}

/// The text form of a non-NULL value (MariaDB sends text in utf8mb4).
fn lossy_text(value: Value) -> String {
    match value {
        Value::Bytes(bytes) => String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        Value::Int(n) => n.to_string(),
        Value::UInt(n) => n.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Double(f) => f.to_string(),
        // Date/Time outside their usual columns: MySQL's own literal without quotes.
        other => other.as_sql(true).trim_matches('\'').to_string(),
    }
}

/// `columnMetadata` entry (the SDK's `ColumnMetadata`) for a result column, JDBC-style
/// as Aurora reports it.
pub fn column_metadata(column: &Column) -> serde_json::Value {
    let (kind, name, jdbc_type) = describe(column);
    let flags = column.flags();
    let unsigned = flags.contains(ColumnFlags::UNSIGNED_FLAG);
    let length = column.column_length();
    let numeric = matches!(kind, Kind::Integer | Kind::Decimal | Kind::Float);
    let decimals = i32::from(column.decimals());
    // 31 (NOT_FIXED_DEC) and above mean "no fixed scale".
    let scale = match kind {
        Kind::Decimal | Kind::DateTime | Kind::Time => decimals,
        Kind::Float if decimals < 31 => decimals,
        _ => 0,
    };
    let precision = match kind {
        Kind::Text => length / UTF8MB4_MAX_BYTES,
        // DECIMAL(10,2) has length 12: ten digits, the point and the sign.
        Kind::Decimal => length
            .saturating_sub(u32::from(scale > 0))
            .saturating_sub(u32::from(!unsigned)),
        _ => length,
    };
    let org_name = column.org_name_str();
    serde_json::json!({
        "name": if org_name.is_empty() { column.name_str() } else { org_name },
        "label": column.name_str(),
        // YEAR is unsigned without saying so.
        "typeName": match numeric && unsigned && name != "YEAR" {
            true => format!("{name} UNSIGNED"),
            false => name.to_string(),
        },
        // Connector/J widens INT UNSIGNED to BIGINT.
        "type": if name == "INT" && unsigned { -5 } else { jdbc_type },
        // java.sql.ResultSetMetaData: 0 = columnNoNulls, 1 = columnNullable.
        "nullable": i32::from(!flags.contains(ColumnFlags::NOT_NULL_FLAG)),
        "precision": i32::try_from(precision).unwrap_or(i32::MAX),
        "scale": scale,
        "isSigned": numeric && !unsigned,
        "isAutoIncrement": flags.contains(ColumnFlags::AUTO_INCREMENT_FLAG),
        "isCaseSensitive": match kind {
            Kind::Binary => true,
            Kind::Text => flags.contains(ColumnFlags::BINARY_FLAG),
            _ => false,
        },
        "isCurrency": false,
        "arrayBaseColumnType": 0,
        // MySQL has catalogs (databases), not schemas: Connector/J reports "".
        "schemaName": "",
        "tableName": column.org_table_str(),
    })
}

#[cfg(test)]
mod tests;

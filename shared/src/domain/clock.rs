//! Time as the domain holds it: Unix milliseconds, the one clock unit shared by Redis,
//! Lua and the handlers, and its RFC 3339 text form at the API.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::ids::{ValidationError, invalid};

/// Unix time in milliseconds: the one clock unit shared by Redis, Lua and the handlers.
pub type UnixMillis = i64;

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> UnixMillis {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Parses an RFC 3339 timestamp into Unix milliseconds.
pub fn parse_rfc3339_millis(s: &str, what: &str) -> Result<UnixMillis, ValidationError> {
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|_| invalid(format!("{what} must be an RFC 3339 timestamp")))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Formats Unix milliseconds as RFC 3339 in UTC: `2026-11-22T10:00:00.123Z`, with the
/// fraction's trailing zeros dropped (`…:00.5Z`, and `…:00Z` on a whole second), as the
/// `time` crate writes it; `docs/openapi.yaml`'s `Timestamp` describes the same form.
pub fn format_rfc3339_millis(ms: UnixMillis) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let t = t
        .replace_nanosecond((ms.rem_euclid(1000) as u32) * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_with_milliseconds() {
        let ms = parse_rfc3339_millis("2026-11-22T10:00:00.123Z", "t").unwrap();
        assert_eq!(format_rfc3339_millis(ms), "2026-11-22T10:00:00.123Z");
        // Trailing zeros of the fraction are dropped (the contract's Timestamp form).
        assert_eq!(format_rfc3339_millis(ms - 123), "2026-11-22T10:00:00Z");
        assert_eq!(format_rfc3339_millis(ms + 377), "2026-11-22T10:00:00.5Z");
    }
}

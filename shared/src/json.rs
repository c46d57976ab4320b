//! How request bodies read JSON: the few places where serde's defaults and the
//! contract's JSON Schema (docs/openapi.yaml) disagree, settled on the schema's side.
//!
//! - An integer is a number without a fraction, `5` or `5.0` alike (JSON Schema's
//!   `integer`); `5.5`, `"5"` and numbers outside `i64` are refused.
//! - An optional field that is present holds a value of its type: `null` is refused,
//!   never read as "absent".

use serde::{Deserialize, Deserializer};

/// 2^63 as an `f64`, exactly.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// A JSON number without a fractional part that fits `i64`.
pub fn integral<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    match serde_json::Number::deserialize(d)? {
        n if n.is_i64() => Ok(n.as_i64().expect("checked")),
        n => match n.as_f64() {
            // 2^63 is the first f64 past i64::MAX; -2^63 is i64::MIN exactly.
            Some(f) if f.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&f) => Ok(f as i64),
            _ => Err(D::Error::custom(format!(
                "invalid number {n}: expected an integer that fits 64 bits"
            ))),
        },
    }
}

/// [`integral`] for an optional field: absent is `None`, `null` is refused.
pub fn optional_integral<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    integral(d).map(Some)
}

/// An optional field that, present, must hold a `T` (`null` is refused). Use with
/// `#[serde(default)]` so that absent is `None`.
pub fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "integral")]
        n: i64,
        #[serde(default, deserialize_with = "optional_integral")]
        m: Option<i64>,
        #[serde(default, deserialize_with = "not_null")]
        b: Option<bool>,
    }

    fn parse(s: &str) -> Result<Body, serde_json::Error> {
        serde_json::from_str(s)
    }

    #[test]
    fn integers_with_or_without_a_zero_fraction() {
        assert_eq!(parse(r#"{"n": 5}"#).unwrap().n, 5);
        assert_eq!(parse(r#"{"n": 5.0}"#).unwrap().n, 5);
        assert_eq!(parse(r#"{"n": -7e2}"#).unwrap().n, -700);
        assert_eq!(parse(r#"{"n": 9223372036854775807}"#).unwrap().n, i64::MAX);
        assert_eq!(parse(r#"{"n": -9223372036854775808}"#).unwrap().n, i64::MIN);
        assert_eq!(
            parse(r#"{"n": -9.223372036854775808e18}"#).unwrap().n,
            i64::MIN
        );
        for bad in [
            "5.5",
            "\"5\"",
            "9223372036854775808",
            "9.3e18",
            "1e300",
            "null",
            "true",
        ] {
            assert!(parse(&format!(r#"{{"n": {bad}}}"#)).is_err(), "{bad}");
        }
    }

    #[test]
    fn absent_is_none_and_null_is_refused() {
        let b = parse(r#"{"n": 1}"#).unwrap();
        assert_eq!((b.m, b.b), (None, None));
        let b = parse(r#"{"n": 1, "m": 2.0, "b": false}"#).unwrap();
        assert_eq!((b.m, b.b), (Some(2), Some(false)));
        assert!(parse(r#"{"n": 1, "m": null}"#).is_err());
        assert!(parse(r#"{"n": 1, "b": null}"#).is_err());
    }
}

//! The identifiers: of a voucher, an order, a buyer and a payment, and the
//! [`ValidationError`] every parser of this module tree refuses an input with.
//!
//! Each is valid by construction: a [`VoucherId`] or an [`OrderId`] is a positive 63-bit
//! integer (ids travel as decimal strings and must fit the Data API's signed
//! `longValue`), a [`UserId`] is 1 to 64 bytes without control characters, a
//! [`PaymentRef`] 1 to 128 characters of a fixed alphabet.

use std::fmt;
use std::str::FromStr;

/// Why an input was refused. The message is safe to show to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

pub(super) fn invalid(msg: impl Into<String>) -> ValidationError {
    ValidationError(msg.into())
}

/// Parses a positive 63-bit decimal id: ids travel as decimal strings (JSON numbers lose
/// precision past 2^53) and must fit the Data API's signed `longValue`.
fn parse_positive_id(s: &str, what: &str) -> Result<i64, ValidationError> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!(
            "{what} must be a positive decimal integer"
        )));
    }
    match s.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid(format!(
            "{what} must be a positive decimal integer"
        ))),
    }
}

/// The id of a voucher (a sale), assigned by the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VoucherId(i64);

impl VoucherId {
    /// Wraps an id that came from the database; `None` unless positive.
    pub fn new(n: i64) -> Option<VoucherId> {
        (n > 0).then_some(VoucherId(n))
    }
    pub fn get(self) -> i64 {
        self.0
    }
}

impl FromStr for VoucherId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_positive_id(s, "voucher id").map(VoucherId)
    }
}

impl fmt::Display for VoucherId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of an order: time-prefixed, see [`crate::order_id`] for the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderId(i64);

impl OrderId {
    pub fn new(n: i64) -> Option<OrderId> {
        (n > 0).then_some(OrderId(n))
    }
    pub fn get(self) -> i64 {
        self.0
    }
}

impl FromStr for OrderId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_positive_id(s, "order id").map(OrderId)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A buyer, as named by the `sub` claim of a verified token (never by a request body).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(String);

/// The longest `sub` the contract accepts, in bytes (it is a `VARCHAR(64)` column).
pub const MAX_USER_ID_BYTES: usize = 64;

impl UserId {
    pub fn parse(s: &str) -> Result<UserId, ValidationError> {
        if s.is_empty() {
            return Err(invalid("user id is empty"));
        }
        if s.len() > MAX_USER_ID_BYTES {
            return Err(invalid("user id is longer than 64 bytes"));
        }
        if s.chars().any(char::is_control) {
            return Err(invalid("user id contains control characters"));
        }
        Ok(UserId(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A payment reference (the payment provider's id, used as the idempotency key of
/// `POST /orders/{id}/pay`): 1 to 128 characters of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRef(String);

impl PaymentRef {
    pub fn parse(s: &str) -> Result<PaymentRef, ValidationError> {
        let ok = (1..=128).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
        if !ok {
            return Err(invalid(
                "the payment reference must be 1 to 128 characters of A-Z a-z 0-9 . _ : -",
            ));
        }
        Ok(PaymentRef(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_only_positive_decimals_that_fit_i64() {
        assert_eq!("42".parse::<VoucherId>().unwrap().get(), 42);
        assert_eq!(
            "9223372036854775807".parse::<OrderId>().unwrap().get(),
            i64::MAX
        );
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1e3",
            " 1",
            "9223372036854775808",
            "12345678901234567890",
            "abc",
            "1.0",
        ] {
            assert!(bad.parse::<VoucherId>().is_err(), "{bad:?} parsed");
        }
    }

    proptest::proptest! {
        // Any path segment a caller can send: parsing never panics, and what parses is
        // exactly the positive i64 it spells.
        #[test]
        fn any_string_parses_to_a_positive_id_or_an_error(s in "\\PC{0,24}|[0-9+-]{0,21}") {
            match s.parse::<OrderId>() {
                Ok(id) => {
                    proptest::prop_assert!(id.get() > 0);
                    proptest::prop_assert_eq!(id.get().to_string(), s.trim_start_matches('0'));
                }
                Err(e) => proptest::prop_assert!(!e.0.is_empty()),
            }
            proptest::prop_assert_eq!(s.parse::<VoucherId>().is_ok(), s.parse::<OrderId>().is_ok());
        }

        #[test]
        fn every_i64_spelled_in_decimal_parses_iff_positive(n in proptest::num::i64::ANY) {
            proptest::prop_assert_eq!(n.to_string().parse::<OrderId>().ok().map(OrderId::get), (n > 0).then_some(n));
            let wider = i128::from(n) + i128::from(u64::MAX);
            proptest::prop_assert!(wider.to_string().parse::<OrderId>().is_err() || wider <= i128::from(i64::MAX));
        }
    }

    #[test]
    fn user_ids_are_bounded_and_printable() {
        assert!(UserId::parse("alice").is_ok());
        assert!(UserId::parse(&"x".repeat(64)).is_ok());
        assert!(UserId::parse(&"x".repeat(65)).is_err());
        assert!(UserId::parse("").is_err());
        assert!(UserId::parse("a\nb").is_err());
        // 64 bytes, not 64 characters: 22 three-byte characters are 66 bytes.
        assert!(UserId::parse(&"€".repeat(22)).is_err());
    }
}

//! JSON shapes of the RDS Data API (rest-json 1.1), as `aws-sdk-rdsdata` serialises and
//! parses them (`src/protocol_serde/` of that crate is the reference for every field
//! name here).
//!
//! Every request member is optional, so the server can answer a missing one with its own
//! `BadRequestException` instead of a bare serde error; unknown members are ignored, as
//! AWS does.

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The body of every Data API operation; each one reads the members it takes.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Request {
    pub resource_arn: Option<String>,
    pub secret_arn: Option<String>,
    pub sql: Option<String>,
    pub database: Option<String>,
    pub transaction_id: Option<String>,
    /// ExecuteStatement's parameters.
    pub parameters: Vec<SqlParameter>,
    /// BatchExecuteStatement's parameters, one set per run of the statement.
    pub parameter_sets: Vec<Vec<SqlParameter>>,
    pub include_result_metadata: bool,
    pub continue_after_timeout: bool,
    pub result_set_options: ResultSetOptions,
    pub format_records_as: RecordsFormat,
}

/// One named parameter. `value` stays raw JSON so that a value of an unknown shape (or
/// an `arrayValue`) is reported with the parameter's name.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SqlParameter {
    pub name: Option<String>,
    pub value: Option<serde_json::Value>,
    pub type_hint: Option<TypeHint>,
}

/// The `typeHint` values of `SqlParameter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TypeHint {
    Date,
    Time,
    Timestamp,
    Decimal,
    Json,
    Uuid,
}

/// How the caller asked for numbers (`resultSetOptions`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResultSetOptions {
    pub decimal_return_type: DecimalReturnType,
    pub long_return_type: LongReturnType,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DecimalReturnType {
    #[default]
    String,
    DoubleOrLong,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LongReturnType {
    #[default]
    Long,
    String,
}

/// `formatRecordsAs`: `records` (NONE) or `formattedRecords` (JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RecordsFormat {
    #[default]
    None,
    Json,
}

/// The `Field` union. Serialised externally tagged, which is exactly the wire form:
/// `{"longValue": 1}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Field {
    IsNull(bool),
    BooleanValue(bool),
    LongValue(i64),
    DoubleValue(f64),
    StringValue(String),
    BlobValue(#[serde(with = "base64_bytes")] Vec<u8>),
}

impl Field {
    /// The value in a `formattedRecords` JSON document.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Field::IsNull(_) => J::Null,
            Field::BooleanValue(b) => J::Bool(*b),
            Field::LongValue(n) => J::from(*n),
            // A non-finite double cannot come out of MySQL; `from_f64` would give None.
            Field::DoubleValue(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Field::StringValue(s) => J::String(s.clone()),
            Field::BlobValue(b) => J::String(base64::engine::general_purpose::STANDARD.encode(b)),
        }
    }

    /// Bytes this field adds to a response, close enough to bound memory while rows
    /// stream in (the exact limit is checked on the serialised body).
    pub fn approximate_size(&self) -> usize {
        match self {
            Field::StringValue(s) => s.len() + 18,
            Field::BlobValue(b) => b.len() * 4 / 3 + 18,
            _ => 24,
        }
    }
}

mod base64_bytes {
    use super::*;

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteStatementResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<Vec<Field>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// `ColumnMetadata` entries, built by `values::column_metadata`.
    pub column_metadata: Option<Vec<serde_json::Value>>,
    pub number_of_records_updated: u64,
    pub generated_fields: Vec<Field>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub formatted_records: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_use_the_wire_union_form() {
        let json = serde_json::to_string(&vec![
            Field::IsNull(true),
            Field::LongValue(-5),
            Field::StringValue("x".into()),
            Field::BlobValue(vec![0, 255]),
        ])
        .unwrap();
        assert_eq!(
            json,
            r#"[{"isNull":true},{"longValue":-5},{"stringValue":"x"},{"blobValue":"AP8="}]"#
        );
        let back: Field = serde_json::from_str(r#"{"blobValue":"AP8="}"#).unwrap();
        assert_eq!(back, Field::BlobValue(vec![0, 255]));
        assert!(serde_json::from_str::<Field>(r#"{"longValue":1,"isNull":true}"#).is_err());
    }

    #[test]
    fn requests_read_the_sdk_enumerations() {
        let req: Request = serde_json::from_str(
            r#"{"sql":"SELECT 1","formatRecordsAs":"JSON","parameters":[{"name":"a","typeHint":"UUID"}],
                "resultSetOptions":{"decimalReturnType":"DOUBLE_OR_LONG","longReturnType":"STRING"}}"#,
        )
        .unwrap();
        assert_eq!(req.format_records_as, RecordsFormat::Json);
        assert_eq!(req.parameters[0].type_hint, Some(TypeHint::Uuid));
        let options = req.result_set_options;
        assert_eq!(options.decimal_return_type, DecimalReturnType::DoubleOrLong);
        assert_eq!(options.long_return_type, LongReturnType::String);
        assert!(serde_json::from_str::<TypeHint>(r#""BLOB""#).is_err());
        assert!(serde_json::from_str::<RecordsFormat>(r#""CSV""#).is_err());
    }

    #[test]
    fn execute_response_omits_absent_members() {
        let resp = ExecuteStatementResponse {
            records: None,
            column_metadata: None,
            number_of_records_updated: 2,
            generated_fields: vec![Field::LongValue(7)],
            formatted_records: None,
        };
        assert_eq!(
            serde_json::to_string(&resp).unwrap(),
            r#"{"numberOfRecordsUpdated":2,"generatedFields":[{"longValue":7}]}"#
        );
    }
}

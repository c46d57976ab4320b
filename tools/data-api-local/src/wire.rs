//! JSON shapes of the RDS Data API (rest-json 1.1), as `aws-sdk-rdsdata` serialises and
//! parses them (`src/protocol_serde/` of that crate is the reference for every field
//! name here).
//!
//! Requests are deserialised leniently where the SDK may omit a member (`Option`), so the
//! server can answer a missing member with its own `BadRequestException` instead of a
//! bare serde error; unknown members are ignored, as AWS does.

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `POST /Execute` (ExecuteStatement).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteStatementRequest {
    pub resource_arn: Option<String>,
    pub secret_arn: Option<String>,
    pub sql: Option<String>,
    pub database: Option<String>,
    #[serde(default)]
    pub parameters: Vec<SqlParameter>,
    pub transaction_id: Option<String>,
    #[serde(default)]
    pub include_result_metadata: bool,
    #[serde(default)]
    pub continue_after_timeout: bool,
    pub result_set_options: Option<ResultSetOptions>,
    pub format_records_as: Option<String>,
}

/// `POST /BatchExecute` (BatchExecuteStatement).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchExecuteStatementRequest {
    pub resource_arn: Option<String>,
    pub secret_arn: Option<String>,
    pub sql: Option<String>,
    pub database: Option<String>,
    #[serde(default)]
    pub parameter_sets: Vec<Vec<SqlParameter>>,
    pub transaction_id: Option<String>,
}

/// `POST /BeginTransaction`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BeginTransactionRequest {
    pub resource_arn: Option<String>,
    pub secret_arn: Option<String>,
    pub database: Option<String>,
}

/// `POST /CommitTransaction` and `POST /RollbackTransaction`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndTransactionRequest {
    pub resource_arn: Option<String>,
    pub secret_arn: Option<String>,
    pub transaction_id: Option<String>,
}

/// One named parameter. `value` stays raw JSON so that a value of an unknown shape (or
/// an `arrayValue`) is reported with the parameter's name.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SqlParameter {
    pub name: Option<String>,
    pub value: Option<serde_json::Value>,
    pub type_hint: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultSetOptions {
    pub decimal_return_type: Option<String>,
    pub long_return_type: Option<String>,
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

/// `ColumnMetadata` (JDBC-flavoured, as Aurora MySQL reports it).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColumnMetadata {
    pub name: String,
    pub label: String,
    pub type_name: String,
    #[serde(rename = "type")]
    pub jdbc_type: i32,
    pub nullable: i32,
    pub precision: i32,
    pub scale: i32,
    pub is_signed: bool,
    pub is_auto_increment: bool,
    pub is_case_sensitive: bool,
    pub is_currency: bool,
    pub array_base_column_type: i32,
    pub schema_name: String,
    pub table_name: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteStatementResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<Vec<Field>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column_metadata: Option<Vec<ColumnMetadata>>,
    pub number_of_records_updated: u64,
    pub generated_fields: Vec<Field>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub formatted_records: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateResult {
    pub generated_fields: Vec<Field>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchExecuteStatementResponse {
    pub update_results: Vec<UpdateResult>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BeginTransactionResponse {
    pub transaction_id: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndTransactionResponse {
    pub transaction_status: String,
}

/// Error body: the SDK reads `code` (after the `X-Amzn-Errortype` header) and `message`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub message: &'a str,
    pub code: &'a str,
    /// Only for `StatementTimeoutException`, which models it.
    #[serde(rename = "dbConnectionId", skip_serializing_if = "Option::is_none")]
    pub db_connection_id: Option<i64>,
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

//! Unit tests of the parameter binding and the result conversion of `values`.

use super::*;

fn param(name: &str, value: serde_json::Value, hint: Option<TypeHint>) -> SqlParameter {
    SqlParameter {
        name: Some(name.to_string()),
        value: Some(value),
        type_hint: hint,
    }
}

fn col(ty: ColumnType) -> Column {
    Column::new(ty).with_character_set(BINARY_CHARSET)
}

fn text_col(ty: ColumnType) -> Column {
    Column::new(ty).with_character_set(45)
}

#[test]
fn binds_in_placeholder_order_with_repeats() {
    let names = vec!["a".to_string(), "b".to_string(), "a".to_string()];
    let params = vec![
        param("b", serde_json::json!({"stringValue": "x"}), None),
        param("a", serde_json::json!({"longValue": 7}), None),
    ];
    assert_eq!(
        bind(&names, &params).unwrap(),
        vec![Value::Int(7), Value::Bytes(b"x".to_vec()), Value::Int(7)]
    );
}

#[test]
fn missing_unused_and_duplicate_parameters_are_errors() {
    let used = vec!["a".to_string()];
    let err = bind(&used, &[]).unwrap_err();
    assert_eq!(err.to_string(), "No value specified for parameter: a");
    let extra = vec![
        param("a", serde_json::json!({"isNull": true}), None),
        param("zz", serde_json::json!({"isNull": true}), None),
    ];
    assert_eq!(
        bind(&used, &extra).unwrap_err().to_string(),
        "Cannot find parameter: zz"
    );
    let dup = vec![
        param("a", serde_json::json!({"longValue": 1}), None),
        param("a", serde_json::json!({"longValue": 2}), None),
    ];
    assert!(matches!(bind(&used, &dup), Err(ApiError::BadRequest(_))));
}

#[test]
fn parameter_value_shapes() {
    let ok = |v: serde_json::Value| parameter_value("p", &param("p", v, None));
    assert_eq!(
        ok(serde_json::json!({"isNull": true})).unwrap(),
        Value::NULL
    );
    assert_eq!(
        ok(serde_json::json!({"booleanValue": true})).unwrap(),
        Value::Int(1)
    );
    assert_eq!(
        ok(serde_json::json!({"doubleValue": 1.5})).unwrap(),
        Value::Double(1.5)
    );
    assert_eq!(
        ok(serde_json::json!({"blobValue": "AP8="})).unwrap(),
        Value::Bytes(vec![0, 255])
    );
    for bad in [
        serde_json::json!({}),
        serde_json::json!({"arrayValue": {"longValues": [1]}}),
        serde_json::json!({"isNull": false}),
        serde_json::json!({"fooValue": 1}),
        serde_json::json!({"blobValue": "not base64!"}),
    ] {
        assert!(matches!(ok(bad), Err(ApiError::BadRequest(_))));
    }
    let missing = SqlParameter {
        name: Some("p".into()),
        value: None,
        type_hint: None,
    };
    assert_eq!(
        parameter_value("p", &missing).unwrap_err().to_string(),
        "Parameter \"p\" has value with no field set"
    );
}

#[test]
fn type_hints_validate_and_bind() {
    assert_eq!(
        hinted_value("2026-02-28 23:59:58.5", TypeHint::Timestamp),
        Ok(Value::Date(2026, 2, 28, 23, 59, 58, 500_000))
    );
    assert_eq!(
        hinted_value("2026-02-28 01:02:03.123456789", TypeHint::Timestamp),
        Ok(Value::Date(2026, 2, 28, 1, 2, 3, 123_456))
    );
    assert_eq!(
        hinted_value("2024-02-29", TypeHint::Date),
        Ok(Value::Date(2024, 2, 29, 0, 0, 0, 0))
    );
    assert_eq!(
        hinted_value("13:14:15", TypeHint::Time),
        Ok(Value::Time(false, 0, 13, 14, 15, 0))
    );
    assert_eq!(
        hinted_value("-12.50e3", TypeHint::Decimal),
        Ok(Value::Bytes(b"-12.50e3".to_vec()))
    );
    assert_eq!(
        hinted_value("{\"a\":[1]}", TypeHint::Json),
        Ok(Value::Bytes(b"{\"a\":[1]}".to_vec()))
    );
    assert!(hinted_value("123e4567-e89b-12d3-a456-426614174000", TypeHint::Uuid).is_ok());

    for (bad, hint) in [
        ("2026-01-01T00:00:00Z", TypeHint::Timestamp),
        ("2026-01-01", TypeHint::Timestamp),
        ("2026-13-01 00:00:00", TypeHint::Timestamp),
        ("2026-01-01 24:00:00", TypeHint::Timestamp),
        ("2026-01-01 00:00:00.", TypeHint::Timestamp),
        ("2025-02-29", TypeHint::Date),
        ("26-01-01", TypeHint::Date),
        ("+2026-01-01", TypeHint::Date),
        ("1:02:03", TypeHint::Time),
        ("12:60:00", TypeHint::Time),
        ("1.2.3", TypeHint::Decimal),
        ("", TypeHint::Decimal),
        (".", TypeHint::Decimal),
        ("1e", TypeHint::Decimal),
        ("NaN", TypeHint::Decimal),
        ("{", TypeHint::Json),
        ("123e4567e89b12d3a456426614174000", TypeHint::Uuid),
        ("not-a-uuid", TypeHint::Uuid),
    ] {
        assert!(
            hinted_value(bad, hint).is_err(),
            "{bad} should fail as {hint:?}"
        );
    }
    let hinted_long = param(
        "p",
        serde_json::json!({"longValue": 1}),
        Some(TypeHint::Decimal),
    );
    assert!(parameter_value("p", &hinted_long).is_err());
}

#[test]
fn integers_and_decimals() {
    let options = ResultSetOptions::default();
    let bigint = col(ColumnType::MYSQL_TYPE_LONGLONG);
    assert_eq!(
        to_field(Value::Int(-3), &bigint, options).unwrap(),
        Field::LongValue(-3)
    );
    let unsigned = col(ColumnType::MYSQL_TYPE_LONGLONG).with_flags(ColumnFlags::UNSIGNED_FLAG);
    assert_eq!(
        to_field(Value::UInt(u64::MAX >> 1), &unsigned, options).unwrap(),
        Field::LongValue(i64::MAX)
    );
    assert!(matches!(
        to_field(Value::UInt(u64::MAX), &unsigned, options),
        Err(ApiError::UnsupportedResult(_))
    ));
    let as_string = ResultSetOptions {
        long_return_type: LongReturnType::String,
        ..options
    };
    assert_eq!(
        to_field(Value::UInt(u64::MAX), &unsigned, as_string).unwrap(),
        Field::StringValue("18446744073709551615".into())
    );
    // Text protocol: digits as bytes.
    assert_eq!(
        to_field(Value::Bytes(b"42".to_vec()), &bigint, options).unwrap(),
        Field::LongValue(42)
    );

    let decimal = col(ColumnType::MYSQL_TYPE_NEWDECIMAL).with_decimals(2);
    let dec = Value::Bytes(b"12.30".to_vec());
    assert_eq!(
        to_field(dec.clone(), &decimal, options).unwrap(),
        Field::StringValue("12.30".into())
    );
    let numbers = ResultSetOptions {
        decimal_return_type: DecimalReturnType::DoubleOrLong,
        ..options
    };
    assert_eq!(
        to_field(dec, &decimal, numbers).unwrap(),
        Field::DoubleValue(12.3)
    );
    let whole = col(ColumnType::MYSQL_TYPE_NEWDECIMAL);
    assert_eq!(
        to_field(Value::Bytes(b"17".to_vec()), &whole, numbers).unwrap(),
        Field::LongValue(17)
    );
}

#[test]
fn floats_temporals_bits_and_strings() {
    let options = ResultSetOptions::default();
    let float = col(ColumnType::MYSQL_TYPE_FLOAT);
    assert_eq!(
        to_field(Value::Float(1.1), &float, options).unwrap(),
        Field::DoubleValue(1.1)
    );

    let dt3 = col(ColumnType::MYSQL_TYPE_DATETIME).with_decimals(3);
    assert_eq!(
        to_field(Value::Date(2026, 1, 2, 3, 4, 5, 67_000), &dt3, options).unwrap(),
        Field::StringValue("2026-01-02 03:04:05.067".into())
    );
    let dt0 = col(ColumnType::MYSQL_TYPE_DATETIME);
    assert_eq!(
        to_field(Value::Date(2026, 1, 2, 0, 0, 0, 0), &dt0, options).unwrap(),
        Field::StringValue("2026-01-02 00:00:00".into())
    );
    let date = col(ColumnType::MYSQL_TYPE_DATE);
    assert_eq!(
        to_field(Value::Date(2026, 1, 2, 0, 0, 0, 0), &date, options).unwrap(),
        Field::StringValue("2026-01-02".into())
    );
    let time = col(ColumnType::MYSQL_TYPE_TIME);
    assert_eq!(
        to_field(Value::Time(true, 1, 2, 3, 4, 0), &time, options).unwrap(),
        Field::StringValue("-26:03:04".into())
    );

    let bit1 = col(ColumnType::MYSQL_TYPE_BIT).with_column_length(1);
    assert_eq!(
        to_field(Value::Bytes(vec![1]), &bit1, options).unwrap(),
        Field::BooleanValue(true)
    );
    let bit16 = col(ColumnType::MYSQL_TYPE_BIT).with_column_length(16);
    assert_eq!(
        to_field(Value::Bytes(vec![1, 2]), &bit16, options).unwrap(),
        Field::LongValue(258)
    );

    let text = text_col(ColumnType::MYSQL_TYPE_BLOB);
    assert_eq!(
        to_field(Value::Bytes(b"hi".to_vec()), &text, options).unwrap(),
        Field::StringValue("hi".into())
    );
    let blob = col(ColumnType::MYSQL_TYPE_BLOB);
    assert_eq!(
        to_field(Value::Bytes(vec![0, 1]), &blob, options).unwrap(),
        Field::BlobValue(vec![0, 1])
    );
    assert_eq!(
        to_field(Value::NULL, &text, options).unwrap(),
        Field::IsNull(true)
    );
}

#[test]
fn metadata_of_common_columns() {
    let varchar = text_col(ColumnType::MYSQL_TYPE_VAR_STRING)
        .with_column_length(256)
        .with_flags(ColumnFlags::NOT_NULL_FLAG)
        .with_org_name(b"user_id")
        .with_org_table(b"orders");
    let meta = column_metadata(&varchar);
    assert_eq!(meta["typeName"], "VARCHAR");
    assert_eq!(meta["type"], 12);
    assert_eq!(meta["precision"], 64);
    assert_eq!(meta["nullable"], 0);
    assert_eq!(meta["name"], "user_id");
    assert_eq!(meta["tableName"], "orders");
    assert_eq!(meta["isSigned"], false);

    let id = col(ColumnType::MYSQL_TYPE_LONGLONG)
        .with_column_length(20)
        .with_flags(ColumnFlags::UNSIGNED_FLAG | ColumnFlags::AUTO_INCREMENT_FLAG);
    let meta = column_metadata(&id);
    assert_eq!(meta["typeName"], "BIGINT UNSIGNED");
    assert_eq!(meta["type"], -5);
    assert_eq!(meta["isAutoIncrement"], true);
    assert_eq!(meta["isSigned"], false);

    let decimal = col(ColumnType::MYSQL_TYPE_NEWDECIMAL)
        .with_column_length(12)
        .with_decimals(2);
    let meta = column_metadata(&decimal);
    assert_eq!(meta["precision"], 10);
    assert_eq!(meta["scale"], 2);
    assert_eq!(meta["type"], 3);
    assert_eq!(meta["isSigned"], true);
}

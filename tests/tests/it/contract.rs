//! The contract document (`docs/openapi.yaml`) against the code: its operations are
//! exactly the router's routes with the same authentication, its error codes exactly
//! the codes `ApiError` maps, and it names nothing outside this repository. The
//! responses themselves are checked against it wherever the suites read one
//! (`seckill_tests::harness::call`, `e2e_http`, `http_fuzz`).

use proptest::prelude::*;
use seckill_http::error::CODES;
use seckill_http::routes::ROUTES;
use seckill_shared::domain::{NewVoucher, format_rfc3339_millis, now_millis};
use seckill_tests::contract::contract;
use serde_json::{Value, json};

#[test]
fn the_contract_lists_exactly_the_routes_of_the_router_with_their_authentication() {
    let doc = contract().doc();
    let mut from_code: Vec<String> = ROUTES.iter().map(|(m, p, _)| format!("{m} {p}")).collect();
    from_code.sort();
    assert_eq!(contract().route_keys(), from_code);
    for (method, path, protected) in ROUTES {
        let op = &doc["paths"][path][method.to_lowercase()];
        // No `security` on the operation: the document's default (a bearer token).
        let security = if op["security"].is_null() {
            &doc["security"]
        } else {
            &op["security"]
        };
        let open = security.as_array().is_some_and(|s| s.is_empty());
        assert_eq!(
            !open, *protected,
            "{method} {path}: security {security} in the contract"
        );
        // Every protected route can answer 401; every route with an id 400.
        let statuses = contract().statuses(&format!("{method} {path}"));
        if *protected {
            assert!(statuses.contains(&"401".to_string()), "{method} {path}");
        }
        if path.contains('{') {
            assert!(statuses.contains(&"400".to_string()), "{method} {path}");
        }
    }
}

#[test]
fn the_contract_error_codes_are_exactly_the_codes_of_the_code() {
    let listed: Vec<&str> = contract().doc()["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("components.schemas.ErrorCode.enum")
        .iter()
        .map(|v| v.as_str().expect("codes are strings"))
        .collect();
    assert_eq!(listed, CODES);
}

#[test]
fn the_contract_refers_to_nothing_outside_the_repository() {
    fn walk(v: &Value, at: &str) {
        match v {
            Value::String(s) => assert!(
                !s.contains("../") && !s.contains("shared/README"),
                "{at}: {s:?} points outside the repository"
            ),
            Value::Object(m) => m.iter().for_each(|(k, v)| walk(v, &format!("{at}/{k}"))),
            Value::Array(a) => a.iter().for_each(|v| walk(v, at)),
            _ => {}
        }
    }
    walk(contract().doc(), "");
}

/// JSON Pointer escaping of one path segment (`/vouchers/{id}` -> `~1vouchers~1{id}`).
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Every example the document gives (request and response bodies, named examples,
/// parameters, schemas) is valid against its own schema, whenever it is read.
#[test]
fn every_example_in_the_contract_matches_its_schema() {
    let doc = contract().doc();
    let mut checked = 0;
    let mut check = |schema_at: String, example: &Value| {
        contract()
            .validate_at(&schema_at, example)
            .unwrap_or_else(|e| panic!("an example does not match its schema: {e}"));
        checked += 1;
    };
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            let Some(op) = op.as_object() else { continue };
            let at = format!("/paths/{}/{method}", escape(path));
            let body = &op.get("requestBody").cloned().unwrap_or(Value::Null)["content"]["application/json"];
            if let Some(example) = body.get("example") {
                check(
                    format!("{at}/requestBody/content/application~1json/schema"),
                    example,
                );
            }
            for (status, response) in op
                .get("responses")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let media = &response["content"]["application/json"];
                let schema_at = format!("{at}/responses/{status}/content/application~1json/schema");
                if let Some(example) = media.get("example") {
                    check(schema_at.clone(), example);
                }
                for named in media
                    .get("examples")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(_, e)| e)
                {
                    check(schema_at.clone(), &named["value"]);
                }
            }
        }
    }
    for (name, p) in doc["components"]["parameters"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if let Some(example) = p.get("example") {
            check(format!("/components/parameters/{name}/schema"), example);
        }
    }
    for (name, schema) in doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
    {
        for example in schema
            .get("examples")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            check(format!("/components/schemas/{name}"), example);
        }
    }
    assert!(checked >= 10, "only {checked} examples found");
}

/// The voucher example a reader copies is one the function accepts today: its rules
/// that no schema states (times in order and in the future) hold for it too.
#[test]
fn the_voucher_example_is_a_voucher_the_function_accepts() {
    let example = &contract().doc()["paths"]["/vouchers"]["post"]["requestBody"]["content"]["application/json"]
        ["example"];
    let text = |k: &str| example[k].as_str().expect("a string field");
    NewVoucher::parse(
        text("title"),
        example["stock"].as_i64().expect("stock"),
        text("begins_at"),
        text("ends_at"),
        now_millis(),
    )
    .unwrap_or_else(|e| panic!("the documented example is refused: {e:?}"));
}

/// Characters around the edges of the title rule: whitespace that trims, whitespace
/// that does not, controls (C0, DEL, C1), a BOM, letters wide in UTF-8.
fn title_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => proptest::char::range('a', 'z'),
        2 => proptest::sample::select(vec![
            ' ', '\t', '\n', '\u{b}', '\u{c}', '\r', '\u{85}', '\u{a0}', '\u{1680}', '\u{2000}',
            '\u{200a}', '\u{2028}', '\u{2029}', '\u{202f}', '\u{205f}', '\u{3000}', '\u{feff}',
            '\u{0}', '\u{1}', '\u{1c}', '\u{1f}', '\u{7f}', '\u{80}', '\u{9f}', '\u{200b}',
            'é', '€', '😀',
        ]),
        1 => any::<char>(),
    ]
}

fn title() -> impl Strategy<Value = String> {
    // Near the 200-character bound: letters, one odd character somewhere, whitespace
    // around (a long title of odd characters alone would nearly always hold a control).
    let whitespace = || {
        proptest::collection::vec(
            proptest::sample::select(vec![' ', '\t', '\u{85}', '\u{3000}', '\u{feff}']),
            0..3,
        )
    };
    let long = (
        whitespace(),
        proptest::collection::vec(proptest::char::range('a', 'z'), 196..205),
        title_char(),
        any::<prop::sample::Index>(),
        whitespace(),
    )
        .prop_map(|(pre, mut body, odd, at, post)| {
            let i = at.index(body.len() + 1);
            body.insert(i, odd);
            pre.into_iter().chain(body).chain(post).collect::<String>()
        });
    prop_oneof![
        proptest::collection::vec(title_char(), 0..8).prop_map(|c| c.into_iter().collect()),
        long,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// The title's pattern in the document accepts exactly the titles the function does:
    /// a schema-valid voucher is never refused for its title, nor a schema-invalid
    /// title accepted.
    #[test]
    fn the_documented_title_rule_is_the_functions(title in title()) {
        let now = now_millis();
        let by_code = NewVoucher::parse(
            &title,
            1,
            &format_rfc3339_millis(now),
            &format_rfc3339_millis(now + 60_000),
            now,
        )
        .is_ok();
        let by_doc = contract()
            .validate_at("/components/schemas/NewVoucher/properties/title", &json!(title))
            .is_ok();
        prop_assert_eq!(by_doc, by_code, "{:?}", title);
    }
}

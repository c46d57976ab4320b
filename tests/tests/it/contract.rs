//! The contract document (`docs/openapi.yaml`) against the code: its operations are
//! exactly the router's routes with the same authentication, its error codes exactly
//! the codes `ApiError` maps, and it names nothing outside this repository. The
//! responses themselves are checked against it wherever the suites read one
//! (`seckill_tests::harness::call`, `e2e_http`, `http_fuzz`).

use seckill_http::error::CODES;
use seckill_http::routes::ROUTES;
use seckill_tests::contract::contract;
use serde_json::Value;

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

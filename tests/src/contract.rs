//! The public HTTP API's contract, `docs/openapi.yaml`, as a check on real answers.
//!
//! Every response the handler suites and the end-to-end suite read goes through
//! [`Contract::check`]: the route must list the status, and the body must validate
//! against that status's JSON Schema (draft 2020-12, as OpenAPI 3.1 uses), so error
//! `code`s outside the document's enum, missing fields and wrong types fail the test
//! that met them. The document and the code therefore cannot drift apart silently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::stack::workspace_root;

/// The parsed contract with a validator per (route, status), built on first use.
pub struct Contract {
    doc: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

/// The repository's contract, read once per test process.
pub fn contract() -> &'static Contract {
    static CONTRACT: OnceLock<Contract> = OnceLock::new();
    CONTRACT.get_or_init(|| {
        let path = workspace_root().join("docs/openapi.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Contract::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// The route key (`POST /vouchers/{id}/seckill`) the router gives `method path`, `None`
/// when no route matches.
pub fn route_key(method: &str, path: &str) -> Option<&'static str> {
    let method = method.parse().ok()?;
    seckill_http::routes::Route::parse(&method, path).map(|r| r.key().0)
}

/// The route key of a request as the handler dispatches it: API Gateway's `routeKey`,
/// or for the emulator's catch-all (`$default`) the route its method and path match.
pub fn route_key_of(req: &lambda_http::Request) -> Option<String> {
    use lambda_http::RequestExt;
    use lambda_http::request::RequestContext;
    let given = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.route_key.clone(),
        _ => None,
    };
    match given {
        Some(key) if key != "$default" => Some(key),
        _ => route_key(req.method().as_str(), req.uri().path()).map(str::to_string),
    }
}

impl Contract {
    /// Parses an OpenAPI document (YAML or JSON).
    pub fn parse(text: &str) -> Result<Contract, String> {
        let doc: Value = serde_yaml::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
        if !doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1"))
        {
            return Err("not an OpenAPI 3.1 document".into());
        }
        Ok(Contract {
            doc,
            validators: Mutex::new(HashMap::new()),
        })
    }

    /// The whole document.
    pub fn doc(&self) -> &Value {
        &self.doc
    }

    /// Every operation as a route key, `METHOD /path/{param}`, sorted.
    pub fn route_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        if let Some(paths) = self.doc["paths"].as_object() {
            for (path, item) in paths {
                for method in item.as_object().into_iter().flat_map(|m| m.keys()) {
                    if matches!(
                        method.as_str(),
                        "get" | "put" | "post" | "delete" | "patch" | "head" | "options"
                    ) {
                        keys.push(format!("{} {path}", method.to_uppercase()));
                    }
                }
            }
        }
        keys.sort();
        keys
    }

    /// The statuses the contract lists for a route (as written: `202`, `4XX`, `default`).
    pub fn statuses(&self, route_key: &str) -> Vec<String> {
        self.operation(route_key)
            .and_then(|op| op["responses"].as_object())
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Checks one answer: `route_key` as the router matched it (`None` or a key the
    /// document does not have: no route, which only a catch-all route delivers; the
    /// answer must then be a 4xx with the contract's error body), its status and its
    /// JSON body.
    pub fn check(&self, route_key: Option<&str>, status: u16, body: &Value) -> Result<(), String> {
        // A route key the document does not have (an API Gateway route of someone
        // else's, such as `ANY /{proxy+}`) matches no route of the function either; the
        // document's operations are exactly the router's (the `contract` suite).
        let operation = route_key.and_then(|key| Some((key, self.operation(key)?)));
        let (cache_key, schema) = match operation {
            Some((key, op)) => {
                let responses = &op["responses"];
                let exact = status.to_string();
                let range = format!("{}XX", status / 100);
                let (listed, response) = [exact.as_str(), range.as_str(), "default"]
                    .into_iter()
                    .find_map(|s| responses.get(s).map(|r| (s, r)))
                    .ok_or_else(|| {
                        format!(
                            "{key} answered {status}, which the contract does not list \
                             (it lists {:?}); body: {body}",
                            self.statuses(key)
                        )
                    })?;
                let response = self.resolve(response);
                let schema = response["content"]["application/json"]["schema"].clone();
                if schema.is_null() {
                    return Err(format!(
                        "{key} {status}: the contract gives no application/json body schema"
                    ));
                }
                (format!("{key} {listed}"), schema)
            }
            None => {
                if !(400..500).contains(&status) {
                    return Err(format!(
                        "a request matching no route answered {status}, not a 4xx: {body}"
                    ));
                }
                let schema = self.doc["components"]["schemas"]["Error"].clone();
                if schema.is_null() {
                    return Err("the contract has no components.schemas.Error".into());
                }
                ("(no route) 4XX".to_string(), schema)
            }
        };
        let errors = errors_of(&*self.validator(&cache_key, &schema)?, body);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{cache_key}: the body does not match the contract: {}; body: {body}",
                errors.join("; ")
            ))
        }
    }

    /// [`Contract::check`], panicking with its message (for the suites).
    pub fn assert(&self, route_key: Option<&str>, status: u16, body: &Value) {
        if let Err(e) = self.check(route_key, status, body) {
            panic!("{e}");
        }
    }

    fn operation(&self, route_key: &str) -> Option<&Value> {
        let (method, path) = route_key.split_once(' ')?;
        let op = &self.doc["paths"][path][method.to_lowercase()];
        (!op.is_null()).then_some(op)
    }

    /// Follows `$ref`s at this level (`#/components/...` only).
    fn resolve<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        while let Some(r) = v.get("$ref").and_then(Value::as_str) {
            match r.strip_prefix('#') {
                Some(pointer) => match self.doc.pointer(pointer) {
                    Some(target) => v = target,
                    None => return &Value::Null,
                },
                None => return &Value::Null,
            }
        }
        v
    }

    /// A schema with every local `$ref` replaced by its target, so it validates alone.
    fn inline(&self, v: &Value, depth: usize) -> Result<Value, String> {
        if depth > 32 {
            return Err("schema $refs nest deeper than 32 (a cycle?)".into());
        }
        Ok(match v {
            Value::Object(map) => {
                if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                    let target = r
                        .strip_prefix('#')
                        .and_then(|p| self.doc.pointer(p))
                        .ok_or_else(|| format!("unresolvable $ref {r}"))?;
                    let mut inlined = self.inline(target, depth + 1)?;
                    // Keywords beside a $ref (2020-12 allows them) still apply.
                    if let Value::Object(out) = &mut inlined {
                        for (k, val) in map {
                            if k != "$ref" {
                                out.insert(k.clone(), self.inline(val, depth + 1)?);
                            }
                        }
                    }
                    inlined
                } else {
                    let mut out = serde_json::Map::new();
                    for (k, val) in map {
                        out.insert(k.clone(), self.inline(val, depth + 1)?);
                    }
                    Value::Object(out)
                }
            }
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|i| self.inline(i, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            other => other.clone(),
        })
    }

    /// Checks `value` against the schema at `pointer` in the document (for example
    /// `/components/schemas/NewVoucher`): the errors, if any.
    pub fn validate_at(&self, pointer: &str, value: &Value) -> Result<(), String> {
        let schema = self
            .doc
            .pointer(pointer)
            .ok_or_else(|| format!("the contract has nothing at {pointer}"))?
            .clone();
        let errors = errors_of(&*self.validator(pointer, &schema)?, value);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{pointer}: {}; value: {value}", errors.join("; ")))
        }
    }

    fn validator(&self, key: &str, schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
        let mut cache = self.validators.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = cache.get(key) {
            return Ok(v.clone());
        }
        let schema = self.inline(schema, 0)?;
        let validator = jsonschema::draft202012::new(&schema)
            .map_err(|e| format!("{key}: the contract's schema does not compile: {e}"))?;
        let validator = Arc::new(validator);
        cache.insert(key.to_string(), validator.clone());
        Ok(validator)
    }
}

/// Every way `value` breaks `validator`'s schema, with where.
fn errors_of(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DOC: &str = r##"
openapi: 3.1.0
info: {title: t, version: "1"}
paths:
  /things/{id}:
    get:
      responses:
        "200":
          content:
            application/json:
              schema: {$ref: "#/components/schemas/Thing"}
        "404": {$ref: "#/components/responses/Error"}
components:
  responses:
    Error:
      description: e
      content:
        application/json:
          schema: {$ref: "#/components/schemas/Error"}
  schemas:
    Thing:
      type: object
      required: [id]
      properties: {id: {type: string}}
    Error:
      type: object
      required: [code]
      properties: {code: {enum: [not_found]}}
"##;

    #[test]
    fn answers_are_checked_against_the_route_status_and_schema() {
        let c = Contract::parse(DOC).unwrap();
        assert_eq!(c.route_keys(), ["GET /things/{id}"]);
        let key = Some("GET /things/{id}");
        c.check(key, 200, &json!({"id": "1"})).unwrap();
        assert!(c.check(key, 200, &json!({"id": 1})).is_err(), "wrong type");
        c.check(key, 404, &json!({"code": "not_found"})).unwrap();
        assert!(c.check(key, 404, &json!({"code": "nope"})).is_err(), "code");
        let err = c.check(key, 409, &json!({})).unwrap_err();
        assert!(err.contains("does not list"), "{err}");
        assert!(c.check(Some("POST /things"), 200, &json!({})).is_err());
        c.check(Some("ANY /{proxy+}"), 404, &json!({"code": "not_found"}))
            .unwrap();
        c.check(None, 404, &json!({"code": "not_found"})).unwrap();
        assert!(c.check(None, 200, &json!({"code": "not_found"})).is_err());
    }
}

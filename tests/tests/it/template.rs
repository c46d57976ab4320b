//! The SAM template (`template.yaml`) checked offline, without an AWS account:
//!
//! - `cfn-lint` finds no errors in it, and checkov (a scanner nobody here wrote) no
//!   failed check: each check it would fail is fixed or skipped inline with a reason;
//! - seckill-http's reserved concurrency covers the stage's rate at ten times an
//!   admission's time, so a burst of slow requests cannot take the account's whole pool;
//! - the routes of the HTTP API are exactly `seckill_http::routes::ROUTES`, the protected
//!   ones behind the JWT authorizer, the public one explicitly without;
//! - the drainer's timing is consistent: XAUTOCLAIM min-idle > its timeout > its max run,
//!   one run at a time, a small retry budget, an alarm on its errors;
//! - every IAM statement names scoped resources — the very cluster and secret the
//!   functions are configured with — and grants each function exactly the Data API
//!   calls its code makes;
//! - the functions use the application user's secret, never the master secret, which
//!   only `seckill migrate` uses (an output says which it is);
//! - each function's configuration loads from exactly the environment the template gives
//!   it (with placeholders for what only exists once deployed), in both shapes of the
//!   stack (resources created by it, or existing ones passed as parameters), and the
//!   template sets no variable the code does not read.
//!
//! The template is read with CloudFormation's short tags (`!Ref`, `!If`, ...) and a small
//! evaluator resolves them for a given set of parameter values.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::{Mapping, Value};

// ------------------------------------------------------------------------ loading

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn template() -> Value {
    let path = workspace_root().join("template.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping().and_then(|m| m.get(key))
}

fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    let mut cur = v;
    for (i, key) in path.iter().enumerate() {
        cur = get(cur, key).unwrap_or_else(|| panic!("template has no {}", path[..=i].join(".")));
    }
    cur
}

fn str_of(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, found {v:?}"))
}

fn resources(t: &Value) -> &Mapping {
    at(t, &["Resources"])
        .as_mapping()
        .expect("Resources is a mapping")
}

fn resources_of_type<'a>(t: &'a Value, ty: &str) -> Vec<(&'a str, &'a Value)> {
    resources(t)
        .iter()
        .filter(|(_, r)| get(r, "Type").and_then(Value::as_str) == Some(ty))
        .map(|(k, r)| (str_of(k), r))
        .collect()
}

fn resource<'a>(t: &'a Value, name: &str) -> &'a Value {
    resources(t)
        .get(name)
        .unwrap_or_else(|| panic!("template has no resource {name}"))
}

/// The `AWS::Serverless::Function` whose cargo-lambda build produces `binary`.
fn function_for_binary<'a>(t: &'a Value, binary: &str) -> (&'a str, &'a Value) {
    let found: Vec<_> = resources_of_type(t, "AWS::Serverless::Function")
        .into_iter()
        .filter(|(_, f)| {
            get(f, "Metadata")
                .and_then(|m| get(m, "BuildProperties"))
                .and_then(|b| get(b, "Binary"))
                .and_then(Value::as_str)
                == Some(binary)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "exactly one function must build the binary {binary}"
    );
    found[0]
}

/// A function property, falling back to `Globals.Function`.
fn function_property<'a>(t: &'a Value, f: &'a Value, key: &str) -> Option<&'a Value> {
    get(at(f, &["Properties"]), key).or_else(|| {
        get(t, "Globals")
            .and_then(|g| get(g, "Function"))
            .and_then(|g| get(g, key))
    })
}

// ------------------------------------------------------------------ intrinsic functions

/// An intrinsic function call in either notation: `!Ref X` or `{Ref: X}`, `!If [...]` or
/// `{"Fn::If": [...]}`. Returns the long name (`Ref`, `Fn::If`, `Condition`...) and its
/// argument.
fn intrinsic(v: &Value) -> Option<(String, &Value)> {
    match v {
        Value::Tagged(t) => {
            let tag = t.tag.to_string();
            let tag = tag.trim_start_matches('!');
            let name = if tag == "Ref" || tag == "Condition" {
                tag.to_string()
            } else {
                format!("Fn::{tag}")
            };
            Some((name, &t.value))
        }
        Value::Mapping(m) if m.len() == 1 => {
            let (k, arg) = m.iter().next()?;
            let k = k.as_str()?;
            (k == "Ref" || k == "Condition" || k.starts_with("Fn::")).then(|| (k.to_string(), arg))
        }
        _ => None,
    }
}

/// Parameter values for one shape of the stack.
#[derive(Clone)]
struct Scenario {
    name: &'static str,
    params: BTreeMap<String, String>,
}

impl Scenario {
    /// The parameters' defaults, placeholders for those without one, then `overrides`.
    fn new(t: &Value, name: &'static str, overrides: &[(&str, &str)]) -> Scenario {
        let placeholders: HashMap<&str, &str> = [
            (
                "JwtIssuer",
                "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_example",
            ),
            ("JwtAudience", "exampleclientid"),
            ("VpcId", "vpc-0123456789abcdef0"),
            (
                "SubnetIds",
                "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
            ),
        ]
        .into();
        let mut params = BTreeMap::new();
        for (k, p) in at(t, &["Parameters"]).as_mapping().unwrap() {
            let k = str_of(k);
            let value = match get(p, "Default") {
                Some(d) => scalar_string(d),
                None => placeholders
                    .get(k)
                    .unwrap_or_else(|| panic!("parameter {k} has no default: add a placeholder"))
                    .to_string(),
            };
            params.insert(k.to_string(), value);
        }
        for (k, v) in overrides {
            assert!(params.contains_key(*k), "no parameter {k}");
            params.insert(k.to_string(), v.to_string());
        }
        Scenario { name, params }
    }

    /// Both shapes: everything created by the stack (the defaults), and an existing
    /// cache and database passed in.
    fn all(t: &Value) -> Vec<Scenario> {
        vec![
            Scenario::new(t, "created resources", &[]),
            Scenario::new(
                t,
                "existing resources",
                &[
                    (
                        "ExistingRedisUrl",
                        "rediss://existing.serverless.use1.cache.amazonaws.com:6379",
                    ),
                    ("ExistingRedisSecurityGroupId", "sg-0123456789abcdef0"),
                    (
                        "ExistingDbClusterArn",
                        "arn:aws:rds:us-east-1:123456789012:cluster:existing",
                    ),
                    (
                        "ExistingDbSecretArn",
                        "arn:aws:secretsmanager:us-east-1:123456789012:secret:existing-AbCdEf",
                    ),
                    ("CreateRdsDataEndpoint", "false"),
                    ("EnableStripe", "true"),
                    ("EnableEdge", "true"),
                ],
            ),
            Scenario::bounds(t, "every number parameter at its MinValue", "MinValue"),
            Scenario::bounds(t, "every number parameter at its MaxValue", "MaxValue"),
        ]
    }

    /// The defaults with every `Number` parameter that has the bound `key` set to it.
    fn bounds(t: &Value, name: &'static str, key: &str) -> Scenario {
        let mut s = Scenario::new(t, name, &[]);
        for (k, p) in at(t, &["Parameters"]).as_mapping().unwrap() {
            if get(p, "Type").map(str_of) == Some("Number")
                && let Some(bound) = get(p, key)
            {
                s.params.insert(str_of(k).to_string(), scalar_string(bound));
            }
        }
        s
    }
}

fn scalar_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("expected a scalar, found {other:?}"),
    }
}

/// Resolves intrinsic functions for a scenario. Parameters take the scenario's values;
/// what only exists once deployed (resource ids, attributes) becomes a recognisable
/// placeholder; `AWS::NoValue` becomes `Null`.
struct Eval<'a> {
    t: &'a Value,
    s: &'a Scenario,
}

impl Eval<'_> {
    fn value(&self, v: &Value) -> Value {
        if let Some((name, arg)) = intrinsic(v) {
            return self.call(&name, arg);
        }
        match v {
            Value::Sequence(items) => {
                Value::Sequence(items.iter().map(|i| self.value(i)).collect())
            }
            Value::Mapping(m) => Value::Mapping(
                m.iter()
                    .map(|(k, v)| (k.clone(), self.value(v)))
                    .filter(|(_, v)| !v.is_null())
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn string(&self, v: &Value) -> String {
        scalar_string(&self.value(v))
    }

    fn call(&self, name: &str, arg: &Value) -> Value {
        match name {
            "Ref" => self.reference(str_of(arg)),
            "Fn::GetAtt" => {
                let (res, attr) = match arg {
                    Value::String(s) => s.split_once('.').expect("GetAtt Resource.Attribute"),
                    Value::Sequence(p) => (str_of(&p[0]), str_of(&p[1])),
                    other => panic!("bad GetAtt {other:?}"),
                };
                Value::String(self.attribute(res, attr))
            }
            "Fn::Sub" => {
                let (text, vars) = match arg {
                    Value::String(s) => (s.as_str(), None),
                    Value::Sequence(p) => (str_of(&p[0]), p.get(1)),
                    other => panic!("bad Sub {other:?}"),
                };
                Value::String(self.sub(text, vars))
            }
            "Fn::If" => {
                let p = arg.as_sequence().expect("If takes a list");
                assert_eq!(p.len(), 3, "If takes [condition, then, else]");
                if self.condition(str_of(&p[0])) {
                    self.value(&p[1])
                } else {
                    self.value(&p[2])
                }
            }
            other => panic!("the template check does not evaluate {other}: extend Eval"),
        }
    }

    fn reference(&self, name: &str) -> Value {
        match name {
            "AWS::Region" => return Value::from("us-east-1"),
            "AWS::AccountId" => return Value::from("123456789012"),
            "AWS::Partition" => return Value::from("aws"),
            "AWS::URLSuffix" => return Value::from("amazonaws.com"),
            "AWS::StackName" => return Value::from("seckill"),
            "AWS::NoValue" => return Value::Null,
            _ => {}
        }
        if let Some(value) = self.s.params.get(name) {
            let ty = str_of(at(self.t, &["Parameters", name, "Type"]));
            return if ty.starts_with("List<") || ty == "CommaDelimitedList" {
                Value::Sequence(value.split(',').map(Value::from).collect())
            } else {
                Value::from(value.as_str())
            };
        }
        let r = resource(self.t, name);
        self.assert_exists(name, r);
        if get(r, "Type").and_then(Value::as_str) == Some("AWS::SecretsManager::Secret") {
            // A secret's Ref is its ARN.
            return Value::String(format!(
                "arn:aws:secretsmanager:us-east-1:123456789012:secret:{}-placeholder",
                name.to_ascii_lowercase()
            ));
        }
        Value::String(format!("{}-placeholder-id", name.to_ascii_lowercase()))
    }

    fn attribute(&self, name: &str, attr: &str) -> String {
        let r = resource(self.t, name);
        self.assert_exists(name, r);
        let lower = name.to_ascii_lowercase();
        if attr.ends_with("Port") {
            "6379".into()
        } else if attr.ends_with("Address") {
            format!("{lower}.placeholder.cache.amazonaws.com")
        } else if attr.ends_with("Arn") {
            format!(
                "arn:aws:placeholder:us-east-1:123456789012:{lower}:{}",
                attr.to_ascii_lowercase()
            )
        } else {
            format!("{lower}-{}", attr.to_ascii_lowercase())
        }
    }

    /// A resource used in this scenario must exist in it.
    fn assert_exists(&self, name: &str, r: &Value) {
        if let Some(cond) = get(r, "Condition") {
            assert!(
                self.condition(str_of(cond)),
                "{}: {name} is used but its condition {} is false",
                self.s.name,
                str_of(cond)
            );
        }
    }

    fn sub(&self, text: &str, vars: Option<&Value>) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let end = rest[i..].find('}').expect("unclosed ${") + i;
            let name = &rest[i + 2..end];
            if let Some(literal) = name.strip_prefix('!') {
                out.push_str("${");
                out.push_str(literal);
                out.push('}');
            } else if let Some(v) = vars.and_then(|vars| get(vars, name)) {
                out.push_str(&self.string(v));
            } else if let Some((res, attr)) = name.split_once('.') {
                out.push_str(&self.attribute(res, attr));
            } else {
                out.push_str(&scalar_string(&self.reference(name)));
            }
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn condition(&self, name: &str) -> bool {
        self.boolean(at(self.t, &["Conditions", name]))
    }

    fn boolean(&self, v: &Value) -> bool {
        let (name, arg) = intrinsic(v).unwrap_or_else(|| panic!("not a condition: {v:?}"));
        let args = || arg.as_sequence().expect("condition arguments are a list");
        match name.as_str() {
            "Condition" => self.condition(str_of(arg)),
            "Fn::Equals" => {
                let a = args();
                self.value(&a[0]) == self.value(&a[1])
            }
            "Fn::Not" => !self.boolean(&args()[0]),
            "Fn::And" => args().iter().all(|c| self.boolean(c)),
            "Fn::Or" => args().iter().any(|c| self.boolean(c)),
            other => panic!("unknown condition function {other}"),
        }
    }
}

// --------------------------------------------------------------------------- cfn-lint

/// `cfn-lint template.yaml`: no errors. Its exit code is a bit set: 2 errors, 4 warnings,
/// 8 informational; 1 a fatal problem (no template, bad arguments). Warnings are printed.
#[test]
fn cfn_lint_finds_no_errors() {
    let root = workspace_root();
    // The script pip installs, or the same entry point through Python when pip put the
    // script somewhere off PATH (`pip install --user`).
    const ENTRY: &str =
        "import sys; from cfnlint.runner import main; sys.argv[0] = 'cfn-lint'; sys.exit(main())";
    let candidates: [(&str, &[&str]); 3] = [
        ("cfn-lint", &[]),
        ("python3", &["-c", ENTRY]),
        ("python", &["-c", ENTRY]),
    ];
    for (program, prefix) in candidates {
        let out = Command::new(program)
            .args(prefix)
            .args(["--format", "parseable", "--", "template.yaml"])
            .current_dir(&root)
            .output();
        let Ok(out) = out else { continue };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if program != "cfn-lint" && stderr.contains("No module named 'cfnlint'") {
            continue;
        }
        let code = out
            .status
            .code()
            .unwrap_or_else(|| panic!("cfn-lint was killed: {stderr}"));
        if !stdout.trim().is_empty() {
            eprintln!("cfn-lint findings (exit {code}):\n{stdout}");
        }
        assert!(
            code & 0b11 == 0,
            "cfn-lint reports errors in template.yaml (exit {code}):\n{stdout}\n{stderr}"
        );
        return;
    }
    panic!(
        "cfn-lint is not installed; install it with `python3 -m pip install cfn-lint` \
         (scripts/setup.sh does) so template.yaml can be checked"
    );
}

// ------------------------------------------------------------------------------ checkov

/// checkov (pinned by `scripts/setup.sh`) on template.yaml, offline: no failed check. A
/// check that does not apply is skipped in the template itself, on its resource, with a
/// one-line reason (`Metadata.checkov.skip[].comment`), so a new finding fails here.
/// checkov reads conditions at the parameters' defaults, so it scans a copy with every
/// opt-in on (`EnableStripe`, `EnableEdge`): the default shape's resources and the
/// opt-ins' too.
#[test]
fn checkov_finds_nothing_that_is_not_skipped_with_a_reason() {
    let checkov =
        seckill_tests::pinned::tool("checkov", "CHECKOV_VERSION", "checkov", "SECKILL_CHECKOV");
    let text = std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap();
    let mut every_opt_in = text.clone();
    for name in ["EnableStripe", "EnableEdge"] {
        let opt_in = format!("  {name}:\n    Type: String\n    Default: \"false\"");
        assert!(text.contains(&opt_in), "{name}'s default moved");
        every_opt_in = every_opt_in.replace(
            &opt_in,
            &format!("  {name}:\n    Type: String\n    Default: \"true\""),
        );
    }
    let dir = workspace_root().join("target/tmp/checkov");
    std::fs::create_dir_all(&dir).unwrap();
    let scanned = dir.join(format!("template-{}.yaml", std::process::id()));
    std::fs::write(&scanned, every_opt_in).unwrap();
    let out = Command::new(&checkov)
        .arg("-f")
        .arg(&scanned)
        .args(["--framework", "cloudformation"])
        .args(["--skip-download", "--output", "json"])
        .current_dir(workspace_root())
        .env("BC_SKIP_MAPPING", "TRUE")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", checkov.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "checkov printed no JSON report ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let failed: Vec<String> = report["results"]["failed_checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| format!("{} {} on {}", c["check_id"], c["check_name"], c["resource"]))
        .collect();
    assert!(
        failed.is_empty(),
        "checkov fails template.yaml:\n{}",
        failed.join("\n")
    );
    let summary = &report["summary"];
    assert_eq!(summary["parsing_errors"], 0, "{summary}");
    assert!(summary["passed"].as_u64().unwrap_or(0) >= 40, "{summary}");
    // Every skip says why.
    let t = template();
    let mut skips = 0;
    for (name, r) in resources(&t) {
        let Some(list) = get(r, "Metadata")
            .and_then(|m| get(m, "checkov"))
            .and_then(|c| get(c, "skip"))
        else {
            continue;
        };
        for skip in list.as_sequence().expect("a list of skips") {
            let comment = get(skip, "comment").map(str_of).unwrap_or_default();
            assert!(
                comment.len() > 20,
                "{name:?}: the skip of {skip:?} gives no reason"
            );
            skips += 1;
        }
    }
    assert_eq!(summary["skipped"].as_u64(), Some(skips), "{summary}");
    std::fs::remove_file(&scanned).ok();
}

/// seckill-http may use at most (and always has) `HttpReservedConcurrency` instances:
/// enough for the stage's rate at 50 ms a request (ten times an admission), with room.
#[test]
fn seckill_http_has_reserved_concurrency_sized_from_the_stage_rate() {
    let t = template();
    let (_, f) = function_for_binary(&t, "seckill-http");
    let reserved = function_property(&t, f, "ReservedConcurrentExecutions")
        .expect("seckill-http has ReservedConcurrentExecutions");
    assert_eq!(
        intrinsic(reserved).map(|(f, arg)| (f, str_of(arg).to_string())),
        Some(("Ref".to_string(), "HttpReservedConcurrency".to_string())),
        "{reserved:?}"
    );
    let default = |name: &str| {
        at(&t, &["Parameters", name, "Default"])
            .as_u64()
            .unwrap_or_else(|| panic!("{name} has a numeric default"))
    };
    let (reserved, rate) = (
        default("HttpReservedConcurrency"),
        default("ThrottleRateLimit"),
    );
    // Little's law: instances busy = rate x time per request.
    assert!(
        reserved * 1000 >= rate * 50,
        "{reserved} instances cannot serve {rate}/s at 50 ms"
    );
    // And well below an account's default pool of 1,000.
    assert!(reserved <= 500, "{reserved}");
}

// ------------------------------------------------------------------------------ routes

#[test]
fn http_api_routes_are_exactly_the_router_routes_with_the_authorizer_on_protected_ones() {
    let t = template();
    let apis = resources_of_type(&t, "AWS::Serverless::HttpApi");
    assert_eq!(apis.len(), 1, "one HTTP API");
    let (api_name, api) = apis[0];
    let props = at(api, &["Properties"]);

    // $default stage: the function sees paths without a stage prefix.
    assert_eq!(get(props, "StageName").map(str_of), Some("$default"));
    // Secure by default.
    let auth = at(props, &["Auth"]);
    let default_authorizer = get(auth, "DefaultAuthorizer").map(str_of);
    let authorizers = at(auth, &["Authorizers"]).as_mapping().unwrap();
    let jwt: Vec<&str> = authorizers
        .iter()
        .filter(|(_, a)| get(a, "JwtConfiguration").is_some())
        .map(|(k, _)| str_of(k))
        .collect();
    assert_eq!(jwt.len(), 1, "one JWT authorizer");
    let jwt_name = jwt[0];
    let jwt_auth = &authorizers[jwt_name];
    assert_eq!(
        str_of(at(jwt_auth, &["IdentitySource"])),
        "$request.header.Authorization"
    );
    for (key, param) in [("issuer", "JwtIssuer"), ("audience", "JwtAudience")] {
        let v = at(jwt_auth, &["JwtConfiguration", key]);
        assert_eq!(
            intrinsic(v).map(|(n, a)| (n, str_of(a).to_string())),
            Some(("Ref".to_string(), param.to_string())),
            "the authorizer's {key} comes from the {param} parameter"
        );
    }
    // Stage throttling from parameters, access logs to a log group.
    for key in ["ThrottlingBurstLimit", "ThrottlingRateLimit"] {
        let v = at(props, &["DefaultRouteSettings", key]);
        let (f, p) = intrinsic(v).unwrap_or_else(|| panic!("{key} must be a parameter"));
        assert_eq!(f, "Ref");
        assert!(get(at(&t, &["Parameters"]), str_of(p)).is_some(), "{key}");
    }
    let dest = at(props, &["AccessLogSettings", "DestinationArn"]);
    let (f, arg) = intrinsic(dest).expect("access logs go to a log group of the stack");
    assert_eq!(f, "Fn::GetAtt");
    let group = str_of(arg).split('.').next().unwrap();
    assert_eq!(
        str_of(at(resource(&t, group), &["Type"])),
        "AWS::Logs::LogGroup"
    );
    assert!(
        get(at(&t, &["Resources", group]), "Properties")
            .and_then(|p| get(p, "RetentionInDays"))
            .is_some()
    );
    let format = str_of(at(props, &["AccessLogSettings", "Format"]));
    let _: serde_json::Value = serde_json::from_str(format).expect("access log format is JSON");

    // Every HttpApi event of every function.
    let (http_fn, _) = function_for_binary(&t, "seckill-http");
    let mut declared = BTreeSet::new();
    for (fname, f) in resources_of_type(&t, "AWS::Serverless::Function") {
        let Some(events) = get(at(f, &["Properties"]), "Events") else {
            continue;
        };
        for (ename, e) in events.as_mapping().unwrap() {
            let ty = str_of(at(e, &["Type"]));
            assert_ne!(ty, "Api", "REST API events are not part of this stack");
            if ty != "HttpApi" {
                continue;
            }
            let ename = str_of(ename);
            assert_eq!(fname, http_fn, "{ename}: routes belong to seckill-http");
            let p = at(e, &["Properties"]);
            let api_ref = intrinsic(at(p, &["ApiId"])).map(|(n, a)| (n, str_of(a).to_string()));
            assert_eq!(
                api_ref,
                Some(("Ref".into(), api_name.to_string())),
                "{ename}: ApiId"
            );
            let method = str_of(at(p, &["Method"])).to_ascii_uppercase();
            let path = str_of(at(p, &["Path"])).to_string();
            let authorizer = get(p, "Auth")
                .and_then(|a| get(a, "Authorizer"))
                .map(str_of)
                .or(default_authorizer)
                .unwrap_or("NONE");
            let protected = authorizer != "NONE";
            if protected {
                assert_eq!(
                    authorizer, jwt_name,
                    "{ename}: protected by the JWT authorizer"
                );
            } else {
                // Public on purpose, said explicitly.
                assert_eq!(
                    get(p, "Auth")
                        .and_then(|a| get(a, "Authorizer"))
                        .map(str_of),
                    Some("NONE"),
                    "{ename}: a public route says Authorizer: NONE"
                );
            }
            assert!(
                declared.insert((method.clone(), path.clone(), protected)),
                "{method} {path} twice"
            );
        }
    }
    let served: BTreeSet<(String, String, bool)> = seckill_http::routes::ROUTES
        .iter()
        .map(|(m, p, protected)| (m.to_string(), p.to_string(), *protected))
        .collect();
    assert_eq!(
        declared, served,
        "template routes (left) vs seckill_http::routes::ROUTES (right)"
    );
}

// ---------------------------------------------------------------------- functions

#[test]
fn functions_are_cargo_lambda_builds_on_provided_al2023_logging_json() {
    let t = template();
    let arch = at(&t, &["Parameters", "Architecture"]);
    assert_eq!(get(arch, "Default").map(str_of), Some("arm64"));
    let all = resources_of_type(&t, "AWS::Serverless::Function");
    assert_eq!(
        all.len(),
        2,
        "two functions: seckill-http and order-drainer"
    );
    for binary in ["seckill-http", "order-drainer"] {
        let (name, f) = function_for_binary(&t, binary);
        assert_eq!(
            str_of(at(f, &["Metadata", "BuildMethod"])),
            "rust-cargolambda",
            "{name}"
        );
        // sam runs cargo lambda at CodeUri and takes target/lambda/<Binary>/bootstrap:
        // CodeUri must be the workspace root.
        let code_uri = function_property(&t, f, "CodeUri").map(str_of);
        assert!(
            matches!(code_uri, Some("." | "./")),
            "{name}: CodeUri is the workspace root"
        );
        assert!(
            workspace_root()
                .join("functions")
                .join(binary)
                .join("src/main.rs")
                .exists()
        );
        assert_eq!(
            function_property(&t, f, "Runtime").map(str_of),
            Some("provided.al2023"),
            "{name}"
        );
        assert_eq!(
            function_property(&t, f, "Handler").map(str_of),
            Some("bootstrap"),
            "{name}"
        );
        let archs = function_property(&t, f, "Architectures")
            .and_then(Value::as_sequence)
            .unwrap_or_else(|| panic!("{name}: Architectures"));
        assert_eq!(archs.len(), 1);
        assert_eq!(
            intrinsic(&archs[0]).map(|(n, a)| (n, str_of(a).to_string())),
            Some(("Ref".into(), "Architecture".into())),
            "{name}: the architecture is the Architecture parameter"
        );
        let logging = function_property(&t, f, "LoggingConfig").unwrap_or_else(|| panic!("{name}"));
        assert_eq!(
            str_of(at(logging, &["LogFormat"])),
            "JSON",
            "{name}: JSON logs"
        );
        for key in ["MemorySize", "Timeout"] {
            assert!(
                function_property(&t, f, key)
                    .and_then(Value::as_u64)
                    .is_some(),
                "{name}: {key} is chosen explicitly"
            );
        }
        assert!(
            function_property(&t, f, "VpcConfig").is_some(),
            "{name}: runs in the VPC"
        );
        assert!(
            function_property(&t, f, "Role").is_none(),
            "{name}: SAM builds the role from Policies"
        );
    }
}

#[test]
fn drainer_timing_is_consistent_and_runs_do_not_pile_up() {
    let t = template();
    let (name, f) = function_for_binary(&t, "order-drainer");
    let props = at(f, &["Properties"]);
    let timeout_ms = function_property(&t, f, "Timeout")
        .and_then(Value::as_u64)
        .unwrap()
        * 1000;
    for s in Scenario::all(&t) {
        let env = environment(&t, f, &s);
        let ms = |key: &str| -> u64 {
            env.get(key)
                .unwrap_or_else(|| panic!("{name} has no {key}"))
                .parse()
                .unwrap_or_else(|_| panic!("{key} is not a number of milliseconds"))
        };
        // Parameters can be changed at deploy time: check their whole allowed range.
        let upper = |key: &str| -> u64 {
            let v = at(props, &["Environment", "Variables", key]);
            match intrinsic(v) {
                Some((f, p)) if f == "Ref" => {
                    let max = get(at(&t, &["Parameters", str_of(p)]), "MaxValue")
                        .unwrap_or_else(|| panic!("{key}: its parameter needs a MaxValue"));
                    scalar_string(max).parse().unwrap()
                }
                _ => ms(key),
            }
        };
        let min_idle = ms("DRAINER_MIN_IDLE_MS");
        assert!(
            min_idle > timeout_ms,
            "XAUTOCLAIM min-idle ({min_idle} ms) must exceed the drainer's timeout ({timeout_ms} ms)"
        );
        let max_run = upper("DRAINER_MAX_RUN_MS");
        assert!(
            max_run < timeout_ms,
            "DRAINER_MAX_RUN_MS ({max_run}) < timeout ({timeout_ms})"
        );
        assert!(ms("DRAINER_SAFETY_MARGIN_MS") < timeout_ms);
    }

    // One run at a time; ticks that find it busy expire instead of queueing; failures
    // are not retried (the next tick recovers).
    assert_eq!(
        get(props, "ReservedConcurrentExecutions").and_then(Value::as_u64),
        Some(1)
    );
    let invoke = at(props, &["EventInvokeConfig"]);
    assert_eq!(
        get(invoke, "MaximumRetryAttempts").and_then(Value::as_u64),
        Some(0)
    );
    let max_age = get(invoke, "MaximumEventAgeInSeconds")
        .and_then(Value::as_u64)
        .unwrap();
    assert!(
        max_age <= 60,
        "a queued tick expires within a period of the default schedule"
    );

    let events = at(props, &["Events"]).as_mapping().unwrap();
    let schedules: Vec<&Value> = events
        .values()
        .filter(|e| matches!(get(e, "Type").map(str_of), Some("Schedule" | "ScheduleV2")))
        .collect();
    assert_eq!(
        schedules.len(),
        1,
        "{name} runs on one EventBridge schedule"
    );
    let p = at(schedules[0], &["Properties"]);
    let (f_, param) = intrinsic(at(p, &["Schedule"])).expect("the schedule is a parameter");
    assert_eq!(f_, "Ref");
    let param = str_of(param).to_string();
    assert_eq!(
        str_of(at(&t, &["Parameters", &param, "Default"])),
        "rate(1 minute)"
    );
    let retries = at(p, &["RetryPolicy", "MaximumRetryAttempts"])
        .as_u64()
        .unwrap();
    assert!(retries <= 2, "a small retry budget on the schedule");

    // An alarm on the function's errors.
    let alarms = resources_of_type(&t, "AWS::CloudWatch::Alarm");
    assert!(
        alarms.iter().any(|(_, a)| {
            let p = at(a, &["Properties"]);
            get(p, "Namespace").map(str_of) == Some("AWS/Lambda")
                && get(p, "MetricName").map(str_of) == Some("Errors")
                && get(p, "Dimensions")
                    .and_then(Value::as_sequence)
                    .is_some_and(|d| {
                        d.iter().any(|d| {
                            get(d, "Name").map(str_of) == Some("FunctionName")
                                && get(d, "Value")
                                    .and_then(intrinsic)
                                    .is_some_and(|(f, a)| f == "Ref" && str_of(a) == name)
                        })
                    })
        }),
        "an alarm on {name}'s Errors metric"
    );
}

// ---------------------------------------------------------------------------- IAM

/// Every policy statement the template writes: SAM `Policies` of functions and any IAM
/// resource's policy documents. (SAM also attaches the AWS managed
/// AWSLambdaBasicExecutionRole and AWSLambdaVPCAccessExecutionRole; network interfaces
/// and log streams are what they grant.)
fn policy_statements(t: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    let mut documents: Vec<(String, &Value)> = Vec::new();
    for (name, r) in resources(t) {
        let name = str_of(name);
        let ty = str_of(at(r, &["Type"]));
        let Some(props) = get(r, "Properties") else {
            continue;
        };
        match ty {
            "AWS::Serverless::Function" => {
                let policies = match get(props, "Policies") {
                    Some(Value::Sequence(p)) => p.iter().collect(),
                    Some(other) => vec![other],
                    None => vec![],
                };
                for p in policies {
                    match p {
                        Value::String(managed) => panic!(
                            "{name}: policy {managed} is not ours to scope; write a statement"
                        ),
                        _ if get(p, "Statement").is_some() => documents.push((name.into(), p)),
                        other => panic!("{name}: SAM policy templates are not used: {other:?}"),
                    }
                }
            }
            "AWS::IAM::Role" => {
                for p in get(props, "Policies")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    documents.push((name.into(), at(p, &["PolicyDocument"])));
                }
                assert!(
                    get(props, "ManagedPolicyArns").is_none(),
                    "{name}: managed policies"
                );
            }
            "AWS::IAM::Policy" | "AWS::IAM::ManagedPolicy" => {
                documents.push((name.into(), at(props, &["PolicyDocument"])))
            }
            _ => {}
        }
    }
    for (name, doc) in documents {
        match at(doc, &["Statement"]) {
            Value::Sequence(s) => out.extend(s.iter().map(|s| (name.clone(), s))),
            s => out.push((name, s)),
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Sequence(items) => items.iter().map(scalar_string).collect(),
        other => vec![scalar_string(other)],
    }
}

/// The Data API calls each entry point of the shared crate's database adapters makes
/// (`DataApi`, `SaleSnapshot` in `data_api.rs`; `Ledger`, `LedgerTx` in `ledger.rs`),
/// as IAM actions. Every `pub async fn` of those files must be listed (checked below),
/// so a new one is classified before a function can use it.
const ENTRY_POINTS: &[(&str, &[&str])] = &[
    // data_api.rs
    ("connect", &[]),
    // Builds the SDK configuration (also for the Secrets Manager client); calls nothing.
    ("sdk_config", &[]),
    ("execute", &["ExecuteStatement"]),
    ("begin", &["BeginTransaction"]),
    ("commit", &["CommitTransaction"]),
    ("rollback", &["RollbackTransaction"]),
    ("try_rollback", &["RollbackTransaction"]),
    ("create_voucher", &["ExecuteStatement"]),
    ("voucher", &["ExecuteStatement"]),
    (
        "sale_snapshot",
        &[
            "BeginTransaction",
            "ExecuteStatement",
            "RollbackTransaction",
        ],
    ),
    (
        "sale_snapshot_after",
        &[
            "BeginTransaction",
            "ExecuteStatement",
            "RollbackTransaction",
        ],
    ),
    ("order_of_buyer", &["ExecuteStatement"]),
    ("order", &["ExecuteStatement"]),
    // Used by the operator commands (seckill status), no function.
    ("order_counts", &["ExecuteStatement"]),
    ("next_page", &["ExecuteStatement"]),
    // SaleSnapshot::finish ends the read-only transaction with a rollback.
    ("finish", &["RollbackTransaction"]),
    // ledger.rs (begin, commit, rollback, try_rollback as above)
    ("abort_abandoned", &["RollbackTransaction"]),
    (
        "accepts_an_ordinary_row",
        &[
            "BeginTransaction",
            "ExecuteStatement",
            "RollbackTransaction",
        ],
    ),
    ("record_rejected", &["ExecuteStatement"]),
    ("sale_end", &["ExecuteStatement"]),
    ("refund_paid_closed_again", &["ExecuteStatement"]),
    ("lock_voucher", &["ExecuteStatement"]),
    ("lock_vouchers", &["ExecuteStatement"]),
    ("existing_orders", &["ExecuteStatement"]),
    // Which orders of a batch have rows (and await payment): the settle's ranking.
    ("rows_of", &["ExecuteStatement"]),
    ("insert_orders", &["ExecuteStatement"]),
    ("take_stock", &["ExecuteStatement"]),
    ("take_stocks", &["ExecuteStatement"]),
    ("settle", &["ExecuteStatement"]),
    ("insert_payment_orders", &["ExecuteStatement"]),
    ("awaiting_payment", &["ExecuteStatement"]),
    ("payment_ref", &["ExecuteStatement"]),
    ("order_status_counts", &["ExecuteStatement"]),
];

fn rust_sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// The Data API actions the function crate in `functions/<dir>` can make: the entry
/// points its sources call (`.name(`), mapped through [`ENTRY_POINTS`]. A name shared
/// with an unrelated method (`finish`) can only add an action, never hide one.
fn data_api_actions_of(dir: &str) -> BTreeSet<String> {
    let root = workspace_root();
    for file in [
        "shared/src/adapters/data_api.rs",
        "shared/src/adapters/ledger.rs",
    ] {
        let src = std::fs::read_to_string(root.join(file)).unwrap();
        for line in src.lines() {
            if let Some(rest) = line.trim().strip_prefix("pub async fn ") {
                let name = rest.split(['(', '<']).next().unwrap();
                assert!(
                    ENTRY_POINTS.iter().any(|(n, _)| *n == name),
                    "{file}: `{name}` is not in ENTRY_POINTS: list the Data API calls it makes"
                );
            }
        }
    }
    let mut sources = Vec::new();
    rust_sources(&root.join("functions").join(dir), &mut sources);
    assert!(!sources.is_empty(), "no sources in functions/{dir}");
    let mut used = BTreeSet::new();
    // EventBridge: the order events the drainer publishes.
    if sources.iter().any(|s| s.contains(".put_events()")) {
        used.insert("events:PutEvents".to_string());
    }
    for (name, actions) in ENTRY_POINTS {
        let call = format!(".{name}(");
        if sources.iter().any(|s| s.contains(&call)) {
            used.extend(actions.iter().map(|a| format!("rds-data:{a}")));
        }
    }
    assert!(
        used.contains("rds-data:ExecuteStatement"),
        "the scan finds the Data API calls of functions/{dir}"
    );
    used
}

/// The Data API actions each database-using function's code makes, by resource name.
fn data_api_actions_by_function(t: &Value) -> BTreeMap<String, BTreeSet<String>> {
    [
        ("seckill-http", "seckill-http"),
        ("order-drainer", "order-drainer"),
    ]
    .into_iter()
    .map(|(binary, dir)| {
        let (name, _) = function_for_binary(t, binary);
        (name.to_string(), data_api_actions_of(dir))
    })
    .collect()
}

/// The Data API operations the code calls (SDK method → IAM action), found in the
/// sources of the shared crate and the functions.
fn data_api_actions_used() -> BTreeSet<String> {
    const OPERATIONS: [(&str, &str); 5] = [
        (".execute_statement()", "rds-data:ExecuteStatement"),
        (
            ".batch_execute_statement()",
            "rds-data:BatchExecuteStatement",
        ),
        (".begin_transaction()", "rds-data:BeginTransaction"),
        (".commit_transaction()", "rds-data:CommitTransaction"),
        (".rollback_transaction()", "rds-data:RollbackTransaction"),
    ];
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let root = workspace_root();
    let mut sources = Vec::new();
    walk(&root.join("shared/src"), &mut sources);
    walk(&root.join("functions"), &mut sources);
    let mut used = BTreeSet::new();
    for src in &sources {
        for (call, action) in OPERATIONS {
            if src.contains(call) {
                used.insert(action.to_string());
            }
        }
    }
    assert!(
        used.contains("rds-data:ExecuteStatement"),
        "the scan finds the Data API calls"
    );
    used
}

#[test]
fn every_iam_statement_is_scoped_to_the_configured_cluster_and_secret() {
    let t = template();
    let statements = policy_statements(&t);
    assert!(!statements.is_empty());
    let data_api_actions: BTreeSet<&str> = [
        "rds-data:ExecuteStatement",
        "rds-data:BatchExecuteStatement",
        "rds-data:BeginTransaction",
        "rds-data:CommitTransaction",
        "rds-data:RollbackTransaction",
    ]
    .into();
    let used = data_api_actions_used();
    let by_function = data_api_actions_by_function(&t);
    for actions in by_function.values() {
        let data_api: BTreeSet<String> = actions
            .iter()
            .filter(|a| a.starts_with("rds-data:"))
            .cloned()
            .collect();
        assert!(data_api.is_subset(&used), "{actions:?} ⊄ {used:?}");
    }
    for s in Scenario::all(&t) {
        let eval = Eval { t: &t, s: &s };
        let mut granted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (owner, st) in &statements {
            let st = eval.value(st);
            if st.is_null() {
                // `!If [cond, statement, !Ref AWS::NoValue]` with cond false: no statement.
                continue;
            }
            for key in ["NotResource", "NotAction", "NotPrincipal"] {
                assert!(get(&st, key).is_none(), "{owner}: {key} is not used");
            }
            assert_eq!(get(&st, "Effect").map(str_of), Some("Allow"), "{owner}");
            let actions = strings(at(&st, &["Action"]));
            let resources = strings(at(&st, &["Resource"]));
            for a in &actions {
                assert!(!a.contains('*'), "{owner}: wildcard action {a}");
            }
            for r in &resources {
                assert!(
                    !r.contains('*') && r.starts_with("arn:"),
                    "{} / {owner}: resource {r:?} is not a scoped ARN",
                    s.name
                );
            }
            // The very cluster and secret this function is configured with.
            let f = resource(&t, owner);
            let env = environment(&t, f, &s);
            // The order-events bus, by ARN: the one the function names (EVENT_BUS_NAME).
            let bus_arn = eval.attribute("OrderEventsBus", "Arn");
            for a in &actions {
                let expected = if a == "events:PutEvents" {
                    assert_eq!(
                        env.get("EVENT_BUS_NAME").map(|v| Value::from(v.as_str())),
                        Some(eval.reference("OrderEventsBus")),
                        "{owner} publishes to the bus it may put events on"
                    );
                    Some(&bus_arn)
                } else if a.starts_with("rds-data:") {
                    assert!(data_api_actions.contains(a.as_str()), "{owner}: {a}");
                    env.get("DB_CLUSTER_ARN")
                } else if a == "secretsmanager:GetSecretValue" {
                    // The database secret the function names to the Data API, or a
                    // secret it reads itself (the payment webhook's, the entry
                    // tokens', Stripe's, the edge's): one per statement.
                    let own = [
                        "PAYMENT_WEBHOOK_SECRET_ARN",
                        "ENTRY_TOKEN_SECRET_ARN",
                        "STRIPE_SECRET_KEY_ARN",
                        "STRIPE_WEBHOOK_SECRET_ARN",
                        "EDGE_ORIGIN_SECRET_ARN",
                    ]
                    .iter()
                    .filter_map(|k| env.get(*k))
                    .find(|w| resources == vec![(*w).clone()]);
                    own.or_else(|| env.get("DB_SECRET_ARN"))
                } else {
                    panic!("{owner}: unexpected action {a}")
                };
                let expected =
                    expected.unwrap_or_else(|| panic!("{owner} grants {a} but has no target"));
                assert_eq!(
                    &resources,
                    &vec![expected.clone()],
                    "{} / {owner}: {a}",
                    s.name
                );
                granted.entry(owner.clone()).or_default().insert(a.clone());
            }
        }
        // Every function that talks to the database may make exactly the calls its code
        // makes, and read its secret: nothing it never uses.
        for (name, f) in resources_of_type(&t, "AWS::Serverless::Function") {
            if !environment(&t, f, &s).contains_key("DB_CLUSTER_ARN") {
                continue;
            }
            let g = granted.get(name).cloned().unwrap_or_default();
            let mut wanted = by_function
                .get(name)
                .unwrap_or_else(|| panic!("{name}: which binary is it?"))
                .clone();
            wanted.insert("secretsmanager:GetSecretValue".to_string());
            for action in &wanted {
                assert!(
                    g.contains(action),
                    "{name} calls {action} but is not allowed to"
                );
            }
            for action in &g {
                assert!(
                    wanted.contains(action),
                    "{} / {name} is allowed {action}, which its code never calls",
                    s.name
                );
            }
        }
    }
}

// ----------------------------------------------------------------- configuration

/// The environment a function gets in a scenario (`Globals.Function` merged under the
/// function's own variables), every value a string as Lambda hands it over.
fn environment(t: &Value, f: &Value, s: &Scenario) -> HashMap<String, String> {
    let eval = Eval { t, s };
    let mut vars = HashMap::new();
    let global = get(t, "Globals")
        .and_then(|g| get(g, "Function"))
        .and_then(|g| get(g, "Environment"))
        .and_then(|e| get(e, "Variables"));
    let own = get(at(f, &["Properties"]), "Environment").and_then(|e| get(e, "Variables"));
    for source in [global, own].into_iter().flatten() {
        for (k, v) in eval.value(source).as_mapping().unwrap() {
            // `!Ref AWS::NoValue`: CloudFormation leaves the variable out.
            if !v.is_null() {
                vars.insert(str_of(k).to_string(), scalar_string(v));
            }
        }
    }
    vars
}

/// Read by the logging setup (`seckill_shared::telemetry::init`), not by `Config`.
const TELEMETRY_VARS: &[&str] = &["RUST_LOG"];

/// Never in AWS: the API Gateway authorizer verifies tokens, the SDK finds the real
/// Data API endpoint.
const LOCAL_ONLY_VARS: &[&str] = &["SECKILL_DEV_JWT_SECRET", "DATA_API_URL"];

fn check_names(name: &str, env: &HashMap<String, String>, reads: &[&str]) {
    for k in env.keys() {
        assert!(
            reads.contains(&k.as_str()) || TELEMETRY_VARS.contains(&k.as_str()),
            "{name}: the template sets {k}, which the code never reads"
        );
        assert!(
            !LOCAL_ONLY_VARS.contains(&k.as_str()),
            "{name}: {k} must not be set in AWS"
        );
    }
    assert_eq!(
        env.get("RUST_LOG").map(String::as_str),
        Some("info"),
        "{name}: RUST_LOG"
    );
}

fn check_redis(name: &str, s: &Scenario, env: &HashMap<String, String>) {
    let url = &env["REDIS_URL"];
    assert!(
        url.starts_with("rediss://"),
        "{} / {name}: ElastiCache Serverless needs TLS, got {url}",
        s.name
    );
    assert_eq!(
        env["REDIS_CLUSTER"], "true",
        "{name}: ElastiCache Serverless is cluster mode"
    );
    redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("{name}: REDIS_URL {url}: {e}"));
}

#[test]
fn seckill_http_starts_with_exactly_the_template_environment() {
    use seckill_http::config::{Config, env_vars};
    use seckill_shared::config::EnvReader;

    let t = template();
    let (name, f) = function_for_binary(&t, "seckill-http");
    for s in Scenario::all(&t) {
        let env = environment(&t, f, &s);
        check_names(name, &env, &env_vars());
        check_redis(name, &s, &env);
        let cfg = Config::read(EnvReader::from_map(env.clone()))
            .unwrap_or_else(|e| panic!("{} / {name}: {e}", s.name));
        assert!(cfg.redis.cluster);
        assert_eq!(
            cfg.data_api.endpoint, None,
            "{name}: the real Data API endpoint"
        );
        assert_eq!(
            cfg.dev_jwt_secret, None,
            "{name}: tokens are verified by API Gateway"
        );
        assert_eq!(cfg.data_api.database, s.params["DbName"]);
        if s.name == "existing resources" {
            assert_eq!(cfg.data_api.cluster_arn, s.params["ExistingDbClusterArn"]);
            assert_eq!(cfg.data_api.secret_arn, s.params["ExistingDbSecretArn"]);
            assert_eq!(cfg.redis.url, s.params["ExistingRedisUrl"]);
        }
    }
}

#[test]
fn order_drainer_starts_with_exactly_the_template_environment() {
    use order_drainer::config::{Config, MAX_BATCH_SIZE, env_vars};
    use seckill_shared::config::EnvReader;

    let t = template();
    let (name, f) = function_for_binary(&t, "order-drainer");
    let timeout = std::time::Duration::from_secs(
        function_property(&t, f, "Timeout")
            .and_then(Value::as_u64)
            .unwrap(),
    );
    for s in Scenario::all(&t) {
        let env = environment(&t, f, &s);
        check_names(name, &env, &env_vars());
        check_redis(name, &s, &env);
        assert!(
            !env.contains_key("DRAINER_VOUCHERS"),
            "{name}: drains the active set in AWS"
        );
        let cfg = Config::read(EnvReader::from_map(env.clone()))
            .unwrap_or_else(|e| panic!("{} / {name}: {e}", s.name));
        assert!(cfg.redis.cluster);
        assert_eq!(
            cfg.data_api.endpoint, None,
            "{name}: the real Data API endpoint"
        );
        assert_eq!(cfg.vouchers, None);
        // The timing the function really runs with, not just the strings.
        assert!(
            cfg.min_idle > timeout,
            "{}: min-idle {:?} <= timeout {timeout:?}",
            s.name,
            cfg.min_idle
        );
        assert!(
            cfg.max_run < timeout,
            "{}: max run {:?} >= timeout {timeout:?}",
            s.name,
            cfg.max_run
        );
        assert!(cfg.safety_margin < timeout);
        assert!((1..=MAX_BATCH_SIZE).contains(&cfg.batch_size));
        assert_eq!(cfg.batch_size.to_string(), s.params["DrainerBatchSize"]);
        assert_eq!(
            cfg.max_run.as_millis().to_string(),
            s.params["DrainerMaxRunMs"]
        );
    }
}

/// Hardening the template keeps: the database cannot be deleted by accident,
/// an existing cache is reached over TLS and its URL (which may hold a password) is never
/// echoed, and the admin route asks API Gateway for the admin scope too.
#[test]
fn the_database_is_protected_the_cache_is_tls_and_admin_routes_need_the_scope() {
    let t = template();
    let cluster = resources_of_type(&t, "AWS::RDS::DBCluster");
    assert_eq!(cluster.len(), 1);
    assert_eq!(
        get(at(cluster[0].1, &["Properties"]), "DeletionProtection").and_then(Value::as_bool),
        Some(true),
        "DeletionProtection on the Aurora cluster"
    );

    let redis = at(&t, &["Parameters", "ExistingRedisUrl"]);
    assert_eq!(get(redis, "NoEcho").and_then(Value::as_bool), Some(true));
    let pattern = regex_lite_like(str_of(at(redis, &["AllowedPattern"])));
    assert!(pattern("rediss://cache.example:6379") && pattern(""));
    assert!(
        !pattern("redis://cache.example:6379"),
        "plain redis:// must be refused"
    );
    // No output shows the parameter back.
    for (name, o) in at(&t, &["Outputs"]).as_mapping().unwrap() {
        let text = serde_yaml::to_string(at(o, &["Value"])).unwrap();
        assert!(
            !text.contains("Ref: ExistingRedisUrl") && !text.contains("!Ref ExistingRedisUrl"),
            "output {} echoes ExistingRedisUrl: {text}",
            str_of(name)
        );
    }

    let (_, http) = function_for_binary(&t, "seckill-http");
    let events = at(http, &["Properties", "Events"]).as_mapping().unwrap();
    let admin_routes: Vec<&Value> = events
        .values()
        .filter(|e| {
            let p = at(e, &["Properties"]);
            get(p, "Method").map(str_of).map(str::to_ascii_uppercase) == Some("POST".into())
                && get(p, "Path").map(str_of) == Some("/vouchers")
        })
        .collect();
    assert_eq!(admin_routes.len(), 1, "POST /vouchers is declared once");
    let scopes: Vec<&str> = at(
        admin_routes[0],
        &["Properties", "Auth", "AuthorizationScopes"],
    )
    .as_sequence()
    .expect("AuthorizationScopes is a list")
    .iter()
    .map(str_of)
    .collect();
    assert_eq!(scopes, vec![seckill_shared::auth::ADMIN_SCOPE]);
}

/// The template's `AllowedPattern` as CloudFormation applies it (the whole value must
/// match); the patterns here are anchored alternations of literal prefixes and `.+`.
fn regex_lite_like(pattern: &str) -> impl Fn(&str) -> bool + '_ {
    move |value: &str| {
        pattern
            .trim_start_matches('^')
            .trim_end_matches('$')
            .split('|')
            .map(|alt| alt.trim_start_matches('^').trim_end_matches('$'))
            .any(|alt| match alt.strip_suffix(".+") {
                Some(prefix) => value.starts_with(prefix) && value.len() > prefix.len(),
                None => value == alt,
            })
    }
}

/// The functions' security group lets out only Redis (6379) and HTTPS (443), each to the
/// group of what they talk to whenever the stack knows that group; an address range only
/// where no group can be named (an existing cache given without its group, the Data API
/// through a NAT gateway). AWS's default allow-all egress is replaced.
#[test]
fn function_egress_is_only_the_cache_and_the_data_api() {
    let t = template();
    let mut scenarios = Scenario::all(&t);
    scenarios.push(Scenario::new(
        &t,
        "existing cache without its group",
        &[
            (
                "ExistingRedisUrl",
                "rediss://existing.serverless.use1.cache.amazonaws.com:6379",
            ),
            ("ExistingRedisSecurityGroupId", ""),
        ],
    ));
    let placeholder = |r: &Value| {
        get(r, "IpProtocol").map(scalar_string).as_deref() == Some("-1")
            && get(r, "CidrIp").map(str_of) == Some("127.0.0.1/32")
    };
    for s in &scenarios {
        let e = Eval { t: &t, s };
        let group = at(resource(&t, "FunctionSecurityGroup"), &["Properties"]);
        let inline = at(group, &["SecurityGroupEgress"]).as_sequence().unwrap();
        assert!(
            inline.len() == 1 && placeholder(&inline[0]),
            "the inline egress is only the placeholder that removes the default rule"
        );
        // (port, destination): a group's name, or an address range.
        let mut rules: Vec<(String, String)> = Vec::new();
        for (name, r) in resources_of_type(&t, "AWS::EC2::SecurityGroupEgress") {
            if get(r, "Condition").is_some_and(|c| !e.condition(str_of(c))) {
                continue;
            }
            let p = at(r, &["Properties"]);
            let group_ref = intrinsic(at(p, &["GroupId"])).map(|(n, a)| (n, str_of(a).to_string()));
            assert_eq!(
                group_ref,
                Some(("Ref".into(), "FunctionSecurityGroup".into())),
                "{name}"
            );
            let from = scalar_string(at(p, &["FromPort"]));
            assert_eq!(from, scalar_string(at(p, &["ToPort"])), "{name}: one port");
            assert_eq!(scalar_string(at(p, &["IpProtocol"])), "tcp", "{name}");
            let to = match (get(p, "DestinationSecurityGroupId"), get(p, "CidrIp")) {
                (Some(g), None) => scalar_string(&e.value(g)),
                (None, Some(c)) => str_of(c).to_string(),
                other => panic!("{name}: one destination, found {other:?}"),
            };
            rules.push((from, to));
        }
        rules.sort();
        let want: Vec<(String, String)> = match s.name {
            "existing resources" => vec![
                ("443".into(), "0.0.0.0/0".into()),
                ("6379".into(), "sg-0123456789abcdef0".into()),
            ],
            "existing cache without its group" => vec![
                (
                    "443".into(),
                    scalar_string(&e.reference("DataApiEndpointSecurityGroup")),
                ),
                ("6379".into(), "0.0.0.0/0".into()),
            ],
            _ => {
                let mut v = vec![
                    (
                        "443".to_string(),
                        scalar_string(&e.reference("DataApiEndpointSecurityGroup")),
                    ),
                    (
                        "6379".to_string(),
                        scalar_string(&e.reference("CacheSecurityGroup")),
                    ),
                ];
                v.sort();
                v
            }
        };
        assert_eq!(rules, want, "{}: the functions' egress", s.name);
        if s.name != "existing resources" && s.name != "existing cache without its group" {
            assert!(
                rules.iter().all(|(_, to)| to != "0.0.0.0/0"),
                "{}: with the stack's own cache and endpoint nothing goes to any address",
                s.name
            );
        }
    }
}

/// The only route without a token (GET /vouchers/{id}) has its own route throttling,
/// below the stage's, and the function's per-source limit is configured from the
/// template.
#[test]
fn the_anonymous_route_has_its_own_lower_throttle() {
    let t = template();
    let (_, api) = resources_of_type(&t, "AWS::Serverless::HttpApi")[0];
    let settings = at(api, &["Properties", "RouteSettings"])
        .as_mapping()
        .unwrap();
    let anonymous: Vec<String> = seckill_http::routes::ROUTES
        .iter()
        .filter(|(_, _, token)| !token)
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect();
    let keys: Vec<String> = settings.keys().map(|k| str_of(k).to_string()).collect();
    assert_eq!(
        keys, anonymous,
        "route settings exactly for the routes without a token"
    );
    for s in Scenario::all(&t) {
        let e = Eval { t: &t, s: &s };
        let number = |v: &Value| scalar_string(&e.value(v)).parse::<f64>().unwrap();
        let stage = at(api, &["Properties", "DefaultRouteSettings"]);
        for route in settings.values() {
            for key in ["ThrottlingRateLimit", "ThrottlingBurstLimit"] {
                assert!(number(at(route, &[key])) > 0.0, "{}: {key}", s.name);
                if s.name == "created resources" {
                    assert!(
                        number(at(route, &[key])) < number(at(stage, &[key])),
                        "{}: the anonymous route's {key} is below the stage's",
                        s.name
                    );
                }
            }
        }
    }
}

/// The sale's alarms and dashboard read metrics the functions really write (the names of
/// shared/src/metrics.rs, namespace `seckill`), and the ones the operator needs exist.
#[test]
fn alarms_and_dashboard_use_the_metrics_the_functions_write() {
    use seckill_shared::metrics::{NAMESPACE, names};
    let t = template();
    // Alarms: (namespace, metric) of each, plain or inside metric math.
    let mut alarmed = Vec::new();
    for (name, alarm) in resources_of_type(&t, "AWS::CloudWatch::Alarm") {
        let p = at(alarm, &["Properties"]);
        let mut pairs = Vec::new();
        if let Some(m) = get(p, "MetricName") {
            pairs.push((
                str_of(at(p, &["Namespace"])).to_string(),
                str_of(m).to_string(),
            ));
        }
        for q in get(p, "Metrics")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            if let Some(stat) = get(q, "MetricStat") {
                let m = at(stat, &["Metric"]);
                pairs.push((
                    str_of(at(m, &["Namespace"])).to_string(),
                    str_of(at(m, &["MetricName"])).to_string(),
                ));
            }
        }
        assert!(!pairs.is_empty(), "{name} watches no metric");
        for (ns, metric) in pairs {
            if ns == NAMESPACE {
                assert!(
                    names::ALL.contains(&metric.as_str()),
                    "{name}: no metric {metric}"
                );
                alarmed.push(metric);
            }
        }
    }
    for want in [
        names::DRAIN_OLDEST_PENDING_AGE,
        names::DRAIN_DEAD_LETTERED,
        names::HTTP_5XX,
        names::DRAIN_LAG,
    ] {
        assert!(alarmed.iter().any(|m| m == want), "no alarm on {want}");
    }

    // The dashboard: its body (a Fn::Sub) is JSON once substituted, every ${...} names
    // something that exists, and every seckill metric it shows is written.
    let dashboards = resources_of_type(&t, "AWS::CloudWatch::Dashboard");
    assert_eq!(dashboards.len(), 1);
    let (_, arg) = intrinsic(at(dashboards[0].1, &["Properties", "DashboardBody"]))
        .expect("DashboardBody is a Fn::Sub");
    let parts = arg.as_sequence().expect("Fn::Sub [body, variables]");
    let (body, vars) = (str_of(&parts[0]), &parts[1]);
    let mut substituted = String::new();
    let mut rest = body;
    while let Some(i) = rest.find("${") {
        substituted.push_str(&rest[..i]);
        let end = rest[i..].find('}').unwrap() + i;
        let var = &rest[i + 2..end];
        assert!(
            var.starts_with("AWS::")
                || get(vars, var).is_some()
                || get(at(&t, &["Parameters"]), var).is_some()
                || get(at(&t, &["Resources"]), var).is_some(),
            "the dashboard names ${{{var}}}, which does not exist"
        );
        substituted.push('1');
        rest = &rest[end + 1..];
    }
    substituted.push_str(rest);
    let body: serde_json::Value =
        serde_json::from_str(&substituted).expect("the dashboard body is JSON");
    let mut shown = Vec::new();
    let mut services = Vec::new();
    for w in body["widgets"].as_array().expect("widgets") {
        for row in w["properties"]["metrics"].as_array().into_iter().flatten() {
            let row = row.as_array().expect("a metric row");
            match (row[0].as_str(), row.get(1).and_then(|v| v.as_str())) {
                (Some(ns), Some(metric)) if ns == NAMESPACE => shown.push(metric.to_string()),
                (Some(ns), Some(_)) => services.push(ns.to_string()),
                _ => {
                    let expr = row[0]["expression"].as_str().expect("an expression");
                    let metric = expr
                        .split("MetricName=\"")
                        .nth(1)
                        .and_then(|r| r.split('"').next())
                        .expect("a SEARCH naming its metric");
                    assert!(expr.contains(&format!("{{{NAMESPACE},outcome}}")), "{expr}");
                    shown.push(metric.to_string());
                }
            }
        }
    }
    for m in &shown {
        assert!(
            names::ALL.contains(&m.as_str()),
            "the dashboard shows unknown metric {m}"
        );
    }
    for want in [
        names::ADMISSIONS,
        names::DRAIN_INSERTED,
        names::DRAIN_LAG,
        names::DRAIN_OLDEST_PENDING_AGE,
        names::DRAIN_DEAD_LETTERED,
        names::REDIS_LATENCY,
    ] {
        assert!(
            shown.iter().any(|m| m == want),
            "the dashboard lacks {want}"
        );
    }
    for want in ["AWS/Lambda", "AWS/ElastiCache", "AWS/RDS"] {
        assert!(
            services.iter().any(|s| s == want),
            "the dashboard lacks {want}"
        );
    }
}

/// Least privilege for the database: the template makes the application
/// user's secret (username seckill_app, a password `seckill migrate` can write into
/// CREATE USER), both functions sign in with it (or with ExistingDbSecretArn, then the
/// application user's secret too) and may read only it; no function mentions the master
/// secret, which is an output for `seckill migrate` alone. seckill-http, which makes no
/// transaction but a read-only one, may not commit one.
#[test]
fn functions_use_the_application_user_secret_never_the_master_secret() {
    let t = template();
    let secret = resource(&t, "AppDbSecret");
    assert_eq!(str_of(at(secret, &["Type"])), "AWS::SecretsManager::Secret");
    assert_eq!(
        str_of(at(secret, &["Condition"])),
        "CreateDatabase",
        "made with the database it is for"
    );
    let generate = at(secret, &["Properties", "GenerateSecretString"]);
    let template_json: serde_json::Value =
        serde_json::from_str(str_of(at(generate, &["SecretStringTemplate"]))).unwrap();
    assert_eq!(
        template_json,
        serde_json::json!({"username": "seckill_app"})
    );
    assert_eq!(str_of(at(generate, &["GenerateStringKey"])), "password");
    assert!(at(generate, &["PasswordLength"]).as_u64().unwrap() >= 32);
    assert_eq!(
        at(generate, &["ExcludePunctuation"]).as_bool(),
        Some(true),
        "seckill migrate accepts letters and digits only"
    );
    seckill_shared::migrate::AppUser::new("seckill_app", &"aZ9".repeat(11))
        .expect("a generated password is accepted by seckill migrate");

    // No function's definition names the master secret.
    for (name, f) in resources_of_type(&t, "AWS::Serverless::Function") {
        let text = serde_yaml::to_string(f).unwrap();
        assert!(
            !text.contains("MasterUserSecret"),
            "{name} references the master secret:\n{text}"
        );
    }
    let master = Eval {
        t: &t,
        s: &Scenario::new(&t, "created resources", &[]),
    }
    .attribute("DbCluster", "MasterUserSecret.SecretArn");

    let by_function = data_api_actions_by_function(&t);
    assert!(
        !by_function["SeckillHttpFunction"].contains("rds-data:CommitTransaction"),
        "seckill-http ends its read-only snapshot with a rollback"
    );
    assert!(by_function["OrderDrainerFunction"].contains("rds-data:CommitTransaction"));
    let statements = policy_statements(&t);
    for s in Scenario::all(&t) {
        let eval = Eval { t: &t, s: &s };
        let app_secret = if s.name == "existing resources" {
            s.params["ExistingDbSecretArn"].clone()
        } else {
            scalar_string(&eval.reference("AppDbSecret"))
        };
        assert_ne!(app_secret, master);
        for binary in ["seckill-http", "order-drainer"] {
            let (name, f) = function_for_binary(&t, binary);
            let env = environment(&t, f, &s);
            assert_eq!(env["DB_SECRET_ARN"], app_secret, "{} / {name}", s.name);
            let secret_resources: Vec<String> = statements
                .iter()
                .filter(|(owner, _)| owner == name)
                .map(|(_, st)| eval.value(st))
                .filter(|st| !st.is_null())
                .filter(|st| {
                    strings(at(st, &["Action"]))
                        .iter()
                        .any(|a| a.starts_with("secretsmanager:"))
                })
                .flat_map(|st| strings(at(&st, &["Resource"])))
                .collect();
            // The application user's secret, and seckill-http's own webhook and
            // entry-token secrets.
            let mut expected = vec![app_secret.clone()];
            expected.extend(env.get("PAYMENT_WEBHOOK_SECRET_ARN").cloned());
            expected.extend(env.get("ENTRY_TOKEN_SECRET_ARN").cloned());
            // Stripe's key (both functions) and webhook secret (seckill-http).
            expected.extend(env.get("STRIPE_SECRET_KEY_ARN").cloned());
            expected.extend(env.get("STRIPE_WEBHOOK_SECRET_ARN").cloned());
            // The edge's origin secret (seckill-http, EnableEdge=true).
            expected.extend(env.get("EDGE_ORIGIN_SECRET_ARN").cloned());
            assert_eq!(secret_resources, expected, "{} / {name}", s.name);
            assert!(!secret_resources.contains(&master), "{} / {name}", s.name);
        }
        // The outputs name both secrets for `seckill migrate` (ARNs, never values).
        let outputs = at(&t, &["Outputs"]);
        let app_out = eval.string(at(outputs, &["DbAppSecretArn", "Value"]));
        assert_eq!(app_out, app_secret, "{}", s.name);
        if s.name != "existing resources" {
            let master_out = eval.string(at(outputs, &["DbMasterSecretArn", "Value"]));
            assert_eq!(master_out, master);
        }
        for (name, o) in outputs.as_mapping().unwrap() {
            let text = serde_yaml::to_string(at(o, &["Value"])).unwrap();
            assert!(
                !text.contains("SecretString") && !text.contains("resolve:secretsmanager"),
                "output {} shows a secret's value",
                str_of(name)
            );
        }
    }
}

// --------------------------------------------------------------------------------- edge

/// With the edge on (`EnableEdge=true`), the distribution passes the function what it
/// reads (the body's type, the providers' signatures, the entry token, the viewer's
/// address; the token as part of the cache key, never Host), keeps nothing the function
/// does not mark public, sends the very secret the function is told to demand, and its
/// web ACL answers over-limit clients the body the local gateway emulates, on the
/// parameter the local stack reads.
#[test]
fn the_edge_passes_what_the_function_reads_and_sends_the_secret_it_demands() {
    let t = template();
    let s = Scenario::new(&t, "edge", &[("EnableEdge", "true")]);
    let eval = Eval { t: &t, s: &s };
    let lower = |v: &Value| -> BTreeSet<String> {
        strings(v).iter().map(|h| h.to_ascii_lowercase()).collect()
    };
    let forwarded = lower(&eval.value(at(
        resource(&t, "EdgeOriginRequestPolicy"),
        &[
            "Properties",
            "OriginRequestPolicyConfig",
            "HeadersConfig",
            "Headers",
        ],
    )));
    for header in [
        "content-type",
        seckill_shared::webhook::SIGNATURE_HEADER,
        seckill_shared::webhook::stripe::SIGNATURE_HEADER,
        seckill_http::queue::ENTRY_HEADER,
        seckill_http::edge::VIEWER_HEADER,
    ] {
        assert!(
            forwarded.contains(header),
            "{header} is not passed: {forwarded:?}"
        );
    }
    assert!(
        !forwarded.contains("host"),
        "API Gateway routes on its own Host"
    );
    let cache = at(
        resource(&t, "EdgeCachePolicy"),
        &["Properties", "CachePolicyConfig"],
    );
    let keyed = lower(&eval.value(at(
        cache,
        &[
            "ParametersInCacheKeyAndForwardedToOrigin",
            "HeadersConfig",
            "Headers",
        ],
    )));
    assert_eq!(keyed, BTreeSet::from(["authorization".to_string()]));
    assert_eq!(
        at(cache, &["DefaultTTL"]).as_u64(),
        Some(0),
        "unmarked answers are not kept"
    );
    let max_age: u64 = seckill_http::vouchers::READ_CACHE_CONTROL
        .rsplit('=')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(at(cache, &["MaxTTL"]).as_u64().unwrap() >= max_age);

    let config = at(
        resource(&t, "EdgeDistribution"),
        &["Properties", "DistributionConfig"],
    );
    let origin = &at(config, &["Origins"]).as_sequence().unwrap()[0];
    let header = &at(origin, &["OriginCustomHeaders"]).as_sequence().unwrap()[0];
    assert_eq!(
        str_of(at(header, &["HeaderName"])).to_ascii_lowercase(),
        seckill_http::edge::EDGE_HEADER
    );
    let (_, f) = function_for_binary(&t, "seckill-http");
    let secret = environment(&t, f, &s)
        .remove("EDGE_ORIGIN_SECRET_ARN")
        .expect("seckill-http is told the edge's secret");
    assert_eq!(
        eval.string(at(header, &["HeaderValue"])),
        format!("{{{{resolve:secretsmanager:{secret}:SecretString}}}}")
    );
    assert_eq!(
        eval.string(at(config, &["WebACLId"])),
        eval.attribute("EdgeWebAcl", "Arn")
    );
    // Without the edge, the function is told no secret (and so serves every request).
    let plain = Scenario::new(&t, "no edge", &[]);
    assert!(!environment(&t, f, &plain).contains_key("EDGE_ORIGIN_SECRET_ARN"));

    let acl = at(resource(&t, "EdgeWebAcl"), &["Properties"]);
    let body = str_of(at(acl, &["CustomResponseBodies", "RateLimited", "Content"]));
    let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(parsed["code"], "rate_limited", "the API's own code");
    let gateway =
        std::fs::read_to_string(workspace_root().join("tools/api-gateway-local/src/lib.rs"))
            .unwrap();
    assert!(
        gateway.contains(&format!("r#\"{body}\"#")),
        "the local gateway answers the web ACL's body"
    );
    let rules = at(acl, &["Rules"]).as_sequence().unwrap();
    let reads = rules
        .iter()
        .find(|r| str_of(at(r, &["Name"])) == "anonymous-reads-per-client")
        .expect("a per-client rule on the anonymous reads");
    let limit = at(reads, &["Statement", "RateBasedStatement", "Limit"]);
    assert_eq!(
        intrinsic(limit).map(|(f, arg)| (f, str_of(arg).to_string())),
        Some(("Ref".to_string(), "EdgeReadsPerClientMinute".to_string()))
    );
    let stack = std::fs::read_to_string(workspace_root().join("scripts/stack.sh")).unwrap();
    assert!(stack.contains("template_default EdgeReadsPerClientMinute"));
}

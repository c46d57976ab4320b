//! The contract under a fuzzer nobody here wrote: schemathesis (pinned by
//! `scripts/setup.sh`) generates requests from `docs/openapi.yaml` in all its phases
//! (the document's examples, boundary coverage, random fuzzing, stateful sequences
//! following the document's links) and sends them to the running stack's
//! `SECKILL_HTTP_URL` (the local API Gateway in front of the function), with every check
//! on: no 5xx, statuses and bodies as documented, schema-valid requests accepted,
//! schema-violating ones refused, `405` with `Allow` for undeclared methods, created
//! resources reachable through their links.
//!
//! It runs once with an admin's token and once with a user's, with a fixed seed and a
//! bounded number of examples, so a failure reproduces and the run stays short.
//!
//! What the document cannot say in JSON Schema is named in one place,
//! `tests/schemathesis/hooks.py`, with the reason: the rules of `POST /vouchers` that
//! compare two fields or read the clock. The same file signs the positive cases of the
//! payment webhook with the stack's secret, as the provider would.

use std::process::Command;

use seckill_tests::api::Api;
use seckill_tests::pinned;
use seckill_tests::stack::{StackEnv, workspace_root};

/// Examples per operation and phase: enough to meet every rule the document states
/// (about 600 cases a run), few enough for a test.
const MAX_EXAMPLES: u32 = 40;
const SEED: u64 = 20_261_127;

/// One schemathesis run with `token`; panics with its report unless it found nothing.
fn run(who: &str, token: &str) {
    let stack = StackEnv::load();
    let st = pinned::tool(
        "schemathesis",
        "SCHEMATHESIS_VERSION",
        "st",
        "SECKILL_SCHEMATHESIS",
    );
    let root = workspace_root();
    // Its cache and reports go below its working directory: a folder of its own.
    let report = std::env::temp_dir().join(format!("seckill-schemathesis-{who}"));
    std::fs::create_dir_all(&report).expect("a report directory");
    let out = Command::new(&st)
        .arg("run")
        .arg(root.join("docs/openapi.yaml"))
        .args(["--url", &stack.seckill_http_url()])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", &MAX_EXAMPLES.to_string()])
        .args(["--seed", &SEED.to_string()])
        .args(["--workers", "2"])
        .args(["--request-timeout", "30"])
        .arg("--no-color")
        .arg("--report-dir")
        .arg(&report)
        .current_dir(&report)
        .env("SCHEMATHESIS_HOOKS", "hooks")
        .env("PYTHONPATH", root.join("tests/schemathesis"))
        .env(
            "SECKILL_PAYMENT_WEBHOOK_SECRET",
            stack.get("SECKILL_PAYMENT_WEBHOOK_SECRET"),
        )
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", st.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed") || l.contains("⚠"))
        .collect();
    eprintln!("schemathesis as {who}: {}", summary.join(" | "));
    assert!(
        out.status.success(),
        "schemathesis as {who} found failures (exit {:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
    // A run that tested nothing would pass too: it must have sent its cases.
    assert!(
        stdout.contains("generated") && !stdout.contains(" 0 generated"),
        "schemathesis as {who} generated no test case:\n{stdout}\n{stderr}"
    );
}

#[test]
fn contract_fuzz_as_an_admin_finds_nothing() {
    run("admin", &Api::new().token("fuzz-admin", true));
}

#[test]
fn contract_fuzz_as_a_user_finds_nothing() {
    run("user", &Api::new().token("fuzz-user", false));
}

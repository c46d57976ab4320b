//! `scripts/stack.sh up` run again on a running stack, as one does to bring back a
//! service that died, with none of the Redis selection variables set: it keeps the Redis
//! that runs (engine, version, topology, the very processes) and says so. Before, it fell
//! back to the default single node with its own data folder, and every undrained order
//! of a sale on the cluster vanished from the drainer's view. Runs on its own
//! (`scripts/test.sh`'s `SUITES_ALONE`): `up` rewrites `.dev/stack.env`, which other
//! suites read. In the cluster pass this is the real check; in the single pass it checks
//! that nothing restarts.

use std::collections::BTreeMap;
use std::process::Command;

use seckill_tests::StackEnv;
use seckill_tests::stack::workspace_root;

/// Every Redis pid file of the stack and the pid in it.
fn redis_pids() -> BTreeMap<String, String> {
    let dir = workspace_root().join(".dev/pids");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect(".dev/pids").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("redis") && name.ends_with(".pid") {
            let pid = std::fs::read_to_string(entry.path()).unwrap_or_default();
            out.insert(name, pid.trim().to_string());
        }
    }
    out
}

#[test]
fn up_again_without_a_selection_keeps_the_running_redis() {
    let before = StackEnv::load();
    let pids = redis_pids();
    assert!(!pids.is_empty(), "the stack runs Redis");
    let mut up = Command::new("bash");
    // Cargo sets CARGO_MANIFEST_DIR, CARGO_PKG_NAME, OUT_DIR, ... for this test process;
    // build scripts (ring's) rebuild when those differ between cargo runs, so the `cargo
    // build` inside `up` must not see them: it would rebuild half the dependency tree,
    // and the next plain build all of it again.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let per_package = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            || [
                "CARGO",
                "OUT_DIR",
                "CARGO_TARGET_TMPDIR",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&key.as_ref());
        if per_package {
            up.env_remove(key.as_ref());
        }
    }
    let out = up
        .arg(workspace_root().join("scripts/stack.sh"))
        .arg("up")
        .current_dir(workspace_root())
        .env_remove("SECKILL_REDIS_ENGINE")
        .env_remove("SECKILL_REDIS_TOPOLOGY")
        .env_remove("SECKILL_VALKEY_VERSION")
        .env_remove("SECKILL_REDIS_SERVER")
        .env("SECKILL_LAMBDA_RELOAD", "0")
        .output()
        .expect("scripts/stack.sh runs");
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "scripts/stack.sh up failed:\n{log}");
    let topology = before.get("SECKILL_REDIS_TOPOLOGY");
    assert!(
        log.contains("Redis keeps the topology it runs with")
            && log.contains(&format!("{topology} topology")),
        "up says it keeps the running Redis ({topology}):\n{log}"
    );
    let after = StackEnv::load();
    for key in [
        "SECKILL_REDIS_ENGINE",
        "SECKILL_REDIS_TOPOLOGY",
        "REDIS_NODES",
        "REDIS_URL",
    ] {
        assert_eq!(after.get(key), before.get(key), "{key} after `up` again");
    }
    assert_eq!(redis_pids(), pids, "the same Redis processes run on");
}

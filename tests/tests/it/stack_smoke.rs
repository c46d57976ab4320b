//! Smoke test of the local stack contract (`.dev/stack.env`, docs/local-stack.md):
//! one test per key, each proving the address really serves what it promises.
//! Needs a running stack: `scripts/stack.sh up` (or run everything with `scripts/test.sh`).

use std::time::Duration;

use mysql_async::prelude::Queryable;
use seckill_tests::StackEnv;

const TIMEOUT: Duration = Duration::from_secs(60);

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(TIMEOUT)
        .build()
        .expect("reqwest client")
}

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {TIMEOUT:?}"))
}

#[test]
fn stack_env_file_has_every_contract_key() {
    let path = seckill_tests::stack::workspace_root().join(".dev/stack.env");
    let path = std::env::var("SECKILL_STACK_ENV").map_or(path, Into::into);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; start the stack with `scripts/stack.sh up`",
            path.display()
        )
    });
    for key in [
        "SECKILL_HTTP_URL",
        "DRAINER_INVOKE_URL",
        "REDIS_URL",
        "MYSQL_URL",
        "DATA_API_URL",
        "SECKILL_DEV_JWT_SECRET",
    ] {
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .unwrap_or_else(|| panic!("{} has no {key}= line", path.display()));
        assert!(!value.trim().is_empty(), "{key} is empty");
    }
}

#[tokio::test]
async fn redis_url_answers_ping_and_cluster_is_ok() {
    let env = StackEnv::load();
    let url = env.redis_url();
    assert_eq!(
        env.get("REDIS_CLUSTER"),
        "true",
        "the local Redis runs in cluster mode"
    );
    let client = redis::cluster::ClusterClient::new(vec![url.as_str()])
        .unwrap_or_else(|e| panic!("cluster client for {url}: {e}"));
    let mut conn = within("cluster connect", client.get_async_connection())
        .await
        .unwrap_or_else(|e| panic!("connecting to {url} in cluster mode: {e}"));
    let pong: String = within("PING", redis::cmd("PING").query_async(&mut conn))
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");
    let info: String = within(
        "CLUSTER INFO",
        redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn),
    )
    .await
    .expect("CLUSTER INFO");
    assert!(
        info.lines().any(|l| l.trim() == "cluster_state:ok"),
        "CLUSTER INFO of {url}:\n{info}"
    );
    // A key round trip through the cluster client (routing by slot works).
    let key = format!("seckill:{{smoke}}:{}", std::process::id());
    let () = within(
        "SET",
        redis::cmd("SET")
            .arg(&key)
            .arg("1")
            .arg("EX")
            .arg(60)
            .query_async(&mut conn),
    )
    .await
    .expect("SET");
    let got: String = within("GET", redis::cmd("GET").arg(&key).query_async(&mut conn))
        .await
        .expect("GET");
    assert_eq!(got, "1");
}

/// `REDIS_NODES` are the whole of the selected topology, run by the selected engine:
/// one node owning every slot (`single`), or 3 primaries each with one replica online
/// (`cluster`); the first node (`REDIS_URL`) a primary; every node the server that
/// `SECKILL_REDIS_SERVER` names.
#[tokio::test]
async fn redis_nodes_are_the_selected_engine_and_topology() {
    let env = StackEnv::load();
    let (engine, topology) = (env.redis_engine(), env.redis_topology());
    let nodes = env.redis_nodes();
    // Nodes, and replicas of each primary.
    let (want_nodes, per_primary) = match topology.as_str() {
        "single" => (1, 0),
        "cluster" => (6, 1),
        other => panic!("SECKILL_REDIS_TOPOLOGY={other}: expected single or cluster"),
    };
    assert_eq!(
        nodes.len(),
        want_nodes,
        "REDIS_NODES for {topology}: {nodes:?}"
    );
    let seed = env.redis_url();
    assert!(
        seed.ends_with(&format!("//{}", nodes[0])),
        "REDIS_URL {seed} is not the first of REDIS_NODES {nodes:?}"
    );
    let server = env.redis_server_bin();
    let version = std::process::Command::new(&server)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("SECKILL_REDIS_SERVER {server} --version: {e}"));
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    let version = version
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("{server} --version names no version: {version}"))
        .to_string();
    let field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
            .map(str::to_string)
    };
    let (mut primaries, mut replicas) = (0, 0);
    for node in &nodes {
        let client = redis::Client::open(format!("redis://{node}"))
            .unwrap_or_else(|e| panic!("client for {node}: {e}"));
        let mut conn = within(node, client.get_multiplexed_async_connection())
            .await
            .unwrap_or_else(|e| panic!("connecting to {node}: {e}"));
        let info: String = within(
            node,
            redis::cmd("INFO").arg("server").query_async(&mut conn),
        )
        .await
        .unwrap_or_else(|e| panic!("INFO server on {node}: {e}"));
        let (name, node_version) = match field(&info, "server_name").as_deref() {
            Some("valkey") => ("valkey", field(&info, "valkey_version")),
            _ => ("redis", field(&info, "redis_version")),
        };
        assert_eq!(
            name, engine,
            "{node} runs {name}, SECKILL_REDIS_ENGINE is {engine}"
        );
        assert_eq!(
            node_version.as_deref(),
            Some(version.as_str()),
            "{node} runs another version than SECKILL_REDIS_SERVER {server}"
        );
        let cluster: String = within(
            node,
            redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn),
        )
        .await
        .unwrap_or_else(|e| panic!("CLUSTER INFO on {node}: {e}"));
        assert_eq!(
            field(&cluster, "cluster_state").as_deref(),
            Some("ok"),
            "{node}:\n{cluster}"
        );
        assert_eq!(
            field(&cluster, "cluster_known_nodes"),
            Some(want_nodes.to_string()),
            "{node}:\n{cluster}"
        );
        let repl: String = within(
            node,
            redis::cmd("INFO").arg("replication").query_async(&mut conn),
        )
        .await
        .unwrap_or_else(|e| panic!("INFO replication on {node}: {e}"));
        match field(&repl, "role").as_deref() {
            Some("master") => {
                primaries += 1;
                let replicas_online = repl
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count();
                assert_eq!(
                    replicas_online, per_primary,
                    "primary {node} should have {per_primary} replica(s) online:\n{repl}"
                );
            }
            Some("slave") => {
                replicas += 1;
                assert_eq!(
                    field(&repl, "master_link_status").as_deref(),
                    Some("up"),
                    "{node}:\n{repl}"
                );
            }
            other => panic!("{node} has role {other:?}"),
        }
        if node == &nodes[0] {
            assert_eq!(
                field(&repl, "role").as_deref(),
                Some("master"),
                "REDIS_URL {seed} is not a primary"
            );
        }
    }
    assert_eq!(
        (primaries, replicas),
        (
            want_nodes / (per_primary + 1),
            want_nodes - want_nodes / (per_primary + 1)
        ),
        "primaries and replicas of {nodes:?}"
    );
}

#[tokio::test]
async fn mysql_url_connects_and_has_the_schema() {
    let env = StackEnv::load();
    let url = env.mysql_url();
    let opts = mysql_async::Opts::from_url(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let mut conn = within("mysql connect", mysql_async::Conn::new(opts))
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    let tables: Vec<String> = within(
        "list tables",
        conn.query(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() ORDER BY 1",
        ),
    )
    .await
    .expect("listing tables");
    for want in ["vouchers", "orders"] {
        assert!(
            tables.iter().any(|t| t == want),
            "table {want} missing in {url} (tables: {tables:?}); migrations not applied?"
        );
    }
    let tz: String = within("time zone", conn.query_first("SELECT @@time_zone"))
        .await
        .expect("SELECT @@time_zone")
        .expect("one row");
    assert_eq!(tz, "+00:00", "the local server runs in UTC");
    conn.disconnect().await.expect("disconnect");
}

#[tokio::test]
async fn data_api_url_executes_select_1() {
    use aws_sdk_rdsdata::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_rdsdata::types::Field;

    let env = StackEnv::load();
    let url = env.data_api_url();
    let conf = aws_sdk_rdsdata::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "smoke"))
        .endpoint_url(&url)
        .build();
    let client = aws_sdk_rdsdata::Client::from_conf(conf);
    let out = within(
        "ExecuteStatement",
        client
            .execute_statement()
            .resource_arn(env.get("DB_CLUSTER_ARN"))
            .secret_arn(env.get("DB_SECRET_ARN"))
            .database(env.get("DB_NAME"))
            .sql("SELECT 1")
            .send(),
    )
    .await
    .unwrap_or_else(|e| panic!("ExecuteStatement SELECT 1 at {url}: {e:?}"));
    let records = out.records();
    assert_eq!(records.len(), 1, "one row: {out:?}");
    assert_eq!(records[0].len(), 1, "one column: {out:?}");
    assert_eq!(records[0][0], Field::LongValue(1), "{out:?}");
}

#[tokio::test]
async fn seckill_http_url_serves_json() {
    let env = StackEnv::load();
    let base = env.seckill_http_url();
    let url = format!("{}/vouchers/1", base.trim_end_matches('/'));
    let resp = http()
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = resp.text().await.expect("body");
    assert!(
        content_type.starts_with("application/json"),
        "GET {url}: content-type {content_type:?}, status {status}, body {text}"
    );
    let body: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("GET {url}: body is not JSON ({e}): {text}"));
    // The shared database may hold a voucher 1 created by another suite.
    match status.as_u16() {
        404 => assert_eq!(body["code"], "not_found", "GET {url}: {body}"),
        200 => assert_eq!(body["id"], "1", "GET {url}: {body}"),
        other => panic!("GET {url}: status {other}, body {body}"),
    }
}

#[tokio::test]
async fn drainer_invoke_url_accepts_a_scheduled_event() {
    let env = StackEnv::load();
    let url = env.drainer_invoke_url();
    let event = std::fs::read_to_string(
        seckill_tests::stack::workspace_root().join("tests/fixtures/eventbridge-scheduled.json"),
    )
    .expect("tests/fixtures/eventbridge-scheduled.json");
    // The functions write their EMF metrics to stdout, which lands in the emulator's log
    // as it lands in CloudWatch Logs in AWS: a run adds its document there.
    let log = seckill_tests::stack::workspace_root().join(".dev/logs/lambda.log");
    let log_len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let resp = http()
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(event)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    assert_eq!(status.as_u16(), 200, "POST {url}: {text}");
    let t0 = std::time::Instant::now();
    let document = loop {
        let bytes = std::fs::read(&log).unwrap_or_default();
        let new = String::from_utf8_lossy(bytes.get(log_len as usize..).unwrap_or(&[]));
        let found = new.lines().find_map(|l| {
            let doc: serde_json::Value = serde_json::from_str(&l[l.find("{\"_aws\"")?..]).ok()?;
            doc.get(seckill_shared::metrics::names::DRAIN_RUN_TIME)?;
            Some(doc)
        });
        if let Some(doc) = found {
            break doc;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "no EMF document of the drainer run in {}",
            log.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        document["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        seckill_shared::metrics::NAMESPACE,
        "{document}"
    );
}

#[test]
fn dev_jwt_secret_is_set() {
    let secret = StackEnv::load().dev_jwt_secret();
    assert!(
        secret.len() >= 32,
        "SECKILL_DEV_JWT_SECRET is too short ({} bytes)",
        secret.len()
    );
}

/// The local secrets (the dev JWT secret, passwords inside URLs) are this user's alone:
/// `.dev` and the files the stack wrote into it are not readable by group or others.
#[test]
fn local_secrets_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dev = seckill_tests::stack::workspace_root().join(".dev");
    for path in [
        dev.clone(),
        dev.join("stack.env"),
        dev.join("functions.env"),
        dev.join("jwt-secret"),
    ] {
        let mode = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "{} is mode {:o}",
            path.display(),
            mode & 0o777
        );
    }
}

/// Least privilege: `DB_SECRET_ARN`, the secret the functions under the
/// watch are given, is the application user's, not the master secret that `seckill
/// migrate` uses; through the Data API it signs in as `seckill_app`, which may not
/// drop or delete, and Secrets Manager (`SECRETS_MANAGER_URL`) hands out its password.
#[tokio::test]
async fn the_functions_sign_in_as_the_application_user() {
    use seckill_shared::adapters::data_api::{DataApi, field};
    use seckill_shared::config::DataApiConfig;
    use seckill_shared::error::StoreError;

    let env = StackEnv::load();
    let app = env.get("DB_SECRET_ARN");
    let master = env.get("DB_MASTER_SECRET_ARN");
    assert_ne!(app, master, "the functions must not get the master secret");
    assert_eq!(env.get("DB_APP_SECRET_ARN"), app);
    let functions_env = seckill_tests::stack::workspace_root().join(".dev/functions.env");
    let functions_env = std::fs::read_to_string(&functions_env)
        .unwrap_or_else(|e| panic!("{}: {e}", functions_env.display()));
    assert!(
        functions_env
            .lines()
            .any(|l| l == format!("DB_SECRET_ARN={app}")),
        "the functions under cargo lambda watch get DB_SECRET_ARN={app}"
    );
    assert!(
        !functions_env
            .lines()
            .any(|l| l.split_once('=').is_some_and(|(_, v)| v == master)),
        "no function sees the master secret"
    );

    let db = DataApi::connect(&DataApiConfig {
        cluster_arn: env.get("DB_CLUSTER_ARN"),
        secret_arn: app.clone(),
        database: env.get("DB_NAME"),
        endpoint: Some(env.data_api_url()),
        timeout: TIMEOUT,
    })
    .await;
    let out = within(
        "SELECT CURRENT_USER()",
        db.execute("SELECT CURRENT_USER()", vec![], None),
    )
    .await
    .expect("the application user signs in");
    let user = field::string(&out.records()[0][0]).unwrap();
    assert!(user.starts_with("seckill_app@"), "signed in as {user}");
    within(
        "SELECT FROM orders",
        db.execute("SELECT COUNT(*) FROM orders", vec![], None),
    )
    .await
    .expect("it reads orders");
    // Statements that would change nothing if allowed; refused for lack of a privilege.
    for sql in [
        "DROP TABLE IF EXISTS no_such_table_for_smoke",
        "DELETE FROM orders WHERE 1 = 0",
    ] {
        match within(sql, db.execute(sql, vec![], None)).await {
            Err(StoreError::Database(m)) if m.to_ascii_lowercase().contains("denied") => {}
            other => panic!("{sql}: the application user must be refused, got {other:?}"),
        }
    }
    let secret = seckill_cli::migrate::read_app_user(&app, Some(&env.get("SECRETS_MANAGER_URL")))
        .await
        .expect("GetSecretValue for the application user's secret");
    assert_eq!(secret.username, "seckill_app");
}

/// Without reload (`SECKILL_LAMBDA_RELOAD` unset or 0: how the tests and the benchmarks
/// run the stack), `cargo lambda watch` watches nothing of the workspace. It puts an
/// inotify watch on every directory below its working directory whatever its flags, and
/// from the workspace root (5,290 watches there, `target/` and `.dev/` included) its
/// watcher woke on every write of the stack's MariaDB, Redis and logs: up to a fifth of
/// a CPU taken from whatever else ran on it.
#[test]
fn the_lambda_watch_watches_no_workspace_directory_without_reload() {
    let pids = seckill_tests::stack::workspace_root().join(".dev/pids");
    let read = |name: &str| {
        std::fs::read_to_string(pids.join(name)).unwrap_or_else(|e| {
            panic!(
                "{name} in {}: {e}; start the stack with `scripts/stack.sh up`",
                pids.display()
            )
        })
    };
    let stamp = read("lambda.stamp");
    if !stamp.split_whitespace().any(|w| w == "reload=0") {
        eprintln!(
            "the watch reloads (SECKILL_LAMBDA_RELOAD=1): it watches the workspace by design"
        );
        return;
    }
    let pid = read("lambda.pid");
    let fdinfo = std::path::Path::new("/proc")
        .join(pid.trim())
        .join("fdinfo");
    let mut watches = 0;
    for entry in std::fs::read_dir(&fdinfo)
        .expect("the watch's /proc fdinfo")
        .flatten()
    {
        // A descriptor closed meanwhile is simply gone.
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        watches += text
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count();
    }
    let cwd = std::fs::read_link(std::path::Path::new("/proc").join(pid.trim()).join("cwd"))
        .expect("the watch's working directory");
    assert!(
        watches < 20,
        "cargo lambda watch (pid {}) holds {watches} inotify watches from {}",
        pid.trim(),
        cwd.display()
    );
    assert_ne!(
        cwd,
        seckill_tests::stack::workspace_root(),
        "the watch runs from the workspace root"
    );
}

/// 300 requests sent at once through the local API Gateway all get an answer. cargo
/// lambda watch 1.9 wedges for good once 100 invocations of one function wait in its
/// queue (docs/local-stack.md, "Past 100 requests in flight"); the gateway keeps fewer
/// than that in flight and lets the rest wait their turn. Without that bound this test
/// never finishes (and the stack answers nothing more until restarted).
#[tokio::test]
async fn three_hundred_requests_at_once_all_get_an_answer() {
    use seckill_tests::api::Api;
    let api = Api::new();
    let (status, voucher) = api
        .call(
            "POST",
            "/vouchers",
            Some(&api.token("ops", true)),
            Some(serde_json::json!({
                "title": "burst",
                "stock": 10,
                "begins_at": "2020-01-01T00:00:00Z",
                "ends_at": "2099-01-01T00:00:00Z",
            })),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{voucher}");
    let url = format!(
        "{}/vouchers/{}",
        api.base().trim_end_matches('/'),
        voucher["id"].as_str().expect("a decimal id")
    );
    // Fresh connections, all sent before any answer can come back.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("reqwest client");
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(300));
    let calls: Vec<_> = (0..300)
        .map(|_| {
            let (client, url, start) = (client.clone(), url.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                match client.get(&url).send().await {
                    Ok(res) => Ok(res.status().as_u16()),
                    Err(e) => Err(e.to_string()),
                }
            })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::new();
    for call in calls {
        let answer = within("300 requests at once", call)
            .await
            .expect("the request task");
        *statuses.entry(answer).or_insert(0) += 1;
    }
    // The function's own limit on anonymous reads may answer some 429 (an answer all
    // the same); nothing may time out or come back 5xx from the gateway.
    let answered: u32 = [Ok(200), Ok(429)]
        .iter()
        .map(|s| statuses.get(s).copied().unwrap_or(0))
        .sum();
    assert_eq!(
        answered, 300,
        "every request answered 200 or 429: {statuses:?}"
    );
    assert!(statuses.contains_key(&Ok(200)), "{statuses:?}");
    // And the stack still answers afterwards: through the gateway to the function and
    // Redis (an operator's read: the anonymous reads of this address may be spent).
    let (status, body) = api
        .call("GET", "/status", Some(&api.token("ops", true)), None)
        .await;
    assert_eq!(status.as_u16(), 200, "{body}");
}

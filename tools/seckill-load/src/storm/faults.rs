//! The storm's machinery around the sale: drainers run as the schedule runs them (the
//! stack's function through its invoke URL) and beside them (`order-drainer --once`
//! processes, overlapping, some killed with SIGKILL mid-run), and the faults of the plan:
//! a database outage and lost answers (data-api-local's `/_local/faults`), a graceful
//! primary failover and a slot move on the cluster stack. Everything a fault changed is
//! put back by [`Machinery::restore`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::json;

use super::plan::Fault;

/// What the drainers did.
#[derive(Debug, Default, Serialize)]
pub struct DrainerCounts {
    /// Scheduled runs through the invoke URL, and those answered with an error.
    pub scheduled: u64,
    pub scheduled_failed: u64,
    /// `order-drainer --once` runs beside them, and those killed with SIGKILL.
    pub overlapping: u64,
    pub killed: u64,
}

/// Drainers, faults, and what to put back.
pub struct Machinery {
    http: reqwest::Client,
    invoke_url: String,
    data_api_url: String,
    drainer_bin: PathBuf,
    drainer_env: Vec<(String, String)>,
    /// Redis nodes (`127.0.0.1:port`), and whether they form several shards.
    nodes: Vec<String>,
    stop: AtomicBool,
    scheduled: AtomicU64,
    scheduled_failed: AtomicU64,
    overlapping: AtomicU64,
    killed: AtomicU64,
    /// Slots moved: slot → the node id that served it first.
    moved: std::sync::Mutex<HashMap<u16, String>>,
    /// A failover happened: the stack's first three nodes are made primaries again.
    failed_over: AtomicBool,
}

/// The claim threshold of the storm's own drainer runs: longer than any run lasts
/// (`DRAINER_MAX_RUN_MS` 2 s), short enough that a killed run's entries come back
/// within the storm.
const MIN_IDLE_MS: &str = "8000";

impl Machinery {
    pub fn new(
        env: &seckill_cli::stack_env::StackEnv,
        drainer_bin: PathBuf,
    ) -> anyhow::Result<Machinery> {
        let functions_env = env
            .path()
            .and_then(|p| p.parent())
            .map(|d| d.join("functions.env"))
            .context(
                "no stack file (.dev/stack.env) was found: the storm runs the functions' \
                 drainer with the stack's functions.env beside it; start the stack with \
                 scripts/stack.sh up",
            )?;
        let text = std::fs::read_to_string(&functions_env)
            .with_context(|| format!("reading {}", functions_env.display()))?;
        let mut drainer_env: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| !k.trim().is_empty() && !k.starts_with('#'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .filter(|(k, _)| k != "DRAINER_MIN_IDLE_MS" && k != "DRAINER_MAX_RUN_MS")
            .collect();
        drainer_env.push(("DRAINER_MIN_IDLE_MS".into(), MIN_IDLE_MS.into()));
        drainer_env.push(("DRAINER_MAX_RUN_MS".into(), "2000".into()));
        drainer_env.push(("RUST_LOG".into(), "warn".into()));
        Ok(Machinery {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            invoke_url: env.get("DRAINER_INVOKE_URL")?,
            data_api_url: env.get("DATA_API_URL")?,
            drainer_bin,
            drainer_env,
            nodes: env.redis_nodes()?,
            stop: AtomicBool::new(false),
            scheduled: AtomicU64::new(0),
            scheduled_failed: AtomicU64::new(0),
            overlapping: AtomicU64::new(0),
            killed: AtomicU64::new(0),
            moved: std::sync::Mutex::default(),
            failed_over: AtomicBool::new(false),
        })
    }

    /// Whether the stack's Redis has several primaries.
    pub fn cluster(&self) -> bool {
        self.nodes.len() > 1
    }

    pub fn counts(&self) -> DrainerCounts {
        DrainerCounts {
            scheduled: self.scheduled.load(Ordering::Relaxed),
            scheduled_failed: self.scheduled_failed.load(Ordering::Relaxed),
            overlapping: self.overlapping.load(Ordering::Relaxed),
            killed: self.killed.load(Ordering::Relaxed),
        }
    }

    /// Runs the drainers until [`stop_drainers`](Self::stop_drainers): the scheduled
    /// function every second, and an `order-drainer --once` beside it every 1.5 s.
    pub async fn drain_while_running(self: Arc<Self>) {
        let scheduled = {
            let m = self.clone();
            async move {
                while !m.stop.load(Ordering::Relaxed) {
                    m.scheduled_run().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let beside = {
            let m = self.clone();
            async move {
                while !m.stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    let _ = m.drain_once(None).await;
                }
            }
        };
        tokio::join!(scheduled, beside);
    }

    pub fn stop_drainers(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// One run of the stack's drainer function, as the schedule invokes it.
    pub async fn scheduled_run(&self) {
        let event = json!({
            "version": "0", "id": uuid_like(), "detail-type": "Scheduled Event",
            "source": "aws.events", "account": "000000000000",
            "time": "2026-01-01T00:00:00Z", "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:000000000000:rule/seckill-order-drainer"],
            "detail": {}
        });
        self.scheduled.fetch_add(1, Ordering::Relaxed);
        let ok = match self.http.post(&self.invoke_url).json(&event).send().await {
            Ok(res) => {
                let failed = !res.status().is_success()
                    || res.headers().contains_key("x-amz-function-error");
                let body: serde_json::Value = res.json().await.unwrap_or_default();
                !failed && body["errors"].as_u64() == Some(0)
            }
            Err(_) => false,
        };
        if !ok {
            self.scheduled_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One `order-drainer --once` run; killed with SIGKILL after `kill_after` if given.
    /// `Ok(true)`: it ran to its end and reported no error.
    pub async fn drain_once(&self, kill_after: Option<Duration>) -> anyhow::Result<bool> {
        let mut child = tokio::process::Command::new(&self.drainer_bin)
            .arg("--once")
            .env_clear()
            .envs(self.drainer_env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.drainer_bin.display()))?;
        self.overlapping.fetch_add(1, Ordering::Relaxed);
        if let Some(after) = kill_after {
            tokio::time::sleep(after).await;
            if child.try_wait()?.is_none() {
                child.start_kill()?;
                self.killed.fetch_add(1, Ordering::Relaxed);
            }
            child.wait().await?;
            return Ok(false);
        }
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .context("order-drainer --once did not finish within 60 s")??;
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        Ok(out.status.success() && summary["errors"].as_u64() == Some(0))
    }

    /// Starts `fault` (those with a duration end by themselves); `buckets` maps a
    /// bucket index to the hash slot of its keys.
    pub async fn inject(&self, fault: &Fault, slot_of: impl Fn(u16) -> u16) -> anyhow::Result<()> {
        match fault {
            Fault::KillDrainer { after } => {
                self.drain_once(Some(*after)).await?;
            }
            Fault::DatabaseOutage { lasting } => {
                self.faults(json!({"outage_ms": lasting.as_millis() as u64}))
                    .await?;
            }
            Fault::LostAnswers { per_mille, lasting } => {
                self.faults(
                    json!({"lose_answers_per_mille": per_mille, "seed": rand::random::<u32>()}),
                )
                .await?;
                tokio::time::sleep(*lasting).await;
                self.faults(json!({"lose_answers_per_mille": 0})).await?;
            }
            Fault::Failover { bucket } => self.failover(slot_of(*bucket)).await?,
            Fault::MoveSlot { bucket } => self.move_slot(slot_of(*bucket)).await?,
        }
        Ok(())
    }

    /// Sets data-api-local's faults.
    async fn faults(&self, body: serde_json::Value) -> anyhow::Result<()> {
        let url = format!("{}/_local/faults", self.data_api_url.trim_end_matches('/'));
        let res = self.http.post(&url).json(&body).send().await?;
        if !res.status().is_success() {
            bail!(
                "{url} answered {} (is data-api-local started with --fault-control? scripts/stack.sh up)",
                res.status()
            );
        }
        Ok(())
    }

    /// Ends every fault: no outage, no lost answers, every moved slot back where it was,
    /// the stack's first three nodes primaries again.
    pub async fn restore(&self) -> anyhow::Result<()> {
        self.faults(json!({"outage_ms": 0, "lose_answers_per_mille": 0}))
            .await?;
        let moved: Vec<(u16, String)> = self.moved.lock().expect("moved").drain().collect();
        for (slot, home) in moved {
            self.move_slot_to(slot, &home).await?;
        }
        if self.failed_over.load(Ordering::Relaxed) {
            for node in self.nodes.iter().take(3) {
                let n = Node::of(&self.nodes, node).await?;
                if !n.primary {
                    let _: () = redis::cmd("CLUSTER")
                        .arg("FAILOVER")
                        .query_async(&mut admin(node).await?)
                        .await?;
                    wait_primary(node).await?;
                }
            }
        }
        Ok(())
    }

    /// The cluster's nodes now, and the primary serving `slot`.
    async fn primary_of(&self, slot: u16) -> anyhow::Result<(Vec<Node>, Node)> {
        let nodes = cluster_nodes(&self.nodes[0]).await?;
        let owner = nodes
            .iter()
            .find(|n| n.primary && n.serves(slot))
            .cloned()
            .context("the slot's primary")?;
        Ok((nodes, owner))
    }

    /// A graceful `CLUSTER FAILOVER`: the replica of the primary serving `slot` takes over.
    async fn failover(&self, slot: u16) -> anyhow::Result<()> {
        let (nodes, owner) = self.primary_of(slot).await?;
        let replica = nodes
            .iter()
            .find(|n| !n.primary && n.master == owner.id && !n.failed)
            .context("a replica of the slot's primary")?;
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query_async(&mut admin(&replica.addr).await?)
            .await?;
        self.failed_over.store(true, Ordering::Relaxed);
        wait_primary(&replica.addr).await
    }

    /// Moves `slot` to another primary, key by key, as `redis-cli --cluster reshard`.
    async fn move_slot(&self, slot: u16) -> anyhow::Result<()> {
        let (nodes, owner) = self.primary_of(slot).await?;
        let to = nodes
            .iter()
            .find(|n| n.primary && n.id != owner.id && !n.failed)
            .context("another primary")?;
        self.moved
            .lock()
            .expect("moved")
            .entry(slot)
            .or_insert_with(|| owner.id.clone());
        self.move_slot_to(slot, &to.id).await
    }

    async fn move_slot_to(&self, slot: u16, to_id: &str) -> anyhow::Result<()> {
        let (nodes, from) = self.primary_of(slot).await?;
        if from.id == to_id {
            return Ok(());
        }
        let to = nodes
            .iter()
            .find(|n| n.id == to_id)
            .context("the target node")?;
        let (mut src, mut dst) = (admin(&from.addr).await?, admin(&to.addr).await?);
        setslot(&mut dst, slot, "IMPORTING", &from.id).await?;
        setslot(&mut src, slot, "MIGRATING", &to.id).await?;
        let (host, port) = to.addr.split_once(':').context("host:port")?;
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(10)
                .query_async(&mut src)
                .await?;
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg(host)
                .arg(port)
                .arg("")
                .arg(0)
                .arg(10_000)
                .arg("KEYS");
            for k in &keys {
                migrate.arg(k);
            }
            let _: redis::Value = migrate.query_async(&mut src).await?;
            // A pace buyers meet ASK and TRYAGAIN at for a while.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for n in nodes.iter().filter(|n| n.primary && !n.failed) {
            setslot(&mut admin(&n.addr).await?, slot, "NODE", &to.id).await?;
        }
        Ok(())
    }
}

fn uuid_like() -> String {
    format!("{:032x}", rand::random::<u128>())
}

async fn admin(addr: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

async fn setslot(
    conn: &mut redis::aio::MultiplexedConnection,
    slot: u16,
    how: &str,
    id: &str,
) -> anyhow::Result<()> {
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(how)
        .arg(id)
        .query_async(conn)
        .await
        .with_context(|| format!("CLUSTER SETSLOT {slot} {how}"))?;
    Ok(())
}

/// Waits until the node at `addr` calls itself a primary.
async fn wait_primary(addr: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut admin(addr).await?)
            .await?;
        if info.lines().any(|l| l.trim() == "role:master") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{addr} did not become a primary within 20 s")
}

/// A line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Node {
    id: String,
    addr: String,
    primary: bool,
    failed: bool,
    master: String,
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }

    /// The node at `addr`, as the cluster sees it now.
    async fn of(nodes: &[String], addr: &str) -> anyhow::Result<Node> {
        cluster_nodes(&nodes[0])
            .await?
            .into_iter()
            .find(|n| n.addr == addr)
            .with_context(|| format!("{addr} in CLUSTER NODES"))
    }
}

async fn cluster_nodes(addr: &str) -> anyhow::Result<Vec<Node>> {
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut admin(addr).await?)
        .await?;
    Ok(text.lines().filter_map(parse_node).collect())
}

fn parse_node(line: &str) -> Option<Node> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    let addr = f[1].split('@').next()?.to_string();
    let flags = f[2];
    let slots = f[8..]
        .iter()
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|x| (x, x)),
        })
        .collect();
    Some(Node {
        id: f[0].to_string(),
        addr,
        primary: flags.contains("master"),
        failed: flags.contains("fail"),
        master: f[3].to_string(),
        slots,
    })
}

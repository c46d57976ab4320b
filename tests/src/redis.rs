//! A private Redis or Valkey per test: real servers on free loopback ports, always in
//! cluster mode, so scripts run under the same cross-slot rules as ElastiCache
//! Serverless (which runs Valkey as a sharded cluster).
//!
//! [`RedisServer::start`] follows the run's settings ([`RedisSettings`]): one node owning
//! every slot (`single`, the default), or a cluster of three primaries (`cluster`), of
//! the engine and server binary chosen. [`RedisServer::cluster`] starts a cluster with
//! replicas for failover tests. Stopped when dropped; [`RedisServer::restart`] kills every
//! node and brings it back from its last snapshot, to test what survives lost writes.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use seckill_shared::adapters::redis::RedisConn;
use seckill_shared::config::RedisConfig;

use crate::stack::StackEnv;

/// The server a run tests against: which engine, in which topology, from which binary.
///
/// Read from the process environment first, then from `.dev/stack.env` (which
/// `scripts/stack.sh` writes):
///
/// - `SECKILL_REDIS_ENGINE`: `redis` (default) or `valkey`;
/// - `SECKILL_REDIS_TOPOLOGY`: `single` (default: one node owning every slot) or
///   `cluster` (three primaries, no replicas);
/// - `SECKILL_REDIS_SERVER`: the server binary (default `redis-server`, or
///   `valkey-server` for Valkey, on `PATH`).
///
/// Every server started is checked to be of the engine named, so a run that claims
/// Valkey cannot quietly test Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub engine: Engine,
    pub topology: Topology,
    pub server: PathBuf,
}

/// A server engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Redis,
    Valkey,
}

/// How [`RedisServer::start`] lays a server out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One node owning all 16384 slots.
    Single,
    /// Three primaries (slots 0-5460, 5461-10922, 10923-16383), no replicas.
    Cluster,
}

impl RedisSettings {
    /// This run's settings (read once per process).
    ///
    /// # Panics
    /// On a value that is not one of those listed above.
    pub fn get() -> &'static RedisSettings {
        static SETTINGS: OnceLock<RedisSettings> = OnceLock::new();
        SETTINGS.get_or_init(|| {
            let stack = StackEnv::load();
            let setting = |key: &str| {
                std::env::var(key)
                    .ok()
                    .or_else(|| stack.get_opt(key))
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
            };
            let engine = match setting("SECKILL_REDIS_ENGINE").as_deref() {
                None | Some("redis") => Engine::Redis,
                Some("valkey") => Engine::Valkey,
                Some(other) => {
                    panic!("SECKILL_REDIS_ENGINE={other:?}: expected `redis` or `valkey`")
                }
            };
            let topology = match setting("SECKILL_REDIS_TOPOLOGY").as_deref() {
                None | Some("single") => Topology::Single,
                Some("cluster") => Topology::Cluster,
                Some(other) => {
                    panic!("SECKILL_REDIS_TOPOLOGY={other:?}: expected `single` or `cluster`")
                }
            };
            let server = setting("SECKILL_REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(match engine {
                        Engine::Redis => "redis-server",
                        Engine::Valkey => "valkey-server",
                    })
                });
            RedisSettings {
                engine,
                topology,
                server,
            }
        })
    }
}

/// What is started: binary, engine, TLS, and the cluster's shape.
#[derive(Debug, Clone)]
struct Spec {
    server: PathBuf,
    engine: Engine,
    tls: bool,
    primaries: usize,
    replicas_per_primary: usize,
    /// `cluster-node-timeout` in ms; `None` keeps the server's default (15 s).
    node_timeout_ms: Option<u64>,
    /// How far the nodes' clocks run ahead of this machine's (libfaketime), if at all.
    clock_ahead_s: Option<u64>,
}

impl Spec {
    fn nodes(&self) -> usize {
        self.primaries * (1 + self.replicas_per_primary)
    }
}

/// One server process of a [`RedisServer`].
struct Node {
    port: u16,
    /// The cluster bus port (`cluster-port`).
    bus_port: u16,
    dir: PathBuf,
    /// `None` once killed.
    child: Option<Child>,
}

impl Node {
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The role of a node, as the node itself sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Primary,
    /// A replica of the primary with this cluster node id.
    Replica {
        primary_id: String,
    },
}

/// A running node of a [`RedisServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub port: u16,
    /// The cluster node id (`CLUSTER MYID`).
    pub id: String,
    pub role: Role,
}

/// A private Redis or Valkey, one node or a cluster of several, owned by a test.
pub struct RedisServer {
    spec: Spec,
    /// Holds every node's directory (and the TLS certificates).
    dir: PathBuf,
    /// Primaries first, in slot order, then the replicas.
    nodes: Vec<Node>,
}

impl RedisServer {
    /// Starts this run's server ([`RedisSettings`]): one node owning every slot, or three
    /// primaries, of the engine and binary chosen; returns once the cluster accepts
    /// commands.
    ///
    /// # Panics
    /// When the server binary is missing, is not of the engine named, or the cluster does
    /// not come up.
    pub fn start() -> RedisServer {
        RedisServer::primaries(match RedisSettings::get().topology {
            Topology::Single => 1,
            Topology::Cluster => 3,
        })
    }

    /// Starts one node owning every slot, of this run's engine and binary, whatever the
    /// topology setting (for what only runs on such a node, like the load tool's
    /// tutorial baseline).
    pub fn single() -> RedisServer {
        RedisServer::primaries(1)
    }

    fn primaries(primaries: usize) -> RedisServer {
        // Nothing fails over here: the default timeout keeps a loaded machine from
        // seeing a slow node as failed.
        RedisServer::shaped(primaries, 0, None)
    }

    /// Starts a cluster of `primaries` primaries (slots spread evenly, as
    /// `redis-cli --cluster create` does) with `replicas_per_primary` replicas each, of
    /// this run's engine and binary, with `cluster-node-timeout` 2000 ms so failures are
    /// detected and failed over quickly. Returns once every node knows every other, the
    /// cluster is ok everywhere and every replica is connected and in sync.
    pub fn cluster(primaries: usize, replicas_per_primary: usize) -> RedisServer {
        assert!(primaries >= 1, "a cluster needs a primary");
        RedisServer::shaped(primaries, replicas_per_primary, Some(2_000))
    }

    /// A cluster of this run's engine and binary, without TLS.
    fn shaped(
        primaries: usize,
        replicas_per_primary: usize,
        node_timeout_ms: Option<u64>,
    ) -> RedisServer {
        let settings = RedisSettings::get();
        RedisServer::launch(Spec {
            server: settings.server.clone(),
            engine: settings.engine,
            tls: false,
            primaries,
            replicas_per_primary,
            node_timeout_ms,
            clock_ahead_s: None,
        })
    }

    /// Starts one node owning every slot, of this run's engine and binary, whose clock
    /// (`TIME`, and every time the server reads) runs `seconds` ahead of this machine's,
    /// as a server whose clock is off would: libfaketime preloaded (Debian's `faketime`
    /// package, installed by `scripts/setup.sh`).
    ///
    /// `None` on the Redis engine: Debian's `redis-server` allocates with jemalloc, which
    /// reads the clock while libfaketime initialises, and the server never starts (the
    /// library says so: "unexpected recursive calls to clock_gettime()"). The Valkey
    /// runs (the cluster pass of `scripts/test.sh`) have the node.
    ///
    /// # Panics
    /// When libfaketime is not installed, or as [`Self::start`].
    pub fn single_with_clock_ahead(seconds: u64) -> Option<RedisServer> {
        let settings = RedisSettings::get();
        if settings.engine == Engine::Redis {
            return None;
        }
        Some(RedisServer::launch(Spec {
            server: settings.server.clone(),
            engine: settings.engine,
            tls: false,
            primaries: 1,
            replicas_per_primary: 0,
            node_timeout_ms: None,
            clock_ahead_s: Some(seconds),
        }))
    }

    /// Starts a node that only speaks TLS (`rediss://`, like ElastiCache Serverless),
    /// with a certificate for 127.0.0.1 signed by a throwaway CA ([`Self::ca_file`]).
    ///
    /// Always Debian's `redis-server` from `PATH`, one node owning every slot, whatever
    /// [`RedisSettings`] say: the Valkey builds used for the Valkey runs have no TLS.
    /// Needs the `openssl` command.
    pub fn start_tls() -> RedisServer {
        RedisServer::launch(Spec {
            server: PathBuf::from("redis-server"),
            engine: Engine::Redis,
            tls: true,
            primaries: 1,
            replicas_per_primary: 0,
            node_timeout_ms: None,
            clock_ahead_s: None,
        })
    }

    fn launch(spec: Spec) -> RedisServer {
        static SERVERS: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "seckill-redis-{}-{}",
            std::process::id(),
            SERVERS.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        if spec.tls {
            make_certificates(&dir);
        }
        let mut server = RedisServer {
            spec,
            dir,
            nodes: Vec::new(),
        };
        for _ in 0..server.spec.nodes() {
            let node = server.launch_node();
            server.nodes.push(node);
        }
        server.form_cluster();
        server
    }

    /// Picking free ports and binding them are two steps, so another test may take a
    /// port in between: then our server exits, or a probe would reach the other test's
    /// server. Each attempt checks that the server answering is our own process, and a
    /// lost race is simply tried again on other ports.
    fn launch_node(&self) -> Node {
        for _ in 0..20 {
            let (port, bus_port) = (free_port(), free_port());
            if port == bus_port {
                continue;
            }
            let dir = self.dir.join(format!("node-{port}"));
            std::fs::create_dir_all(&dir).expect("node dir");
            let mut child = spawn(&self.spec, &self.dir, &dir, port, bus_port);
            let own = self.wait_own(port, &mut child);
            let mut node = Node {
                port,
                bus_port,
                dir,
                child: Some(child),
            };
            match own {
                Ok(true) => return node,
                Ok(false) => {}
                Err(why) => {
                    node.stop();
                    panic!("{why}");
                }
            }
            node.stop();
            let _ = std::fs::remove_dir_all(&node.dir);
        }
        panic!(
            "could not start a private {} after 20 attempts",
            self.spec.server.display()
        );
    }

    /// Waits until the node's own process (`child`) answers on `port`: `Ok(false)` when
    /// it exited (lost a port to someone else) or another server answers there, `Err`
    /// when nothing answers within 10 s or the server is not of the engine named. Never
    /// panics: the caller owns the child and must stop it first.
    fn wait_own(&self, port: u16, child: &mut Child) -> Result<bool, String> {
        let pid = child.id();
        let server = self.spec.server.display();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if Instant::now() >= deadline {
                return Err(format!("{server} on port {port} did not come up"));
            }
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(false);
            }
            if let Ok(info) = self.query::<String>(port, redis::cmd("INFO").arg("server")) {
                if !info.contains(&format!("process_id:{pid}\r")) {
                    return Ok(false); // someone else's server on this port
                }
                let valkey = info.contains("server_name:valkey\r");
                if valkey != (self.spec.engine == Engine::Valkey) {
                    return Err(format!(
                        "{server} is not {:?}: SECKILL_REDIS_ENGINE and SECKILL_REDIS_SERVER disagree",
                        self.spec.engine
                    ));
                }
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Gives each primary its slots, introduces every node to the first, attaches the
    /// replicas, and waits until the cluster is ready everywhere.
    fn form_cluster(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let primaries = self.spec.primaries;
        let many = self.nodes.len() > 1;
        for (i, node) in self.nodes.iter().enumerate() {
            if many {
                // Distinct epochs from the start, as `redis-cli --cluster create` gives.
                self.query::<()>(
                    node.port,
                    redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1),
                )
                .expect("CLUSTER SET-CONFIG-EPOCH");
            }
            if i < primaries {
                let (first, last) = slot_range(i, primaries);
                self.query::<()>(
                    node.port,
                    redis::cmd("CLUSTER")
                        .arg("ADDSLOTSRANGE")
                        .arg(first)
                        .arg(last),
                )
                .expect("CLUSTER ADDSLOTSRANGE");
            }
        }
        let seed = self.nodes[0].port;
        for node in &self.nodes[1..] {
            self.query::<()>(
                seed,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.port)
                    .arg(node.bus_port),
            )
            .expect("CLUSTER MEET");
        }
        if self.spec.replicas_per_primary > 0 {
            let ids: Vec<String> = self.nodes[..primaries]
                .iter()
                .map(|n| self.node_id(n.port))
                .collect();
            for (r, node) in self.nodes[primaries..].iter().enumerate() {
                let primary = &ids[r % primaries];
                // The replica must have met its primary first: retry until it has.
                loop {
                    let replicate = self.query::<()>(
                        node.port,
                        redis::cmd("CLUSTER").arg("REPLICATE").arg(primary),
                    );
                    match replicate {
                        Ok(()) => break,
                        Err(e) => assert!(
                            Instant::now() < deadline,
                            "CLUSTER REPLICATE on port {}: {e}",
                            node.port
                        ),
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        self.wait_formed(deadline);
    }

    /// Waits until the cluster has its full shape again (see [`Self::check_formed`]).
    fn wait_formed(&self, deadline: Instant) {
        loop {
            match self.check_formed() {
                Ok(()) => return,
                Err(why) => assert!(
                    Instant::now() < deadline,
                    "the cluster of {} nodes did not form: {why}",
                    self.nodes.len()
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node runs, reports `cluster_state:ok`, and knows every node, none of them
    /// failing or in handshake, with as many primaries owning slots and as many replicas
    /// as the cluster was made with; every replica has finished its sync and every
    /// primary sees its replicas online.
    fn check_formed(&self) -> Result<(), String> {
        let total = self.nodes.len();
        for node in &self.nodes {
            if node.child.is_none() {
                return Err(format!("node {} is not running", node.port));
            }
            let port = node.port;
            self.check_ok(port, &[])?;
            let lines = self.cluster_nodes(port)?;
            if lines.len() != total {
                return Err(format!("node {port} knows {} nodes", lines.len()));
            }
            let owners = lines
                .iter()
                .filter(|l| l.primary() && !l.slots.is_empty())
                .count();
            let replicas = lines.iter().filter(|l| !l.primary()).count();
            let want = self.spec.primaries * self.spec.replicas_per_primary;
            if owners != self.spec.primaries || replicas != want {
                return Err(format!(
                    "node {port} sees {owners} primaries with slots and {replicas} replicas"
                ));
            }
            let me = lines.iter().find(|l| l.myself).ok_or("no myself line")?;
            let info = self
                .query::<String>(port, redis::cmd("INFO").arg("replication"))
                .map_err(|e| format!("INFO replication on {port}: {e}"))?;
            if me.primary() {
                let online = info.matches(",state=online,").count();
                let expected = lines
                    .iter()
                    .filter(|l| l.primary_id.as_deref() == Some(me.id.as_str()))
                    .count();
                if online != expected {
                    return Err(format!(
                        "primary {port} has {online} of {expected} replicas online"
                    ));
                }
            } else if !info.contains("master_link_status:up\r")
                || !info.contains("master_sync_in_progress:0\r")
            {
                return Err(format!("replica {port} is not in sync yet"));
            }
        }
        Ok(())
    }

    /// The node on `port` reports `cluster_state:ok`, and in its view every node but the
    /// `stopped` ones is connected and healthy, and no stopped node serves slots.
    fn check_ok(&self, port: u16, stopped: &[String]) -> Result<(), String> {
        let info = self
            .query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
            .map_err(|e| format!("CLUSTER INFO on {port}: {e}"))?;
        if !info.contains("cluster_state:ok\r") {
            return Err(format!("node {port} is not cluster_state:ok"));
        }
        for line in self.cluster_nodes(port)? {
            let down = stopped.contains(&line.id);
            if (!down && !line.healthy()) || (down && line.primary() && !line.slots.is_empty()) {
                return Err(format!("node {port} sees {}", line.text));
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` until every running node reports `cluster_state:ok`, sees
    /// every other running node connected and healthy, and sees every slot served by a
    /// running node: after [`Self::kill`], once a replica took over the killed primary's
    /// slots; after [`Self::revive`], once the node rejoined. Returns how long it took.
    ///
    /// # Panics
    /// When it does not happen in time (with what was last seen).
    pub fn wait_ok(&self, timeout: Duration) -> Duration {
        let started = Instant::now();
        let stopped: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_none())
            .filter_map(|n| self.known_id(n))
            .collect();
        loop {
            let check = self
                .running()
                .try_for_each(|node| self.check_ok(node.port, &stopped));
            match check {
                Ok(()) => return started.elapsed(),
                Err(why) => assert!(
                    started.elapsed() < timeout,
                    "the cluster is not ok after {timeout:?}: {why}"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills every node (SIGKILL: nothing is saved) and starts each again on the same
    /// ports and directories, so it loads its last `SAVE`d snapshot (`dump.rdb`), if
    /// any: the cluster forgets every write made after that snapshot, as after a crash
    /// with AOF `everysec` or a failover to a replica that lagged. The cluster config
    /// (`nodes.conf`) is kept, so the nodes own their slots again. Nodes stopped by
    /// [`Self::kill`] come back too.
    ///
    /// # Panics
    /// When the cluster does not come back within 30 s (e.g. a port was taken meanwhile).
    pub fn restart(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        for i in 0..self.nodes.len() {
            self.respawn(i);
        }
        self.wait_formed(Instant::now() + Duration::from_secs(30));
    }

    /// Starts a node stopped by [`Self::kill`] again, from its last snapshot, and waits
    /// until it answers (not until the cluster took it back: see [`Self::wait_ok`]).
    pub fn revive(&mut self, port: u16) {
        let i = self.index_of(port);
        assert!(self.nodes[i].child.is_none(), "node {port} is running");
        self.respawn(i);
    }

    fn respawn(&mut self, i: usize) {
        let node = &self.nodes[i];
        let port = node.port;
        let mut child = spawn(&self.spec, &self.dir, &node.dir, port, node.bus_port);
        let own = self.wait_own(port, &mut child);
        // Stored before any panic, so that dropping the server stops it.
        self.nodes[i].child = Some(child);
        match own {
            Ok(true) => {}
            Ok(false) => panic!(
                "{} did not come back on port {port}",
                self.spec.server.display()
            ),
            Err(why) => panic!("{why}"),
        }
    }

    /// Kills one node (SIGKILL), as a crash would; its files stay for [`Self::revive`]
    /// and [`Self::restart`].
    pub fn kill(&mut self, port: u16) {
        let i = self.index_of(port);
        self.nodes[i].stop();
    }

    /// `SAVE` on every running node: each writes its snapshot, which
    /// [`Self::restart`] comes back from. (A `SAVE` through a cluster connection
    /// reaches one node only.)
    pub fn save(&self) {
        for node in self.running() {
            self.query::<()>(node.port, &redis::cmd("SAVE"))
                .unwrap_or_else(|e| panic!("SAVE on node {}: {e}", node.port));
        }
    }

    /// The running nodes, primaries first as started, each with its role now.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.running()
            .map(|node| {
                let lines = self
                    .cluster_nodes(node.port)
                    .unwrap_or_else(|e| panic!("{e}"));
                let me = lines
                    .into_iter()
                    .find(|l| l.myself)
                    .expect("CLUSTER NODES has a myself line");
                let role = match (me.primary(), me.primary_id) {
                    (false, Some(primary_id)) => Role::Replica { primary_id },
                    _ => Role::Primary,
                };
                NodeInfo {
                    port: node.port,
                    id: me.id,
                    role,
                }
            })
            .collect()
    }

    /// The port of the primary serving `slot`: of the running nodes that claim it, the
    /// one with the newest config epoch (an old primary that just came back may still
    /// claim slots a replica took over).
    ///
    /// # Panics
    /// When no running node claims the slot.
    pub fn primary_of_slot(&self, slot: u16) -> u16 {
        self.running()
            .filter_map(|node| {
                let lines = self.cluster_nodes(node.port).ok()?;
                let me = lines.into_iter().find(|l| l.myself)?;
                let owns = me.primary() && me.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot));
                owns.then_some((me.config_epoch, node.port))
            })
            .max()
            .map(|(_, port)| port)
            .unwrap_or_else(|| panic!("no running node serves slot {slot}"))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn key_slot(&self, key: &str) -> u16 {
        let port = self.running().next().expect("a running node").port;
        self.query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .expect("CLUSTER KEYSLOT")
    }

    /// The port of the seed node ([`Self::url`]).
    pub fn port(&self) -> u16 {
        self.seed().port
    }

    /// The URL of one node (the first primary, or the first node still running), which
    /// cluster clients use as their seed to discover the rest.
    pub fn url(&self) -> String {
        self.url_of(self.port())
    }

    /// The URL of the node on `port`.
    pub fn url_of(&self, port: u16) -> String {
        let scheme = if self.spec.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{port}")
    }

    /// The CA certificate of a TLS server.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A client configuration for this server; its response timeout is
    /// [`client_timeout`].
    pub fn config(&self) -> RedisConfig {
        RedisConfig {
            url: self.url(),
            cluster: true,
            timeout: client_timeout(),
            tls_ca_file: self.spec.tls.then(|| self.ca_file().display().to_string()),
            durable: None,
        }
    }

    /// A cluster connection to this server.
    pub async fn connect(&self) -> RedisConn {
        RedisConn::connect(&self.config())
            .await
            .expect("connect to test redis")
    }

    fn seed(&self) -> &Node {
        self.running()
            .next()
            .unwrap_or_else(|| panic!("no node of this server is running"))
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.child.is_some())
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node of this server on port {port}"))
    }

    /// A node's id as its own `nodes.conf` records it (also for a stopped node).
    fn known_id(&self, node: &Node) -> Option<String> {
        let conf = std::fs::read_to_string(node.dir.join("nodes.conf")).ok()?;
        conf.lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split(' ').next())
            .map(str::to_string)
    }

    fn node_id(&self, port: u16) -> String {
        self.query(port, redis::cmd("CLUSTER").arg("MYID"))
            .expect("CLUSTER MYID")
    }

    fn cluster_nodes(&self, port: u16) -> Result<Vec<NodeLine>, String> {
        let text: String = self
            .query(port, redis::cmd("CLUSTER").arg("NODES"))
            .map_err(|e| format!("CLUSTER NODES on {port}: {e}"))?;
        Ok(text.lines().filter_map(NodeLine::parse).collect())
    }

    /// Every running node's `INFO commandstats`, summed by command (the name lower
    /// case, without its `cmdstat_` prefix).
    pub fn commandstats(&self) -> BTreeMap<String, seckill_load::redis_info::CommandStat> {
        let infos: Vec<String> = self
            .running()
            .map(|node| {
                self.query(node.port, redis::cmd("INFO").arg("commandstats"))
                    .unwrap_or_else(|e| panic!("INFO on node {}: {e}", node.port))
            })
            .collect();
        seckill_load::redis_info::commandstats(infos.iter().map(String::as_str))
    }

    /// Script calls (`EVALSHA`, `EVAL`) every running node ran so far, by its
    /// `INFO commandstats`: calls that failed (the first call of a script the server
    /// did not have yet, refused `NOSCRIPT` and sent again loaded) not counted.
    pub fn script_calls(&self) -> u64 {
        self.commandstats()
            .iter()
            .filter(|(name, _)| *name == "evalsha" || *name == "eval")
            .map(|(_, s)| s.calls - s.failed_calls)
            .sum()
    }

    /// Commands every running node ran so far, by its `INFO commandstats`, but for the
    /// ones clients and tests send on their own (`INFO`, `CLUSTER`, `PING`, `HELLO`,
    /// `CLIENT`, `READONLY`): what the code under test asked of Redis, counted on the
    /// server.
    pub fn command_calls(&self) -> u64 {
        const OWN: [&str; 6] = ["info", "cluster", "ping", "hello", "client", "readonly"];
        self.commandstats()
            .iter()
            .filter(|(name, _)| !OWN.iter().any(|own| name.starts_with(own)))
            .map(|(_, s)| s.calls)
            .sum()
    }

    /// One command on the node on `port`, over a connection of its own (for what a
    /// cluster client would route elsewhere or to every node: `WAIT`, `CLUSTER ...`,
    /// `DEBUG`, `INFO`).
    pub fn query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let url = self.url_of(port);
        let client = if self.spec.tls {
            seckill_shared::adapters::redis::install_crypto_provider();
            let ca = std::fs::read(self.ca_file()).ok();
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: ca,
                },
            )?
        } else {
            redis::Client::open(url)?
        };
        let mut con = client.get_connection_with_timeout(Duration::from_secs(2))?;
        con.set_read_timeout(Some(Duration::from_secs(10)))?;
        cmd.query(&mut con)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The slots of primary `i` of `n`, spread as `redis-cli --cluster create` spreads them
/// (three primaries: 0-5460, 5461-10922, 10923-16383).
fn slot_range(i: usize, n: usize) -> (u16, u16) {
    let per = 16384.0 / n as f64;
    let last = |i: usize| -> u16 {
        if i + 1 == n {
            16383
        } else {
            ((i + 1) as f64 * per - 1.0).round() as u16
        }
    };
    let first = if i == 0 { 0 } else { last(i - 1) + 1 };
    (first, last(i))
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    text: String,
    id: String,
    myself: bool,
    flags: Vec<String>,
    primary_id: Option<String>,
    /// The client port the node is announced at.
    port: Option<u16>,
    config_epoch: u64,
    connected: bool,
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    /// `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link>
    /// <slot>...`
    fn parse(line: &str) -> Option<NodeLine> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            return None;
        }
        let flags: Vec<String> = f[2].split(',').map(str::to_string).collect();
        let slots = f[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        Some(NodeLine {
            text: line.to_string(),
            id: f[0].to_string(),
            myself: flags.iter().any(|x| x == "myself"),
            primary_id: (f[3] != "-").then(|| f[3].to_string()),
            port: f[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok()),
            config_epoch: f[6].parse().unwrap_or(0),
            connected: f[7] == "connected",
            flags,
            slots,
        })
    }

    fn primary(&self) -> bool {
        self.flags.iter().any(|x| x == "master" || x == "primary")
    }

    /// Connected, and neither failing, in handshake, nor without an address.
    fn healthy(&self) -> bool {
        self.connected
            && !self
                .flags
                .iter()
                .any(|x| matches!(x.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
    }
}

/// TCP proxies in front of every node of a [`RedisServer`] that can lose one reply: once
/// [`Self::arm`]ed, the first command containing all of `needles`, on whichever node it
/// reaches, is forwarded, and when the node answers, the answer is thrown away and the
/// client's connection is cut, as by a connection reset or a failover right after the
/// server ran the command. Everything else passes through.
///
/// Cluster clients route by the addresses the nodes announce: while the dropper runs,
/// every node announces its own proxy's port (`cluster-announce-port`), so a client
/// seeded with [`Self::url`] keeps all its traffic on the proxies. Dropping the dropper
/// makes the nodes announce their own ports again.
pub struct ReplyDropper {
    /// Proxy port by node port.
    proxies: Vec<(u16, u16)>,
    /// The node URLs of the server, to undo the announcements.
    node_urls: Vec<String>,
    armed: std::sync::Arc<std::sync::Mutex<Option<Vec<Vec<u8>>>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// [`Self::mute`]: the needles and how many more connections to mute.
    mute: MuteNeedles,
    muted: Arc<std::sync::atomic::AtomicUsize>,
    /// [`Self::hold`] and [`Self::fail`].
    late: Late,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What [`ReplyDropper::hold`] and [`ReplyDropper::fail`] share with the proxies.
#[derive(Clone)]
struct Late {
    /// The needles of the command to hold back (the first one only).
    hold: Arc<std::sync::Mutex<Option<Vec<Vec<u8>>>>>,
    /// Set once the held command may go to the node.
    released: tokio::sync::watch::Sender<bool>,
    /// How many commands are held (or were, until released).
    held: Arc<std::sync::atomic::AtomicUsize>,
    /// The needles of commands to answer with an error instead, and how many more.
    fail: MuteNeedles,
    /// The error reply they get (RESP, `-...\r\n`).
    fail_reply: Arc<std::sync::Mutex<&'static [u8]>>,
}

impl ReplyDropper {
    /// Puts a proxy on a free loopback port in front of each running node of `server`,
    /// makes each node announce its proxy, and waits until every node's view of the
    /// cluster names only the proxies.
    ///
    /// # Panics
    /// When the announcements have not spread within 30 s.
    pub async fn start(server: &RedisServer) -> ReplyDropper {
        let armed = std::sync::Arc::new(std::sync::Mutex::new(None::<Vec<Vec<u8>>>));
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mute = Arc::new(std::sync::Mutex::new(None));
        let muted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let late = Late {
            hold: Arc::default(),
            released: tokio::sync::watch::channel(false).0,
            held: Arc::default(),
            fail: Arc::default(),
            fail_reply: Arc::new(std::sync::Mutex::new(INJECTED_ERROR)),
        };
        let mut proxies = Vec::new();
        let mut tasks = Vec::new();
        for node in server.running() {
            let upstream_port = node.port;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind proxy");
            let port = listener.local_addr().expect("proxy address").port();
            let (a, d, m, md) = (armed.clone(), dropped.clone(), mute.clone(), muted.clone());
            let l = late.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (a, d, l) = (a.clone(), d.clone(), l.clone());
                    let mute = Mute {
                        needles: m.clone(),
                        count: md.clone(),
                    };
                    tokio::spawn(async move {
                        if let Ok(up) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                        {
                            proxy(client, up, a, d, mute, l).await;
                        }
                    });
                }
            }));
            proxies.push((upstream_port, port));
        }
        let dropper = ReplyDropper {
            node_urls: proxies.iter().map(|(n, _)| server.url_of(*n)).collect(),
            proxies,
            armed,
            dropped,
            mute,
            muted,
            late,
            tasks,
        };
        let mut ids = Vec::new();
        for (node, proxy) in &dropper.proxies {
            server
                .query::<()>(
                    *node,
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("cluster-announce-port")
                        .arg(*proxy),
                )
                .expect("CONFIG SET cluster-announce-port");
            ids.push((server.node_id(*node), *proxy));
        }
        // Every node learns the others' new ports from their next heartbeat.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stale = dropper.proxies.iter().find_map(|(node, _)| {
                let lines = server.cluster_nodes(*node).ok()?;
                let stale = lines.iter().find(|l| {
                    ids.iter()
                        .any(|(id, proxy)| *id == l.id && l.port != Some(*proxy))
                })?;
                Some(format!("node {node} sees {}", stale.text))
            });
            let Some(stale) = stale else { break };
            assert!(
                Instant::now() < deadline,
                "the proxies' ports did not spread: {stale}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        dropper
    }

    /// The URL clients use to go through the proxies (the seed node's proxy).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.proxies[0].1)
    }

    /// Loses the reply to the next command, on any node, that contains every one of
    /// `needles`.
    pub fn arm(&self, needles: &[&[u8]]) {
        *self.armed.lock().unwrap() = Some(needles.iter().map(|n| n.to_vec()).collect());
    }

    /// How many replies were lost so far.
    pub fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Mutes the connections carrying the next `times` commands that contain every one
    /// of `needles`: each command is forwarded and runs, but nothing the node sends on
    /// that connection reaches the client any more, and the connection stays open (as a
    /// wedged client's or a half-dead network path's would).
    pub fn mute(&self, needles: &[&[u8]], times: usize) {
        *self.mute.lock().unwrap() = Some((needles.iter().map(|n| n.to_vec()).collect(), times));
    }

    /// How many connections were muted so far.
    pub fn muted(&self) -> usize {
        self.muted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Holds back the next command that contains every one of `needles`: it does not
    /// reach the node (nor does anything sent after it on that connection) until
    /// [`Self::release`], and nothing the node sends on that connection reaches the
    /// client any more. The client sees no reply in time; the command runs late, as a
    /// first copy stuck in a slow network path does after its resend was answered.
    pub fn hold(&self, needles: &[&[u8]]) {
        *self.late.hold.lock().unwrap() = Some(needles.iter().map(|n| n.to_vec()).collect());
    }

    /// How many commands were held so far.
    pub fn held(&self) -> usize {
        self.late.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Lets the held command (and what followed it) go to the node, and waits a moment
    /// for the node to run it.
    pub async fn release(&self) {
        self.late.released.send_replace(true);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    /// Answers the next `times` commands that contain every one of `needles` (and are
    /// not held) with an error reply instead of sending them to the node.
    pub fn fail(&self, needles: &[&[u8]], times: usize) {
        self.fail_with(needles, times, INJECTED_ERROR);
    }

    /// [`Self::fail`] with the error reply `reply` (RESP: `-CODE text\r\n`), such as a
    /// `TRYAGAIN` a node answers while a slot's keys are split between two nodes.
    pub fn fail_with(&self, needles: &[&[u8]], times: usize, reply: &'static [u8]) {
        *self.late.fail_reply.lock().unwrap() = reply;
        *self.late.fail.lock().unwrap() =
            Some((needles.iter().map(|n| n.to_vec()).collect(), times));
    }
}

/// The error reply of [`ReplyDropper::fail`].
const INJECTED_ERROR: &[u8] = b"-ERR injected by the test proxy\r\n";

/// The commands to mute connections for, and how many more (see [`ReplyDropper::mute`]).
type MuteNeedles = Arc<std::sync::Mutex<Option<(Vec<Vec<u8>>, usize)>>>;

/// Whether `chunk` contains every one of `needles`.
fn contains_all(chunk: &[u8], needles: &[Vec<u8>]) -> bool {
    needles
        .iter()
        .all(|n| chunk.windows(n.len()).any(|w| w == n.as_slice()))
}

/// What a proxy connection needs to know of [`ReplyDropper::mute`].
struct Mute {
    needles: MuteNeedles,
    count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Mute {
    /// Whether `chunk` is a command to mute its connection for (counting it).
    fn matches(&self, chunk: &[u8]) -> bool {
        let mut needles = self.needles.lock().unwrap();
        let Some((wanted, left)) = needles.as_mut() else {
            return false;
        };
        if !contains_all(chunk, wanted) {
            return false;
        }
        *left -= 1;
        if *left == 0 {
            *needles = None;
        }
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }
}

impl Drop for ReplyDropper {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // The nodes announce their own ports again (best effort: the server may be gone).
        for url in &self.node_urls {
            if let Ok(client) = redis::Client::open(url.as_str())
                && let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1))
            {
                let _: redis::RedisResult<()> = redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("cluster-announce-port")
                    .arg(0)
                    .query(&mut con);
            }
        }
    }
}

async fn proxy(
    mut client: tokio::net::TcpStream,
    mut up: tokio::net::TcpStream,
    armed: std::sync::Arc<std::sync::Mutex<Option<Vec<Vec<u8>>>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    mute: Mute,
    late: Late,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut cbuf, mut ubuf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut doomed = false;
    let mut silent = false;
    // What the client sent from the held command on, until it is released.
    let mut holding: Option<Vec<u8>> = None;
    let mut released = late.released.subscribe();
    loop {
        tokio::select! {
            changed = released.changed(), if holding.is_some() => {
                if changed.is_err() {
                    return; // the dropper is gone
                }
                if !*released.borrow_and_update() {
                    continue;
                }
                let held = holding.take().unwrap_or_default();
                if up.write_all(&held).await.is_err() {
                    return;
                }
            }
            n = client.read(&mut cbuf) => {
                let Ok(n @ 1..) = n else {
                    // Whatever was sent is on its way even when its sender has gone: a
                    // held command still reaches the node once released.
                    if let Some(held) = holding.take()
                        && released.wait_for(|r| *r).await.is_ok()
                        && up.write_all(&held).await.is_ok()
                    {
                        let _ = up.read(&mut ubuf).await;
                    }
                    return;
                };
                let chunk = &cbuf[..n];
                if let Some(held) = holding.as_mut() {
                    held.extend_from_slice(chunk);
                    continue;
                }
                {
                    let mut hold = late.hold.lock().unwrap();
                    if hold.as_ref().is_some_and(|needles| contains_all(chunk, needles)) {
                        *hold = None;
                        late.held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        holding = Some(chunk.to_vec());
                        silent = true;
                        continue;
                    }
                }
                let failing = {
                    let mut fail = late.fail.lock().unwrap();
                    match fail.as_mut() {
                        Some((needles, left)) if contains_all(chunk, needles) => {
                            *left -= 1;
                            if *left == 0 {
                                *fail = None;
                            }
                            true
                        }
                        _ => false,
                    }
                };
                if failing {
                    let reply = *late.fail_reply.lock().unwrap();
                    if client.write_all(reply).await.is_err() {
                        return;
                    }
                    continue;
                }
                {
                    let mut armed = armed.lock().unwrap();
                    if armed.as_ref().is_some_and(|needles| contains_all(chunk, needles)) {
                        *armed = None;
                        doomed = true;
                    }
                }
                silent = silent || mute.matches(chunk);
                if up.write_all(chunk).await.is_err() {
                    return;
                }
            }
            n = up.read(&mut ubuf) => {
                let Ok(n @ 1..) = n else { return };
                if doomed {
                    // The command ran; its answer is lost with the connection.
                    dropped.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
                if silent {
                    continue;
                }
                if client.write_all(&ubuf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Debian's libfaketime, for whichever architecture this is.
fn libfaketime() -> PathBuf {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketime.so.1"))
        .find(|lib| lib.exists())
        .expect("libfaketime is missing: run scripts/setup.sh (Debian package faketime)")
}

/// Starts one node of `spec` in cluster mode on `port` (cluster bus on `bus_port`),
/// keeping its files in `dir`. Nothing is saved by itself (`--save ""`, no AOF): only an
/// explicit `SAVE` writes `dump.rdb`. A TLS node finds its certificates in `certs`.
fn spawn(spec: &Spec, certs: &Path, dir: &Path, port: u16, bus_port: u16) -> Child {
    let mut cmd = Command::new(&spec.server);
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
        .args(["--cluster-port", &bus_port.to_string()])
        .arg("--dir")
        .arg(dir);
    if let Some(ms) = spec.node_timeout_ms {
        cmd.args(["--cluster-node-timeout", &ms.to_string()]);
    }
    if spec.tls {
        cmd.args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cluster",
            "yes",
        ])
        .args(["--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(certs.join("server.crt"))
        .arg("--tls-key-file")
        .arg(certs.join("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(certs.join("ca.crt"));
    } else {
        cmd.args(["--port", &port.to_string()]);
    }
    if let Some(seconds) = spec.clock_ahead_s {
        cmd.env("LD_PRELOAD", libfaketime())
            .env("FAKETIME", format!("+{seconds}s"));
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e} (run scripts/setup.sh, or set SECKILL_REDIS_SERVER)",
                spec.server.display()
            )
        })
}

/// A throwaway CA and a server certificate for 127.0.0.1, in `dir`.
fn make_certificates(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("the openssl command is needed for TLS tests")
            .success();
        assert!(ok, "openssl {args:?} failed");
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write ext.cnf");
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=seckill-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The response timeout of test clients: 2 s, or `SECKILL_TEST_REDIS_TIMEOUT_MS` (e.g.
/// 250, the production default, to run the cluster tests the way a deployment would).
pub fn client_timeout() -> Duration {
    let ms = std::env::var("SECKILL_TEST_REDIS_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    Duration::from_millis(ms)
}

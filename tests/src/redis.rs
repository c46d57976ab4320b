//! A private `redis-server` per test: a real server on a free loopback port, in cluster
//! mode with one node owning every slot, so scripts run under the same cross-slot rules
//! as ElastiCache Serverless. Stopped when dropped; [`RedisServer::restart`] kills it and
//! brings it back from its last snapshot, to test what survives lost writes.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seckill_shared::adapters::redis::RedisConn;
use seckill_shared::config::RedisConfig;

/// A running redis-server owned by a test.
pub struct RedisServer {
    child: Child,
    dir: PathBuf,
    pub port: u16,
    tls: bool,
}

impl RedisServer {
    /// Starts a server and waits until the cluster accepts commands.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not come up within 10 s.
    pub fn start() -> RedisServer {
        RedisServer::launch(false)
    }

    /// Starts a server that only speaks TLS (`rediss://`, like ElastiCache Serverless),
    /// with a certificate for 127.0.0.1 signed by a throwaway CA ([`Self::ca_file`]).
    /// Needs the `openssl` command.
    pub fn start_tls() -> RedisServer {
        RedisServer::launch(true)
    }

    /// Picking a free port and binding it are two steps, so another test may take the
    /// port in between: then our server exits, or a probe would reach the other test's
    /// server. Each attempt checks that the server answering is our own process, and a
    /// lost race is simply tried again on another port.
    fn launch(tls: bool) -> RedisServer {
        for _ in 0..20 {
            if let Some(server) = RedisServer::try_launch(tls) {
                return server;
            }
        }
        panic!("could not start a private redis-server after 20 attempts");
    }

    fn try_launch(tls: bool) -> Option<RedisServer> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("seckill-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        if tls {
            make_certificates(&dir);
        }
        let mut server = RedisServer {
            child: spawn(port, &dir, tls),
            dir,
            port,
            tls,
        };
        server.wait_ready().then_some(server)
    }

    /// Kills the server (SIGKILL: nothing is saved) and starts it again on the same port
    /// and directory, so it loads the last `SAVE`d snapshot (`dump.rdb`), if any: Redis
    /// forgets every write made after that snapshot, as after a crash with AOF
    /// `everysec` or a failover to a replica that lagged. The cluster config is kept, so
    /// the node owns every slot again.
    ///
    /// # Panics
    /// When the server does not come back within 10 s (e.g. the port was taken meanwhile).
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.port, &self.dir, self.tls);
        assert!(
            self.wait_ready(),
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// Waits until our own process answers and the cluster is ok; false when the server
    /// exited (lost the port to someone else).
    fn wait_ready(&mut self) -> bool {
        let (port, tls) = (self.port, self.tls);
        let pid = self.child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut slots_added = false;
        loop {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not come up"
            );
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // lost the port to someone else; Drop cleans up
            }
            let client = if tls {
                seckill_shared::adapters::redis::install_crypto_provider();
                let ca = std::fs::read(self.ca_file()).ok();
                redis::Client::build_with_tls(
                    self.url(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: ca,
                    },
                )
            } else {
                redis::Client::open(self.url())
            };
            if let Ok(client) = client
                && let Ok(mut con) = client.get_connection()
            {
                let info: String = redis::cmd("INFO")
                    .arg("server")
                    .query(&mut con)
                    .unwrap_or_default();
                if !info.contains(&format!("process_id:{pid}\r")) {
                    // Someone else's server on this port.
                    if info.contains("process_id:") {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                // A restarted node keeps its slots (nodes.conf): adding them again fails
                // harmlessly, and the cluster state below says when it is ready.
                if !slots_added {
                    slots_added = redis::cmd("CLUSTER")
                        .arg("ADDSLOTSRANGE")
                        .arg(0)
                        .arg(16383)
                        .query::<()>(&mut con)
                        .is_ok();
                }
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut con)
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The CA certificate of a TLS server.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn config(&self) -> RedisConfig {
        RedisConfig {
            url: self.url(),
            cluster: true,
            timeout: Duration::from_secs(2),
            tls_ca_file: self.tls.then(|| self.ca_file().display().to_string()),
        }
    }

    /// A cluster connection to this server.
    pub async fn connect(&self) -> RedisConn {
        RedisConn::connect(&self.config())
            .await
            .expect("connect to test redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy in front of a Redis node that can lose one reply: once [`Self::arm`]ed,
/// the first command containing both `needles` is forwarded, and when Redis answers, the
/// answer is thrown away and the client's connection is cut, as by a connection reset or
/// a failover right after the server ran the command. Everything else passes through.
///
/// Cluster clients route by the addresses the node announces; point them here with
/// [`Self::announce_through`].
pub struct ReplyDropper {
    pub port: u16,
    armed: std::sync::Arc<std::sync::Mutex<Option<Vec<Vec<u8>>>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ReplyDropper {
    /// Listens on a free loopback port and forwards to `upstream_port`.
    pub async fn start(upstream_port: u16) -> ReplyDropper {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let armed = std::sync::Arc::new(std::sync::Mutex::new(None::<Vec<Vec<u8>>>));
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (a, d) = (armed.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (a, d) = (a.clone(), d.clone());
                tokio::spawn(async move {
                    if let Ok(up) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                    {
                        proxy(client, up, a, d).await;
                    }
                });
            }
        });
        ReplyDropper {
            port,
            armed,
            dropped,
            task,
        }
    }

    /// Makes the node announce this proxy's port in its cluster topology, so cluster
    /// clients that connect here keep all their traffic here.
    pub async fn announce_through(&self, node: &RedisServer) {
        let client = redis::Client::open(node.url()).expect("node url");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to node");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-announce-port")
            .arg(self.port)
            .query_async(&mut con)
            .await
            .expect("CONFIG SET cluster-announce-port");
    }

    /// The URL clients use to go through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Loses the reply to the next command that contains every one of `needles`.
    pub fn arm(&self, needles: &[&[u8]]) {
        *self.armed.lock().unwrap() = Some(needles.iter().map(|n| n.to_vec()).collect());
    }

    /// How many replies were lost so far.
    pub fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for ReplyDropper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn proxy(
    mut client: tokio::net::TcpStream,
    mut up: tokio::net::TcpStream,
    armed: std::sync::Arc<std::sync::Mutex<Option<Vec<Vec<u8>>>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut cbuf, mut ubuf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut doomed = false;
    loop {
        tokio::select! {
            n = client.read(&mut cbuf) => {
                let Ok(n @ 1..) = n else { return };
                let chunk = &cbuf[..n];
                {
                    let mut armed = armed.lock().unwrap();
                    if armed.as_ref().is_some_and(|needles| {
                        needles.iter().all(|n| chunk.windows(n.len()).any(|w| w == n.as_slice()))
                    }) {
                        *armed = None;
                        doomed = true;
                    }
                }
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
                if client.write_all(&ubuf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Starts `redis-server` in cluster mode on `port`, keeping its files in `dir`. Nothing
/// is saved by itself (`--save ""`, no AOF): only an explicit `SAVE` writes `dump.rdb`.
fn spawn(port: u16, dir: &std::path::Path, tls: bool) -> Child {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
        .arg("--dir")
        .arg(dir);
    if tls {
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
        .arg(dir.join("server.crt"))
        .arg("--tls-key-file")
        .arg(dir.join("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(dir.join("ca.crt"));
    } else {
        cmd.args(["--port", &port.to_string()]);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is not installed: run scripts/setup.sh")
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

//! A private `redis-server` per test: a real server on a free loopback port, in cluster
//! mode with one node owning every slot, so scripts run under the same cross-slot rules
//! as ElastiCache Serverless. Stopped when dropped.

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
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .arg("--dir")
            .arg(&dir);
        if tls {
            make_certificates(&dir);
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
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: run scripts/setup.sh");
        let mut server = RedisServer {
            child,
            dir,
            port,
            tls,
        };
        let pid = server.child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut slots_added = false;
        loop {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not come up"
            );
            if let Ok(Some(_)) = server.child.try_wait() {
                return None; // lost the port to someone else; Drop cleans up
            }
            let client = if tls {
                seckill_shared::adapters::redis::install_crypto_provider();
                let ca = std::fs::read(server.ca_file()).ok();
                redis::Client::build_with_tls(
                    server.url(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: ca,
                    },
                )
            } else {
                redis::Client::open(server.url())
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
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
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
                    return Some(server);
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

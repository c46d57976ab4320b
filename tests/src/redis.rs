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
}

impl RedisServer {
    /// Starts a server and waits until the cluster accepts commands.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not come up within 10 s.
    pub fn start() -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("seckill-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: run scripts/setup.sh");
        let server = RedisServer { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut slots_added = false;
        loop {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not come up"
            );
            if let Ok(client) = redis::Client::open(server.url())
                && let Ok(mut con) = client.get_connection()
            {
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
                    return server;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn config(&self) -> RedisConfig {
        RedisConfig {
            url: self.url(),
            cluster: true,
            timeout: Duration::from_secs(2),
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

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

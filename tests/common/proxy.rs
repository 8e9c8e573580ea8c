//! The real `agent-proxy` binary on an ephemeral port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub struct Proxy {
    pub port: u16,
    child: Child,
    pub dir: PathBuf,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh directory for one test's files.
pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agent-proxy-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port for a proxy (or a server that must not exist). Taken below the
/// kernel's ephemeral range, so no server bound to port 0 can grab it between
/// this check and the proxy's own bind; unique within the test process.
pub fn free_port() -> u16 {
    static NEXT_PORT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() * 97;
    loop {
        let n = NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        let port = 20_000 + ((offset + n) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A config whose default upstream `up` is the server at `url`, then `extra`
/// (YAML lines: agents, tools, limits).
pub fn one_upstream(url: &str, extra: &str) -> String {
    format!("default_upstream: up\nupstreams: {{ up: {{ url: \"{url}/v1\" }} }}\n{extra}\n")
}

/// `yaml` with a `listen` line for `port` in front.
pub fn with_listen(port: u16, yaml: &str) -> String {
    format!("listen: \"127.0.0.1:{port}\"\n{yaml}")
}

impl Proxy {
    /// Starts the proxy with `yaml` (without `listen`, which the harness sets)
    /// and waits until `/healthz` answers.
    pub async fn start(yaml: &str) -> Proxy {
        Self::start_with_env(yaml, &[]).await
    }

    pub async fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Proxy {
        Self::start_with(yaml, env, &[]).await
    }

    pub async fn start_with(yaml: &str, env: &[(&str, &str)], args: &[&str]) -> Proxy {
        let dir = scratch_dir();
        let port = free_port();
        let config = dir.join("proxy.yaml");
        std::fs::write(&config, with_listen(port, yaml)).unwrap();
        Self::launch(dir, &config, port, env, args).await
    }

    /// Starts the proxy with `yaml`, run by `wrapper` (a command line the
    /// proxy's own follows, as `unshare … agent-proxy …`). [`Proxy::pid`]
    /// and [`Proxy::signal`] are then the wrapper's.
    pub async fn start_wrapped(wrapper: &[&str], yaml: &str) -> Proxy {
        let dir = scratch_dir();
        let port = free_port();
        let config = dir.join("proxy.yaml");
        std::fs::write(&config, with_listen(port, yaml)).unwrap();
        Self::launch_wrapped(wrapper, dir, &config, port, &[], &[]).await
    }

    /// Starts the proxy on a config file the test wrote itself (with `listen`
    /// on `port`).
    pub async fn launch(
        dir: PathBuf,
        config: &Path,
        port: u16,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Proxy {
        Self::launch_wrapped(&[], dir, config, port, env, args).await
    }

    async fn launch_wrapped(
        wrapper: &[&str],
        dir: PathBuf,
        config: &Path,
        port: u16,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Proxy {
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("proxy.log")).unwrap();
        let binary = env!("CARGO_BIN_EXE_agent-proxy");
        let (program, before) = match wrapper {
            [program, before @ ..] => (*program, before),
            [] => (binary, &[][..]),
        };
        let child = Command::new(program)
            .args(before)
            .args(if wrapper.is_empty() {
                None
            } else {
                Some(binary)
            })
            .arg("--config")
            .arg(config)
            .args(args)
            // A test's own `RUST_LOG` wins.
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start agent-proxy");
        let proxy = Proxy { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Ok(mut s)) = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = s
                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await;
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(1), s.read_to_end(&mut buf)).await;
                // Only the proxy tags its answers with a request id.
                let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                if head.starts_with("http/1.1 200") && head.contains("x-request-id") {
                    return proxy;
                }
            }
            assert!(
                Instant::now() < deadline,
                "proxy did not start:\n{}",
                proxy.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("proxy.log")).unwrap_or_default()
    }

    /// Whether every one of `texts` reaches the log within 5 s: the proxy's
    /// log writer puts lines out a few milliseconds after they are logged,
    /// so a line about what just happened may not be there yet.
    pub async fn logged(&self, texts: &[&str]) -> bool {
        wait_until(Duration::from_secs(5), || {
            let logs = self.logs();
            std::future::ready(texts.iter().all(|text| logs.contains(text)))
        })
        .await
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits up to `limit` for the process to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` until it holds, for at most `limit`: whether it ever did.
pub async fn wait_until<F: std::future::Future<Output = bool>>(
    limit: Duration,
    mut done: impl FnMut() -> F,
) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits `work`, failing the test if it takes longer than `limit`: a
/// generous deadline that only something broken (a timeout that never
/// fires) blows through.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after {limit:?}"))
}

/// Whether process `pid` no longer runs: gone, or a zombie waiting to be
/// reaped.
pub fn process_gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(')')
        .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// The pids a process the test started wrote to `path` (a line of them,
/// space-separated), once written, each checked to run.
pub async fn wait_pids(path: &Path) -> Vec<u32> {
    let pids: Vec<u32> = wait_line(path, Duration::from_secs(10))
        .await
        .split(' ')
        .map(|pid| pid.parse().expect("a pid"))
        .collect();
    assert!(pids.iter().all(|&pid| !process_gone(pid)), "{pids:?} run");
    pids
}

/// Whether every one of `pids` is gone within `limit`.
pub async fn all_gone(pids: &[u32], limit: Duration) -> bool {
    wait_until(limit, || {
        std::future::ready(pids.iter().all(|&pid| process_gone(pid)))
    })
    .await
}

/// Waits (`limit` at most) until the file at `path` holds a complete line
/// (written by a process the test started), and returns it.
pub async fn wait_line(path: &Path, limit: Duration) -> String {
    let mut line = String::new();
    let written = wait_until(limit, || {
        line = std::fs::read_to_string(path).unwrap_or_default();
        std::future::ready(line.ends_with('\n'))
    })
    .await;
    assert!(
        written,
        "nothing written to {} in {limit:?}",
        path.display()
    );
    line.trim_end().to_owned()
}

//! A real Postgres with pgvector for the shared knowledge index tests: the
//! server binaries of PyPI's `pgserver` wheel (pinned in
//! `tests/python/requirements.txt`, so `cargo test` provisions it like the
//! SDKs), on a free port, its data in a temporary directory. Postgres will
//! not run as root: as root, it runs as `nobody`.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::proxy::{free_port, wait_until};
use super::sdk::{python_package_dir, stdout_of};

const NOBODY: u32 = 65534;

pub struct PostgresServer {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

/// The provisioned installation's `bin` directory.
fn bin_dir() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = python_package_dir("pgserver").join("pginstall/bin");
        assert!(
            bin.join("postgres").is_file(),
            "no postgres in {}",
            bin.display()
        );
        bin
    })
}

/// `program` from the installation, as `nobody` when we are root.
fn command(program: &str, as_nobody: bool) -> Command {
    let mut command = Command::new(bin_dir().join(program));
    if as_nobody {
        command.uid(NOBODY).gid(NOBODY);
    }
    command
}

impl PostgresServer {
    /// Makes a database cluster, starts the server and waits until it
    /// accepts queries.
    pub async fn start() -> PostgresServer {
        let dir = std::env::temp_dir().join(format!(
            "agent-proxy-pg-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a data directory");
        let as_nobody = std::fs::metadata(&dir).expect("its metadata").uid() == 0;
        if as_nobody {
            std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        let data = dir.join("data");
        let status = command("initdb", as_nobody)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb failed in {}", data.display());
        let port = free_port();
        let child = command("postgres", as_nobody)
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(&dir)
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start postgres");
        let up = wait_until(Duration::from_secs(30), || async {
            command("pg_isready", false)
                .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        })
        .await;
        assert!(up, "postgres did not start on port {port}");
        PostgresServer { port, child, dir }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `sql` through `psql`, its output as text.
    pub fn psql(&self, sql: &str) -> String {
        stdout_of(command("psql", false).args(["-X", "-A", "-t", "-d", &self.url(), "-c", sql]))
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // SIGINT: a fast shutdown; then the files go.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! The demo MCP server (`examples/mcp_demo_server.rs`) for tests that
//! configure one, and waiting for the proxy to connect it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{get, Proxy};

/// The demo MCP server's binary. Plain `cargo test` builds it next to the
/// test binaries (`target/<profile>/examples/`); `--all-targets` builds
/// examples only as tests and `--test NAME` not at all, so then, or when its
/// inputs changed since, it is built here.
pub fn demo_server() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binaries are in <target>/<profile>/deps");
        let built = profile_dir
            .join("examples")
            .join(format!("mcp_demo_server{}", std::env::consts::EXE_SUFFIX));
        let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let inputs = ["examples/mcp_demo_server.rs", "Cargo.toml", "Cargo.lock"];
        let fresh = modified(&built).is_some_and(|built_at| {
            inputs
                .iter()
                .all(|input| modified(&root.join(input)).is_some_and(|at| at <= built_at))
        });
        if fresh {
            built
        } else {
            build_demo_server(profile_dir.ends_with("release"))
        }
    })
}

fn build_demo_server(release: bool) -> PathBuf {
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--locked", "--example", "mcp_demo_server"])
        .arg("--message-format=json")
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    if release {
        cargo.arg("--release");
    }
    // Cargo gave this test its package's variables. Build scripts watch some
    // of them (ring: CARGO_PKG_NAME, CARGO_MANIFEST_DIR): a cargo that saw
    // them set would rebuild half the dependencies, and the next `cargo test`
    // again.
    let package_vars = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
    ];
    for (name, _) in std::env::vars_os() {
        if package_vars
            .iter()
            .any(|prefix| name.to_string_lossy().starts_with(prefix))
        {
            cargo.env_remove(name);
        }
    }
    let output = cargo.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "building the demo MCP server failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Cargo names the binary it built in its JSON messages.
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|message| message["target"]["name"] == "mcp_demo_server")
        .and_then(|message| message["executable"].as_str().map(PathBuf::from))
        .expect("cargo reports the demo MCP server's executable")
}

/// Waits until `/readyz` reports `server` connected.
pub async fn wait_connected(proxy: &Proxy, server: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = get(proxy.port, "/readyz").await.json()["mcp"][server]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status.starts_with("connected") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "MCP server `{server}` never connected ({status}):\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

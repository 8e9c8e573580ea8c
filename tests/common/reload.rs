//! A proxy whose config file a test rewrites, and waiting for each reload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{free_port, scratch_dir, wait_until, with_listen, Proxy};

/// The proxy on a config file it polls every 50 ms.
pub struct Reloadable {
    pub proxy: Proxy,
    path: PathBuf,
}

impl Reloadable {
    pub async fn start(yaml: &str) -> Reloadable {
        let dir = scratch_dir();
        let port = free_port();
        let path = dir.join("proxy.yaml");
        std::fs::write(&path, with_listen(port, yaml)).unwrap();
        let proxy = Proxy::launch(dir, &path, port, &[], &["--reload-poll-ms", "50"]).await;
        Reloadable { proxy, path }
    }

    pub fn port(&self) -> u16 {
        self.proxy.port
    }

    /// Replaces the config with `yaml` and waits until the proxy serves it.
    pub async fn reload(&self, yaml: &str) {
        let reloads = || self.proxy.logs().matches("config reloaded").count();
        let before = reloads();
        write_atomically(&self.path, &with_listen(self.proxy.port, yaml));
        let done = wait_until(Duration::from_secs(10), || {
            std::future::ready(reloads() > before)
        })
        .await;
        assert!(done, "the config was not reloaded:\n{}", self.proxy.logs());
    }
}

/// Replaces the file atomically, as editors and config managers do.
pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

//! Hot reload: the config lives in an `ArcSwap`; every request takes the
//! snapshot current when it started and keeps it to its end. A new config is
//! loaded on SIGHUP and when the file's content changes. Content, not
//! inotify: a Kubernetes ConfigMap update swaps a `..data` symlink, which
//! naive watchers miss, but reading the path sees the new file.
//!
//! A reload rebuilds only what changed: an upstream or MCP server whose spec
//! is as before is carried over whole (pool health, pooled connections, the
//! MCP connection and process), see [`Config::load_reusing`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::config::{fingerprint, Config, ConfigError};
use crate::metrics::metrics;

pub struct Reloader {
    path: PathBuf,
    config: Arc<ArcSwap<Config>>,
    poll: Duration,
    /// What the process started with and a reload cannot change (its
    /// sockets, its threads): a reload that differs is told so.
    started: StartOnly,
}

/// The settings that take effect at a start only.
struct StartOnly {
    listen: String,
    admin_listen: Option<String>,
    runtime: crate::config::Runtime,
}

impl StartOnly {
    fn of(config: &Config) -> Self {
        StartOnly {
            listen: config.listen.clone(),
            admin_listen: config.admin_listen.clone(),
            runtime: config.runtime,
        }
    }

    /// Which of `config`'s start-only settings differ from what runs.
    fn differing(&self, config: &Config) -> Vec<&'static str> {
        [
            ("listen", config.listen != self.listen),
            ("admin_listen", config.admin_listen != self.admin_listen),
            ("runtime", config.runtime != self.runtime),
        ]
        .into_iter()
        .filter_map(|(name, differs)| differs.then_some(name))
        .collect()
    }

    /// Says so of each start-only setting `config` changes.
    fn warn_of(&self, config: &Config) {
        for setting in self.differing(config) {
            warn!(
                setting,
                "a change to `{setting}` takes effect at the next restart"
            );
        }
    }
}

impl Reloader {
    pub fn new(path: PathBuf, config: Arc<ArcSwap<Config>>, poll: Duration) -> Self {
        let started = StartOnly::of(&config.load());
        Reloader {
            path,
            config,
            poll,
            started,
        }
    }

    /// Loads the file again; an invalid config is rejected whole and the
    /// current one keeps serving.
    async fn reload(&self, reason: &str) {
        let path = self.path.clone();
        let current = self.config.load_full();
        let loaded = tokio::task::spawn_blocking(move || Config::load_reusing(&path, &current))
            .await
            .unwrap_or_else(|e| {
                Err(ConfigError {
                    key: String::new(),
                    message: e.to_string(),
                })
            });
        match loaded {
            Ok(new) => {
                let old = self.config.load();
                // Against what runs, not the last file: a change undone
                // again is no change.
                self.started.warn_of(&new);
                info!(
                    reason,
                    agents = new.agents.len(),
                    upstreams_rebuilt = rebuilt(&new.upstreams, &old.upstreams),
                    mcp_servers_rebuilt = rebuilt(&new.mcp_servers, &old.mcp_servers),
                    "config reloaded"
                );
                let replaced = self.config.swap(Arc::new(new));
                replaced.superseded.mark();
                metrics().config_reloads.with_label_values(&["ok"]).inc();
            }
            Err(e) => {
                error!(
                    reason,
                    "config reload rejected, the current config stays: {e}"
                );
                metrics()
                    .config_reloads
                    .with_label_values(&["failed"])
                    .inc();
            }
        }
    }

    /// The file as it is now, by [`fingerprint`]; `None` when unreadable.
    /// Read in place: the reloader's runtime is a thread of its own that
    /// serves nothing else, and a read of a config file is brief; tokio's
    /// would wake a blocking-pool thread for it every poll.
    fn file_fingerprint(&self) -> Option<u64> {
        let bytes = std::fs::read(&self.path).ok()?;
        Some(fingerprint(&bytes))
    }
}

/// How many of `new`'s runtime objects are not `old`'s carried over.
fn rebuilt<T>(new: &BTreeMap<String, Arc<T>>, old: &BTreeMap<String, Arc<T>>) -> usize {
    new.iter()
        .filter(|(name, built)| !old.get(*name).is_some_and(|o| Arc::ptr_eq(o, built)))
        .count()
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => Some(hangups),
            Err(e) => {
                warn!("cannot listen for SIGHUP ({e}); reloading on file changes only");
                None
            }
        };
        // What was loaded at start, not the file as it is now: it may have
        // changed since, and that change is still to be loaded.
        let mut seen = self.config.load().source;
        // The first look is one period in, not at once: `seen` is the
        // loaded file, so anything written since shows as a change then.
        let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + self.poll, self.poll);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = async { hangups.as_mut()?.recv().await } => {
                    seen = self.file_fingerprint();
                    self.reload("SIGHUP").await;
                }
                _ = poll.tick() => {
                    let now = self.file_fingerprint();
                    if now.is_some() && now != seen {
                        seen = now;
                        self.reload("file changed").await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_text(agents: &str) -> String {
        format!(
            "default_upstream: up\nupstreams: {{ up: {{ url: \"http://127.0.0.1:9/v1\" }} }}\n\
             agents: {{ {agents} }}\nstore: {{ kind: none }}\n"
        )
    }

    #[test]
    fn start_only_settings_are_told_against_what_runs() {
        let dir = std::env::temp_dir().join(format!("agent-proxy-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.yaml");
        let load = |extra: &str| {
            std::fs::write(&path, config_text("bot: {}") + extra).unwrap();
            Config::load(&path).unwrap()
        };
        let running = StartOnly::of(&load(""));
        assert_eq!(running.differing(&load("")), Vec::<&str>::new());
        assert_eq!(
            running.differing(&load("listen: \"127.0.0.1:1\"\n")),
            ["listen"]
        );
        assert_eq!(
            running.differing(&load("admin_listen: \"127.0.0.1:2\"\n")),
            ["admin_listen"]
        );
        // Changed, then changed back: what runs again, nothing to tell.
        assert_eq!(running.differing(&load("")), Vec::<&str>::new());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The file changes after the config was loaded but before the
    /// reloader first looks (a busy start): the change is loaded, not taken
    /// as what is running.
    #[tokio::test]
    async fn a_change_written_before_watching_begins_is_loaded() {
        let dir = std::env::temp_dir().join(format!("agent-proxy-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.yaml");
        std::fs::write(&path, config_text("bot: { system_prompt: hi }")).unwrap();
        let config = Arc::new(ArcSwap::from_pointee(Config::load(&path).unwrap()));
        std::fs::write(
            &path,
            config_text("bot: { system_prompt: hi }, extra: { system_prompt: hi }"),
        )
        .unwrap();

        let reloader = Reloader::new(path, config.clone(), Duration::from_millis(10));
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let watching = tokio::spawn(async move { reloader.start(shutdown).await });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while config.load().agent("extra").is_none() {
            assert!(tokio::time::Instant::now() < deadline, "never reloaded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.send(true).unwrap();
        watching.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

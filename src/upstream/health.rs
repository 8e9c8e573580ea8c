//! Active health checks for every pool of the current config, reload-aware:
//! each round looks at the config as it is now. Once at start, a warning
//! when the default upstream accepts no connection.
//!
//! The checker is also the only one that calls an upstream to learn whether
//! it is up: `/readyz` reads what it last learned ([`Readiness`]), so a flood
//! of probes is not a flood of upstream calls.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use futures::future::join_all;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::{watch, Notify};
use tracing::warn;

use super::Upstream;
use crate::config::Config;
use crate::sync::lock;

/// Name lookup, connect and TLS of the start-up check together.
const STARTUP_WAIT: Duration = Duration::from_secs(10);
/// How often an upstream without health checks is probed for readiness
/// (`GET <url>/models`), and how long a probe may take.
const READY_INTERVAL: Duration = Duration::from_secs(5);
const READY_PROBE_WAIT: Duration = Duration::from_secs(2);
/// An upstream without health checks is probed only while `/readyz` is
/// asked about it this recently: a proxy nobody probes calls nobody.
const READY_DEMAND: Duration = Duration::from_secs(60);

/// What the health checker last learned of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// No check has completed yet.
    Unchecked,
    Ready,
    /// Why not.
    Down(String),
}

/// An upstream's [`Readiness`], written by the checker, read by `/readyz`.
pub struct ReadyState {
    now: watch::Sender<Readiness>,
    /// When `/readyz` last asked.
    asked: Mutex<Option<Instant>>,
    /// When the checker last probed (upstreams without health checks).
    probed: Mutex<Option<Instant>>,
    /// Wakes the checker when `/readyz` asks after a time nobody did.
    demand: Notify,
}

impl Default for ReadyState {
    fn default() -> Self {
        ReadyState {
            now: watch::Sender::new(Readiness::Unchecked),
            asked: Mutex::new(None),
            probed: Mutex::new(None),
            demand: Notify::new(),
        }
    }
}

impl Upstream {
    /// What the health checker last learned of this upstream. Before its
    /// first check completes, waits for it for at most `wait`.
    pub async fn readiness(&self, wait: Duration) -> Readiness {
        let before = lock(&self.ready.asked).replace(Instant::now());
        if before.is_none_or(|at| at.elapsed() >= READY_DEMAND) {
            self.ready.demand.notify_one();
        }
        let mut known = self.ready.now.subscribe();
        let checked = async {
            let seen = known.wait_for(|r| *r != Readiness::Unchecked).await;
            seen.map(|r| r.clone())
        };
        match tokio::time::timeout(wait, checked).await {
            Ok(Ok(readiness)) => readiness,
            _ => Readiness::Unchecked,
        }
    }

    /// Runs this upstream's health checks when due. One without health
    /// checks is probed for readiness instead, if it is the default
    /// upstream (the one `/readyz` reports) and `/readyz` asks about it.
    async fn check_if_due(&self, is_default: bool) {
        let outcome = if self.pool.has_health_checks() {
            self.pool.check_health_if_due().await
        } else if is_default && self.readiness_probe_is_due() {
            Some(match self.fetch_models(READY_PROBE_WAIT).await {
                Ok((status, _)) if status >= 500 => Err(format!("HTTP {status}")),
                Ok(_) => Ok(()),
                Err(reason) => Err(reason),
            })
        } else {
            None
        };
        if let Some(outcome) = outcome {
            self.ready
                .now
                .send_replace(outcome.map_or_else(Readiness::Down, |()| Readiness::Ready));
        }
    }

    fn readiness_probe_is_due(&self) -> bool {
        let due = self
            .readiness_probe_due_at()
            .is_some_and(|at| at <= Instant::now());
        if due {
            *lock(&self.ready.probed) = Some(Instant::now());
        }
        due
    }

    /// When the next readiness probe is due; `None` while `/readyz` is not
    /// asking (its next question wakes the checker).
    fn readiness_probe_due_at(&self) -> Option<Instant> {
        let asked = (*lock(&self.ready.asked)).filter(|at| at.elapsed() < READY_DEMAND)?;
        let probed = *lock(&self.ready.probed);
        let next = probed.map_or_else(Instant::now, |at| at + READY_INTERVAL);
        (next < asked + READY_DEMAND).then_some(next)
    }

    /// When this upstream next has a check due, as [`check_if_due`] would
    /// run it; `None`: none until `/readyz` asks.
    fn next_check_at(&self, is_default: bool) -> Option<Instant> {
        match self.pool.health_due_at() {
            Some(at) => Some(at),
            None if is_default => self.readiness_probe_due_at(),
            None => None,
        }
    }
}

pub struct HealthChecks {
    config: Arc<ArcSwap<Config>>,
    /// The config file, named in the start-up warning.
    config_path: PathBuf,
}

impl HealthChecks {
    pub fn new(config: Arc<ArcSwap<Config>>, config_path: PathBuf) -> Self {
        HealthChecks {
            config,
            config_path,
        }
    }

    /// On a first run the model server is often not started yet: one line
    /// says where the proxy looked and what to do, before a client gets a 502.
    /// Connecting is enough to tell, and the model server sees no request.
    async fn warn_if_default_upstream_is_down(config: Arc<Config>, config_path: PathBuf) {
        let upstream = &config.default_upstream;
        if let Err(reason) = upstream.accepts_connections(STARTUP_WAIT).await {
            warn!(
                "default upstream `{}` is not answering at {} ({reason}): start llama-server there, or set default_upstream in {}",
                upstream.name,
                upstream.urls(),
                config_path.display()
            );
        }
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // Beside the rounds, not before them: it may wait for a timeout.
        let startup = tokio::spawn(Self::warn_if_default_upstream_is_down(
            self.config.load_full(),
            self.config_path.clone(),
        ));
        loop {
            let config = self.config.load_full();
            let is_default = |u: &Arc<Upstream>| Arc::ptr_eq(u, &config.default_upstream);
            join_all(
                config
                    .upstreams
                    .values()
                    .map(|u| u.check_if_due(is_default(u))),
            )
            .await;
            // Asleep until a check is due, `/readyz` asks, or a reload.
            let next = config
                .upstreams
                .values()
                .filter_map(|u| u.next_check_at(is_default(u)))
                .min();
            let due = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = due => {}
                _ = config.default_upstream.ready.demand.notified() => {}
                _ = config.superseded.wait() => {}
            }
        }
        startup.abort();
    }
}

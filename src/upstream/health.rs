//! Active health checks for every pool of the current config, reload-aware:
//! each round looks at the config as it is now. Once at start, a warning
//! when the default upstream accepts no connection.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use futures::future::join_all;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tracing::warn;

use crate::config::Config;

/// How often due checks are looked for; each pool keeps its own interval.
const TICK: Duration = Duration::from_millis(50);
/// Name lookup, connect and TLS of the start-up check together.
const STARTUP_WAIT: Duration = Duration::from_secs(10);

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
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(TICK) => {
                    let config = self.config.load_full();
                    join_all(config.upstreams.values().map(|u| u.pool.check_health_if_due())).await;
                }
            }
        }
        startup.abort();
    }
}

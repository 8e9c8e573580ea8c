//! Active health checks for every pool of the current config, reload-aware:
//! each round looks at the config as it is now.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use futures::future::join_all;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::Config;

/// How often due checks are looked for; each pool keeps its own interval.
const TICK: Duration = Duration::from_millis(50);

pub struct HealthChecks {
    config: Arc<ArcSwap<Config>>,
}

impl HealthChecks {
    pub fn new(config: Arc<ArcSwap<Config>>) -> Self {
        HealthChecks { config }
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(TICK) => {
                    let config = self.config.load_full();
                    join_all(config.upstreams.values().map(|u| u.pool.check_health_if_due())).await;
                }
            }
        }
    }
}

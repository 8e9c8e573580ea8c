//! Connects the current config's MCP servers in the background and
//! reconnects the ones that went away, with backoff.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::Config;

const TICK: Duration = Duration::from_millis(100);

pub struct McpSupervisor {
    config: Arc<ArcSwap<Config>>,
}

impl McpSupervisor {
    pub fn new(config: Arc<ArcSwap<Config>>) -> Self {
        McpSupervisor { config }
    }
}

#[async_trait]
impl BackgroundService for McpSupervisor {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            for server in self.config.load().mcp_servers.values() {
                if server.attempt_due() {
                    tokio::spawn(server.clone().connect());
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }
}

//! Starts the connection task of each MCP server of the current config,
//! at start and after each reload; each task connects its server and
//! reconnects it with backoff ([`McpServer::start`]).

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::McpServer;
use crate::config::Config;

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
    /// Runs until the process exits, holding the config: at shutdown the
    /// other services let go of theirs, and the last to go would drop the
    /// servers. They stay connected for the requests still draining; the
    /// drain then closes them ([`crate::shutdown`]), and the exit ends what
    /// is left ([`crate::children`]).
    async fn start(&self, _shutdown: ShutdownWatch) {
        loop {
            let config = self.config.load_full();
            config
                .mcp_servers
                .values()
                .for_each(|s| McpServer::start(s));
            config.superseded.wait().await;
        }
    }
}

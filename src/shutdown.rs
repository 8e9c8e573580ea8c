//! Graceful shutdown that ends when the work does. On SIGTERM (or SIGQUIT
//! during an upgrade) pingora stops accepting and then waits its grace period
//! unconditionally; this service exits the process as soon as no request is
//! in flight (a new connection's first request counts from its accept) and
//! the MCP connections are closed as MCP says, so a rollout never waits
//! much longer than the longest live stream.
//! The grace period stays the upper bound: what is left then is cut.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use futures::future::join_all;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tracing::{info, warn};

use crate::config::Config;
#[cfg(doc)]
use crate::mcp::McpServer;
use crate::per_thread::Count;

/// Every request counts itself here, on its thread's part: one count that
/// all threads wrote was a line moved between the cores twice a request.
static IN_FLIGHT: LazyLock<Count> = LazyLock::new(Count::new);
/// New connections, from their accept until their first request is
/// answered: that request counts in [`IN_FLIGHT`] too once it arrived, so
/// the drain waits for both, and its log counts requests from the first.
static ARRIVING: LazyLock<Count> = LazyLock::new(Count::new);

/// Set as the server begins shutting down: a connection closes after the
/// answer it is writing, so that answer says so (`Connection: close`), as
/// nginx's and Envoy's do; a client would otherwise send its next request on
/// it and lose it to the close.
static DRAINING: AtomicBool = AtomicBool::new(false);

/// The server began shutting down.
pub fn begin_draining() {
    DRAINING.store(true, Ordering::Relaxed);
}

/// Whether the server is shutting down.
pub fn draining() -> bool {
    DRAINING.load(Ordering::Relaxed)
}

/// Counts one request (or one new connection's first) for as long as it
/// lives.
pub struct InFlight(&'static Count);

impl InFlight {
    /// A request.
    pub fn enter() -> Self {
        Self::on(&IN_FLIGHT)
    }

    /// A new connection, until its first request is answered.
    pub fn arriving() -> Self {
        Self::on(&ARRIVING)
    }

    fn on(count: &'static LazyLock<Count>) -> Self {
        let count: &'static Count = count;
        count.raise();
        InFlight(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lower();
    }
}

/// Whether anything the drain waits for is still going. The new
/// connections first: one counts there from before its first request
/// counts in [`IN_FLIGHT`] until after it ended, and none is accepted once
/// the drain began, so no request is missed between the two reads.
fn busy() -> bool {
    let arriving = ARRIVING.get();
    arriving + IN_FLIGHT.get() > 0
}

/// What the MCP connections get to close once the requests are done: a
/// connection's own shutdown takes three seconds at most, a second for each
/// step ([`McpServer::close`]); what is left, the exit ends.
const MCP_CLOSE_LIMIT: Duration = Duration::from_millis(3500);

/// How long before the grace period's end the cut is announced: pingora
/// ends the runtimes (and their logging) then.
const CUT_NOTICE: Duration = Duration::from_millis(100);

pub struct Drain {
    config: Arc<ArcSwap<Config>>,
    /// Pingora's grace period: at its end, what is in flight is cut.
    grace: Duration,
}

impl Drain {
    pub fn new(config: Arc<ArcSwap<Config>>, grace: Duration) -> Self {
        Drain { config, grace }
    }
}

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // Wait for the shutdown signal (an error: the server itself is gone).
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        info!(
            in_flight = IN_FLIGHT.get(),
            new_connections = ARRIVING.get(),
            "shutting down: draining"
        );
        // Pingora's runtime drops the requests it cuts: none writes its
        // request line, so the operator hears of them here.
        let cut_at = tokio::time::Instant::now() + self.grace.saturating_sub(CUT_NOTICE);
        let mut told = false;
        loop {
            if !busy() {
                let config = self.config.load_full();
                if !config.mcp_servers.is_empty() {
                    info!("drained; closing the MCP connections");
                    let closing = join_all(config.mcp_servers.values().map(|s| s.close()));
                    let _ = tokio::time::timeout(MCP_CLOSE_LIMIT, closing).await;
                }
                info!("drained; exiting");
                std::process::exit(0);
            }
            if !told && tokio::time::Instant::now() >= cut_at {
                told = true;
                warn!(
                    in_flight = IN_FLIGHT.get(),
                    new_connections = ARRIVING.get(),
                    grace_s = self.grace.as_secs(),
                    "grace period over: the requests still in flight are cut"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

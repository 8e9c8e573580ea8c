//! Graceful shutdown that ends when the work does. On SIGTERM (or SIGQUIT
//! during an upgrade) pingora stops accepting and then waits its grace period
//! unconditionally; this service exits the process as soon as no request is
//! in flight (a new connection's first request counts from its accept), so
//! a rollout never waits longer than the longest live stream.
//! The grace period stays the upper bound: what is left then is cut.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tracing::info;

use crate::per_thread::Count;

/// Every request counts itself here, on its thread's part: one count that
/// all threads wrote was a line moved between the cores twice a request.
static IN_FLIGHT: LazyLock<Count> = LazyLock::new(Count::new);

/// Counts one request for as long as it lives.
pub struct InFlight(());

impl InFlight {
    pub fn enter() -> Self {
        IN_FLIGHT.raise();
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.lower();
    }
}

pub struct Drain;

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // Wait for the shutdown signal (an error: the server itself is gone).
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        info!(in_flight = IN_FLIGHT.get(), "shutting down: draining");
        loop {
            if IN_FLIGHT.get() == 0 {
                info!("drained; exiting");
                std::process::exit(0);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

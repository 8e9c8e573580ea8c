//! `GET /healthz` (the process is up), `GET /readyz` (the config is loaded
//! and the default upstream answers, as the health checker last saw it) and
//! `GET /metrics`.

use std::time::Duration;

use bytes::Bytes;
use pingora::Result;
use serde_json::{json, Value};

use super::h1::Session;
use super::handled;
use crate::config::Config;
use crate::downstream::Client;
use crate::upstream::Readiness;

/// How long a probe waits for the health checker's first verdict.
const PROBE_WAIT: Duration = Duration::from_secs(2);

pub async fn live(session: &mut Session) -> Result<bool> {
    respond(session, 200, live_body()).await
}

pub fn live_body() -> Value {
    json!({"status": "ok"})
}

pub async fn ready(session: &mut Session, config: &Config) -> Result<bool> {
    let (status, body) = readiness(config).await;
    respond(session, status, body).await
}

/// The readiness verdict and its JSON detail: the config is loaded (it is,
/// or there would be no `config`) and the default upstream answers. The
/// health checker alone calls the upstream; this reads its last verdict.
pub async fn readiness(config: &Config) -> (u16, Value) {
    let upstream = &config.default_upstream;
    let readiness = upstream.readiness(PROBE_WAIT).await;
    // MCP servers are detail, not readiness: agents without them still work.
    let mcp: serde_json::Map<String, Value> = config
        .mcp_servers
        .iter()
        .map(|(name, server)| (name.clone(), Value::String(server.status())))
        .collect();
    // Knowledge bases too: an agent answers without a base still building.
    let knowledge: serde_json::Map<String, Value> = config
        .knowledge_bases
        .iter()
        .map(|(name, base)| (name.clone(), base.status()))
        .collect();
    match readiness {
        Readiness::Ready => (
            200,
            json!({"status": "ready", "upstream": upstream.name, "mcp": mcp, "knowledge": knowledge}),
        ),
        // Nothing known against it yet: starting unready would only delay traffic.
        Readiness::Unchecked => (
            200,
            json!({"status": "ready", "upstream": upstream.name, "note": "the upstream has not been checked yet", "mcp": mcp, "knowledge": knowledge}),
        ),
        Readiness::Down(reason) => (
            503,
            json!({"status": "not ready", "upstream": upstream.name, "reason": reason, "mcp": mcp, "knowledge": knowledge}),
        ),
    }
}

/// `GET /metrics` in the Prometheus text format.
pub async fn metrics(session: &mut Session) -> Result<bool> {
    let mut client = Client::new(session, Duration::MAX);
    let body = Bytes::from(crate::metrics::metrics().render());
    let content_type = http::HeaderValue::from_static(crate::metrics::CONTENT_TYPE);
    let sent = client
        .respond_json(200, body, &[(http::header::CONTENT_TYPE, content_type)])
        .await;
    handled(sent.is_err())
}

async fn respond(session: &mut Session, status: u16, body: Value) -> Result<bool> {
    let mut client = Client::new(session, Duration::MAX);
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    handled(client.respond_json(status, bytes, &[]).await.is_err())
}

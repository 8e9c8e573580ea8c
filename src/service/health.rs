//! `GET /healthz` (the process is up) and `GET /readyz` (the config is loaded
//! and the default upstream answers).

use std::time::Duration;

use bytes::Bytes;
use pingora::proxy::Session;
use pingora::Result;
use serde_json::json;

use super::handled;
use crate::config::Config;
use crate::downstream::Client;

const PROBE_WAIT: Duration = Duration::from_secs(2);

pub async fn live(session: &mut Session) -> Result<bool> {
    respond(session, 200, json!({"status": "ok"})).await
}

pub async fn ready(session: &mut Session, config: &Config) -> Result<bool> {
    let upstream = &config.default_upstream;
    let probe = async {
        let req = upstream.get("/models").map_err(|e| e.to_string())?;
        let mut exchange = upstream
            .endpoint
            .send(req, None)
            .await
            .map_err(|e| e.etype().as_str().to_string())?;
        let status = exchange.status();
        // Drain so the connection can go back to the pool.
        let _ = exchange.read_to_end(4 << 20).await;
        if status >= 500 {
            return Err(format!("HTTP {status}"));
        }
        Ok(())
    };
    let outcome = tokio::time::timeout(PROBE_WAIT, probe)
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    match outcome {
        Ok(()) => {
            respond(
                session,
                200,
                json!({"status": "ready", "upstream": upstream.name}),
            )
            .await
        }
        Err(reason) => {
            respond(
                session,
                503,
                json!({"status": "not ready", "upstream": upstream.name, "reason": reason}),
            )
            .await
        }
    }
}

async fn respond(session: &mut Session, status: u16, body: serde_json::Value) -> Result<bool> {
    let mut client = Client::new(session, Duration::MAX);
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    handled(client.respond_json(status, bytes, &[]).await.is_err())
}

//! `GET /v1/models`: the agents, then the default upstream's own models.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pingora::proxy::Session;
use pingora::Result;
use serde_json::Value;
use tracing::warn;

use super::handled;
use crate::agent::router::AUTO;
use crate::config::Config;
use crate::downstream::Client;
use crate::openai::ModelCard;
use crate::upstream::Upstream;

/// How long the listing waits for the upstream's models.
const UPSTREAM_WAIT: Duration = Duration::from_secs(3);

pub async fn list(session: &mut Session, config: &Config) -> Result<bool> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut data: Vec<Value> = config
        .agents
        .values()
        .map(|agent| {
            serde_json::to_value(ModelCard {
                id: &agent.id,
                object: "model",
                created,
                owned_by: "agent-proxy",
                name: &agent.name,
                description: &agent.description,
            })
            .unwrap_or_default()
        })
        .collect();
    if config.router.is_some() {
        let auto = ModelCard {
            id: AUTO,
            object: "model",
            created,
            owned_by: "agent-proxy",
            name: "Auto",
            description: "Picks the best agent for each request",
        };
        data.push(serde_json::to_value(auto).unwrap_or_default());
    }
    if config.passthrough {
        match upstream_models(&config.default_upstream).await {
            Ok(models) => data.extend(models.into_iter().filter(|m| {
                m.get("id")
                    .and_then(Value::as_str)
                    .is_none_or(|id| config.agent(id).is_none())
            })),
            Err(reason) => {
                warn!(upstream = %config.default_upstream.name, %reason, "model list without the upstream's models")
            }
        }
    }
    let body = serde_json::json!({ "object": "list", "data": data });
    let mut client = Client::new(session, config.limits.heartbeat);
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    handled(client.respond_json(200, bytes, &[]).await.is_err())
}

/// The upstream's `data` array; an upstream that is down yields an error,
/// never a failed listing.
async fn upstream_models(upstream: &Upstream) -> std::result::Result<Vec<Value>, String> {
    let (status, body) = upstream.fetch_models(UPSTREAM_WAIT).await?;
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let mut list: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    match list.get_mut("data").map(Value::take) {
        Some(Value::Array(models)) => Ok(models),
        _ => Err("no `data` array".into()),
    }
}

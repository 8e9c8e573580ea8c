//! `GET /v1/models`: the agents, then the default upstream's own models.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pingora::Result;
use serde_json::Value;
use tracing::warn;

use super::h1::Session;
use super::handled;
use crate::agent::router::AUTO;
use crate::config::Config;
use crate::conversation::Dialect;
use crate::downstream::Client;
use crate::openai::ModelCard;
use crate::upstream::Upstream;

/// One model card of the proxy's own (an agent, `auto`).
fn card(id: &str, name: &str, description: &str, created: u64) -> Value {
    serde_json::to_value(ModelCard {
        id,
        object: "model",
        created,
        owned_by: "agent-proxy",
        name,
        description,
    })
    .unwrap_or_default()
}

/// How long the listing waits for the upstream's models.
const UPSTREAM_WAIT: Duration = Duration::from_secs(3);

/// The listing, in Anthropic's shape when the client is an Anthropic one
/// (`dialect` is `Messages` when the request carries `anthropic-version`).
pub async fn list(session: &mut Session, config: &Config, dialect: Dialect) -> Result<bool> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut data: Vec<Value> = config
        .agents
        .values()
        .map(|agent| card(&agent.id, &agent.name, &agent.description, created))
        .collect();
    if config.router.is_some() {
        data.push(card(
            AUTO,
            "Auto",
            "Picks the best agent for each request",
            created,
        ));
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
    let body = match dialect {
        Dialect::Messages => anthropic_listing(&data, created),
        _ => serde_json::json!({ "object": "list", "data": data }),
    };
    let mut client = Client::new(session, config.limits.heartbeat);
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    handled(client.respond_json(200, bytes, &[]).await.is_err())
}

/// `GET /v1/models/{id}` for an agent (other ids are the upstream's): its
/// card, in Anthropic's shape for an Anthropic client.
pub async fn one(
    session: &mut Session,
    config: &Config,
    id: &str,
    dialect: Dialect,
) -> Result<bool> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let card = config
        .agent(id)
        .map(|agent| card(id, &agent.name, &agent.description, created));
    let body = match dialect {
        Dialect::Messages => anthropic_listing(card.as_slice(), created)["data"][0].take(),
        _ => card.unwrap_or_default(),
    };
    let mut client = Client::new(session, config.limits.heartbeat);
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    handled(client.respond_json(200, bytes, &[]).await.is_err())
}

/// `{data: [{type: "model", id, display_name, created_at}], has_more,
/// first_id, last_id}`, as Anthropic's `GET /v1/models` answers.
fn anthropic_listing(models: &[Value], created: u64) -> Value {
    let created_at = rfc3339(created);
    let data: Vec<Value> = models
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?;
            let name = m.get("name").and_then(Value::as_str).unwrap_or(id);
            Some(serde_json::json!({"type": "model", "id": id, "display_name": name, "created_at": created_at}))
        })
        .collect();
    let first = data.first().map(|m| m["id"].clone());
    let last = data.last().map(|m| m["id"].clone());
    serde_json::json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
}

/// Seconds since the epoch as an RFC 3339 UTC timestamp.
fn rfc3339(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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

//! `GET /v1/models`: the agents, then the default upstream's own models.

use std::time::Duration;

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
use crate::error::ApiError;
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
    let created = config.loaded_at;
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
        Dialect::Messages => {
            let query = session.req_header().uri.query().unwrap_or_default();
            match anthropic_page(anthropic_listing(&data, created), query) {
                Ok(page) => page,
                Err(error) => return super::reject(session, dialect, &error).await,
            }
        }
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
    let created = config.loaded_at;
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
/// first_id, last_id}`, as Anthropic's `GET /v1/models` answers; a model
/// without its own `created` takes `created`.
fn anthropic_listing(models: &[Value], created: u64) -> Value {
    let data: Vec<Value> = models
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?;
            let name = m.get("name").and_then(Value::as_str).unwrap_or(id);
            let created_at = rfc3339(m.get("created").and_then(Value::as_u64).unwrap_or(created));
            Some(serde_json::json!({"type": "model", "id": id, "display_name": name, "created_at": created_at}))
        })
        .collect();
    let first = data.first().map(|m| m["id"].clone());
    let last = data.last().map(|m| m["id"].clone());
    serde_json::json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
}

/// One page of an Anthropic listing, as its `GET /v1/models` pages: `limit`
/// (1-1000, 20), `after_id` or `before_id`.
fn anthropic_page(mut listing: Value, query: &str) -> Result<Value, ApiError> {
    let Some(Value::Array(models)) = listing.get_mut("data").map(Value::take) else {
        return Ok(listing);
    };
    let mut limit = 20;
    let (mut after, mut before) = (None, None);
    // Decoded: model ids hold `/` and `:`, which the SDKs encode.
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "limit" => limit = super::page_limit(&value, 1000)?,
            "after_id" => after = Some(value),
            "before_id" => before = Some(value),
            _ => {}
        }
    }
    let position = |id: &str| models.iter().position(|m| m["id"] == id);
    // An id not listed (any more) ends the paging: an empty last page, not
    // the first again, which an SDK's pager would ask for forever.
    let (start, end) = match (after.as_deref(), before.as_deref()) {
        (Some(id), _) => position(id).map_or((0, 0), |i| (i + 1, models.len())),
        // Backwards from `before_id`: the `limit` models just before it.
        (None, Some(id)) => position(id).map_or((0, 0), |i| (i.saturating_sub(limit), i)),
        (None, None) => (0, models.len()),
    };
    let window = &models[start..end.max(start)];
    let page: Vec<Value> = window.iter().take(limit).cloned().collect();
    let first = page.first().map(|m| m["id"].clone());
    let last = page.last().map(|m| m["id"].clone());
    let has_more = match before.is_some() && after.is_none() {
        true => start > 0,
        false => window.len() > page.len(),
    };
    Ok(serde_json::json!({"data": page, "has_more": has_more, "first_id": first, "last_id": last}))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Pages as Anthropic's `GET /v1/models` pages them.
    #[test]
    fn an_anthropic_listing_pages() {
        let models: Vec<Value> = (0..5).map(|i| json!({"id": format!("m{i}")})).collect();
        let ids = |query: &str| {
            let page = anthropic_page(anthropic_listing(&models, 0), query).unwrap();
            let ids: Vec<String> = page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned())
                .collect();
            (ids.join(","), page["has_more"].as_bool().unwrap())
        };
        assert_eq!(ids(""), ("m0,m1,m2,m3,m4".into(), false));
        assert_eq!(ids("limit=2"), ("m0,m1".into(), true));
        assert_eq!(ids("limit=2&after_id=m1"), ("m2,m3".into(), true));
        assert_eq!(ids("limit=2&after_id=m3"), ("m4".into(), false));
        assert_eq!(ids("limit=2&before_id=m3"), ("m1,m2".into(), true));
        assert_eq!(ids("limit=2&before_id=m2"), ("m0,m1".into(), false));
        assert_eq!(ids("after_id=gone"), ("".into(), false));
        let encoded: Vec<Value> = ["org/a:q4", "org/b:q8"]
            .iter()
            .map(|id| json!({"id": id}))
            .collect();
        let page = anthropic_page(anthropic_listing(&encoded, 0), "after_id=org%2Fa%3Aq4").unwrap();
        assert_eq!(page["data"][0]["id"], "org/b:q8");
        let listing = anthropic_listing(&models, 0);
        assert_eq!(anthropic_page(listing, "limit=0").unwrap_err().status, 400);
        // A model's own time, else the given one.
        let dated = anthropic_listing(
            &[json!({"id": "a", "created": 86400}), json!({"id": "b"})],
            0,
        );
        assert_eq!(dated["data"][0]["created_at"], "1970-01-02T00:00:00Z");
        assert_eq!(dated["data"][1]["created_at"], "1970-01-01T00:00:00Z");
    }
}

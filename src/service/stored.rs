//! Stored responses (the response store, `store:`), where the Responses
//! front meets it:
//! - `POST /v1/responses` with `previous_response_id`: the chain of stored
//!   responses becomes the input items in front of the request's own
//!   ([`decode`]), and the answer is kept when it ends ([`Saving`]);
//! - `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and
//!   `GET /v1/responses/{id}/input_items` ([`handle`]).
//!
//! An id this store does not hold for the client's tenant is not ours to
//! answer: with `passthrough` it goes to the default upstream (an OpenAI
//! upstream's own stored responses stay reachable), else it is a 404.

use std::sync::Arc;

use bytes::Bytes;
use pingora::Result;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::h1::Session;
use super::{handled, reject, RequestCtx};
use crate::config::Config;
use crate::conversation::{Conversation, Dialect};
use crate::downstream::Client;
use crate::error::ApiError;
use crate::front::responses::{self, Context, Finished, Keep};
use crate::front::{picked_object_and_tools, Entry, Found, Take};
use crate::store::{unix_now, Record, Store};

/// A Responses request as a conversation, its `previous_response_id`
/// resolved through the store, and what keeping its answer takes.
/// Tool lists and entries the body's shape pass found known (`found`) are
/// taken as it found them.
pub async fn decode(
    config: &Config,
    tenant: &str,
    body: &[u8],
    found: &Found<'_>,
) -> Result<(Conversation, Box<Context>, Option<Saving>), ApiError> {
    let (tool, read) = (responses::TOOL, &responses::READ);
    let body = picked_object_and_tools(body, tool, read, Some("input"), found)?;
    let (mut read, top, tools, list) = (body.picked, body.rest, body.tools, body.history);
    let Some(store) = &config.store else {
        // No store: the decoder refuses a previous id, nothing is kept.
        let (conversation, context) = responses::decode_object(read, top, tools, list)?;
        return Ok((conversation, context, None));
    };
    let previous = match read.take("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(_) => {
            return Err(
                ApiError::bad_request("previous_response_id must be a string.")
                    .with_param("previous_response_id"),
            )
        }
    };
    let keep = match top.get("store") {
        None | Some(Value::Null) => store.by_default(),
        Some(flag) => flag
            .as_bool()
            .ok_or_else(|| ApiError::bad_request("store must be a boolean.").with_param("store"))?,
    };
    let input = match list {
        // Neither kept nor after a kept answer (Codex's requests): read as
        // without a store, most of a history decoded before.
        Some(list) if !keep && previous.is_none() => {
            within_limit(list.len(), config)?;
            let (conversation, mut context) =
                responses::decode_object(read, top, tools, Some(list))?;
            context.echo.store = keep;
            return Ok((conversation, context, None));
        }
        Some(list) => {
            let items = list.into_iter().map(Entry::into_value);
            responses::Input::Items(items.collect::<Result<_, _>>()?)
        }
        None => responses::Input::new(read.take("input"))?,
    };
    let mut input = input;
    if let responses::Input::Items(items) = &mut input {
        resolve_references(store, tenant, items).await?;
    }
    let history = match &previous {
        Some(id) => history(store, tenant, id, config.limits.max_body_bytes).await?,
        None => Vec::new(),
    };
    let own = keep
        .then(|| String::from_utf8(input.kept()))
        .transpose()
        .map_err(|e| ApiError::internal(format!("input items: {e}")))?;
    within_limit(history.len() + input.count(), config)?;
    let input = if previous.is_some() {
        let mut items = history;
        items.extend(input.into_items());
        Value::Array(items)
    } else {
        input.into_value()
    };
    // A stored conversation's items with the request's: entries never kept.
    let list = match input {
        Value::Array(items) => Some(items.into_iter().map(Entry::from).collect()),
        text => {
            read.put("input", text);
            None
        }
    };
    let (conversation, mut context) = responses::decode_object(read, top, tools, list)?;
    context.echo.store = keep;
    context.echo.previous_response_id.clone_from(&previous);
    let saving = own.map(|input| Saving {
        store: store.clone(),
        tenant: tenant.to_owned(),
        previous,
        input,
    });
    Ok((conversation, context, saving))
}

/// A conversation of `count` input items, its previous responses' with
/// its own, within `limits.max_messages`.
fn within_limit(count: usize, config: &Config) -> Result<(), ApiError> {
    if count > config.limits.max_messages {
        return Err(ApiError::bad_request(format!(
            "the conversation has {count} input items with its previous responses; the limit \
             is {}: start a new one",
            config.limits.max_messages
        ))
        .with_param("previous_response_id"));
    }
    Ok(())
}

/// The input and output items of the chain ending at `id`, oldest first;
/// no more bytes of it than a request body may have.
async fn history(
    store: &Store,
    tenant: &str,
    id: &str,
    max_bytes: usize,
) -> Result<Vec<Value>, ApiError> {
    let mut chain: Vec<Arc<Record>> = Vec::new();
    let mut bytes = 0;
    let mut next = Some(id.to_owned());
    while let Some(id) = next {
        let record = store
            .load(tenant, &id)
            .await
            .map_err(|_| unavailable())?
            .ok_or_else(|| {
                // A 400, as OpenAI answers it (the SDKs' BadRequestError).
                ApiError::bad_request(format!("Previous response with id '{id}' not found."))
                    .with_param("previous_response_id")
                    .with_code("previous_response_not_found")
            })?;
        bytes += record.input.len() + record.response.len();
        if bytes > max_bytes {
            return Err(ApiError::bad_request(format!(
                "the conversation before this turn is larger than limits.max_body_bytes \
                 ({max_bytes} bytes): start a new one"
            ))
            .with_param("previous_response_id"));
        }
        next = record.previous.clone();
        chain.push(record);
    }
    let mut items = Vec::new();
    for record in chain.iter().rev() {
        let input: Vec<Value> = serde_json::from_str(&record.input).unwrap_or_default();
        let answer: Answer = serde_json::from_str(&record.response).unwrap_or_default();
        items.extend(input);
        items.extend(answer.output);
    }
    Ok(items)
}

/// Puts in place of each `item_reference` of `items` the kept item it
/// names, as OpenAI does: the Vercel AI SDK sends an earlier answer's items
/// so when its responses are stored, and skipped, the model lost every turn
/// of its own. An item's id names the response holding it
/// ([`responses::response_of_item`]); each is loaded once.
async fn resolve_references(
    store: &Store,
    tenant: &str,
    items: &mut [Value],
) -> Result<(), ApiError> {
    let mut loaded: Vec<(String, Vec<Value>)> = Vec::new();
    for item in items.iter_mut() {
        let Some(id) = responses::referenced(item).map(str::to_owned) else {
            continue;
        };
        let not_found =
            || ApiError::bad_request(format!("Item with id '{id}' not found.")).with_param("input");
        let response = responses::response_of_item(&id).ok_or_else(not_found)?;
        let at = match loaded.iter().position(|(held, _)| *held == response) {
            Some(at) => at,
            None => {
                let record = store
                    .load(tenant, &response)
                    .await
                    .map_err(|_| unavailable())?
                    .ok_or_else(not_found)?;
                let answer: Answer = serde_json::from_str(&record.response).unwrap_or_default();
                loaded.push((response, answer.output));
                loaded.len() - 1
            }
        };
        let found = loaded[at].1.iter().find(|kept| kept["id"] == id.as_str());
        *item = found.cloned().ok_or_else(not_found)?;
    }
    Ok(())
}

/// What a kept Response object adds to the conversation: its output items.
/// Its other members (usage, tools, text format, …) are skipped, not built.
#[derive(Default, Deserialize)]
struct Answer {
    #[serde(default)]
    output: Vec<Value>,
}

fn unavailable() -> ApiError {
    ApiError::unavailable("the response store is unavailable; try again")
        .with_code("store_unavailable")
}

/// What keeping an answer takes, until the agent that answers is known.
pub struct Saving {
    store: Arc<Store>,
    tenant: String,
    previous: Option<String>,
    /// The request's own input items, as JSON.
    input: String,
}

impl Saving {
    /// The encoder's hook that keeps the answer of `agent`.
    pub fn keep(self, agent: &str) -> Keep {
        let agent = agent.to_owned();
        Box::new(move |finished: Finished<'_>| {
            let now = unix_now();
            self.store.save(Record {
                id: finished.id.to_owned(),
                tenant: self.tenant,
                agent,
                previous: self.previous,
                status: finished.status.to_owned(),
                created_at: now,
                expires_at: now + self.store.ttl().as_secs(),
                input: self.input,
                response: finished.response,
            });
        })
    }
}

/// What a `/v1/responses/{id}…` request asks for.
enum Ask<'a> {
    Get(&'a str),
    Delete(&'a str),
    InputItems(&'a str),
}

/// The route of `method path`, if it is one of ours.
pub fn is_route(method: &str, path: &str) -> bool {
    ask(method, path).is_some()
}

fn ask<'a>(method: &str, path: &'a str) -> Option<Ask<'a>> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if id.is_empty() {
        return None;
    }
    match (method, tail) {
        ("GET", "") => Some(Ask::Get(id)),
        ("DELETE", "") => Some(Ask::Delete(id)),
        ("GET", "input_items") => Some(Ask::InputItems(id)),
        _ => None,
    }
}

/// Answers a stored response's route; `Ok(false)`: not ours to answer (an
/// id that is not ours, with `passthrough`; a route of a response we do not
/// serve).
pub async fn handle(session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
    let config = ctx.config.clone();
    let req = session.req_header();
    let path = req.uri.path().to_owned();
    let query = req.uri.query().unwrap_or_default().to_owned();
    let method = req.method.as_str().to_owned();
    let Some(ask) = ask(&method, &path) else {
        return Ok(false);
    };
    let id = match &ask {
        Ask::Get(id) | Ask::Delete(id) | Ask::InputItems(id) => *id,
    };
    let found = match &config.store {
        Some(store) => match store.load(&ctx.tenant, id).await {
            Ok(found) => found,
            Err(_) => return reject(session, Dialect::Chat, &unavailable()).await,
        },
        None => None,
    };
    let Some(record) = found else {
        if config.passthrough {
            return Ok(false);
        }
        let error = ApiError::not_found(format!("Response with id '{id}' not found."));
        return reject(session, Dialect::Chat, &error).await;
    };
    ctx.agent = Some(record.agent.clone());
    let body = match ask {
        Ask::Get(_) => Bytes::from(record.response.clone()),
        Ask::Delete(id) => {
            let deleted = match &config.store {
                Some(store) => store.delete(&ctx.tenant, id).await,
                None => Ok(false),
            };
            if deleted.is_err() {
                return reject(session, Dialect::Chat, &unavailable()).await;
            }
            let body = json!({"id": id, "object": "response.deleted", "deleted": true});
            Bytes::from(body.to_string())
        }
        Ask::InputItems(_) => match input_items_page(&record.input, &query) {
            Ok(page) => Bytes::from(page.to_string()),
            Err(error) => return reject(session, Dialect::Chat, &error).await,
        },
    };
    let mut client = Client::new(session, config.limits.heartbeat);
    handled(client.respond_json(200, body, &[]).await.is_err())
}

/// One page of a response's input items, as OpenAI lists them: `order`
/// (`desc` by default: newest first), `limit` (1-100, 20), `after` and
/// `before` (item ids).
fn input_items_page(input: &str, query: &str) -> Result<Value, ApiError> {
    let mut items: Vec<Value> = serde_json::from_str(input).unwrap_or_default();
    let mut limit = 20;
    let mut newest_first = true;
    let (mut after, mut before) = (None, None);
    // Decoded, as the model list's are.
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "limit" => limit = super::page_limit(&value, 100)?,
            "order" => match &*value {
                "asc" => newest_first = false,
                "desc" => newest_first = true,
                _ => {
                    return Err(
                        ApiError::bad_request("order must be asc or desc.").with_param("order")
                    )
                }
            },
            "after" => after = Some(value),
            "before" => before = Some(value),
            _ => {}
        }
    }
    if newest_first {
        items.reverse();
    }
    let position = |id: &str| {
        items
            .iter()
            .position(|item| item.get("id").and_then(Value::as_str) == Some(id))
    };
    let start = after.as_deref().and_then(position).map_or(0, |i| i + 1);
    let end = before.as_deref().and_then(position).unwrap_or(items.len());
    let window = items.get(start..end.max(start)).unwrap_or_default();
    let data: Vec<Value> = window.iter().take(limit).cloned().map(listed).collect();
    let id_at = |item: Option<&Value>| item.and_then(|i| i.get("id")).cloned();
    let mut page = Map::new();
    page.insert("object".into(), json!("list"));
    page.insert(
        "first_id".into(),
        id_at(data.first()).unwrap_or(Value::Null),
    );
    page.insert("last_id".into(), id_at(data.last()).unwrap_or(Value::Null));
    page.insert("has_more".into(), json!(window.len() > data.len()));
    page.insert("data".into(), Value::Array(data));
    Ok(Value::Object(page))
}

/// An input item as OpenAI lists it: a message in the short form a client
/// may send (`{"role", "content": "text"}`) with its `type` and its text as
/// a part, as the SDKs' types read it.
fn listed(mut item: Value) -> Value {
    let Value::Object(fields) = &mut item else {
        return item;
    };
    let Some(role) = fields.get("role").and_then(Value::as_str) else {
        return item;
    };
    let part = match role {
        "assistant" => "output_text",
        _ => "input_text",
    };
    if let Some(content) = fields.get_mut("content") {
        if let Value::String(text) = content {
            *content = json!([{"type": part, "text": std::mem::take(text)}]);
        }
    }
    fields
        .entry("type")
        .or_insert_with(|| Value::from("message"));
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: usize) -> String {
        let items: Vec<Value> = (0..n).map(|i| json!({"id": format!("msg_{i}")})).collect();
        serde_json::to_string(&items).unwrap()
    }

    fn ids(page: &Value) -> Vec<&str> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn input_items_page_as_openai_does() {
        let input = items(5);
        let page = input_items_page(&input, "").unwrap();
        assert_eq!(ids(&page), ["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"]);
        assert_eq!(page["has_more"], json!(false));
        let page = input_items_page(&input, "order=asc&limit=2").unwrap();
        assert_eq!(ids(&page), ["msg_0", "msg_1"]);
        assert_eq!(
            (page["first_id"].as_str(), page["has_more"].as_bool()),
            (Some("msg_0"), Some(true))
        );
        let page = input_items_page(&input, "order=asc&limit=2&after=msg_1").unwrap();
        assert_eq!(ids(&page), ["msg_2", "msg_3"]);
        let page = input_items_page(&input, "limit=10&after=msg_3&before=msg_0").unwrap();
        assert_eq!(ids(&page), ["msg_2", "msg_1"]);
        // Messages in short form are listed in full.
        let short = json!([
            {"role": "user", "content": "hi", "id": "msg_a"},
            {"type": "message", "role": "assistant", "content": "hello", "id": "msg_b"},
            {"type": "function_call_output", "call_id": "c", "output": "x", "id": "fc_c"}
        ]);
        let page = input_items_page(&short.to_string(), "order=asc").unwrap();
        assert_eq!(
            page["data"],
            json!([
                {"type": "message", "role": "user", "id": "msg_a",
                 "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "message", "role": "assistant", "id": "msg_b",
                 "content": [{"type": "output_text", "text": "hello"}]},
                {"type": "function_call_output", "call_id": "c", "output": "x", "id": "fc_c"}
            ])
        );
        let page = input_items_page("[]", "").unwrap();
        assert_eq!(
            (page["first_id"].clone(), page["has_more"].clone()),
            (Value::Null, json!(false))
        );
        for bad in ["limit=0", "limit=101", "limit=x", "order=up"] {
            assert_eq!(
                input_items_page(&input, bad).unwrap_err().status,
                400,
                "{bad}"
            );
        }
    }

    #[test]
    fn only_the_three_routes_are_ours() {
        assert!(is_route("GET", "/v1/responses/resp_1"));
        assert!(is_route("DELETE", "/v1/responses/resp_1"));
        assert!(is_route("GET", "/v1/responses/resp_1/input_items"));
        assert!(!is_route("POST", "/v1/responses/resp_1/cancel"));
        assert!(!is_route("GET", "/v1/responses/"));
        assert!(!is_route("PUT", "/v1/responses/resp_1"));
    }
}

//! `/admin/memories`: an operator lists and deletes a user's memory notes
//! (their right to see and erase what is kept about them). Behind one of
//! `auth.admin_keys`, never a client key; off without one.
//!
//! - `GET /admin/memories?user=<identity>[&agent=<id>]`: the notes, oldest first;
//! - `DELETE /admin/memories?user=<identity>[&agent=<id>]`: all of them;
//! - `DELETE /admin/memories/<id>?user=<identity>`: one.
//!
//! `user` is an identity as the notes show it (`name:alice`,
//! `name:acme/user:bob`, `anonymous`); empty for agents' own notes.

use bytes::Bytes;
use pingora::Result;
use serde_json::{json, Value};

use super::h1::Session;
use super::{auth, handled, reject};
use crate::config::Config;
use crate::conversation::Dialect;
use crate::downstream::Client;
use crate::error::ApiError;
use crate::store::Note;

pub const PREFIX: &str = "/admin/memories";

pub fn is_route(path: &str) -> bool {
    path == PREFIX
        || path
            .strip_prefix(PREFIX)
            .is_some_and(|rest| rest.starts_with('/'))
}

pub async fn handle(session: &mut Session, config: &Config) -> Result<bool> {
    let req = session.req_header();
    if config.admin_keys.is_empty() {
        let error = ApiError::not_found("admin routes are off: configure auth.admin_keys");
        return reject(session, Dialect::Chat, &error).await;
    }
    if !auth::is_admin(config, req) {
        return reject(session, Dialect::Chat, &ApiError::invalid_api_key()).await;
    }
    let Some(store) = config.store.clone() else {
        let error = ApiError::not_found("no memory is kept: `store.kind` is none");
        return reject(session, Dialect::Chat, &error).await;
    };
    let (mut user, mut agent) = (None, None);
    for (key, value) in form_urlencoded::parse(req.uri.query().unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "user" => user = Some(value.into_owned()),
            "agent" => agent = Some(value.into_owned()),
            _ => {}
        }
    }
    let Some(user) = user else {
        let error = ApiError::bad_request("`user` (an identity) is required").with_param("user");
        return reject(session, Dialect::Chat, &error).await;
    };
    let one = req.uri.path()[PREFIX.len()..]
        .strip_prefix('/')
        .map(str::to_owned);
    let method = req.method.as_str().to_owned();
    let unavailable = || ApiError::unavailable("the store is unavailable; try again");
    let notes: Vec<Note> = match store.notes(&user).await {
        Ok(notes) => notes
            .into_iter()
            .filter(|n| agent.as_deref().is_none_or(|a| n.agent == a))
            .filter(|n| one.as_deref().is_none_or(|id| n.id == id))
            .collect(),
        Err(_) => return reject(session, Dialect::Chat, &unavailable()).await,
    };
    let body = match (method.as_str(), &one) {
        ("GET", None) => json!({
            "object": "list",
            "data": notes.iter().map(note_json).collect::<Vec<_>>(),
        }),
        ("DELETE", _) => {
            if let (Some(id), true) = (&one, notes.is_empty()) {
                let error = ApiError::not_found(format!("no note `{id}` of `{user}`"));
                return reject(session, Dialect::Chat, &error).await;
            }
            let ids: Vec<String> = notes.iter().map(|n| n.id.clone()).collect();
            if store.delete_notes(&user, &ids).await.is_err() {
                return reject(session, Dialect::Chat, &unavailable()).await;
            }
            match one {
                Some(id) => json!({"id": id, "object": "memory.deleted", "deleted": true}),
                None => json!({"object": "list", "deleted": ids.len()}),
            }
        }
        _ => {
            let error = ApiError::method_not_allowed(format!("{method} is not allowed here"));
            return reject(session, Dialect::Chat, &error).await;
        }
    };
    let mut client = Client::new(session, config.limits.heartbeat);
    let sent = client
        .respond_json(200, Bytes::from(body.to_string()), &[])
        .await;
    handled(sent.is_err())
}

fn note_json(note: &Note) -> Value {
    json!({
        "id": note.id,
        "object": "memory",
        "user": note.owner,
        "agent": note.agent,
        "scope": note.scope,
        "session": note.session,
        "text": note.text,
        "created_at": note.created_at / 1000,
    })
}

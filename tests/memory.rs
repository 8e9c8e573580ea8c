//! Agents that remember: notes written with `remember` in one conversation
//! are in the system prompt of the same user's next one, never another
//! user's; session notes stay in their session; `recall` and `forget` work;
//! an operator lists and erases a user's notes; replicas sharing a Redis
//! store share memory.

mod common;

use common::*;
use serde_json::{json, Value};

/// A model scripted by the last user message: `call <tool> <json>` makes
/// that call, and once the result is in, answers `tool said: <result>`;
/// anything else is answered with the system prompt it got, so a test
/// reads what was injected.
async fn scripted_model() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        if let Some(result) = req.tool_results().last() {
            return Reply::events(vec![
                content(&format!("tool said: {result}")),
                finish("stop"),
            ]);
        }
        let body = req.json();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let text = |m: &Value| match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
            _ => String::new(),
        };
        let last_user = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(text)
            .unwrap_or_default();
        if let Some((name, args)) = last_user
            .strip_prefix("call ")
            .and_then(|rest| rest.split_once(' '))
        {
            return Reply::events(vec![tool_call(0, "c0", name, args), finish("tool_calls")]);
        }
        let system = messages
            .first()
            .filter(|m| m["role"] == "system")
            .map(text)
            .unwrap_or_default();
        Reply::events(vec![content(&format!("system: {system}")), finish("stop")])
    })
    .await
}

fn config(upstream: &str, store: &str) -> String {
    one_upstream(
        upstream,
        &format!(
            "auth:
  api_keys: [{{ key: sk-alice, name: alice }}, {{ key: sk-bob, name: bob }}]
  admin_keys: [sk-admin]
{store}
agents:
  helper:
    system_prompt: You help.
    memory: {{ scope: [user, session] }}
"
        ),
    )
}

/// One chat turn to `helper` as `key` in `session`: the answer's text.
async fn say(port: u16, key: &str, session: &str, text: &str) -> String {
    let auth = format!("Bearer {key}");
    let body = json!({"model": "helper", "messages": [{"role": "user", "content": text}]});
    let response = request(
        port,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
            ("x-session-id", session),
        ],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn admin(port: u16, key: &str, method: &str, path: &str) -> Response {
    let auth = format!("Bearer {key}");
    request(port, method, path, &[("authorization", &auth)], b"").await
}

fn note_id(answer: &str) -> String {
    let start = answer.find("[mem_").expect("a note id") + 1;
    let end = start + answer[start..].find(']').unwrap();
    answer[start..end].to_owned()
}

#[tokio::test]
async fn a_user_is_remembered_across_sessions_and_never_shown_to_another() {
    let model = scripted_model().await;
    let proxy = Proxy::start(&config(&model.url(), "")).await;
    let port = proxy.port;

    let saved = say(
        port,
        "sk-alice",
        "s1",
        r#"call remember {"text":"Prefers Celsius"}"#,
    )
    .await;
    assert!(saved.starts_with("tool said: remembered [mem_"), "{saved}");
    let celsius = note_id(&saved);
    let topic = say(
        port,
        "sk-alice",
        "s1",
        r#"call remember {"text":"This chat is about Oslo","scope":"session"}"#,
    )
    .await;
    assert!(topic.contains("remembered"), "{topic}");

    // A new session of alice's: her user notes, not the other session's.
    let fresh = say(port, "sk-alice", "s2", "hello").await;
    assert!(
        fresh.starts_with("system: You help.\n\n<memory scope=\"user\">"),
        "{fresh}"
    );
    assert!(
        fresh.contains(&format!("- [{celsius}] Prefers Celsius")),
        "{fresh}"
    );
    assert!(
        !fresh.contains("Oslo"),
        "session notes stay in their session: {fresh}"
    );
    let same = say(port, "sk-alice", "s1", "hello").await;
    assert!(same.contains("Prefers Celsius") && same.contains("<memory scope=\"session\">"));
    assert!(same.contains("This chat is about Oslo"), "{same}");

    // Bob, even claiming alice's session id, sees none of it.
    let bob = say(port, "sk-bob", "s1", "hello").await;
    assert_eq!(bob, "system: You help.");
    let recalled = say(port, "sk-bob", "s1", r#"call recall {"query":"celsius"}"#).await;
    assert_eq!(recalled, "tool said: no saved notes match");
    let stolen = say(
        port,
        "sk-bob",
        "s1",
        &format!(r#"call forget {{"id":"{celsius}"}}"#),
    )
    .await;
    assert!(stolen.contains("no note"), "{stolen}");

    // Alice recalls and forgets her own.
    let recalled = say(
        port,
        "sk-alice",
        "s2",
        r#"call recall {"query":"celsius weather"}"#,
    )
    .await;
    assert_eq!(
        recalled,
        format!("tool said: - [{celsius}] (user) Prefers Celsius")
    );
    let forgot = say(
        port,
        "sk-alice",
        "s2",
        &format!(r#"call forget {{"id":"{celsius}"}}"#),
    )
    .await;
    assert_eq!(forgot, format!("tool said: forgot [{celsius}]"));
    assert_eq!(
        say(port, "sk-alice", "s2", "hello").await,
        "system: You help."
    );

    // The same through the Messages front: the memory is the agent's,
    // whatever the dialect.
    say(
        port,
        "sk-alice",
        "s3",
        r#"call remember {"text":"Name is Alice"}"#,
    )
    .await;
    let body = json!({"model": "helper", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hello"}]});
    let response = request(
        port,
        "POST",
        "/v1/messages",
        &[
            ("content-type", "application/json"),
            ("x-api-key", "sk-alice"),
            ("anthropic-version", "2023-06-01"),
        ],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let text = response.json()["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(text.contains("Name is Alice"), "{text}");
}

#[tokio::test]
async fn an_operator_lists_and_erases_a_users_notes_with_an_admin_key_only() {
    let model = scripted_model().await;
    let proxy = Proxy::start(&config(&model.url(), "")).await;
    let port = proxy.port;
    say(
        port,
        "sk-alice",
        "s1",
        r#"call remember {"text":"Likes tea"}"#,
    )
    .await;
    say(
        port,
        "sk-alice",
        "s1",
        r#"call remember {"text":"Has a cat"}"#,
    )
    .await;
    say(
        port,
        "sk-bob",
        "s1",
        r#"call remember {"text":"Likes coffee"}"#,
    )
    .await;

    let path = "/admin/memories?user=name%3Aalice";
    for key in ["sk-alice", "nope"] {
        let refused = admin(port, key, "GET", path).await;
        assert_eq!(refused.status, 401, "a client key is not an admin key");
        assert_eq!(refused.json()["error"]["code"], "invalid_api_key");
    }
    let missing = admin(port, "sk-admin", "GET", "/admin/memories").await;
    assert_eq!(
        (missing.status, missing.json()["error"]["param"].clone()),
        (400, json!("user"))
    );

    let listed = admin(port, "sk-admin", "GET", path).await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let notes = listed.json()["data"].as_array().cloned().unwrap();
    let texts: Vec<&str> = notes.iter().map(|n| n["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["Likes tea", "Has a cat"]);
    assert_eq!(notes[0]["user"], "name:alice");
    assert_eq!(notes[0]["agent"], "helper");
    assert_eq!(notes[0]["scope"], "user");

    let one = notes[0]["id"].as_str().unwrap();
    let deleted = admin(
        port,
        "sk-admin",
        "DELETE",
        &format!("/admin/memories/{one}?user=name%3Aalice"),
    )
    .await;
    assert_eq!(
        deleted.json(),
        json!({"id": one, "object": "memory.deleted", "deleted": true})
    );
    let again = admin(
        port,
        "sk-admin",
        "DELETE",
        &format!("/admin/memories/{one}?user=name%3Aalice"),
    )
    .await;
    assert_eq!(again.status, 404);
    let all = admin(port, "sk-admin", "DELETE", path).await;
    assert_eq!(all.json()["deleted"], 1);
    assert_eq!(
        say(port, "sk-alice", "s9", "hello").await,
        "system: You help."
    );
    let bob = admin(port, "sk-admin", "GET", "/admin/memories?user=name%3Abob").await;
    assert_eq!(
        bob.json()["data"][0]["text"],
        "Likes coffee",
        "bob's notes are untouched"
    );
}

/// With `auth.trust_user_field`, the `user` field names the user within the
/// key's tenant: two users of one app key are apart.
#[tokio::test]
async fn a_trusted_user_field_separates_users_of_one_key() {
    let model = scripted_model().await;
    let yaml =
        config(&model.url(), "").replace("admin_keys:", "trust_user_field: true\n  admin_keys:");
    let proxy = Proxy::start(&yaml).await;
    let chat = |user: &'static str, text: &'static str| {
        let body = json!({"model": "helper", "user": user, "messages": [{"role": "user", "content": text}]});
        async move {
            let response = request(
                proxy.port,
                "POST",
                "/v1/chat/completions",
                &[
                    ("content-type", "application/json"),
                    ("authorization", "Bearer sk-alice"),
                ],
                body.to_string().as_bytes(),
            )
            .await;
            response.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
    };
    chat("u1", r#"call remember {"text":"Speaks Norwegian"}"#).await;
    assert!(chat("u1", "hello").await.contains("Speaks Norwegian"));
    assert_eq!(chat("u2", "hello").await, "system: You help.");
    let listed = admin(
        proxy.port,
        "sk-admin",
        "GET",
        "/admin/memories?user=name%3Aalice%2Fuser%3Au1",
    )
    .await;
    assert_eq!(listed.json()["data"][0]["text"], "Speaks Norwegian");
}

/// Two replicas on one Redis: a note written through one is in the prompt
/// the other sends.
#[tokio::test]
async fn replicas_sharing_redis_share_memory() {
    let model = scripted_model().await;
    let redis = RedisServer::start().await;
    let store = format!("store: {{ kind: redis, url: \"{}\" }}", redis.url());
    let a = Proxy::start(&config(&model.url(), &store)).await;
    let b = Proxy::start(&config(&model.url(), &store)).await;
    say(
        a.port,
        "sk-alice",
        "s1",
        r#"call remember {"text":"Works nights"}"#,
    )
    .await;
    let other = say(b.port, "sk-alice", "s2", "hello").await;
    assert!(other.contains("Works nights"), "{other}");
    assert_eq!(
        say(b.port, "sk-bob", "s1", "hello").await,
        "system: You help."
    );
}

#[tokio::test]
async fn memory_without_a_store_is_a_config_error() {
    let yaml = config("http://127.0.0.1:9", "store: { kind: none }");
    let path = scratch_dir().join("proxy.yaml");
    std::fs::write(&path, yaml).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_agent-proxy"))
        .args(["--config", path.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("agents.helper.memory: memory needs a store"),
        "{stderr}"
    );
}

/// The session cascade, as a tool sees it through `inject: { request:
/// session }`: the client's `X-Session-Id`, else a client's own id header
/// (Codex's `session-id`), else an id derived from how the conversation
/// begins: the same for every turn of it, another for another conversation.
#[tokio::test]
async fn the_session_comes_from_the_client_or_from_how_the_conversation_begins() {
    let model = FakeServer::start(|req, _| {
        if req.path.ends_with("/tool") {
            // The tool: answers with the arguments it got.
            return Reply::raw_json(200, &req.body);
        }
        match req.tool_results().last() {
            Some(result) => Reply::events(vec![content(result), finish("stop")]),
            None => Reply::events(vec![
                tool_call(0, "c0", "whoami", "{}"),
                finish("tool_calls"),
            ]),
        }
    })
    .await;
    let yaml = one_upstream(
        &model.url(),
        &format!(
            "tools:
  whoami:
    http: {{ url: \"{}/tool\" }}
    inject: {{ session: {{ request: session }} }}
agents:
  helper: {{ tools: [whoami] }}
",
            model.url()
        ),
    );
    let proxy = Proxy::start(&yaml).await;
    let session_of = |headers: &'static [(&'static str, &'static str)], messages: Value| async move {
        let body = json!({"model": "helper", "messages": messages});
        let response = request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[&[("content-type", "application/json")], headers].concat(),
            body.to_string().as_bytes(),
        )
        .await;
        let answer = response.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        serde_json::from_str::<Value>(&answer).unwrap_or_default()["session"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let first = json!([{"role": "user", "content": "Plan a trip"}]);
    let later = json!([
        {"role": "user", "content": "Plan a trip"},
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "Oslo"}
    ]);
    assert_eq!(
        session_of(
            &[("x-session-id", "s-explicit"), ("session-id", "codex")],
            first.clone()
        )
        .await,
        "s-explicit"
    );
    assert_eq!(
        session_of(&[("session-id", "codex-7")], first.clone()).await,
        "codex-7"
    );
    let derived = session_of(&[], first).await;
    assert!(derived.starts_with("sess_"), "{derived}");
    assert_eq!(
        session_of(&[], later).await,
        derived,
        "every turn of a conversation"
    );
    let other = session_of(&[], json!([{"role": "user", "content": "Write a poem"}])).await;
    assert!(other.starts_with("sess_") && other != derived);
    assert!(proxy.logged(&[&derived]).await, "the log line names it");
}

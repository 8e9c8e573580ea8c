//! The official Anthropic SDKs on the Messages front door: the `anthropic`
//! Python client (`tests/python/anthropic_check.py`) and `@anthropic-ai/sdk`
//! for Node (`tests/node/anthropic_check.mjs`), both installed on first use.

mod common;

use std::process::Command;

use common::*;
use serde_json::{json, Value};

/// The key the SDKs send as `x-api-key`.
const KEY: &str = "sk-ant-proxy-test";

/// What the fake tokenizer counts for any prompt.
const TOKENS: usize = 42;

/// The text of a chat message's `content`: a string, or its text parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// A scripted llama-server: its model list, its tokenizer, and a chat that
/// answers by the conversation's first user message — `get_weather` then an
/// answer with reasoning; a `read_file` call for the client then an answer
/// from its result; or the system prompt it got, echoed.
async fn upstream() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::json(
                200,
                json!({"object": "list", "data": [{"id": "llama", "object": "model"}]}),
            );
        }
        if req.path.ends_with("/apply-template") {
            return Reply::json(200, json!({"prompt": "<the templated prompt>"}));
        }
        if req.path.ends_with("/tokenize") {
            return Reply::json(200, json!({"tokens": vec![1; TOKENS]}));
        }
        let body = req.json();
        let messages = body["messages"].as_array().unwrap();
        let first_user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .map(|m| text_of(&m["content"]))
            .unwrap_or_default();
        let results = req.tool_results();
        if first_user.contains("system prompt") {
            let system = messages
                .iter()
                .find(|m| m["role"] == "system")
                .map(|m| text_of(&m["content"]))
                .unwrap_or_default();
            return Reply::events(vec![content(&system), finish("stop"), usage(5, 1)]);
        }
        match (first_user.contains("notes.txt"), results.last()) {
            (true, None) => Reply::events(vec![
                tool_call(0, "toolu_f1", "read_file", "{\"path\":"),
                tool_args(0, "\"notes.txt\"}"),
                finish("tool_calls"),
                usage(6, 3),
            ]),
            (true, Some(result)) => Reply::events(vec![
                content(&format!("notes.txt says: {result}")),
                finish("stop"),
                usage(12, 4),
            ]),
            (false, result) => weather_round(result.is_some()),
        }
    })
    .await
}

async fn proxy(upstream: &FakeServer, tool: &FakeServer) -> Proxy {
    Proxy::start(&format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{}/v1" }} }}
auth: {{ api_keys: ["{KEY}"] }}
tools:
  get_weather:
    description: Current weather for a city
    parameters: {{ type: object, properties: {{ city: {{ type: string }} }}, required: [city] }}
    http: {{ url: "{}" }}
agents:
  weather:
    name: Weather
    description: Answers with the current weather
    system_prompt: "You are a weather assistant."
    tools: [get_weather]
"#,
        upstream.url(),
        tool.url()
    ))
    .await
}

/// Runs a check script against `proxy` with the client key (the SDK adds `/v1`).
async fn run_check(command: Command, proxy: &Proxy, passed: &str) {
    let base_url = format!("http://127.0.0.1:{}", proxy.port);
    run_sdk_check(
        command,
        proxy,
        base_url,
        &[("AGENT_PROXY_KEY", KEY)],
        passed,
    )
    .await;
}

/// What every check's requests must have done upstream: the client's key
/// never left the proxy, and the agent's prompt and tool were sent.
fn check_upstream_saw(upstream: &FakeServer) {
    let requests = upstream.requests();
    for request in &requests {
        assert!(request.header("x-api-key").is_none(), "{request:?}");
        assert!(
            !request
                .header("authorization")
                .is_some_and(|v| v.contains(KEY)),
            "{request:?}"
        );
    }
    let chats: Vec<Value> = requests
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| r.json())
        .collect();
    assert!(!chats.is_empty());
    for chat in &chats {
        assert_eq!(chat["messages"][0]["role"], "system", "{chat}");
        assert!(
            text_of(&chat["messages"][0]["content"]).starts_with("You are a weather assistant."),
            "{chat}"
        );
        assert_eq!(
            chat["tools"][0]["function"]["name"], "get_weather",
            "{chat}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_python_client_talks_to_an_agent() {
    // Installed (the first time) before anything starts: it can take a while.
    let python = tokio::task::spawn_blocking(python_with_sdks).await.unwrap();
    let tool = weather_tool().await;
    let upstream = upstream().await;
    let proxy = proxy(&upstream, &tool).await;
    let mut command = python;
    command.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/anthropic_check.py"
    ));
    run_check(command, &proxy, "all anthropic python checks passed").await;
    check_upstream_saw(&upstream);
    // count_tokens asked the upstream's template for the agent's whole
    // request: its prompt and its tool with the client's message.
    let templated = upstream
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/apply-template"))
        .expect("count_tokens used the upstream's template")
        .json();
    assert_eq!(templated["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(
        text_of(&templated["messages"][0]["content"]),
        "You are a weather assistant."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_node_client_talks_to_an_agent() {
    let node = tokio::task::spawn_blocking(|| node_with_sdks("anthropic_check.mjs"))
        .await
        .unwrap();
    let tool = weather_tool().await;
    let upstream = upstream().await;
    let proxy = proxy(&upstream, &tool).await;
    run_check(node, &proxy, "all anthropic node checks passed").await;
    check_upstream_saw(&upstream);
}

//! The official `openai` SDKs on the Responses front door: the Python client
//! (`tests/python/responses_check.py`) and the Node client
//! (`tests/node/responses_check.mjs`), both installed on first use.

mod common;

use common::*;
use serde_json::json;

/// A scripted upstream for the SDK checks: `get_weather` then an answer, or
/// a `read_file` call for the client and an answer from its result; 404 for
/// anything but a model call.
async fn upstream() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method != "POST" {
            // What llama-server says of a path it does not serve (an id the
            // proxy's store does not hold is passed through to it).
            let error = json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}});
            return Reply::json(404, error);
        }
        let body = req.json();
        let messages = body["messages"].as_array().unwrap();
        let results = req.tool_results();
        if messages.iter().any(|m| m["content"] == "Break off.") {
            // The model server fails mid-answer.
            return Reply::Sse {
                steps: vec![Step::Bytes(
                    format!("data: {}\n\n", content("Half an")).into_bytes(),
                )],
                complete: false,
            };
        }
        let asks_file = messages.iter().any(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.contains("notes.txt"))
        });
        match (asks_file, results.last()) {
            (true, None) => Reply::events(vec![
                tool_call(0, "call_f", "read_file", "{\"path\":\"notes.txt\"}"),
                finish("tool_calls"),
            ]),
            (true, Some(result)) => Reply::events(vec![
                content(&format!("notes.txt says: {result}")),
                finish("stop"),
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
tools:
  get_weather:
    description: Current weather for a city
    parameters: {{ type: object, properties: {{ city: {{ type: string }} }} }}
    http: {{ url: "{}" }}
agents:
  weather: {{ system_prompt: "You are a weather assistant.", tools: [get_weather] }}
"#,
        upstream.url(),
        tool.url()
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_speaks_responses_to_an_agent() {
    // Installed (the first time) before anything starts: it can take a while.
    let mut python = tokio::task::spawn_blocking(python_with_sdks).await.unwrap();
    let tool = weather_tool().await;
    let upstream = upstream().await;
    let proxy = proxy(&upstream, &tool).await;
    let script = format!(
        "{}/tests/python/responses_check.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let base_url = format!("http://127.0.0.1:{}/v1", proxy.port);
    python.arg(script);
    run_sdk_check(
        python,
        &proxy,
        base_url,
        &[],
        "all openai responses checks passed",
    )
    .await;
    // The chained turn reached the model with the turn before it.
    let chained = upstream.requests().iter().any(|r| {
        let body = String::from_utf8_lossy(&r.body).into_owned();
        body.contains("Weather in Paris?") && body.contains("And tomorrow?")
    });
    assert!(chained, "the model saw the first turn in the second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_node_client_speaks_responses_to_an_agent() {
    // Installed (the first time) before anything starts: it can take a while.
    let node = tokio::task::spawn_blocking(|| node_with_sdks("responses_check.mjs"))
        .await
        .unwrap();
    let tool = weather_tool().await;
    let upstream = upstream().await;
    let proxy = proxy(&upstream, &tool).await;
    let base_url = format!("http://127.0.0.1:{}/v1", proxy.port);
    run_sdk_check(
        node,
        &proxy,
        base_url,
        &[],
        "all openai node responses checks passed",
    )
    .await;
}

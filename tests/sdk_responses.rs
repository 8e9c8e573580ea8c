//! The official `openai` SDKs on the Responses front door: the Python client
//! (`tests/python/responses_check.py`) and the Node client
//! (`tests/node/responses_check.mjs`), both installed on first use.

mod common;

use common::*;
use serde_json::json;

/// A scripted upstream for the SDK checks: `get_weather` then an answer, or
/// a `read_file` call for the client and an answer from its result.
async fn upstream() -> FakeServer {
    FakeServer::start(|req, _| {
        let body = req.json();
        let messages = body["messages"].as_array().unwrap();
        let results = req.tool_results();
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
            (false, None) => Reply::events(vec![
                reasoning("Let me check."),
                tool_call(0, "call_1", "get_weather", "{\"city\":\"Paris\"}"),
                finish("tool_calls"),
                usage(8, 2),
            ]),
            (false, Some(_)) => Reply::events(vec![
                reasoning("Warm enough."),
                content("It is 21 °C"),
                content(" in Paris."),
                finish("stop"),
                usage(30, 2),
            ]),
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
    let tool =
        FakeServer::start(|_, _| Reply::json(200, json!({"city": "Paris", "temp_c": 21}))).await;
    let upstream = upstream().await;
    let proxy = proxy(&upstream, &tool).await;
    let script = format!(
        "{}/tests/python/responses_check.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let base_url = format!("http://127.0.0.1:{}/v1", proxy.port);
    let output = tokio::task::spawn_blocking(move || {
        python_with_sdks()
            .arg(script)
            .env("AGENT_PROXY_BASE_URL", base_url)
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "openai responses checks failed\nstdout:\n{stdout}\nstderr:\n{stderr}\nproxy log:\n{}",
        proxy.logs()
    );
    assert!(
        stdout.contains("all openai responses checks passed"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_node_client_speaks_responses_to_an_agent() {
    // Installed (the first time) before anything starts: it can take a while.
    let mut node = tokio::task::spawn_blocking(|| node_with_sdks("responses_check.mjs"))
        .await
        .unwrap();
    let tool =
        FakeServer::start(|_, _| Reply::json(200, json!({"city": "Paris", "temp_c": 21}))).await;
    let upstream = upstream().await;
    let proxy = proxy(&upstream, &tool).await;
    let base_url = format!("http://127.0.0.1:{}/v1", proxy.port);
    sdk_env_cleared(&mut node).env("AGENT_PROXY_BASE_URL", base_url);
    let output = tokio::task::spawn_blocking(move || node.output().expect("node runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("all openai node responses checks passed"),
        "openai node responses checks failed\nstdout:\n{stdout}\nstderr:\n{stderr}\nproxy log:\n{}",
        proxy.logs()
    );
}

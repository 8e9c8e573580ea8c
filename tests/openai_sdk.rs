//! The official `openai` Python client against the running proxy (installed
//! on first use into a virtualenv under the target directory).

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_streams_through_an_agent_with_a_tool_call() {
    // Installed (the first time) before anything starts: it can take a while.
    let mut python = tokio::task::spawn_blocking(python_with_sdks).await.unwrap();
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::raw_json(200, &fixture("models.json"));
        }
        let body = req.json();
        if body["model"] == "broken" {
            return Reply::Sse {
                steps: vec![Step::Bytes(
                    format!("data: {}\n\n", content("half")).into_bytes(),
                )],
                complete: false,
            };
        }
        let has_tool_result = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if has_tool_result {
            Reply::events(vec![
                role(),
                reasoning("Warm enough."),
                content("It is 21 °C"),
                content(" in Paris."),
                finish("stop"),
                usage(30, 2),
            ])
        } else {
            Reply::events(vec![
                role(),
                reasoning("Let me check."),
                tool_call(0, "call_1", "get_weather", "{\"city\":"),
                tool_args(0, "\"Paris\"}"),
                finish("tool_calls"),
                usage(8, 2),
            ])
        }
    })
    .await;
    let yaml = format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{up}/v1" }} }}
tools:
  get_weather:
    parameters: {{ type: object, properties: {{ city: {{ type: string }} }} }}
    http: {{ url: "{tool}/weather" }}
agents:
  weather: {{ tools: [get_weather], system_prompt: "You are a weather assistant." }}
  broken: {{ model: broken }}
"#,
        up = upstream.url(),
        tool = tool.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/openai_sdk_check.py"
    );
    let base_url = format!("http://127.0.0.1:{}/v1", proxy.port);
    python.arg(script);
    run_sdk_check(
        python,
        &proxy,
        base_url,
        &[],
        "all openai SDK checks passed",
    )
    .await;
}

//! The `weather` agent most end-to-end tests run: a system prompt and one
//! HTTP tool, `get_weather`, on one upstream.

use serde_json::json;

use super::fake::{content, finish, reasoning, tool_call, usage, FakeServer, Reply};

/// A config with the `weather` agent on the upstream `local` speaking `api`
/// (`chat` or `responses`), its `get_weather` tool at `tool_url`, and
/// `extra` top-level YAML.
pub fn weather_config(upstream: &FakeServer, api: &str, tool_url: &str, extra: &str) -> String {
    format!(
        r#"
default_upstream: local
upstreams:
  local: {{ url: "{up}/v1", api: {api} }}
tools:
  get_weather:
    description: Current weather for a city
    parameters: {{ type: object, properties: {{ city: {{ type: string }} }}, required: [city] }}
    http: {{ url: "{tool_url}", timeout_ms: 2000 }}
agents:
  weather:
    model: up-model
    system_prompt: You are a weather assistant.
    tools: [get_weather]
limits: {{ heartbeat_ms: 100 }}
{extra}
"#,
        up = upstream.url()
    )
}

/// The `get_weather` tool: Paris, 21 °C, whatever is asked.
pub async fn weather_tool() -> FakeServer {
    FakeServer::start(|_, _| Reply::json(200, json!({"city": "Paris", "temp_c": 21}))).await
}

/// The weather agent's model, one round: it thinks and calls `get_weather`,
/// then, once it has the result, thinks again and answers (usage included).
pub fn weather_round(has_result: bool) -> Reply {
    if has_result {
        Reply::events(vec![
            reasoning("Warm enough."),
            content("It is 21 °C"),
            content(" in Paris."),
            finish("stop"),
            usage(30, 2),
        ])
    } else {
        Reply::events(vec![
            reasoning("Let me check."),
            tool_call(0, "call_1", "get_weather", "{\"city\":\"Paris\"}"),
            finish("tool_calls"),
            usage(8, 2),
        ])
    }
}

//! A client's chat request through the agent rewrite: any request that
//! parses is rewritten without panicking into one that serializes, starts
//! with the agent's system message and streams.
#![no_main]

use std::sync::LazyLock;

use agent_proxy::agent::rewrite::rewrite;
use agent_proxy::agent::toolset::ToolSet;
use agent_proxy::config::Config;
use agent_proxy::openai::ChatRequest;
use libfuzzer_sys::fuzz_target;

static CONFIG: LazyLock<Config> = LazyLock::new(|| {
    Config::parse(
        r#"
default_upstream: up
upstreams: { up: { url: "http://127.0.0.1:1/v1" } }
tools:
  get_weather: { http: { url: "http://127.0.0.1:2/w" }, inject: { user_id: { request: user } } }
agents:
  a: { system_prompt: AGENT, system_prompt_mode: prepend, tools: [get_weather], params: { temperature: 0.2 } }
"#,
        |_| None,
    )
    .expect("the fuzz config is valid")
});

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<ChatRequest>(data) else {
        return;
    };
    let agent = CONFIG.agent("a").expect("agent a");
    let toolset = ToolSet::of(agent, &CONFIG);
    let stream = request.stream.unwrap_or(false);
    let out = rewrite(agent, &toolset, request, stream);
    assert_eq!(out.stream, Some(stream));
    assert_eq!(out.stream_options.is_some(), stream);
    assert_eq!(out.messages.first().map(|m| m.role.as_str()), Some("system"));
    let bytes = serde_json::to_vec(&out).expect("a rewritten request serializes");
    serde_json::from_slice::<serde_json::Value>(&bytes).expect("and is valid JSON");
});

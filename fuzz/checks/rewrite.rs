//! A client's request through each front decoder (chat, Responses,
//! Messages), the agent rewrite and each upstream encoder: whatever decodes
//! is rewritten without panicking into a valid request that carries the
//! agent's instructions first and streams as the client asked; what is not
//! JSON does not decode.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use std::sync::LazyLock;

use agent_proxy::agent::rewrite::rewrite;
use agent_proxy::agent::toolset::ToolSet;
use agent_proxy::config::Config;
use agent_proxy::conversation::Conversation;
use agent_proxy::front;
use agent_proxy::round;
use serde_json::Value;

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

fn decoded(data: &[u8]) -> Vec<Conversation> {
    let chat = front::chat::decode(data).ok();
    let responses = front::responses::decode(data).ok().map(|(c, _)| c);
    let messages = front::messages::decode(data).ok().map(|(c, _)| c);
    [chat, responses, messages].into_iter().flatten().collect()
}

pub fn check(data: &[u8]) {
    // What is not JSON is refused: the scanner that reads a body's tools
    // passes their text on as it came.
    if serde_json::from_slice::<&serde_json::value::RawValue>(data).is_err() {
        assert!(front::responses::decode(data).is_err());
        assert!(front::messages::decode(data).is_err());
    }
    let agent = CONFIG.agent("a").expect("agent a");
    let toolset = ToolSet::of(agent, &CONFIG);
    for mut out in decoded(data) {
        let stream = out.options.stream;
        rewrite(agent, &toolset, &mut out);
        let system = out.system_text().expect("the agent's prompt");
        assert!(system.starts_with("AGENT"));
        let chat: Value = serde_json::from_slice(&round::chat::encode(&out, stream))
            .expect("a chat request is valid JSON");
        assert_eq!(chat["stream"], stream);
        assert_eq!(chat["messages"][0]["role"], "system");
        // Its texts, each written as it came or escaped again, read as one.
        assert_eq!(chat["messages"][0]["content"], *system);
        let responses: Value = serde_json::from_slice(&round::responses::encode(&out, stream))
            .expect("a Responses request is valid JSON");
        assert_eq!(responses["store"], false);
    }
}

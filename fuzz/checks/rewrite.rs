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
use serde_json::value::RawValue;
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
    if serde_json::from_slice::<&RawValue>(data).is_err() {
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
        let chat = members(&round::chat::encode(&out, stream), "a chat request");
        assert_eq!(member(&chat, "stream"), stream);
        let messages: Vec<Members> =
            serde_json::from_str(chat["messages"].get()).expect("a list of messages");
        assert_eq!(member(&messages[0], "role"), "system");
        // Its texts, each written as it came or escaped again, read as one.
        assert_eq!(member(&messages[0], "content"), *system);
        let responses = members(
            &round::responses::encode(&out, stream),
            "a Responses request",
        );
        assert_eq!(member(&responses, "store"), false);
    }
}

/// A JSON object's members as their JSON text. Not values: a tool's schema
/// goes on as it came, and JSON allows a number past what a float holds
/// (`1e400`), which a serde_json value refuses.
type Members = std::collections::HashMap<String, Box<RawValue>>;

fn members(json: &[u8], what: &str) -> Members {
    serde_json::from_slice(json).unwrap_or_else(|e| panic!("{what} is a JSON object: {e}"))
}

fn member(members: &Members, name: &str) -> Value {
    let json = members.get(name).unwrap_or_else(|| panic!("no {name}"));
    serde_json::from_str(json.get()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

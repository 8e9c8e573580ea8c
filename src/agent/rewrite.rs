//! The agent rewrite: from the request a client sent to the request the
//! agent's upstream gets.

use serde_json::{Map, Value};
use tracing::warn;

use super::toolset::ToolSet;
use super::Agent;
use crate::config::file::PromptMode;
use crate::openai::{ChatRequest, Message, StreamOptions, ToolDef};

/// Rewrites `req` for `agent`. Every field the rewrite does not own is kept
/// as the client sent it. `stream` says whether the upstream streams (with
/// usage, which the loop sums over rounds): when someone watches the answer
/// as it comes. A non-streaming answer is one JSON document from the model
/// server, far cheaper to produce and to read than the same answer as SSE.
pub fn rewrite(
    agent: &Agent,
    toolset: &ToolSet,
    mut req: ChatRequest,
    stream: bool,
) -> ChatRequest {
    combine_instructions(agent, &mut req.messages);
    req.tools = merge_tools(agent, toolset, req.tools.take());
    req.model = agent.model.clone();
    for (key, value) in &agent.params {
        req.set_default(key, value);
    }
    if req.enable_thinking == Some(false) {
        let kwargs = req
            .rest
            .entry("chat_template_kwargs")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(kwargs) = kwargs {
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
        }
    }
    req.stream = Some(stream);
    // OpenAI refuses `stream_options` on a request that does not stream.
    let options = req.stream_options.take();
    if stream {
        let mut options = options.unwrap_or_default();
        options.include_usage = Some(true);
        req.stream_options = Some(StreamOptions { ..options });
    }
    req
}

/// One leading system message: the agent's instructions combined with the
/// client's leading system/developer messages per `system_prompt_mode`.
/// (Many chat templates accept a single system message, first.)
fn combine_instructions(agent: &Agent, messages: &mut Vec<Message>) {
    if agent.prompt_mode == PromptMode::Replace {
        messages.retain(|m| !m.is_instruction());
    }
    let Some(ours) = agent.instructions.as_deref() else {
        return;
    };
    let leading = messages.iter().take_while(|m| m.is_instruction()).count();
    let theirs = messages[..leading]
        .iter()
        .map(Message::content_text)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    let text = match (agent.prompt_mode, theirs.is_empty()) {
        (PromptMode::Replace, _) | (_, true) => ours.to_owned(),
        (PromptMode::Prepend, false) => format!("{ours}\n\n{theirs}"),
        (PromptMode::Append, false) => format!("{theirs}\n\n{ours}"),
    };
    messages.splice(..leading, [Message::text("system", text)]);
}

/// The agent's tools first, then the client's, minus any client tool that
/// shadows a local one (the local tool wins).
fn merge_tools(
    agent: &Agent,
    toolset: &ToolSet,
    client_tools: Option<Vec<ToolDef>>,
) -> Option<Vec<ToolDef>> {
    let mut tools: Vec<ToolDef> = toolset.definitions().cloned().collect();
    for tool in client_tools.into_iter().flatten() {
        match tool.function_name() {
            Some(name) if toolset.is_local(name) => {
                warn!(agent = %agent.id, tool = name, "client tool dropped: the agent has a local tool of that name");
            }
            _ => tools.push(tool),
        }
    }
    (!tools.is_empty()).then_some(tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use serde_json::json;

    fn agent(mode: &str) -> (std::sync::Arc<Agent>, ToolSet) {
        let yaml = format!(
            "
default_upstream: up
upstreams: {{ up: {{ url: 'http://127.0.0.1:1/v1' }} }}
tools:
  get_weather: {{ http: {{ url: 'http://127.0.0.1:2/w' }} }}
agents:
  a:
    model: qwen3
    system_prompt: AGENT
    system_prompt_mode: {mode}
    tools: [get_weather]
    params: {{ temperature: 0.2, top_p: 0.9 }}
"
        );
        let config = Config::parse(&yaml, |_| None).unwrap();
        let agent = config.agent("a").unwrap().clone();
        let toolset = ToolSet::of(&agent, &config);
        (agent, toolset)
    }

    fn rewrite_for(mode: &str, req: ChatRequest) -> ChatRequest {
        let (agent, toolset) = agent(mode);
        rewrite(&agent, &toolset, req, true)
    }

    fn request(body: Value) -> ChatRequest {
        serde_json::from_value(body).unwrap()
    }

    fn system_text(req: &ChatRequest) -> String {
        assert_eq!(req.messages[0].role, "system");
        req.messages[0].content_text()
    }

    #[test]
    fn prompt_modes_combine_one_leading_system_message() {
        let body = json!({"model":"a","messages":[
            {"role":"system","content":"CLIENT"},
            {"role":"developer","content":[{"type":"text","text":"DEV"}]},
            {"role":"user","content":"hi"}]});
        let out = rewrite_for("prepend", request(body.clone()));
        assert_eq!(system_text(&out), "AGENT\n\nCLIENT\n\nDEV");
        assert_eq!(out.messages.len(), 2);
        let out = rewrite_for("append", request(body.clone()));
        assert_eq!(system_text(&out), "CLIENT\n\nDEV\n\nAGENT");
        let out = rewrite_for("replace", request(body));
        assert_eq!(system_text(&out), "AGENT");
        assert_eq!(out.messages[1].content_text(), "hi");
    }

    #[test]
    fn tools_params_model_and_unknown_fields() {
        let body = json!({"model":"a","messages":[{"role":"user","content":"hi"}],
            "temperature": 0.9, "x_vendor": {"k": 1}, "enable_thinking": false,
            "tools":[{"type":"function","function":{"name":"get_weather"}},
                     {"type":"function","function":{"name":"client_tool","parameters":{}}}]});
        let out = serde_json::to_value(rewrite_for("prepend", request(body))).unwrap();
        assert_eq!(out["model"], "qwen3");
        assert_eq!(out["temperature"], 0.9, "client value wins over params");
        assert_eq!(out["top_p"], 0.9, "params fill what the client left out");
        assert_eq!(out["x_vendor"], json!({"k": 1}));
        assert_eq!(out["stream"], true);
        assert_eq!(out["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            out["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        let names: Vec<&str> = out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["get_weather", "client_tool"]);
        assert_eq!(out["tools"][0]["function"]["parameters"]["type"], "object");
    }

    #[test]
    fn a_non_streaming_request_stays_one_without_stream_options() {
        let body = json!({"model":"a","messages":[{"role":"user","content":"hi"}],
            "stream": false, "stream_options": {"include_usage": true}});
        let (agent, toolset) = agent("prepend");
        let out = serde_json::to_value(rewrite(&agent, &toolset, request(body), false)).unwrap();
        assert_eq!(out["stream"], false);
        assert!(out.get("stream_options").is_none(), "{out}");
    }
}

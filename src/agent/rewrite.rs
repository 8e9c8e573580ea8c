//! The agent rewrite: from the conversation a client sent to the one the
//! agent's upstream gets, whatever the dialects on either side.

use std::sync::Arc;

use serde_json::Value;
use tracing::warn;

use super::toolset::ToolSet;
use super::Agent;
use crate::config::file::PromptMode;
use crate::conversation::{Conversation, FunctionTool, Item, Prompt, Role};

/// Rewrites `conversation` for `agent`, in place (it is moved no more: a
/// move copies its half KiB). Everything the rewrite does not own is kept
/// as the client sent it.
pub fn rewrite(agent: &Agent, toolset: &ToolSet, conversation: &mut Conversation) {
    combine_instructions(agent, conversation);
    merge_tools(agent, toolset, &mut conversation.tools);
    conversation.model = agent.model.clone();
    for (key, value) in &agent.params {
        apply_param(conversation, key, value);
    }
    if !agent.upstream.vision {
        name_attachments(&mut conversation.items);
    }
}

/// A tool result's images and files, for a model that takes none: each a
/// line of the result's text naming it. Sent, one would fail the request,
/// and every later one of the conversation that holds it.
fn name_attachments(items: &mut [Item]) {
    for item in items {
        if let Item::ToolResult(result) = item {
            for part in result.attachments.drain(..) {
                if !result.output.is_empty() {
                    result.output.push('\n');
                }
                result.output.push_str(&part.named());
            }
        }
    }
}

/// An agent `param` fills what the client left unset: the options the core
/// maps between dialects by their chat names, anything else as an upstream
/// field.
fn apply_param(conversation: &mut Conversation, key: &str, value: &Value) {
    let options = &mut conversation.options;
    match key {
        "temperature" => options.temperature = options.temperature.or(value.as_f64()),
        "top_p" => options.top_p = options.top_p.or(value.as_f64()),
        "max_tokens" | "max_completion_tokens" | "max_output_tokens" => {
            options.max_tokens = options.max_tokens.or(value.as_u64())
        }
        "enable_thinking" => options.thinking = options.thinking.or(value.as_bool()),
        "reasoning_effort" => {
            if options.reasoning_effort.is_none() {
                options.reasoning_effort = value.as_str().map(str::to_owned);
            }
        }
        "parallel_tool_calls" => {
            options.parallel_tool_calls = options.parallel_tool_calls.or(value.as_bool())
        }
        _ => {
            if !conversation.extra.contains_key(key) {
                conversation
                    .params
                    .entry(key.to_owned())
                    .or_insert_with(|| value.clone());
            }
        }
    }
}

/// One system prompt: the agent's instructions combined with the client's
/// leading instructions per `system_prompt_mode`. (Many chat templates
/// accept a single system message, first.)
fn combine_instructions(agent: &Agent, conversation: &mut Conversation) {
    if agent.prompt_mode == PromptMode::Replace {
        conversation.system = None;
        conversation
            .items
            .retain(|item| !matches!(item, Item::Message(m) if m.role == Role::System));
    }
    let Some(ours) = agent.instructions.as_deref() else {
        return;
    };
    let theirs = conversation.system.take().filter(|t| !t.is_empty());
    // Theirs is a coding agent's many KiB: kept apart from ours, not copied.
    conversation.system = Some(match (agent.prompt_mode, theirs) {
        (PromptMode::Replace, _) | (_, None) => Prompt::new(ours),
        (PromptMode::Prepend, Some(mut theirs)) => {
            theirs.push_front(ours.to_owned());
            theirs
        }
        (PromptMode::Append, Some(mut theirs)) => {
            theirs.push(ours.to_owned());
            theirs
        }
    });
}

/// The agent's tools first, then the client's, minus any client tool that
/// shadows a local one (the local tool wins).
fn merge_tools(agent: &Agent, toolset: &ToolSet, tools: &mut Vec<Arc<FunctionTool>>) {
    // An agent without tools of its own keeps the client's list as it is.
    if toolset.is_empty() {
        return;
    }
    let client = std::mem::take(tools);
    tools.reserve_exact(toolset.functions().len() + client.len());
    tools.extend(toolset.functions().cloned());
    for tool in client {
        if toolset.is_local(&tool.name) {
            warn!(agent = %agent.id, tool = %tool.name, "client tool dropped: the agent has a local tool of that name");
        } else {
            tools.push(tool);
        }
    }
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

    /// The chat body the agent's upstream gets for a chat request `body`.
    fn rewrite_for(mode: &str, body: Value) -> Value {
        let (agent, toolset) = agent(mode);
        let mut out = crate::front::chat::decode(&serde_json::to_vec(&body).unwrap()).unwrap();
        let stream = out.options.stream;
        rewrite(&agent, &toolset, &mut out);
        serde_json::from_slice(&crate::round::chat::encode(&out, stream)).unwrap()
    }

    fn system_text(out: &Value) -> String {
        assert_eq!(out["messages"][0]["role"], "system");
        out["messages"][0]["content"].as_str().unwrap().to_owned()
    }

    #[test]
    fn prompt_modes_combine_one_leading_system_message() {
        let body = json!({"model":"a","messages":[
            {"role":"system","content":"CLIENT"},
            {"role":"developer","content":[{"type":"text","text":"DEV"}]},
            {"role":"user","content":"hi"}]});
        let out = rewrite_for("prepend", body.clone());
        assert_eq!(system_text(&out), "AGENT\n\nCLIENT\n\nDEV");
        assert_eq!(out["messages"].as_array().unwrap().len(), 2);
        let out = rewrite_for("append", body.clone());
        assert_eq!(system_text(&out), "CLIENT\n\nDEV\n\nAGENT");
        let out = rewrite_for("replace", body);
        assert_eq!(system_text(&out), "AGENT");
        assert_eq!(out["messages"][1]["content"], "hi");
    }

    #[test]
    fn a_coding_agents_long_texts_go_to_the_model_as_its_client_escaped_them() {
        // Escapes serde_json would write otherwise (`\/`, `\u00e9`): what
        // the model gets shows whose they are.
        let long = |tag: &str| format!("{tag}: caf\\u00e9 \\/ \\\"x\\\"\\n").repeat(80);
        let (block, note, asked, dev) = (long("block"), long("note"), long("asked"), long("dev"));
        let text = |raw: &str| serde_json::from_str::<String>(&format!("\"{raw}\"")).unwrap();
        crate::on_a_new_thread(move || {
            let (agent, toolset) = agent("prepend");
            let messages = format!(
                r#"{{"model":"a","max_tokens":9,"system":[{{"type":"text","text":"Short."}},{{"type":"text","text":"{block}"}}],
                "messages":[{{"role":"user","content":[{{"type":"text","text":"{asked}"}},{{"type":"text","text":"hi"}}]}},
                {{"role":"system","content":"{note}"}}]}}"#
            );
            let (mut conversation, _) =
                crate::front::messages::decode(messages.as_bytes()).unwrap();
            rewrite(&agent, &toolset, &mut conversation);
            let sent = String::from_utf8(crate::round::chat::encode(&conversation, false)).unwrap();
            assert!(sent.contains(&format!(
                r#""content":"AGENT\n\nShort.\n\n{block}\n\n{note}""#
            )));
            assert!(sent.contains(&format!(r#"{{"type":"text","text":"{asked}"}}"#)));
            let read: Value = serde_json::from_str(&sent).unwrap();
            let system = format!("AGENT\n\nShort.\n\n{}\n\n{}", text(&block), text(&note));
            assert_eq!(system_text(&read), system);
            assert_eq!(read["messages"][1]["content"][0]["text"], text(&asked));

            // Responses: a developer message's texts, a line apart.
            let responses = format!(
                r#"{{"model":"a","instructions":"Be brief.","input":[{{"role":"developer","content":[{{"type":"input_text","text":"{dev}"}},{{"type":"input_text","text":"Also."}}]}},{{"role":"user","content":"hi"}}]}}"#
            );
            let (mut conversation, _) =
                crate::front::responses::decode(responses.as_bytes()).unwrap();
            rewrite(&agent, &toolset, &mut conversation);
            let sent = String::from_utf8(crate::round::chat::encode(&conversation, false)).unwrap();
            assert!(sent.contains(&format!(
                r#""content":"AGENT\n\nBe brief.\n\n{dev}\nAlso.""#
            )));
            let read: Value = serde_json::from_str(&sent).unwrap();
            let system = format!("AGENT\n\nBe brief.\n\n{}\nAlso.", text(&dev));
            assert_eq!(system_text(&read), system);
            assert_eq!(conversation.system_text().unwrap(), system);
        });
    }

    #[test]
    fn tools_params_model_and_unknown_fields() {
        let body = json!({"model":"a","messages":[{"role":"user","content":"hi"}], "stream": true,
            "temperature": 0.9, "x_vendor": {"k": 1}, "enable_thinking": false,
            "tools":[{"type":"function","function":{"name":"get_weather"}},
                     {"type":"function","function":{"name":"client_tool","parameters":{}}}]});
        let out = rewrite_for("prepend", body);
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
    fn thinking_off_joins_the_template_kwargs_the_client_gave() {
        let body = json!({"model":"a","messages":[{"role":"user","content":"hi"}],
            "enable_thinking": false, "max_completion_tokens": 7,
            "chat_template_kwargs": {"reasoning_budget": 0}});
        let out = rewrite_for("prepend", body);
        assert_eq!(
            out["chat_template_kwargs"],
            json!({"reasoning_budget": 0, "enable_thinking": false})
        );
        assert_eq!(
            out["max_completion_tokens"], 7,
            "the client's, as it sent it"
        );
        assert!(out.get("max_tokens").is_none(), "not both limits: {out}");
        let text = serde_json::to_string(&out).unwrap();
        assert_eq!(text.matches("chat_template_kwargs").count(), 1, "{text}");
    }

    #[test]
    fn a_non_streaming_request_stays_one_without_stream_options() {
        let body = json!({"model":"a","messages":[{"role":"user","content":"hi"}],
            "stream": false, "stream_options": {"include_usage": true}});
        let out = rewrite_for("prepend", body);
        assert_eq!(out["stream"], false);
        assert!(out.get("stream_options").is_none(), "{out}");
    }
}

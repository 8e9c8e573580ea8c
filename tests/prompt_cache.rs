//! llama.cpp reuses its KV cache only when a new prompt extends the last one
//! token for token. These tests drive a 3-round, 2-turn coding-agent
//! conversation (client tools, as Codex CLI and Claude Code run it) through
//! each front door and check that every upstream request starts with the
//! previous one, message for message, byte for byte: the client re-sends the
//! history in its own dialect and we must render it exactly as before.

mod common;

use common::*;
use serde_json::{json, Value};

/// The model: two rounds that think and call the client's `Bash` (compact
/// arguments, keys in the model's order rather than sorted, as llama-server
/// sends them), a third that answers; the second turn answers again.
async fn coding_model() -> FakeServer {
    FakeServer::start(|req, i| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        match i {
            0 => Reply::events(vec![
                reasoning("List first."),
                tool_call(0, "call_a", "Bash", LS),
                finish("tool_calls"),
                usage(50, 9),
            ]),
            1 => Reply::events(vec![
                reasoning("Now read it."),
                tool_call(0, "call_b", "Bash", CAT),
                finish("tool_calls"),
                usage(70, 9),
            ]),
            _ => Reply::events(vec![
                reasoning("Answer."),
                content(if i == 2 { "a.txt says hi" } else { "Bye" }),
                finish("stop"),
                usage(90, 4),
            ]),
        }
    })
    .await
}

const LS: &str = r#"{"description":"List files","command":"ls"}"#;
const CAT: &str = r#"{"command":"cat a.txt","description":"Read it"}"#;
const ASKS: [&str; 2] = ["What does a.txt say?", "Thanks"];
const RESULTS: [&str; 2] = ["a.txt", "hi"];

/// One round of a client: sends the conversation so far, appends the answer
/// as the client keeps it, returns the ids of the tool calls to run.
async fn send(front: &str, port: u16, history: &mut Vec<Value>) -> Vec<Value> {
    let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}});
    match front {
        // The message goes back as the client received it.
        "chat" => {
            let tools =
                json!([{"type": "function", "function": {"name": "Bash", "parameters": schema}}]);
            let body = json!({"model": "weather", "messages": history, "tools": tools});
            let message = answer(port, "/v1/chat/completions", &[], &body).await["choices"][0]
                ["message"]
                .clone();
            history.push(message.clone());
            let calls = message["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            calls.iter().map(|c| c["id"].clone()).collect()
        }
        // Statelessly, as Codex CLI does: every output item (reasoning with
        // its encrypted content, calls, messages) goes back as input; a
        // reasoning item by its summary and encrypted content alone, as
        // OpenAI's stateless use has it (the AI SDK sends no `content`).
        "responses" => {
            let tools = json!([{"type": "function", "name": "Bash", "parameters": schema}]);
            let body = json!({"model": "weather", "input": history, "tools": tools,
                "store": false, "include": ["reasoning.encrypted_content"]});
            let output = answer(port, "/v1/responses", &[], &body).await["output"].clone();
            let output = output.as_array().cloned().unwrap_or_default();
            history.extend(output.iter().cloned().map(|mut item| {
                if item["type"] == "reasoning" {
                    item["content"] = Value::Null;
                }
                item
            }));
            output
                .iter()
                .filter(|item| item["type"] == "function_call")
                .map(|item| item["call_id"].clone())
                .collect()
        }
        // As Claude Code does: the assistant's blocks (thinking with its
        // signature, tool_use) go back as they came.
        _ => {
            let tools = json!([{"name": "Bash", "input_schema": schema}]);
            let body = json!({"model": "weather", "max_tokens": 1000, "messages": history,
                "tools": tools, "thinking": {"type": "enabled", "budget_tokens": 500}});
            let version = [("anthropic-version", "2023-06-01")];
            let blocks = answer(port, "/v1/messages", &version, &body).await["content"].clone();
            history.push(json!({"role": "assistant", "content": blocks}));
            let blocks = blocks.as_array().cloned().unwrap_or_default();
            blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].clone())
                .collect()
        }
    }
}

async fn answer(port: u16, path: &str, headers: &[(&str, &str)], body: &Value) -> Value {
    let response = request(port, "POST", path, headers, body.to_string().as_bytes()).await;
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    response.json()
}

/// A tool result in `front`'s dialect.
fn tool_result(front: &str, id: Value, output: &str) -> Value {
    match front {
        "chat" => json!({"role": "tool", "tool_call_id": id, "content": output}),
        "responses" => json!({"type": "function_call_output", "call_id": id, "output": output}),
        _ => json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}),
    }
}

/// Turn 1 until the model answers (the client running each call), then
/// turn 2.
async fn conversation(front: &str, port: u16) {
    let mut history = Vec::new();
    for ask in ASKS {
        history.push(json!({"role": "user", "content": ask}));
        let mut results = RESULTS.iter();
        loop {
            let calls = send(front, port, &mut history).await;
            if calls.is_empty() {
                break;
            }
            for id in calls {
                let output = results.next().expect("the model calls twice");
                history.push(tool_result(front, id, output));
            }
        }
    }
}

/// The upstream requests of one conversation through `front`.
async fn upstream_prompts(front: &str) -> Vec<Value> {
    let tool = weather_tool().await;
    let upstream = coding_model().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    conversation(front, proxy.port).await;
    let sent: Vec<Value> = upstream
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.json())
        .collect();
    assert_eq!(
        sent.len(),
        4,
        "{front}: one upstream request per client request"
    );
    sent
}

fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().expect("a chat request")
}

/// Each request's messages start with the previous request's, then carry
/// the model's own output of that round as the model wrote it.
fn check_extends(front: &str, sent: &[Value]) {
    let produced = [
        ("List first.", Some(("call_a", LS))),
        ("Now read it.", Some(("call_b", CAT))),
        ("Answer.", None),
    ];
    for (k, pair) in sent.windows(2).enumerate() {
        let (before, after) = (messages(&pair[0]), messages(&pair[1]));
        assert_eq!(
            &after[..before.len()],
            &before[..],
            "{front}: request {} re-renders the prompt of request {k}",
            k + 1
        );
        let assistant = &after[before.len()];
        assert_eq!(assistant["role"], "assistant", "{front}: {assistant}");
        let (thought, call) = produced[k];
        assert_eq!(
            assistant["reasoning_content"], thought,
            "{front}: round {k}'s reasoning goes back to the model: {assistant}"
        );
        match call {
            Some((id, arguments)) => {
                let sent_call = &assistant["tool_calls"][0];
                assert_eq!(sent_call["id"], id, "{front}");
                assert_eq!(sent_call["function"]["arguments"], arguments, "{front}");
            }
            None => assert_eq!(assistant["content"], "a.txt says hi", "{front}"),
        }
        assert_eq!(
            pair[0]["tools"], pair[1]["tools"],
            "{front}: the tool definitions, in the same order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_re_renders_earlier_rounds_and_turns_exactly() {
    let chat = upstream_prompts("chat").await;
    check_extends("chat", &chat);
    for front in ["responses", "messages"] {
        let sent = upstream_prompts(front).await;
        check_extends(front, &sent);
        // The same conversation reaches the model the same way whichever
        // door it came in by, so one llama-server serves all three warm.
        for (k, (a, b)) in chat.iter().zip(&sent).enumerate() {
            assert_eq!(
                messages(a),
                messages(b),
                "{front}: request {k} differs from the chat front's"
            );
            assert_eq!(a["tools"], b["tools"], "{front}: request {k}'s tools");
        }
    }
}

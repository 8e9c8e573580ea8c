//! The Anthropic Messages API end to end: agents behind `POST /v1/messages`
//! (what Claude Code and the anthropic SDKs send), thinking blocks, client
//! tools, auth by `x-api-key`, Anthropic's error shapes, count_tokens, the
//! model list, and passthrough for other models.

mod common;

use common::*;
use serde_json::{json, Value};

/// An upstream: `get_weather` first, then reasoning and the answer.
async fn tool_then_answer() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.tool_results().is_empty() {
            Reply::events(vec![
                reasoning("Let me check."),
                tool_call(0, "call_1", "get_weather", "{\"city\":\"Paris\"}"),
                finish("tool_calls"),
                usage(10, 3),
            ])
        } else {
            Reply::events(vec![
                reasoning("Warm."),
                content("It is 21 °C"),
                content(" in Paris."),
                finish("stop"),
                usage(20, 5),
            ])
        }
    })
    .await
}

async fn post_messages(port: u16, path: &str, body: &Value, headers: &[(&str, &str)]) -> Response {
    let body = body.to_string();
    let mut all = vec![
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    all.extend_from_slice(headers);
    request(port, "POST", path, &all, body.as_bytes()).await
}

/// `(event name, data)` of each SSE event, checking Anthropic's framing:
/// the name is the data's `type`, `message_start` first, `message_stop`
/// last, and every block's deltas between its start and stop.
fn anthropic_events(body: &[u8]) -> Vec<(String, Value)> {
    let mut parser = agent_proxy::sse::Parser::new(1 << 20);
    parser.feed(body);
    let mut events = Vec::new();
    while let Some(event) = parser.next_event().unwrap() {
        let data: Value = serde_json::from_slice(&event.data).unwrap();
        let name = event.name.expect("every Anthropic event is named");
        assert_eq!(data["type"], name.as_str());
        events.push((name, data));
    }
    let names: Vec<&str> = events
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "ping")
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let mut open: Option<u64> = None;
    let mut next = 0;
    for (name, data) in &events {
        match name.as_str() {
            "content_block_start" => {
                assert!(open.is_none());
                assert_eq!(data["index"], next);
                open = Some(next);
                next += 1;
            }
            "content_block_delta" => assert_eq!(data["index"].as_u64(), open),
            "content_block_stop" => {
                assert_eq!(data["index"].as_u64(), open);
                open = None;
            }
            _ => {}
        }
    }
    events
}

/// The blocks of a stream: `(type, text or input JSON)`.
fn blocks(events: &[(String, Value)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (name, data) in events {
        match name.as_str() {
            "content_block_start" => out.push((
                data["content_block"]["type"].as_str().unwrap().to_owned(),
                String::new(),
            )),
            "content_block_delta" => {
                let delta = &data["delta"];
                let piece = delta["text"]
                    .as_str()
                    .or(delta["thinking"].as_str())
                    .or(delta["partial_json"].as_str())
                    .unwrap_or_default();
                out.last_mut().unwrap().1.push_str(piece);
            }
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_streams_thinking_and_text_blocks_and_keeps_its_tool_local() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let body = json!({"model": "weather", "max_tokens": 512, "stream": true,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    // Claude Code's path carries `?beta=true`.
    let response = post_messages(proxy.port, "/v1/messages?beta=true", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let events = anthropic_events(&response.body);
    let blocks = blocks(&events);
    let kinds: Vec<&str> = blocks.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        !kinds.contains(&"tool_use"),
        "the agent's own tool is not a client call"
    );
    assert_eq!(kinds.last(), Some(&"text"));
    assert_eq!(blocks.last().unwrap().1, "It is 21 °C in Paris.");
    let thinking: String = blocks
        .iter()
        .filter(|(k, _)| k == "thinking")
        .map(|(_, t)| t.as_str())
        .collect();
    assert!(
        thinking.contains("Let me check.") && thinking.contains("Warm."),
        "{thinking}"
    );
    let delta = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .map(|(_, d)| d)
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 8);
    let sent = upstream.requests()[0].json();
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "You are a weather assistant.\n\nBe brief."})
    );
    assert_eq!(sent["max_tokens"], 512);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_progress_notes_are_a_thinking_block_that_never_goes_back_to_the_model() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let asked = json!({"role": "user", "content": "Weather in Paris?"});
    let thinking = json!({"type": "enabled", "budget_tokens": 1024});
    let body =
        json!({"model": "weather", "max_tokens": 512, "thinking": thinking, "messages": [asked]});
    let answer = post_messages(proxy.port, "/v1/messages", &body, &[])
        .await
        .json();
    let content = answer["content"].as_array().unwrap();
    let texts: Vec<(&str, &str)> = content
        .iter()
        .map(|b| {
            let text = b["thinking"].as_str().or(b["text"].as_str());
            (b["type"].as_str().unwrap(), text.unwrap())
        })
        .collect();
    // The note begins its own block: no line break leads it.
    assert_eq!(
        texts,
        [
            ("thinking", "Let me check."),
            ("thinking", "Calling get_weather {\"city\":\"Paris\"}…\n"),
            ("thinking", "Warm."),
            ("text", "It is 21 °C in Paris."),
        ]
    );
    let note = content[1]["signature"].as_str().unwrap();
    assert!(note.starts_with("agent-proxy:note:"), "{note}");

    // Sent back as Claude Code and the SDKs do: every block, signed.
    let body = json!({"model": "weather", "max_tokens": 512, "thinking": thinking, "messages": [
        asked, {"role": "assistant", "content": content},
        {"role": "user", "content": "And tomorrow?"}]});
    post_messages(proxy.port, "/v1/messages", &body, &[]).await;
    let next = upstream.requests().last().unwrap().json();
    assert_eq!(
        next["messages"][2],
        json!({"role": "assistant", "content": "It is 21 °C in Paris.",
               "reasoning_content": "Let me check.\nWarm."})
    );
}

/// Anthropic answers thinking blocks only to a request that switches
/// thinking on: the SDKs' `message.content[0].text` and LangChain's string
/// content hold the text. A reasoning model's thoughts and the proxy's notes
/// are left out, streamed or not; the model still thinks, and its reasoning
/// stays in the next round's history. A round that says it called tools
/// and named none ends the turn (`end_turn`), not `tool_use`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_did_not_switch_thinking_on_gets_no_thinking_blocks() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    for stream in [false, true] {
        let body = json!({"model": "weather", "max_tokens": 512, "stream": stream,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]});
        let response = post_messages(proxy.port, "/v1/messages", &body, &[]).await;
        assert_eq!(response.status, 200, "{}", response.text());
        let kinds: Vec<String> = match stream {
            false => {
                let message = response.json();
                assert_eq!(message["content"][0]["text"], "It is 21 °C in Paris.");
                let content = message["content"].as_array().unwrap().clone();
                content
                    .iter()
                    .map(|b| b["type"].as_str().unwrap().to_owned())
                    .collect()
            }
            true => blocks(&anthropic_events(&response.body))
                .into_iter()
                .map(|(kind, _)| kind)
                .collect(),
        };
        assert_eq!(kinds, ["text"], "stream: {stream}");
    }
    let second_round = upstream.requests()[1].json();
    let assistant = &second_round["messages"].as_array().unwrap()[2];
    assert_eq!(assistant["reasoning_content"], "Let me check.");

    let liar =
        FakeServer::start(|_, _| Reply::events(vec![content("Done."), finish("tool_calls")])).await;
    let proxy = Proxy::start(&weather_config(&liar, "chat", &tool.url(), "")).await;
    let body = json!({"model": "weather", "max_tokens": 512,
        "messages": [{"role": "user", "content": "Go."}]});
    let message = post_messages(proxy.port, "/v1/messages", &body, &[])
        .await
        .json();
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "Done."}])
    );
    assert_eq!(message["stop_reason"], "end_turn");
}

/// Claude Code's Read of a picture or a PDF answers it in the tool result;
/// a chat tool message holds text only, so a model that takes images
/// (`vision: true`) gets them in a user message after the results, each
/// labelled with its call, joined to the client's own next words. Before,
/// they were dropped unseen and the model made the file's content up. A
/// text model (a llama-server without `--mmproj` refuses any image, and the
/// conversation with it) reads a line naming each instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_results_images_reach_the_model_after_the_results() {
    let tool = weather_tool().await;
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("A cat."), finish("stop")])).await;
    let text_model = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let config = weather_config(&upstream, "chat, vision: true", &tool.url(), "");
    let proxy = Proxy::start(&config).await;
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}});
    let calls = json!([
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a.png"}},
        {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"file_path": "/b.txt"}}
    ]);
    let tools = json!([{"name": "Read", "input_schema": {"type": "object"}}]);
    for (then, last) in [
        (
            json!([]),
            json!({"role": "user", "content": [
            {"type": "text", "text": "Attached to the result of tool call toolu_1:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}),
        ),
        (
            json!([{"type": "text", "text": "What is it?"}]),
            json!({"role": "user", "content": [
            {"type": "text", "text": "Attached to the result of tool call toolu_1:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
            {"type": "text", "text": "What is it?"}]}),
        ),
    ] {
        let mut results = json!([
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "a.png, 2 KB"}, image]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "hello"}
        ]);
        results
            .as_array_mut()
            .unwrap()
            .extend(then.as_array().unwrap().iter().cloned());
        let body = json!({"model": "weather", "max_tokens": 100, "tools": tools, "messages": [
            {"role": "user", "content": "Look at both."},
            {"role": "assistant", "content": calls},
            {"role": "user", "content": results}]});
        let response = post_messages(proxy.port, "/v1/messages", &body, &[]).await;
        assert_eq!(response.status, 200, "{}", response.text());
        let sent = upstream.requests().last().unwrap().json();
        let messages = sent["messages"].as_array().unwrap();
        assert_eq!(
            messages[messages.len() - 3..],
            [
                json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a.png, 2 KB"}),
                json!({"role": "tool", "tool_call_id": "toolu_2", "content": "hello"}),
                last,
            ]
        );
        let response = post_messages(text_model.port, "/v1/messages", &body, &[]).await;
        assert_eq!(response.status, 200, "{}", response.text());
        let sent = upstream.requests().last().unwrap().json();
        let text = sent.to_string();
        assert!(
            !text.contains("image_url") && !text.contains("Attached"),
            "{text}"
        );
        let named = sent["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["tool_call_id"] == "toolu_1")
            .unwrap()
            .clone();
        assert_eq!(
            named["content"],
            "a.png, 2 KB\n[image: image/png, 1 KiB, not shown: the model takes no images]"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_only_answer_stays_an_assistant_turn_in_the_history() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let thinking = json!({"type": "thinking", "thinking": "Only thinking.", "signature": "agent-proxy:msg_1:0"});
    let body = json!({"model": "weather", "max_tokens": 512, "messages": [
        {"role": "user", "content": "Think."},
        {"role": "assistant", "content": [thinking]},
        {"role": "user", "content": "And now?"}]});
    let res = post_messages(proxy.port, "/v1/messages", &body, &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let sent = upstream.requests()[0].json();
    assert_eq!(
        sent["messages"].as_array().unwrap()[1..],
        [
            json!({"role": "user", "content": "Think."}),
            json!({"role": "assistant", "content": "", "reasoning_content": "Only thinking."}),
            json!({"role": "user", "content": "And now?"}),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_round_trips_as_tool_use_and_tool_result() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, _| match req.tool_results().last() {
        None => Reply::events(vec![
            tool_call(0, "toolu_1", "Bash", "{\"command\":\"ls\"}"),
            finish("tool_calls"),
        ]),
        Some(result) => Reply::events(vec![content(&format!("Files: {result}")), finish("stop")]),
    })
    .await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let tools = json!([{"name": "Bash", "description": "Runs a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]);
    let first = post_messages(
        proxy.port,
        "/v1/messages",
        &json!({"model": "weather", "max_tokens": 100, "tools": tools,
                "messages": [{"role": "user", "content": "List files"}]}),
        &[],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let message = first.json();
    assert_eq!(message["type"], "message");
    assert_eq!(message["stop_reason"], "tool_use");
    let call = message["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert_eq!(call["id"], "toolu_1");
    assert_eq!(call["input"], json!({"command": "ls"}));
    let second = post_messages(
        proxy.port,
        "/v1/messages",
        &json!({"model": "weather", "max_tokens": 100, "tools": tools, "messages": [
            {"role": "user", "content": "List files"},
            {"role": "assistant", "content": message["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}
        ]}),
        &[],
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.text());
    let answer = second.json();
    assert_eq!(
        answer["content"].as_array().unwrap().last().unwrap()["text"],
        "Files: a.txt"
    );
    assert_eq!(answer["stop_reason"], "end_turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_by_x_api_key_and_errors_in_anthropic_shape() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&weather_config(
        &upstream,
        "chat",
        &tool.url(),
        "auth: { api_keys: [k-1] }",
    ))
    .await;
    let body = json!({"model": "weather", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let denied = post_messages(proxy.port, "/v1/messages", &body, &[("x-api-key", "wrong")]).await;
    assert_eq!(denied.status, 401);
    let error = denied.json();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "authentication_error");
    let allowed = post_messages(proxy.port, "/v1/messages", &body, &[("x-api-key", "k-1")]).await;
    assert_eq!(allowed.status, 200, "{}", allowed.text());
    let bearer = post_messages(
        proxy.port,
        "/v1/messages",
        &body,
        &[
            ("authorization", "Bearer k-1"),
            ("anthropic-beta", "made-up-beta-2099"),
        ],
    )
    .await;
    assert_eq!(bearer.status, 200, "{}", bearer.text());
    let bad = post_messages(
        proxy.port,
        "/v1/messages",
        &json!({"model": "weather", "messages": []}),
        &[("x-api-key", "k-1")],
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["type"], "invalid_request_error");
    // The proxy's key never reaches the upstream.
    for recorded in upstream.requests() {
        assert!(recorded.header("x-api-key").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_requests_are_accepted() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, _| {
        let body = req.json();
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles[0], "system");
        assert!(
            !roles[1..].contains(&"system"),
            "one leading system message: {roles:?}"
        );
        Reply::events(vec![content("ok"), finish("stop")])
    })
    .await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    for fixture in [
        "claude-code-2.1.330-plain",
        "claude-code-2.1.330-tool-round2",
    ] {
        let path = format!(
            "{}/tests/fixtures/clients/{fixture}.request.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let captured: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let mut body = captured["body"].clone();
        body["model"] = json!("weather");
        // Its headers as sent (the body's framing is the test client's).
        let headers: Vec<(&str, &str)> = captured["headers"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(name, _)| {
                ![
                    "content-length",
                    "host",
                    "content-type",
                    "anthropic-version",
                    "accept-encoding",
                ]
                .contains(&name.to_lowercase().as_str())
            })
            .filter_map(|(name, value)| Some((name.as_str(), value.as_str()?)))
            .collect();
        let path = captured["path"].as_str().unwrap();
        let response = post_messages(proxy.port, path, &body, &headers).await;
        assert_eq!(response.status, 200, "{fixture}: {}", response.text());
        let blocks = blocks(&anthropic_events(&response.body));
        assert_eq!(
            blocks.last().unwrap(),
            &("text".to_owned(), "ok".to_owned())
        );
    }
    // Claude Code's session id is on the request's log line.
    assert!(
        proxy
            .logged(&["8c11ba6a-dc9d-4234-8a2a-0d4d94b18cec"])
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_models_probes_and_passthrough() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, _| match req.path.as_str() {
        "/v1/models" => Reply::json(
            200,
            json!({"object": "list", "data": [{"id": "llama", "object": "model"}]}),
        ),
        "/v1/messages" => Reply::json(
            200,
            json!({"type": "message", "passed": req.json()["model"]}),
        ),
        // Not llama-server: no tokenizer endpoints.
        _ => Reply::json(404, json!({"error": "no"})),
    })
    .await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let counted = post_messages(
        proxy.port,
        "/v1/messages/count_tokens",
        &json!({"model": "weather", "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
        &[],
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let tokens = counted.json()["input_tokens"].as_u64().unwrap();
    assert!(
        tokens > 20,
        "the agent's prompt and tools count too: {tokens}"
    );
    let models = request(
        proxy.port,
        "GET",
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
        b"",
    )
    .await;
    let listing = models.json();
    assert_eq!(listing["data"][0]["type"], "model");
    assert!(listing["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "weather"));
    assert_eq!(listing["has_more"], false);
    let one = request(
        proxy.port,
        "GET",
        "/v1/models/weather",
        &[("anthropic-version", "2023-06-01")],
        b"",
    )
    .await
    .json();
    assert_eq!(
        (one["type"].as_str(), one["id"].as_str()),
        (Some("model"), Some("weather"))
    );
    let card = get(proxy.port, "/v1/models/weather").await.json();
    assert_eq!(
        (card["object"].as_str(), card["id"].as_str()),
        (Some("model"), Some("weather"))
    );
    let root = get(proxy.port, "/").await;
    assert_eq!(root.status, 200);
    let passed = post_messages(
        proxy.port,
        "/v1/messages",
        &json!({"model": "llama", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
        &[],
    )
    .await;
    assert_eq!(
        passed.json()["passed"],
        "llama",
        "other models go to the upstream's /v1/messages"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_aliases_map_hard_coded_names_to_agents() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let extra = r#"model_aliases: { "claude-haiku-*": weather, "claude-sonnet-4-5": weather }"#;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), extra)).await;
    for model in ["claude-haiku-4-5-20251001", "claude-sonnet-4-5"] {
        let response = post_messages(
            proxy.port,
            "/v1/messages",
            &json!({"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": "Paris?"}]}),
            &[],
        )
        .await;
        assert_eq!(response.status, 200, "{}", response.text());
        let message = response.json();
        assert_eq!(
            message["model"], model,
            "the answer names the model asked for"
        );
        let text = message["content"].as_array().unwrap().last().unwrap()["text"].clone();
        assert_eq!(text, "It is 21 °C in Paris.");
    }
    let sent = upstream.requests()[0].json();
    assert_eq!(sent["model"], "up-model");
}

/// A text document reaches a chat upstream as text, which llama-server
/// reads; a PDF as chat's `file` part. Sent as Anthropic's `document`
/// block, llama-server refused the request (`unsupported content[].type`).
#[tokio::test]
async fn documents_reach_a_chat_upstream_as_text_or_files() {
    let tool = weather_tool().await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let body = json!({"model": "weather", "max_tokens": 512,
    "messages": [{"role": "user", "content": [
        {"type": "document", "title": "Trip", "source": {"type": "text", "media_type": "text/plain",
         "data": "Paris on Monday."}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
         "data": "JVBERi0="}},
        {"type": "text", "text": "Weather there?"}
    ]}]});
    let response = post_messages(proxy.port, "/v1/messages", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let sent = upstream.requests()[0].json();
    let user = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap()
        .clone();
    assert_eq!(
        user["content"],
        json!([
            {"type": "text", "text": "Trip\n\nParis on Monday."},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=",
                                      "filename": "document.pdf"}},
            {"type": "text", "text": "Weather there?"}
        ])
    );
}

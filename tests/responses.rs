//! The Responses API end to end: agents behind `POST /v1/responses` (over a
//! chat upstream and over a Responses upstream), client function tools,
//! what Codex CLI sends, and passthrough for other models.

mod common;

use common::*;
use serde_json::{json, Value};

/// Each SSE event of a Responses stream as `(event name, data)`.
fn named_events(body: &[u8]) -> Vec<(String, Value)> {
    let mut parser = agent_proxy::sse::Parser::new(1 << 20);
    parser.feed(body);
    let mut out = Vec::new();
    while let Some(event) = parser.next_event().unwrap() {
        let data: Value = serde_json::from_slice(&event.data).unwrap();
        out.push((event.name.unwrap_or_default(), data));
    }
    out
}

fn types(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}

/// Checks what every Responses stream must satisfy: each event named after
/// its `type`, sequence numbers 0, 1, 2…, created first, one terminal event
/// last carrying the whole response.
fn check_stream(events: &[(String, Value)]) -> &Value {
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i, "{name}");
    }
    assert_eq!(events[0].0, "response.created");
    let terminal = &events.last().unwrap();
    assert!(
        [
            "response.completed",
            "response.incomplete",
            "response.failed"
        ]
        .contains(&terminal.0.as_str()),
        "{}",
        terminal.0
    );
    let done_items: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "response.output_item.done")
        .map(|(_, data)| &data["item"])
        .collect();
    let response = &terminal.1["response"];
    let output: Vec<&Value> = response["output"].as_array().unwrap().iter().collect();
    assert_eq!(
        output, done_items,
        "the final output is the items as streamed"
    );
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_answers_a_responses_stream_with_a_local_tool_round() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, i| match i {
        0 => Reply::events(vec![
            reasoning("Let me check."),
            tool_call(0, "call_1", "get_weather", "{\"city\":\"Paris\"}"),
            finish("tool_calls"),
            usage(10, 3),
        ]),
        _ => {
            assert!(req.tool_results()[0].contains("21"));
            Reply::events(vec![
                reasoning("Warm."),
                content("It is 21 °C"),
                content(" in Paris."),
                finish("stop"),
                usage(20, 5),
            ])
        }
    })
    .await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let response = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": "Weather in Paris?", "stream": true,
                "instructions": "Answer briefly."}),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let events = named_events(&response.body);
    let final_response = check_stream(&events);
    assert_eq!(final_response["status"], "completed");
    assert_eq!(final_response["usage"]["input_tokens"], 30);
    assert_eq!(final_response["usage"]["output_tokens"], 8);
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "It is 21 °C in Paris.");
    assert!(
        !types(&events).contains(&"response.function_call_arguments.delta"),
        "the agent's own tool is not a client call"
    );
    let kinds: Vec<&str> = final_response["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.last(), Some(&"message"));
    assert!(kinds.contains(&"reasoning"));
    // The upstream got one system message: the agent's prompt, then the
    // client's instructions.
    let first = upstream.requests()[0].json();
    assert_eq!(first["model"], "up-model");
    assert_eq!(
        first["messages"][0],
        json!({"role": "system", "content": "You are a weather assistant.\n\nAnswer briefly."})
    );
    assert_eq!(first["messages"][1]["content"], "Weather in Paris?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_progress_notes_are_shown_but_never_go_back_to_the_model() {
    let tool = weather_tool().await;
    let upstream =
        FakeServer::start(|req, _| weather_round(req.json().to_string().contains("temp_c"))).await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    // What the model's next prompt holds of the turn before: its own
    // reasoning, and none of the proxy's notes.
    let next_prompt = || {
        let last = upstream.requests().last().unwrap().json().to_string();
        assert!(last.contains("Let me check."), "{last}");
        assert!(!last.contains("Calling get_weather"), "{last}");
    };
    let port = proxy.port;
    let ask = |extra: Value| async move {
        let mut body = json!({"model": "weather", "input": "Weather in Paris?"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post_json(port, "/v1/responses", &body).await
    };
    let first = ask(json!({})).await.json();
    let output = first["output"].as_array().unwrap().clone();
    let note: Vec<&Value> = output
        .iter()
        .filter(|item| item["id"].as_str().unwrap().starts_with("rs_note_"))
        .collect();
    assert_eq!(note.len(), 1, "{output:?}");
    assert_eq!(note[0]["type"], "reasoning");
    let shown = note[0]["content"][0]["text"].as_str().unwrap();
    assert!(shown.starts_with("Calling get_weather"), "{shown}");

    // Sent back whole (the Agents SDK's `to_input_list()`), by reference
    // (the AI SDK's, with stored answers), and by the stored chain.
    let mut input = vec![json!({"role": "user", "content": "Weather in Paris?"})];
    input.extend(output.iter().cloned());
    input.push(json!({"role": "user", "content": "And tomorrow?"}));
    ask(json!({"input": input, "store": false})).await;
    next_prompt();
    let references: Vec<Value> = output
        .iter()
        .map(|item| json!({"type": "item_reference", "id": item["id"]}))
        .collect();
    let res = ask(json!({"input": references})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    next_prompt();
    ask(json!({"input": "And tomorrow?", "previous_response_id": first["id"]})).await;
    next_prompt();

    // Stateless, by summary and encrypted content alone (Codex's way).
    let stateless = json!({"store": false, "include": ["reasoning.encrypted_content"]});
    let output = ask(stateless.clone()).await.json()["output"].clone();
    let mut input = vec![json!({"role": "user", "content": "Weather in Paris?"})];
    for item in output.as_array().unwrap() {
        input.push(match item["type"].as_str() {
            Some("reasoning") => json!({"type": "reasoning", "summary": [],
                                        "encrypted_content": item["encrypted_content"]}),
            _ => item.clone(),
        });
    }
    let mut again = stateless;
    again["input"] = json!(input);
    ask(again).await;
    next_prompt();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_for_a_summary_gets_the_reasoning_as_one() {
    // The AI SDK and LangChain read reasoning from summaries only, Codex
    // by default too: asked for one, the model's readable reasoning is it.
    let tool = weather_tool().await;
    let upstream =
        FakeServer::start(|req, _| weather_round(req.json().to_string().contains("temp_c"))).await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let body = json!({"model": "weather", "input": "Weather in Paris?", "stream": true,
                      "reasoning": {"summary": "auto"}});
    let response = post_json(proxy.port, "/v1/responses", &body).await;
    let events = named_events(&response.body);
    let answer = check_stream(&events);
    assert!(!types(&events).contains(&"response.reasoning_text.delta"));
    let summarized: Vec<(&str, &Value)> = events
        .iter()
        .filter(|(name, _)| name.starts_with("response.reasoning_summary"))
        .map(|(name, data)| (name.as_str(), &data["summary_index"]))
        .collect();
    assert_eq!(
        summarized[..4],
        [
            ("response.reasoning_summary_part.added", &json!(0)),
            ("response.reasoning_summary_text.delta", &json!(0)),
            ("response.reasoning_summary_text.done", &json!(0)),
            ("response.reasoning_summary_part.done", &json!(0)),
        ]
    );
    let reasoning: Vec<&Value> = answer["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "reasoning")
        .collect();
    assert_eq!(
        reasoning[0]["summary"],
        json!([{"type": "summary_text", "text": "Let me check."}])
    );
    assert_eq!(reasoning[0].get("content"), None, "{}", reasoning[0]);
    let note = reasoning[1]["summary"][0]["text"].as_str().unwrap();
    assert!(note.starts_with("Calling get_weather"), "{note}");

    // Sent back by reference (the AI SDK, stored answers): the summary is
    // the reasoning the model reads again.
    let mut input: Vec<Value> = answer["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| json!({"type": "item_reference", "id": item["id"]}))
        .collect();
    input.insert(0, json!({"role": "user", "content": "Weather in Paris?"}));
    input.push(json!({"role": "user", "content": "And tomorrow?"}));
    let res = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": input, "reasoning": {"summary": "auto"}}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let next = upstream.requests().last().unwrap().json();
    assert_eq!(
        next["messages"][2],
        json!({"role": "assistant", "content": "It is 21 °C in Paris.",
               "reasoning_content": "Let me check.\nWarm enough."})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_reasoning_alone_stays_an_assistant_turn_in_the_history() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|_, _| weather_round(true)).await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    // As Codex sends it back: by its summary and encrypted content.
    let input = json!([
        {"role": "user", "content": "Think."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Only thinking."}]},
        {"role": "user", "content": "And now?"}]);
    let res = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": input}),
    )
    .await;
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
async fn client_function_tools_round_trip_as_function_call_items() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, _| {
        let body = req.json();
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if last["role"] == "tool" {
            let result = last["content"].as_str().unwrap().to_owned();
            return Reply::events(vec![
                content(&format!("The file says {result}")),
                finish("stop"),
            ]);
        }
        Reply::events(vec![
            tool_call(0, "call_77", "read_file", "{\"path\":\"a.txt\"}"),
            finish("tool_calls"),
        ])
    })
    .await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let tools = json!([{"type": "function", "name": "read_file", "description": "Reads a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]);
    let first = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": "Read a.txt", "tools": tools}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "completed");
    let call = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "function_call")
        .unwrap()
        .clone();
    assert_eq!(call["call_id"], "call_77");
    assert_eq!(call["name"], "read_file");
    assert_eq!(call["arguments"], "{\"path\":\"a.txt\"}");
    // The client runs it and sends the whole conversation back.
    let mut input = vec![json!({"role": "user", "content": "Read a.txt"})];
    input.extend(first["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "function_call_output", "call_id": "call_77", "output": "HELLO"}));
    let second = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": input, "tools": tools, "stream": true}),
    )
    .await;
    let events = named_events(&second.body);
    let response = check_stream(&events);
    let message = response["output"].as_array().unwrap().last().unwrap();
    assert_eq!(message["content"][0]["text"], "The file says HELLO");
    let sent = upstream.requests()[1].json();
    let messages = sent["messages"].as_array().unwrap();
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["tool_calls"][0]["id"], "call_77");
    assert_eq!(
        messages.last().unwrap(),
        &json!({"role": "tool", "tool_call_id": "call_77", "content": "HELLO"})
    );
}

/// A tool output's image (Codex's `view_image`, an image tool's picture)
/// reaches a chat model that takes images in a user message after the
/// results, labelled with its call (a chat tool message holds text only);
/// before, it was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_outputs_image_reaches_a_chat_model_after_the_results() {
    let tool = weather_tool().await;
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("A cat."), finish("stop")])).await;
    let config = weather_config(&upstream, "chat, vision: true", &tool.url(), "");
    let proxy = Proxy::start(&config).await;
    let input = json!([
        {"role": "user", "content": "Look at cat.png"},
        {"type": "function_call", "call_id": "call_9", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_9", "output": [
            {"type": "input_text", "text": "cat.png"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"}]}
    ]);
    let body = json!({"model": "weather", "input": input, "store": false});
    let response = post_json(proxy.port, "/v1/responses", &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let expected = [
        json!({"role": "tool", "tool_call_id": "call_9", "content": "cat.png"}),
        json!({"role": "user", "content": [
            {"type": "text", "text": "Attached to the result of tool call call_9:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}),
    ];
    let sent = upstream.requests()[0].json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages[messages.len() - 2..], expected);

    // The same from the chat front: LangChain's ToolMessage of a picture.
    let body = json!({"model": "weather", "messages": [
        {"role": "user", "content": "Look at cat.png"},
        {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function",
            "function": {"name": "view_image", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": [
            {"type": "text", "text": "cat.png"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}
    ]});
    let response = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let sent = upstream.requests().last().unwrap().json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages[messages.len() - 2..], expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_codex_sends_is_accepted_and_its_namespace_tools_come_back_named() {
    let upstream = FakeServer::start(|req, _| {
        let body = req.json();
        let names: Vec<String> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert!(names.contains(&"exec_command".to_owned()));
        assert!(
            !names.iter().any(|n| n == "web_search"),
            "hosted tools are dropped"
        );
        let nested = names
            .iter()
            .find(|n| n.ends_with("close_agent"))
            .expect("the namespace's functions are offered")
            .clone();
        Reply::events(vec![
            tool_call(0, "call_9", &nested, "{\"id\":\"a1\"}"),
            finish("tool_calls"),
        ])
    })
    .await;
    let tool = weather_tool().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    for fixture in ["codex-0.169.0-round1", "codex-0.169.0-round2"] {
        let path = format!(
            "{}/tests/fixtures/clients/{fixture}.request.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut body: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        body["model"] = json!("weather");
        let response = post_json(proxy.port, "/v1/responses", &body).await;
        assert_eq!(response.status, 200, "{fixture}: {}", response.text());
        let events = named_events(&response.body);
        let final_response = check_stream(&events);
        let call = final_response["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["type"] == "function_call")
            .unwrap();
        assert_eq!(call["name"], "close_agent", "{fixture}");
        assert_eq!(call["namespace"], "multi_agent_v1", "{fixture}");
        assert_eq!(call["call_id"], "call_9");
    }
    // Round 2's history reached the upstream as chat: the call and its output.
    let sent = upstream.requests()[1].json();
    let messages = sent["messages"].as_array().unwrap();
    assert!(messages
        .iter()
        .any(|m| m["tool_calls"][0]["function"]["name"] == "exec_command"));
    assert!(messages
        .iter()
        .any(|m| m["role"] == "tool" && m["tool_call_id"] == "call_mock1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_fields_get_a_clear_error_in_openai_shape() {
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("x"), finish("stop")])).await;
    let tool = weather_tool().await;
    let ask_previous =
        json!({"model": "weather", "input": "hi", "previous_response_id": "resp_123"});
    // Without a store: refused.
    let stateless = weather_config(&upstream, "chat", &tool.url(), "store: { kind: none }");
    let proxy = Proxy::start(&stateless).await;
    let response = post_json(proxy.port, "/v1/responses", &ask_previous).await;
    assert_eq!(response.status, 400);
    let error = &response.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["param"], "previous_response_id");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("keeps no responses"));
    // With the default store: an id it does not hold.
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let response = post_json(proxy.port, "/v1/responses", &ask_previous).await;
    assert_eq!(response.status, 400, "as OpenAI's: {}", response.text());
    let error = &response.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["code"], "previous_response_not_found");
    assert_eq!(error["param"], "previous_response_id");
    let response = post_json(proxy.port, "/v1/responses", &json!({"model": "weather"})).await;
    assert_eq!(response.status, 400, "{}", response.text());
    assert_eq!(response.json()["error"]["param"], "input");
    assert!(upstream.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_models_pass_through_to_the_upstream_responses_endpoint() {
    let upstream = FakeServer::start(|req, _| {
        assert_eq!(req.path, "/v1/responses");
        Reply::json(
            200,
            json!({"id": "resp_up", "object": "response", "echo": req.json()}),
        )
    })
    .await;
    let tool = weather_tool().await;
    let proxy = Proxy::start(&weather_config(&upstream, "chat", &tool.url(), "")).await;
    let body =
        json!({"model": "gpt-x", "input": "hi", "previous_response_id": "resp_1", "x_vendor": 1});
    let response = post_json(proxy.port, "/v1/responses", &body).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["echo"], body, "forwarded untouched");
}

// ------------------------------------------------ a Responses upstream

/// One event of OpenAI's Responses stream framing.
fn up_event(kind: &str, mut data: Value) -> Step {
    data["type"] = json!(kind);
    Step::Bytes(format!("event: {kind}\ndata: {data}\n\n").into_bytes())
}

fn responses_stream(steps: Vec<Step>) -> Reply {
    Reply::Sse {
        steps,
        complete: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_upstream_gets_tool_outputs_and_its_encrypted_reasoning_back() {
    let tool = weather_tool().await;
    let upstream = FakeServer::start(|req, i| {
        assert_eq!(req.path, "/v1/responses");
        let reasoning = json!({"type": "reasoning", "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Need the weather."}],
            "encrypted_content": "ENC-1"});
        match i {
            0 => responses_stream(vec![
                up_event("response.created", json!({"response": {"id": "resp_a", "status": "in_progress", "output": []}})),
                up_event("response.output_item.added", json!({"output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}})),
                up_event("response.reasoning_summary_text.delta", json!({"item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Need the weather."})),
                up_event("response.output_item.done", json!({"output_index": 0, "item": reasoning})),
                up_event("response.output_item.done", json!({"output_index": 1, "item": {"type": "function_call", "id": "fc_1",
                    "call_id": "call_w", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed"}})),
                up_event("response.completed", json!({"response": {"id": "resp_a", "status": "completed",
                    "output": [reasoning], "usage": {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}}})),
            ]),
            _ => responses_stream(vec![
                up_event("response.created", json!({"response": {"id": "resp_b", "status": "in_progress", "output": []}})),
                up_event("response.output_text.delta", json!({"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Sunny, 21 °C."})),
                up_event("response.completed", json!({"response": {"id": "resp_b", "status": "completed",
                    "output": [], "usage": {"input_tokens": 30, "output_tokens": 6, "total_tokens": 36}}})),
            ]),
        }
    })
    .await;
    let proxy = Proxy::start(&weather_config(&upstream, "responses", &tool.url(), "")).await;
    let response = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "weather", "messages": [{"role": "user", "content": "Paris?"}]}),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let answer = response.json();
    assert_eq!(answer["choices"][0]["message"]["content"], "Sunny, 21 °C.");
    let reasoning = answer["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap();
    assert!(reasoning.contains("Need the weather."), "{reasoning}");
    assert_eq!(answer["usage"]["prompt_tokens"], 41);
    let requests = upstream.requests();
    let first = requests[0].json();
    assert_eq!(first["store"], false);
    assert_eq!(first["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(first["instructions"], "You are a weather assistant.");
    assert_eq!(first["model"], "up-model");
    let second = requests[1].json();
    let input = second["input"].as_array().unwrap();
    let carried = input
        .iter()
        .find(|item| item["type"] == "reasoning")
        .expect("the round-1 reasoning item is carried");
    assert_eq!(carried["encrypted_content"], "ENC-1");
    assert_eq!(carried["id"], "rs_1");
    let output = input
        .iter()
        .find(|item| item["type"] == "function_call_output")
        .unwrap();
    assert_eq!(output["call_id"], "call_w");
    assert!(output["output"].as_str().unwrap().contains("21"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_upstreams_summaries_stay_its_own_when_a_summary_is_asked_for() {
    // Its items carry a summary of their own beside the raw text: the
    // client gets both as the upstream made them, each summary part once.
    let upstream = FakeServer::start(|_, _| {
        let item = json!({"type": "reasoning", "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Short summary."}],
            "content": [{"type": "reasoning_text", "text": "Raw thinking."}],
            "encrypted_content": "ENC-1"});
        responses_stream(vec![
            up_event("response.created", json!({"response": {"id": "resp_a", "status": "in_progress", "output": []}})),
            up_event("response.output_item.added", json!({"output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}})),
            up_event("response.reasoning_text.delta", json!({"item_id": "rs_1", "output_index": 0, "content_index": 0, "delta": "Raw thinking."})),
            up_event("response.output_item.done", json!({"output_index": 0, "item": item})),
            up_event("response.output_text.delta", json!({"item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Hi."})),
            up_event("response.completed", json!({"response": {"id": "resp_a", "status": "completed",
                "output": [item], "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}})),
        ])
    })
    .await;
    let tool = weather_tool().await;
    let proxy = Proxy::start(&weather_config(&upstream, "responses", &tool.url(), "")).await;
    let body = json!({"model": "weather", "input": "Hi?", "stream": true,
                      "reasoning": {"summary": "auto"}});
    let response = post_json(proxy.port, "/v1/responses", &body).await;
    let events = named_events(&response.body);
    let answer = check_stream(&events);
    let parts: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|(name, _)| name == "response.reasoning_summary_part.added")
        .map(|(_, data)| (&data["item_id"], &data["summary_index"]))
        .collect();
    assert_eq!(parts.len(), 1, "{parts:?}");
    let item = &answer["output"][0];
    assert_eq!(
        item["summary"],
        json!([{"type": "summary_text", "text": "Short summary."}])
    );
    assert_eq!(
        item["content"],
        json!([{"type": "reasoning_text", "text": "Raw thinking."}])
    );
}

/// OpenAI streams a reasoning model's summary, not its reasoning: the
/// client gets it as summary events, as from OpenAI (Codex and the AI SDK
/// show only those), and the item done with the upstream's summary parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_upstreams_streamed_summary_reaches_the_client_as_a_summary() {
    let upstream = FakeServer::start(|_, _| {
        let summary = json!([{"type": "summary_text", "text": "**Plan**"},
                             {"type": "summary_text", "text": "Say hi."}]);
        let item = json!({"type": "reasoning", "id": "rs_1", "summary": summary,
                          "encrypted_content": "ENC-1"});
        let at = |index: u64| json!({"item_id": "rs_1", "output_index": 0, "summary_index": index});
        let with = |mut at: Value, key: &str, value: Value| {
            at[key] = value;
            at
        };
        responses_stream(vec![
            up_event("response.created", json!({"response": {"id": "resp_a", "status": "in_progress", "output": []}})),
            up_event("response.output_item.added", json!({"output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}})),
            up_event("response.reasoning_summary_part.added", with(at(0), "part", json!({"type": "summary_text", "text": ""}))),
            up_event("response.reasoning_summary_text.delta", with(at(0), "delta", json!("**Plan**"))),
            up_event("response.reasoning_summary_part.added", with(at(1), "part", json!({"type": "summary_text", "text": ""}))),
            up_event("response.reasoning_summary_text.delta", with(at(1), "delta", json!("Say hi."))),
            up_event("response.output_item.done", json!({"output_index": 0, "item": item})),
            up_event("response.output_text.delta", json!({"item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Hi."})),
            up_event("response.completed", json!({"response": {"id": "resp_a", "status": "completed",
                "output": [item], "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}})),
        ])
    })
    .await;
    let tool = weather_tool().await;
    let proxy = Proxy::start(&weather_config(&upstream, "responses", &tool.url(), "")).await;
    let body = json!({"model": "weather", "input": "Hi?", "stream": true,
                      "reasoning": {"summary": "auto"}});
    let response = post_json(proxy.port, "/v1/responses", &body).await;
    let events = named_events(&response.body);
    let answer = check_stream(&events);
    let kinds = types(&events);
    assert!(
        !kinds.contains(&"response.reasoning_text.delta"),
        "{kinds:?}"
    );
    let summary: String = events
        .iter()
        .filter(|(name, _)| name == "response.reasoning_summary_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap())
        .collect();
    assert_eq!(summary, "**Plan**\n\nSay hi.");
    let item = &answer["output"][0];
    assert_eq!(
        item["summary"],
        json!([{"type": "summary_text", "text": "**Plan**"},
               {"type": "summary_text", "text": "Say hi."}])
    );
    assert!(item.get("content").is_none(), "{item}");
    assert_eq!(item["encrypted_content"], "ENC-1");
    // A chat client reads it as the reasoning.
    let body = json!({"model": "weather", "messages": [{"role": "user", "content": "Hi?"}]});
    let answer = post_json(proxy.port, "/v1/chat/completions", &body)
        .await
        .json();
    let reasoning = &answer["choices"][0]["message"]["reasoning_content"];
    assert_eq!(reasoning, "**Plan**\n\nSay hi.");
}

/// A Responses upstream's whole answer (a client that does not stream): its
/// reasoning item is the answer's one, with its summary and encrypted
/// content, and goes back as it came; it was shown twice, the second time
/// under an id the upstream never made, without its encrypted content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_upstreams_whole_answer_holds_its_reasoning_item_once() {
    let upstream = FakeServer::start(|_, _| {
        let item = json!({"type": "reasoning", "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Short summary."}],
            "encrypted_content": "ENC-1"});
        let message = json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi."}]});
        Reply::json(
            200,
            json!({"id": "resp_a", "object": "response", "status": "completed",
            "output": [item, message],
            "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}),
        )
    })
    .await;
    let tool = weather_tool().await;
    let proxy = Proxy::start(&weather_config(&upstream, "responses", &tool.url(), "")).await;
    let first = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": "Hi?"}),
    )
    .await;
    let first = first.json();
    let output = first["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message"], "{output:?}");
    assert_eq!(output[0]["summary"][0]["text"], "Short summary.");
    assert_eq!(output[0]["encrypted_content"], "ENC-1");
    let body = json!({"model": "weather", "input": "More?", "previous_response_id": first["id"]});
    let second = post_json(proxy.port, "/v1/responses", &body).await;
    assert_eq!(second.status, 200, "{}", second.text());
    let sent = upstream.requests().last().unwrap().json();
    let reasoning: Vec<&Value> = sent["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "reasoning")
        .collect();
    assert_eq!(reasoning.len(), 1, "{reasoning:?}");
    assert_eq!(reasoning[0]["encrypted_content"], "ENC-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_front_puts_reasoning_where_reasoning_field_says() {
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![reasoning("Hmm."), content("Hi."), finish("stop")])
    })
    .await;
    let tool = weather_tool().await;
    let yaml = format!(
        "{}\nreasoning_field: reasoning\n",
        weather_config(&upstream, "chat", &tool.url(), "")
    );
    let proxy = Proxy::start(&yaml).await;
    let body = json!({"model": "weather", "messages": [{"role": "user", "content": "hi"}], "stream": true});
    let response = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(response.delta_text("reasoning"), "Hmm.");
    assert_eq!(response.delta_text("reasoning_content"), "");
    assert_eq!(response.delta_text("content"), "Hi.");
    let whole = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "weather",
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
    .json();
    assert_eq!(whole["choices"][0]["message"]["reasoning"], "Hmm.");
    assert!(whole["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
}

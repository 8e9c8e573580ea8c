//! The agent path end to end: the real proxy between a client and a scripted
//! upstream, running local tools.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Config with one upstream and a `weather` agent whose tool is `tool_url`.
fn config(upstream: &FakeServer, tool_url: &str, agent_extra: &str) -> String {
    format!(
        r#"
default_upstream: local
upstreams:
  local: {{ url: "{up}/v1" }}
tools:
  get_weather:
    description: Current weather for a city
    parameters: {{ type: object, properties: {{ city: {{ type: string }} }}, required: [city] }}
    http: {{ url: "{tool_url}", timeout_ms: 2000 }}
  echo_args:
    description: Echoes its arguments
    command: {{ argv: ["cat"], timeout_ms: 2000 }}
skills:
  forecasting: {{ prompt: "Always use Celsius.", tools: [get_weather] }}
agents:
  weather:
    model: qwen3-8b
    system_prompt: You are a weather assistant.
    skills: [forecasting]
    params: {{ temperature: 0.2 }}
{agent_extra}
limits: {{ heartbeat_ms: 100 }}
"#,
        up = upstream.url()
    )
}

/// An upstream that answers `first` to the first call and `answer` after.
async fn tool_round_then(first: Vec<Value>, answer: &'static str) -> FakeServer {
    let first = std::sync::Mutex::new(Some(first));
    FakeServer::start(move |_, i| match (i, first.lock().unwrap().take()) {
        (0, Some(events)) => Reply::events(events),
        _ => Reply::events(vec![content(answer), finish("stop")]),
    })
    .await
}

/// An upstream answering with real llama.cpp non-streamed answers: a tool
/// call, then reasoning and content.
async fn json_rounds() -> FakeServer {
    FakeServer::start(|_, i| match i {
        0 => Reply::raw_json(200, &fixture("toolcall-nonstream.json")),
        _ => Reply::raw_json(200, &fixture("reasoning-nonstream.json")),
    })
    .await
}

/// The proxy with the `weather` agent, its tool served by `tool`.
async fn weather_agent(upstream: &FakeServer, tool: &FakeServer) -> Proxy {
    agent_with(upstream, tool, "    tools: [get_weather]").await
}

/// The proxy with the `weather` agent set up by `agent_extra` (YAML lines of
/// the agent), its `get_weather` tool served by `tool`.
async fn agent_with(upstream: &FakeServer, tool: &FakeServer, agent_extra: &str) -> Proxy {
    Proxy::start(&config(
        upstream,
        &format!("{}/weather", tool.url()),
        agent_extra,
    ))
    .await
}

async fn weather_tool(status: u16) -> FakeServer {
    FakeServer::start(move |_, _| Reply::json(status, json!({"city": "Paris", "temp_c": 21}))).await
}

/// Concatenated `delta.<field>` of a captured llama.cpp stream.
fn fixture_text(name: &str, field: &str) -> String {
    sse_data(&fixture(name))
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["delta"][field].as_str().map(str::to_owned)
        })
        .collect()
}

fn ask(stream: bool) -> Value {
    json!({"model": "weather", "stream": stream,
           "messages": [{"role": "user", "content": "What is the weather in Paris?"}]})
}

#[tokio::test]
async fn streams_a_two_round_tool_loop_from_real_llama_cpp_captures() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, i| match i {
        0 => Reply::replay(&fixture("toolcall-stream.sse"), Duration::ZERO),
        _ => Reply::replay(&fixture("reasoning-stream.sse"), Duration::ZERO),
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;

    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("content-type"), Some("text/event-stream"));
    assert_eq!(res.header("cache-control"), Some("no-cache"));
    assert_eq!(res.header("x-accel-buffering"), Some("no"));
    assert!(res.complete && res.ends_with_done());

    let events = res.events();
    let id = events[0]["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("chatcmpl-"));
    for e in &events {
        assert_eq!(e["id"], id.as_str(), "one id for the whole loop");
        assert_eq!(e["model"], "weather");
        assert_eq!(e["object"], "chat.completion.chunk");
        assert!(
            e["choices"][0]["delta"].get("tool_calls").is_none(),
            "local calls are not shown as tool calls"
        );
    }
    let roles = events
        .iter()
        .filter(|e| e["choices"][0]["delta"].get("role").is_some())
        .count();
    assert_eq!(roles, 1);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let finishes: Vec<&Value> = events
        .iter()
        .map(|e| &e["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("stop")]);

    let reasoning = res.delta_text("reasoning_content");
    let round1 = fixture_text("toolcall-stream.sse", "reasoning_content");
    let round2 = fixture_text("reasoning-stream.sse", "reasoning_content");
    // The note is a line of its own after the model's reasoning.
    assert!(!round1.ends_with('\n'));
    let note = "\nCalling get_weather {\"city\":\"Paris\"}…\n";
    assert_eq!(reasoning, format!("{round1}{note}{round2}"));
    assert_eq!(
        res.delta_text("content"),
        fixture_text("reasoning-stream.sse", "content")
    );

    // The tool got the model's arguments; round 2 carried the call and its result.
    assert_eq!(tool.requests()[0].json(), json!({"city": "Paris"}));
    let calls = upstream.requests();
    assert_eq!(calls.len(), 2);
    let first = calls[0].json();
    assert_eq!(calls[0].path, "/v1/chat/completions");
    assert_eq!(first["model"], "qwen3-8b");
    assert_eq!(first["temperature"], 0.2);
    assert_eq!(first["stream"], true);
    assert_eq!(first["messages"][0]["role"], "system");
    assert_eq!(
        first["messages"][0]["content"],
        "You are a weather assistant.\n\nAlways use Celsius."
    );
    assert_eq!(first["tools"][0]["function"]["name"], "get_weather");
    let second = calls[1].json();
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    let assistant = &messages[2];
    assert_eq!(assistant["role"], "assistant");
    let call = &assistant["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["tool_call_id"], call["id"]);
    assert_eq!(
        messages[3]["content"],
        json!({"city": "Paris", "temp_c": 21}).to_string()
    );
}

#[tokio::test]
async fn non_streaming_loop_returns_one_completion_with_summed_usage() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, i| match i {
        0 => Reply::events(vec![
            role(),
            tool_call(0, "c1", "get_weather", "{\"city\":"),
            tool_args(0, "\"Paris\"}"),
            finish("tool_calls"),
            usage(10, 5),
        ]),
        _ => Reply::events(vec![
            role(),
            reasoning("sunny?"),
            content("It is 21 °C."),
            finish("stop"),
            usage(20, 7),
        ]),
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;

    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "weather");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "It is 21 °C.");
    assert_eq!(
        choice["message"]["reasoning_content"],
        "Calling get_weather {\"city\":\"Paris\"}…\nsunny?"
    );
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42})
    );
}

#[tokio::test]
async fn a_non_streaming_client_gets_non_streaming_upstream_calls_from_real_llama_cpp_captures() {
    let tool = weather_tool(200).await;
    let upstream = json_rounds().await;
    let proxy = weather_agent(&upstream, &tool).await;

    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200, "{}", res.text());

    // One JSON answer per round is cheaper for the model server than SSE,
    // and OpenAI refuses `stream_options` on a request that does not stream.
    let calls = upstream.requests();
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert_eq!(call.json()["stream"], false);
        assert!(call.json().get("stream_options").is_none());
    }
    assert_eq!(tool.requests()[0].json(), json!({"city": "Paris"}));
    let round1: Value = serde_json::from_slice(&fixture("toolcall-nonstream.json")).unwrap();
    let round2: Value = serde_json::from_slice(&fixture("reasoning-nonstream.json")).unwrap();
    let message = |v: &Value, field: &str| {
        v["choices"][0]["message"][field]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let body = res.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["content"], message(&round2, "content"));
    assert_eq!(
        choice["message"]["reasoning_content"],
        format!(
            "{}\nCalling get_weather {{\"city\":\"Paris\"}}…\n{}",
            message(&round1, "reasoning_content"),
            message(&round2, "reasoning_content")
        )
    );
    let sum = |field: &str| {
        round1["usage"][field].as_u64().unwrap() + round2["usage"][field].as_u64().unwrap()
    };
    assert_eq!(body["usage"]["prompt_tokens"], sum("prompt_tokens"));
    assert_eq!(body["usage"]["completion_tokens"], sum("completion_tokens"));
}

#[tokio::test]
async fn stream_usage_chunk_sums_all_rounds() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, i| match i {
        0 => Reply::events(vec![
            tool_call(0, "c1", "get_weather", "{\"city\":\"Oslo\"}"),
            finish("tool_calls"),
            usage(10, 5),
        ]),
        _ => Reply::events(vec![content("Cold."), finish("stop"), usage(20, 7)]),
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let mut body = ask(true);
    body["stream_options"] = json!({"include_usage": true});
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    let events = res.events();
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42})
    );
    assert!(res.ends_with_done());
}

#[tokio::test]
async fn client_tool_calls_go_back_to_the_client() {
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![
            role(),
            content("Let me look."),
            tool_call(0, "call-9", "lookup_order", "{\"id\":"),
            tool_args(0, "42}"),
            finish("tool_calls"),
        ])
    })
    .await;
    let proxy = Proxy::start(&config(
        &upstream,
        "http://127.0.0.1:9/unused",
        "    tools: [get_weather]",
    ))
    .await;
    let mut body = ask(true);
    body["tools"] = json!([{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    let events = res.events();
    // The role's chunk says no text yet, as llama-server's does: `""`
    // would open a text part in the AI SDK before any text or call.
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    let calls: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0],
        &json!([{"index": 0, "id": "call-9", "type": "function", "function": {"name": "lookup_order", "arguments": "{\"id\":42}"}}])
    );
    assert_eq!(res.delta_text("content"), "Let me look.");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert_eq!(upstream.requests().len(), 1);
    // The client's tool reached the model next to the agent's.
    let names: Vec<String> = upstream.requests()[0].json()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["get_weather", "lookup_order"]);

    // Non-streaming: the standard message form.
    body["stream"] = json!(false);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    let message = &res.json()["choices"][0]["message"];
    assert_eq!(message["tool_calls"][0]["function"]["name"], "lookup_order");
    assert_eq!(res.json()["choices"][0]["finish_reason"], "tool_calls");
}

/// A call to a tool no one offered (vLLM's parsers let a made-up name
/// through) is not handed to a client that never declared it: the model is
/// told there is no such tool, and answers in its next round.
#[tokio::test]
async fn a_call_to_a_tool_no_one_offered_is_answered_to_the_model() {
    let upstream = FakeServer::start(|req, _| match req.tool_results().last() {
        None => Reply::events(vec![
            tool_call(0, "call-1", "python", "{\"code\":\"2+2\"}"),
            finish("tool_calls"),
        ]),
        Some(result) => Reply::events(vec![content(&format!("4 ({result})")), finish("stop")]),
    })
    .await;
    let proxy = Proxy::start(&config(
        &upstream,
        "http://127.0.0.1:9/unused",
        "    tools: [get_weather]",
    ))
    .await;
    for stream in [false, true] {
        let mut body = ask(stream);
        body["tools"] = json!([{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]);
        let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
        assert_eq!(res.status, 200, "{}", res.text());
        let (text, finish) = match stream {
            true => {
                let events = res.events();
                let finish = events.last().unwrap()["choices"][0]["finish_reason"].clone();
                (res.delta_text("content"), finish)
            }
            false => {
                let choice = res.json()["choices"][0].clone();
                let text = choice["message"]["content"].as_str().unwrap().to_owned();
                assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
                (text, choice["finish_reason"].clone())
            }
        };
        assert_eq!(finish, "stop");
        assert!(
            text.starts_with("4 (error: There is no tool `python`."),
            "{text}"
        );
    }
}

/// Once the agent's tools ran, a failure is not for the client to send
/// again: the OpenAI SDKs resend a 5xx twice unless `x-should-retry: false`
/// says not to, and the tools (an order placed, a mail sent) would run
/// again each time. A failure before any tool ran may be sent again.
#[tokio::test]
async fn a_failure_after_the_tools_ran_tells_the_sdks_not_to_retry() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|req, _| {
        let busy = br#"{"error":{"message":"busy","type":"server_error","code":503}}"#;
        match (
            req.json()["messages"][1]["content"].as_str(),
            req.tool_results().is_empty(),
        ) {
            (Some("first"), _) | (_, false) => Reply::raw_json(503, busy),
            (_, true) => Reply::events(vec![
                tool_call(0, "call-1", "get_weather", "{\"city\":\"Rome\"}"),
                finish("tool_calls"),
            ]),
        }
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, &tool.url(), "    tools: [get_weather]")).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(tool.requests().len(), 1);
    assert_eq!(res.header("x-should-retry"), Some("false"));
    let mut first = ask(false);
    first["messages"][0]["content"] = json!("first");
    let res = post_json(proxy.port, "/v1/chat/completions", &first).await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.header("x-should-retry"), None, "no tool ran");
}

#[tokio::test]
async fn mixed_turn_runs_local_calls_and_defers_client_calls() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, i| match i {
        0 => Reply::events(vec![
            tool_call(0, "local-1", "get_weather", "{\"city\":\"Rome\"}"),
            tool_call(1, "client-1", "lookup_order", "{\"id\":1}"),
            finish("tool_calls"),
        ]),
        _ => Reply::events(vec![
            tool_call(0, "client-2", "lookup_order", "{\"id\":1}"),
            finish("tool_calls"),
        ]),
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let mut body = ask(false);
    body["tools"] = json!([{"type": "function", "function": {"name": "lookup_order"}}]);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(tool.requests().len(), 1, "the local call ran");
    let results = upstream.requests()[1].tool_messages();
    assert_eq!(results.len(), 2, "every call got a result");
    assert_eq!(results[0].0, "local-1");
    assert!(results[0].1.contains("temp_c"));
    assert_eq!(results[1].0, "client-1");
    assert!(
        results[1]
            .1
            .starts_with("error: `lookup_order` was not run"),
        "{}",
        results[1].1
    );
    let choice = &res.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["tool_calls"][0]["id"], "client-2");
}

#[tokio::test]
async fn max_tool_rounds_ends_with_a_note_and_finish_reason_length() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, i| {
        Reply::events(vec![
            tool_call(0, &format!("c{i}"), "get_weather", "{\"city\":\"Nice\"}"),
            finish("tool_calls"),
        ])
    })
    .await;
    let proxy = agent_with(
        &upstream,
        &tool,
        "    tools: [get_weather]\n    max_tool_rounds: 2",
    )
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(upstream.requests().len(), 3);
    assert_eq!(tool.requests().len(), 2);
    let events = res.events();
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(res
        .delta_text("content")
        .contains("stopped after 2 tool rounds"));
    assert!(res.ends_with_done());
}

/// A forced tool choice asks for one call: once the agent's tool ran, the
/// model may answer. Forced on every round, a server that enforces it (as
/// llama.cpp's grammar does) called a tool each round until the cap.
#[tokio::test]
async fn a_forced_tool_choice_holds_for_the_first_round_only() {
    let tool = weather_tool(200).await;
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, params) in [
        (Some(json!("required")), ""),
        (Some(named.clone()), ""),
        (
            None,
            "    params: { temperature: 0.2, tool_choice: required }\n",
        ),
    ] {
        let upstream = tool_round_then(
            vec![
                tool_call(0, "c1", "get_weather", "{\"city\":\"Paris\"}"),
                finish("tool_calls"),
            ],
            "Sunny.",
        )
        .await;
        // The config's own `params` line, replaced when the case has one.
        let config = config(
            &upstream,
            &format!("{}/weather", tool.url()),
            "    tools: [get_weather]",
        );
        let config = match params {
            "" => config,
            params => config.replace("    params: { temperature: 0.2 }\n", params),
        };
        let proxy = Proxy::start(&config).await;
        let mut body = ask(true);
        if let Some(choice) = &choice {
            body["tool_choice"] = choice.clone();
        }
        let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
        assert_eq!(res.delta_text("content"), "Sunny.");
        let sent: Vec<Value> = upstream.requests().iter().map(|r| r.json()).collect();
        assert_eq!(sent.len(), 2);
        let first = choice.unwrap_or(json!("required"));
        assert_eq!(sent[0]["tool_choice"], first);
        assert_eq!(sent[1]["tool_choice"], "auto", "{params}");
    }
}

#[tokio::test]
async fn failing_tools_and_bad_arguments_become_results_not_failures() {
    let tool = weather_tool(500).await;
    let upstream = tool_round_then(
        vec![
            tool_call(0, "a", "get_weather", "{\"city\":\"Lima\"}"),
            tool_call(1, "b", "get_weather", "{not json"),
            tool_call(2, "c", "echo_args", "{\"x\": \"$(rm -rf /); `id`\"}"),
            finish("tool_calls"),
        ],
        "Sorry, no data.",
    )
    .await;
    let proxy = agent_with(&upstream, &tool, "    tools: [get_weather, echo_args]").await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json()["choices"][0]["message"]["content"],
        "Sorry, no data."
    );
    assert_eq!(
        tool.requests().len(),
        1,
        "invalid JSON arguments are not executed"
    );
    let results = upstream.requests()[1].tool_results();
    assert!(
        results[0].starts_with("error: HTTP status 500"),
        "{}",
        results[0]
    );
    assert!(results[1].contains("not valid JSON"), "{}", results[1]);
    // Shell metacharacters reach the command as inert data on stdin.
    assert_eq!(results[2], "{\"x\": \"$(rm -rf /); `id`\"}");
}

#[tokio::test]
async fn a_tool_that_hangs_times_out_into_an_error_result() {
    let upstream = tool_round_then(
        vec![
            tool_call(0, "a", "get_weather", "{\"city\":\"Oslo\"}"),
            finish("tool_calls"),
        ],
        "ok",
    )
    .await;
    let hanging = FakeServer::start(|_, _| Reply::Stall).await;
    let proxy = Proxy::start(&config(
        &upstream,
        &format!("{}/weather", hanging.url()),
        "    tools: [get_weather]",
    ))
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200);
    let second = upstream.requests()[1].json();
    let result = second["messages"][3]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(result, "error: timed out after 2000 ms");
}

#[tokio::test]
async fn reasoning_deltas_are_forwarded_as_they_arrive() {
    let upstream = FakeServer::start(|_, _| {
        let mut steps = Vec::new();
        for word in ["one ", "two ", "three ", "four ", "five "] {
            steps.push(Step::Bytes(
                format!("data: {}\n\n", reasoning(word)).into_bytes(),
            ));
            steps.push(Step::Sleep(Duration::from_millis(150)));
        }
        steps.push(Step::Bytes(
            format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                content("done"),
                finish("stop")
            )
            .into_bytes(),
        ));
        Reply::Sse {
            steps,
            complete: true,
        }
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "http://127.0.0.1:9/x", "")).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(
        res.delta_text("reasoning_content"),
        "one two three four five "
    );
    let first_reasoning = res
        .chunks
        .iter()
        .find(|(_, c)| String::from_utf8_lossy(c).contains("\"reasoning_content\":\"one "))
        .map(|(t, _)| *t)
        .expect("first reasoning chunk");
    let last = res.chunks.last().unwrap().0;
    // Five deltas 150 ms apart upstream: a proxy that buffered a round
    // would deliver the first one together with the last.
    assert!(
        last.duration_since(first_reasoning) >= Duration::from_millis(450),
        "first reasoning delta arrived only {:?} before the end",
        last.duration_since(first_reasoning)
    );
}

#[tokio::test]
async fn think_tags_split_across_chunks_become_reasoning_content() {
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![
            content("<thi"),
            content("nk>let me think</th"),
            content("ink>\n\nAnswer: 4"),
            finish("stop"),
        ])
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "http://127.0.0.1:9/x", "")).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(res.delta_text("reasoning_content"), "let me think");
    assert_eq!(res.delta_text("content"), "\n\nAnswer: 4");
}

#[tokio::test]
async fn enable_thinking_false_drops_reasoning_and_reaches_the_template() {
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![
            reasoning("secret thoughts"),
            vec_reasoning_alias("more"),
            content("Hi!"),
            finish("stop"),
        ])
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "http://127.0.0.1:9/x", "")).await;
    let mut body = ask(true);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(
        res.delta_text("reasoning_content"),
        "secret thoughtsmore",
        "`reasoning` (vLLM) is shown as reasoning_content"
    );
    body["enable_thinking"] = json!(false);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.delta_text("reasoning_content"), "");
    assert_eq!(res.delta_text("content"), "Hi!");
    let sent = upstream.requests()[1].json();
    assert_eq!(
        sent["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
}

fn vec_reasoning_alias(text: &str) -> Value {
    json!({"choices":[{"index":0,"delta":{"reasoning":text},"finish_reason":null}]})
}

#[tokio::test]
async fn heartbeats_keep_a_stream_alive_while_a_tool_runs() {
    let upstream = tool_round_then(
        vec![
            tool_call(0, "a", "get_weather", "{\"city\":\"Oslo\"}"),
            finish("tool_calls"),
        ],
        "ok",
    )
    .await;
    let slow_tool = FakeServer::start(|_, _| {
        std::thread::sleep(Duration::from_millis(600));
        Reply::json(200, json!({"ok": true}))
    })
    .await;
    let proxy = Proxy::start(&config(
        &upstream,
        &format!("{}/weather", slow_tool.url()),
        "    tools: [get_weather]",
    ))
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    let heartbeats = res.text().matches(": keep-alive\n\n").count();
    assert!(
        heartbeats >= 2,
        "expected heartbeats during a 600 ms tool, got {heartbeats}:\n{}",
        res.text()
    );
    assert_eq!(res.delta_text("content"), "ok");
}

#[tokio::test]
async fn tool_events_setting_controls_progress_lines() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, i| match i % 2 {
        0 => Reply::events(vec![
            reasoning("I should look."),
            content("Let me look."),
            tool_call(0, "a", "get_weather", "{\"city\":\"Oslo\"}"),
            finish("tool_calls"),
        ]),
        _ => Reply::events(vec![reasoning("Found it."), content("ok"), finish("stop")]),
    })
    .await;
    // A line of its own, after whatever the model's text ended with; a
    // round's reasoning does not run into the last one's either.
    let note = "Calling get_weather {\"city\":\"Oslo\"}…\n";
    for (events, content, reasoning) in [
        (
            "content",
            format!("Let me look.\n{note}ok"),
            "I should look.\n\nFound it.".to_owned(),
        ),
        (
            "reasoning",
            "Let me look.\n\nok".to_owned(),
            format!("I should look.\n{note}Found it."),
        ),
        (
            "hidden",
            "Let me look.\n\nok".to_owned(),
            "I should look.\n\nFound it.".to_owned(),
        ),
    ] {
        let proxy = agent_with(
            &upstream,
            &tool,
            &format!("    tools: [get_weather]\n    tool_events: {events}"),
        )
        .await;
        let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
        assert_eq!(res.delta_text("content"), content, "{events}");
        assert_eq!(res.delta_text("reasoning_content"), reasoning, "{events}");
    }
    assert_eq!(tool.requests().len(), 3, "the tool ran whatever was shown");
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_upstream_request() {
    let upstream = FakeServer::start(|_, _| {
        let mut steps = Vec::new();
        for i in 0..100 {
            steps.push(Step::Bytes(
                format!("data: {}\n\n", content(&format!("w{i} "))).into_bytes(),
            ));
            steps.push(Step::Sleep(Duration::from_millis(50)));
        }
        Reply::Sse {
            steps,
            complete: true,
        }
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "http://127.0.0.1:9/x", "")).await;
    let mut conn = Connection::chat(proxy.port, &ask(true)).await;
    let mut head = conn.head().await;
    assert_eq!(head.status, 200);
    conn.next_chunk(&mut head).await.expect("a first chunk");
    drop(conn);
    let hung_up = wait_until(Duration::from_secs(10), || {
        std::future::ready(upstream.hangups() == 1)
    })
    .await;
    assert!(
        hung_up,
        "the upstream connection was closed when the client left"
    );
}

#[tokio::test]
async fn client_disconnect_kills_a_running_command_tool() {
    let dir = scratch_dir();
    let pid_file = dir.join("pid");
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![tool_call(0, "a", "slow", "{}"), finish("tool_calls")])
    })
    .await;
    let extra = format!(
        r#"    tools: [slow]
tools:
  slow:
    command: {{ argv: ["python3", "-c", "import os,time; open('{}','w').write(str(os.getpid()) + chr(10)); time.sleep(30)"], timeout_ms: 60000 }}"#,
        pid_file.display()
    );
    // `tools:` appears twice in YAML otherwise; put the slow tool in its own config.
    let yaml = format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{}/v1" }} }}
agents:
  weather:
{extra}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let mut conn = Connection::chat(proxy.port, &ask(true)).await;
    let head = conn.head().await;
    assert_eq!(head.status, 200);
    let pid: u32 = wait_line(&pid_file, Duration::from_secs(10))
        .await
        .parse()
        .expect("the tool wrote its pid");
    drop(conn);
    let killed = wait_until(Duration::from_secs(10), || {
        std::future::ready(process_gone(pid))
    })
    .await;
    assert!(killed, "tool process {pid} still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_in_one_turn_run_concurrently() {
    use std::sync::{Arc, Condvar, Mutex};
    // Each tool request waits (up to 5 s) until both have arrived: run one
    // after the other, the first would give up alone.
    let arrived = Arc::new((Mutex::new(0u32), Condvar::new()));
    let tool = FakeServer::start(move |_, _| {
        let (count, cvar) = &*arrived;
        let mut n = count.lock().unwrap();
        *n += 1;
        cvar.notify_all();
        let (n, _) = cvar
            .wait_timeout_while(n, Duration::from_secs(5), |n| *n < 2)
            .unwrap();
        Reply::json(200, json!({ "met": *n >= 2 }))
    })
    .await;
    let upstream = tool_round_then(
        vec![
            tool_call(0, "a", "get_weather", "{\"city\":\"Oslo\"}"),
            tool_call(1, "b", "get_weather", "{\"city\":\"Rome\"}"),
            finish("tool_calls"),
        ],
        "done",
    )
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200);
    let results = upstream.requests()[1].tool_results();
    assert_eq!(results, ["{\"met\":true}", "{\"met\":true}"]);
}

/// An upstream whose first round makes `n` calls of `get_weather` (served
/// by `tool`), and the proxy with `limits`.
async fn one_round_of_calls(n: u32, limits: &str, tool: &FakeServer) -> (FakeServer, Proxy) {
    let calls: Vec<Value> = (0..n)
        .map(|i| {
            tool_call(
                i,
                &format!("call_{i}"),
                "get_weather",
                "{\"city\":\"Oslo\"}",
            )
        })
        .chain([finish("tool_calls")])
        .collect();
    let upstream = tool_round_then(calls, "done").await;
    let yaml = config(
        &upstream,
        &format!("{}/weather", tool.url()),
        "    tools: [get_weather]",
    )
    .replace(
        "limits: { heartbeat_ms: 100 }",
        &format!("limits: {{ {limits} }}"),
    );
    let proxy = Proxy::start(&yaml).await;
    (upstream, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 6)]
async fn calls_past_the_per_turn_cap_get_error_results_and_few_run_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    // In flight now, and the most ever at once.
    let gauge = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let seen = gauge.clone();
    let tool = FakeServer::start(move |_, _| {
        let now = seen.0.fetch_add(1, SeqCst) + 1;
        seen.1.fetch_max(now, SeqCst);
        // Held long enough for the others to pile up if they were let in.
        std::thread::sleep(Duration::from_millis(100));
        seen.0.fetch_sub(1, SeqCst);
        Reply::json(200, json!({"temp_c": 21}))
    })
    .await;
    let limits = "heartbeat_ms: 100, max_tool_calls_per_turn: 16, max_concurrent_tool_calls: 3";
    let (upstream, proxy) = one_round_of_calls(20, limits, &tool).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(tool.requests().len(), 16, "only the first 16 calls ran");
    let most = gauge.1.load(SeqCst);
    assert!((2..=3).contains(&most), "{most} calls ran at once");
    // Every call has its result, in order; the ones past the cap say why.
    let results = upstream.requests()[1].tool_messages();
    assert_eq!(results.len(), 20);
    for (i, (id, text)) in results.iter().enumerate() {
        assert_eq!(*id, format!("call_{i}"));
        if i < 16 {
            assert_eq!(*text, "{\"temp_c\":21}");
        } else {
            assert!(
                text.contains("at most 16 tool calls run per turn"),
                "{text}"
            );
        }
    }
    // One log line for the calls not run, however many: a model's output
    // must not flood the log.
    let logs = proxy.logs();
    let said: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("over limits.max_tool_calls_per_turn"))
        .collect();
    assert!(said.len() == 1 && said[0].contains("calls=4"), "{logs}");

    // More calls in one round than a client may send items: the model has
    // gone wrong, and the turn fails rather than grow its next request.
    let (upstream, proxy) = one_round_of_calls(30, "max_messages: 20", &tool).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert!(
        res.text().contains("30 tool calls in one round"),
        "{}",
        res.text()
    );
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test]
async fn a_turn_cut_by_the_token_limit_runs_no_call_and_ends_as_cut_in_every_dialect() {
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![
            content("Let me check."),
            tool_call(0, "a", "get_weather", "{\"city\":\"Par"),
            finish("length"),
        ])
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let question = "What is the weather in Paris?";
    let chat = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    let choice = &chat.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["content"], "Let me check.");
    assert!(choice["message"].get("tool_calls").is_none());
    let streamed = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    let finishes: Vec<Value> = streamed
        .events()
        .iter()
        .map(|e| e["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [json!("length")]);
    let responses = post_json(
        proxy.port,
        "/v1/responses",
        &json!({"model": "weather", "input": question}),
    )
    .await
    .json();
    assert_eq!(responses["status"], "incomplete", "{responses}");
    assert_eq!(
        responses["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    let messages = post_json(
        proxy.port,
        "/v1/messages",
        &json!({"model": "weather", "max_tokens": 100,
                "messages": [{"role": "user", "content": question}]}),
    )
    .await
    .json();
    assert_eq!(messages["stop_reason"], "max_tokens", "{messages}");
    assert_eq!(
        upstream.requests().len(),
        4,
        "one upstream call per request"
    );
    assert!(tool.requests().is_empty(), "the cut call never ran");
}

#[tokio::test]
async fn parallel_calls_numbered_alike_run_apart() {
    let tool = weather_tool(200).await;
    let upstream = tool_round_then(
        vec![
            tool_call(0, "call_a", "get_weather", "{\"city\":\"Oslo\"}"),
            tool_call(0, "call_b", "get_weather", "{\"city\":\"Rome\"}"),
            finish("tool_calls"),
        ],
        "done",
    )
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let mut cities: Vec<String> = tool
        .requests()
        .iter()
        .map(|r| r.json()["city"].as_str().unwrap().to_owned())
        .collect();
    cities.sort();
    assert_eq!(cities, ["Oslo", "Rome"]);
    let ids: Vec<String> = upstream.requests()[1]
        .tool_messages()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["call_a", "call_b"]);
}

#[tokio::test]
async fn several_choices_are_refused_for_agents_and_forwarded_for_other_models() {
    let tool = weather_tool(200).await;
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("hi"), finish("stop")])).await;
    let proxy = weather_agent(&upstream, &tool).await;
    let mut body = ask(false);
    body["n"] = json!(2);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 400, "{}", res.text());
    let error = &res.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["param"], "n");
    assert!(upstream.requests().is_empty());
    body["n"] = json!(1);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    body["n"] = json!(2);
    body["model"] = json!("not-an-agent");
    post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(upstream.requests().last().unwrap().json()["n"], 2);
}

#[tokio::test]
async fn the_text_of_successive_rounds_does_not_run_together() {
    let tool = weather_tool(200).await;
    for (first, expected, stream) in [
        ("Let me check.", "Let me check.\n\nIt is 21 °C.", false),
        ("Let me check.", "Let me check.\n\nIt is 21 °C.", true),
        ("Let me check.\n", "Let me check.\nIt is 21 °C.", true),
    ] {
        let upstream = tool_round_then(
            vec![
                content(first),
                tool_call(0, "a", "get_weather", "{\"city\":\"Paris\"}"),
                finish("tool_calls"),
            ],
            "It is 21 °C.",
        )
        .await;
        let proxy = weather_agent(&upstream, &tool).await;
        let res = post_json(proxy.port, "/v1/chat/completions", &ask(stream)).await;
        let text = match stream {
            true => res.delta_text("content"),
            false => res.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned(),
        };
        assert_eq!(text, expected);
        // Round 1's text went back to the model with its call: only the
        // last round's text is not kept.
        let second = upstream.requests()[1].json();
        let assistant: Vec<&Value> = second["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        assert_eq!(assistant.len(), 1, "{second}");
        assert_eq!(assistant[0]["content"], first);
        assert_eq!(assistant[0]["tool_calls"][0]["id"], "a");
    }
}

#[tokio::test]
async fn the_next_round_holds_the_reasoning_the_model_wrote() {
    // The model's reasoning before its call goes back with the call, as
    // the client sends it back in its next request: one prompt, round to
    // round and turn to turn, and the reasoning models that need theirs
    // on a tool call's continuation (gpt-oss) have it. Whether it is shown
    // to the client (`reasoning: strip`) does not change the prompt.
    let tool = weather_tool(200).await;
    for extra in ["", "    reasoning: strip"] {
        let upstream =
            FakeServer::start(|req, _| weather_round(req.json().to_string().contains("temp_c")))
                .await;
        let proxy = agent_with(
            &upstream,
            &tool,
            &format!("    tools: [get_weather]\n{extra}"),
        )
        .await;
        let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
        assert_eq!(res.status, 200, "{}", res.text());
        let second = upstream.requests()[1].json();
        let call = second["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "assistant")
            .cloned()
            .unwrap();
        assert_eq!(
            call["reasoning_content"], "Let me check.",
            "{extra}: {second}"
        );
        assert_eq!(call["tool_calls"][0]["function"]["name"], "get_weather");
    }
}

#[tokio::test]
async fn a_rounds_text_in_an_item_of_its_own_does_not_begin_with_a_blank_line() {
    // Responses' message items and Messages' text blocks: the tool's
    // progress note (on the reasoning channel) ends round 1's item, so
    // round 2's text is an item of its own, with no separator to lead it.
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|req, _| {
        let has_result = req.json().to_string().contains("temp_c");
        match has_result {
            false => Reply::events(vec![
                content("Let me check."),
                tool_call(0, "a", "get_weather", "{\"city\":\"Paris\"}"),
                finish("tool_calls"),
            ]),
            true => Reply::events(vec![content("It is 21 °C."), finish("stop")]),
        }
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let asked = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    for stream in [false, true] {
        let res = post_json(
            proxy.port,
            "/v1/responses",
            &json!({"model": "weather", "input": asked, "stream": stream, "store": false}),
        )
        .await;
        let output = match stream {
            false => res.json()["output"].clone(),
            true => res.events().last().unwrap()["response"]["output"].clone(),
        };
        let texts: Vec<&Value> = output
            .as_array()
            .unwrap()
            .iter()
            .filter(|item| item["type"] == "message")
            .map(|item| &item["content"][0]["text"])
            .collect();
        assert_eq!(texts, [&json!("Let me check."), &json!("It is 21 °C.")]);

        let res = post_json(
            proxy.port,
            "/v1/messages",
            // Thinking on: the note is a block of its own between the texts.
            &json!({"model": "weather", "messages": asked, "max_tokens": 100, "stream": stream,
                    "thinking": {"type": "adaptive"}}),
        )
        .await;
        let texts: Vec<String> = match stream {
            false => res.json()["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|block| block["type"] == "text")
                .map(|block| block["text"].as_str().unwrap().to_owned())
                .collect(),
            true => {
                let mut texts: Vec<String> = Vec::new();
                for event in res.events() {
                    match (
                        event["type"].as_str(),
                        event["content_block"]["type"].as_str(),
                    ) {
                        (Some("content_block_start"), Some("text")) => texts.push(String::new()),
                        (Some("content_block_delta"), _)
                            if event["delta"]["type"] == "text_delta" =>
                        {
                            let text = event["delta"]["text"].as_str().unwrap();
                            texts.last_mut().unwrap().push_str(text);
                        }
                        _ => {}
                    }
                }
                texts
            }
        };
        assert_eq!(texts, ["Let me check.", "It is 21 °C."], "stream: {stream}");
    }
}

/// Reads `conn`'s body until it holds `marker`; what was read.
async fn read_until(conn: &mut Connection, res: &mut Response, marker: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(marker) {
        let chunk = conn.next_chunk(res).await.expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opens_and_beats_while_the_model_is_silent() {
    // Before the upstream's headers: it answers only once the client has
    // seen the stream open and beat.
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let upstream = FakeServer::start(move |_, _| {
        let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(20));
        Reply::events(vec![content("hi"), finish("stop")])
    })
    .await;
    let tool = weather_tool(200).await;
    let proxy = weather_agent(&upstream, &tool).await;
    let mut conn = Connection::chat(proxy.port, &ask(true)).await;
    let mut res = conn.head().await;
    assert_eq!(res.status, 200);
    assert_eq!(res.header("content-type"), Some("text/event-stream"));
    let early = read_until(&mut conn, &mut res, ": keep-alive").await;
    assert!(early.contains(r#""role":"assistant""#), "{early}");
    release.send(()).unwrap();
    let rest = read_until(&mut conn, &mut res, "[DONE]").await;
    assert!(rest.contains(r#""content":"hi""#), "{rest}");

    // After its headers, silent before the first token.
    let upstream = FakeServer::start(|_, _| {
        let mut steps = vec![Step::Sleep(Duration::from_secs(1))];
        steps.extend(
            [content("hi"), finish("stop")]
                .iter()
                .map(|e| Step::Bytes(format!("data: {e}\n\n").into_bytes())),
        );
        steps.push(Step::Bytes(b"data: [DONE]\n\n".to_vec()));
        Reply::Sse {
            steps,
            complete: true,
        }
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let mut conn = Connection::chat(proxy.port, &ask(true)).await;
    let mut res = conn.head().await;
    let body = read_until(&mut conn, &mut res, "[DONE]").await;
    let beat = body.find(": keep-alive").expect("a heartbeat");
    let token = body.find(r#""content":"hi""#).expect("the token");
    assert!(beat < token, "heartbeats before the first token: {body}");
}

#[tokio::test]
async fn a_body_of_countless_tiny_values_is_refused_before_it_is_parsed() {
    let tool = weather_tool(200).await;
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("hi"), finish("stop")])).await;
    let proxy = Proxy::start(
        &config(
            &upstream,
            &format!("{}/weather", tool.url()),
            "    tools: [get_weather]\nlimits: { max_json_values: 100000 }",
        )
        .replace("limits: { heartbeat_ms: 100 }\n", ""),
    )
    .await;
    let values = |n: usize| json!(vec![0; n]);
    for (path, mut body) in [
        ("/v1/chat/completions", ask(false)),
        (
            "/v1/messages",
            json!({"model": "weather", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        body["x"] = values(100_000);
        let res = post_json(proxy.port, path, &body).await;
        assert_eq!(res.status, 413, "{path}: {}", res.text());
        let error = res.json();
        if path == "/v1/messages" {
            assert_eq!(error["type"], "error");
            assert_eq!(error["error"]["type"], "request_too_large");
        } else {
            assert_eq!(error["error"]["code"], "request_too_large");
        }
        // Not an agent: refused all the same, never forwarded.
        body["model"] = json!("other");
        assert_eq!(post_json(proxy.port, path, &body).await.status, 413);
        body["x"] = values(90_000);
        body["model"] = json!("weather");
        let res = post_json(proxy.port, path, &body).await;
        assert_eq!(res.status, 200, "{path}: under the limit: {}", res.text());
    }
    assert_eq!(
        upstream.requests().len(),
        2,
        "only the bodies under the limit"
    );
}

#[tokio::test]
async fn command_output_is_capped_and_a_failing_exit_is_reported() {
    let upstream = tool_round_then(
        vec![
            tool_call(0, "a", "flood", "{}"),
            tool_call(1, "b", "fail", "{}"),
            tool_call(2, "c", "chatty", "{}"),
            tool_call(3, "d", "noisy_fail", "{}"),
            finish("tool_calls"),
        ],
        "ok",
    )
    .await;
    let yaml = format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{}/v1" }} }}
tools:
  flood:
    command: {{ argv: ["python3", "-c", "import sys; [sys.stdout.write('x' * 1_000_000) for _ in range(100)]"] }}
    max_output_bytes: 1000
  fail:
    command: {{ argv: ["python3", "-c", "import sys; print('partial'); sys.stderr.write('boom'); sys.exit(3)"] }}
  chatty:
    command: {{ argv: ["python3", "-c", "import sys; sys.stderr.write('progress ' * 20_000); sys.stderr.flush(); print('result')"] }}
    max_output_bytes: 1000
  noisy_fail:
    command: {{ argv: ["python3", "-c", "import sys; sys.stderr.write('e' * 50_000); sys.exit(4)"] }}
    max_output_bytes: 1000
agents:
  weather: {{ tools: [flood, fail, chatty, noisy_fail] }}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let results = upstream.requests()[1].tool_results();
    assert_eq!(
        results[0],
        format!(
            "{}\n[truncated: output exceeded 1000 bytes]",
            "x".repeat(1000)
        )
    );
    assert!(
        results[1].starts_with("error: exit status: 3\npartial"),
        "{}",
        results[1]
    );
    assert!(results[1].ends_with("stderr: boom"), "{}", results[1]);
    // 160 KB of progress on stderr: drained, so the command lives to print
    // its result (it used to die of a closed pipe).
    assert_eq!(results[2], "result\n");
    assert_eq!(
        results[3],
        format!(
            "error: exit status: 4\n\nstderr: {}\n[truncated: output exceeded 1000 bytes]",
            "e".repeat(1000)
        )
    );
}

#[tokio::test]
async fn an_upstream_answering_json_to_a_stream_request_still_drives_the_loop() {
    let tool = weather_tool(200).await;
    let upstream = json_rounds().await;
    let proxy = weather_agent(&upstream, &tool).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let answer: Value = serde_json::from_slice(&fixture("reasoning-nonstream.json")).unwrap();
    assert_eq!(
        res.delta_text("content"),
        answer["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert!(res
        .delta_text("reasoning_content")
        .contains("Calling get_weather {\"city\":\"Paris\"}"));
    assert_eq!(tool.requests().len(), 1);
    let second = upstream.requests()[1].json();
    assert_eq!(
        second["messages"][2]["tool_calls"][0]["id"],
        "dHhX0c9VFj1w5vWk0mgT5DyqIJ7cZ7Oh"
    );
}

#[tokio::test]
async fn reasoning_strip_drops_the_models_reasoning_but_keeps_tool_progress() {
    let tool = weather_tool(200).await;
    let upstream = tool_round_then(
        vec![
            reasoning("hidden"),
            tool_call(0, "a", "get_weather", "{\"city\":\"Oslo\"}"),
            finish("tool_calls"),
        ],
        "Cold.",
    )
    .await;
    let proxy = agent_with(
        &upstream,
        &tool,
        "    tools: [get_weather]\n    reasoning: strip",
    )
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(
        res.delta_text("reasoning_content"),
        "Calling get_weather {\"city\":\"Oslo\"}…\n"
    );
    assert_eq!(res.delta_text("content"), "Cold.");
}

#[tokio::test]
async fn events_read_together_leave_together_though_each_came_in_a_chunk_of_its_own() {
    // llama-server sends an event a chunk; under load many arrive in one read.
    let tool = weather_tool(200).await;
    let upstream = FakeServer::start(|_, _| {
        let mut events: Vec<Vec<u8>> = (0..20)
            .map(|i| format!("data: {}\n\n", content(&format!("t{i} "))).into_bytes())
            .collect();
        events.push(format!("data: {}\n\n", finish("stop")).into_bytes());
        events.push(b"data: [DONE]\n\n".to_vec());
        Reply::Sse {
            steps: vec![Step::Chunks(events)],
            complete: true,
        }
    })
    .await;
    let proxy = weather_agent(&upstream, &tool).await;
    let mut conn = Connection::chat(proxy.port, &ask(true)).await;
    let mut res = conn.head().await;
    let mut writes = 0;
    let mut body = String::new();
    while let Some(chunk) = conn.next_chunk(&mut res).await {
        writes += 1;
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        body.contains("t19 ") && body.ends_with("data: [DONE]\n\n"),
        "{body}"
    );
    assert!(writes <= 3, "22 events came in {writes} writes: {body}");
}

/// llama-server says how much of the prompt its cache held (the KV cache
/// reused, turn after turn): each dialect reports it where its clients read
/// it (Codex's and Claude Code's accounting, the SDKs' `cached_tokens`).
#[tokio::test]
async fn the_prompt_tokens_the_model_server_had_cached_reach_every_dialect() {
    let upstream = FakeServer::start(|req, _| match req.json()["stream"] == true {
        true => Reply::replay(&fixture("usage-stream.sse"), Duration::ZERO),
        false => Reply::raw_json(200, &fixture("plain-nonstream.json")),
    })
    .await;
    let yaml = format!(
        "default_upstream: local\nupstreams: {{ local: {{ url: \"{}/v1\" }} }}\nagents:\n  a: {{}}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    for stream in [false, true] {
        // 17 prompt tokens, 16 of them cached, in both captures.
        let chat = json!({"model": "a", "messages": messages, "stream": stream,
                          "stream_options": stream.then(|| json!({"include_usage": true}))});
        let res = post_json(proxy.port, "/v1/chat/completions", &chat).await;
        let usage = match stream {
            false => res.json()["usage"].clone(),
            true => {
                let data = sse_data(&res.body);
                let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
                last["usage"].clone()
            }
        };
        assert_eq!(usage["prompt_tokens"], 17, "{usage}");
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"], 16,
            "{usage}"
        );

        let responses = json!({"model": "a", "input": "hi", "stream": stream, "store": false});
        let res = post_json(proxy.port, "/v1/responses", &responses).await;
        let text = res.text();
        let usage = match stream {
            false => res.json()["usage"].clone(),
            true => {
                let last = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .next_back();
                serde_json::from_str::<Value>(last.unwrap()).unwrap()["response"]["usage"].clone()
            }
        };
        assert_eq!(usage["input_tokens"], 17, "{usage}");
        assert_eq!(
            usage["input_tokens_details"]["cached_tokens"], 16,
            "{usage}"
        );

        let anthropic =
            json!({"model": "a", "max_tokens": 64, "messages": messages, "stream": stream});
        let res = post_json(proxy.port, "/v1/messages", &anthropic).await;
        let text = res.text();
        let usage = match stream {
            false => res.json()["usage"].clone(),
            true => {
                let delta = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .map(|d| serde_json::from_str::<Value>(d).unwrap())
                    .find(|e| e["type"] == "message_delta")
                    .unwrap();
                delta["usage"].clone()
            }
        };
        // Anthropic counts the cached tokens apart from `input_tokens`.
        assert_eq!(usage["input_tokens"], 1, "{usage}");
        assert_eq!(usage["cache_read_input_tokens"], 16, "{usage}");
    }
}

//! Request ids, metrics and logs, as an operator sees them.

mod common;

use common::*;
use serde_json::{json, Value};

fn config(upstream: &FakeServer, tool: &FakeServer) -> String {
    format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{}/v1", api_key: "sk-upstream-secret" }} }}
tools:
  get_weather: {{ http: {{ url: "{}/weather" }} }}
agents:
  weather: {{ tools: [get_weather] }}
"#,
        upstream.url(),
        tool.url()
    )
}

async fn tool_then_answer() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::raw_json(200, &fixture("models.json"));
        }
        let body = req.json();
        if body["model"] == "gpt-x" {
            return Reply::json(200, json!({"ok": true}));
        }
        if body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool")
        {
            Reply::events(vec![content("Sunny."), finish("stop"), usage(20, 3)])
        } else {
            Reply::events(vec![
                tool_call(0, "a", "get_weather", "{}"),
                finish("tool_calls"),
                usage(10, 2),
            ])
        }
    })
    .await
}

fn ask() -> Value {
    json!({"model": "weather", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn request_ids_reach_the_upstream_the_tools_and_the_client() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"sky": "clear"}))).await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&config(&upstream, &tool)).await;
    let body = ask().to_string();
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-request-id", "req-abc-1"),
        ],
        body.as_bytes(),
    )
    .await;
    assert_eq!(res.header("x-request-id"), Some("req-abc-1"));
    assert!(upstream
        .requests()
        .iter()
        .all(|r| r.header("x-request-id") == Some("req-abc-1")));
    assert_eq!(tool.requests()[0].header("x-request-id"), Some("req-abc-1"));

    // Generated when absent, the same everywhere.
    let res = post_json(proxy.port, "/v1/chat/completions", &ask()).await;
    let id = res
        .header("x-request-id")
        .expect("a generated id")
        .to_owned();
    assert_eq!(id.len(), 32);
    assert_eq!(tool.requests()[1].header("x-request-id"), Some(id.as_str()));

    // Non-agent chat, the pingora proxy path and errors carry one too.
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "gpt-x", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    let id = res.header("x-request-id").unwrap();
    assert_eq!(
        upstream.requests().last().unwrap().header("x-request-id"),
        Some(id)
    );
    let res = get(proxy.port, "/health").await;
    assert!(res.header("x-request-id").is_some());
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "weather"}),
    )
    .await;
    assert_eq!(res.status, 400);
    assert!(res.header("x-request-id").is_some());
}

#[tokio::test]
async fn metrics_count_requests_tools_tokens_and_upstream_errors() {
    let tool = FakeServer::start(|_, i| {
        Reply::json(if i == 0 { 200 } else { 500 }, json!({"sky": "clear"}))
    })
    .await;
    let upstream = tool_then_answer().await;
    let proxy = Proxy::start(&config(&upstream, &tool)).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask()).await;
    assert_eq!(res.status, 200);
    let res = post_json(proxy.port, "/v1/chat/completions", &ask()).await;
    assert_eq!(
        res.status, 200,
        "a failing tool is an error result, not a failed request"
    );

    let res = get(proxy.port, "/metrics").await;
    assert_eq!(res.status, 200);
    assert!(res
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    let text = res.text();
    for line in [
        r#"agent_proxy_requests_total{agent="weather",route="agent",status="200",stream="true"} 2"#,
        r#"agent_proxy_tool_calls_total{outcome="ok",tool="get_weather"} 1"#,
        r#"agent_proxy_tool_calls_total{outcome="error",tool="get_weather"} 1"#,
        r#"agent_proxy_tokens_total{agent="weather",kind="prompt"} 60"#,
        r#"agent_proxy_tokens_total{agent="weather",kind="completion"} 10"#,
        r#"agent_proxy_rounds_sum{agent="weather"} 4"#,
        r#"agent_proxy_time_to_first_token_seconds_count{agent="weather"} 2"#,
        "agent_proxy_streams_in_flight 0",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }

    drop(upstream);
    let res = post_json(proxy.port, "/v1/chat/completions", &ask()).await;
    assert_eq!(res.status, 502);
    let text = get(proxy.port, "/metrics").await.text();
    assert!(
        text.contains(r#"agent_proxy_upstream_errors_total{kind="#),
        "{text}"
    );
    assert!(text.contains(r#"upstream="local"} 1"#), "{text}");
}

#[tokio::test]
async fn json_logs_have_one_line_per_request_and_no_secrets() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"sky": "clear"}))).await;
    let upstream = tool_then_answer().await;
    let yaml = config(&upstream, &tool) + "auth: { api_keys: [sk-proxy-secret] }\n";
    let proxy = Proxy::start_with_env(&yaml, &[("AGENT_PROXY_LOG_JSON", "1")]).await;
    let body = ask().to_string();
    let auth = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-proxy-secret"),
        ("x-request-id", "log-1"),
    ];
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &auth,
        body.as_bytes(),
    )
    .await;
    assert_eq!(res.status, 200);
    let wrong = [("authorization", "Bearer sk-wrong-guess")];
    assert_eq!(
        request(proxy.port, "GET", "/v1/models", &wrong, b"")
            .await
            .status,
        401
    );
    // The log line is written after the response; give it a moment.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logs = proxy.logs();
    let lines: Vec<Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let line = lines
        .iter()
        .find(|l| l["fields"]["request_id"] == "log-1")
        .expect("a request line");
    let fields = &line["fields"];
    assert_eq!(fields["agent"], "weather");
    assert_eq!(fields["upstream"], "local");
    assert_eq!(fields["status"], 200);
    assert_eq!(fields["rounds"], 2);
    assert_eq!(fields["tools"], 1);
    assert_eq!(fields["prompt_tokens"], 30);
    for secret in ["sk-proxy-secret", "sk-upstream-secret", "sk-wrong-guess"] {
        assert!(!logs.contains(secret), "`{secret}` leaked into the logs");
    }
    assert!(!logs.contains("Sunny."), "message bodies are not logged");
}

/// The log line's `error` says what failed, on an agent's path and passed
/// on alike, in pingora's words, as its proxy path logs them.
#[tokio::test]
async fn a_failed_requests_line_names_what_failed() {
    let broken = FakeServer::start(|_, _| Reply::Sse {
        steps: vec![Step::Bytes(
            format!("data: {}\n\n", content("partial ")).into_bytes(),
        )],
        complete: false,
    })
    .await;
    let refusing = format!("http://127.0.0.1:{}", free_port());
    let yaml = format!(
        r#"
default_upstream: down
upstreams:
  down: {{ url: "{refusing}/v1" }}
  broken: {{ url: "{}/v1" }}
agents:
  a: {{}}
  b: {{ upstream: broken }}
model_aliases: {{ "claude-haiku-*": a }}
"#,
        broken.url()
    );
    let proxy = Proxy::start_with_env(&yaml, &[("AGENT_PROXY_LOG_JSON", "1")]).await;
    let cases = [
        ("refused-agent", "a", false, "ConnectRefused"),
        ("refused-passed-on", "gpt-x", false, "ConnectRefused"),
        ("broken-agent", "b", true, "ConnectionClosed"),
    ];
    let send = |id: &'static str, body: Value| async move {
        let headers = [("content-type", "application/json"), ("x-request-id", id)];
        let body = body.to_string();
        request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &headers,
            body.as_bytes(),
        )
        .await;
    };
    for (id, model, stream, _) in cases {
        send(
            id,
            json!({"model": model, "stream": stream,
                        "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    }
    // A request for an agent that is refused still names the agent, by
    // its id: the name the client sent is any name an alias matches.
    send(
        "bad-agent",
        json!({"model": "claude-haiku-x7", "messages": "hi"}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logs = proxy.logs();
    let lines: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let line = |id: &str| {
        lines
            .iter()
            .find(|l| l["fields"]["request_id"] == id)
            .unwrap_or_else(|| panic!("{id}: no line in {logs}"))
    };
    let refused = line("bad-agent");
    assert_eq!(
        (&refused["fields"]["status"], &refused["fields"]["agent"]),
        (&json!(400), &json!("a")),
        "{refused}"
    );
    for (id, _, _, error) in cases {
        let line = line(id);
        assert_eq!(line["fields"]["error"], error, "{id}: {line}");
    }
}

/// An upstream's error answer is `UpstreamStatus` on the line, whichever
/// path carried it: passed on, it said nothing had failed.
#[tokio::test]
async fn an_upstreams_error_answer_is_named_on_every_path() {
    let failing = FakeServer::start(|_, _| {
        Reply::json(
            500,
            json!({"error": {"message": "boom", "type": "server_error"}}),
        )
    })
    .await;
    let yaml = format!(
        "default_upstream: local\nupstreams:\n  local: {{ url: \"{}/v1\" }}\nagents:\n  a: {{}}\n",
        failing.url()
    );
    let proxy = Proxy::start_with_env(&yaml, &[("AGENT_PROXY_LOG_JSON", "1")]).await;
    // The agent's path, our forwarder, and pingora's path (an upload over
    // 1 MiB to another route).
    let upload = "x".repeat(1_200_000);
    let chat = "/v1/chat/completions";
    let cases = [
        (
            "agent",
            chat,
            json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "forwarded",
            chat,
            json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "proxied",
            "/v1/embeddings",
            json!({"model": "gpt-x", "input": upload}),
        ),
    ];
    for (id, path, body) in &cases {
        let headers = [("content-type", "application/json"), ("x-request-id", *id)];
        let res = request(
            proxy.port,
            "POST",
            path,
            &headers,
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(res.status, 500, "{id}: {}", res.text());
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logs = proxy.logs();
    for (id, _, _) in &cases {
        let line = logs
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["request_id"] == *id)
            .unwrap_or_else(|| panic!("{id}: no line in {logs}"));
        assert_eq!(line["fields"]["error"], "UpstreamStatus", "{id}: {line}");
    }
}

/// A client leaving a passed-through stream is named so: the line said
/// `ConnectionClosed`, an upstream's close.
#[tokio::test]
async fn a_client_leaving_a_passed_through_stream_is_logged_as_such() {
    use std::time::Duration;
    let upstream =
        FakeServer::start(|_, _| Reply::slow_stream(50, Duration::from_millis(20))).await;
    let yaml = format!(
        "default_upstream: local\nupstreams:\n  local: {{ url: \"{}/v1\" }}\n",
        upstream.url()
    );
    let proxy = Proxy::start_with_env(&yaml, &[("AGENT_PROXY_LOG_JSON", "1")]).await;
    let body = json!({"model": "gpt-x", "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let mut conn = Connection::chat(proxy.port, &body).await;
    let mut res = conn.head().await;
    conn.next_chunk(&mut res).await.expect("the stream started");
    drop(conn);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let line = loop {
        let logs = proxy.logs();
        let line = logs
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["path"] == "/v1/chat/completions");
        match line {
            Some(line) => break line,
            None if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => panic!("no request line in {logs}"),
        }
    };
    assert_eq!(line["fields"]["error"], "ClientClosed", "{line}");
}

/// At `RUST_LOG=trace` too: pingora's trace events print whole request
/// heads, so its crates log at `debug` at most.
#[tokio::test]
async fn no_log_level_shows_a_key() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"sky": "clear"}))).await;
    let upstream = tool_then_answer().await;
    let yaml = config(&upstream, &tool) + "auth: { api_keys: [sk-proxy-secret] }\n";
    let proxy = Proxy::start_with_env(&yaml, &[("RUST_LOG", "trace")]).await;
    // A chunked body to a route we pass on goes by pingora's proxy path.
    let request =
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-proxy-secret\r\n\
        Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
        12\r\n{\"model\": \"gpt-x\"}\r\n\r\n0\r\n\r\n";
    let res = raw_request(proxy.port, request).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = post_json(proxy.port, "/v1/chat/completions", &ask()).await;
    assert_eq!(res.status, 401, "{}", res.text());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logs = proxy.logs();
    assert!(
        logs.contains("DEBUG pingora"),
        "pingora's debug lines are kept: {logs}"
    );
    for secret in ["sk-proxy-secret", "sk-upstream-secret"] {
        assert!(
            !logs.contains(secret),
            "`{secret}` leaked into the logs:\n{logs}"
        );
    }
}

#[tokio::test]
async fn tool_names_a_model_makes_up_never_become_metric_labels() {
    let upstream = FakeServer::start(|req, _| {
        if !req.tool_results().is_empty() {
            return Reply::events(vec![content("done"), finish("stop")]);
        }
        let mut events: Vec<Value> = (0..50)
            .map(|i| tool_call(i, &format!("c{i}"), &format!("files__made_up_{i}"), "{}"))
            .collect();
        events.push(finish("tool_calls"));
        Reply::events(events)
    })
    .await;
    // An MCP server that is down: every `files__…` name is the proxy's to
    // answer, none of them a tool it knows.
    let yaml = format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{}/v1" }} }}
mcp_servers:
  files: {{ url: "http://127.0.0.1:{}/mcp" }}
agents:
  a: {{ tools: ["files/*"] }}
"#,
        upstream.url(),
        free_port()
    );
    let proxy = Proxy::start(&yaml).await;
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let text = get(proxy.port, "/metrics").await.text();
    assert!(!text.contains("made_up"), "{text}");
    assert!(
        // The first 16 ran (limits.max_tool_calls_per_turn); the rest were refused unrun.
        text.contains(r#"agent_proxy_tool_calls_total{outcome="error",tool="other"} 16"#),
        "{text}"
    );
}

/// Lines are written by a thread of their own: the last ones, logged as the
/// process exits, still reach the log, and none is lost under load.
#[tokio::test]
async fn every_line_reaches_the_log_the_last_ones_too() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"sky": "clear"}))).await;
    let upstream = tool_then_answer().await;
    let mut proxy = Proxy::start(&config(&upstream, &tool)).await;
    let headers = [("content-type", "application/json")];
    let body = json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]});
    let body = body.to_string();
    let asks = (0..200).map(|_| {
        request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &headers,
            body.as_bytes(),
        )
    });
    for res in futures::future::join_all(asks).await {
        assert_eq!(res.status, 200);
    }
    proxy.signal("TERM");
    let status = proxy.wait_exit(std::time::Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let logs = proxy.logs();
    let lines = logs
        .lines()
        .filter(|l| l.contains("path=/v1/chat/completions status=200"))
        .count();
    assert_eq!(lines, 200, "{logs}");
    // Logged just before `exit` (other threads' lines may follow it).
    assert!(
        logs.lines().any(|l| l.ends_with("drained; exiting")),
        "{logs}"
    );
}

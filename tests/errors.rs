//! Every error the proxy answers has the OpenAI shape and the right status;
//! an error after streaming began ends the stream with an error event and no
//! clean end.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn config(upstream_url: &str, extra: &str) -> String {
    format!(
        r#"
default_upstream: local
upstreams:
  local: {{ url: "{upstream_url}/v1", first_byte_timeout_ms: 400, idle_timeout_ms: 400, connect_timeout_ms: 400 }}
agents:
  helper: {{ system_prompt: "Be brief." }}
{extra}
"#
    )
}

fn assert_error(res: &Response, status: u16, kind: &str) -> Value {
    assert_eq!(res.status, status, "{}", res.text());
    assert_eq!(res.header("content-type"), Some("application/json"));
    let error = res.json()["error"].clone();
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "error lacks `{key}`: {error}");
    }
    assert_eq!(error["type"], kind, "{error}");
    assert!(!error["message"].as_str().unwrap().is_empty());
    error
}

/// `body` as it is, to the chat endpoint as JSON.
async fn post_chat_bytes(port: u16, body: &[u8]) -> Response {
    let json_header = [("content-type", "application/json")];
    request(port, "POST", "/v1/chat/completions", &json_header, body).await
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn malformed_and_incomplete_requests_are_400_with_param() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;

    let res = post_chat_bytes(proxy.port, &fixture("requests/error-invalid-json.body")).await;
    assert_error(&res, 400, "invalid_request_error");

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "helper"}),
    )
    .await;
    let error = assert_error(&res, 400, "invalid_request_error");
    assert_eq!(error["param"], "messages");

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "x", "messages": []}),
    )
    .await;
    assert_eq!(
        assert_error(&res, 400, "invalid_request_error")["param"],
        "messages"
    );

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "helper", "messages": [{"content": "no role"}]}),
    )
    .await;
    assert_error(&res, 400, "invalid_request_error");

    // Cut off inside a member's name: the member around the break, or none
    // (never the `?` a path with an unknown member renders).
    for (body, param) in [
        (&br#"{"model":"helper","messa"#[..], Value::Null),
        (
            br#"{"model":"helper","messages":[{"role":"user","conte"#,
            json!("messages[0]"),
        ),
    ] {
        let res = post_chat_bytes(proxy.port, body).await;
        assert_eq!(
            assert_error(&res, 400, "invalid_request_error")["param"],
            param
        );
    }

    // Bodies that are no JSON, to be passed on or routed by their model, are
    // refused in the words an agent's are.
    for body in [&br#"{"model":"x","messages":["#[..], b"", b"hello"] {
        let res = post_chat_bytes(proxy.port, body).await;
        let error = assert_error(&res, 400, "invalid_request_error");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("The request body is not a valid JSON object: "),
            "{message}"
        );
    }

    // An `input` of neither type is named as such, kept or not.
    for store in [json!(null), json!(false)] {
        let res = post_json(
            proxy.port,
            "/v1/responses",
            &json!({"model": "helper", "input": 7, "store": store}),
        )
        .await;
        let error = assert_error(&res, 400, "invalid_request_error");
        assert_eq!(error["param"], "input", "store: {store}");
        assert_eq!(
            error["message"], "input must be a string or an array of input items.",
            "store: {store}"
        );
    }
    assert!(
        upstream.requests().is_empty(),
        "nothing invalid reached the upstream"
    );
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&config(&upstream.url(), "limits: { max_body_bytes: 1000 }")).await;
    let mut body = chat("helper", false);
    body["messages"][0]["content"] = json!("x".repeat(2000));
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    let error = assert_error(&res, 413, "invalid_request_error");
    assert_eq!(error["code"], "request_too_large");
}

#[tokio::test]
async fn auth_on_requires_a_configured_key_and_never_forwards_it() {
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("hi"), finish("stop")])).await;
    let proxy = Proxy::start_with_env(
        &config(
            &upstream.url(),
            "auth: { api_keys: [\"${PROXY_KEY}\", other-key] }",
        ),
        &[("PROXY_KEY", "sk-proxy-123")],
    )
    .await;
    let body = chat("helper", true).to_string();
    let json_header = ("content-type", "application/json");

    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[json_header],
        body.as_bytes(),
    )
    .await;
    assert_eq!(
        assert_error(&res, 401, "invalid_request_error")["code"],
        "invalid_api_key"
    );
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[json_header, ("authorization", "Bearer sk-wrong")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(
        assert_error(&res, 401, "invalid_request_error")["code"],
        "invalid_api_key"
    );
    let res = request(proxy.port, "GET", "/v1/models", &[], b"").await;
    assert_eq!(res.status, 401);

    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[json_header, ("authorization", "Bearer sk-proxy-123")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.delta_text("content"), "hi");
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[json_header, ("authorization", "Bearer other-key")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(res.status, 200);
    assert!(
        upstream
            .requests()
            .iter()
            .all(|r| r.header("authorization").is_none()),
        "the proxy's key is not sent upstream"
    );
    assert_eq!(
        get(proxy.port, "/healthz").await.status,
        200,
        "health needs no key"
    );
    assert!(
        !proxy.logs().contains("sk-proxy-123"),
        "the key never reaches the logs"
    );
}

#[tokio::test]
async fn without_passthrough_unknown_paths_and_models_are_404() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&config(&upstream.url(), "passthrough: false")).await;
    let res = get(proxy.port, "/v1/no-such-endpoint").await;
    assert_error(&res, 404, "invalid_request_error");
    let res = post_json(proxy.port, "/v1/chat/completions", &chat("gpt-4o", false)).await;
    let error = assert_error(&res, 404, "invalid_request_error");
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["param"], "model");
    // No model at all is the client's mistake, as OpenAI says it is.
    let nameless = json!({"messages": [{"role": "user", "content": "hi"}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &nameless).await;
    let error = assert_error(&res, 400, "invalid_request_error");
    assert_eq!(error["param"], "model");
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn unreachable_upstream_is_502_on_every_path() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let proxy = Proxy::start(&config(&dead, "")).await;
    for model in ["helper", "some-upstream-model"] {
        let res = post_json(proxy.port, "/v1/chat/completions", &chat(model, true)).await;
        assert_error(&res, 502, "upstream_error");
    }
    let res = post_json(proxy.port, "/v1/embeddings", &json!({"input": "x"})).await;
    assert_error(&res, 502, "upstream_error");
    // An Anthropic client reads Anthropic's error shape, agent or not.
    for model in ["helper", "claude-passed-through"] {
        for stream in [false, true] {
            let body = json!({
                "model": model, "max_tokens": 16, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}],
            });
            let res = post_json(proxy.port, "/v1/messages", &body).await;
            assert_eq!(res.status, 502, "{model}: {}", res.text());
            let error = res.json();
            assert_eq!(error["type"], "error", "{model}: {error}");
            assert_eq!(error["error"]["type"], "api_error", "{model}: {error}");
            assert!(error["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("refused")));
        }
    }
}

#[tokio::test]
async fn a_refused_connection_says_which_url_and_what_to_start() {
    let port = free_port();
    let yaml = format!(
        r#"
default_upstream: local
upstreams:
  local: {{ url: "http://127.0.0.1:{port}/v1", api_key: key-secret }}
agents:
  helper: {{ system_prompt: "Be brief." }}
"#
    );
    let proxy = Proxy::start(&yaml).await;
    let expected = format!(
        "upstream `local` refused the connection at http://127.0.0.1:{port}: \
         is llama-server (or your model server) running there?"
    );
    // An agent, and a model passed through to the upstream.
    for model in ["helper", "some-upstream-model"] {
        for stream in [false, true] {
            let res = post_json(proxy.port, "/v1/chat/completions", &chat(model, stream)).await;
            let error = assert_error(&res, 502, "upstream_error");
            assert_eq!(error["message"], expected.as_str(), "{model}");
        }
    }

    // One line at start says the same, with the URL as configured.
    let warning = format!(
        "default upstream `local` is not answering at http://127.0.0.1:{port}/v1 (connection refused): \
         start llama-server there, or set default_upstream in {}",
        proxy.dir.join("proxy.yaml").display()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !proxy.logs().contains(&warning) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs = proxy.logs();
    assert_eq!(logs.matches(&warning).count(), 1, "{logs}");
    assert!(
        !logs.contains("secret"),
        "credentials stay out of the logs: {logs}"
    );
}

#[tokio::test]
async fn upstream_timeout_is_504() {
    let upstream = FakeServer::start(|_, _| Reply::Stall).await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    for model in ["helper", "some-upstream-model"] {
        let res = post_json(proxy.port, "/v1/chat/completions", &chat(model, true)).await;
        assert_error(&res, 504, "upstream_error");
    }
    let res = post_json(proxy.port, "/v1/embeddings", &json!({"input": "x"})).await;
    assert_error(&res, 504, "upstream_error");
}

#[tokio::test]
async fn upstream_error_status_and_body_reach_the_client() {
    let upstream = FakeServer::start(|req, _| {
        if req.json()["messages"][1]["content"] == "rate" {
            Reply::Json {
                status: 429,
                body: br#"{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}"#.to_vec(),
                headers: vec![("Retry-After".into(), "7".into())],
            }
        } else {
            Reply::raw_json(400, &fixture("error-context-exceeded.json"))
        }
    })
    .await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    // llama.cpp's context overflow, as OpenAI answers it (Codex and
    // LangChain act on the code), streamed or not, on either OpenAI front.
    let res = post_json(proxy.port, "/v1/chat/completions", &chat("helper", true)).await;
    let error = assert_error(&res, 400, "invalid_request_error");
    assert_eq!(error["code"], "context_length_exceeded");
    assert_eq!(error["n_ctx"], 4096, "the upstream's details are kept");
    let responses = json!({"model": "helper", "input": "hi", "stream": true});
    let res = post_json(proxy.port, "/v1/responses", &responses).await;
    let error = assert_error(&res, 400, "invalid_request_error");
    assert_eq!(error["code"], "context_length_exceeded");

    let mut body = chat("helper", false);
    body["messages"][0]["content"] = json!("rate");
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_error(&res, 429, "rate_limit_error");
    assert_eq!(res.header("retry-after"), Some("7"));
}

/// An upstream that echoes the credential it was sent in its error ("Incorrect
/// API key provided: …") has the upstream's key masked: the client and the
/// log never see it, on an agent's path, streamed or not, or passed on.
#[tokio::test]
async fn an_upstream_key_echoed_in_an_error_is_masked() {
    const KEY: &str = "sk-UPSTREAM-SECRET-123";
    let upstream = FakeServer::start(|req, _| {
        let sent = req.header("authorization").unwrap_or_default();
        let message = format!("Incorrect API key provided: {sent}");
        Reply::json(
            401,
            json!({"error": {"message": message, "type": "invalid_request_error"}}),
        )
    })
    .await;
    let yaml = format!(
        "default_upstream: local\nupstreams:\n  local: {{ url: \"{}/v1\", api_key: {KEY} }}\nagents:\n  helper: {{}}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let masked = format!(
        "Incorrect API key provided: Bearer {}",
        "*".repeat(KEY.len())
    );
    for (model, stream) in [
        ("helper", false),
        ("helper", true),
        ("other", false),
        ("other", true),
    ] {
        let res = post_json(proxy.port, "/v1/chat/completions", &chat(model, stream)).await;
        assert_eq!(res.status, 401, "{model} {stream}: {}", res.text());
        assert!(
            !res.text().contains(KEY),
            "{model} {stream}: {}",
            res.text()
        );
        assert_eq!(res.json()["error"]["message"], masked, "{model} {stream}");
    }
    assert_eq!(upstream.requests().len(), 4, "each went to the upstream");
    assert!(!proxy.logs().contains(KEY), "{}", proxy.logs());
}

#[tokio::test]
async fn upstream_breaking_mid_stream_ends_with_an_error_event_not_a_clean_end() {
    let upstream = FakeServer::start(|req, _| {
        let steps = vec![
            Step::Bytes(format!("data: {}\n\n", content("partial ")).into_bytes()),
            Step::Sleep(Duration::from_millis(50)),
            Step::Bytes(format!("data: {}\n\n", content("answer")).into_bytes()),
            // Broken off inside an event: the error event starts after it
            // ends, not on its line.
            Step::Bytes(b"data: {\"choices\": [nu".to_vec()),
        ];
        let _ = req;
        Reply::Sse {
            steps,
            complete: false,
        }
    })
    .await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    for model in ["helper", "some-upstream-model"] {
        let res = post_json(proxy.port, "/v1/chat/completions", &chat(model, true)).await;
        assert_eq!(res.status, 200);
        assert!(
            !res.complete,
            "{model}: a broken stream must not end cleanly"
        );
        assert!(!res.ends_with_done());
        let data = sse_data(&res.body);
        let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
        assert_eq!(last["error"]["type"], "upstream_error", "{model}: {last}");
    }
}

/// Responses' `response.failed` and a Messages `error` end their streams, as
/// OpenAI's and Anthropic's do: the body ends cleanly after them, and the
/// client reads the failure (Codex reports a `response.failed` only from a
/// stream that ended; a cut body was a transport error to it and to the
/// SDKs). Chat has no such event: there the cut says the answer is not whole.
#[tokio::test]
async fn a_broken_stream_ends_cleanly_after_a_terminal_error_event() {
    let upstream = FakeServer::start(|_, _| Reply::Sse {
        steps: vec![Step::Bytes(
            format!("data: {}\n\n", content("partial ")).into_bytes(),
        )],
        complete: false,
    })
    .await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let asks = [
        (
            "/v1/responses",
            json!({"model": "helper", "input": "hi", "stream": true}),
            "response.failed",
        ),
        (
            "/v1/messages",
            json!({"model": "helper", "max_tokens": 64, "stream": true,
                   "messages": [{"role": "user", "content": "hi"}]}),
            "error",
        ),
    ];
    for (path, body, terminal) in asks {
        let res = post_json(proxy.port, path, &body).await;
        assert_eq!(res.status, 200, "{path}");
        assert!(res.complete, "{path}: the body ends: {}", res.text());
        let text = res.text();
        let mut data = text.lines().filter_map(|l| l.strip_prefix("data: "));
        let last: Value = serde_json::from_str(data.next_back().unwrap()).unwrap();
        assert_eq!(last["type"], terminal, "{path}: {last}");
    }
}

/// A tool result for a call the conversation never made is refused, in
/// each dialect's shape, as OpenAI and Anthropic refuse it: forwarded, it
/// reached the model as an answer to nothing.
#[tokio::test]
async fn a_tool_result_for_no_call_is_a_400_in_the_clients_dialect() {
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("hi"), finish("stop")])).await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let asks = [
        (
            "/v1/chat/completions",
            json!({"model": "helper", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "nope", "content": "42"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "helper", "store": false, "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "nope", "output": "42"}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "helper", "max_tokens": 64, "messages": [
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "nope", "content": "42"}]}]}),
        ),
    ];
    for (path, body) in asks {
        let res = post_json(proxy.port, path, &body).await;
        assert_eq!(res.status, 400, "{path}: {}", res.text());
        let error = match path {
            "/v1/messages" => {
                assert_eq!(res.json()["type"], "error", "{path}");
                res.json()["error"].clone()
            }
            _ => res.json()["error"].clone(),
        };
        assert_eq!(error["type"], "invalid_request_error", "{path}: {error}");
        assert!(
            error["message"].as_str().unwrap().contains("`nope`"),
            "{error}"
        );
    }
    // Answered calls are fine.
    let answered = json!({"model": "helper", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &answered).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        upstream.requests().len(),
        1,
        "only the answered one was forwarded"
    );
}

#[tokio::test]
async fn garbage_in_an_upstream_stream_is_an_error_event() {
    let upstream = FakeServer::start(|_, _| Reply::Sse {
        steps: vec![
            Step::Bytes(format!("data: {}\n\n", content("ok ")).into_bytes()),
            Step::Bytes(b"data: {this is not json\n\n".to_vec()),
        ],
        complete: true,
    })
    .await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &chat("helper", true)).await;
    assert!(!res.complete);
    let data = sse_data(&res.body);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "upstream_error");
    assert_eq!(res.delta_text("content"), "ok ");

    // Before any byte was sent, the same failure is a plain 502.
    let res = post_json(proxy.port, "/v1/chat/completions", &chat("helper", false)).await;
    assert_error(&res, 502, "upstream_error");
}

#[tokio::test]
async fn http_1_1_without_host_is_400_and_http_1_0_without_host_is_served() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let res = raw_request(proxy.port, b"GET /v1/models HTTP/1.1\r\n\r\n").await;
    let error = assert_error(&res, 400, "invalid_request_error");
    assert!(error["message"].as_str().unwrap().contains("Host"));
    let res = raw_request(proxy.port, b"GET /healthz HTTP/1.0\r\n\r\n").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(upstream.requests().is_empty(), "nothing was forwarded");
}

#[tokio::test]
async fn malformed_requests_get_an_error_body_that_does_not_name_the_software() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let huge_header = format!(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let many_headers = format!(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..10_000)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    let long_target = format!(
        "GET /v1/models?q={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(70_000)
    );
    // Each with the status that names its fault (RFC 9110 §15.5.15, RFC 6585 §5).
    for (what, bytes, status) in [
        ("a 1 MiB header", huge_header, 431),
        ("a 70,000-byte target", long_target, 414),
        ("10,000 headers", many_headers, 400),
        (
            "a bad method",
            "G(T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            400,
        ),
        (
            "HTTP/9.9",
            "GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n".into(),
            400,
        ),
        // A transfer coding the proxy cannot undo (RFC 9112 §6.1).
        (
            "a gzip transfer coding",
            "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
                .into(),
            501,
        ),
        // A TRACE would echo the request as sent upstream, with its key.
        (
            "a TRACE",
            "TRACE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            405,
        ),
        (
            "a CONNECT",
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".into(),
            405,
        ),
    ] {
        let res = raw_request(proxy.port, bytes.as_bytes()).await;
        assert_error(&res, status, "invalid_request_error");
        assert!(
            res.header("server")
                .is_none_or(|s| !s.to_ascii_lowercase().contains("pingora")),
            "{what}: {:?}",
            res.headers
        );
    }
    assert!(upstream.requests().is_empty(), "nothing was forwarded");
    let trace = raw_request(proxy.port, b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        trace
            .header("allow")
            .is_some_and(|allow| allow.contains("POST")),
        "a 405 names the methods that are allowed: {:?}",
        trace.headers
    );
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("hi"), finish("stop")])).await;
    let proxy = Proxy::start(&config(&upstream.url(), "auth: { api_keys: [sk-1] }")).await;
    let body = chat("helper", false).to_string();
    for authorization in ["bearer sk-1", "BEARER sk-1", "Bearer   sk-1"] {
        let res = request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[("authorization", authorization)],
            body.as_bytes(),
        )
        .await;
        assert_eq!(res.status, 200, "{authorization}: {}", res.text());
    }
}

/// A client that sends its whole upload before it reads (Python's
/// `http.client`, the SDKs' file uploads) gets the answer given before the
/// upload was read: a refused key's 401, an unreachable upstream's 502.
/// Closed with the upload unread, the connection was reset, and the answer
/// lost with it.
#[tokio::test]
async fn an_answer_given_before_an_upload_was_read_reaches_its_client() {
    use tokio::io::AsyncWriteExt;
    let port = free_port();
    let yaml = config(
        &format!("http://127.0.0.1:{port}"),
        "auth: { api_keys: [sk-1] }",
    );
    let proxy = Proxy::start(&yaml).await;
    let upload = vec![b'x'; 8 << 20];
    for (key, status) in [("sk-wrong", 401), ("sk-1", 502)] {
        let head = format!(
            "POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            upload.len()
        );
        // All of it sent before anything is read, as Python's client does:
        // a write that fails there raises, and the answer is never read.
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        for piece in upload.chunks(64 << 10) {
            let sent = stream.write_all(piece).await;
            sent.unwrap_or_else(|e| panic!("{key}: the upload was cut: {e}"));
        }
        let mut conn = Connection::on(stream);
        let res = conn.head().await;
        assert_eq!(res.status, status, "{key}");
    }
}

/// A compressed body to a front door is a 415 that says so, in the
/// client's dialect: it was a 400 calling the body no JSON.
#[tokio::test]
async fn a_compressed_body_is_a_415() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let body = b"\x1f\x8b\x08\x00\x00\x00\x00\x00";
    for (path, kind) in [
        ("/v1/chat/completions", None),
        ("/v1/messages", Some("invalid_request_error")),
    ] {
        let headers = [
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
            ("anthropic-version", "2023-06-01"),
        ];
        let res = request(proxy.port, "POST", path, &headers, body).await;
        match kind {
            None => {
                let error = assert_error(&res, 415, "invalid_request_error");
                assert!(error["message"].as_str().unwrap().contains("`gzip`"));
            }
            Some(kind) => {
                assert_eq!(res.status, 415, "{}", res.text());
                assert_eq!(res.json()["type"], "error");
                assert_eq!(res.json()["error"]["type"], kind);
            }
        }
    }
    assert!(upstream.requests().is_empty());
}

//! What is not an agent passes through untouched: other models' chat
//! completions, every other path, and the model list.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn config(upstream: &FakeServer, extra: &str) -> String {
    format!(
        r#"
default_upstream: local
upstreams:
  local: {{ url: "{}/v1", api_key: "sk-upstream-secret" }}
agents:
  weather: {{ name: "Weather Agent", description: "Answers with live forecasts" }}
  helper:
{extra}
"#,
        upstream.url()
    )
}

#[tokio::test]
async fn non_agent_chat_streams_byte_for_byte() {
    let captured = fixture("plain-stream.sse");
    let replay = captured.clone();
    let upstream =
        FakeServer::start(move |_, _| Reply::replay(&replay, Duration::from_millis(5))).await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let body = fixture("requests/plain-stream.json");
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer client-key"),
            ("x-custom", "kept"),
        ],
        &body,
    )
    .await;
    assert_eq!(res.status, 200);
    assert!(res.complete);
    assert_eq!(res.body, captured, "the stream is passed on unchanged");
    assert_eq!(res.header("content-type"), Some("text/event-stream"));
    assert!(res.chunks.len() > 3, "streamed, not buffered");
    let sent = &upstream.requests()[0];
    assert_eq!(sent.body, body, "the body is passed on unchanged");
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.header("x-custom"), Some("kept"));
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer sk-upstream-secret"),
        "the upstream's key replaces the client's"
    );
    assert!(!proxy.logs().contains("sk-upstream-secret"));
}

#[tokio::test]
async fn non_agent_json_answer_and_error_pass_through() {
    let upstream = FakeServer::start(|req, _| {
        if req.json()["n"] == 2 {
            Reply::raw_json(400, &fixture("error-n-unsupported.json"))
        } else {
            Reply::raw_json(200, &fixture("plain-nonstream.json"))
        }
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let body = fixture("requests/plain-nonstream.json");
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        &body,
    )
    .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.body, fixture("plain-nonstream.json"));
    let body = fixture("requests/error-n-unsupported.json");
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        &body,
    )
    .await;
    assert_eq!(res.status, 400);
    assert_eq!(res.body, fixture("error-n-unsupported.json"));
}

/// An event stream framed by its length that breaks off is cut as it is:
/// an error event written after it would be read as the start of the next
/// response on the connection, or land inside the declared length.
#[tokio::test]
async fn a_stream_with_a_length_that_breaks_off_is_cut_without_an_event() {
    let events = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n".to_vec();
    for missing in [10, 500] {
        let sent = events.clone();
        let upstream = FakeServer::start(move |_, _| Reply::ShortEvents {
            declared: sent.len() + missing,
            body: sent.clone(),
        })
        .await;
        let proxy = Proxy::start(&config(&upstream, "")).await;
        let body = json!({"model": "other", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
        let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
        assert_eq!(res.status, 200);
        let declared = (events.len() + missing).to_string();
        assert_eq!(res.header("content-length"), Some(declared.as_str()));
        assert_eq!(
            String::from_utf8_lossy(&res.body),
            String::from_utf8_lossy(&events),
            "{missing} bytes short"
        );
        assert!(!res.complete, "the close tells the client it was cut");
    }
}

#[tokio::test]
async fn a_request_and_its_answer_are_passed_on_with_their_fields_as_sent_but_the_hop_by_hop_ones()
{
    let answer = br#"{"error":{"message":"slow down","type":"rate_limit"}}"#;
    let upstream = FakeServer::start(move |_, _| {
        let fields = [
            ("Retry-After", "7"),
            ("Set-Cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("Keep-Alive", "timeout=5"),
            ("Connection", "keep-alive, X-Upstream-Hop"),
            ("X-Upstream-Hop", "for us alone"),
            ("X-Request-Id", "theirs"),
            ("Date", "Thu, 01 Jan 1970 00:00:00 GMT"),
            ("X-Tab", "a\tb"),
        ];
        Reply::with_fields(429, answer, &fields)
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-request-id", "ours-1"),
            ("connection", "X-Client-Hop"),
            ("x-client-hop", "for the proxy alone"),
            ("x-kept", "yes"),
        ],
        br#"{"model":"other","messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    let sent = &upstream.requests()[0];
    assert_eq!(
        sent.header("x-client-hop"),
        None,
        "named by the client's Connection"
    );
    assert_eq!(sent.header("x-kept"), Some("yes"));
    assert_eq!(res.status, 429);
    assert_eq!(res.body, answer);
    let named = |name: &str| -> Vec<&str> {
        let fields = res.headers.iter();
        let named = fields.filter(|(k, _)| k.eq_ignore_ascii_case(name));
        named.map(|(_, v)| v.as_str()).collect()
    };
    assert_eq!(named("set-cookie"), ["a=1", "b=2"], "both, in order");
    assert_eq!(named("retry-after"), ["7"]);
    assert_eq!(named("x-tab"), ["a\tb"]);
    assert_eq!(named("content-type"), ["application/json"]);
    assert_eq!(named("content-length"), [answer.len().to_string()]);
    assert_eq!(
        named("date"),
        ["Thu, 01 Jan 1970 00:00:00 GMT"],
        "theirs, not a second"
    );
    assert_eq!(named("keep-alive"), Vec::<&str>::new(), "hop-by-hop");
    assert_eq!(
        named("x-upstream-hop"),
        Vec::<&str>::new(),
        "named by its Connection"
    );
    assert_eq!(named("transfer-encoding"), Vec::<&str>::new());
    assert_eq!(named("connection"), ["keep-alive"], "ours, once");
    assert_eq!(named("x-request-id"), ["ours-1"], "the request's id, once");
}

#[tokio::test]
async fn a_coding_agents_fields_reach_the_upstream_as_sent_request_after_request() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    // Claude Code's, as it spells them, a name given twice, and a value
    // past ASCII (obs-text, which a header value may hold).
    let fields = [
        ("Content-Type", "application/json"),
        ("User-Agent", "claude-cli/2.1.330 (external, sdk-cli)"),
        (
            "X-Claude-Code-Session-Id",
            "8c11ba6a-dc9d-4234-8a2a-0d4d94b18cec",
        ),
        ("X-Stainless-Arch", "x64"),
        ("X-Stainless-Lang", "js"),
        ("X-Stainless-Runtime-Version", "v26.12.1"),
        (
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        ),
        ("anthropic-version", "2023-06-01"),
        ("x-api-key", "sk-client-key"),
        ("X-Made-Up", "first"),
        ("x-made-up", "second"),
        ("X-Note", "café"),
    ];
    // On the proxy's threads the names are made once, then found: each
    // request must come out the same.
    for _ in 0..6 {
        let res = request(
            proxy.port,
            "POST",
            "/v1/messages",
            &fields,
            br#"{"model":"claude-sonnet","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
        assert_eq!(res.status, 200);
    }
    let sent = upstream.requests();
    assert_eq!(sent.len(), 6);
    for sent in &sent {
        for (name, value) in &fields[..8] {
            assert_eq!(sent.header(name), Some(*value), "{name}");
        }
        let made_up: Vec<&str> = sent
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("x-made-up"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(made_up, ["first", "second"], "both, in order");
        assert_eq!(sent.header("x-note"), Some("café"));
        assert_eq!(
            sent.header("x-api-key"),
            None,
            "the upstream's key goes instead"
        );
        assert_eq!(
            sent.header("authorization"),
            Some("Bearer sk-upstream-secret")
        );
    }
}

#[tokio::test]
async fn other_paths_are_proxied() {
    let upstream = FakeServer::start(|req, _| match req.path.as_str() {
        "/v1/embeddings" => Reply::json(
            200,
            json!({"object": "list", "data": [{"embedding": [0.5]}], "echo": req.json()}),
        ),
        "/health" => Reply::json(200, json!({"status": "ok"})),
        _ => Reply::raw_json(404, &fixture("error-not-found.json")),
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let res = post_json(
        proxy.port,
        "/v1/embeddings",
        &json!({"input": "hello", "model": "e5"}),
    )
    .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.json()["echo"], json!({"input": "hello", "model": "e5"}));
    assert_eq!(
        get(proxy.port, "/health").await.json(),
        json!({"status": "ok"})
    );
    let res = get(proxy.port, "/v1/no-such-endpoint").await;
    assert_eq!(res.status, 404);
    assert_eq!(res.body, fixture("error-not-found.json"));
    let paths: Vec<String> = upstream.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/v1/embeddings", "/health", "/v1/no-such-endpoint"]);
    assert!(upstream
        .requests()
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer sk-upstream-secret")));
}

/// Another route keeps its method, its query and its body whole, whichever
/// way it goes: read whole and forwarded here (a small body, none), or
/// streamed by pingora's proxy path (a body of unknown length, a large one).
#[tokio::test]
async fn other_routes_keep_their_method_query_and_body() {
    let upstream = FakeServer::start(|req, _| {
        Reply::json(
            200,
            json!({"method": req.method, "path": req.path, "bytes": req.body.len()}),
        )
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let large = vec![b'a'; 3 * 1024 * 1024];
    let small = br#"{"input":"hello"}"#;
    let answers = [
        request(proxy.port, "DELETE", "/v1/files/f1?purpose=x", &[], b"").await,
        request(proxy.port, "PUT", "/v1/things/1", &[], small).await,
        request(proxy.port, "POST", "/v1/audio/transcriptions", &[], &large).await,
        raw_request(
            proxy.port,
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        .await,
    ];
    let seen: Vec<Value> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 200, "{}", a.text());
            a.json()
        })
        .collect();
    assert_eq!(
        seen,
        [
            json!({"method": "DELETE", "path": "/v1/files/f1?purpose=x", "bytes": 0}),
            json!({"method": "PUT", "path": "/v1/things/1", "bytes": small.len()}),
            json!({"method": "POST", "path": "/v1/audio/transcriptions", "bytes": large.len()}),
            json!({"method": "POST", "path": "/v1/embeddings", "bytes": 5}),
        ]
    );
    assert!(upstream
        .requests()
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer sk-upstream-secret")));
}

#[tokio::test]
async fn models_lists_agents_then_upstream_models() {
    let upstream = FakeServer::start(|_, _| Reply::raw_json(200, &fixture("models.json"))).await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let res = get(proxy.port, "/v1/models").await;
    assert_eq!(res.status, 200);
    let list = res.json();
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["helper", "weather", "tiny"]);
    let weather = &data[1];
    assert_eq!(weather["object"], "model");
    assert_eq!(weather["name"], "Weather Agent");
    assert_eq!(weather["description"], "Answers with live forecasts");
    assert_eq!(weather["owned_by"], "agent-proxy");
    assert!(weather["created"].is_u64());
    assert_eq!(
        data[0]["name"], "helper",
        "a one-line agent is named by its id"
    );
}

#[tokio::test]
async fn models_still_lists_agents_when_the_upstream_is_down() {
    let dead = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let yaml = config(&dead, "");
    drop(dead);
    let proxy = Proxy::start(&yaml).await;
    let res = get(proxy.port, "/v1/models").await;
    assert_eq!(res.status, 200);
    let ids: Vec<Value> = res.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("helper"), json!("weather")]);
    let ready = get(proxy.port, "/readyz").await;
    assert_eq!(ready.status, 503);
    assert_eq!(get(proxy.port, "/healthz").await.status, 200);
}

#[tokio::test]
async fn readyz_is_200_when_the_upstream_answers() {
    let upstream = FakeServer::start(|_, _| Reply::raw_json(200, &fixture("models.json"))).await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let res = get(proxy.port, "/readyz").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["status"], "ready");
}

#[tokio::test]
async fn passthrough_output_equals_input_for_any_body() {
    // The upstream echoes the body; random bodies of many sizes and bytes
    // come back unchanged through pingora's proxy path and the chat path.
    let upstream = FakeServer::start(|req, _| Reply::Json {
        status: 200,
        body: req.body.clone(),
        headers: vec![("Content-Type".into(), "application/octet-stream".into())],
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let mut seed: u64 = 0x5eed;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    for size in [0, 1, 2, 17, 1000, 65_535, 65_536, 65_537, 300_000] {
        let body: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let res = request(
            proxy.port,
            "POST",
            "/v1/embeddings",
            &[("content-type", "application/octet-stream")],
            &body,
        )
        .await;
        assert_eq!(res.status, 200);
        assert!(
            res.body == body,
            "a {size}-byte body changed on the proxy path"
        );
    }
    for size in [2, 1000, 70_000, 300_000] {
        let filler: String = (0..size)
            .map(|_| char::from(b'a' + (next() % 26) as u8))
            .collect();
        let body = serde_json::to_vec(&json!({"model": "other", "messages": [{"role": "user", "content": filler}], "x": next()})).unwrap();
        let res = request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            &body,
        )
        .await;
        assert!(res.body == body, "a {}-byte chat body changed", body.len());
    }
}

#[tokio::test]
async fn the_model_is_read_as_a_json_parser_reads_it() {
    let upstream = FakeServer::start(|_, _| {
        Reply::json(
            200,
            json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok"}}]}),
        )
    })
    .await;
    let extra = "    system_prompt: \"HELPER\"";
    let proxy = Proxy::start(&config(&upstream, extra)).await;
    let send = |body: &'static str| {
        request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
    };
    // Escaped, the agent's name is still the agent's.
    let res = send(r#"{"model":"h\u0065lper","messages":[{"role":"user","content":"hi"}]}"#).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["model"], "helper");
    let sent = upstream.requests().pop().unwrap().json();
    assert_eq!(sent["messages"][0]["content"], "HELPER");
    // Named in a member of its own, or twice, it is not the request's model.
    let res = send(
        r#"{"x":{"model":"helper"},"model":"other","messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let sent = upstream.requests().pop().unwrap().json();
    assert_eq!(sent["model"], "other");
    assert_eq!(sent["messages"].as_array().unwrap().len(), 1);
    let res =
        send(r#"{"model":"helper","model":"other","messages":[{"role":"user","content":"hi"}]}"#)
            .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert_eq!(upstream.requests().len(), 2);
}

/// A request of unknown length goes by pingora's proxy path; neither it nor
/// its answer carries the fields of one hop to the next.
#[tokio::test]
async fn the_proxy_path_passes_on_no_field_of_one_hop_either_way() {
    let upstream = FakeServer::start(|_, _| {
        let fields = [
            ("Connection", "X-Upstream-Hop"),
            ("X-Upstream-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("X-Kept", "1"),
        ];
        Reply::with_fields(200, b"{}", &fields)
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let res = raw_request(
        proxy.port,
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\
          Connection: close, X-Client-Hop\r\nX-Client-Hop: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\n\
          Proxy-Connection: keep-alive\r\nX-Kept: 1\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let has = |fields: &[(String, String)], name: &str| {
        fields.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    };
    for hop in ["x-upstream-hop", "keep-alive"] {
        assert!(!has(&res.headers, hop), "{hop} reached the client");
    }
    assert!(has(&res.headers, "x-kept"));
    let sent = &upstream.requests()[0].headers;
    for hop in ["x-client-hop", "keep-alive", "te", "proxy-connection"] {
        assert!(!has(sent, hop), "{hop} reached the upstream");
    }
    assert!(has(sent, "x-kept"));
}

/// The config of a proxy in front of an upstream that reads each request's
/// lines until what it read so far is `answered_at`, then writes `answer`
/// and closes, or with `hold`, goes silent.
async fn scripted_upstream(answered_at: fn(&str) -> bool, answer: Vec<u8>, hold: bool) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut socket = BufReader::new(socket);
                let mut read = String::new();
                while socket.read_line(&mut read).await.unwrap_or(0) > 0 {
                    if answered_at(&read) {
                        let _ = socket.get_mut().write_all(&answer).await;
                        if hold {
                            std::future::pending::<()>().await;
                        }
                        break;
                    }
                }
            });
        }
    });
    format!(
        "default_upstream: local\nupstreams:\n  local: {{ url: \"http://127.0.0.1:{port}/v1\", first_byte_timeout_ms: 2000 }}\n"
    )
}

/// An upstream that answers before it has read the whole request (a 413 for
/// a body too large) and closes: its answer reaches the client, not a 502
/// for the write it cut short.
#[tokio::test]
async fn an_answer_the_upstream_sent_before_reading_the_body_reaches_the_client() {
    let body = r#"{"error":{"message":"too large","type":"invalid_request_error"}}"#;
    let answer = format!(
        "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // Answered at the head's end, the body unread: the proxy's write fails.
    let config = scripted_upstream(
        |read| read.ends_with("\r\n\r\n"),
        answer.into_bytes(),
        false,
    )
    .await;
    let proxy = Proxy::start(&config).await;
    let large = "x".repeat(8 << 20);
    let body = json!({"model": "other", "messages": [{"role": "user", "content": large}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 413, "{}", res.text());
    assert_eq!(res.json()["error"]["message"], "too large");
}

/// A chunked upload, which pingora's proxy path serves, to an upstream that
/// answers it with `answer` once the body's last chunk came (and with
/// `hold` goes silent after); the client's view of the answer.
async fn chunked_upload(answer: Vec<u8>, hold: bool) -> Response {
    let config = scripted_upstream(|read| read.ends_with("0\r\n\r\n"), answer, hold).await;
    let proxy = Proxy::start(&config).await;
    raw_request(
        proxy.port,
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await
}

/// What pingora's proxy path writes goes out as it comes: an answer with a
/// length whose upstream goes silent reaches the client as far as it came
/// (its head, what of its body came), then the close; held, the client got
/// nothing at all.
#[tokio::test]
async fn an_answer_on_the_proxy_path_that_stalls_reaches_the_client_as_far_as_it_came() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf";
    // Silent after: the proxy's read of the rest times out (2 s).
    let res = chunked_upload(answer.to_vec(), true).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.text(), "half");
    assert!(!res.complete, "cut");
}

/// Interim answers an upstream sends on pingora's proxy path (103 Early
/// Hints) are not passed on: an HTTP/1.0 client must get none, and an API
/// client has no use for them.
#[tokio::test]
async fn interim_answers_on_the_proxy_path_are_not_passed_on() {
    let answer = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let res = chunked_upload(answer.to_vec(), false).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.text(), "ok");
}

/// An upstream that switches protocols on a request that asked for no
/// switch gets a 502, not the client's connection as a tunnel (pingora's
/// proxy path: a chunked upload; nginx answers so too).
#[tokio::test]
async fn a_switch_the_client_did_not_ask_for_is_a_502() {
    let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n";
    let res = chunked_upload(switch.to_vec(), false).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert_eq!(res.header("upgrade"), None);
}

/// A WebSocket (as OpenAI's Realtime API opens one) goes by pingora's proxy
/// path: the 101 keeps its `Upgrade`, `Connection: upgrade` and accept key,
/// loses the upstream's other hop fields, and then bytes flow both ways.
#[tokio::test]
async fn a_websocket_switches_and_carries_bytes_both_ways() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{TcpListener, TcpStream};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = tokio::spawn(async move {
        // The first connection with a request in it (a health probe may
        // connect and send nothing).
        let (mut socket, head) = loop {
            let (socket, _) = listener.accept().await.unwrap();
            let mut socket = BufReader::new(socket);
            let mut head = String::new();
            while !head.ends_with("\r\n\r\n") {
                if socket.read_line(&mut head).await.unwrap_or(0) == 0 {
                    break;
                }
            }
            if head.ends_with("\r\n\r\n") {
                break (socket, head);
            }
        };
        socket
            .get_mut()
            .write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                  Connection: Upgrade, X-Upstream-Hop\r\nX-Upstream-Hop: 1\r\n\
                  Keep-Alive: timeout=5\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
            )
            .await
            .unwrap();
        // An echo of bytes, as the switched protocol: frames are no
        // business of the proxy's.
        let mut byte = [0u8; 1];
        while socket.read_exact(&mut byte).await.is_ok() {
            socket.get_mut().write_all(&byte).await.unwrap();
        }
        head
    });
    let config = format!(
        "default_upstream: local\nupstreams:\n  local: {{ url: \"http://127.0.0.1:{port}/v1\" }}\n"
    );
    let proxy = Proxy::start(&config).await;
    let mut client = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    client
        .write_all(
            b"GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              Sec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let mut client = BufReader::new(client);
    let mut answer = String::new();
    while !answer.ends_with("\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_line(&mut answer));
        assert!(read.await.unwrap().unwrap() > 0, "{answer}");
    }
    let lower = answer.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 101"), "{answer}");
    assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{answer}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{answer}");
    assert!(lower.contains("\r\nsec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"));
    assert!(
        !lower.contains("x-upstream-hop") && !lower.contains("keep-alive"),
        "{answer}"
    );
    client.get_mut().write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut echoed));
    read.await.unwrap().unwrap();
    assert_eq!(&echoed, b"ping");
    // The client's close ends the upstream's side too.
    drop(client);
    let upstream = tokio::time::timeout(Duration::from_secs(10), upstream);
    let sent = upstream.await.unwrap().unwrap().to_ascii_lowercase();
    assert!(sent.starts_with("get /v1/realtime?model=m "), "{sent}");
    assert!(sent.contains("\r\nupgrade: websocket\r\n"), "{sent}");
    assert!(sent.contains("\r\nsec-websocket-key: dghlihnhbxbszsbub25jzq==\r\n"));
}

//! Faults, limits and tool safety: what happens when the upstream, a tool or
//! the client misbehaves, and what a client can never make the proxy do.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn ask(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

/// The proxy's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// ------------------------------------------------------------- upstream faults

#[tokio::test]
async fn upstream_faults_end_in_defined_errors() {
    let upstream = FakeServer::start(|req, _| match req.json()["messages"][0]["content"].as_str().unwrap_or_default() {
        "text" => Reply::Json { status: 200, body: b"this is not JSON nor SSE".to_vec(), headers: vec![("Content-Type".into(), "text/plain".into())] },
        "no-done" => Reply::Sse { steps: vec![Step::Bytes(format!("data: {}\n\n", content("half")).into_bytes())], complete: true },
        "finish-no-done" => Reply::Sse {
            steps: vec![Step::Bytes(format!("data: {}\n\ndata: {}\n\n", content("whole"), finish("stop")).into_bytes())],
            complete: true,
        },
        "huge" => Reply::Sse {
            steps: vec![Step::Bytes(format!("data: {}\n\n", content(&"x".repeat(10_000))).into_bytes())],
            complete: true,
        },
        "error-event" => Reply::Sse {
            steps: vec![Step::Bytes(b"event: error\ndata: {\"error\":{\"message\":\"model crashed\",\"type\":\"server_error\"}}\n\n".to_vec())],
            complete: true,
        },
        _ => Reply::events(vec![content("ok"), finish("stop")]),
    })
    .await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "agents: { a: {} }\nlimits: { max_event_bytes: 2048 }",
    ))
    .await;
    let say = |what: &str, stream: bool| json!({"model": "a", "stream": stream, "messages": [{"role": "user", "content": what}]});

    let res = post_json(proxy.port, "/v1/chat/completions", &say("text", true)).await;
    assert_eq!(res.status, 502, "a non-SSE, non-JSON body: {}", res.text());

    let res = post_json(proxy.port, "/v1/chat/completions", &say("no-done", true)).await;
    assert!(
        !res.complete,
        "a stream that ends without [DONE] or finish_reason is broken"
    );
    assert_eq!(res.last_event()["error"]["type"], "upstream_error");

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &say("finish-no-done", true),
    )
    .await;
    assert!(
        res.complete && res.ends_with_done(),
        "a finish_reason is enough: {}",
        res.text()
    );

    let res = post_json(proxy.port, "/v1/chat/completions", &say("huge", true)).await;
    assert_eq!(
        res.status,
        502,
        "an event over limits.max_event_bytes: {}",
        res.text()
    );
    assert!(res.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2048"));

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &say("error-event", false),
    )
    .await;
    assert_eq!(res.status, 502);
    assert_eq!(
        res.json()["error"]["message"],
        "model crashed",
        "the upstream's error event reaches the client"
    );
}

/// However small its events, what a model streams to an agent is bounded
/// as a whole answer is (16 MiB): its text and a call's arguments are held
/// for the next round, and a Responses item's text for its last events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_stream_past_16_mib_is_an_error_not_memory() {
    let text = "y".repeat(64 * 1024);
    let call = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": text}}
    ]}}]});
    let upstream = FakeServer::start(move |req, _| {
        let first = tool_call(0, "c1", "echo", "");
        let delta = match req.json()["messages"][0]["content"].as_str() {
            Some("arguments") => &call,
            _ => &content(&text),
        };
        let mut steps = vec![Step::event(&first)];
        steps.extend((0..320).map(|_| Step::event(delta)));
        Reply::Sse {
            steps,
            complete: true,
        }
    })
    .await;
    let tools = "tools:\n  echo: { command: { argv: [cat] } }\nagents: { a: { tools: [echo] } }";
    let proxy = Proxy::start(&one_upstream(&upstream.url(), tools)).await;
    let pid = proxy.pid();
    let start = rss_kib(pid);
    for (path, what) in [
        ("/v1/chat/completions", "arguments"),
        ("/v1/chat/completions", "text"),
        ("/v1/responses", "text"),
    ] {
        let body = match path {
            "/v1/responses" => {
                json!({"model": "a", "stream": true, "input": [{"role": "user", "content": what}]})
            }
            _ => {
                json!({"model": "a", "stream": true, "messages": [{"role": "user", "content": what}]})
            }
        };
        let res = post_json(proxy.port, path, &body).await;
        // A 502 before the answer began (a call's arguments are not
        // streamed), else an error event: chat's, and the cut after;
        // Responses' `response.failed`, which ends its stream.
        let ended_as_the_dialect_says = match path {
            "/v1/responses" => res.complete && res.text().contains("response.failed"),
            _ => res.status == 502 || !res.complete,
        };
        assert!(ended_as_the_dialect_says, "{path} {what}: {}", res.status);
        assert!(
            res.text().contains("larger than 16777216 bytes"),
            "{path} {what}: {}",
            &res.text()[res.text().len().saturating_sub(400)..]
        );
    }
    let grown = rss_kib(pid).saturating_sub(start);
    assert!(
        grown < 200 * 1024,
        "RSS grew by {grown} KiB for 20 MiB answers"
    );
    assert_eq!(
        upstream.requests().len(),
        3,
        "no call ran, no round followed"
    );
}

// ---------------------------------------------------------------- client faults

#[tokio::test]
async fn a_client_that_leaves_before_sending_its_body_costs_nothing() {
    let upstream =
        FakeServer::start(|_, _| Reply::events(vec![content("ok"), finish("stop")])).await;
    let proxy = Proxy::start(&one_upstream(&upstream.url(), "agents: { a: {} }")).await;
    for _ in 0..20 {
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .unwrap();
        use tokio::io::AsyncWriteExt;
        socket
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"model\":")
            .await
            .unwrap();
        drop(socket);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        upstream.requests().is_empty(),
        "nothing half-read went upstream"
    );
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("a", true)).await;
    assert_eq!(res.delta_text("content"), "ok", "the proxy serves on");
    assert!(get(proxy.port, "/metrics")
        .await
        .text()
        .contains("agent_proxy_streams_in_flight 0"));
}

#[tokio::test]
async fn a_client_that_leaves_while_the_upstream_thinks_cancels_the_upstream_call() {
    let upstream = FakeServer::start(|_, _| Reply::Hold).await;
    let proxy = Proxy::start(&one_upstream(&upstream.url(), "agents: { a: {} }")).await;
    for (model, stream) in [("a", true), ("a", false), ("other", true)] {
        let before = upstream.hangups();
        let conn = Connection::chat(proxy.port, &ask(model, stream)).await;
        upstream.wait_requests(before as usize + 1).await;
        drop(conn);
        let closed = wait_until(Duration::from_secs(10), || {
            std::future::ready(upstream.hangups() == before + 1)
        })
        .await;
        assert!(
            closed,
            "{model} stream={stream}: the upstream request was closed"
        );
    }
}

/// An upstream that streams 40 MB to each request, as fast as it is taken.
async fn forty_megabytes() -> FakeServer {
    let chunk = format!("data: {}\n\n", content(&"y".repeat(16 * 1024)));
    FakeServer::start(move |_, _| {
        let steps = (0..2500)
            .map(|_| Step::Bytes(chunk.clone().into_bytes()))
            .collect();
        Reply::Sse {
            steps,
            complete: true,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_backpressure_not_unbounded_buffering() {
    let upstream = forty_megabytes().await;
    let mut proxy_process = Proxy::start(&one_upstream(&upstream.url(), "agents: { a: {} }")).await;
    let pid = proxy_process.pid();
    for model in ["a", "other"] {
        let start = rss_kib(pid);
        let mut conn = Connection::chat(proxy_process.port, &ask(model, true)).await;
        let mut res = conn.head().await;
        let mut peak = start;
        let mut read = 0;
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if let Some(piece) = conn.next_chunk(&mut res).await {
                read += piece.len();
            }
            peak = peak.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(conn);
        eprintln!("slow reader via {model}: read {read} bytes in 3 s; proxy RSS {start} KiB -> peak {peak} KiB");
        assert!(read < 20 << 20, "the client really was slow");
        assert!(
            peak - start < 24 * 1024,
            "RSS grew by {} KiB while 40 MB were offered",
            peak - start
        );
    }
    assert!(
        proxy_process
            .wait_exit(Duration::from_millis(10))
            .await
            .is_none(),
        "still running"
    );
}

/// A client that reads nothing of its stream holds its connection, and the
/// model's answer behind it, only `limits.send_timeout_ms` past the last
/// write the client took: then both are let go, the client's stream cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_let_go_after_the_send_timeout() {
    // More than every buffer on the way holds.
    let upstream = forty_megabytes().await;
    let limits = "agents: { a: {} }\nlimits: { send_timeout_ms: 300 }";
    let proxy = Proxy::start(&one_upstream(&upstream.url(), limits)).await;
    for (before, model) in ["a", "other"].into_iter().enumerate() {
        let mut conn = Connection::chat(proxy.port, &ask(model, true)).await;
        let let_go = wait_until(Duration::from_secs(10), || {
            std::future::ready(upstream.hangups() as usize > before)
        })
        .await;
        assert!(let_go, "{model}: the upstream's answer was let go");
        // What the buffers held, then the close: a cut stream.
        let mut res = conn.head().await;
        assert_eq!(res.status, 200, "{model}");
        while conn.next_chunk(&mut res).await.is_some() {}
        assert!(!res.complete, "{model}: the stream was cut");
    }
}

// ------------------------------------------------------------------------ limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_messages_and_open_streams() {
    let hold = Gate::default();
    let held = hold.clone();
    let upstream = FakeServer::start(move |req, _| {
        match req.json()["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
        {
            "slow" => {
                held.wait();
                Reply::events(vec![content("done"), finish("stop")])
            }
            _ => Reply::events(vec![content("ok"), finish("stop")]),
        }
    })
    .await;
    let extra = "agents: { a: {} }\nlimits: { max_messages: 3, max_streams_per_client: 1 }";
    let proxy = Proxy::start(&one_upstream(&upstream.url(), extra)).await;

    let many = json!({"model": "a", "messages": [{"role": "user", "content": "1"}, {"role": "user", "content": "2"}, {"role": "user", "content": "3"}, {"role": "user", "content": "4"}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &many).await;
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["error"]["param"], "messages");
    // Given twice, the list read is the last: the one bounded.
    let json = [("content-type", "application/json")];
    let one = r#"[{"role":"user","content":"1"}]"#;
    let twice = format!(
        r#"{{"model":"a","messages":{one},"messages":{}}}"#,
        many["messages"]
    );
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &json,
        twice.as_bytes(),
    )
    .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert_eq!(res.json()["error"]["param"], "messages");
    // A body cut short is not JSON, whatever its lists looked like so far:
    // said in the client's dialect.
    for (path, cut) in [
        ("/v1/chat/completions", &br#"{"model":"a","messages":["#[..]),
        (
            "/v1/messages",
            br#"{"model":"a","max_tokens":5,"messages":[{"role":"user""#,
        ),
    ] {
        let res = request(proxy.port, "POST", path, &json, cut).await;
        assert_eq!(res.status, 400, "{path}");
        let error = res.json();
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("EOF while parsing"), "{path}: {message}");
        if path == "/v1/messages" {
            assert_eq!(error["type"], "error");
        }
    }

    let port = proxy.port;
    let slow =
        json!({"model": "a", "stream": true, "messages": [{"role": "user", "content": "slow"}]});
    let first = tokio::spawn(async move { post_json(port, "/v1/chat/completions", &slow).await });
    // Its slot is taken once the upstream has it; the gate keeps it there.
    upstream.wait_requests(1).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("a", true)).await;
    assert_eq!(res.status, 429, "a second stream of the same client");
    assert_eq!(res.json()["error"]["code"], "too_many_streams");
    assert_eq!(
        post_json(proxy.port, "/v1/chat/completions", &ask("a", false))
            .await
            .status,
        200,
        "non-streaming is not limited"
    );
    hold.open();
    let first = first.await.unwrap();
    assert!(first.complete && first.ends_with_done());
    assert_eq!(
        post_json(proxy.port, "/v1/chat/completions", &ask("a", true))
            .await
            .status,
        200,
        "the slot was released"
    );
}

#[tokio::test]
async fn request_timeout_ms_bounds_a_whole_agent_request() {
    // The upstream's own timeouts are minutes: only the request's fires.
    let upstream = FakeServer::start(|_, _| Reply::Stall).await;
    let extra = "agents: { a: {} }\nlimits: { request_timeout_ms: 1500 }";
    let proxy = Proxy::start(&one_upstream(&upstream.url(), extra)).await;
    let res = within(
        Duration::from_secs(15),
        "the request timeout",
        post_json(proxy.port, "/v1/chat/completions", &ask("a", false)),
    )
    .await;
    assert_eq!(res.status, 504, "{}", res.text());
    assert!(
        res.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("request_timeout_ms")),
        "{}",
        res.text()
    );
}

// ---------------------------------------------------------------------- security

#[tokio::test]
async fn a_client_cannot_make_the_proxy_run_a_tool_outside_its_agent() {
    let allowed = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let forbidden = FakeServer::start(|_, _| Reply::json(200, json!({"pwned": true}))).await;
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![
            tool_call(0, "c1", "delete_everything", "{}"),
            finish("tool_calls"),
        ])
    })
    .await;
    let yaml = one_upstream(&upstream.url(),
        &format!(
            "tools:\n  get_weather: {{ http: {{ url: \"{}/w\" }} }}\n  delete_everything: {{ http: {{ url: \"{}/x\" }} }}\nagents:\n  a: {{ tools: [get_weather] }}",
            allowed.url(),
            forbidden.url()
        ),
    );
    let proxy = Proxy::start(&yaml).await;
    let mut body = ask("a", false);
    body["tools"] = json!([{"type": "function", "function": {"name": "delete_everything", "parameters": {"type": "object"}}}]);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "delete_everything"}});
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 200);
    assert_eq!(
        res.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "delete_everything",
        "a call to a tool the agent does not list goes back to the client"
    );
    assert!(
        forbidden.requests().is_empty(),
        "the operator's other tool never ran"
    );
}

#[tokio::test]
async fn command_tools_run_without_a_shell_in_a_clean_environment() {
    let dir = scratch_dir();
    let work = dir.join("work");
    std::fs::create_dir(&work).unwrap();
    let args = r#"{"path": "../../etc/passwd; rm -rf / $(id) `id` | cat > /tmp/x"}"#;
    let upstream = calls_then_echo_results(vec![
        ("environment", args),
        ("directory", args),
        ("echo", args),
    ])
    .await;
    let tools = format!(
        r#"tools:
  environment: {{ command: {{ argv: [/usr/bin/env], env: {{ MODE: test }}, inherit_env: [PATH] }} }}
  directory: {{ command: {{ argv: [/bin/pwd], cwd: "{}" }} }}
  echo: {{ command: {{ argv: [cat] }} }}
agents:
  a: {{ tools: [environment, directory, echo] }}"#,
        work.display()
    );
    let yaml = one_upstream(&upstream.url(), &tools);
    let proxy = Proxy::start_with_env(&yaml, &[("SECRET_TOKEN", "must-not-leak")]).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("a", false)).await;
    let results = echoed_results(&res.json());
    let mut env: Vec<&str> = results[0]
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    env.sort();
    assert_eq!(
        env,
        ["MODE", "PATH"],
        "only the allowed variables: {}",
        results[0]
    );
    assert_eq!(
        results[1].trim(),
        work.to_str().unwrap(),
        "the configured working directory"
    );
    assert_eq!(
        results[2], args,
        "shell syntax arrives on stdin as inert data"
    );
    assert!(!std::path::Path::new("/tmp/x").exists());
}

#[tokio::test]
async fn http_tools_post_to_the_configured_url_whatever_the_arguments_say() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let upstream = FakeServer::start(|req, _| {
        if req.json()["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool")
        {
            Reply::events(vec![content("done"), finish("stop")])
        } else {
            Reply::events(vec![
                tool_call(
                    0,
                    "c",
                    "fetch",
                    r#"{"url": "http://169.254.169.254/latest/meta-data", "host": "evil.example"}"#,
                ),
                finish("tool_calls"),
            ])
        }
    })
    .await;
    let yaml = one_upstream(&upstream.url(), &format!("tools:\n  fetch: {{ http: {{ url: \"{}/fixed/path?x=1\" }} }}\nagents:\n  a: {{ tools: [fetch] }}", tool.url()));
    let proxy = Proxy::start(&yaml).await;
    post_json(proxy.port, "/v1/chat/completions", &ask("a", false)).await;
    let sent = &tool.requests()[0];
    assert_eq!(sent.path, "/fixed/path?x=1");
    assert_eq!(
        sent.header("host"),
        Some(format!("127.0.0.1:{}", tool.port).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_tools_key_reflected_by_its_target_is_masked_in_the_result() {
    // A target that reflects the headers it got, as many echo and debugging
    // endpoints do, and as error messages quoting a bad key do.
    let tool = FakeServer::start(|req, _| {
        let said = req.header("authorization").unwrap_or_default().to_owned();
        let key = said.trim_start_matches("Bearer ").to_owned();
        Reply::json(
            401,
            json!({"headers": {"authorization": said}, "error": format!("bad key {key}")}),
        )
    })
    .await;
    let upstream = calls_then_echo_results(vec![("lookup", "{}")]).await;
    let yaml = one_upstream(
        &upstream.url(),
        &format!(
            "tools:\n  lookup: {{ http: {{ url: \"{}/\", headers: {{ Authorization: \"Bearer ${{TOOL_KEY}}\" }} }} }}\nagents:\n  a: {{ tools: [lookup] }}",
            tool.url()
        ),
    );
    let proxy = Proxy::start_with_env(&yaml, &[("TOOL_KEY", "tk-0123456789abcdef")]).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("a", false)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        tool.requests()[0].header("authorization"),
        Some("Bearer tk-0123456789abcdef"),
        "the tool got its key"
    );
    let result = &upstream.requests().last().unwrap().tool_results()[0];
    assert!(!result.contains("tk-0123456789abcdef"), "{result}");
    assert!(
        result.contains("*************************")
            && result.contains("bad key *******************"),
        "masked where it was, at its length: {result}"
    );
    assert!(!res.text().contains("tk-0123456789abcdef"));
}

// ------------------------------------------------------------------- tool faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_tools_give_bounded_error_results() {
    let huge = FakeServer::start(|req, _| match req.path.as_str() {
        "/big" => Reply::Json {
            status: 200,
            body: vec![b'z'; 50 << 20],
            headers: vec![],
        },
        _ => Reply::Json {
            status: 200,
            body: vec![0xff, 0xfe, b'o', b'k'],
            headers: vec![],
        },
    })
    .await;
    let upstream =
        calls_then_echo_results(vec![("big", "{}"), ("binary", "{}"), ("spawner", "{}")]).await;
    // Three children in the command's group, their ids written once they run.
    let pids = scratch_dir().join("children");
    let spawner = format!(
        "import subprocess, time; kids = [subprocess.Popen(['sleep', '600']) for _ in range(3)]; open('{}', 'w').write(' '.join(str(k.pid) for k in kids) + chr(10)); time.sleep(600)",
        pids.display()
    );
    let yaml = one_upstream(
        &upstream.url(),
        &format!(
            "tools:\n  big: {{ http: {{ url: \"{u}/big\" }}, max_output_bytes: 1000 }}\n  binary: {{ http: {{ url: \"{u}/bin\" }} }}\n  spawner: {{ command: {{ argv: [python3, -c, \"{spawner}\"], timeout_ms: 3000 }} }}\nagents:\n  a: {{ tools: [big, binary, spawner] }}",
            u = huge.url()
        ),
    );
    let proxy = Proxy::start(&yaml).await;
    let port = proxy.port;
    let call =
        tokio::spawn(
            async move { post_json(port, "/v1/chat/completions", &ask("a", false)).await },
        );
    // Each runs before the timeout.
    let children = wait_pids(&pids).await;

    let res = call.await.unwrap();
    assert_eq!(res.status, 200, "{}", res.text());
    let results = echoed_results(&res.json());
    assert!(
        results[0].ends_with("[truncated: output exceeded 1000 bytes]") && results[0].len() < 1100
    );
    assert_eq!(
        results[1], "\u{fffd}\u{fffd}ok",
        "invalid UTF-8 is replaced, not fatal"
    );
    assert_eq!(results[2], "error: timed out after 3000 ms");
    let killed = all_gone(&children, Duration::from_secs(10)).await;
    assert!(
        killed,
        "the command's children {children:?} were killed too"
    );
}

// ----------------------------------------------------------------- client edge

/// A stream request with `authorization`, held open by the upstream.
async fn held_stream(port: u16, authorization: &str) -> Connection {
    let body = ask("a", true).to_string();
    Connection::open(
        port,
        "POST",
        "/v1/chat/completions",
        &[("authorization", authorization)],
        body.as_bytes(),
    )
    .await
}

async fn stream_status(port: u16, authorization: &str) -> u16 {
    let body = ask("a", true).to_string();
    let res = request(
        port,
        "POST",
        "/v1/chat/completions",
        &[("authorization", authorization)],
        body.as_bytes(),
    )
    .await;
    res.status
}

#[tokio::test]
async fn made_up_bearers_buy_no_extra_streams_without_auth() {
    let upstream = FakeServer::start(|_, _| Reply::Hold).await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "agents: { a: {} }\nlimits: { max_streams_per_client: 1 }",
    ))
    .await;
    let _first = held_stream(proxy.port, "Bearer made-up-1").await;
    upstream.wait_requests(1).await;
    assert_eq!(
        stream_status(proxy.port, "Bearer made-up-2").await,
        429,
        "without auth, streams count per address whatever the bearer"
    );
}

#[tokio::test]
async fn with_auth_streams_count_per_configured_key() {
    let upstream = FakeServer::start(|_, _| Reply::Hold).await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "auth: { api_keys: [k1, k2] }\nagents: { a: {} }\nlimits: { max_streams_per_client: 1 }",
    ))
    .await;
    let _first = held_stream(proxy.port, "Bearer k1").await;
    upstream.wait_requests(1).await;
    assert_eq!(stream_status(proxy.port, "Bearer k1").await, 429);
    let _second = held_stream(proxy.port, "Bearer k2").await;
    upstream.wait_requests(2).await;
}

#[tokio::test]
async fn a_passed_through_stream_takes_a_slot_too() {
    /// A chat request for `body`, held open by the upstream.
    async fn open(port: u16, body: &str) -> Connection {
        Connection::open(port, "POST", "/v1/chat/completions", &[], body.as_bytes()).await
    }
    // `gpt-4` is no agent's: the request is forwarded. Spelled with an
    // escape, only a parse reads its name; plainly, the body's shape does.
    for model in [r#""gpt-4""#, r#""gpt\u002d4""#] {
        let upstream = FakeServer::start(|_, _| Reply::Hold).await;
        let proxy = Proxy::start(&one_upstream(
            &upstream.url(),
            "limits: { max_streams_per_client: 1 }",
        ))
        .await;
        let body = format!(
            r#"{{"model":{model},"stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        let _held = open(proxy.port, &body).await;
        upstream.wait_requests(1).await;
        let res = request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[],
            body.as_bytes(),
        )
        .await;
        assert_eq!(res.status, 429, "{model}: {}", res.text());
        // Not a stream: no slot needed.
        let _second = open(
            proxy.port,
            &body.replace(r#""stream":true"#, r#""stream":false"#),
        )
        .await;
        upstream.wait_requests(2).await;
    }
}

async fn healthz_on(conn: &mut Connection) -> Response {
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("the connection is open");
    conn.next_response().await
}

async fn idle_connection(port: u16) -> Connection {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut conn = Connection::on(stream);
    assert_eq!(healthz_on(&mut conn).await.status, 200);
    conn
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_keepalive_timeout() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "limits: { keepalive_timeout_ms: 300 }",
    ))
    .await;
    let mut conn = idle_connection(proxy.port).await;
    assert!(
        conn.closed_within(Duration::from_secs(10)).await,
        "an idle keep-alive connection is closed"
    );
}

#[tokio::test]
async fn keep_alive_connections_stay_open_across_a_pause_by_default() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&one_upstream(&upstream.url(), "")).await;
    let mut conn = idle_connection(proxy.port).await;
    // The pause under test, well below the 75 s default.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(healthz_on(&mut conn).await.status, 200, "still open");
}

#[tokio::test]
async fn at_max_connections_the_oldest_idle_connection_makes_room() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({}))).await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "limits: { max_connections: 2 }",
    ))
    .await;
    // Idle the longest by a margin: a connection's idle wait begins just
    // after its answer leaves, on its own thread, and the next one's could
    // otherwise begin first.
    let settle = || tokio::time::sleep(Duration::from_millis(50));
    let mut oldest = idle_connection(proxy.port).await;
    settle().await;
    let mut newer = idle_connection(proxy.port).await;
    settle().await;
    let mut third = idle_connection(proxy.port).await;
    assert!(
        oldest.closed_within(Duration::from_secs(10)).await,
        "the connection idle the longest was closed"
    );
    assert_eq!(healthz_on(&mut third).await.status, 200);
    settle().await;
    let _fourth = idle_connection(proxy.port).await;
    assert!(
        newer.closed_within(Duration::from_secs(10)).await,
        "then the next oldest, to let the fourth in"
    );
    assert_eq!(healthz_on(&mut third).await.status, 200, "third is kept");
}

/// A whole (not streamed) answer past the 16 MiB a round reads is a 502
/// that says so, as a streamed one's is; it said "read failed".
#[tokio::test]
async fn a_whole_answer_too_large_says_so() {
    let text = "x".repeat(17 << 20);
    let upstream = FakeServer::start(move |_, _| {
        Reply::json(
            200,
            json!({"choices": [{"message": {"role": "assistant", "content": text},
                                "finish_reason": "stop"}]}),
        )
    })
    .await;
    let extra = "agents: { a: {} }";
    let proxy = Proxy::start(&one_upstream(&upstream.url(), extra)).await;
    let body = json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert!(
        res.text()
            .contains("its answer is larger than 16777216 bytes"),
        "{}",
        res.text()
    );
}

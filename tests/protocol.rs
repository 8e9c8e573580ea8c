//! Requests at the edges of HTTP/1.1 that let a client smuggle a second
//! request past a proxy, send it somewhere else, or hold a connection: each
//! is answered safely by the real proxy, and nothing odd reaches the
//! upstream.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn config(upstream: &FakeServer, limits: &str) -> String {
    format!(
        "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\" }} }}\nagents:\n  a: {{}}\n{limits}",
        upstream.url()
    )
}

/// A proxy with `limits`, in front of an upstream that answers `{"ok": true}`.
async fn started(limits: &str) -> (FakeServer, Proxy) {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let proxy = Proxy::start(&config(&upstream, limits)).await;
    (upstream, proxy)
}

const BODY: &str = r#"{"model":"other","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn smuggling_shapes_are_refused_or_forwarded_as_one_request() {
    let (upstream, proxy) = started("").await;
    let len = BODY.len();
    // Both framings: Transfer-Encoding wins (RFC 9112 §6.3), the upstream
    // gets the body once with a length of its own.
    let both = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n{len:x}\r\n{BODY}\r\n0\r\n\r\n"
    );
    let res = raw_request(proxy.port, both.as_bytes()).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let sent = upstream.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(String::from_utf8_lossy(&sent[0].body), BODY);
    assert_eq!(sent[0].header("transfer-encoding"), None);

    for (what, raw) in [
        (
            "two different lengths",
            format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\nContent-Length: 3\r\n\r\n{BODY}"),
        ),
        (
            "an encoding that is not chunked",
            format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: {len}\r\n\r\n{BODY}"),
        ),
        (
            "an absolute-form target naming another host",
            format!("POST http://evil.example/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n{BODY}"),
        ),
        (
            "an absolute-form target on the proxy path",
            "GET http://evil.example/v1/embeddings HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(),
        ),
    ] {
        let res = raw_request(proxy.port, raw.as_bytes()).await;
        assert_eq!(res.status, 400, "{what}: {}", res.text());
        assert_eq!(res.json()["error"]["type"], "invalid_request_error", "{what}");
    }
    assert_eq!(upstream.requests().len(), 1, "none of those was forwarded");
}

#[tokio::test]
async fn a_client_dripping_its_head_is_cut_off() {
    let (upstream, proxy) = started("limits: { header_timeout_ms: 300 }").await;
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    stream
        .write_all(b"GET /v1/models HTTP/1.1\r\n")
        .await
        .unwrap();
    // A byte every 50 ms: each read is quick, the head never ends.
    let drip = async {
        for byte in b"X-Slow: ".iter().cycle() {
            if stream.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let cut = tokio::time::timeout(Duration::from_secs(10), drip).await;
    assert!(cut.is_ok(), "the proxy closed the connection");
    assert!(upstream.requests().is_empty());
}

/// A connection to the proxy on which `bytes` were sent.
async fn sent(port: u16, bytes: &[u8]) -> Connection {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    Connection::on(stream)
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (upstream, proxy) = started("").await;
    let len = BODY.len();
    let pipelined = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n{BODY}\
         GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    );
    let mut conn = sent(proxy.port, pipelined.as_bytes()).await;
    let first = conn.next_response().await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["ok"], true);
    let second = conn.next_response().await;
    assert_eq!(second.json()["object"], "list", "{}", second.text());
    let third = conn.next_response().await;
    assert_eq!(third.json()["status"], "ok", "{}", third.text());
    let chats = upstream.requests();
    let chats = chats
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"));
    assert_eq!(chats.count(), 1);
}

/// A request pingora's proxy path serves (a body over 1 MiB, a chunked body
/// to another route) with requests pipelined after it: it is answered
/// whole, then the connection closes, its answer saying so. The requests
/// after it are the client's to send again (RFC 9112 §9.3.2), never
/// answered by nothing or left waiting.
#[tokio::test]
async fn a_request_on_pingoras_path_with_requests_pipelined_after_it_is_answered_then_closed() {
    let (upstream, proxy) = started("").await;
    let large = "x".repeat(2 << 20);
    let requests = [
        (
            "a body over 1 MiB",
            format!(
                "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{large}",
                large.len()
            ),
        ),
        (
            "a chunked body",
            "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_string(),
        ),
    ];
    for (what, request) in &requests {
        let next = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut conn = sent(proxy.port, format!("{request}{next}{next}").as_bytes()).await;
        let first = conn.next_response().await;
        assert_eq!(first.status, 200, "{what}: {}", first.text());
        assert!(first.complete, "{what}");
        assert_eq!(first.header("connection"), Some("close"), "{what}");
        assert!(conn.closed_within(Duration::from_secs(5)).await, "{what}");
    }
    let sizes: Vec<usize> = upstream.requests().iter().map(|r| r.body.len()).collect();
    assert_eq!(sizes, [large.len(), 5]);
}

#[tokio::test]
async fn a_client_that_asks_to_close_gets_its_answer_then_the_close() {
    let (_upstream, proxy) = started("").await;
    for request in [
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /healthz HTTP/1.0\r\n\r\n",
    ] {
        let mut conn = sent(proxy.port, request.as_bytes()).await;
        let res = conn.next_response().await;
        assert_eq!(res.status, 200, "{request:?}");
        assert_eq!(res.header("connection"), Some("close"), "{request:?}");
        assert!(
            conn.closed_within(Duration::from_secs(5)).await,
            "{request:?}"
        );
    }
    // An HTTP/1.0 client that asks to keep the connection keeps it.
    let mut conn = sent(
        proxy.port,
        b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    )
    .await;
    let res = conn.next_response().await;
    assert_eq!(res.header("connection"), Some("keep-alive"));
    conn.send(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
    assert_eq!(conn.next_response().await.status, 200);
}

#[tokio::test]
async fn a_head_request_gets_the_length_but_no_body() {
    let (_upstream, proxy) = started("").await;
    let mut conn = sent(proxy.port, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let head = conn.head().await;
    assert_eq!(head.status, 200);
    assert!(head.header("content-length").is_some_and(|l| l != "0"));
    // Had a body followed, it would be read as the next status line.
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let next = conn.next_response().await;
    assert_eq!(next.status, 200);
    assert_eq!(next.json()["status"], "ok");
}

#[tokio::test]
async fn a_client_expecting_100_continue_gets_it_before_it_sends_the_body() {
    let (upstream, proxy) = started("").await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    );
    let mut conn = sent(proxy.port, head.as_bytes()).await;
    let interim = conn.head().await;
    assert_eq!(interim.status, 100);
    conn.send(BODY.as_bytes()).await.unwrap();
    let res = conn.next_response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    let sent = upstream.requests();
    assert_eq!(String::from_utf8_lossy(&sent[0].body), BODY);
    assert_eq!(sent[0].header("expect"), None, "the proxy answered it");
}

/// An answer sent before the request's body was read (a wrong key, a body
/// too large) reaches a client still sending that body: the proxy closes
/// its side, then reads and drops the rest for a moment. Closed with unread
/// bytes, the connection is reset, and the client's next write fails: an
/// HTTP library then reports that failure, not the answer waiting for it.
#[tokio::test]
async fn an_early_error_reaches_a_client_still_sending_its_body() {
    let (_upstream, proxy) = started("auth: { api_keys: [k1] }").await;
    let length = 4 * 1024 * 1024;
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: wrong\r\nanthropic-version: 2023-06-01\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    );
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b' '; 64 * 1024]).await.unwrap();
    // The answer is out and the proxy's side closed meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stream
        .write_all(&vec![b' '; 1024 * 1024])
        .await
        .expect("the rest of the body is taken, not refused with a reset");
    let mut conn = Connection::on(stream);
    let mut response = conn.head().await;
    while let Some(chunk) = conn.next_chunk(&mut response).await {
        response.body.extend_from_slice(&chunk);
    }
    assert_eq!(response.status, 401, "{}", response.text());
    assert_eq!(response.json()["type"], "error");
    assert_eq!(response.json()["error"]["type"], "authentication_error");
}

#[tokio::test]
async fn an_http_1_0_client_gets_an_agent_s_whole_stream_before_the_close() {
    let upstream = FakeServer::start(|_, _| {
        Reply::events(vec![content("Hel"), content("lo"), finish("stop")])
    })
    .await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    for (path, body, last) in [
        (
            "/v1/chat/completions",
            json!({"model": "a", "stream": true, "messages": user}),
            "data: [DONE]",
        ),
        (
            "/v1/messages",
            json!({"model": "a", "stream": true, "max_tokens": 8, "messages": user}),
            "event: message_stop",
        ),
        (
            "/v1/responses",
            json!({"model": "a", "stream": true, "store": false, "input": "hi"}),
            "event: response.completed",
        ),
    ] {
        // No chunks for HTTP/1.0: the close ends the body, and the last
        // events (held to leave with a closing chunk) must go before it.
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let res = raw_request(proxy.port, request.as_bytes()).await;
        assert_eq!(res.status, 200, "{path}: {}", res.text());
        assert_eq!(res.header("transfer-encoding"), None, "{path}");
        let text = res.text();
        assert!(text.contains("lo"), "{path}: {text}");
        let events: Vec<&str> = text.split_terminator("\n\n").collect();
        assert!(text.ends_with("\n\n"), "{path}: {text}");
        assert!(
            events.last().is_some_and(|e| e.starts_with(last)),
            "{path}: {text}"
        );
    }
}

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

const BODY: &str = r#"{"model":"other","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn smuggling_shapes_are_refused_or_forwarded_as_one_request() {
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
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
    let upstream = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let proxy = Proxy::start(&config(&upstream, "limits: { header_timeout_ms: 300 }")).await;
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

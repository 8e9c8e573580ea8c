//! Documented behaviour at the client's edge and in the config reference:
//! where agents' requests go, which `Authorization` reaches an upstream,
//! body and stream limits, `/metrics` and the admin listener, `Expect`.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// An upstream that answers every chat with `name`.
async fn named(name: &'static str) -> FakeServer {
    FakeServer::start(move |_, _| Reply::events(vec![content(name), finish("stop")])).await
}

#[tokio::test]
async fn an_agent_on_a_non_default_upstream_calls_that_upstream() {
    let (local, remote) = (named("local").await, named("remote").await);
    let yaml = format!(
        "default_upstream: local\nupstreams:\n  local: {{ url: \"{}/v1\" }}\n  remote: {{ url: \"{}/v1\" }}\nagents:\n  near: {{}}\n  far: {{ upstream: remote }}\n",
        local.url(),
        remote.url()
    );
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(
        answer_text(proxy.port, &chat_body("far", "hi")).await,
        "remote"
    );
    assert_eq!(
        answer_text(proxy.port, &chat_body("near", "hi")).await,
        "local"
    );
}

/// The `Authorization` the upstream got for an agent's model call and for a
/// forwarded (non-agent) request, both sent with `Bearer <client_key>`.
async fn authorization_upstream_sees(
    extra: &str,
    upstream_key: &str,
    client_key: &str,
) -> [Option<String>; 2] {
    let upstream = named("ok").await;
    let key = if upstream_key.is_empty() {
        String::new()
    } else {
        format!(", api_key: {upstream_key}")
    };
    let yaml = format!(
        "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\"{key} }} }}\nagents: {{ a: {{}} }}\n{extra}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let bearer = format!("Bearer {client_key}");
    for model in ["a", "other"] {
        let res = request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[("authorization", &bearer)],
            chat_body(model, "hi").to_string().as_bytes(),
        )
        .await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let requests = upstream.requests();
    [0, 1].map(|i| requests[i].header("authorization").map(str::to_owned))
}

#[tokio::test]
async fn without_proxy_auth_or_upstream_key_the_clients_authorization_goes_along() {
    let seen = authorization_upstream_sees("", "", "sk-client").await;
    assert_eq!(
        seen,
        [
            Some("Bearer sk-client".into()),
            Some("Bearer sk-client".into())
        ],
        "an agent's model calls and forwarded requests alike"
    );
}

#[tokio::test]
async fn an_upstream_key_replaces_the_clients_authorization() {
    let seen = authorization_upstream_sees("", "sk-upstream", "sk-client").await;
    assert_eq!(
        seen,
        [
            Some("Bearer sk-upstream".into()),
            Some("Bearer sk-upstream".into())
        ]
    );
}

#[tokio::test]
async fn the_proxys_own_key_is_never_forwarded() {
    let seen = authorization_upstream_sees("auth: { api_keys: [sk-proxy] }", "", "sk-proxy").await;
    assert_eq!(seen, [None, None]);
}

#[tokio::test]
async fn a_chunked_body_over_max_body_bytes_is_413() {
    let upstream = named("ok").await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "agents: { a: {} }\nlimits: { max_body_bytes: 1000 }",
    ))
    .await;
    let body = chat_body("a", &"x".repeat(2000)).to_string();
    let mut bytes = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in body.as_bytes().chunks(500) {
        bytes.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        bytes.extend_from_slice(piece);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n\r\n");
    let res = raw_request(proxy.port, &bytes).await;
    assert_eq!(res.status, 413, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "request_too_large");
    assert!(upstream.requests().is_empty(), "nothing went upstream");
}

#[tokio::test]
async fn max_streams_per_client_zero_means_no_limit() {
    let upstream = FakeServer::start(|_, _| Reply::Hold).await;
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        "agents: { a: {} }\nlimits: { max_streams_per_client: 0 }",
    ))
    .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(Connection::chat(proxy.port, &stream_body("a", "hi")).await);
    }
    // A refused stream never reaches the upstream.
    upstream.wait_requests(5).await;
}

#[tokio::test]
async fn metrics_need_the_key_when_auth_is_on_and_are_free_on_the_admin_listener() {
    let upstream = named("ok").await;
    let admin = free_port();
    let proxy = Proxy::start(&one_upstream(
        &upstream.url(),
        &format!("auth: {{ api_keys: [sk-proxy] }}\nadmin_listen: \"127.0.0.1:{admin}\""),
    ))
    .await;
    let res = get(proxy.port, "/metrics").await;
    assert_eq!(res.status, 401, "{}", res.text());
    let res = request(
        proxy.port,
        "GET",
        "/metrics",
        &[("authorization", "Bearer sk-proxy")],
        b"",
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(res.text().contains("agent_proxy_"));

    for path in ["/metrics", "/healthz", "/readyz"] {
        let res = get(admin, path).await;
        assert_eq!(
            res.status,
            200,
            "{path} on the admin listener: {}",
            res.text()
        );
    }
    assert!(get(admin, "/metrics").await.text().contains("agent_proxy_"));
    let res = post_json(admin, "/v1/chat/completions", &chat_body("a", "hi")).await;
    assert_ne!(res.status, 200, "the admin listener serves no API");
    assert!(
        upstream.requests().iter().all(|r| r.method == "GET"),
        "only readiness checks reached the upstream"
    );
}

#[tokio::test]
async fn expect_100_continue_gets_a_go_ahead_before_the_body() {
    let upstream = named("ok").await;
    let proxy = Proxy::start(&one_upstream(&upstream.url(), "agents: { a: {} }")).await;
    let body = chat_body("a", "hi").to_string();
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    within(
        Duration::from_secs(10),
        "100 Continue",
        reader.read_line(&mut status),
    )
    .await
    .unwrap();
    assert!(status.starts_with("HTTP/1.1 100"), "{status}");
    let mut blank = String::new();
    reader.read_line(&mut blank).await.unwrap();
    assert_eq!(blank, "\r\n");
    let mut stream = reader.into_inner();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut conn = Connection::on(stream);
    let res = conn.next_response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["choices"][0]["message"]["content"], "ok");
}

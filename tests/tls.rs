//! HTTPS upstreams (OpenAI and friends) through pingora's rustls client,
//! against a local TLS server whose certificate comes from a test CA.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use tokio_rustls::rustls;

struct TestPki {
    ca_pem: String,
    acceptor: tokio_rustls::TlsAcceptor,
}

fn test_pki() -> TestPki {
    test_pki_with_alpn(vec![])
}

fn test_pki_with_alpn(alpn: Vec<Vec<u8>>) -> TestPki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "agent-proxy test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    config.alpn_protocols = alpn;
    TestPki {
        ca_pem: ca.pem(),
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    }
}

#[tokio::test]
async fn agent_and_passthrough_requests_reach_an_https_upstream() {
    let pki = test_pki();
    let upstream = FakeServer::start_with(
        |req, _| match req.path.as_str() {
            "/openai/v1/chat/completions" if req.json()["model"] == "gpt-4o-mini" => {
                Reply::events(vec![role(), content("secure hello"), finish("stop")])
            }
            _ => Reply::json(200, json!({"object": "list", "data": [], "path": req.path})),
        },
        Some(pki.acceptor.clone()),
    )
    .await;
    let dir = scratch_dir();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let yaml = format!(
        r#"
default_upstream: openai
upstreams:
  openai: {{ url: "https://127.0.0.1:{port}/openai/v1", api_key: "${{TEST_OPENAI_KEY}}", ca_file: "{ca}" }}
agents:
  coder: {{ model: gpt-4o-mini, system_prompt: "Be exact." }}
"#,
        port = upstream.port,
        ca = ca_file.display()
    );
    let proxy = Proxy::start_with_env(&yaml, &[("TEST_OPENAI_KEY", "sk-test-openai")]).await;

    let body =
        json!({"model": "coder", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 200, "{}\n{}", res.text(), proxy.logs());
    assert_eq!(res.delta_text("content"), "secure hello");
    let sent = &upstream.requests()[0];
    assert_eq!(sent.header("authorization"), Some("Bearer sk-test-openai"));
    assert_eq!(
        sent.header("host"),
        Some(format!("127.0.0.1:{}", upstream.port).as_str())
    );

    let res = post_json(proxy.port, "/v1/embeddings", &json!({"input": "x"})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["path"], "/openai/v1/embeddings");
}

#[tokio::test]
async fn an_upstream_certificate_from_an_unknown_ca_is_refused() {
    let pki = test_pki();
    let other = test_pki();
    let upstream = FakeServer::start_with(
        |_, _| Reply::json(200, json!({})),
        Some(pki.acceptor.clone()),
    )
    .await;
    let dir = scratch_dir();
    let ca_file = dir.join("other-ca.pem");
    std::fs::write(&ca_file, &other.ca_pem).unwrap();
    let yaml = format!(
        "default_upstream: up\nupstreams:\n  up: {{ url: \"https://127.0.0.1:{}/v1\", ca_file: \"{}\" }}\nagents:\n  a:\n",
        upstream.port,
        ca_file.display()
    );
    let proxy = Proxy::start(&yaml).await;
    let body = json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]});
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert!(upstream.requests().is_empty());
}

/// An HTTP/2-only TLS server, as api.openai.com negotiates by ALPN: answers
/// chat completions with an SSE body in several DATA frames and records the
/// request's path, authority and authorization.
async fn h2_upstream(
    acceptor: tokio_rustls::TlsAcceptor,
) -> (u16, Arc<std::sync::Mutex<Vec<(String, String, String)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, record) = (acceptor.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(socket).await else {
                    return;
                };
                let Ok(mut conn) = h2::server::handshake(tls).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let record = record.clone();
                    tokio::spawn(async move {
                        let (parts, mut body) = request.into_parts();
                        while let Some(Ok(data)) = body.data().await {
                            let _ = body.flow_control().release_capacity(data.len());
                        }
                        let header = |name: &str| {
                            parts
                                .headers
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned()
                        };
                        let authority = parts
                            .uri
                            .authority()
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        record.lock().unwrap().push((
                            parts.uri.path().to_owned(),
                            authority,
                            header("authorization"),
                        ));
                        let response = http::Response::builder()
                            .status(200)
                            .header("content-type", "text/event-stream")
                            .body(())
                            .unwrap();
                        let Ok(mut stream) = respond.send_response(response, false) else {
                            return;
                        };
                        for event in [role(), content("over "), content("h2"), finish("stop")] {
                            let _ = stream.send_data(format!("data: {event}\n\n").into(), false);
                        }
                        let _ = stream.send_data("data: [DONE]\n\n".into(), true);
                    });
                }
            });
        }
    });
    (port, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_only_upstream_is_spoken_to_over_h2() {
    let pki = test_pki_with_alpn(vec![b"h2".to_vec()]);
    let (port, seen) = h2_upstream(pki.acceptor.clone()).await;
    let dir = scratch_dir();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let yaml = format!(
        "default_upstream: openai\nupstreams:\n  openai: {{ url: \"https://127.0.0.1:{port}/v1\", api_key: sk-h2, ca_file: \"{}\" }}\nagents:\n  coder: {{ model: gpt-4o-mini }}\n",
        ca_file.display()
    );
    let proxy = Proxy::start(&yaml).await;
    let body =
        json!({"model": "coder", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
        assert_eq!(res.status, 200, "{}\n{}", res.text(), proxy.logs());
        assert_eq!(res.delta_text("content"), "over h2");
        assert!(res.ends_with_done());
    }
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(res.status, 200, "non-agent chat over h2: {}", res.text());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for (path, authority, auth) in &seen {
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(authority, &format!("127.0.0.1:{port}"));
        assert_eq!(auth, "Bearer sk-h2");
    }
}

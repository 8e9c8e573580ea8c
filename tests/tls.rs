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
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
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

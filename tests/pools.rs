//! Upstream pools: balancing, health checks, failover and retries, timeouts.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// A replica that names itself in every answer and answers health checks.
async fn replica(name: &'static str, port: u16) -> FakeServer {
    FakeServer::start_on(
        port,
        move |req, _| match req.path.as_str() {
            "/health" => Reply::json(200, json!({"status": "ok"})),
            "/v1/embeddings" => Reply::json(200, json!({"replica": name})),
            _ => {
                let slow = req.json()["messages"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["content"] == "slow"));
                let mut steps = vec![Step::Bytes(
                    format!("data: {}\n\n", content(name)).into_bytes(),
                )];
                if slow {
                    steps.push(Step::Sleep(Duration::from_millis(1500)));
                }
                steps.push(Step::Bytes(
                    format!("data: {}\n\ndata: [DONE]\n\n", finish("stop")).into_bytes(),
                ));
                Reply::Sse {
                    steps,
                    complete: true,
                }
            }
        },
        None,
    )
    .await
}

fn pool_config(urls: &[String], extra: &str) -> String {
    let endpoints: Vec<String> = urls.iter().map(|u| format!("\"{u}/v1\"")).collect();
    let health = if extra.contains("health_check") {
        ""
    } else {
        "    health_check: { path: /health, interval_ms: 100, timeout_ms: 300 }\n"
    };
    format!(
        "default_upstream: pool\nupstreams:\n  pool:\n    endpoints: [{}]\n{health}{extra}\nagents:\n  bot: {{}}\n",
        endpoints.join(", ")
    )
}

fn ask(user: &str) -> Value {
    json!({"model": "bot", "messages": [{"role": "user", "content": user}]})
}

async fn answer(port: u16, body: &Value) -> String {
    let res = post_json(port, "/v1/chat/completions", body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn chat_calls(server: &FakeServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_load_and_a_killed_replica_leaves_and_rejoins() {
    let (a, b, c) = (
        replica("A", 0).await,
        replica("B", 0).await,
        replica("C", 0).await,
    );
    let b_port = b.port;
    let proxy = Proxy::start(&pool_config(&[a.url(), b.url(), c.url()], "")).await;
    for _ in 0..6 {
        answer(proxy.port, &ask("hi")).await;
    }
    assert_eq!((chat_calls(&a), chat_calls(&b), chat_calls(&c)), (2, 2, 2));

    drop(b);
    for _ in 0..9 {
        assert_ne!(
            answer(proxy.port, &ask("hi")).await,
            "B",
            "no request fails or lands on the dead replica"
        );
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let _b = replica("B", b_port).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while answer(proxy.port, &ask("hi")).await != "B" {
        assert!(
            Instant::now() < deadline,
            "B never rejoined:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs = proxy.logs();
    assert!(
        logs.contains("endpoint unhealthy") && logs.contains("endpoint healthy again"),
        "{logs}"
    );
}

#[tokio::test]
async fn a_5xx_before_any_byte_is_retried_on_another_replica() {
    let failing = FakeServer::start(|req, _| match req.path.as_str() {
        "/health" => Reply::json(200, json!({})),
        _ => Reply::json(
            503,
            json!({"error": {"message": "loading model", "type": "unavailable_error"}}),
        ),
    })
    .await;
    let good = replica("B", 0).await;
    let proxy = Proxy::start(&pool_config(&[failing.url(), good.url()], "")).await;
    for _ in 0..4 {
        assert_eq!(answer(proxy.port, &ask("hi")).await, "B");
        let res = post_json(
            proxy.port,
            "/v1/chat/completions",
            &json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
        assert_eq!(res.status, 200, "non-agent chat is retried too");
    }
    assert!(chat_calls(&failing) >= 2, "the failing replica was tried");

    // When every replica fails, the last answer reaches the client as it is.
    let other = FakeServer::start(|_, _| {
        Reply::json(
            503,
            json!({"error": {"message": "busy", "type": "unavailable_error"}}),
        )
    })
    .await;
    let proxy = Proxy::start(&pool_config(
        &[failing.url(), other.url()],
        "    health_check: { enabled: false }",
    ))
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("hi")).await;
    assert_eq!(res.status, 503);
    assert_eq!(res.json()["error"]["type"], "unavailable_error");
}

#[tokio::test]
async fn a_stream_that_breaks_after_it_began_is_never_retried() {
    let breaking = FakeServer::start(|req, _| match req.path.as_str() {
        "/health" => Reply::json(200, json!({})),
        _ => Reply::Sse {
            steps: vec![Step::Bytes(
                format!("data: {}\n\n", content("partial")).into_bytes(),
            )],
            complete: false,
        },
    })
    .await;
    let good = replica("B", 0).await;
    let proxy = Proxy::start(&pool_config(&[breaking.url(), good.url()], "")).await;
    let mut body = ask("hi");
    body["stream"] = json!(true);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.delta_text("content"), "partial");
    assert!(
        !res.complete,
        "the broken stream ends with an error, not B's answer"
    );
    assert_eq!(chat_calls(&good), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_affinity_keeps_each_conversation_on_one_replica() {
    let replicas = [
        replica("A", 0).await,
        replica("B", 0).await,
        replica("C", 0).await,
    ];
    let urls: Vec<String> = replicas.iter().map(FakeServer::url).collect();
    let proxy = Proxy::start(&pool_config(&urls, "    balance: prefix_affinity")).await;
    let mut homes = Vec::new();
    for conversation in 0..8 {
        let mut messages = vec![
            json!({"role": "system", "content": "You are terse."}),
            json!({"role": "user", "content": format!("question {conversation}")}),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for turn in 0..4 {
            let replica = answer(proxy.port, &json!({"model": "bot", "messages": messages})).await;
            seen.insert(replica.clone());
            messages.push(json!({"role": "assistant", "content": replica}));
            messages.push(json!({"role": "user", "content": format!("follow-up {turn}")}));
        }
        assert_eq!(
            seen.len(),
            1,
            "conversation {conversation} moved between replicas: {seen:?}"
        );
        homes.push(seen.into_iter().next().unwrap());
    }
    let distinct: std::collections::BTreeSet<_> = homes.iter().collect();
    assert!(
        distinct.len() >= 2,
        "conversations spread over the pool: {homes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn least_in_flight_sends_new_requests_to_the_idle_replica() {
    let (a, b) = (replica("A", 0).await, replica("B", 0).await);
    let proxy = Proxy::start(&pool_config(
        &[a.url(), b.url()],
        "    balance: least_in_flight",
    ))
    .await;
    let port = proxy.port;
    let slow = tokio::spawn(async move { answer(port, &ask("slow")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy = if chat_calls(&a) == 1 { "A" } else { "B" };
    for _ in 0..4 {
        assert_ne!(answer(proxy.port, &ask("hi")).await, busy);
    }
    assert_eq!(slow.await.unwrap(), busy);
}

#[tokio::test]
async fn the_proxy_path_fails_over_on_connect_failure() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let good = replica("B", 0).await;
    let proxy = Proxy::start(&pool_config(
        &[dead, good.url()],
        "    health_check: { enabled: false }",
    ))
    .await;
    for _ in 0..4 {
        let res = post_json(proxy.port, "/v1/embeddings", &json!({"input": "x"})).await;
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.json()["replica"], "B");
    }
}

#[tokio::test]
async fn first_byte_idle_and_total_timeouts() {
    let upstream = FakeServer::start(|req, _| {
        let user = req.json()["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match user.as_str() {
            "stall" => Reply::Stall,
            "pause" => Reply::Sse {
                steps: vec![
                    Step::Bytes(format!("data: {}\n\n", content("a")).into_bytes()),
                    Step::Sleep(Duration::from_secs(5)),
                ],
                complete: true,
            },
            _ => {
                let mut steps = Vec::new();
                for _ in 0..30 {
                    steps.push(Step::Bytes(
                        format!("data: {}\n\n", content(".")).into_bytes(),
                    ));
                    steps.push(Step::Sleep(Duration::from_millis(100)));
                }
                Reply::Sse {
                    steps,
                    complete: true,
                }
            }
        }
    })
    .await;
    let yaml = format!(
        "default_upstream: up\nupstreams:\n  up: {{ url: \"{}/v1\", first_byte_timeout_ms: 300, idle_timeout_ms: 500, total_timeout_ms: 1200 }}\nagents:\n  bot: {{}}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let stream = |user: &str| json!({"model": "bot", "stream": true, "messages": [{"role": "user", "content": user}]});

    let res = post_json(proxy.port, "/v1/chat/completions", &stream("stall")).await;
    assert_eq!(res.status, 504, "no first byte: {}", res.text());

    for (user, why) in [("pause", "idle"), ("long", "total")] {
        let started = Instant::now();
        let res = post_json(proxy.port, "/v1/chat/completions", &stream(user)).await;
        assert_eq!(res.status, 200);
        assert!(!res.complete, "{why} timeout cuts the stream");
        let last: Value = serde_json::from_str(sse_data(&res.body).last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "timeout", "{why}: {last}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{why} timeout fired"
        );
    }
}

/// A single-URL upstream for non-agent chat requests, which the proxy
/// forwards on pooled connections. A streamed answer's end reaches the client
/// after the connection is back in the pool, so the next request reuses it.
fn single(url: &str) -> String {
    format!("default_upstream: up\nupstreams:\n  up: {{ url: \"{url}/v1\" }}\n")
}

fn other_model() -> Value {
    json!({"model": "other", "messages": [{"role": "user", "content": "x"}]})
}

#[tokio::test]
async fn a_request_the_upstream_read_before_closing_the_connection_is_not_sent_again() {
    let upstream = FakeServer::start(|_, index| match index {
        0 => Reply::events(vec![content("first")]),
        1 => Reply::CloseUnanswered,
        _ => Reply::json(200, json!({"answer": "sent again"})),
    })
    .await;
    let proxy = Proxy::start(&single(&upstream.url())).await;
    let first = post_json(proxy.port, "/v1/chat/completions", &other_model()).await;
    assert_eq!(first.delta_text("content"), "first");

    let second = post_json(proxy.port, "/v1/chat/completions", &other_model()).await;
    assert_eq!(second.status, 502, "{}", second.text());
    assert_eq!(second.error_type(), "upstream_error", "{}", second.text());
    let requests = upstream.requests();
    assert_eq!(
        requests[1].connection, requests[0].connection,
        "the second request went out on the pooled connection"
    );
    assert_eq!(
        requests.len(),
        2,
        "the upstream may have acted on the request: it is not replayed"
    );
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_while_idle_is_not_an_error() {
    let upstream = FakeServer::start(|_, index| match index {
        0 => Reply::ThenClose(Box::new(Reply::events(vec![content("first")]))),
        _ => Reply::json(200, json!({"answer": "second"})),
    })
    .await;
    let proxy = Proxy::start(&single(&upstream.url())).await;
    let first = post_json(proxy.port, "/v1/chat/completions", &other_model()).await;
    assert_eq!(first.delta_text("content"), "first");
    assert!(
        wait_until(Duration::from_secs(5), || std::future::ready(
            upstream.closed() == 1
        ))
        .await,
        "the upstream closed the idle connection"
    );

    let second = post_json(proxy.port, "/v1/chat/completions", &other_model()).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["answer"], "second");
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2, "each request reached the upstream once");
    assert_ne!(requests[1].connection, requests[0].connection);
}

/// Probes `/readyz` until `done` holds for its answer (at most 10 s).
async fn readyz_until(port: u16, done: impl Fn(&Response) -> bool) -> Response {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let res = get(port, "/readyz").await;
        if done(&res) {
            return res;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never got there: {}",
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ready, and known to be: a check has completed.
fn checked_ready(res: &Response) -> bool {
    res.status == 200 && res.json()["note"].is_null()
}

#[tokio::test]
async fn a_flood_of_readyz_probes_makes_no_upstream_calls_of_its_own() {
    let upstream =
        FakeServer::start(|_, _| Reply::json(200, json!({"object": "list", "data": []}))).await;
    let proxy = Proxy::start(&single(&upstream.url())).await;
    let started = Instant::now();
    readyz_until(proxy.port, checked_ready).await;
    for _ in 0..50 {
        let res = get(proxy.port, "/readyz").await;
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.json()["status"], "ready");
    }
    // The health checker probes at most every 5 s, once on demand at start.
    let allowed = 2 + started.elapsed().as_secs() as usize / 5;
    let calls = upstream.requests().len();
    assert!(
        calls <= allowed,
        "{calls} upstream calls for 51 probes (the checker's own: at most {allowed})"
    );
}

#[tokio::test]
async fn readyz_follows_the_health_checker_down_and_up_again() {
    let upstream = replica("A", 0).await;
    let port = upstream.port;
    let yaml = format!(
        "default_upstream: up\nupstreams:\n  up:\n    url: \"{}/v1\"\n    health_check: {{ path: /health, interval_ms: 100, timeout_ms: 300 }}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    readyz_until(proxy.port, checked_ready).await;
    let checks = upstream.requests().len();
    for _ in 0..50 {
        assert_eq!(get(proxy.port, "/readyz").await.status, 200);
    }
    assert!(
        upstream.requests().iter().all(|r| r.path == "/health"),
        "only the health checker calls the upstream"
    );
    assert!(upstream.requests().len() >= checks);

    drop(upstream);
    let down = readyz_until(proxy.port, |res| res.status == 503).await;
    assert_eq!(down.json()["status"], "not ready");
    assert_eq!(down.json()["upstream"], "up");
    assert!(
        down.json()["reason"]
            .as_str()
            .is_some_and(|r| r.contains("/health")),
        "{}",
        down.text()
    );

    let _back = replica("A", port).await;
    readyz_until(proxy.port, checked_ready).await;
}

/// A proxy whose upstream is `http://localhost:PORT` and a replica that
/// listens on 127.0.0.1:PORT only, as llama-server does by default, while
/// `[::1]:PORT` refuses. The replica starts after the proxy's start-up check
/// found nothing at either address, so `[::1]` is still tried first.
async fn behind_localhost() -> (Proxy, FakeServer) {
    let port = free_port();
    let proxy = Proxy::start(&format!(
        "default_upstream: up\nupstreams:\n  up: {{ url: \"http://localhost:{port}/v1\" }}\nagents:\n  bot: {{}}\n"
    ))
    .await;
    let checked = wait_until(Duration::from_secs(10), || {
        std::future::ready(proxy.logs().contains("is not answering"))
    })
    .await;
    assert!(checked, "no start-up check:\n{}", proxy.logs());
    let replica = replica("A", port).await;
    (proxy, replica)
}

#[tokio::test]
async fn an_agent_reaches_a_localhost_upstream_on_whichever_loopback_address_listens() {
    let (proxy, replica) = behind_localhost().await;
    for _ in 0..2 {
        assert_eq!(answer(proxy.port, &ask("hi")).await, "A");
    }
    assert_eq!(chat_calls(&replica), 2);
}

#[tokio::test]
async fn the_proxy_path_reaches_a_localhost_upstream_on_whichever_loopback_address_listens() {
    let (proxy, _replica) = behind_localhost().await;
    for _ in 0..2 {
        let res = post_json(proxy.port, "/v1/embeddings", &json!({"input": "x"})).await;
        assert_eq!(res.status, 200, "{}\n{}", res.text(), proxy.logs());
        assert_eq!(res.json()["replica"], "A");
    }
}

//! Upstream pools: balancing, health checks, failover and retries, timeouts.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// A replica that names itself in every answer and answers health checks.
async fn replica(name: &'static str, port: u16) -> FakeServer {
    holding_replica(name, port, None).await
}

/// A [`replica`] that holds a request saying `slow` until `hold` opens.
async fn holding_replica(name: &'static str, port: u16, hold: Option<Gate>) -> FakeServer {
    FakeServer::start_on(
        port,
        move |req, _| match req.path.as_str() {
            "/health" => Reply::json(200, json!({"status": "ok"})),
            "/v1/embeddings" => Reply::json(200, json!({"replica": name})),
            _ => {
                if let Some(hold) = &hold {
                    if req.json()["messages"][0]["content"] == "slow" {
                        hold.wait();
                    }
                }
                Reply::events(vec![content(name), finish("stop")])
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
    chat_body("bot", user)
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
        answer_text(proxy.port, &ask("hi")).await;
    }
    assert_eq!((chat_calls(&a), chat_calls(&b), chat_calls(&c)), (2, 2, 2));

    drop(b);
    for _ in 0..9 {
        assert_ne!(
            answer_text(proxy.port, &ask("hi")).await,
            "B",
            "no request fails or lands on the dead replica"
        );
    }
    let noticed = wait_until(Duration::from_secs(10), || {
        std::future::ready(proxy.logs().contains("endpoint unhealthy"))
    })
    .await;
    assert!(noticed, "the health checker saw B die:\n{}", proxy.logs());
    let _b = replica("B", b_port).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while answer_text(proxy.port, &ask("hi")).await != "B" {
        assert!(
            Instant::now() < deadline,
            "B never rejoined:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        proxy
            .logged(&["endpoint unhealthy", "endpoint healthy again"])
            .await,
        "{}",
        proxy.logs()
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
        assert_eq!(answer_text(proxy.port, &ask("hi")).await, "B");
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
            steps: vec![Step::event(&content("partial"))],
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
            let replica =
                answer_text(proxy.port, &json!({"model": "bot", "messages": messages})).await;
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
    let hold = Gate::default();
    let (a, b) = (
        holding_replica("A", 0, Some(hold.clone())).await,
        holding_replica("B", 0, Some(hold.clone())).await,
    );
    let proxy = Proxy::start(&pool_config(
        &[a.url(), b.url()],
        "    balance: least_in_flight",
    ))
    .await;
    let port = proxy.port;
    let slow = tokio::spawn(async move { answer_text(port, &ask("slow")).await });
    let arrived = wait_until(Duration::from_secs(10), || {
        std::future::ready(chat_calls(&a) + chat_calls(&b) == 1)
    })
    .await;
    assert!(arrived, "the slow request reached a replica");
    let busy = if chat_calls(&a) == 1 { "A" } else { "B" };
    for _ in 0..4 {
        assert_ne!(answer_text(proxy.port, &ask("hi")).await, busy);
    }
    hold.open();
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

/// The agent `bot` on `url` with only the `timeouts` given (the others keep
/// their defaults of minutes), so each test sees exactly one timeout at work.
fn timed(url: &str, timeouts: &str) -> String {
    format!(
        "default_upstream: up\nupstreams:\n  up: {{ url: \"{url}/v1\", {timeouts} }}\nagents:\n  bot: {{}}\n"
    )
}

/// Far beyond the timeouts under test, far below the defaults of the others.
const DEADLINE: Duration = Duration::from_secs(10);

/// A chat request to `bot`, answered within [`DEADLINE`].
async fn call_bot(proxy: &Proxy, body: &Value) -> Response {
    within(
        DEADLINE,
        "an answer",
        post_json(proxy.port, "/v1/chat/completions", body),
    )
    .await
}

/// A streamed request to `bot` that the proxy must cut on a timeout (within
/// [`DEADLINE`]) with an error event.
async fn cut_by_timeout(proxy: &Proxy) -> Response {
    let res = call_bot(proxy, &stream_body("bot", "hi")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(!res.complete, "cut, not ended cleanly: {}", res.text());
    assert_eq!(
        res.last_event()["error"]["code"],
        "timeout",
        "{}",
        res.text()
    );
    res
}

#[tokio::test]
async fn first_byte_timeout_answers_504_when_the_upstream_never_answers() {
    let upstream = FakeServer::start(|_, _| Reply::Stall).await;
    let proxy = Proxy::start(&timed(&upstream.url(), "first_byte_timeout_ms: 300")).await;
    for body in [chat_body("bot", "hi"), stream_body("bot", "hi")] {
        let res = call_bot(&proxy, &body).await;
        assert_eq!(res.status, 504, "{}", res.text());
        assert_eq!(res.json()["error"]["code"], "timeout", "{}", res.text());
    }
}

#[tokio::test]
async fn idle_timeout_cuts_a_stream_that_stalls_mid_way() {
    let upstream = FakeServer::start(|_, _| Reply::silent_after("begun")).await;
    let proxy = Proxy::start(&timed(&upstream.url(), "idle_timeout_ms: 500")).await;
    assert_eq!(cut_by_timeout(&proxy).await.delta_text("content"), "begun");

    // A client that did not stream gets a 504 for the same stall.
    let res = call_bot(&proxy, &chat_body("bot", "hi")).await;
    assert_eq!(res.status, 504, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "timeout", "{}", res.text());
}

#[tokio::test]
async fn total_timeout_cuts_a_stream_that_never_pauses_long() {
    // Ten minutes of a chunk every 100 ms: never idle, always too long.
    let upstream =
        FakeServer::start(|_, _| Reply::slow_stream(6000, Duration::from_millis(100))).await;
    let proxy = Proxy::start(&timed(&upstream.url(), "total_timeout_ms: 1200")).await;
    let res = cut_by_timeout(&proxy).await;
    assert!(
        res.delta_text("content").starts_with('.'),
        "the stream ran before it was cut"
    );
}

#[tokio::test]
async fn total_timeout_also_bounds_the_wait_for_the_first_byte() {
    let upstream = FakeServer::start(|_, _| Reply::Stall).await;
    let proxy = Proxy::start(&timed(&upstream.url(), "total_timeout_ms: 500")).await;
    let res = call_bot(&proxy, &chat_body("bot", "hi")).await;
    assert_eq!(res.status, 504, "{}", res.text());
}

#[tokio::test]
async fn connect_timeout_gives_up_on_a_host_that_never_accepts() {
    // A listener whose accept queue is full: the kernel drops further SYNs,
    // so a connect neither succeeds nor is refused until it gives up.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let _queued = tokio::net::TcpStream::connect(address).await.unwrap();
    let filled = tokio::time::timeout(
        Duration::from_millis(500),
        tokio::net::TcpStream::connect(address),
    )
    .await
    .is_err();
    assert!(filled, "the listener's queue is full");

    let url = format!("http://{address}");
    let proxy = Proxy::start(&timed(&url, "connect_timeout_ms: 300")).await;
    let res = call_bot(&proxy, &chat_body("bot", "hi")).await;
    assert_eq!(res.status, 504, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "timeout", "{}", res.text());
}

/// A single-URL upstream for non-agent chat requests, which the proxy
/// forwards on pooled connections. A streamed answer's end reaches the client
/// after the connection is back in the pool, so the next request reuses it.
fn single(url: &str) -> String {
    one_upstream(url, "")
}

fn other_model() -> Value {
    json!({"model": "other", "messages": [{"role": "user", "content": "x"}]})
}

#[tokio::test]
async fn a_request_the_upstream_read_before_closing_the_connection_is_not_sent_again() {
    // The case needs the second request on the first one's pooled
    // connection: one thread, whose pool part both client connections use
    // (each thread keeps its own idle connections, and a connection goes to
    // the thread serving the fewest: on a loaded machine the first client's
    // connection may not have closed yet). The pool may not have it back
    // yet either, so the scenario runs again until it did.
    for _ in 0..5 {
        let upstream = FakeServer::start(|_, index| match index {
            0 => Reply::events(vec![content("first")]),
            1 => Reply::CloseUnanswered,
            _ => Reply::json(200, json!({"answer": "sent again"})),
        })
        .await;
        let one_thread = one_upstream(&upstream.url(), "runtime: { threads: 1 }");
        let proxy = Proxy::start(&one_thread).await;
        let first = post_json(proxy.port, "/v1/chat/completions", &other_model()).await;
        assert_eq!(first.delta_text("content"), "first");

        let second = post_json(proxy.port, "/v1/chat/completions", &other_model()).await;
        assert_eq!(second.status, 502, "{}", second.text());
        assert_eq!(second.error_type(), "upstream_error", "{}", second.text());
        let requests = upstream.requests();
        assert_eq!(
            requests.len(),
            2,
            "the upstream may have acted on the request: it is not replayed"
        );
        if requests[1].connection == requests[0].connection {
            return;
        }
    }
    panic!("the second request never went out on the pooled connection");
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
        assert_eq!(answer_text(proxy.port, &ask("hi")).await, "A");
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

#[tokio::test]
async fn first_byte_timeout_bounds_a_request_the_upstream_never_reads() {
    // Accepts and never reads: a request larger than the sockets' buffers
    // can only be written in part.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let _accepted: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(DEADLINE);
    });
    let proxy = Proxy::start(&timed(&url, "first_byte_timeout_ms: 300")).await;
    // A model no agent answers: the body is passed on as it came.
    let body = chat_body("passed-on", &"x".repeat(12 * 1024 * 1024));
    let started = Instant::now();
    let res = call_bot(&proxy, &body).await;
    assert_eq!(res.status, 504, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "timeout", "{}", res.text());
    assert!(started.elapsed() < DEADLINE, "cut by the timeout");
}

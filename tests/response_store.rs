//! The response store (`store:`): `previous_response_id` chains, reading
//! back and deleting stored responses, tenant isolation, SQLite across a
//! restart, Redis shared by two proxies and its outage, and conversation
//! affinity on a pool.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// A model that answers with what it was sent: `seen: <user and assistant
/// texts, in order, joined by |>`, so a test reads the history it got.
async fn echo_model() -> FakeServer {
    FakeServer::start(|req, _| {
        let messages = req.json()["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let seen: Vec<String> = messages
            .iter()
            .filter(|m| m["role"] == "user" || m["role"] == "assistant")
            .map(|m| m["content"].as_str().unwrap_or("?").to_owned())
            .collect();
        Reply::events(vec![
            content(&format!("seen: {}", seen.join("|"))),
            finish("stop"),
            usage(5, 2),
        ])
    })
    .await
}

fn bot_config(upstream: &str, extra: &str) -> String {
    format!(
        "{}\nagents:\n  bot: {{ system_prompt: Be brief. }}\n{extra}\n",
        one_upstream(upstream, "")
    )
}

/// One turn: the Response object (non-streamed), or the final one of the
/// stream.
async fn turn(port: u16, headers: &[(&str, &str)], body: Value) -> Value {
    let response = request(
        port,
        "POST",
        "/v1/responses",
        &[&[("content-type", "application/json")], headers].concat(),
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    if body["stream"] == true {
        // Responses events are named: `event: …\ndata: …`.
        let text = response.text();
        let last = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap();
        serde_json::from_str::<Value>(last).unwrap()["response"].clone()
    } else {
        response.json()
    }
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .map(|part| part["text"].as_str().unwrap().to_owned())
        .collect()
}

fn id(response: &Value) -> String {
    response["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_response_id_continues_and_stored_responses_read_back() {
    let upstream = echo_model().await;
    let proxy = Proxy::start(&bot_config(
        &upstream.url(),
        "passthrough: false\nstore: { kind: memory }",
    ))
    .await;
    let port = proxy.port;

    let first = turn(
        port,
        &[],
        json!({"model": "bot", "input": "My name is Ada.", "stream": true}),
    )
    .await;
    assert_eq!(
        (first["store"].clone(), first["status"].clone()),
        (json!(true), json!("completed"))
    );
    let second = turn(
        port,
        &[],
        json!({"model": "bot", "input": "What is my name?", "previous_response_id": id(&first)}),
    )
    .await;
    assert_eq!(
        output_text(&second),
        "seen: My name is Ada.|seen: My name is Ada.|What is my name?",
        "the model got the first turn, its answer, then the new input"
    );
    assert_eq!(second["previous_response_id"], id(&first));
    let third = turn(
        port,
        &[],
        json!({"model": "bot", "input": [{"role": "user", "content": "And again?"}],
               "previous_response_id": id(&second)}),
    )
    .await;
    assert_eq!(
        output_text(&third),
        format!(
            "seen: My name is Ada.|seen: My name is Ada.|What is my name?|{}|And again?",
            output_text(&second)
        ),
        "the whole chain, oldest first"
    );

    // Read back: the very object answered.
    let got = get(port, &format!("/v1/responses/{}", id(&second))).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json(), second);
    let items = get(port, &format!("/v1/responses/{}/input_items", id(&second))).await;
    assert_eq!(items.status, 200, "{}", items.text());
    let items = items.json();
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"].as_array().unwrap().len(), 1, "{items}");
    assert_eq!(items["data"][0]["content"][0]["text"], "What is my name?");
    assert!(items["data"][0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(items["first_id"], items["data"][0]["id"]);
    // A streamed one reads back as its `response.completed` carried it.
    let got = get(port, &format!("/v1/responses/{}", id(&first))).await;
    assert_eq!(got.json(), first);

    // Deleted: gone, and a chain through it is broken.
    let deleted = request(
        port,
        "DELETE",
        &format!("/v1/responses/{}", id(&first)),
        &[],
        b"",
    )
    .await;
    assert_eq!(
        deleted.json(),
        json!({"id": id(&first), "object": "response.deleted", "deleted": true})
    );
    let gone = get(port, &format!("/v1/responses/{}", id(&first))).await;
    assert_eq!(gone.status, 404);
    assert_eq!(gone.json()["error"]["type"], "invalid_request_error");
    let broken = post_json(
        port,
        "/v1/responses",
        &json!({"model": "bot", "input": "more", "previous_response_id": id(&third)}),
    )
    .await;
    assert_eq!(broken.status, 400, "{}", broken.text());
    assert_eq!(
        broken.json()["error"]["code"],
        "previous_response_not_found"
    );

    // `store: false` is answered, not kept.
    let unkept = turn(
        port,
        &[],
        json!({"model": "bot", "input": "hi", "store": false}),
    )
    .await;
    assert_eq!(unkept["store"], false);
    assert_eq!(
        get(port, &format!("/v1/responses/{}", id(&unkept)))
            .await
            .status,
        404
    );
}

/// The Vercel AI SDK, its responses stored, sends an earlier answer's items
/// back as `item_reference`s: each is the kept item it names, as at
/// OpenAI. Skipped, the model lost every turn of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_reference_is_the_kept_item_it_names() {
    let upstream = echo_model().await;
    let proxy = Proxy::start(&bot_config(&upstream.url(), "")).await;
    for stream in [false, true] {
        let first = turn(
            proxy.port,
            &[],
            json!({"model": "bot", "input": "one", "stream": stream}),
        )
        .await;
        let said = first["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["type"] == "message")
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let second = turn(
            proxy.port,
            &[],
            json!({"model": "bot", "stream": stream, "input": [
                {"role": "user", "content": "one"},
                {"type": "item_reference", "id": said},
                {"role": "user", "content": "two"}]}),
        )
        .await;
        assert_eq!(
            output_text(&second),
            "seen: one|seen: one|two",
            "the model saw its own answer between the two"
        );
    }
    // A reference to nothing the store holds is the client's mistake.
    for unknown in ["msg_nothing", "msg_0123456789abcdefghijklmnopqrstuv_0"] {
        let body = json!({"model": "bot", "input": [{"type": "item_reference", "id": unknown}]});
        let res = post_json(proxy.port, "/v1/responses", &body).await;
        assert_eq!(res.status, 400, "{}", res.text());
        assert_eq!(res.json()["error"]["param"], "input");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_is_seen_only_by_its_tenant() {
    let upstream = echo_model().await;
    let keys = "auth:\n  api_keys:\n    - { key: sk-alice, name: alice }\n    - { key: sk-alice-2, name: alice }\n    - { key: sk-bob, name: bob }\n    - sk-carol";
    let proxy = Proxy::start(&bot_config(
        &upstream.url(),
        &format!("passthrough: false\nstore: {{ kind: memory }}\n{keys}"),
    ))
    .await;
    let port = proxy.port;
    let alice = [("authorization", "Bearer sk-alice")];
    let first = turn(
        port,
        &alice,
        json!({"model": "bot", "input": "secret plans"}),
    )
    .await;
    let path = format!("/v1/responses/{}", id(&first));

    for (key, visible) in [
        ("sk-alice", true),
        ("sk-alice-2", true),
        ("sk-bob", false),
        ("sk-carol", false),
    ] {
        let bearer = format!("Bearer {key}");
        let h = [("authorization", bearer.as_str())];
        let got = request(port, "GET", &path, &h, b"").await;
        assert_eq!(got.status == 200, visible, "{key}: {}", got.text());
        if !visible {
            assert!(!got.text().contains("secret"), "{key} sees nothing of it");
            let continued = request(
                port,
                "POST",
                "/v1/responses",
                &[
                    ("authorization", bearer.as_str()),
                    ("content-type", "application/json"),
                ],
                json!({"model": "bot", "input": "tell me", "previous_response_id": id(&first)})
                    .to_string()
                    .as_bytes(),
            )
            .await;
            assert_eq!(continued.status, 400, "{key}: as an id no one holds");
            let deleted = request(port, "DELETE", &path, &h, b"").await;
            assert_eq!(deleted.status, 404, "{key} cannot delete it");
        }
    }
    let still = request(port, "GET", &path, &alice, b"").await;
    assert_eq!(still.status, 200);
}

/// With `passthrough`, a response id the store does not hold is the
/// upstream's: the request goes there as the client sent it, and the
/// connection serves the next request, whichever path takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_id_not_ours_is_the_upstreams_with_passthrough() {
    let upstream = FakeServer::start(|req, _| match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/responses/resp_theirs") => {
            Reply::json(200, json!({"id": "resp_theirs", "object": "response"}))
        }
        ("GET", _) => Reply::json(200, json!({"object": "list", "data": []})),
        _ => Reply::events(vec![content("hello"), finish("stop"), usage(3, 1)]),
    })
    .await;
    let proxy = Proxy::start(&bot_config(
        &upstream.url(),
        "passthrough: true\nstore: { kind: memory }",
    ))
    .await;
    let ours = turn(proxy.port, &[], json!({"model": "bot", "input": "hi"})).await;

    let mut connection =
        Connection::open(proxy.port, "GET", "/v1/responses/resp_theirs", &[], b"").await;
    let theirs = connection.next_response().await;
    assert_eq!(theirs.status, 200, "{}", theirs.text());
    assert_eq!(theirs.json()["id"], "resp_theirs");
    let host = format!("Host: 127.0.0.1:{}", proxy.port);
    for path in [format!("/v1/responses/{}", id(&ours)), "/v1/files".into()] {
        let next = format!("GET {path} HTTP/1.1\r\n{host}\r\n\r\n");
        connection.send(next.as_bytes()).await.unwrap();
        let answer = connection.next_response().await;
        assert_eq!(answer.status, 200, "{path} on the same connection");
    }
    let asked: Vec<String> = upstream.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        asked[1..],
        [
            "/v1/responses/resp_theirs".to_owned(),
            "/v1/files".to_owned()
        ],
        "the stored response is answered by the proxy, the others by the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_sqlite_store_keeps_conversations_across_a_restart() {
    let upstream = echo_model().await;
    let dir = scratch_dir();
    let port = free_port();
    let config = dir.join("proxy.yaml");
    // No `store:` at all: SQLite in a file beside the config.
    std::fs::write(&config, with_listen(port, &bot_config(&upstream.url(), ""))).unwrap();
    let mut proxy = Proxy::launch(dir.clone(), &config, port, &[], &[]).await;
    let first = turn(port, &[], json!({"model": "bot", "input": "Remember 42."})).await;
    let path = format!("/v1/responses/{}", id(&first));
    // A rollout's SIGTERM: the write handed over at the answer's end lands
    // before the process exits.
    proxy.signal("TERM");
    assert!(proxy.wait_exit(Duration::from_secs(10)).await.is_some());
    assert!(dir.join("agent-proxy.sqlite3").is_file());

    let proxy = Proxy::launch(dir.clone(), &config, port, &[], &[]).await;
    let second = turn(
        proxy.port,
        &[],
        json!({"model": "bot", "input": "What number?", "previous_response_id": id(&first)}),
    )
    .await;
    assert_eq!(
        output_text(&second),
        "seen: Remember 42.|seen: Remember 42.|What number?"
    );
    assert_eq!(get(port, &path).await.json(), first);
}

/// The value of a counter line of `/metrics`, 0 when absent.
async fn metric(port: u16, line_start: &str) -> u64 {
    let text = get(port, "/metrics").await.text();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_continue_each_others_conversations_through_redis_and_outlive_its_outage() {
    let mut redis = RedisServer::start().await;
    let upstream = echo_model().await;
    let config = bot_config(
        &upstream.url(),
        &format!("store: {{ kind: redis, url: \"{}\" }}", redis.url()),
    );
    let (a, b) = (Proxy::start(&config).await, Proxy::start(&config).await);

    let first = turn(
        a.port,
        &[],
        json!({"model": "bot", "input": "I live in Oslo."}),
    )
    .await;
    let second = turn(
        b.port,
        &[],
        json!({"model": "bot", "input": "Where do I live?", "previous_response_id": id(&first),
               "stream": true}),
    )
    .await;
    assert_eq!(
        output_text(&second),
        "seen: I live in Oslo.|seen: I live in Oslo.|Where do I live?",
        "replica B continued replica A's conversation"
    );
    let read = get(a.port, &format!("/v1/responses/{}", id(&second))).await;
    assert_eq!(read.json(), second, "and A reads B's answer");

    redis.kill();
    // What does not need the store keeps working: a stateless turn, and a
    // kept one (its write fails, logged and counted).
    let writes_failed = "agent_proxy_store_errors_total{op=\"write\"}";
    let before = metric(a.port, writes_failed).await;
    let stateless = turn(
        a.port,
        &[],
        json!({"model": "bot", "input": "hi", "store": false}),
    )
    .await;
    assert_eq!(output_text(&stateless), "seen: hi");
    let started = Instant::now();
    let kept = turn(
        a.port,
        &[],
        json!({"model": "bot", "input": "hello", "stream": true}),
    )
    .await;
    assert_eq!(kept["status"], "completed");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the answer does not wait on the store"
    );
    let counted = wait_until(Duration::from_secs(10), || async {
        metric(a.port, writes_failed).await > before
    })
    .await;
    assert!(counted, "the failed write is counted");
    // What needs it gets a clear 503.
    let needs = post_json(
        a.port,
        "/v1/responses",
        &json!({"model": "bot", "input": "more", "previous_response_id": id(&second)}),
    )
    .await;
    assert_eq!(needs.status, 503, "{}", needs.text());
    assert_eq!(needs.json()["error"]["code"], "store_unavailable");
    let read = get(b.port, &format!("/v1/responses/{}", id(&second))).await;
    assert_eq!(read.status, 503);

    // Redis back (empty, as a restarted one without persistence is): the
    // first write and the first read after it work, on both replicas. Each
    // replica's connection learned of the restart only from a command.
    let _redis = RedisServer::start_on(redis.port).await;
    let again = turn(
        a.port,
        &[],
        json!({"model": "bot", "input": "I moved to Bergen."}),
    )
    .await;
    let after = post_json(
        b.port,
        "/v1/responses",
        &json!({"model": "bot", "input": "Where now?", "previous_response_id": id(&again)}),
    )
    .await;
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(
        output_text(&after.json()),
        "seen: I moved to Bergen.|seen: I moved to Bergen.|Where now?"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_requests_after_redis_restarts_are_served() {
    // A restart that no request saw: the replica's connection learns of it
    // from the next command only, which went out on the closed connection.
    let mut redis = RedisServer::start().await;
    let upstream = echo_model().await;
    let config = bot_config(
        &upstream.url(),
        &format!(
            "store: {{ kind: redis, url: \"{}\" }}\npassthrough: false",
            redis.url()
        ),
    );
    let proxy = Proxy::start(&config).await;
    let first = turn(
        proxy.port,
        &[],
        json!({"model": "bot", "input": "I live in Oslo."}),
    )
    .await;
    // In Redis (not just this replica's pending write): another replica
    // reads it.
    let other = Proxy::start(&config).await;
    let written = wait_until(Duration::from_secs(10), || async {
        get(other.port, &format!("/v1/responses/{}", id(&first)))
            .await
            .status
            == 200
    })
    .await;
    assert!(written, "the answer reached Redis");
    redis.kill();
    let _redis = RedisServer::start_on(redis.port).await;
    // Gone with the restart (no persistence): not found, not unavailable.
    let read = get(proxy.port, &format!("/v1/responses/{}", id(&first))).await;
    assert_eq!(read.status, 404, "{}", read.text());
    let again = turn(
        proxy.port,
        &[],
        json!({"model": "bot", "input": "Bergen now."}),
    )
    .await;
    let read = get(proxy.port, &format!("/v1/responses/{}", id(&again))).await;
    assert_eq!(read.status, 200, "{}", read.text());
}

/// A replica that answers with its own name.
async fn named_replica(name: &'static str) -> FakeServer {
    FakeServer::start(move |_, _| Reply::events(vec![content(name), finish("stop")])).await
}

/// The `bot` agent on a pool of two [`named_replica`]s balanced by
/// `balance`, with a memory store.
async fn two_replica_proxy(balance: &str) -> (Proxy, [FakeServer; 2]) {
    let replicas = [named_replica("A").await, named_replica("B").await];
    let endpoints: Vec<String> = replicas
        .iter()
        .map(|r| format!("\"{}/v1\"", r.url()))
        .collect();
    let config = format!(
        "default_upstream: pool\nupstreams:\n  pool:\n    endpoints: [{}]\n    balance: {balance}\n\
         agents:\n  bot: {{}}\nstore: {{ kind: memory }}\n",
        endpoints.join(", ")
    );
    (Proxy::start(&config).await, replicas)
}

/// The share of turns (after each conversation's first) served by the
/// replica that served the turn before, over `conversations` conversations
/// of `turns` turns chained by `previous_response_id`.
async fn same_replica_share(balance: &str, conversations: usize, turns: usize) -> f64 {
    let (proxy, _replicas) = two_replica_proxy(balance).await;
    let (mut same, mut later) = (0, 0);
    for c in 0..conversations {
        let mut previous: Option<String> = None;
        let mut last = String::new();
        for t in 0..turns {
            let mut body = json!({"model": "bot", "input": format!("conversation {c}, turn {t}")});
            if let Some(previous) = &previous {
                body["previous_response_id"] = json!(previous);
            }
            let answer = turn(proxy.port, &[], body).await;
            let served = output_text(&answer);
            if t > 0 {
                later += 1;
                same += usize::from(served == last);
            }
            last = served;
            previous = Some(id(&answer));
        }
    }
    same as f64 / later as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversations_turns_stay_on_one_replica() {
    let on = same_replica_share("prefix_affinity", 12, 3).await;
    let off = same_replica_share("round_robin", 12, 3).await;
    println!("turns on the previous turn's replica: affinity on {on:.2}, off {off:.2}");
    assert_eq!(on, 1.0, "every later turn on its conversation's replica");

    // A client's session key does it for a stateless client too.
    let (proxy, _replicas) = two_replica_proxy("prefix_affinity").await;
    let mut homes = BTreeSet::new();
    // Replicas are ranked per key by a hash that includes their (ephemeral)
    // ports: with 16 sessions, all on one replica has odds of 2 in 65,536.
    for session in 0..16 {
        let key = format!("session-{session}");
        let mut seen = BTreeSet::new();
        for t in 0..3 {
            // Each turn's first message differs: only the key ties them.
            let body = json!({"model": "bot", "input": format!("turn {t} of {key}"),
                              "prompt_cache_key": key, "store": false});
            seen.insert(output_text(&turn(proxy.port, &[], body).await));
        }
        assert_eq!(seen.len(), 1, "{key} moved: {seen:?}");
        homes.extend(seen);
    }
    assert_eq!(homes.len(), 2, "sessions spread over both replicas");
}

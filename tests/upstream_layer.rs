//! The one upstream layer: both ways out (the agent loop over the proxy's own
//! client, other endpoints over pingora's proxy path) fail over and retry by
//! the same policy; a reload keeps the runtime of every upstream and MCP
//! server whose spec did not change.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A replica that names itself (and the system prompt it got) in every
/// answer; its health check passes when `healthy`.
async fn replica(name: &'static str, healthy: bool) -> FakeServer {
    FakeServer::start(move |req, _| match req.path.as_str() {
        "/health" if healthy => Reply::json(200, json!({"status": "ok"})),
        "/health" => Reply::json(503, json!({"status": "loading model"})),
        "/v1/embeddings" => Reply::json(200, json!({"replica": name})),
        _ => {
            let body = req.json();
            let system = body["messages"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["role"] == "system"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_owned();
            Reply::events(vec![content(&format!("{name}:{system}")), finish("stop")])
        }
    })
    .await
}

fn ask() -> Value {
    json!({"model": "bot", "messages": [{"role": "user", "content": "hi"}]})
}

/// An agent's answer, or the error status.
async fn agent_answer(port: u16) -> Result<String, u16> {
    let res = post_json(port, "/v1/chat/completions", &ask()).await;
    match res.status {
        200 => Ok(res.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()),
        status => Err(status),
    }
}

fn health_checks(server: &FakeServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.path == "/health")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_only_an_agent_keeps_a_pools_ejected_replica_out() {
    let (a, b) = (replica("A", true).await, replica("B", false).await);
    let config = |prompt: &str| {
        format!(
            "default_upstream: pool\nupstreams:\n  pool:\n    endpoints: [\"{}/v1\", \"{}/v1\"]\n    health_check: {{ path: /health, interval_ms: 200, timeout_ms: 300 }}\nagents:\n  bot: {{ system_prompt: \"{prompt}\" }}\n",
            a.url(),
            b.url()
        )
    };
    let proxy = Reloadable::start(&config("before")).await;
    let ejected = wait_until(Duration::from_secs(10), || {
        std::future::ready(proxy.proxy.logs().contains("endpoint unhealthy"))
    })
    .await;
    assert!(
        ejected,
        "B never left the rotation:\n{}",
        proxy.proxy.logs()
    );
    for _ in 0..4 {
        assert_eq!(agent_answer(proxy.port()).await, Ok("A:before".into()));
    }

    proxy.reload(&config("after")).await;
    let checks = health_checks(&b);
    // A rebuilt pool would start with B healthy again, taking every other
    // request until two checks failed anew.
    for _ in 0..10 {
        assert_eq!(
            agent_answer(proxy.port()).await,
            Ok("A:after".into()),
            "the reloaded config serves, from A only"
        );
    }
    let checked = wait_until(Duration::from_secs(10), || {
        std::future::ready(health_checks(&b) >= checks + 3)
    })
    .await;
    assert!(checked, "the health checker kept checking B");
    let logs = proxy.proxy.logs();
    assert_eq!(
        logs.matches("endpoint unhealthy").count(),
        1,
        "B was never back in rotation to be ejected again:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_keeps_its_process_across_a_reload_until_its_own_spec_changes() {
    // Calls the tool the user names, then answers with its result.
    let upstream = FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        if let Some(result) = req.tool_results().first() {
            return Reply::events(vec![content(result), finish("stop")]);
        }
        Reply::events(vec![
            tool_call(0, "c", "demo__pid", "{}"),
            finish("tool_calls"),
        ])
    })
    .await;
    let config = |prompt: &str, timeout_ms: u32| {
        format!(
            "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\" }} }}\nmcp_servers:\n  demo: {{ command: [\"{}\", stdio], timeout_ms: {timeout_ms} }}\nagents:\n  bot: {{ tools: [\"demo/*\"], system_prompt: \"{prompt}\" }}\n",
            upstream.url(),
            demo_server().display()
        )
    };
    let proxy = Reloadable::start(&config("before", 5000)).await;
    wait_connected(&proxy.proxy, "demo").await;
    let pid = || async { agent_answer(proxy.port()).await.unwrap_or_default() };
    let first = pid().await;
    assert!(first.parse::<u32>().is_ok(), "the server's pid: {first}");

    proxy.reload(&config("after", 5000)).await;
    assert_eq!(pid().await, first, "the same process serves the new config");
    assert!(
        upstream
            .requests()
            .last()
            .is_some_and(|r| r.body.windows(5).any(|w| w == b"after")),
        "the call was made under the new config"
    );

    proxy.reload(&config("after", 6000)).await;
    // Until the new server connects, the tool's result is an error.
    let (now, pid) = (&std::cell::RefCell::new(String::new()), &pid);
    let restarted = wait_until(Duration::from_secs(30), move || async move {
        *now.borrow_mut() = pid().await;
        now.borrow().parse::<u32>().is_ok()
    })
    .await;
    let now = now.borrow().clone();
    assert!(restarted, "no server for the new spec: {now}");
    assert_ne!(now, first, "a server with a changed spec is a new process");
    let gone = wait_until(Duration::from_secs(10), || {
        std::future::ready(!std::path::Path::new(&format!("/proc/{first}")).exists())
    })
    .await;
    assert!(gone, "the old server's process {first} stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_dropped_from_the_config_ends_with_what_it_started() {
    let upstream =
        FakeServer::start(|_, _| Reply::json(200, json!({"object": "list", "data": []}))).await;
    let dir = scratch_dir();
    let (pids, said) = (dir.join("pids"), dir.join("said"));
    // The server as `npx` runs one: a process of its own that started
    // another. Once its stdin closes, it takes 200 ms to put its state away
    // (and says whether a SIGTERM came meanwhile); what it started runs on
    // until the group is told to end. `$$$$` is the config's escape of the
    // shell's `$$`.
    let script = format!(
        "trap 'echo terminated >> {said}' TERM; sleep 300 & echo $$$$ $$! > {}; {} stdio; sleep 0.2; echo put away >> {said}",
        pids.display(),
        demo_server().display(),
        said = said.display(),
    );
    let config = |servers: &str| {
        format!(
            "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\" }} }}\nmcp_servers: {{ {servers} }}\nagents:\n  bot: {{}}\n",
            upstream.url()
        )
    };
    let proxy = Reloadable::start(&config(&format!(
        "demo: {{ command: [sh, -c, \"{script}\"] }}"
    )))
    .await;
    wait_connected(&proxy.proxy, "demo").await;
    let started = wait_pids(&pids).await;

    proxy.reload(&config("")).await;
    let ended = all_gone(&started, Duration::from_secs(10)).await;
    assert!(
        ended,
        "the server and what it started {started:?} ended:\n{}",
        proxy.proxy.logs()
    );
    assert_eq!(
        std::fs::read_to_string(&said).unwrap_or_default(),
        "put away\n",
        "the server had its time after its stdin closed, before any SIGTERM"
    );
}

/// `agent_proxy_upstream_errors_total` for a refused connection to `pool`.
async fn refusals(port: u16) -> u64 {
    let text = get(port, "/metrics").await.text();
    text.lines()
        .find_map(|line| {
            line.strip_prefix(
                r#"agent_proxy_upstream_errors_total{kind="ConnectRefused",upstream="pool"} "#,
            )
        })
        .map_or(0, |n| n.parse().unwrap())
}

/// How many of `n` requests on each path failed, and the refused attempts
/// each path counted.
async fn failures_per_path(port: u16, n: usize) -> [(usize, u64); 2] {
    let mut outcome = [(0, 0); 2];
    for (path, counted) in outcome.iter_mut().enumerate() {
        let before = refusals(port).await;
        for _ in 0..n {
            let status = if path == 0 {
                agent_answer(port).await.err().unwrap_or(200)
            } else {
                let res = post_json(port, "/v1/embeddings", &json!({"input": "x"})).await;
                assert!(res.status != 200 || res.json()["replica"] == "L");
                res.status
            };
            assert!(matches!(status, 200 | 502), "{status}");
            counted.0 += usize::from(status == 502);
        }
        counted.1 = refusals(port).await - before;
    }
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_paths_fail_over_from_refused_replicas_and_obey_the_same_retries() {
    let live = replica("L", true).await;
    let (dead1, dead2) = (free_port(), free_port());
    let config = |retries: u32| {
        format!(
            "default_upstream: pool\nupstreams:\n  pool:\n    endpoints: [\"http://127.0.0.1:{dead1}/v1\", \"http://127.0.0.1:{dead2}/v1\", \"{}/v1\"]\n    health_check: {{ enabled: false }}\n    retries: {retries}\nagents:\n  bot: {{}}\n",
            live.url()
        )
    };
    // Round robin: of 6 requests, 2 start on each replica. With 2 retries
    // every request reaches L; with 1, those that start on the first dead
    // replica fail (2 refusals each); with none, all that start on a dead one.
    let proxy = Reloadable::start(&config(2)).await;
    let expected = [(2, (0, 6)), (1, (2, 6)), (0, (4, 4))];
    for (retries, (failed, refused)) in expected {
        if retries != 2 {
            proxy.reload(&config(retries)).await;
        }
        let [agent, proxy_path] = failures_per_path(proxy.port(), 6).await;
        assert_eq!(
            agent,
            (failed, refused),
            "agent path, retries: {retries} (failed, refused attempts)"
        );
        assert_eq!(
            proxy_path, agent,
            "proxy path as the agent path, retries: {retries}"
        );
    }
}

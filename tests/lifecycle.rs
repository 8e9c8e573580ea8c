//! Hot reload under load, and graceful shutdown that drains live streams.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// An upstream that streams the system prompt it was given back, slowly, so
/// each answer shows which config served it and spans a reload.
async fn echo_prompt_upstream(events: usize, gap: Duration) -> FakeServer {
    FakeServer::start(move |req, _| {
        let prompt = req.json()["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut steps = vec![Step::Bytes(
            format!("data: {}\n\n", content(&prompt)).into_bytes(),
        )];
        for _ in 1..events {
            steps.push(Step::Sleep(gap));
            steps.push(Step::Bytes(
                format!("data: {}\n\n", content(".")).into_bytes(),
            ));
        }
        steps.push(Step::Bytes(
            format!("data: {}\n\ndata: [DONE]\n\n", finish("stop")).into_bytes(),
        ));
        Reply::Sse {
            steps,
            complete: true,
        }
    })
    .await
}

fn config(upstream: &FakeServer, generation: u32) -> String {
    let extra = if generation.is_multiple_of(2) {
        "  extra: { description: even }\n"
    } else {
        ""
    };
    format!(
        "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\" }} }}\nagents:\n  bot: {{ system_prompt: \"gen-{generation}\" }}\n{extra}",
        upstream.url()
    )
}

/// Replaces the file atomically, as editors and config managers do.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn ask() -> Value {
    json!({"model": "bot", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

async fn model_ids(port: u16) -> Vec<String> {
    get(port, "/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

/// `agent_proxy_config_reloads_total` for `result` (`ok`, `failed`).
async fn reloads(port: u16, result: &str) -> u64 {
    let line = format!("agent_proxy_config_reloads_total{{result=\"{result}\"}} ");
    get(port, "/metrics")
        .await
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the proxy has counted `n` reloads with `result`.
async fn wait_reloads(port: u16, result: &str, n: u64) {
    let counted = wait_until(Duration::from_secs(10), || async move {
        reloads(port, result).await >= n
    })
    .await;
    assert!(
        counted,
        "{n} reloads {result}: {}",
        reloads(port, result).await
    );
}

/// Waits until some answer came from config `generation`: each generation
/// serves part of the load before the next replaces it.
async fn served(answers: &Mutex<Vec<String>>, generation: u32) {
    let prefix = format!("gen-{generation}");
    let seen = wait_until(Duration::from_secs(10), || {
        std::future::ready(
            answers
                .lock()
                .unwrap()
                .iter()
                .any(|a| a.starts_with(&prefix)),
        )
    })
    .await;
    assert!(seen, "no answer from {prefix}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_under_load_fail_no_request_and_reject_invalid_configs() {
    let upstream = echo_prompt_upstream(4, Duration::from_millis(40)).await;
    let dir = scratch_dir();
    let port = free_port();
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, with_listen(port, &config(&upstream, 1))).unwrap();
    let proxy = Proxy::launch(dir, &path, port, &[], &["--reload-poll-ms", "50"]).await;

    let answers = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (answers, stop) = (answers.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let res = post_json(port, "/v1/chat/completions", &ask()).await;
                    assert_eq!(res.status, 200, "{}", res.text());
                    assert!(res.complete && res.ends_with_done(), "{}", res.text());
                    answers.lock().unwrap().push(res.delta_text("content"));
                }
            })
        })
        .collect();
    served(&answers, 1).await;
    let mut ok = 0;
    for generation in 2..=6 {
        write_atomically(&path, &with_listen(port, &config(&upstream, generation)));
        ok += 1;
        wait_reloads(port, "ok", ok).await;
        if generation == 4 {
            write_atomically(&path, &with_listen(port, "agents: [this is not a config"));
            wait_reloads(port, "failed", 1).await;
            assert_eq!(
                post_json(port, "/v1/chat/completions", &ask()).await.status,
                200,
                "the old config keeps serving"
            );
            write_atomically(&path, &with_listen(port, &config(&upstream, generation)));
            ok += 1;
            wait_reloads(port, "ok", ok).await;
        }
        served(&answers, generation).await;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    assert!(answers.iter().all(|a| a.starts_with("gen-")), "{answers:?}");

    assert_eq!(
        model_ids(port).await,
        ["bot", "extra"],
        "generation 6 has the extra agent"
    );
    let res = post_json(port, "/v1/chat/completions", &ask()).await;
    assert!(res.delta_text("content").starts_with("gen-6"));
    assert_eq!(reloads(port, "ok").await, 6, "one reload per change");
    assert_eq!(reloads(port, "failed").await, 1);
    assert!(proxy.logged(&["config reload rejected"]).await);
}

#[tokio::test]
async fn a_configmap_symlink_swap_is_picked_up() {
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    let dir = scratch_dir();
    let port = free_port();
    // The layout kubelet writes for a mounted ConfigMap.
    let first = dir.join("..2026_11_21_first");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(
        first.join("proxy.yaml"),
        with_listen(port, &config(&upstream, 1)),
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_11_21_first", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/proxy.yaml", dir.join("proxy.yaml")).unwrap();
    let proxy = Proxy::launch(
        dir.clone(),
        &dir.join("proxy.yaml"),
        port,
        &[],
        &["--reload-poll-ms", "50"],
    )
    .await;
    assert_eq!(model_ids(port).await, ["bot"]);

    let second = dir.join("..2026_11_21_second");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(
        second.join("proxy.yaml"),
        with_listen(port, &config(&upstream, 2)),
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_11_21_second", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    while model_ids(port).await != ["bot", "extra"] {
        assert!(
            Instant::now() < deadline,
            "the swap was not picked up:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sighup_reloads() {
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    let dir = scratch_dir();
    let port = free_port();
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, with_listen(port, &config(&upstream, 1))).unwrap();
    // Polling effectively off: only the signal can reload.
    let proxy = Proxy::launch(dir, &path, port, &[], &["--reload-poll-ms", "3600000"]).await;
    std::fs::write(&path, with_listen(port, &config(&upstream, 2))).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(model_ids(port).await, ["bot"]);
    proxy.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while model_ids(port).await != ["bot", "extra"] {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_live_stream_then_exits_at_once() {
    let upstream = echo_prompt_upstream(20, Duration::from_millis(100)).await;
    let mut proxy =
        Proxy::start_with(&config(&upstream, 1), &[], &["--shutdown-grace", "60"]).await;
    let mut conn = Connection::chat(proxy.port, &ask()).await;
    let mut res = conn.head().await;
    assert_eq!(res.status, 200);
    let first = conn.next_chunk(&mut res).await.expect("the stream started");
    res.body.extend_from_slice(&first);
    let signalled = Instant::now();
    proxy.signal("TERM");
    let port = proxy.port;
    let refused = wait_until(Duration::from_secs(10), || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    })
    .await;
    assert!(refused, "new connections are refused while draining");
    while let Some(chunk) = conn.next_chunk(&mut res).await {
        res.body.extend_from_slice(&chunk);
    }
    assert!(
        res.complete && res.ends_with_done(),
        "the live stream finished: {}",
        res.text()
    );
    let status = proxy
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("exited after the last stream");
    assert!(status.success(), "{status:?}");
    // 60 s of grace were allowed; the process left with the stream (~2 s).
    assert!(signalled.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_idle_keep_alive_connections_while_streams_drain() {
    let upstream = echo_prompt_upstream(30, Duration::from_millis(100)).await;
    let mut proxy =
        Proxy::start_with(&config(&upstream, 1), &[], &["--shutdown-grace", "60"]).await;
    // A keep-alive connection at rest after its answer (75 s of keep-alive
    // left), and one whose stream keeps the process draining for 3 s.
    let mut idle = Connection::open(proxy.port, "GET", "/healthz", &[], b"").await;
    let answer = idle.next_response().await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let mut live = Connection::chat(proxy.port, &ask()).await;
    let mut res = live.head().await;
    live.next_chunk(&mut res).await.expect("the stream started");
    proxy.signal("TERM");
    assert!(
        idle.closed_within(Duration::from_secs(2)).await,
        "the idle connection is closed as the shutdown begins"
    );
    while let Some(chunk) = live.next_chunk(&mut res).await {
        res.body.extend_from_slice(&chunk);
    }
    assert!(res.complete && res.ends_with_done(), "{}", res.text());
    assert!(proxy.wait_exit(Duration::from_secs(10)).await.is_some());
}

/// An answer written once the shutdown began says its connection closes
/// after it (as nginx's does): a pooled client would send its next request
/// on the connection and lose it to the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_written_during_a_drain_says_connection_close() {
    let upstream = echo_prompt_upstream(10, Duration::from_millis(100)).await;
    let mut proxy =
        Proxy::start_with(&config(&upstream, 1), &[], &["--shutdown-grace", "60"]).await;
    // Answered whole after about a second: the shutdown begins meanwhile.
    let mut whole = ask();
    whole["stream"] = json!(false);
    let body = whole.to_string();
    let headers = [("content-type", "application/json")];
    let mut conn = Connection::open(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.as_bytes(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.signal("TERM");
    let answer = conn.next_response().await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(proxy.wait_exit(Duration::from_secs(10)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_exits_at_once_cutting_live_streams() {
    // Twenty seconds of stream and a minute of grace: neither is waited for.
    let upstream = echo_prompt_upstream(200, Duration::from_millis(100)).await;
    let mut proxy =
        Proxy::start_with(&config(&upstream, 1), &[], &["--shutdown-grace", "60"]).await;
    let mut conn = Connection::chat(proxy.port, &ask()).await;
    let mut res = conn.head().await;
    conn.next_chunk(&mut res).await.expect("the stream started");
    proxy.signal("INT");
    assert!(
        proxy.wait_exit(Duration::from_secs(10)).await.is_some(),
        "the process left without draining"
    );
    while conn.next_chunk(&mut res).await.is_some() {}
    assert!(!res.complete, "the live stream was cut");
}

/// A stdio MCP server that never answers its handshake (one still
/// starting, as `npx` is for seconds), and a process it started in turn:
/// their pids, once both run, and the file where the server writes
/// `terminated` on SIGTERM.
async fn proxy_with_a_starting_mcp_server(upstream: &FakeServer) -> (Proxy, Vec<u32>, PathBuf) {
    let dir = scratch_dir();
    let (pids, said) = (dir.join("pids"), dir.join("said"));
    let script = format!(
        // `$$$$` is the config's escape of the shell's `$$`.
        "trap 'echo terminated > {}; exit 0' TERM; sleep 300 & echo $$$$ $$! > {}; while :; do sleep 0.05; done",
        said.display(),
        pids.display()
    );
    let yaml = format!(
        "{}mcp_servers:\n  starting: {{ command: [sh, -c, \"{script}\"] }}\n",
        config(upstream, 1)
    );
    let proxy = Proxy::start(&yaml).await;
    let children = wait_pids(&pids).await;
    (proxy, children, said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_processes_end_with_the_proxy() {
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    // SIGTERM's drain and SIGINT's fast exit both leave by `exit`, which
    // drops no connection: the server and what it started end anyway, the
    // server told to (SIGTERM), not killed.
    for signal in ["TERM", "INT"] {
        let (mut proxy, children, said) = proxy_with_a_starting_mcp_server(&upstream).await;
        proxy.signal(signal);
        assert!(
            proxy.wait_exit(Duration::from_secs(10)).await.is_some(),
            "SIG{signal}: the proxy exited"
        );
        let ended = all_gone(&children, Duration::from_secs(5)).await;
        assert!(
            ended,
            "SIG{signal}: the MCP server's processes {children:?} ended with the proxy"
        );
        assert_eq!(
            std::fs::read_to_string(&said).unwrap_or_default(),
            "terminated\n",
            "SIG{signal}: the server had its SIGTERM"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_a_connected_mcp_server_as_mcp_says_before_the_exit() {
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    // Also after a reload that kept the server: it is started again with
    // the new config, and the drain still waits for its close.
    for reloaded in [false, true] {
        let dir = scratch_dir();
        let said = dir.join("said");
        // A connected server that puts its state away once its stdin
        // closes, and says whether a SIGTERM came first.
        let script = format!(
            "trap 'echo terminated >> {said}' TERM; {} stdio; echo put away >> {said}",
            demo_server().display(),
            said = said.display(),
        );
        let yaml = |generation| {
            format!(
                "{}mcp_servers:\n  demo: {{ command: [sh, -c, \"{script}\"] }}\n",
                config(&upstream, generation)
            )
        };
        let mut proxy = reload::Reloadable::start(&yaml(1)).await;
        wait_connected(&proxy.proxy, "demo").await;
        if reloaded {
            proxy.reload(&yaml(2)).await;
            wait_connected(&proxy.proxy, "demo").await;
        }
        proxy.proxy.signal("TERM");
        assert!(
            proxy
                .proxy
                .wait_exit(Duration::from_secs(10))
                .await
                .is_some(),
            "the proxy exited"
        );
        let put_away = wait_until(Duration::from_secs(5), || {
            std::future::ready(std::fs::read_to_string(&said).is_ok_and(|s| s.ends_with('\n')))
        })
        .await;
        assert!(
            put_away,
            "reloaded {reloaded}: the server ended:\n{}",
            proxy.proxy.logs()
        );
        assert_eq!(
            std::fs::read_to_string(&said).unwrap_or_default(),
            "put away\n",
            "reloaded {reloaded}: its stdin closed, the server ended by itself, before any signal"
        );
    }
}

/// The processes whose parent is `parent`, running or not yet reaped.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|process| {
            let pid = process.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(process.path().join("stat")).ok()?;
            let mut fields = stat.rsplit_once(')')?.1.split_ascii_whitespace();
            let ppid = fields.nth(1)?.parse::<u32>().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_a_containers_first_process_it_reaps_what_its_commands_leave_behind() {
    // Each call of `leaver` leaves a process running in the background, killed
    // with the command's group at the call's end; its parent gone, it is the
    // init's of its PID namespace to reap. In a container with no init in
    // front, that is the proxy.
    let upstream =
        calls_then_echo_results(vec![("leaver", "{}"), ("leaver", "{}"), ("failer", "{}")]).await;
    let yaml = one_upstream(
        &upstream.url(),
        "tools:\n  leaver: { command: { argv: [sh, -c, \"sleep 60 </dev/null >/dev/null 2>&1 & echo left\"] } }\n  failer: { command: { argv: [sh, -c, \"exit 3\"] } }\nagents:\n  a: { tools: [leaver, failer] }",
    );
    // A PID namespace of its own (a user namespace too, so that it needs no
    // root), whose first process the proxy is.
    let unshare = [
        "unshare",
        "--map-root-user",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
    ];
    let allowed = std::process::Command::new(unshare[0])
        .args(&unshare[1..])
        .arg("true")
        .status()
        .is_ok_and(|status| status.success());
    if !allowed {
        // Some hosts forbid user namespaces (Ubuntu's AppArmor default,
        // Docker's seccomp profile): this machine cannot make a PID 1.
        eprintln!("SKIPPED: `unshare` cannot make a PID namespace here");
        return;
    }
    let proxy = Proxy::start_wrapped(&unshare, &yaml).await;
    let init = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", proxy.pid()))
        .unwrap()
        .trim()
        .parse::<u32>()
        .expect("unshare started the proxy");
    let ask = json!({"model": "a", "messages": [{"role": "user", "content": "go"}]});
    for _ in 0..3 {
        let res = post_json(proxy.port, "/v1/chat/completions", &ask).await;
        assert_eq!(res.status, 200, "{}", res.text());
        // The commands' own ends are still the proxy's to read.
        assert_eq!(
            echoed_results(&res.json()),
            ["left\n", "left\n", "error: exit status: 3\n"],
            "{}",
            res.text()
        );
    }
    // Six processes were left behind and killed: none is left, not even
    // a zombie (nor are the commands themselves, which tokio reaped).
    let reaped = wait_until(Duration::from_secs(5), || {
        std::future::ready(children_of(init).is_empty())
    })
    .await;
    assert!(
        reaped,
        "what the commands left behind was reaped: {:?}",
        children_of(init)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_period_bounds_a_drain() {
    let upstream = echo_prompt_upstream(100, Duration::from_millis(100)).await;
    let mut proxy = Proxy::start_with(&config(&upstream, 1), &[], &["--shutdown-grace", "1"]).await;
    let mut conn = Connection::chat(proxy.port, &ask()).await;
    let mut res = conn.head().await;
    conn.next_chunk(&mut res).await.expect("the stream started");
    proxy.signal("TERM");
    while conn.next_chunk(&mut res).await.is_some() {}
    assert!(
        !res.complete,
        "a stream longer than the grace period is cut"
    );
    assert!(proxy.wait_exit(Duration::from_secs(10)).await.is_some());
    // Cut requests write no request line: the drain says it cut them.
    let logs = proxy.logs();
    assert!(
        logs.contains("grace period over: the requests still in flight are cut"),
        "{logs}"
    );
    // One stream, counted once (a connection's first request counted
    // twice: at the accept and as a request).
    assert!(
        logs.contains("shutting down: draining in_flight=1"),
        "{logs}"
    );
    assert!(logs.contains("are cut in_flight=1"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_accepted_before_a_shutdown_gets_its_first_request_answered() {
    use tokio::io::AsyncWriteExt;
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    let mut proxy =
        Proxy::start_with(&config(&upstream, 1), &[], &["--shutdown-grace", "10"]).await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .unwrap();
    // Accepted, then the shutdown begins before the client's request.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.signal("TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let body = ask().to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut conn = Connection::on(stream);
    let mut res = conn.head().await;
    while conn.next_chunk(&mut res).await.is_some() {}
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(res.complete, "the answer was cut");
    assert_eq!(
        res.header("connection"),
        Some("close"),
        "an answer given while draining closes its connection"
    );
    assert!(
        proxy.wait_exit(Duration::from_secs(10)).await.is_some(),
        "the process left once the request was answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_upgrade_hands_over_the_sockets_without_refusing_a_request() {
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    let dir = scratch_dir();
    let port = free_port();
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, with_listen(port, &config(&upstream, 1))).unwrap();
    let sock = dir.join("upgrade.sock");
    let sock = sock.to_str().unwrap();
    let mut old = Proxy::launch(dir.join("old"), &path, port, &[], &["--upgrade-sock", sock]).await;

    let statuses = Arc::new(Mutex::new(Vec::new()));
    let traffic = {
        let statuses = statuses.clone();
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(8);
            while Instant::now() < until {
                let status = post_json(port, "/v1/chat/completions", &ask()).await.status;
                statuses.lock().unwrap().push(status);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let flowing = wait_until(Duration::from_secs(10), || {
        std::future::ready(statuses.lock().unwrap().len() >= 5)
    })
    .await;
    assert!(flowing, "the old process serves the traffic");
    // The new binary waits on the socket for the old one's listeners.
    let _new = Proxy::launch(
        dir.join("new"),
        &path,
        port,
        &[],
        &["--upgrade", "--upgrade-sock", sock],
    )
    .await;
    old.signal("QUIT");
    traffic.await.unwrap();
    let statuses = statuses.lock().unwrap().clone();
    assert!(statuses.len() > 50);
    assert!(
        statuses.iter().all(|&s| s == 200),
        "every request answered: {statuses:?}"
    );
    let status = old
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the old process left");
    assert!(status.success());
    assert_eq!(
        post_json(port, "/v1/chat/completions", &ask()).await.status,
        200,
        "the new one serves"
    );
}

/// The `/proc` directories of the proxy's worker threads: pingora names
/// them after the service, as the process is named; the main thread (whose
/// id is the process's) only waits.
fn workers(pid: u32) -> Vec<std::path::PathBuf> {
    let mut workers: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|task| task.unwrap().path())
        .filter(|task| {
            let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            name.trim() == "agent-proxy" && !task.ends_with(pid.to_string())
        })
        .collect();
    workers.sort();
    workers
}

/// CPU ticks (user + system) of each of the proxy's worker threads.
fn worker_ticks(pid: u32) -> Vec<u64> {
    workers(pid)
        .iter()
        .map(|task| {
            let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
            // Fields after the parenthesised name: utime and stime are the
            // 12th and 13th.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
        })
        .collect()
}

/// The time each of the proxy's worker threads ran, in nanoseconds (the
/// scheduler's own count: ticks are too coarse for a few hundred requests).
fn worker_cpu_ns(pid: u32) -> Vec<u64> {
    workers(pid)
        .iter()
        .map(|task| {
            let stat = std::fs::read_to_string(task.join("schedstat")).unwrap();
            stat.split_whitespace()
                .next()
                .and_then(|ns| ns.parse().ok())
                .expect("a thread's time on the CPU")
        })
        .collect()
}

/// How many times each of the proxy's worker threads went to sleep.
fn worker_sleeps(pid: u32) -> Vec<u64> {
    workers(pid)
        .iter()
        .map(|task| {
            // Unread, a count of 0 would pass for an idle thread.
            let status = std::fs::read_to_string(task.join("status")).unwrap();
            status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|count| count.trim().parse().ok())
                .expect("a thread's count of voluntary switches")
        })
        .collect()
}

/// Each of `after`'s counts less the same thread's in `before`.
fn since(before: &[u64], after: &[u64]) -> Vec<u64> {
    after
        .iter()
        .zip(before)
        .map(|(after, before)| after - before)
        .collect()
}

/// A new keep-alive connection to the proxy on `port`.
async fn connect(port: u16) -> Connection {
    Connection::on(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap(),
    )
}

/// Asks for the model list `times` over on one keep-alive connection.
async fn list_models(connection: &mut Connection, times: u64) {
    for _ in 0..times {
        connection
            .send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(connection.next_response().await.status, 200);
    }
}

/// A proxy with two worker threads, each its own runtime (no work
/// stealing), once both are up.
async fn two_runtimes() -> Proxy {
    let proxy = Proxy::start(&one_upstream(
        "http://127.0.0.1:9",
        "runtime: { threads: 2, work_stealing: false }\nstore: { kind: none }",
    ))
    .await;
    // A thread just spawned carries its parent's name until it sets its own
    // (pingora's timer thread, started by the first connection's timeout).
    for _ in 0..40 {
        if workers(proxy.pid()).len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(workers(proxy.pid()).len(), 2, "two worker threads");
    proxy
}

/// `runtime: { work_stealing: false }` runs one single-threaded runtime per
/// thread, as nginx runs one worker per core: the connections must go to
/// every thread, not all to the one that accepts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_work_stealing_every_thread_serves_connections() {
    let proxy = two_runtimes().await;
    let (port, pid) = (proxy.port, proxy.pid());
    let before = worker_ticks(pid);
    // 64 connections: each thread's share is about half, and far from none.
    let clients: Vec<_> = (0..64)
        .map(|_| {
            tokio::spawn(async move {
                list_models(&mut connect(port).await, 150).await;
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let spent = since(&before, &worker_ticks(pid));
    let total: u64 = spent.iter().sum();
    assert!(total > 0, "{spent:?}");
    for ticks in &spent {
        assert!(
            ticks * 5 >= total,
            "a thread served under a fifth: {spent:?}"
        );
    }
}

/// Without work stealing a connection is served on one thread's runtime,
/// often not the accepting one's, and its socket must be that runtime's:
/// registered with the accepting one, each request would wake the accepting
/// thread too (a futex wake and a context switch per read, a fifth more CPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_work_stealing_a_connection_wakes_only_the_thread_serving_it() {
    let proxy = two_runtimes().await;
    let (port, pid) = (proxy.port, proxy.pid());
    const REQUESTS: u64 = 200;
    // One connection used at a time, the earlier ones kept open: each goes
    // to the thread with fewer open, so three of the six are on the thread
    // that did not accept them.
    let mut open = Vec::new();
    for _ in 0..6 {
        let mut connection = connect(port).await;
        let before = worker_sleeps(pid);
        list_models(&mut connection, REQUESTS).await;
        let woken = since(&before, &worker_sleeps(pid));
        // The serving thread sleeps between requests; the other, idle,
        // hardly ever wakes.
        assert!(
            woken.iter().min().is_some_and(|idle| *idle < REQUESTS / 4),
            "both threads woke for one connection's requests: {woken:?}"
        );
        open.push(connection);
    }
}

/// Without work stealing a thread cannot hand a connection over, so where a
/// connection lands decides which thread works for it: two clients must land
/// on two threads, not (as at random, half the time) both on one while the
/// other idles.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_work_stealing_connections_go_to_the_least_loaded_thread() {
    let proxy = two_runtimes().await;
    let (port, pid) = (proxy.port, proxy.pid());
    const REQUESTS: u64 = 300;
    for _ in 0..3 {
        // Both open before either is used: the second is placed while the
        // first is open.
        let mut connections = Vec::new();
        for _ in 0..2 {
            let mut connection = connect(port).await;
            list_models(&mut connection, 1).await;
            connections.push(connection);
        }
        let before = worker_cpu_ns(pid);
        let clients: Vec<_> = connections
            .into_iter()
            .map(|mut connection| {
                tokio::spawn(async move { list_models(&mut connection, REQUESTS).await })
            })
            .collect();
        for client in clients {
            client.await.unwrap();
        }
        // Each thread does about half the work; one serving neither
        // connection hardly runs.
        let spent = since(&before, &worker_cpu_ns(pid));
        let total: u64 = spent.iter().sum();
        assert!(
            spent.iter().all(|ns| ns * 5 >= total),
            "a thread served neither connection (ns on the CPU): {spent:?}"
        );
        // Closed, they leave their threads with none open again.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The allocator returns freed memory to the system on its own thread, so
/// the memory a burst of large requests left behind leaves the RSS while
/// the streams they opened go on (bench/results/ab.md). Without the thread
/// nothing breaks, the RSS just stays at the burst's peak: only this test
/// would tell. Read from the process's threads, as jemalloc names them.
#[cfg(all(target_os = "linux", feature = "jemalloc", not(feature = "mimalloc")))]
#[tokio::test]
async fn the_allocator_returns_freed_memory_on_a_thread_of_its_own() {
    let upstream = echo_prompt_upstream(1, Duration::ZERO).await;
    let proxy = Proxy::start(&config(&upstream, 1)).await;
    assert_eq!(model_ids(proxy.port).await, ["bot"]);
    let names = || -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", proxy.pid())).unwrap();
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !names()
        .iter()
        .any(|name| name.starts_with("jemalloc_bg_thd"))
    {
        assert!(
            Instant::now() < deadline,
            "no jemalloc background thread among {:?}",
            names()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! MCP servers as tool sources (a real server on rmcp's server side,
//! `examples/mcp_demo_server.rs`, over stdio and streamable HTTP), injected
//! arguments, agents that call agents, and the `auto` model.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The demo server over streamable HTTP on `port`.
struct HttpMcp(Child);

impl HttpMcp {
    async fn start(port: u16) -> HttpMcp {
        Self::start_logging(port, Stdio::null()).await
    }

    /// With the requests it gets (`METHOD /path` lines) written to `log`.
    async fn start_logging(port: u16, log: impl Into<Stdio>) -> HttpMcp {
        let child = Command::new(demo_server())
            .args(["http", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the demo MCP server starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the MCP HTTP server did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        HttpMcp(child)
    }
}

impl Drop for HttpMcp {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy with `agents` (YAML lines) and the demo MCP server over stdio,
/// once that server is connected.
async fn with_stdio_demo(upstream: &FakeServer, agents: &str) -> Proxy {
    with_stdio_demo_set(upstream, "timeout_ms: 5000", agents).await
}

/// [`with_stdio_demo`] with the server's `settings` (YAML flow entries).
async fn with_stdio_demo_set(upstream: &FakeServer, settings: &str, agents: &str) -> Proxy {
    with_stdio_demo_env(upstream, settings, agents, &[]).await
}

/// [`with_stdio_demo_set`], the proxy's environment having `env` too.
async fn with_stdio_demo_env(
    upstream: &FakeServer,
    settings: &str,
    agents: &str,
    env: &[(&str, &str)],
) -> Proxy {
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
mcp_servers:
  demo: {{ command: ["{}", "stdio"], {settings} }}
agents:
{agents}
"#,
        upstream.url(),
        demo_server().display()
    );
    let proxy = Proxy::start_with_env(&yaml, env).await;
    wait_connected(&proxy, "demo").await;
    proxy
}

/// The chat completions an upstream received (not `/readyz`'s probes).
fn chats(upstream: &FakeServer) -> Vec<Recorded> {
    upstream
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect()
}

fn has_tool_result(req: &Recorded) -> bool {
    req.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "tool")
}

fn offered(req: &Recorded) -> Vec<Value> {
    req.json()["tools"].as_array().cloned().unwrap_or_default()
}

/// The upstream's answer to `/readyz`'s probe.
fn models() -> Reply {
    Reply::json(200, json!({"object": "list", "data": []}))
}

fn ask(model: &str, user: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": user}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_mcp_servers_tools_are_offered_and_called() {
    let upstream = calls_then_echo_results(vec![
        ("demo__add", r#"{"a": 2, "b": 3}"#),
        ("demo__fail", r#"{"message": "nope"}"#),
        ("demo__picture", "{}"),
    ])
    .await;
    let proxy = with_stdio_demo(
        &upstream,
        r#"
  docs: { tools: ["demo/*"] }
  adder: { tools: ["demo/add"] }"#,
    )
    .await;

    let res = post_json(proxy.port, "/v1/chat/completions", &ask("docs", "go")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        echoed_results(&res.json()).len(),
        3,
        "the loop finished with every result"
    );
    let requests = chats(&upstream);
    let tools = offered(&requests[0]);
    let add = tools
        .iter()
        .find(|t| t["function"]["name"] == "demo__add")
        .expect("demo__add offered");
    assert_eq!(add["function"]["description"], "Add two integers.");
    assert_eq!(
        add["function"]["parameters"]["properties"]["a"]["type"],
        "integer"
    );
    assert!(tools.len() >= 8, "every tool of the server: {tools:?}");
    let results = requests[1].tool_results();
    assert_eq!(results[0], "5");
    // `isError` results reach the model as errors.
    assert!(
        results[1].starts_with("error: ") && results[1].contains("fail"),
        "{}",
        results[1]
    );
    assert_eq!(results[2], "[image: image/png, 12 bytes of base64]");

    post_json(proxy.port, "/v1/chat/completions", &ask("adder", "go")).await;
    let names: Vec<Value> = offered(&chats(&upstream)[2])
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    assert_eq!(names, [json!("demo__add")], "one tool by name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_servers_env_and_output_cap_apply_to_its_calls() {
    let long = "x".repeat(500);
    let upstream = calls_then_echo_results(vec![
        ("demo__env", r#"{"name": "DEMO_GREETING"}"#),
        ("demo__env", r#"{"name": "HOME"}"#),
        ("demo__env", r#"{"name": "UPSTREAM_SECRET"}"#),
        (
            "demo__fail",
            Box::leak(format!(r#"{{"message": "{long}"}}"#).into_boxed_str()),
        ),
    ])
    .await;
    let proxy = with_stdio_demo_env(
        &upstream,
        "timeout_ms: 5000, max_output_bytes: 100, env: { DEMO_GREETING: hello }",
        "  docs: { tools: [\"demo/*\"] }",
        &[("UPSTREAM_SECRET", "sk-not-for-servers")],
    )
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("docs", "go")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let results = chats(&upstream)[1].tool_results();
    assert_eq!(
        results[0], "hello",
        "the server's env has the configured variable"
    );
    assert_eq!(
        results[1],
        std::env::var("HOME").unwrap_or_else(|_| "unset".into()),
        "and HOME, as the MCP SDKs pass it"
    );
    assert_eq!(
        results[2], "unset",
        "but none of the proxy's other variables, as the MCP SDKs do"
    );
    assert!(
        results[3].ends_with("[truncated: output exceeded 100 bytes]") && results[3].len() < 200,
        "{}",
        results[3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_inherits_only_the_variables_it_names_and_its_credentials_are_masked() {
    let upstream = calls_then_echo_results(vec![
        ("demo__env", r#"{"name": "UPSTREAM_SECRET"}"#),
        ("demo__env", r#"{"name": "PATH"}"#),
    ])
    .await;
    let proxy = with_stdio_demo_env(
        &upstream,
        "timeout_ms: 5000, inherit_env: [UPSTREAM_SECRET]",
        "  docs: { tools: [\"demo/*\"] }",
        &[("UPSTREAM_SECRET", "sk-named")],
    )
    .await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("docs", "go")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let results = chats(&upstream)[1].tool_results();
    assert_eq!(
        results,
        ["********", "unset"],
        "named, and only that; a credential the server echoes is masked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_streamable_http_servers_session() {
    let port = free_port();
    let requests = scratch_dir().join("requests");
    let _server = HttpMcp::start_logging(port, std::fs::File::create(&requests).unwrap()).await;
    let upstream = FakeServer::start(|_, _| models()).await;
    let yaml = format!(
        "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\" }} }}\nmcp_servers:\n  web: {{ url: \"http://127.0.0.1:{port}/mcp\" }}\nagents:\n  a: {{ tools: [\"web/*\"] }}\n",
        upstream.url()
    );
    let mut proxy = Proxy::start(&yaml).await;
    wait_connected(&proxy, "web").await;
    let seen = || std::fs::read_to_string(&requests).unwrap_or_default();
    assert!(!seen().contains("DELETE"), "{}", seen());
    proxy.signal("TERM");
    assert!(proxy.wait_exit(Duration::from_secs(10)).await.is_some());
    // The client's end of the session, as MCP's streamable HTTP asks.
    let deleted = wait_until(Duration::from_secs(5), || {
        std::future::ready(seen().lines().any(|line| line == "DELETE /mcp"))
    })
    .await;
    assert!(deleted, "the session was deleted:\n{}", seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_gets_its_headers_and_injected_arguments() {
    let port = free_port();
    let _server = HttpMcp::start(port).await;
    let upstream = calls_then_echo_results(vec![
        ("web__auth", "{}"),
        ("web__whoami", r#"{"user_id": "mallory", "note": "hi"}"#),
        ("web__add", r#"{"a": 1, "b": 2}"#),
    ])
    .await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
mcp_servers:
  web:
    url: "http://127.0.0.1:{port}/mcp"
    headers: {{ Authorization: "Bearer ${{MCP_TOKEN}}" }}
    inject: {{ user_id: {{ request: user }} }}
agents:
  web: {{ tools: ["web/*"] }}
"#,
        upstream.url()
    );
    let proxy = Proxy::start_with_env(&yaml, &[("MCP_TOKEN", "tok-123")]).await;
    wait_connected(&proxy, "web").await;
    let mut body = ask("web", "who am I?");
    body["user"] = json!("alice");
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let requests = chats(&upstream);
    let whoami = offered(&requests[0])
        .into_iter()
        .find(|t| t["function"]["name"] == "web__whoami")
        .unwrap();
    let properties = whoami["function"]["parameters"]["properties"]
        .as_object()
        .unwrap();
    assert!(
        !properties.contains_key("user_id"),
        "the injected parameter is hidden: {properties:?}"
    );
    assert!(properties.contains_key("note"));
    let results = requests[1].tool_results();
    // The server echoes the header it got: the configured value exactly, as
    // only that is masked, and masked, as a credential the server echoes is.
    assert_eq!(results[0], "*".repeat("Bearer tok-123".len()));
    assert_eq!(
        results[1], "user=alice note=hi",
        "the model's user_id was overridden"
    );
    assert_eq!(
        results[2], "3",
        "a tool that doesn't declare user_id doesn't get it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_at_start_is_reported_then_picked_up() {
    let port = free_port();
    let upstream = calls_then_echo_results(vec![("web__add", r#"{"a": 1, "b": 1}"#)]).await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
mcp_servers:
  web: {{ url: "http://127.0.0.1:{port}/mcp" }}
agents:
  web: {{ tools: ["web/add"] }}
  plain: {{}}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ready = get(proxy.port, "/readyz").await;
    assert_eq!(
        ready.status, 200,
        "a down MCP server does not make the proxy unready"
    );
    assert!(
        ready.json()["mcp"]["web"]
            .as_str()
            .unwrap()
            .starts_with("down"),
        "{}",
        ready.text()
    );

    let res = post_json(proxy.port, "/v1/chat/completions", &ask("web", "1+1")).await;
    assert_eq!(res.status, 200);
    let result = &chats(&upstream)[1].tool_results()[0];
    assert!(
        result.contains("MCP server `web`"),
        "a clear error for the model: {result}"
    );

    let _server = HttpMcp::start(port).await;
    wait_connected(&proxy, "web").await;
    post_json(proxy.port, "/v1/chat/completions", &ask("web", "1+1")).await;
    let requests = chats(&upstream);
    assert_eq!(requests.last().unwrap().tool_results()[0], "2");
}

/// A model that calls the tool the user's message names (`tool` or
/// `tool {arguments}`), then says "done".
async fn calls_the_named_tool() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method == "GET" {
            return models();
        }
        if has_tool_result(req) {
            return Reply::events(vec![content("done"), finish("stop")]);
        }
        let asked = req.json()["messages"][0]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let (tool, arguments) = asked.split_once(' ').unwrap_or((&asked, "{}"));
        Reply::events(vec![
            tool_call(0, "c", tool, arguments),
            finish("tool_calls"),
        ])
    })
    .await
}

/// The result of `tool`, called by agent `demo` through `proxy`.
async fn demo_call(proxy: &Proxy, upstream: &FakeServer, tool: &str) -> String {
    post_json(proxy.port, "/v1/chat/completions", &ask("demo", tool)).await;
    chats(upstream).last().unwrap().tool_results()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_dies_is_restarted() {
    let upstream = calls_the_named_tool().await;
    let proxy = with_stdio_demo(&upstream, r#"  demo: { tools: ["demo/*"] }"#).await;
    let call = |tool| demo_call(&proxy, &upstream, tool);
    let first_pid = call("demo__pid").await;
    assert!(first_pid.parse::<u32>().is_ok(), "{first_pid}");
    let crashed = call("demo__crash").await;
    assert!(
        crashed.starts_with("error: "),
        "a crash mid-call is an error result: {crashed}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pid = call("demo__pid").await;
        if pid.parse::<u32>().is_ok() {
            assert_ne!(pid, first_pid, "a new server process");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server was not restarted: {pid}\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_killed_between_calls_is_restarted_before_the_next_call() {
    let upstream = calls_the_named_tool().await;
    let proxy = with_stdio_demo(&upstream, r#"  demo: { tools: ["demo/*"] }"#).await;
    let pid = || demo_call(&proxy, &upstream, "demo__pid");
    let first = pid().await;
    assert!(first.parse::<u32>().is_ok(), "{first}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first])
        .status()
        .unwrap();
    assert!(killed.success());
    // Noticed by the proxy itself: no call has to fail to find out.
    wait_log(&proxy, "MCP server connection lost").await;
    wait_connected(&proxy, "demo").await;
    let now = pid().await;
    assert!(
        now.parse::<u32>().is_ok() && now != first,
        "the first call after the kill is served by a new process: {now}\n{}",
        proxy.logs()
    );
}

/// The names of the functions the last request to `upstream` offered.
fn last_offered(upstream: &FakeServer) -> Vec<String> {
    offered(chats(upstream).last().unwrap())
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_tools_change_is_listed_again() {
    let upstream = calls_the_named_tool().await;
    let port = free_port();
    let _http = HttpMcp::start(port).await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
mcp_servers:
  demo: {{ command: ["{}", "stdio"] }}
  web: {{ url: "http://127.0.0.1:{port}/mcp" }}
agents:
  demo: {{ tools: ["demo/*"] }}
  web: {{ tools: ["web/*"] }}
"#,
        upstream.url(),
        demo_server().display()
    );
    let proxy = Proxy::start(&yaml).await;
    let (proxy, upstream) = (&proxy, &upstream);
    for server in ["demo", "web"] {
        wait_connected(proxy, server).await;
        let status = || async move {
            let ready = get(proxy.port, "/readyz").await.json();
            ready["mcp"][server].as_str().unwrap_or_default().to_owned()
        };
        let before = status().await;
        let echo = format!("{server}__echo");
        let call = |asked: String| async move {
            post_json(proxy.port, "/v1/chat/completions", &ask(server, &asked)).await;
            chats(upstream).last().unwrap().tool_results()[0].clone()
        };
        assert_eq!(call(format!("{server}__grow")).await, "grown");
        assert!(
            !last_offered(upstream).contains(&echo),
            "not offered before the server grew"
        );
        // Told by the server, not found out by a failing call.
        let deadline = Instant::now() + Duration::from_secs(20);
        while status().await == before {
            assert!(
                Instant::now() < deadline,
                "`{server}` was not listed again:\n{}",
                proxy.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let said = call(format!(r#"{echo} {{"text": "hello"}}"#)).await;
        assert!(last_offered(upstream).contains(&echo), "now offered");
        assert_eq!(said, "hello", "and called");
    }
    assert!(proxy.logs().contains("MCP server's tools changed"));
}

/// The demo server writes these on stderr, which is the proxy's log.
const SLOW_STARTED: &str = "mcp_demo_server: slow started";
const CANCELLED: &str = "mcp_demo_server: notifications/cancelled";

/// Waits (30 s at most) until the proxy's log holds `line`.
async fn wait_log(proxy: &Proxy, line: &str) {
    let seen = wait_until(Duration::from_secs(30), || {
        std::future::ready(proxy.logs().contains(line))
    })
    .await;
    assert!(seen, "no `{line}` in the log:\n{}", proxy.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_during_an_mcp_call_gets_it_cancelled_on_the_server() {
    let upstream = calls_then_echo_results(vec![("demo__slow", r#"{"seconds": 3600}"#)]).await;
    let proxy = with_stdio_demo_set(
        &upstream,
        "timeout_ms: 600000",
        r#"  demo: { tools: ["demo/slow"] }"#,
    )
    .await;
    let mut conn = Connection::chat(proxy.port, &stream_body("demo", "go")).await;
    assert_eq!(conn.head().await.status, 200);
    wait_log(&proxy, SLOW_STARTED).await;
    assert!(!proxy.logs().contains(CANCELLED));
    drop(conn);
    wait_log(&proxy, CANCELLED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_past_its_timeout_is_cancelled_and_becomes_an_error_result() {
    let upstream = calls_then_echo_results(vec![("demo__slow", r#"{"seconds": 3600}"#)]).await;
    let proxy = with_stdio_demo_set(
        &upstream,
        "timeout_ms: 300",
        r#"  demo: { tools: ["demo/slow"] }"#,
    )
    .await;
    let res = within(
        Duration::from_secs(30),
        "the MCP timeout",
        post_json(proxy.port, "/v1/chat/completions", &ask("demo", "go")),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        echoed_results(&res.json()),
        ["error: MCP tool `slow` timed out after 300 ms"]
    );
    wait_log(&proxy, CANCELLED).await;
}

#[tokio::test]
async fn the_matched_keys_name_is_an_identity_the_client_cannot_forge() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let upstream = calls_then_echo_results(vec![(
        "orders",
        r#"{"owner": "mallory", "user": "mallory"}"#,
    )])
    .await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
auth: {{ api_keys: [{{ key: sk-alice, name: alice }}, sk-anonymous] }}
tools:
  orders:
    parameters: {{ type: object, properties: {{ owner: {{ type: string }}, user: {{ type: string }} }} }}
    http: {{ url: "{}/orders" }}
    inject: {{ owner: {{ api_key: name }}, user: {{ request: user }} }}
agents:
  shop: {{ tools: [orders] }}
"#,
        upstream.url(),
        tool.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let mut body = ask("shop", "my orders?");
    // The client may claim any `user`; only the key says who it is.
    body["user"] = json!("bob");
    let body = body.to_string();
    for key in ["sk-alice", "sk-anonymous"] {
        let auth = format!("Bearer {key}");
        let res = request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("authorization", &auth),
            ],
            body.as_bytes(),
        )
        .await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let sent: Vec<Value> = tool.requests().iter().map(|r| r.json()).collect();
    assert_eq!(
        sent,
        [
            json!({"owner": "alice", "user": "bob"}),
            json!({"user": "bob"}),
        ],
        "an unnamed key gives no owner, and the model's is dropped"
    );
}

#[tokio::test]
async fn local_tools_take_injected_arguments_from_headers_and_constants() {
    let tool = FakeServer::start(|_, _| Reply::json(200, json!({"ok": true}))).await;
    let upstream = calls_then_echo_results(vec![(
        "lookup",
        r#"{"order": 7, "tenant": "evil", "region": "us"}"#,
    )])
    .await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
tools:
  lookup:
    parameters: {{ type: object, properties: {{ order: {{ type: integer }}, tenant: {{ type: string }}, region: {{ type: string }}, zone: {{ type: string }} }}, required: [order, tenant] }}
    http: {{ url: "{}/lookup" }}
    inject: {{ tenant: {{ header: x-tenant }}, region: {{ value: eu }}, zone: {{ env: SHOP_ZONE }} }}
agents:
  shop: {{ tools: [lookup] }}
"#,
        upstream.url(),
        tool.url()
    );
    let proxy = Proxy::start_with_env(&yaml, &[("SHOP_ZONE", "eu-west-3")]).await;
    let body = ask("shop", "where is order 7?").to_string();
    let res = request(
        proxy.port,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json"), ("x-tenant", "acme")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(res.status, 200);
    assert_eq!(
        tool.requests()[0].json(),
        json!({"order": 7, "tenant": "acme", "region": "eu", "zone": "eu-west-3"})
    );
    let schema = &offered(&chats(&upstream)[0])[0]["function"]["parameters"];
    assert_eq!(schema["required"], json!(["order"]));
    assert_eq!(
        schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["order"]
    );
}

/// An upstream that plays each agent by its system prompt.
async fn team_upstream() -> FakeServer {
    FakeServer::start(|req, _| {
        let body = req.json();
        let system = body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let results = req.tool_results();
        match system.as_str() {
            // Asks for a tool no one gave it.
            "DREAMER" => Reply::events(vec![
                content("Let me search."),
                tool_call(0, "d1", "web_search", r#"{"q": "X"}"#),
                finish("tool_calls"),
            ]),
            "RESEARCH" => Reply::events(vec![
                reasoning("looking it up. "),
                content("X is 42"),
                finish("stop"),
                usage(7, 3),
            ]),
            // The boss calls whichever agent it was given.
            "BOSS" if results.is_empty() => Reply::events(vec![
                tool_call(
                    0,
                    "r1",
                    body["tools"][0]["function"]["name"]
                        .as_str()
                        .unwrap_or_default(),
                    r#"{"task": "find X"}"#,
                ),
                finish("tool_calls"),
                usage(100, 10),
            ]),
            "BOSS" => Reply::events(vec![
                content(&format!("Boss says: {}", results[0])),
                finish("stop"),
                usage(120, 20),
            ]),
            "LOOP" if results.is_empty() => Reply::events(vec![
                tool_call(0, "l1", "agent__loop", r#"{"task": "again"}"#),
                finish("tool_calls"),
            ]),
            _ => Reply::events(vec![
                content(&format!("gave up: {}", results.join(" | "))),
                finish("stop"),
            ]),
        }
    })
    .await
}

#[tokio::test]
async fn an_agent_calls_another_agent_and_streams_its_progress() {
    let upstream = team_upstream().await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
agents:
  boss: {{ system_prompt: BOSS, tools: ["agent:research"] }}
  research: {{ system_prompt: RESEARCH, description: "Finds facts" }}
  loop: {{ system_prompt: LOOP, tools: ["agent:loop"] }}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let mut body = ask("boss", "what is X?");
    body["stream"] = json!(true);
    let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(res.status, 200);
    assert_eq!(
        res.delta_text("content"),
        "Boss says: X is 42",
        "{}",
        proxy.logs()
    );
    let reasoning = res.delta_text("reasoning_content");
    assert!(
        reasoning.contains("Calling agent__research {\"task\": \"find X\"}")
            && reasoning.contains("looking it up. X is 42"),
        "the callee's progress streams as tool events: {reasoning:?}"
    );
    let requests = chats(&upstream);
    let boss_tools = offered(&requests[0]);
    assert_eq!(boss_tools[0]["function"]["name"], "agent__research");
    assert_eq!(
        boss_tools[0]["function"]["parameters"]["required"],
        json!(["task"])
    );
    let research = requests
        .iter()
        .find(|r| r.json()["messages"][0]["content"] == "RESEARCH")
        .unwrap()
        .json();
    assert_eq!(
        research["messages"][1],
        json!({"role": "user", "content": "find X"})
    );

    let res = post_json(proxy.port, "/v1/chat/completions", &ask("loop", "go")).await;
    let answer = res.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        answer.starts_with("gave up: error: agent `loop` is already working"),
        "cycles are refused: {answer}"
    );
}

/// A called agent whose model asks for a tool it does not have has no
/// client to hand the call to: its caller is told, not given the text
/// before the call as the whole answer.
#[tokio::test]
async fn a_called_agents_call_for_a_tool_it_lacks_is_its_callers_error() {
    let upstream = team_upstream().await;
    let yaml = format!(
        "default_upstream: up\nupstreams: {{ up: {{ url: \"{}/v1\" }} }}\nagents:\n  boss: {{ system_prompt: BOSS, tools: [\"agent:dreamer\"] }}\n  dreamer: {{ system_prompt: DREAMER }}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &ask("boss", "what is X?"),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let answer = res.json()["choices"][0]["message"]["content"].clone();
    assert_eq!(
        answer,
        "Boss says: error: agent `dreamer` stopped to call a tool it does not have; what it said before: Let me search."
    );
}

#[tokio::test]
async fn agents_calling_agents_stop_at_four_levels() {
    // Each level calls the agent it was given, and answers with what it got.
    let upstream = FakeServer::start(|req, _| {
        let body = req.json();
        let level = body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let results = req.tool_results();
        match body["tools"][0]["function"]["name"].as_str() {
            Some(callee) if results.is_empty() => Reply::events(vec![
                tool_call(0, "c", callee, r#"{"task": "go deeper"}"#),
                finish("tool_calls"),
            ]),
            _ => Reply::events(vec![
                content(&format!("{level}[{}]", results.join(""))),
                finish("stop"),
            ]),
        }
    })
    .await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
agents:
  l1: {{ system_prompt: L1, tools: ["agent:l2"] }}
  l2: {{ system_prompt: L2, tools: ["agent:l3"] }}
  l3: {{ system_prompt: L3, tools: ["agent:l4"] }}
  l4: {{ system_prompt: L4, tools: ["agent:l5"] }}
  l5: {{ system_prompt: L5, tools: ["agent:l6"] }}
  l6: {{ system_prompt: L6 }}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let res = post_json(proxy.port, "/v1/chat/completions", &ask("l1", "go")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let answer = res.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    // l1 runs l2, l3, l4: four levels; l4's call to l5 is refused.
    assert!(
        answer.starts_with("L1[L2[L3[L4[error: agents may call agents at most 4 deep"),
        "{answer}"
    );
    assert!(!answer.contains("L5"), "{answer}");
}

#[tokio::test]
async fn a_called_agents_reasoning_follows_both_agents_settings_and_its_usage_counts() {
    let upstream = team_upstream().await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
agents:
  boss: {{ system_prompt: BOSS, tools: ["agent:research"] }}
  stripping_boss: {{ system_prompt: BOSS, tools: ["agent:research"], reasoning: strip }}
  boss_of_quiet: {{ system_prompt: BOSS, tools: ["agent:quiet_research"] }}
  research: {{ system_prompt: RESEARCH }}
  quiet_research: {{ system_prompt: RESEARCH, reasoning: strip }}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let callee_reasoning = "looking it up.";
    for (agent, shown) in [
        ("boss", true),
        ("stripping_boss", false),
        ("boss_of_quiet", false),
    ] {
        let mut body = ask(agent, "what is X?");
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let res = post_json(proxy.port, "/v1/chat/completions", &body).await;
        assert_eq!(res.status, 200, "{agent}: {}", res.text());
        assert_eq!(res.delta_text("content"), "Boss says: X is 42", "{agent}");
        assert_eq!(
            res.text().contains(callee_reasoning),
            shown,
            "{agent}: {}",
            res.text()
        );
        // Both of the boss's rounds and the callee's one.
        let usage = res.events().last().unwrap()["usage"].clone();
        assert_eq!(usage["prompt_tokens"], 227, "{agent}: {usage}");
        assert_eq!(usage["completion_tokens"], 33, "{agent}: {usage}");
    }
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &ask("boss", "what is X?"),
    )
    .await;
    assert_eq!(res.json()["usage"]["total_tokens"], 260);
}

#[tokio::test]
async fn auto_routes_each_request_to_the_agent_the_router_names() {
    let upstream = FakeServer::start(|req, _| {
        if req.method == "GET" {
            return models();
        }
        let body = req.json();
        if body["model"] == "router-model" {
            let question = body["messages"][1]["content"].as_str().unwrap_or_default();
            let answer = if question.contains("rain") { "<think>hmm</think>weather" } else { "no idea, sorry" };
            // Reasoning that names another agent first is not the answer.
            return Reply::json(200, json!({"choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": "helper? no.", "content": answer}, "finish_reason": "stop"}]}));
        }
        let system = body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
        Reply::events(vec![content(&format!("answered by {system}")), finish("stop")])
    })
    .await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams: {{ up: {{ url: "{}/v1" }} }}
router: {{ model: router-model, default_agent: helper }}
agents:
  weather: {{ system_prompt: WEATHER, description: "Forecasts and rain" }}
  helper: {{ system_prompt: HELPER, description: "Anything else" }}
"#,
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let ids: Vec<Value> = get(proxy.port, "/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("helper"), json!("weather"), json!("auto")]);

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &ask("auto", "will it rain?"),
    )
    .await;
    assert_eq!(res.json()["model"], "weather");
    assert_eq!(
        res.json()["choices"][0]["message"]["content"],
        "answered by WEATHER"
    );
    let routing = chats(&upstream)[0].json();
    assert_eq!(
        routing["chat_template_kwargs"]["enable_thinking"], false,
        "a thinking model is asked not to think before naming an agent"
    );
    assert_eq!(routing["max_tokens"], 512);
    assert_eq!(routing["stream"], false);
    let prompt = routing["messages"][0]["content"].as_str().unwrap();
    assert!(
        prompt.contains("- weather: Forecasts and rain")
            && prompt.contains("- helper: Anything else"),
        "{prompt}"
    );

    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &ask("auto", "tell me a joke"),
    )
    .await;
    assert_eq!(
        res.json()["model"],
        "helper",
        "an answer naming no agent falls back"
    );
    assert!(proxy.logged(&["auto routed"]).await);
}

#[tokio::test]
async fn auto_falls_back_when_the_router_is_down() {
    let upstream = FakeServer::start(|req, _| {
        let system = req.json()["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Reply::events(vec![content(&system), finish("stop")])
    })
    .await;
    let yaml = format!(
        r#"
default_upstream: up
upstreams:
  up: {{ url: "{}/v1" }}
  router: {{ url: "http://127.0.0.1:{}/v1" }}
router: {{ upstream: router, default_agent: helper }}
agents:
  weather: {{ system_prompt: WEATHER }}
  helper: {{ system_prompt: HELPER }}
"#,
        upstream.url(),
        free_port()
    );
    let proxy = Proxy::start(&yaml).await;
    let res = post_json(
        proxy.port,
        "/v1/chat/completions",
        &ask("auto", "will it rain?"),
    )
    .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.json()["model"], "helper");
    assert_eq!(res.json()["choices"][0]["message"]["content"], "HELPER");
}

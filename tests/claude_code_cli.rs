//! The real Claude Code CLI (npm `@anthropic-ai/claude-code`, installed on
//! first use under the target directory) run as `claude -p` against an
//! agent through `POST /v1/messages`: the model calls Claude Code's own
//! `Bash` tool, the proxy hands the call back as a `tool_use` block, Claude
//! Code runs it and sends a `tool_result`, and the loop ends with the
//! model's answer. Offline: the upstream is scripted and every other host
//! Claude Code might reach goes to a local recorder instead (it honours
//! `HTTPS_PROXY`: without `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` the
//! recorder sees it reach for api.anthropic.com — MCP registry, event
//! logging), which must see nothing.
//!
//! Claude Code retries a stream it cannot read as a non-streaming request
//! and then succeeds, so a broken stream can look like a working one:
//! `CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK=1` makes it fail instead
//! ("API Error: Stream ended without receiving any events"), and the
//! proxy's metrics must show every call answered as a stream.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const CLAUDE_CODE: &str = "@anthropic-ai/claude-code@2.1.330";

/// The command the model asks Claude Code to run. Its output
/// (`CLAUDE-RAN`) is not in its text, so finding the output proves the
/// shell ran it.
const COMMAND: &str = "printf 'CLAUDE-%s\\n' RAN";
const OUTPUT: &str = "CLAUDE-RAN";

const KEY: &str = "cc-test-key";

/// The upstream. Claude Code's main loop offers its tools (`Bash` among
/// them): round 1 calls `Bash`; once the request carries its result, the
/// answer quotes the result's last line. Anything else Claude Code asks
/// (a side request without its tools) gets a short plain answer.
async fn scripted_upstream() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method != "POST" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        if !offers_bash(req) {
            return Reply::events(vec![
                role(),
                content("Side answer"),
                finish("stop"),
                usage(30, 2),
            ]);
        }
        call_then_quote(
            req,
            tool_call(
                0,
                "call_claude_1",
                "Bash",
                &json!({ "command": COMMAND, "description": "run it" }).to_string(),
            ),
        )
    })
    .await
}

/// Whether a chat request offers the model Claude Code's `Bash` tool: its
/// main loop does.
fn offers_bash(request: &Recorded) -> bool {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    body["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == "Bash"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_its_bash_tool_through_an_agent() {
    // First, so a machine without npm fails here with one message.
    let started = Instant::now();
    let claude = node_package(CLAUDE_CODE, "claude");
    eprintln!("claude code: installed or found in {:?}", started.elapsed());
    let upstream = scripted_upstream().await;
    // Where Claude Code's traffic to any other host would go (HTTP(S)_PROXY):
    // recorded and refused.
    let elsewhere = FakeServer::start(|_, _| Reply::json(403, json!({"error": "offline"}))).await;
    let proxy = Proxy::start(&format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{up}/v1" }} }}
auth: {{ api_keys: [{KEY}] }}
agents:
  coder: {{ model: tiny-coder, system_prompt: "You are a careful coding agent." }}
"#,
        up = upstream.url()
    ))
    .await;

    let dir = scratch_dir();
    let (home, work) = (dir.join("home"), dir.join("work"));
    // Its settings file, there from the start (else it logs that it cannot
    // lock it), and its temporary files (sockets) in the scratch directory.
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::write(home.join(".claude/.claude.json"), "{}").unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let debug_log = dir.join("claude.debug");

    let started = Instant::now();
    let (port, elsewhere_url) = (proxy.port, elsewhere.url());
    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || {
        run_claude(&claude, &dir, &home, &work, port, &elsewhere_url)
    })
    .await
    .unwrap();
    eprintln!("claude code: ran in {:?}", started.elapsed());
    let metrics = request(
        proxy.port,
        "GET",
        "/metrics",
        &[("authorization", &format!("Bearer {KEY}"))],
        b"",
    )
    .await
    .text();
    let debug = std::fs::read_to_string(&debug_log).unwrap_or_default();
    let context = || {
        let requests: Vec<String> = upstream
            .requests()
            .iter()
            .chain(elsewhere.requests().iter())
            .map(|r| {
                let body = String::from_utf8_lossy(&r.body);
                let head: String = body.chars().take(600).collect();
                format!("{} {}\n  {head}", r.method, r.path)
            })
            .collect();
        format!(
            "exit: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}\nupstream and other requests:\n{}\n\
             proxy log:\n{}\nmetrics:\n{}\nClaude Code's debug log:\n{debug}",
            requests.join("\n"),
            proxy.logs(),
            metrics
                .lines()
                .filter(|l| l.starts_with("agent_proxy_requests_total"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    assert_eq!(status, "exit status: 0", "claude -p failed\n{}", context());

    // `--output-format stream-json --verbose`: one message per line.
    let messages: Vec<Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let result = messages
        .iter()
        .find(|m| m["type"] == "result")
        .unwrap_or_else(|| panic!("a result message\n{}", context()));
    assert_eq!(result["subtype"], "success", "{}", context());
    assert_eq!(result["is_error"], false, "{}", context());
    assert_eq!(
        result["result"],
        format!("All done: {OUTPUT}"),
        "{}",
        context()
    );
    assert_eq!(result["num_turns"], 2, "{}", context());
    // Claude Code adds up the usage of its two calls, each the upstream's
    // usage of that round.
    assert_eq!(result["usage"]["input_tokens"], 250, "{}", context());
    assert_eq!(result["usage"]["output_tokens"], 12, "{}", context());

    // Claude Code ran the call it got as a `tool_use` block and sent its
    // output back as a `tool_result`.
    let blocks = |role: &str, kind: &str| -> Vec<Value> {
        messages
            .iter()
            .filter(|m| m["type"] == role)
            .filter_map(|m| m["message"]["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == kind)
            .cloned()
            .collect()
    };
    let uses = blocks("assistant", "tool_use");
    assert_eq!(uses.len(), 1, "one tool call\n{}", context());
    assert_eq!(uses[0]["name"], "Bash");
    assert_eq!(uses[0]["id"], "call_claude_1");
    assert_eq!(uses[0]["input"]["command"], COMMAND);
    let results = blocks("user", "tool_result");
    assert_eq!(results.len(), 1, "{}", context());
    assert_eq!(results[0]["tool_use_id"], "call_claude_1");
    assert_ne!(results[0]["is_error"], true, "{}", context());

    // The upstream saw Claude Code's tools, then its tool's result.
    let rounds: Vec<Recorded> = upstream
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && offers_bash(r))
        .collect();
    assert_eq!(rounds.len(), 2, "two main rounds\n{}", context());
    let first = rounds[0].json();
    assert_eq!(first["model"], "tiny-coder");
    assert!(rounds[0].tool_results().is_empty());
    let tool_results = rounds[1].tool_results();
    assert_eq!(tool_results.len(), 1, "{}", context());
    assert!(tool_results[0].contains(OUTPUT), "{tool_results:?}");
    let second = rounds[1].json();
    let call = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant" && m["tool_calls"].is_array())
        .unwrap_or_else(|| panic!("the call is replayed\n{second}"));
    assert_eq!(call["tool_calls"][0]["id"], "call_claude_1");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "Bash");

    // Claude Code streamed: its two Messages calls each got an event stream.
    // (It would silently retry a broken stream without streaming; the
    // fallback is turned off, and the proxy counted no answer that is not a
    // stream.)
    let agent_calls = |stream: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("agent_proxy_requests_total{")
                    && l.contains("agent=\"coder\"")
                    && l.contains(&format!("stream=\"{stream}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(agent_calls("true"), 2, "{}", context());
    assert_eq!(agent_calls("false"), 0, "{}", context());
    assert!(
        !debug.contains("falling back to non-streaming"),
        "{}",
        context()
    );

    // Nothing went to another host.
    assert!(
        elsewhere.requests().is_empty(),
        "Claude Code tried other hosts\n{}",
        context()
    );
}

/// Runs `claude -p` with its home in the test's scratch directory and only
/// the environment given here; returns the exit status and what it printed.
fn run_claude(
    claude: &Path,
    dir: &Path,
    home: &Path,
    work: &Path,
    port: u16,
    elsewhere: &str,
) -> (String, String, String) {
    let (out, err) = (dir.join("claude.stdout"), dir.join("claude.stderr"));
    let mut command = Command::new(claude);
    command
        .args([
            "-p",
            "Run the check command.",
            "--model",
            "coder",
            "--output-format",
            "stream-json",
            "--verbose",
            "--allowedTools",
            "Bash",
            "--max-turns",
            "4",
            "--no-session-persistence",
            "--debug-file",
        ])
        .arg(dir.join("claude.debug"))
        .current_dir(work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CLAUDE_CONFIG_DIR", home.join(".claude"))
        .env("TMPDIR", dir.join("tmp"))
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
        .env("ANTHROPIC_API_KEY", KEY)
        // Its side calls (titles, summaries) go to the agent too.
        .env("ANTHROPIC_SMALL_FAST_MODEL", "coder")
        .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "coder")
        .env("ANTHROPIC_DEFAULT_SONNET_MODEL", "coder")
        .env("ANTHROPIC_DEFAULT_OPUS_MODEL", "coder")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("HTTP_PROXY", elsewhere)
        .env("HTTPS_PROXY", elsewhere)
        .env("NO_PROXY", "127.0.0.1,localhost")
        // A broken stream fails instead of being retried without streaming,
        // and an error answer fails at once.
        .env("CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    // The shell its Bash tool runs.
    if let Some(bash) = ["/bin/bash", "/usr/bin/bash"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
    {
        command.env("SHELL", bash);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", claude.display()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.to_string();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break "killed after 120 s".to_owned();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    (status, read(&out), read(&err))
}

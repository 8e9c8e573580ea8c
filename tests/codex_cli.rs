//! The real Codex CLI (npm `@openai/codex`, installed on first use under the
//! target directory) run as `codex exec` against an agent through
//! `POST /v1/responses`: the model calls Codex's own shell tool, the proxy
//! hands the call back, Codex runs it and sends its output, and the loop ends
//! with the model's answer. Offline: the upstream is scripted and Codex is
//! kept from every other host.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const CODEX: &str = "@openai/codex@0.169.0";

/// The command the model asks Codex to run. Its output (`CODEX-RAN-42`) is
/// not in its text, so finding the output proves the shell ran it.
const COMMAND: &str = "echo CODEX-RAN-$((6*7))";
const OUTPUT: &str = "CODEX-RAN-42";

/// Codex's configuration: the proxy as a Responses provider, no approvals
/// or sandbox (the test runs one harmless `echo`), no retries (a failure
/// shows at once: without `unbounded_connection_retries = false` Codex
/// retries a refused connection forever), and nothing that would reach
/// another host (its plugins look up api.github.com and chatgpt.com).
fn codex_config(port: u16) -> String {
    format!(
        r#"model_provider = "proxy"
model = "coder"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.proxy]
name = "agent-proxy"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "AGENT_PROXY_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
unbounded_connection_retries = false

[analytics]
enabled = false
"#
    )
}

/// The upstream: round 1 thinks, then calls `exec_command` (a tool of
/// Codex, not of the agent); once the request carries its result, the
/// answer quotes the result's last line. Codex sends the round's reasoning
/// item back with the call (`content` as streamed, `encrypted_content:
/// null`), so the proxy must take that too.
async fn scripted_upstream() -> FakeServer {
    FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        call_then_quote(
            req,
            tool_call(
                0,
                "call_codex_1",
                "exec_command",
                &json!({ "cmd": COMMAND }).to_string(),
            ),
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_runs_its_shell_tool_through_an_agent() {
    // First, so a machine without npm fails here with one message.
    let started = Instant::now();
    let codex = node_package(CODEX, "codex");
    eprintln!("codex: installed or found in {:?}", started.elapsed());
    let upstream = scripted_upstream().await;
    let proxy = Proxy::start(&format!(
        r#"
default_upstream: local
upstreams: {{ local: {{ url: "{up}/v1" }} }}
agents:
  coder: {{ model: tiny-coder, system_prompt: "You are a careful coding agent." }}
"#,
        up = upstream.url()
    ))
    .await;

    let dir = scratch_dir();
    let (home, work) = (dir.join("codex-home"), dir.join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(home.join("config.toml"), codex_config(proxy.port)).unwrap();

    let started = Instant::now();
    let (status, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_codex(&codex, &dir, &home, &work))
            .await
            .unwrap();
    eprintln!("codex: ran in {:?}", started.elapsed());
    let context = || {
        format!(
            "exit: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}\nproxy log:\n{}",
            proxy.logs()
        )
    };
    assert_eq!(status, "exit status: 0", "codex exec failed\n{}", context());

    // `--json`: one event per line.
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let completed = |kind: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == kind)
            .map(|e| &e["item"])
            .collect()
    };
    let commands = completed("command_execution");
    assert_eq!(commands.len(), 1, "Codex ran one command\n{}", context());
    assert!(
        commands[0]["command"].as_str().unwrap().contains(COMMAND),
        "{}",
        context()
    );
    assert_eq!(commands[0]["exit_code"], 0, "{}", context());
    assert_eq!(commands[0]["aggregated_output"], format!("{OUTPUT}\n"));

    // Codex asks for a summary of the reasoning, and shows that by default:
    // the model's reasoning is it.
    let reasoning: Vec<&str> = completed("reasoning")
        .iter()
        .filter_map(|item| item["text"].as_str())
        .collect();
    assert!(
        reasoning.iter().any(|text| text.contains("Let me run it.")),
        "{reasoning:?}\n{}",
        context()
    );

    let messages = completed("agent_message");
    assert_eq!(messages.len(), 1, "one final answer\n{}", context());
    assert_eq!(messages[0]["text"], format!("All done: {OUTPUT}"));
    let turn = events
        .iter()
        .find(|e| e["type"] == "turn.completed")
        .unwrap_or_else(|| panic!("the turn completed\n{}", context()));
    // Codex adds up the usage of its two Responses calls, each the
    // upstream's usage of that round.
    assert_eq!(turn["usage"]["input_tokens"], 250, "{}", context());
    assert_eq!(turn["usage"]["output_tokens"], 12, "{}", context());

    // The upstream saw two rounds: Codex's tool and then its result.
    let requests: Vec<Recorded> = upstream
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(requests.len(), 2, "{}", context());
    let first = requests[0].json();
    assert_eq!(first["model"], "tiny-coder");
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"exec_command"), "{offered:?}");
    assert!(requests[0].tool_results().is_empty());
    let results = requests[1].tool_results();
    assert_eq!(results.len(), 1, "{}", context());
    assert!(results[0].contains(OUTPUT), "{results:?}");
    let second = requests[1].json();
    let messages = second["messages"].as_array().unwrap();
    let call = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(call["tool_calls"][0]["id"], "call_codex_1", "{second}");
    // Codex sends the reasoning item back: the model's prompt is the one it
    // had, reasoning and all (a model server's cache of it holds).
    assert_eq!(call["reasoning_content"], "Let me run it.", "{second}");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "exec_command");
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(
        result["tool_call_id"], "call_codex_1",
        "the result answers the upstream's call"
    );
}

/// Runs `codex exec --json` with its home and working directory in the
/// test's scratch directory; returns the exit status and what it printed.
fn run_codex(codex: &Path, dir: &Path, home: &Path, work: &Path) -> (String, String, String) {
    let (out, err) = (dir.join("codex.stdout"), dir.join("codex.stderr"));
    let mut child = Command::new(codex)
        .args([
            "exec",
            "--json",
            "--ephemeral",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--color",
            "never",
            "Run the check command.",
        ])
        .current_dir(work)
        .env("CODEX_HOME", home)
        .env("HOME", home)
        .env("AGENT_PROXY_TEST_KEY", "test-key")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", codex.display()));
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

//! agent-proxy's benchmark: every scenario against every target side by
//! side in one run, on one fake upstream, reported as figures and ratios.
//!
//!   agent-proxy-bench run [--smoke] [--out bench/results]
//!
//! Targets: the fake upstream directly, nginx as a plain reverse proxy,
//! agent-proxy passing a chat completion through, agent-proxy's agent path
//! (rewrite, no tools) through its chat, Responses and Messages front
//! doors, and an agent with one local HTTP tool round.

mod load;
mod procs;
mod report;
mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Parser, Subcommand};

use load::{Answer, Load};
use procs::Process;
use report::{Memory, Peers, Report, Run, StreamCost, ToolRound};

#[derive(Parser)]
#[command(about = "Benchmarks agent-proxy against a direct upstream and nginx")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs every scenario and writes README.md and chart.svg to `--out`.
    Run(RunArgs),
    /// Serves the fake model (the harness starts it itself).
    Upstream {
        #[arg(long)]
        listen: SocketAddr,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// A few seconds in all, with small counts: checks that it still works.
    #[arg(long)]
    smoke: bool,
    /// The agent-proxy binary; by default the one beside this one.
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Measured seconds per target and scenario, split over the rounds.
    #[arg(long, default_value_t = 6.0)]
    seconds: f64,
    /// Rounds over all targets per scenario; interleaving evens out noise.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Only these scenarios (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<Scenario>,
    /// Leaves out the Responses and Messages targets: for an agent-proxy
    /// that predates those front doors (a before/after of the chat path).
    #[arg(long)]
    chat_only: bool,
    /// YAML appended to the proxy's config, e.g. `runtime: { work_stealing: false }`.
    #[arg(long, default_value = "")]
    proxy_yaml: String,
    /// A second agent-proxy binary, run beside the first with the same
    /// config: its passthrough, agent and Responses targets, marked "(B)", take their
    /// turns in every round of the non-streaming and streaming scenarios.
    /// An A/B of two builds within one run, so both see the same machine.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// The "(B)" proxy's config addition instead of `--proxy-yaml`: an A/B
    /// of two configs (of the same binary, without `--baseline-bin`).
    #[arg(long)]
    baseline_yaml: Option<String>,
    /// Access logs on, as people run them: nginx's `access_log` to a file,
    /// agent-proxy at `RUST_LOG=info` (its line per request on stderr, to a
    /// file). Off by default: the figures are the proxying's own.
    #[arg(long)]
    access_log: bool,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Scenario {
    /// Non-streaming requests at 1, 32 and 256 connections.
    Plain,
    /// One local tool round.
    Tool,
    /// Streaming answers at 1 and 256 connections.
    Stream,
    /// Open streams and idle memory.
    Memory,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Upstream { listen } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(upstream::serve(listen)),
        Cmd::Run(args) => {
            procs::raise_open_files_limit();
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(run(args))
        }
    }
}

/// What a request asks the fake model for.
#[derive(Clone, Copy)]
struct Shape {
    stream: bool,
    tokens: u32,
    delay_us: u64,
}

/// Non-streaming: 16 tokens at once.
const SMALL: Shape = Shape {
    stream: false,
    tokens: 16,
    delay_us: 0,
};
/// Streams at one connection: a fast model.
const FAST_TOKEN_US: u64 = 1_000;
/// The length of its answers at one connection.
const FAST_TOKENS: u32 = 20;
/// Streams at many connections: a busy model (a less busy one in a smoke run).
const BUSY_TOKEN_US: u64 = 10_000;
const SMOKE_BUSY_TOKEN_US: u64 = 2_000;

/// The token delays a Responses or Messages request may ask for. Their
/// unknown fields stay in their own dialect (they reach only an upstream
/// that speaks it), so `bench_delay_us` rides on the agent instead, as a
/// param: one agent per delay (see [`delay_agent`]).
const AGENT_DELAYS_US: [u64; 5] = [
    SMALL.delay_us,
    FAST_TOKEN_US,
    BUSY_TOKEN_US,
    SMOKE_BUSY_TOKEN_US,
    OPEN_STREAM_TOKEN_US,
];
/// Streams held open for the memory figures: a token every 100 ms.
const OPEN_STREAM_TOKEN_US: u64 = 100_000;

/// The agent `plain`, with `bench_delay_us` as a param.
fn delay_agent(delay_us: u64) -> String {
    assert!(
        AGENT_DELAYS_US.contains(&delay_us),
        "no agent for {delay_us} µs a token: add it to AGENT_DELAYS_US"
    );
    format!("plain-{delay_us}us")
}

#[derive(Clone, Copy, PartialEq)]
enum Host {
    Upstream,
    Nginx,
    Proxy,
    /// `--baseline-bin`.
    ProxyB,
}

/// What a target is asked, in which dialect.
#[derive(Clone, Copy, PartialEq)]
enum Ask {
    /// A chat completion for this model.
    Chat(&'static str),
    /// A Responses request for the agent `plain` (by way of the
    /// [`delay_agent`] with the shape's delay), its answer kept in the
    /// response store (OpenAI's default, `store: true`) or not (`store:
    /// false`, as Codex CLI asks).
    Responses { stored: bool },
    /// The same as an Anthropic Messages request.
    Messages,
    /// A coding agent's real request (captured, in `tests/fixtures/clients`)
    /// in its own dialect: its tools offered with `tool_choice: none`, so
    /// the answer is text. For the agent with the shape's delay, or (`agent:
    /// false`) for the model `bench`, which no proxy knows as an agent: the
    /// same bytes carried to the fake model as they are.
    Client { request: ClientRequest, agent: bool },
    /// The fake HTTP tool's own request.
    Tool,
}

#[derive(Clone, Copy, PartialEq)]
enum ClientRequest {
    /// Claude Code's first request of a session (`POST /v1/messages`).
    ClaudeCode,
    /// Codex CLI's first request of a session (`POST /v1/responses`).
    Codex,
}

impl ClientRequest {
    /// The capture as recorded: Claude Code's keeps the request's method and
    /// headers beside its body, Codex's is its body alone.
    fn capture(self) -> serde_json::Value {
        let capture = match self {
            ClientRequest::ClaudeCode => {
                include_str!("../../tests/fixtures/clients/claude-code-2.1.330-plain.request.json")
            }
            ClientRequest::Codex => {
                include_str!("../../tests/fixtures/clients/codex-0.169.0-round1.request.json")
            }
        };
        serde_json::from_str(capture).expect("a captured request is JSON")
    }

    /// The captured request, with the model, the stream and the answer's
    /// length set as the shape says.
    fn body(self, model: &str, stream: bool, tokens: u32) -> Bytes {
        let (tokens_field, none) = match self {
            ClientRequest::ClaudeCode => ("max_tokens", serde_json::json!({ "type": "none" })),
            ClientRequest::Codex => ("max_output_tokens", serde_json::json!("none")),
        };
        let mut capture = self.capture();
        let mut body = match capture.get_mut("body") {
            Some(body) => body.take(),
            None => capture,
        };
        body["model"] = model.into();
        body["stream"] = stream.into();
        body[tokens_field] = tokens.into();
        body["tool_choice"] = none;
        Bytes::from(serde_json::to_vec(&body).expect("JSON out"))
    }

    /// The captured request's header fields, as the client sent them, but
    /// those the load generator sets (`host`, `content-type`) and those of
    /// its connection (`content-length`, `connection`); none for Codex's.
    fn headers(self) -> Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)> {
        let capture = self.capture();
        let Some(fields) = capture["headers"].as_object() else {
            return Vec::new();
        };
        fields
            .iter()
            .filter(|(name, _)| {
                !["host", "content-type", "content-length", "connection"]
                    .contains(&name.to_ascii_lowercase().as_str())
            })
            .filter_map(|(name, value)| {
                let name = hyper::header::HeaderName::from_bytes(name.as_bytes()).ok()?;
                let value = hyper::header::HeaderValue::from_str(value.as_str()?).ok()?;
                Some((name, value))
            })
            .collect()
    }

    fn answer(self) -> Answer {
        match self {
            ClientRequest::ClaudeCode => Answer::Messages,
            ClientRequest::Codex => Answer::Responses,
        }
    }
}

#[derive(Clone, Copy)]
struct Target {
    name: &'static str,
    host: Host,
    path: &'static str,
    ask: Ask,
    /// The request body goes chunked (see [`load::Load::chunked`]).
    chunked: bool,
    /// The targets it is measured against: the same request sent straight
    /// and through nginx.
    peers: Peers,
}

impl Target {
    /// A chat completion for `model`, served by `host`.
    const fn chat(name: &'static str, host: Host, model: &'static str) -> Target {
        Target {
            name,
            host,
            path: "/v1/chat/completions",
            ask: Ask::Chat(model),
            chunked: false,
            peers: Peers::SMALL,
        }
    }

    /// A coding agent's request carried by `host`: to the agent where
    /// `agent`, else as it is. Its name, and what it is measured against,
    /// are its request's.
    const fn client(host: Host, request: ClientRequest, agent: bool) -> Target {
        let (path, peers, passthrough, to_agent) = match request {
            ClientRequest::ClaudeCode => (
                "/v1/messages",
                Peers::CLAUDE_CODE,
                "passthrough (Claude Code's request)",
                "agent (Claude Code's request)",
            ),
            ClientRequest::Codex => (
                "/v1/responses",
                Peers::CODEX,
                "passthrough (Codex's request)",
                "agent (Codex's request)",
            ),
        };
        let name = match (host, agent) {
            (_, true) => to_agent,
            (Host::Upstream, false) => peers.direct,
            (Host::Nginx, false) => peers.nginx,
            (Host::Proxy | Host::ProxyB, false) => passthrough,
        };
        Target {
            name,
            host,
            path,
            ask: Ask::Client { request, agent },
            chunked: false,
            peers,
        }
    }
}

const DIRECT: Target = Target::chat("direct", Host::Upstream, "bench");
const NGINX: Target = Target::chat("nginx", Host::Nginx, "bench");
/// `bench` is no agent: forwarded as it is.
const PASSTHROUGH: Target = Target::chat("passthrough", Host::Proxy, "bench");
const AGENT: Target = Target::chat("agent", Host::Proxy, "plain");
/// The same agent through the Responses front door (its upstream still
/// speaks chat completions).
const AGENT_RESPONSES: Target = Target {
    name: "agent (responses)",
    host: Host::Proxy,
    path: "/v1/responses",
    ask: Ask::Responses { stored: true },
    chunked: false,
    peers: Peers::SMALL,
};
/// The same, its answer not kept: the front door's cost without the
/// response store's write.
const AGENT_RESPONSES_UNSTORED: Target = Target {
    name: "agent (responses, store: false)",
    ask: Ask::Responses { stored: false },
    ..AGENT_RESPONSES
};
/// The same agent through the Anthropic Messages front door.
const AGENT_MESSAGES: Target = Target {
    name: "agent (messages)",
    host: Host::Proxy,
    path: "/v1/messages",
    ask: Ask::Messages,
    chunked: false,
    peers: Peers::SMALL,
};
/// Claude Code's and Codex CLI's real requests, tools and all: to the
/// agent, and as they are (straight, through nginx, passed through).
const AGENT_CLAUDE_CODE: Target = Target::client(Host::Proxy, ClientRequest::ClaudeCode, true);
const DIRECT_CLAUDE_CODE: Target = Target::client(Host::Upstream, ClientRequest::ClaudeCode, false);
const NGINX_CLAUDE_CODE: Target = Target::client(Host::Nginx, ClientRequest::ClaudeCode, false);
const PASSTHROUGH_CLAUDE_CODE: Target =
    Target::client(Host::Proxy, ClientRequest::ClaudeCode, false);
const AGENT_CODEX: Target = Target::client(Host::Proxy, ClientRequest::Codex, true);
const DIRECT_CODEX: Target = Target::client(Host::Upstream, ClientRequest::Codex, false);
const NGINX_CODEX: Target = Target::client(Host::Nginx, ClientRequest::Codex, false);
const PASSTHROUGH_CODEX: Target = Target::client(Host::Proxy, ClientRequest::Codex, false);
/// The same three through `--baseline-bin`.
const PASSTHROUGH_B: Target = Target::chat("passthrough (B)", Host::ProxyB, "bench");
const AGENT_B: Target = Target::chat("agent (B)", Host::ProxyB, "plain");
const AGENT_RESPONSES_B: Target = Target {
    name: "agent (responses) (B)",
    host: Host::ProxyB,
    ..AGENT_RESPONSES
};
const AGENT_TOOL: Target = Target::chat("agent + tool round", Host::Proxy, "tooled");
/// Another path (the legacy completions API, served by the fake model like
/// chat), its body chunked: pingora's own proxy path, no agent-proxy code on
/// the way (a body of a given length is forwarded as passthrough's is).
const PINGORA: Target = Target {
    path: "/v1/completions",
    chunked: true,
    ..Target::chat("pingora proxy path", Host::Proxy, "bench")
};
const TOOL: Target = Target {
    name: "tool, direct",
    host: Host::Upstream,
    path: "/tool",
    ask: Ask::Tool,
    chunked: false,
    peers: Peers::SMALL,
};

/// The processes under test and how long to measure each.
struct Bench {
    upstream: Process,
    nginx: Process,
    proxy: Process,
    /// `--baseline-bin`'s process, when given.
    proxy_b: Option<Process>,
    /// How to start agent-proxy again: the memory figures each want a
    /// fresh process.
    proxy_cmd: ProxyCmd,
    addrs: [SocketAddr; 4],
    rounds: u32,
    slice: Duration,
    /// Whether the Responses and Messages targets run.
    fronts: bool,
}

impl Bench {
    /// CPU time of the targets' processes so far: nginx and the proxies.
    fn targets_cpu(&self) -> Duration {
        [Host::Nginx, Host::Proxy]
            .into_iter()
            .map(|host| self.process(host).cpu())
            .chain(self.proxy_b.iter().map(Process::cpu))
            .sum::<Duration>()
    }

    /// The fake model's CPU time and the load generator's (this process's).
    fn rig_cpu(&self) -> Duration {
        self.upstream.cpu() + procs::own_cpu()
    }

    fn process(&self, host: Host) -> &Process {
        match host {
            Host::Upstream => &self.upstream,
            Host::Nginx => &self.nginx,
            Host::Proxy => &self.proxy,
            Host::ProxyB => self
                .proxy_b
                .as_ref()
                .expect("(B) targets run only with --baseline-bin"),
        }
    }

    fn load(&self, target: Target, shape: Shape, connections: usize) -> Load {
        let Shape {
            stream,
            tokens,
            delay_us,
        } = shape;
        let headers = match target.ask {
            Ask::Client { request, .. } => request.headers(),
            _ => Vec::new(),
        };
        let (body, answer): (Bytes, Answer) = match target.ask {
            Ask::Chat(model) => (
                format!(
                    r#"{{"model":"{model}","messages":[{{"role":"user","content":"{PROMPT}"}}],"stream":{stream},"max_tokens":{tokens},"bench_delay_us":{delay_us}}}"#
                )
                .into(),
                Answer::Chat,
            ),
            Ask::Responses { stored } => {
                let model = delay_agent(delay_us);
                let body = format!(
                    r#"{{"model":"{model}","input":"{PROMPT}","stream":{stream},"max_output_tokens":{tokens},"store":{stored}}}"#
                );
                (body.into(), Answer::Responses)
            }
            Ask::Messages => {
                let model = delay_agent(delay_us);
                let body = format!(
                    r#"{{"model":"{model}","messages":[{{"role":"user","content":"{PROMPT}"}}],"stream":{stream},"max_tokens":{tokens}}}"#
                );
                (body.into(), Answer::Messages)
            }
            Ask::Client { request, agent } => {
                let model = if agent { delay_agent(delay_us) } else { "bench".into() };
                (request.body(&model, stream, tokens), request.answer())
            }
            Ask::Tool => (
                Bytes::from_static(br#"{"city":"Paris"}"#),
                Answer::Containing(b"temperature_c"),
            ),
        };
        Load {
            addr: self.addrs[target.host as usize],
            path: target.path,
            body,
            headers,
            chunked: target.chunked,
            stream,
            answer,
            connections,
            warmup: Duration::from_millis(300),
            stagger: Duration::ZERO,
            measure: self.slice,
        }
    }

    /// Runs the same load against each target, `rounds` times in turn.
    async fn compare(
        &self,
        targets: &[Target],
        connections: usize,
        shape: Shape,
        tune: impl Fn(&mut Load),
    ) -> anyhow::Result<Vec<Run>> {
        let targets: Vec<Target> = targets
            .iter()
            .filter(|t| self.fronts || matches!(t.ask, Ask::Chat(_) | Ask::Tool))
            .filter(|t| t.host != Host::ProxyB || self.proxy_b.is_some())
            .copied()
            .collect();
        let mut runs: Vec<Run> = targets
            .iter()
            .map(|t| Run::new(t.name, t.peers, connections))
            .collect();
        for round in 0..self.rounds as usize {
            // Each round starts one target further on: no target always
            // follows the same one, or runs furthest from nginx's turn.
            let start = round % targets.len().max(1);
            let order = (start..targets.len()).chain(0..start);
            for i in order {
                let (target, run) = (&targets[i], &mut runs[i]);
                let mut load = self.load(*target, shape, connections);
                tune(&mut load);
                let process = self.process(target.host);
                let (cpu, rig, targets, busy, started) = (
                    process.cpu(),
                    self.rig_cpu(),
                    self.targets_cpu(),
                    procs::machine_busy(),
                    Instant::now(),
                );
                let stats = load::run(&load).await;
                run.cpu += process.cpu() - cpu;
                let rig = self.rig_cpu() - rig;
                run.rig_cpu += rig;
                // The benchmark's own processes: the rig and the targets.
                let ours = rig + (self.targets_cpu() - targets);
                run.foreign_cpu += (procs::machine_busy() - busy).saturating_sub(ours);
                run.wall += started.elapsed();
                run.rounds.push(stats.throughput());
                run.stats.merge(&stats);
            }
        }
        for run in &runs {
            if run.stats.errors > 0 {
                bail!(
                    "{} at {} connections: {} failed requests, the first: {}",
                    run.target,
                    connections,
                    run.stats.errors,
                    run.stats.first_error.as_deref().unwrap_or("?")
                );
            }
            eprintln!(
                "  {:<20} c{:<4} {:>9.0} req/s  p50 {:>8.1} µs  p99 {:>8.1} µs",
                run.target,
                connections,
                run.stats.throughput(),
                run.stats.latency.value_at_quantile(0.5) as f64 / 1e3,
                run.stats.latency.value_at_quantile(0.99) as f64 / 1e3,
            );
        }
        Ok(runs)
    }

    /// What `count` open streams through `target` cost its process (a
    /// fresh agent-proxy each time, so no stream reuses another's memory):
    /// as they opened, and `settle` later, still open.
    async fn stream_cost(
        &mut self,
        target: Target,
        count: usize,
        settle: Duration,
    ) -> anyhow::Result<StreamCost> {
        if target.host == Host::Proxy {
            self.proxy.stop();
            self.proxy = start_proxy(&self.proxy_cmd, self.addrs[Host::Proxy as usize])?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let shape = Shape {
            stream: true,
            tokens: 10_000,
            delay_us: OPEN_STREAM_TOKEN_US,
        };
        let process = self.process(target.host);
        let before_kib = process.rss_kib();
        let streams = load::open_streams(&self.load(target, shape, 1), count)
            .await
            .with_context(|| format!("{count} streams through {}", target.name))?;
        // Let every stream carry a few chunks.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let open_kib = process.rss_kib();
        // Then what stays while they go on: what opening them left behind
        // (bodies read and let go) is returned to the system meanwhile.
        tokio::time::sleep(settle).await;
        let settled_kib = process.rss_kib();
        drop(streams);
        tokio::time::sleep(Duration::from_secs(1)).await;
        eprintln!(
            "  {:<20} {count} streams: {before_kib} KiB -> {open_kib} KiB, {settled_kib} KiB settled",
            target.name
        );
        Ok(StreamCost {
            target: target.name,
            streams: count,
            before_kib,
            open_kib,
            settled_kib,
        })
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let proxy_bin = match args.proxy_bin.clone() {
        Some(bin) => bin,
        None => std::env::current_exe()?.with_file_name("agent-proxy"),
    };
    let work = std::env::temp_dir().join(format!("agent-proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = measure(&args, &proxy_bin, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    let report = result?;
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("README.md"), report.markdown())?;
    report.chart(&args.out.join("chart.svg"))?;
    println!("{}", report.markdown());
    eprintln!("written to {}", args.out.display());
    Ok(())
}

async fn measure(args: &RunArgs, proxy_bin: &Path, work: &Path) -> anyhow::Result<Report> {
    let smoke = args.smoke;
    let [up, ng, px, px_b] = [
        procs::free_addr()?,
        procs::free_addr()?,
        procs::free_addr()?,
        procs::free_addr()?,
    ];
    let mut upstream_cmd = Command::new(std::env::current_exe()?);
    upstream_cmd.args(["upstream", "--listen", &up.to_string()]);
    let upstream = Process::start(
        "fake upstream",
        upstream_cmd,
        &work.join("upstream.log"),
        up,
    )?;

    std::fs::write(
        work.join("nginx.conf"),
        nginx_conf(work, ng, up, args.access_log),
    )?;
    let mut nginx_cmd = Command::new("nginx");
    nginx_cmd
        .arg("-p")
        .arg(work)
        .arg("-e")
        .arg(work.join("nginx-error.log"))
        .arg("-c")
        .arg(work.join("nginx.conf"));
    let nginx = Process::start("nginx", nginx_cmd, &work.join("nginx.log"), ng)?;

    std::fs::write(
        work.join("proxy.yaml"),
        proxy_conf(px, up) + &args.proxy_yaml + "\n",
    )?;
    let log = if args.access_log { "info" } else { "warn" };
    let proxy_cmd = ProxyCmd {
        bin: proxy_bin.to_owned(),
        work: work.to_owned(),
        log,
    };
    let proxy = start_proxy(&proxy_cmd, px)?;
    // In a directory of its own: its own config, and its own response store.
    let baseline_bin = match (&args.baseline_bin, &args.baseline_yaml) {
        (Some(bin), _) => Some(bin.clone()),
        (None, Some(_)) => Some(proxy_bin.to_owned()),
        (None, None) => None,
    };
    let mut builds = format!("agent-proxy `{}`", shown(proxy_bin));
    if let Some(bin) = &baseline_bin {
        builds += &format!(", \"(B)\" `{}`", shown(bin));
    }
    if args.access_log {
        builds += "; access logs on (nginx `access_log` to a file, agent-proxy `RUST_LOG=info`)";
    }
    let proxy_b = match baseline_bin {
        Some(bin) => {
            let dir = work.join("b");
            std::fs::create_dir_all(&dir)?;
            let yaml = args.baseline_yaml.as_ref().unwrap_or(&args.proxy_yaml);
            std::fs::write(dir.join("proxy.yaml"), proxy_conf(px_b, up) + yaml + "\n")?;
            let cmd = ProxyCmd {
                bin,
                work: dir,
                log,
            };
            Some(start_proxy(&cmd, px_b)?)
        }
        None => None,
    };
    // Idle: started, nothing served yet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_start_kib = proxy.rss_kib();

    let rounds = if smoke { 1 } else { args.rounds.max(1) };
    let seconds = if smoke { 0.5 } else { args.seconds };
    let mut bench = Bench {
        upstream,
        nginx,
        proxy,
        proxy_b,
        proxy_cmd,
        addrs: [up, ng, px, px_b],
        rounds,
        slice: Duration::from_secs_f64(seconds / rounds as f64),
        fronts: !args.chat_only,
    };
    // Non-streaming, pingora's own proxy path runs alongside: the share of
    // the cost that is the framework's rather than agent-proxy's.
    let compared = [
        DIRECT,
        NGINX,
        PINGORA,
        PASSTHROUGH,
        PASSTHROUGH_B,
        AGENT,
        AGENT_B,
        AGENT_RESPONSES,
        AGENT_RESPONSES_B,
        AGENT_RESPONSES_UNSTORED,
        AGENT_MESSAGES,
        DIRECT_CLAUDE_CODE,
        NGINX_CLAUDE_CODE,
        PASSTHROUGH_CLAUDE_CODE,
        AGENT_CLAUDE_CODE,
        DIRECT_CODEX,
        NGINX_CODEX,
        PASSTHROUGH_CODEX,
        AGENT_CODEX,
    ];

    let wanted = |scenario| args.only.is_empty() || args.only.contains(&scenario);

    let mut plain = Vec::new();
    if wanted(Scenario::Plain) || wanted(Scenario::Tool) {
        eprintln!("non-streaming");
        for connections in if smoke { [1, 8, 32] } else { [1, 32, 256] } {
            if connections == 1 || wanted(Scenario::Plain) {
                plain.extend(bench.compare(&compared, connections, SMALL, |_| {}).await?);
            }
        }
    }

    let mut tool = None;
    if wanted(Scenario::Tool) {
        eprintln!("one local tool round");
        let runs = bench.compare(&[AGENT_TOOL, TOOL], 1, SMALL, |_| {}).await?;
        let [tooled, tool_alone] = <[Run; 2]>::try_from(runs).ok().context("two runs")?;
        tool = Some(ToolRound {
            tooled,
            tool: tool_alone,
        });
    }

    let mut streaming = Vec::new();
    if wanted(Scenario::Stream) {
        eprintln!("streaming");
        streaming = bench.streaming(smoke).await?;
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_after_kib = bench.proxy.rss_kib();
    let mut streams = Vec::new();
    if wanted(Scenario::Memory) {
        eprintln!("open streams");
        let count = if smoke { 100 } else { 2_000 };
        // Past jemalloc's `dirty_decay_ms` (10 s), over which its
        // background thread returns freed memory.
        let settle = Duration::from_secs(if smoke { 1 } else { 12 });
        let mut targets = vec![AGENT, PASSTHROUGH, PINGORA, NGINX];
        if bench.fronts {
            targets.extend([AGENT_CLAUDE_CODE, AGENT_CODEX]);
        }
        for target in targets {
            streams.push(bench.stream_cost(target, count, settle).await?);
        }
    }

    Ok(Report {
        machine: procs::machine(),
        commit: git_commit(),
        builds,
        smoke,
        seconds,
        rounds,
        plain,
        tool,
        streaming,
        memory: Memory {
            idle_start_kib,
            idle_after_kib,
            streams,
        },
    })
}

impl Bench {
    /// At one connection, 20-token answers from a fast model (1 ms a
    /// token): short, so that a run holds a hundred and more first tokens
    /// and their p99 is not just the slowest of a dozen. At 256, 200-token
    /// answers from a busy one (10 ms a token).
    async fn streaming(&self, smoke: bool) -> anyhow::Result<Vec<Run>> {
        let compared = [
            DIRECT,
            NGINX,
            PASSTHROUGH,
            PASSTHROUGH_B,
            AGENT,
            AGENT_B,
            AGENT_RESPONSES,
            AGENT_RESPONSES_B,
            AGENT_MESSAGES,
        ];
        let tokens = if smoke { 20 } else { 200 };
        let mut streaming = Vec::new();
        let fast = Shape {
            stream: true,
            tokens: FAST_TOKENS,
            delay_us: FAST_TOKEN_US,
        };
        streaming.extend(self.compare(&compared, 1, fast, |_| {}).await?);
        let (busy, slow) = if smoke {
            (32, SMOKE_BUSY_TOKEN_US)
        } else {
            (256, BUSY_TOKEN_US)
        };
        let answer_time = Duration::from_micros(slow * u64::from(tokens));
        let slow = Shape {
            stream: true,
            tokens,
            delay_us: slow,
        };
        streaming.extend(
            self.compare(&compared, busy, slow, |load| {
                // Spread the clients over one answer's time so they don't
                // arrive in lockstep, and measure whole answers.
                load.stagger = answer_time;
                load.warmup = answer_time + Duration::from_millis(200);
                load.measure = load.measure.max(answer_time * 2);
            })
            .await?,
        );
        Ok(streaming)
    }
}

/// How a proxy under test starts: its binary, its directory (config,
/// response store, log) and its log filter.
struct ProxyCmd {
    bin: PathBuf,
    work: PathBuf,
    log: &'static str,
}

fn start_proxy(cmd: &ProxyCmd, listen: SocketAddr) -> anyhow::Result<Process> {
    let mut command = Command::new(&cmd.bin);
    command
        .arg("--config")
        .arg(cmd.work.join("proxy.yaml"))
        .env("RUST_LOG", cmd.log);
    Process::start("agent-proxy", command, &cmd.work.join("proxy.log"), listen)
}

/// `path` from the working directory, when it is under it.
fn shown(path: &Path) -> String {
    let relative = std::env::current_dir()
        .ok()
        .and_then(|dir| path.strip_prefix(dir).ok().map(Path::to_owned));
    relative.as_deref().unwrap_or(path).display().to_string()
}

fn git_commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// nginx as people run it in front of a model server: keep-alive upstream
/// connections, no buffering (so SSE flows), a request body of up to 1 MiB
/// kept in memory (by default one past 16 KiB, as every coding agent's is,
/// goes to a temporary file first), no access log unless
/// `access_log` (agent-proxy runs at `RUST_LOG=warn`, without its
/// per-request line, to match).
fn nginx_conf(work: &Path, listen: SocketAddr, upstream: SocketAddr, access_log: bool) -> String {
    let log = match access_log {
        true => work.join("nginx-access.log").display().to_string(),
        false => "off".into(),
    };
    format!(
        r#"daemon off;
worker_processes auto;
worker_rlimit_nofile 20000;
pid {pid};
events {{ worker_connections 10000; }}
http {{
  access_log {log};
  keepalive_requests 1000000;
  client_body_buffer_size 1m;
  client_body_temp_path {tmp};
  proxy_temp_path {tmp};
  upstream model {{ server {upstream}; keepalive 512; }}
  server {{
    listen {listen} backlog=4096;
    location / {{
      proxy_pass http://model;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"#,
        pid = work.join("nginx.pid").display(),
        tmp = work.display(),
    )
}

/// What every chat, Responses and Messages request asks.
const PROMPT: &str = "What is the weather in Paris today?";
/// Every agent's system prompt.
const INSTRUCTIONS: &str = "You are a weather assistant.";

fn proxy_conf(listen: SocketAddr, upstream: SocketAddr) -> String {
    let delay_agents: String = AGENT_DELAYS_US
        .iter()
        .map(|delay_us| {
            format!(
                "  {}:\n    system_prompt: \"{INSTRUCTIONS}\"\n    params: {{ bench_delay_us: {delay_us} }}\n",
                delay_agent(*delay_us)
            )
        })
        .collect();
    format!(
        r#"listen: "{listen}"
default_upstream: fake
upstreams:
  fake: {{ url: "http://{upstream}/v1" }}
agents:
  plain:
    system_prompt: "{INSTRUCTIONS}"
  tooled:
    system_prompt: "{INSTRUCTIONS}"
    tools: [lookup]
{delay_agents}tools:
  lookup:
    description: "Current weather for a city"
    parameters: {{ type: object, properties: {{ city: {{ type: string }} }}, required: [city] }}
    http: {{ url: "http://{upstream}/tool", timeout_ms: 5000 }}
limits:
  max_streams_per_client: 100000
"#
    )
}

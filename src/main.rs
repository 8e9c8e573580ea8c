//! The `agent-proxy` binary: load the config, then serve it on pingora.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use clap::Parser;
use pingora::apps::http_app::HttpServer;
use pingora::proxy::http_proxy;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use tracing::{info, warn};

use agent_proxy::children::Reaper;
use agent_proxy::config::Config;
use agent_proxy::knowledge::KnowledgeBuilder;
use agent_proxy::mcp::McpSupervisor;
use agent_proxy::reload::Reloader;
use agent_proxy::service::{Admin, AgentProxy, Edge, Listener};
use agent_proxy::shutdown::Drain;
use agent_proxy::upstream::HealthChecks;

#[derive(Parser)]
#[command(
    version,
    about = "Turns any OpenAI-compatible LLM server into an agent server"
)]
struct Args {
    /// The config file (default: proxy.yaml). It is reloaded on SIGHUP and
    /// when its content changes.
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The config file, given without `--config` (`agent-proxy --check proxy.yaml`).
    #[arg(value_name = "CONFIG", conflicts_with = "config")]
    config_file: Option<PathBuf>,
    /// Validate the config and exit.
    #[arg(long)]
    check: bool,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "AGENT_PROXY_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    log_json: bool,
    /// Longest time in-flight requests get after SIGTERM; the process exits
    /// as soon as the last one is done.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// How often the config file is checked for changes, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    reload_poll_ms: u64,
    /// Zero-downtime upgrade: take over the listening sockets of the running
    /// process (send it SIGQUIT) through `--upgrade-sock`.
    #[arg(long)]
    upgrade: bool,
    /// Unix socket the old and new process hand the listeners over on.
    #[arg(long, default_value = "/tmp/agent-proxy-upgrade.sock")]
    upgrade_sock: String,
}

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read as it starts (`_RJEM_MALLOC_CONF` in the
/// environment overrides them). Its background thread returns freed memory
/// to the system over `dirty_decay_ms` (10 s). Without it, memory is returned
/// only as allocations come and go: the memory a burst of requests left
/// behind (a coding agent's 50 KB requests, read and let go) stayed in the
/// RSS while the streams they opened lasted (bench/results/ab.md).
///
/// A thread caches 200 freed blocks of each small size, not 20: a request's
/// futures (1.7, 2.3 and 4.2 KiB) come in sizes whose bins jemalloc sizes by
/// their slab's few regions, and with a hundred requests in flight on a
/// thread each of them went back and forth between the thread's cache and
/// the arena, building and tearing down slabs (bench/results/ab.md).
///
/// And it trims that cache every 1 MiB a thread allocates, not every 64
/// KiB: an agent's request allocates about 30 KiB, and each trim gave back
/// blocks the next requests took again from the arena (3% of an agent
/// request's instructions at 256 connections, bench/results/ab.md).
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: MallocConf = MallocConf(
    c"background_thread:true,tcache_nslots_small_min:200,tcache_gc_incr_bytes:1048576".as_ptr(),
);

/// jemalloc's `malloc_conf`: a C string.
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: a pointer to a constant string, never written.
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
unsafe impl Sync for MallocConf {}

fn main() -> ExitCode {
    let args = Args::parse();
    agent_proxy::logs::init(args.log_json);

    let config_path = args
        .config
        .or(args.config_file)
        .unwrap_or_else(|| PathBuf::from("proxy.yaml"));
    let config = match Config::load(&config_path) {
        Ok(config) => config,
        Err(e) => {
            // The error names the file, line and key itself.
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.check {
        println!(
            "{}: OK ({} agents, default upstream `{}`)",
            config_path.display(),
            config.agents.len(),
            config.default_upstream.name
        );
        return ExitCode::SUCCESS;
    }
    if config.api_keys.is_empty() {
        warn!("auth.api_keys is empty: every client is allowed");
    }

    let conf = ServerConf {
        threads: config
            .runtime
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        work_stealing: config.runtime.work_stealing,
        // An upper bound only: `Drain` exits as soon as nothing is in flight
        // (pingora's own default is an unconditional 300 s sleep).
        grace_period_seconds: Some(args.shutdown_grace),
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: args.upgrade_sock.clone(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: args.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    agent_proxy::children::follow(server.watch_execution_phase());
    server.bootstrap();

    let listen = config.listen.clone();
    let admin_listen = config.admin_listen.clone();
    info!(%listen, agents = config.agents.len(), "agent-proxy starting");
    let config = Arc::new(ArcSwap::from_pointee(config));

    let proxy = http_proxy(&server.configuration, AgentProxy::new(config.clone()));
    server.add_service(Listener::new(
        "agent-proxy",
        &listen,
        Edge::new(proxy, config.clone()),
    ));
    if let Some(admin_listen) = admin_listen {
        let mut admin = Service::new(
            "admin".into(),
            HttpServer::new_app(Admin::new(config.clone())),
        );
        admin.add_tcp(&admin_listen);
        server.add_service(admin);
    }
    server.add_service(background_service(
        "health checks",
        HealthChecks::new(config.clone(), config_path.clone()),
    ));
    server.add_service(background_service(
        "mcp",
        McpSupervisor::new(config.clone()),
    ));
    server.add_service(background_service(
        "knowledge",
        KnowledgeBuilder::new(config.clone()),
    ));
    let poll = Duration::from_millis(args.reload_poll_ms.max(10));
    server.add_service(background_service(
        "config reload",
        Reloader::new(config_path, config.clone(), poll),
    ));
    let grace = Duration::from_secs(args.shutdown_grace);
    server.add_service(background_service("drain", Drain::new(config, grace)));
    server.add_service(background_service("reaper", Reaper));
    server.run_forever()
}

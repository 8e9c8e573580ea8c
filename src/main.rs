//! The `agent-proxy` binary: load the config, then serve it on pingora.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use arc_swap::ArcSwap;
use clap::Parser;
use pingora::proxy::http_proxy_service;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use tracing::{info, warn};

use agent_proxy::config::Config;
use agent_proxy::service::AgentProxy;

#[derive(Parser)]
#[command(
    version,
    about = "Turns any OpenAI-compatible LLM server into an agent server"
)]
struct Args {
    /// The config file.
    #[arg(long, short, default_value = "proxy.yaml")]
    config: PathBuf,
    /// Validate the config and exit.
    #[arg(long)]
    check: bool,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "AGENT_PROXY_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    log_json: bool,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_json {
        logs.json().init();
    } else {
        logs.init();
    }

    let config = match Config::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{}: {e}", args.config.display());
            return ExitCode::from(2);
        }
    };
    if args.check {
        println!(
            "{}: OK ({} agents, default upstream `{}`)",
            args.config.display(),
            config.agents.len(),
            config.default_upstream.name
        );
        return ExitCode::SUCCESS;
    }
    if config.api_keys.is_empty() {
        warn!("auth.api_keys is empty: every client is allowed");
    }

    let conf = ServerConf {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        // pingora's default grace period is an unconditional 300 s sleep.
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(args.shutdown_grace),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let listen = config.listen.clone();
    info!(%listen, agents = config.agents.len(), "agent-proxy starting");
    let proxy = AgentProxy::new(Arc::new(ArcSwap::from_pointee(config)));
    let mut service = http_proxy_service(&server.configuration, proxy);
    service.add_tcp(&listen);
    server.add_service(service);
    server.run_forever()
}

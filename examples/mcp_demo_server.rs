//! A small MCP server for agent-proxy's tests, on rmcp's server side.
//!
//!     mcp_demo_server stdio
//!     mcp_demo_server http PORT     (streamable HTTP at /mcp on 127.0.0.1)
//!
//! tests/mcp_and_teams.rs finds it, or has cargo build it, in
//! `target/<profile>/examples/`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, CancelledNotificationParam, ContentBlock, Extensions, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{NotificationContext, Peer, RoleServer};
// `schemars` in scope: the JsonSchema derive names it.
use rmcp::schemars::{self, JsonSchema};
use rmcp::serde::Deserialize;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};

/// The first 8 bytes of every PNG file, base64-encoded.
const PNG_SIGNATURE_BASE64: &str = "iVBORw0KGgo=";

/// A connection's server. `grow` adds `echo` to its tools, as servers
/// that load tools on demand do, and says so (`tools/list_changed`).
#[derive(Clone, Default)]
struct Demo {
    grown: Arc<AtomicBool>,
}

/// Offered once `grow` was called.
const GROWN: &str = "echo";

/// Strict, as many servers' schemas are: an argument it doesn't declare is
/// an error.
#[derive(Deserialize, JsonSchema)]
#[serde(crate = "rmcp::serde", deny_unknown_fields)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Deserialize, JsonSchema)]
#[serde(crate = "rmcp::serde")]
struct WhoamiArgs {
    user_id: String,
    #[serde(default)]
    note: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(crate = "rmcp::serde")]
struct EnvArgs {
    name: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(crate = "rmcp::serde")]
struct FailArgs {
    message: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(crate = "rmcp::serde")]
struct EchoArgs {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(crate = "rmcp::serde")]
struct SlowArgs {
    seconds: f64,
}

#[tool_router]
impl Demo {
    /// Add two integers.
    #[tool]
    fn add(&self, Parameters(AddArgs { a, b }): Parameters<AddArgs>) -> String {
        (a + b).to_string()
    }

    /// Say which user the call is for.
    #[tool]
    fn whoami(&self, Parameters(args): Parameters<WhoamiArgs>) -> String {
        format!("user={} note={}", args.user_id, args.note)
    }

    /// Always fails with the message.
    #[tool]
    fn fail(&self, Parameters(FailArgs { message }): Parameters<FailArgs>) -> CallToolResult {
        // A tool-level failure (`isError`), not a JSON-RPC error.
        CallToolResult::error(vec![ContentBlock::text(format!(
            "Error executing tool fail: {message}"
        ))])
    }

    /// Kills the server process mid-call.
    #[tool]
    fn crash(&self) -> String {
        std::process::exit(3)
    }

    /// The value of one of the server's environment variables.
    #[tool]
    fn env(&self, Parameters(EnvArgs { name }): Parameters<EnvArgs>) -> String {
        std::env::var(name).unwrap_or_else(|_| "unset".into())
    }

    /// The server's process id.
    #[tool]
    fn pid(&self) -> String {
        std::process::id().to_string()
    }

    /// A tiny PNG.
    #[tool]
    fn picture(&self) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::image(PNG_SIGNATURE_BASE64, "image/png")])
    }

    /// Sleeps, then answers.
    #[tool]
    async fn slow(&self, Parameters(SlowArgs { seconds }): Parameters<SlowArgs>) -> String {
        // On stderr (a stdio server's is the proxy's log): tests wait for
        // the call to be running before they abandon it.
        eprintln!("mcp_demo_server: slow started");
        // Negative (or NaN) is no wait; too long to represent, forever.
        let wait = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX);
        tokio::time::sleep(wait).await;
        "done".into()
    }

    /// Offers one tool more, `echo`, from now on.
    #[tool]
    async fn grow(&self, peer: Peer<RoleServer>) -> String {
        if self.grown.swap(true, Ordering::SeqCst) {
            return "grown already".into();
        }
        match peer.notify_tool_list_changed().await {
            Ok(()) => "grown".into(),
            Err(e) => format!("grown, unsaid: {e}"),
        }
    }

    /// Says its text back.
    #[tool]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }

    /// The Authorization header of the HTTP request that carried the call.
    #[tool]
    fn auth(&self, extensions: Extensions) -> String {
        // The streamable HTTP transport puts the request's head here; over
        // stdio there is none.
        extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get(http::header::AUTHORIZATION))
            .and_then(|value| value.to_str().ok())
            .unwrap_or("none")
            .to_owned()
    }
}

impl Demo {
    /// The tools as of now: `echo` only once grown.
    fn router(&self) -> ToolRouter<Self> {
        let mut router = Self::tool_router();
        if !self.grown.load(Ordering::SeqCst) {
            router.remove_route(GROWN);
        }
        router
    }
}

#[tool_handler(router = self.router())]
impl ServerHandler for Demo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    /// Says on stderr which call the client gave up on, so a test can see
    /// that `notifications/cancelled` arrived.
    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        let request = notification
            .request_id
            .map_or_else(|| "?".to_owned(), |id| id.to_string());
        eprintln!("mcp_demo_server: notifications/cancelled for request {request}");
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["stdio"] => {
            Demo::default()
                .serve(rmcp::transport::stdio())
                .await?
                .waiting()
                .await?;
        }
        ["http", port] => serve_http(port.parse()?).await?,
        _ => return Err("usage: mcp_demo_server stdio | http PORT".into()),
    }
    Ok(())
}

async fn serve_http(port: u16) -> std::io::Result<()> {
    let mcp = StreamableHttpService::new(
        || Ok(Demo::default()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let mcp = mcp.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let mcp = mcp.clone();
                async move {
                    // Each request's method and path on stderr: what a test
                    // reads to see a session's end (`DELETE /mcp`).
                    eprintln!("{} {}", req.method(), req.uri().path());
                    let response = if req.uri().path() == "/mcp" {
                        mcp.handle(req).await
                    } else {
                        let mut not_found = http::Response::new(Default::default());
                        *not_found.status_mut() = http::StatusCode::NOT_FOUND;
                        not_found
                    };
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            // A connection that breaks only ends that connection.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

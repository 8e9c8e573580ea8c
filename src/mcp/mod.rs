//! MCP servers as tool sources, on the official `rmcp` client.
//!
//! Each configured server is one long-lived connection (a stdio child or a
//! streamable-HTTP session), the runtime built from its spec
//! ([`McpServerFile`]): a reload that leaves a server's name and spec as they
//! were keeps it (`config` reuses the running one), one that changes either
//! starts a new one, and the old one stops with the last config holding it.
//! A supervisor connects servers in
//! the background and reconnects with backoff: a server that is down never
//! stops the proxy or other agents, and a call to one of its tools meanwhile
//! gets a clear error result. A connection ends as MCP's shutdown says, when
//! its server is dropped and at the end of a drain ([`McpServer::close`]): an
//! HTTP session deleted, a stdio server's stdin closed before any signal.
//! A server that says its tools changed (`notifications/tools/list_changed`)
//! is listed again; the new list is what the next request offers.

mod supervisor;

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::{
    MaybeSendFuture, NotificationContext, Peer, RunningService, RunningServiceCancellationToken,
    ServiceError,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use supervisor::McpSupervisor;

use crate::children::Group;
use crate::config::file::McpServerFile;
use crate::conversation::FunctionTool;
use crate::sync::lock;
use crate::tools::{capped_text, CallContext, Injection, Outcome};

/// Separates the server from the tool in the function names models see.
pub const SEPARATOR: &str = "__";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// What a closing server (dropped from the config, or at the end of a
/// drain) gets to end once its stdin is closed, and then once sent SIGTERM,
/// before it is killed.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

type Client = RunningService<RoleClient, Watcher>;

/// What the proxy does with what a server tells it: a changed tool list is
/// passed on to the connection task, which lists the tools again.
struct Watcher(Arc<Notify>);

impl ClientHandler for Watcher {
    fn on_tool_list_changed(
        &self,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        // A permit: changes while a listing runs make one listing more.
        self.0.notify_one();
        std::future::ready(())
    }
}

/// A server's connection task: waiting to be started with its end of
/// `alive` (made with the server, so a close sent before the start is
/// seen), running, or done with.
enum Task {
    Waiting(watch::Receiver<()>),
    Running(JoinHandle<()>),
    Done,
}

enum Transport {
    Stdio {
        argv: Vec<String>,
        env: Vec<(String, String)>,
    },
    Http {
        url: String,
        headers: HashMap<http::HeaderName, http::HeaderValue>,
    },
}

impl Transport {
    /// The credentials among what the server is given: its environment, or
    /// its headers.
    fn secrets(&self) -> Vec<Box<[u8]>> {
        match self {
            Transport::Stdio { env, .. } => {
                crate::mask::credentials(env.iter().map(|(n, v)| (n, v)))
            }
            Transport::Http { headers, .. } => crate::mask::credentials(headers),
        }
    }
}

/// One MCP tool as the model sees it.
#[derive(Clone)]
pub struct McpTool {
    /// The tool's name on the server.
    pub name: String,
    /// The function name the model calls: `<server>__<tool>`.
    pub function: String,
    /// As offered to the model.
    pub offered: Arc<FunctionTool>,
    /// The server's injected parameters this tool declares.
    injection: Injection,
}

struct State {
    /// The open connection's handle for calls, and what ends it.
    client: Option<(Peer<RoleClient>, RunningServiceCancellationToken)>,
    /// The last tool list seen; kept while the server is down, so calls to
    /// its tools get a clear error instead of vanishing from the model's view.
    tools: Arc<Vec<McpTool>>,
    status: String,
}

pub struct McpServer {
    /// The spec it was built from.
    spec: McpServerFile,
    timeout: Duration,
    max_output_bytes: usize,
    /// The credentials among its configured headers or environment, masked
    /// in what it answers (see [`crate::mask`]).
    secrets: Vec<Box<[u8]>>,
    link: Arc<Link>,
    /// The connection task, started once, for [`McpServer::close`] to wait
    /// for.
    task: Mutex<Task>,
    /// Sent to by [`McpServer::close`], or dropped with the server: either
    /// ends its connection task, which closes the connection (and ends a
    /// stdio server's process).
    alive: watch::Sender<()>,
}

/// What the connection task shares with its server: how to connect, and
/// the state calls read. Not the server itself, which it must not keep.
struct Link {
    name: String,
    transport: Transport,
    injection: Injection,
    state: Mutex<State>,
    /// Told by the connection's [`Watcher`] that the tools changed.
    changed: Arc<Notify>,
}

impl McpServer {
    /// The request headers its injected parameters read.
    pub fn injected_headers(&self) -> impl Iterator<Item = &http::HeaderName> {
        self.link.injection.headers()
    }

    /// A server for `name` as `file` configures it, not yet connected (the
    /// supervisor connects it).
    pub fn from_file(name: &str, file: &McpServerFile) -> Result<Self, String> {
        let transport = match (&file.command, &file.url) {
            (Some(argv), None) if !argv.is_empty() && !argv[0].is_empty() => Transport::Stdio {
                argv: argv.clone(),
                env: crate::children::environment(&file.inherit_env, &file.env),
            },
            (None, Some(url)) => {
                let uri: http::Uri = url
                    .parse()
                    .map_err(|e| crate::http_client::invalid_url(url, e))?;
                if let Some(authority) = uri.authority() {
                    crate::http_client::without_credentials(url, authority)?;
                }
                let headers = file
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        let name = http::HeaderName::try_from(k.as_str())
                            .map_err(|_| format!("invalid header name `{k}`"))?;
                        let value = http::HeaderValue::try_from(v.as_str())
                            .map_err(|_| format!("invalid value for header `{k}`"))?;
                        Ok((name, value))
                    })
                    .collect::<Result<_, String>>()?;
                Transport::Http {
                    url: url.clone(),
                    headers,
                }
            }
            _ => return Err("give either `command` (a non-empty argv) or `url`".into()),
        };
        let alive = watch::Sender::new(());
        Ok(McpServer {
            spec: file.clone(),
            timeout: Duration::from_millis(file.timeout_ms),
            max_output_bytes: file.max_output_bytes,
            secrets: transport.secrets(),
            link: Arc::new(Link {
                name: name.to_owned(),
                transport,
                injection: Injection::from_file(&file.inject)?,
                state: Mutex::new(State {
                    client: None,
                    tools: Arc::new(Vec::new()),
                    status: "connecting".into(),
                }),
                changed: Arc::new(Notify::new()),
            }),
            task: Mutex::new(Task::Waiting(alive.subscribe())),
            alive,
        })
    }

    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// Whether this server was built from `spec`.
    pub fn is_built_from(&self, spec: &McpServerFile) -> bool {
        self.spec == *spec
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.link.state()
    }

    /// Starts the task that connects this server and keeps it connected.
    /// The supervisor calls it for each server of every config it loads: a
    /// server a reload kept is started again, and keeps its task (the drain
    /// waits for it), as a closed one stays closed.
    fn start(&self) {
        let mut task = lock(&self.task);
        *task = match std::mem::replace(&mut *task, Task::Done) {
            Task::Waiting(alive) => Task::Running(tokio::spawn(self.link.clone().run(alive))),
            started_or_closed => started_or_closed,
        };
    }

    /// Closes the connection as MCP's shutdown says, as a reload that drops
    /// the server does, and waits for it: the drain's last step, so that an
    /// HTTP session is deleted and a stdio server has its stdin closed
    /// before anything signals it.
    pub async fn close(&self) {
        self.alive.send_replace(());
        let task = std::mem::replace(&mut *lock(&self.task), Task::Done);
        if let Task::Running(task) = task {
            let _ = task.await;
        }
    }

    /// The tools as last listed.
    pub fn tools(&self) -> Arc<Vec<McpTool>> {
        self.state().tools.clone()
    }

    /// `connected (N tools)` or why not, for `/readyz`.
    pub fn status(&self) -> String {
        self.state().status.clone()
    }

    /// Calls `tool` with the model's arguments. Failures become error results.
    pub async fn call(
        &self,
        tool: &str,
        mut arguments: Map<String, Value>,
        ctx: &CallContext,
    ) -> Outcome {
        let client = self.state().client.as_ref().map(|(peer, _)| peer.clone());
        let Some(client) = client else {
            let status = self.status();
            return Outcome::error(format!(
                "MCP server `{}` is not available ({status}); try again later",
                self.name()
            ));
        };
        if let Some(listed) = self.tools().iter().find(|t| t.name == tool) {
            listed.injection.apply(&mut arguments, ctx);
        }
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match tokio::time::timeout(self.timeout, client.call_tool(params)).await {
            Err(_) => Outcome::error(format!(
                "MCP tool `{tool}` timed out after {} ms",
                self.timeout.as_millis()
            )),
            Ok(Err(e)) => {
                // The server process died or the session broke: reconnect.
                if matches!(
                    e,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                ) || client.is_transport_closed()
                {
                    self.link.lost(&e.to_string());
                }
                Outcome::error(format!("MCP server `{}` failed: {e}", self.name()))
            }
            Ok(Ok(result)) => self.outcome(result),
        }
    }

    fn outcome(&self, result: CallToolResult) -> Outcome {
        let mut text = String::new();
        for block in &result.content {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&describe(block));
        }
        if text.is_empty() {
            if let Some(structured) = &result.structured_content {
                text = structured.to_string();
            }
        }
        let text = crate::mask::masked_all(text.into_bytes(), &self.secrets);
        let text = capped_text(&text, self.max_output_bytes, false);
        if result.is_error == Some(true) {
            Outcome::error(text)
        } else {
            Outcome::success(text)
        }
    }
}

impl Link {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Connects, waits for the connection to end (the server quit or a
    /// call found it broken), and connects again, with a backoff that
    /// doubles per failed attempt; until [`McpServer::close`] sends on
    /// `alive` or the server is dropped (which closes it), either of which
    /// closes the connection and ends the server, or the process exits,
    /// which ends it ([`crate::children`]).
    async fn run(self: Arc<Self>, mut alive: watch::Receiver<()>) {
        let mut backoff = FIRST_BACKOFF;
        // Once the process exits, a server that ends is not started again.
        while !crate::children::exiting() {
            // A stdio server's process group, from its start on: one still
            // starting is ended too. The attempt (and its pipes) is gone by
            // the `match`: a server that failed is killed with its group
            // there, not after the backoff.
            let (opened, group) = {
                let starting = Mutex::new(None);
                let mut opening =
                    std::pin::pin!(tokio::time::timeout(CONNECT_TIMEOUT, self.open(&starting)));
                let opened = tokio::select! {
                    opened = &mut opening => {
                        opened.unwrap_or_else(|_| Err("timed out connecting".into()))
                    }
                    _ = alive.changed() => {
                        // Told to end with its pipes still open: a server
                        // still starting writes to them, and one closed
                        // under it fails loudly (Node's `EPIPE` trace).
                        let group = lock(&starting).take();
                        if let Some(group) = group {
                            group.terminate(CLOSE_GRACE).await;
                        }
                        return;
                    }
                };
                let group = lock(&starting).take();
                (opened, group)
            };
            match opened {
                Ok((client, tools)) => {
                    info!(server = %self.name, tools = tools.len(), "MCP server connected");
                    *self.state() = State {
                        status: format!("connected ({} tools)", tools.len()),
                        tools: Arc::new(tools),
                        client: Some((client.peer().clone(), client.cancellation_token())),
                    };
                    backoff = FIRST_BACKOFF;
                    let connection = client.cancellation_token();
                    let peer = client.peer().clone();
                    let mut waiting = std::pin::pin!(client.waiting());
                    tokio::select! {
                        never = self.relist_on_change(&peer) => match never {},
                        _ = &mut waiting => {
                            if crate::children::exiting() {
                                return;
                            }
                            self.lost("the connection closed");
                        }
                        _ = alive.changed() => {
                            // Closed as MCP's stdio shutdown says: its stdin
                            // first, then SIGTERM, then SIGKILL, a moment
                            // each.
                            connection.cancel();
                            let _ = tokio::time::timeout(CLOSE_GRACE, waiting).await;
                            if let Some(group) = group {
                                group.end(CLOSE_GRACE).await;
                            }
                            return;
                        }
                    }
                }
                Err(_) if crate::children::exiting() => return,
                Err(e) => {
                    // A server that failed ends now, not after the backoff.
                    drop(group);
                    self.unavailable(&e, backoff);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = alive.changed() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Lists the tools again each time the server says they changed, for
    /// as long as the connection lasts (the task drops it as it ends). A
    /// listing that fails keeps the last list.
    async fn relist_on_change(&self, peer: &Peer<RoleClient>) -> std::convert::Infallible {
        loop {
            self.changed.notified().await;
            match tokio::time::timeout(CONNECT_TIMEOUT, self.list(peer)).await {
                Ok(Ok(tools)) => {
                    info!(server = %self.name, tools = tools.len(), "MCP server's tools changed");
                    let mut state = self.state();
                    if state.client.is_some() {
                        state.status = format!("connected ({} tools)", tools.len());
                        state.tools = Arc::new(tools);
                    }
                }
                Ok(Err(e)) => {
                    warn!(server = %self.name, reason = %e, "MCP server's changed tools not listed; keeping the last list");
                }
                Err(_) => {
                    warn!(server = %self.name, reason = "timed out", "MCP server's changed tools not listed; keeping the last list");
                }
            }
        }
    }

    /// The connection broke: it is closed, and the connection task
    /// connects again.
    fn lost(&self, why: &str) {
        let mut state = self.state();
        if let Some((_, connection)) = state.client.take() {
            warn!(server = %self.name, reason = why, "MCP server connection lost; reconnecting");
            state.status = format!("down: {why}");
            connection.cancel();
        }
    }

    fn unavailable(&self, why: &str, retry_in: Duration) {
        warn!(server = %self.name, reason = why, retry_in_ms = retry_in.as_millis() as u64, "MCP server unavailable");
        self.state().status = format!("down: {why}");
    }

    /// Connects the server and lists its tools; a stdio server's process
    /// group goes to `group` as it starts, to end with the connection.
    async fn open(&self, group: &Mutex<Option<Group>>) -> Result<(Client, Vec<McpTool>), String> {
        let client = match &self.transport {
            Transport::Stdio { argv, env } => {
                // Started here, not by rmcp's child transport, which kills
                // the server (not what it started) whenever the connection
                // drops: its group is ours to end, with the connection and
                // at the proxy's exit, where it gets SIGTERM first. rmcp
                // speaks over its pipes.
                let mut child = tokio::process::Command::new(&argv[0])
                    .args(&argv[1..])
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .process_group(0)
                    .spawn()
                    .map_err(|e| format!("cannot start `{}`: {e}", argv[0]))?;
                *lock(group) = child.id().and_then(Group::led_by);
                let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                    return Err("cannot attach to the server's pipes".into());
                };
                self.watcher()
                    .serve((stdout, stdin))
                    .await
                    .map_err(|e| e.to_string())?
            }
            Transport::Http { url, headers } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.custom_headers = headers.clone();
                let transport = StreamableHttpClientTransport::from_config(config);
                self.watcher()
                    .serve(transport)
                    .await
                    .map_err(|e| e.to_string())?
            }
        };
        let tools = self.list(client.peer()).await?;
        Ok((client, tools))
    }

    fn watcher(&self) -> Watcher {
        Watcher(self.changed.clone())
    }

    /// The server's tools, as the model sees them.
    async fn list(&self, peer: &Peer<RoleClient>) -> Result<Vec<McpTool>, String> {
        let listed = peer.list_all_tools().await.map_err(|e| e.to_string())?;
        let functions = function_names(&self.name, listed.iter().map(|t| t.name.as_ref()));
        Ok(listed
            .into_iter()
            .zip(functions)
            .map(|(tool, function)| {
                let mut schema = Value::Object((*tool.input_schema).clone());
                let injection = self.injection.declared_in(&schema);
                self.injection.hide(&mut schema);
                let description = tool.description.as_deref().unwrap_or_default();
                McpTool {
                    offered: Arc::new(FunctionTool::function(&function, description, &schema)),
                    name: tool.name.into_owned(),
                    function,
                    injection,
                }
            })
            .collect())
    }
}

/// How a non-text content block reaches the model.
fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!(
            "[image: {}, {} bytes of base64]",
            image.mime_type,
            image.data.len()
        ),
        ContentBlock::Audio(audio) => format!(
            "[audio: {}, {} bytes of base64]",
            audio.mime_type,
            audio.data.len()
        ),
        ContentBlock::Resource(resource) => match serde_json::to_value(&resource.resource) {
            Ok(Value::Object(r)) => match (
                r.get("text").and_then(Value::as_str),
                r.get("uri").and_then(Value::as_str),
            ) {
                (Some(text), _) => text.to_owned(),
                (None, Some(uri)) => format!("[resource: {uri}]"),
                _ => "[resource]".into(),
            },
            _ => "[resource]".into(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link: {}]", link.uri),
        _ => "[content of a kind the proxy does not know]".into(),
    }
}

/// `<server>__<tool>` within OpenAI's function-name rule
/// (`^[a-zA-Z0-9_-]{1,64}$`): other characters become `_`, and a name that
/// is too long keeps its start and ends in a digest of the whole.
pub fn function_name(server: &str, tool: &str) -> String {
    let name: String = format!("{server}{SEPARATOR}{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.len() > 64 {
        true => digested(name, server, tool),
        false => name,
    }
}

/// [`function_name`] for each of a server's `tools`, but where tools make
/// one name (`a.b` and `a_b`): then each of them is told apart by a digest
/// of its own name, whichever order the server lists them in (a history
/// naming one must call the same tool after a reconnect).
fn function_names<'a>(server: &str, tools: impl Iterator<Item = &'a str> + Clone) -> Vec<String> {
    let names: Vec<(String, &str)> = tools
        .map(|tool| (function_name(server, tool), tool))
        .collect();
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for (name, _) in &names {
        *uses.entry(name.as_str()).or_default() += 1;
    }
    let shared: HashSet<String> = uses
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(name, _)| name.to_owned())
        .collect();
    names
        .into_iter()
        .map(|(name, tool)| match shared.contains(&name) {
            true => digested(name, server, tool),
            false => name,
        })
        .collect()
}

/// `name` cut to 55 bytes (ASCII) and ended in a digest of the server's and
/// the tool's own names. The same every run: the prompt stays the same.
fn digested(mut name: String, server: &str, tool: &str) -> String {
    let mut hasher = DefaultHasher::new();
    format!("{server}{SEPARATOR}{tool}").hash(&mut hasher);
    name.truncate(55);
    name.push_str(&format!("_{:08x}", hasher.finish() as u32));
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_names_follow_openai_rules() {
        assert_eq!(function_name("files", "read_file"), "files__read_file");
        assert_eq!(
            function_name("my.server", "get/thing"),
            "my_server__get_thing"
        );
        let tools = ["a.b", "a_b", "a/b", "c"];
        let names = function_names("s", tools.iter().copied());
        // Listed in another order, each keeps its name.
        let mut again = function_names("s", tools.iter().rev().copied());
        again.reverse();
        assert_eq!(names, again);
        assert!(
            names[0].starts_with("s__a_b_") && names[0] != names[1],
            "{names:?}"
        );
        assert!(
            names[1].starts_with("s__a_b_") && names[1] != names[2],
            "{names:?}"
        );
        assert_eq!(names[3], "s__c");
        let distinct: HashSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), 4, "one function name a tool");
        let long = function_name("server", &"x".repeat(100));
        assert_eq!(long.len(), 64);
        assert_ne!(
            long,
            function_name("server", &format!("{}y", "x".repeat(100)))
        );
    }
}

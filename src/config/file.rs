//! The YAML file as written by the operator: the public contract of key names.
//! Everything here is plain data, the spec: `config::load` validates it and
//! builds the runtime objects from it (upstreams with their pools, MCP
//! connections), reusing on a reload those whose spec did not change.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// A second listener for `/metrics`, `/healthz` and `/readyz` without auth.
    #[serde(default)]
    pub admin_listen: Option<String>,
    #[serde(default)]
    pub auth: AuthFile,
    pub default_upstream: String,
    pub upstreams: BTreeMap<String, UpstreamFile>,
    #[serde(default, deserialize_with = "null_as_default_values")]
    pub agents: BTreeMap<String, AgentFile>,
    #[serde(default, deserialize_with = "null_as_default_values")]
    pub skills: BTreeMap<String, SkillFile>,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolFile>,
    /// MCP servers whose tools agents can list as `server/*` or `server/tool`.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerFile>,
    /// Documents agents search (`search_knowledge`), embedded on an upstream.
    #[serde(default)]
    pub knowledge_bases: BTreeMap<String, KnowledgeBaseFile>,
    /// With a router, the model `auto` picks an agent per request.
    #[serde(default)]
    pub router: Option<RouterFile>,
    /// Forward requests for non-agent models and other paths to `default_upstream`.
    #[serde(default = "yes")]
    pub passthrough: bool,
    #[serde(default)]
    pub limits: LimitsFile,
    /// Model names clients hard-code (`claude-*`), mapped to agent ids.
    #[serde(default)]
    pub model_aliases: BTreeMap<String, String>,
    /// Where the chat front puts reasoning (agents may override).
    #[serde(default)]
    pub reasoning_field: ReasoningField,
    /// Where Responses API answers are kept for `previous_response_id`.
    #[serde(default)]
    pub store: StoreFile,
    /// The worker threads; read at start only.
    #[serde(default)]
    pub runtime: RuntimeFile,
}

/// `runtime:`: how many threads serve requests, and how.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeFile {
    /// Worker threads; by default one per CPU the process may use (a
    /// container's CPU limit included).
    pub threads: Option<usize>,
    /// `false` (the default): one single-threaded runtime per thread, each
    /// connection served by one of them, the one with the fewest open as it
    /// is accepted (nginx's worker model); `true`: tokio's work-stealing
    /// scheduler, any connection's work on any thread. Without stealing, a
    /// third more requests went through at 32 connections, with a lower p99
    /// at 256 (bench/results/ab.md).
    pub work_stealing: bool,
}

fn default_listen() -> String {
    "127.0.0.1:8787".into()
}

fn yes() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    #[serde(default)]
    pub api_keys: Vec<ApiKeyFile>,
    /// Keys for `/admin/*` (memories); without one those routes are off.
    #[serde(default)]
    pub admin_keys: Vec<String>,
    /// Whether the request's `user` field names the user (within the key's
    /// tenant) for memory. Off by default: a client could claim anyone.
    #[serde(default)]
    pub trust_user_field: bool,
}

/// A client key: the key alone, or with a name that `inject` can pass to
/// tools as an identity the client cannot forge.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ApiKeyFile {
    Key(String),
    Named { key: String, name: String },
}

/// An upstream as written: a reload that leaves it equal keeps its runtime
/// (pool health, pooled connections).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// One server's base URL. Give either `url` or `endpoints`.
    pub url: Option<String>,
    /// A pool of replicas, each a base URL like `url`.
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub api_key: Option<String>,
    /// PEM file of CAs that replaces the system roots for this upstream.
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default = "default_connect_ms")]
    pub connect_timeout_ms: u64,
    /// Longest wait for the response header (prompt processing included).
    #[serde(default = "default_first_byte_ms")]
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two reads of an answer.
    #[serde(default = "default_idle_ms")]
    pub idle_timeout_ms: u64,
    /// Longest time for one whole upstream call; unset: no limit.
    #[serde(default)]
    pub total_timeout_ms: Option<u64>,
    /// How a pool picks a replica.
    #[serde(default)]
    pub balance: Balance,
    /// Active health checks; on by default for pools (`GET /health`).
    #[serde(default)]
    pub health_check: Option<HealthCheckFile>,
    /// Other replicas tried on a connect failure or a 5xx answer, before any
    /// byte reached the client. Default: up to 2, fewer in smaller pools.
    #[serde(default)]
    pub retries: Option<u32>,
    /// The API agents' requests use: `chat` (default) or `responses`.
    #[serde(default)]
    pub api: UpstreamApi,
    /// Whether its models take the images and files a tool's result holds.
    /// Off unless said: a text model (a llama-server without `--mmproj`,
    /// gpt-oss on vLLM) refuses every request holding one.
    #[serde(default)]
    pub vision: bool,
}

fn default_connect_ms() -> u64 {
    5_000
}

fn default_first_byte_ms() -> u64 {
    300_000
}

fn default_idle_ms() -> u64 {
    120_000
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    #[default]
    RoundRobin,
    LeastInFlight,
    /// The same conversation prefix (system prompt and first user message)
    /// goes to the same replica, so llama.cpp's prompt cache is reused.
    PrefixAffinity,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    /// An absolute path on each replica's host (llama.cpp: `/health`).
    #[serde(default = "default_health_path")]
    pub path: String,
    #[serde(default = "default_health_interval")]
    pub interval_ms: u64,
    #[serde(default = "default_health_timeout")]
    pub timeout_ms: u64,
    /// `false` turns the checks off for a pool.
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for HealthCheckFile {
    fn default() -> Self {
        HealthCheckFile {
            path: default_health_path(),
            interval_ms: default_health_interval(),
            timeout_ms: default_health_timeout(),
            enabled: true,
        }
    }
}

fn default_health_path() -> String {
    "/health".into()
}

fn default_health_interval() -> u64 {
    5_000
}

fn default_health_timeout() -> u64 {
    2_000
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptMode {
    #[default]
    Prepend,
    Append,
    Replace,
}

/// How the client is shown local tool calls while they run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolEvents {
    #[default]
    Reasoning,
    Content,
    Hidden,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningMode {
    #[default]
    Pass,
    Strip,
}

/// The chat front's field for reasoning: LibreChat, Cline and Roo read
/// `reasoning_content`; vLLM renamed it `reasoning`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningField {
    #[default]
    ReasoningContent,
    Reasoning,
    Both,
}

/// The API an upstream is called over for agents.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamApi {
    /// `/chat/completions`: llama.cpp, vLLM and other compatible servers.
    #[default]
    Chat,
    /// `/responses`: OpenAI, whose reasoning models return their reasoning only here.
    Responses,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    pub name: Option<String>,
    pub description: Option<String>,
    pub upstream: Option<String>,
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub system_prompt_mode: PromptMode,
    #[serde(default)]
    pub skills: Vec<String>,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub params: Map<String, Value>,
    #[serde(default = "default_rounds")]
    pub max_tool_rounds: u32,
    #[serde(default)]
    pub tool_events: ToolEvents,
    #[serde(default)]
    pub reasoning: ReasoningMode,
    /// Overrides the top-level `reasoning_field` for this agent.
    #[serde(default)]
    pub reasoning_field: Option<ReasoningField>,
    /// Memory kept across requests: `remember`/`recall`/`forget` tools and
    /// the stored notes injected before the conversation.
    #[serde(default)]
    pub memory: Option<MemoryFile>,
    /// Knowledge bases it searches with `search_knowledge`.
    #[serde(default)]
    pub knowledge: Vec<String>,
    /// Whether the best chunks for the last user message are put before it
    /// on every request, without the model asking.
    #[serde(default)]
    pub knowledge_auto: bool,
}

/// `knowledge_bases.<name>`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeBaseFile {
    /// Files or globs (`docs/**/*.md`), relative to the config file's
    /// directory, or `http(s)://` URLs fetched when the base is built:
    /// text, Markdown or PDF.
    pub sources: Vec<String>,
    #[serde(default)]
    pub embedding: EmbeddingFile,
    #[serde(default)]
    pub chunk: ChunkFile,
    /// Chunks a search returns unless the model asks for fewer or more.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// The embeddings cache (SQLite), relative to the config file's
    /// directory; bases may share one.
    #[serde(default = "default_knowledge_path")]
    pub path: String,
    /// Where the chunks and vectors are searched.
    #[serde(default)]
    pub index: KnowledgeIndexFile,
}

/// `knowledge_bases.<name>.index`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeIndexFile {
    #[serde(default)]
    pub kind: IndexKind,
    /// Postgres's URL (`postgres://user:password@host:5432/db`).
    pub url: Option<String>,
    /// PEM file of CAs that replaces the system roots for Postgres's TLS;
    /// relative to the config file's directory.
    pub ca_file: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexKind {
    /// In this process's memory, its vectors cached in `path`: no server.
    #[default]
    Embedded,
    /// A table in Postgres with pgvector, shared by every replica.
    Postgres,
}

fn default_top_k() -> usize {
    5
}

fn default_knowledge_path() -> String {
    "knowledge.sqlite3".into()
}

/// Where chunks are embedded: `POST /v1/embeddings` on an upstream.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingFile {
    /// Default: `default_upstream`.
    pub upstream: Option<String>,
    /// The `model` field sent; omitted when unset (llama-server serves one).
    pub model: Option<String>,
}

/// Chunking, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkFile {
    pub size: usize,
    pub overlap: usize,
}

impl Default for ChunkFile {
    fn default() -> Self {
        ChunkFile {
            size: 1000,
            overlap: 200,
        }
    }
}

/// `agents.<id>.memory`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryFile {
    /// Whose notes: one scope or several (`[user, agent]`), each kept and
    /// injected apart.
    pub scope: OneOrMany<MemoryScope>,
    /// Notes kept per scope (and user or session); the oldest go first.
    #[serde(default = "default_memory_items")]
    pub max_items: usize,
    /// Whether the notes are put in the system prompt of every request.
    #[serde(default = "yes")]
    pub inject: bool,
    /// The injected notes' budget, estimated at 4 bytes a token; the
    /// newest notes are kept.
    #[serde(default = "default_memory_tokens")]
    pub max_inject_tokens: usize,
    /// The longest note `remember` keeps, in characters.
    #[serde(default = "default_memory_chars")]
    pub max_item_chars: usize,
}

fn default_memory_items() -> usize {
    100
}

fn default_memory_tokens() -> usize {
    1000
}

fn default_memory_chars() -> usize {
    1000
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// The request's user (the key's identity): every session of theirs.
    User,
    /// One conversation of one user.
    Session,
    /// The agent's own notes, shared by every user.
    Agent,
}

/// A value or a list of them (`scope: user` or `scope: [user, agent]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    pub fn to_vec(&self) -> Vec<T> {
        match self {
            OneOrMany::One(one) => vec![one.clone()],
            OneOrMany::Many(many) => many.clone(),
        }
    }
}

fn default_rounds() -> u32 {
    8
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillFile {
    pub prompt: Option<String>,
    #[serde(default)]
    pub tools: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFile {
    #[serde(default)]
    pub description: String,
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
    pub http: Option<HttpToolFile>,
    pub command: Option<CommandToolFile>,
    /// Cap on the result handed to the model; longer output is truncated.
    #[serde(default = "default_output_cap")]
    pub max_output_bytes: usize,
    /// Parameters the proxy fills in from the request; the model never sees them.
    #[serde(default)]
    pub inject: BTreeMap<String, InjectFile>,
}

/// Where an injected parameter's value comes from: exactly one of these.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectFile {
    /// Of the request: `user` (the client's field) or `session` (its
    /// session id).
    pub request: Option<String>,
    /// A header of the client's request.
    pub header: Option<String>,
    /// A constant.
    pub value: Option<Value>,
    /// An environment variable of the proxy, read when the config loads.
    pub env: Option<String>,
    /// The matched client key's: `name`.
    pub api_key: Option<String>,
}

/// An MCP server as written: a reload that leaves it equal keeps its
/// connection (and a stdio server's process).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerFile {
    /// A stdio server: the program and its arguments (no shell).
    pub command: Option<Vec<String>>,
    /// Variables set for a stdio server. Its environment starts empty.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables a stdio server gets from the proxy's environment.
    #[serde(default = "default_mcp_inherited_env")]
    pub inherit_env: Vec<String>,
    /// A streamable-HTTP server.
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest time for one `tools/call`.
    #[serde(default = "default_tool_timeout")]
    pub timeout_ms: u64,
    #[serde(default = "default_output_cap")]
    pub max_output_bytes: usize,
    /// Injected parameters for every tool of this server that declares them.
    #[serde(default)]
    pub inject: BTreeMap<String, InjectFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterFile {
    /// Where the routing question goes; default: `default_upstream`.
    pub upstream: Option<String>,
    pub model: Option<String>,
    /// The agent that answers when routing fails or names no agent.
    pub default_agent: String,
    #[serde(default = "default_router_timeout")]
    pub timeout_ms: u64,
}

fn default_router_timeout() -> u64 {
    10_000
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

fn default_output_cap() -> usize {
    32 * 1024
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolFile {
    pub url: String,
    #[serde(default = "default_tool_timeout")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandToolFile {
    pub argv: Vec<String>,
    #[serde(default = "default_tool_timeout")]
    pub timeout_ms: u64,
    /// Working directory; defaults to the proxy's own.
    pub cwd: Option<String>,
    /// Variables set for the child. Its environment starts empty.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables copied from the proxy's environment.
    #[serde(default = "default_inherited_env")]
    pub inherit_env: Vec<String>,
}

fn default_tool_timeout() -> u64 {
    30_000
}

fn default_inherited_env() -> Vec<String> {
    vec!["PATH".into()]
}

/// What the MCP SDKs' stdio clients pass a server by default (Python's
/// `get_default_environment`, TypeScript's `getDefaultEnvironment`): enough
/// for `npx` and `uvx` to find their caches, none of the proxy's secrets.
fn default_mcp_inherited_env() -> Vec<String> {
    ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"]
        .map(String::from)
        .to_vec()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsFile {
    pub max_body_bytes: usize,
    /// Messages in one chat request.
    pub max_messages: usize,
    /// SSE comment sent to a streaming client while it would otherwise wait in silence.
    pub heartbeat_ms: u64,
    /// One agent request, all rounds and tools included.
    pub request_timeout_ms: u64,
    /// Event streams one client (API key, or address without auth) may hold open; 0: no limit.
    pub max_streams_per_client: usize,
    /// The largest SSE event accepted from an upstream.
    pub max_event_bytes: usize,
    /// Local tool calls run from one model turn; the rest get an error result.
    pub max_tool_calls_per_turn: usize,
    /// Local tool calls of one turn running at once.
    pub max_concurrent_tool_calls: usize,
    /// JSON values in one request body (each costs ~32 bytes parsed).
    pub max_json_values: usize,
    /// How long an idle keep-alive client connection is kept open.
    pub keepalive_timeout_ms: u64,
    /// A request's head, once its first byte came, must be whole within this.
    pub header_timeout_ms: u64,
    /// Each write of a response to a client may wait this long for the
    /// client to take it.
    pub send_timeout_ms: u64,
    /// Open client connections; at the cap the one idle the longest is
    /// closed to make room. 0: no limit.
    pub max_connections: usize,
}

impl Default for LimitsFile {
    fn default() -> Self {
        LimitsFile {
            max_body_bytes: 16 * 1024 * 1024,
            max_messages: 2048,
            heartbeat_ms: 10_000,
            request_timeout_ms: 30 * 60 * 1000,
            max_streams_per_client: 64,
            max_event_bytes: 8 * 1024 * 1024,
            max_tool_calls_per_turn: 16,
            max_concurrent_tool_calls: 8,
            max_json_values: 1 << 18,
            // nginx's default.
            keepalive_timeout_ms: 75_000,
            // nginx's client_header_timeout.
            header_timeout_ms: 60_000,
            // nginx's send_timeout.
            send_timeout_ms: 60_000,
            max_connections: 10_000,
        }
    }
}

/// `store:`: the response store.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreFile {
    pub kind: StoreKind,
    /// SQLite's file; relative to the config file's directory.
    pub path: Option<String>,
    /// Redis's URL (`redis://[:password@]host:port[/db]`, `rediss://` for TLS).
    pub url: Option<String>,
    /// How long a response is kept.
    pub ttl_seconds: u64,
    /// A response whose input and output together are larger is not kept.
    pub max_response_bytes: usize,
    /// Whether a request that does not say (`store` absent) is kept, as
    /// OpenAI does.
    pub store_by_default: bool,
}

impl Default for StoreFile {
    fn default() -> Self {
        StoreFile {
            kind: StoreKind::Sqlite,
            path: None,
            url: None,
            // OpenAI's 30 days.
            ttl_seconds: 30 * 24 * 3600,
            max_response_bytes: 16 * 1024 * 1024,
            store_by_default: true,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// An embedded SQLite file: no server, kept across restarts.
    #[default]
    Sqlite,
    /// Shared by every replica.
    Redis,
    /// This process only.
    Memory,
    /// Stateless: `previous_response_id` is refused.
    None,
}

/// Lets a one-line entry (`helper:` with no value) stand for all defaults.
fn null_as_default_values<'de, D, T>(de: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    let map = BTreeMap::<String, Option<T>>::deserialize(de)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or_default()))
        .collect())
}

//! Configuration: read the YAML, expand `${VAR}`s into the spec as written
//! (`file.rs`), check every reference and build from it the runtime [`Config`]
//! a request works with.
//!
//! Spec and runtime are apart: the objects with state of their own — an
//! upstream (its pool's health, ejected replicas, pooled connections, DNS
//! answers) and an MCP server (its connection, a stdio server's process) —
//! are built from their spec, and a reload ([`Config::load_reusing`]) keeps
//! each one whose name and spec are unchanged. Agents, tools and the rest are
//! cheap and stateless: rebuilt every time.

mod expand;
pub mod file;
mod held;
mod locate;

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_yaml_ng::Value as Yaml;

use crate::agent::router::Router;
use crate::agent::{Agent, AgentTool};
use crate::conversation::FunctionTool;
use crate::knowledge::KnowledgeBase;
use crate::mcp::{self, McpServer};
use crate::store::Store;
use crate::tools::Tool;
use crate::upstream::Upstream;
pub use file::RuntimeFile as Runtime;
use file::{ApiKeyFile, ConfigFile, IndexKind, McpServerFile, StoreFile, StoreKind, UpstreamFile};
pub use held::Held;
pub use locate::KeyPath;
use locate::{locate, Location};

/// A loaded, validated configuration. Requests hold an `Arc` of the one they
/// started with.
pub struct Config {
    pub listen: String,
    pub admin_listen: Option<String>,
    pub api_keys: Vec<ApiKey>,
    /// Bearer keys for `/admin/*`; none: those routes are off.
    pub admin_keys: Vec<String>,
    /// The request's `user` field names the user for memory.
    pub trust_user_field: bool,
    pub default_upstream: Arc<Upstream>,
    /// Every upstream, for health checks.
    pub upstreams: BTreeMap<String, Arc<Upstream>>,
    pub agents: BTreeMap<String, Arc<Agent>>,
    /// The client's request headers an agent's calls may read: those its
    /// tools inject, and `Authorization` when the proxy has no keys (it
    /// goes on to the upstream). Only these are kept for the call.
    pub context_headers: Vec<http::HeaderName>,
    /// `model_aliases`: names clients hard-code, mapped to agents.
    pub aliases: Vec<ModelAlias>,
    pub mcp_servers: BTreeMap<String, Arc<McpServer>>,
    /// Built in the background (`knowledge::KnowledgeBuilder`).
    pub knowledge_bases: BTreeMap<String, Arc<KnowledgeBase>>,
    /// Present when the model `auto` routes requests to agents.
    pub router: Option<Router>,
    pub passthrough: bool,
    /// The response store; `None` with `store: { kind: none }`.
    pub store: Option<Arc<Store>>,
    pub limits: Limits,
    /// Threads and scheduler: read at start, a reload leaves them.
    pub runtime: Runtime,
    /// When it was loaded (seconds since the epoch): its agents' `created`
    /// in the model list, the same from one listing to the next.
    pub loaded_at: u64,
    /// [`fingerprint`] of the file's text this config was loaded from
    /// (`None` when parsed from a string): the reloader's baseline, so a
    /// change written between loading and watching is not taken as seen.
    pub source: Option<u64>,
    /// Set once a reload put another config in this one's place.
    pub superseded: Superseded,
}

/// Whether a reload replaced a [`Config`]: background work (health checks,
/// MCP connections, knowledge builds) sleeps until it has something due or
/// its config is superseded, rather than waking on a timer to look.
#[derive(Default)]
pub struct Superseded(tokio::sync::watch::Sender<bool>);

impl Superseded {
    /// Called by the reloader once the new config is in place.
    pub fn mark(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once [`mark`](Self::mark) was called, even before this call.
    pub async fn wait(&self) {
        let mut marked = self.0.subscribe();
        // The sender is `self`: it outlives this wait, so this never fails.
        let _ = marked.wait_for(|&marked| marked).await;
    }
}

/// What the reloader compares to tell that the config file changed.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// A client key (`auth.api_keys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub key: String,
    /// The operator's name for whoever holds it, for `inject`.
    pub name: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_messages: usize,
    pub heartbeat: Duration,
    pub request_timeout: Duration,
    pub max_streams_per_client: usize,
    /// Largest SSE event accepted from an upstream.
    pub max_event_bytes: usize,
    /// The most one upstream answer may carry to an agent, read whole
    /// (errors, JSON answers) or streamed (a round's events).
    pub max_upstream_body_bytes: usize,
    pub max_tool_calls_per_turn: usize,
    /// At least 1.
    pub max_concurrent_tool_calls: usize,
    pub max_json_values: usize,
    /// Longest wait for the next request on a client connection.
    pub keepalive_timeout: Duration,
    /// The longest a request's head may take to arrive, once begun.
    pub header_timeout: Duration,
    /// The longest one write of a response may wait for the client to read.
    pub send_timeout: Duration,
    /// Open client connections (0: no limit).
    pub max_connections: usize,
}

/// What is wrong with a config, as one line for the operator: where in the
/// file, the key, and what was expected (`proxy.yaml:42:7:
/// agents.weather.skills[0]: no skill named `x` (defined skills: a, b)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The bad key (`agents.weather.skills[0]`); empty for the file as a whole.
    pub key: String,
    /// The whole line, location and key included.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A problem found while loading, before it is placed in the text.
#[derive(Debug)]
struct Invalid {
    key: KeyPath,
    message: String,
    /// Known for YAML syntax errors; found from `key` for the others.
    at: Option<Location>,
}

fn error(key: KeyPath, message: impl Into<String>) -> Invalid {
    Invalid {
        key,
        message: message.into(),
        at: None,
    }
}

impl Invalid {
    /// The operator's line: `file:line:column: key: message`; without a file
    /// name, `line L, column C: key: message`.
    fn render(self, file: Option<&str>, text: &str) -> ConfigError {
        let at = self.at.or_else(|| locate(text, &self.key));
        let key = self.key.to_string();
        let mut message = match (file, at) {
            (Some(file), Some(at)) => format!("{file}:{}:{}: ", at.line, at.column),
            (Some(file), None) => format!("{file}: "),
            (None, Some(at)) => format!("line {}, column {}: ", at.line, at.column),
            (None, None) => String::new(),
        };
        if !key.is_empty() {
            message.push_str(&key);
            message.push_str(": ");
        }
        message.push_str(&self.message);
        ConfigError { key, message }
    }
}

/// `no skill named `x` (defined skills: a, b)`: what was asked for and what
/// it could have been.
fn no_such<'a>(kind: &str, name: &str, defined: impl IntoIterator<Item = &'a String>) -> String {
    const SHOWN: usize = 20;
    let defined: Vec<&str> = defined.into_iter().map(String::as_str).collect();
    let choices = match defined.len() {
        0 => format!("no {kind}s are defined"),
        n if n > SHOWN => format!("defined {kind}s: {}, …", defined[..SHOWN].join(", ")),
        _ => format!("defined {kind}s: {}", defined.join(", ")),
    };
    format!("no {kind} named `{name}` ({choices})")
}

impl Config {
    /// Reads and checks the config file; errors name the file, line and key.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, &Previous(None))
    }

    /// [`Config::load`] for a reload: upstreams and MCP servers whose spec is
    /// unchanged from `previous` are `previous`'s own, state and all.
    pub fn load_reusing(path: &Path, previous: &Config) -> Result<Config, ConfigError> {
        Self::load_with(path, &Previous(Some(previous)))
    }

    fn load_with(path: &Path, previous: &Previous) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            key: String::new(),
            message: format!("{file}: cannot read the config file: {e}"),
        })?;
        // Relative paths in the config (the store's file) are the file's own.
        let base = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let mut config = parse_text(&text, &|name| std::env::var(name).ok(), previous, base)
            .map_err(|invalid| invalid.render(Some(&file), &text))?;
        config.source = Some(fingerprint(text.as_bytes()));
        Ok(config)
    }

    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        parse_text(text, &env, &Previous(None), Path::new("."))
            .map_err(|invalid| invalid.render(None, text))
    }

    pub fn agent(&self, id: &str) -> Option<&Arc<Agent>> {
        self.agents.get(id).or_else(|| {
            self.aliases
                .iter()
                .find(|alias| alias.matches(id))
                .map(|alias| &alias.agent)
        })
    }
}

/// A model name (or, ending in `*`, a prefix) that stands for an agent.
#[derive(Clone)]
pub struct ModelAlias {
    name: String,
    prefix: bool,
    agent: Arc<Agent>,
}

impl ModelAlias {
    fn new(pattern: &str, agent: Arc<Agent>) -> Self {
        let (name, prefix) = match pattern.strip_suffix('*') {
            Some(prefix) => (prefix.to_owned(), true),
            None => (pattern.to_owned(), false),
        };
        ModelAlias {
            name,
            prefix,
            agent,
        }
    }

    fn matches(&self, model: &str) -> bool {
        if self.prefix {
            model.starts_with(&self.name)
        } else {
            model == self.name
        }
    }
}

/// The config a reload replaces, whose runtime objects are kept where their
/// spec did not change.
struct Previous<'a>(Option<&'a Config>);

impl Previous<'_> {
    fn upstream(&self, name: &str, spec: &UpstreamFile) -> Option<Arc<Upstream>> {
        let kept = self.0?.upstreams.get(name)?;
        kept.is_built_from(spec).then(|| kept.clone())
    }

    fn mcp_server(&self, name: &str, spec: &McpServerFile) -> Option<Arc<McpServer>> {
        let kept = self.0?.mcp_servers.get(name)?;
        kept.is_built_from(spec).then(|| kept.clone())
    }

    fn knowledge_base(&self, name: &str) -> Option<&KnowledgeBase> {
        self.0?.knowledge_bases.get(name).map(|base| &**base)
    }

    /// `Some(store)` when the previous config had this very store spec:
    /// its connection (and pending writes) carry over.
    fn store(&self, spec: &StoreFile) -> Option<Option<Arc<Store>>> {
        let previous = self.0?;
        match &previous.store {
            Some(kept) => kept.is_built_from(spec).then(|| Some(kept.clone())),
            None => (spec.kind == StoreKind::None).then_some(None),
        }
    }
}

/// [`parse_expanded`], its error never showing a value `${VAR}` brought in
/// (how secrets are given: a key, a URL's password): `${VAR}` stands in its
/// place. The message goes to a terminal, and to the log on a reload.
fn parse_text(
    text: &str,
    env: &impl Fn(&str) -> Option<String>,
    previous: &Previous,
    base: &Path,
) -> Result<Config, Invalid> {
    let brought = std::cell::RefCell::new(Vec::new());
    let recording = |name: &str| {
        let value = env(name);
        if let Some(value) = value.as_ref().filter(|v| v.len() >= SHOWN_UNDER) {
            brought
                .borrow_mut()
                .push((value.clone(), format!("${{{name}}}")));
        }
        value
    };
    parse_expanded(text, &recording, previous, base).map_err(|mut invalid| {
        // The longest first: a value inside another is not cut from it.
        let mut brought = brought.into_inner();
        brought.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        for (value, name) in &brought {
            invalid.message = invalid.message.replace(value.as_str(), name);
        }
        invalid
    })
}

/// Values from the environment this short stay in error messages (a port,
/// a flag); masking them would garble the message around them.
const SHOWN_UNDER: usize = 6;

fn parse_expanded(
    text: &str,
    env: &impl Fn(&str) -> Option<String>,
    previous: &Previous,
    base: &Path,
) -> Result<Config, Invalid> {
    let mut yaml: Yaml = serde_yaml_ng::from_str(text).map_err(|e| {
        let at = Location::of(&e);
        // The position leads the line; libyaml's own copy of it goes.
        let mut message = e.to_string();
        if let Some(at) = at {
            message =
                message.replacen(&format!(" at line {} column {}", at.line, at.column), "", 1);
        }
        Invalid {
            key: KeyPath::default(),
            message: format!("invalid YAML: {message}"),
            at,
        }
    })?;
    if yaml.is_null() {
        return Err(error(
            KeyPath::default(),
            "the config is empty: it needs at least `default_upstream` and `upstreams`",
        ));
    }
    expand_strings(&mut yaml, &mut KeyPath::default(), env)?;
    let file: ConfigFile = serde_path_to_error::deserialize(yaml)
        .map_err(|e| error(KeyPath::from_serde(e.path()), e.into_inner().to_string()))?;
    resolve(file, previous, base)
}

/// Replaces `${VAR}` in every string value, tracking the key path for errors.
fn expand_strings(
    value: &mut Yaml,
    path: &mut KeyPath,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(), Invalid> {
    match value {
        Yaml::String(s) => {
            *s = expand::expand(s, env).map_err(|m| error(path.clone(), m))?;
        }
        Yaml::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push_index(i);
                expand_strings(item, path, env)?;
                path.pop();
            }
        }
        Yaml::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                path.push_key(key.as_str().unwrap_or("?"));
                expand_strings(item, path, env)?;
                path.pop();
            }
        }
        Yaml::Tagged(tagged) => expand_strings(&mut tagged.value, path, env)?,
        _ => {}
    }
    Ok(())
}

/// The functions memory and knowledge give an agent.
const BUILT_IN_TOOLS: [&str; 4] = ["remember", "recall", "forget", "search_knowledge"];

/// The prefix of the functions agents are called by (`agent__<id>`).
const AGENTS: &str = "agent";

/// Fields of a chat request the proxy manages itself: not settable as `params`.
const MANAGED_FIELDS: &[&str] = &["model", "messages", "tools", "stream", "stream_options"];

fn resolve(file: ConfigFile, previous: &Previous, base: &Path) -> Result<Config, Invalid> {
    let mut upstreams = BTreeMap::new();
    for (name, spec) in file.upstreams {
        let upstream = match previous.upstream(&name, &spec) {
            Some(kept) => kept,
            None => Arc::new(
                Upstream::from_file(&name, spec)
                    .map_err(|m| error(KeyPath::of(&["upstreams", &name]), m))?,
            ),
        };
        upstreams.insert(name, upstream);
    }
    let find_upstream = |key: KeyPath, name: &str| {
        upstreams
            .get(name)
            .cloned()
            .ok_or_else(|| error(key, no_such("upstream", name, upstreams.keys())))
    };
    let default_upstream =
        find_upstream(KeyPath::of(&["default_upstream"]), &file.default_upstream)?;

    let mut tools = BTreeMap::new();
    for (name, tool) in file.tools {
        let key = KeyPath::of(&["tools", &name]);
        if !is_function_name(&name) {
            return Err(error(
                key,
                "a tool name must be 1-64 letters, digits, `_` or `-`",
            ));
        }
        // The proxy's own functions' names, and those of MCP servers' and
        // agents' tools: a tool by one of them would hide it, or be hidden.
        let reserved = BUILT_IN_TOOLS.contains(&name.as_str())
            || name.split_once(mcp::SEPARATOR).is_some_and(|(prefix, _)| {
                prefix == AGENTS || file.mcp_servers.contains_key(prefix)
            });
        if reserved {
            return Err(error(
                key,
                format!(
                    "`{name}` is the name of a function the proxy makes ({}, `agent__<id>`, `<mcp server>__<tool>`)",
                    BUILT_IN_TOOLS.join(", ")
                ),
            ));
        }
        let resolved = Tool::from_file(&name, tool).map_err(|m| error(key, m))?;
        tools.insert(name, Arc::new(resolved));
    }
    let mut mcp_servers = BTreeMap::new();
    for (name, spec) in &file.mcp_servers {
        let key = KeyPath::of(&["mcp_servers", name]);
        if !is_function_name(name) || name.contains(mcp::SEPARATOR) {
            return Err(error(
                key,
                "a server name must be 1-64 letters, digits, `_` or `-`, without `__`",
            ));
        }
        if name == AGENTS {
            return Err(error(
                key,
                "`agent` is taken: agents called as tools are the functions `agent__<id>`",
            ));
        }
        let server = match previous.mcp_server(name, spec) {
            Some(kept) => kept,
            None => Arc::new(McpServer::from_file(name, spec).map_err(|m| error(key, m))?),
        };
        mcp_servers.insert(name.clone(), server);
    }
    let mut knowledge_bases = BTreeMap::new();
    for (name, spec) in file.knowledge_bases {
        let key = |field: &str| KeyPath::of(&["knowledge_bases", &name, field]);
        if spec.sources.is_empty() {
            return Err(error(key("sources"), "needs at least one file or glob"));
        }
        for (i, source) in spec.sources.iter().enumerate() {
            let url = crate::knowledge::is_url(source).then(|| {
                source
                    .parse::<http::Uri>()
                    .ok()
                    .filter(|u| u.authority().is_some())
            });
            if url == Some(None) {
                return Err(error(
                    key("sources").index(i),
                    format!("not a valid URL: `{source}`"),
                ));
            }
        }
        if spec.chunk.size == 0 || spec.chunk.overlap >= spec.chunk.size {
            return Err(error(
                key("chunk"),
                "`size` must be greater than 0 and `overlap` smaller than `size`",
            ));
        }
        if spec.top_k == 0 {
            return Err(error(key("top_k"), "must be greater than 0"));
        }
        if spec.index.kind == IndexKind::Postgres {
            let url = spec.index.url.as_deref().unwrap_or_default();
            // The URL holds a password: the error does not repeat it.
            let why = if url.is_empty() {
                Some("a postgres index needs `url` (postgres://user:password@host:5432/db)".into())
            } else {
                url.parse::<tokio_postgres::Config>()
                    .err()
                    .map(|e| format!("not a valid Postgres URL ({e})"))
            };
            if let Some(why) = why {
                return Err(error(key("index").key("url"), why));
            }
        }
        let upstream = match &spec.embedding.upstream {
            None => default_upstream.clone(),
            Some(upstream) => find_upstream(key("embedding").key("upstream"), upstream)?,
        };
        let previous = previous.knowledge_base(&name);
        let base = KnowledgeBase::from_file(&name, spec, upstream, base, previous)
            .map_err(|m| error(key("index"), m))?;
        knowledge_bases.insert(name, Arc::new(base));
    }
    // Each agent as a function another agent may call.
    let agent_functions: BTreeMap<String, Arc<FunctionTool>> = file
        .agents
        .iter()
        .map(|(id, agent)| {
            let name = agent.name.as_deref().unwrap_or(id);
            let description = agent.description.as_deref().unwrap_or_default();
            let offered = crate::agent::toolset::agent_function(id, name, description);
            (id.clone(), Arc::new(offered))
        })
        .collect();
    // `tool`, `server/*`, `server/tool` or `agent:<id>`.
    let find_tool = |key: KeyPath, name: &str| -> Result<AgentTool, Invalid> {
        if let Some(id) = name.strip_prefix("agent:") {
            return match agent_functions.get(id) {
                Some(offered) => Ok(AgentTool::Agent {
                    id: id.to_owned(),
                    offered: offered.clone(),
                }),
                None => Err(error(key, no_such("agent", id, agent_functions.keys()))),
            };
        }
        if let Some((server, tool)) = name.split_once('/') {
            let server = mcp_servers
                .get(server)
                .cloned()
                .ok_or_else(|| error(key, no_such("MCP server", server, mcp_servers.keys())))?;
            let tool = (tool != "*").then(|| tool.to_owned());
            return Ok(AgentTool::Mcp { server, tool });
        }
        tools
            .get(name)
            .cloned()
            .map(AgentTool::Local)
            .ok_or_else(|| error(key, no_such("tool", name, tools.keys())))
    };

    let mut skills = BTreeMap::new();
    for (name, skill) in &file.skills {
        let skill_tools = skill
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| find_tool(KeyPath::of(&["skills", name, "tools"]).index(i), t))
            .collect::<Result<Vec<_>, _>>()?;
        skills.insert(name.clone(), (skill.prompt.clone(), skill_tools));
    }

    let mut agents = BTreeMap::new();
    for (id, agent) in file.agents {
        let key = |field: &str| KeyPath::of(&["agents", &id, field]);
        let upstream = match &agent.upstream {
            None => default_upstream.clone(),
            Some(name) => find_upstream(key("upstream"), name)?,
        };
        if let Some(field) = agent
            .params
            .keys()
            .find(|k| MANAGED_FIELDS.contains(&k.as_str()))
        {
            return Err(error(
                key("params").key(field),
                format!(
                    "set by the proxy; not allowed in params (the proxy manages {})",
                    MANAGED_FIELDS.join(", ")
                ),
            ));
        }
        let mut prompt_parts: Vec<String> = agent.system_prompt.iter().cloned().collect();
        // Listed twice (by the agent and a skill), a tool is offered once:
        // the per-request tool set keeps the first of each function name.
        let mut agent_tools: Vec<AgentTool> = Vec::new();
        let mut add_tool = |tool: AgentTool| agent_tools.push(tool);
        for (i, name) in agent.tools.iter().enumerate() {
            add_tool(find_tool(key("tools").index(i), name)?);
        }
        for (i, name) in agent.skills.iter().enumerate() {
            let (prompt, skill_tools) = skills.get(name).ok_or_else(|| {
                error(
                    key("skills").index(i),
                    no_such("skill", name, skills.keys()),
                )
            })?;
            prompt_parts.extend(prompt.iter().cloned());
            skill_tools.iter().cloned().for_each(&mut add_tool);
        }
        let instructions = Some(prompt_parts.join("\n\n")).filter(|p| !p.is_empty());
        let knowledge = agent
            .knowledge
            .iter()
            .enumerate()
            .map(|(i, name)| {
                knowledge_bases.get(name).cloned().ok_or_else(|| {
                    error(
                        key("knowledge").index(i),
                        no_such("knowledge base", name, knowledge_bases.keys()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if agent.knowledge_auto && knowledge.is_empty() {
            return Err(error(
                key("knowledge_auto"),
                "needs `knowledge` (the bases to search)",
            ));
        }
        let memory = match &agent.memory {
            None => None,
            Some(_) if file.store.kind == StoreKind::None => {
                return Err(error(
                    key("memory"),
                    "memory needs a store: `store.kind` is none",
                ))
            }
            Some(spec) => Some(Arc::new(
                crate::agent::memory::Memory::from_file(spec)
                    .map_err(|m| error(key("memory"), m))?,
            )),
        };
        // Knowledge's search and memory's tools, after the tools it lists,
        // as made now.
        let search =
            (!knowledge.is_empty()).then(|| crate::knowledge::SearchTool::definition(&knowledge));
        let remember = memory
            .iter()
            .flat_map(|memory| crate::agent::memory::tools(&id, memory));
        agent_tools.extend(search.into_iter().chain(remember).map(|(offered, run)| {
            AgentTool::Builtin {
                offered: Arc::new(offered),
                run,
            }
        }));
        let series = crate::metrics::metrics().agent_series(&id);
        agents.insert(
            id.clone(),
            Arc::new(Agent {
                name: agent.name.unwrap_or_else(|| id.clone()),
                description: agent.description.unwrap_or_default(),
                id,
                upstream,
                model: agent.model,
                instructions,
                prompt_mode: agent.system_prompt_mode,
                tools: agent_tools,
                params: agent.params,
                max_tool_rounds: agent.max_tool_rounds,
                tool_events: agent.tool_events,
                reasoning: agent.reasoning,
                reasoning_field: agent.reasoning_field.unwrap_or(file.reasoning_field),
                memory,
                knowledge,
                knowledge_auto: agent.knowledge_auto,
                series,
            }),
        );
    }

    let router = file
        .router
        .map(|router| {
            let upstream = match &router.upstream {
                None => default_upstream.clone(),
                Some(name) => find_upstream(KeyPath::of(&["router", "upstream"]), name)?,
            };
            if !agents.contains_key(&router.default_agent) {
                return Err(error(
                    KeyPath::of(&["router", "default_agent"]),
                    no_such("agent", &router.default_agent, agents.keys()),
                ));
            }
            Ok(Router {
                upstream,
                model: router.model,
                default_agent: router.default_agent,
                timeout: Duration::from_millis(router.timeout_ms),
            })
        })
        .transpose()?;

    let mut aliases = Vec::with_capacity(file.model_aliases.len());
    for (name, target) in &file.model_aliases {
        let agent = agents.get(target).cloned().ok_or_else(|| {
            error(
                KeyPath::of(&["model_aliases", name]),
                no_such("agent", target, agents.keys()),
            )
        })?;
        aliases.push(ModelAlias::new(name, agent));
    }
    // A longer prefix is the more specific alias.
    aliases.sort_by_key(|a| std::cmp::Reverse(a.name.len()));

    let store = match previous.store(&file.store) {
        Some(kept) => kept,
        None => {
            check_store(&file.store)?;
            Store::from_file(&file.store, base)
        }
    };

    if file.runtime.threads == Some(0) {
        return Err(error(
            KeyPath::of(&["runtime", "threads"]),
            "must be greater than 0",
        ));
    }
    if file.limits.max_body_bytes == 0 {
        return Err(error(
            KeyPath::of(&["limits", "max_body_bytes"]),
            "must be greater than 0",
        ));
    }
    let mut context_headers: Vec<http::HeaderName> = agents
        .values()
        .flat_map(|agent| &agent.tools)
        .filter_map(|tool| match tool {
            AgentTool::Local(tool) => Some(tool.injected_headers()),
            _ => None,
        })
        .flatten()
        .chain(
            mcp_servers
                .values()
                .flat_map(|server| server.injected_headers()),
        )
        .cloned()
        .collect();
    let api_keys: Vec<ApiKey> = file
        .auth
        .api_keys
        .into_iter()
        .map(|k| match k {
            ApiKeyFile::Key(key) => ApiKey { key, name: None },
            ApiKeyFile::Named { key, name } => ApiKey {
                key,
                name: Some(name),
            },
        })
        .filter(|k| !k.key.is_empty())
        .collect();
    if api_keys.is_empty() {
        context_headers.push(http::header::AUTHORIZATION);
    }
    context_headers.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    context_headers.dedup();
    Ok(Config {
        context_headers,
        admin_keys: file
            .auth
            .admin_keys
            .into_iter()
            .filter(|k| !k.is_empty())
            .collect(),
        trust_user_field: file.auth.trust_user_field,
        runtime: file.runtime,
        loaded_at: crate::store::unix_now(),
        source: None,
        superseded: Superseded::default(),
        listen: file.listen,
        admin_listen: file.admin_listen,
        api_keys,
        default_upstream,
        upstreams,
        agents,
        aliases,
        mcp_servers,
        knowledge_bases,
        router,
        passthrough: file.passthrough,
        store,
        limits: Limits {
            max_body_bytes: file.limits.max_body_bytes,
            max_messages: file.limits.max_messages,
            heartbeat: Duration::from_millis(file.limits.heartbeat_ms.max(1)),
            request_timeout: Duration::from_millis(file.limits.request_timeout_ms.max(1)),
            max_streams_per_client: file.limits.max_streams_per_client,
            max_event_bytes: file.limits.max_event_bytes.max(1024),
            max_upstream_body_bytes: 16 * 1024 * 1024,
            max_tool_calls_per_turn: file.limits.max_tool_calls_per_turn,
            max_concurrent_tool_calls: file.limits.max_concurrent_tool_calls.max(1),
            max_json_values: file.limits.max_json_values,
            keepalive_timeout: Duration::from_millis(file.limits.keepalive_timeout_ms.max(1)),
            header_timeout: Duration::from_millis(file.limits.header_timeout_ms.max(1)),
            send_timeout: Duration::from_millis(file.limits.send_timeout_ms.max(1)),
            max_connections: file.limits.max_connections,
        },
    })
}

/// Each kind has the keys it needs, and no others.
fn check_store(spec: &StoreFile) -> Result<(), Invalid> {
    let key = |name: &str| KeyPath::of(&["store", name]);
    match spec.kind {
        StoreKind::Redis if spec.url.as_deref().is_none_or(str::is_empty) => {
            return Err(error(
                KeyPath::of(&["store"]),
                "a redis store needs `url` (redis://host:6379)",
            ))
        }
        StoreKind::Redis => {
            if let Err(e) = redis::Client::open(spec.url.as_deref().unwrap_or_default()) {
                return Err(error(
                    key("url"),
                    format!("not a Redis URL: {}", e.category()),
                ));
            }
        }
        _ if spec.url.is_some() => return Err(error(key("url"), "`url` is for `kind: redis`")),
        _ => {}
    }
    if spec.path.is_some() && spec.kind != StoreKind::Sqlite {
        return Err(error(key("path"), "`path` is for `kind: sqlite`"));
    }
    if spec.ttl_seconds == 0 {
        return Err(error(key("ttl_seconds"), "must be greater than 0"));
    }
    Ok(())
}

/// OpenAI's rule for function names.
fn is_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
default_upstream: local
upstreams:
  local: { url: 'http://127.0.0.1:8080/v1', api_key: '${KEY:-}' }
tools:
  get_weather:
    description: Weather
    parameters: { type: object, properties: { city: { type: string } } }
    http: { url: 'http://127.0.0.1:9000/weather' }
skills:
  forecasting: { prompt: 'Use Celsius.', tools: [get_weather] }
agents:
  minimal:
  weather:
    system_prompt: You are a weather assistant.
    skills: [forecasting]
    params: { temperature: 0.2 }
";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn one_line_agent_and_skill_resolution() {
        let config = Config::parse(BASE, no_env).unwrap();
        let minimal = config.agent("minimal").unwrap();
        assert_eq!(minimal.name, "minimal");
        assert!(minimal.tools.is_empty());
        let weather = config.agent("weather").unwrap();
        assert_eq!(
            weather.instructions.as_deref(),
            Some("You are a weather assistant.\n\nUse Celsius.")
        );
        assert_eq!(weather.tools.len(), 1);
        assert_eq!(weather.max_tool_rounds, 8);
    }

    fn err(text: &str) -> ConfigError {
        match Config::parse(text, no_env) {
            Err(e) => e,
            Ok(_) => panic!("config was accepted"),
        }
    }

    #[test]
    fn errors_show_an_environment_value_as_its_variable() {
        let env = |name: &str| match name {
            "CK" => Some("client-KEY-456".to_owned()),
            "PASS" => Some("TOOL-SECRET-789".to_owned()),
            "PORT" => Some("9000".to_owned()),
            _ => None,
        };
        let typed = format!("{BASE}auth: {{ api_keys: '${{CK}}' }}\n");
        let url = BASE.replace(
            "http://127.0.0.1:9000/weather",
            "http://u:${PASS}@127.0.0.1:${PORT} /weather",
        );
        for text in [typed, url] {
            let e = Config::parse(&text, env).err().expect("refused");
            let shown = e.to_string();
            assert!(
                !shown.contains("KEY-456") && !shown.contains("SECRET-789"),
                "{shown}"
            );
            // A URL's password is not shown at all.
            assert!(
                shown.contains("${CK}") || shown.contains("u:***@"),
                "{shown}"
            );
        }
    }

    #[test]
    fn errors_name_the_bad_key() {
        let e = err(&BASE.replace("skills: [forecasting]", "skills: [nope]"));
        assert_eq!(e.key, "agents.weather.skills[0]");
        let e = err(&BASE.replace("system_prompt:", "sytem_prompt:"));
        assert!(e.key.starts_with("agents.weather"), "{e}");
        assert!(e.message.contains("sytem_prompt"), "{e}");
        let e = err(&BASE.replace("${KEY:-}", "${UNSET_VARIABLE}"));
        assert_eq!(e.key, "upstreams.local.api_key");
        assert!(e.message.contains("UNSET_VARIABLE"));
        let e = err(&BASE.replace("temperature", "stream"));
        assert_eq!(e.key, "agents.weather.params.stream");
        let e = err(&BASE.replace("default_upstream: local", "default_upstream: remote"));
        assert_eq!(e.key, "default_upstream");
        let e = err(&BASE.replace("http: {", "command: { argv: [x] }\n    http: {"));
        assert_eq!(e.key, "tools.get_weather");
    }

    #[test]
    fn errors_point_at_the_line_and_say_what_was_expected() {
        let e = err(&BASE.replace("skills: [forecasting]", "skills: [nope]"));
        assert_eq!(
            e.to_string(),
            "line 16, column 14: agents.weather.skills[0]: \
             no skill named `nope` (defined skills: forecasting)"
        );
        let e = err(&BASE.replace("system_prompt:", "sytem_prompt:"));
        assert_eq!(e.key, "agents.weather.sytem_prompt");
        assert!(
            e.message.starts_with(
                "line 15, column 5: agents.weather.sytem_prompt: unknown field `sytem_prompt`, \
                 expected one of `name`, `description`"
            ),
            "{e}"
        );
        let e = err(&BASE.replace("default_upstream: local", "default_upstream: remote"));
        assert_eq!(
            e.message,
            "line 2, column 1: default_upstream: no upstream named `remote` (defined upstreams: local)"
        );
        let e = err(&format!("{BASE}    max_tool_rounds: many\n"));
        assert!(
            e.message
                .starts_with("line 18, column 5: agents.weather.max_tool_rounds: invalid type"),
            "{e}"
        );
        let e = err(&BASE.replace("[forecasting]", "[forecasting"));
        assert!(
            e.message
                .starts_with("line 17, column 11: invalid YAML: did not find expected ',' or ']'"),
            "{e}"
        );
        assert!(!e.message.contains("at line 17 column 11"), "{e}");
        assert!(err("# nothing yet\n").message.contains("empty"));
    }

    #[test]
    fn a_reload_keeps_the_runtime_of_every_unchanged_spec() {
        let with_mcp = format!("{BASE}mcp_servers:\n  files: {{ command: [mcp-files] }}\n");
        let reload = |old: &Config, text: &str| {
            parse_text(text, &no_env, &Previous(Some(old)), Path::new("."))
                .unwrap_or_else(|e| panic!("{e:?}"))
        };
        let old = Config::parse(&with_mcp, no_env).unwrap();
        let same = |a: &Config, b: &Config| {
            (
                Arc::ptr_eq(&a.default_upstream, &b.default_upstream),
                Arc::ptr_eq(&a.mcp_servers["files"], &b.mcp_servers["files"]),
            )
        };
        let prompt = reload(&old, &with_mcp.replace("a weather assistant", "terse"));
        assert_eq!(same(&old, &prompt), (true, true), "only an agent changed");
        let upstream = reload(&prompt, &with_mcp.replace("8080", "8081"));
        assert_eq!(same(&prompt, &upstream), (false, true));
        let server = reload(
            &upstream,
            &with_mcp.replace("[mcp-files]", "[mcp-files, -v]"),
        );
        assert!(!same(&upstream, &server).1, "the server changed");
        assert!(
            !Arc::ptr_eq(&server.default_upstream, &upstream.default_upstream),
            "back to 8080: a new runtime, not the one two reloads ago"
        );
    }

    #[test]
    fn a_store_has_the_keys_its_kind_needs() {
        let with = |store: &str| Config::parse(&format!("{BASE}\nstore: {store}"), no_env);
        let message = |store: &str| with(store).err().map(|e| e.message).unwrap_or_default();
        assert!(message("{ kind: redis }").contains("store: a redis store needs `url`"));
        assert!(message("{ kind: redis, url: 'http://x' }").contains("not a Redis URL"));
        assert!(message("{ kind: memory, url: 'redis://x' }").contains("store.url"));
        assert!(message("{ kind: redis, url: 'redis://x', path: a.db }").contains("store.path"));
        assert!(message("{ ttl_seconds: 0 }").contains("store.ttl_seconds"));
        assert!(message("{ kind: postgres }").contains("store.kind"));
        assert!(with("{ kind: none }").unwrap().store.is_none());
        // Nothing is opened by parsing: no file appears for the default.
        assert!(with("{ path: /nonexistent/dir/x.db }")
            .unwrap()
            .store
            .is_some());
        assert!(!std::path::Path::new("/nonexistent/dir/x.db").exists());
    }

    #[test]
    fn knowledge_bases_and_memory_are_checked() {
        let message = |extra: &str| {
            Config::parse(&format!("{BASE}{extra}"), no_env)
                .err()
                .map(|e| e.message)
                .unwrap_or_default()
        };
        let base = "knowledge_bases:\n  docs: { sources: [docs/*.md] }\n";
        assert!(Config::parse(&format!("{BASE}{base}"), no_env).is_ok());
        assert!(message("knowledge_bases:\n  docs: { sources: [] }\n")
            .contains("knowledge_bases.docs.sources: needs at least one"));
        assert!(message(
            "knowledge_bases:\n  docs: { sources: [a], chunk: { size: 10, overlap: 10 } }\n"
        )
        .contains(
            "knowledge_bases.docs.chunk: `size` must be greater than 0 and `overlap` smaller"
        ));
        assert!(
            message("knowledge_bases:\n  docs: { sources: [a, 'https://'] }\n")
                .contains("knowledge_bases.docs.sources[1]: not a valid URL")
        );
        assert!(message(
            "knowledge_bases:\n  docs: { sources: [a], embedding: { upstream: nope } }\n"
        )
        .contains("knowledge_bases.docs.embedding.upstream: no upstream named `nope`"));
        assert!(
            message("knowledge_bases:\n  docs: { sources: [a], index: { kind: postgres } }\n")
                .contains("knowledge_bases.docs.index.url: a postgres index needs `url`")
        );
        let bad = message(
            "knowledge_bases:\n  docs: { sources: [a], index: { kind: postgres, url: 'postgres://u:pw-77@h:notaport/db' } }\n",
        );
        assert!(
            bad.contains("knowledge_bases.docs.index.url: not a valid Postgres URL")
                && !bad.contains("pw-77"),
            "{bad}"
        );
        assert!(Config::parse(
            &format!("{BASE}knowledge_bases:\n  docs: {{ sources: [a], index: {{ kind: postgres, url: 'postgres://u:p@db:5432/kb' }} }}\n"),
            no_env
        )
        .is_ok());
        // A CA file replaces the system roots; a missing or empty one is a
        // config error.
        let dir = std::env::temp_dir().join(format!("agent-proxy-pgca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["db".into()]).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.cert.pem()).unwrap();
        std::fs::write(dir.join("empty.pem"), "").unwrap();
        let with_ca = |file: &str| {
            let yaml = format!("{BASE}knowledge_bases:\n  docs: {{ sources: [a], index: {{ kind: postgres, url: 'postgres://db/kb', ca_file: {file} }} }}\n");
            std::fs::write(dir.join("proxy.yaml"), yaml).unwrap();
            Config::load(&dir.join("proxy.yaml"))
        };
        assert!(with_ca("ca.pem").is_ok());
        for file in ["empty.pem", "missing.pem"] {
            let e = with_ca(file).err().unwrap();
            assert_eq!(e.key, "knowledge_bases.docs.index", "{e}");
            assert!(
                e.message
                    .contains(&format!("ca_file `{}", dir.join(file).display())),
                "{e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
        let with_agent =
            |agent: &str| BASE.replace("  minimal:\n", &format!("  minimal: {agent}\n")) + base;
        assert!(Config::parse(
            &with_agent("{ knowledge: [docs], knowledge_auto: true }"),
            no_env
        )
        .is_ok());
        let e = Config::parse(&with_agent("{ knowledge: [wiki] }"), no_env)
            .err()
            .unwrap();
        assert_eq!(e.key, "agents.minimal.knowledge[0]");
        assert!(
            e.message
                .contains("no knowledge base named `wiki` (defined knowledge bases: docs)"),
            "{e}"
        );
        let e = Config::parse(&with_agent("{ knowledge_auto: true }"), no_env)
            .err()
            .unwrap();
        assert_eq!(e.key, "agents.minimal.knowledge_auto");
        let e = Config::parse(&with_agent("{ memory: { scope: [] } }"), no_env)
            .err()
            .unwrap();
        assert_eq!(e.key, "agents.minimal.memory");
        let e = Config::parse(&with_agent("{ memory: { scope: everyone } }"), no_env)
            .err()
            .unwrap();
        assert!(e.key.starts_with("agents.minimal.memory"), "{e}");
    }

    /// An agent's call keeps only the request headers something reads: the
    /// injected ones, and `Authorization` only when it goes upstream.
    #[test]
    fn the_call_context_keeps_the_headers_tools_inject() {
        let names = |extra: &str| {
            let config = Config::parse(&format!("{BASE}{extra}"), no_env).unwrap();
            config
                .context_headers
                .iter()
                .map(|name| name.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(""), ["authorization"]);
        let injecting = "
  lookup:
    description: Lookup
    parameters: { type: object }
    http: { url: 'http://127.0.0.1:9000/lookup' }
    inject: { tenant: { header: x-tenant }, user: { request: user } }
";
        let with_tool = BASE
            .replace("tools:\n", &format!("tools:\n{injecting}"))
            .replace(
                "agents:\n  minimal:",
                "agents:\n  minimal: { tools: [lookup] }",
            );
        let config = Config::parse(&with_tool, no_env).unwrap();
        let kept: Vec<_> = config.context_headers.iter().map(|n| n.as_str()).collect();
        assert_eq!(kept, ["authorization", "x-tenant"]);
        assert_eq!(names("auth: { api_keys: [k1] }"), Vec::<String>::new());
    }

    #[test]
    fn runtime_threads_and_scheduler() {
        let with = |runtime: &str| Config::parse(&format!("{BASE}\nruntime: {runtime}"), no_env);
        let default = Config::parse(BASE, no_env).unwrap().runtime;
        assert_eq!((default.threads, default.work_stealing), (None, false));
        let set = with("{ threads: 3, work_stealing: true }").unwrap().runtime;
        assert_eq!((set.threads, set.work_stealing), (Some(3), true));
        let zero = with("{ threads: 0 }")
            .err()
            .map(|e| e.message)
            .unwrap_or_default();
        assert!(
            zero.contains("runtime.threads: must be greater than 0"),
            "{zero}"
        );
    }
}

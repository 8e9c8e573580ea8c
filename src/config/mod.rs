//! Configuration: read the YAML, expand `${VAR}`s, check every reference and
//! resolve it into the runtime [`Config`] a request works with.

mod expand;
pub mod file;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_yaml_ng::Value as Yaml;

use crate::agent::router::Router;
use crate::agent::{Agent, AgentTool};
use crate::mcp::{self, McpServer};
use crate::tools::Tool;
use crate::upstream::Upstream;
use file::ConfigFile;

/// A loaded, validated configuration. Requests hold an `Arc` of the one they
/// started with.
pub struct Config {
    pub listen: String,
    pub admin_listen: Option<String>,
    pub api_keys: Vec<String>,
    pub default_upstream: Arc<Upstream>,
    /// Every upstream, for health checks.
    pub upstreams: BTreeMap<String, Arc<Upstream>>,
    pub agents: BTreeMap<String, Arc<Agent>>,
    pub mcp_servers: BTreeMap<String, Arc<McpServer>>,
    /// Present when the model `auto` routes requests to agents.
    pub router: Option<Router>,
    pub passthrough: bool,
    pub limits: Limits,
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
    /// Largest non-streamed upstream body read whole (errors, JSON answers).
    pub max_upstream_body_bytes: usize,
}

/// What is wrong with a config, naming the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "config error: {}", self.message)
        } else {
            write!(f, "config error at `{}`: {}", self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn error(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        message: message.into(),
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| error("", format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text, |name| std::env::var(name).ok())
    }

    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut yaml: Yaml =
            serde_yaml_ng::from_str(text).map_err(|e| error("", format!("invalid YAML: {e}")))?;
        expand_strings(&mut yaml, &mut String::new(), &env)?;
        let file: ConfigFile = serde_path_to_error::deserialize(yaml).map_err(|e| {
            let key = e.path().to_string();
            error(
                if key == "." { String::new() } else { key },
                e.into_inner().to_string(),
            )
        })?;
        resolve(file)
    }

    pub fn agent(&self, id: &str) -> Option<&Arc<Agent>> {
        self.agents.get(id)
    }
}

/// Replaces `${VAR}` in every string value, tracking the key path for errors.
fn expand_strings(
    value: &mut Yaml,
    path: &mut String,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        Yaml::String(s) => {
            *s = expand::expand(s, env).map_err(|m| error(path.clone(), m))?;
        }
        Yaml::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                expand_strings(item, path, env)?;
                path.truncate(len);
            }
        }
        Yaml::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key.as_str().unwrap_or("?"));
                expand_strings(item, path, env)?;
                path.truncate(len);
            }
        }
        Yaml::Tagged(tagged) => expand_strings(&mut tagged.value, path, env)?,
        _ => {}
    }
    Ok(())
}

/// Fields of a chat request the proxy manages itself: not settable as `params`.
const MANAGED_FIELDS: &[&str] = &["model", "messages", "tools", "stream", "stream_options"];

fn resolve(file: ConfigFile) -> Result<Config, ConfigError> {
    let mut upstreams = BTreeMap::new();
    for (name, upstream) in file.upstreams {
        let resolved = Upstream::from_file(&name, upstream)
            .map_err(|m| error(format!("upstreams.{name}"), m))?;
        upstreams.insert(name, Arc::new(resolved));
    }
    let default_upstream = upstreams
        .get(&file.default_upstream)
        .cloned()
        .ok_or_else(|| {
            error(
                "default_upstream",
                format!("no upstream named `{}`", file.default_upstream),
            )
        })?;

    let mut tools = BTreeMap::new();
    for (name, tool) in file.tools {
        if !is_function_name(&name) {
            return Err(error(
                format!("tools.{name}"),
                "a tool name must be 1-64 letters, digits, `_` or `-`",
            ));
        }
        let resolved =
            Tool::from_file(&name, tool).map_err(|m| error(format!("tools.{name}"), m))?;
        tools.insert(name, Arc::new(resolved));
    }
    let mut mcp_servers = BTreeMap::new();
    for (name, server) in &file.mcp_servers {
        if !is_function_name(name) || name.contains(mcp::SEPARATOR) {
            return Err(error(
                format!("mcp_servers.{name}"),
                "a server name must be 1-64 letters, digits, `_` or `-`, without `__`",
            ));
        }
        let resolved =
            mcp::server(name, server).map_err(|m| error(format!("mcp_servers.{name}"), m))?;
        mcp_servers.insert(name.clone(), resolved);
    }
    let agent_ids: Vec<String> = file.agents.keys().cloned().collect();
    // `tool`, `server/*`, `server/tool` or `agent:<id>`.
    let find_tool = |key: String, name: &str| -> Result<AgentTool, ConfigError> {
        if let Some(id) = name.strip_prefix("agent:") {
            return match agent_ids.iter().any(|a| a == id) {
                true => Ok(AgentTool::Agent(id.to_owned())),
                false => Err(error(key, format!("no agent named `{id}`"))),
            };
        }
        if let Some((server, tool)) = name.split_once('/') {
            let server = mcp_servers
                .get(server)
                .cloned()
                .ok_or_else(|| error(key, format!("no MCP server named `{server}`")))?;
            let tool = (tool != "*").then(|| tool.to_owned());
            return Ok(AgentTool::Mcp { server, tool });
        }
        tools
            .get(name)
            .cloned()
            .map(AgentTool::Local)
            .ok_or_else(|| error(key, format!("no tool named `{name}`")))
    };

    let mut skills = BTreeMap::new();
    for (name, skill) in &file.skills {
        let skill_tools = skill
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| find_tool(format!("skills.{name}.tools[{i}]"), t))
            .collect::<Result<Vec<_>, _>>()?;
        skills.insert(name.clone(), (skill.prompt.clone(), skill_tools));
    }

    let mut agents = BTreeMap::new();
    for (id, agent) in file.agents {
        let key = |field: &str| format!("agents.{id}.{field}");
        let upstream = match &agent.upstream {
            None => default_upstream.clone(),
            Some(name) => upstreams
                .get(name)
                .cloned()
                .ok_or_else(|| error(key("upstream"), format!("no upstream named `{name}`")))?,
        };
        if let Some(field) = agent
            .params
            .keys()
            .find(|k| MANAGED_FIELDS.contains(&k.as_str()))
        {
            return Err(error(
                key(&format!("params.{field}")),
                "set by the proxy; not allowed in params",
            ));
        }
        let mut prompt_parts: Vec<String> = agent.system_prompt.iter().cloned().collect();
        // Listed twice (by the agent and a skill), a tool is offered once:
        // the per-request tool set keeps the first of each function name.
        let mut agent_tools: Vec<AgentTool> = Vec::new();
        let mut add_tool = |tool: AgentTool| agent_tools.push(tool);
        for (i, name) in agent.tools.iter().enumerate() {
            add_tool(find_tool(key(&format!("tools[{i}]")), name)?);
        }
        for (i, name) in agent.skills.iter().enumerate() {
            let (prompt, skill_tools) = skills.get(name).ok_or_else(|| {
                error(
                    key(&format!("skills[{i}]")),
                    format!("no skill named `{name}`"),
                )
            })?;
            prompt_parts.extend(prompt.iter().cloned());
            skill_tools.iter().cloned().for_each(&mut add_tool);
        }
        let instructions = Some(prompt_parts.join("\n\n")).filter(|p| !p.is_empty());
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
            }),
        );
    }

    let router = file
        .router
        .map(|router| {
            let upstream = match &router.upstream {
                None => default_upstream.clone(),
                Some(name) => upstreams.get(name).cloned().ok_or_else(|| {
                    error("router.upstream", format!("no upstream named `{name}`"))
                })?,
            };
            if !agents.contains_key(&router.default_agent) {
                return Err(error(
                    "router.default_agent",
                    format!("no agent named `{}`", router.default_agent),
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

    if file.limits.max_body_bytes == 0 {
        return Err(error("limits.max_body_bytes", "must be greater than 0"));
    }
    Ok(Config {
        listen: file.listen,
        admin_listen: file.admin_listen,
        api_keys: file
            .auth
            .api_keys
            .into_iter()
            .filter(|k| !k.is_empty())
            .collect(),
        default_upstream,
        upstreams,
        agents,
        mcp_servers,
        router,
        passthrough: file.passthrough,
        limits: Limits {
            max_body_bytes: file.limits.max_body_bytes,
            max_messages: file.limits.max_messages,
            heartbeat: Duration::from_millis(file.limits.heartbeat_ms.max(1)),
            request_timeout: Duration::from_millis(file.limits.request_timeout_ms.max(1)),
            max_streams_per_client: file.limits.max_streams_per_client,
            max_event_bytes: file.limits.max_event_bytes.max(1024),
            max_upstream_body_bytes: 16 * 1024 * 1024,
        },
    })
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
}

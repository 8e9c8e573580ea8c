//! The YAML file as written by the operator: the public contract of key names.
//! Everything here is plain data; `config::load` validates and resolves it.

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
    /// Forward requests for non-agent models and other paths to `default_upstream`.
    #[serde(default = "yes")]
    pub passthrough: bool,
    #[serde(default)]
    pub limits: LimitsFile,
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
    pub api_keys: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub url: String,
    #[serde(default)]
    pub api_key: Option<String>,
    /// PEM file of CAs that replaces the system roots for this upstream.
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default = "default_connect_ms")]
    pub connect_timeout_ms: u64,
    /// Longest wait for the first byte and between two reads of an answer.
    #[serde(default = "default_read_ms")]
    pub read_timeout_ms: u64,
}

fn default_connect_ms() -> u64 {
    5_000
}

fn default_read_ms() -> u64 {
    300_000
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsFile {
    pub max_body_bytes: usize,
    /// SSE comment sent to a streaming client while it would otherwise wait in silence.
    pub heartbeat_ms: u64,
}

impl Default for LimitsFile {
    fn default() -> Self {
        LimitsFile {
            max_body_bytes: 16 * 1024 * 1024,
            heartbeat_ms: 10_000,
        }
    }
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

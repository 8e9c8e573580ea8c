//! Agents: an OpenAI "model" that is really a prompt, a set of local tools
//! and an upstream. `rewrite` turns a client request into the upstream
//! request; `tool_loop` runs the conversation with the model until it answers.

pub mod assemble;
pub mod memory;
pub mod reasoning;
mod reply;
pub mod rewrite;
pub mod router;
pub mod tool_loop;
pub mod toolset;

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::config::file::{PromptMode, ReasoningField, ReasoningMode, ToolEvents};
use crate::conversation::FunctionTool;
use crate::mcp::McpServer;
use crate::tools::{Run, Tool};
use crate::upstream::Upstream;

pub struct Agent {
    pub id: String,
    pub name: String,
    pub description: String,
    pub upstream: Arc<Upstream>,
    /// Model name sent upstream; the field is omitted when unset.
    pub model: Option<String>,
    /// The system prompt followed by its skills' fragments.
    pub instructions: Option<String>,
    pub prompt_mode: PromptMode,
    /// Its own tools and its skills' tools, each once, then knowledge's
    /// search and memory's tools.
    pub tools: Vec<AgentTool>,
    pub params: Map<String, Value>,
    pub max_tool_rounds: u32,
    pub tool_events: ToolEvents,
    pub reasoning: ReasoningMode,
    pub reasoning_field: ReasoningField,
    /// Notes kept across requests (`memory:`).
    pub memory: Option<Arc<memory::Memory>>,
    /// Bases it searches (`search_knowledge`).
    pub knowledge: Vec<Arc<crate::knowledge::KnowledgeBase>>,
    /// Whether each request's last user message gets the best chunks first.
    pub knowledge_auto: bool,
    pub series: crate::metrics::AgentSeries,
}

/// A tool an agent lists: resolved into functions per request, because an
/// MCP server's tools are what it lists at the time. Each function offered
/// is made once: with the config, or when the MCP server lists it.
#[derive(Clone)]
pub enum AgentTool {
    Local(Arc<Tool>),
    /// `server/*` (`tool: None`) or `server/tool`.
    Mcp {
        server: Arc<McpServer>,
        tool: Option<String>,
    },
    /// `agent:<id>`: another agent, called with a task, as the config of
    /// the request has it.
    Agent {
        id: String,
        offered: Arc<FunctionTool>,
    },
    /// Memory's and knowledge's, which run in the proxy.
    Builtin {
        offered: Arc<FunctionTool>,
        run: Arc<dyn Run>,
    },
}

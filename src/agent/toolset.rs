//! The functions an agent offers the model on one request, and what runs
//! when the model calls one ([`Run`]): a configured tool (HTTP or command),
//! an MCP server's tool, or another agent's whole loop.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{tool_loop, Agent, AgentTool};
use crate::config::Config;
use crate::conversation::FunctionTool;
use crate::mcp::{self, function_name, McpServer};
use crate::tools::{parse_arguments, CallContext, Outcome, Run};

/// Nested agent calls deeper than this are refused.
pub const MAX_AGENT_DEPTH: usize = 4;

pub struct ToolSet {
    entries: Vec<Entry>,
    /// The agent's MCP servers: a call to `<server>__…` is theirs even when
    /// the server is down and its tools are not listed.
    servers: Vec<Arc<McpServer>>,
}

struct Entry {
    /// Made once, with the tool (its schema written as JSON then), not per
    /// request: an agent with 20 tools spent 570k instructions a request
    /// copying, writing and dropping their definitions.
    function: Arc<FunctionTool>,
    target: Arc<dyn Run>,
}

/// One tool of an MCP server.
struct McpTool {
    server: Arc<McpServer>,
    tool: String,
}

/// Another agent, called with a task.
struct AgentCall(Arc<Agent>);

impl ToolSet {
    /// `agent`'s functions as of now. A name listed twice is offered once.
    pub fn of(agent: &Agent, config: &Config) -> ToolSet {
        let mut set = ToolSet {
            entries: Vec::new(),
            servers: Vec::new(),
        };
        for tool in &agent.tools {
            match tool {
                AgentTool::Local(tool) => set.add(tool.offered.clone(), tool.clone()),
                AgentTool::Mcp { server, tool } => {
                    set.servers.push(server.clone());
                    for listed in server.tools().iter() {
                        if tool.as_deref().is_none_or(|t| t == listed.name) {
                            let target = McpTool {
                                server: server.clone(),
                                tool: listed.name.clone(),
                            };
                            set.add(listed.offered.clone(), Arc::new(target));
                        }
                    }
                }
                AgentTool::Agent { id, offered } => {
                    if let Some(callee) = config.agent(id) {
                        set.add(offered.clone(), Arc::new(AgentCall(callee.clone())));
                    }
                }
                AgentTool::Builtin { offered, run } => set.add(offered.clone(), run.clone()),
            }
        }
        set
    }

    fn add(&mut self, function: Arc<FunctionTool>, target: Arc<dyn Run>) {
        if !self.offers(&function.name) {
            self.entries.push(Entry { function, target });
        }
    }

    fn get(&self, function: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.function.name == function)
    }

    /// Whether the agent has no tools of its own: then every call a model
    /// makes is the client's.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.servers.is_empty()
    }

    /// Whether `function` is one of the functions offered.
    pub fn offers(&self, function: &str) -> bool {
        self.get(function).is_some()
    }

    /// Whether the proxy runs `function` (otherwise it is the client's).
    pub fn is_local(&self, function: &str) -> bool {
        self.offers(function) || self.unlisted_server(function).is_some()
    }

    fn unlisted_server(&self, function: &str) -> Option<&Arc<McpServer>> {
        self.servers.iter().find(|server| {
            function
                .strip_prefix(server.name())
                .is_some_and(|rest| rest.starts_with(mcp::SEPARATOR))
        })
    }

    /// Runs `function` with the model's arguments.
    pub async fn call(&self, function: &str, arguments: &str, ctx: &CallContext) -> Outcome {
        if let Some(entry) = self.get(function) {
            return entry.target.run(arguments, ctx).await;
        }
        match self.unlisted_server(function) {
            Some(server) => Outcome::error(format!(
                "`{function}` is not available: MCP server `{}` is {}",
                server.name(),
                server.status()
            )),
            None => Outcome::error(format!("`{function}` is not a tool of this agent")),
        }
    }

    /// The functions offered, as the conversation lists them.
    pub fn functions(&self) -> impl ExactSizeIterator<Item = &Arc<FunctionTool>> {
        self.entries.iter().map(|e| &e.function)
    }
}

#[async_trait::async_trait]
impl Run for McpTool {
    async fn run(&self, arguments: &str, ctx: &CallContext) -> Outcome {
        match parse_arguments(arguments) {
            Ok(arguments) => self.server.call(&self.tool, arguments, ctx).await,
            Err(outcome) => outcome,
        }
    }
}

#[async_trait::async_trait]
impl Run for AgentCall {
    /// The callee's whole loop on the task; its answer is the result.
    async fn run(&self, arguments: &str, ctx: &CallContext) -> Outcome {
        let callee = &self.0;
        let task = match parse_arguments(arguments) {
            Ok(arguments) => match arguments.get("task").and_then(Value::as_str) {
                Some(task) => task.to_owned(),
                None => return Outcome::error("`task` (a string) is required"),
            },
            Err(outcome) => return outcome,
        };
        if ctx.stack.iter().any(|id| *id == callee.id) {
            return Outcome::error(format!(
                "agent `{}` is already working on this request (a cycle: {} -> {}); answer without it",
                callee.id,
                ctx.stack.join(" -> "),
                callee.id
            ));
        }
        if ctx.stack.len() >= MAX_AGENT_DEPTH {
            return Outcome::error(format!(
                "agents may call agents at most {MAX_AGENT_DEPTH} deep"
            ));
        }
        // Its own task: polled from the scheduler, not deep inside the
        // caller's poll chain (nesting would grow the stack). Dropping the
        // call (the client left) aborts it.
        let run = tokio::spawn(tool_loop::run_nested(callee.clone(), task, ctx.clone()));
        let _abort_on_drop = AbortOnDrop(run.abort_handle());
        match run.await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::error(format!("agent `{}` failed: {e}", callee.id)),
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How the agent `id` looks to a model: a function taking one `task`.
pub fn agent_function(id: &str, name: &str, description: &str) -> FunctionTool {
    let description = if description.is_empty() {
        format!("Ask the {name} agent to carry out a task and answer.")
    } else {
        format!("{description} (the {name} agent; give it a task)")
    };
    FunctionTool::function(
        &function_name("agent", id),
        &description,
        &json!({
            "type": "object",
            "properties": { "task": { "type": "string", "description": "What the agent should do, with everything it needs to know" } },
            "required": ["task"]
        }),
    )
}

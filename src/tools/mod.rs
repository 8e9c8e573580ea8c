//! Local tools: what the operator configured, and how a call becomes the
//! text result the model reads. A tool never fails the request: errors,
//! timeouts and oversized output all become a result the model can act on.

mod command;
mod context;
mod http;
mod inject;

use std::sync::Arc;

use serde_json::{Map, Value};

pub use context::{CallContext, Progress};
pub use inject::Injection;

use crate::config::file::ToolFile;
use crate::conversation::FunctionTool;

/// What runs when the model calls a function the proxy owns. Every tool
/// kind implements it: an HTTP endpoint, a command, an MCP server's tool,
/// another agent; the tool loop knows only this.
#[async_trait::async_trait]
pub trait Run: Send + Sync {
    /// Runs with the model's `arguments` (JSON text). Never fails the
    /// request: a failure is an error result the model reads.
    async fn run(&self, arguments: &str, ctx: &CallContext) -> Outcome;
}

/// A configured tool: an HTTP endpoint or a command, with the parameters
/// the proxy injects.
pub struct Tool {
    pub name: String,
    /// As offered to the model.
    pub offered: Arc<FunctionTool>,
    executor: Box<dyn Run>,
    injection: Injection,
}

/// The result of one call, as handed to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub ok: bool,
    pub text: String,
}

impl Outcome {
    pub fn success(text: String) -> Self {
        Outcome { ok: true, text }
    }

    pub fn error(text: impl std::fmt::Display) -> Self {
        Outcome {
            ok: false,
            text: format!("error: {text}"),
        }
    }
}

impl Tool {
    /// The request headers its injected parameters read.
    pub fn injected_headers(&self) -> impl Iterator<Item = &::http::HeaderName> {
        self.injection.headers()
    }

    pub fn from_file(name: &str, file: ToolFile) -> Result<Self, String> {
        let mut parameters = file.parameters;
        if !parameters.is_object() {
            return Err("`parameters` must be a JSON schema object".into());
        }
        let injection = Injection::from_file(&file.inject)?;
        injection.hide(&mut parameters);
        let cap = file.max_output_bytes;
        let executor: Box<dyn Run> = match (file.http, file.command) {
            (Some(http), None) => Box::new(http::HttpTool::from_file(http, cap)?),
            (None, Some(command)) => Box::new(command::CommandTool::from_file(command, cap)?),
            _ => return Err("exactly one of `http` or `command` is required".into()),
        };
        Ok(Tool {
            name: name.to_owned(),
            offered: Arc::new(FunctionTool::function(name, &file.description, &parameters)),
            executor,
            injection,
        })
    }
}

#[async_trait::async_trait]
impl Run for Tool {
    /// Runs the tool with the model's `arguments`, injected parameters set
    /// from `ctx`.
    async fn run(&self, arguments: &str, ctx: &CallContext) -> Outcome {
        let mut parsed = match parse_arguments(arguments) {
            Ok(parsed) => parsed,
            Err(outcome) => return outcome,
        };
        // The model's own text is passed on as it is unless something is injected.
        let injected;
        let arguments = if self.injection.is_empty() && !arguments.trim().is_empty() {
            arguments
        } else {
            self.injection.apply(&mut parsed, ctx);
            injected = Value::Object(parsed).to_string();
            injected.as_str()
        };
        self.executor.run(arguments, ctx).await
    }
}

/// The model's arguments as a JSON object; anything else is not executed.
pub fn parse_arguments(arguments: &str) -> Result<Map<String, Value>, Outcome> {
    let arguments = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Outcome::error(
            "arguments must be a JSON object; the tool was not run",
        )),
        Err(e) => Err(Outcome::error(format!(
            "arguments are not valid JSON ({e}); the tool was not run"
        ))),
    }
}

/// Lossy UTF-8 text of `bytes`, with a note when the output was cut at `cap`.
pub fn capped_text(bytes: &[u8], cap: usize, truncated: bool) -> String {
    let mut text = String::from_utf8_lossy(&bytes[..bytes.len().min(cap)]).into_owned();
    if truncated || bytes.len() > cap {
        text.push_str(&format!("\n[truncated: output exceeded {cap} bytes]"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_is_marked_and_lossy_utf8_is_safe() {
        assert_eq!(capped_text(b"abc", 10, false), "abc");
        assert_eq!(
            capped_text(b"abcdef", 3, false),
            "abc\n[truncated: output exceeded 3 bytes]"
        );
        assert_eq!(capped_text(&[0xff, b'a'], 10, false), "\u{fffd}a");
    }
}

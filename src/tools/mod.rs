//! Local tools: what the operator configured, and how a call becomes the
//! text result the model reads. A tool never fails the request: errors,
//! timeouts and oversized output all become a result the model can act on.

mod command;
mod http;

use serde_json::Value;

use crate::config::file::ToolFile;
use crate::openai::ToolDef;

pub struct Tool {
    pub name: String,
    pub definition: ToolDef,
    executor: Executor,
    max_output_bytes: usize,
}

enum Executor {
    Http(http::HttpTool),
    Command(command::CommandTool),
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
    pub fn from_file(name: &str, file: ToolFile) -> Result<Self, String> {
        if !file.parameters.is_object() {
            return Err("`parameters` must be a JSON schema object".into());
        }
        let executor = match (file.http, file.command) {
            (Some(http), None) => Executor::Http(http::HttpTool::from_file(http)?),
            (None, Some(command)) => Executor::Command(command::CommandTool::from_file(command)?),
            _ => return Err("exactly one of `http` or `command` is required".into()),
        };
        Ok(Tool {
            name: name.to_owned(),
            definition: ToolDef::function(name, &file.description, file.parameters),
            executor,
            max_output_bytes: file.max_output_bytes,
        })
    }

    /// Runs the tool with the model's `arguments` (JSON text). Arguments that
    /// are not a JSON object are not executed.
    pub async fn call(&self, arguments: &str, request_id: &str) -> Outcome {
        let arguments = if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        };
        match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(_)) => {}
            Ok(_) => {
                return Outcome::error("arguments must be a JSON object; the tool was not run")
            }
            Err(e) => {
                return Outcome::error(format!(
                    "arguments are not valid JSON ({e}); the tool was not run"
                ))
            }
        }
        match &self.executor {
            Executor::Http(tool) => {
                tool.call(arguments, request_id, self.max_output_bytes)
                    .await
            }
            Executor::Command(tool) => tool.call(arguments, self.max_output_bytes).await,
        }
    }
}

/// Lossy UTF-8 text of `bytes`, with a note when the output was cut at `cap`.
fn capped_text(bytes: &[u8], cap: usize, truncated: bool) -> String {
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

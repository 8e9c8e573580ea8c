//! What a tool call knows about the request it serves.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::config::Config;

/// The request a tool call serves: for injected parameters, request ids,
/// and agents calling agents.
#[derive(Clone)]
pub struct CallContext {
    pub config: Arc<Config>,
    pub request_id: String,
    /// The chat request's `user` field.
    pub user: Option<String>,
    pub headers: Arc<http::HeaderMap>,
    /// The agents whose loops are running, outermost first.
    pub stack: Vec<String>,
    /// Where a nested agent reports its progress to the caller's stream.
    pub progress: Option<UnboundedSender<String>>,
}

impl CallContext {
    /// The context for a loop of `agent` called from this one.
    pub fn nested(&self, agent: &str, progress: Option<UnboundedSender<String>>) -> Self {
        let mut stack = self.stack.clone();
        stack.push(agent.to_owned());
        CallContext {
            stack,
            progress,
            ..self.clone()
        }
    }
}

//! What a tool call knows about the request it serves.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::config::Held;
use crate::conversation::Usage;

/// The request a tool call serves: for injected parameters, request ids,
/// and agents calling agents.
#[derive(Clone)]
pub struct CallContext {
    pub config: Held,
    pub request_id: String,
    /// The chat request's `user` field (the client's word).
    pub user: Option<String>,
    /// The name of the client key the request matched (the operator's word).
    pub key_name: Option<String>,
    /// Whom the request is for (`session::identity`): memory's owner.
    pub identity: String,
    /// The conversation it belongs to (`session`'s cascade).
    pub session: String,
    pub headers: Arc<http::HeaderMap>,
    /// The agents whose loops are running, outermost first.
    pub stack: Vec<String>,
    /// Where a nested agent reports its progress to the caller's stream.
    pub progress: Option<UnboundedSender<Progress>>,
    /// The client sees the model's reasoning: a nested agent's is shown
    /// (as progress) only then, and only if its own `reasoning` passes it.
    pub show_reasoning: bool,
}

/// What an agent called as a tool reports to its caller while it runs.
#[derive(Debug)]
pub enum Progress {
    /// Text for the caller's stream: its answer as it comes, its tool notes.
    Note(String),
    /// What its model calls used, for the request's total.
    Usage(Usage),
}

impl CallContext {
    /// The context for a loop of `agent` called from this one.
    pub fn nested(&self, agent: &str) -> Self {
        let mut stack = self.stack.clone();
        stack.push(agent.to_owned());
        CallContext {
            stack,
            ..self.clone()
        }
    }
}

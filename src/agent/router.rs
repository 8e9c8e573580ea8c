//! The `auto` model: a router model picks the agent for each request from
//! the agents' ids and descriptions and the conversation's last user message.
//! Any failure, or an answer naming no agent, falls back to `default_agent`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::{info, warn};

use super::reasoning::{Kind, ThinkSplitter};
use super::Agent;
use crate::config::Config;
use crate::conversation::{Conversation, Item, Message, Options, Prompt, Role};
use crate::round;
use crate::upstream::Upstream;

pub const AUTO: &str = "auto";

/// The router's answer budget: an id, with room for a model that thinks a
/// little even when asked not to.
const ROUTER_MAX_TOKENS: u64 = 512;

pub struct Router {
    pub upstream: Arc<Upstream>,
    pub model: Option<String>,
    pub default_agent: String,
    pub timeout: Duration,
}

impl Router {
    /// The agent that answers `request` (always one of the config's agents).
    pub async fn choose(
        &self,
        config: &Config,
        conversation: &Conversation,
        request_id: &str,
    ) -> Option<Arc<Agent>> {
        let question = conversation
            .items
            .iter()
            .rev()
            .find_map(|item| match item {
                Item::Message(m) if m.role == Role::User => Some(m.text_content()),
                _ => None,
            })
            .unwrap_or_default();
        let routed = match self.ask(config, &question, request_id).await {
            Ok(answer) => {
                let chosen = pick(config, &answer);
                if chosen.is_none() {
                    warn!(answer = %answer.chars().take(200).collect::<String>(), "router named no agent; using the default");
                }
                chosen
            }
            Err(reason) => {
                warn!(%reason, "router failed; using the default agent");
                None
            }
        };
        let via = if routed.is_some() {
            "router"
        } else {
            "default"
        };
        let agent = routed.or_else(|| config.agent(&self.default_agent).cloned())?;
        info!(agent = %agent.id, via, "auto routed");
        Some(agent)
    }

    async fn ask(
        &self,
        config: &Config,
        question: &str,
        request_id: &str,
    ) -> Result<String, String> {
        let mut prompt = String::from(
            "You route each request to the agent best suited to answer it. \
             Reply with the agent's id and nothing else.\n\nAgents:\n",
        );
        for agent in config.agents.values() {
            let about = if agent.description.is_empty() {
                &agent.name
            } else {
                &agent.description
            };
            prompt.push_str(&format!("- {}: {about}\n", agent.id));
        }
        let conversation = Conversation {
            model: self.model.clone(),
            system: Some(Prompt::new(prompt)),
            items: vec![Item::Message(Message::text(
                Role::User,
                question.to_owned(),
            ))],
            options: Options {
                max_tokens: Some(ROUTER_MAX_TOKENS),
                temperature: Some(0.0),
                // A thinking model would spend its budget before the id.
                thinking: Some(false),
                ..Options::default()
            },
            ..Conversation::default()
        };
        let api = self.upstream.api;
        let body = Bytes::from(round::encode(api, &conversation, false));
        let call = async {
            let mut exchange = self
                .upstream
                .post_model(api, body, request_id, None, None)
                .await
                .map_err(|e| e.etype().as_str().to_owned())?;
            let body = exchange
                .read_to_end(1 << 20)
                .await
                .map_err(|e| e.etype().as_str().to_owned())?;
            if !(200..300).contains(&exchange.status()) {
                return Err(format!("HTTP {}", exchange.status()));
            }
            let whole = round::decoder(api, &conversation)
                .body(&body)
                .map_err(|e| e.to_string())?;
            Ok(whole.content)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }
}

/// The agent an answer names: the whole answer as an id, or else the id
/// that appears first in it as a word. Thinking (`<think>…</think>`) is
/// ignored.
fn pick(config: &Config, answer: &str) -> Option<Arc<Agent>> {
    let mut splitter = ThinkSplitter::default();
    let mut text: String = splitter
        .split(answer)
        .iter()
        .filter(|(kind, _)| *kind == Kind::Content)
        .map(|(_, piece)| piece)
        .collect();
    if let Some((Kind::Content, rest)) = splitter.flush() {
        text.push_str(&rest);
    }
    let text = text.to_lowercase();
    let trimmed = text
        .trim()
        .trim_matches(|c: char| !c.is_alphanumeric() && c != '_' && c != '-');
    if let Some(agent) = config
        .agents
        .values()
        .find(|a| a.id.to_lowercase() == trimmed)
    {
        return Some(agent.clone());
    }
    let is_word_char = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    config
        .agents
        .values()
        .filter_map(|agent| {
            let id = agent.id.to_lowercase();
            text.match_indices(&id)
                .find(|(at, _)| {
                    let before = text[..*at].chars().next_back();
                    let after = text[at + id.len()..].chars().next();
                    !before.is_some_and(is_word_char) && !after.is_some_and(is_word_char)
                })
                .map(|(at, _)| (at, agent))
        })
        .min_by_key(|(at, _)| *at)
        .map(|(_, agent)| agent.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_named_agent_from_loose_answers() {
        let config = Config::parse(
            "default_upstream: u\nupstreams: { u: { url: 'http://127.0.0.1:1/v1' } }\nagents:\n  weather:\n  coder:\n  code-review:\n",
            |_| None,
        )
        .unwrap();
        let id = |answer: &str| pick(&config, answer).map(|a| a.id.clone());
        assert_eq!(id("weather"), Some("weather".into()));
        assert_eq!(id(" `Coder`.\n"), Some("coder".into()));
        assert_eq!(
            id("<think>maybe weather?</think>code-review"),
            Some("code-review".into())
        );
        assert_eq!(id("I'd pick coder, not weather"), Some("coder".into()));
        assert_eq!(id("codered"), None);
        assert_eq!(id("nothing fits"), None);
    }
}

//! Upstream dialects: for each, an encoder (conversation → the upstream
//! request body) and a round decoder (the upstream's answer → neutral
//! deltas and a [`RoundEnd`]). Pure: no I/O, no config.

pub mod chat;
pub mod responses;

use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use crate::config::file::UpstreamApi;
use crate::conversation::{CallKind, Conversation, Delta, Reasoning, RoundEnd, UpstreamError};
use crate::sse;

/// Why an upstream answer could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not the dialect's shape, or incomplete.
    Malformed(String),
    /// The upstream reported an error in its stream.
    Upstream(UpstreamError),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Malformed(m) => f.write_str(m),
            DecodeError::Upstream(e) => write!(f, "upstream error {}", e.status),
        }
    }
}

/// A whole non-streamed answer's text (its calls and usage come from
/// [`RoundDecoder::end`]).
#[derive(Debug, Default, PartialEq)]
pub struct Whole {
    pub reasoning: String,
    pub content: String,
    /// Reasoning items, in order (their text is also in `reasoning`).
    pub reasoning_items: Vec<Reasoning>,
}

/// What one upstream event carries that must be handed on now.
#[derive(Debug, Default, PartialEq)]
pub struct Step<'a> {
    pub delta: Delta<'a>,
    /// A reasoning item completed (it is also kept for the round's end).
    pub reasoning_item: Option<Reasoning>,
    /// The stream's own end marker (`[DONE]`, `response.completed`).
    pub done: bool,
}

/// A round decoder: fed one SSE event at a time, in order.
pub trait RoundDecoder {
    fn event<'a>(&mut self, event: &'a sse::Event) -> Result<Step<'a>, DecodeError>;

    /// A whole non-streamed JSON answer (some servers answer a stream
    /// request with one, too).
    fn body(&mut self, body: &[u8]) -> Result<Whole, DecodeError>;

    /// The round's end, once the answer ended; `Malformed` when a stream
    /// ended before the answer was complete.
    fn end(&mut self) -> Result<RoundEnd, DecodeError>;
}

/// The request body for an upstream speaking `api`.
pub fn encode(api: UpstreamApi, conversation: &Conversation, stream: bool) -> Vec<u8> {
    match api {
        UpstreamApi::Chat => chat::encode(conversation, stream),
        UpstreamApi::Responses => responses::encode(conversation, stream),
    }
}

/// The buffer `conversation`'s request body is written into, allocated
/// once: the room its text needs ([`TextSize::room`]; a coding agent's
/// instructions are a third of its request), the envelope, and the escapes.
///
/// [`TextSize::room`]: crate::conversation::TextSize::room
fn body_buffer(conversation: &Conversation) -> Vec<u8> {
    let text = conversation.text_size();
    Vec::with_capacity(4096 + text.room() + text.total / 8)
}

/// A decoder for one round of `api`'s answer to `conversation`.
pub fn decoder(api: UpstreamApi, conversation: &Conversation) -> Box<dyn RoundDecoder + Send> {
    match api {
        UpstreamApi::Chat => Box::new(chat::Decoder::new(
            conversation
                .tools
                .iter()
                .filter(|t| t.kind == CallKind::Custom)
                .map(|t| t.name.clone())
                .collect(),
        )),
        UpstreamApi::Responses => Box::new(responses::Decoder::default()),
    }
}

/// Adds `field` unless an earlier source gave the same key: the client's
/// fields come before the agent's defaults.
pub(super) fn first_of_each<'a>(
    mut fields: Vec<(&'a str, &'a Value)>,
    field: (&'a str, &'a Value),
) -> Vec<(&'a str, &'a Value)> {
    if !fields.iter().any(|(key, _)| *key == field.0) {
        fields.push(field);
    }
    fields
}

/// Extra object fields, written after the typed ones.
pub(super) struct Fields<'a>(pub Vec<(&'a str, &'a Value)>);

impl Serialize for Fields<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Description, FunctionTool, Item, Message, Prompt, Role, Schema};

    #[test]
    fn a_request_body_is_written_without_growing_its_buffer() {
        // A coding agent's shape: long instructions, escapes, a history.
        let instructions = "Follow the rules:\n\t\"quote\" \\ é 漢\n".repeat(700);
        let conversation = Conversation {
            system: Some(Prompt::new(instructions)),
            items: vec![
                Item::Message(Message::text(Role::User, "fix the build")),
                Item::Message(Message::text(Role::Assistant, "done.\n".repeat(300))),
            ],
            tools: vec![std::sync::Arc::new(FunctionTool {
                name: "shell".into(),
                description: Description::new("Runs a command."),
                parameters: Schema::empty(),
                kind: CallKind::Function,
                extra: Default::default(),
            })],
            ..Default::default()
        };
        for api in [UpstreamApi::Chat, UpstreamApi::Responses] {
            let capacity = body_buffer(&conversation).capacity();
            let body = encode(api, &conversation, true);
            assert_eq!(body.capacity(), capacity, "{api:?}: the buffer grew");
            let parsed: Value = serde_json::from_slice(&body).unwrap();
            assert!(parsed
                .to_string()
                .contains("Follow the rules:\\n\\t\\\"quote\\\""));
        }
    }
}

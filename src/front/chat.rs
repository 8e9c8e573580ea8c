//! The chat-completions front door: a `/v1/chat/completions` request becomes
//! a conversation, and the loop's output becomes one OpenAI chat stream (one
//! id, the role once, deltas as they come, one finish chunk, `[DONE]`) or one
//! `chat.completion`, whatever number of rounds the loop took.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Map, Value};

use super::Encoder;
use crate::config::file::ReasoningField;
use crate::conversation::{
    CallKind, Conversation, Dialect, Finish, Format, FunctionTool, Item, Message, Options, Part,
    Reasoning, Role, Schema, ToolCall, ToolChoice, ToolResult, Usage,
};
use crate::error::ApiError;
use crate::openai::{self, ChatRequest};
use crate::sse;

// ------------------------------------------------------------- decoding

/// The conversation of a chat request. Fields the core does not model stay
/// in `extra`, in chat shape, for a chat upstream.
pub fn decode(request: ChatRequest) -> Result<Conversation, ApiError> {
    let ChatRequest {
        model,
        messages,
        tools,
        stream,
        stream_options,
        enable_thinking,
        mut rest,
    } = request;
    let mut conversation = Conversation {
        model,
        origin: Dialect::Chat,
        ..Conversation::default()
    };
    let leading = messages.iter().take_while(|m| m.is_instruction()).count();
    let system = messages[..leading]
        .iter()
        .map(openai::Message::content_text)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    conversation.system = (!system.is_empty()).then_some(system);
    for (i, message) in messages.into_iter().enumerate().skip(leading) {
        decode_message(message, &mut conversation.items)
            .map_err(|e| e.with_param(format!("messages[{i}]")))?;
    }
    for tool in tools.into_iter().flatten() {
        if let Some(function) = tool.function {
            conversation.tools.push(FunctionTool {
                name: function.name,
                description: function.description,
                parameters: function
                    .parameters
                    .as_ref()
                    .map_or_else(Schema::empty, Schema::from),
                kind: CallKind::Function,
                extra: function.rest,
            });
        }
    }
    let mut options = Options {
        stream: stream.unwrap_or(false),
        include_usage: stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        ..Options::default()
    };
    options.thinking = enable_thinking.or_else(|| {
        rest.get("chat_template_kwargs")
            .and_then(|k| k.get("enable_thinking"))
            .and_then(Value::as_bool)
    });
    if let Some(thinking) = enable_thinking {
        // Forwarded as sent to a chat upstream.
        rest.insert("enable_thinking".into(), Value::Bool(thinking));
    }
    decode_options(&mut rest, &mut options)?;
    conversation.options = options;
    conversation.extra = rest;
    Ok(conversation)
}

fn decode_message(message: openai::Message, items: &mut Vec<Item>) -> Result<(), ApiError> {
    let openai::Message {
        role,
        content,
        tool_calls,
        tool_call_id,
        mut rest,
    } = message;
    let role = match role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" | "developer" => Role::System,
        "tool" => {
            let output = openai::Message {
                content,
                ..openai::Message::text("tool", "")
            }
            .content_text();
            items.push(Item::ToolResult(ToolResult {
                call_id: tool_call_id.unwrap_or_default(),
                output,
                is_error: false,
            }));
            return Ok(());
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "unsupported message role `{other}`"
            )))
        }
    };
    if role == Role::Assistant {
        let reasoning =
            ["reasoning_content", "reasoning"]
                .iter()
                .find_map(|key| match rest.remove(*key) {
                    Some(Value::String(text)) if !text.is_empty() => Some(text),
                    _ => None,
                });
        if let Some(text) = reasoning {
            items.push(Item::Reasoning(Reasoning {
                text,
                ..Reasoning::default()
            }));
        }
    }
    let parts = decode_content(content);
    if !parts.is_empty() || tool_calls.as_ref().is_none_or(Vec::is_empty) {
        items.push(Item::Message(Message {
            role,
            content: parts,
            extra: rest,
        }));
    }
    for call in tool_calls.into_iter().flatten() {
        items.push(Item::ToolCall(ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: call.function.arguments,
            kind: CallKind::Function,
        }));
    }
    Ok(())
}

fn decode_content(content: Option<Value>) -> Vec<Part> {
    match content {
        Some(Value::String(text)) => vec![Part::Text(text)],
        Some(Value::Array(parts)) => parts.into_iter().map(decode_part).collect(),
        _ => Vec::new(),
    }
}

fn decode_part(part: Value) -> Part {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => match part.get("text").and_then(Value::as_str) {
            Some(text) => Part::Text(text.to_owned()),
            None => Part::Other(part),
        },
        Some("image_url") => {
            let image = part.get("image_url");
            let url = image
                .and_then(|i| i.get("url").or(Some(i)))
                .and_then(Value::as_str);
            match url {
                Some(url) => Part::Image {
                    url: url.to_owned(),
                    detail: image
                        .and_then(|i| i.get("detail"))
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                },
                None => Part::Other(part),
            }
        }
        _ => Part::Other(part),
    }
}

/// Moves the options the core maps between dialects out of `rest`.
fn decode_options(rest: &mut Map<String, Value>, options: &mut Options) -> Result<(), ApiError> {
    let invalid = |key: &'static str| {
        ApiError::bad_request(format!("`{key}` has an invalid value")).with_param(key)
    };
    // `max_completion_tokens` stays as sent for a chat upstream; other
    // dialects get it as their own limit.
    options.max_tokens = match rest.get("max_completion_tokens") {
        Some(v) => Some(v.as_u64().ok_or_else(|| invalid("max_completion_tokens"))?),
        None => match rest.remove("max_tokens") {
            Some(Value::Null) | None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| invalid("max_tokens"))?),
        },
    };
    // One answer per agent request: the loop runs tools for one choice.
    match rest.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(n) if n.as_u64().is_some() => {
            return Err(ApiError::bad_request(format!(
                "`n` is {n}: an agent gives one answer per request (n: 1); send several requests for several answers"
            ))
            .with_param("n"))
        }
        Some(_) => return Err(invalid("n")),
    }
    options.temperature = take_number(rest, "temperature").map_err(|_| invalid("temperature"))?;
    options.top_p = take_number(rest, "top_p").map_err(|_| invalid("top_p"))?;
    options.stop = match rest.remove("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(all)) => all
            .into_iter()
            .map(|s| match s {
                Value::String(s) => Ok(s),
                _ => Err(invalid("stop")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("stop")),
    };
    options.tool_choice = match rest.remove("tool_choice") {
        None | Some(Value::Null) => None,
        Some(choice) => Some(decode_tool_choice(&choice).ok_or_else(|| invalid("tool_choice"))?),
    };
    options.parallel_tool_calls = match rest.remove("parallel_tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => return Err(invalid("parallel_tool_calls")),
    };
    options.reasoning_effort = match rest.remove("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(invalid("reasoning_effort")),
    };
    options.format = match rest.remove("response_format") {
        None | Some(Value::Null) => None,
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Format::JsonObject),
            Some("json_schema") => Some(Format::JsonSchema(
                format
                    .get("json_schema")
                    .cloned()
                    .ok_or_else(|| invalid("response_format"))?,
            )),
            _ => return Err(invalid("response_format")),
        },
    };
    options.user = match rest.remove("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(invalid("user")),
    };
    Ok(())
}

fn take_number(rest: &mut Map<String, Value>, key: &str) -> Result<Option<f64>, ()> {
    match rest.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or(()),
    }
}

pub fn decode_tool_choice(choice: &Value) -> Option<ToolChoice> {
    match choice {
        Value::String(s) => match s.as_str() {
            "auto" => Some(ToolChoice::Auto),
            "none" => Some(ToolChoice::None),
            "required" => Some(ToolChoice::Required),
            _ => None,
        },
        Value::Object(o) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .or_else(|| o.get("name"))
            .and_then(Value::as_str)
            .map(|name| ToolChoice::Function(name.to_owned())),
        _ => None,
    }
}

// ------------------------------------------------------------- encoding

pub struct ChatEncoder {
    id: String,
    created: u64,
    model: String,
    stream: bool,
    include_usage: bool,
    field: ReasoningField,
    // What a non-streaming answer accumulates.
    content: String,
    reasoning: String,
    tool_calls: Vec<openai::ToolCall>,
}

impl ChatEncoder {
    pub fn new(model: &str, stream: bool, include_usage: bool, field: ReasoningField) -> Self {
        let mut id = String::from("chatcmpl-");
        id.extend((0..24).map(|_| fastrand::alphanumeric()));
        ChatEncoder {
            id,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_owned(),
            stream,
            include_usage,
            field,
            content: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
        }
    }

    fn chunk(&self, delta: openai::DeltaOut<'_>, finish_reason: Option<&str>, out: &mut Vec<u8>) {
        let choices = [openai::ChoiceOut {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        }];
        self.write(&choices, None, out);
    }

    fn write(&self, choices: &[openai::ChoiceOut<'_>], usage: Option<Usage>, out: &mut Vec<u8>) {
        let chunk = openai::ChunkOut {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        };
        out.extend_from_slice(b"data: ");
        // Serializing our own string-only types cannot fail.
        serde_json::to_writer(&mut *out, &chunk).unwrap_or_default();
        out.extend_from_slice(b"\n\n");
    }

    fn reasoning_fields<'t>(&self, text: &'t str) -> (Option<&'t str>, Option<&'t str>) {
        match self.field {
            ReasoningField::ReasoningContent => (Some(text), None),
            ReasoningField::Reasoning => (None, Some(text)),
            ReasoningField::Both => (Some(text), Some(text)),
        }
    }
}

fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
        Finish::ContentFilter => "content_filter",
    }
}

impl Encoder for ChatEncoder {
    fn streams(&self) -> bool {
        self.stream
    }

    fn open(&mut self, out: &mut Vec<u8>) {
        let delta = openai::DeltaOut {
            role: Some("assistant"),
            content: Some(""),
            ..openai::DeltaOut::default()
        };
        self.chunk(delta, None, out);
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if !self.stream {
            self.reasoning.push_str(text);
            return;
        }
        let (reasoning_content, reasoning) = self.reasoning_fields(text);
        let delta = openai::DeltaOut {
            reasoning_content,
            reasoning,
            ..openai::DeltaOut::default()
        };
        self.chunk(delta, None, out);
    }

    fn content(&mut self, text: &str, out: &mut Vec<u8>) {
        if !self.stream {
            self.content.push_str(text);
            return;
        }
        let delta = openai::DeltaOut {
            content: Some(text),
            ..openai::DeltaOut::default()
        };
        self.chunk(delta, None, out);
    }

    fn client_calls(&mut self, calls: &[ToolCall], out: &mut Vec<u8>) {
        self.tool_calls = calls.iter().map(|call| wire_call(call).into()).collect();
        if self.stream {
            let indexed = self
                .tool_calls
                .iter()
                .enumerate()
                .map(|(index, call)| openai::IndexedToolCall { index, call })
                .collect();
            let delta = openai::DeltaOut {
                tool_calls: Some(indexed),
                ..openai::DeltaOut::default()
            };
            self.chunk(delta, None, out);
        }
    }

    fn finish(&mut self, finish: Finish, usage: Usage, out: &mut Vec<u8>) {
        let reason = finish_reason(finish);
        if self.stream {
            self.chunk(openai::DeltaOut::default(), Some(reason), out);
            if self.include_usage {
                self.write(&[], Some(usage), out);
            }
            out.extend_from_slice(sse::DONE);
            return;
        }
        let (reasoning_content, reasoning) = match self.reasoning.is_empty() {
            true => (None, None),
            false => self.reasoning_fields(&self.reasoning),
        };
        let body = openai::CompletionOut {
            id: &self.id,
            object: "chat.completion",
            created: self.created,
            model: &self.model,
            choices: [openai::CompletionChoiceOut {
                index: 0,
                message: openai::AssistantMessageOut {
                    role: "assistant",
                    content: (!self.content.is_empty() || self.tool_calls.is_empty())
                        .then_some(self.content.as_str()),
                    reasoning_content,
                    reasoning,
                    tool_calls: (!self.tool_calls.is_empty()).then_some(self.tool_calls.as_slice()),
                },
                logprobs: None,
                finish_reason: reason,
            }],
            usage,
        };
        // Sized for the text and the envelope: one allocation, no regrowth.
        out.reserve(512 + self.content.len() + self.reasoning.len());
        serde_json::to_writer(&mut *out, &body).unwrap_or_default();
    }

    fn stream_error(&mut self, _status: u16, openai_error: &[u8], out: &mut Vec<u8>) {
        sse::write_data(out, openai_error);
    }
}

/// A call in chat shape, borrowed from the conversation (a round re-sends
/// every call of the history).
#[derive(Serialize)]
pub struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

pub fn wire_call(call: &ToolCall) -> WireCall<'_> {
    WireCall {
        id: &call.id,
        kind: "function",
        function: WireFunction {
            name: &call.name,
            arguments: wire_arguments(call),
        },
    }
}

/// A call's arguments in chat shape: a custom tool's raw input becomes its
/// one argument, `input`.
pub fn wire_arguments(call: &ToolCall) -> Cow<'_, str> {
    match call.kind {
        CallKind::Function => Cow::Borrowed(&call.arguments),
        CallKind::Custom => Cow::Owned(serde_json::json!({ "input": call.arguments }).to_string()),
    }
}

impl From<WireCall<'_>> for openai::ToolCall {
    fn from(call: WireCall<'_>) -> Self {
        openai::ToolCall {
            id: call.id.to_owned(),
            kind: call.kind.to_owned(),
            function: openai::FunctionCall {
                name: call.function.name.to_owned(),
                arguments: call.function.arguments.into_owned(),
            },
        }
    }
}

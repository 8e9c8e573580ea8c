//! The chat-completions front door: a `/v1/chat/completions` request becomes
//! a conversation, and the loop's output becomes one OpenAI chat stream (one
//! id, the role once, deltas as they come, one finish chunk, `[DONE]`) or one
//! `chat.completion`, whatever number of rounds the loop took.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::known_tools::Declared;
use super::{
    decode_history, description, function_tools, invalid, picked_object_and_tools, required_str,
    result_parts, take_bool, take_str, take_str_at, At, Encoder, Entry, Found, Picked, Take,
    ToolShape, Tools,
};
use crate::config::file::ReasoningField;
use crate::config::KeyPath;
use crate::conversation::{
    CallKind, Conversation, Dialect, FilePart, Finish, Format, FunctionTool, Item, Message,
    Options, Part, Prompt, Reasoning, Role, Schema, TextSize, ToolCall, ToolChoice, ToolResult,
    Usage,
};
use crate::error::ApiError;
use crate::json;
use crate::json::cut::Lazy;
use crate::json::scan::Built;
use crate::openai;
use crate::sse;

// ------------------------------------------------------------- decoding

/// The root members the decoder reads, set apart as the body is parsed
/// ([`Picked`]); the others go on in `extra`, to a chat upstream as sent.
const READ: [&str; 14] = [
    "model",
    "messages",
    "stream",
    "stream_options",
    "enable_thinking",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "response_format",
    "user",
];

/// The members of a body [`READ`] set apart.
type Read = Picked<{ READ.len() }>;

/// A chat tool: `{type, function: {name, description, parameters, …}}`,
/// its function read as a tool and its schema kept as the text it came as.
const TOOL: ToolShape = ToolShape {
    dialect: Dialect::Chat,
    schema: "parameters",
    nested: Some("function"),
};

/// The conversation of a chat request's body. Fields the core does not
/// model stay in `extra`, in chat shape, for a chat upstream; tool schemas
/// go on as the text they came as. An OpenAI-compatible coding agent
/// (Continue, Cline, Aider) sends its whole conversation and tools again
/// with each request: the messages and the tool list decoded before are
/// taken as they were ([`known_entries`](super::known_entries),
/// [`known_tools`](super::known_tools)).
pub fn decode(body: &[u8]) -> Result<Conversation, ApiError> {
    decode_with(body, &Found::default())
}

/// [`decode`], with what the body's shape pass found known ([`Found`]).
pub fn decode_with(body: &[u8], found: &Found) -> Result<Conversation, ApiError> {
    let body = picked_object_and_tools(body, TOOL, &READ, Some("messages"), found)
        .map_err(|error| named(body, error))?;
    let (mut read, mut rest, tools) = (body.picked, body.rest, body.tools);
    let mut conversation = Conversation {
        model: take_str(&mut read, "model")?,
        origin: Dialect::Chat,
        ..Conversation::default()
    };
    let messages = (body.history, read.take("messages"));
    let mut system = Prompt::default();
    decode_messages(messages, &mut conversation.items, &mut system)?;
    conversation.system = system.some();
    let declared = tools.declared(Dialect::Chat, decode_tools)?;
    conversation.tools.clone_from(&declared.tools);
    let mut options = Options {
        stream: take_bool(&mut read, "stream")?.unwrap_or(false),
        include_usage: include_usage(read.take("stream_options"))?,
        ..Options::default()
    };
    let enable_thinking = take_bool(&mut read, "enable_thinking")?;
    options.thinking = enable_thinking.or_else(|| {
        rest.get("chat_template_kwargs")
            .and_then(|k| k.get("enable_thinking"))
            .and_then(Value::as_bool)
    });
    if let Some(thinking) = enable_thinking {
        // Forwarded as sent to a chat upstream.
        rest.insert("enable_thinking".into(), Value::Bool(thinking));
    }
    decode_options(&mut rest, &mut read, &mut options)?;
    conversation.options = options;
    conversation.extra = rest;
    Ok(conversation)
}

/// A body that is no JSON object, its error naming the member around the
/// place it breaks off, as OpenAI writes a `param` (`messages[0].content`);
/// the body is read again for it, errors being rare. A member whose name
/// the body breaks off in is left out (the path's own rendering writes it
/// `?`).
fn named(body: &[u8], error: ApiError) -> ApiError {
    let mut json = serde_json::Deserializer::from_slice(body);
    let at = match serde_path_to_error::deserialize::<_, Value>(&mut json) {
        Err(e) => Some(KeyPath::from_serde(e.path()).to_string()).filter(|at| !at.is_empty()),
        Ok(_) => None,
    };
    match at {
        Some(param) if error.param.is_none() => error.with_param(param),
        _ => error,
    }
}

/// `stream_options.include_usage`, false unless given.
fn include_usage(options: Option<Value>) -> Result<bool, ApiError> {
    match options {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(mut options)) => {
            let at = At::Root("stream_options");
            match options.remove("include_usage") {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(include)) => Ok(include),
                Some(_) => Err(at.field("include_usage").invalid("must be a boolean.")),
            }
        }
        Some(_) => Err(At::Root("stream_options").invalid("must be an object.")),
    }
}

/// `messages` as items; the instructions before anything else (`system`
/// or `developer` messages) are the system prompt.
fn decode_messages(
    (history, value): (Option<Vec<Entry<'_>>>, Option<Value>),
    items: &mut Vec<Item>,
    system: &mut Prompt,
) -> Result<(), ApiError> {
    let list = match history.ok_or(value) {
        Ok(list) => list,
        Err(_) => return Err(invalid("messages must be an array.", "messages")),
    };
    // A message's decoding depends on it alone: whether it leads is seen
    // once all are decoded.
    let decode = |message, at: At<'_>, items: &mut _, _: &mut Prompt| {
        decode_message(message, at, items).map(|()| true)
    };
    decode_history(list, Dialect::Chat, "messages", items, system, decode)?;
    let leading = items
        .iter()
        .take_while(|item| matches!(item, Item::Message(message) if message.role == Role::System))
        .count();
    for item in items.drain(..leading) {
        if let Item::Message(message) = item {
            let text = instructions(message.content);
            if !text.is_empty() {
                system.push(text);
            }
        }
    }
    Ok(())
}

/// The text of an instruction message's parts: each part's `text`, of
/// whatever type (`text`, or another API's `input_text`), joined by lines.
fn instructions(parts: Vec<Part>) -> String {
    let texts = parts.into_iter().filter_map(|part| match part {
        Part::Text(text) => Some(text),
        Part::Other(Value::Object(mut part)) => match part.remove("text") {
            Some(Value::String(text)) => Some(text),
            _ => None,
        },
        _ => None,
    });
    texts.collect::<Vec<_>>().join("\n")
}

/// The members of a message the decoder reads; the others go on with it.
const MESSAGE: [&str; 4] = ["role", "content", "tool_calls", "tool_call_id"];

/// One message (`at`) as items: its reasoning, its text, its calls.
fn decode_message(message: Built, at: At<'_>, items: &mut Vec<Item>) -> Result<(), ApiError> {
    let (mut message, mut rest) = Picked::members(message, &MESSAGE, at)?;
    let role = required_str(&mut message, "role", at)?;
    let content = message.take("content");
    let role = match role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" | "developer" => Role::System,
        "tool" => {
            let call_id = take_str_at(&mut message, "tool_call_id", at.field("tool_call_id"))?;
            let (output, attachments) = tool_content(content);
            items.push(Item::ToolResult(ToolResult {
                call_id: call_id.unwrap_or_default(),
                output,
                is_error: false,
                attachments,
            }));
            return Ok(());
        }
        other => {
            return Err(invalid(
                format!("unsupported message role `{other}`"),
                at.field("role").to_string(),
            ))
        }
    };
    if role == Role::Assistant {
        let reasoning = ["reasoning_content", "reasoning"].iter().find_map(|key| {
            match rest.shift_remove(*key) {
                Some(Value::String(text)) if !text.is_empty() => Some(text),
                _ => None,
            }
        });
        if let Some(text) = reasoning {
            items.push(Item::Reasoning(Reasoning {
                text,
                ..Reasoning::default()
            }));
        }
    }
    let calls = tool_calls(message.take("tool_calls"), at.field("tool_calls"))?;
    let parts = decode_content(content);
    if !parts.is_empty() || calls.is_empty() {
        items.push(Item::Message(Message {
            role,
            content: parts,
            extra: rest,
        }));
    }
    items.extend(calls);
    Ok(())
}

/// A message's `tool_calls` (`at`): a list of calls, each with its id and
/// its function's name.
fn tool_calls(calls: Option<Value>, at: At<'_>) -> Result<Vec<Item>, ApiError> {
    let calls = match calls {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(at.invalid("must be an array.")),
    };
    let call = |(j, call)| match openai::ToolCall::deserialize(call) {
        // Its result names it by id.
        Ok(call) if call.id.is_empty() => Err(at
            .index(j)
            .field("id")
            .invalid("must be a non-empty string.")),
        Ok(call) => Ok(Item::ToolCall(ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: call.function.arguments,
            kind: CallKind::Function,
        })),
        Err(e) => Err(at.index(j).invalid(&format!("is not a tool call: {e}."))),
    };
    calls.into_iter().enumerate().map(call).collect()
}

/// A tool message's `content`: a string, or its text parts joined, and its
/// images and files (LangChain sends a tool's picture so) apart.
fn tool_content(content: Option<Value>) -> (String, Vec<Part>) {
    match content {
        Some(Value::String(text)) => (text, Vec::new()),
        content => result_parts(decode_content(content)),
    }
}

/// A request's function tools; a tool without a function is none the
/// model can call here.
fn decode_tools(tools: Tools<'_>) -> Result<Declared, ApiError> {
    let tools = function_tools(tools, |tool, out| {
        let at = tool.param.field("function");
        let function = match tool.nested.map(|function| *function) {
            None | Some(Tools::None) => return Ok(()),
            Some(Tools::Object {
                fields,
                schema,
                description,
                nested: _,
            }) => (fields, schema, description),
            Some(_) => return Err(at.invalid("must be an object.")),
        };
        let (mut fields, schema, text) = function;
        let name = required_str(&mut fields, "name", at)?;
        let schema = schema.filter(|text| text.get() != "null");
        out.push(Arc::new(FunctionTool {
            name,
            description: description(text, at.field("description"))?,
            parameters: schema.map_or_else(Schema::empty, Schema::from),
            kind: CallKind::Function,
            // `strict`, …
            extra: fields.into_map(),
        }));
        Ok(())
    })?;
    Ok(Declared {
        tools,
        ..Declared::default()
    })
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
        Some("file") => {
            let field = |key| {
                part.get("file")
                    .and_then(|f| f.get(key))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let file = FilePart {
                data: field("file_data"),
                id: field("file_id"),
                url: None,
                name: field("filename"),
            };
            match file.data.is_some() || file.id.is_some() {
                true => Part::File(file),
                false => Part::Other(part),
            }
        }
        _ => Part::Other(part),
    }
}

/// The options the core maps between dialects: those `given`, and those
/// that stay in `rest` too.
fn decode_options(
    rest: &mut Map<String, Value>,
    read: &mut Read,
    options: &mut Options,
) -> Result<(), ApiError> {
    let invalid = |key: &'static str| {
        ApiError::bad_request(format!("`{key}` has an invalid value")).with_param(key)
    };
    // `null` is as good as absent.
    let mut given = |key| read.take(key).filter(|value| !value.is_null());
    rest.retain(|key, value| match key.as_str() {
        "max_completion_tokens" => !value.is_null(),
        // No answer of an agent carries them (each round has its own), and
        // llama.cpp refuses a stream that asks for them with tools.
        "logprobs" | "top_logprobs" => false,
        _ => true,
    });
    // `max_completion_tokens` stays as sent for a chat upstream; other
    // dialects get it as their own limit.
    options.max_tokens = match rest.get("max_completion_tokens") {
        Some(v) => {
            let limit = v.as_u64().ok_or_else(|| invalid("max_completion_tokens"))?;
            if let Some(sent) = given("max_tokens") {
                rest.insert("max_tokens".into(), sent);
            }
            Some(limit)
        }
        None => match given("max_tokens") {
            Some(v) => Some(v.as_u64().ok_or_else(|| invalid("max_tokens"))?),
            None => None,
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
    options.temperature = number(given("temperature")).ok_or_else(|| invalid("temperature"))?;
    options.top_p = number(given("top_p")).ok_or_else(|| invalid("top_p"))?;
    options.stop = match given("stop") {
        None => Vec::new(),
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
    options.tool_choice = match given("tool_choice") {
        None => None,
        Some(choice) => Some(decode_tool_choice(&choice).ok_or_else(|| invalid("tool_choice"))?),
    };
    options.parallel_tool_calls = match given("parallel_tool_calls") {
        None => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => return Err(invalid("parallel_tool_calls")),
    };
    options.reasoning_effort = match given("reasoning_effort") {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(invalid("reasoning_effort")),
    };
    options.format = match given("response_format") {
        None => None,
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
    options.user = match given("user") {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(invalid("user")),
    };
    Ok(())
}

/// A number given or none; `None`: something else was given.
fn number(given: Option<Value>) -> Option<Option<f64>> {
    match given {
        None => Some(None),
        Some(v) => v.as_f64().map(Some),
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
        // Its mode; the tools it allows are all offered (as a Responses
        // `allowed_tools` is read).
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("allowed_tools") => {
            match o.get("allowed_tools").and_then(|a| a.get("mode")) {
                Some(mode) if mode == "required" => Some(ToolChoice::Required),
                Some(mode) if mode == "auto" => Some(ToolChoice::Auto),
                _ => None,
            }
        }
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
    /// What every chunk of a stream begins with, its id to its `choices`:
    /// rendered once, not per chunk (empty unless it streams: only a stream
    /// writes chunks).
    chunk_head: Vec<u8>,
    /// A streamed text's chunk, cut around its text (`json::cut`) as the
    /// first one is written: content's, and reasoning's where one member
    /// carries it.
    content_chunk: Lazy,
    reasoning_chunk: Lazy,
}

/// `data: {"id":…,"object":"chat.completion.chunk","created":…,"model":…,"choices":`
fn chunk_head(id: &str, created: u64, model: &str) -> Vec<u8> {
    let mut head = Vec::with_capacity(96 + model.len());
    head.extend_from_slice(b"data: {\"id\":");
    json::write(&mut head, id);
    head.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
    head.extend_from_slice(itoa::Buffer::new().format(created).as_bytes());
    head.extend_from_slice(b",\"model\":");
    json::write(&mut head, model);
    head.extend_from_slice(b",\"choices\":");
    head
}

impl ChatEncoder {
    pub fn new(model: &str, stream: bool, include_usage: bool, field: ReasoningField) -> Self {
        let id = super::random_id::<24>("chatcmpl-");
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        ChatEncoder {
            chunk_head: match stream {
                true => chunk_head(&id, created, model),
                false => Vec::new(),
            },
            id,
            created,
            model: model.to_owned(),
            stream,
            include_usage,
            field,
            content: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            content_chunk: Lazy::default(),
            reasoning_chunk: Lazy::default(),
        }
    }

    /// A text's chunk: by its cut, else written member by member.
    fn text_chunk(
        &self,
        cut: &Lazy,
        delta: for<'t> fn(&Self, &'t str) -> openai::DeltaOut<'t>,
        text: &str,
        out: &mut Vec<u8>,
    ) {
        let writer = |_, text: &str, out: &mut Vec<u8>| self.chunk(delta(self, text), None, out);
        cut.write(writer, 0, text, out);
    }

    fn content_delta<'t>(&self, text: &'t str) -> openai::DeltaOut<'t> {
        openai::DeltaOut {
            content: Some(text),
            ..openai::DeltaOut::default()
        }
    }

    fn reasoning_delta<'t>(&self, text: &'t str) -> openai::DeltaOut<'t> {
        let (reasoning_content, reasoning) = self.reasoning_fields(text);
        openai::DeltaOut {
            reasoning_content,
            reasoning,
            ..openai::DeltaOut::default()
        }
    }

    fn chunk(
        &self,
        delta: openai::DeltaOut<'_>,
        finish_reason: Option<&'static str>,
        out: &mut Vec<u8>,
    ) {
        let choice = openai::ChoiceOut {
            delta,
            finish_reason,
        };
        self.write(Some(&choice), None, out);
    }

    /// A chunk of `choice` (none: the usage chunk's empty list).
    fn write(
        &self,
        choice: Option<&openai::ChoiceOut<'_>>,
        usage: Option<Usage>,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(&self.chunk_head);
        out.push(b'[');
        if let Some(choice) = choice {
            choice.write(out);
        }
        out.push(b']');
        if let Some(usage) = usage {
            out.extend_from_slice(b",\"usage\":");
            usage.write(out);
        }
        out.extend_from_slice(b"}\n\n");
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
            ..openai::DeltaOut::default()
        };
        self.chunk(delta, None, out);
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if !self.stream {
            self.reasoning.push_str(text);
            return;
        }
        match self.field {
            // Two members carry the text: not cut.
            ReasoningField::Both => self.chunk(self.reasoning_delta(text), None, out),
            _ => self.text_chunk(&self.reasoning_chunk, Self::reasoning_delta, text, out),
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<u8>) {
        if !self.stream {
            self.content.push_str(text);
            return;
        }
        self.text_chunk(&self.content_chunk, Self::content_delta, text, out);
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
                self.write(None, Some(usage), out);
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
            created: self.created,
            model: &self.model,
            message: openai::AssistantMessageOut {
                content: (!self.content.is_empty() || self.tool_calls.is_empty())
                    .then_some(self.content.as_str()),
                reasoning_content,
                reasoning,
                tool_calls: (!self.tool_calls.is_empty()).then_some(self.tool_calls.as_slice()),
            },
            finish_reason: reason,
            usage,
        };
        // Sized for the text and the envelope: one allocation, no regrowth.
        out.reserve(512 + TextSize::of([self.content.len(), self.reasoning.len()]).room());
        body.write(out);
    }

    fn stream_error(&mut self, _status: u16, openai_error: &[u8], out: &mut Vec<u8>) {
        sse::write_data(out, openai_error);
    }
}

/// A call in chat shape, borrowed from the conversation (a round re-sends
/// every call of the history).
pub struct WireCall<'a> {
    id: &'a str,
    kind: &'static str,
    function: WireFunction<'a>,
}

struct WireFunction<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

impl WireCall<'_> {
    /// `{"id":…,"type":"function","function":{"name":…,"arguments":…}}`
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.value("id", self.id);
        o.plain("type", self.kind);
        let mut function = o.object("function");
        function.value("name", self.function.name);
        function.text("arguments", &self.function.arguments);
        function.end();
        o.end();
    }
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{decode, decode_tool_choice};
    use crate::conversation::{Description, Dialect, Item, Role, Schema, ToolChoice};

    /// The chat body a chat upstream gets for `body`, no agent rewrite.
    fn forwarded(body: &str) -> Value {
        let conversation = decode(body.as_bytes()).unwrap();
        serde_json::from_slice(&crate::round::chat::encode(&conversation, false)).unwrap()
    }

    #[test]
    fn unknown_fields_go_on_to_a_chat_upstream() {
        let out = forwarded(
            r#"{"model":"m","messages":[{"role":"user","content":"hi","name":"bob"}],
            "temperature":0.3,"response_format":{"type":"json_object"},"x_custom":[1,2],
            "enable_thinking":false}"#,
        );
        assert_eq!(out["messages"][0]["name"], "bob");
        assert_eq!(out["x_custom"], json!([1, 2]));
        assert_eq!(out["response_format"], json!({"type": "json_object"}));
        assert_eq!(out["temperature"], 0.3);
        assert_eq!(out["enable_thinking"], false);
    }

    #[test]
    fn token_limits_go_on_as_sent_and_wrong_options_are_named() {
        let user = r#""messages":[{"role":"user","content":"hi"}]"#;
        let out = forwarded(&format!(
            r#"{{{user},"max_tokens":9,"stop":"x","user":"u"}}"#
        ));
        assert_eq!(out["max_tokens"], 9);
        assert_eq!(out.get("max_completion_tokens"), None);
        assert_eq!(out["stop"], json!(["x"]));
        // Both limits: each as sent, the newer one the agent's own.
        let body = format!(r#"{{{user},"max_tokens":9,"max_completion_tokens":5}}"#);
        assert_eq!(decode(body.as_bytes()).unwrap().options.max_tokens, Some(5));
        let out = forwarded(&body);
        assert_eq!(
            (&out["max_tokens"], &out["max_completion_tokens"]),
            (&json!(9), &json!(5))
        );
        // openai-python sends an explicit `None` as `null`: no limit. And
        // logprobs, which no agent answer carries, are not asked for
        // (llama.cpp refuses them in a stream with tools).
        let body = format!(
            r#"{{{user},"max_completion_tokens":null,"logprobs":true,"top_logprobs":2,"seed":1}}"#
        );
        assert_eq!(decode(body.as_bytes()).unwrap().options.max_tokens, None);
        let out = forwarded(&body);
        for gone in ["max_completion_tokens", "logprobs", "top_logprobs"] {
            assert_eq!(out.get(gone), None, "{gone}");
        }
        assert_eq!(out["seed"], 1);
        for (option, value) in [
            ("max_tokens", "-1"),
            ("temperature", "\"hot\""),
            ("stop", "[1]"),
            ("tool_choice", "7"),
            ("parallel_tool_calls", "\"yes\""),
            ("response_format", "{\"type\":\"yaml\"}"),
            ("user", "{}"),
        ] {
            let body = format!(r#"{{{user},"{option}":{value}}}"#);
            let error = decode(body.as_bytes()).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(option), "{body}");
        }
    }

    #[test]
    fn a_tool_schema_goes_on_as_the_client_wrote_it() {
        // Key order, an escape and a number as written: the text, not a
        // re-serialized value (a prompt cache needs the same bytes per turn).
        // A description too: its escapes as sent.
        let schema = r#"{"type":"object","required":["b","a"],"properties":{"b":{"type":"string","description":"caf\u00e9"},"a":{"type":"number","maximum":1.50}}}"#;
        let description = r#""Caf\u00e9 \/ \"menu\"\n""#;
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":[
            {{"type":"function","function":{{"name":"T","strict":true,"description":{description},"parameters":{schema}}}}},
            {{"type":"function","function":{{"name":"N","description":null,"parameters":null}}}},
            {{"type":"custom","custom":{{"name":"C"}}}}]}}"#
        );
        let conversation = decode(body.as_bytes()).unwrap();
        let out = crate::round::chat::encode(&conversation, false);
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(&format!(r#""parameters":{schema}"#)), "{out}");
        assert!(
            out.contains(&format!(r#""description":{description}"#)),
            "{out}"
        );
        let first = conversation.tools[0].description.as_ref();
        assert_eq!(
            first.map(Description::text).as_deref(),
            Some("Café / \"menu\"\n")
        );
        assert_eq!(conversation.tools[1].description, None);
        let error = decode(br#"{"messages":[],"tools":[{"type":"function","function":{"name":"T","description":7}}]}"#).unwrap_err();
        assert_eq!(
            error.param.as_deref(),
            Some("tools[0].function.description")
        );
        assert_eq!(
            error.message,
            "tools[0].function.description must be a string."
        );
        let names: Vec<&str> = conversation.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["T", "N"]);
        assert_eq!(conversation.tools[0].extra["strict"], true);
        assert_eq!(conversation.tools[1].parameters, Schema::empty());
    }

    #[test]
    fn leading_instructions_are_the_system_prompt_and_calls_follow_their_text() {
        let conversation = decode(
            br#"{"messages":[
            {"role":"system","content":"Be brief."},
            {"role":"developer","content":[{"type":"text","text":"Use tools."},
             {"type":"input_text","text":"Be kind."}]},
            {"role":"user","content":"Weather?"},
            {"role":"assistant","content":"Looking.","reasoning_content":"Paris.",
             "tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"sunny"},
            {"role":"system","content":"Late note."}]}"#,
        )
        .unwrap();
        assert_eq!(
            conversation.system_text().as_deref(),
            Some("Be brief.\n\nUse tools.\nBe kind.")
        );
        let kinds: Vec<&str> = conversation
            .items
            .iter()
            .map(|item| match item {
                Item::Message(m) if m.role == Role::User => "user",
                Item::Message(m) if m.role == Role::Assistant => "assistant",
                Item::Message(m) if m.role == Role::System => "system",
                Item::Reasoning(_) => "reasoning",
                Item::ToolCall(_) => "call",
                Item::ToolResult(_) => "result",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            ["user", "reasoning", "assistant", "call", "result", "system"]
        );
    }

    #[test]
    fn a_history_decodes_the_same_from_the_messages_decoded_before() {
        // A thread of its own: its kept messages and tools are this test's.
        crate::on_a_new_thread(a_history_decodes_the_same_on_this_thread);
    }

    /// A session of an OpenAI-compatible coding agent (Cline, Continue):
    /// its instructions, its tools, and a tool round more each turn.
    fn a_history_decodes_the_same_on_this_thread() {
        use crate::conversation::Conversation;
        use crate::front::known_entries;

        let instructions = json!({"role": "system", "content": "You edit code. ".repeat(40)});
        let call = |i: usize| {
            let arguments = json!({"path": format!("src/m{i}.py"),
                "old": "def f(x):\n\treturn \"x\"\n".repeat(8),
                "new": "def f(x):\n\treturn 'é'\n".repeat(8)});
            json!({"role": "assistant", "content": "Editing.", "reasoning_content": format!("plan {i}"),
                "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                    "function": {"name": "edit", "arguments": arguments.to_string()}}]})
        };
        let result = |i: usize| {
            json!({"role": "tool", "tool_call_id": format!("call_{i}"),
                "content": "The file has been updated.\n".repeat(12)})
        };
        // A list of 1 KiB or more, as coding agents' are: kept.
        let tools = json!([{"type": "function", "function": {"name": "edit",
            "description": "Edits a file. ".repeat(80), "strict": true,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
        let turn = |n: usize| {
            let mut messages = vec![
                instructions.clone(),
                json!({"role": "user", "content": "Fix it."}),
            ];
            for i in 0..n {
                messages.push(call(i));
                messages.push(result(i));
            }
            // The same instructions again, not leading: a message of its own.
            messages.push(instructions.clone());
            json!({"model": "m", "messages": messages, "tools": tools, "stream": true})
        };
        // Each turn's reference decoded on a thread that has kept nothing,
        // and the model's request made of it.
        let sent = |conv: &Conversation| {
            let json = crate::round::chat::encode(conv, false);
            serde_json::from_slice::<Value>(&json).unwrap()
        };
        let fresh = |body: Value| {
            crate::on_a_new_thread(move || {
                let conv = decode(body.to_string().as_bytes()).unwrap();
                (format!("{conv:?}"), sent(&conv))
            })
        };
        for n in 1..5 {
            let conv = decode(turn(n).to_string().as_bytes()).unwrap();
            assert_eq!(
                (format!("{conv:?}"), sent(&conv)),
                fresh(turn(n)),
                "turn {n}"
            );
            assert_eq!(
                conv.system_text().as_deref(),
                instructions["content"].as_str()
            );
            let last = conv.items.last();
            assert!(matches!(last, Some(Item::Message(m)) if m.role == Role::System));
            assert_eq!(conv.tools.len(), 1);
        }
        // The earlier turns' messages were kept, and the next turn found
        // them; so was the tool list.
        let body = turn(4).to_string();
        let kept = |message: &Value| {
            let rest = &body[body.find(&message.to_string()).unwrap()..];
            let head = known_entries::head(rest.as_bytes()).unwrap();
            known_entries::find(Dialect::Chat, head, rest).is_some()
        };
        assert!(kept(&instructions) && kept(&call(0)) && kept(&result(2)));
        let listed = &body[body.find(&tools.to_string()).unwrap()..];
        assert!(crate::front::known_tools::find(Dialect::Chat, listed).is_some());
        // A message after kept ones that is wrong is named by its place.
        let mut broken = turn(4);
        broken["messages"][8]["tool_calls"][0] = json!({"type": "function"});
        let error = decode(broken.to_string().as_bytes()).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("messages[8].tool_calls[0]"));
        assert!(
            error.message.contains("missing field `function`"),
            "{}",
            error.message
        );
    }

    #[test]
    fn tool_choices_as_openai_writes_them() {
        for (choice, read) in [
            (json!("auto"), Some(ToolChoice::Auto)),
            (json!("required"), Some(ToolChoice::Required)),
            (
                json!({"type": "function", "function": {"name": "f"}}),
                Some(ToolChoice::Function("f".into())),
            ),
            (
                json!({"type": "allowed_tools", "allowed_tools": {"mode": "required",
                       "tools": [{"type": "function", "function": {"name": "f"}}]}}),
                Some(ToolChoice::Required),
            ),
            (
                json!({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}),
                Some(ToolChoice::Auto),
            ),
            (json!({"type": "allowed_tools"}), None),
            (json!("sometimes"), None),
        ] {
            assert_eq!(decode_tool_choice(&choice), read, "{choice}");
        }
    }

    #[test]
    fn fields_of_the_wrong_shape_are_named() {
        let user = json!({"role": "user", "content": "hi"});
        for (body, param) in [
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": [user, 7]}), "messages[1]"),
            (json!({"messages": [{"content": "hi"}]}), "messages[0].role"),
            (json!({"messages": [{"role": "robot"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "w"}}]}]}),
                "messages[0].tool_calls[0].id",
            ),
            (
                json!({"messages": [user], "tools": [{"type": "function", "function": 3}]}),
                "tools[0].function",
            ),
            (
                json!({"messages": [user], "tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"messages": [user], "stream_options": {"include_usage": "yes"}}),
                "stream_options.include_usage",
            ),
            (
                json!({"messages": [user], "enable_thinking": "no"}),
                "enable_thinking",
            ),
            (json!({"model": 7, "messages": [user]}), "model"),
        ] {
            let error = decode(body.to_string().as_bytes()).unwrap_err();
            assert_eq!(
                error.param.as_deref(),
                Some(param),
                "{body}: {}",
                error.message
            );
            assert_eq!(error.status, 400);
        }
        let error = decode(b"[1]").unwrap_err();
        assert!(
            error.message.contains("not a valid JSON object"),
            "{}",
            error.message
        );
        assert_eq!(
            decode(br#"{"messages":null}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("messages")
        );
    }

    #[test]
    fn a_body_cut_off_inside_a_name_names_the_member_around_it() {
        for (body, param) in [
            (&br#"{"model":"a","messa"#[..], None),
            (
                br#"{"messages":[{"role":"user","conte"#,
                Some("messages[0]"),
            ),
            (
                br#"{"messages":[{"role":"user","content":"h"#,
                Some("messages[0].content"),
            ),
            (br#"{"model":"a","#, None),
        ] {
            let error = decode(body).unwrap_err();
            assert_eq!(error.status, 400);
            assert_eq!(
                error.param.as_deref(),
                param,
                "{}: {}",
                String::from_utf8_lossy(body),
                error.message
            );
        }
    }

    #[test]
    fn a_streamed_texts_chunk_is_what_the_chunk_writer_writes() {
        use super::{ChatEncoder, Encoder, ReasoningField};
        use crate::openai::DeltaOut;
        for field in [
            ReasoningField::ReasoningContent,
            ReasoningField::Reasoning,
            ReasoningField::Both,
        ] {
            let mut encoder = ChatEncoder::new("m \"quoted\" é", true, false, field);
            type Write = fn(&mut ChatEncoder, &str, &mut Vec<u8>);
            type Delta = for<'t> fn(&ChatEncoder, &'t str) -> DeltaOut<'t>;
            let kinds: [(Write, Delta); 2] = [
                (ChatEncoder::content, ChatEncoder::content_delta),
                (ChatEncoder::reasoning, ChatEncoder::reasoning_delta),
            ];
            for text in ["", "x", "a\"b\\c\n\u{1}é ✓", "</script>"] {
                for (write, delta) in kinds {
                    let (mut fast, mut written) = (Vec::new(), Vec::new());
                    write(&mut encoder, text, &mut fast);
                    encoder.chunk(delta(&encoder, text), None, &mut written);
                    assert_eq!(
                        String::from_utf8_lossy(&fast),
                        String::from_utf8_lossy(&written)
                    );
                }
            }
            // Cut as the first was written; reasoning in two members is not.
            assert!(encoder.content_chunk.is_cut());
            let reasoning_cut = encoder.reasoning_chunk.is_cut();
            assert_eq!(reasoning_cut, field != ReasoningField::Both);
        }
    }
}

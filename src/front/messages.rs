//! The Anthropic Messages front door (`POST /v1/messages`): the request
//! decoder and the encoder of the answer, as Anthropic streams it (named SSE
//! events: `message_start`, content blocks numbered by `index`,
//! `message_delta`, `message_stop`) or as one Message object.
//!
//! Server tools (web search, code execution, …) are dropped: the proxy cannot
//! run them. The model's reasoning goes out as `thinking` blocks; a block's
//! `signature` is the opaque reasoning an upstream handed out, if any, and
//! comes back as that reasoning's encrypted content.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::chat::wire_arguments;
use super::defined_tools;
use super::known_tools::Declared;
use super::{
    decode_history, description, function_tools, invalid, new_id, note_dropped,
    picked_object_and_tools, required_str, result_parts, take_bool, take_f64, take_str,
    take_str_at, take_u64, At, Channel, Encoder, Entry, ErrorEnvelope, ErrorIn, Found, Picked,
    Take, ToolObject, ToolShape, Tools,
};
use crate::conversation::{
    CallKind, Conversation, Dialect, FilePart, Finish, Format, FunctionTool, Item, Message,
    Options, Part, Prompt, Reasoning, Role, Schema, TextSize, ToolCall, ToolChoice, ToolResult,
    Usage,
};
use crate::error::ApiError;
use crate::json;
use crate::json::cut::Lazy;
use crate::json::scan::Built;

/// Anthropic's keep-alive event: what a silent stream gets instead of an SSE
/// comment (see [`Encoder::heartbeat`]).
pub const PING: &[u8] = b"event: ping\ndata: {\"type\": \"ping\"}\n\n";

/// How the signature of a thinking block the proxy wrote begins, when the
/// upstream gave its reasoning none. Clients keep a thinking block for the
/// history they send back only if it is signed (the AI SDK's and litellm's
/// Anthropic providers drop it otherwise), and the model's prompt then lacks
/// its reasoning: a changed prompt, and the server's cache of it lost.
const OWN_SIGNATURE: &str = "agent-proxy:";
/// How the signature of a thinking block of the proxy's own progress notes
/// (`Calling get_weather {…}…`) begins: sent back, such a block is dropped,
/// as the model never wrote it, and the calls it names are not in the
/// history the client holds.
const NOTE_SIGNATURE: &str = "agent-proxy:note:";

/// What decoding a request learned that the caller needs.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Types of the server tools the client declared (`web_search_20250305`,
    /// `code_execution_20250825`, …): the proxy cannot run them, so they are dropped;
    /// the caller logs them.
    pub dropped_tools: Vec<String>,
    /// The client switched thinking on (`enabled`, `adaptive`): only then
    /// does Anthropic's API answer thinking blocks, and only then does a
    /// client look past `content[0]` for the text.
    pub thinking: bool,
}

/// The root members the decoder reads, set apart as the body is parsed
/// ([`Picked`]); the others go on in `extra`. The last six configure
/// Anthropic's own services: accepted, never taken, so never forwarded.
const READ: [&str; 19] = [
    "model",
    "system",
    "messages",
    "stream",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "tool_choice",
    "thinking",
    "output_config",
    "metadata",
    "context_management",
    "safeguards",
    "container",
    "mcp_servers",
    "service_tier",
    "cache_control",
];

/// The members of a body [`READ`] set apart.
type Read = Picked<{ READ.len() }>;

/// How Claude Code's first system block starts: billing attribution for
/// Anthropic's API, not an instruction. It differs between conversations, so
/// kept it would make every prompt start differently and defeat the
/// upstream's prompt cache.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

// ------------------------------------------------------------------ decode

/// A tool's schema, kept as the text it came as.
const TOOL: ToolShape = ToolShape {
    dialect: Dialect::Messages,
    schema: "input_schema",
    nested: None,
};

/// A `POST /v1/messages` body as a conversation (origin
/// [`Dialect::Messages`]), with what the caller must know about it.
pub fn decode(body: &[u8]) -> Result<(Conversation, Context), ApiError> {
    decode_with(body, &Found::default())
}

/// [`decode`], with what the body's shape pass found known ([`Found`]).
pub fn decode_with(body: &[u8], found: &Found) -> Result<(Conversation, Context), ApiError> {
    // Tools are most of a coding agent's request: read as tools in the
    // body's one pass, their schemas kept as the text they came as.
    let body = picked_object_and_tools(body, TOOL, &READ, Some("messages"), found)?;
    let (mut read, mut top, tools) = (body.picked, body.rest, body.tools);
    let mut ctx = Context::default();
    let mut conv = Conversation {
        origin: Dialect::Messages,
        model: take_str(&mut read, "model")?,
        ..Conversation::default()
    };
    let mut system = decode_system(read.take("system"))?;
    let messages = (body.history, read.take("messages"));
    decode_messages(messages, &mut conv.items, &mut system)?;
    conv.system = system.some();
    let declared = tools.declared(Dialect::Messages, decode_tools)?;
    conv.tools.clone_from(&declared.tools);
    ctx.dropped_tools.clone_from(&declared.dropped);
    conv.options = decode_options(&mut read, &mut top)?;
    ctx.thinking = conv.options.thinking == Some(true);
    // Claude Code's carries its session id; an app's, its user.
    conv.session.clone_from(&conv.options.user);
    conv.extra = top;
    Ok((conv, ctx))
}

/// The system prompt's parts: a string, or text blocks (`cache_control`
/// means nothing to other upstreams).
fn decode_system(system: Option<Value>) -> Result<Prompt, ApiError> {
    let mut prompt = Prompt::default();
    match system {
        None | Some(Value::Null) => Ok(prompt),
        Some(Value::String(text)) => {
            if !text.is_empty() {
                prompt.push(text);
            }
            Ok(prompt)
        }
        Some(Value::Array(blocks)) => {
            block_texts(blocks)
                .filter(|text| !is_billing_header(text))
                .for_each(|text| prompt.push(text));
            Ok(prompt)
        }
        Some(_) => Err(invalid(
            "system must be a string or an array of text blocks.",
            "system",
        )),
    }
}

/// Claude Code's billing block: the header line alone.
fn is_billing_header(text: &str) -> bool {
    text.starts_with(BILLING_HEADER) && !text.contains('\n')
}

/// The non-empty `text` of each block.
fn block_texts(blocks: Vec<Value>) -> impl Iterator<Item = String> {
    blocks.into_iter().filter_map(|block| match block {
        Value::Object(mut block) => match block.remove("text") {
            Some(Value::String(text)) if !text.is_empty() => Some(text),
            _ => None,
        },
        _ => None,
    })
}

/// `messages`: read entry by entry when it is an array (a coding agent's
/// history, most of it decoded before), else as the value it is.
fn decode_messages(
    (history, value): (Option<Vec<Entry<'_>>>, Option<Value>),
    items: &mut Vec<Item>,
    system: &mut Prompt,
) -> Result<(), ApiError> {
    match history.ok_or(value) {
        Ok(list) if !list.is_empty() => {
            let dialect = Dialect::Messages;
            let decode = |message, at: At<'_>, items: &mut _, system: &mut _| {
                decode_message(message, at, items, system).map(|()| true)
            };
            decode_history(list, dialect, "messages", items, system, decode)
        }
        Ok(_) => Err(invalid("messages must not be empty.", "messages")),
        Err(None | Some(Value::Null)) => Err(invalid("messages is required.", "messages")),
        Err(Some(_)) => Err(invalid(
            "messages must be an array of messages.",
            "messages",
        )),
    }
}

/// The members of a message the decoder reads; the others go on with it.
const MESSAGE: [&str; 2] = ["role", "content"];

/// One message as items: its tool results first (chat templates want them
/// right after the calls), then its parts, reasoning and calls in order.
fn decode_message(
    message: Built,
    param: At<'_>,
    items: &mut Vec<Item>,
    system: &mut Prompt,
) -> Result<(), ApiError> {
    let (mut read, message) = Picked::members(message, &MESSAGE, param)?;
    let role = match required_str(&mut read, "role", param)?.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        // Claude Code sends one after the first user turn. Many chat
        // templates refuse a system message that does not lead, so it joins
        // the system prompt.
        "system" => {
            match read.take("content") {
                Some(Value::String(text)) if !text.is_empty() => system.push(text),
                Some(Value::Array(blocks)) => block_texts(blocks).for_each(|t| system.push(t)),
                _ => {}
            }
            return Ok(());
        }
        other => {
            return Err(invalid(
                format!("Invalid {param}.role `{other}`: expected user or assistant."),
                param.field("role"),
            ))
        }
    };
    let blocks = match read.take("content") {
        Some(Value::String(text)) => {
            items.push(Item::Message(Message {
                role,
                content: vec![Part::Text(text)],
                extra: message,
            }));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(param
                .field("content")
                .invalid("must be a string or an array of content blocks."))
        }
    };
    let mut turn = Turn {
        role,
        extra: message,
        parts: Vec::new(),
        rest: Vec::new(),
    };
    let list = param.field("content");
    for (j, block) in blocks.into_iter().enumerate() {
        if let Some(result) = decode_block(block, list.index(j), &mut turn)? {
            items.push(Item::ToolResult(result));
        }
    }
    turn.flush();
    items.append(&mut turn.rest);
    Ok(())
}

/// A message's items as its blocks are read: consecutive parts make one
/// message, cut by reasoning and calls.
struct Turn {
    role: Role,
    /// Message fields besides `role` and `content`, for the first message.
    extra: Map<String, Value>,
    parts: Vec<Part>,
    rest: Vec<Item>,
}

impl Turn {
    fn flush(&mut self) {
        if !self.parts.is_empty() {
            self.rest.push(Item::Message(Message {
                role: self.role,
                content: std::mem::take(&mut self.parts),
                extra: std::mem::take(&mut self.extra),
            }));
        }
    }

    fn push(&mut self, item: Item) {
        self.flush();
        self.rest.push(item);
    }
}

/// One content block into `turn`; a tool result is returned instead (it goes
/// before the message's other items).
fn decode_block(
    block: Value,
    param: At<'_>,
    turn: &mut Turn,
) -> Result<Option<ToolResult>, ApiError> {
    let Value::Object(mut block) = block else {
        return Err(param.invalid("must be an object."));
    };
    let kind = match block.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        _ => return Err(param.field("type").invalid("is required.")),
    };
    match kind.as_str() {
        "text" => match block.remove("text") {
            // An empty text says nothing, and before a thinking block it
            // made an assistant turn of its own (LangChain sends back one
            // it merged from a stream that began with thinking): two
            // assistant messages in a row, which templates refuse.
            Some(Value::String(text)) if text.is_empty() && turn.role == Role::Assistant => {}
            Some(Value::String(text)) => turn.parts.push(Part::Text(text)),
            _ => return Err(param.field("text").invalid("must be a string.")),
        },
        "image" => turn.parts.push(decode_image(block)),
        "document" => decode_document(block, &mut turn.parts),
        "search_result" => turn.parts.push(Part::Text(search_result_text(block))),
        "tool_use" => {
            let id = required_str(&mut block, "id", param)?;
            let name = required_str(&mut block, "name", param)?;
            // Written by our writer (serde_json's bytes, strings escaped by
            // SIMD): through `Display`, serde_json escaped a file edit's
            // text byte by byte into a `fmt::Write`, 16% of a request with
            // thirty such calls in its history.
            let arguments = match block.remove("input") {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(input) => crate::json::to_string(&input),
            };
            turn.push(Item::ToolCall(ToolCall {
                id,
                name,
                arguments,
                kind: CallKind::Function,
            }));
        }
        "tool_result" => {
            let call_id = required_str(&mut block, "tool_use_id", param)?;
            let (output, attachments) = match block.remove("content") {
                None | Some(Value::Null) => (String::new(), Vec::new()),
                Some(Value::String(text)) => (text, Vec::new()),
                Some(Value::Array(blocks)) => result_blocks(blocks),
                Some(_) => {
                    return Err(param
                        .field("content")
                        .invalid("must be a string or an array of content blocks."))
                }
            };
            let is_error = take_bool(&mut block, "is_error")
                .map_err(|_| param.field("is_error").invalid("must be a boolean."))?
                .unwrap_or(false);
            // A chat or Responses upstream has no field for it: the text
            // says so, as the proxy's own failed tools' results do.
            let output = match is_error {
                true => format!("error: {output}"),
                false => output,
            };
            return Ok(Some(ToolResult {
                call_id,
                output,
                is_error,
                attachments,
            }));
        }
        "thinking" => {
            let text = take_str_at(&mut block, "thinking", param.field("thinking"))?;
            let signature = take_str_at(&mut block, "signature", param.field("signature"))?;
            if signature
                .as_deref()
                .is_some_and(|s| s.starts_with(NOTE_SIGNATURE))
            {
                return Ok(None);
            }
            let reasoning = Reasoning {
                text: text.unwrap_or_default(),
                // Our own mark carries nothing for an upstream.
                encrypted: signature.filter(|s| !s.is_empty() && !s.starts_with(OWN_SIGNATURE)),
                ..Reasoning::default()
            };
            // An empty block without a signature carries nothing.
            if !reasoning.text.is_empty() || reasoning.encrypted.is_some() {
                turn.push(Item::Reasoning(reasoning));
            }
        }
        "redacted_thinking" => {
            if let Some(data) = take_str_at(&mut block, "data", param.field("data"))? {
                turn.push(Item::Reasoning(Reasoning {
                    encrypted: Some(data),
                    ..Reasoning::default()
                }));
            }
        }
        // Documents, search results, server tool blocks: passed on as they are.
        _ => turn.parts.push(Part::Other(Value::Object(block))),
    }
    Ok(None)
}

/// A tool result's blocks: their texts, one a line, and what is not text
/// (images, PDFs: Claude Code's Read of such a file), which a chat tool
/// message cannot hold.
fn result_blocks(blocks: Vec<Value>) -> (String, Vec<Part>) {
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        let Value::Object(block) = block else {
            continue;
        };
        match block.get("type").and_then(Value::as_str) {
            Some("image") => parts.push(decode_image(block)),
            Some("document") => decode_document(block, &mut parts),
            Some("search_result") => parts.push(Part::Text(search_result_text(block))),
            // Text blocks, by their text.
            _ => parts.push(Part::Other(Value::Object(block))),
        }
    }
    result_parts(parts)
}

/// A search result (a RAG tool's, with its source for citations) as the
/// text a model without Anthropic's citations reads: title, source, text.
fn search_result_text(mut block: Map<String, Value>) -> String {
    let mut lines = Vec::new();
    for key in ["title", "source"] {
        if let Some(Value::String(line)) = block.remove(key) {
            lines.push(line);
        }
    }
    if let Some(Value::Array(blocks)) = block.remove("content") {
        let mut texts = block_texts(blocks).peekable();
        if texts.peek().is_some() {
            lines.push(String::new());
            lines.extend(texts);
        }
    }
    lines.join("\n")
}

/// An image by base64 data (as a `data:` URL) or by URL; by file id, as it is.
fn decode_image(block: Map<String, Value>) -> Part {
    let source = block.get("source");
    let field = |key| source.and_then(|s| s.get(key)).and_then(Value::as_str);
    let url = match field("type") {
        Some("base64") => match (field("media_type"), field("data")) {
            (Some(media_type), Some(data)) => Some(format!("data:{media_type};base64,{data}")),
            _ => None,
        },
        Some("url") => field("url").map(str::to_owned),
        _ => None,
    };
    match url {
        Some(url) => Part::Image { url, detail: None },
        None => Part::Other(Value::Object(block)),
    }
}

/// A document: a text one (or one of content blocks) as its text, titled;
/// a PDF (base64), or one by URL or file id, as a file.
fn decode_document(block: Map<String, Value>, parts: &mut Vec<Part>) {
    let source = block.get("source");
    let field = |key| source.and_then(|s| s.get(key)).and_then(Value::as_str);
    let title = block.get("title").and_then(Value::as_str);
    let titled = |text: &str| match title {
        Some(title) => format!("{title}\n\n{text}"),
        None => text.to_owned(),
    };
    let file = |data, id, url, name: Option<&str>| {
        Part::File(FilePart {
            data,
            id,
            url,
            name: title.or(name).map(str::to_owned),
        })
    };
    let part = match field("type") {
        Some("text") => match field("data") {
            Some(text) => Part::Text(titled(text)),
            None => Part::Other(Value::Object(block)),
        },
        Some("content") => {
            let blocks = source.and_then(|s| s.get("content"));
            let text = match blocks {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(blocks)) => blocks
                    .iter()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .filter(|text| !text.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => return parts.push(Part::Other(Value::Object(block))),
            };
            Part::Text(titled(&text))
        }
        Some("base64") => match (field("media_type"), field("data")) {
            // OpenAI's file part wants a name with its data.
            (Some(media_type), Some(data)) => {
                let name = match media_type {
                    "application/pdf" => "document.pdf",
                    _ => "document",
                };
                let data = format!("data:{media_type};base64,{data}");
                file(Some(data), None, None, Some(name))
            }
            _ => Part::Other(Value::Object(block)),
        },
        Some("url") => match field("url") {
            Some(url) => file(None, None, Some(url.to_owned()), None),
            None => Part::Other(Value::Object(block)),
        },
        Some("file") => match field("file_id") {
            Some(id) => file(None, Some(id.to_owned()), None, None),
            None => Part::Other(Value::Object(block)),
        },
        _ => Part::Other(Value::Object(block)),
    };
    parts.push(part);
}

/// Custom tools become functions, and so do Anthropic-defined client tools
/// (bash, the text editor, memory: [`defined_tools`]); server tools (any
/// other `type`) are dropped.
fn decode_tools(tools: Tools) -> Result<Declared, ApiError> {
    let mut dropped = Vec::new();
    let tools = function_tools(tools, |tool, out| {
        let ToolObject {
            param,
            fields: mut tool,
            mut schema,
            description: given,
            nested: _,
        } = tool;
        let mut defined = None;
        match take_str_at(&mut tool, "type", param.field("type"))? {
            None => {}
            Some(kind) if kind == "custom" => {}
            Some(kind) => match defined_tools::defined(&kind) {
                Some(found) => defined = Some(found),
                None => {
                    note_dropped(&mut dropped, kind);
                    return Ok(());
                }
            },
        }
        let name = required_str(&mut tool, "name", param)?;
        let mut description = description(given, param.field("description"))?;
        if let Some((text, parameters)) = defined {
            (description, schema) = (text, Some(parameters));
        }
        // `cache_control`, `defer_loading`, `strict`, …
        out.push(Arc::new(FunctionTool {
            name,
            description,
            parameters: schema.unwrap_or_else(Schema::empty),
            kind: CallKind::Function,
            extra: tool.into_map(),
        }));
        Ok(())
    })?;
    Ok(Declared {
        tools,
        dropped,
        ..Declared::default()
    })
}

/// The sampling and output options, out of the members `read`; what the
/// core does not map of `output_config` back to `top`.
fn decode_options(read: &mut Read, top: &mut Map<String, Value>) -> Result<Options, ApiError> {
    let mut options = Options {
        stream: take_bool(read, "stream")?.unwrap_or(false),
        // `message_delta` reports usage: ask upstreams for it.
        include_usage: true,
        max_tokens: take_u64(read, "max_tokens")?,
        temperature: take_f64(read, "temperature")?,
        top_p: take_f64(read, "top_p")?,
        ..Options::default()
    };
    options.top_k = take_u64(read, "top_k")?;
    options.stop = match read.take("stop_sequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(all)) => all
            .into_iter()
            .map(|s| match s {
                Value::String(s) => Ok(s),
                _ => Err(invalid(
                    "stop_sequences must be an array of strings.",
                    "stop_sequences",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(invalid(
                "stop_sequences must be an array of strings.",
                "stop_sequences",
            ))
        }
    };
    if let Some(choice) = read.take("tool_choice").filter(|v| !v.is_null()) {
        decode_tool_choice(&choice, &mut options)?;
    }
    if let Some(thinking) = read.take("thinking").filter(|v| !v.is_null()) {
        decode_thinking(&thinking, &mut options)?;
    }
    if let Some(config) = read.take("output_config").filter(|v| !v.is_null()) {
        let Value::Object(mut config) = config else {
            return Err(invalid("output_config must be an object.", "output_config"));
        };
        // The explicit effort wins over one read from a thinking budget.
        if let Some(effort) = take_str_at(&mut config, "effort", At::Root("output_config.effort"))?
        {
            options.reasoning_effort = Some(openai_effort(effort));
        }
        if let Some(format) = config.remove("format").filter(|v| !v.is_null()) {
            options.format = decode_format(format)?;
        }
        if !config.is_empty() {
            top.insert("output_config".into(), Value::Object(config));
        }
    }
    // Claude Code's `user_id` is a JSON string (device, session); kept as sent.
    if let Some(metadata) = read.take("metadata") {
        options.user = metadata
            .get("user_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    Ok(options)
}

fn decode_tool_choice(choice: &Value, options: &mut Options) -> Result<(), ApiError> {
    let (kind, fields) = match choice {
        Value::Object(fields) => match fields.get("type").and_then(Value::as_str) {
            Some(kind) => (kind, Some(fields)),
            None => return Err(invalid("tool_choice.type is required.", "tool_choice.type")),
        },
        // Not Anthropic's shape, but unambiguous.
        Value::String(kind) => (kind.as_str(), None),
        _ => return Err(invalid("tool_choice must be an object.", "tool_choice")),
    };
    let field = |key| fields.and_then(|f| f.get(key));
    options.tool_choice = Some(match kind {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => match field("name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Function(name.to_owned()),
            None => return Err(invalid("tool_choice.name is required.", "tool_choice.name")),
        },
        other => {
            return Err(invalid(
                format!("Invalid tool_choice.type `{other}`: expected auto, any, tool or none."),
                "tool_choice.type",
            ))
        }
    });
    if field("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
        options.parallel_tool_calls = Some(false);
    }
    Ok(())
}

/// `enabled` (with a budget, read as an effort), `disabled`, or a mode where
/// the model decides (`adaptive`); an unknown mode says nothing.
fn decode_thinking(thinking: &Value, options: &mut Options) -> Result<(), ApiError> {
    let Value::Object(fields) = thinking else {
        return Err(invalid("thinking must be an object.", "thinking"));
    };
    match fields.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            options.thinking = Some(true);
            options.reasoning_effort =
                fields
                    .get("budget_tokens")
                    .and_then(Value::as_u64)
                    .map(|budget| {
                        match budget {
                            0..4096 => "low",
                            4096..16384 => "medium",
                            _ => "high",
                        }
                        .to_owned()
                    });
        }
        Some("disabled") => options.thinking = Some(false),
        Some("adaptive" | "between_tools") => options.thinking = Some(true),
        Some(_) => {}
        None => return Err(invalid("thinking.type is required.", "thinking.type")),
    }
    Ok(())
}

/// Anthropic's effort as the OpenAI dialects name it: its levels above
/// `high` (`xhigh`, `max`) are `high`, the highest every upstream knows.
fn openai_effort(effort: String) -> String {
    match effort.as_str() {
        "xhigh" | "max" => "high".to_owned(),
        _ => effort,
    }
}

/// `{type: json_schema, schema}` as the `{name, schema, strict}` object both
/// OpenAI dialects carry; another type asks for nothing the core maps.
fn decode_format(format: Value) -> Result<Option<Format>, ApiError> {
    let Value::Object(mut fields) = format else {
        return Err(invalid(
            "output_config.format must be an object.",
            "output_config.format",
        ));
    };
    if take_str_at(&mut fields, "type", At::Root("output_config.format.type"))?.as_deref()
        != Some("json_schema")
    {
        return Ok(None);
    }
    match fields.remove("schema") {
        Some(schema @ Value::Object(_)) => Ok(Some(Format::JsonSchema(
            json!({"name": "output", "schema": schema, "strict": true}),
        ))),
        _ => Err(invalid(
            "output_config.format.schema must be an object.",
            "output_config.format.schema",
        )),
    }
}

// ----------------------------------------------------------------- encode

/// A content block of a non-streaming answer.
enum Block {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Option<Box<RawValue>>,
    },
}

impl Block {
    fn wire(&self) -> BlockOut<'_> {
        match self {
            Block::Thinking {
                thinking,
                signature,
            } => BlockOut::Thinking {
                thinking,
                signature,
            },
            Block::Text { text } => BlockOut::Text { text },
            Block::ToolUse { id, name, input } => BlockOut::ToolUse {
                id,
                name,
                input: input.as_deref(),
            },
        }
    }

    fn size_hint(&self) -> usize {
        64 + match self {
            Block::Thinking {
                thinking,
                signature,
            } => thinking.len() + signature.len(),
            Block::Text { text } => text.len(),
            Block::ToolUse { id, name, input } => {
                id.len() + name.len() + input.as_ref().map_or(2, |i| i.get().len())
            }
        }
    }
}

/// The kinds of block that take streamed text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    /// A thinking block of the proxy's own notes ([`NOTE_SIGNATURE`]).
    Note,
    Text,
}

/// The Messages [`Encoder`]: one message, whatever number of rounds the loop
/// took; each round's reasoning a thinking block before its text.
pub struct MessagesEncoder {
    id: String,
    model: String,
    stream: bool,
    /// The block taking text, and its index.
    open: Option<(Open, usize)>,
    /// Blocks started so far: the next block's index.
    started: usize,
    /// The content of a non-streaming answer (a stream keeps none).
    content: Vec<Block>,
    /// The closing events went out: nothing more may follow them.
    ended: bool,
    /// A stream's text and thinking deltas, cut around their block's index
    /// and text (`json::cut`) as the first is written.
    text_delta: Lazy,
    thinking_delta: Lazy,
    /// Thinking blocks are written ([`Context::thinking`]): a reasoning
    /// model's thoughts and the proxy's notes are not, for a client that
    /// did not ask for them.
    thinking: bool,
}

impl MessagesEncoder {
    pub fn new(model: &str, stream: bool, context: Context) -> Self {
        MessagesEncoder {
            id: new_id("msg_"),
            model: model.to_owned(),
            stream,
            open: None,
            started: 0,
            content: Vec::new(),
            ended: false,
            text_delta: Lazy::default(),
            thinking_delta: Lazy::default(),
            thinking: context.thinking,
        }
    }

    /// The index of the open block of `kind`, or of a new one (closing the
    /// one open).
    fn block(&mut self, kind: Open, out: &mut Vec<u8>) -> usize {
        match self.open {
            Some((open, index)) if open == kind => index,
            _ => {
                self.close(None, out);
                let index = self.started;
                self.started += 1;
                if self.stream {
                    let content_block = match kind {
                        Open::Thinking | Open::Note => BlockOut::Thinking {
                            thinking: "",
                            signature: "",
                        },
                        Open::Text => BlockOut::Text { text: "" },
                    };
                    block_start(out, index, &content_block);
                } else {
                    self.content.push(match kind {
                        Open::Thinking | Open::Note => Block::Thinking {
                            thinking: String::new(),
                            signature: String::new(),
                        },
                        Open::Text => Block::Text {
                            text: String::new(),
                        },
                    });
                }
                self.open = Some((kind, index));
                index
            }
        }
    }

    /// Adds `piece` to the open block of `kind` (opening it if need be).
    fn append(&mut self, kind: Open, piece: &str, out: &mut Vec<u8>) {
        let index = self.block(kind, out);
        if self.stream {
            let cut = match kind {
                Open::Thinking | Open::Note => &self.thinking_delta,
                Open::Text => &self.text_delta,
            };
            let writer = |index, piece: &str, out: &mut Vec<u8>| {
                delta_event(kind, index as usize, piece, out)
            };
            cut.write(writer, index as u64, piece, out);
            return;
        }
        if let Some(Block::Thinking { thinking: all, .. } | Block::Text { text: all }) =
            self.content.get_mut(index)
        {
            all.push_str(piece);
        }
    }

    /// Ends the open block, if any; a thinking block first takes `signature`,
    /// the upstream's or, if it gave none, the proxy's own.
    fn close(&mut self, signature: Option<&str>, out: &mut Vec<u8>) {
        let Some((kind, index)) = self.open.take() else {
            return;
        };
        let signature = match (kind, signature.filter(|s| !s.is_empty())) {
            (Open::Text, _) => {
                if self.stream {
                    emit(out, "content_block_stop", BlockStop { index });
                }
                return;
            }
            (Open::Note, _) => Cow::Owned(format!("{NOTE_SIGNATURE}{}:{index}", self.id)),
            (Open::Thinking, Some(signature)) => Cow::Borrowed(signature),
            (Open::Thinking, None) => Cow::Owned(format!("{OWN_SIGNATURE}{}:{index}", self.id)),
        };
        if self.stream {
            let delta = DeltaOut::Signature {
                signature: &signature,
            };
            emit(out, "content_block_delta", BlockDelta { index, delta });
            emit(out, "content_block_stop", BlockStop { index });
            return;
        }
        if let Some(Block::Thinking {
            signature: slot, ..
        }) = self.content.get_mut(index)
        {
            *slot = signature.into_owned();
        }
    }

    fn message(&self, stop_reason: Option<&'static str>, usage: UsageOut) -> MessageOut<'_> {
        MessageOut {
            id: &self.id,
            model: &self.model,
            content: &self.content,
            stop_reason,
            usage,
        }
    }
}

fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
        Finish::ContentFilter => "refusal",
    }
}

/// A call's `input`: its arguments when they are a JSON object; `{}` (None)
/// when there are none or they are not one, as a model's broken JSON cannot
/// go out as an object.
fn call_input(call: &ToolCall) -> Option<Box<RawValue>> {
    let arguments = wire_arguments(call);
    let arguments = arguments.trim();
    if !arguments.starts_with('{') {
        return None;
    }
    RawValue::from_string(arguments.to_owned()).ok()
}

impl Encoder for MessagesEncoder {
    fn streams(&self) -> bool {
        self.stream
    }

    fn open(&mut self, out: &mut Vec<u8>) {
        if !self.stream {
            return;
        }
        // Input tokens are known only at the end: `message_delta` has them.
        let message = self.message(None, UsageOut::from(Usage::default()));
        emit_with(out, "message_start", |out| {
            let mut o = json::Object::new(out);
            message.write(o.name("message"));
            o.end();
        });
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended || !self.thinking {
            return;
        }
        self.append(Open::Thinking, text, out);
    }

    fn note(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended || !self.thinking {
            return;
        }
        self.append(Open::Note, text, out);
    }

    /// Ends the open thinking block with the item's encrypted content as its
    /// signature; reasoning not streamed before gets a block of its own.
    fn reasoning_item(&mut self, item: &Reasoning, out: &mut Vec<u8>) {
        if self.ended || !self.thinking {
            return;
        }
        if !matches!(self.open, Some((Open::Thinking, _))) {
            let text = match item.text.is_empty() {
                true => Cow::Owned(item.summary.join("\n\n")),
                false => Cow::Borrowed(item.text.as_str()),
            };
            if text.is_empty() && item.encrypted.is_none() {
                return;
            }
            self.block(Open::Thinking, out);
            if !text.is_empty() {
                self.append(Open::Thinking, &text, out);
            }
        }
        self.close(item.encrypted.as_deref(), out);
    }

    fn content(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended {
            return;
        }
        self.append(Open::Text, text, out);
    }

    fn continues(&self, channel: Channel) -> bool {
        let open = match channel {
            Channel::Text => Open::Text,
            Channel::Reasoning => Open::Thinking,
            Channel::Note => Open::Note,
        };
        matches!(self.open, Some((kind, _)) if kind == open)
    }

    fn takes_reasoning(&self) -> bool {
        self.thinking
    }

    /// One `tool_use` block per call, its input in one `input_json_delta`.
    /// The upstream's call id is kept: the client's `tool_result` names it.
    fn client_calls(&mut self, calls: &[ToolCall], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.close(None, out);
        for call in calls {
            let input = call_input(call);
            let index = self.started;
            self.started += 1;
            if !self.stream {
                self.content.push(Block::ToolUse {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    input,
                });
                continue;
            }
            let content_block = BlockOut::ToolUse {
                id: &call.id,
                name: &call.name,
                input: None,
            };
            block_start(out, index, &content_block);
            let partial_json = input.as_deref().map_or("{}", RawValue::get);
            let delta = DeltaOut::InputJson { partial_json };
            emit(out, "content_block_delta", BlockDelta { index, delta });
            emit(out, "content_block_stop", BlockStop { index });
        }
    }

    fn finish(&mut self, finish: Finish, usage: Usage, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.close(None, out);
        self.ended = true;
        let stop_reason = stop_reason(finish);
        let usage = UsageOut::from(usage);
        if self.stream {
            emit_with(out, "message_delta", |out| {
                let mut o = json::Object::new(out);
                let mut delta = o.object("delta");
                delta.plain("stop_reason", stop_reason);
                delta.raw("stop_sequence", "null");
                delta.end();
                usage.write(o.name("usage"));
                o.end();
            });
            emit(out, "message_stop", NoFields {});
            return;
        }
        // Sized for the blocks and the envelope: one allocation, no regrowth.
        out.reserve(256 + TextSize::of(self.content.iter().map(Block::size_hint)).room());
        self.message(Some(stop_reason), usage).write(out);
    }

    fn error_body(&self, status: u16, openai_error: Bytes) -> Bytes {
        let (kind, message) = from_openai(status, &openai_error);
        error_json(kind, &message)
    }

    fn error_status(&self, status: u16) -> u16 {
        error_status(status)
    }

    /// An `error` event (Anthropic's stream ends with it); without a stream,
    /// the error body.
    fn stream_error(&mut self, status: u16, openai_error: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.ended = true;
        let (kind, message) = from_openai(status, openai_error);
        if !self.stream {
            out.extend_from_slice(&error_json(kind, &message));
            return;
        }
        emit_error(out, kind, &message);
    }

    fn heartbeat(&self) -> &'static [u8] {
        PING
    }

    fn error_ends_stream(&self) -> bool {
        true
    }
}

// ------------------------------------------------------------------ errors

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The status Anthropic answers a case with: an unavailable (overloaded)
/// server is its 529, which clients such as Claude Code report as overload.
pub fn error_status(status: u16) -> u16 {
    match status {
        503 => 529,
        status => status,
    }
}

/// An Anthropic error body, `{"type":"error","error":{type, message}}`, for
/// errors answered before any decoding (a missing API key, say). Its status
/// is [`error_status`] of `status`.
pub fn anthropic_error(status: u16, message: &str) -> Bytes {
    error_json(error_type(status), message)
}

/// [`anthropic_error`] as the `error` event that ends a stream.
pub fn anthropic_error_event(status: u16, message: &str) -> Bytes {
    let mut out = Vec::with_capacity(64 + message.len());
    emit_error(&mut out, error_type(status), message);
    Bytes::from(out)
}

/// Writes an `error` event.
fn emit_error(out: &mut Vec<u8>, kind: &'static str, message: &str) {
    let error = ErrorOut { kind, message };
    emit(out, "error", ErrorEvent { error });
}

fn error_json(kind: &'static str, message: &str) -> Bytes {
    let body = ErrorEvent {
        error: ErrorOut { kind, message },
    };
    let mut out = Vec::with_capacity(64 + message.len());
    write_event(&mut out, "error", |out| json::write(out, &body));
    Bytes::from(out)
}

/// The type and message of an OpenAI-shaped error body. A context overflow
/// reads as Anthropic's "prompt is too long", which Claude Code answers by
/// compacting the conversation.
fn from_openai(status: u16, openai_error: &[u8]) -> (&'static str, Cow<'_, str>) {
    let parsed: Option<ErrorEnvelope> = serde_json::from_slice(openai_error).ok();
    let message = match parsed {
        Some(ErrorEnvelope { error }) if context_overflow(&error) => {
            Cow::Owned(match (error.n_prompt_tokens, error.n_ctx) {
                (Some(prompt), Some(limit)) => {
                    format!("prompt is too long: {prompt} tokens > {limit} maximum")
                }
                _ => format!(
                    "prompt is too long: {}",
                    error.message.as_deref().unwrap_or("it exceeds the context")
                ),
            })
        }
        Some(ErrorEnvelope {
            error:
                ErrorIn {
                    message: Some(message),
                    ..
                },
        }) => message,
        _ => Cow::Owned(format!("upstream error {status}")),
    };
    (error_type(status), message)
}

/// llama.cpp's `exceed_context_size_error`, or OpenAI's `context_length_exceeded`.
fn context_overflow(error: &ErrorIn<'_>) -> bool {
    const KINDS: [&str; 2] = ["exceed_context_size_error", "context_length_exceeded"];
    let code = match &error.code {
        Some(Value::String(code)) => Some(code.as_str()),
        _ => None,
    };
    [error.kind.as_deref(), code]
        .into_iter()
        .flatten()
        .any(|kind| KINDS.contains(&kind))
}

// ------------------------------------------------------------- wire types

/// Writes one event, `event: <type>` and its data, whose `type` is the same.
fn emit<T: Serialize>(out: &mut Vec<u8>, kind: &'static str, body: T) {
    emit_with(out, kind, |out| json::write(out, &body));
}

/// The event a stream has for each token, written by hand:
/// `{"index":…,"delta":{"type":"text_delta","text":…}}`.
fn delta_event(kind: Open, index: usize, piece: &str, out: &mut Vec<u8>) {
    let (delta_type, member) = match kind {
        Open::Thinking | Open::Note => ("thinking_delta", "thinking"),
        Open::Text => ("text_delta", "text"),
    };
    emit_with(out, "content_block_delta", |out| {
        let mut event = json::Object::new(out);
        event.u64("index", index as u64);
        let mut delta = event.object("delta");
        delta.plain("type", delta_type);
        delta.value(member, piece);
        delta.end();
        event.end();
    });
}

/// [`emit`] of the object `body` writes.
fn emit_with(out: &mut Vec<u8>, kind: &'static str, body: impl FnOnce(&mut Vec<u8>)) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    write_event(out, kind, body);
    out.extend_from_slice(b"\n\n");
}

/// An event's JSON: its type, then its own fields.
fn write_event(out: &mut Vec<u8>, kind: &'static str, body: impl FnOnce(&mut Vec<u8>)) {
    json::tagged(out, |head| head.plain("type", kind), body);
}

#[derive(Serialize)]
struct NoFields {}

/// A `content_block_start` event.
fn block_start(out: &mut Vec<u8>, index: usize, content_block: &BlockOut<'_>) {
    emit_with(out, "content_block_start", |out| {
        let mut o = json::Object::new(out);
        o.u64("index", index as u64);
        content_block.write(o.name("content_block"));
        o.end();
    });
}

#[derive(Serialize)]
struct BlockDelta<'a> {
    index: usize,
    delta: DeltaOut<'a>,
}

#[derive(Serialize)]
struct BlockStop {
    index: usize,
}

#[derive(Serialize)]
struct ErrorEvent<'a> {
    error: ErrorOut<'a>,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// A content block, written member by member (`json::Object`, as the
/// Message object and its usage are): through serde, each member name was
/// escaped as any string.
enum BlockOut<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        /// Checked JSON object text, or none for `{}`.
        input: Option<&'a RawValue>,
    },
}

impl BlockOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        match self {
            BlockOut::Thinking {
                thinking,
                signature,
            } => {
                o.plain("type", "thinking");
                o.value("thinking", thinking);
                o.value("signature", signature);
            }
            BlockOut::Text { text } => {
                o.plain("type", "text");
                o.value("text", text);
            }
            BlockOut::ToolUse { id, name, input } => {
                o.plain("type", "tool_use");
                o.value("id", id);
                o.value("name", name);
                o.raw("input", input.map_or("{}", RawValue::get));
            }
        }
        o.end();
    }
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum DeltaOut<'a> {
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// A Message object.
struct MessageOut<'a> {
    id: &'a str,
    model: &'a str,
    content: &'a [Block],
    stop_reason: Option<&'static str>,
    usage: UsageOut,
}

impl MessageOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.value("id", self.id);
        o.plain("type", "message");
        o.plain("role", "assistant");
        o.value("model", self.model);
        o.list("content", self.content, |out, block| {
            block.wire().write(out)
        });
        match self.stop_reason {
            Some(reason) => o.plain("stop_reason", reason),
            None => o.raw("stop_reason", "null"),
        }
        o.raw("stop_sequence", "null");
        self.usage.write(o.name("usage"));
        o.end();
    }
}

/// Usage as Anthropic reports it: `input_tokens` are the prompt's tokens
/// the server's cache did not hold, `cache_read_input_tokens` those it did
/// (their sum is the prompt). The proxy writes no cache itself.
struct UsageOut {
    input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
}

impl UsageOut {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.u64("input_tokens", self.input_tokens);
        o.raw("cache_creation_input_tokens", "0");
        o.u64("cache_read_input_tokens", self.cache_read_input_tokens);
        o.u64("output_tokens", self.output_tokens);
        o.end();
    }
}

impl From<Usage> for UsageOut {
    fn from(usage: Usage) -> Self {
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        UsageOut {
            input_tokens: usage.prompt_tokens - cached,
            cache_read_input_tokens: cached,
            output_tokens: usage.completion_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Description;

    #[test]
    fn a_streamed_delta_is_what_the_delta_writer_writes() {
        let mut enc = MessagesEncoder::new("coder", true, thinking());
        for (kind, index) in [(Open::Text, 0), (Open::Thinking, 1)] {
            // The first opens the block (its start goes before the delta).
            enc.append(kind, "first", &mut Vec::new());
            for piece in ["", "x", "a\"b\\\n\u{1}é ✓"] {
                let (mut ours, mut written) = (Vec::new(), Vec::new());
                enc.append(kind, piece, &mut ours);
                delta_event(kind, index, piece, &mut written);
                assert_eq!(
                    String::from_utf8_lossy(&ours),
                    String::from_utf8_lossy(&written)
                );
            }
        }
        assert!(enc.text_delta.is_cut());
        assert!(enc.thinking_delta.is_cut());
    }

    /// The body of a captured request (`{method, path, headers, body}`).
    fn fixture(file: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/clients/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let capture: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        serde_json::to_vec(&capture["body"]).unwrap()
    }

    #[test]
    fn a_tool_use_input_becomes_arguments_as_serde_json_writes_it() {
        let inputs = [
            json!({"file_path": "/a.py", "old_string": "def f(x):\n\t\"q\" \\ é 😀\u{1}", "replace_all": false}),
            json!({"n": 1.5, "m": -0.0, "big": 18446744073709551615u64, "e": 1e300, "list": [null, true, {}]}),
            json!({"nested": {"b": 1, "a": [{"z": "z", "y": "y"}]}, "empty": ""}),
        ];
        for input in inputs {
            let body = json!({"model": "m", "max_tokens": 1, "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "Edit", "input": input}
                ]}
            ]});
            let (conv, _) = decode_json(body).unwrap();
            let Some(Item::ToolCall(call)) = conv.items.last() else {
                panic!("a call: {:?}", conv.items);
            };
            assert_eq!(call.arguments, serde_json::to_string(&input).unwrap());
        }
    }

    #[test]
    fn a_history_decodes_the_same_from_the_messages_decoded_before() {
        // A thread of its own: its kept messages are this test's.
        crate::on_a_new_thread(a_history_decodes_the_same_on_this_thread);
    }

    fn a_history_decodes_the_same_on_this_thread() {
        let edit = |i: usize| {
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": format!("plan {i}"), "signature": "c2ln"},
                {"type": "text", "text": "Editing."},
                {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Edit", "input": {
                    "file_path": format!("/src/m{i}.py"),
                    "old_string": "def f(x):\n\treturn \"x\"\n".repeat(8),
                    "new_string": "def f(x):\n\treturn 'é'\n".repeat(8)}}]})
        };
        let result = |i: usize, marked: bool| {
            let mut block = json!({"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
                "content": [{"type": "text", "text": "The file has been updated.\n".repeat(12)}]});
            if marked {
                block["cache_control"] = json!({"type": "ephemeral"});
            }
            json!({"role": "user", "content": [block, {"type": "text", "text": "go on"}]})
        };
        let system = json!({"role": "system", "content": "Environment: ".repeat(30)});
        let turn = |n: usize| {
            let mut messages = vec![
                json!({"role": "user", "content": "Fix the bug."}),
                system.clone(),
            ];
            for i in 0..n {
                messages.push(edit(i));
                // As Claude Code does: the last result carries the mark.
                messages.push(result(i, i + 1 == n));
            }
            // Members after `messages`, as Claude Code sends them.
            json!({"model": "m", "messages": messages, "system": "Be brief.", "max_tokens": 8})
        };
        // Each turn's reference decoded on a thread that has kept nothing,
        // and the model's request made of it.
        let sent = |conv: &Conversation| {
            let json = crate::round::chat::encode(conv, false);
            serde_json::from_slice::<Value>(&json).unwrap()
        };
        let fresh = |body: Value| {
            crate::on_a_new_thread(move || {
                let (conv, _) = decode_json(body).unwrap();
                (format!("{conv:?}"), sent(&conv))
            })
        };
        {
            for n in 1..5 {
                let (conv, _) = decode_json(turn(n)).unwrap();
                // Its texts written as they were escaped before.
                assert_eq!(
                    (format!("{conv:?}"), sent(&conv)),
                    fresh(turn(n)),
                    "turn {n}"
                );
                let calls = conv.items.iter().filter(|i| matches!(i, Item::ToolCall(_)));
                assert_eq!(calls.count(), n);
            }
            // The earlier turns' messages were kept (the system message
            // too), and the next turn found them.
            let body = serde_json::to_string(&turn(4)).unwrap();
            let kept = |message: &Value| {
                let rest = &body[body.find(&message.to_string()).unwrap()..];
                let head = crate::front::known_entries::head(rest.as_bytes()).unwrap();
                crate::front::known_entries::find(Dialect::Messages, head, rest).is_some()
            };
            assert!(kept(&system) && kept(&edit(0)) && kept(&result(0, false)));
            assert!(kept(&result(2, false)));
            // A message after kept ones that is wrong is named by its place.
            let mut broken = turn(4);
            broken["messages"][9]["content"][0]["tool_use_id"] = json!(5);
            let error = decode_json(broken).unwrap_err();
            assert!(error.message.contains("messages[9]"), "{}", error.message);
        }
        // Given twice, the last counts, a list or not.
        let list = r#"[{"role":"user","content":"hi"}]"#;
        let twice = |a: &str, b: &str| {
            let body = format!(r#"{{"model":"m","max_tokens":1,"messages":{a},"messages":{b}}}"#);
            decode(body.as_bytes()).map(|(conv, _)| conv.items.len())
        };
        assert_eq!(twice("1", list).ok(), Some(1));
        // A list the scanner does not read entry by entry is parsed whole,
        // as without kept messages: serde_json's error, its depth bound.
        let with = |messages: &str| {
            let body = format!(r#"{{"model":"m","max_tokens":1,"messages":{messages}}}"#);
            decode(body.as_bytes()).map(|(conv, _)| conv.items.len())
        };
        let trailing = with(r#"[{"role":"user","content":"hi"},]"#).unwrap_err();
        assert!(
            trailing.message.contains("trailing comma"),
            "{}",
            trailing.message
        );
        for depth in [120, 126, 127, 128] {
            let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let messages = format!(r#"[{{"role":"user","content":"hi","x":{deep}}}]"#);
            let whole = serde_json::from_str::<Value>(&messages).is_ok();
            assert_eq!(with(&messages).is_ok(), whole, "{depth}");
        }
        assert_eq!(
            with(r#"[{"role":"user","content":"hi","n":1e400}]"#).ok(),
            None
        );
        assert_eq!(
            with(r#"[{"role":"user","content":"hi","n":1.5e3}]"#).ok(),
            Some(1)
        );
        let error = twice(list, "1").unwrap_err();
        assert_eq!(error.message, "messages must be an array of messages.");
    }

    fn decode_json(body: Value) -> Result<(Conversation, Context), ApiError> {
        decode(&serde_json::to_vec(&body).unwrap())
    }

    #[test]
    fn an_empty_text_before_thinking_makes_no_assistant_turn_of_its_own() {
        let (conv, _) = decode_json(json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": ""},
                {"type": "thinking", "thinking": "T", "signature": ""},
                {"type": "text", "text": "Hello"}]},
            {"role": "user", "content": "again"}
        ]}))
        .unwrap();
        assert_eq!(
            conv.items,
            [
                text(Role::User, "hi"),
                Item::Reasoning(reasoning("T", None)),
                text(Role::Assistant, "Hello"),
                text(Role::User, "again"),
            ]
        );
    }

    fn text(role: Role, text: &str) -> Item {
        Item::Message(Message::text(role, text))
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            kind: CallKind::Function,
        }
    }

    fn result(call_id: &str, output: &str, is_error: bool) -> Item {
        Item::ToolResult(ToolResult {
            call_id: call_id.into(),
            output: output.into(),
            is_error,
            attachments: Vec::new(),
        })
    }

    fn reasoning(text: &str, encrypted: Option<&str>) -> Reasoning {
        Reasoning {
            text: text.into(),
            encrypted: encrypted.map(str::to_owned),
            ..Reasoning::default()
        }
    }

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
            ..Usage::default()
        }
    }

    /// A client's that switched thinking on.
    fn thinking() -> Context {
        Context {
            thinking: true,
            ..Context::default()
        }
    }

    fn streaming() -> MessagesEncoder {
        MessagesEncoder::new("coder", true, thinking())
    }

    /// Parses a stream, checking the framing: every event named as its
    /// `type`; blocks started with indexes 0, 1, 2…, each delta and stop on
    /// the one block open, every block stopped before the message ends.
    fn events(bytes: &[u8]) -> Vec<Value> {
        let mut parser = crate::sse::Parser::new(1 << 24);
        parser.feed(bytes);
        let mut all: Vec<Value> = Vec::new();
        let mut open: Option<u64> = None;
        let mut started = 0;
        while let Some(event) = parser.next_event().unwrap() {
            let data: Value = serde_json::from_slice(&event.data).unwrap();
            assert_eq!(event.name.as_deref(), data["type"].as_str(), "{data}");
            match data["type"].as_str().unwrap() {
                "content_block_start" => {
                    assert_eq!(open, None, "{data}");
                    assert_eq!(data["index"], started, "{data}");
                    open = Some(started);
                    started += 1;
                }
                "content_block_delta" => assert_eq!(data["index"].as_u64(), open, "{data}"),
                "content_block_stop" => {
                    assert_eq!(data["index"].as_u64(), open, "{data}");
                    open = None;
                }
                "message_delta" | "message_stop" => assert_eq!(open, None, "{data}"),
                _ => {}
            }
            all.push(data);
        }
        assert!(
            parser.finish().is_none(),
            "the stream ends with a whole event"
        );
        all
    }

    fn kinds(events: &[Value]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                let kind = e["type"].as_str().unwrap();
                match kind {
                    "content_block_start" => format!("start:{}", e["content_block"]["type"]),
                    "content_block_delta" => format!("delta:{}", e["delta"]["type"]),
                    _ => kind.to_owned(),
                }
                .replace('"', "")
            })
            .collect()
    }

    // ------------------------------------------------------------ decode

    #[test]
    fn string_content_and_string_system() {
        let (conv, ctx) = decode_json(json!({
            "model": "coder", "max_tokens": 1024, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        assert_eq!(conv.origin, Dialect::Messages);
        assert_eq!(conv.model.as_deref(), Some("coder"));
        assert_eq!(conv.system_text().as_deref(), Some("Be brief."));
        assert_eq!(conv.items, vec![text(Role::User, "hi")]);
        assert_eq!(conv.options.max_tokens, Some(1024));
        assert!(!conv.options.stream);
        assert!(conv.options.include_usage);
        assert!(conv.tools.is_empty());
        assert!(conv.extra.is_empty(), "{:?}", conv.extra);
        assert!(ctx.dropped_tools.is_empty());
    }

    #[test]
    fn every_block_kind() {
        let (conv, _) = decode_json(json!({
            "model": "coder",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                    {"type": "image", "source": {"type": "file", "file_id": "file_1"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
                    {"type": "document", "title": "Notes", "source": {"type": "content", "content": [
                        {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}},
                    {"type": "document", "title": "a.pdf", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
                    {"type": "document", "source": {"type": "url", "url": "https://example.com/b.pdf"}},
                    {"type": "document", "source": {"type": "file", "file_id": "file_2"}},
                    {"type": "search_result", "source": "https://s", "title": "T", "content": [
                        {"type": "text", "text": "Found."}], "citations": {"enabled": true}},
                    {"type": "mystery"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "SIG"},
                    {"type": "redacted_thinking", "data": "RED"},
                    {"type": "text", "text": "Sure."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "call_2", "name": "Read", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "and also"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb"},
                    {"type": "tool_result", "tool_use_id": "call_2", "is_error": true, "content": [
                        {"type": "text", "text": "one"},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/b.png"}},
                        {"type": "text", "text": "two"}
                    ]},
                    {"type": "tool_result", "tool_use_id": "toolu_3"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "", "signature": ""},
                    {"type": "text", "text": "Done."},
                    {"type": "thinking", "thinking": "more"},
                    {"type": "text", "text": "Really."}
                ]}
            ]
        }))
        .unwrap();
        let user = Item::Message(Message {
            role: Role::User,
            content: vec![
                Part::Text("look".into()),
                Part::Image {
                    url: "data:image/png;base64,AAAA".into(),
                    detail: None,
                },
                Part::Image {
                    url: "https://example.com/a.png".into(),
                    detail: None,
                },
                Part::Other(
                    json!({"type": "image", "source": {"type": "file", "file_id": "file_1"}}),
                ),
                // Text documents are text; others files, for the upstream.
                Part::Text("doc".into()),
                Part::Text("Notes\n\none\ntwo".into()),
                Part::File(FilePart {
                    data: Some("data:application/pdf;base64,JVBE".into()),
                    name: Some("a.pdf".into()),
                    ..FilePart::default()
                }),
                Part::File(FilePart {
                    url: Some("https://example.com/b.pdf".into()),
                    ..FilePart::default()
                }),
                Part::File(FilePart {
                    id: Some("file_2".into()),
                    ..FilePart::default()
                }),
                // A search result as text: no model of ours reads its block.
                Part::Text("T\nhttps://s\n\nFound.".into()),
                Part::Other(json!({"type": "mystery"})),
            ],
            extra: Map::new(),
        });
        let expected = vec![
            user,
            Item::Reasoning(reasoning("hmm", Some("SIG"))),
            Item::Reasoning(reasoning("", Some("RED"))),
            text(Role::Assistant, "Sure."),
            Item::ToolCall(call("toolu_1", "Bash", r#"{"command":"ls"}"#)),
            Item::ToolCall(call("call_2", "Read", "{}")),
            // Results before the text that came with them.
            result("toolu_1", "a\nb", false),
            // Its picture is attached, for the upstream to see.
            Item::ToolResult(ToolResult {
                call_id: "call_2".into(),
                output: "error: one\ntwo".into(),
                is_error: true,
                attachments: vec![Part::Image {
                    url: "https://example.com/b.png".into(),
                    detail: None,
                }],
            }),
            result("toolu_3", "", false),
            text(Role::User, "and also"),
            // The empty thinking block carried nothing.
            text(Role::Assistant, "Done."),
            Item::Reasoning(reasoning("more", None)),
            text(Role::Assistant, "Really."),
        ];
        assert_eq!(conv.items, expected);
    }

    #[test]
    fn system_blocks_and_system_messages_make_the_system_prompt() {
        let (conv, _) = decode_json(json!({
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330.572; cc_entrypoint=sdk-cli;"},
                {"type": "text", "text": "First.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": ""},
                {"type": "text", "text": "Second."}
            ],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "Env."},
                {"role": "system", "content": [{"type": "text", "text": "More."}]},
                {"role": "assistant", "content": "ok"}
            ]
        }))
        .unwrap();
        assert_eq!(
            conv.system_text().as_deref(),
            Some("First.\n\nSecond.\n\nEnv.\n\nMore.")
        );
        assert_eq!(
            conv.items,
            vec![text(Role::User, "hi"), text(Role::Assistant, "ok")]
        );
    }

    #[test]
    fn a_tool_schema_goes_on_as_the_client_wrote_it() {
        // Key order, an escape and a number as written: the text, not a
        // re-serialized value (a prompt cache needs the same bytes per turn).
        let schema = r#"{"type":"object","required":["b","a"],"properties":{"b":{"type":"string","description":"caf\u00e9"},"a":{"type":"number","maximum":1.50}}}"#;
        let body = format!(
            r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"name":"T","description":"caf\u00e9\n","input_schema":{schema}}},{{"name":"N","input_schema":null}}]}}"#
        );
        let (conv, _) = decode(body.as_bytes()).unwrap();
        let out = crate::round::chat::encode(&conv, false);
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(&format!(r#""parameters":{schema}"#)), "{out}");
        assert!(out.contains(r#""description":"caf\u00e9\n","#), "{out}");
        assert_eq!(conv.tools[1].parameters, Schema::empty());
    }

    #[test]
    fn tools_of_the_wrong_shape_are_named() {
        for (tools, message, param) in [
            (json!("Bash"), "tools must be an array.", "tools"),
            (json!({"name": "Bash"}), "tools must be an array.", "tools"),
            (
                json!([{"name": "Bash"}, 7]),
                "tools[1] must be an object.",
                "tools[1]",
            ),
            (json!(true), "tools must be an array.", "tools"),
            (
                json!([[{"name": "Bash"}], null]),
                "tools[0] must be an object.",
                "tools[0]",
            ),
            (
                json!([{"name": "Bash"}, null]),
                "tools[1] must be an object.",
                "tools[1]",
            ),
        ] {
            let error = decode_json(json!({
                "messages": [{"role": "user", "content": "hi"}],
                "tools": tools,
            }))
            .unwrap_err();
            assert_eq!(error.message, message);
            assert_eq!(error.param.as_deref(), Some(param));
        }
        let (conv, _) = decode_json(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "tools": null,
        }))
        .unwrap();
        assert!(conv.tools.is_empty());
        let error = decode(b"[1]").unwrap_err();
        assert!(
            error
                .message
                .starts_with("The request body is not a valid JSON object"),
            "{}",
            error.message
        );
    }

    #[test]
    fn custom_and_client_tools_are_functions_and_server_tools_dropped() {
        let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}});
        let (conv, ctx) = decode_json(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {"name": "Bash", "description": "Run.", "input_schema": schema, "cache_control": {"type": "ephemeral"}},
                {"type": "custom", "name": "Edit", "input_schema": schema, "strict": true},
                {"name": "Later", "input_schema": schema, "defer_loading": true},
                {"name": "Bare"},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "bash_20250124", "name": "bash"},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
                {"type": "code_execution_20250825", "name": "code_execution"},
                {"type": "web_search_20250305", "name": "web_search"}
            ]
        }))
        .unwrap();
        let names: Vec<&str> = conv.tools.iter().map(|t| t.name.as_str()).collect();
        // The client runs Anthropic's bash and editor: the model gets their
        // arguments as Anthropic's models know them.
        assert_eq!(
            names,
            [
                "Bash",
                "Edit",
                "Later",
                "Bare",
                "bash",
                "str_replace_based_edit_tool"
            ]
        );
        let editor = conv.tools[5].parameters.to_value();
        assert_eq!(editor["required"], json!(["command", "path"]));
        assert!(editor["properties"]["old_str"].is_object(), "{editor}");
        assert!(conv.tools[4].parameters.to_value()["properties"]["command"].is_object());
        assert!(conv.tools[4].description.is_some());
        assert_eq!(
            conv.tools[0].description.as_ref().map(Description::text),
            Some("Run.".into())
        );
        assert_eq!(conv.tools[0].parameters.to_value(), schema);
        assert_eq!(conv.tools[0].kind, CallKind::Function);
        assert_eq!(
            conv.tools[0].extra["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert_eq!(
            conv.tools[1].extra,
            json!({"strict": true}).as_object().unwrap().clone()
        );
        assert_eq!(conv.tools[2].extra["defer_loading"], true);
        assert_eq!(conv.tools[3].parameters, Schema::empty());
        assert_eq!(
            ctx.dropped_tools,
            [
                "web_search_20250305",
                "computer_20250124",
                "code_execution_20250825"
            ]
        );

        let (conv, ctx) = decode_json(json!({
            "messages": [{"role": "user", "content": "hi"}], "tools": []
        }))
        .unwrap();
        assert!(conv.tools.is_empty() && ctx.dropped_tools.is_empty());
    }

    #[test]
    fn options_map_to_the_core() {
        let (conv, _) = decode_json(json!({
            "model": "coder",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 32000,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["END", "STOP"],
            "stream": true,
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 8000},
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}, "task_budget": 3},
            "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"s\"}"},
            "context_management": {"edits": []},
            "safeguards": {},
            "container": "c",
            "mcp_servers": [],
            "service_tier": "auto",
            "cache_control": {"type": "ephemeral"},
            "inference_geo": "us"
        }))
        .unwrap();
        let o = &conv.options;
        assert!(o.stream);
        assert_eq!(o.max_tokens, Some(32000));
        assert_eq!((o.temperature, o.top_p), (Some(0.5), Some(0.9)));
        assert_eq!(o.stop, ["END", "STOP"]);
        assert_eq!(o.tool_choice, Some(ToolChoice::Auto));
        assert_eq!(o.parallel_tool_calls, Some(false));
        assert_eq!(o.thinking, Some(true));
        assert_eq!(o.reasoning_effort.as_deref(), Some("medium"));
        assert_eq!(
            o.format,
            Some(Format::JsonSchema(
                json!({"name": "output", "schema": {"type": "object"}, "strict": true})
            ))
        );
        assert_eq!(
            o.user.as_deref(),
            Some("{\"device_id\":\"d\",\"session_id\":\"s\"}")
        );
        // For a chat upstream only: OpenAI's Responses API refuses it.
        assert_eq!(o.top_k, Some(40));
        assert!(conv.params.is_empty());
        // Anthropic's service settings are gone; unknown fields stay.
        assert_eq!(
            Value::Object(conv.extra),
            json!({"output_config": {"task_budget": 3}, "inference_geo": "us"})
        );
    }

    #[test]
    fn tool_choice_and_thinking_forms() {
        let options = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            decode_json(body).unwrap().0.options
        };
        let choice = |c: Value| options(json!({"tool_choice": c})).tool_choice;
        assert_eq!(choice(json!({"type": "any"})), Some(ToolChoice::Required));
        assert_eq!(choice(json!({"type": "none"})), Some(ToolChoice::None));
        assert_eq!(
            choice(json!({"type": "tool", "name": "Bash"})),
            Some(ToolChoice::Function("Bash".into()))
        );
        assert_eq!(choice(json!("auto")), Some(ToolChoice::Auto));
        let o =
            options(json!({"tool_choice": {"type": "any", "disable_parallel_tool_use": false}}));
        assert_eq!(o.parallel_tool_calls, None);

        let thinking = |t: Value| {
            let o = options(json!({"thinking": t}));
            (o.thinking, o.reasoning_effort)
        };
        let effort = |e: &str| Some(e.to_owned());
        assert_eq!(
            thinking(json!({"type": "enabled", "budget_tokens": 1024})),
            (Some(true), effort("low"))
        );
        assert_eq!(
            thinking(json!({"type": "enabled", "budget_tokens": 4096})),
            (Some(true), effort("medium"))
        );
        assert_eq!(
            thinking(json!({"type": "enabled", "budget_tokens": 16384})),
            (Some(true), effort("high"))
        );
        assert_eq!(thinking(json!({"type": "disabled"})), (Some(false), None));
        assert_eq!(
            thinking(json!({"type": "adaptive", "display": "omitted"})),
            (Some(true), None)
        );
        // The explicit effort wins over the budget's.
        let o = options(json!({
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "output_config": {"effort": "max"}
        }));
        assert_eq!(o.reasoning_effort.as_deref(), Some("high"));
        let o = options(json!({"output_config": {"effort": "low"}}));
        assert_eq!(o.reasoning_effort.as_deref(), Some("low"));
    }

    #[test]
    fn malformed_requests_are_400s_naming_the_field() {
        let param = |body: Value| {
            let e = decode_json(body).unwrap_err();
            assert_eq!(e.status, 400);
            e.param.map(|p| p.into_owned())
        };
        let hi = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(param(json!({"model": "m"})).as_deref(), Some("messages"));
        assert_eq!(param(json!({"messages": []})).as_deref(), Some("messages"));
        assert_eq!(
            param(json!({"messages": "hi"})).as_deref(),
            Some("messages")
        );
        assert_eq!(
            param(json!({"messages": [1]})).as_deref(),
            Some("messages[0]")
        );
        assert_eq!(
            param(json!({"messages": [{"content": "hi"}]})).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "tool", "content": "hi"}]})).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "user"}]})).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]})).as_deref(),
            Some("messages[0].content[0].type")
        );
        assert_eq!(
            param(
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})
            )
            .as_deref(),
            Some("messages[0].content[0].text")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "x"}]}]}))
                .as_deref(),
            Some("messages[0].content[0].id")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}))
                .as_deref(),
            Some("messages[0].content[0].tool_use_id")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"},
            ]}]}))
            .as_deref(),
            Some("messages[0].content[0].is_error")
        );
        assert_eq!(
            param(json!({"messages": hi, "max_tokens": "9"})).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            param(json!({"messages": hi, "system": 3})).as_deref(),
            Some("system")
        );
        assert_eq!(
            param(json!({"messages": hi, "tools": {}})).as_deref(),
            Some("tools")
        );
        assert_eq!(
            param(json!({"messages": hi, "tools": [{"description": "x"}]})).as_deref(),
            Some("tools[0].name")
        );
        assert_eq!(
            param(json!({"messages": hi, "tool_choice": {"type": "sometimes"}})).as_deref(),
            Some("tool_choice.type")
        );
        assert_eq!(
            param(json!({"messages": hi, "tool_choice": {"type": "tool"}})).as_deref(),
            Some("tool_choice.name")
        );
        assert_eq!(
            param(json!({"messages": hi, "stop_sequences": "END"})).as_deref(),
            Some("stop_sequences")
        );
        assert_eq!(
            param(json!({"messages": hi, "output_config": {"format": {"type": "json_schema"}}}))
                .as_deref(),
            Some("output_config.format.schema")
        );
        assert_eq!(decode(b"[1]").unwrap_err().status, 400);
        assert_eq!(decode(b"{\"messages\": ").unwrap_err().status, 400);
        // No `max_tokens`: fine here, whatever Anthropic says.
        assert!(decode_json(json!({"messages": hi})).is_ok());
    }

    #[test]
    fn tools_known_from_an_earlier_request_decode_as_read_afresh() {
        let round2 = fixture("claude-code-2.1.330-tool-round2.request.json");
        let body = round2.clone();
        // A thread of its own: nothing known yet.
        let fresh = crate::on_a_new_thread(move || decode(&body).unwrap());
        decode(&fixture("claude-code-2.1.330-plain.request.json")).unwrap();
        let text = std::str::from_utf8(&round2).unwrap();
        let tools = text.find("\"tools\":").unwrap() + "\"tools\":".len();
        assert!(
            crate::front::known_tools::find(Dialect::Messages, text[tools..].trim_start())
                .is_some()
        );
        let (known, ctx) = decode(&round2).unwrap();
        assert_eq!(format!("{known:?}"), format!("{:?}", fresh.0));
        assert_eq!(ctx.dropped_tools, fresh.1.dropped_tools);
        assert!(known.tools.len() > 10);
    }

    #[test]
    fn claude_code_requests_decode() {
        let (one, ctx) = decode(&fixture("claude-code-2.1.330-plain.request.json")).unwrap();
        assert_eq!(one.model.as_deref(), Some("chat"));
        assert!(one.options.stream);
        assert_eq!(one.options.max_tokens, Some(32000));
        assert_eq!(one.options.thinking, Some(true));
        assert_eq!(one.options.reasoning_effort.as_deref(), Some("high"));
        assert!(one.options.user.as_deref().unwrap().contains("session_id"));
        let system = one.system_text().unwrap();
        // The billing header is gone; the system message of `messages` joined.
        assert!(system.starts_with("You are a Claude agent"), "{system}");
        assert!(!system.contains("x-anthropic-billing-header"));
        assert!(system.contains("# Environment"));
        assert_eq!(one.items.len(), 1);
        let Item::Message(user) = &one.items[0] else {
            panic!("{:?}", one.items[0]);
        };
        assert_eq!(user.role, Role::User);
        assert_eq!(user.content.len(), 2);
        assert_eq!(user.content[1], Part::Text("Say hello".into()));
        assert_eq!(one.tools.len(), 12);
        assert!(one.tools.iter().any(|t| t.name == "Bash"));
        assert!(ctx.dropped_tools.is_empty());
        assert!(one.extra.is_empty(), "{:?}", one.extra);

        let (two, _) = decode(&fixture("claude-code-2.1.330-tool-round2.request.json")).unwrap();
        let system = two.system_text().unwrap();
        assert!(system.contains("# Environment"));
        assert_eq!(two.items.len(), 3, "{:?}", two.items);
        assert!(
            matches!(&two.items[0], Item::Message(m) if m.role == Role::User
            && m.text_content().ends_with("CC-RUN: run the marker command and report what it printed"))
        );
        assert_eq!(
            two.items[1..],
            [
                Item::ToolCall(call(
                    "call_mock1",
                    "Bash",
                    r#"{"command":"echo CC-RAN","description":"Print a marker"}"#
                )),
                result("call_mock1", "CC-RAN", false),
            ]
        );
        assert_eq!(two.tools, one.tools);
    }

    // ------------------------------------------------------------ encode

    #[test]
    fn reasoning_then_text_stream() {
        let mut enc = streaming();
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.reasoning("Let me ", &mut out);
        enc.reasoning("think.", &mut out);
        enc.content("Hello", &mut out);
        enc.content(", world.", &mut out);
        enc.finish(Finish::Stop, usage(), &mut out);
        let events = events(&out);
        assert_eq!(
            kinds(&events),
            [
                "message_start",
                "start:thinking",
                "delta:thinking_delta",
                "delta:thinking_delta",
                "delta:signature_delta",
                "content_block_stop",
                "start:text",
                "delta:text_delta",
                "delta:text_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let message = &events[0]["message"];
        assert!(message["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(
            events[0],
            json!({"type": "message_start", "message": {
                "id": message["id"], "type": "message", "role": "assistant", "model": "coder",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0, "output_tokens": 0}
            }})
        );
        assert_eq!(
            events[1],
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
        );
        assert_eq!(
            events[2],
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "thinking_delta", "thinking": "Let me "}})
        );
        assert_eq!(
            events[4],
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta",
                   "signature": format!("agent-proxy:{}:0", message["id"].as_str().unwrap())}})
        );
        assert_eq!(
            events[6],
            json!({"type": "content_block_start", "index": 1,
                   "content_block": {"type": "text", "text": ""}})
        );
        assert_eq!(
            events[8],
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "text_delta", "text": ", world."}})
        );
        assert_eq!(
            events[10],
            json!({"type": "message_delta",
                   "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                   "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0, "output_tokens": 5}})
        );
        assert_eq!(events[11], json!({"type": "message_stop"}));
    }

    #[test]
    fn reasoning_then_client_calls_stop_for_tool_use() {
        let mut enc = streaming();
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.reasoning("I'll look.", &mut out);
        let calls = [
            call("call_1", "Bash", r#" {"command": "ls"} "#),
            call("toolu_2", "Read", "{\"path\": \"a"),
            call("call_3", "Now", ""),
        ];
        enc.client_calls(&calls, &mut out);
        enc.finish(Finish::ToolCalls, usage(), &mut out);
        let events = events(&out);
        assert_eq!(
            kinds(&events),
            [
                "message_start",
                "start:thinking",
                "delta:thinking_delta",
                "delta:signature_delta",
                "content_block_stop",
                "start:tool_use",
                "delta:input_json_delta",
                "content_block_stop",
                "start:tool_use",
                "delta:input_json_delta",
                "content_block_stop",
                "start:tool_use",
                "delta:input_json_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(
            events[5],
            json!({"type": "content_block_start", "index": 1,
                   "content_block": {"type": "tool_use", "id": "call_1", "name": "Bash", "input": {}}})
        );
        assert_eq!(
            events[6],
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"command\": \"ls\"}"}})
        );
        // Broken or missing arguments go out as an empty object.
        assert_eq!(events[9]["delta"]["partial_json"], "{}");
        assert_eq!(events[12]["delta"]["partial_json"], "{}");
        assert_eq!(events[14]["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn every_round_reasoning_goes_before_its_text() {
        let mut enc = streaming();
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.reasoning("Round one.", &mut out);
        enc.content("Looking.", &mut out);
        enc.reasoning("[calling search]", &mut out);
        enc.reasoning("Round two.", &mut out);
        enc.content("Found it.", &mut out);
        enc.finish(Finish::Stop, usage(), &mut out);
        let events = events(&out);
        let starts: Vec<(u64, String)> = events
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| {
                let block = &e["content_block"]["type"];
                (
                    e["index"].as_u64().unwrap(),
                    block.as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            starts,
            [
                (0, "thinking".to_owned()),
                (1, "text".to_owned()),
                (2, "thinking".to_owned()),
                (3, "text".to_owned())
            ]
        );
    }

    #[test]
    fn length_is_max_tokens_and_content_filter_a_refusal() {
        for (finish, reason) in [
            (Finish::Length, "max_tokens"),
            (Finish::ContentFilter, "refusal"),
            (Finish::Stop, "end_turn"),
        ] {
            let mut enc = streaming();
            let mut out = Vec::new();
            enc.open(&mut out);
            enc.content("Cut", &mut out);
            enc.finish(finish, usage(), &mut out);
            let events = events(&out);
            assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], reason);
            // Nothing follows the end.
            let len = out.len();
            enc.content("more", &mut out);
            enc.finish(Finish::Stop, usage(), &mut out);
            enc.stream_error(500, b"{}", &mut out);
            assert_eq!(out.len(), len);
        }
        // An empty answer is still a whole message.
        let mut enc = streaming();
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.finish(Finish::Stop, Usage::default(), &mut out);
        assert_eq!(
            kinds(&events(&out)),
            ["message_start", "message_delta", "message_stop"]
        );
    }

    #[test]
    fn reasoning_items_sign_thinking_blocks() {
        let mut enc = streaming();
        let mut out = Vec::new();
        enc.open(&mut out);
        // Streamed reasoning, then the upstream's whole item: its signature.
        enc.reasoning("Streamed.", &mut out);
        enc.reasoning_item(&reasoning("Streamed.", Some("ENC-1")), &mut out);
        // An item not streamed before: a block of its own.
        enc.reasoning_item(
            &Reasoning {
                summary: vec!["S1".into(), "S2".into()],
                encrypted: Some("ENC-2".into()),
                ..Reasoning::default()
            },
            &mut out,
        );
        // Without encrypted content: the proxy's own signature.
        enc.reasoning("Plain.", &mut out);
        enc.reasoning_item(&reasoning("Plain.", None), &mut out);
        // Nothing to show: nothing.
        enc.reasoning_item(&Reasoning::default(), &mut out);
        enc.content("Done.", &mut out);
        enc.finish(Finish::Stop, usage(), &mut out);
        let events = events(&out);
        assert_eq!(
            kinds(&events),
            [
                "message_start",
                "start:thinking",
                "delta:thinking_delta",
                "delta:signature_delta",
                "content_block_stop",
                "start:thinking",
                "delta:thinking_delta",
                "delta:signature_delta",
                "content_block_stop",
                "start:thinking",
                "delta:thinking_delta",
                "delta:signature_delta",
                "content_block_stop",
                "start:text",
                "delta:text_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let id = events[0]["message"]["id"].as_str().unwrap();
        assert_eq!(
            events[11]["delta"]["signature"],
            format!("agent-proxy:{id}:2")
        );
        assert_eq!(
            events[3],
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "signature_delta", "signature": "ENC-1"}})
        );
        assert_eq!(events[6]["delta"]["thinking"], "S1\n\nS2");
        assert_eq!(events[7]["delta"]["signature"], "ENC-2");
    }

    /// Without `thinking` switched on, Anthropic answers no thinking block,
    /// and a client reads its text at `content[0]`: a reasoning model's
    /// thoughts and the proxy's notes are not shown, streamed or not.
    #[test]
    fn thinking_blocks_only_for_a_client_that_switched_thinking_on() {
        for (thinking, shown) in [
            (json!(null), false),
            (json!({"type": "disabled"}), false),
            (json!({"type": "enabled", "budget_tokens": 2048}), true),
            (json!({"type": "adaptive", "display": "omitted"}), true),
        ] {
            let (_, context) = decode_json(json!({
                "messages": [{"role": "user", "content": "hi"}], "thinking": thinking
            }))
            .unwrap();
            assert_eq!(context.thinking, shown, "{thinking}");
            for stream in [false, true] {
                let mut enc = MessagesEncoder::new("coder", stream, context.clone());
                let mut out = Vec::new();
                enc.open(&mut out);
                enc.reasoning("Hmm.", &mut out);
                enc.note("Calling get_weather…", &mut out);
                enc.reasoning_item(&reasoning("Hmm.", Some("ENC")), &mut out);
                enc.content("Hello.", &mut out);
                enc.finish(Finish::Stop, usage(), &mut out);
                let text = String::from_utf8(out).unwrap();
                assert_eq!(
                    text.contains("thinking"),
                    shown,
                    "{thinking} {stream}: {text}"
                );
                if !stream {
                    let message: Value = serde_json::from_str(&text).unwrap();
                    let first = &message["content"][0];
                    let want = if shown { "thinking" } else { "text" };
                    assert_eq!(first["type"], want, "{thinking}");
                }
            }
        }
    }

    /// The Message object, and its content fed back as the assistant turn
    /// (with the client's result) decodes to what the loop produced.
    #[test]
    fn message_object_and_round_trip() {
        let mut enc = MessagesEncoder::new("coder", false, thinking());
        let mut out = Vec::new();
        enc.open(&mut out);
        assert!(out.is_empty());
        enc.reasoning("Let me ", &mut out);
        enc.reasoning("look.", &mut out);
        enc.reasoning_item(&reasoning("Let me look.", Some("ENC")), &mut out);
        enc.reasoning("Unsigned.", &mut out);
        enc.content("Running ", &mut out);
        enc.content("it.", &mut out);
        let calls = [
            // Keys not in sorted order: the round trip keeps the model's order
            // (llama.cpp's prompt cache needs the same bytes back).
            call("call_1", "Bash", r#"{"description":"List","command":"ls"}"#),
            call("call_2", "Read", "not json"),
        ];
        enc.client_calls(&calls, &mut out);
        assert!(out.is_empty(), "nothing before the end");
        enc.finish(Finish::ToolCalls, usage(), &mut out);
        let message: Value = serde_json::from_slice(&out).unwrap();
        assert!(message["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(
            message,
            json!({
                "id": message["id"], "type": "message", "role": "assistant", "model": "coder",
                "content": [
                    {"type": "thinking", "thinking": "Let me look.", "signature": "ENC"},
                    {"type": "thinking", "thinking": "Unsigned.",
                     "signature": format!("agent-proxy:{}:1", message["id"].as_str().unwrap())},
                    {"type": "text", "text": "Running it."},
                    {"type": "tool_use", "id": "call_1", "name": "Bash",
                     "input": {"description": "List", "command": "ls"}},
                    {"type": "tool_use", "id": "call_2", "name": "Read", "input": {}}
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0, "output_tokens": 5}
            })
        );

        let (conv, _) = decode_json(json!({
            "messages": [
                {"role": "user", "content": "list"},
                {"role": "assistant", "content": message["content"]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "a b"},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "bad input", "is_error": true}
                ]}
            ]
        }))
        .unwrap();
        assert_eq!(
            conv.items[1..],
            [
                Item::Reasoning(reasoning("Let me look.", Some("ENC"))),
                Item::Reasoning(reasoning("Unsigned.", None)),
                text(Role::Assistant, "Running it."),
                Item::ToolCall(calls[0].clone()),
                Item::ToolCall(call("call_2", "Read", "{}")),
                result("call_1", "a b", false),
                result("call_2", "error: bad input", true),
            ]
        );
    }

    // ------------------------------------------------------------ errors

    #[test]
    fn errors_take_anthropic_types_by_status() {
        let enc = streaming();
        let body = |status: u16| -> Value {
            let openai = ApiError::bad_request("nope").to_json();
            serde_json::from_slice(&enc.error_body(status, openai)).unwrap()
        };
        assert_eq!(
            body(400),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "nope"}})
        );
        for (status, kind) in [
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (405, "invalid_request_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
            (529, "overloaded_error"),
        ] {
            assert_eq!(body(status)["error"]["type"], kind, "{status}");
        }
        assert_eq!(enc.error_status(503), 529);
        assert_eq!(enc.error_status(502), 502);
        assert_eq!(error_status(401), 401);
        let v: Value =
            serde_json::from_slice(&anthropic_error(401, "Incorrect or missing API key.")).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "authentication_error",
                   "message": "Incorrect or missing API key."}})
        );
        // A body that is not OpenAI's shape: the status says it.
        let v: Value =
            serde_json::from_slice(&enc.error_body(502, Bytes::from_static(b"<html>"))).unwrap();
        assert_eq!(v["error"]["message"], "upstream error 502");
    }

    #[test]
    fn context_overflow_reads_as_prompt_too_long() {
        let llama = include_bytes!("../../tests/fixtures/llama.cpp/error-context-exceeded.json");
        // As the reply hands it on: `code` a string, the other fields kept.
        let mut openai: Value = serde_json::from_slice(llama).unwrap();
        openai["error"]["code"] = json!("400");
        let openai = Bytes::from(openai.to_string());
        let enc = streaming();
        let v: Value = serde_json::from_slice(&enc.error_body(400, openai)).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                   "message": "prompt is too long: 5016 tokens > 4096 maximum"}})
        );
        let openai = json!({"error": {"message": "This model's maximum context length is 8192 tokens.",
                                      "type": "invalid_request_error", "code": "context_length_exceeded"}});
        let v: Value =
            serde_json::from_slice(&enc.error_body(400, Bytes::from(openai.to_string()))).unwrap();
        assert_eq!(
            v["error"]["message"],
            "prompt is too long: This model's maximum context length is 8192 tokens."
        );
    }

    #[test]
    fn stream_errors_are_error_events() {
        let mut enc = streaming();
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.content("Half", &mut out);
        let openai = ApiError::unavailable("busy").to_json();
        enc.stream_error(503, &openai, &mut out);
        let events = events(&out);
        assert_eq!(
            events.last().unwrap(),
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        );
        // Nothing follows it.
        let len = out.len();
        enc.finish(Finish::Stop, usage(), &mut out);
        assert_eq!(out.len(), len);

        // Without a stream: the error body.
        let mut enc = MessagesEncoder::new("coder", false, Context::default());
        let mut out = Vec::new();
        enc.stream_error(502, &ApiError::bad_gateway("gone").to_json(), &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "api_error", "message": "gone"}})
        );
    }

    #[test]
    fn ping_is_the_heartbeat() {
        assert_eq!(streaming().heartbeat(), PING);
        let chat = crate::front::chat::ChatEncoder::new(
            "m",
            true,
            false,
            crate::config::file::ReasoningField::ReasoningContent,
        );
        assert_eq!(chat.heartbeat(), crate::sse::HEARTBEAT);
        let events = events(PING);
        assert_eq!(events, [json!({"type": "ping"})]);
    }
}

//! The OpenAI Responses API front door (`POST /v1/responses`): the request
//! decoder and the encoder of the answer, as OpenAI streams it (named SSE
//! events with sequence numbers, ending in one `response.completed`,
//! `response.incomplete` or `response.failed`) or as one Response object.
//!
//! State lives outside the codec: the front door resolves
//! `previous_response_id` from the response store into earlier input items
//! (see [`Input`]) and keeps the finished Response object through the
//! encoder's [`Keep`] hook. `conversation` and `background` are refused, as
//! is `previous_response_id` when it reaches the decoder (no store). Hosted tools are dropped; `namespace` tools are flattened to
//! `<namespace>__<name>` functions and restored on the calls handed back.

use std::sync::Arc;

use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::known_tools::{Declared, Namespaced};
use super::{
    decode_history, description, each_tool, function_tools, invalid, nested_tools, new_id,
    note_dropped, picked_object_and_tools, required_str, result_parts, take_bool, take_f64,
    take_str, take_str_at, take_u64, At, Channel, Entry, ErrorEnvelope, ErrorIn, Found, Picked,
    ReadTools, Take, ToolObject, ToolShape, Tools,
};
use crate::conversation::{
    CallKind, Conversation, Dialect, FilePart, Finish, Format, FunctionTool, Item, Message,
    Options, Part, Prompt, Reasoning, Role, Schema, TextSize, ToolCall, ToolChoice, ToolResult,
    Usage,
};
use crate::error::ApiError;
use crate::front::Encoder;
use crate::json;
use crate::json::cut::Lazy;
use crate::json::scan::Built;

/// Between a namespace and a function name in a flattened tool name.
const NAMESPACE_SEPARATOR: &str = "__";

/// What decoding a request learned that the encoder and the caller need.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Types of the hosted tools the client declared (`web_search`, `mcp`,
    /// …): the proxy cannot run them, so they are dropped; the caller logs them.
    pub dropped_tools: Vec<String>,
    /// The namespaced functions declared or called: the encoder puts
    /// their names back on calls.
    pub namespaced: Namespaced,
    /// Request fields the Response object repeats.
    pub echo: Echo,
    /// The client asked for reasoning's encrypted content (`include`), to
    /// send the reasoning back by it (Codex, with `store: false`).
    pub carries_reasoning: bool,
    /// The client asked for a summary of the reasoning
    /// (`reasoning.summary`): readable reasoning goes out as the summary,
    /// what such clients show (the AI SDK, LangChain, and Codex by
    /// default read nothing else). Not for an agent on a Responses
    /// upstream, whose items carry summaries of their own.
    pub summarizes: bool,
}

/// How the encrypted content the proxy gives reasoning of its own begins:
/// the reasoning text follows. A stateless client (`store: false`) sends a
/// reasoning item back by what OpenAI's use of it keeps, its summary and
/// encrypted content (the AI SDK sends no `content`): without the text, the
/// model's earlier reasoning was gone from the next round's prompt, and a
/// model server's cache of that prompt with it.
const OWN_REASONING: &str = "agent-proxy:reasoning:";
/// The proxy's own progress notes (`Calling get_weather {…}…`) go out as
/// reasoning items of their own, their ids beginning so (and their
/// encrypted content, if asked for, being [`NOTE_ENCRYPTED`]): sent back,
/// such an item is dropped, as the model never wrote it, and the calls it
/// names are not in the history the client holds.
const NOTE_ID: &str = "rs_note_";
const NOTE_ENCRYPTED: &str = "agent-proxy:note";

/// The request fields a Response object echoes back. A member the request
/// left out is `None` and echoed as OpenAI's default, written from a
/// constant (`Echo::METADATA`, …): building and writing a `Value` for each
/// default was a twentieth of a small request's instructions.
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    /// [`Echo::METADATA`] when `None`.
    pub metadata: Option<Value>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// [`Echo::TOOL_CHOICE`] when `None`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: bool,
    pub max_output_tokens: Option<u64>,
    pub store: bool,
    pub user: Option<String>,
    /// [`Echo::TEXT`] when `None`.
    pub text: Option<Value>,
    /// [`Echo::REASONING`] when `None`.
    pub reasoning: Option<Value>,
    /// [`Echo::TRUNCATION`] when `None`.
    pub truncation: Option<Value>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    /// The response this one continues (resolved by the front door).
    pub previous_response_id: Option<String>,
}

/// OpenAI's defaults, as JSON text, for the members a request left out.
impl Echo {
    pub const METADATA: &'static str = "{}";
    pub const TOOL_CHOICE: &'static str = r#""auto""#;
    pub const TEXT: &'static str = r#"{"format":{"type":"text"}}"#;
    pub const REASONING: &'static str = r#"{"effort":null,"summary":null}"#;
    pub const TRUNCATION: &'static str = r#""disabled""#;
}

impl Default for Echo {
    /// OpenAI's defaults, except `store`: the front door says whether a
    /// response is kept.
    fn default() -> Self {
        Echo {
            instructions: None,
            metadata: None,
            temperature: None,
            top_p: None,
            tool_choice: None,
            parallel_tool_calls: true,
            max_output_tokens: None,
            store: false,
            user: None,
            text: None,
            reasoning: None,
            truncation: None,
            prompt_cache_key: None,
            safety_identifier: None,
            previous_response_id: None,
        }
    }
}

// ------------------------------------------------------------------ decode

/// A function tool's schema, kept as the text it came as, and a
/// namespace's tools, read as tools.
pub const TOOL: ToolShape = ToolShape {
    dialect: Dialect::Responses,
    schema: "parameters",
    nested: Some("tools"),
};

/// A `POST /v1/responses` body as a conversation (origin
/// [`Dialect::Responses`]), with what the encoder must know about it.
pub fn decode(body: &[u8]) -> Result<(Conversation, Box<Context>), ApiError> {
    let body = picked_object_and_tools(body, TOOL, &READ, Some("input"), &Found::default())?;
    decode_object(body.picked, body.rest, body.tools, body.history)
}

/// The root members the decoder reads, set apart as the body is parsed
/// ([`Picked`]); the others go on in `extra` (to a Responses upstream). The
/// last three, null or false, only say what the stateless proxy does anyway:
/// checked, never taken, so never forwarded.
pub const READ: [&str; 15] = [
    "model",
    "instructions",
    "input",
    "stream",
    "max_output_tokens",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "tool_choice",
    "text",
    "reasoning",
    "previous_response_id",
    "background",
    "conversation",
];

/// The members of a body [`READ`] set apart.
pub type Read = Picked<{ READ.len() }>;

/// [`decode`] of a body already parsed (and its history spliced in), its
/// `tools` as that pass read them, and its `input` list, when it is one,
/// entry by entry.
pub fn decode_object(
    mut read: Read,
    mut top: Map<String, Value>,
    tools: ReadTools,
    input: Option<Vec<Entry<'_>>>,
) -> Result<(Conversation, Box<Context>), ApiError> {
    refuse_state(&read)?;
    // Boxed: it goes to the encoder through several hands, and is large.
    let mut ctx = Box::<Context>::default();
    let mut conv = Conversation {
        origin: Dialect::Responses,
        model: take_str(&mut read, "model")?,
        ..Conversation::default()
    };
    let instructions = take_str(&mut read, "instructions")?;
    let options = decode_options(&mut read, &mut top, &mut ctx)?;
    ctx.summarizes = options
        .reasoning_summary
        .as_deref()
        .is_some_and(|summary| summary != "none");

    let declared = tools.declared(Dialect::Responses, decode_tools)?;
    conv.tools.clone_from(&declared.tools);
    ctx.dropped_tools.clone_from(&declared.dropped);
    ctx.namespaced = declared.namespaced.clone();

    let mut system = Prompt::default();
    if let Some(instructions) = instructions.as_ref().filter(|s| !s.is_empty()) {
        system.push(instructions.clone());
    }
    let input = (input, read.take("input"));
    decode_input(input, &mut conv.items, &mut system, &mut ctx)?;
    conv.system = system.some();

    ctx.carries_reasoning = top
        .get("include")
        .and_then(Value::as_array)
        .is_some_and(|all| all.iter().any(|i| i == "reasoning.encrypted_content"));
    // Echoed as sent; also forwarded (in `extra`) to a Responses upstream.
    let echo = &mut ctx.echo;
    echo.instructions = instructions;
    if let Some(metadata) = top.get("metadata").filter(|v| v.is_object()) {
        echo.metadata = Some(metadata.clone());
    }
    if let Some(store) = top.get("store").and_then(Value::as_bool) {
        echo.store = store;
    }
    if let Some(truncation) = top.get("truncation").filter(|v| v.is_string()) {
        echo.truncation = Some(truncation.clone());
    }
    let text_of = |key| top.get(key).and_then(Value::as_str).map(str::to_owned);
    echo.prompt_cache_key = text_of("prompt_cache_key");
    conv.session.clone_from(&echo.prompt_cache_key);
    echo.safety_identifier = text_of("safety_identifier");

    conv.options = options;
    conv.extra = top;
    Ok((conv, ctx))
}

/// Stored state the proxy does not have: a request relying on it is refused
/// rather than answered without the context it expects.
fn refuse_state(read: &Read) -> Result<(), ApiError> {
    let set = |key| read.get(key).is_some_and(|v| !v.is_null());
    if set("previous_response_id") {
        return Err(invalid(
            "previous_response_id is not supported: this proxy keeps no responses (its \
             `store` is `kind: none`); send the whole conversation in input.",
            "previous_response_id",
        ));
    }
    if read.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(invalid(
            "agent-proxy is stateless: background responses are not supported; stream the \
             response instead.",
            "background",
        ));
    }
    if set("conversation") {
        return Err(invalid(
            "agent-proxy is stateless: conversation is not supported; send the whole \
             conversation in input.",
            "conversation",
        ));
    }
    Ok(())
}

/// The sampling and output options, out of the members `read`; `text` and
/// `reasoning` fields the core does not map go to `top` (forwarded to a
/// Responses upstream).
fn decode_options(
    read: &mut Read,
    top: &mut Map<String, Value>,
    ctx: &mut Context,
) -> Result<Options, ApiError> {
    let mut options = Options {
        stream: take_bool(read, "stream")?.unwrap_or(false),
        // The Response object always reports usage: ask upstreams for it.
        include_usage: true,
        max_tokens: take_u64(read, "max_output_tokens")?,
        temperature: take_f64(read, "temperature")?,
        top_p: take_f64(read, "top_p")?,
        parallel_tool_calls: take_bool(read, "parallel_tool_calls")?,
        user: take_str(read, "user")?,
        ..Options::default()
    };
    let echo = &mut ctx.echo;
    echo.max_output_tokens = options.max_tokens;
    echo.temperature = options.temperature;
    echo.top_p = options.top_p;
    echo.parallel_tool_calls = options.parallel_tool_calls.unwrap_or(true);
    echo.user = options.user.clone();

    if let Some(choice) = read.take("tool_choice").filter(|v| !v.is_null()) {
        options.tool_choice = decode_tool_choice(&choice)?;
        echo.tool_choice = Some(choice);
    }

    if let Some(text) = read.take("text").filter(|v| !v.is_null()) {
        let Value::Object(mut fields) = text else {
            return Err(invalid("text must be an object.", "text"));
        };
        echo.text = Some(Value::Object(fields.clone()));
        if let Some(format) = fields.remove("format").filter(|v| !v.is_null()) {
            options.format = decode_format(format)?;
        }
        if !fields.is_empty() {
            top.insert("text".into(), Value::Object(fields));
        }
    }

    if let Some(reasoning) = read.take("reasoning").filter(|v| !v.is_null()) {
        let Value::Object(mut fields) = reasoning else {
            return Err(invalid("reasoning must be an object.", "reasoning"));
        };
        echo.reasoning = Some(Value::Object(fields.clone()));
        options.reasoning_effort =
            take_str_at(&mut fields, "effort", At::Root("reasoning.effort"))?;
        let summary = take_str_at(&mut fields, "summary", At::Root("reasoning.summary"))?;
        let legacy = take_str_at(
            &mut fields,
            "generate_summary",
            At::Root("reasoning.generate_summary"),
        )?;
        options.reasoning_summary = summary.or(legacy);
        if !fields.is_empty() {
            top.insert("reasoning".into(), Value::Object(fields));
        }
    }
    Ok(options)
}

fn decode_tool_choice(choice: &Value) -> Result<Option<ToolChoice>, ApiError> {
    let param = "tool_choice";
    match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" => Ok(Some(ToolChoice::Required)),
            other => Err(invalid(
                format!("Invalid tool_choice `{other}`: expected auto, none or required."),
                param,
            )),
        },
        Value::Object(fields) => match fields.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => match fields.get("name").and_then(Value::as_str) {
                Some(name) => Ok(Some(ToolChoice::Function(name.to_owned()))),
                None => Err(invalid("tool_choice.name is required.", "tool_choice.name")),
            },
            Some("allowed_tools") => Ok(Some(match fields.get("mode").and_then(Value::as_str) {
                Some("required") => ToolChoice::Required,
                _ => ToolChoice::Auto,
            })),
            // A hosted tool's type: that tool is dropped, so nothing to force.
            Some(_) => Ok(None),
            None => Err(invalid("tool_choice.type is required.", "tool_choice.type")),
        },
        _ => Err(invalid("tool_choice must be a string or an object.", param)),
    }
}

fn decode_format(format: Value) -> Result<Option<Format>, ApiError> {
    let Value::Object(mut fields) = format else {
        return Err(invalid("text.format must be an object.", "text.format"));
    };
    let kind = take_str_at(&mut fields, "type", At::Root("text.format.type"))?;
    Ok(match kind.as_deref() {
        // `{name, schema, strict, description}`: the same object chat nests
        // in `response_format.json_schema`.
        Some("json_schema") => Some(Format::JsonSchema(Value::Object(fields))),
        Some("json_object") => Some(Format::JsonObject),
        _ => None,
    })
}

fn decode_tools(tools: Tools) -> Result<Declared, ApiError> {
    let (mut dropped, mut namespaced) = (Vec::new(), Arc::default());
    let tools = function_tools(tools, |mut tool, out| {
        let kind = required_str(&mut tool.fields, "type", tool.param)?;
        match kind.as_str() {
            "function" | "custom" => {
                out.push(Arc::new(function_tool(tool, &kind, None, &mut namespaced)?))
            }
            "namespace" => {
                let namespace = required_str(&mut tool.fields, "name", tool.param)?;
                let list = tool.param.field("tools");
                let namespace = Some(namespace.as_str());
                each_tool(nested_tools(tool.nested, list)?, list, |mut inner| {
                    let kind = required_str(&mut inner.fields, "type", inner.param)?;
                    if kind == "function" || kind == "custom" {
                        let tool = function_tool(inner, &kind, namespace, &mut namespaced)?;
                        out.push(Arc::new(tool));
                    } else {
                        note_dropped(&mut dropped, kind);
                    }
                    Ok(())
                })?;
            }
            _ => note_dropped(&mut dropped, kind),
        }
        Ok(())
    })?;
    Ok(Declared {
        tools,
        dropped,
        namespaced,
    })
}

/// A `function` or `custom` tool definition, its `parameters` taken out;
/// whatever else it carries (`strict`, a custom tool's `format`, …) goes
/// to `extra`.
fn function_tool(
    tool: ToolObject,
    kind: &str,
    namespace: Option<&str>,
    namespaced: &mut Namespaced,
) -> Result<FunctionTool, ApiError> {
    let ToolObject {
        param,
        fields: mut tool,
        schema: parameters,
        description: given,
        nested,
    } = tool;
    // Only a namespace's `tools` are tools: here it goes on as sent.
    if let Some(nested) = nested {
        tool.insert("tools".into(), nested.into_value(TOOL)?);
    }
    let name = required_str(&mut tool, "name", param)?;
    let description = description(given, param.field("description"))?;
    let (kind, parameters) = if kind == "custom" {
        // A freeform tool takes one raw string; to a model without custom
        // tools it is a function of one string argument.
        let schema = json!({
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
        });
        // Not ours to read: it stays with the tool, as sent.
        if let Some(given) = parameters {
            tool.insert("parameters".into(), given.to_value());
        }
        (CallKind::Custom, Schema::from(&schema))
    } else {
        (CallKind::Function, parameters.unwrap_or_else(Schema::empty))
    };
    Ok(FunctionTool {
        name: match namespace {
            Some(namespace) => flatten(namespaced, namespace, name),
            None => name,
        },
        description,
        parameters,
        kind,
        extra: tool.into_map(),
    })
}

/// `<namespace>__<name>`, remembered so calls can be handed back as sent.
fn flatten(namespaced: &mut Namespaced, namespace: &str, name: String) -> String {
    let flat = [namespace, NAMESPACE_SEPARATOR, &name].concat();
    // Shared with the tools' decoding (see `known_tools`): copied only for
    // a name of a call's own.
    if !namespaced.contains_key(&flat) {
        Arc::make_mut(namespaced).insert(flat.clone(), (namespace.to_owned(), name));
    }
    flat
}

fn decode_input(
    (list, input): (Option<Vec<Entry<'_>>>, Option<Value>),
    items: &mut Vec<Item>,
    system: &mut Prompt,
    ctx: &mut Context,
) -> Result<(), ApiError> {
    let list = match (list, input) {
        (Some(list), _) => list,
        (None, Some(Value::String(text))) if !text.is_empty() => {
            items.push(Item::Message(Message::text(Role::User, text)));
            return Ok(());
        }
        (None, None | Some(Value::Null | Value::String(_))) => Vec::new(),
        (None, Some(_)) => return Err(not_string_or_list()),
    };
    if list.is_empty() {
        return Err(invalid(
            "input is required: a string or a non-empty array of input items.",
            "input",
        ));
    }
    // A coding agent's history, most of it decoded before. An item's
    // decoding depends on it alone but for a call's namespace, which the
    // request's names must learn each time (`flatten`).
    let decode = |item: Built, at: At<'_>, items: &mut Vec<Item>, _: &mut Prompt| {
        let item = item.into_value();
        let alone = item.get("namespace").is_none();
        items.extend(decode_item(item, at, ctx)?);
        Ok(alone)
    };
    decode_history(list, Dialect::Responses, "input", items, system, decode)?;
    // Instructions before anything else are the system prompt.
    let leading = items
        .iter()
        .take_while(|item| matches!(item, Item::Message(message) if message.role == Role::System));
    let leading = leading.count();
    for item in items.drain(..leading) {
        if let Item::Message(message) = item {
            system.push_message(message);
        }
    }
    Ok(())
}

/// `input` of a type it cannot have.
fn not_string_or_list() -> ApiError {
    invalid(
        "input must be a string or an array of input items.",
        "input",
    )
}

/// The request's `input` as a store keeps it and a later turn replays it: a
/// list of items, each with an id (`input_items` lists and pages by id).
/// A string stays a string until a chain needs it as an item: the decoder
/// reads it as one user message, and the kept list is written from it
/// directly, without a map built per item and member.
pub enum Input {
    Text(String),
    /// A list (empty for none: [`decode`] judges that).
    Items(Vec<Value>),
}

impl Input {
    /// `input` as sent; anything but a string, a list or none is refused
    /// here as [`decode`] refuses it, before a store keeps it.
    pub fn new(input: Option<Value>) -> Result<Input, ApiError> {
        match input {
            Some(Value::String(text)) => Ok(Input::Text(text)),
            Some(Value::Array(items)) => Ok(Input::Items(items)),
            None | Some(Value::Null) => Ok(Input::Items(Vec::new())),
            Some(_) => Err(not_string_or_list()),
        }
    }

    /// How many items it is.
    pub fn count(&self) -> usize {
        match self {
            Input::Text(_) => 1,
            Input::Items(items) => items.len(),
        }
    }

    /// The list a store keeps, as JSON: an object item without an id is
    /// given one here, where it is kept (the decoder drops ids).
    pub fn kept(&self) -> Vec<u8> {
        match self {
            // Written member by member: 1.3k instructions with its id,
            // against 2.2k through serde.
            Input::Text(text) => json::to_vec_with(|out| {
                out.push(b'[');
                let mut item = json::Object::new(out);
                item.plain("type", "message");
                item.plain("role", "user");
                item.list("content", [text], |out, text| {
                    let mut part = json::Object::new(out);
                    part.plain("type", "input_text");
                    part.value("text", text);
                    part.end();
                });
                item.value("id", &new_id("msg_"));
                item.end();
                out.push(b']');
            }),
            Input::Items(items) => json::to_vec(&KeptItems(items)),
        }
    }

    /// As items, to follow those of earlier responses. A string becomes
    /// the "easy" message it stands for.
    pub fn into_items(self) -> Vec<Value> {
        match self {
            Input::Text(text) => vec![json!({"role": "user", "content": text})],
            Input::Items(items) => items,
        }
    }

    /// As the request's `input`, for [`decode`].
    pub fn into_value(self) -> Value {
        match self {
            Input::Text(text) => Value::String(text),
            Input::Items(items) => Value::Array(items),
        }
    }
}

/// Input items as a store keeps them: each object with a string `id`, one
/// made where it has none.
struct KeptItems<'a>(&'a [Value]);

impl Serialize for KeptItems<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(KeptItem))
    }
}

struct KeptItem<'a>(&'a Value);

impl Serialize for KeptItem<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Value::Object(fields) = self.0 else {
            return self.0.serialize(serializer);
        };
        if fields.get("id").is_some_and(Value::is_string) {
            return self.0.serialize(serializer);
        }
        let prefix = match fields.get("type").and_then(Value::as_str) {
            Some("message") | None => "msg_",
            Some("function_call_output") => "fco_",
            Some("custom_tool_call_output") => "ctco_",
            Some("function_call") => "fc_",
            Some("reasoning") => "rs_",
            Some(_) => "item_",
        };
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in fields.iter().filter(|(key, _)| *key != "id") {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry("id", &new_id(prefix))?;
        map.end()
    }
}

/// The response that holds the output item `id` (made by
/// `ResponsesEncoder::item_id`), by its id.
pub fn response_of_item(id: &str) -> Option<String> {
    let rest = match id.strip_prefix(NOTE_ID) {
        Some(rest) => rest,
        None => id.split_once('_')?.1,
    };
    let (response, place) = rest.rsplit_once('_')?;
    (!response.is_empty() && !place.is_empty() && place.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("resp_{response}"))
}

/// The id an `item_reference` input item names.
pub fn referenced(item: &Value) -> Option<&str> {
    match item.get("type")?.as_str()? {
        "item_reference" => item.get("id")?.as_str(),
        _ => None,
    }
}

/// One input item; `None` for item types the proxy does not model (such as
/// hosted tool calls, or an `item_reference` no store resolved), which are
/// skipped.
fn decode_item(item: Value, param: At<'_>, ctx: &mut Context) -> Result<Option<Item>, ApiError> {
    let Value::Object(mut item) = item else {
        return Err(param.invalid("must be an object."));
    };
    let kind = match item.remove("type") {
        Some(Value::String(kind)) => kind,
        // An "easy" input message: `{role, content}`.
        None | Some(Value::Null) if item.contains_key("role") => "message".to_owned(),
        _ => return Err(param.field("type").invalid("is required.")),
    };
    Ok(Some(match kind.as_str() {
        "message" => Item::Message(decode_message(item, param)?),
        "function_call" | "custom_tool_call" => {
            let call_id = required_str(&mut item, "call_id", param)?;
            let mut name = required_str(&mut item, "name", param)?;
            let namespace = take_str_at(&mut item, "namespace", param.field("namespace"))?;
            if let Some(namespace) = namespace {
                name = flatten(&mut ctx.namespaced, &namespace, name);
            }
            let (field, kind) = if kind == "function_call" {
                ("arguments", CallKind::Function)
            } else {
                ("input", CallKind::Custom)
            };
            let arguments = take_str_at(&mut item, field, param.field(field))?.unwrap_or_default();
            Item::ToolCall(ToolCall {
                id: call_id,
                name,
                arguments,
                kind,
            })
        }
        "function_call_output" | "custom_tool_call_output" => {
            let call_id = required_str(&mut item, "call_id", param)?;
            let (output, attachments) = decode_output(item.remove("output"), param)?;
            Item::ToolResult(ToolResult {
                call_id,
                output,
                is_error: false,
                attachments,
            })
        }
        "reasoning" => match decode_reasoning(item, param)? {
            Some(reasoning) => Item::Reasoning(reasoning),
            None => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

fn decode_message(mut item: Map<String, Value>, param: At<'_>) -> Result<Message, ApiError> {
    let role = match required_str(&mut item, "role", param)?.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" | "developer" => Role::System,
        other => {
            return Err(invalid(
                format!(
                "Invalid {param}.role `{other}`: expected user, assistant, system or developer."
            ),
                param.field("role"),
            ))
        }
    };
    let content = match item.remove("content") {
        Some(Value::String(text)) => vec![Part::Text(text)],
        Some(Value::Array(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            let list = param.field("content");
            for (j, part) in parts.into_iter().enumerate() {
                out.push(decode_part(part, list.index(j))?);
            }
            out
        }
        _ => {
            return Err(param
                .field("content")
                .invalid("must be a string or an array of content parts."))
        }
    };
    // The id and status of an item the client got from a response say
    // nothing to a model; anything else (`phase`, …) is kept.
    item.remove("id");
    item.remove("status");
    Ok(Message {
        role,
        content,
        extra: item,
    })
}

fn decode_part(part: Value, param: At<'_>) -> Result<Part, ApiError> {
    let Value::Object(mut part) = part else {
        return Err(param.invalid("must be an object."));
    };
    let text_field = match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => "text",
        Some("refusal") => "refusal",
        Some("input_image") if part.get("image_url").is_some_and(Value::is_string) => {
            let url = take_str_at(&mut part, "image_url", param)?.unwrap_or_default();
            let detail = take_str_at(&mut part, "detail", param)?;
            return Ok(Part::Image { url, detail });
        }
        Some("input_file") => {
            let mut field = |key| take_str_at(&mut part, key, param.field(key));
            let file = FilePart {
                data: field("file_data")?,
                id: field("file_id")?,
                url: field("file_url")?,
                name: field("filename")?,
            };
            if file.data.is_some() || file.id.is_some() || file.url.is_some() {
                return Ok(Part::File(file));
            }
            return Ok(Part::Other(Value::Object(part)));
        }
        // Images by file id, audio: passed on as they are.
        _ => return Ok(Part::Other(Value::Object(part))),
    };
    match part.remove(text_field) {
        Some(Value::String(text)) => Ok(Part::Text(text)),
        _ => Err(param.field(text_field).invalid("must be a string.")),
    }
}

/// A tool output: a string, or content parts: their texts joined, and
/// what is not text (Codex's `view_image`, an image tool's picture).
fn decode_output(output: Option<Value>, param: At<'_>) -> Result<(String, Vec<Part>), ApiError> {
    let list = param.field("output");
    match output {
        Some(Value::String(text)) => Ok((text, Vec::new())),
        Some(Value::Array(parts)) => {
            let parts = parts.into_iter().enumerate();
            let parts = parts.map(|(j, part)| decode_part(part, list.index(j)));
            Ok(result_parts(parts.collect::<Result<Vec<_>, _>>()?))
        }
        _ => Err(list.invalid("must be a string or an array of content parts.")),
    }
}

/// A reasoning item; `None` for one of the proxy's notes ([`NOTE_ID`]).
fn decode_reasoning(
    mut item: Map<String, Value>,
    param: At<'_>,
) -> Result<Option<Reasoning>, ApiError> {
    let id = take_str_at(&mut item, "id", param.field("id"))?;
    let encrypted = take_str_at(
        &mut item,
        "encrypted_content",
        param.field("encrypted_content"),
    )?;
    if id.as_deref().is_some_and(|id| id.starts_with(NOTE_ID))
        || encrypted.as_deref() == Some(NOTE_ENCRYPTED)
    {
        return Ok(None);
    }
    let texts = |parts: Option<Value>, field: &str| -> Result<Vec<String>, ApiError> {
        let list = param.field(field);
        match parts {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(parts)) => parts
                .into_iter()
                .enumerate()
                .map(|(j, part)| match part {
                    Value::Object(mut part) => match part.remove("text") {
                        Some(Value::String(text)) => Ok(text),
                        _ => Err(list.index(j).field("text").invalid("must be a string.")),
                    },
                    _ => Err(list.index(j).invalid("must be an object.")),
                })
                .collect(),
            Some(_) => Err(list.invalid("must be an array.")),
        }
    };
    let summary = texts(item.remove("summary"), "summary")?;
    let mut text = texts(item.remove("content"), "content")?.join("\n");
    // The proxy's own: the text it carries, for the model, never for an
    // upstream.
    let encrypted = match encrypted {
        Some(own) if own.starts_with(OWN_REASONING) => {
            if text.is_empty() {
                text = own[OWN_REASONING.len()..].to_owned();
            }
            None
        }
        encrypted => encrypted,
    };
    Ok(Some(Reasoning {
        id,
        text,
        summary,
        encrypted,
    }))
}

// ----------------------------------------------------------------- encode

/// One output item of the response, as far as it got.
#[derive(Debug)]
struct OutputItem {
    id: String,
    body: Body,
}

#[derive(Debug)]
enum Body {
    Message {
        text: String,
    },
    Reasoning {
        /// One of the proxy's notes ([`NOTE_ID`]), not the model's.
        note: bool,
        /// Its text goes out as its summary ([`Context::summarizes`]), not
        /// as `reasoning_text` content.
        summarized: bool,
        /// What was streamed as `reasoning_text`.
        text: String,
        /// Whether a `reasoning_text` content part is open.
        part: bool,
        /// The upstream's item, once it completed: its text replaces the
        /// streamed one in the finished item (which goes back upstream).
        upstream_text: Option<String>,
        summary: Vec<String>,
        encrypted: Option<String>,
    },
    FunctionCall {
        call_id: String,
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
    CustomCall {
        call_id: String,
        name: String,
        namespace: Option<String>,
        input: String,
    },
}

/// How far an item is, for its wire form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Just opened (`output_item.added`): no content yet.
    Added,
    Done,
    /// Cut off by a failure, or by the answer's end (a token limit).
    Cut,
}

impl OutputItem {
    /// About the bytes of text the item serializes to.
    fn size_hint(&self) -> usize {
        let text = match &self.body {
            Body::Message { text } => text.len(),
            Body::Reasoning {
                text,
                upstream_text,
                summary,
                encrypted,
                ..
            } => {
                upstream_text.as_ref().map_or(text.len(), String::len)
                    + summary.iter().map(String::len).sum::<usize>()
                    + encrypted.as_ref().map_or(0, String::len)
            }
            Body::FunctionCall { arguments, .. } => arguments.len() + 64,
            Body::CustomCall { input, .. } => input.len() + 64,
        };
        text + 128
    }

    fn wire(&self, phase: Phase) -> ItemOut<'_> {
        let status = match phase {
            Phase::Added => "in_progress",
            Phase::Done => "completed",
            Phase::Cut => "incomplete",
        };
        let added = phase == Phase::Added;
        let id = self.id.as_str();
        match &self.body {
            Body::Message { text } => ItemOut::Message {
                id,
                status,
                content: (!added).then_some(PartOut::OutputText { text }),
            },
            Body::Reasoning {
                text,
                upstream_text,
                summary,
                encrypted,
                ..
            } => {
                // A summarized item's text went into its summary when it
                // closed; the upstream's own raw text is its content.
                let text = upstream_text.as_deref().unwrap_or(text);
                ItemOut::Reasoning {
                    id,
                    summary: SummaryList(if added { &[] } else { summary }),
                    content: (!added && !text.is_empty())
                        .then_some(PartOut::ReasoningText { text }),
                    encrypted_content: encrypted.as_deref().filter(|_| !added),
                }
            }
            Body::FunctionCall {
                call_id,
                name,
                namespace,
                arguments: payload,
            }
            | Body::CustomCall {
                call_id,
                name,
                namespace,
                input: payload,
            } => ItemOut::Call {
                custom: matches!(self.body, Body::CustomCall { .. }),
                id,
                call_id,
                name,
                namespace: namespace.as_deref(),
                payload: if added { "" } else { payload },
                status,
            },
        }
    }
}

/// An event's body written by hand ([`json::Object`]), not through serde:
/// those a stream writes for every item and part.
trait Wire {
    fn write(&self, out: &mut Vec<u8>);
}

/// Writes the events of a stream, numbered; writes nothing for a
/// non-streaming answer (which only collects the items). Taken out of the
/// encoder while an event borrowing it is written, then put back.
#[derive(Default)]
struct Sink {
    stream: bool,
    sequence: u64,
    /// The text deltas of the last item that had one, cut around their
    /// sequence number and text (`json::cut`).
    delta: Option<DeltaCut>,
}

/// What a text delta event is cut for, and its cut.
struct DeltaCut {
    kind: &'static str,
    item_id: String,
    output_index: usize,
    logprobs: bool,
    cut: Lazy,
}

impl Sink {
    fn emit<T: Serialize>(&mut self, out: &mut Vec<u8>, kind: &'static str, body: T) {
        self.emit_with(out, kind, |out| json::write(out, &body));
    }

    /// [`emit`](Self::emit) of a body written by hand.
    fn emit_wire(&mut self, out: &mut Vec<u8>, kind: &'static str, body: impl Wire) {
        self.emit_with(out, kind, |out| body.write(out));
    }

    /// [`emit`](Self::emit) of the object `body` writes.
    fn emit_with(
        &mut self,
        out: &mut Vec<u8>,
        kind: &'static str,
        body: impl FnOnce(&mut Vec<u8>),
    ) {
        if !self.stream {
            return;
        }
        write_event(out, kind, self.sequence, body);
        self.sequence += 1;
    }

    /// A text's delta, the event a stream has for each token (see
    /// [`write_delta`]).
    fn emit_delta(
        &mut self,
        out: &mut Vec<u8>,
        kind: &'static str,
        item_id: &str,
        output_index: usize,
        delta: &str,
        logprobs: bool,
    ) {
        if !self.stream {
            return;
        }
        let write = |sequence, delta: &str, out: &mut Vec<u8>| {
            write_delta(out, kind, sequence, item_id, output_index, delta, logprobs)
        };
        let cut = match &self.delta {
            Some(cut)
                if cut.output_index == output_index
                    && cut.kind == kind
                    && cut.logprobs == logprobs
                    && cut.item_id == item_id =>
            {
                &cut.cut
            }
            _ => {
                let cut = DeltaCut {
                    kind,
                    item_id: item_id.to_owned(),
                    output_index,
                    logprobs,
                    cut: Lazy::default(),
                };
                &self.delta.insert(cut).cut
            }
        };
        cut.write(write, self.sequence, delta, out);
        self.sequence += 1;
    }

    /// An event carrying the Response object.
    fn emit_response(&mut self, out: &mut Vec<u8>, kind: &'static str, response: &ResponseOut<'_>) {
        self.emit_with(out, kind, |out| {
            let mut event = json::Object::new(out);
            response.write(event.name("response"));
            event.end();
        });
    }
}

/// An event: its type and number, then its own fields.
fn write_event(
    out: &mut Vec<u8>,
    kind: &'static str,
    sequence: u64,
    body: impl FnOnce(&mut Vec<u8>),
) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    json::tagged(
        out,
        |head| {
            head.plain("type", kind);
            head.u64("sequence_number", sequence);
        },
        body,
    );
    out.extend_from_slice(b"\n\n");
}

/// The event of a piece of a reasoning summary's text.
const SUMMARY_DELTA: &str = "response.reasoning_summary_text.delta";

/// A text's delta event: its item's id and index, and the text; output
/// text has its (empty) `logprobs` too.
fn write_delta(
    out: &mut Vec<u8>,
    kind: &'static str,
    sequence: u64,
    item_id: &str,
    output_index: usize,
    delta: &str,
    logprobs: bool,
) {
    write_event(out, kind, sequence, |out| {
        let mut o = json::Object::new(out);
        o.value("item_id", item_id);
        o.u64("output_index", output_index as u64);
        match kind {
            SUMMARY_DELTA => o.raw("summary_index", "0"),
            _ => o.raw("content_index", "0"),
        }
        o.value("delta", delta);
        if logprobs {
            o.raw("logprobs", "[]");
        }
        o.end();
    });
}

/// The end of a response, handed to whoever keeps it (the response store).
pub struct Finished<'a> {
    pub id: &'a str,
    /// `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    /// The Response object, as `GET /v1/responses/{id}` answers it.
    pub response: String,
}

/// Called once, as the response ends and before its last bytes go out.
pub type Keep = Box<dyn FnOnce(Finished<'_>) + Send>;

/// The Responses [`Encoder`]: one Response, whatever number of rounds the
/// loop took.
pub struct ResponsesEncoder {
    id: String,
    created_at: u64,
    model: String,
    context: Context,
    sink: Sink,
    output: Vec<OutputItem>,
    /// The message or reasoning item (an index into `output`) still taking text.
    open: Option<usize>,
    /// The item the answer's end cut short (`max_output_tokens`): it goes
    /// out `incomplete`, as OpenAI's does.
    cut: Option<usize>,
    /// The terminal event went out: nothing more may follow it.
    ended: bool,
    keep: Option<Keep>,
}

impl ResponsesEncoder {
    pub fn new(model: &str, stream: bool, context: Context) -> Self {
        ResponsesEncoder {
            id: new_id("resp_"),
            created_at: unix_now(),
            model: model.to_owned(),
            context,
            sink: Sink {
                stream,
                sequence: 0,
                delta: None,
            },
            output: Vec::new(),
            open: None,
            cut: None,
            ended: false,
            keep: None,
        }
    }

    /// Hands the finished Response object to `keep`.
    pub fn keeping(mut self, keep: Keep) -> Self {
        self.keep = Some(keep);
        self
    }

    /// The open item if it is a message, else a new one (closing what was open).
    fn message(&mut self, out: &mut Vec<u8>) -> usize {
        if let Some(index) = self.open {
            if matches!(self.output[index].body, Body::Message { .. }) {
                return index;
            }
        }
        self.close(None, out);
        let index = self.add(
            self.item_id("msg_"),
            Body::Message {
                text: String::new(),
            },
            out,
        );
        let item_id = &self.output[index].id;
        self.sink.emit_wire(
            out,
            "response.content_part.added",
            PartEvent {
                item_id,
                output_index: index,
                content_index: 0,
                part: PartOut::OutputText { text: "" },
            },
        );
        self.open = Some(index);
        index
    }

    /// The open item if it is reasoning, else a new one (closing what was open).
    fn reasoning_index(&mut self, id: Option<&str>, note: bool, out: &mut Vec<u8>) -> usize {
        if let Some(index) = self.open.filter(|&i| self.open_reasoning(i, note)) {
            return index;
        }
        self.close(None, out);
        let id = match (id, note) {
            (Some(id), false) => id.to_owned(),
            (_, true) => self.item_id(NOTE_ID),
            (None, false) => self.item_id("rs_"),
        };
        let index = self.add(
            id,
            Body::Reasoning {
                note,
                summarized: self.context.summarizes,
                text: String::new(),
                part: false,
                upstream_text: None,
                summary: Vec::new(),
                encrypted: None,
            },
            out,
        );
        self.open = Some(index);
        index
    }

    /// Whether output item `index` is a reasoning item of the model's
    /// (`note`: of the proxy's notes), which more of the same extends.
    fn open_reasoning(&self, index: usize, note: bool) -> bool {
        matches!(self.output[index].body, Body::Reasoning { note: n, .. } if n == note)
    }

    /// The id of the next output item: `prefix`, this response's id without
    /// its own prefix, and the item's place. Which response holds an item is
    /// then read off its id ([`response_of_item`]), for an `item_reference`.
    fn item_id(&self, prefix: &str) -> String {
        let response = self.id.strip_prefix("resp_").unwrap_or(&self.id);
        let mut place = itoa::Buffer::new();
        let place = place.format(self.output.len());
        let mut id = String::with_capacity(prefix.len() + response.len() + 1 + place.len());
        id.push_str(prefix);
        id.push_str(response);
        id.push('_');
        id.push_str(place);
        id
    }

    /// Appends an item and announces it.
    fn add(&mut self, id: String, body: Body, out: &mut Vec<u8>) -> usize {
        let index = self.output.len();
        self.output.push(OutputItem { id, body });
        self.sink.emit_wire(
            out,
            "response.output_item.added",
            ItemEvent {
                output_index: index,
                item: self.output[index].wire(Phase::Added),
            },
        );
        index
    }

    /// Streams reasoning text into the open reasoning item at `index`: as
    /// its `reasoning_text` content, or its summary's one part.
    fn reasoning_text(&mut self, index: usize, delta: &str, out: &mut Vec<u8>) {
        let item = &mut self.output[index];
        let Body::Reasoning {
            text,
            part,
            summarized,
            ..
        } = &mut item.body
        else {
            return;
        };
        if !*part {
            *part = true;
            match summarized {
                true => self.sink.emit(
                    out,
                    "response.reasoning_summary_part.added",
                    SummaryPartEvent {
                        at: &SummaryAt::first(&item.id, index),
                        part: SummaryPartOut::text(""),
                    },
                ),
                false => self.sink.emit_wire(
                    out,
                    "response.content_part.added",
                    PartEvent {
                        item_id: &item.id,
                        output_index: index,
                        content_index: 0,
                        part: PartOut::ReasoningText { text: "" },
                    },
                ),
            }
        }
        text.push_str(delta);
        let kind = match summarized {
            true => SUMMARY_DELTA,
            false => "response.reasoning_text.delta",
        };
        self.sink
            .emit_delta(out, kind, &item.id, index, delta, false);
    }

    /// Finishes the open item, if any; a reasoning item takes the summary,
    /// text and encrypted content of `upstream`, the item the upstream made.
    fn close(&mut self, upstream: Option<&Reasoning>, out: &mut Vec<u8>) {
        self.close_as(upstream, Phase::Done, out);
    }

    /// [`Self::close`], the item done as `phase` says.
    fn close_as(&mut self, upstream: Option<&Reasoning>, phase: Phase, out: &mut Vec<u8>) {
        let Some(index) = self.open.take() else {
            return;
        };
        if phase == Phase::Cut {
            self.cut = Some(index);
        }
        let item = &mut self.output[index];
        let item_id = item.id.as_str();
        match &mut item.body {
            Body::Message { text } => {
                self.sink.emit(
                    out,
                    "response.output_text.done",
                    TextDoneEvent {
                        item_id,
                        output_index: index,
                        content_index: 0,
                        text,
                        logprobs: Empty,
                    },
                );
                self.sink.emit_wire(
                    out,
                    "response.content_part.done",
                    PartEvent {
                        item_id,
                        output_index: index,
                        content_index: 0,
                        part: PartOut::OutputText { text },
                    },
                );
            }
            Body::Reasoning {
                note,
                summarized,
                text,
                part,
                upstream_text,
                summary,
                encrypted,
            } => {
                if std::mem::take(part) {
                    match summarized {
                        true => {
                            let at = SummaryAt::first(item_id, index);
                            let done = SummaryDoneEvent { at: &at, text };
                            self.sink
                                .emit(out, "response.reasoning_summary_text.done", done);
                            let part = SummaryPartOut::text(text);
                            let done = SummaryPartEvent { at: &at, part };
                            self.sink
                                .emit(out, "response.reasoning_summary_part.done", done);
                        }
                        false => {
                            let done = ReasoningDoneEvent {
                                item_id,
                                output_index: index,
                                content_index: 0,
                                text,
                            };
                            self.sink.emit(out, "response.reasoning_text.done", done);
                            let part = PartOut::ReasoningText { text };
                            let done = PartEvent {
                                item_id,
                                output_index: index,
                                content_index: 0,
                                part,
                            };
                            self.sink.emit_wire(out, "response.content_part.done", done);
                        }
                    }
                }
                if let Some(upstream) = upstream {
                    *upstream_text = Some(upstream.text.clone());
                    summary.clone_from(&upstream.summary);
                    encrypted.clone_from(&upstream.encrypted);
                    // A round decoder may have streamed the summary as
                    // reasoning already; then it is not shown twice.
                    if !contains_in_order(text, summary) {
                        emit_summary(&mut self.sink, item_id, index, summary, out);
                    }
                }
                let shown = upstream_text.as_deref().unwrap_or(text);
                if encrypted.is_none() && self.context.carries_reasoning && !shown.is_empty() {
                    *encrypted = Some(own_encrypted(*note, shown));
                }
                // The text is the summary now, held once.
                if *summarized && summary.is_empty() && !text.is_empty() {
                    summary.push(std::mem::take(text));
                }
            }
            // Calls are finished as they are added.
            Body::FunctionCall { .. } | Body::CustomCall { .. } => {}
        }
        self.sink.emit_wire(
            out,
            "response.output_item.done",
            ItemEvent {
                output_index: index,
                item: self.output[index].wire(phase),
            },
        );
    }

    /// The Response object: `output` with every item finished, but for the
    /// one a failure cut off.
    fn response<'a>(
        &'a self,
        status: &'static str,
        incomplete: Option<&'static str>,
        usage: Option<Usage>,
        error: Option<ErrorOut<'a>>,
    ) -> ResponseOut<'a> {
        let echo = &self.context.echo;
        ResponseOut {
            id: &self.id,
            created_at: self.created_at,
            status,
            completed_at: (status == "completed").then(unix_now),
            error,
            incomplete_details: incomplete.map(|reason| IncompleteOut { reason }),
            instructions: echo.instructions.as_deref(),
            max_output_tokens: echo.max_output_tokens,
            model: &self.model,
            output: OutputList {
                items: &self.output,
                cut: self.open.or(self.cut),
            },
            parallel_tool_calls: echo.parallel_tool_calls,
            previous_response_id: echo.previous_response_id.as_deref(),
            prompt_cache_key: echo.prompt_cache_key.as_deref(),
            reasoning: Echoed(echo.reasoning.as_ref(), Echo::REASONING),
            safety_identifier: echo.safety_identifier.as_deref(),
            store: echo.store,
            temperature: echo.temperature,
            text: Echoed(echo.text.as_ref(), Echo::TEXT),
            tool_choice: Echoed(echo.tool_choice.as_ref(), Echo::TOOL_CHOICE),
            top_p: echo.top_p,
            truncation: Echoed(echo.truncation.as_ref(), Echo::TRUNCATION),
            usage: usage.map(UsageOut::from),
            user: echo.user.as_deref(),
            metadata: Echoed(echo.metadata.as_ref(), Echo::METADATA),
        }
    }
}

/// The encrypted content the proxy gives reasoning of its own: a note's
/// mark, or the model's text.
fn own_encrypted(note: bool, text: &str) -> String {
    match note {
        true => NOTE_ENCRYPTED.to_owned(),
        false => format!("{OWN_REASONING}{text}"),
    }
}

/// Announces summary parts not streamed before, each whole.
fn emit_summary(sink: &mut Sink, item_id: &str, index: usize, parts: &[String], out: &mut Vec<u8>) {
    for (summary_index, text) in parts.iter().enumerate() {
        let text = text.as_str();
        let at = SummaryAt {
            item_id,
            output_index: index,
            summary_index,
        };
        let part = SummaryPartOut::text;
        sink.emit(
            out,
            "response.reasoning_summary_part.added",
            SummaryPartEvent {
                at: &at,
                part: part(""),
            },
        );
        sink.emit(
            out,
            SUMMARY_DELTA,
            SummaryDeltaEvent {
                at: &at,
                delta: text,
            },
        );
        sink.emit(
            out,
            "response.reasoning_summary_text.done",
            SummaryDoneEvent { at: &at, text },
        );
        sink.emit(
            out,
            "response.reasoning_summary_part.done",
            SummaryPartEvent {
                at: &at,
                part: part(text),
            },
        );
    }
}

/// Whether every part occurs in `text`, in order (whatever lies between).
fn contains_in_order(text: &str, parts: &[String]) -> bool {
    let mut rest = text;
    parts.iter().all(|part| match rest.find(part.as_str()) {
        Some(at) => {
            rest = &rest[at + part.len()..];
            true
        }
        None => false,
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Encoder for ResponsesEncoder {
    fn streams(&self) -> bool {
        self.sink.stream
    }

    fn error_ends_stream(&self) -> bool {
        true
    }

    fn open(&mut self, out: &mut Vec<u8>) {
        if !self.sink.stream {
            return;
        }
        let mut sink = std::mem::take(&mut self.sink);
        let response = self.response("in_progress", None, None, None);
        // The same object in both events: serialized once.
        let written = json::to_string_with(|out| response.write(out));
        let response = json::Raw::written(&written);
        for kind in ["response.created", "response.in_progress"] {
            sink.emit(out, kind, ResponseEvent { response });
        }
        self.sink = sink;
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended {
            return;
        }
        let index = self.reasoning_index(None, false, out);
        self.reasoning_text(index, text, out);
    }

    fn note(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended {
            return;
        }
        let index = self.reasoning_index(None, true, out);
        self.reasoning_text(index, text, out);
    }

    /// A Responses upstream's summary streams as the item's summary, as
    /// OpenAI streams it (what Codex and the AI SDK show), unless the
    /// item's raw text began first.
    fn summary(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended {
            return;
        }
        let index = self.reasoning_index(None, false, out);
        if let Body::Reasoning {
            summarized, part, ..
        } = &mut self.output[index].body
        {
            *summarized |= !*part;
        }
        self.reasoning_text(index, text, out);
    }

    /// Finishes the open reasoning item with what the upstream completed
    /// (summary, encrypted content), or hands it on as a new item.
    fn reasoning_item(&mut self, item: &Reasoning, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let reasoning_open = self.open.is_some_and(|i| self.open_reasoning(i, false));
        if !reasoning_open {
            let index = self.reasoning_index(item.id.as_deref(), false, out);
            if !item.text.is_empty() {
                self.reasoning_text(index, &item.text, out);
            }
        }
        self.close(Some(item), out);
    }

    fn content(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() || self.ended {
            return;
        }
        let index = self.message(out);
        let item = &mut self.output[index];
        if let Body::Message { text: all } = &mut item.body {
            all.push_str(text);
        }
        self.sink.emit_delta(
            out,
            "response.output_text.delta",
            &item.id,
            index,
            text,
            true,
        );
    }

    fn continues(&self, channel: Channel) -> bool {
        self.open.is_some_and(|i| match channel {
            Channel::Text => matches!(self.output[i].body, Body::Message { .. }),
            Channel::Reasoning => self.open_reasoning(i, false),
            Channel::Note => self.open_reasoning(i, true),
        })
    }

    fn client_calls(&mut self, calls: &[ToolCall], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.close(None, out);
        for call in calls {
            // A flattened namespace function goes back under its own name.
            let (namespace, name) = match self.context.namespaced.get(&call.name) {
                Some((namespace, name)) => (Some(namespace.clone()), name.clone()),
                None => (None, call.name.clone()),
            };
            // The event after the item names it too.
            let shown = name.clone();
            let (id, body) = match call.kind {
                CallKind::Function => (
                    self.item_id("fc_"),
                    Body::FunctionCall {
                        call_id: call.id.clone(),
                        name,
                        namespace,
                        arguments: call.arguments.clone(),
                    },
                ),
                CallKind::Custom => (
                    self.item_id("ctc_"),
                    Body::CustomCall {
                        call_id: call.id.clone(),
                        name,
                        namespace,
                        input: call.arguments.clone(),
                    },
                ),
            };
            let index = self.add(id, body, out);
            let item_id = self.output[index].id.as_str();
            let whole = call.arguments.as_str();
            let (delta, done) = match call.kind {
                CallKind::Function => (
                    "response.function_call_arguments.delta",
                    "response.function_call_arguments.done",
                ),
                CallKind::Custom => (
                    "response.custom_tool_call_input.delta",
                    "response.custom_tool_call_input.done",
                ),
            };
            if !whole.is_empty() {
                self.sink.emit(
                    out,
                    delta,
                    CallDeltaEvent {
                        item_id,
                        output_index: index,
                        delta: whole,
                    },
                );
            }
            match call.kind {
                CallKind::Function => self.sink.emit(
                    out,
                    done,
                    ArgumentsDoneEvent {
                        item_id,
                        name: &shown,
                        output_index: index,
                        arguments: whole,
                    },
                ),
                CallKind::Custom => self.sink.emit(
                    out,
                    done,
                    InputDoneEvent {
                        item_id,
                        output_index: index,
                        input: whole,
                    },
                ),
            }
            self.sink.emit_wire(
                out,
                "response.output_item.done",
                ItemEvent {
                    output_index: index,
                    item: self.output[index].wire(Phase::Done),
                },
            );
        }
    }

    fn finish(&mut self, finish: Finish, usage: Usage, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let whole = matches!(finish, Finish::Stop | Finish::ToolCalls);
        self.close_as(None, if whole { Phase::Done } else { Phase::Cut }, out);
        self.ended = true;
        let (kind, status, incomplete) = match finish {
            Finish::Stop | Finish::ToolCalls => ("response.completed", "completed", None),
            Finish::Length => (
                "response.incomplete",
                "incomplete",
                Some("max_output_tokens"),
            ),
            Finish::ContentFilter => ("response.incomplete", "incomplete", Some("content_filter")),
        };
        if !self.sink.stream {
            // Sized for the texts and the envelope: one allocation, no regrowth.
            let texts = TextSize::of(self.output.iter().map(OutputItem::size_hint));
            out.reserve(1024 + texts.room());
        }
        let mut sink = std::mem::take(&mut self.sink);
        let keep = self.keep.take();
        let response = self.response(status, incomplete, Some(usage), None);
        write_end(&mut sink, kind, &response, out, keep, &self.id);
        self.sink = sink;
    }

    /// `response.failed`, its response carrying the error and the output so
    /// far; without a stream, that failed Response object as the body.
    fn stream_error(&mut self, status: u16, openai_error: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.ended = true;
        let parsed: Option<ErrorEnvelope> = serde_json::from_slice(openai_error).ok();
        let (code, message) = match &parsed {
            Some(ErrorEnvelope { error }) => (failure_code(error), error.message.as_deref()),
            None => ("server_error".to_owned(), None),
        };
        let message = message
            .map(str::to_owned)
            .unwrap_or_else(|| format!("upstream error {status}"));
        // The item cut off stays open: it goes out as `incomplete`.
        let mut sink = std::mem::take(&mut self.sink);
        let keep = self.keep.take();
        let response = self.response(
            "failed",
            None,
            None,
            Some(ErrorOut {
                code: &code,
                message: &message,
            }),
        );
        write_end(&mut sink, "response.failed", &response, out, keep, &self.id);
        self.sink = sink;
    }
}

/// The response's last bytes (its final event, or the Response object as
/// the body), and the Response object to `keep`, if one was given:
/// serialized once for both.
fn write_end(
    sink: &mut Sink,
    kind: &'static str,
    response: &ResponseOut<'_>,
    out: &mut Vec<u8>,
    keep: Option<Keep>,
    id: &str,
) {
    let Some(keep) = keep else {
        // The Response as the final event, or as the body.
        return match sink.stream {
            true => sink.emit_response(out, kind, response),
            false => response.write(out),
        };
    };
    // Written once when it is kept too.
    let kept = json::to_string_with(|out| response.write(out));
    match sink.stream {
        true => sink.emit(
            out,
            kind,
            ResponseEvent {
                response: json::Raw::written(&kept),
            },
        ),
        false => out.extend_from_slice(kept.as_bytes()),
    }
    keep(Finished {
        id,
        status: response.status,
        response: kept,
    });
}

/// The `code` of a failed response: the error's `code`, else its `type`.
/// llama.cpp's context overflow gets OpenAI's code, which clients such as
/// Codex act on.
fn failure_code(error: &ErrorIn<'_>) -> String {
    let code = match &error.code {
        Some(Value::String(code))
            if !code.is_empty() && !code.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(code.as_str())
        }
        _ => None,
    };
    match code.or(error.kind.as_deref()) {
        Some("exceed_context_size_error") => "context_length_exceeded".to_owned(),
        Some(code) => code.to_owned(),
        None => "server_error".to_owned(),
    }
}

// ------------------------------------------------------------- wire types

/// `[]`, for the lists the proxy never fills (annotations, logprobs, tools).
struct Empty;

impl Serialize for Empty {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_seq(Some(0))?.end()
    }
}

/// A request member echoed as sent, or its default (JSON text) when the
/// request left it out.
struct Echoed<'a>(Option<&'a Value>, &'static str);

impl Echoed<'_> {
    fn write(&self, object: &mut json::Object<'_>, name: &'static str) {
        match self.0 {
            Some(sent) => object.value(name, sent),
            None => object.raw(name, self.1),
        }
    }
}

/// Summary texts as `[{type: summary_text, text}]`.
struct SummaryList<'a>(&'a [String]);

impl Serialize for SummaryList<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|text| SummaryPartOut::text(text)))
    }
}

#[derive(Serialize)]
struct SummaryPartOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

impl<'a> SummaryPartOut<'a> {
    fn text(text: &'a str) -> Self {
        SummaryPartOut {
            kind: "summary_text",
            text,
        }
    }
}

#[derive(Serialize)]
struct ResponseEvent<T> {
    response: T,
}

struct ItemEvent<'a> {
    output_index: usize,
    item: ItemOut<'a>,
}

impl Wire for ItemEvent<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.u64("output_index", self.output_index as u64);
        self.item.write(o.name("item"));
        o.end();
    }
}

struct PartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    part: PartOut<'a>,
}

impl Wire for PartEvent<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.value("item_id", self.item_id);
        o.u64("output_index", self.output_index as u64);
        o.u64("content_index", self.content_index.into());
        self.part.write(o.name("part"));
        o.end();
    }
}

#[derive(Serialize)]
struct TextDoneEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    text: &'a str,
    logprobs: Empty,
}

#[derive(Serialize)]
struct ReasoningDoneEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    text: &'a str,
}

#[derive(Serialize)]
struct SummaryAt<'a> {
    item_id: &'a str,
    output_index: usize,
    summary_index: usize,
}

impl<'a> SummaryAt<'a> {
    /// The first summary part of item `output_index`.
    fn first(item_id: &'a str, output_index: usize) -> Self {
        SummaryAt {
            item_id,
            output_index,
            summary_index: 0,
        }
    }
}

#[derive(Serialize)]
struct SummaryPartEvent<'a> {
    #[serde(flatten)]
    at: &'a SummaryAt<'a>,
    part: SummaryPartOut<'a>,
}

#[derive(Serialize)]
struct SummaryDeltaEvent<'a> {
    #[serde(flatten)]
    at: &'a SummaryAt<'a>,
    delta: &'a str,
}

#[derive(Serialize)]
struct SummaryDoneEvent<'a> {
    #[serde(flatten)]
    at: &'a SummaryAt<'a>,
    text: &'a str,
}

#[derive(Serialize)]
struct CallDeltaEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    delta: &'a str,
}

#[derive(Serialize)]
struct ArgumentsDoneEvent<'a> {
    item_id: &'a str,
    name: &'a str,
    output_index: usize,
    arguments: &'a str,
}

#[derive(Serialize)]
struct InputDoneEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    input: &'a str,
}

/// A content part (`type` first, as serde writes an internally tagged enum).
enum PartOut<'a> {
    OutputText { text: &'a str },
    ReasoningText { text: &'a str },
}

impl PartOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        match self {
            PartOut::OutputText { text } => {
                o.plain("type", "output_text");
                o.value("text", *text);
                o.raw("annotations", "[]");
                o.raw("logprobs", "[]");
            }
            PartOut::ReasoningText { text } => {
                o.plain("type", "reasoning_text");
                o.value("text", *text);
            }
        }
        o.end();
    }
}

/// An output item (`type` first, as serde writes an internally tagged enum).
enum ItemOut<'a> {
    Message {
        id: &'a str,
        status: &'static str,
        /// None while the message is being added.
        content: Option<PartOut<'a>>,
    },
    Reasoning {
        id: &'a str,
        summary: SummaryList<'a>,
        content: Option<PartOut<'a>>,
        encrypted_content: Option<&'a str>,
    },
    /// A `function_call` (its `arguments` and `status`), or a
    /// `custom_tool_call` (its `input`).
    Call {
        custom: bool,
        id: &'a str,
        call_id: &'a str,
        name: &'a str,
        namespace: Option<&'a str>,
        payload: &'a str,
        status: &'static str,
    },
}

impl ItemOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        /// `content`: a list of no part or one.
        fn content(o: &mut json::Object<'_>, part: Option<&PartOut<'_>>) {
            o.list("content", part, |out, part| part.write(out));
        }
        let mut o = json::Object::new(out);
        match self {
            ItemOut::Message {
                id,
                status,
                content: part,
            } => {
                o.plain("type", "message");
                o.value("id", *id);
                o.plain("status", status);
                o.plain("role", "assistant");
                content(&mut o, part.as_ref());
            }
            ItemOut::Reasoning {
                id,
                summary,
                content: part,
                encrypted_content,
            } => {
                o.plain("type", "reasoning");
                o.value("id", *id);
                o.value("summary", summary);
                if part.is_some() {
                    content(&mut o, part.as_ref());
                }
                o.optional("encrypted_content", *encrypted_content);
            }
            ItemOut::Call {
                custom,
                id,
                call_id,
                name,
                namespace,
                payload,
                status,
            } => {
                o.plain(
                    "type",
                    if *custom {
                        "custom_tool_call"
                    } else {
                        "function_call"
                    },
                );
                o.value("id", *id);
                o.value("call_id", *call_id);
                o.value("name", *name);
                o.optional("namespace", *namespace);
                match custom {
                    true => o.value("input", *payload),
                    false => o.value("arguments", *payload),
                }
                // Both kinds, as OpenAI's own: the AI SDK's stream schema
                // requires it on a custom call, or drops the call.
                o.plain("status", status);
            }
        }
        o.end();
    }
}

/// The items in `output`: finished, but for the one a failure cut off.
struct OutputList<'a> {
    items: &'a [OutputItem],
    cut: Option<usize>,
}

impl OutputList<'_> {
    fn write(&self, o: &mut json::Object<'_>) {
        o.list("output", self.items.iter().enumerate(), |out, (i, item)| {
            let phase = match self.cut == Some(i) {
                true => Phase::Cut,
                false => Phase::Done,
            };
            item.wire(phase).write(out);
        });
    }
}

/// The Response object. Written by hand ([`ResponseOut::write`]): its
/// ~40 member names are constants, and through serde each was escaped as any
/// string.
struct ResponseOut<'a> {
    id: &'a str,
    created_at: u64,
    status: &'static str,
    completed_at: Option<u64>,
    error: Option<ErrorOut<'a>>,
    incomplete_details: Option<IncompleteOut>,
    instructions: Option<&'a str>,
    max_output_tokens: Option<u64>,
    model: &'a str,
    output: OutputList<'a>,
    parallel_tool_calls: bool,
    previous_response_id: Option<&'a str>,
    prompt_cache_key: Option<&'a str>,
    reasoning: Echoed<'a>,
    safety_identifier: Option<&'a str>,
    store: bool,
    temperature: Option<f64>,
    text: Echoed<'a>,
    tool_choice: Echoed<'a>,
    top_p: Option<f64>,
    truncation: Echoed<'a>,
    usage: Option<UsageOut>,
    user: Option<&'a str>,
    metadata: Echoed<'a>,
}

impl ResponseOut<'_> {
    /// Its members in the order OpenAI writes them.
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.value("id", self.id);
        o.plain("object", "response");
        o.u64("created_at", self.created_at);
        o.plain("status", self.status);
        if let Some(at) = self.completed_at {
            o.u64("completed_at", at);
        }
        o.raw("background", "false");
        match &self.error {
            Some(error) => {
                let mut e = o.object("error");
                e.value("code", error.code);
                e.value("message", error.message);
                e.end();
            }
            None => o.raw("error", "null"),
        }
        match &self.incomplete_details {
            Some(details) => {
                let mut d = o.object("incomplete_details");
                d.plain("reason", details.reason);
                d.end();
            }
            None => o.raw("incomplete_details", "null"),
        }
        o.value("instructions", &self.instructions);
        o.value("max_output_tokens", &self.max_output_tokens);
        o.value("model", self.model);
        self.output.write(&mut o);
        o.bool("parallel_tool_calls", self.parallel_tool_calls);
        o.value("previous_response_id", &self.previous_response_id);
        o.value("prompt_cache_key", &self.prompt_cache_key);
        self.reasoning.write(&mut o, "reasoning");
        o.value("safety_identifier", &self.safety_identifier);
        o.bool("store", self.store);
        o.value("temperature", &self.temperature);
        self.text.write(&mut o, "text");
        self.tool_choice.write(&mut o, "tool_choice");
        // The client's tools are not repeated: no SDK reads them back, and
        // Codex's are tens of kilobytes, thrice per response.
        o.raw("tools", "[]");
        o.value("top_p", &self.top_p);
        self.truncation.write(&mut o, "truncation");
        match &self.usage {
            Some(usage) => usage.write(o.object("usage")),
            None => o.raw("usage", "null"),
        }
        o.value("user", &self.user);
        self.metadata.write(&mut o, "metadata");
        o.end();
    }
}

struct ErrorOut<'a> {
    code: &'a str,
    message: &'a str,
}

struct IncompleteOut {
    reason: &'static str,
}

struct UsageOut {
    input_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    reasoning_tokens: u64,
    total_tokens: u64,
}

impl UsageOut {
    fn write(&self, mut o: json::Object<'_>) {
        o.u64("input_tokens", self.input_tokens);
        let mut details = json::Object::new(o.name("input_tokens_details"));
        details.u64("cached_tokens", self.cached_tokens);
        // Required by the SDKs' usage type, though OpenAI's docs omit it.
        details.raw("cache_write_tokens", "0");
        details.end();
        o.u64("output_tokens", self.output_tokens);
        let mut details = json::Object::new(o.name("output_tokens_details"));
        details.u64("reasoning_tokens", self.reasoning_tokens);
        details.end();
        o.u64("total_tokens", self.total_tokens);
        o.end();
    }
}

impl From<Usage> for UsageOut {
    fn from(usage: Usage) -> Self {
        UsageOut {
            input_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            output_tokens: usage.completion_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            total_tokens: usage
                .total_tokens
                .max(usage.prompt_tokens + usage.completion_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Description;
    use crate::front::known_tools;

    #[test]
    fn a_streamed_delta_is_what_the_delta_writer_writes() {
        let mut sink = Sink {
            stream: true,
            ..Sink::default()
        };
        for (kind, item, index, logprobs) in [
            ("response.output_text.delta", "msg_1", 0, true),
            ("response.reasoning_text.delta", "rs_2", 1, false),
            ("response.output_text.delta", "msg_3", 2, true),
        ] {
            for text in ["", "x", "a\"b\\\n\u{1}é ✓"] {
                let sequence = sink.sequence;
                let (mut ours, mut written) = (Vec::new(), Vec::new());
                sink.emit_delta(&mut ours, kind, item, index, text, logprobs);
                write_delta(&mut written, kind, sequence, item, index, text, logprobs);
                assert_eq!(
                    String::from_utf8_lossy(&ours),
                    String::from_utf8_lossy(&written)
                );
            }
            assert!(sink
                .delta
                .as_ref()
                .is_some_and(|d| d.cut.is_cut() && d.item_id == item));
        }
        assert_eq!(sink.sequence, 9);
    }

    const CODEX_ROUND1: &[u8] =
        include_bytes!("../../tests/fixtures/clients/codex-0.169.0-round1.request.json");
    const CODEX_ROUND2: &[u8] =
        include_bytes!("../../tests/fixtures/clients/codex-0.169.0-round2.request.json");

    fn decode_json(body: Value) -> Result<(Conversation, Box<Context>), ApiError> {
        decode(&serde_json::to_vec(&body).unwrap())
    }

    fn text(role: Role, text: &str) -> Item {
        Item::Message(Message::text(role, text))
    }

    #[test]
    fn a_history_decodes_the_same_from_the_items_decoded_before() {
        // A thread of its own: its kept items are this test's.
        crate::on_a_new_thread(a_history_decodes_the_same_on_this_thread);
    }

    fn a_history_decodes_the_same_on_this_thread() {
        let long = |what: &str| format!("{what}: ").repeat(40);
        let developer = json!({"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": long("sandbox")}]});
        let round = |i: usize| {
            vec![
                json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": long("plan")}],
                    "encrypted_content": format!("gAAA{i}")}),
                json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "shell",
                    "arguments": serde_json::to_string(&json!({"command": ["sed", "-n", long("1,9p")]})).unwrap()}),
                json!({"type": "function_call_output", "call_id": format!("call_{i}"),
                    "output": long("line")}),
            ]
        };
        // A call in a namespace no tool declares: the name it is given is
        // added to the request's, so its item is decoded every time.
        let namespaced = json!({"type": "function_call", "call_id": "call_ns", "name": "get",
            "namespace": "mcp__files", "arguments": long("{}")});
        let turn = |n: usize| {
            let mut input = vec![
                developer.clone(),
                json!({"role": "user", "content": long("fix it")}),
            ];
            input.push(namespaced.clone());
            (0..n).for_each(|i| input.extend(round(i)));
            json!({"model": "m", "input": input, "instructions": "Be brief.", "store": false})
        };
        let fresh = |body: Value| {
            crate::on_a_new_thread(move || format!("{:?}", decode_json(body).unwrap()))
        };
        for n in 1..4 {
            let decoded = decode_json(turn(n)).unwrap();
            assert_eq!(format!("{decoded:?}"), fresh(turn(n)), "turn {n}");
            let (conv, ctx) = decoded;
            // The developer message leads: it is the system prompt.
            let system = conv.system.unwrap().text().into_owned();
            assert!(system.starts_with("Be brief.\n\nsandbox: "), "{system}");
            assert!(ctx.namespaced.contains_key("mcp__files__get"));
        }
        let body = serde_json::to_string(&turn(3)).unwrap();
        let kept = |item: &Value| {
            let rest = &body[body.find(&item.to_string()).unwrap()..];
            let head = crate::front::known_entries::head(rest.as_bytes()).unwrap();
            crate::front::known_entries::find(Dialect::Responses, head, rest).is_some()
        };
        assert!(kept(&developer) && round(0).iter().all(kept));
        assert!(!kept(&namespaced));
        // Where a tool declares the namespace, the call's item is still
        // decoded each time: a later request may no longer declare it.
        let tools = json!([{"type": "namespace", "name": "mcp__files", "description": "Files.",
            "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}]}]);
        let mut declared = turn(1);
        declared["tools"] = tools;
        assert!(decode_json(declared)
            .unwrap()
            .1
            .namespaced
            .contains_key("mcp__files__get"));
        assert!(!kept(&namespaced));
        let (_, ctx) = decode_json(turn(1)).unwrap();
        assert!(ctx.namespaced.contains_key("mcp__files__get"));
        // A history's developer message after its first item is not the
        // system prompt, kept or not.
        let mut late = turn(2);
        late["input"].as_array_mut().unwrap().swap(0, 1);
        let (conv, _) = decode_json(late.clone()).unwrap();
        assert_eq!(
            format!("{:?}", decode_json(late.clone()).unwrap()),
            fresh(late)
        );
        assert_eq!(conv.system.unwrap().text(), "Be brief.");
    }

    fn call(id: &str, name: &str, arguments: &str, kind: CallKind) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            kind,
        }
    }

    /// Parses a stream, checking the framing: every event named as its
    /// `type`, numbered from 0 without gaps.
    fn events(bytes: &[u8]) -> Vec<Value> {
        let mut parser = crate::sse::Parser::new(1 << 24);
        parser.feed(bytes);
        let mut all: Vec<Value> = Vec::new();
        while let Some(event) = parser.next_event().unwrap() {
            let data: Value = serde_json::from_slice(&event.data).unwrap();
            assert_eq!(event.name.as_deref(), data["type"].as_str(), "{data}");
            assert_eq!(data["sequence_number"], all.len(), "{data}");
            all.push(data);
        }
        assert!(
            parser.finish().is_none(),
            "the stream ends with a whole event"
        );
        all
    }

    fn kinds(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    /// The items of the `output_item.done` events, in order.
    fn done_items(events: &[Value]) -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| e["item"].clone())
            .collect()
    }

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
            ..Usage::default()
        }
    }

    fn streaming(context: Context) -> ResponsesEncoder {
        ResponsesEncoder::new("coder", true, context)
    }

    // ------------------------------------------------------------ decode

    #[test]
    fn string_input_is_one_user_message() {
        let (conv, ctx) =
            decode_json(json!({"model": "coder", "input": "hi", "instructions": "Be brief."}))
                .unwrap();
        assert_eq!(conv.origin, Dialect::Responses);
        assert_eq!(conv.model.as_deref(), Some("coder"));
        assert_eq!(conv.system_text().as_deref(), Some("Be brief."));
        assert_eq!(conv.items, vec![text(Role::User, "hi")]);
        assert!(!conv.options.stream);
        assert!(conv.extra.is_empty(), "{:?}", conv.extra);
        assert_eq!(ctx.echo.instructions.as_deref(), Some("Be brief."));
        assert!(ctx.dropped_tools.is_empty());
    }

    #[test]
    fn every_input_item_form() {
        let (conv, ctx) = decode_json(json!({
            "model": "coder",
            "instructions": "First.",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Second."}]},
                {"role": "system", "content": "Third."},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
                    {"type": "input_image", "file_id": "file-1"},
                    {"type": "input_file", "file_id": "file-2"}
                ]},
                {"type": "item_reference", "id": "msg_old"},
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "phase": "commentary",
                 "content": [{"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []},
                             {"type": "refusal", "refusal": "Not that."}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "S1"}, {"type": "summary_text", "text": "S2"}],
                 "content": [{"type": "reasoning_text", "text": "thinking"}], "encrypted_content": "ENC"},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "spawn_agent", "namespace": "agents", "arguments": "{\"a\":1}", "status": "completed"},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}]},
                {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done."},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                {"type": "developer", "role": "developer", "content": "ignored: unknown type"},
                {"role": "developer", "content": "Later."}
            ]
        }))
        .unwrap();
        assert_eq!(
            conv.system_text().as_deref(),
            Some("First.\n\nSecond.\n\nThird.")
        );
        let mut assistant = Message {
            role: Role::Assistant,
            content: vec![Part::Text("Sure.".into()), Part::Text("Not that.".into())],
            extra: Map::new(),
        };
        assistant.extra.insert("phase".into(), json!("commentary"));
        let expected = vec![
            Item::Message(Message {
                role: Role::User,
                content: vec![
                    Part::Text("look".into()),
                    Part::Image {
                        url: "data:image/png;base64,AA".into(),
                        detail: Some("low".into()),
                    },
                    Part::Other(json!({"type": "input_image", "file_id": "file-1"})),
                    Part::File(FilePart {
                        id: Some("file-2".into()),
                        ..FilePart::default()
                    }),
                ],
                extra: Map::new(),
            }),
            Item::Message(assistant),
            Item::Reasoning(Reasoning {
                id: Some("rs_1".into()),
                text: "thinking".into(),
                summary: vec!["S1".into(), "S2".into()],
                encrypted: Some("ENC".into()),
            }),
            Item::ToolCall(call(
                "c1",
                "agents__spawn_agent",
                "{\"a\":1}",
                CallKind::Function,
            )),
            Item::ToolResult(ToolResult {
                call_id: "c1".into(),
                output: "one\ntwo".into(),
                is_error: false,
                attachments: Vec::new(),
            }),
            Item::ToolCall(call(
                "c2",
                "apply_patch",
                "*** Begin Patch",
                CallKind::Custom,
            )),
            Item::ToolResult(ToolResult {
                call_id: "c2".into(),
                output: "Done.".into(),
                is_error: false,
                attachments: Vec::new(),
            }),
            text(Role::System, "Later."),
        ];
        assert_eq!(conv.items, expected);
        assert_eq!(
            ctx.namespaced.get("agents__spawn_agent"),
            Some(&("agents".to_owned(), "spawn_agent".to_owned()))
        );
    }

    #[test]
    fn a_function_schema_goes_on_as_the_client_wrote_it() {
        let schema = r#"{"type":"object","required":["b","a"],"properties":{"b":{"type":"string","description":"caf\u00e9"},"a":{"type":"number","maximum":1.50}}}"#;
        let body = format!(
            r#"{{"model":"m","input":"hi","tools":[{{"type":"function","name":"T","description":"caf\u00e9\n","parameters":{schema}}},{{"type":"custom","name":"C","parameters":{{"kept":true}}}}]}}"#
        );
        let (conv, _) = decode(body.as_bytes()).unwrap();
        let out = String::from_utf8(crate::round::chat::encode(&conv, false)).unwrap();
        assert!(out.contains(&format!(r#""parameters":{schema}"#)), "{out}");
        assert!(out.contains(r#""description":"caf\u00e9\n","#), "{out}");
        // To a Responses upstream as well.
        let out = crate::round::responses::encode(&conv, false);
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(r#""description":"caf\u00e9\n","#), "{out}");
        // A custom tool's own `parameters` is not its schema: kept with it.
        assert_eq!(conv.tools[1].extra["parameters"], json!({"kept": true}));
        for (tools, message) in [
            (json!("T"), "tools must be an array."),
            (
                json!([{"type": "function", "name": "T"}, []]),
                "tools[1] must be an object.",
            ),
            (
                json!([{"type": "namespace", "name": "n"}]),
                "tools[0].tools must be an array.",
            ),
            (
                json!([{"type": "namespace", "name": "n", "tools": {"type": "function"}}]),
                "tools[0].tools must be an array.",
            ),
            (
                json!([{"type": "namespace", "name": "n", "tools": [3]}]),
                "tools[0].tools[0] must be an object.",
            ),
        ] {
            let error = decode_json(json!({"input": "hi", "tools": tools})).unwrap_err();
            assert_eq!(error.message, message);
        }
    }

    #[test]
    fn tools_are_flattened_and_hosted_ones_dropped() {
        let (conv, ctx) = decode_json(json!({
            "input": "hi",
            "tools": [
                {"type": "function", "name": "exec", "description": "Run.", "strict": false,
                 "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
                {"type": "custom", "name": "apply_patch", "description": "Patch.",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
                {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                    {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}},
                    {"type": "custom", "name": "note"}
                ]},
                {"type": "web_search", "external_web_access": true},
                {"type": "file_search", "vector_store_ids": []},
                {"type": "web_search"}
            ]
        }))
        .unwrap();
        let names: Vec<&str> = conv.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["exec", "apply_patch", "agents__spawn", "agents__note"]
        );
        assert_eq!(ctx.dropped_tools, ["web_search", "file_search"]);

        let exec = &conv.tools[0];
        assert_eq!(exec.kind, CallKind::Function);
        assert_eq!(
            exec.description.as_ref().map(Description::text),
            Some("Run.".into())
        );
        assert_eq!(
            exec.parameters.to_value()["properties"]["cmd"]["type"],
            "string"
        );
        assert_eq!(
            exec.extra,
            json!({"strict": false}).as_object().unwrap().clone()
        );

        let patch = &conv.tools[1];
        assert_eq!(patch.kind, CallKind::Custom);
        assert_eq!(
            patch.parameters.to_value(),
            json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]})
        );
        assert_eq!(patch.extra["format"]["syntax"], "lark");
        assert_eq!(conv.tools[3].kind, CallKind::Custom);
        assert_eq!(
            ctx.namespaced.get("agents__note"),
            Some(&("agents".to_owned(), "note".to_owned()))
        );
    }

    #[test]
    fn a_string_input_is_kept_as_the_one_message_it_stands_for() {
        let kept = Input::new(Some(json!("Hi\n\"there\""))).unwrap().kept();
        let kept: Value = serde_json::from_slice(&kept).unwrap();
        let id = kept[0]["id"].as_str().unwrap();
        assert!(id.starts_with("msg_") && id.len() == 36, "{id}");
        assert_eq!(
            kept,
            json!([{"type": "message", "role": "user", "id": id,
                    "content": [{"type": "input_text", "text": "Hi\n\"there\""}]}])
        );
        // A later turn replays the kept item: it reads as the string did.
        let (as_sent, _) = decode_json(json!({"model": "m", "input": "Hi\n\"there\""})).unwrap();
        let (replayed, _) = decode_json(json!({"model": "m", "input": kept})).unwrap();
        assert_eq!(as_sent.items, replayed.items);
        // Kept items keep theirs, and get one where they have none.
        let given = json!([
            {"role": "user", "content": "a", "id": "msg_mine"},
            {"type": "function_call_output", "call_id": "c", "output": "x", "id": null},
        ]);
        let items = Input::new(Some(given.clone())).unwrap();
        assert_eq!(items.count(), 2);
        let kept: Value = serde_json::from_slice(&items.kept()).unwrap();
        assert_eq!(kept[0], given[0]);
        let id = kept[1]["id"].as_str().unwrap();
        assert!(id.starts_with("fco_") && id.len() == 36, "{id}");
        let mut with_id = given[1].clone();
        with_id["id"] = id.into();
        assert_eq!(kept[1], with_id);
        // Not kept, they go on as sent.
        assert_eq!(Value::Array(items.into_items()), given);
        // Behind earlier items, a string reads as it does alone.
        let behind = Input::new(Some(json!("Hi\n\"there\"")))
            .unwrap()
            .into_items();
        let (chained, _) = decode_json(json!({"model": "m", "input": behind})).unwrap();
        assert_eq!(as_sent.items, chained.items);
    }

    #[test]
    fn a_namespace_s_schemas_go_on_as_sent_and_only_it_has_tools() {
        // As the client wrote them (spacing, key order), as top-level ones.
        let body = br#"{"input": "hi", "tools": [
            {"type": "namespace", "name": "n", "tools": [
                {"type": "function", "name": "f", "parameters": {"type":"object", "properties": {"z": {}, "a": {}}}}
            ]},
            {"type": "function", "name": "g", "tools": [1, {"x": null, "parameters": {"a": [true]}}]},
            {"type": "function", "name": "h", "tools": "none"}
        ]}"#;
        let (conv, _) = decode(body).unwrap();
        let sent = r#"{"type":"object", "properties": {"z": {}, "a": {}}}"#;
        let kept = &conv.tools[0].parameters;
        assert_eq!(kept.json_len(), sent.len());
        assert_eq!(
            kept.to_value(),
            serde_json::from_str::<Value>(sent).unwrap()
        );
        // Not a namespace: its `tools` is just another member, kept.
        assert_eq!(
            conv.tools[1].extra["tools"],
            json!([1, {"x": null, "parameters": {"a": [true]}}])
        );
        assert_eq!(conv.tools[2].extra["tools"], "none");
    }

    #[test]
    fn options_are_mapped_and_the_rest_kept() {
        let (conv, ctx) = decode_json(json!({
            "model": "coder", "input": "hi", "stream": true,
            "max_output_tokens": 100, "temperature": 0.5, "top_p": 0.9,
            "tool_choice": {"type": "function", "name": "exec"}, "parallel_tool_calls": false,
            "reasoning": {"effort": "high", "summary": "auto", "context": "all_turns"},
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}, "verbosity": "low"},
            "user": "u1", "metadata": {"k": "v"}, "store": false, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "pk", "client_metadata": {"a": "b"}, "truncation": "auto",
            "service_tier": "flex", "safety_identifier": "sid", "x_unknown": 1,
            "previous_response_id": null, "background": false, "conversation": null
        }))
        .unwrap();
        let o = &conv.options;
        assert!(o.stream && o.include_usage);
        assert_eq!(o.max_tokens, Some(100));
        assert_eq!((o.temperature, o.top_p), (Some(0.5), Some(0.9)));
        assert_eq!(o.tool_choice, Some(ToolChoice::Function("exec".into())));
        assert_eq!(o.parallel_tool_calls, Some(false));
        assert_eq!(o.reasoning_effort.as_deref(), Some("high"));
        assert_eq!(o.reasoning_summary.as_deref(), Some("auto"));
        assert_eq!(
            o.format,
            Some(Format::JsonSchema(
                json!({"name": "out", "schema": {"type": "object"}, "strict": true})
            ))
        );
        assert_eq!(o.user.as_deref(), Some("u1"));

        let mut keys: Vec<&str> = conv.extra.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "client_metadata",
                "include",
                "metadata",
                "prompt_cache_key",
                "reasoning",
                "safety_identifier",
                "service_tier",
                "store",
                "text",
                "truncation",
                "x_unknown"
            ]
        );
        assert_eq!(conv.extra["text"], json!({"verbosity": "low"}));
        assert_eq!(conv.extra["reasoning"], json!({"context": "all_turns"}));

        let echo = &ctx.echo;
        assert_eq!(echo.metadata, Some(json!({"k": "v"})));
        assert_eq!(
            echo.tool_choice,
            Some(json!({"type": "function", "name": "exec"}))
        );
        assert!(!echo.parallel_tool_calls && !echo.store);
        assert_eq!(echo.max_output_tokens, Some(100));
        assert_eq!(echo.text.as_ref().unwrap()["verbosity"], "low");
        assert_eq!(echo.reasoning.as_ref().unwrap()["effort"], "high");
        assert_eq!(echo.truncation, Some(json!("auto")));
        assert_eq!(echo.prompt_cache_key.as_deref(), Some("pk"));
        assert_eq!(echo.user.as_deref(), Some("u1"));
    }

    #[test]
    fn tool_choice_and_format_forms() {
        let choice = |v: Value| {
            decode_json(json!({"input": "hi", "tool_choice": v}))
                .unwrap()
                .0
                .options
                .tool_choice
        };
        assert_eq!(choice(json!("auto")), Some(ToolChoice::Auto));
        assert_eq!(choice(json!("none")), Some(ToolChoice::None));
        assert_eq!(choice(json!("required")), Some(ToolChoice::Required));
        assert_eq!(
            choice(json!({"type": "custom", "name": "apply_patch"})),
            Some(ToolChoice::Function("apply_patch".into()))
        );
        assert_eq!(
            choice(json!({"type": "allowed_tools", "mode": "required", "tools": []})),
            Some(ToolChoice::Required)
        );
        assert_eq!(choice(json!({"type": "web_search_preview"})), None);

        let format = |v: Value| {
            decode_json(json!({"input": "hi", "text": {"format": v}}))
                .unwrap()
                .0
                .options
                .format
        };
        assert_eq!(
            format(json!({"type": "json_object"})),
            Some(Format::JsonObject)
        );
        assert_eq!(format(json!({"type": "text"})), None);
    }

    #[test]
    fn stateful_and_malformed_requests_are_400_with_param() {
        let param = |body: Value| {
            let e = decode_json(body).unwrap_err();
            assert_eq!((e.status, e.kind), (400, "invalid_request_error"), "{e}");
            e.param.map(|p| p.into_owned())
        };
        let e = decode_json(json!({"input": "hi", "previous_response_id": "resp_1"})).unwrap_err();
        assert!(e.message.contains("keeps no responses"), "{e}");
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        assert_eq!(
            param(json!({"input": "hi", "background": true})).as_deref(),
            Some("background")
        );
        assert_eq!(
            param(json!({"input": "hi", "conversation": "conv_1"})).as_deref(),
            Some("conversation")
        );
        for input in [json!(null), json!(""), json!([])] {
            assert_eq!(param(json!({"input": input})).as_deref(), Some("input"));
        }
        assert_eq!(param(json!({"model": "m"})).as_deref(), Some("input"));
        assert_eq!(param(json!({"input": 3})).as_deref(), Some("input"));
        assert_eq!(param(json!({"input": ["hi"]})).as_deref(), Some("input[0]"));
        assert_eq!(
            param(json!({"input": [{"content": "no role or type"}]})).as_deref(),
            Some("input[0].type")
        );
        assert_eq!(
            param(json!({"input": [{"type": "message", "content": "x"}]})).as_deref(),
            Some("input[0].role")
        );
        assert_eq!(
            param(json!({"input": [{"role": "tool", "content": "x"}]})).as_deref(),
            Some("input[0].role")
        );
        assert_eq!(
            param(json!({"input": [{"role": "user", "content": 1}]})).as_deref(),
            Some("input[0].content")
        );
        assert_eq!(
            param(json!({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}))
                .as_deref(),
            Some("input[0].content[0].text")
        );
        assert_eq!(
            param(json!({"input": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "input_text", "text": "b"}, {"type": "input_text"}]},
            ]}))
            .as_deref(),
            Some("input[1].content[1].text")
        );
        assert_eq!(
            param(json!({"input": "hi", "tools": [
                {"type": "function", "name": "f"},
                {"type": "namespace", "name": "n", "tools": [{"type": "function", "name": "g"}, {"type": "function"}]},
            ]}))
            .as_deref(),
            Some("tools[1].tools[1].name")
        );
        assert_eq!(
            param(json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}))
                .as_deref(),
            Some("input[0].call_id")
        );
        assert_eq!(
            param(json!({"input": [{"type": "function_call_output", "call_id": "c"}]})).as_deref(),
            Some("input[0].output")
        );
        assert_eq!(
            param(json!({"input": [{"type": "reasoning", "summary": "x"}]})).as_deref(),
            Some("input[0].summary")
        );
        assert_eq!(
            param(json!({"input": "hi", "tools": {"type": "function"}})).as_deref(),
            Some("tools")
        );
        assert_eq!(
            param(json!({"input": "hi", "tools": [{"type": "function"}]})).as_deref(),
            Some("tools[0].name")
        );
        assert_eq!(
            param(json!({"input": "hi", "tool_choice": "sometimes"})).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            param(json!({"input": "hi", "max_output_tokens": -1})).as_deref(),
            Some("max_output_tokens")
        );
        assert_eq!(
            param(json!({"input": "hi", "model": 7})).as_deref(),
            Some("model")
        );
        let e = decode(b"{\"input\": ").unwrap_err();
        assert_eq!((e.status, e.param), (400, None));
        assert_eq!(decode(b"[1]").unwrap_err().status, 400);
    }

    #[test]
    fn tools_known_from_an_earlier_request_decode_as_read_afresh() {
        // A thread of its own: nothing known yet.
        let fresh = crate::on_a_new_thread(|| decode(CODEX_ROUND2).unwrap());
        let (_, ctx) = decode(CODEX_ROUND1).unwrap();
        let body = std::str::from_utf8(CODEX_ROUND2).unwrap();
        let tools = body.find("\"tools\":").unwrap() + "\"tools\":".len();
        assert!(known_tools::find(Dialect::Responses, body[tools..].trim_start()).is_some());
        let (known, known_ctx) = decode(CODEX_ROUND2).unwrap();
        assert_eq!(format!("{known:?}"), format!("{:?}", fresh.0));
        assert_eq!(known_ctx.namespaced, fresh.1.namespaced);
        assert_eq!(known_ctx.dropped_tools, fresh.1.dropped_tools);
        assert!(!ctx.namespaced.is_empty());
        // A list that differs from the known text is read anew.
        let mut other: Value = serde_json::from_slice(CODEX_ROUND2).unwrap();
        other["tools"].as_array_mut().unwrap().remove(0);
        let other = serde_json::to_vec(&other).unwrap();
        let (fewer, _) = decode(&other).unwrap();
        let fresh = crate::on_a_new_thread(move || decode(&other).unwrap());
        assert_eq!(format!("{fewer:?}"), format!("{:?}", fresh.0));
        assert!(fewer.tools.len() < known.tools.len());
    }

    #[test]
    fn codex_requests_decode_and_round_two_extends_round_one() {
        let (one, ctx) = decode(CODEX_ROUND1).unwrap();
        let (two, ctx2) = decode(CODEX_ROUND2).unwrap();
        assert_eq!(one.model.as_deref(), Some("gpt-5-codex"));
        assert!(one.options.stream);
        assert_eq!(one.options.tool_choice, Some(ToolChoice::Auto));
        assert_eq!(one.options.parallel_tool_calls, Some(true));
        assert_eq!(one.options.reasoning_summary.as_deref(), Some("auto"));
        // Both developer messages lead: the system prompt.
        let system = one.system_text().unwrap();
        assert!(system.starts_with("You are a coding agent running in the Codex CLI"));
        assert!(system.contains("<skills_instructions>"));
        assert_eq!(one.items.len(), 2);
        assert!(
            matches!(&one.items[0], Item::Message(m) if m.role == Role::User
            && m.text_content().starts_with("<environment_context>"))
        );
        assert_eq!(
            one.items[1],
            text(Role::User, "CODEX-SHELL: run the check command.")
        );

        assert_eq!(two.system, one.system);
        assert_eq!(two.items[..2], one.items[..]);
        assert_eq!(
            two.items[2..],
            [
                Item::Reasoning(Reasoning {
                    id: Some("rs_mock1795443323559".into()),
                    text: String::new(),
                    summary: vec!["Let me think.".into()],
                    encrypted: Some("ENC-1".into()),
                }),
                Item::ToolCall(call(
                    "call_mock1",
                    "exec_command",
                    "{\"cmd\": \"echo CODEX-RAN\"}",
                    CallKind::Function
                )),
                Item::ToolResult(ToolResult {
                    call_id: "call_mock1".into(),
                    output: "Chunk ID: 395f41\nWall time: 0.0000 seconds\nProcess exited with code 0\nOriginal token count: 3\nOutput:\nCODEX-RAN\n".into(),
                    is_error: false,
                    attachments: Vec::new(),
                }),
            ]
        );

        let names: Vec<&str> = one.tools.iter().map(|t| t.name.as_str()).collect();
        for name in [
            "exec_command",
            "multi_agent_v1__spawn_agent",
            "multi_agent_v1__wait_agent",
            "update_goal",
        ] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        assert_eq!(
            ctx.namespaced.get("multi_agent_v1__close_agent"),
            Some(&("multi_agent_v1".to_owned(), "close_agent".to_owned()))
        );
        assert_eq!(ctx.dropped_tools, ["web_search"]);
        assert_eq!(ctx2.dropped_tools, ["web_search"]);
        assert_eq!(two.tools, one.tools);
        for key in ["store", "include", "prompt_cache_key", "client_metadata"] {
            assert!(one.extra.contains_key(key), "{key}");
        }
        assert!(!ctx.echo.store);
    }

    // ------------------------------------------------------------ encode

    #[test]
    fn reasoning_then_text_stream() {
        let mut enc = streaming(Context::default());
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
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let created = &events[0]["response"];
        assert_eq!(created["status"], "in_progress");
        assert_eq!(created["output"], json!([]));
        assert_eq!(created["object"], "response");
        assert_eq!(created["model"], "coder");
        assert!(created["usage"].is_null());
        assert_eq!(events[1]["response"]["id"], created["id"]);

        let rs = events[2]["item"]["id"].as_str().unwrap();
        assert!(rs.starts_with("rs_"));
        assert_eq!(
            events[2]["item"],
            json!({"type": "reasoning", "id": rs, "summary": []})
        );
        assert_eq!(events[4]["delta"], "Let me ");
        assert_eq!(events[4]["item_id"], rs);
        assert_eq!(events[6]["text"], "Let me think.");
        assert_eq!(
            events[8]["item"],
            json!({"type": "reasoning", "id": rs, "summary": [],
                   "content": [{"type": "reasoning_text", "text": "Let me think."}]})
        );

        let msg = events[9]["item"]["id"].as_str().unwrap();
        assert!(msg.starts_with("msg_"));
        assert_eq!(events[9]["output_index"], 1);
        assert_eq!(
            events[9]["item"],
            json!({"type": "message", "id": msg, "status": "in_progress", "role": "assistant", "content": []})
        );
        assert_eq!(
            events[10]["part"],
            json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        );
        assert_eq!(
            events[11],
            json!({"type": "response.output_text.delta", "sequence_number": 11, "item_id": msg,
                   "output_index": 1, "content_index": 0, "delta": "Hello", "logprobs": []})
        );
        assert_eq!(events[13]["text"], "Hello, world.");
        assert_eq!(events[13]["logprobs"], json!([]));
        assert_eq!(
            events[15]["item"],
            json!({"type": "message", "id": msg, "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": "Hello, world.", "annotations": [], "logprobs": []}]})
        );

        let done = &events[16]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["id"], created["id"]);
        assert!(done["id"].as_str().unwrap().starts_with("resp_"));
        assert!(done["completed_at"].is_u64());
        assert!(done["error"].is_null() && done["incomplete_details"].is_null());
        assert_eq!(done["output"], Value::Array(done_items(&events)));
        assert_eq!(
            done["usage"],
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                   "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})
        );
        assert!(done.get("output_text").is_none());
        for (key, value) in [
            ("tools", json!([])),
            ("metadata", json!({})),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("previous_response_id", json!(null)),
            ("truncation", json!("disabled")),
            ("text", json!({"format": {"type": "text"}})),
            ("reasoning", json!({"effort": null, "summary": null})),
            ("store", json!(false)),
        ] {
            assert_eq!(done[key], value, "{key}");
        }
    }

    #[test]
    fn reasoning_then_client_calls_stream_with_namespace_restored() {
        let (_, context) = decode_json(json!({"input": "hi", "tools": [
            {"type": "namespace", "name": "agents", "description": "d", "tools": [
                {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
            {"type": "custom", "name": "apply_patch"}
        ]}))
        .unwrap();
        let mut enc = streaming(*context);
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.reasoning("Plan.", &mut out);
        enc.client_calls(
            &[
                call(
                    "call_1",
                    "agents__spawn",
                    "{\"task\":\"x\"}",
                    CallKind::Function,
                ),
                call("call_2", "apply_patch", "*** Begin Patch", CallKind::Custom),
            ],
            &mut out,
        );
        enc.finish(Finish::ToolCalls, usage(), &mut out);
        let events = events(&out);
        assert_eq!(
            kinds(&events)[2..],
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let fc = events[8]["item"]["id"].as_str().unwrap();
        assert!(fc.starts_with("fc_"));
        assert_eq!(
            events[8]["item"],
            json!({"type": "function_call", "id": fc, "call_id": "call_1", "name": "spawn",
                   "namespace": "agents", "arguments": "", "status": "in_progress"})
        );
        assert_eq!(events[9]["delta"], "{\"task\":\"x\"}");
        assert_eq!(events[10]["arguments"], "{\"task\":\"x\"}");
        assert_eq!(events[10]["name"], "spawn", "named as OpenAI's event is");
        assert_eq!(
            events[11]["item"],
            json!({"type": "function_call", "id": fc, "call_id": "call_1", "name": "spawn",
                   "namespace": "agents", "arguments": "{\"task\":\"x\"}", "status": "completed"})
        );
        let ctc = events[12]["item"]["id"].as_str().unwrap();
        assert!(ctc.starts_with("ctc_"));
        assert_eq!(events[12]["output_index"], 2);
        assert_eq!(events[12]["item"]["status"], "in_progress");
        assert_eq!(events[13]["delta"], "*** Begin Patch");
        assert_eq!(events[14]["input"], "*** Begin Patch");
        assert_eq!(
            events[15]["item"],
            json!({"type": "custom_tool_call", "id": ctc, "call_id": "call_2", "name": "apply_patch",
                   "input": "*** Begin Patch", "status": "completed"})
        );
        let done = &events[16]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"], Value::Array(done_items(&events)));
    }

    #[test]
    fn limits_end_in_response_incomplete() {
        for (finish, reason) in [
            (Finish::Length, "max_output_tokens"),
            (Finish::ContentFilter, "content_filter"),
        ] {
            let mut enc = streaming(Context::default());
            let mut out = Vec::new();
            enc.open(&mut out);
            enc.content("cut", &mut out);
            enc.finish(finish, usage(), &mut out);
            // Only one terminal event, whatever comes after.
            enc.finish(Finish::Stop, usage(), &mut out);
            enc.content("more", &mut out);
            enc.stream_error(500, b"{}", &mut out);
            let events = events(&out);
            let last = events.last().unwrap();
            assert_eq!(last["type"], "response.incomplete");
            assert_eq!(last["response"]["status"], "incomplete");
            assert_eq!(
                last["response"]["incomplete_details"],
                json!({"reason": reason})
            );
            assert!(last["response"].get("completed_at").is_none());
            assert_eq!(
                last["response"]["output"],
                Value::Array(done_items(&events))
            );
            // The message cut short is itself `incomplete`, as OpenAI's is.
            assert_eq!(last["response"]["output"][0]["status"], "incomplete");
            assert_eq!(last["response"]["output"][0]["content"][0]["text"], "cut");
            let terminal = kinds(&events)
                .into_iter()
                .filter(|k| k.starts_with("response.") && k.matches('.').count() == 1)
                .collect::<Vec<_>>();
            assert_eq!(
                terminal,
                [
                    "response.created",
                    "response.in_progress",
                    "response.incomplete"
                ]
            );
        }
    }

    #[test]
    fn upstream_reasoning_items_close_or_open_items() {
        let mut enc = streaming(Context::default());
        let mut out = Vec::new();
        enc.open(&mut out);
        // 1. Streamed text, then the upstream's item with a summary not seen.
        enc.reasoning("raw thoughts", &mut out);
        enc.reasoning_item(
            &Reasoning {
                id: Some("rs_up1".into()),
                text: "raw thoughts".into(),
                summary: vec!["Thinking.".into()],
                encrypted: Some("ENC-1".into()),
            },
            &mut out,
        );
        // 2. The summary streamed as reasoning: not shown twice.
        enc.reasoning("Checking.", &mut out);
        enc.reasoning_item(
            &Reasoning {
                id: Some("rs_up2".into()),
                text: String::new(),
                summary: vec!["Checking.".into()],
                encrypted: Some("ENC-2".into()),
            },
            &mut out,
        );
        // 3. Nothing open (after text): a whole new item, with the upstream's id.
        enc.content("Answer.", &mut out);
        enc.reasoning_item(
            &Reasoning {
                id: Some("rs_up3".into()),
                text: String::new(),
                summary: vec![],
                encrypted: Some("ENC-3".into()),
            },
            &mut out,
        );
        enc.finish(Finish::Stop, usage(), &mut out);
        let events = events(&out);
        let items = done_items(&events);
        assert_eq!(items.len(), 4);
        let first = items[0]["id"].as_str().unwrap();
        assert!(first.starts_with("rs_"), "the streamed item keeps its id");
        assert_eq!(
            items[0],
            json!({"type": "reasoning", "id": first,
                   "summary": [{"type": "summary_text", "text": "Thinking."}],
                   "content": [{"type": "reasoning_text", "text": "raw thoughts"}],
                   "encrypted_content": "ENC-1"})
        );
        let second = items[1]["id"].as_str().unwrap();
        assert_eq!(
            items[1],
            json!({"type": "reasoning", "id": second,
                   "summary": [{"type": "summary_text", "text": "Checking."}],
                   "encrypted_content": "ENC-2"})
        );
        assert_eq!(items[2]["type"], "message");
        assert_eq!(
            items[3],
            json!({"type": "reasoning", "id": "rs_up3", "summary": [], "encrypted_content": "ENC-3"})
        );
        let summary: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"].as_str().unwrap().contains("summary"))
            .collect();
        assert_eq!(
            summary
                .iter()
                .map(|e| e["type"].as_str().unwrap())
                .collect::<Vec<_>>(),
            [
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
            ]
        );
        assert_eq!(
            summary[0],
            &json!({"type": "response.reasoning_summary_part.added", "sequence_number": summary[0]["sequence_number"],
                    "item_id": first, "output_index": 0, "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""}})
        );
        assert_eq!(summary[1]["delta"], "Thinking.");
        assert_eq!(summary[2]["text"], "Thinking.");
        assert_eq!(summary[3]["part"]["text"], "Thinking.");
        let last = events.last().unwrap();
        assert_eq!(last["response"]["output"], Value::Array(items));
    }

    #[test]
    fn switching_channels_opens_new_items() {
        let mut enc = streaming(Context::default());
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.content("a", &mut out);
        enc.reasoning("b", &mut out);
        enc.content("c", &mut out);
        enc.reasoning("", &mut out);
        enc.content("", &mut out);
        enc.content("d", &mut out);
        enc.finish(Finish::Stop, Usage::default(), &mut out);
        let events = events(&out);
        let items = done_items(&events);
        let types: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["message", "reasoning", "message"]);
        assert_eq!(items[2]["content"][0]["text"], "cd");
        let ids: std::collections::HashSet<&str> =
            items.iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), 3, "ids are unique");
        let last = &events.last().unwrap()["response"];
        assert_eq!(last["usage"]["total_tokens"], 0);
    }

    #[test]
    fn stream_error_is_response_failed_with_what_was_sent() {
        let mut enc = streaming(Context::default());
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.content("partial", &mut out);
        let body = ApiError::bad_gateway("upstream `x` failed").to_json();
        enc.stream_error(502, &body, &mut out);
        enc.finish(Finish::Stop, usage(), &mut out);
        let events = events(&out);
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.failed");
        let response = &last["response"];
        assert_eq!(response["status"], "failed");
        assert_eq!(
            response["error"],
            json!({"code": "bad_gateway", "message": "upstream `x` failed"})
        );
        assert_eq!(response["output"][0]["status"], "incomplete");
        assert_eq!(response["output"][0]["content"][0]["text"], "partial");
        assert_eq!(
            kinds(&events)
                .iter()
                .filter(|k| k.starts_with("response.failed"))
                .count(),
            1
        );
        assert!(!kinds(&events).contains(&"response.completed"));
    }

    #[test]
    fn failure_codes() {
        let code = |body: &[u8]| {
            let mut enc = streaming(Context::default());
            let mut out = Vec::new();
            enc.stream_error(500, body, &mut out);
            let events = events(&out);
            events[0]["response"]["error"].clone()
        };
        assert_eq!(
            code(&ApiError::internal("boom").to_json()),
            json!({"code": "server_error", "message": "boom"})
        );
        let llama =
            br#"{"error":{"code":"400","message":"too long","type":"exceed_context_size_error"}}"#;
        assert_eq!(code(llama)["code"], "context_length_exceeded");
        assert_eq!(
            code(br#"{"error":{"message":"slow","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#)["code"],
            "rate_limit_exceeded"
        );
        assert_eq!(
            code(b"<html>"),
            json!({"code": "server_error", "message": "upstream error 500"})
        );
    }

    /// Asked for (`include`), reasoning of the proxy's own gets encrypted
    /// content that carries its text; sent back by it alone, without its
    /// text, the item is that text again, and nothing for an upstream.
    #[test]
    fn own_reasoning_comes_back_by_its_encrypted_content() {
        let answer = |include: Value| -> Value {
            let (_, context) = decode_json(json!({"input": "hi", "include": include})).unwrap();
            let mut enc = ResponsesEncoder::new("coder", false, *context);
            let mut out = Vec::new();
            enc.open(&mut out);
            enc.reasoning("Let me ", &mut out);
            enc.reasoning("think.", &mut out);
            enc.content("Hi.", &mut out);
            enc.finish(Finish::Stop, usage(), &mut out);
            serde_json::from_slice::<Value>(&out).unwrap()["output"][0].clone()
        };
        assert!(answer(json!([])).get("encrypted_content").is_none());
        let mut item = answer(json!(["reasoning.encrypted_content"]));
        assert_eq!(
            item["encrypted_content"],
            "agent-proxy:reasoning:Let me think."
        );
        item["content"] = Value::Null;
        let (conversation, _) = decode_json(json!({"input": [
            {"role": "user", "content": "hi"}, item,
            {"role": "user", "content": "and?"}
        ]}))
        .unwrap();
        let Item::Reasoning(reasoning) = &conversation.items[1] else {
            panic!("{:?}", conversation.items);
        };
        assert_eq!(
            (reasoning.text.as_str(), reasoning.encrypted.as_deref()),
            ("Let me think.", None)
        );
    }

    #[test]
    fn non_streaming_body_is_the_response_object() {
        let (_, context) = decode_json(json!({
            "input": "hi", "instructions": "Be brief.", "temperature": 0.2,
            "metadata": {"k": "v"}, "max_output_tokens": 50, "store": true,
            "text": {"format": {"type": "json_object"}},
            "tools": [{"type": "namespace", "name": "ns", "description": "d",
                       "tools": [{"type": "function", "name": "f"}]}]
        }))
        .unwrap();
        let mut enc = ResponsesEncoder::new("coder", false, *context);
        assert!(!enc.streams());
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.reasoning("hmm", &mut out);
        enc.content("{\"a\":1}", &mut out);
        enc.client_calls(&[call("c1", "ns__f", "{}", CallKind::Function)], &mut out);
        assert!(out.is_empty(), "nothing before the end");
        enc.finish(Finish::ToolCalls, usage(), &mut out);
        let body: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["object"], "response");
        assert_eq!(body["status"], "completed");
        assert_eq!(body["model"], "coder");
        assert_eq!(body["instructions"], "Be brief.");
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(body["metadata"], json!({"k": "v"}));
        assert_eq!(body["max_output_tokens"], 50);
        assert_eq!(body["store"], true);
        assert_eq!(body["text"], json!({"format": {"type": "json_object"}}));
        assert_eq!(body["usage"]["total_tokens"], 15);
        let output = body["output"].as_array().unwrap();
        assert_eq!(output.len(), 3);
        assert_eq!(output[0]["content"][0]["text"], "hmm");
        assert_eq!(output[1]["status"], "completed");
        assert_eq!(output[1]["content"][0]["text"], "{\"a\":1}");
        assert_eq!(output[2]["name"], "f");
        assert_eq!(output[2]["namespace"], "ns");
        assert_eq!(output[2]["arguments"], "{}");
        assert!(body.get("sequence_number").is_none());
    }

    #[test]
    fn output_items_round_trip_through_decode() {
        let tools = json!([{"type": "namespace", "name": "agents", "description": "d", "tools": [
            {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
            {"type": "custom", "name": "apply_patch"}]);
        let (_, context) = decode_json(json!({"input": "go", "tools": tools})).unwrap();
        let mut enc = streaming(*context);
        let mut out = Vec::new();
        enc.open(&mut out);
        enc.reasoning("Plan it.", &mut out);
        enc.reasoning_item(
            &Reasoning {
                id: Some("rs_up".into()),
                text: "Plan it.".into(),
                summary: vec!["Planning.".into()],
                encrypted: Some("ENC-9".into()),
            },
            &mut out,
        );
        enc.content("Spawning.", &mut out);
        let calls = [
            call(
                "call_1",
                "agents__spawn",
                "{\"task\":\"t\"}",
                CallKind::Function,
            ),
            call("call_2", "apply_patch", "*** Begin Patch", CallKind::Custom),
        ];
        enc.client_calls(&calls, &mut out);
        enc.finish(Finish::ToolCalls, usage(), &mut out);
        let events = events(&out);
        let output = events.last().unwrap()["response"]["output"].clone();
        let rs_id = output[0]["id"].as_str().unwrap().to_owned();

        let mut input = vec![json!({"role": "user", "content": "go"})];
        input.extend(output.as_array().unwrap().iter().cloned());
        input.push(json!({"type": "function_call_output", "call_id": "call_1", "output": "ok"}));
        let (conv, _) = decode_json(json!({"input": input, "tools": tools})).unwrap();
        assert_eq!(
            conv.items,
            vec![
                text(Role::User, "go"),
                Item::Reasoning(Reasoning {
                    id: Some(rs_id),
                    text: "Plan it.".into(),
                    summary: vec!["Planning.".into()],
                    encrypted: Some("ENC-9".into()),
                }),
                text(Role::Assistant, "Spawning."),
                Item::ToolCall(calls[0].clone()),
                Item::ToolCall(calls[1].clone()),
                Item::ToolResult(ToolResult {
                    call_id: "call_1".into(),
                    output: "ok".into(),
                    is_error: false,
                    attachments: Vec::new(),
                }),
            ]
        );
    }
}

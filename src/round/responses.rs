//! The OpenAI Responses API as an upstream dialect: [`encode`] writes the
//! `POST /v1/responses` body for a [`Conversation`], and [`Decoder`] reads
//! the answer, streamed (typed SSE events) or whole (a Response object).
//!
//! The proxy keeps no state at the upstream: every round sends the whole
//! conversation with `store: false` and asks for the reasoning items'
//! `encrypted_content`, so that they can go back unchanged in the next round.

use std::borrow::Cow;
use std::sync::Arc;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{first_of_each, DecodeError, Fields, RoundDecoder, Step, Whole};
use crate::conversation::{
    CallKind, Conversation, Dialect, Finish, Format, FunctionTool, Item, JsonText, Message, Part,
    Reasoning, Role, RoundEnd, ToolCall, ToolChoice, ToolResult, UpstreamError, Usage,
};
use crate::json::{self, Raw};
use crate::sse;

/// What makes reasoning items reusable without server-side storage.
const ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";

/// Fields that would make the upstream keep or look up state: the proxy
/// sends the whole conversation every round and stores nothing there.
const STATEFUL: [&str; 3] = ["store", "previous_response_id", "conversation"];

/// Separates reasoning summary parts, as the whole answer joins them.
const PART_SEPARATOR: &str = "\n\n";

// ------------------------------------------------------------------ encode

/// The `/v1/responses` request body for `conversation`.
pub fn encode(conversation: &Conversation, stream: bool) -> Vec<u8> {
    let request = Request::new(conversation, stream);
    let mut body = super::body_buffer(conversation);
    json::write(&mut body, &request);
    body
}

#[derive(Serialize)]
struct Request<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<Cow<'a, str>>,
    input: Input<'a>,
    #[serde(skip_serializing_if = "<[_]>::is_empty", serialize_with = "tools")]
    tools: &'a [Arc<FunctionTool>],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoiceOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<ReasoningConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    store: bool,
    include: Vec<&'a str>,
    stream: bool,
    /// The client's fields (same dialect only), then the agent's params:
    /// each only where the body has no such key yet.
    #[serde(flatten)]
    rest: Fields<'a>,
}

impl<'a> Request<'a> {
    fn new(conversation: &'a Conversation, stream: bool) -> Self {
        let options = &conversation.options;
        // The client's fields are in its own dialect's shape: only ours can take them.
        let client = (conversation.origin == Dialect::Responses).then_some(&conversation.extra);
        let sources = || client.into_iter().chain([&conversation.params]);
        let tool_choice = options.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => ToolChoiceOut::Mode("auto"),
            ToolChoice::None => ToolChoiceOut::Mode("none"),
            ToolChoice::Required => ToolChoiceOut::Mode("required"),
            ToolChoice::Function(name) => ToolChoiceOut::Named {
                kind: match conversation.tools.iter().find(|t| &t.name == name) {
                    Some(tool) if tool.kind == CallKind::Custom => "custom",
                    _ => "function",
                },
                name,
            },
        });
        let reasoning = (options.reasoning_effort.is_some() || options.reasoning_summary.is_some())
            .then_some(ReasoningConfig {
                effort: options.reasoning_effort.as_deref(),
                summary: options.reasoning_summary.as_deref(),
            });
        let text = options.format.as_ref().map(|format| TextConfig {
            format,
            // `text` also carries `verbosity`, which the core does not model.
            rest: Fields(
                sources()
                    .filter_map(|fields| fields.get("text").and_then(Value::as_object))
                    .flatten()
                    .filter(|(key, _)| key.as_str() != "format")
                    .map(|(key, value)| (key.as_str(), value))
                    .fold(Vec::new(), first_of_each),
            ),
        });
        let mut include = vec![ENCRYPTED_REASONING];
        for entry in sources()
            .filter_map(|fields| fields.get("include").and_then(Value::as_array))
            .flatten()
            .filter_map(Value::as_str)
        {
            if !include.contains(&entry) {
                include.push(entry);
            }
        }
        let mut request = Request {
            model: conversation.model.as_deref(),
            instructions: conversation.system_text(),
            input: Input::new(&conversation.items),
            tools: &conversation.tools,
            max_output_tokens: options.max_tokens,
            temperature: options.temperature,
            top_p: options.top_p,
            tool_choice,
            parallel_tool_calls: options.parallel_tool_calls,
            reasoning,
            text,
            user: options.user.as_deref(),
            store: false,
            include,
            stream,
            rest: Fields(Vec::new()),
        };
        request.rest = Fields(
            sources()
                .flatten()
                .map(|(key, value)| (key.as_str(), value))
                .filter(|(key, _)| !request.has(key) && !STATEFUL.contains(key))
                .fold(Vec::new(), first_of_each),
        );
        request
    }

    /// Whether the typed fields put `key` in the body (keep in step with
    /// the struct: `params` and `extra` only fill keys left absent).
    fn has(&self, key: &str) -> bool {
        match key {
            "input" | "store" | "include" | "stream" => true,
            "model" => self.model.is_some(),
            "instructions" => self.instructions.is_some(),
            "tools" => !self.tools.is_empty(),
            "max_output_tokens" => self.max_output_tokens.is_some(),
            "temperature" => self.temperature.is_some(),
            "top_p" => self.top_p.is_some(),
            "tool_choice" => self.tool_choice.is_some(),
            "parallel_tool_calls" => self.parallel_tool_calls.is_some(),
            "reasoning" => self.reasoning.is_some(),
            "text" => self.text.is_some(),
            "user" => self.user.is_some(),
            _ => false,
        }
    }
}

/// The conversation's items as Responses input items.
struct Input<'a> {
    items: &'a [Item],
    /// Ids of custom tool calls: their results are `custom_tool_call_output`.
    custom_calls: Vec<&'a str>,
}

impl<'a> Input<'a> {
    fn new(items: &'a [Item]) -> Self {
        let custom_calls = items
            .iter()
            .filter_map(|item| match item {
                Item::ToolCall(call) if call.kind == CallKind::Custom => Some(call.id.as_str()),
                _ => None,
            })
            .collect();
        Input {
            items,
            custom_calls,
        }
    }
}

impl Serialize for Input<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for item in self.items {
            let out = match item {
                Item::Message(message) => message_item(message),
                // Readable reasoning from another dialect: OpenAI takes only
                // its own reasoning items (by id or encrypted content) as input.
                Item::Reasoning(Reasoning {
                    id: None,
                    encrypted: None,
                    ..
                }) => continue,
                Item::Reasoning(reasoning) => InputItem::Reasoning {
                    id: reasoning.id.as_deref(),
                    summary: Texts("summary_text", &reasoning.summary),
                    content: (!reasoning.text.is_empty())
                        .then(|| Texts("reasoning_text", std::slice::from_ref(&reasoning.text))),
                    encrypted_content: reasoning.encrypted.as_deref(),
                },
                Item::ToolCall(call) => match call.kind {
                    CallKind::Function => InputItem::FunctionCall {
                        call_id: &call.id,
                        name: &call.name,
                        arguments: &call.arguments,
                    },
                    CallKind::Custom => InputItem::CustomToolCall {
                        call_id: &call.id,
                        name: &call.name,
                        input: &call.arguments,
                    },
                },
                // `is_error` has no field here: the output text says so.
                Item::ToolResult(result)
                    if self.custom_calls.contains(&result.call_id.as_str()) =>
                {
                    InputItem::CustomToolCallOutput {
                        call_id: &result.call_id,
                        output: Output(result),
                    }
                }
                Item::ToolResult(result) => InputItem::FunctionCallOutput {
                    call_id: &result.call_id,
                    output: Output(result),
                },
            };
            seq.serialize_element(&out)?;
        }
        seq.end()
    }
}

fn message_item(message: &Message) -> InputItem<'_> {
    let (role, text_type) = match message.role {
        Role::User => ("user", "input_text"),
        Role::Assistant => ("assistant", "output_text"),
        Role::System => ("developer", "input_text"),
    };
    InputItem::Message {
        role,
        content: Parts {
            parts: &message.content,
            text_type,
        },
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem<'a> {
    Message {
        role: &'static str,
        content: Parts<'a>,
    },
    Reasoning {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        summary: Texts<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<Texts<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<&'a str>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    CustomToolCall {
        call_id: &'a str,
        name: &'a str,
        input: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Output<'a>,
    },
    CustomToolCallOutput {
        call_id: &'a str,
        output: Output<'a>,
    },
}

/// A tool's output: its text, or with attachments (images, files) content
/// parts, which Responses takes in an output.
struct Output<'a>(&'a ToolResult);

impl Serialize for Output<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ToolResult {
            output,
            attachments,
            ..
        } = self.0;
        if attachments.is_empty() {
            return serializer.serialize_str(output);
        }
        let mut seq = serializer.serialize_seq(None)?;
        if !output.is_empty() {
            seq.serialize_element(&TextPart {
                kind: "input_text",
                text: output,
            })?;
        }
        for part in attachments {
            seq.serialize_element(&PartOut {
                part,
                text_type: "input_text",
            })?;
        }
        seq.end()
    }
}

/// A message's content parts; text is `input_text` from the user and the
/// developer, `output_text` from the assistant.
struct Parts<'a> {
    parts: &'a [Part],
    text_type: &'static str,
}

impl Serialize for Parts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.parts.len()))?;
        for part in self.parts {
            let text_type = self.text_type;
            seq.serialize_element(&PartOut { part, text_type })?;
        }
        seq.end()
    }
}

/// One content part, text as `text_type`.
struct PartOut<'a> {
    part: &'a Part,
    text_type: &'static str,
}

impl Serialize for PartOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.part {
            Part::Text(text) => TextPart {
                kind: self.text_type,
                text,
            }
            .serialize(serializer),
            Part::Image { url, detail } => ImagePart {
                kind: "input_image",
                image_url: url,
                // OpenAI's image input requires `detail`; `auto` is its default.
                detail: detail.as_deref().unwrap_or("auto"),
            }
            .serialize(serializer),
            Part::File(file) => FileOut {
                kind: "input_file",
                file_data: file.data.as_deref(),
                file_id: file.id.as_deref(),
                file_url: file.url.as_deref(),
                filename: file.name.as_deref(),
            }
            .serialize(serializer),
            Part::Other(value) => value.serialize(serializer),
        }
    }
}

/// Responses' `input_file`.
#[derive(Serialize)]
struct FileOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file_data: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file_url: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filename: Option<&'a str>,
}

#[derive(Serialize)]
struct TextPart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct ImagePart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    image_url: &'a str,
    detail: &'a str,
}

/// Texts as `[{type, text}…]` parts of one type.
struct Texts<'a>(&'static str, &'a [String]);

impl Serialize for Texts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.1.len()))?;
        for text in self.1 {
            seq.serialize_element(&TextPart { kind: self.0, text })?;
        }
        seq.end()
    }
}

/// `strict` when neither the client nor the agent set it: Responses would
/// otherwise make every function strict, which turns optional parameters
/// into required ones (chat completions and tool servers mean non-strict).
static NOT_STRICT: Value = Value::Bool(false);

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToolOut<'a> {
    Function {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<Raw<'a>>,
        parameters: Raw<'a>,
        strict: &'a Value,
    },
    Custom {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<Raw<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        format: Option<&'a Value>,
    },
}

fn tools<S: Serializer>(tools: &&[Arc<FunctionTool>], serializer: S) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(tools.len()))?;
    for tool in *tools {
        let name = &tool.name;
        let description = tool.description.as_deref().map(JsonText::raw);
        seq.serialize_element(&match tool.kind {
            CallKind::Function => ToolOut::Function {
                name,
                description,
                parameters: tool.parameters.raw(),
                strict: tool.extra.get("strict").unwrap_or(&NOT_STRICT),
            },
            CallKind::Custom => ToolOut::Custom {
                name,
                description,
                format: tool.extra.get("format"),
            },
        })?;
    }
    seq.end()
}

#[derive(Serialize)]
#[serde(untagged)]
enum ToolChoiceOut<'a> {
    Mode(&'static str),
    Named {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'a str,
    },
}

#[derive(Serialize)]
struct ReasoningConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'a str>,
}

#[derive(Serialize)]
struct TextConfig<'a> {
    #[serde(serialize_with = "format")]
    format: &'a Format,
    #[serde(flatten)]
    rest: Fields<'a>,
}

/// `{type: json_object}`, or `{type: json_schema, name, schema, strict…}`
/// with the schema object's fields at the same level.
fn format<S: Serializer>(format: &&Format, serializer: S) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(None)?;
    match format {
        Format::JsonObject => map.serialize_entry("type", "json_object")?,
        Format::JsonSchema(schema) => {
            map.serialize_entry("type", "json_schema")?;
            for (key, value) in schema.as_object().into_iter().flatten() {
                if key != "type" {
                    map.serialize_entry(key, value)?;
                }
            }
        }
    }
    map.end()
}

// ------------------------------------------------------------------ decode

/// Reads one Responses answer: its stream's events in order, or one whole
/// body; then [`RoundDecoder::end`] gives the calls, reasoning items, usage
/// and finish.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Calls and reasoning items with their output index, to keep output
    /// order when `response.completed` brings items no event gave.
    calls: Vec<(u64, ToolCall)>,
    reasoning: Vec<(u64, Reasoning)>,
    usage: Usage,
    /// Set by the terminal event.
    finish: Option<Finish>,
    /// Reasoning text went out since the last separator: a new summary
    /// part starts with one.
    reasoning_open: bool,
}

impl RoundDecoder for Decoder {
    fn event<'a>(&mut self, event: &'a sse::Event) -> Result<Step<'a>, DecodeError> {
        // Not OpenAI's, but some compatible servers end with it.
        if event.is_done() {
            return Ok(Step::default());
        }
        let data: EventIn<'a> = crate::json::from_bytes(&event.data).map_err(|e| {
            DecodeError::Malformed(format!(
                "upstream sent an event that is not a Responses event: {e}"
            ))
        })?;
        let kind = data.kind.as_deref().or(event.name.as_deref());
        let mut step = Step::default();
        match kind.unwrap_or_default() {
            "response.output_text.delta" | "response.refusal.delta" => {
                step.delta.content = text(data.delta)?;
            }
            kind @ ("response.reasoning_summary_text.delta" | "response.reasoning_text.delta") => {
                let text = text(data.delta)?;
                self.reasoning_open |= text.as_deref().is_some_and(|t| !t.is_empty());
                step.delta.reasoning = text;
                step.delta.summary = kind == "response.reasoning_summary_text.delta";
            }
            "response.reasoning_summary_part.added" if std::mem::take(&mut self.reasoning_open) => {
                step.delta.reasoning = Some(Cow::Borrowed(PART_SEPARATOR));
                step.delta.summary = true;
            }
            "response.output_item.done" => {
                let item: ItemIn = field(data.item, "response.output_item.done")?;
                // Without an index, after the indexed ones in arrival order.
                let index = data
                    .output_index
                    .and_then(|raw| serde_json::from_str(raw.get()).ok())
                    .unwrap_or(u64::MAX);
                step.reasoning_item = self.keep(index, item).cloned();
            }
            terminal @ ("response.completed" | "response.incomplete") => {
                let response: ResponseIn = field(data.response, terminal)?;
                self.complete(response, terminal == "response.incomplete");
                step.done = true;
            }
            "response.failed" => {
                let response: ResponseIn = field(data.response, "response.failed")?;
                let error = response.error.unwrap_or_default();
                return Err(upstream_error(&error, "the upstream response failed"));
            }
            "error" => {
                // OpenAI's error event has the error's fields at its top
                // (where `type` is the event's); some servers nest them.
                let mut error: ErrorIn = serde_json::from_slice(&event.data).unwrap_or_default();
                let error = match error.error.take() {
                    Some(nested) => *nested,
                    None => ErrorIn {
                        kind: None,
                        ..error
                    },
                };
                return Err(upstream_error(&error, "the upstream reported an error"));
            }
            // Lifecycle events, `.done` repeats of streamed text, argument
            // deltas (the whole call comes with its item), and the rest.
            _ => {}
        }
        Ok(step)
    }

    fn body(&mut self, body: &[u8]) -> Result<Whole, DecodeError> {
        let response: ResponseIn = crate::json::from_bytes(body).map_err(|e| {
            DecodeError::Malformed(format!("upstream sent invalid Responses JSON: {e}"))
        })?;
        if let Some(error) = &response.error {
            return Err(upstream_error(error, "the upstream response failed"));
        }
        if response.status.as_deref() == Some("failed") {
            return Err(upstream_error(
                &ErrorIn::default(),
                "the upstream response failed",
            ));
        }
        let Some(output) = &response.output else {
            return Err(DecodeError::Malformed(
                "upstream answered without a Responses output".into(),
            ));
        };
        let content = output
            .iter()
            .filter_map(|item| match item {
                ItemIn::Message { content } => content.as_deref(),
                _ => None,
            })
            .flatten()
            .filter_map(ContentIn::answer)
            .collect();
        self.complete(response, false);
        let reasoning_items: Vec<Reasoning> =
            self.reasoning.iter().map(|(_, r)| r.clone()).collect();
        let reasoning = reasoning_items
            .iter()
            .flat_map(|r| std::iter::once(&r.text).chain(&r.summary))
            .filter(|text| !text.is_empty())
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(PART_SEPARATOR);
        Ok(Whole {
            reasoning,
            content,
            reasoning_items,
        })
    }

    fn end(&mut self) -> Result<RoundEnd, DecodeError> {
        let Decoder {
            mut calls,
            mut reasoning,
            usage,
            finish,
            ..
        } = std::mem::take(self);
        let Some(finish) = finish else {
            return Err(DecodeError::Malformed(
                "the upstream Responses stream ended before response.completed".into(),
            ));
        };
        // Stable: items without an index keep their arrival order.
        calls.sort_by_key(|(index, _)| *index);
        reasoning.sort_by_key(|(index, _)| *index);
        Ok(RoundEnd {
            calls: calls.into_iter().map(|(_, call)| call).collect(),
            reasoning: reasoning.into_iter().map(|(_, r)| r).collect(),
            finish: Some(finish),
            usage,
        })
    }
}

impl Decoder {
    /// Keeps a call or reasoning item unless it was seen already (the
    /// terminal response repeats every item, its reasoning re-encrypted);
    /// returns a reasoning item that is new.
    fn keep(&mut self, index: u64, item: ItemIn) -> Option<&Reasoning> {
        let call = match item {
            ItemIn::Reasoning {
                id,
                summary,
                content,
                encrypted_content,
            } => {
                let reasoning = Reasoning {
                    text: content
                        .into_iter()
                        .flatten()
                        .filter_map(ContentIn::into_text)
                        .collect(),
                    summary: summary
                        .into_iter()
                        .flatten()
                        .filter_map(ContentIn::into_text)
                        .collect(),
                    encrypted: encrypted_content,
                    id,
                };
                let seen = self.reasoning.iter().any(|(_, kept)| match &reasoning.id {
                    Some(id) => kept.id.as_ref() == Some(id),
                    None => *kept == reasoning,
                });
                if seen {
                    return None;
                }
                self.reasoning.push((index, reasoning));
                return self.reasoning.last().map(|(_, r)| r);
            }
            ItemIn::FunctionCall {
                call_id,
                name,
                arguments,
            } => ToolCall {
                id: call_id,
                name,
                arguments,
                kind: CallKind::Function,
            },
            ItemIn::CustomToolCall {
                call_id,
                name,
                input,
            } => ToolCall {
                id: call_id,
                name,
                arguments: input,
                kind: CallKind::Custom,
            },
            ItemIn::Message { .. } | ItemIn::Other => return None,
        };
        if !self.calls.iter().any(|(_, kept)| kept.id == call.id) {
            self.calls.push((index, call));
        }
        None
    }

    /// The terminal response: its usage, the items no event gave, and why
    /// the answer ended.
    fn complete(&mut self, response: ResponseIn, incomplete_event: bool) {
        if let Some(usage) = response.usage {
            self.usage = Usage {
                prompt_tokens: usage.input_tokens,
                completion_tokens: usage.output_tokens,
                total_tokens: usage
                    .total_tokens
                    .unwrap_or(usage.input_tokens.saturating_add(usage.output_tokens)),
                cached_tokens: usage
                    .input_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
                reasoning_tokens: usage
                    .output_tokens_details
                    .and_then(|d| d.reasoning_tokens)
                    .unwrap_or(0),
            };
        }
        for (index, item) in response.output.into_iter().flatten().enumerate() {
            self.keep(index as u64, item);
        }
        let incomplete = incomplete_event || response.status.as_deref() == Some("incomplete");
        self.finish = Some(if incomplete {
            match response
                .incomplete_details
                .and_then(|d| d.reason)
                .as_deref()
            {
                Some("content_filter") => Finish::ContentFilter,
                // `max_output_tokens`, or a reason this proxy does not know:
                // either way the answer was cut.
                _ => Finish::Length,
            }
        } else if self.calls.is_empty() {
            Finish::Stop
        } else {
            Finish::ToolCalls
        });
    }
}

/// A delta's text, borrowed from the event unless it has escapes.
fn text(raw: Option<&RawValue>) -> Result<Option<Cow<'_, str>>, DecodeError> {
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    raw.map(|raw| serde_json::from_str::<Text>(raw.get()).map(|t| t.0))
        .transpose()
        .map_err(|e| DecodeError::Malformed(format!("upstream sent a delta that is not text: {e}")))
}

/// The object an `event` type carries (its `item` or `response`), parsed.
fn field<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>, event: &str) -> Result<T, DecodeError> {
    let raw = raw.ok_or_else(|| {
        DecodeError::Malformed(format!("upstream sent {event} without its object"))
    })?;
    serde_json::from_str(raw.get())
        .map_err(|e| DecodeError::Malformed(format!("upstream sent an invalid {event}: {e}")))
}

/// An upstream error in OpenAI's error shape, with a status from its code.
fn upstream_error(error: &ErrorIn, fallback: &str) -> DecodeError {
    let kind = error.kind.as_ref().and_then(Value::as_str);
    // Some servers (vLLM) give the HTTP status as the code.
    let http_status = error
        .code
        .as_ref()
        .and_then(Value::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| (400..600).contains(code));
    let code = error.code.as_ref().and_then(|code| match code {
        Value::String(code) => Some(Cow::Borrowed(code.as_str())),
        Value::Number(code) => Some(Cow::Owned(code.to_string())),
        _ => None,
    });
    let says = |word: &str| {
        code.as_deref().is_some_and(|c| c.contains(word)) || kind.is_some_and(|k| k.contains(word))
    };
    let status = match http_status {
        Some(status) => status,
        None if says("rate_limit") => 429,
        None if says("invalid") => 400,
        None => 502,
    };
    let default_kind = match status {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "upstream_error",
    };
    let body = ErrorEnvelope {
        error: ErrorOut {
            message: error
                .message
                .as_ref()
                .and_then(Value::as_str)
                .unwrap_or(fallback),
            kind: kind.unwrap_or(default_kind),
            param: error.param.as_ref().and_then(Value::as_str),
            code,
        },
    };
    DecodeError::Upstream(UpstreamError {
        status,
        // Plain strings into a Vec: cannot fail.
        body: serde_json::to_vec(&body).unwrap_or_default().into(),
    })
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorOut<'a>,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<Cow<'a, str>>,
}

/// One stream event. Every field but `type` stays raw until its event type
/// says what it is, so that an event this decoder ignores cannot fail it
/// with a field shape it does not expect.
#[derive(Deserialize)]
struct EventIn<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    output_index: Option<&'a RawValue>,
    #[serde(default, borrow)]
    item: Option<&'a RawValue>,
    #[serde(default, borrow)]
    response: Option<&'a RawValue>,
}

/// A Response object: the terminal events' `response`, or a whole answer.
#[derive(Deserialize)]
struct ResponseIn {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    output: Option<Vec<ItemIn>>,
    #[serde(default)]
    usage: Option<UsageIn>,
    #[serde(default)]
    error: Option<ErrorIn>,
    #[serde(default)]
    incomplete_details: Option<IncompleteIn>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ItemIn {
    Message {
        #[serde(default)]
        content: Option<Vec<ContentIn>>,
    },
    Reasoning {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        summary: Option<Vec<ContentIn>>,
        #[serde(default)]
        content: Option<Vec<ContentIn>>,
        #[serde(default)]
        encrypted_content: Option<String>,
    },
    FunctionCall {
        call_id: String,
        name: String,
        #[serde(default)]
        arguments: String,
    },
    CustomToolCall {
        call_id: String,
        name: String,
        #[serde(default)]
        input: String,
    },
    /// Built-in tool calls and whatever comes next: not the loop's business.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentIn {
    OutputText {
        text: String,
    },
    Refusal {
        refusal: String,
    },
    ReasoningText {
        text: String,
    },
    SummaryText {
        text: String,
    },
    #[serde(other)]
    Other,
}

impl ContentIn {
    /// What the model said: its text, or its refusal.
    fn answer(&self) -> Option<&str> {
        match self {
            ContentIn::OutputText { text } => Some(text),
            ContentIn::Refusal { refusal } => Some(refusal),
            _ => None,
        }
    }

    /// A reasoning item's text or summary part.
    fn into_text(self) -> Option<String> {
        match self {
            ContentIn::ReasoningText { text } | ContentIn::SummaryText { text } => Some(text),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct UsageIn {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetailsIn>,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    output_tokens_details: Option<OutputDetailsIn>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct InputDetailsIn {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetailsIn {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct IncompleteIn {
    #[serde(default)]
    reason: Option<String>,
}

/// An error object, lenient: any field may be missing or of another type.
#[derive(Deserialize, Default)]
struct ErrorIn {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    message: Option<Value>,
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    param: Option<Value>,
    /// An error event's error, when the server nests it.
    #[serde(default)]
    error: Option<Box<ErrorIn>>,
}

#[cfg(test)]
mod tests {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    use serde_json::{json, Map};

    use super::*;
    use crate::conversation::Prompt;
    use crate::conversation::{Description, FilePart, Options, Schema, ToolResult};

    const TOOL_STREAM: &[u8] =
        include_bytes!("../../tests/fixtures/openai/responses-tool-stream.sse");
    const TEXT_STREAM: &[u8] =
        include_bytes!("../../tests/fixtures/openai/responses-text-stream.sse");
    const TEXT_BODY: &[u8] = include_bytes!("../../tests/fixtures/openai/responses-text.json");

    fn encoded(conversation: &Conversation) -> Value {
        serde_json::from_slice(&encode(conversation, true)).unwrap()
    }

    fn tool(name: &str, kind: CallKind, extra: Value) -> Arc<FunctionTool> {
        Arc::new(FunctionTool {
            name: name.into(),
            description: Description::new(&format!("{name} tool")),
            parameters: Schema::empty(),
            kind,
            extra: extra.as_object().cloned().unwrap_or_default(),
        })
    }

    #[test]
    fn encodes_every_item_kind_tool_and_option() {
        let conversation = Conversation {
            model: Some("gpt-5-mini".into()),
            system: Some(Prompt::new("Be brief.")),
            items: vec![
                Item::Message(Message {
                    role: Role::User,
                    content: vec![
                        Part::Text("What is this?".into()),
                        Part::Image {
                            url: "https://example.com/cat.png".into(),
                            detail: Some("low".into()),
                        },
                        Part::Image {
                            url: "data:image/png;base64,AAAA".into(),
                            detail: None,
                        },
                        Part::Other(json!({"type": "input_file", "file_id": "file-1"})),
                        Part::File(FilePart {
                            data: Some("data:application/pdf;base64,JVBE".into()),
                            name: Some("a.pdf".into()),
                            ..FilePart::default()
                        }),
                        Part::File(FilePart {
                            url: Some("https://example.com/b.pdf".into()),
                            ..FilePart::default()
                        }),
                    ],
                    extra: Map::new(),
                }),
                Item::Message(Message::text(Role::System, "Answer in French.")),
                Item::Reasoning(Reasoning {
                    id: Some("rs_1".into()),
                    text: String::new(),
                    summary: vec!["**Looking**".into(), "A cat.".into()],
                    encrypted: Some("gAAAA1".into()),
                }),
                // Readable reasoning from a chat upstream: not OpenAI input.
                Item::Reasoning(Reasoning {
                    text: "Hmm, a cat.".into(),
                    ..Reasoning::default()
                }),
                Item::ToolCall(ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                    kind: CallKind::Function,
                }),
                Item::ToolCall(ToolCall {
                    id: "call_2".into(),
                    name: "run_sql".into(),
                    arguments: "SELECT 1".into(),
                    kind: CallKind::Custom,
                }),
                // A picture in the result goes in the output's own parts.
                Item::ToolResult(ToolResult {
                    call_id: "call_1".into(),
                    output: "18 °C".into(),
                    is_error: false,
                    attachments: vec![Part::Image {
                        url: "data:image/png;base64,CHART".into(),
                        detail: None,
                    }],
                }),
                Item::ToolResult(ToolResult {
                    call_id: "call_2".into(),
                    output: "no such table".into(),
                    is_error: true,
                    attachments: Vec::new(),
                }),
                Item::Message(Message::text(Role::Assistant, "Un chat.")),
                // A gpt-oss item from a vLLM Responses server: text and id.
                Item::Reasoning(Reasoning {
                    id: Some("rs_2".into()),
                    text: "Done.".into(),
                    summary: vec![],
                    encrypted: None,
                }),
            ],
            tools: vec![
                tool("get_weather", CallKind::Function, json!({"strict": true})),
                tool("search", CallKind::Function, json!({})),
                tool(
                    "run_sql",
                    CallKind::Custom,
                    json!({"format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}),
                ),
            ],
            options: Options {
                stream: true,
                include_usage: true,
                max_tokens: Some(300),
                temperature: Some(0.5),
                top_p: Some(0.9),
                // Not OpenAI's: not sent.
                top_k: Some(40),
                stop: vec!["END".into()],
                tool_choice: Some(ToolChoice::Required),
                parallel_tool_calls: Some(false),
                reasoning_effort: Some("low".into()),
                reasoning_summary: Some("auto".into()),
                thinking: Some(true),
                format: Some(Format::JsonSchema(json!({
                    "name": "answer", "schema": {"type": "object"}, "strict": true
                }))),
                user: Some("u-1".into()),
            },
            ..Conversation::default()
        };
        assert_eq!(
            encoded(&conversation),
            json!({
                "model": "gpt-5-mini",
                "instructions": "Be brief.",
                "input": [
                    {"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "low"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                        {"type": "input_file", "file_id": "file-1"},
                        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBE",
                         "filename": "a.pdf"},
                        {"type": "input_file", "file_url": "https://example.com/b.pdf"}
                    ]},
                    {"type": "message", "role": "developer", "content": [
                        {"type": "input_text", "text": "Answer in French."}
                    ]},
                    {"type": "reasoning", "id": "rs_1", "summary": [
                        {"type": "summary_text", "text": "**Looking**"},
                        {"type": "summary_text", "text": "A cat."}
                    ], "encrypted_content": "gAAAA1"},
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                     "arguments": "{\"city\":\"Paris\"}"},
                    {"type": "custom_tool_call", "call_id": "call_2", "name": "run_sql", "input": "SELECT 1"},
                    {"type": "function_call_output", "call_id": "call_1", "output": [
                        {"type": "input_text", "text": "18 °C"},
                        {"type": "input_image", "image_url": "data:image/png;base64,CHART", "detail": "auto"}
                    ]},
                    {"type": "custom_tool_call_output", "call_id": "call_2", "output": "no such table"},
                    {"type": "message", "role": "assistant", "content": [
                        {"type": "output_text", "text": "Un chat."}
                    ]},
                    {"type": "reasoning", "id": "rs_2", "summary": [],
                     "content": [{"type": "reasoning_text", "text": "Done."}]}
                ],
                "tools": [
                    {"type": "function", "name": "get_weather", "description": "get_weather tool",
                     "parameters": {"type": "object", "properties": {}}, "strict": true},
                    {"type": "function", "name": "search", "description": "search tool",
                     "parameters": {"type": "object", "properties": {}}, "strict": false},
                    {"type": "custom", "name": "run_sql", "description": "run_sql tool",
                     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
                ],
                "max_output_tokens": 300,
                "temperature": 0.5,
                "top_p": 0.9,
                "tool_choice": "required",
                "parallel_tool_calls": false,
                "reasoning": {"effort": "low", "summary": "auto"},
                "text": {"format": {"type": "json_schema", "name": "answer",
                                    "schema": {"type": "object"}, "strict": true}},
                "user": "u-1",
                "store": false,
                "include": ["reasoning.encrypted_content"],
                "stream": true
            })
        );
    }

    #[test]
    fn minimal_conversation_omits_what_is_unset() {
        let conversation = Conversation {
            items: vec![Item::Message(Message::text(Role::User, "hi"))],
            ..Conversation::default()
        };
        let body = encode(&conversation, false);
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"store":false,"include":["reasoning.encrypted_content"],"stream":false}"#
        );
    }

    #[test]
    fn tool_choice_format_and_reasoning_variants() {
        let mut conversation = Conversation {
            tools: vec![
                tool("f", CallKind::Function, json!({})),
                tool("c", CallKind::Custom, json!({})),
            ],
            ..Conversation::default()
        };
        let choice = |conversation: &mut Conversation, choice: ToolChoice| {
            conversation.options.tool_choice = Some(choice);
            encoded(conversation)["tool_choice"].clone()
        };
        assert_eq!(choice(&mut conversation, ToolChoice::Auto), json!("auto"));
        assert_eq!(choice(&mut conversation, ToolChoice::None), json!("none"));
        assert_eq!(
            choice(&mut conversation, ToolChoice::Function("f".into())),
            json!({"type": "function", "name": "f"})
        );
        assert_eq!(
            choice(&mut conversation, ToolChoice::Function("c".into())),
            json!({"type": "custom", "name": "c"})
        );
        conversation.options.format = Some(Format::JsonObject);
        conversation.options.reasoning_summary = Some("detailed".into());
        let body = encoded(&conversation);
        assert_eq!(body["text"], json!({"format": {"type": "json_object"}}));
        assert_eq!(body["reasoning"], json!({"summary": "detailed"}));
        // A custom tool without a format is freeform text.
        assert_eq!(
            body["tools"][1],
            json!({"type": "custom", "name": "c", "description": "c tool"})
        );
    }

    #[test]
    fn params_fill_absent_keys_and_client_fields_pass_only_from_responses() {
        let mut conversation = Conversation {
            options: Options {
                temperature: Some(0.2),
                format: Some(Format::JsonObject),
                ..Options::default()
            },
            params: json!({
                "temperature": 1.5,
                "top_k": 20,
                "service_tier": "flex",
                "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
                "store": true,
                "previous_response_id": "resp_agent"
            })
            .as_object()
            .cloned()
            .unwrap(),
            extra: json!({
                "service_tier": "priority",
                "metadata": {"k": "v"},
                "include": ["web_search_call.action.sources"],
                "text": {"verbosity": "low"},
                "store": true,
                "previous_response_id": "resp_client",
                "conversation": "conv_1"
            })
            .as_object()
            .cloned()
            .unwrap(),
            origin: Dialect::Chat,
            ..Conversation::default()
        };
        // The client spoke chat: its extra fields mean nothing here.
        let body = encoded(&conversation);
        assert_eq!(body["temperature"], json!(0.2));
        assert_eq!(body["top_k"], json!(20));
        assert_eq!(body["service_tier"], json!("flex"));
        assert_eq!(body["metadata"], Value::Null);
        assert_eq!(body["text"], json!({"format": {"type": "json_object"}}));
        assert_eq!(
            body["include"],
            json!([
                "reasoning.encrypted_content",
                "message.output_text.logprobs"
            ])
        );
        assert_eq!(body["store"], json!(false));
        assert_eq!(body.get("previous_response_id"), None);

        conversation.origin = Dialect::Responses;
        let body = encoded(&conversation);
        assert_eq!(body["temperature"], json!(0.2));
        assert_eq!(body["top_k"], json!(20));
        // The client's own field wins over the agent's default, as in chat.
        assert_eq!(body["service_tier"], json!("priority"));
        assert_eq!(body["metadata"], json!({"k": "v"}));
        assert_eq!(
            body["text"],
            json!({"format": {"type": "json_object"}, "verbosity": "low"})
        );
        assert_eq!(
            body["include"],
            json!([
                "reasoning.encrypted_content",
                "web_search_call.action.sources",
                "message.output_text.logprobs"
            ])
        );
        assert_eq!(body["store"], json!(false));
        assert_eq!(body.get("previous_response_id"), None);
        assert_eq!(body.get("conversation"), None);
    }

    /// The body's top-level keys, duplicates included.
    fn top_level_keys(body: &[u8]) -> Vec<String> {
        struct Keys;
        impl<'de> Visitor<'de> for Keys {
            type Value = Vec<String>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
                let mut keys = Vec::new();
                while let Some((key, IgnoredAny)) = map.next_entry()? {
                    keys.push(key);
                }
                Ok(keys)
            }
        }
        use serde::Deserializer as _;
        serde_json::Deserializer::from_slice(body)
            .deserialize_map(Keys)
            .unwrap()
    }

    #[test]
    fn typed_fields_are_never_overridden_or_repeated() {
        let mut conversation = Conversation {
            model: Some("m".into()),
            system: Some(Prompt::new("s")),
            items: vec![Item::Message(Message::text(Role::User, "hi"))],
            tools: vec![tool("f", CallKind::Function, json!({}))],
            options: Options {
                max_tokens: Some(1),
                temperature: Some(0.1),
                top_p: Some(0.2),
                tool_choice: Some(ToolChoice::Auto),
                parallel_tool_calls: Some(true),
                reasoning_effort: Some("high".into()),
                format: Some(Format::JsonObject),
                user: Some("u".into()),
                ..Options::default()
            },
            origin: Dialect::Responses,
            ..Conversation::default()
        };
        let alone = encode(&conversation, true);
        let keys = top_level_keys(&alone);
        let sentinel: Map<String, Value> = keys
            .iter()
            .filter(|key| key.as_str() != "include")
            .map(|key| (key.clone(), json!("sentinel")))
            .collect();
        conversation.params = sentinel.clone();
        conversation.extra = sentinel;
        let crowded = encode(&conversation, true);
        assert_eq!(top_level_keys(&crowded), keys);
        assert_eq!(crowded, alone);
    }

    // ------------------------------------------------------------ decode

    fn events(bytes: &[u8]) -> Vec<sse::Event> {
        let mut parser = sse::Parser::new(1 << 20);
        parser.feed(bytes);
        let mut events = Vec::new();
        while let Some(event) = parser.next_event().unwrap() {
            events.push(event);
        }
        events.extend(parser.finish());
        events
    }

    /// What a stream decodes to: its text, reasoning, the reasoning items
    /// handed on as they completed, and the round's end.
    struct Decoded {
        content: String,
        reasoning: String,
        items: Vec<Reasoning>,
        end: Result<RoundEnd, DecodeError>,
    }

    fn decode(bytes: &[u8]) -> Decoded {
        let mut decoder = Decoder::default();
        let mut decoded = Decoded {
            content: String::new(),
            reasoning: String::new(),
            items: Vec::new(),
            end: Err(DecodeError::Malformed("not ended".into())),
        };
        for event in events(bytes) {
            match decoder.event(&event) {
                Ok(step) => {
                    decoded.content.extend(step.delta.content);
                    decoded.reasoning.extend(step.delta.reasoning);
                    decoded.items.extend(step.reasoning_item);
                }
                Err(e) => {
                    decoded.end = Err(e);
                    return decoded;
                }
            }
        }
        decoded.end = decoder.end();
        decoded
    }

    fn event(data: Value) -> sse::Event {
        sse::Event {
            name: data["type"].as_str().map(str::to_owned),
            data: serde_json::to_vec(&data).unwrap().into(),
        }
    }

    fn upstream(result: Result<impl std::fmt::Debug, DecodeError>) -> (u16, Value) {
        match result {
            Err(DecodeError::Upstream(e)) => (e.status, serde_json::from_slice(&e.body).unwrap()),
            other => panic!("not an upstream error: {other:?}"),
        }
    }

    #[test]
    fn decodes_an_openai_tool_call_stream() {
        let decoded = decode(TOOL_STREAM);
        let end = decoded.end.unwrap();
        let summary = [
            "**Looking up two cities**\n\nThe user wants the current weather in Paris and Tokyo. I'll call get_weather for each.",
            "**Calling the tool twice**\n\nThe lookups are independent, so both calls go out together.",
        ];
        assert_eq!(decoded.content, "");
        assert_eq!(decoded.reasoning, summary.join("\n\n"));
        assert_eq!(decoded.items.len(), 1);
        let item = &decoded.items[0];
        assert!(item.id.as_deref().unwrap().starts_with("rs_"));
        assert_eq!(item.summary, summary);
        assert_eq!(item.text, "");
        // The item as `output_item.done` gave it, not `response.completed`'s
        // copy (re-encrypted): one item, handed on once.
        let done = events(TOOL_STREAM)
            .into_iter()
            .filter_map(|e| serde_json::from_slice::<Value>(&e.data).ok())
            .find(|e| e["type"] == "response.output_item.done")
            .unwrap();
        assert_eq!(
            item.encrypted.as_deref(),
            done["item"]["encrypted_content"].as_str()
        );
        assert_eq!(end.reasoning, decoded.items);
        let calls: Vec<(&str, &str, CallKind)> = end
            .calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str(), c.kind))
            .collect();
        assert_eq!(
            calls,
            [
                ("get_weather", r#"{"city":"Paris"}"#, CallKind::Function),
                ("get_weather", r#"{"city":"Tokyo"}"#, CallKind::Function),
            ]
        );
        assert!(end.calls.iter().all(|c| c.id.starts_with("call_")));
        assert_ne!(end.calls[0].id, end.calls[1].id);
        assert_eq!(end.finish, Some(Finish::ToolCalls));
        assert_eq!(
            end.usage,
            Usage {
                prompt_tokens: 96,
                completion_tokens: 251,
                total_tokens: 347,
                cached_tokens: 0,
                reasoning_tokens: 192,
            }
        );
    }

    #[test]
    fn decodes_an_openai_text_stream_borrowing_plain_deltas() {
        let decoded = decode(TEXT_STREAM);
        assert_eq!(
            decoded.content,
            "Paris: 18 °C and sunny (feels like 17 °C).\nTokyo: 24 °C with light rain — take an umbrella."
        );
        assert_eq!(
            decoded.reasoning,
            "**Summarizing the results**\n\nBoth lookups returned; I'll give a short answer with the \"feels like\" values."
        );
        assert_eq!(decoded.items.len(), 1);
        let end = decoded.end.unwrap();
        assert_eq!(end.calls, []);
        assert_eq!(end.finish, Some(Finish::Stop));
        assert_eq!(
            end.usage,
            Usage {
                prompt_tokens: 412,
                completion_tokens: 97,
                total_tokens: 509,
                cached_tokens: 256,
                reasoning_tokens: 64,
            }
        );

        let mut decoder = Decoder::default();
        let events = events(TEXT_STREAM);
        let steps: Vec<Step> = events.iter().map(|e| decoder.event(e).unwrap()).collect();
        // A delta is its own string only when JSON escapes had to be undone
        // (`\n`, `\"`); raw UTF-8 such as `°` is borrowed.
        let deltas = steps
            .iter()
            .flat_map(|s| [&s.delta.content, &s.delta.reasoning])
            .flatten();
        for delta in deltas {
            let escaped = delta.contains(['\n', '"', '\\']);
            assert_eq!(matches!(delta, Cow::Owned(_)), escaped, "{delta:?}");
        }
        assert_eq!(steps.iter().filter(|s| s.done).count(), 1);
    }

    #[test]
    fn a_stream_cut_before_its_terminal_event_is_malformed() {
        let completed = b"event: response.completed\n";
        let cut = TOOL_STREAM
            .windows(completed.len())
            .position(|w| w == completed)
            .unwrap();
        let decoded = decode(&TOOL_STREAM[..cut]);
        assert!(matches!(
            decoded.end,
            Err(DecodeError::Malformed(m)) if m.contains("ended before response.completed")
        ));
        assert!(matches!(decode(b"").end, Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn incomplete_answers_say_why() {
        for (reason, finish) in [
            ("max_output_tokens", Finish::Length),
            ("content_filter", Finish::ContentFilter),
        ] {
            let incomplete = event(json!({
                "type": "response.incomplete", "sequence_number": 9,
                "response": {"status": "incomplete", "incomplete_details": {"reason": reason},
                             "output": [], "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}}
            }));
            let mut decoder = Decoder::default();
            assert!(decoder.event(&incomplete).unwrap().done);
            let end = decoder.end().unwrap();
            assert_eq!(end.finish, Some(finish));
            assert_eq!(end.usage.total_tokens, 12);
        }
    }

    #[test]
    fn failures_are_upstream_errors_in_openai_shape() {
        let failed = event(json!({
            "type": "response.failed", "sequence_number": 3,
            "response": {"status": "failed", "output": [],
                         "error": {"code": "server_error", "message": "The model failed."}}
        }));
        assert_eq!(
            upstream(Decoder::default().event(&failed)),
            (
                502,
                json!({"error": {"message": "The model failed.", "type": "upstream_error",
                                 "param": null, "code": "server_error"}})
            )
        );
        let rate_limited = event(json!({
            "type": "error", "sequence_number": 1, "code": "rate_limit_exceeded",
            "message": "Slow down.", "param": null
        }));
        assert_eq!(
            upstream(Decoder::default().event(&rate_limited)),
            (
                429,
                json!({"error": {"message": "Slow down.", "type": "rate_limit_error",
                                 "param": null, "code": "rate_limit_exceeded"}})
            )
        );
        // Nested, as some compatible servers send it, named only by `event:`.
        let nested = sse::Event {
            name: Some("error".into()),
            data: br#"{"error":{"type":"invalid_request_error","message":"bad input","param":"input","code":400}}"#
                .as_slice()
                .into(),
        };
        assert_eq!(
            upstream(Decoder::default().event(&nested)),
            (
                400,
                json!({"error": {"message": "bad input", "type": "invalid_request_error",
                                 "param": "input", "code": "400"}})
            )
        );
        let vllm = event(json!({"type": "error", "error": {
            "message": "context too long", "type": "BadRequestError", "param": null, "code": 413
        }}));
        assert_eq!(upstream(Decoder::default().event(&vllm)).0, 413);
        let bare = event(json!({"type": "error"}));
        assert_eq!(
            upstream(Decoder::default().event(&bare)).1["error"]["message"],
            "the upstream reported an error"
        );
    }

    #[test]
    fn ignores_what_it_does_not_read_and_rejects_what_is_not_json() {
        let mut decoder = Decoder::default();
        for ignored in [
            json!({"type": "response.mcp_call_arguments.delta", "delta": {"x": 1}, "output_index": "0"}),
            json!({"type": "response.output_text.done", "text": "repeated"}),
            json!({"type": "response.output_item.done", "output_index": 1,
                   "item": {"type": "web_search_call", "id": "ws_1", "status": "completed"}}),
            json!({"type": "response.reasoning_summary_part.added", "summary_index": 0}),
            json!({"type": "keepalive"}),
        ] {
            assert_eq!(decoder.event(&event(ignored)).unwrap(), Step::default());
        }
        let done = sse::Event {
            name: None,
            data: "[DONE]".into(),
        };
        assert_eq!(decoder.event(&done).unwrap(), Step::default());
        let garbage = sse::Event {
            name: None,
            data: "{not json".into(),
        };
        assert!(matches!(
            decoder.event(&garbage),
            Err(DecodeError::Malformed(_))
        ));
        let bad_delta = event(json!({"type": "response.output_text.delta", "delta": 5}));
        assert!(matches!(
            decoder.event(&bad_delta),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn calls_only_in_the_terminal_response_still_count_once_in_order() {
        let mut decoder = Decoder::default();
        let custom = json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c",
                            "name": "run_sql", "input": "SELECT 1"});
        decoder
            .event(&event(
                json!({"type": "response.output_item.done", "output_index": 1, "item": custom}),
            ))
            .unwrap();
        decoder
            .event(&event(json!({
                "type": "response.completed",
                "response": {"status": "completed", "output": [
                    {"type": "function_call", "id": "fc_1", "call_id": "call_f",
                     "name": "get_weather", "arguments": "{}"},
                    custom
                ]}
            })))
            .unwrap();
        let end = decoder.end().unwrap();
        assert_eq!(
            end.calls,
            [
                ToolCall {
                    id: "call_f".into(),
                    name: "get_weather".into(),
                    arguments: "{}".into(),
                    kind: CallKind::Function
                },
                ToolCall {
                    id: "call_c".into(),
                    name: "run_sql".into(),
                    arguments: "SELECT 1".into(),
                    kind: CallKind::Custom
                },
            ]
        );
        assert_eq!(end.finish, Some(Finish::ToolCalls));
        // Without usage in the response, the round reports none.
        assert_eq!(end.usage, Usage::default());
    }

    #[test]
    fn decodes_a_whole_response() {
        let mut decoder = Decoder::default();
        let whole = decoder.body(TEXT_BODY).unwrap();
        let streamed = decode(TEXT_STREAM);
        assert_eq!(whole.content, streamed.content);
        assert_eq!(whole.reasoning, streamed.reasoning);
        assert_eq!(whole.reasoning_items.len(), 1);
        assert_eq!(
            whole.reasoning_items[0].summary,
            std::slice::from_ref(&streamed.reasoning)
        );
        let end = decoder.end().unwrap();
        assert_eq!(end.reasoning, whole.reasoning_items);
        assert_eq!(end.finish, Some(Finish::Stop));
        assert_eq!(end.usage.completion_tokens, 97);

        let mut decoder = Decoder::default();
        let whole = decoder
            .body(
                br#"{"id":"resp_1","object":"response","status":"incomplete",
                    "incomplete_details":{"reason":"max_output_tokens"},
                    "output":[{"type":"reasoning","id":"rs_1","summary":[],
                               "content":[{"type":"reasoning_text","text":"Let me think"}]},
                              {"type":"message","role":"assistant","content":[
                                  {"type":"output_text","text":"Half","annotations":[]},
                                  {"type":"refusal","refusal":" an answer"}]},
                              {"type":"function_call","call_id":"call_1","name":"f","arguments":"{\"a\""}],
                    "usage":{"input_tokens":3,"output_tokens":4}}"#,
            )
            .unwrap();
        assert_eq!(whole.content, "Half an answer");
        assert_eq!(whole.reasoning, "Let me think");
        assert_eq!(whole.reasoning_items[0].text, "Let me think");
        let end = decoder.end().unwrap();
        assert_eq!(end.finish, Some(Finish::Length));
        assert_eq!(end.calls.len(), 1);
        assert_eq!(end.usage.total_tokens, 7);
    }

    #[test]
    fn whole_failures_and_foreign_bodies() {
        let (status, body) = upstream(Decoder::default().body(
            br#"{"error":{"message":"Unsupported parameter: 'stop'.","type":"invalid_request_error","param":"stop","code":"unsupported_parameter"}}"#,
        ));
        assert_eq!(status, 400);
        assert_eq!(body["error"]["param"], "stop");
        let (status, body) = upstream(Decoder::default().body(
            br#"{"status":"failed","error":{"code":"server_error","message":"boom"},"output":[]}"#,
        ));
        assert_eq!(
            (status, body["error"]["message"].as_str()),
            (502, Some("boom"))
        );
        let (status, _) = upstream(Decoder::default().body(br#"{"status":"failed","error":null}"#));
        assert_eq!(status, 502);
        for foreign in [
            &br#"{"object":"chat.completion","choices":[]}"#[..],
            b"not json",
            b"[]",
        ] {
            assert!(matches!(
                Decoder::default().body(foreign),
                Err(DecodeError::Malformed(_))
            ));
        }
    }
}

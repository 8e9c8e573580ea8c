//! Chat completions as an upstream dialect (llama.cpp, vLLM, any compatible
//! server): the conversation as a `/chat/completions` request, and the
//! stream (or the one JSON completion) it answers with, decoded.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::{first_of_each, DecodeError, RoundDecoder, Step, Whole};
use crate::agent::assemble::{new_call_id, Assembler};
use crate::conversation::{
    CallKind, Conversation, Delta, Dialect, Finish, Format, Item, JsonText, Part, Prompt, Role,
    RoundEnd, ToolCall, ToolChoice, UpstreamError,
};
use crate::front::chat::{wire_call, WireCall};
use crate::json::{self, Raw};
use crate::openai::{ChunkReader, CompletionIn};
use crate::sse;

// ------------------------------------------------------------- encoding

/// The request. Written by hand ([`Body::write`]): through serde, each
/// message's extra members (`flatten`) took a map serializer, and each
/// member name was escaped as any string.
struct Body<'a> {
    model: Option<&'a str>,
    messages: Vec<MessageOut<'a>>,
    tools: Vec<ToolOut<'a>>,
    tool_choice: Option<Value>,
    stream: bool,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    stop: &'a [String],
    parallel_tool_calls: Option<bool>,
    reasoning_effort: Option<&'a str>,
    response_format: Option<Value>,
    user: Option<&'a str>,
    /// The client's fields (same dialect only), then the agent's params:
    /// each only where no earlier source gave the key.
    rest: Vec<(&'a str, &'a Value)>,
}

impl Body<'_> {
    /// Whether the typed fields put `key` in the body (keep in step with
    /// the struct: `params` and `extra` only fill keys left absent).
    fn has(&self, key: &str) -> bool {
        match key {
            "messages" | "stream" => true,
            "stream_options" => self.stream,
            "model" => self.model.is_some(),
            "tools" => !self.tools.is_empty(),
            "tool_choice" => self.tool_choice.is_some(),
            "max_tokens" => self.max_tokens.is_some(),
            "temperature" => self.temperature.is_some(),
            "top_p" => self.top_p.is_some(),
            "top_k" => self.top_k.is_some(),
            "stop" => !self.stop.is_empty(),
            "parallel_tool_calls" => self.parallel_tool_calls.is_some(),
            "reasoning_effort" => self.reasoning_effort.is_some(),
            "response_format" => self.response_format.is_some(),
            "user" => self.user.is_some(),
            _ => false,
        }
    }

    /// The members that are set, in this order (a prompt cache needs the
    /// same bytes for the same conversation).
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.optional("model", self.model);
        o.list("messages", &self.messages, |out, m| m.write(out));
        if !self.tools.is_empty() {
            o.list("tools", &self.tools, |out, t| t.write(out));
        }
        o.optional("tool_choice", self.tool_choice.as_ref());
        o.bool("stream", self.stream);
        if self.stream {
            o.raw("stream_options", r#"{"include_usage":true}"#);
        }
        if let Some(n) = self.max_tokens {
            o.u64("max_tokens", n);
        }
        o.optional("temperature", self.temperature.as_ref());
        o.optional("top_p", self.top_p.as_ref());
        if let Some(k) = self.top_k {
            o.u64("top_k", k);
        }
        if !self.stop.is_empty() {
            o.value("stop", self.stop);
        }
        if let Some(parallel) = self.parallel_tool_calls {
            o.bool("parallel_tool_calls", parallel);
        }
        o.optional("reasoning_effort", self.reasoning_effort);
        o.optional("response_format", self.response_format.as_ref());
        o.optional("user", self.user);
        for (key, value) in &self.rest {
            o.member(key, value);
        }
        o.end();
    }
}

struct MessageOut<'a> {
    role: &'static str,
    content: Option<ContentOut<'a>>,
    reasoning_content: Option<Cow<'a, str>>,
    tool_calls: Vec<WireCall<'a>>,
    tool_call_id: Option<&'a str>,
    /// The client's own members of the message (same dialect only).
    extra: Option<&'a Map<String, Value>>,
}

impl MessageOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.plain("role", self.role);
        match self.content {
            Some(ContentOut::Text(text)) => o.text("content", text),
            Some(ContentOut::Prompt(prompt)) => prompt.write_json(o.name("content")),
            Some(ContentOut::Parts(parts)) => o.list("content", parts, write_part),
            Some(ContentOut::Attached { results, then }) => {
                let attached = results.iter().filter_map(|item| match item {
                    Item::ToolResult(result) if !result.attachments.is_empty() => Some(result),
                    _ => None,
                });
                let pieces = attached
                    .flat_map(|result| {
                        let label = std::iter::once(Piece::Label(&result.call_id));
                        label.chain(result.attachments.iter().map(Piece::Part))
                    })
                    .chain(then.iter().map(Piece::Part));
                o.list("content", pieces, |out, piece| match piece {
                    Piece::Label(call_id) => write_label(out, call_id),
                    Piece::Part(part) => write_part(out, part),
                });
            }
            None => {}
        }
        if let Some(reasoning) = &self.reasoning_content {
            o.text("reasoning_content", reasoning);
        }
        if !self.tool_calls.is_empty() {
            o.list("tool_calls", &self.tool_calls, |out, call| call.write(out));
        }
        o.optional("tool_call_id", self.tool_call_id);
        for (key, value) in self.extra.into_iter().flatten() {
            o.member(key, value);
        }
        o.end();
    }
}

/// A message's content as sent, borrowed from the conversation (a round
/// re-sends the whole history; copying it into JSON values first cost an
/// allocation and a copy per message): a text, the system prompt, or
/// content parts.
#[derive(Clone, Copy)]
enum ContentOut<'a> {
    Text(&'a str),
    Prompt(&'a Prompt),
    Parts(&'a [Part]),
    /// A user message holding what a run of tool results attached (each
    /// labelled with its call), then its own parts, if any.
    Attached {
        results: &'a [Item],
        then: &'a [Part],
    },
}

impl<'a> MessageOut<'a> {
    fn new(role: &'static str, content: Option<ContentOut<'a>>) -> Self {
        MessageOut {
            role,
            content,
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            extra: None,
        }
    }
}

/// A function tool: `{"type":"function","function":{…}}`.
struct ToolOut<'a> {
    name: &'a str,
    description: Option<Raw<'a>>,
    parameters: Raw<'a>,
    extra: Option<&'a Map<String, Value>>,
}

impl ToolOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut tool = json::Object::new(out);
        tool.plain("type", "function");
        let mut o = tool.object("function");
        o.value("name", self.name);
        if let Some(description) = self.description {
            o.raw("description", description.get());
        }
        o.raw("parameters", self.parameters.get());
        for (key, value) in self.extra.into_iter().flatten() {
            o.member(key, value);
        }
        o.end();
        tool.end();
    }
}

const TEMPLATE_KWARGS: &str = "chat_template_kwargs";

/// The `/chat/completions` body for `conversation`. A streaming request asks
/// for usage (the loop sums it over rounds).
pub fn encode(conversation: &Conversation, stream: bool) -> Vec<u8> {
    let same_dialect = conversation.origin == Dialect::Chat;
    let options = &conversation.options;
    // Borrowed, not merged into a copy: the client's fields come first.
    let client = same_dialect.then_some(&conversation.extra);
    let sources = || client.into_iter().chain([&conversation.params]);
    // Thinking off is llama.cpp's template switch, added to any kwargs given
    // (kwargs that are no object are left as they are). Thinking on is left
    // to the template's default and the agent's `params`: a client's "on"
    // (Claude Code's, always) must not override an operator's "off", nor
    // send a member OpenAI's chat API refuses.
    let kwargs = match options.thinking {
        Some(false) => match sources().find_map(|fields| fields.get(TEMPLATE_KWARGS)) {
            Some(Value::Object(given)) => {
                let mut kwargs = given.clone();
                kwargs.insert("enable_thinking".into(), Value::Bool(false));
                Some(Value::Object(kwargs))
            }
            Some(_) => None,
            None => Some(serde_json::json!({ "enable_thinking": false })),
        },
        _ => None,
    };
    let mut body = Body {
        model: conversation.model.as_deref(),
        messages: messages(conversation, same_dialect),
        tools: conversation
            .tools
            .iter()
            .map(|tool| ToolOut {
                name: &tool.name,
                description: tool.description.as_deref().map(JsonText::raw),
                parameters: tool.parameters.raw(),
                extra: same_dialect.then_some(&tool.extra),
            })
            .collect(),
        tool_choice: options.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => Value::from("auto"),
            ToolChoice::None => Value::from("none"),
            ToolChoice::Required => Value::from("required"),
            ToolChoice::Function(name) => {
                serde_json::json!({"type": "function", "function": {"name": name}})
            }
        }),
        stream,
        // A client's `max_completion_tokens` goes on in `rest`, as it sent it.
        max_tokens: options
            .max_tokens
            .filter(|_| !sources().any(|fields| fields.contains_key("max_completion_tokens"))),
        temperature: options.temperature,
        top_p: options.top_p,
        top_k: options.top_k,
        stop: &options.stop,
        parallel_tool_calls: options.parallel_tool_calls,
        reasoning_effort: options.reasoning_effort.as_deref(),
        response_format: options.format.as_ref().map(|format| match format {
            Format::JsonObject => serde_json::json!({"type": "json_object"}),
            Format::JsonSchema(schema) => {
                serde_json::json!({"type": "json_schema", "json_schema": schema})
            }
        }),
        user: options.user.as_deref(),
        rest: Vec::new(),
    };
    let mut rest = sources()
        .flatten()
        .map(|(key, value)| match &kwargs {
            Some(kwargs) if key == TEMPLATE_KWARGS => (key.as_str(), kwargs),
            _ => (key.as_str(), value),
        })
        .filter(|(key, _)| !body.has(key))
        .fold(Vec::new(), first_of_each);
    if let Some(kwargs) = &kwargs {
        rest = first_of_each(rest, (TEMPLATE_KWARGS, kwargs));
    }
    body.rest = rest;
    let mut out = super::body_buffer(conversation);
    body.write(&mut out);
    out
}

/// The system prompt first, then the items; consecutive calls join the
/// assistant message before them, and readable reasoning goes on the
/// assistant message that follows it (the reasoning items before one
/// message, one line each: a turn's rounds that ran the agent's own tools
/// come back from the client as its reasoning items, then its answer). An
/// answer that was reasoning alone is an assistant turn of its own, as the
/// chat front sends it back: the user's next message does not follow the
/// last one, which templates that alternate the roles refuse.
fn messages(conversation: &Conversation, same_dialect: bool) -> Vec<MessageOut<'_>> {
    let mut out = Vec::with_capacity(conversation.items.len() + 1);
    if let Some(system) = &conversation.system {
        out.push(MessageOut::new("system", Some(ContentOut::Prompt(system))));
    }
    let mut reasoning: Option<Cow<'_, str>> = None;
    // Whether the last message is an assistant turn that calls may join.
    let mut open_turn = false;
    // Where the run of tool results being written began, and where, once
    // one of them attached something.
    let mut run = 0;
    let mut attaching: Option<usize> = None;
    let items = &conversation.items;
    for (i, item) in items.iter().enumerate() {
        // A run's attachments go in the user message after it: a user
        // message of the client's own takes them first.
        let mut attached = None;
        if !matches!(item, Item::ToolResult(_)) {
            run = i + 1;
            if let Some(start) = attaching.take() {
                attached = Some(&items[start..i]);
            }
        }
        let user = matches!(item, Item::Message(m) if m.role == Role::User);
        if let Some(results) = attached.take_if(|_| !user) {
            out.push(attachments_alone(results));
        }
        match item {
            Item::Message(message) => {
                let role = match message.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::System => "system",
                };
                let content = match attached {
                    Some(results) => ContentOut::Attached {
                        results,
                        then: &message.content,
                    },
                    None => content(&message.content),
                };
                let mut m = MessageOut::new(role, Some(content));
                m.extra = same_dialect.then_some(&message.extra);
                match message.role {
                    Role::Assistant => m.reasoning_content = reasoning.take(),
                    _ => reasoning_alone(&mut out, &mut reasoning),
                }
                open_turn = message.role == Role::Assistant;
                out.push(m);
            }
            Item::Reasoning(r) => {
                // Sent back by its summary alone, the summary is its text:
                // the proxy gives a client that asks for one the text so.
                // Not another model's (OpenAI's carry its encrypted content).
                let text = match (r.text.as_str(), r.summary.as_slice(), &r.encrypted) {
                    ("", [one], None) => Cow::Borrowed(one.as_str()),
                    ("", parts, None) => Cow::Owned(parts.join("\n\n")),
                    (text, _, _) => Cow::Borrowed(text),
                };
                if !text.is_empty() {
                    reasoning = Some(match reasoning.take() {
                        None => text,
                        Some(before) => Cow::Owned(format!("{before}\n{text}")),
                    });
                }
                open_turn = false;
            }
            Item::ToolCall(call) => {
                if !open_turn {
                    let mut m = MessageOut::new("assistant", None);
                    m.reasoning_content = reasoning.take();
                    out.push(m);
                    open_turn = true;
                }
                if let Some(last) = out.last_mut() {
                    last.tool_calls.push(wire_call(call));
                }
            }
            Item::ToolResult(result) => {
                reasoning_alone(&mut out, &mut reasoning);
                let mut m = MessageOut::new("tool", Some(ContentOut::Text(&result.output)));
                m.tool_call_id = Some(&result.call_id);
                out.push(m);
                open_turn = false;
                if !result.attachments.is_empty() {
                    attaching.get_or_insert(run);
                }
            }
        }
    }
    if let Some(start) = attaching {
        out.push(attachments_alone(&items[start..]));
    }
    out
}

/// A user message of the attachments of a run of `results` alone.
fn attachments_alone(results: &[Item]) -> MessageOut<'_> {
    let then = &[];
    MessageOut::new("user", Some(ContentOut::Attached { results, then }))
}

/// A part of a user message holding tool results' attachments.
enum Piece<'a> {
    /// The text before a result's attachments, naming its call.
    Label(&'a str),
    Part(&'a Part),
}

/// The text part before a tool result's attachments, naming its call.
fn write_label(out: &mut Vec<u8>, call_id: &str) {
    let mut o = json::Object::new(out);
    o.plain("type", "text");
    o.text(
        "text",
        &format!("Attached to the result of tool call {call_id}:"),
    );
    o.end();
}

/// An assistant turn of `reasoning` alone, if any is pending.
fn reasoning_alone<'a>(out: &mut Vec<MessageOut<'a>>, reasoning: &mut Option<Cow<'a, str>>) {
    if let Some(reasoning) = reasoning.take() {
        let mut m = MessageOut::new("assistant", Some(ContentOut::Text("")));
        m.reasoning_content = Some(reasoning);
        out.push(m);
    }
}

/// One text part as a plain string (what every template takes); anything
/// else as chat content parts.
fn content(parts: &[Part]) -> ContentOut<'_> {
    match parts {
        [Part::Text(text)] => ContentOut::Text(text),
        parts => ContentOut::Parts(parts),
    }
}

/// A chat content part.
fn write_part(out: &mut Vec<u8>, part: &Part) {
    match part {
        Part::Text(text) => {
            let mut o = json::Object::new(out);
            o.plain("type", "text");
            o.text("text", text);
            o.end();
        }
        Part::Image { url, detail } => {
            let mut o = json::Object::new(out);
            o.plain("type", "image_url");
            let mut image = o.object("image_url");
            image.value("url", url);
            image.optional("detail", detail.as_ref());
            image.end();
            o.end();
        }
        // Chat's file part has no URL: a file by URL goes as Responses
        // names it, for the upstream to take or refuse.
        Part::File(file) => {
            let mut o = json::Object::new(out);
            o.plain("type", "file");
            let mut inner = o.object("file");
            inner.optional("file_data", file.data.as_ref());
            inner.optional("file_id", file.id.as_ref());
            inner.optional("file_url", file.url.as_ref());
            inner.optional("filename", file.name.as_ref());
            inner.end();
            o.end();
        }
        Part::Other(other) => json::write(out, other),
    }
}

// ------------------------------------------------------------- decoding

/// Decodes one round's chat stream (or completion). Tool-call deltas are
/// assembled; calls to custom (freeform) tools, flattened to one `input`
/// argument on the way in, come back as their raw input.
#[derive(Default)]
pub struct Decoder {
    assembler: Assembler,
    calls: Vec<ToolCall>,
    finish: Option<Finish>,
    usage: crate::conversation::Usage,
    done: bool,
    custom: Vec<String>,
    chunks: ChunkReader,
}

impl Decoder {
    /// `custom`: the names of the request's custom tools.
    pub fn new(custom: Vec<String>) -> Self {
        Decoder {
            custom,
            ..Decoder::default()
        }
    }
}

pub fn finish_of(reason: &str) -> Finish {
    match reason {
        "length" => Finish::Length,
        "content_filter" => Finish::ContentFilter,
        "tool_calls" | "function_call" => Finish::ToolCalls,
        _ => Finish::Stop,
    }
}

/// A chat tool call, whole or assembled from a stream's deltas, as the core's.
fn core_call(call: crate::openai::ToolCall) -> ToolCall {
    ToolCall {
        id: call.id,
        name: call.function.name,
        arguments: call.function.arguments,
        kind: CallKind::Function,
    }
}

impl RoundDecoder for Decoder {
    fn event<'a>(&mut self, event: &'a sse::Event) -> Result<Step<'a>, DecodeError> {
        if event.is_done() {
            self.done = true;
            return Ok(Step {
                done: true,
                ..Step::default()
            });
        }
        let chunk = self.chunks.read(&event.data).map_err(|e| {
            DecodeError::Malformed(format!(
                "upstream sent an event that is not a chat chunk: {e}"
            ))
        })?;
        if chunk.error.is_some() || event.name.as_deref() == Some("error") {
            return Err(DecodeError::Upstream(UpstreamError {
                status: 502,
                body: event.data.clone(),
            }));
        }
        if let Some(usage) = chunk.usage {
            self.usage = usage;
        }
        let mut step = Step::default();
        // The proxy asks for one choice; only the first is read.
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(step);
        };
        if let Some(delta) = choice.delta {
            step.delta = Delta {
                reasoning: delta.reasoning_content.or(delta.reasoning),
                summary: false,
                content: delta.content,
            };
            for call in delta.tool_calls.iter().flatten() {
                self.assembler.push(call);
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.finish = Some(finish_of(&reason));
        }
        Ok(step)
    }

    fn body(&mut self, body: &[u8]) -> Result<Whole, DecodeError> {
        let completion = CompletionIn::read(body)
            .map_err(|e| DecodeError::Malformed(format!("upstream sent invalid JSON: {e}")))?;
        if let Some(usage) = completion.usage {
            self.usage = usage;
        }
        let Some(choice) = completion.choices.into_iter().next() else {
            return Err(DecodeError::Malformed(
                "upstream answered without choices".into(),
            ));
        };
        let message = choice.message;
        self.calls = message.tool_calls.into_iter().map(core_call).collect();
        self.finish = Some(
            choice
                .finish_reason
                .as_deref()
                .map_or(Finish::Stop, finish_of),
        );
        self.done = true;
        Ok(Whole {
            reasoning: message
                .reasoning_content
                .or(message.reasoning)
                .unwrap_or_default(),
            content: message.content.unwrap_or_default(),
            reasoning_items: Vec::new(),
        })
    }

    fn end(&mut self) -> Result<RoundEnd, DecodeError> {
        if !self.done && self.finish.is_none() {
            return Err(DecodeError::Malformed(
                "ended its stream before the answer was complete".into(),
            ));
        }
        let mut calls = std::mem::take(&mut self.calls);
        if !self.assembler.is_empty() {
            calls = std::mem::take(&mut self.assembler)
                .finish()
                .into_iter()
                .map(core_call)
                .collect();
        }
        // A tool result names its call by id: a call without one, or two
        // calls sharing one (a malformed answer), would be indistinguishable.
        // A set, not a look back per call: an answer may hold many. One
        // call, the most common, needs none.
        match calls.as_mut_slice() {
            [] => {}
            [call] => {
                if call.id.is_empty() {
                    call.id = new_call_id();
                }
            }
            calls => {
                let mut seen = std::collections::HashSet::with_capacity(calls.len());
                for call in calls {
                    if call.id.is_empty() || !seen.insert(call.id.clone()) {
                        call.id = new_call_id();
                        seen.insert(call.id.clone());
                    }
                }
            }
        }
        for call in &mut calls {
            if self.custom.contains(&call.name) {
                call.kind = CallKind::Custom;
                // The model was given one string argument, `input`.
                if let Ok(Value::Object(mut args)) = serde_json::from_str(&call.arguments) {
                    if let Some(Value::String(input)) = args.remove("input") {
                        call.arguments = input;
                    }
                }
            }
        }
        Ok(RoundEnd {
            calls,
            reasoning: Vec::new(),
            // `[DONE]` without a finish reason (some servers): the answer ended.
            finish: Some(self.finish.unwrap_or(Finish::Stop)),
            usage: self.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{FilePart, Message, ToolResult};
    use serde_json::json;

    /// A call the upstream sent without an id gets one, streamed or not: the
    /// loop's result, or the client's, names the call by it.
    #[test]
    fn a_call_without_an_id_is_given_one() {
        let whole = br#"{"choices":[{"message":{"role":"assistant","content":null,
            "tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}},
                          {"id":"","function":{"name":"g","arguments":"{}"}}]},
            "finish_reason":"tool_calls"}]}"#;
        let mut decoder = Decoder::new(Vec::new());
        decoder.body(whole).unwrap();
        let non_streamed = decoder.end().unwrap().calls;

        let mut decoder = Decoder::new(Vec::new());
        for data in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"name":"g","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            let event = sse::Event {
                name: None,
                data: bytes::Bytes::from_static(data.as_bytes()),
            };
            decoder.event(&event).unwrap();
        }
        let streamed = decoder.end().unwrap().calls;

        for calls in [non_streamed, streamed] {
            let names: Vec<_> = calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["f", "g"]);
            assert!(calls.iter().all(|c| c.id.starts_with("call_")), "{calls:?}");
            assert_ne!(calls[0].id, calls[1].id);
        }
    }

    /// An agent's `params` fill what the client left unset, and never write
    /// a member twice: the client's `tool_choice`, `stop`, format or `user`
    /// win over the agent's.
    #[test]
    fn a_member_is_written_once() {
        let mut conversation = Conversation::default();
        for (key, value) in [
            ("tool_choice", json!("required")),
            ("stop", json!(["END"])),
            ("response_format", json!({"type": "text"})),
            ("user", json!("agent")),
            ("top_k", json!(5)),
        ] {
            conversation.params.insert(key.into(), value);
        }
        let body = |conversation: &Conversation| {
            let body = encode(conversation, false);
            let text = String::from_utf8(body.clone()).unwrap();
            for key in ["tool_choice", "stop", "response_format", "user", "top_k"] {
                assert_eq!(text.matches(&format!("\"{key}\"")).count(), 1, "{text}");
            }
            serde_json::from_slice::<Value>(&body).unwrap()
        };
        assert_eq!(body(&conversation)["tool_choice"], "required");
        let options = &mut conversation.options;
        options.tool_choice = Some(ToolChoice::Auto);
        options.stop = vec!["STOP".into()];
        options.format = Some(Format::JsonObject);
        options.user = Some("client".into());
        options.top_k = Some(7);
        let sent = body(&conversation);
        assert_eq!(sent["tool_choice"], "auto");
        assert_eq!(sent["stop"], json!(["STOP"]));
        assert_eq!(sent["response_format"], json!({"type": "json_object"}));
        assert_eq!(sent["user"], "client");
        assert_eq!(sent["top_k"], 7);
    }

    /// Thinking switched off by the client is the template's switch, beside
    /// any kwargs given; switched on, the kwargs are the operator's.
    #[test]
    fn thinking_off_is_the_templates_switch() {
        let mut conversation = Conversation::default();
        let kwargs = json!({"enable_thinking": false, "reasoning_budget": 64});
        conversation
            .params
            .insert(TEMPLATE_KWARGS.into(), kwargs.clone());
        let sent = |conversation: &Conversation| -> Value {
            serde_json::from_slice::<Value>(&encode(conversation, false)).unwrap()[TEMPLATE_KWARGS]
                .clone()
        };
        conversation.options.thinking = Some(true);
        assert_eq!(sent(&conversation), kwargs, "the operator's off holds");
        conversation.params.clear();
        assert_eq!(
            sent(&conversation),
            Value::Null,
            "no member a server may refuse"
        );
        conversation.options.thinking = Some(false);
        assert_eq!(sent(&conversation), json!({"enable_thinking": false}));
    }

    /// A file goes as chat's `file` part, one by URL with Responses' name
    /// for it; a lone text part as a plain string.
    #[test]
    fn files_are_file_parts() {
        let conversation = Conversation {
            items: vec![Item::Message(Message {
                role: Role::User,
                content: vec![
                    Part::Text("Read these.".into()),
                    Part::File(FilePart {
                        data: Some("data:application/pdf;base64,JVBE".into()),
                        name: Some("a.pdf".into()),
                        ..FilePart::default()
                    }),
                    Part::File(FilePart {
                        id: Some("file-1".into()),
                        url: Some("https://example.com/b.pdf".into()),
                        ..FilePart::default()
                    }),
                ],
                extra: Map::new(),
            })],
            ..Conversation::default()
        };
        let sent: Value = serde_json::from_slice(&encode(&conversation, false)).unwrap();
        assert_eq!(
            sent["messages"][0]["content"],
            json!([
                {"type": "text", "text": "Read these."},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE",
                                          "filename": "a.pdf"}},
                {"type": "file", "file": {"file_id": "file-1",
                                          "file_url": "https://example.com/b.pdf"}}
            ])
        );
    }

    /// A run of results' attachments go in one user message after the run
    /// (the tool messages stay together, as templates want them), before
    /// the assistant's next turn; each result's after its call's label.
    #[test]
    fn a_runs_attachments_follow_it_in_a_user_message() {
        let image = |url: &str| Part::Image {
            url: url.into(),
            detail: None,
        };
        let result = |id: &str, attachments| {
            Item::ToolResult(ToolResult {
                call_id: id.into(),
                output: format!("{id} done"),
                is_error: false,
                attachments,
            })
        };
        let conversation = Conversation {
            items: vec![
                result("a", vec![image("data:a")]),
                result("b", Vec::new()),
                result("c", vec![image("data:c1"), image("data:c2")]),
                Item::Message(Message::text(Role::Assistant, "Two pictures.")),
            ],
            ..Conversation::default()
        };
        let sent: Value = serde_json::from_slice(&encode(&conversation, false)).unwrap();
        let picture = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
        let label = |id: &str| json!({"type": "text", "text": format!("Attached to the result of tool call {id}:")});
        assert_eq!(
            sent["messages"],
            json!([
                {"role": "tool", "tool_call_id": "a", "content": "a done"},
                {"role": "tool", "tool_call_id": "b", "content": "b done"},
                {"role": "tool", "tool_call_id": "c", "content": "c done"},
                {"role": "user", "content": [label("a"), picture("data:a"),
                    label("c"), picture("data:c1"), picture("data:c2")]},
                {"role": "assistant", "content": "Two pictures."}
            ])
        );
    }
}

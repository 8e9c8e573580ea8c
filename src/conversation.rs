//! The protocol-neutral core: the conversation the tool loop works on, what
//! a round decoder reads from an upstream, and what a front encoder writes
//! to a client. Dialects (chat completions, Responses, Messages) are codecs
//! at the edges; nothing here knows their wire shapes.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::json::Raw;

pub use crate::openai::Usage;

/// The wire a request came in on or goes out over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// `/v1/chat/completions`
    #[default]
    Chat,
    /// `/v1/responses`
    Responses,
    /// `/v1/messages`
    Messages,
}

/// One request's conversation, as the loop sees it.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The model asked for; the agent rewrite replaces it.
    pub model: Option<String>,
    /// The system prompt: the client's leading instructions, then (after the
    /// rewrite) combined with the agent's.
    pub system: Option<Prompt>,
    pub items: Vec<Item>,
    /// Functions the model may call: the agent's, then the client's. Shared:
    /// an agent's are made once, with the config or the tool.
    pub tools: Vec<Arc<FunctionTool>>,
    pub options: Options,
    /// Upstream request fields whatever the upstream's dialect (the agent's
    /// `params`, such as `top_k` or `chat_template_kwargs`): set when absent.
    pub params: Map<String, Value>,
    /// Request fields the core does not know, in `origin`'s wire shape:
    /// forwarded only to an upstream that speaks the same dialect.
    pub extra: Map<String, Value>,
    pub origin: Dialect,
    /// The client's key for the conversation, when it gives one (a session
    /// header, `prompt_cache_key`, Anthropic's `metadata.user_id`): its turns
    /// go to one replica, whose prompt cache holds the conversation.
    pub session: Option<String>,
}

impl Conversation {
    /// The call id of the first tool result that answers no call before it
    /// (OpenAI and Anthropic refuse such a request; a model's template
    /// would fail on it, or the model read an answer to nothing). The call
    /// is looked for back from the result: it is most often just before.
    pub fn unanswered_result(&self) -> Option<&str> {
        self.items.iter().enumerate().find_map(|(at, item)| match item {
            Item::ToolResult(result) => {
                let called = self.items[..at]
                    .iter()
                    .rev()
                    .any(|earlier| matches!(earlier, Item::ToolCall(call) if call.id == result.call_id));
                (!called).then_some(result.call_id.as_str())
            }
            _ => None,
        })
    }

    /// Lets go of what it holds (the prompt, the items, the tools, the
    /// fields passed on), in place: its model, options and session stay.
    /// Taking it whole (`mem::take`) copied all 520 bytes out and a default
    /// in, for the same frees.
    pub fn release(&mut self) {
        self.system = None;
        self.items = Vec::new();
        self.tools = Vec::new();
        self.params = Map::new();
        self.extra = Map::new();
    }

    /// The bytes of its text and tool schemas (about the size of a request
    /// carrying it), and of the longest of them: what an encoder sizes its
    /// buffer by.
    pub fn text_size(&self) -> TextSize {
        let mut size = TextSize::default();
        let mut add = |len: usize| size.add(len);
        add(self.system.as_ref().map_or(0, Prompt::len));
        for item in &self.items {
            match item {
                Item::Message(m) => m.content.iter().for_each(|part| match part {
                    Part::Text(text) => add(text.len()),
                    Part::Image { url, .. } => add(url.len()),
                    Part::File(file) => add(file.data.as_ref().map_or(64, String::len)),
                    Part::Other(_) => {}
                }),
                Item::Reasoning(r) => add(r.text.len()),
                Item::ToolCall(call) => add(call.arguments.len()),
                Item::ToolResult(result) => add(result.output.len()),
            }
        }
        for tool in &self.tools {
            add(tool.description.as_deref().map_or(0, JsonText::json_len));
            add(tool.parameters.json_len());
        }
        size
    }

    /// The system prompt's text, joined.
    pub fn system_text(&self) -> Option<Cow<'_, str>> {
        self.system.as_ref().map(Prompt::text)
    }

    /// The text of the first user message: how a conversation begins, the
    /// same in every later turn of it.
    pub fn first_user_text(&self) -> Option<String> {
        self.items.iter().find_map(|item| match item {
            Item::Message(m) if m.role == Role::User => Some(m.text_content()),
            _ => None,
        })
    }
}

/// The system prompt: its texts kept apart until written, each after a blank
/// line (the next instructions or system message) or a line break (the next
/// text of one message). A coding agent's are tens of KiB its client sends
/// again with every request: each goes out as the client escaped it
/// ([`json::write_text`](crate::json::write_text)), not joined into a copy
/// and escaped again.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prompt(Vec<(Joint, String)>);

/// What comes before a text of a [`Prompt`] but its first.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Joint {
    BlankLine,
    LineBreak,
}

impl Joint {
    fn text(self) -> &'static str {
        match self {
            Joint::BlankLine => "\n\n",
            Joint::LineBreak => "\n",
        }
    }

    /// As written inside a JSON string.
    fn json(self) -> &'static [u8] {
        match self {
            Joint::BlankLine => b"\\n\\n",
            Joint::LineBreak => b"\\n",
        }
    }
}

impl Prompt {
    /// The prompt of one text.
    pub fn new(text: impl Into<String>) -> Prompt {
        Prompt(vec![(Joint::BlankLine, text.into())])
    }

    /// Itself, unless it has no text at all.
    pub fn some(self) -> Option<Prompt> {
        (!self.0.is_empty()).then_some(self)
    }

    /// Adds a text after a blank line.
    pub fn push(&mut self, text: String) {
        self.0.push((Joint::BlankLine, text));
    }

    /// Adds another prompt's texts after its own, as they were joined.
    pub fn append(&mut self, other: Prompt) {
        self.0.extend(other.0);
    }

    /// Adds a text before the others, a blank line between.
    pub fn push_front(&mut self, text: String) {
        self.0.insert(0, (Joint::BlankLine, text));
    }

    /// Adds a message's text parts: the first after a blank line, the others
    /// each after a line break (as [`Message::text_content`] joins them).
    pub fn push_message(&mut self, message: Message) {
        let mut joint = Joint::BlankLine;
        for part in message.content {
            if let Part::Text(text) = part {
                self.0.push((joint, text));
                joint = Joint::LineBreak;
            }
        }
        // A message without text still parts what comes before and after.
        if joint == Joint::BlankLine {
            self.0.push((joint, String::new()));
        }
    }

    /// Its texts joined: borrowed when there is one.
    pub fn text(&self) -> Cow<'_, str> {
        match self.0.as_slice() {
            [] => Cow::Borrowed(""),
            [(_, only)] => Cow::Borrowed(only),
            _ => {
                let mut all = String::with_capacity(self.len());
                self.pieces().for_each(|piece| all.push_str(piece));
                Cow::Owned(all)
            }
        }
    }

    /// The bytes of its joined text.
    pub fn len(&self) -> usize {
        self.pieces().map(str::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces().all(str::is_empty)
    }

    /// Its texts, without the joints between them.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(_, text)| text.as_str())
    }

    /// Its joined text, in pieces: each text, the joints between.
    pub fn pieces(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .enumerate()
            .flat_map(|(i, (joint, text))| [if i == 0 { "" } else { joint.text() }, text.as_str()])
    }

    /// Writes it as one JSON string.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'"');
        for (i, (joint, text)) in self.0.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(joint.json());
            }
            crate::json::write_text_inside(out, text);
        }
        out.push(b'"');
    }
}

/// The bytes of some texts, and of the longest of them
/// ([`Conversation::text_size`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TextSize {
    pub total: usize,
    pub longest: usize,
}

impl TextSize {
    /// Of `texts`' lengths.
    pub fn of(texts: impl IntoIterator<Item = usize>) -> TextSize {
        let mut size = TextSize::default();
        texts.into_iter().for_each(|len| size.add(len));
        size
    }

    pub fn add(&mut self, len: usize) {
        self.total += len;
        self.longest = self.longest.max(len);
    }

    /// The room a buffer needs for [`json::write`](crate::json::write) to
    /// write these texts without growing it: the texts, and what it asks
    /// to have free before it writes a string (six bytes per byte, the
    /// escapes' worst case). Grown instead, the buffer is reallocated, and
    /// what it holds copied, at the longest text. Room left untouched
    /// costs no memory (its pages are never written).
    pub fn room(&self) -> usize {
        self.total + 6 * self.longest
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Message(Message),
    /// Reasoning the model produced in an earlier round or turn.
    Reasoning(Reasoning),
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// An instruction that is not leading (a leading one is `system`).
    System,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
    /// Message fields the core does not know, in the conversation's origin
    /// dialect (chat's `name`, say).
    pub extra: Map<String, Value>,
}

impl Message {
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: vec![Part::Text(text.into())],
            extra: Map::new(),
        }
    }

    /// The text parts, joined by newlines.
    pub fn text_content(&self) -> String {
        let mut texts = self.content.iter().filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        });
        let first = texts.next().unwrap_or_default().to_owned();
        texts.fold(first, |mut all, t| {
            all.push('\n');
            all.push_str(t);
            all
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// An image by URL (`data:` URLs included).
    Image {
        url: String,
        detail: Option<String>,
    },
    /// A file (a PDF, …): its data, by id or by URL. Chat's `file` part,
    /// Responses' `input_file`, Messages' `document` (but for a text one,
    /// which is text).
    File(FilePart),
    /// A part of a kind the core does not model, in the origin dialect's shape.
    Other(Value),
}

impl Part {
    /// A line naming a part a model cannot take (an image for a text
    /// model), in its place: `[image: image/png, 2 KiB]`.
    pub fn named(&self) -> String {
        // A `data:` URL by its type and size, never its bytes; another by
        // its first 200 bytes.
        let data = |url: &str| {
            let (head, data) = url.strip_prefix("data:")?.split_once(',')?;
            let kind = head.split(';').next().unwrap_or_default();
            let bytes = match head.ends_with(";base64") {
                true => data.len() * 3 / 4,
                false => data.len(),
            };
            Some(format!("{kind}, {} KiB", bytes.div_ceil(1024)))
        };
        let short = |url: &str| match url.char_indices().nth(200) {
            Some((end, _)) => format!("{}…", &url[..end]),
            None => url.to_owned(),
        };
        match self {
            Part::Text(text) => text.clone(),
            Part::Image { url, .. } => {
                let what = data(url).unwrap_or_else(|| short(url));
                format!("[image: {what}, not shown: the model takes no images]")
            }
            Part::File(file) => {
                let what = match (&file.name, file.data.as_deref().and_then(data)) {
                    (Some(name), Some(size)) => format!("{name}, {size}"),
                    (Some(name), None) => name.clone(),
                    (None, Some(size)) => size,
                    (None, None) => short(file.url.as_deref().or(file.id.as_deref()).unwrap_or("")),
                };
                format!("[file: {what}, not shown: the model takes no files]")
            }
            Part::Other(_) => "[content the model cannot take, not shown]".to_owned(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FilePart {
    /// Its bytes as a `data:` URL (`data:application/pdf;base64,…`).
    pub data: Option<String>,
    pub id: Option<String>,
    pub url: Option<String>,
    pub name: Option<String>,
}

/// A reasoning item. `encrypted` is opaque and goes back unchanged to the
/// upstream that produced it; `text` is readable reasoning, if any.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reasoning {
    pub id: Option<String>,
    pub text: String,
    pub summary: Vec<String>,
    pub encrypted: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The id results refer to (chat `id`, Responses `call_id`, Messages `id`).
    pub id: String,
    pub name: String,
    /// JSON text, or for a custom tool the raw input.
    pub arguments: String,
    pub kind: CallKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallKind {
    #[default]
    Function,
    /// A Responses `custom` (freeform) tool: `arguments` is its raw input.
    Custom,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub call_id: String,
    pub output: String,
    pub is_error: bool,
    /// What the result holds besides text (images, files), which a chat
    /// tool message cannot: a chat upstream gets them in a user message
    /// after the results, a Responses one in the output itself.
    pub attachments: Vec<Part>,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<Description>,
    /// JSON schema of the arguments.
    pub parameters: Schema,
    pub kind: CallKind,
    /// `strict`, and anything else a dialect adds to a function definition.
    pub extra: Map<String, Value>,
}

impl FunctionTool {
    /// A function of ours (a configured tool, an MCP server's, another
    /// agent, memory, knowledge): made once where the tool is (its schema
    /// written as JSON text then), and shared by each request's list.
    pub fn function(name: &str, description: &str, parameters: &Value) -> FunctionTool {
        FunctionTool {
            name: name.to_owned(),
            description: Description::new(description),
            parameters: Schema::from(parameters),
            kind: CallKind::Function,
            extra: Map::new(),
        }
    }
}

/// JSON text kept as it came (or as we wrote it): what the proxy only passes
/// on is not parsed into values and written out again.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonText(Box<str>);

impl JsonText {
    /// Text checked to be JSON where it was read or written.
    fn new(json: Raw<'_>) -> JsonText {
        JsonText(json.get().into())
    }

    /// The length of its JSON text.
    pub fn json_len(&self) -> usize {
        self.0.len()
    }

    /// The text as [`json::write`](crate::json::write) writes it.
    pub fn raw(&self) -> Raw<'_> {
        Raw::written(&self.0)
    }

    /// What it reads as (for a test or a look inside).
    fn parse<T: serde::de::DeserializeOwned + Default>(&self) -> T {
        serde_json::from_str(&self.0).unwrap_or_default()
    }
}

/// A tool's description, kept as the JSON string it came as (quotes and
/// escapes included). Claude Code's are 18 KB of prose: read into a
/// `String` and escaped again on the way out, they cost twice this copy.
#[derive(Debug, Clone, PartialEq)]
pub struct Description(JsonText);

impl Description {
    /// Ours, from its text: none when empty.
    pub fn new(text: &str) -> Option<Description> {
        if text.is_empty() {
            return None;
        }
        Some(Description(JsonText(crate::json::to_string(text).into())))
    }

    /// A client's, as sent: none unless it is a JSON string.
    pub fn from_json(json: Raw<'_>) -> Option<Description> {
        json.get()
            .starts_with('"')
            .then(|| Description(JsonText::new(json)))
    }

    /// Its text.
    pub fn text(&self) -> String {
        self.0.parse()
    }
}

impl std::ops::Deref for Description {
    type Target = JsonText;

    fn deref(&self) -> &JsonText {
        &self.0
    }
}

/// A JSON schema, kept as its JSON text. A coding agent's tools hold tens
/// of KiB of schemas for a whole stream: as a `Value`, every object in them
/// would be a map of its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema(JsonText);

impl Schema {
    /// The schema of a function without arguments.
    pub fn empty() -> Schema {
        Schema(JsonText::new(Raw::written(
            r#"{"type":"object","properties":{}}"#,
        )))
    }

    /// The schema as JSON.
    pub fn to_value(&self) -> Value {
        self.0.parse()
    }
}

impl std::ops::Deref for Schema {
    type Target = JsonText;

    fn deref(&self) -> &JsonText {
        &self.0
    }
}

impl From<&Value> for Schema {
    fn from(schema: &Value) -> Schema {
        Schema(JsonText(crate::json::to_string(schema).into()))
    }
}

impl From<Raw<'_>> for Schema {
    fn from(schema: Raw<'_>) -> Schema {
        Schema(JsonText::new(schema))
    }
}

/// The sampling and output options the core maps between dialects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    pub stream: bool,
    /// Chat's `stream_options.include_usage`.
    pub include_usage: bool,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Anthropic's, and llama.cpp's and vLLM's chat extension: a chat
    /// upstream's (OpenAI's Responses API has none, and refuses it).
    pub top_k: Option<u64>,
    pub stop: Vec<String>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// `low` | `medium` | `high` (…): chat `reasoning_effort`, Responses `reasoning.effort`.
    pub reasoning_effort: Option<String>,
    /// Responses `reasoning.summary` (`auto`, `concise`, `detailed`).
    pub reasoning_summary: Option<String>,
    /// Thinking switched on or off by the client (llama.cpp `enable_thinking`).
    pub thinking: Option<bool>,
    /// Structured output: a JSON schema (`{name, schema, strict}`) or `json_object`.
    pub format: Option<Format>,
    pub user: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    JsonObject,
    /// `{name, schema, strict?}` as both OpenAI dialects carry it.
    JsonSchema(Value),
}

// ------------------------------------------------------------ round events

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Finish {
    #[default]
    Stop,
    /// A token limit (or the loop's own round limit) cut the answer.
    Length,
    ToolCalls,
    ContentFilter,
}

/// What one piece of an upstream answer carries: a round decoder turns each
/// upstream event into one of these, borrowing from the event's bytes.
#[derive(Debug, Default, PartialEq)]
pub struct Delta<'a> {
    pub reasoning: Option<Cow<'a, str>>,
    /// `reasoning` is a summary of the model's reasoning (a Responses
    /// upstream's `reasoning_summary_text`), not its own words.
    pub summary: bool,
    pub content: Option<Cow<'a, str>>,
}

/// The end of one round: everything that is only whole at the end.
#[derive(Debug, Default, PartialEq)]
pub struct RoundEnd {
    pub calls: Vec<ToolCall>,
    /// Reasoning items to carry into the next round unchanged.
    pub reasoning: Vec<Reasoning>,
    pub finish: Option<Finish>,
    pub usage: Usage,
}

/// An upstream event that is an error report (carried to the client as the
/// upstream's error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamError {
    pub status: u16,
    pub body: bytes::Bytes,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A part a model cannot take is named by its type and size, never its
    /// bytes, whatever its `data:` URL's encoding.
    #[test]
    fn a_part_is_named_without_its_bytes() {
        let image = |url: &str| Part::Image {
            url: url.into(),
            detail: None,
        };
        let base64 = format!("data:image/png;base64,{}", "A".repeat(4000));
        let svg = format!("data:image/svg+xml;utf8,{}", "<svg/>".repeat(400));
        let long = format!("https://example.com/{}", "x".repeat(300));
        let not_shown = ", not shown: the model takes no images]";
        assert_eq!(
            image(&base64).named(),
            format!("[image: image/png, 3 KiB{not_shown}")
        );
        assert_eq!(
            image(&svg).named(),
            format!("[image: image/svg+xml, 3 KiB{not_shown}")
        );
        assert!(image(&long).named().contains(&format!("{}…", &long[..200])));
        let pdf = Part::File(FilePart {
            data: Some(format!("data:application/pdf;base64,{}", "A".repeat(40))),
            name: Some("a.pdf".into()),
            ..FilePart::default()
        });
        assert_eq!(
            pdf.named(),
            "[file: a.pdf, application/pdf, 1 KiB, not shown: the model takes no files]"
        );
    }

    #[derive(Debug, Clone)]
    enum Add {
        Back(String),
        Front(String),
        Message(Vec<String>),
    }

    fn add() -> impl Strategy<Value = Add> {
        let text = "[a-z \n\"\\\\\u{e9}\u{1}\u{2028}]{0,12}";
        prop_oneof![
            text.prop_map(Add::Back),
            text.prop_map(Add::Front),
            proptest::collection::vec(text, 0..3).prop_map(Add::Message),
        ]
    }

    proptest! {
        /// However it was put together, a prompt reads, measures and writes
        /// as its texts joined: blank lines between parts, a message's
        /// texts a line apart.
        #[test]
        fn a_prompt_is_its_texts_joined(adds in proptest::collection::vec(add(), 0..6)) {
            let mut prompt = Prompt::default();
            let mut parts: Vec<String> = Vec::new();
            for add in adds {
                match add {
                    Add::Back(text) => {
                        parts.push(text.clone());
                        prompt.push(text);
                    }
                    Add::Front(text) => {
                        parts.insert(0, text.clone());
                        prompt.push_front(text);
                    }
                    Add::Message(texts) => {
                        let message = Message {
                            role: Role::System,
                            content: texts.iter().cloned().map(Part::Text).collect(),
                            extra: Map::new(),
                        };
                        parts.push(message.text_content());
                        prompt.push_message(message);
                    }
                }
            }
            let joined = parts.join("\n\n");
            prop_assert_eq!(prompt.text(), joined.as_str());
            prop_assert_eq!(prompt.pieces().collect::<String>(), joined.as_str());
            prop_assert_eq!(prompt.len(), joined.len());
            prop_assert_eq!(prompt.is_empty(), joined.is_empty());
            prop_assert_eq!(prompt.clone().some().is_some(), !parts.is_empty());
            let mut written = Vec::new();
            prompt.write_json(&mut written);
            prop_assert_eq!(written, serde_json::to_vec(&joined).unwrap());
        }
    }
}

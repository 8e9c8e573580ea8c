//! OpenAI chat-completions wire types: tool calls and definitions, the
//! routing peek of a request (the chat front decodes the rest itself, see
//! `front::chat`), and answers. Chunks read from upstreams borrow from the
//! event bytes; what the proxy writes is its own strict types.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json;
use crate::json::scan::{BadJson, ScanError, Scanner};

// ---------------------------------------------------------------- requests

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ToolCall {
    /// Empty when missing: an upstream's call is given one (as a stream's
    /// is), a client's is refused.
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// Just enough of a request to route it: the model, and each message's
/// role with its content left as raw JSON.
#[derive(Deserialize)]
pub struct RoutingPeek<'a> {
    #[serde(default, borrow)]
    pub model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub messages: Option<Vec<PeekMessage<'a>>>,
    /// Responses: a string or a list of items.
    #[serde(default, borrow)]
    pub input: Option<&'a serde_json::value::RawValue>,
    /// Responses `instructions`, or Messages `system`.
    #[serde(default, borrow, alias = "system")]
    pub instructions: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    pub stream: Option<bool>,
}

#[derive(Deserialize)]
pub struct PeekMessage<'a> {
    #[serde(default, borrow)]
    pub role: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub content: Option<&'a serde_json::value::RawValue>,
}

impl RoutingPeek<'_> {
    /// The number of Responses `input` items (a string is one).
    pub fn input_len(&self) -> Option<usize> {
        let raw = self.input?.get();
        if raw.starts_with('[') {
            serde_json::from_str::<Vec<&serde_json::value::RawValue>>(raw)
                .ok()
                .map(|items| items.len())
        } else {
            Some(1)
        }
    }

    /// What stays the same over a conversation: the raw system prompt
    /// (Responses `instructions`, Messages `system`, or the first
    /// system/developer message) and the first user message (or Responses
    /// input item).
    pub fn prefix(&self) -> (Option<&str>, Option<&str>) {
        let messages = self.messages.as_deref().unwrap_or_default();
        let content_of = |roles: &[&str]| {
            messages
                .iter()
                .find(|m| m.role.as_deref().is_some_and(|r| roles.contains(&r)))
                .and_then(|m| m.content.map(|c| c.get()))
        };
        let system = self
            .instructions
            .map(|i| i.get())
            .or_else(|| content_of(&["system", "developer"]));
        let first = match self.input {
            Some(input) if input.get().starts_with('[') => {
                serde_json::from_str::<Vec<&serde_json::value::RawValue>>(input.get())
                    .ok()
                    .and_then(|items| items.first().map(|i| i.get()))
            }
            Some(input) => Some(input.get()),
            None => content_of(&["user"]),
        };
        (system, first)
    }
}

// ------------------------------------------------------- upstream answers

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    /// Of the prompt's tokens, those the server had cached
    /// (`prompt_tokens_details.cached_tokens`): llama.cpp's KV cache reused,
    /// OpenAI's prompt cache. Clients bill and report by it.
    #[serde(
        default,
        rename = "prompt_tokens_details",
        deserialize_with = "cached_tokens"
    )]
    pub cached_tokens: u64,
    /// Of the completion's tokens, the reasoning's
    /// (`completion_tokens_details.reasoning_tokens`).
    #[serde(
        default,
        rename = "completion_tokens_details",
        deserialize_with = "reasoning_tokens"
    )]
    pub reasoning_tokens: u64,
}

/// A usage's `prompt_tokens_details` or `completion_tokens_details`: each
/// reads its one count (none, or `null`, is 0).
#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

fn cached_tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(Option::<Details>::deserialize(d)?
        .and_then(|d| d.cached_tokens)
        .unwrap_or(0))
}

fn reasoning_tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(Option::<Details>::deserialize(d)?
        .and_then(|d| d.reasoning_tokens)
        .unwrap_or(0))
}

impl Usage {
    /// As OpenAI writes it, by hand (see [`ChoiceOut`]); the details only
    /// where the upstream gave them.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.u64("prompt_tokens", self.prompt_tokens);
        o.u64("completion_tokens", self.completion_tokens);
        o.u64("total_tokens", self.total_tokens);
        if self.cached_tokens > 0 {
            let mut details = json::Object::new(o.name("prompt_tokens_details"));
            details.u64("cached_tokens", self.cached_tokens);
            details.end();
        }
        if self.reasoning_tokens > 0 {
            let mut details = json::Object::new(o.name("completion_tokens_details"));
            details.u64("reasoning_tokens", self.reasoning_tokens);
            details.end();
        }
        o.end();
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.cached_tokens += other.cached_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// One `chat.completion.chunk` (or an error event) from an upstream stream.
#[derive(Debug, Deserialize)]
pub struct ChunkIn<'a> {
    #[serde(default, borrow)]
    pub choices: Vec<ChoiceIn<'a>>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub error: Option<Value>,
}

impl<'a> ChunkIn<'a> {
    /// One event's data. Read by our scanner ([`json::scan`]): serde's
    /// derived readers took 3.5k instructions for a 150-byte chunk, half of
    /// what an agent's stream does per chunk. What the scanner does not
    /// take (no JSON, a value of another type, a member given twice) is
    /// read again by serde_json, whose value or error stands.
    pub fn read(data: &'a [u8]) -> serde_json::Result<ChunkIn<'a>> {
        scanned_or_serde(data, scan_chunk)
    }
}

/// A stream's chunks, read as [`ChunkIn::read`] reads each. The last chunk
/// read whole is remembered if it carried a text alone; a server writes
/// every such chunk of a stream in the same bytes but for that text
/// (llama.cpp and vLLM do; OpenAI's random `obfuscation` member does not),
/// so one whose bytes before and after its text are the remembered chunk's
/// is read by scanning that one string. The bytes around a string decide
/// what it is the value of, and nothing else in them changed: the chunk
/// reads as the remembered one with the new text. A whole chunk's scan was
/// 2.5k instructions for llama.cpp's 230 bytes, half of an agent's work a
/// streamed token.
#[derive(Default)]
pub struct ChunkReader {
    /// The remembered chunk.
    last: Vec<u8>,
    /// Where its text's string (quotes and all) begins and ends in it, and
    /// the member it is; `None` while no chunk is remembered.
    text: Option<(usize, usize, TextMember)>,
    /// Text chunks in a row read whole, though one was remembered: past
    /// [`MISSES`], the stream's chunks differ in more than their text, and
    /// the reader stops remembering them.
    misses: u8,
}

/// The delta member a remembered chunk's text is the value of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextMember {
    Content,
    ReasoningContent,
    Reasoning,
}

/// A chunk longer than this is not remembered: each stream holds its copy.
const REMEMBERED_CHUNK: usize = 2048;
/// Text chunks in a row not alike the remembered one before the reader
/// stops remembering (see [`ChunkReader`]).
const MISSES: u8 = 8;

impl ChunkReader {
    pub fn read<'a>(&mut self, data: &'a [u8]) -> serde_json::Result<ChunkIn<'a>> {
        if let Some(chunk) = self.alike(data) {
            self.misses = 0;
            return Ok(chunk);
        }
        let Some(chunk) = scanned(data, scan_chunk) else {
            self.text = None;
            return json::from_bytes(data);
        };
        self.remember(data, &chunk);
        Ok(chunk)
    }

    /// `data` read as the remembered chunk with another text, if that is
    /// what it is.
    fn alike<'a>(&self, data: &'a [u8]) -> Option<ChunkIn<'a>> {
        let (start, end, member) = self.text?;
        let after = &self.last[end..];
        let text_end = data.len().checked_sub(after.len())?;
        if text_end <= start || data[..start] != self.last[..start] || data[text_end..] != *after {
            return None;
        }
        // Whitespace around the string is JSON's; anything else, or a
        // string the scanner refuses, is read whole.
        let mut s = Scanner::new(json::utf8(&data[start..text_end])?);
        let text = s.text().ok()?;
        s.end().ok()?;
        let mut delta = DeltaIn::default();
        *match member {
            TextMember::Content => &mut delta.content,
            TextMember::ReasoningContent => &mut delta.reasoning_content,
            TextMember::Reasoning => &mut delta.reasoning,
        } = Some(text);
        Some(ChunkIn {
            choices: vec![ChoiceIn {
                delta: Some(delta),
                finish_reason: None,
            }],
            usage: None,
            error: None,
        })
    }

    /// Remembers `chunk` (read from `data`) if it carries a text alone:
    /// one choice, unfinished, its delta one text found in `data` as it is
    /// (no escapes, so where it lies is known), no usage and no error.
    fn remember(&mut self, data: &[u8], chunk: &ChunkIn<'_>) {
        let remembered = self.text.take().is_some();
        if self.misses == MISSES {
            return;
        }
        let [ChoiceIn {
            delta: Some(delta),
            finish_reason: None,
        }] = chunk.choices.as_slice()
        else {
            return;
        };
        if chunk.usage.is_some()
            || chunk.error.is_some()
            || delta.tool_calls.is_some()
            || data.len() > REMEMBERED_CHUNK
        {
            return;
        }
        let (text, member) = match (&delta.content, &delta.reasoning_content, &delta.reasoning) {
            (Some(text), None, None) => (text, TextMember::Content),
            (None, Some(text), None) => (text, TextMember::ReasoningContent),
            (None, None, Some(text)) => (text, TextMember::Reasoning),
            _ => return,
        };
        let Cow::Borrowed(text) = text else {
            return;
        };
        let Some(start) = (text.as_ptr() as usize).checked_sub(data.as_ptr() as usize) else {
            return;
        };
        let end = start + text.len();
        // The string's quotes, around the text borrowed from `data`.
        if start == 0 || data.get(start - 1) != Some(&b'"') || data.get(end) != Some(&b'"') {
            return;
        }
        // A text chunk again, read whole: not alike the one remembered.
        if remembered {
            self.misses += 1;
            if self.misses == MISSES {
                self.last = Vec::new();
                return;
            }
        }
        self.last.clear();
        self.last.extend_from_slice(data);
        self.text = Some((start - 1, end + 1, member));
    }
}

/// `data` read by `scan`, or, where it refuses, by serde_json, whose value
/// or error stands.
fn scanned_or_serde<'a, T: Deserialize<'a>>(
    data: &'a [u8],
    scan: fn(&'a str) -> Result<T, Refused>,
) -> serde_json::Result<T> {
    match scanned(data, scan) {
        Some(value) => Ok(value),
        None => json::from_bytes(data),
    }
}

/// `data` read by `scan`, if it is UTF-8 and the scanner takes it.
fn scanned<'a, T>(data: &'a [u8], scan: fn(&'a str) -> Result<T, Refused>) -> Option<T> {
    json::utf8(data).and_then(|text| scan(text).ok())
}

/// Where the scanner leaves a chunk or an answer to serde_json.
struct Refused;

impl From<ScanError> for Refused {
    fn from(_: ScanError) -> Refused {
        Refused
    }
}

impl From<BadJson> for Refused {
    fn from(_: BadJson) -> Refused {
        Refused
    }
}

/// A member's value into `slot`, the first time the member comes (`bit`,
/// of those `seen`): serde's derived readers refuse a second.
fn set<T>(seen: &mut u8, bit: u8, slot: &mut T, value: Result<T, Refused>) -> Result<(), Refused> {
    if *seen & bit != 0 {
        return Err(Refused);
    }
    *seen |= bit;
    *slot = value?;
    Ok(())
}

/// `null`, or what `read` reads: as `Option<T>` reads.
fn or_null<'a, T>(
    s: &mut Scanner<'a>,
    read: impl FnOnce(&mut Scanner<'a>) -> Result<T, Refused>,
) -> Result<Option<T>, Refused> {
    if s.null() {
        return Ok(None);
    }
    read(s).map(Some)
}

fn text<'a>(s: &mut Scanner<'a>) -> Result<Cow<'a, str>, Refused> {
    Ok(s.text()?)
}

fn array<'a, T>(
    s: &mut Scanner<'a>,
    mut read: impl FnMut(&mut Scanner<'a>) -> Result<T, Refused>,
) -> Result<Vec<T>, Refused> {
    let mut items = Vec::new();
    s.array(|s| {
        items.push(read(s)?);
        Ok::<_, Refused>(())
    })?;
    Ok(items)
}

fn owned(s: &mut Scanner<'_>) -> Result<String, Refused> {
    Ok(s.text()?.into_owned())
}

fn skip(s: &mut Scanner<'_>) -> Result<(), Refused> {
    s.value()?;
    Ok(())
}

fn scan_chunk(text: &str) -> Result<ChunkIn<'_>, Refused> {
    let mut s = Scanner::new(text);
    let mut chunk = ChunkIn {
        choices: Vec::new(),
        usage: None,
        error: None,
    };
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "choices" => set(&mut seen, 1, &mut chunk.choices, array(s, scan_choice)),
        "usage" => set(&mut seen, 2, &mut chunk.usage, Ok(s.parse()?)),
        "error" => set(&mut seen, 4, &mut chunk.error, Ok(s.parse()?)),
        _ => skip(s),
    })?;
    s.end()?;
    Ok(chunk)
}

fn scan_choice<'a>(s: &mut Scanner<'a>) -> Result<ChoiceIn<'a>, Refused> {
    let mut choice = ChoiceIn {
        delta: None,
        finish_reason: None,
    };
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "delta" => set(&mut seen, 1, &mut choice.delta, or_null(s, scan_delta)),
        "finish_reason" => set(&mut seen, 2, &mut choice.finish_reason, or_null(s, text)),
        _ => skip(s),
    })?;
    Ok(choice)
}

fn scan_delta<'a>(s: &mut Scanner<'a>) -> Result<DeltaIn<'a>, Refused> {
    let mut delta = DeltaIn::default();
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "content" => set(&mut seen, 1, &mut delta.content, or_null(s, text)),
        "reasoning_content" => set(&mut seen, 2, &mut delta.reasoning_content, or_null(s, text)),
        "reasoning" => set(&mut seen, 4, &mut delta.reasoning, or_null(s, text)),
        "tool_calls" => {
            let calls = or_null(s, |s| array(s, scan_call));
            set(&mut seen, 8, &mut delta.tool_calls, calls)
        }
        _ => skip(s),
    })?;
    Ok(delta)
}

fn scan_call<'a>(s: &mut Scanner<'a>) -> Result<ToolCallDelta<'a>, Refused> {
    let mut call = ToolCallDelta {
        index: None,
        id: None,
        function: None,
    };
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "index" => set(&mut seen, 1, &mut call.index, Ok(s.parse()?)),
        "id" => set(&mut seen, 2, &mut call.id, or_null(s, text)),
        "function" => set(&mut seen, 4, &mut call.function, or_null(s, scan_function)),
        _ => skip(s),
    })?;
    Ok(call)
}

fn scan_function<'a>(s: &mut Scanner<'a>) -> Result<FunctionDelta<'a>, Refused> {
    let mut function = FunctionDelta::default();
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "name" => set(&mut seen, 1, &mut function.name, or_null(s, text)),
        "arguments" => set(&mut seen, 2, &mut function.arguments, or_null(s, text)),
        _ => skip(s),
    })?;
    Ok(function)
}

#[derive(Debug, Deserialize)]
pub struct ChoiceIn<'a> {
    #[serde(default, borrow)]
    pub delta: Option<DeltaIn<'a>>,
    #[serde(default, borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DeltaIn<'a> {
    #[serde(default, borrow)]
    pub content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub reasoning_content: Option<Cow<'a, str>>,
    /// vLLM / OpenRouter name for the same thing.
    #[serde(default, borrow)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub tool_calls: Option<Vec<ToolCallDelta<'a>>>,
}

#[derive(Debug, Deserialize)]
pub struct ToolCallDelta<'a> {
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub function: Option<FunctionDelta<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub arguments: Option<Cow<'a, str>>,
}

/// A whole `chat.completion`: an answer not streamed, or an upstream's
/// answer in JSON to a stream request.
#[derive(Debug, Deserialize)]
pub struct CompletionIn {
    #[serde(default)]
    pub choices: Vec<CompletionChoiceIn>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

impl CompletionIn {
    /// A body, read as [`ChunkIn::read`] reads a chunk: 4.8k instructions
    /// for llama.cpp's 654-byte answer, where serde's derived readers took
    /// 5.5k (its `timings`, read by nobody, are skipped, not parsed).
    pub fn read(data: &[u8]) -> serde_json::Result<CompletionIn> {
        scanned_or_serde(data, scan_completion)
    }
}

fn scan_completion(text: &str) -> Result<CompletionIn, Refused> {
    let mut s = Scanner::new(text);
    let mut completion = CompletionIn {
        choices: Vec::new(),
        usage: None,
    };
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "choices" => {
            let choices = array(s, scan_completion_choice);
            set(&mut seen, 1, &mut completion.choices, choices)
        }
        "usage" => set(&mut seen, 2, &mut completion.usage, Ok(s.parse()?)),
        _ => skip(s),
    })?;
    s.end()?;
    Ok(completion)
}

fn scan_completion_choice(s: &mut Scanner<'_>) -> Result<CompletionChoiceIn, Refused> {
    let (mut message, mut finish_reason) = (None, None);
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "message" => set(&mut seen, 1, &mut message, scan_message(s).map(Some)),
        "finish_reason" => set(&mut seen, 2, &mut finish_reason, or_null(s, owned)),
        _ => skip(s),
    })?;
    Ok(CompletionChoiceIn {
        // Missing: serde's error names it.
        message: message.ok_or(Refused)?,
        finish_reason,
    })
}

fn scan_message(s: &mut Scanner<'_>) -> Result<CompletionMessageIn, Refused> {
    let mut message = CompletionMessageIn {
        content: None,
        reasoning_content: None,
        reasoning: None,
        tool_calls: Vec::new(),
    };
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "content" => set(&mut seen, 1, &mut message.content, or_null(s, owned)),
        "reasoning_content" => {
            let reasoning = or_null(s, owned);
            set(&mut seen, 2, &mut message.reasoning_content, reasoning)
        }
        "reasoning" => set(&mut seen, 4, &mut message.reasoning, or_null(s, owned)),
        "tool_calls" => {
            let calls = array(s, scan_tool_call);
            set(&mut seen, 8, &mut message.tool_calls, calls)
        }
        _ => skip(s),
    })?;
    Ok(message)
}

fn scan_tool_call(s: &mut Scanner<'_>) -> Result<ToolCall, Refused> {
    let (mut id, mut kind, mut function) = (None, None, None);
    let mut seen = 0;
    s.object(|s, name| match &*name {
        "id" => set(&mut seen, 1, &mut id, owned(s).map(Some)),
        "type" => set(&mut seen, 2, &mut kind, owned(s).map(Some)),
        "function" => {
            let read = scan_function_call(s).map(Some);
            set(&mut seen, 4, &mut function, read)
        }
        _ => skip(s),
    })?;
    Ok(ToolCall {
        id: id.unwrap_or_default(),
        kind: kind.unwrap_or_else(function_type),
        function: function.ok_or(Refused)?,
    })
}

fn scan_function_call(s: &mut Scanner<'_>) -> Result<FunctionCall, Refused> {
    let (mut name, mut arguments) = (None, None);
    let mut seen = 0;
    s.object(|s, member| match &*member {
        "name" => set(&mut seen, 1, &mut name, owned(s).map(Some)),
        "arguments" => set(&mut seen, 2, &mut arguments, owned(s).map(Some)),
        _ => skip(s),
    })?;
    Ok(FunctionCall {
        name: name.ok_or(Refused)?,
        arguments: arguments.unwrap_or_default(),
    })
}

#[derive(Debug, Deserialize)]
pub struct CompletionChoiceIn {
    pub message: CompletionMessageIn,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionMessageIn {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
}

// ------------------------------------------------------ what we write

/// A streamed chunk's one choice. Written by hand ([`ChoiceOut::write`]):
/// a stream writes one a token, and through serde each of its member names
/// was escaped as any string.
pub struct ChoiceOut<'a> {
    pub delta: DeltaOut<'a>,
    pub finish_reason: Option<&'static str>,
}

impl ChoiceOut<'_> {
    /// `{"index":0,"delta":…,"logprobs":null,"finish_reason":…}`
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.raw("index", "0");
        self.delta.write(o.object("delta"));
        o.raw("logprobs", "null");
        match self.finish_reason {
            Some(reason) => o.plain("finish_reason", reason),
            None => o.raw("finish_reason", "null"),
        }
        o.end();
    }
}

/// Only the members that are set are written.
#[derive(Default)]
pub struct DeltaOut<'a> {
    pub role: Option<&'static str>,
    pub content: Option<&'a str>,
    pub reasoning_content: Option<&'a str>,
    /// vLLM's name for `reasoning_content` (`reasoning_field`).
    pub reasoning: Option<&'a str>,
    pub tool_calls: Option<Vec<IndexedToolCall<'a>>>,
}

impl DeltaOut<'_> {
    fn write(&self, mut o: json::Object<'_>) {
        if let Some(role) = self.role {
            o.plain("role", role);
            // The role's chunk says `content: null` until text comes, as
            // llama-server's does: `""` opens a text part in the AI SDK
            // even when tool calls follow.
            if self.content.is_none() {
                o.raw("content", "null");
            }
        }
        o.optional("content", self.content);
        o.optional("reasoning_content", self.reasoning_content);
        o.optional("reasoning", self.reasoning);
        o.optional("tool_calls", self.tool_calls.as_ref());
        o.end();
    }
}

#[derive(Serialize)]
pub struct IndexedToolCall<'a> {
    pub index: usize,
    #[serde(flatten)]
    pub call: &'a ToolCall,
}

/// A `chat.completion`. Written by hand ([`CompletionOut::write`]), as
/// [`ChoiceOut`] is.
pub struct CompletionOut<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
    pub message: AssistantMessageOut<'a>,
    pub finish_reason: &'static str,
    pub usage: Usage,
}

impl CompletionOut<'_> {
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut o = json::Object::new(out);
        o.value("id", self.id);
        o.plain("object", "chat.completion");
        o.u64("created", self.created);
        o.value("model", self.model);
        o.list("choices", [self], |out, completion| {
            let mut choice = json::Object::new(out);
            choice.raw("index", "0");
            completion.message.write(choice.object("message"));
            choice.raw("logprobs", "null");
            choice.plain("finish_reason", completion.finish_reason);
            choice.end();
        });
        self.usage.write(o.name("usage"));
        o.end();
    }
}

/// The assistant's message: `content` always (`null` without text), the
/// rest only when set.
pub struct AssistantMessageOut<'a> {
    pub content: Option<&'a str>,
    pub reasoning_content: Option<&'a str>,
    pub reasoning: Option<&'a str>,
    pub tool_calls: Option<&'a [ToolCall]>,
}

impl AssistantMessageOut<'_> {
    fn write(&self, mut o: json::Object<'_>) {
        o.plain("role", "assistant");
        o.value("content", &self.content);
        o.optional("reasoning_content", self.reasoning_content);
        o.optional("reasoning", self.reasoning);
        o.optional("tool_calls", self.tool_calls);
        o.end();
    }
}

#[derive(Serialize)]
pub struct ModelCard<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub name: &'a str,
    pub description: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read`'s reading of `data` and serde's, as `Debug` shows them (a
    /// value or an error's message), are the same; `scan`, the scanner
    /// behind `read`, read it itself or left it to serde (`by_scanner`).
    fn reads_as_serde<'a, T: std::fmt::Debug + Deserialize<'a>>(
        data: &'a str,
        read: fn(&'a [u8]) -> serde_json::Result<T>,
        scan: fn(&'a str) -> Result<T, Refused>,
        by_scanner: bool,
    ) {
        let shown = |read: serde_json::Result<T>| match read {
            Ok(value) => format!("{value:?}"),
            Err(e) => format!("error: {e}"),
        };
        let ours = shown(read(data.as_bytes()));
        assert_eq!(
            ours,
            shown(json::from_bytes::<T>(data.as_bytes())),
            "{data}"
        );
        assert_eq!(
            scan(data).is_ok(),
            by_scanner,
            "read by the scanner: {data}"
        );
    }

    /// Each captured stream (`tests/fixtures/{llama.cpp,openai}/*.sse`):
    /// its file and its events' data, but for `[DONE]`.
    fn captured_streams() -> Vec<(std::path::PathBuf, Vec<String>)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let mut streams = Vec::new();
        for sub in ["llama.cpp", "openai"] {
            for entry in std::fs::read_dir(format!("{dir}/{sub}")).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "sse") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let data = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|data| *data != "[DONE]")
                    .map(str::to_owned)
                    .collect();
                streams.push((path, data));
            }
        }
        streams
    }

    #[test]
    fn every_captured_chunk_reads_as_serde_reads_it() {
        let mut read = 0;
        for (_, chunks) in captured_streams() {
            for data in &chunks {
                // Read by the scanner, not by serde after it.
                reads_as_serde(data, ChunkIn::read, scan_chunk, true);
                read += 1;
            }
        }
        assert!(read > 90, "{read} chunks read");
    }

    /// A chunk as [`ChunkReader`] reads it after `before`, shown, and
    /// whether it was read as alike the remembered one.
    fn read_after(before: &[&str], data: &str) -> (String, bool) {
        let mut reader = ChunkReader::default();
        for chunk in before {
            reader.read(chunk.as_bytes()).unwrap();
        }
        let alike = reader.alike(data.as_bytes()).is_some();
        (format!("{:?}", reader.read(data.as_bytes())), alike)
    }

    #[test]
    fn a_streams_chunks_read_as_each_reads_alone() {
        let mut read = 0;
        for (path, chunks) in captured_streams() {
            let mut reader = ChunkReader::default();
            let mut alike = 0;
            for data in &chunks {
                alike += usize::from(reader.alike(data.as_bytes()).is_some());
                let ours = format!("{:?}", reader.read(data.as_bytes()));
                assert_eq!(
                    ours,
                    format!("{:?}", ChunkIn::read(data.as_bytes())),
                    "{data}"
                );
            }
            read += chunks.len();
            // llama.cpp's answer: all but the role's chunk, the first
            // text's (escaped: `\n\n`), the next (remembered) and the
            // finish.
            if path.ends_with("plain-stream.sse") {
                assert_eq!((alike, chunks.len()), (9, 13));
            }
        }
        assert!(read > 150, "{read} chunks read");
    }

    #[test]
    fn a_chunk_alike_but_for_its_text_reads_as_it_reads_alone() {
        let shape = |text: &str| {
            format!(
                r#"{{"choices":[{{"finish_reason":null,"index":0,"delta":{{"content":{text}}}}}],"created":1,"id":"c","object":"chat.completion.chunk"}}"#
            )
        };
        let first = shape(r#""Yes""#);
        let reasoning = r#"{"choices":[{"delta":{"reasoning_content":" hmm"}}]}"#;
        for (text, is_alike) in [
            (r#"" clear""#, true),
            (r#""""#, true),
            (r#""a\"b\n\u00e9 ✓""#, true),
            (r#" "spaced" "#, true),
            ("null", false),
            ("5", false),
            (r#""a","content":"b""#, false),
            (
                r#""a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2},"x":{"y":"b""#,
                false,
            ),
            (r#""\ud800""#, false),
            (r#""open"#, false),
            (r#""tab	in""#, false),
        ] {
            let data = shape(text);
            let (ours, alike) = read_after(&[&first], &data);
            assert_eq!(
                ours,
                format!("{:?}", ChunkIn::read(data.as_bytes())),
                "{data}"
            );
            assert_eq!(alike, is_alike, "{data}");
        }
        // Another member, another end, another beginning: read whole.
        let finished = first.replace("null", r#""stop""#);
        let longer = first.replace(r#""id":"c""#, r#""id":"cc""#);
        for data in [
            finished,
            longer,
            first.replace("\"created\":1", "\"created\":2"),
        ] {
            let (ours, alike) = read_after(&[&first], &data);
            assert_eq!(ours, format!("{:?}", ChunkIn::read(data.as_bytes())));
            assert!(!alike, "{data}");
        }
        // The remembered chunk is the last one read whole: a reasoning
        // delta's text is a reasoning delta's.
        let next = reasoning.replace(" hmm", " so");
        let (ours, alike) = read_after(&[&first, reasoning], &next);
        assert!(
            alike && ours.contains("reasoning_content: Some(\" so\")"),
            "{ours}"
        );
        // Nothing is remembered from a chunk that finishes, has escapes in
        // its text, or has two texts.
        for before in [
            shape(r#""a\nb""#),
            first.replace("null", r#""stop""#),
            r#"{"choices":[{"delta":{"content":"a","reasoning":"b"}}]}"#.into(),
        ] {
            let data = before.replace("a\\nb", "x").replace("\"a\"", "\"x\"");
            let (ours, alike) = read_after(&[&before], &data);
            assert_eq!(ours, format!("{:?}", ChunkIn::read(data.as_bytes())));
            assert!(!alike, "{before}");
        }
        // Shorter than the remembered chunk's bytes around its text, or
        // not UTF-8 in the text: read whole (serde's error stands).
        let mut reader = ChunkReader::default();
        reader.read(first.as_bytes()).unwrap();
        let (start, end, _) = reader.text.unwrap();
        let mut cut_short = first.as_bytes()[..start].to_vec();
        cut_short.extend_from_slice(&first.as_bytes()[end + 2..]);
        let mut not_utf8 = first.as_bytes()[..start].to_vec();
        not_utf8.extend_from_slice(b"\"\xff\"");
        not_utf8.extend_from_slice(&first.as_bytes()[end..]);
        for data in [cut_short, not_utf8] {
            assert!(reader.alike(&data).is_none());
            let ours = format!("{:?}", reader.read(&data));
            assert_eq!(ours, format!("{:?}", ChunkIn::read(&data)));
        }
    }

    #[test]
    fn a_stream_whose_chunks_differ_beyond_their_text_is_not_remembered_for_long() {
        // OpenAI's chunks: a random `obfuscation` member in each.
        let chunk = |n: usize| {
            format!(r#"{{"choices":[{{"delta":{{"content":"t"}}}}],"obfuscation":"{n}"}}"#)
        };
        let mut reader = ChunkReader::default();
        for n in 0..20 {
            let data = chunk(n);
            assert!(reader.alike(data.as_bytes()).is_none());
            let ours = format!("{:?}", reader.read(data.as_bytes()));
            assert_eq!(ours, format!("{:?}", ChunkIn::read(data.as_bytes())));
        }
        assert!(reader.text.is_none() && reader.last.capacity() == 0);
        assert_eq!(reader.misses, MISSES);
        // Text chunks alike but for their text, among chunks of another
        // kind (which are no misses): none is missed.
        let mut reader = ChunkReader::default();
        for n in 0..20 {
            let data = match n % 5 {
                4 => r#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#.into(),
                _ => format!(r#"{{"choices":[{{"delta":{{"content":"{n}"}}}}]}}"#),
            };
            reader.read(data.as_bytes()).unwrap();
        }
        assert_eq!(reader.misses, 0);
    }

    #[test]
    fn a_chunk_off_the_common_shape_reads_as_serde_reads_it() {
        for data in [
            // Escapes in values and in names; whitespace; unknown members
            // of every type, nested.
            r#" { "choices" : [ { "delta" : { "content" : "a\"b\u00e9\n", "reas\u006fning":"r" } , "index":0,"logprobs":{"content":[{"t":[1,2.5e3,-0.1,true,null]}]}} ] , "x":{} } "#,
            r#"{"choices":[{"delta":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
            r#"{"choices":[],"usage":null}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":null,"type":"function","function":{"arguments":"{\"a\":"}},{"index":0,"function":null}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":null,"content":null,"reasoning_content":null}},{"delta":{"content":"second"}}]}"#,
            r#"{"error":{"message":"boom","code":500}}"#,
            r#"{"error":null}"#,
            r#"{}"#,
        ] {
            reads_as_serde(data, ChunkIn::read, scan_chunk, true);
        }
        for data in [
            // serde's readers take a struct as an array of its fields.
            r#"[[{"delta":{"content":"x"}}],null,null]"#,
            // What serde refuses: its error stands.
            r#"{"choices":[{"delta":{"content":"a"}}],"choices":[]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":-1}]}}]}"#,
            r#"{"choices":null}"#,
            r#"{"choices":[{"delta":{"content":"\ud800"}}]}"#,
            r#"{"choices":[]} x"#,
            r#"{"choices":[{"delta":{"content":"a"}]}"#,
            r#"{"choices":[{"delta":{"content":"tab	in"}}]}"#,
            "",
        ] {
            reads_as_serde(data, ChunkIn::read, scan_chunk, false);
        }
        // A stray byte in a member nobody reads passes, as before.
        let data = b"{\"id\":\"\xff\",\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}";
        let shown = format!("{:?}", ChunkIn::read(data));
        assert_eq!(shown, format!("{:?}", json::from_bytes::<ChunkIn>(data)));
        assert!(shown.contains("\"ok\""), "{shown}");
    }

    #[test]
    fn every_captured_answer_reads_as_serde_reads_it() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama.cpp");
        let mut read = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with("-nonstream.json") {
                continue;
            }
            let data = std::fs::read_to_string(&path).unwrap();
            reads_as_serde(&data, CompletionIn::read, scan_completion, true);
            read += 1;
        }
        assert_eq!(read, 3, "plain, reasoning and tool-call answers");
    }

    #[test]
    fn an_answer_off_the_common_shape_reads_as_serde_reads_it() {
        for data in [
            r#" { "choices" : [ { "message" : { "content" : "a\"b\u00e9\n", "reas\u006fning":"r", "role":"assistant" } , "finish_reason" : "length" , "logprobs":{"content":[{"t":[1,2.5e3,-0.1,true,null]}]}} ] , "x":{} } "#,
            r#"{"choices":[{"message":{"content":null,"reasoning_content":"think","tool_calls":[{"id":"c1","function":{"name":"f"}},{"id":"c2","type":"custom","function":{"name":"g","arguments":"{\"a\":1}","x":0}}]},"finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
            r#"{"choices":[{"message":{}},{"message":{"content":"second"},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"choices":[]}"#,
            r#"{}"#,
            // No id: the round's end gives the call one.
            r#"{"choices":[{"message":{"tool_calls":[{"function":{"name":"f"}}]}}]}"#,
        ] {
            reads_as_serde(data, CompletionIn::read, scan_completion, true);
        }
        for data in [
            r#"[[{"message":{"content":"x"}}],null]"#,
            r#"{"choices":[{"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":null}]}"#,
            r#"{"choices":[{"message":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":null}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[{"id":"c","type":null,"function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":null}}]}}]}"#,
            r#"{"choices":[{"message":{"content":"\ud800"}}]}"#,
            r#"{"choices":[]} x"#,
            "",
        ] {
            reads_as_serde(data, CompletionIn::read, scan_completion, false);
        }
    }

    #[test]
    fn reads_llama_cpp_tool_call_delta() {
        let event = r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"abc","type":"function","function":{"name":"get_weather","arguments":"{"}}]}}],"created":1,"id":"x","model":"tiny","system_fingerprint":"b","object":"chat.completion.chunk"}"#;
        let chunk: ChunkIn = serde_json::from_str(event).unwrap();
        let calls = chunk.choices[0]
            .delta
            .as_ref()
            .unwrap()
            .tool_calls
            .as_ref()
            .unwrap();
        assert_eq!(calls[0].index, Some(0));
        assert_eq!(
            calls[0].function.as_ref().unwrap().name.as_deref(),
            Some("get_weather")
        );
    }
}

//! Front doors: the client's dialect. Each front has a request decoder (wire
//! request → [`Conversation`]) and an [`Encoder`] that turns the loop's
//! neutral output into that dialect's stream or single response. Both are
//! pure: bytes and types in, bytes out, no I/O.
//!
//! [`Conversation`]: crate::conversation::Conversation

pub mod budget;
pub mod chat;
pub mod defined_tools;
pub mod known_entries;
pub mod known_tools;
pub mod messages;
pub mod responses;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::conversation::{
    Description, Dialect, Finish, FunctionTool, Item, Part, Prompt, Reasoning, Schema, ToolCall,
    Usage,
};
use crate::error::ApiError;
use crate::json::scan::{BadJson, Built, ScanError, Scanner, MAX_DEPTH};
use crate::json::Raw;
pub use budget::Found;
use known_entries::Decoding;
use known_tools::Declared;

/// What a piece of an answer is, for [`Encoder::continues`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Text,
    /// The model's reasoning (or a summary of it).
    Reasoning,
    /// The proxy's progress notes.
    Note,
}

/// Writes one answer in a client's dialect. Streaming encoders append SSE
/// bytes to `out` as each call comes; non-streaming ones collect and write
/// the whole response body in [`Encoder::finish`].
pub trait Encoder: Send {
    /// Whether the answer is an event stream.
    fn streams(&self) -> bool;

    /// The events that open a stream (chat: the role chunk; Responses:
    /// `response.created`, `response.in_progress`). Called once, first.
    fn open(&mut self, out: &mut Vec<u8>);

    /// A piece of the model's reasoning.
    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>);

    /// A piece of a summary of the model's reasoning (a Responses
    /// upstream's), for fronts that tell a summary from the reasoning.
    fn summary(&mut self, text: &str, out: &mut Vec<u8>) {
        self.reasoning(text, out);
    }

    /// A piece of the proxy's own progress notes (a tool call, a called
    /// agent's text), shown on the reasoning channel. The fronts whose
    /// clients send reasoning back (Responses, Messages) put it in an item
    /// or block of its own, marked, which their decoders drop: the model
    /// did not write it, and the calls it names are not in the client's
    /// history.
    fn note(&mut self, text: &str, out: &mut Vec<u8>) {
        self.reasoning(text, out);
    }

    /// A reasoning item the upstream completed (with its opaque encrypted
    /// content), for fronts that hand reasoning items to the client.
    fn reasoning_item(&mut self, item: &Reasoning, out: &mut Vec<u8>) {
        let _ = (item, out);
    }

    /// A piece of the answer's text.
    fn content(&mut self, text: &str, out: &mut Vec<u8>);

    /// Whether the next piece on `channel` extends the one written last
    /// (chat's one `content` and one reasoning), rather than beginning an
    /// item or block of its own (the Responses and Messages fronts, after
    /// another kind or a call): only then does a new round's text or
    /// reasoning start with a blank line, and a note's line with a break.
    fn continues(&self, channel: Channel) -> bool {
        let _ = channel;
        true
    }

    /// Whether the answer carries reasoning at all (Messages: only when the
    /// client switched thinking on). Otherwise the model's reasoning and the
    /// proxy's notes are left out, and a stream is not opened for them.
    fn takes_reasoning(&self) -> bool {
        true
    }

    /// Tool calls the client runs itself.
    fn client_calls(&mut self, calls: &[ToolCall], out: &mut Vec<u8>);

    /// Ends the answer: the closing events of a stream, or the whole body.
    fn finish(&mut self, finish: Finish, usage: Usage, out: &mut Vec<u8>);

    /// An error body in this dialect, before anything was sent, from an
    /// OpenAI-shaped error body (`{"error":{message,type,param,code}}`).
    fn error_body(&self, status: u16, openai_error: Bytes) -> Bytes {
        let _ = status;
        openai_error
    }

    /// The status of an error answered before anything was sent, for a
    /// dialect whose status for a case differs (Anthropic's 529 overloaded).
    fn error_status(&self, status: u16) -> u16 {
        status
    }

    /// An error once the stream is open: the dialect's error event.
    fn stream_error(&mut self, status: u16, openai_error: &[u8], out: &mut Vec<u8>);

    /// Whether the error event ends the stream as the dialect's own end
    /// does, so the body ends cleanly after it (Responses' `response.failed`,
    /// a Messages `error`: what OpenAI's and Anthropic's servers do, and what
    /// a client reads the failure from; Codex reports a `response.failed`
    /// only from a stream that ended). Chat has no such event: a cut body
    /// there is what tells a client the answer is not whole.
    fn error_ends_stream(&self) -> bool {
        false
    }

    /// What keeps a silent stream alive: an SSE comment, unless the dialect
    /// has its own event for it (Anthropic's `ping`).
    fn heartbeat(&self) -> &'static [u8] {
        crate::sse::HEARTBEAT
    }
}

// ------------------------------------------------ shared by the fronts

/// A new id: `prefix`, the time in milliseconds (12 hex digits), then 20
/// random alphanumerics. Leading with the time, as OpenAI's own ids do, keeps
/// a store's index of them append-only: a batch of stored responses dirties
/// the index's last page or two, not one random page each.
fn new_id(prefix: &str) -> String {
    let mut suffix = [0u8; 32];
    let (time, random) = suffix.split_at_mut(12);
    // Its low 6 bytes fill 12 hex digits exactly: it cannot fail.
    let _ = hex::encode_to_slice(&crate::store::unix_now_ms().to_be_bytes()[2..], time);
    random.copy_from_slice(&random_alphanumerics::<20>());
    prefixed(prefix, &suffix)
}

/// A tool result's parts: their texts, one a line, and its images and files
/// apart ([`ToolResult::attachments`]). A part of another kind counts by its
/// `text`, if it has one; no upstream reads the rest.
///
/// [`ToolResult::attachments`]: crate::conversation::ToolResult::attachments
fn result_parts(parts: impl IntoIterator<Item = Part>) -> (String, Vec<Part>) {
    let mut texts = Vec::new();
    let mut attachments = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) => texts.push(text),
            Part::Other(Value::Object(mut part)) => {
                if let Some(Value::String(text)) = part.remove("text") {
                    texts.push(text);
                }
            }
            Part::Other(_) => {}
            other => attachments.push(other),
        }
    }
    texts.retain(|text| !text.is_empty());
    (texts.join("\n"), attachments)
}

/// `prefix` then `N` random alphanumerics: an id with no time in it (a chat
/// completion's, a tool call's, a memory note's).
pub fn random_id<const N: usize>(prefix: &str) -> String {
    prefixed(prefix, &random_alphanumerics::<N>())
}

/// `prefix` then `suffix`, ASCII by construction (the one check is cheap),
/// in a string sized once.
fn prefixed(prefix: &str, suffix: &[u8]) -> String {
    let mut id = String::with_capacity(prefix.len() + suffix.len());
    id.push_str(prefix);
    id.push_str(std::str::from_utf8(suffix).unwrap_or_default());
    id
}

/// `N` random alphanumerics, 7 from each random word: a word read as a
/// fraction of 2^64, times 62, has its digit as the integer part and the
/// rest of the word left for the next. Each of the 62^7 runs of seven
/// digits comes from 5,238,149 or 5,238,150 of the 2^64 words: uniform to
/// one part in five million. Twenty cost about 400 instructions, against
/// 950 with a bounded draw per character (fastrand's `alphanumeric`); a
/// Responses answer makes three ids, a chat answer one.
fn random_alphanumerics<const N: usize>() -> [u8; N] {
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut random = fastrand::Rng::new();
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(7) {
        let mut fraction = random.u64(..);
        for digit in chunk {
            let scaled = u128::from(fraction) * 62;
            // The high word is below 62: the index cannot go out of bounds.
            *digit = DIGITS[(scaled >> 64) as usize];
            fraction = scaled as u64;
        }
    }
    out
}

/// A request body, which must be a JSON object, read in one pass: the
/// root's members named in `names` set apart ([`Picked`]), the others in a
/// map, and its `tools` (most of a coding agent's request) each parsed but
/// for its schema and description, only scanned and kept as the text they
/// came as ([`scan`](crate::json::scan)), and the tools it groups, read as
/// tools: as `shape` names them. The member named `history`, when it is an
/// array, is read entry by entry ([`Entry`]) rather than set apart. A
/// member given twice is the last.
///
/// Tool lists and entries the body's shape pass found known (`found`) are
/// taken as it found them.
pub fn picked_object_and_tools<'a, const N: usize>(
    body: &'a [u8],
    shape: ToolShape,
    names: &'static [&'static str; N],
    history: Option<&'static str>,
    found: &Found,
) -> Result<ReadBody<'a, N>, ApiError> {
    let text = crate::json::utf8(body).ok_or_else(|| not_json(explain(body, None)))?;
    let mut scan = Scanner::new(text);
    let mut read = ReadBody {
        picked: Picked::new(names),
        rest: Map::new(),
        tools: ReadTools::Read {
            tools: Tools::None,
            text: "",
        },
        history: None,
    };
    let members = scan.object(|scan, name| {
        if name == "tools" {
            let rest = scan.rest();
            let known = found.tools(body, scan.offset(), shape.dialect);
            read.tools = match known.or_else(|| known_tools::find(shape.dialect, rest)) {
                Some((len, declared)) => {
                    scan.pass(len);
                    ReadTools::Known(declared)
                }
                None => {
                    let start = scan.offset();
                    let tools = lenient(scan, shape, Nesting::List(0))?;
                    ReadTools::Read {
                        tools,
                        text: &rest[..scan.offset() - start],
                    }
                }
            };
        } else if let Some(slot) = read.picked.position(&name) {
            // Given twice, the last: as an array or as a value.
            let listed = history == Some(&*name);
            if !listed {
                read.picked.set(slot, Some(scan.parse_value()?));
            } else if scan.peek() != Some(b'[') {
                read.history = None;
                read.picked.set(slot, Some(scan.parse_value()?));
            } else {
                // A value given before the array is no longer the last.
                read.picked.set(slot, None);
                read.history = match entries(scan, shape.dialect, body, found) {
                    Some(entries) => Some(entries),
                    // Parsed whole, as any value: its entries never kept.
                    None => match scan.parse_value()? {
                        Value::Array(values) => Some(values.into_iter().map(Entry::from).collect()),
                        _ => None,
                    },
                };
            }
        } else {
            let value = scan.parse_value()?;
            read.rest.insert(name.into_owned(), value);
        }
        Ok::<_, BadJson>(())
    });
    members
        .and_then(|()| Ok(scan.end()?))
        .map_err(|e| not_json(explain(body, Some(e))))?;
    Ok(read)
}

/// A request body as [`picked_object_and_tools`] read it.
pub struct ReadBody<'a, const N: usize> {
    pub picked: Picked<N>,
    /// The root's other members.
    pub rest: Map<String, Value>,
    pub tools: ReadTools<'a>,
    /// The history list's entries, when it is an array (it is then not
    /// among the picked values).
    pub history: Option<Vec<Entry<'a>>>,
}

/// An entry of a request's history (a chat or Messages request's `messages`,
/// a Responses request's `input`).
pub enum Entry<'a> {
    /// Decoded before, known by its text ([`known_entries`]), which it
    /// came as again.
    Known {
        decoding: Arc<Decoding>,
        text: &'a str,
    },
    /// Read now: its value, the text it came as, and its
    /// [`head`](known_entries::head).
    Read {
        value: Built,
        text: &'a str,
        head: Option<u64>,
    },
}

/// A value read otherwise (parsed whole, or a stored conversation's),
/// never kept.
impl From<Value> for Entry<'_> {
    fn from(value: Value) -> Self {
        Entry::Read {
            value: Built::Value(value),
            text: "",
            head: None,
        }
    }
}

impl Entry<'_> {
    /// The entry as a value, for what reads it as one (a store keeping a
    /// request's input).
    pub fn into_value(self) -> Result<Value, ApiError> {
        match self {
            Entry::Read { value, .. } => Ok(value.into_value()),
            Entry::Known { text, .. } => crate::json::from_bytes(text.as_bytes()).map_err(not_json),
        }
    }
}

/// An array's entries, each found among those decoded before or built.
/// `None`, the scanner back where it stood, where an entry is none the
/// scanner builds (a number serde_json rounds, nesting near serde_json's
/// bound) or the array is no JSON: it is then parsed whole, as any value,
/// for serde_json's values or its error, as without the entries.
fn entries<'a>(
    scan: &mut Scanner<'a>,
    dialect: Dialect,
    body: &[u8],
    found: &Found,
) -> Option<Vec<Entry<'a>>> {
    let start = scan.offset();
    let mut entries = Vec::new();
    let read = scan.array(|scan| {
        let rest = scan.rest();
        let (known, head) = match found.entry(body, scan.offset(), dialect) {
            Some(known) => (Some(known), None),
            None => {
                let head = known_entries::head(rest.as_bytes());
                let known = head.and_then(|head| known_entries::find(dialect, head, rest));
                (known, head)
            }
        };
        let entry = match known {
            Some((len, decoding)) => {
                scan.pass(len);
                let text = &rest[..len];
                Entry::Known { decoding, text }
            }
            None => {
                let at = scan.offset();
                let value = scan.built_entry().ok_or(ScanError { at })?;
                let text = &rest[..scan.offset() - at];
                Entry::Read { value, text, head }
            }
        };
        entries.push(entry);
        Ok::<_, ScanError>(())
    });
    if read.is_err() {
        scan.back_to(start);
        return None;
    }
    Some(entries)
}

/// A history's entries as items (and system prompt text), each decoded by
/// `decode` (given it as built, its place, and where its items and text go)
/// unless it was before; those decoded now are known to the requests that
/// follow, unless `decode` says its decoding depends on more than the
/// entry.
pub fn decode_history(
    entries: Vec<Entry<'_>>,
    dialect: Dialect,
    list: &'static str,
    items: &mut Vec<Item>,
    system: &mut Prompt,
    mut decode: impl FnMut(Built, At<'_>, &mut Vec<Item>, &mut Prompt) -> Result<bool, ApiError>,
) -> Result<(), ApiError> {
    items.reserve(entries.len());
    let list = At::Root(list);
    for (i, entry) in entries.into_iter().enumerate() {
        match entry {
            Entry::Known { decoding, .. } => {
                items.extend(decoding.items.iter().cloned());
                system.append(decoding.system.clone());
            }
            Entry::Read { value, text, head } => {
                let (before, mut texts) = (items.len(), Prompt::default());
                let alone = decode(value, list.index(i), items, &mut texts)?;
                let kept = alone && text.len() >= known_entries::SMALLEST;
                if let Some(head) = head.filter(|_| kept) {
                    let decoding = Decoding {
                        items: items[before..].to_vec(),
                        system: texts.clone(),
                    };
                    known_entries::keep(dialect, head, text, decoding);
                }
                system.append(texts);
            }
        }
    }
    Ok(())
}

/// A body that is not a JSON object, in the words every route uses for it.
pub fn not_json(reason: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!(
        "The request body is not a valid JSON object: {reason}."
    ))
}

/// What is wrong with `body`, in serde_json's words as before the scanner:
/// its own error where it parsed a value, else what its reading of the
/// whole body finds.
fn explain(body: &[u8], error: Option<BadJson>) -> String {
    if let Some(BadJson::Parse { at, error }) = &error {
        return at_body(body, *at, error);
    }
    match crate::json::from_bytes_seed(body, AnObject) {
        Err(e) => e.to_string(),
        // serde_json skips any depth, and strings it skips unchecked.
        Ok(()) => match error {
            Some(BadJson::Scan(ScanError { at })) => {
                format!("arrays and objects nested deeper than {MAX_DEPTH} at byte {at}")
            }
            _ => "it is not UTF-8 text".to_owned(),
        },
    }
}

/// serde_json's `error` for a value parsed from byte `at`, its line and
/// column made the body's.
fn at_body(body: &[u8], at: usize, error: &serde_json::Error) -> String {
    let message = error.to_string();
    let Some((what, _)) = message.rsplit_once(" at line ") else {
        return message;
    };
    let before = &body[..at];
    let lines = before.iter().filter(|&&byte| byte == b'\n').count();
    let mut column = error.column();
    if error.line() == 1 {
        column += at
            - before
                .iter()
                .rposition(|&byte| byte == b'\n')
                .map_or(0, |i| i + 1);
    }
    format!("{what} at line {} column {column}", lines + error.line())
}

/// A body read for its error alone: an object of anything.
struct AnObject;

impl<'de> DeserializeSeed<'de> for AnObject {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, json: D) -> Result<(), D::Error> {
        json.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AnObject {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// The members of a dialect's tool object read apart from the others.
#[derive(Clone, Copy)]
pub struct ToolShape {
    /// Whose tools: the lists a front decoded are known to it alone
    /// ([`known_tools`]).
    pub dialect: Dialect,
    /// A function's schema (`parameters`, `input_schema`): kept as text.
    pub schema: &'static str,
    /// The tools a tool groups (a Responses `namespace`'s `tools`), or the
    /// one it wraps (a chat tool's `function`), read as tools too: a
    /// namespace of Codex's holds a fifth of its request in schemas, which
    /// would otherwise be parsed into values and written out again.
    pub nested: Option<&'static str>,
}

/// The root members a decoder reads, set apart as the body is parsed: each
/// found by its name in a short list, where the map of the other members
/// would hash it in and out again. What is not taken is dropped.
pub struct Picked<const N: usize> {
    names: &'static [&'static str; N],
    /// Where each name's member is in `values`, plus one (0: not found).
    places: [u8; N],
    /// The members found, in the order first found (a name unset keeps its
    /// place, as `None`). A request gives a few of the names (a small chat
    /// request 3 of 14): a value's room for each was a KiB written for
    /// nothing, and cold at many connections.
    values: Vec<Option<Value>>,
}

/// An object whose members a decoder takes out one by one.
pub trait Take {
    fn take(&mut self, key: &str) -> Option<Value>;
}

impl Take for Map<String, Value> {
    fn take(&mut self, key: &str) -> Option<Value> {
        self.remove(key)
    }
}

impl<const N: usize> Picked<N> {
    fn new(names: &'static [&'static str; N]) -> Self {
        const { assert!(N < 256, "a place in `values` is a byte") };
        Picked {
            names,
            places: [0; N],
            values: Vec::with_capacity(N.min(8)),
        }
    }

    /// Sets (or with `None` unsets) the member of the name at `slot`. Each
    /// name has one place in `values` at most, so there are N at most.
    fn set(&mut self, slot: usize, value: Option<Value>) {
        match self.places[slot] {
            0 if value.is_none() => {}
            0 => {
                self.values.push(value);
                self.places[slot] = self.values.len() as u8;
            }
            place => self.values[usize::from(place) - 1] = value,
        }
    }

    /// Where in `values` the member of the name at `slot` is, if it was found.
    fn place(&self, slot: usize) -> Option<usize> {
        usize::from(self.places[slot]).checked_sub(1)
    }

    /// An entry's object (`at`): the members named set apart, the others
    /// in a map, in their order (a name given twice in its first place,
    /// with its last value).
    pub fn members(
        entry: Built,
        names: &'static [&'static str; N],
        at: At<'_>,
    ) -> Result<(Self, Map<String, Value>), ApiError> {
        let members = match entry {
            Built::Members(members) => members,
            Built::Value(Value::Object(members)) => members.into_iter().collect(),
            Built::Value(_) => return Err(at.invalid("must be an object.")),
        };
        let (mut picked, mut rest) = (Picked::new(names), Map::new());
        for (name, value) in members {
            match picked.position(&name) {
                Some(slot) => picked.set(slot, Some(value)),
                None => drop(rest.insert(name, value)),
            }
        }
        Ok((picked, rest))
    }

    /// Where `key` goes, if it is picked.
    fn position(&self, key: &str) -> Option<usize> {
        self.names.iter().position(|name| *name == key)
    }

    /// [`position`](Self::position) of a key the decoder reads: one it
    /// did not pick is a bug.
    fn slot(&self, key: &str) -> Option<usize> {
        // A decoder's key is a literal, and the compiler makes one of equal
        // literals: most are found by their address, without comparing
        // bytes (about 20 lookups a Responses request, 7 names in on
        // average).
        let same = |name: &&str| std::ptr::eq(*name, key);
        let slot = self
            .names
            .iter()
            .position(same)
            .or_else(|| self.position(key));
        debug_assert!(slot.is_some(), "`{key}` is not among the picked members");
        slot
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(self.place(self.slot(key)?)?)?.as_ref()
    }

    /// Sets a member (one the decoder takes, to be read as `value`).
    pub fn put(&mut self, key: &str, value: Value) {
        if let Some(slot) = self.slot(key) {
            self.set(slot, Some(value));
        }
    }
}

impl<const N: usize> Take for Picked<N> {
    fn take(&mut self, key: &str) -> Option<Value> {
        let place = self.place(self.slot(key)?)?;
        self.values.get_mut(place)?.take()
    }
}

/// The members of a tool object every front reads as text.
const TOOL_MEMBERS: [&str; 2] = ["type", "name"];

/// A tool object's members but its [`ToolShape`]'s and its description:
/// those every front reads (`type`, `name`) set apart as strings as it is
/// parsed, the others in a map. A coding agent sends a dozen tools or more:
/// in the map, each of their names was hashed in and out again.
#[derive(Default)]
pub struct ToolFields {
    named: [Option<String>; TOOL_MEMBERS.len()],
    /// The others, and one of [`TOOL_MEMBERS`] that is not a string: the
    /// decoder names what is wrong with it.
    rest: Map<String, Value>,
}

impl ToolFields {
    /// Where `key` is kept, if it is one of [`TOOL_MEMBERS`].
    fn slot(key: &str) -> Option<usize> {
        TOOL_MEMBERS.iter().position(|name| *name == key)
    }

    /// A member as parsed; one given twice is the last.
    fn insert(&mut self, key: String, value: Value) {
        match (Self::slot(&key), value) {
            (Some(slot), Value::String(text)) => {
                self.named[slot] = Some(text);
                if !self.rest.is_empty() {
                    self.rest.remove(&key);
                }
            }
            (slot, value) => {
                if let Some(slot) = slot {
                    self.named[slot] = None;
                }
                self.rest.insert(key, value);
            }
        }
    }

    /// Every member not taken, as a map (the tool's `extra`).
    fn into_map(self) -> Map<String, Value> {
        let mut map = self.rest;
        for (name, text) in TOOL_MEMBERS.iter().zip(self.named) {
            if let Some(text) = text {
                map.insert((*name).to_owned(), Value::String(text));
            }
        }
        map
    }
}

impl Take for ToolFields {
    fn take(&mut self, key: &str) -> Option<Value> {
        match Self::slot(key).and_then(|slot| self.named[slot].take()) {
            Some(text) => Some(Value::String(text)),
            None => self.rest.remove(key),
        }
    }
}

/// A request's `tools`: a list decoded before, known by its text, or what
/// the body's one pass read.
pub enum ReadTools<'a> {
    Known(Arc<Declared>),
    Read { tools: Tools<'a>, text: &'a str },
}

impl<'a> ReadTools<'a> {
    /// The tools declared: a known list's, else what `decode` makes of
    /// them, then known to the requests that follow.
    pub fn declared(
        self,
        dialect: Dialect,
        decode: impl FnOnce(Tools<'a>) -> Result<Declared, ApiError>,
    ) -> Result<Arc<Declared>, ApiError> {
        match self {
            ReadTools::Known(declared) => Ok(declared),
            ReadTools::Read {
                tools: Tools::None, ..
            } => Ok(known_tools::none()),
            ReadTools::Read { tools, text } => {
                let declared = Arc::new(decode(tools)?);
                known_tools::keep(dialect, text, &declared);
                Ok(declared)
            }
        }
    }
}

/// A request's `tools` as the body's one pass read them, whatever their
/// shape: `function_tools` says what is wrong with them.
#[derive(Default)]
pub enum Tools<'a> {
    /// Absent or null.
    #[default]
    None,
    /// A list: each entry read as a tool.
    List(Vec<Tools<'a>>),
    /// A tool: its members parsed into values, but its schema and its
    /// description, kept as the text they came as, and the tools it groups,
    /// read as tools.
    Object {
        fields: ToolFields,
        schema: Option<Raw<'a>>,
        description: Option<Raw<'a>>,
        nested: Option<Box<Tools<'a>>>,
    },
    /// Anything else, as it came.
    Other(Value),
}

impl Tools<'_> {
    /// The JSON it was read from (but for the order of an object's members).
    fn into_value(self, shape: ToolShape) -> Result<Value, ApiError> {
        Ok(match self {
            Tools::None => Value::Null,
            Tools::List(list) => Value::Array(
                list.into_iter()
                    .map(|tools| tools.into_value(shape))
                    .collect::<Result<_, _>>()?,
            ),
            Tools::Object {
                fields,
                schema,
                description,
                nested,
            } => {
                let mut fields = fields.into_map();
                for (key, text) in [(shape.schema, schema), ("description", description)] {
                    if let Some(text) = text {
                        let value = serde_json::from_str(text.get()).map_err(not_json)?;
                        fields.insert(key.into(), value);
                    }
                }
                if let (Some(key), Some(nested)) = (shape.nested, nested) {
                    fields.insert(key.into(), nested.into_value(shape)?);
                }
                Value::Object(fields)
            }
            Tools::Other(value) => value,
        })
    }
}

/// One of a request's `tools`, parsed but for its [`ToolShape`].
struct ToolObject<'a, 'b> {
    /// Its place (`tools[i]`), for errors.
    param: At<'b>,
    fields: ToolFields,
    /// Kept as the text it came as; `null` is none.
    schema: Option<Schema>,
    /// As it came, whatever it is: see [`description`].
    description: Option<Raw<'a>>,
    /// The tools it groups.
    nested: Option<Box<Tools<'a>>>,
}

/// A tool's `description` (`at`) as sent, a JSON string; `null` is none.
fn description(json: Option<Raw>, at: At) -> Result<Option<Description>, ApiError> {
    match json {
        None => Ok(None),
        Some(json) if json.get() == "null" => Ok(None),
        Some(json) => Description::from_json(json)
            .map(Some)
            .ok_or_else(|| at.invalid("must be a string.")),
    }
}

/// A request's function tools: `read` takes each tool, an object, and adds
/// what it makes of it to the list (none for a tool the upstream cannot
/// run, several for a namespace).
fn function_tools<'a>(
    tools: Tools<'a>,
    mut read: impl FnMut(ToolObject<'a, '_>, &mut Vec<Arc<FunctionTool>>) -> Result<(), ApiError>,
) -> Result<Vec<Arc<FunctionTool>>, ApiError> {
    let all = At::Root("tools");
    let list = match tools {
        Tools::None => Vec::new(),
        tools => tool_list(tools, all)?,
    };
    let mut out = Vec::with_capacity(list.len());
    each_tool(list, all, |tool| read(tool, &mut out))?;
    Ok(out)
}

/// A list of tools (`at`), or a 400 saying it must be one.
fn tool_list<'a>(tools: Tools<'a>, at: At) -> Result<Vec<Tools<'a>>, ApiError> {
    match tools {
        Tools::List(list) => Ok(list),
        _ => Err(at.invalid("must be an array.")),
    }
}

/// `read` of each tool of `list` (`at`), each of which must be an object.
fn each_tool<'a>(
    list: Vec<Tools<'a>>,
    at: At,
    mut read: impl FnMut(ToolObject<'a, '_>) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    for (i, tool) in list.into_iter().enumerate() {
        let param = at.index(i);
        let Tools::Object {
            fields,
            schema,
            description,
            nested,
        } = tool
        else {
            return Err(param.invalid("must be an object."));
        };
        let schema = schema.filter(|text| text.get() != "null").map(Schema::from);
        read(ToolObject {
            param,
            fields,
            schema,
            description,
            nested,
        })?;
    }
    Ok(())
}

/// The tools a tool groups (`at`): a list, as a request's `tools`.
fn nested_tools<'a>(nested: Option<Box<Tools<'a>>>, at: At) -> Result<Vec<Tools<'a>>, ApiError> {
    tool_list(nested.map_or(Tools::None, |tools| *tools), at)
}

/// How deep [`lenient`] is: in a list of tools, or in one of them, nested
/// in this many tools that group tools.
#[derive(Clone, Copy)]
enum Nesting {
    List(u32),
    Tool(u32),
}

/// `tools` (or, `Nesting::Tool`, one of them) read whatever its shape: the
/// wrong shape is kept as [`Tools::Other`], for the decoder to name (or,
/// where it is no tool's list, to pass on).
fn lenient<'a>(
    scan: &mut Scanner<'a>,
    shape: ToolShape,
    nesting: Nesting,
) -> Result<Tools<'a>, BadJson> {
    match (scan.peek(), nesting) {
        (Some(b'['), Nesting::List(depth)) => {
            let mut list = Vec::new();
            scan.array(|scan| {
                list.push(lenient(scan, shape, Nesting::Tool(depth))?);
                Ok::<_, BadJson>(())
            })?;
            Ok(Tools::List(list))
        }
        (Some(b'{'), Nesting::Tool(depth)) => {
            let mut fields = ToolFields::default();
            let (mut schema, mut description, mut nested) = (None, None, None);
            scan.object(|scan, name| {
                if name == shape.schema {
                    schema = Some(scan.value()?);
                } else if name == "description" {
                    description = Some(scan.value()?);
                } else if Some(name.as_ref()) == shape.nested && depth < MAX_DEPTH {
                    // A list of tools (a namespace's), or one (a chat
                    // tool's function).
                    let nesting = match scan.peek() {
                        Some(b'{') => Nesting::Tool(depth + 1),
                        _ => Nesting::List(depth + 1),
                    };
                    nested = Some(Box::new(lenient(scan, shape, nesting)?));
                } else {
                    let value = scan.parse_value()?;
                    fields.insert(name.into_owned(), value);
                }
                Ok::<_, BadJson>(())
            })?;
            Ok(Tools::Object {
                fields,
                schema,
                description,
                nested,
            })
        }
        (Some(b'n'), Nesting::List(_)) => {
            // `null`, or not JSON: the scan tells.
            scan.value()?;
            Ok(Tools::None)
        }
        _ => Ok(Tools::Other(scan.parse_value()?)),
    }
}

/// Notes a dropped tool type, once.
fn note_dropped(dropped: &mut Vec<String>, kind: String) {
    if !dropped.contains(&kind) {
        dropped.push(kind);
    }
}

/// A 400 naming the field at fault.
fn invalid(message: impl Into<String>, param: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).with_param(param.into())
}

/// Where a value sits in a request body (`input[3].content[0]`), for an
/// error about it: spelled out only when an error is made. A coding agent's
/// request has hundreds of such places, and as a rule no error.
#[derive(Clone, Copy)]
pub enum At<'a> {
    Root(&'a str),
    Index(&'a At<'a>, usize),
    Field(&'a At<'a>, &'a str),
}

impl<'a> At<'a> {
    fn index(&'a self, i: usize) -> At<'a> {
        At::Index(self, i)
    }

    fn field(&'a self, name: &'a str) -> At<'a> {
        At::Field(self, name)
    }

    /// A 400 about the value here, `what` following its place
    /// (`input[3].role is required.`), which is also its `param`.
    fn invalid(self, what: &str) -> ApiError {
        invalid(format!("{self} {what}"), self)
    }
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            At::Root(name) => f.write_str(name),
            At::Index(list, i) => write!(f, "{list}[{i}]"),
            At::Field(object, name) => write!(f, "{object}.{name}"),
        }
    }
}

impl From<At<'_>> for String {
    fn from(at: At<'_>) -> String {
        at.to_string()
    }
}

// Typed field readers: null counts as absent; a wrong type is a 400 naming
// the field.

fn take_str(map: &mut impl Take, key: &str) -> Result<Option<String>, ApiError> {
    take_str_at(map, key, At::Root(key))
}

fn take_str_at(map: &mut impl Take, key: &str, param: At<'_>) -> Result<Option<String>, ApiError> {
    match map.take(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(param.invalid("must be a string.")),
    }
}

fn required_str(map: &mut impl Take, key: &str, at: At<'_>) -> Result<String, ApiError> {
    let param = at.field(key);
    match take_str_at(map, key, param)? {
        Some(s) => Ok(s),
        None => Err(param.invalid("is required.")),
    }
}

fn take_bool(map: &mut impl Take, key: &str) -> Result<Option<bool>, ApiError> {
    match map.take(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => Err(invalid(format!("{key} must be a boolean."), key)),
    }
}

fn take_f64(map: &mut impl Take, key: &str) -> Result<Option<f64>, ApiError> {
    match map.take(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(invalid(format!("{key} must be a number."), key)),
    }
}

fn take_u64(map: &mut impl Take, key: &str) -> Result<Option<u64>, ApiError> {
    match map.take(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(_) => Err(invalid(
            format!("{key} must be a non-negative integer."),
            key,
        )),
    }
}

/// An OpenAI-shaped error body (`{"error":{message,type,code,…}}`), as the
/// encoders get it to carry in their own dialect.
#[derive(Deserialize)]
struct ErrorEnvelope<'a> {
    #[serde(borrow)]
    error: ErrorIn<'a>,
}

#[derive(Deserialize)]
struct ErrorIn<'a> {
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    code: Option<Value>,
    /// llama.cpp's context overflow: the prompt's size and the context's.
    #[serde(default)]
    n_prompt_tokens: Option<u64>,
    #[serde(default)]
    n_ctx: Option<u64>,
}

/// An error response (status and body) in the shape `dialect`'s clients read.
pub fn error_response(
    dialect: crate::conversation::Dialect,
    error: &crate::error::ApiError,
) -> (u16, Bytes) {
    match dialect {
        crate::conversation::Dialect::Messages => (
            messages::error_status(error.status),
            messages::anthropic_error(error.status, &error.message),
        ),
        _ => (error.status, error.to_json()),
    }
}

/// The event that ends a stream with `error`, in the shape `dialect`'s
/// clients read: Anthropic's `error` event, or an OpenAI error as data.
pub fn error_event(dialect: crate::conversation::Dialect, error: &ApiError) -> Bytes {
    match dialect {
        crate::conversation::Dialect::Messages => {
            messages::anthropic_error_event(error.status, &error.message)
        }
        _ => {
            let mut event = Vec::new();
            crate::sse::write_data(&mut event, &error.to_json());
            Bytes::from(event)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{error_event, new_id, Take, ToolFields};
    use crate::conversation::Dialect;
    use crate::error::ApiError;
    use serde_json::{json, Value};

    #[test]
    fn a_tools_members_are_read_as_given_the_last_of_a_repeated_one_winning() {
        let mut fields = ToolFields::default();
        let given = [
            ("type", json!("function")),
            ("name", json!(7)),
            ("strict", json!(true)),
            ("name", json!("lookup")),
            ("description", json!("weather")),
            ("description", json!(["not", "text"])),
            ("cache_control", json!({"type": "ephemeral"})),
        ];
        for (key, value) in given {
            fields.insert(key.to_owned(), value);
        }
        assert_eq!(fields.take("name"), Some(json!("lookup")));
        assert_eq!(fields.take("name"), None);
        // Not a string: left for the decoder to name.
        assert_eq!(fields.take("description"), Some(json!(["not", "text"])));
        let extra = fields.into_map();
        let extra: Vec<(&str, &Value)> = extra.iter().map(|(k, v)| (k.as_str(), v)).collect();
        assert_eq!(
            extra,
            [
                ("strict", &json!(true)),
                ("cache_control", &json!({"type": "ephemeral"})),
                ("type", &json!("function")),
            ]
        );
    }

    #[test]
    fn a_picked_member_is_found_by_its_name_whatever_string_holds_it() {
        const NAMES: [&str; 3] = ["model", "input", "store"];
        let body = br#"{"store":false,"model":"m","input":"hi","other":1}"#;
        let shape = super::responses::TOOL;
        let body =
            super::picked_object_and_tools(body, shape, &NAMES, None, &super::Found::default())
                .unwrap();
        let (mut read, rest) = (body.picked, body.rest);
        // A literal (the decoders' keys), and the same name built at run
        // time: found alike.
        assert_eq!(read.get("model"), Some(&json!("m")));
        assert_eq!(read.get(&String::from("input")), Some(&json!("hi")));
        assert_eq!(read.take(&["st", "ore"].concat()), Some(json!(false)));
        assert_eq!(read.take("store"), None);
        assert_eq!(rest.get("other"), Some(&json!(1)));
    }

    #[test]
    fn a_broken_stream_ends_with_an_error_in_the_clients_dialect() {
        let error = ApiError::bad_gateway("the upstream closed mid-stream");
        let anthropic = error_event(Dialect::Messages, &error);
        let data = anthropic
            .strip_prefix(b"event: error\ndata: ")
            .and_then(|rest| rest.strip_suffix(b"\n\n"))
            .expect("a named error event");
        let data: serde_json::Value = serde_json::from_slice(data).unwrap();
        assert_eq!(data["type"], "error");
        assert_eq!(data["error"]["type"], "api_error");
        for dialect in [Dialect::Chat, Dialect::Responses] {
            let openai = error_event(dialect, &error);
            let data = openai.strip_prefix(b"data: ").unwrap();
            let data: serde_json::Value = serde_json::from_slice(data.trim_ascii_end()).unwrap();
            assert_eq!(data["error"]["message"], "the upstream closed mid-stream");
        }
    }

    #[test]
    fn ids_sort_in_the_order_they_were_made() {
        let first = new_id("resp_");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = new_id("resp_");
        assert_eq!((first.len(), second.len()), (37, 37));
        assert!(first < second, "{first} then {second}");
        assert!(first[5..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(new_id("resp_")[17..], new_id("resp_")[17..]);
    }

    #[test]
    fn random_alphanumerics_use_every_digit_about_evenly() {
        let mut counts = std::collections::HashMap::new();
        for _ in 0..6_200 {
            for digit in super::random_alphanumerics::<20>() {
                *counts.entry(digit).or_insert(0u32) += 1;
            }
        }
        // 124,000 digits, 2,000 expected of each of the 62: a digit's
        // count stays within ±300 (6.8 standard deviations).
        assert_eq!(counts.len(), 62);
        assert!(counts.keys().all(u8::is_ascii_alphanumeric));
        for (digit, count) in counts {
            assert!(
                (1_700..=2_300).contains(&count),
                "{} came {count} times",
                digit as char
            );
        }
    }
}

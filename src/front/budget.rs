//! A request body's shape, before it is parsed.
//!
//! What parsing it may cost: decoding into JSON values costs about 32 bytes
//! per value however short its text (`[0,0,0,…]` costs 16 times its size).
//! A body is counted before it is parsed (one pass, no allocation) and
//! refused when it holds more values than the limit, so memory per request
//! stays a small constant times its bytes. The same pass reads where an
//! agent's request goes, so that its front's decoder is its one parse; a
//! request for another model, which is checked to be JSON before it goes
//! on as it came, is read by the checking scanner instead once its model
//! is known ([`Shape::routed`]).

use std::borrow::Cow;
use std::sync::Arc;

use super::known_entries::Decoding;
use super::known_tools::Declared;
use crate::conversation::Dialect;
use crate::json::scan::{ScanError, Scanner};

/// What one pass over a request body tells before it is parsed: what the
/// parse may cost, and where an agent's request goes. Not a validator: text
/// that is not JSON gets some shape and fails to parse later.
///
/// Most of a request's bytes are string text (prompts, tool schemas' prose):
/// a string is skipped to its closing quote by SIMD search, not byte by byte
/// (a coding agent's 50 KB request: 50 µs byte by byte).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape<'a> {
    /// An upper bound of the number of JSON values: one for the root and
    /// one per `[`, `{`, `,` and `:` outside strings (every value but the
    /// root follows one of them).
    pub values: usize,
    /// The root object's `model`, when it is a string without escapes,
    /// given once; otherwise only a parse can tell.
    pub model: Option<&'a str>,
    /// The root object's `messages`.
    pub messages: Entries,
    /// The root object's `input` (Responses).
    pub input: Entries,
    /// Whether the root object's `stream` is `true` (the last given).
    pub stream: bool,
}

/// A list member of the root object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Entries {
    #[default]
    Absent,
    /// A string: one entry (a Responses `input`).
    Text,
    /// An array of this many entries.
    List(usize),
    /// Anything else, or in a body cut short: the parse tells what is
    /// wrong.
    Other,
}

impl Entries {
    /// The member met (again): given twice, the last counts, as the
    /// decoders and JSON readers at large take it; so the limits on a list
    /// bound the one that is read.
    fn met(&mut self, entries: Entries) {
        *self = entries;
    }
}

/// A tool list or history entry kept by the thread, found where a body's
/// rest begins: its length, the values in it, and a front's decoding of it
/// (none where it was only checked).
pub struct Hit<T> {
    pub len: usize,
    pub values: usize,
    pub decoded: Option<(Dialect, Arc<T>)>,
}

/// What a body's shape pass found among the tool lists and history entries
/// this thread keeps decoded ([`known_tools`], [`known_entries`]), by where
/// each begins: the decoder of the same body takes them from here rather
/// than comparing their text with the kept one again (a coding agent's
/// tools, 30 KB, were compared twice a request, its history's entries too).
///
/// [`known_tools`]: super::known_tools
/// [`known_entries`]: super::known_entries
#[derive(Default)]
pub struct Found<'a> {
    /// The body read: nothing is taken for another.
    body: &'a [u8],
    /// The tool lists, in the body's order.
    tools: Vec<Place<Declared>>,
    /// The history entries, in the body's order.
    entries: Vec<Place<Decoding>>,
}

/// A kept list or entry found in a body: where it begins, its length, and
/// its decoding with the dialect that made it.
struct Place<T> {
    start: usize,
    len: usize,
    decoded: (Dialect, Arc<T>),
}

impl<T> Place<T> {
    /// Adds `hit`, found at `start`, to `places` if a front decoded it: its
    /// length and values, for the pass.
    fn keep(places: &mut Vec<Place<T>>, start: usize, hit: Hit<T>) -> (usize, usize) {
        if let Some(decoded) = hit.decoded {
            places.push(Place {
                start,
                len: hit.len,
                decoded,
            });
        }
        (hit.len, hit.values)
    }
}

impl<'a> Found<'a> {
    fn of(body: &'a [u8]) -> Self {
        Found {
            body,
            ..Found::default()
        }
    }

    /// The list of tools `dialect` decoded that begins at `at` in `body`:
    /// its length and its decoding.
    pub fn tools(
        &self,
        body: &[u8],
        at: usize,
        dialect: Dialect,
    ) -> Option<(usize, Arc<Declared>)> {
        self.at(&self.tools, body, at, dialect)
    }

    /// The history entry `dialect` decoded that begins at `at` in `body`:
    /// its length and its decoding.
    pub fn entry(
        &self,
        body: &[u8],
        at: usize,
        dialect: Dialect,
    ) -> Option<(usize, Arc<Decoding>)> {
        self.at(&self.entries, body, at, dialect)
    }

    /// What of `found` begins at `at` in `body`, decoded by `dialect`:
    /// found in the body's order, it is looked up by halves (a history of
    /// hundreds of entries, one lookup each).
    fn at<T>(
        &self,
        found: &[Place<T>],
        body: &[u8],
        at: usize,
        dialect: Dialect,
    ) -> Option<(usize, Arc<T>)> {
        if !std::ptr::eq(self.body, body) {
            return None;
        }
        let index = found.binary_search_by_key(&at, |place| place.start).ok()?;
        let Place { len, decoded, .. } = &found[index];
        (decoded.0 == dialect).then(|| (*len, decoded.1.clone()))
    }
}

/// The root object's member whose value is being read.
#[derive(Clone, Copy, PartialEq)]
enum Member {
    Model,
    Messages,
    Input,
    Stream,
    Tools,
    Other,
}

/// Where one pass over a request body sends it.
pub enum Routed<'a> {
    /// Read whole by [`Shape::of`]: its model, given once, is ours.
    Ours(Shape<'a>),
    /// Read whole by [`Shape::of`]: only a parse can tell its model.
    Read(Shape<'a>),
    /// Its first `model` is a string that is none of ours: the body was read
    /// again by [`Shape::checked`], in the pass that checks it is JSON
    /// (`None`: the scanner says it is not).
    Other(Option<Shape<'a>>),
}

impl<'a> Shape<'a> {
    pub fn of(body: &'a [u8]) -> Shape<'a> {
        Shape::read(body, None).0
    }

    /// [`Shape::of`], unless the root's first `model` is not `ours`: a
    /// request passed on is checked to be JSON, and where it names its model
    /// before the rest (Codex, Claude Code and most clients do), one pass
    /// reads its shape and checks it, rather than one for each.
    /// What the pass found known, for the decoder, comes with it.
    pub fn routed(body: &'a [u8], ours: &dyn Fn(&str) -> bool) -> (Routed<'a>, Found<'a>) {
        match Shape::read(body, Some(ours)) {
            (_, Some(false), _) => (Routed::Other(Shape::checked(body)), Found::default()),
            (shape, Some(true), found) if shape.model.is_some() => (Routed::Ours(shape), found),
            (shape, _, found) => (Routed::Read(shape), found),
        }
    }

    /// The shape of a body that is JSON as [`json::scan`](crate::json::scan)
    /// reads it, read by it, or `None`: what [`Shape::of`] reads of the same
    /// body, in the pass that checks it.
    pub fn checked(body: &'a [u8]) -> Option<Shape<'a>> {
        let mut scan = Scanner::new(crate::json::utf8(body)?);
        let mut shape = Shape {
            values: 1,
            model: None,
            messages: Entries::Absent,
            input: Entries::Absent,
            stream: false,
        };
        let mut models = 0;
        // Values in known tool lists, passed over unread.
        let mut passed = 0;
        let mut member = |scan: &mut Scanner<'a>, name: Cow<'a, str>| {
            // A name with escapes is none of these, as the text it came as.
            let Cow::Borrowed(name) = name else {
                return scan.value().map(drop);
            };
            match name {
                "model" => {
                    models += 1;
                    let text = scan.value()?.get();
                    let unquoted = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'));
                    shape.model = unquoted.filter(|model| !model.contains('\\'));
                }
                "messages" => shape.messages.met(entries(scan, &mut passed)?),
                "input" => shape.input.met(entries(scan, &mut passed)?),
                "stream" => {
                    shape.stream = scan.peek() == Some(b't');
                    scan.value()?;
                }
                "tools" => match super::known_tools::values(scan.rest().as_bytes()) {
                    Some((len, values)) => {
                        scan.pass(len);
                        passed += values;
                    }
                    None => {
                        let before = scan.marks();
                        let text = scan.value()?.get();
                        if text.starts_with('[') {
                            super::known_tools::checked(text, scan.marks() - before);
                        }
                    }
                },
                _ => drop(scan.value()?),
            }
            Ok::<_, ScanError>(())
        };
        match scan.peek() {
            Some(b'{') => scan.object(&mut member).ok()?,
            _ => drop(scan.value().ok()?),
        }
        scan.end().ok()?;
        if models != 1 {
            shape.model = None;
        }
        shape.values += scan.marks() + passed;
        Some(shape)
    }

    /// The shape, in one pass that does not check the JSON, what `ours`
    /// said of the root's first `model` if it is a string without escapes
    /// (where it said no, the pass stopped there), and what it found known
    /// on its way.
    fn read(
        body: &'a [u8],
        ours: Option<&dyn Fn(&str) -> bool>,
    ) -> (Shape<'a>, Option<bool>, Found<'a>) {
        let mut scan = Scan {
            found: Found::of(body),
            shape: Shape {
                values: 1,
                model: None,
                messages: Entries::Absent,
                input: Entries::Absent,
                stream: false,
            },
            models: 0,
            depth: 0,
            root_object: false,
            member: Member::Other,
            key_next: false,
            value_next: false,
            entry_next: false,
        };
        let mut said = None;
        let mut at = 0;
        while let Some(&byte) = body.get(at) {
            at += 1;
            match byte {
                b'"' => {
                    let start = at;
                    let Some(end) = skip_string(body, at) else {
                        return scan.end(false, said);
                    };
                    at = end;
                    if scan.string(&body[start..at - 1]) && scan.models == 1 {
                        said = ours.zip(scan.shape.model).map(|(ours, model)| ours(model));
                        if said == Some(false) {
                            return (scan.shape, said, scan.found);
                        }
                    }
                }
                b'[' | b'{' => {
                    let known = scan
                        .known_tools(body, at - 1)
                        .or_else(|| scan.known_entry(body, at - 1));
                    if let Some((len, values)) = known {
                        // A list of tools, or a history's entry, decoded
                        // before: its count is known.
                        scan.begins(byte);
                        scan.shape.values += values;
                        at += len - 1;
                        continue;
                    }
                    scan.shape.values += 1;
                    scan.begins(byte);
                    scan.depth += 1;
                    match scan.depth {
                        1 => {
                            scan.root_object = byte == b'{';
                            scan.key_next = scan.root_object;
                        }
                        2 => scan.entry_next = byte == b'[',
                        // Below the root's members and their lists nothing
                        // is read: only counted.
                        _ => match deep(body, at, &mut scan.shape.values) {
                            Some(end) => {
                                at = end;
                                scan.depth -= 1;
                            }
                            None => return scan.end(false, said),
                        },
                    }
                }
                b']' | b'}' => scan.depth = scan.depth.saturating_sub(1),
                b',' => {
                    scan.shape.values += 1;
                    match scan.depth {
                        1 if scan.root_object => {
                            scan.key_next = true;
                            scan.member = Member::Other;
                        }
                        2 => scan.entry_next = true,
                        _ => {}
                    }
                }
                b':' => {
                    scan.shape.values += 1;
                    scan.value_next = scan.depth == 1 && scan.root_object;
                }
                _ if byte.is_ascii_whitespace() => {}
                _ => scan.begins(byte),
            }
        }
        let closed = scan.depth == 0;
        scan.end(closed, said)
    }
}

/// The values in `list`, a JSON array, as [`Shape::of`] counts them.
pub fn values_in(list: &[u8]) -> usize {
    let mut values = 1;
    deep(list, 1, &mut values);
    values
}

/// Counts the values of an array or object from just inside its opening
/// bracket, and returns where it ends, just past its closing one (`None`:
/// where the body ends first). Most of a large request is down here (a
/// message's content, a tool's schema), so this loop keeps no other state.
fn deep(body: &[u8], mut at: usize, values: &mut usize) -> Option<usize> {
    let mut depth = 1usize;
    while let Some(&byte) = body.get(at) {
        at += 1;
        match byte {
            b'"' => at = skip_string(body, at)?,
            b'[' | b'{' => {
                *values += 1;
                depth += 1;
            }
            b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at);
                }
            }
            b',' | b':' => *values += 1,
            _ => {}
        }
    }
    None
}

/// Just past the closing quote of the string whose text begins at `start`
/// (`None`: the body ends first). Only quotes are searched for: one is
/// escaped when an odd run of backslashes comes right before it. Prose has
/// an escape (`\n`, `\"`) every line or so, and a search for either byte
/// stopped at each.
///
/// Most strings are short (a schema's names and types: hundreds of them in
/// a coding agent's request), and a call to `memchr` cost them about 50
/// instructions each: the first 16 bytes are searched in one SSE2 step.
#[inline]
fn skip_string(body: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    #[cfg(target_arch = "x86_64")]
    if let Some(quotes) = quotes_in_16(body, start) {
        if quotes == 0 {
            at += 16;
        } else {
            let quote = start + quotes.trailing_zeros() as usize;
            // An odd run of backslashes before it ends right before it.
            if quote == start || body[quote - 1] != b'\\' {
                return Some(quote + 1);
            }
        }
    }
    loop {
        let quote = at + memchr::memchr(b'"', body.get(at..)?)?;
        let backslashes = body[start..quote]
            .iter()
            .rev()
            .take_while(|&&byte| byte == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Some(quote + 1);
        }
        at = quote + 1;
    }
}

/// A bit for each `"` of the 16 bytes at `at` (`None`: fewer are left).
#[cfg(target_arch = "x86_64")]
#[inline]
fn quotes_in_16(body: &[u8], at: usize) -> Option<u32> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    let block = body.get(at..at.checked_add(16)?)?;
    // SAFETY: SSE2 is part of every x86_64 CPU; the 16 bytes read are
    // `block`'s, and an unaligned load may start anywhere.
    let quotes = unsafe {
        let chunk = _mm_loadu_si128(block.as_ptr().cast::<__m128i>());
        _mm_movemask_epi8(_mm_cmpeq_epi8(chunk, _mm_set1_epi8(b'"' as i8)))
    };
    Some(quotes as u32)
}

/// A list member's entries, read by the scanner: those a request on this
/// thread decoded or checked before passed over, their values added to
/// `passed`, the others kept as checked ([`known_entries`]).
///
/// [`known_entries`]: super::known_entries
fn entries(scan: &mut Scanner<'_>, passed: &mut usize) -> Result<Entries, ScanError> {
    Ok(match scan.peek() {
        Some(b'"') => {
            scan.value()?;
            Entries::Text
        }
        Some(b'[') => {
            let mut entries = 0;
            scan.array(|scan| {
                entries += 1;
                let rest = scan.rest();
                let head = super::known_entries::head(rest.as_bytes());
                let known =
                    head.and_then(|head| super::known_entries::values(head, rest.as_bytes()));
                if let Some((len, values)) = known {
                    scan.pass(len);
                    *passed += values;
                    return Ok(());
                }
                let before = scan.marks();
                let text = scan.value()?.get();
                if let Some(head) = head {
                    super::known_entries::checked(head, text, scan.marks() - before);
                }
                Ok(())
            })?;
            Entries::List(entries)
        }
        _ => {
            scan.value()?;
            Entries::Other
        }
    })
}

/// The state of [`Shape::of`] between bytes.
struct Scan<'a> {
    shape: Shape<'a>,
    found: Found<'a>,
    models: usize,
    /// Open arrays and objects.
    depth: usize,
    root_object: bool,
    member: Member,
    /// In the root object: the next string is a member's name.
    key_next: bool,
    /// In the root object: the next value is `member`'s.
    value_next: bool,
    /// In a member's array: the next value is an entry.
    entry_next: bool,
}

impl<'a> Scan<'a> {
    /// Reads a string's text; whether it was a `model`'s.
    #[inline]
    fn string(&mut self, text: &'a [u8]) -> bool {
        if self.depth == 1 && self.key_next {
            self.key_next = false;
            // A name with escapes is none of these, as the text it came as.
            self.member = match text {
                b"model" => Member::Model,
                b"messages" => Member::Messages,
                b"input" => Member::Input,
                b"stream" => Member::Stream,
                b"tools" => Member::Tools,
                _ => Member::Other,
            };
            return false;
        }
        let model = self.depth == 1 && self.value_next && self.member == Member::Model;
        if model {
            self.models += 1;
            // With escapes, only a parse can tell.
            self.shape.model = std::str::from_utf8(text)
                .ok()
                .filter(|_| !text.contains(&b'\\'));
        }
        self.begins(b'"');
        model
    }

    /// Where the root's `tools` begin (`at`), a list decoded before: its
    /// length and its values ([`known_tools`](super::known_tools)), and
    /// its decoding found for the decoder.
    fn known_tools(&mut self, body: &[u8], at: usize) -> Option<(usize, usize)> {
        let tools = self.depth == 1 && self.value_next && self.member == Member::Tools;
        let rest = &body[at..];
        if !(tools && rest.first() == Some(&b'[')) {
            return None;
        }
        let hit = super::known_tools::found(rest)?;
        Some(Place::keep(&mut self.found.tools, at, hit))
    }

    /// Where an entry of the root's `messages` or `input` begins (`at`),
    /// one decoded before: its length and its values
    /// ([`known_entries`](super::known_entries)), and its decoding found
    /// for the decoder.
    fn known_entry(&mut self, body: &[u8], at: usize) -> Option<(usize, usize)> {
        let list = matches!(self.member, Member::Messages | Member::Input);
        if !(list && self.depth == 2 && self.entry_next) {
            return None;
        }
        let rest = &body[at..];
        let head = super::known_entries::head(rest)?;
        let hit = super::known_entries::found(head, rest)?;
        Some(Place::keep(&mut self.found.entries, at, hit))
    }

    /// A value begins with `byte` (or a scalar goes on, for which nothing
    /// is expected any more).
    #[inline]
    fn begins(&mut self, byte: u8) {
        if self.depth == 1 && self.value_next {
            self.value_next = false;
            let entries = match byte {
                b'"' => Entries::Text,
                b'[' => Entries::List(0),
                _ => Entries::Other,
            };
            match self.member {
                Member::Model if byte != b'"' => self.models += 1,
                Member::Messages => self.shape.messages.met(entries),
                Member::Input => self.shape.input.met(entries),
                // `true` is the one value beginning with `t`.
                Member::Stream => self.shape.stream = byte == b't',
                _ => {}
            }
        } else if self.depth == 2 && self.entry_next {
            self.entry_next = false;
            let list = match self.member {
                Member::Messages => &mut self.shape.messages,
                Member::Input => &mut self.shape.input,
                _ => return,
            };
            if let Entries::List(n) = list {
                *n += 1;
            }
        }
    }

    /// The shape read; of a body cut short (`closed` false), its lists are
    /// left to the parse, whose error says what is wrong: a truncated
    /// `"messages": [` is not an empty list.
    fn end(mut self, closed: bool, said: Option<bool>) -> (Shape<'a>, Option<bool>, Found<'a>) {
        if self.models != 1 {
            self.shape.model = None;
        }
        if !closed {
            self.shape.messages = Entries::Other;
            self.shape.input = Entries::Other;
        }
        (self.shape, said, self.found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// The number of values in a parsed document.
    fn values(value: &Value) -> usize {
        1 + match value {
            Value::Array(items) => items.iter().map(values).sum(),
            Value::Object(members) => members.values().map(values).sum(),
            _ => 0,
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            // Strings full of the characters that are counted outside them.
            "[\\[\\]{}:,\"\\\\a-z ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map("[a-z:,\\[]{0,6}", inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The count byte by byte, as [`Shape::values`] defines it.
    fn reference(body: &[u8]) -> usize {
        let mut count = 1;
        let mut in_string = false;
        let mut escaped = false;
        for &byte in body {
            if in_string {
                match (escaped, byte) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'[' | b'{' | b',' | b':' => count += 1,
                _ => {}
            }
        }
        count
    }

    proptest! {
        #[test]
        fn any_bytes_count_as_byte_by_byte(body in prop::collection::vec(
            prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b'{'), Just(b':'), any::<u8>()],
            0..256,
        )) {
            prop_assert_eq!(Shape::of(&body).values, reference(&body));
        }

        #[test]
        fn the_count_bounds_the_values_of_any_document(value in json(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let count = Shape::of(text.as_bytes()).values;
            let exact = values(&value);
            // Never less than the values; at most three times (an object
            // member counts its `,`, its `:` and, a container, its bracket).
            prop_assert!(count >= exact && count <= 3 * exact + 1, "{count} for {exact}: {text}");
        }
    }

    proptest! {
        #[test]
        fn a_string_ends_where_byte_by_byte_it_does(
            body in prop::collection::vec(
                // Quotes rare enough that a run of 16 bytes often has none.
                prop_oneof![1 => Just(b'"'), 2 => Just(b'\\'), 6 => Just(b'a'), 2 => any::<u8>()],
                0..80,
            ),
            start in 0usize..80,
        ) {
            let start = start.min(body.len());
            // The first quote not escaped by an odd run of backslashes.
            let mut escaped = false;
            let mut reference = None;
            for (at, &byte) in body.iter().enumerate().skip(start) {
                match byte {
                    b'"' if !escaped => {
                        reference = Some(at + 1);
                        break;
                    }
                    b'\\' => escaped = !escaped,
                    _ => escaped = false,
                }
            }
            prop_assert_eq!(skip_string(&body, start), reference);
        }
    }

    #[test]
    fn a_known_tools_list_counts_as_read() {
        let tool = |i| {
            serde_json::json!({"name": format!("t{i}"), "description": "a, b: [c]",
                "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}})
        };
        let tools = serde_json::to_string(&(0..30).map(tool).collect::<Vec<_>>()).unwrap();
        let body = format!(
            r#"{{"model":"m","tools": {tools} ,"messages":[{{"role":"user","content":"hi"}}],"stream":true}}"#
        );
        let fresh = {
            let body = body.clone();
            crate::on_a_new_thread(move || format!("{:?}", Shape::of(body.as_bytes())))
        };
        let declared = std::sync::Arc::default();
        crate::front::known_tools::keep(crate::conversation::Dialect::Messages, &tools, &declared);
        assert!(crate::front::known_tools::values(tools.as_bytes()).is_some());
        assert_eq!(format!("{:?}", Shape::of(body.as_bytes())), fresh);
        // Its `[` and what follows a mark in it; the reference adds a root.
        assert_eq!(values_in(tools.as_bytes()) + 1, reference(tools.as_bytes()));
    }

    #[test]
    fn what_the_pass_found_known_the_decoder_of_that_body_takes() {
        crate::on_a_new_thread(|| {
            let tool =
                |i| serde_json::json!({"name": format!("t{i}"), "description": "d".repeat(40)});
            let list = |n| serde_json::to_string(&(0..n).map(tool).collect::<Vec<_>>()).unwrap();
            let tools = list(30);
            let body = format!(
                r#"{{"model":"m","tools": {tools},"messages":[{{"role":"user","content":"hi"}}]}}"#
            );
            let dialect = Dialect::Messages;
            // Kept as a front's decoding, told apart by what it dropped.
            let declared = Arc::new(Declared {
                dropped: vec!["kept".into()],
                ..Declared::default()
            });
            crate::front::known_tools::keep(dialect, &tools, &declared);
            let (routed, found) = Shape::routed(body.as_bytes(), &|_| true);
            assert!(matches!(routed, Routed::Ours(_)));
            let at = body.find(&tools).unwrap();
            let (len, taken) = found.tools(body.as_bytes(), at, dialect).unwrap();
            assert_eq!(len, tools.len());
            assert!(Arc::ptr_eq(&taken, &declared));
            // Only for the body read, and for the dialect that decoded it.
            let copy = body.clone();
            assert!(found.tools(copy.as_bytes(), at, dialect).is_none());
            assert!(found.tools(body.as_bytes(), at, Dialect::Chat).is_none());
            // The thread lets the list go: the decoder still takes it as found,
            // where one without what was found reads the list again.
            for n in 31..35 {
                let other = list(n);
                crate::front::known_tools::keep(dialect, &other, &Arc::default());
            }
            let (_, context) =
                crate::front::messages::decode_with(body.as_bytes(), &found).unwrap();
            assert_eq!(context.dropped_tools, ["kept"]);
            let (_, context) = crate::front::messages::decode(body.as_bytes()).unwrap();
            assert!(context.dropped_tools.is_empty());
        });
    }

    #[test]
    fn a_history_entry_the_pass_found_known_the_decoder_takes() {
        use crate::conversation::{Item, Message, Prompt, Role};
        crate::on_a_new_thread(|| {
            let text = "line, [with] {marks}: \"quoted\"\n".repeat(40);
            let entry = serde_json::json!({"role": "user", "content": text}).to_string();
            let body = format!(
                r#"{{"model":"m","messages":[{entry}, {{"role":"user","content":"hi"}}]}}"#
            );
            let dialect = Dialect::Messages;
            // Kept as a front's decoding, told apart by its text.
            let kept = Item::Message(Message::text(Role::User, "kept"));
            let at = body.find(&entry).unwrap();
            let head = crate::front::known_entries::head(&body.as_bytes()[at..]).unwrap();
            let decoding = Decoding {
                items: vec![kept.clone()],
                system: Prompt::default(),
            };
            crate::front::known_entries::keep(dialect, head, &entry, decoding);
            let (routed, found) = Shape::routed(body.as_bytes(), &|_| true);
            assert!(matches!(routed, Routed::Ours(_)));
            let (len, _) = found.entry(body.as_bytes(), at, dialect).unwrap();
            assert_eq!(len, entry.len());
            assert!(found.entry(body.as_bytes(), at, Dialect::Chat).is_none());
            assert!(found.entry(body.as_bytes(), at + 1, dialect).is_none());
            // On a thread that keeps nothing: taken as found, and read again
            // without.
            let (taken, read) = std::thread::scope(|threads| {
                let decode = || {
                    let taken = crate::front::messages::decode_with(body.as_bytes(), &found);
                    let read = crate::front::messages::decode(body.as_bytes());
                    (taken.unwrap().0.items, read.unwrap().0.items)
                };
                threads.spawn(decode).join().unwrap()
            });
            assert_eq!(taken[0], kept);
            assert_eq!(read[0], Item::Message(Message::text(Role::User, text)));
            assert_eq!(taken[1..], read[1..]);
        });
    }

    #[test]
    fn a_known_history_entry_counts_as_read() {
        let entry = |i| {
            let text = format!("line {i}, [with] {{marks}}: \"quoted\"\n").repeat(20);
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": text}]})
        };
        let entries: Vec<String> = (0..3).map(|i| entry(i).to_string()).collect();
        let body = format!(
            r#"{{"model":"m","messages":[ {} , {{"role":"user","content":"hi"}}],"stream":true}}"#,
            entries.join(",")
        );
        // A thread of its own: its known entries are this test's.
        crate::on_a_new_thread(move || {
            let fresh = Shape::of(body.as_bytes());
            assert_eq!(fresh.messages, Entries::List(4));
            let dialect = crate::conversation::Dialect::Messages;
            let decoding = crate::front::known_entries::Decoding::default();
            // Kept as the decoder keeps it: found by its bytes and the next
            // entry's first.
            let rest = &body.as_bytes()[body.find(&entries[1]).unwrap()..];
            let head = crate::front::known_entries::head(rest).unwrap();
            crate::front::known_entries::keep(dialect, head, &entries[1], decoding);
            let kept = crate::front::known_entries::values(head, rest);
            assert_eq!(
                kept,
                Some((entries[1].len(), values_in(entries[1].as_bytes())))
            );
            assert_eq!(Shape::of(body.as_bytes()), fresh);
            // Only where an entry begins: the same text as a member's value
            // is read.
            let elsewhere = format!(r#"{{"model":"m","x":{},"messages":[]}}"#, entries[1]);
            assert_eq!(
                Shape::of(elsewhere.as_bytes()).values,
                reference(elsewhere.as_bytes())
            );
        });
    }

    #[test]
    fn an_amplifying_body_counts_every_value() {
        let body = format!(r#"{{"model":"m","x":[{}0]}}"#, "0,".repeat(100_000));
        // The root, `{`, two `:`, one `,` between members, `[` and its commas.
        assert_eq!(Shape::of(body.as_bytes()).values, 100_006);
        assert_eq!(Shape::of(br#"{"s":"a,b:[{\"c\":1}]"}"#).values, 3);
    }

    /// The shape a parse sees in `root`, for the members [`Shape`] reads.
    fn parsed_shape(root: &Value) -> (Option<String>, Entries, Entries, bool) {
        let entries = |member: Option<&Value>| match member {
            None => Entries::Absent,
            Some(Value::String(_)) => Entries::Text,
            Some(Value::Array(items)) => Entries::List(items.len()),
            Some(_) => Entries::Other,
        };
        let model = match root.get("model") {
            // Escaped in the text: left to the parse.
            Some(Value::String(model)) if !serde_json::to_string(model).unwrap().contains('\\') => {
                Some(model.clone())
            }
            _ => None,
        };
        (
            model,
            entries(root.get("messages")),
            entries(root.get("input")),
            root.get("stream") == Some(&Value::Bool(true)),
        )
    }

    fn member() -> impl Strategy<Value = Value> {
        prop_oneof![
            json(),
            "[a-z\"\\\\ ]{0,8}".prop_map(Value::String),
            prop::collection::vec(json(), 0..6).prop_map(Value::Array),
        ]
    }

    #[test]
    fn a_history_checked_once_is_passed_over_by_the_next_check() {
        let entry = |i: usize| {
            let text = format!("line {i}: [a, b] {{c}}: \"d\"\n").repeat(20);
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": text}]})
                .to_string()
        };
        let entries: Vec<String> = (0..4).map(entry).collect();
        let body = format!(
            r#"{{"model":"m","messages":[{}, {{"role":"user","content":"hi"}}],"max_tokens":1}}"#,
            entries.join(" ,")
        );
        // A thread of its own: its known entries are this test's.
        crate::on_a_new_thread(move || {
            let read = Shape::checked(body.as_bytes());
            assert_eq!(read.as_ref(), Some(&Shape::of(body.as_bytes())));
            assert_eq!(
                read.as_ref().map(|shape| shape.messages),
                Some(Entries::List(5))
            );
            // Kept by the check, with the count the shape pass makes.
            let rest = &body.as_bytes()[body.find(&entries[2]).unwrap()..];
            let head = crate::front::known_entries::head(rest).unwrap();
            let kept = crate::front::known_entries::values(head, rest);
            assert_eq!(
                kept,
                Some((entries[2].len(), values_in(entries[2].as_bytes())))
            );
            assert_eq!(Shape::checked(body.as_bytes()), read);
            // What follows them is still checked.
            let broken = body.replace(r#""content":"hi"}]"#, r#""content":"hi"]}"#);
            assert_eq!(Shape::checked(broken.as_bytes()), None);
            // No decoding came of it: an agent's decoder reads them afresh,
            // and its decoding takes the checked entry's place.
            let dialect = crate::conversation::Dialect::Messages;
            let text = std::str::from_utf8(rest).unwrap();
            assert!(crate::front::known_entries::find(dialect, head, text).is_none());
            let (conv, _) = crate::front::messages::decode(body.as_bytes()).unwrap();
            assert_eq!(conv.items.len(), 5);
            assert!(crate::front::known_entries::find(dialect, head, text).is_some());
            assert_eq!(Shape::checked(body.as_bytes()), read);
        });
    }

    #[test]
    fn a_tools_list_checked_once_is_passed_over_by_the_next_check() {
        let tool = |i| serde_json::json!({"name": format!("t{i}"), "parameters": {"a": [1, {}]}});
        let tools = serde_json::to_string(&(0..40).map(tool).collect::<Vec<_>>()).unwrap();
        let body = format!(r#"{{"model":"m","tools": {tools} ,"messages":[]}}"#);
        // A thread of its own: its known lists are this test's.
        crate::on_a_new_thread(move || {
            assert!(crate::front::known_tools::values(tools.as_bytes()).is_none());
            let read = Shape::checked(body.as_bytes());
            assert_eq!(read.as_ref(), Some(&Shape::of(body.as_bytes())));
            // Kept by the check, with the count the shape pass makes.
            let kept = crate::front::known_tools::values(tools.as_bytes());
            assert_eq!(kept, Some((tools.len(), values_in(tools.as_bytes()))));
            assert_eq!(Shape::checked(body.as_bytes()), read);
            // What follows the list is still checked.
            let broken = format!(r#"{{"model":"m","tools": {tools} ]}}"#);
            assert_eq!(Shape::checked(broken.as_bytes()), None);
            // No decoding came of it: an agent's decoder reads it afresh.
            let dialect = crate::conversation::Dialect::Chat;
            assert!(crate::front::known_tools::find(dialect, &tools).is_none());
        });
    }

    proptest! {
        #[test]
        fn the_members_read_are_those_a_parse_sees(
            members in prop::collection::vec((
                prop_oneof![
                    Just("model".to_owned()),
                    Just("messages".to_owned()),
                    Just("input".to_owned()),
                    Just("stream".to_owned()),
                    "[a-z:,\\[]{0,6}",
                ],
                member(),
            ), 0..8),
            pretty in any::<bool>(),
        ) {
            let root = Value::Object(members.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&root).unwrap()
            } else {
                serde_json::to_string(&root).unwrap()
            };
            let shape = Shape::of(text.as_bytes());
            let (model, messages, input, stream) = parsed_shape(&root);
            prop_assert_eq!(shape.model.map(str::to_owned), model, "{}", text);
            prop_assert_eq!(shape.messages, messages, "{}", text);
            prop_assert_eq!(shape.input, input, "{}", text);
            prop_assert_eq!(shape.stream, stream, "{}", text);
            // The pass that checks reads the same, and routes by the model.
            prop_assert_eq!(Shape::checked(text.as_bytes()), Some(shape.clone()), "{}", text);
            let (routed, _) = Shape::routed(text.as_bytes(), &|model| model == "ours");
            match (routed, shape.model) {
                (Routed::Other(other), Some(model)) => {
                    prop_assert_ne!(model, "ours");
                    prop_assert_eq!(other, Some(shape), "{}", text);
                }
                (Routed::Ours(read) | Routed::Read(read), _) => {
                    prop_assert_eq!(read, shape, "{}", text)
                }
                // Stopped at a first `model` a later one makes ambiguous.
                (Routed::Other(other), None) => {
                    prop_assert_eq!(other, Some(shape), "{}", text)
                }
            }
        }

        #[test]
        fn what_the_checking_pass_takes_is_json_and_read_as_of_reads_it(
            body in prop::collection::vec(
                prop::sample::select(vec![
                    &b"\""[..], b"\\", b",", b"{", b"}", b"[", b"]", b":", b"1", b"true",
                    b"\"model\"", b"\"messages\"", b" ", br"\u00e9",
                ]),
                0..24,
            ).prop_map(|parts| parts.concat()),
        ) {
            if let Some(shape) = Shape::checked(&body) {
                prop_assert!(crate::json::check(&body).is_ok(), "{}", String::from_utf8_lossy(&body));
                prop_assert_eq!(shape, Shape::of(&body));
            }
        }
    }

    #[test]
    fn a_request_for_another_model_is_read_in_the_pass_that_checks_it() {
        let ours = |model: &str| model == "agent";
        let other =
            br#"{"model":"other","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let (Routed::Other(Some(shape)), _) = Shape::routed(other, &ours) else {
            panic!("not routed elsewhere");
        };
        assert_eq!(shape, Shape::of(other));
        assert_eq!(
            (shape.model, shape.messages, shape.stream),
            (Some("other"), Entries::List(1), true)
        );
        // Not JSON: the caller reads it again, and the check names the fault.
        let broken = br#"{"model":"other","messages":[}"#;
        assert!(matches!(
            Shape::routed(broken, &ours).0,
            Routed::Other(None)
        ));
        // Ours, or only a parse can tell: read whole, unchecked.
        let agent = br#"{"model":"agent","messages":[]}"#;
        assert!(matches!(Shape::routed(agent, &ours).0, Routed::Ours(_)));
        for body in [
            &br#"{"model":"\u0061gent","messages":[]}"#[..],
            br#"{"messages":[],"model":5}"#,
            br#"{"model":"agent","model":"agent"}"#,
        ] {
            assert!(matches!(Shape::routed(body, &ours).0, Routed::Read(_)));
        }
        // A second `model` after another's: ambiguous, left to the parse.
        let twice = br#"{"model":"other","model":"agent"}"#;
        let (Routed::Other(Some(shape)), _) = Shape::routed(twice, &ours) else {
            panic!("not routed elsewhere");
        };
        assert_eq!(shape.model, None);
    }

    #[test]
    fn a_body_cut_short_leaves_its_lists_to_the_parse() {
        for body in [
            &br#"{"model":"m","messages":["#[..],
            br#"{"model":"m","messages":[{"role":"user"}"#,
            br#"{"model":"m","mess"#,
            br#"{"model":"m","input":"unterminated"#,
            br#"{"model":"m","input":[{"a":{"b":1}"#,
        ] {
            let shape = Shape::of(body);
            assert_eq!(shape.model, Some("m"), "{}", String::from_utf8_lossy(body));
            assert_eq!(
                (shape.messages, shape.input),
                (Entries::Other, Entries::Other)
            );
        }
        let whole = Shape::of(br#"{"model":"m","messages":[]}"#);
        assert_eq!(
            (whole.messages, whole.input),
            (Entries::List(0), Entries::Absent)
        );
    }

    #[test]
    fn a_model_given_twice_or_not_at_the_root_is_left_to_the_parse() {
        // A list given twice: the last, as the decoders take it.
        let shape = Shape::of(br#"{"model":"a","messages":[],"model":"b","messages":[1,2]}"#);
        assert_eq!(shape.model, None);
        assert_eq!(shape.messages, Entries::List(2));
        let body = br#"{"messages":[1,2,3],"messages":[1],"stream":false}"#;
        assert_eq!(Shape::checked(body).unwrap().messages, Entries::List(1));
        let shape = Shape::of(br#"{"x":{"model":"a","input":"hi"},"messages":[{"model":"b"},2]}"#);
        assert_eq!((shape.model, shape.input), (None, Entries::Absent));
        assert_eq!(shape.messages, Entries::List(2));
        let shape = Shape::of(br#"[{"model":"a"}, "model", "b"]"#);
        assert_eq!(shape.model, None);
        let shape = Shape::of(br#"{"mod\u0065l":"a","model":"pl\u0061in"}"#);
        assert_eq!(shape.model, None);
    }
}

//! A request body's members, found without parsing what is only passed on.
//!
//! serde_json skips a value it keeps as text (a `RawValue`) at about five
//! instructions a byte, breaking out of its word-at-a-time search at every
//! escape; a coding agent's tools (Claude Code's: 31 KB of descriptions and
//! schemas) were a quarter of its request's instructions. The scanner looks
//! for the end of a string's plain run 16 bytes at a time (quotes,
//! backslashes and control bytes in one SSE2 mask), and 64 at a time with
//! AVX2 past a long string's first 16: the same 31 KB in 103k instructions
//! with SSE2 alone, against serde_json's 163k. From a string's first
//! escape on, it goes a block of 64 bytes at a time, its escapes found by
//! arithmetic on the block's masks (`escaped_string_end`): stopping at
//! each of a prompt's escapes cost two hard-to-predict branches apiece.
//!
//! It accepts what serde_json's skipping accepts, no more: control bytes in
//! strings, bad escapes, numbers off the grammar, unbalanced brackets and
//! trailing text are errors. Values the caller keeps as values are built
//! where they stand ([`Scanner::parse_value`]: serde_json's values and
//! errors), so nothing is read twice. One bound of ours: nesting deeper
//! than [`MAX_DEPTH`] is refused.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{seen, Raw};

/// Arrays and objects nested deeper than this are refused (serde_json's own
/// bound for the values it parses).
pub const MAX_DEPTH: u32 = 128;

/// Where the text stops being JSON (a byte offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanError {
    pub at: usize,
}

/// Why a body could not be read: where the scanner stopped, or serde_json's
/// error for a value parsed at `at`.
#[derive(Debug)]
pub enum BadJson {
    Scan(ScanError),
    Parse { at: usize, error: serde_json::Error },
}

impl From<ScanError> for BadJson {
    fn from(e: ScanError) -> BadJson {
        BadJson::Scan(e)
    }
}

/// A list's entry as [`Scanner::built_entry`] built it: an object's members
/// as they came (a name given twice is there twice), or any other value.
pub enum Built {
    Members(Vec<(String, Value)>),
    Value(Value),
}

impl Built {
    /// As a value: an object's members in a map, a name given twice in its
    /// first place with its last value, as serde_json reads it.
    pub fn into_value(self) -> Value {
        match self {
            Built::Members(members) => Value::Object(members.into_iter().collect()),
            Built::Value(value) => value,
        }
    }
}

/// A cursor over JSON text, checked to be UTF-8 by its `&str`.
pub struct Scanner<'a> {
    text: &'a str,
    at: usize,
    /// The `[`, `{`, `,` and `:` taken so far: what [`Shape`]'s count of
    /// values adds up.
    ///
    /// [`Shape`]: crate::front::budget::Shape
    marks: usize,
    /// Where a string with escapes is unescaped before it is copied out at
    /// its size: one buffer for the whole text, not one grown by doubling
    /// for each such string (a coding agent's request has hundreds).
    scratch: String,
}

impl<'a> Scanner<'a> {
    pub fn new(text: &'a str) -> Scanner<'a> {
        Scanner {
            text,
            at: 0,
            marks: 0,
            scratch: String::new(),
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn error<T>(&self) -> Result<T, ScanError> {
        Err(ScanError { at: self.at })
    }

    /// The next byte that is not whitespace, not taken.
    pub fn peek(&mut self) -> Option<u8> {
        while let Some(&byte) = self.bytes().get(self.at) {
            if !matches!(byte, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(byte);
            }
            self.at += 1;
        }
        None
    }

    /// Takes `byte`, after whitespace.
    fn expect(&mut self, byte: u8) -> Result<(), ScanError> {
        if self.peek() != Some(byte) {
            return self.error();
        }
        self.at += 1;
        Ok(())
    }

    /// The text from the next value on, whitespace taken.
    pub fn rest(&mut self) -> &'a str {
        self.peek();
        &self.text[self.at..]
    }

    /// How far the scanner is in the text, in bytes.
    pub fn offset(&self) -> usize {
        self.at
    }

    /// Takes the next `len` bytes of [`rest`](Self::rest), which the caller
    /// knows to be one whole value.
    pub fn pass(&mut self, len: usize) {
        self.at = (self.at + len).min(self.text.len());
    }

    /// How many `[`, `{`, `,` and `:` were taken so far.
    pub fn marks(&self) -> usize {
        self.marks
    }

    /// Takes a member's colon.
    fn colon(&mut self) -> Result<(), ScanError> {
        self.expect(b':')?;
        self.marks += 1;
        Ok(())
    }

    /// Takes a `null` if one is next: whether it did.
    pub fn null(&mut self) -> bool {
        self.peek() == Some(b'n') && self.literal(b"null").is_ok()
    }

    /// Nothing but whitespace left.
    pub fn end(&mut self) -> Result<(), ScanError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => self.error(),
        }
    }

    /// One value, skipped: its text.
    pub fn value(&mut self) -> Result<Raw<'a>, ScanError> {
        self.peek();
        let start = self.at;
        self.skip()?;
        Ok(Raw(&self.text[start..self.at]))
    }

    /// One value, as serde_json reads it from where the scanner stands (the
    /// same `Value`, the same error), built here: strings are found by the
    /// scanner's wide search and copied in one piece, where serde_json's
    /// eight bytes at a time, stopped by every escape, were a tenth of a
    /// coding agent's request. Whatever this builder does not take (a
    /// lone surrogate, a number it would have to round, any error) is
    /// read again by serde_json, which has the last word.
    pub fn parse_value(&mut self) -> Result<Value, BadJson> {
        match self.built() {
            Some(value) => Ok(value),
            None => self.parse(),
        }
    }

    /// One value as [`parse_value`](Self::parse_value) builds it; `None`
    /// (the scanner where it stood) where serde_json must decide.
    pub fn built(&mut self) -> Option<Value> {
        let at = self.at;
        if let Some(first) = self.peek() {
            let delineated = matches!(first, b'[' | b'{' | b'"');
            // A number or a literal must end where serde_json's reading of
            // one value ends it.
            if let Some(value) = self.build(0) {
                if delineated || ends_a_value(self.bytes().get(self.at)) {
                    return Some(value);
                }
            }
        }
        self.at = at;
        None
    }

    /// Goes back to `offset`, where the scanner stood before.
    pub fn back_to(&mut self, offset: usize) {
        self.at = offset.min(self.at);
    }

    /// One value and what it holds; `None` where serde_json must decide.
    fn build(&mut self, depth: u32) -> Option<Value> {
        Some(match self.peek()? {
            b'"' => {
                self.at += 1;
                Value::String(self.string_value()?)
            }
            b'[' if depth < BUILD_DEPTH => {
                let mut items = Vec::new();
                let mut more = self.open(b'[', b']').ok()?;
                while more {
                    items.push(self.build(depth + 1)?);
                    more = self.more(b']').ok()?;
                }
                Value::Array(items)
            }
            b'{' if depth < BUILD_DEPTH => {
                let mut members = Map::new();
                // A name given twice keeps its place and the last value.
                self.members(depth, |name, value| drop(members.insert(name, value)))?;
                Value::Object(members)
            }
            b't' => self.literal(b"true").ok().map(|()| Value::Bool(true))?,
            b'f' => self.literal(b"false").ok().map(|()| Value::Bool(false))?,
            b'n' => self.literal(b"null").ok().map(|()| Value::Null)?,
            b'-' | b'0'..=b'9' => {
                let start = self.at;
                self.number().ok()?;
                number(&self.text[start..self.at])?
            }
            _ => return None,
        })
    }

    /// The members of an object, its `{` next, each built and handed to
    /// `add`; `None` where serde_json must decide.
    fn members(&mut self, depth: u32, mut add: impl FnMut(String, Value)) -> Option<()> {
        let mut more = self.open(b'{', b'}').ok()?;
        let mut first = true;
        while more {
            self.expect(b'"').ok()?;
            let name = self.string_value()?;
            // serde_json reads an object led by its raw value's token as
            // the JSON text it holds.
            if first && name == RAW_VALUE_TOKEN {
                return None;
            }
            first = false;
            self.expect(b':').ok()?;
            add(name, self.build(depth + 1)?);
            more = self.more(b'}').ok()?;
        }
        Some(())
    }

    /// One entry of a list, as [`built`](Self::built) builds it but for an
    /// object, whose members are left in a list as they came: a decoder
    /// takes them one by one, and a map would hash each name in and out
    /// (a short message's map was a sixth of its chat request's decoding).
    pub fn built_entry(&mut self) -> Option<Built> {
        let at = self.at;
        let built = match self.peek() {
            Some(b'{') => {
                let mut members = Vec::new();
                let read = self.members(0, |name, value| members.push((name, value)));
                read.map(|()| Built::Members(members))
            }
            _ => self.built().map(Built::Value),
        };
        if built.is_none() {
            self.at = at;
        }
        built
    }

    /// The rest of a string, its opening quote taken, unescaped in the same
    /// pass that finds its end; `None` for what serde_json refuses (a
    /// control byte, a bad escape, a lone surrogate) or a string left open.
    fn string_value(&mut self) -> Option<String> {
        let start = self.at;
        self.at += special(&self.bytes()[self.at..]);
        if *self.bytes().get(self.at)? == b'"' {
            self.at += 1;
            return Some(self.text[start..self.at - 1].to_owned());
        }
        // Out of the scanner while `escape` moves it on; put back below.
        let mut unescaped = std::mem::take(&mut self.scratch);
        unescaped.clear();
        let mut run = start;
        // A string found long is looked for among those read before; a
        // short one never pays the lookup.
        let mut looked = false;
        let end = loop {
            let plain = &self.text[run..self.at];
            match self.bytes().get(self.at) {
                Some(b'"') => {
                    unescaped.push_str(plain);
                    self.at += 1;
                    break true;
                }
                Some(b'\\') => {
                    unescaped.push_str(plain);
                    self.at += 1;
                    match self.escape() {
                        Some(decoded) => unescaped.push(decoded),
                        None => break false,
                    }
                    run = self.at;
                }
                _ => break false,
            }
            if !looked && self.at - start > seen::SMALLEST {
                looked = true;
                if let Some((len, text)) = seen::unescaped(&self.bytes()[start..]) {
                    self.scratch = unescaped;
                    self.at = start + len + 1;
                    return Some(text);
                }
            }
            self.at += special(&self.bytes()[self.at..]);
        };
        let text = end.then(|| unescaped.as_str().to_owned());
        if end && looked {
            seen::keep(&self.text[start..self.at - 1], Some(&unescaped));
        }
        self.scratch = unescaped;
        text
    }

    /// The escape after a backslash (taken), decoded and taken.
    fn escape(&mut self) -> Option<char> {
        let bytes = self.bytes();
        let escape = *bytes.get(self.at)?;
        self.at += 1;
        Some(match escape {
            b'u' => {
                let unit = hex4(bytes.get(self.at..self.at + 4)?)?;
                self.at += 4;
                if !(0xD800..=0xDBFF).contains(&unit) {
                    // A trailing surrogate alone is no char.
                    return char::from_u32(unit);
                }
                let low = match bytes.get(self.at..self.at + 6)? {
                    [b'\\', b'u', hex @ ..] => hex4(hex)?,
                    _ => return None,
                };
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                self.at += 6;
                char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?
            }
            // The one list of them, which a string's check reads too.
            short => char::from(short_escape(short)?),
        })
    }

    /// One value as serde_json reads it, from where the scanner stands.
    pub fn parse<T: Deserialize<'a>>(&mut self) -> Result<T, BadJson> {
        let at = self.at;
        let mut values = serde_json::Deserializer::from_str(&self.text[at..]).into_iter::<T>();
        match values.next() {
            Some(Ok(value)) => {
                self.at += values.byte_offset();
                Ok(value)
            }
            Some(Err(error)) => Err(BadJson::Parse { at, error }),
            None => Err(BadJson::Scan(ScanError {
                at: self.text.len(),
            })),
        }
    }

    /// An object's members: `member` reads each value (and must take it
    /// whole), given the scanner and the member's name.
    pub fn object<E: From<ScanError>>(
        &mut self,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut more = self.open(b'{', b'}')?;
        while more {
            let name = self.text()?;
            self.colon()?;
            member(self, name)?;
            more = self.more(b'}')?;
        }
        Ok(())
    }

    /// An array's elements: `element` reads each.
    pub fn array<E: From<ScanError>>(
        &mut self,
        mut element: impl FnMut(&mut Self) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut more = self.open(b'[', b']')?;
        while more {
            element(self)?;
            more = self.more(b']')?;
        }
        Ok(())
    }

    /// Takes `open`: whether something comes before `close` (taken if not).
    fn open(&mut self, open: u8, close: u8) -> Result<bool, ScanError> {
        self.expect(open)?;
        self.marks += 1;
        if self.peek() == Some(close) {
            self.at += 1;
            return Ok(false);
        }
        Ok(true)
    }

    /// After a member or an element: whether another follows (its comma
    /// taken) or `close` ends them (taken).
    fn more(&mut self, close: u8) -> Result<bool, ScanError> {
        match self.peek() {
            Some(b',') => {
                self.at += 1;
                self.marks += 1;
                Ok(true)
            }
            Some(byte) if byte == close => {
                self.at += 1;
                Ok(false)
            }
            _ => self.error(),
        }
    }

    /// A string (a member's name, or a value): borrowed from the text
    /// unless it has escapes.
    pub fn text(&mut self) -> Result<Cow<'a, str>, ScanError> {
        self.expect(b'"')?;
        let start = self.at;
        self.at += special(&self.bytes()[self.at..]);
        if self.bytes().get(self.at) == Some(&b'"') {
            self.at += 1;
            return Ok(Cow::Borrowed(&self.text[start..self.at - 1]));
        }
        // Unescaped as its end is found (a model's answer has its `\n`s):
        // found first, then read again, it took twice the time.
        self.at = start;
        if let Some(text) = self.string_value() {
            return Ok(Cow::Owned(text));
        }
        // Where it stops being JSON; a lone surrogate, which is JSON, is
        // refused at the string's start, as serde_json always refused it.
        self.at = start;
        self.string()?;
        Err(ScanError { at: start })
    }

    /// Skips one value.
    fn skip(&mut self) -> Result<(), ScanError> {
        // Bit `d` is set while level `d` is an array, clear for an object.
        let mut arrays: u128 = 0;
        let mut depth: u32 = 0;
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    self.string()?;
                }
                Some(open @ (b'{' | b'[')) => {
                    if depth == MAX_DEPTH {
                        return self.error();
                    }
                    let array = open == b'[';
                    if self.open(open, closing(array))? {
                        let level = 1u128 << depth;
                        depth += 1;
                        if array {
                            arrays |= level;
                        } else {
                            arrays &= !level;
                            self.member_name()?;
                        }
                        continue;
                    }
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                _ => return self.error(),
            }
            // A value ended: close what it ends, or go on to the next.
            loop {
                if depth == 0 {
                    return Ok(());
                }
                let array = arrays & (1u128 << (depth - 1)) != 0;
                if self.more(closing(array))? {
                    if !array {
                        self.member_name()?;
                    }
                    break;
                }
                depth -= 1;
            }
        }
    }

    /// A member's name and its colon, inside a skipped object.
    fn member_name(&mut self) -> Result<(), ScanError> {
        self.expect(b'"')?;
        self.string()?;
        self.colon()
    }

    /// The rest of a string, its opening quote taken: whether it has escapes.
    fn string(&mut self) -> Result<bool, ScanError> {
        let start = self.at;
        self.at += special(&self.bytes()[self.at..]);
        match self.bytes().get(self.at) {
            Some(b'"') => {
                self.at += 1;
                return Ok(false);
            }
            Some(b'\\') => {}
            // A control byte (JSON wants it escaped), or the text's end.
            _ => return self.error(),
        }
        if let Some(len) = seen::checked(&self.bytes()[start..]) {
            self.at = start + len + 1;
            return Ok(true);
        }
        match escaped_string_end(self.bytes(), self.at) {
            Ok(end) => {
                seen::keep(&self.text[start..end - 1], None);
                self.at = end;
                Ok(true)
            }
            Err(at) => Err(ScanError { at }),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ScanError> {
        if !self.bytes()[self.at..].starts_with(word) {
            return self.error();
        }
        self.at += word.len();
        Ok(())
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Result<(), ScanError> {
        if self.bytes().get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.bytes().get(self.at) {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return self.error(),
        }
        if self.bytes().get(self.at) == Some(&b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.bytes().get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.bytes().get(self.at) {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Ok(())
    }

    /// Takes a run of digits, eight a step: llama.cpp's `timings`, in each
    /// answer it sends, are numbers of up to 18 digits, skipped a byte at a
    /// time in about 80 instructions apiece.
    fn digits(&mut self) {
        let bytes = self.bytes();
        while let Some(eight) = bytes[self.at..].first_chunk::<8>() {
            let word = u64::from_le_bytes(*eight);
            // A byte's high bit is set where it is no digit: below `0` its
            // difference borrows, above `9` its sum reaches the bit. A
            // borrow or a carry runs only into later bytes, past the first
            // one flagged, which is all that is read.
            let not_digit = (word.wrapping_sub(0x3030_3030_3030_3030)
                | word.wrapping_add(0x4646_4646_4646_4646))
                & 0x8080_8080_8080_8080;
            if not_digit != 0 {
                self.at += (not_digit.trailing_zeros() / 8) as usize;
                return;
            }
            self.at += 8;
        }
        while let Some(b'0'..=b'9') = bytes.get(self.at) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Result<(), ScanError> {
        let start = self.at;
        self.digits();
        if self.at == start {
            return self.error();
        }
        Ok(())
    }
}

/// How deep [`Scanner::parse_value`] builds: one level short of serde_json's
/// bound, which it is left to refuse.
const BUILD_DEPTH: u32 = 126;

/// The member name by which serde_json's `raw_value` marks its own.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Whether serde_json's reading of one number or literal ends before `next`
/// (a byte that cannot go on with it), rather than refusing it as trailing.
fn ends_a_value(next: Option<&u8>) -> bool {
    matches!(
        next,
        None | Some(b' ' | b'\n' | b'\t' | b'\r' | b'"' | b'[' | b']' | b'{' | b'}' | b',' | b':')
    )
}

/// A number's text, scanned, as serde_json makes it: an integer of up to
/// 18 digits here, anything else (a float, `-0`, a long integer that may
/// become a float) by serde_json itself.
fn number(text: &str) -> Option<Value> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, text),
    };
    if digits.len() <= 18 && digits.bytes().all(|b| b.is_ascii_digit()) {
        let magnitude: i64 = digits.parse().ok()?;
        return match (negative, magnitude) {
            (false, n) => Some(Value::from(n.unsigned_abs())),
            (true, 0) => serde_json::from_str(text).ok(),
            (true, n) => Some(Value::from(-n)),
        };
    }
    serde_json::from_str(text).ok()
}

/// Four hex digits' value.
fn hex4(hex: &[u8]) -> Option<u32> {
    hex.iter().try_fold(0, |value, &digit| {
        Some(value << 4 | char::from(digit).to_digit(16)?)
    })
}

/// What closes an array, or an object.
fn closing(array: bool) -> u8 {
    if array {
        b']'
    } else {
        b'}'
    }
}

/// Where the first `"`, `\` or control byte of `text` is (its length if
/// none): what ends a string's plain run. Most strings end within 16 bytes
/// (names, types, roles), which one SSE2 step finds; a long one (a prompt,
/// a tool's description: most of a coding agent's request) runs on in AVX2
/// steps of 64 bytes, where the CPU has it.
#[inline]
fn special(text: &[u8]) -> usize {
    let mut at = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if text.len() >= 16 {
            // SAFETY: SSE2 is part of every x86_64 CPU; the 16 bytes read
            // are within `text`.
            let first = unsafe { specials_sse2(text, 0) };
            if first != 0 {
                return first.trailing_zeros() as usize;
            }
            at = 16;
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, just checked.
                at = unsafe { special_avx2(text, at) };
                if at < text.len() && is_special(text[at]) {
                    return at;
                }
            }
            while at + 16 <= text.len() {
                // SAFETY: as above.
                let found = unsafe { specials_sse2(text, at) };
                if found != 0 {
                    return at + found.trailing_zeros() as usize;
                }
                at += 16;
            }
        }
    }
    at + text[at..]
        .iter()
        .position(|&byte| is_special(byte))
        .unwrap_or(text.len() - at)
}

/// The end of a string (just past its closing quote) from its first
/// backslash at `at`; else where it stops being JSON: a bad escape (at its
/// letter), a control byte, or the text's end.
///
/// A prompt or a tool's description has an escape every line or so (`\n`,
/// `\"`); stopping at each, as a plain run's search does, costs a search
/// and two hard-to-predict branches an escape. Here a block of 64 bytes
/// yields masks of its quotes, backslashes and control bytes, the escaped
/// bytes follow by arithmetic (as simdjson finds them), and the string ends
/// at the first quote not escaped: a block's `\"`, `\\` and `\n` cost a
/// bit test together, any other escape a look of its own.
fn escaped_string_end(text: &[u8], at: usize) -> Result<usize, usize> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, just checked.
        return unsafe { escaped_string_end_avx2(text, at) };
    }
    escaped_string_end_by(text, at, Block::of)
}

/// [`escaped_string_end`] with AVX2's masks, compiled for it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn escaped_string_end_avx2(text: &[u8], at: usize) -> Result<usize, usize> {
    // SAFETY: the caller's CPU has AVX2.
    escaped_string_end_by(text, at, |bytes, len| unsafe { Block::of_avx2(bytes, len) })
}

/// [`escaped_string_end`], each block's masks made by `of`.
#[inline(always)]
fn escaped_string_end_by(
    text: &[u8],
    mut at: usize,
    of: impl Fn(&[u8; 64], usize) -> Block,
) -> Result<usize, usize> {
    // Whether the block's first byte is escaped (the last ended in an odd
    // run of backslashes).
    let mut carry = 0;
    loop {
        let Block {
            quote,
            backslash,
            control,
            letter_n,
            len,
        } = Block::at(text, at, &of);
        if len == 0 {
            return Err(text.len());
        }
        let escaped = escaped(backslash, &mut carry) & Block::bits(len);
        let stop = (quote & !escaped) | control;
        // The escaped bytes before the first stop: each must be an escape's
        // letter.
        let letters = escaped & stop.wrapping_sub(1) & !stop;
        // `\"`, `\\` and `\n` (most of them) by their masks; the rest one by one.
        let mut letters = letters & !(quote | backslash | letter_n);
        while letters != 0 {
            let i = at + letters.trailing_zeros() as usize;
            match text[i] {
                letter if short_escape(letter).is_some() => {}
                b'u' if text.get(i + 1..i + 5).and_then(hex4).is_some() => {}
                _ => return Err(i),
            }
            letters &= letters - 1;
        }
        if stop != 0 {
            let i = stop.trailing_zeros();
            return match quote >> i & 1 {
                1 => Ok(at + i as usize + 1),
                _ => Err(at + i as usize),
            };
        }
        at += len;
    }
}

/// The bytes escaped by a backslash in a block: those after an odd run of
/// backslashes (simdjson's `find_escaped_branchless`). `carry`: whether the
/// block's first byte is escaped, on return the next block's.
#[inline]
fn escaped(backslash: u64, carry: &mut u64) -> u64 {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    // An escaped backslash starts no escape.
    let backslash = backslash & !*carry;
    let follows_escape = backslash << 1 | *carry;
    // Runs starting on an odd bit, added to the backslashes, carry out of
    // their run: each run's end bit then tells its length's parity.
    let odd_starts = backslash & !EVEN & !follows_escape;
    let (even_starts, overflow) = odd_starts.overflowing_add(backslash);
    *carry = u64::from(overflow);
    (EVEN ^ even_starts << 1) & follows_escape
}

/// A bit for each quote, backslash, control byte and `n` of up to 64 bytes
/// (bit `i`: the block's byte `i`).
struct Block {
    quote: u64,
    backslash: u64,
    control: u64,
    letter_n: u64,
    /// How many bytes it covers: 64, fewer at the text's end.
    len: usize,
}

impl Block {
    /// The block of `text` from `at`, its masks made by `of`.
    #[inline(always)]
    fn at(text: &[u8], at: usize, of: impl Fn(&[u8; 64], usize) -> Block) -> Block {
        if let Some(Ok(bytes)) = text.get(at..at + 64).map(<&[u8; 64]>::try_from) {
            return of(bytes, 64);
        }
        // The text's end, padded with spaces (no bit of any mask).
        let rest = text.get(at..).unwrap_or_default();
        let mut block = [b' '; 64];
        block[..rest.len()].copy_from_slice(rest);
        of(&block, rest.len())
    }

    /// The masks of `bytes`, 32 at a time.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn of_avx2(bytes: &[u8; 64], len: usize) -> Block {
        use std::arch::x86_64::{
            __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_min_epu8, _mm256_movemask_epi8,
            _mm256_set1_epi8,
        };
        // SAFETY: the 32 bytes read are within `bytes`, and an unaligned load
        // may start anywhere.
        let load =
            |at: usize| unsafe { _mm256_loadu_si256(bytes.as_ptr().add(at).cast::<__m256i>()) };
        let (low, high) = (load(0), load(32));
        let bits = |low, high| {
            u64::from(_mm256_movemask_epi8(low) as u32)
                | u64::from(_mm256_movemask_epi8(high) as u32) << 32
        };
        let equal = |byte: u8| {
            let byte = _mm256_set1_epi8(byte as i8);
            bits(_mm256_cmpeq_epi8(low, byte), _mm256_cmpeq_epi8(high, byte))
        };
        // A byte at most 0x1f is its own minimum with 0x1f.
        let control = _mm256_set1_epi8(0x1f);
        Block {
            quote: equal(b'"'),
            backslash: equal(b'\\'),
            letter_n: equal(b'n'),
            control: bits(
                _mm256_cmpeq_epi8(_mm256_min_epu8(low, control), low),
                _mm256_cmpeq_epi8(_mm256_min_epu8(high, control), high),
            ),
            len,
        }
    }

    /// The masks' bits of a block of `len` bytes.
    fn bits(len: usize) -> u64 {
        u64::MAX.checked_shr(64 - len as u32).unwrap_or(0)
    }

    /// The masks of `bytes`, 16 at a time (SSE2, on every x86_64 CPU), or
    /// a byte at a time elsewhere.
    #[inline]
    fn of(bytes: &[u8; 64], len: usize) -> Block {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{
                __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8,
                _mm_set1_epi8,
            };
            let (mut quote, mut backslash, mut control, mut letter_n) = (0, 0, 0, 0);
            for i in 0..4 {
                // SAFETY: SSE2 is part of every x86_64 CPU; the 16 bytes
                // read are within `bytes`, and an unaligned load may start
                // anywhere.
                unsafe {
                    let chunk = _mm_loadu_si128(bytes.as_ptr().add(16 * i).cast::<__m128i>());
                    let bits = |found| u64::from(_mm_movemask_epi8(found) as u16) << (16 * i);
                    quote |= bits(_mm_cmpeq_epi8(chunk, _mm_set1_epi8(b'"' as i8)));
                    backslash |= bits(_mm_cmpeq_epi8(chunk, _mm_set1_epi8(b'\\' as i8)));
                    letter_n |= bits(_mm_cmpeq_epi8(chunk, _mm_set1_epi8(b'n' as i8)));
                    // A byte at most 0x1f is its own minimum with 0x1f.
                    let low = _mm_min_epu8(chunk, _mm_set1_epi8(0x1f));
                    control |= bits(_mm_cmpeq_epi8(low, chunk));
                }
            }
            Block {
                quote,
                backslash,
                control,
                letter_n,
                len,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mask = |hit: fn(u8) -> bool| {
                bytes
                    .iter()
                    .rev()
                    .fold(0u64, |mask, &byte| mask << 1 | u64::from(hit(byte)))
            };
            Block {
                quote: mask(|b| b == b'"'),
                backslash: mask(|b| b == b'\\'),
                control: mask(|b| b < 0x20),
                letter_n: mask(|b| b == b'n'),
                len,
            }
        }
    }
}

/// What a backslash and `byte` stand for, where they are a whole escape:
/// `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r` or `\t`.
#[inline]
fn short_escape(byte: u8) -> Option<u8> {
    const DECODED: [u8; 128] = {
        let mut decoded = [0; 128];
        decoded[b'"' as usize] = b'"';
        decoded[b'\\' as usize] = b'\\';
        decoded[b'/' as usize] = b'/';
        decoded[b'b' as usize] = 0x08;
        decoded[b'f' as usize] = 0x0c;
        decoded[b'n' as usize] = b'\n';
        decoded[b'r' as usize] = b'\r';
        decoded[b't' as usize] = b'\t';
        decoded
    };
    DECODED
        .get(usize::from(byte))
        .copied()
        .filter(|&decoded| decoded != 0)
}

fn is_special(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < 0x20
}

/// A bit for each special byte of the 16 at `at`, which must be in `text`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn specials_sse2(text: &[u8], at: usize) -> u32 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    debug_assert!(at + 16 <= text.len());
    // An unaligned load may start anywhere.
    let chunk = _mm_loadu_si128(text.as_ptr().add(at).cast::<__m128i>());
    let found = _mm_or_si128(
        _mm_or_si128(
            _mm_cmpeq_epi8(chunk, _mm_set1_epi8(b'"' as i8)),
            _mm_cmpeq_epi8(chunk, _mm_set1_epi8(b'\\' as i8)),
        ),
        // A byte at most 0x1f is its own minimum with 0x1f.
        _mm_cmpeq_epi8(_mm_min_epu8(chunk, _mm_set1_epi8(0x1f)), chunk),
    );
    _mm_movemask_epi8(found) as u32
}

/// From `at`, where the first special byte of `text` is, or where fewer
/// than 32 bytes are left: 64 bytes a step, then 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn special_avx2(text: &[u8], mut at: usize) -> usize {
    use std::arch::x86_64::{
        __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_min_epu8, _mm256_movemask_epi8,
        _mm256_or_si256, _mm256_set1_epi8, _mm256_testz_si256,
    };
    let quote = _mm256_set1_epi8(b'"' as i8);
    let backslash = _mm256_set1_epi8(b'\\' as i8);
    let control = _mm256_set1_epi8(0x1f);
    // SAFETY (of each load): the loop's condition keeps the 32 bytes read
    // within `text`; an unaligned load may start anywhere.
    let load = |at: usize| unsafe { _mm256_loadu_si256(text.as_ptr().add(at).cast::<__m256i>()) };
    let specials = |chunk: __m256i| {
        _mm256_or_si256(
            _mm256_or_si256(
                _mm256_cmpeq_epi8(chunk, quote),
                _mm256_cmpeq_epi8(chunk, backslash),
            ),
            _mm256_cmpeq_epi8(_mm256_min_epu8(chunk, control), chunk),
        )
    };
    while at + 64 <= text.len() {
        let (low, high) = (specials(load(at)), specials(load(at + 32)));
        let either = _mm256_or_si256(low, high);
        if _mm256_testz_si256(either, either) == 0 {
            let low = _mm256_movemask_epi8(low) as u32;
            if low != 0 {
                return at + low.trailing_zeros() as usize;
            }
            return at + 32 + (_mm256_movemask_epi8(high) as u32).trailing_zeros() as usize;
        }
        at += 64;
    }
    while at + 32 <= text.len() {
        let found = _mm256_movemask_epi8(specials(load(at))) as u32;
        if found != 0 {
            return at + found.trailing_zeros() as usize;
        }
        at += 32;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A string's end from its first backslash at 0, by the blocks this CPU
    /// uses and by SSE2's (the same).
    fn escaped_string_end_each_way(text: &[u8]) -> Result<usize, usize> {
        let end = escaped_string_end(text, 0);
        assert_eq!(escaped_string_end_by(text, 0, Block::of), end);
        end
    }

    /// A string's end from `at` within it, found a byte at a time.
    fn walked_string_end(text: &[u8], mut at: usize) -> Result<usize, usize> {
        loop {
            match *text.get(at).ok_or(text.len())? {
                b'"' => return Ok(at + 1),
                b'\\' => {
                    at += 1;
                    match text.get(at) {
                        Some(&letter) if b"\"\\/bfnrt".contains(&letter) => at += 1,
                        Some(b'u')
                            if text
                                .get(at + 1..at + 5)
                                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                        {
                            at += 5
                        }
                        _ => return Err(at),
                    }
                }
                byte if byte < 0x20 => return Err(at),
                _ => at += 1,
            }
        }
    }

    /// A run of backslashes at every place around a block's edge: what
    /// follows it is escaped or not by the run's length.
    #[test]
    fn carries_an_escape_across_a_block_edge() {
        for plain in 0..140 {
            for run in 1..6 {
                for next in ['"', 'n', '\\', 'x', '\u{1}'] {
                    let (plain, run) = ("a".repeat(plain), "\\".repeat(run));
                    let text = format!("\\n{plain}{run}{next}ab\"");
                    let text = text.as_bytes();
                    assert_eq!(
                        escaped_string_end_each_way(text),
                        walked_string_end(text, 0)
                    );
                }
            }
        }
    }

    fn skips(text: &str) -> Result<usize, ScanError> {
        let mut scan = Scanner::new(text);
        scan.value()?;
        scan.end()?;
        Ok(scan.at)
    }

    /// What serde_json's skipping says of the same text.
    fn serde_skips(text: &str) -> bool {
        serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
    }

    #[test]
    fn accepts_what_serde_json_accepts_and_refuses_the_rest() {
        let valid = [
            r#"{"a":[1,-0.5e+3,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"],"b":{}}"#,
            " [ ] ",
            r#""a string longer than sixteen bytes, with an escape \n here""#,
            "0",
            "-12.25E-7",
            r#"{"nested":{"deeper":[[[{"k":"v"}]]]}}"#,
            "\"\u{e9}t\u{e9} \u{1f600}\"",
        ];
        for text in valid {
            assert!(serde_skips(text), "{text}");
            assert_eq!(skips(text), Ok(text.len()), "{text}");
        }
        let invalid = [
            r#"{"a":1,}"#,
            "[1,]",
            "01",
            "1.",
            "1e",
            "-",
            ".5",
            "tru",
            "nulll",
            r#""\x""#,
            r#""\u12g4""#,
            "\"a\tb\"",
            r#""unterminated"#,
            r#"{"a" 1}"#,
            r#"{1:2}"#,
            "[1 2]",
            "{]",
            "[}",
            "1 2",
            "",
        ];
        for text in invalid {
            assert!(!serde_skips(text), "{text}");
            assert!(skips(text).is_err(), "{text}");
        }
    }

    /// `parse_value` and serde_json's reading of the same text, from its
    /// start: the same value (to its last bit, in its members' order), the
    /// same end, or the same error.
    fn builds_as_serde_json_does(text: &str) -> Result<(), String> {
        let (mut ours, mut theirs) = (Scanner::new(text), Scanner::new(text));
        match (ours.parse_value(), theirs.parse::<Value>()) {
            (Ok(built), Ok(parsed)) => {
                // The text tells floats' bits (shortest round trip) and
                // members' order apart, and `-0.0` from `0`.
                let (built, parsed) = (built.to_string(), parsed.to_string());
                if built != parsed || ours.at != theirs.at {
                    return Err(format!(
                        "{built} at {} against {parsed} at {}",
                        ours.at, theirs.at
                    ));
                }
            }
            (Err(ours), Err(theirs)) => {
                let (ours, theirs) = (format!("{ours:?}"), format!("{theirs:?}"));
                if ours != theirs {
                    return Err(format!("{ours} against {theirs}"));
                }
            }
            (ours, theirs) => return Err(format!("{ours:?} against {theirs:?}")),
        }
        // An entry's members left in a list make the same value (a name
        // given twice in its first place, with its last value).
        let (mut entry, mut whole) = (Scanner::new(text), Scanner::new(text));
        let text = |value: Option<Value>| value.map(|value| value.to_string());
        let (entry_value, whole_value) = (
            text(entry.built_entry().map(Built::into_value)),
            text(whole.built()),
        );
        if entry_value != whole_value || entry.at != whole.at {
            return Err(format!("an entry {entry_value:?} against {whole_value:?}"));
        }
        Ok(())
    }

    #[test]
    fn builds_values_as_serde_json_does() {
        let texts = [
            r#"{"a":[1,-0.5e+3,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"],"b":{}}"#,
            r#" {"a\u0062" : [ 1 , 2 ] , "c":{"d":"e"}} tail"#,
            r#"["\ud83d\ude00", "\u00e9t\u00e9", "a\u0000b"]"#,
            r#""\ud83d""#,
            r#""\ud83d\u0041""#,
            r#""\ude00""#,
            r#""\ud83d\n""#,
            r#"{"k":1,"k":2,"j":3}"#,
            r#"{"$serde_json::private::RawValue":"[1,2]"}"#,
            r#"{"a":1,"$serde_json::private::RawValue":"[1,2]"}"#,
            "-0",
            "[-0, 0, -1, 18446744073709551615, 18446744073709551616, -9223372036854775808]",
            "[123456789012345678, 1234567890123456789, -123456789012345678]",
            "[1e400, 1.5e-320, 2.2250738585072011e-308, 0.1, 1E2]",
            "12x",
            "12 ",
            "true]",
            "truex",
            "nul",
            "[1,]",
            "01",
            "\"a\tb\"",
            "",
            "  ",
            "[[[]]]",
        ];
        for text in texts {
            builds_as_serde_json_does(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for n in 120..135 {
            builds_as_serde_json_does(&deep(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
    }

    #[test]
    fn a_long_string_with_escapes_is_kept_and_read_again_as_it_was() {
        crate::on_a_new_thread(|| {
            let text = serde_json::json!("a \"quoted\" line\n".repeat(200)).to_string();
            let raw = &text[1..text.len() - 1];
            assert!(seen::checked(&text.as_bytes()[1..]).is_none());
            let first = Scanner::new(&text).parse_value().unwrap();
            assert_eq!(
                seen::unescaped(&text.as_bytes()[1..]).map(|(len, _)| len),
                Some(raw.len())
            );
            let list = format!("[{text}, 1]");
            let mut again = Scanner::new(&list);
            assert_eq!(again.parse_value().unwrap(), serde_json::json!([first, 1]));
            again.end().unwrap();
        });
    }

    #[test]
    fn digits_end_before_any_character_at_any_place_in_a_step() {
        let characters = (0..0x800)
            .chain([0xFFFF, 0x10FFFF])
            .filter_map(char::from_u32);
        for c in characters {
            for len in 0..=17 {
                let text = format!("{}{c}7", "9".repeat(len));
                let mut s = Scanner::new(&text);
                s.digits();
                let expected = len + usize::from(c.is_ascii_digit()) * 2;
                assert_eq!(s.offset(), expected, "{text:?}");
            }
        }
    }

    proptest! {
        /// A run of digits ends where the first byte that is not one is,
        /// whatever follows it.
        #[test]
        fn digits_end_at_the_first_byte_that_is_not_one(
            digits in "[0-9]{0,40}",
            rest in "\\PC{0,12}",
            bytes in prop::collection::vec(any::<u8>(), 0..12),
        ) {
            // Any byte after the digits: `bytes` as text where they are
            // UTF-8, else as characters of their own value.
            let tail = String::from_utf8(bytes.clone())
                .unwrap_or_else(|_| bytes.iter().map(|&b| char::from(b)).collect());
            for after in [rest, tail] {
                let text = format!("{digits}{after}");
                let mut s = Scanner::new(&text);
                s.digits();
                let by_byte = text.bytes().take_while(u8::is_ascii_digit).count();
                prop_assert_eq!(s.offset(), by_byte, "{:?}", text);
            }
        }

        /// Long strings with escapes, read again (the thread keeps them,
        /// [`seen`]), and texts that begin as they do: each builds as
        /// serde_json reads it.
        #[test]
        fn long_strings_read_again_build_as_serde_json_does(
            line in "[ -~\u{e9}\\\"]{0,30}",
            lines in 40..300usize,
            edits in prop::collection::vec((
                any::<prop::sample::Index>(),
                prop::sample::select(vec!["", "\"", "\\", "\\u12", "x", "\\\"", "\t", "\\n"]),
            ), 0..3),
        ) {
            let text = serde_json::json!(format!("{line}\n").repeat(lines)).to_string();
            let mut edited = text.clone();
            for (at, insert) in edits {
                let mut at = at.index(edited.len() + 1);
                while !edited.is_char_boundary(at) {
                    at -= 1;
                }
                edited.insert_str(at, insert);
            }
            let variants = [
                text.clone(),
                format!("[{text},{text}]"),
                edited,
                text[..text.len() - 1].to_owned(),
                format!("{}x\"", &text[..text.len() - 1]),
                format!("{}\\\"", &text[..text.len() - 1]),
            ];
            // Checked (a string kept without its text), built (its text
            // added), then both again, from what was kept.
            for variant in variants.iter().chain(&variants) {
                prop_assert_eq!(skips(variant).is_ok(), serde_skips(variant), "{}", variant);
                builds_as_serde_json_does(variant).map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(skips(&deep(MAX_DEPTH as usize)).is_ok());
        assert!(skips(&deep(MAX_DEPTH as usize + 1)).is_err());
    }

    #[test]
    fn members_are_read_in_order_with_names_unescaped() {
        let text = r#" {"a\u0062":[1, 2] , "c":{"d":"e"},"f":"g"} "#;
        let mut scan = Scanner::new(text);
        let mut seen = Vec::new();
        scan.object(|scan, name| {
            let value = match name.as_ref() {
                "f" => scan.parse::<String>().map_err(|_| ScanError { at: 0 })?,
                _ => scan.value()?.get().to_owned(),
            };
            seen.push((name.into_owned(), value));
            Ok::<_, ScanError>(())
        })
        .unwrap();
        scan.end().unwrap();
        let expected = [("ab", "[1, 2]"), ("c", r#"{"d":"e"}"#), ("f", "g")];
        let expected: Vec<_> = expected
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(seen, expected);
    }

    /// Text close to JSON: valid values with bytes changed, cut or added.
    fn near_json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            any::<f64>().prop_map(|f| serde_json::json!(f).to_string()),
            any::<i64>().prop_map(|i| i.to_string()),
            "[ -~\u{e9}\u{1f600}\n\t\\\\\"]{0,40}".prop_map(|s| serde_json::json!(s).to_string()),
        ];
        let value = leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec(("[a-z\"\\\\]{0,6}", inner), 0..6).prop_map(|members| {
                    let members: Vec<_> = members
                        .into_iter()
                        .map(|(k, v)| format!("{}:{v}", serde_json::json!(k)))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        });
        (
            value,
            any::<usize>(),
            "[\\\\\"{}\\[\\],: 0-9a-z\u{1}]{0,2}",
            0..3u8,
        )
            .prop_map(|(text, at, bytes, how)| {
                let mut at = at % (text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                match how {
                    0 => text,
                    1 => format!("{}{bytes}{}", &text[..at], &text[at..]),
                    _ => text[..at].to_owned(),
                }
            })
    }

    proptest! {
        #[test]
        fn agrees_with_serde_json_on_any_text(text in near_json()) {
            prop_assert_eq!(skips(&text).is_ok(), serde_skips(&text), "{}", text);
        }

        #[test]
        fn builds_as_serde_json_on_any_text(text in near_json()) {
            prop_assert!(builds_as_serde_json_does(&text).is_ok(), "{}: {:?}", text, builds_as_serde_json_does(&text));
        }

        /// Strings of escapes, surrogates paired and not, and numbers at
        /// the edges of their types.
        #[test]
        fn builds_escapes_and_numbers_as_serde_json(
            parts in prop::collection::vec(prop_oneof![
                Just("\\u00e9"), Just("\\ud83d"), Just("\\ude00"), Just("\\u0041"),
                Just("\\n"), Just("\\\""), Just("\\\\"), Just("\\/"), Just("\\"),
                Just("x"), Just("\u{e9}"), Just("\u{1}"), Just("\\u12"),
            ], 0..8),
            numbers in prop::collection::vec(prop_oneof![
                any::<u64>().prop_map(|n| n.to_string()),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<f64>().prop_map(|f| format!("{f:e}")),
                "-?[0-9]{1,22}(\\.[0-9]{0,3})?([eE][+-]?[0-9]{1,3})?",
            ], 0..4),
        ) {
            let text = format!("[\"{}\",{}]", parts.concat(), numbers.join(","));
            prop_assert!(builds_as_serde_json_does(&text).is_ok(), "{}: {:?}", text, builds_as_serde_json_does(&text));
            for number in &numbers {
                prop_assert!(builds_as_serde_json_does(number).is_ok(), "{}", number);
            }
        }

        #[test]
        fn finds_special_bytes_as_a_plain_search_does(
            text in prop::collection::vec(prop_oneof![Just(b'"'), Just(b'\\'), Just(1u8), 32u8..=255], 0..80)
        ) {
            let plain = text.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            prop_assert_eq!(special(&text), plain.unwrap_or(text.len()));
        }

        /// A string with escapes ends where a walk of its bytes one by one
        /// ends it, or fails where that walk fails: escapes of every kind,
        /// runs of backslashes across a block's edge, control bytes, bad
        /// escapes and `\u`s, and strings left open.
        #[test]
        fn finds_an_escaped_string_end_as_a_walk_does(
            parts in prop::collection::vec(prop_oneof![
                4 => "[a-z ]{0,70}",
                2 => "[\\\\]{1,5}",
                1 => Just("\"".to_owned()),
                1 => "\\\\u[0-9a-fA-F]{4}",
                1 => "\\\\u[0-9a-g\"]{0,5}",
                1 => "\\\\[nrt/bfx\\\\]",
                1 => Just("\u{1}".to_owned()),
            ], 0..30),
        ) {
            let text = format!("\\{}", parts.concat());
            prop_assert_eq!(escaped_string_end_each_way(text.as_bytes()), walked_string_end(text.as_bytes(), 0));
        }

        /// A long plain run (a prompt) through every width of step, and
        /// maybe a special byte after it.
        #[test]
        fn finds_the_special_byte_after_a_long_plain_run(
            run in prop::collection::vec(prop_oneof![32u8..=33, 35u8..=91, 93u8..=255], 0..300),
            end in prop::option::of(prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20]),
            rest in prop::collection::vec(any::<u8>(), 0..70),
        ) {
            let mut text = run.clone();
            text.extend(end);
            text.extend(&rest);
            let plain = text.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            prop_assert_eq!(special(&text), plain.unwrap_or(text.len()));
            if end.is_some() {
                prop_assert_eq!(special(&text), run.len());
            }
        }
    }
}

//! JSON to and from bytes on the hot path.
//!
//! Reading: serde_json reading a byte slice checks that each string it
//! keeps is UTF-8, with a call per string: a small request or a streamed
//! chunk has a dozen strings or more, and those checks were 3–6% of an
//! agent request's instructions. Text known to be UTF-8 is read without
//! them, and one check of the whole text ([`utf8`], simdutf8's) costs less.
//! A Responses or Messages body is read by [`scan`]: a tool's schema and
//! description (most of a coding agent's request) are scanned 16 to 64
//! bytes at a time and kept as text, the rest parsed by serde_json where it
//! stands.
//!
//! Writing: serde_json escapes a string a byte at a time, which was 30% of
//! a coding agent's request (its prompts and histories are mostly text).
//! sonic-rs writes the same bytes, its strings escaped 16 bytes at a time.
//! What we write most (the Response object, each token's event, the chat
//! upstream's request) goes member by member through [`Object`], our
//! constant names as they are, not through the escaper. A long text a
//! client sent (a coding agent's prompts, its history) goes to the model as
//! the client escaped it ([`write_text`]), not escaped again.

pub mod cut;
pub mod escaped;
pub mod scan;
mod seen;

use std::cell::RefCell;
use std::marker::PhantomData;

use serde::de::DeserializeSeed;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::de::{Deserializer, Read};
use serde_json::value::RawValue;
use sonic_rs::format::{CompactFormatter, Formatter};

/// Reads `bytes` as serde_json's `from_slice` does, and accepts exactly
/// what it accepts.
pub fn from_bytes<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    from_bytes_seed(bytes, PhantomData)
}

/// `bytes` as text, if it is UTF-8. A body is checked by simdutf8, 32 bytes
/// a step, rather than by `std::str::from_utf8` (a tenth of a coding agent's
/// request passed on was that check).
pub fn utf8(bytes: &[u8]) -> Option<&str> {
    simdutf8::basic::from_utf8(bytes).ok()
}

/// Whether `bytes` is one JSON value, as [`from_bytes`] accepts it, the
/// fault named as serde_json names it. Checked by the [`scan::Scanner`] (it
/// accepts what serde_json's skipping accepts, 16 to 64 bytes at a time): a
/// fifth fewer instructions than serde_json's skip on a small chat request,
/// and half on a coding agent's.
/// What the scanner refuses is read by serde_json, which names the fault or
/// accepts what only it does (nesting past [`scan::MAX_DEPTH`], a stray
/// byte that is no UTF-8 in a string).
pub fn check(bytes: &[u8]) -> serde_json::Result<()> {
    if let Some(text) = utf8(bytes) {
        let mut scan = scan::Scanner::new(text);
        if scan.value().and_then(|_| scan.end()).is_ok() {
            return Ok(());
        }
    }
    from_bytes::<serde::de::IgnoredAny>(bytes).map(drop)
}

/// [`from_bytes`] by a seed (a reader with state of its own).
pub fn from_bytes_seed<'a, S: DeserializeSeed<'a>>(
    bytes: &'a [u8],
    seed: S,
) -> serde_json::Result<S::Value> {
    match utf8(bytes) {
        Some(text) => whole(&mut Deserializer::from_str(text), seed),
        // Read as before: serde_json checks the strings it keeps and skips
        // the others unchecked, so a stray byte in a field nobody reads (an
        // upstream's token in `logprobs`, say) still passes.
        None => whole(&mut Deserializer::from_slice(bytes), seed),
    }
}

/// One value and nothing after it, as serde_json's `from_*` read.
fn whole<'a, R: Read<'a>, S: DeserializeSeed<'a>>(
    json: &mut Deserializer<R>,
    seed: S,
) -> serde_json::Result<S::Value> {
    let value = seed.deserialize(&mut *json)?;
    json.end()?;
    Ok(value)
}

/// Appends `value` as JSON to `out`: byte for byte what serde_json writes.
/// Raw JSON text in it goes as [`Raw`]: serde_json's `RawValue` is known
/// only to serde_json's writer, and this one would write it as an object.
pub fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Our own types and `Value`s, whose keys are strings: they cannot fail.
    let _ = sonic_rs::to_writer(out, value);
}

/// Appends `text` as a JSON string: as the client sent it, when a request
/// this thread read carried it (`json/seen.rs`), as it was escaped before
/// when a history entry the thread keeps holds it (`json/escaped.rs`), else
/// escaped.
pub fn write_text(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    write_text_inside(out, text);
    out.push(b'"');
}

/// [`write_text`] without the quotes: a part of a string written in parts.
pub fn write_text_inside(out: &mut Vec<u8>, text: &str) {
    if !seen::write_as_sent(text, out) && !escaped::write(text, out) {
        escape_inside(out, text);
    }
}

/// What [`write`](fn@write) writes of a string, its quotes left out.
fn escape_inside(out: &mut Vec<u8>, text: &str) {
    // It cannot fail: a `Vec` takes what it is given.
    let _ = CompactFormatter.write_string_fast(out, text, false);
}

/// The most of its scratch buffer [`to_vec`] keeps on a thread between
/// calls; a larger value's is freed with it.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// [`write`](fn@write) into a new buffer of the JSON's own size, for JSON
/// that is kept (a store's record, freed on the store's thread). It is
/// written into a buffer each thread keeps, then copied once: grown from
/// empty, a Response object was reallocated, and copied, about seven times
/// (sonic-rs reserves room for each string escaped at worst, six bytes a
/// byte), and a buffer started at 4 KiB, freed on another thread, came from
/// the allocator's slow path every time.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    to_vec_with(|buf| write(buf, value))
}

/// [`to_vec`] of what `write_json` writes (an [`Object`]).
pub fn to_vec_with(write_json: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            write_json(&mut buf);
            let out = buf.to_vec();
            if buf.capacity() > SCRATCH_KEPT {
                *buf = Vec::new();
            }
            out
        }
        // Only if a value's `Serialize` called it again.
        Err(_) => {
            let mut out = Vec::new();
            write_json(&mut out);
            out
        }
    })
}

/// What [`to_vec`] writes, as text: written from Rust strings, it is
/// UTF-8, checked once here (a byte that was not would read as U+FFFD).
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> String {
    to_string_with(|buf| write(buf, value))
}

/// [`to_string`] of what `write_json` writes (an [`Object`]).
pub fn to_string_with(write_json: impl FnOnce(&mut Vec<u8>)) -> String {
    String::from_utf8(to_vec_with(write_json))
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// An object written member by member, for wire types whose member names
/// (and some of whose values) are constants of ours: a name goes out as it
/// is, with its quotes and colon, where a serializer escapes it as any
/// string (sonic-rs: about 110 instructions a name, and a Response object
/// has 40). Values that are not constants go through [`write`](fn@write).
pub struct Object<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Object<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Object { out, empty: true }
    }

    /// The comma before every member but the first.
    fn next_member(&mut self) {
        if !std::mem::take(&mut self.empty) {
            self.out.push(b',');
        }
    }

    /// Starts member `name`, and hands back the buffer for its value.
    pub fn name(&mut self, name: &'static str) -> &mut Vec<u8> {
        debug_assert!(is_plain(name), "{name:?} would need escaping");
        self.next_member();
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    pub fn value<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        write(self.name(name), value);
    }

    /// A member whose value is a text a client may have sent ([`write_text`]).
    pub fn text(&mut self, name: &'static str, text: &str) {
        write_text(self.name(name), text);
    }

    /// A member written only when there is a value.
    pub fn optional<T: Serialize + ?Sized>(&mut self, name: &'static str, value: Option<&T>) {
        if let Some(value) = value {
            self.value(name, value);
        }
    }

    /// A string of ours that needs no escaping (a type, a status).
    pub fn plain(&mut self, name: &'static str, text: &'static str) {
        debug_assert!(is_plain(text), "{text:?} would need escaping");
        let out = self.name(name);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    }

    pub fn u64(&mut self, name: &'static str, n: u64) {
        let mut digits = itoa::Buffer::new();
        self.raw(name, digits.format(n));
    }

    pub fn bool(&mut self, name: &'static str, value: bool) {
        self.raw(name, if value { "true" } else { "false" });
    }

    /// A member whose value is JSON text: a constant, or written before.
    pub fn raw(&mut self, name: &'static str, json: &str) {
        self.name(name).extend_from_slice(json.as_bytes());
    }

    /// A member whose name is not ours (a client's field): written as any
    /// string.
    pub fn member<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) {
        self.next_member();
        write(self.out, name);
        self.out.push(b':');
        write(self.out, value);
    }

    /// A member whose value is a list, each item written by `each`.
    pub fn list<I: IntoIterator>(
        &mut self,
        name: &'static str,
        items: I,
        mut each: impl FnMut(&mut Vec<u8>, I::Item),
    ) {
        let out = self.name(name);
        out.push(b'[');
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            each(out, item);
        }
        out.push(b']');
    }

    /// A member whose value is an object of its own.
    pub fn object(&mut self, name: &'static str) -> Object<'_> {
        Object::new(self.name(name))
    }

    pub fn end(self) {
        self.out.push(b'}');
    }
}

/// Text that JSON writes as it is: no quote, backslash or control character.
fn is_plain(text: &str) -> bool {
    text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// Writes an object of `head`'s members followed by those of the object
/// `body` writes, as serde's `flatten` does for a struct flattened into
/// another (an event's type, then its own fields), without the map
/// serializer `flatten` takes: the body's `{` becomes the comma after the
/// head.
pub fn tagged(
    out: &mut Vec<u8>,
    head: impl FnOnce(&mut Object<'_>),
    body: impl FnOnce(&mut Vec<u8>),
) {
    let mut object = Object::new(out);
    head(&mut object);
    let empty = object.empty;
    let at = object.out.len();
    body(object.out);
    let out = object.out;
    debug_assert_eq!(out.get(at), Some(&b'{'), "a flattened body is an object");
    if out.get(at..) == Some(b"{}") {
        out.truncate(at);
        out.push(b'}');
    } else if empty {
        out.remove(at);
    } else {
        out[at] = b',';
    }
}

/// JSON text that [`write`](fn@write) writes as it is (a tool's schema, a call's
/// arguments, a Response object written before): checked once, where it was
/// read (by serde_json or [`scan`]) or written, and not parsed again on the
/// way out.
#[derive(Clone, Copy)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    /// Raw JSON serde_json has checked.
    pub fn checked(raw: &'a RawValue) -> Raw<'a> {
        Raw(raw.get())
    }

    /// Text known to be one JSON value: what [`to_string`] wrote, what a
    /// [`JsonText`](crate::conversation::JsonText) holds.
    pub fn written(json: &'a str) -> Raw<'a> {
        Raw(json)
    }

    /// The JSON text.
    pub fn get(&self) -> &'a str {
        self.0
    }
}

/// sonic-rs writes a struct of this name, and its field of this name, as the
/// field's text. Its own `LazyValue` is written so, but making one parses the
/// text again (as long as escaping it took); `raw_text_is_written_as_it_is`
/// catches a release that renames it.
const SONIC_RAW: &str = "$sonic_rs::LazyValue";

impl Serialize for Raw<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut raw = serializer.serialize_struct(SONIC_RAW, 1)?;
        raw.serialize_field(SONIC_RAW, self.0)?;
        raw.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Kept<'a> {
        #[serde(borrow)]
        text: std::borrow::Cow<'a, str>,
    }

    #[test]
    fn what_from_slice_accepts_is_accepted_and_read_alike() {
        let cases: [&[u8]; 6] = [
            br#"{"text":"plain","n":1}"#,
            br#"{"text":"\u00e9t\u00e9 \"quoted\"","skip":[1,{"a":null}]}"#,
            "{\"text\":\"été 漢字 🙂\"}".as_bytes(),
            // Not UTF-8 in a member nobody reads: serde_json lets it pass.
            b"{\"text\":\"a\",\"skip\":\"\xff\xfe\"}",
            // Not UTF-8 in the member read: refused, as before.
            b"{\"text\":\"\xff\"}",
            br#"{"text": 1}"#,
        ];
        for bytes in cases {
            let ours = from_bytes::<Kept>(bytes).map_err(|e| e.classify());
            let theirs = serde_json::from_slice::<Kept>(bytes).map_err(|e| e.classify());
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(bytes));
        }
        let value: Value = from_bytes(br#"{"a":[true,"x"]}"#).unwrap();
        assert_eq!(value, serde_json::json!({"a": [true, "x"]}));
    }

    #[test]
    fn check_accepts_and_names_faults_as_serde_json_does() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let cases: [&[u8]; 12] = [
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1.5e3}"#,
            b" [1, -0.5, true, false, null, \"\\u00e9\\n\"] ",
            // Past the scanner's depth: serde_json's skip takes it.
            deep.as_bytes(),
            // Not UTF-8 in a string: serde_json's skip lets it pass.
            b"{\"skip\":\"\xff\xfe\"}",
            br#"{"a":01}"#,
            br#"{"a":"\x"}"#,
            b"{\"a\":\"\x01\"}",
            br#"{"a":1} {}"#,
            br#"{"a":[1,]}"#,
            br#"{"a":1"#,
            b"",
            b"  ",
        ];
        for bytes in cases {
            let ours = check(bytes).map_err(|e| e.to_string());
            let theirs = serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
                .map(drop)
                .map_err(|e| e.to_string());
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn what_is_written_is_what_serde_json_writes() {
        // Strings of every kind of character, at every length around the
        // 16-byte blocks; numbers at the edges of their formats.
        let mut strings: Vec<String> = (0u8..0x80).map(|b| char::from(b).to_string()).collect();
        let mixed = "a\"b\\c\n\u{1}\u{1f}\u{7f}é\u{2028}漢🙂 ";
        for len in 0..40 {
            strings.push(mixed.chars().cycle().take(len).collect());
        }
        let numbers = [0.1 + 0.2, 1e-7, 1e21, 5e-324, f64::MAX, -0.0, 0.7, f64::NAN];
        let value = serde_json::json!({
            "strings": strings,
            "numbers": numbers,
            "integers": [u64::MAX, i64::MIN, 0],
            "nested": {"z": null, "a": [true, false, {}]},
        });
        assert_eq!(to_vec(&value), serde_json::to_vec(&value).unwrap());
        assert_eq!(to_vec("x"), b"\"x\"");
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..8)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn any_value_is_written_as_serde_json_writes_it(value in any_json()) {
            proptest::prop_assert_eq!(
                String::from_utf8(to_vec(&value)).unwrap(),
                serde_json::to_string(&value).unwrap()
            );
        }
    }

    #[test]
    fn every_shape_serde_derives_is_written_as_serde_json_writes_it() {
        use std::collections::BTreeMap;

        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct Newtype(u8);
        #[derive(Serialize)]
        struct Pair(i32, &'static str);
        #[derive(Serialize)]
        enum External {
            Unit,
            Newtype(u32),
            Tuple(u8, bool),
            Struct { a: Option<u8>, b: &'static str },
        }
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Internal {
            Text { text: &'static str },
            Empty,
        }
        #[derive(Serialize)]
        #[serde(tag = "t", content = "c")]
        enum Adjacent {
            One(char),
        }
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Untagged {
            Number(f64),
            Text(&'static str),
        }
        struct Bytes(&'static [u8]);
        impl Serialize for Bytes {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        #[derive(Serialize)]
        struct Inner {
            x: u64,
            #[serde(rename = "needs \"escaping\"\n")]
            escaped: i8,
        }
        #[derive(Serialize)]
        struct Outer {
            unit: Unit,
            unit_value: (),
            newtype: Newtype,
            pair: Pair,
            tuple: (u8, (), [i16; 2]),
            externals: [External; 4],
            internals: [Internal; 2],
            adjacent: Adjacent,
            untagged: [Untagged; 2],
            bytes: Bytes,
            #[serde(skip_serializing_if = "Option::is_none")]
            skipped: Option<u8>,
            none: Option<u8>,
            #[serde(flatten)]
            inner: Inner,
            integer_keys: BTreeMap<i64, bool>,
            bool_keys: BTreeMap<bool, u8>,
            char_keys: BTreeMap<char, u8>,
            empty: Vec<u8>,
            empty_map: BTreeMap<String, u8>,
            value: serde_json::Value,
        }
        let outer = Outer {
            unit: Unit,
            unit_value: (),
            newtype: Newtype(7),
            pair: Pair(-3, "p\u{1}"),
            tuple: (1, (), [-1, 2]),
            externals: [
                External::Unit,
                External::Newtype(9),
                External::Tuple(2, true),
                External::Struct { a: None, b: "é" },
            ],
            internals: [Internal::Text { text: "t" }, Internal::Empty],
            adjacent: Adjacent::One('"'),
            untagged: [Untagged::Number(0.5), Untagged::Text("u")],
            bytes: Bytes(b"\x00\xff"),
            skipped: None,
            none: None,
            inner: Inner { x: 1, escaped: -1 },
            integer_keys: BTreeMap::from([(-5, true), (12, false)]),
            bool_keys: BTreeMap::from([(true, 1)]),
            char_keys: BTreeMap::from([('\n', 1)]),
            empty: Vec::new(),
            empty_map: BTreeMap::new(),
            value: serde_json::json!({"k": [1.5, "s", null, {"": {}}]}),
        };
        let ours = String::from_utf8(to_vec(&outer)).unwrap();
        assert_eq!(ours, serde_json::to_string(&outer).unwrap());

        // A key that is not a string, a number, a boolean or a character:
        // refused by both.
        let tuple_keys = BTreeMap::from([((1, 2), 3)]);
        assert!(serde_json::to_vec(&tuple_keys).is_err());
        assert!(sonic_rs::to_vec(&tuple_keys).is_err());
    }

    #[test]
    fn a_text_a_request_carried_goes_out_as_its_client_escaped_it() {
        crate::on_a_new_thread(|| {
            // Escapes serde_json would not write: `\/`, `\u00e9`.
            let raw = "a \\/ path, caf\\u00e9,\\n\\\"quoted\\\"\\n".repeat(60);
            let body = format!(r#"{{"system":"{raw}"}}"#);
            let read = scan::Scanner::new(&body).parse_value().unwrap();
            let text = read["system"].as_str().unwrap();
            let mut out = Vec::new();
            write_text(&mut out, text);
            assert_eq!(out, format!("\"{raw}\"").into_bytes());
            let mut inside = b"x".to_vec();
            write_text_inside(&mut inside, text);
            assert_eq!(inside, format!("x{raw}").into_bytes());
            // A text no request carried: escaped as serde_json does.
            let other = format!("{text}.");
            let escaped = serde_json::to_string(&other).unwrap();
            let mut out = b"x".to_vec();
            write_text(&mut out, &other);
            assert_eq!(String::from_utf8(out).unwrap(), format!("x{escaped}"));
            let mut out = b"x".to_vec();
            write_text_inside(&mut out, &other);
            let inside = &escaped[1..escaped.len() - 1];
            assert_eq!(String::from_utf8(out).unwrap(), format!("x{inside}"));
        });
    }

    #[test]
    fn raw_text_is_written_as_it_is() {
        #[derive(Serialize)]
        struct Tool<'a> {
            name: &'a str,
            parameters: Raw<'a>,
        }
        let schema = r#"{"type": "object",  "properties": {"q": {"type":"string"}}}"#;
        let checked = RawValue::from_string(schema.to_owned()).unwrap();
        let tool = Tool {
            name: "search",
            parameters: Raw::checked(&checked),
        };
        let written = to_string(&tool);
        assert_eq!(
            written,
            format!(r#"{{"name":"search","parameters":{schema}}}"#)
        );
        let again = Tool {
            name: "again",
            parameters: Raw::written(&written),
        };
        let nested = format!(r#"{{"name":"again","parameters":{written}}}"#);
        assert_eq!(String::from_utf8(to_vec(&again)).unwrap(), nested);
    }

    #[test]
    fn an_object_by_hand_is_what_serde_json_writes_for_the_struct() {
        #[derive(Serialize)]
        struct Wire<'a> {
            id: &'a str,
            kind: &'static str,
            n: u64,
            flag: bool,
            none: Option<&'a str>,
            nested: Nested,
            list: Vec<u8>,
            items: [Nested; 2],
            #[serde(rename = "a client's \"key\"")]
            client: u8,
        }
        #[derive(Serialize)]
        struct Nested {
            reason: &'static str,
        }
        let id = "a\"b\n\u{1}é";
        let mut ours = Vec::new();
        let mut o = Object::new(&mut ours);
        o.value("id", id);
        o.plain("kind", "response.output_text.delta");
        o.u64("n", u64::MAX);
        o.bool("flag", true);
        o.value("none", &None::<&str>);
        let mut nested = o.object("nested");
        nested.plain("reason", "max_output_tokens");
        nested.end();
        o.raw("list", "[]");
        o.list("items", ["a", "b\n"], |out, reason| {
            let mut item = Object::new(out);
            item.value("reason", reason);
            item.end();
        });
        o.member("a client's \"key\"", &7);
        o.end();
        let wire = Wire {
            id,
            kind: "response.output_text.delta",
            n: u64::MAX,
            flag: true,
            none: None,
            nested: Nested {
                reason: "max_output_tokens",
            },
            list: Vec::new(),
            items: [Nested { reason: "a" }, Nested { reason: "b\n" }],
            client: 7,
        };
        assert_eq!(ours, serde_json::to_vec(&wire).unwrap());
        let mut empty = Vec::new();
        Object::new(&mut empty).end();
        assert_eq!(empty, b"{}");
    }

    #[test]
    fn a_tagged_object_is_what_serde_s_flatten_writes() {
        #[derive(Serialize)]
        struct Event<T> {
            #[serde(rename = "type")]
            kind: &'static str,
            sequence_number: u64,
            #[serde(flatten)]
            body: T,
        }
        #[derive(Serialize)]
        struct Delta<'a> {
            item_id: &'a str,
            delta: &'a str,
        }
        #[derive(Serialize)]
        struct NoFields {}
        fn tagged_by_hand<T: Serialize>(body: &T) -> Vec<u8> {
            let mut out = Vec::new();
            tagged(
                &mut out,
                |head| {
                    head.plain("type", "response.output_text.delta");
                    head.u64("sequence_number", 7);
                },
                |out| write(out, body),
            );
            out
        }
        let delta = Delta {
            item_id: "msg_1",
            delta: "{\"}",
        };
        for (ours, theirs) in [
            (
                tagged_by_hand(&delta),
                serde_json::to_vec(&Event {
                    kind: "response.output_text.delta",
                    sequence_number: 7,
                    body: &delta,
                }),
            ),
            (
                tagged_by_hand(&NoFields {}),
                serde_json::to_vec(&Event {
                    kind: "response.output_text.delta",
                    sequence_number: 7,
                    body: NoFields {},
                }),
            ),
        ] {
            assert_eq!(String::from_utf8(ours), String::from_utf8(theirs.unwrap()));
        }
        // No members of our own: the body's alone.
        let mut out = Vec::new();
        tagged(&mut out, |_| {}, |out| write(out, &delta));
        assert_eq!(out, serde_json::to_vec(&delta).unwrap());
    }
}

//! Reading JSON from bytes.
//!
//! serde_json reading a byte slice checks that each string it keeps is
//! UTF-8, with a call per string: a small request or a streamed chunk has
//! a dozen strings or more, and those checks were 3–6% of an agent
//! request's instructions. Text known to be UTF-8 is read without them, and
//! one check of the whole text, with std's word-at-a-time ASCII path,
//! costs less.

use std::marker::PhantomData;

use serde::de::DeserializeSeed;
use serde::Deserialize;
use serde_json::de::{Deserializer, Read};

/// Reads `bytes` as serde_json's `from_slice` does, and accepts exactly
/// what it accepts.
pub fn from_bytes<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    from_bytes_seed(bytes, PhantomData)
}

/// [`from_bytes`] by a seed (a reader with state of its own).
pub fn from_bytes_seed<'a, S: DeserializeSeed<'a>>(
    bytes: &'a [u8],
    seed: S,
) -> serde_json::Result<S::Value> {
    match std::str::from_utf8(bytes) {
        Ok(text) => whole(&mut Deserializer::from_str(text), seed),
        // Read as before: serde_json checks the strings it keeps and skips
        // the others unchecked, so a stray byte in a field nobody reads (an
        // upstream's token in `logprobs`, say) still passes.
        Err(_) => whole(&mut Deserializer::from_slice(bytes), seed),
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
}

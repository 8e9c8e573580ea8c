//! A body's values as the scanner builds them (`Scanner::parse_value`, what
//! the front decoders read every member with) against serde_json's reading
//! of the same text: the same value, written the same (each float's bits,
//! the members' order), ending at the same byte; where serde_json refuses
//! the text, so does the scanner. And the check a body passed on gets
//! (`Shape::checked`: the root's member names read, every value skipped)
//! takes what serde_json takes reading the same.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::front::budget::Shape;
use agent_proxy::json::scan::Scanner;
use serde_json::Value;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The check reads the root's member names (to find `model`) as
    // serde_json reads a name, which refuses a lone surrogate, and skips
    // every value as serde_json skips one (a raw value), which does not.
    type Raw = Box<serde_json::value::RawValue>;
    let skipped = match text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        true => serde_json::from_str::<std::collections::BTreeMap<String, Raw>>(text).is_ok(),
        false => serde_json::from_str::<Raw>(text).is_ok(),
    };
    assert_eq!(Shape::checked(data).is_some(), skipped, "checked");
    let mut scan = Scanner::new(text);
    let ours = scan.parse_value();
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match (ours, values.next()) {
        (Ok(ours), Some(Ok(theirs))) => {
            // The text tells floats' bits (shortest round trip) and
            // members' order apart, and `-0.0` from `0`.
            assert_eq!(ours.to_string(), theirs.to_string());
            assert_eq!(scan.offset(), values.byte_offset());
        }
        (Ok(ours), theirs) => panic!("built {ours:?} where serde_json read {theirs:?}"),
        (Err(_), Some(Ok(theirs))) => panic!("refused what serde_json read as {theirs:?}"),
        (Err(_), _) => {}
    }
}

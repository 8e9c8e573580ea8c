//! A body's values as the scanner builds them (`Scanner::parse_value`, what
//! the front decoders read every member with) against serde_json's reading
//! of the same text: the same value, to each float's bits and the members'
//! order, ending at the same byte; where serde_json refuses the text, so
//! does the scanner.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::json::scan::Scanner;
use serde_json::Value;

/// A value's text with each float's bits: `-0.0` is not `0`.
fn exact(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => format!("f{:x}", n.as_f64().unwrap_or(0.0).to_bits()),
        Value::Array(items) => {
            let items: Vec<_> = items.iter().map(exact).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(members) => {
            let members: Vec<_> = members
                .iter()
                .map(|(k, v)| format!("{k:?}:{}", exact(v)))
                .collect();
            format!("{{{}}}", members.join(","))
        }
        other => other.to_string(),
    }
}

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut scan = Scanner::new(text);
    let ours = scan.parse_value();
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match (ours, values.next()) {
        (Ok(ours), Some(Ok(theirs))) => {
            assert_eq!(exact(&ours), exact(&theirs));
            assert_eq!(scan.offset(), values.byte_offset());
        }
        (Ok(ours), theirs) => panic!("built {ours:?} where serde_json read {theirs:?}"),
        (Err(_), Some(Ok(theirs))) => panic!("refused what serde_json read as {theirs:?}"),
        (Err(_), _) => {}
    }
}

//! What parsing a request body may cost. Decoding into JSON values costs
//! about 32 bytes per value however short its text: `[0,0,0,…]` costs 16
//! times its size. A body is counted before it is parsed (one pass, no
//! allocation) and refused when it holds more values than the limit, so
//! memory per request stays a small constant times its bytes.

/// An upper bound of the number of JSON values in `body`: one for the root
/// and one per `[`, `{`, `,` and `:` outside strings (every value but the
/// root follows one of them). Not a validator: text that is not JSON gets
/// some count and fails to parse later.
///
/// Most of a request's bytes are string text (prompts, tool schemas' prose):
/// a string is skipped to its next quote or backslash by SIMD search, not
/// byte by byte (a coding agent's 50 KB request: 50 µs byte by byte).
pub fn json_values(body: &[u8]) -> usize {
    let mut count = 1;
    let mut at = 0;
    while let Some(&byte) = body.get(at) {
        at += 1;
        match byte {
            b'"' => loop {
                match memchr::memchr2(b'"', b'\\', body.get(at..).unwrap_or_default()) {
                    None => return count,
                    // An escape: the next byte is text, whatever it is.
                    Some(i) if body[at + i] == b'\\' => at += i + 2,
                    Some(i) => {
                        at += i + 1;
                        break;
                    }
                }
            },
            b'[' | b'{' | b',' | b':' => count += 1,
            _ => {}
        }
    }
    count
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

    /// The count byte by byte, as [`json_values`] defines it.
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
            prop_assert_eq!(json_values(&body), reference(&body));
        }

        #[test]
        fn the_count_bounds_the_values_of_any_document(value in json(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let count = json_values(text.as_bytes());
            let exact = values(&value);
            // Never less than the values; at most three times (an object
            // member counts its `,`, its `:` and, a container, its bracket).
            prop_assert!(count >= exact && count <= 3 * exact + 1, "{count} for {exact}: {text}");
        }
    }

    #[test]
    fn an_amplifying_body_counts_every_value() {
        let body = format!(r#"{{"model":"m","x":[{}0]}}"#, "0,".repeat(100_000));
        // The root, `{`, two `:`, one `,` between members, `[` and its commas.
        assert_eq!(json_values(body.as_bytes()), 100_006);
        assert_eq!(json_values(br#"{"s":"a,b:[{\"c\":1}]"}"#), 3);
    }
}

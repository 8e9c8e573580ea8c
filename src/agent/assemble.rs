//! Assembling streamed tool calls. Deltas are keyed on `index`: llama.cpp and
//! others send `id` and `name` only in a call's first delta, and parallel
//! calls interleave by index. A new `id` at an index already in use starts
//! another call: some servers number every parallel call 0.

use crate::openai::{FunctionCall, ToolCall, ToolCallDelta};

#[derive(Default)]
pub struct Assembler {
    calls: Vec<Partial>,
}

struct Partial {
    index: u32,
    id: String,
    name: String,
    arguments: String,
}

impl Assembler {
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    pub fn push(&mut self, delta: &ToolCallDelta<'_>) {
        let id = delta.id.as_deref().filter(|id| !id.is_empty());
        let index = delta.index.unwrap_or_else(|| self.guess_index(id));
        // The latest call at this index, unless the delta names another one.
        let same = self
            .calls
            .iter()
            .rposition(|c| c.index == index)
            .filter(|&at| {
                id.is_none_or(|id| self.calls[at].id.is_empty() || self.calls[at].id == id)
            });
        let position = match same {
            Some(position) => position,
            None => {
                self.calls.push(Partial {
                    index,
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[position];
        if let (Some(id), true) = (id, call.id.is_empty()) {
            call.id = id.to_owned();
        }
        if let Some(function) = &delta.function {
            match function.name.as_deref() {
                // Some servers repeat the whole name in every delta; others
                // send it in pieces.
                Some(name) if call.name.is_empty() => call.name = name.to_owned(),
                Some(name) if name != call.name => call.name.push_str(name),
                _ => {}
            }
            if let Some(arguments) = &function.arguments {
                call.arguments.push_str(arguments);
            }
        }
    }

    /// Servers that omit `index` send one call after another: a new `id`
    /// starts the next call.
    fn guess_index(&self, id: Option<&str>) -> u32 {
        match self.calls.last() {
            None => 0,
            Some(last) if id.is_some_and(|id| !last.id.is_empty() && id != last.id) => {
                last.index + 1
            }
            Some(last) => last.index,
        }
    }

    /// The complete calls in index order (calls sharing an index in the
    /// order they came). A call without an id gets one.
    pub fn finish(mut self) -> Vec<ToolCall> {
        self.calls.sort_by_key(|c| c.index);
        self.calls
            .into_iter()
            .map(|c| ToolCall {
                // Empty if the stream named none: the round's end names it.
                id: c.id,
                kind: "function".into(),
                function: FunctionCall {
                    name: c.name,
                    arguments: c.arguments,
                },
            })
            .collect()
    }
}

pub fn new_call_id() -> String {
    crate::front::random_id::<24>("call_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::ChunkIn;

    fn assemble(events: &[&str]) -> Vec<ToolCall> {
        let mut asm = Assembler::default();
        for e in events {
            let chunk: ChunkIn = serde_json::from_str(e).unwrap();
            for delta in chunk.choices[0]
                .delta
                .as_ref()
                .unwrap()
                .tool_calls
                .as_ref()
                .unwrap()
            {
                asm.push(delta);
            }
        }
        asm.finish()
    }

    #[test]
    fn interleaved_parallel_calls_by_index() {
        let calls = assemble(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"}"}}]}}]}"#,
        ]);
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), calls[0].function.name.as_str()),
            ("a", "f")
        );
        assert_eq!(calls[0].function.arguments, r#"{"x":1}"#);
        assert_eq!(calls[1].function.arguments, "{}");
    }

    #[test]
    fn parallel_calls_sharing_an_index_stay_apart_by_id() {
        let calls = assemble(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"name":"g","arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"arguments":"}"}}]}}]}"#,
        ]);
        let got: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|c| {
                (
                    c.id.as_str(),
                    c.function.name.as_str(),
                    c.function.arguments.as_str(),
                )
            })
            .collect();
        assert_eq!(got, [("call_a", "f", r#"{"x":1}"#), ("call_b", "g", "{}")]);
    }

    #[test]
    fn real_llama_cpp_tool_stream() {
        let bytes = include_bytes!("../../tests/fixtures/llama.cpp/toolcall-stream.sse");
        let mut parser = crate::sse::Parser::new(1 << 20);
        parser.feed(bytes);
        let mut asm = Assembler::default();
        while let Some(event) = parser.next_event().unwrap() {
            if event.is_done() {
                break;
            }
            let chunk: ChunkIn = serde_json::from_slice(&event.data).unwrap();
            for choice in &chunk.choices {
                for d in choice
                    .delta
                    .iter()
                    .flat_map(|d| d.tool_calls.iter().flatten())
                {
                    asm.push(d);
                }
            }
        }
        let calls = asm.finish();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].id.len(), 32);
        let args: serde_json::Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
        assert!(args.is_object());
    }

    #[test]
    fn missing_index_and_id_still_assemble() {
        let calls = assemble(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"}"}}]}}]}"#,
        ]);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].function.arguments, "{}");
        let calls = assemble(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#,
        ]);
        assert_eq!(calls[0].id, "");
    }
}

//! Upstream chunks as the tool loop reads them: chunk JSON, tool-call deltas
//! and `<think>` splitting. Never panics; assembled calls keep every
//! argument byte in order.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::agent::assemble::Assembler;
use agent_proxy::agent::reasoning::ThinkSplitter;
use agent_proxy::openai::ChunkIn;
use agent_proxy::sse::Parser;

pub fn check(data: &[u8]) {
    let mut parser = Parser::new(1 << 16);
    parser.feed(data);
    let mut assembler = Assembler::default();
    let mut splitter = ThinkSplitter::default();
    let mut sent_arguments = 0usize;
    while let Ok(Some(event)) = parser.next_event() {
        let Ok(chunk) = serde_json::from_slice::<ChunkIn>(&event.data) else {
            continue;
        };
        for choice in &chunk.choices {
            if let Some(delta) = &choice.delta {
                if let Some(content) = &delta.content {
                    let pieces = splitter.split(content);
                    let text: usize = pieces.iter().map(|(_, t)| t.len()).sum();
                    assert!(text <= content.len() + 16);
                }
                for call in delta.tool_calls.iter().flatten() {
                    sent_arguments += call
                        .function
                        .as_ref()
                        .and_then(|f| f.arguments.as_ref())
                        .map_or(0, |a| a.len());
                    assembler.push(call);
                }
            }
        }
    }
    splitter.flush();
    let calls = assembler.finish();
    let assembled: usize = calls.iter().map(|c| c.function.arguments.len()).sum();
    assert_eq!(
        assembled, sent_arguments,
        "argument bytes were lost or invented"
    );
}

//! An upstream's answer as the tool loop reads it, for each upstream
//! dialect (chat completions, Responses): bytes through the SSE parser and
//! the round decoder, and the same bytes as a whole body. Never panics; any
//! split of the input into reads decodes to the same round; a round that
//! ends has each call once.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::conversation::{Reasoning, RoundEnd};
use agent_proxy::round::{chat, responses};
use agent_proxy::round::{DecodeError, RoundDecoder};
use agent_proxy::sse::Parser;

/// What the loop would see: text, reasoning, reasoning items as they
/// completed, and how the round ended (or the first error).
type Round = (
    String,
    String,
    Vec<Reasoning>,
    Result<RoundEnd, DecodeError>,
);

/// `None` when an event exceeds the parser's limit (where that shows
/// depends on the reads).
fn decode<D: RoundDecoder + Default>(reads: &[&[u8]]) -> Option<Round> {
    let mut parser = Parser::new(1 << 16);
    let mut decoder = D::default();
    let (mut content, mut reasoning, mut items) = (String::new(), String::new(), Vec::new());
    let mut events = Vec::new();
    for read in reads {
        parser.feed(read);
        while let Some(event) = parser.next_event().ok()? {
            events.push(event);
        }
    }
    events.extend(parser.finish());
    for event in &events {
        match decoder.event(event) {
            Ok(step) => {
                content.extend(step.delta.content);
                reasoning.extend(step.delta.reasoning);
                items.extend(step.reasoning_item);
            }
            Err(e) => return Some((content, reasoning, items, Err(e))),
        }
    }
    Some((content, reasoning, items, decoder.end()))
}

fn check_end(end: &Result<RoundEnd, DecodeError>) {
    if let Ok(end) = end {
        assert!(end.finish.is_some(), "a round ended without a finish");
        for (i, call) in end.calls.iter().enumerate() {
            assert!(
                end.calls[..i].iter().all(|c| c.id != call.id),
                "a call came twice"
            );
        }
    }
}

/// A call id the input does not contain was made up by the decoder (at
/// random, so unique): equal rounds may differ there.
fn generated_ids_blanked(mut round: Round, data: &[u8]) -> Round {
    if let Ok(end) = &mut round.3 {
        for call in &mut end.calls {
            let id = call.id.as_bytes();
            if !data.windows(id.len().max(1)).any(|w| w == id) {
                call.id.clear();
            }
        }
    }
    round
}

fn run<D: RoundDecoder + Default>(data: &[u8]) {
    let whole = decode::<D>(&[data]);
    if let Some(round) = &whole {
        check_end(&round.3);
    }
    // The first byte chooses where to split the rest.
    if let Some((&seed, rest)) = data.split_first() {
        let cut = usize::from(seed) % (rest.len() + 1);
        let split = decode::<D>(&[&data[..1], &rest[..cut], &rest[cut..]]);
        if let (Some(split), Some(whole)) = (split, whole) {
            assert_eq!(
                generated_ids_blanked(split, data),
                generated_ids_blanked(whole, data),
                "a split changed the round"
            );
        }
    }
    let mut decoder = D::default();
    if decoder.body(data).is_ok() {
        let end = decoder.end();
        assert!(end.is_ok(), "a whole answer is a complete round");
        check_end(&end);
    }
}

pub fn check(data: &[u8]) {
    run::<chat::Decoder>(data);
    run::<responses::Decoder>(data);
}

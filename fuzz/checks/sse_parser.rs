//! The SSE parser on untrusted upstream bytes: never panics, never holds
//! more than its limit, and any split of the input into reads gives the
//! same events as one read, down to one byte per read (which makes the
//! parser resume its search for a line end on every read).
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::sse::{Event, Parser};

const LIMIT: usize = 4096;

fn parse(reads: &[&[u8]]) -> Result<Vec<Event>, ()> {
    let mut parser = Parser::new(LIMIT);
    let mut events = Vec::new();
    for read in reads {
        parser.feed(read);
        while let Some(event) = parser.next_event().map_err(|_| ())? {
            assert!(event.data.len() <= LIMIT);
            events.push(event);
        }
    }
    events.extend(parser.finish());
    Ok(events)
}

pub fn check(data: &[u8]) {
    let whole = parse(&[data]);
    // The first byte chooses where to split the rest.
    if let Some((&seed, rest)) = data.split_first() {
        let cut = usize::from(seed) % (rest.len() + 1);
        let split = parse(&[&data[..1], &rest[..cut], &rest[cut..]]);
        if let (Ok(split), Ok(whole)) = (&split, &whole) {
            assert_eq!(split, whole, "a split changed the events");
        }
    }
    let bytewise: Vec<&[u8]> = data.chunks(1).collect();
    if let (Ok(bytewise), Ok(whole)) = (&parse(&bytewise), &whole) {
        assert_eq!(bytewise, whole, "byte-by-byte reads changed the events");
    }
}

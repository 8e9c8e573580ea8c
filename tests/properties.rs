//! Property tests for the parsers that see untrusted bytes.

use agent_proxy::agent::assemble::Assembler;
use agent_proxy::conversation::{Reasoning, RoundEnd};
use agent_proxy::openai::{FunctionDelta, ToolCallDelta};
use agent_proxy::round::RoundDecoder;
use agent_proxy::round::{chat, responses};
use agent_proxy::sse::Parser;
use proptest::prelude::*;

/// Events as (data lines), serialized with `ending`, with comments between.
fn serialize(events: &[Vec<String>], ending: &str) -> Vec<u8> {
    let mut out = String::new();
    for (i, lines) in events.iter().enumerate() {
        if i % 3 == 1 {
            out.push_str(&format!(": comment {i}{ending}"));
        }
        for line in lines {
            out.push_str(&format!("data: {line}{ending}"));
        }
        out.push_str(ending);
    }
    out.into_bytes()
}

fn parse(reads: &[&[u8]]) -> Vec<String> {
    let mut parser = Parser::new(1 << 20);
    let mut events = Vec::new();
    for read in reads {
        parser.feed(read);
        while let Some(event) = parser.next_event().expect("within the limit") {
            events.push(String::from_utf8(event.data.to_vec()).unwrap());
        }
    }
    events.extend(
        parser
            .finish()
            .map(|e| String::from_utf8(e.data.to_vec()).unwrap()),
    );
    events
}

/// `bytes` cut at `cuts` (indexes into `bytes.len() + 1`), as reads.
fn reads<'a>(bytes: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
    points.sort();
    let mut reads = Vec::new();
    let mut from = 0;
    for point in points {
        reads.push(&bytes[from..point]);
        from = point;
    }
    reads.push(&bytes[from..]);
    reads
}

/// An upstream stream read in `reads`, through the SSE parser and the round
/// decoder `D`: the content, the reasoning, the reasoning items handed on,
/// and the round's end.
fn decode_round<D: RoundDecoder + Default>(
    reads: &[&[u8]],
) -> (String, String, Vec<Reasoning>, RoundEnd) {
    let mut parser = Parser::new(1 << 20);
    let mut decoder = D::default();
    let (mut content, mut reasoning, mut items) = (String::new(), String::new(), Vec::new());
    let mut take = |event: agent_proxy::sse::Event| {
        let step = decoder.event(&event).expect("a valid event");
        content.extend(step.delta.content);
        reasoning.extend(step.delta.reasoning);
        items.extend(step.reasoning_item);
    };
    for read in reads {
        parser.feed(read);
        while let Some(event) = parser.next_event().expect("within the limit") {
            take(event);
        }
    }
    if let Some(event) = parser.finish() {
        take(event);
    }
    let end = decoder.end().expect("a complete stream");
    (content, reasoning, items, end)
}

const CHAT_STREAMS: [&[u8]; 3] = [
    include_bytes!("fixtures/llama.cpp/reasoning-stream.sse"),
    include_bytes!("fixtures/llama.cpp/toolcall-stream.sse"),
    include_bytes!("fixtures/llama.cpp/usage-stream.sse"),
];

const RESPONSES_STREAMS: [&[u8]; 2] = [
    include_bytes!("fixtures/openai/responses-tool-stream.sse"),
    include_bytes!("fixtures/openai/responses-text-stream.sse"),
];

proptest! {
    #[test]
    fn any_split_of_an_sse_stream_parses_to_the_same_events(
        events in prop::collection::vec(prop::collection::vec("[^\r\n]{0,40}", 1..4), 1..12),
        ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let bytes = serialize(&events, ending);
        let reads = reads(&bytes, &cuts);
        let expected: Vec<String> = events.iter().map(|lines| lines.join("\n")).collect();
        prop_assert_eq!(parse(&reads), expected);
    }

    #[test]
    fn tool_calls_assembled_from_interleaved_fragments_equal_the_whole_calls(
        calls in prop::collection::vec(("[a-z_]{1,12}", "[a-zA-Z0-9_]{4,16}", ".{0,60}"), 1..4),
        fragment in 1usize..7,
        order_seed in any::<u64>(),
    ) {
        // Each call: a first delta (index, id, name), then its arguments in
        // pieces; the pieces of different calls interleave.
        let mut deltas: Vec<(usize, ToolCallDelta)> = Vec::new();
        let mut queues: Vec<Vec<ToolCallDelta>> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, id, args))| {
                let chars: Vec<char> = args.chars().collect();
                let mut queue = vec![ToolCallDelta {
                    index: Some(i as u32),
                    id: Some(id.clone().into()),
                    function: Some(FunctionDelta { name: Some(name.clone().into()), arguments: None }),
                }];
                for piece in chars.chunks(fragment) {
                    queue.push(ToolCallDelta {
                        index: Some(i as u32),
                        id: None,
                        function: Some(FunctionDelta { name: None, arguments: Some(piece.iter().collect::<String>().into()) }),
                    });
                }
                queue.reverse();
                queue
            })
            .collect();
        let mut seed = order_seed;
        while queues.iter().any(|q| !q.is_empty()) {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let live: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
            let pick = live[(seed >> 33) as usize % live.len()];
            deltas.push((pick, queues[pick].pop().unwrap()));
        }
        let mut assembler = Assembler::default();
        for (_, delta) in &deltas {
            assembler.push(delta);
        }
        let assembled = assembler.finish();
        prop_assert_eq!(assembled.len(), calls.len());
        for (call, (name, id, args)) in assembled.iter().zip(&calls) {
            prop_assert_eq!(&call.id, id);
            prop_assert_eq!(&call.function.name, name);
            prop_assert_eq!(&call.function.arguments, args);
        }
    }

    #[test]
    fn any_split_of_a_responses_stream_decodes_to_the_same_round(
        stream in prop::sample::select(RESPONSES_STREAMS.to_vec()),
        ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let whole = decode_round::<responses::Decoder>(&[stream]);
        prop_assert!(!whole.1.is_empty() && !whole.2.is_empty() && whole.3.finish.is_some());
        // Event data is one JSON line: only the SSE framing has line ends.
        let text = std::str::from_utf8(stream).unwrap().replace('\n', ending);
        prop_assert_eq!(decode_round::<responses::Decoder>(&reads(text.as_bytes(), &cuts)), whole);
    }
}

proptest! {
    // Few cases: each one parses about a megabyte, a byte at a time at worst.
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn a_megabyte_event_read_in_small_pieces_parses_whole(
        len in (768usize << 10)..(1 << 20) - 16,
        piece in prop::sample::select(vec![1usize, 7, 512, 4096]),
        ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
    ) {
        // One big tool-call argument as a single `data:` line, then a short event.
        let long: String = "{\"a\":\"xyz\"}".chars().cycle().take(len).collect();
        let bytes = serialize(&[vec![long.clone()], vec!["tail".into()]], ending);
        let reads: Vec<&[u8]> = bytes.chunks(piece).collect();
        prop_assert_eq!(parse(&reads), vec![long, "tail".to_owned()]);
    }
}

proptest! {
    #[test]
    fn any_split_of_a_llama_cpp_stream_decodes_to_the_same_round(
        stream in prop::sample::select(CHAT_STREAMS.to_vec()),
        ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let whole = decode_round::<chat::Decoder>(&[stream]);
        prop_assert!(whole.3.finish.is_some());
        prop_assert!(!whole.0.is_empty() || !whole.1.is_empty() || !whole.3.calls.is_empty());
        let text = std::str::from_utf8(stream).unwrap().replace("\r\n", "\n").replace('\n', ending);
        prop_assert_eq!(decode_round::<chat::Decoder>(&reads(text.as_bytes(), &cuts)), whole);
    }
}

#[test]
fn a_responses_stream_read_byte_by_byte_decodes_to_the_same_round() {
    for stream in RESPONSES_STREAMS {
        let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(
            decode_round::<responses::Decoder>(&bytewise),
            decode_round::<responses::Decoder>(&[stream])
        );
    }
}

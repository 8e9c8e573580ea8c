//! Server-sent events: an incremental parser for what upstreams send and the
//! few byte strings the proxy writes.
//!
//! The parser follows the WHATWG event-stream rules that real servers rely
//! on: `\n`, `\r\n` and `\r` line ends (also split across reads), `:` comment
//! lines, multi-line `data:` joined with `\n`, and `event:` names.

use bytes::{Buf, Bytes, BytesMut};

pub const DONE: &[u8] = b"data: [DONE]\n\n";
pub const HEARTBEAT: &[u8] = b": keep-alive\n\n";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, when the server named the event.
    pub name: Option<String>,
    pub data: Bytes,
}

impl Event {
    pub fn is_done(&self) -> bool {
        self.data.as_ref() == b"[DONE]"
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTooLarge(pub usize);

impl std::fmt::Display for EventTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an SSE event exceeded {} bytes", self.0)
    }
}

pub struct Parser {
    pending: BytesMut,
    /// How much of `pending` is known to hold no line end: a long line read
    /// in many pieces is scanned once, not once per piece.
    scanned: usize,
    /// Bytes looked at for a line end, to show that each is looked at once.
    #[cfg(test)]
    examined: usize,
    /// The event's first `data:` value, a slice of the line it came in:
    /// most events have one line, handed on without a copy.
    data: Option<Bytes>,
    /// Its `data:` values joined, once a second one comes.
    joined: BytesMut,
    name: Option<String>,
    /// The last read ended in `\r`: a `\n` opening the next read belongs to it.
    skip_lf: bool,
    max_event_bytes: usize,
}

impl Parser {
    pub fn new(max_event_bytes: usize) -> Self {
        Parser {
            pending: BytesMut::new(),
            scanned: 0,
            #[cfg(test)]
            examined: 0,
            data: None,
            joined: BytesMut::new(),
            name: None,
            skip_lf: false,
            max_event_bytes,
        }
    }

    /// Adds bytes as read from the network.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next complete event in what was fed so far.
    pub fn next_event(&mut self) -> Result<Option<Event>, EventTooLarge> {
        loop {
            if self.skip_lf && !self.pending.is_empty() {
                if self.pending[0] == b'\n' {
                    self.pending.advance(1);
                }
                self.skip_lf = false;
            }
            let unscanned = &self.pending[self.scanned..];
            let found = memchr::memchr2(b'\n', b'\r', unscanned);
            #[cfg(test)]
            {
                self.examined += found.map_or(unscanned.len(), |at| at + 1);
            }
            let Some(at) = found else {
                if self.pending.is_empty() {
                    // All read is consumed: the memory goes back (once the
                    // events' data is dropped) while the next read waits.
                    self.pending = BytesMut::new();
                }
                self.scanned = self.pending.len();
                if self.pending.len() + self.data_len() > self.max_event_bytes {
                    return Err(EventTooLarge(self.max_event_bytes));
                }
                return Ok(None);
            };
            let line = self.pending.split_to(self.scanned + at);
            self.scanned = 0;
            let terminator = self.pending[0];
            self.pending.advance(1);
            if terminator == b'\r' {
                self.skip_lf = true;
            }
            if let Some(event) = self.take_line(line)? {
                return Ok(Some(event));
            }
        }
    }

    /// Ends the stream: an event left without its closing blank line is
    /// still delivered (some servers omit it before closing).
    pub fn finish(&mut self) -> Option<Event> {
        if !self.pending.is_empty() {
            let line = self.pending.split();
            self.scanned = 0;
            // A partial last line is a field line; it cannot exceed the limit
            // check already applied in `next_event`.
            let _ = self.take_line(line);
        }
        self.dispatch()
    }

    fn take_line(&mut self, line: BytesMut) -> Result<Option<Event>, EventTooLarge> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (field, value) = match memchr::memchr(b':', &line) {
            Some(colon) => {
                let space = line.get(colon + 1) == Some(&b' ');
                (colon, colon + 1 + usize::from(space))
            }
            None => (line.len(), line.len()),
        };
        match &line[..field] {
            b"data" => {
                let len = line.len() - value;
                if self.data_len() + len + 1 > self.max_event_bytes {
                    return Err(EventTooLarge(self.max_event_bytes));
                }
                match &self.data {
                    None => self.data = Some(line.freeze().slice(value..)),
                    Some(first) => {
                        if self.joined.is_empty() {
                            self.joined.extend_from_slice(first);
                        }
                        self.joined.extend_from_slice(b"\n");
                        self.joined.extend_from_slice(&line[value..]);
                    }
                }
            }
            b"event" => self.name = Some(String::from_utf8_lossy(&line[value..]).into_owned()),
            _ => {}
        }
        Ok(None)
    }

    /// The bytes of the event's data so far.
    fn data_len(&self) -> usize {
        match self.joined.is_empty() {
            true => self.data.as_ref().map_or(0, Bytes::len),
            false => self.joined.len(),
        }
    }

    fn dispatch(&mut self) -> Option<Event> {
        let name = self.name.take();
        let first = self.data.take()?;
        let data = match self.joined.is_empty() {
            true => first,
            false => self.joined.split().freeze(),
        };
        Some(Event { name, data })
    }
}

/// `data: <payload>\n\n` into `out`.
pub fn write_data(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(reads: &[&[u8]]) -> Vec<Event> {
        let mut parser = Parser::new(1 << 20);
        let mut events = Vec::new();
        for read in reads {
            parser.feed(read);
            while let Some(e) = parser.next_event().unwrap() {
                events.push(e);
            }
        }
        events.extend(parser.finish());
        events
    }

    fn data(events: &[Event]) -> Vec<&[u8]> {
        events.iter().map(|e| e.data.as_ref()).collect()
    }

    #[test]
    fn every_line_ending_and_split_gives_the_same_events() {
        let canonical =
            b"data: {\"a\":1}\n\n: ping\n\nevent: error\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        let expected = parse_all(&[canonical]);
        assert_eq!(data(&expected), vec![&b"{\"a\":1}"[..], b"x\ny", b"[DONE]"]);
        assert_eq!(expected[1].name.as_deref(), Some("error"));
        for ending in [&b"\r\n"[..], b"\r"] {
            let text: Vec<u8> = String::from_utf8_lossy(canonical)
                .replace('\n', std::str::from_utf8(ending).unwrap())
                .into_bytes();
            for split in 0..text.len() {
                let got = parse_all(&[&text[..split], &text[split..]]);
                assert_eq!(got, expected, "split at {split}");
            }
            let bytewise: Vec<&[u8]> = text.chunks(1).collect();
            assert_eq!(parse_all(&bytewise), expected);
        }
    }

    #[test]
    fn real_llama_cpp_capture_parses() {
        let bytes = include_bytes!("../tests/fixtures/llama.cpp/toolcall-stream.sse");
        let events = parse_all(&[bytes]);
        assert!(events.last().unwrap().is_done());
        assert!(events.len() > 5);
    }

    #[test]
    fn no_space_after_colon_and_unterminated_last_event() {
        assert_eq!(
            data(&parse_all(&[b"data:abc\n\ndata: tail"])),
            vec![&b"abc"[..], b"tail"]
        );
    }

    #[test]
    fn empty_data_lines_count_as_lines() {
        assert_eq!(
            data(&parse_all(&[
                b"data:\n\ndata:\ndata: y\n\ndata: x\ndata:\ndata:\n\n"
            ])),
            vec![&b""[..], b"\ny", b"x\n\n"]
        );
    }

    #[test]
    fn a_4_mib_line_fed_byte_by_byte_is_scanned_once() {
        let line = [b"data: ".as_slice(), &vec![b'x'; 4 << 20], b"\n\n"].concat();
        let mut parser = Parser::new(8 << 20);
        let mut events = Vec::new();
        for byte in line.chunks(1) {
            parser.feed(byte);
            events.extend(parser.next_event().unwrap());
        }
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.len(), 4 << 20);
        // Each byte is looked at for a line end once, not once per read.
        assert!(
            parser.examined <= line.len(),
            "{} bytes examined for {}",
            parser.examined,
            line.len()
        );
    }

    #[test]
    fn oversized_event_is_an_error_not_unbounded_memory() {
        let mut parser = Parser::new(16);
        parser.feed(b"data: 0123456789abcdef0123");
        assert_eq!(parser.next_event(), Err(EventTooLarge(16)));
    }

    /// Between reads that end on an event's end (an open stream's wait),
    /// the parser keeps no buffer; a partial event is kept.
    #[test]
    fn a_parser_waiting_between_events_holds_no_buffer() {
        let mut parser = Parser::new(1 << 20);
        parser.feed(b"data: {\"a\":1}\n\ndata: {\"b\"");
        let first = parser.next_event().unwrap().expect("first event");
        assert_eq!(first.data.as_ref(), br#"{"a":1}"#);
        assert_eq!(parser.next_event(), Ok(None));
        assert_eq!(parser.pending.as_ref(), br#"data: {"b""#);
        parser.feed(b":2}\n\n");
        let second = parser.next_event().unwrap().expect("second event");
        assert_eq!(second.data.as_ref(), br#"{"b":2}"#);
        assert_eq!(parser.next_event(), Ok(None));
        assert_eq!(parser.pending.capacity(), 0);
    }
}

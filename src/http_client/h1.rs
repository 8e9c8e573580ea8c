//! HTTP/1.1 responses read straight off an upstream connection.
//!
//! pingora's HTTP/1 client allocated a 64 KiB body buffer for every
//! response, kept the 4 KiB buffer the head was read into for as long as the
//! connection lived, and copied each piece of a body out of its buffer. Here
//! a read lands in a scratch buffer of the thread's and is copied out at its
//! size, so a connection holds no buffer while it waits (an open stream waits
//! between every two events); one buffer then takes the head and the body,
//! and a body's pieces are handed out of it without a copy. The framing
//! (RFC 9112 §6) is pure:
//! [`parse_head`] and [`Body::decode`](crate::http1::Body::decode) are functions of the bytes read so
//! far, and [`Response`] only feeds them from the socket.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::mem::MaybeUninit;
use std::pin::{pin, Pin};
use std::task::{ready, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{StatusCode, Version};
use pingora::protocols::Stream;
use pingora::{Error, ErrorType, OkOrErr, OrErr, Result};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::http1::{has_token, is_chunked, is_event_stream, is_name, Body, Chunk, Decoded, Fields};

/// The most one read asks for: a large body's reads fill it.
const MAX_READ_SIZE: usize = 64 * 1024;
/// The longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// The most header fields a head may have (pingora's limit).
const MAX_HEADERS: usize = 256;

/// A response's status line and header fields, and how its body is framed.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    /// As sent, but a length beside a transfer coding.
    pub fields: Fields,
    /// Its `Content-Type` is an event stream's.
    pub event_stream: bool,
    pub body: Body,
    /// Whether the server lets the connection serve another request.
    pub keep_alive: bool,
}

/// Parses the response head at the start of `buf`: `None` while it is
/// incomplete, else the head and its length. `head_request`: the request
/// was `HEAD`, so whatever the fields say, no body follows.
pub fn parse_head(buf: &[u8], head_request: bool) -> Result<Option<(Head, usize)>> {
    // Uninitialised: an array of empty fields is 8 KiB written, and read
    // into the cache, per response.
    let mut fields = [MaybeUninit::<httparse::Header>::uninit(); MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    // As lenient as pingora's client: servers in the wild send both.
    let mut parser = httparse::ParserConfig::default();
    parser.allow_spaces_after_header_name_in_responses(true);
    parser.allow_obsolete_multiline_headers_in_responses(true);
    let len = match parser.parse_response_with_uninit_headers(&mut response, buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Error::e_explain(invalid(), format!("response head: {e}")),
    };
    let status = response.code.unwrap_or_default();
    let version = match response.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // One copy of the head, the fields sliced out of it: one allocation,
    // and the read buffer stays the reader's. No map: an answer passed on
    // is written from these as they came.
    let raw = Bytes::copy_from_slice(&buf[..len]);
    let mut fields = Fields::parse(raw, buf, response.headers)
        .or_err_with(invalid(), || "response header value")?;
    let mut length: Option<u64> = None;
    let (mut chunked, mut encoded, mut close, mut keep_alive_asked) = (false, false, false, false);
    let mut event_stream = false;
    for (name, value) in fields.iter() {
        if is_name(name, b"content-length") {
            let parsed = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .or_err_with(invalid(), || "response content-length")?;
            if length.is_some_and(|l| l != parsed) {
                return Error::e_explain(invalid(), "response content-lengths differ");
            }
            length = Some(parsed);
        } else if is_name(name, b"transfer-encoding") {
            encoded = true;
            // Only the final coding frames the body (RFC 9112 §6.3).
            chunked = is_chunked(value);
        } else if is_name(name, b"connection") {
            close |= has_token(value, b"close");
            keep_alive_asked |= has_token(value, b"keep-alive");
        } else if is_name(name, b"content-type") {
            event_stream = is_event_stream(value);
        }
    }
    let mut keep_alive = !close && (version == Version::HTTP_11 || keep_alive_asked);
    let body = if head_request || matches!(status, 100..=199 | 204 | 304) {
        Body::Length(0)
    } else if encoded {
        // A length beside a transfer coding is a smuggling attempt or a
        // bug: the coding wins, the length goes, the connection is not
        // trusted with another request; nor is an HTTP/1.0 one with a
        // coding (RFC 9112 §6.1).
        if length.is_some() || version == Version::HTTP_10 {
            fields.remove(&CONTENT_LENGTH);
            keep_alive = false;
        }
        if chunked {
            Body::Chunked(Chunk::Size)
        } else {
            Body::Close
        }
    } else {
        match length {
            Some(n) => Body::Length(n),
            None => Body::Close,
        }
    };
    if matches!(body, Body::Close) {
        keep_alive = false;
    }
    let status = StatusCode::from_u16(status).or_err(invalid(), "response status")?;
    Ok(Some((
        Head {
            status,
            fields,
            event_stream,
            body,
            keep_alive,
        },
        len,
    )))
}

fn invalid() -> ErrorType {
    ErrorType::InvalidHTTPHeader
}

/// A response being read off its connection.
pub struct Response {
    conn: Conn,
    status: StatusCode,
    event_stream: bool,
    /// `None` once taken.
    fields: Option<Fields>,
    body: Body,
    keep_alive: bool,
}

impl Response {
    /// Reads a response head off `stream` within `read_timeout` of when it
    /// first had to wait, past any interim (1xx) responses: one deadline
    /// for the head, so a server dripping interim responses or a head's
    /// bytes holds the request no longer.
    pub async fn read(
        link: Link,
        read_timeout: Option<Duration>,
        head_request: bool,
    ) -> Result<Response> {
        let mut conn = Conn {
            link,
            buf: BytesMut::new(),
            read_timeout,
        };
        let mut deadline = None;
        loop {
            if !conn.buf.is_empty() {
                if let Some((head, len)) = parse_head(&conn.buf, head_request)? {
                    conn.buf.advance(len);
                    match head.status.as_u16() {
                        // We never ask to switch protocols.
                        101 => return Error::e_explain(invalid(), "unexpected protocol switch"),
                        100..=199 => continue,
                        _ => {
                            return Ok(Response {
                                conn,
                                status: head.status,
                                event_stream: head.event_stream,
                                fields: Some(head.fields),
                                body: head.body,
                                keep_alive: head.keep_alive,
                            })
                        }
                    }
                }
                if conn.buf.len() > MAX_HEAD {
                    return Error::e_explain(invalid(), "response head too long");
                }
            }
            if conn.fill(&mut deadline).await? == 0 {
                return Error::e_explain(
                    ErrorType::ConnectionClosed,
                    "closed before the response head",
                );
            }
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn is_event_stream(&self) -> bool {
        self.event_stream
    }

    /// The head's fields, until [`take_fields`](Self::take_fields).
    pub fn fields(&self) -> Option<&Fields> {
        self.fields.as_ref()
    }

    pub fn take_fields(&mut self) -> Option<Fields> {
        self.fields.take()
    }

    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.conn.read_timeout = timeout;
    }

    /// The next piece of the body; `None` at its end.
    pub async fn read_body(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.body.decode(&mut self.conn.buf)? {
                Decoded::Data(piece) => return Ok(Some(piece)),
                Decoded::End => return Ok(None),
                Decoded::NeedMore => {}
            }
            // Each read of the body within the idle limit of its own.
            if self.conn.fill(&mut None).await? == 0 {
                self.body.closed()?;
            }
        }
    }

    /// The next piece of the body if the buffer holds it, without reading:
    /// `Some(None)` at its end, `None` when a read is needed.
    pub fn read_buffered(&mut self) -> Result<Option<Option<Bytes>>> {
        Ok(match self.body.decode(&mut self.conn.buf)? {
            Decoded::Data(piece) => Some(Some(piece)),
            Decoded::End => Some(None),
            Decoded::NeedMore => None,
        })
    }

    /// The connection, if it may serve another request: the body was read to
    /// its end, nothing came after it, and the server keeps it open.
    /// The connection is not to serve another request once this one ends.
    pub fn close_after(&mut self) {
        self.keep_alive = false;
    }

    pub fn into_reusable(self) -> Option<Link> {
        let done = self.body == Body::Done && self.conn.buf.is_empty();
        (self.keep_alive && done).then_some(self.conn.link)
    }
}

/// An HTTP/1 connection to a peer, and the timer its reads wait on: made
/// with the connection's first wait and pooled with it, then pushed later
/// for each wait (a compare-and-swap). A timer per wait costs a lock to
/// register and another to drop (pingora's `fast_timeout`: a box, and a
/// notifier shared with every other wait under a lock).
pub struct Link {
    pub stream: Stream,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Link {
    pub fn new(stream: Stream) -> Self {
        Link {
            stream,
            timer: None,
        }
    }

    /// Writes `wire` whole and flushes it, unless that still waits `limit`
    /// from when it first had to (a timeout, as a read's). A request's
    /// write nearly always goes at once, and then no timer is touched.
    pub async fn write(&mut self, limit: Duration, wire: &mut impl Buf) -> Result<()> {
        let Link { stream, timer } = self;
        let write = async {
            stream.write_all_buf(wire).await?;
            stream.flush().await
        };
        within(timer, limit, &mut None, write)
            .await
            .or_err(ErrorType::WriteTimedout, "writing the request")?
            .or_err(ErrorType::WriteError, "writing the request")
    }
}

/// `io`, unless it is still waiting at `deadline`, or, with none set yet,
/// `limit` from now (`None`); the deadline set is left in `deadline`, for
/// the next wait of a whole that shares it. `timer` is touched only when
/// `io` must wait.
async fn within<F: Future>(
    timer: &mut Option<Pin<Box<Sleep>>>,
    limit: Duration,
    deadline: &mut Option<Instant>,
    io: F,
) -> Option<F::Output> {
    let mut io = pin!(io);
    let mut armed = false;
    poll_fn(|cx| {
        if let Poll::Ready(done) = io.as_mut().poll(cx) {
            return Poll::Ready(Some(done));
        }
        let until = *deadline.get_or_insert_with(|| Instant::now() + limit);
        let timer = match timer {
            Some(timer) if armed => timer,
            Some(timer) => {
                timer.as_mut().reset(until);
                timer
            }
            None => timer.insert(Box::pin(tokio::time::sleep_until(until))),
        };
        armed = true;
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// A connection and the buffer its bytes are read into.
struct Conn {
    link: Link,
    /// What was read and not yet handed out; no memory while that is nothing.
    buf: BytesMut,
    read_timeout: Option<Duration>,
}

impl Conn {
    /// Reads once into the buffer; 0 when the server has closed. The read
    /// waits until `deadline`, or `read_timeout` from when it first had to
    /// (then set in `deadline`).
    async fn fill(&mut self, deadline: &mut Option<Instant>) -> Result<usize> {
        if self.buf.is_empty() {
            // Its memory goes back (once the pieces handed out are dropped)
            // before the wait, which may be long.
            self.buf = BytesMut::new();
        }
        let Link { stream, timer } = &mut self.link;
        let read = read_copied(stream, &mut self.buf);
        let read = match self.read_timeout {
            Some(limit) => within(timer, limit, deadline, read)
                .await
                .or_err(ErrorType::ReadTimedout, "reading the response")?,
            None => read.await,
        };
        read.or_err(ErrorType::ReadError, "reading the response")
    }
}

thread_local! {
    /// Where reads land (see [`read_copied`]): one per thread, not one per
    /// connection.
    static SCRATCH: RefCell<Box<[MaybeUninit<u8>]>> =
        RefCell::new(Box::new_uninit_slice(MAX_READ_SIZE));
}

/// Reads once from `stream` and appends what came to `buf`: the read goes
/// to the thread's scratch buffer, and only what it got is copied to `buf`,
/// so no room is reserved while the read waits. One copy more per read, of
/// the bytes read, is the price of holding nothing between reads.
fn read_copied<'a>(
    stream: &'a mut Stream,
    buf: &'a mut BytesMut,
) -> impl Future<Output = std::io::Result<usize>> + Send + 'a {
    poll_fn(move |cx| {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut read = ReadBuf::uninit(scratch);
            ready!(Pin::new(&mut *stream).poll_read(cx, &mut read))?;
            let got = read.filled();
            buf.extend_from_slice(got);
            Poll::Ready(Ok(got.len()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::MAX_CHUNK_LINE;
    use proptest::prelude::*;

    /// Decodes a whole response fed in pieces cut at `cuts`, the way reads
    /// deliver it: the head's status, the body, and whether the connection
    /// may serve another request.
    fn decode_in_pieces(wire: &[u8], cuts: &[usize], head_request: bool) -> Result<Decoding> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
        points.push(wire.len());
        points.sort_unstable();
        let mut buf = BytesMut::new();
        let mut fed = 0;
        let mut pieces = points.into_iter().map(|end| {
            let piece = &wire[fed.min(end)..end];
            fed = fed.max(end);
            piece
        });
        let head = loop {
            match parse_head(&buf, head_request)? {
                Some((head, len)) => {
                    buf.advance(len);
                    break head;
                }
                None => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return Error::e_explain(ErrorType::ConnectionClosed, "no head"),
                },
            }
        };
        let (mut body, mut data) = (head.body, Vec::new());
        loop {
            match body.decode(&mut buf)? {
                Decoded::Data(piece) => data.extend_from_slice(&piece),
                Decoded::End => break,
                Decoded::NeedMore => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => body.closed()?,
                },
            }
        }
        let rest: usize = buf.len() + pieces.map(<[u8]>::len).sum::<usize>();
        Ok(Decoding {
            status: head.status.as_u16(),
            body: data,
            reusable: head.keep_alive && rest == 0,
        })
    }

    #[derive(Debug, PartialEq)]
    struct Decoding {
        status: u16,
        body: Vec<u8>,
        reusable: bool,
    }

    fn whole(wire: &[u8]) -> Decoding {
        decode_in_pieces(wire, &[], false).unwrap()
    }

    /// A chunked body as a model server streams it: one chunk per event.
    fn chunked(events: &[&str], trailers: &str) -> Vec<u8> {
        let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        // An empty chunk would be the last one.
        for event in events.iter().filter(|e| !e.is_empty()) {
            wire.extend_from_slice(format!("{:x};ext=1\r\n{event}\r\n", event.len()).as_bytes());
        }
        wire.extend_from_slice(format!("0\r\n{trailers}\r\n").as_bytes());
        wire
    }

    #[test]
    fn bodies_are_framed_as_rfc_9112_says() {
        let events = ["data: {\"a\":1}\n\n", "data: [DONE]\n\n"];
        let chunked_body = events.concat().into_bytes();
        let ok = |body: &[u8], reusable| Decoding {
            status: 200,
            body: body.to_vec(),
            reusable,
        };
        assert_eq!(whole(&chunked(&events, "")), ok(&chunked_body, true));
        assert_eq!(
            whole(&chunked(&events, "x-usage: 5\r\nx-more: 6\r\n")),
            ok(&chunked_body, true)
        );
        assert_eq!(
            whole(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
            ok(b"hello", true)
        );
        // HTTP/1.0 keeps the connection only when asked to.
        assert_eq!(
            whole(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            ok(b"ok", false)
        );
        assert_eq!(
            whole(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok"),
            ok(b"ok", true)
        );
        assert_eq!(
            whole(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"),
            ok(b"ok", false)
        );
        // No length: the body runs to the close, and the connection with it.
        assert_eq!(
            whole(b"HTTP/1.1 200 OK\r\n\r\nto the end"),
            ok(b"to the end", false)
        );
        // A coding other than chunked last: to the close as well.
        assert_eq!(
            whole(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc"),
            ok(b"3\r\nabc", false)
        );
        // Bytes after the body: the server is out of step, not reused.
        assert_eq!(
            whole(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1"),
            ok(b"ok", false)
        );
        for no_body in [
            &b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n"[..],
            b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let status = whole(no_body).status;
            assert_eq!(
                whole(no_body),
                Decoding {
                    status,
                    body: vec![],
                    reusable: true
                }
            );
        }
        let head = decode_in_pieces(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", &[], true);
        assert_eq!(head.unwrap(), ok(b"", true), "a HEAD answer has no body");
    }

    #[test]
    fn a_length_beside_a_transfer_coding_is_dropped_and_so_is_the_connection() {
        let wire = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let (head, _) = parse_head(wire, false).unwrap().unwrap();
        assert!(head.fields.get(&CONTENT_LENGTH).is_none());
        assert_eq!(
            whole(wire),
            Decoding {
                status: 200,
                body: b"hello".to_vec(),
                reusable: false
            }
        );
    }

    #[test]
    fn the_head_keeps_every_field_as_sent() {
        let wire = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nX-Request-Id: abc\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n";
        let (head, len) = parse_head(wire, false).unwrap().unwrap();
        assert_eq!(len, wire.len());
        assert_eq!(head.status, 429);
        let fields: Vec<_> = head.fields.iter().collect();
        assert_eq!(
            fields,
            [
                (&b"Retry-After"[..], &b"7"[..]),
                (b"X-Request-Id", b"abc"),
                (b"Set-Cookie", b"a=1"),
                (b"Set-Cookie", b"b=2"),
                (b"Content-Length", b"0"),
            ]
        );
        assert_eq!(head.fields.get(&http::header::RETRY_AFTER), Some(&b"7"[..]));
        assert_eq!(head.fields.value(&http::header::SET_COOKIE).unwrap(), "a=1");
        assert!(parse_head(&wire[..wire.len() - 1], false)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_field_folded_over_lines_is_refused_not_passed_on() {
        // httparse accepts the fold; its line end must not reach a client.
        let folded = b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n";
        assert!(parse_head(folded, false).is_err());
        let tab = b"HTTP/1.1 200 OK\r\nX-A: a\tb\r\nContent-Length: 0\r\n\r\n";
        let (head, _) = parse_head(tab, false).unwrap().unwrap();
        assert_eq!(
            head.fields.get(&http::HeaderName::from_static("x-a")),
            Some(&b"a\tb"[..])
        );
    }

    #[test]
    fn broken_framing_is_an_error_not_a_short_body() {
        let fails = |wire: &[u8]| decode_in_pieces(wire, &[], false).is_err();
        assert!(fails(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"));
        assert!(fails(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"));
        assert!(fails(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
        ));
        assert!(fails(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        ));
        assert!(fails(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n"
        ));
        assert!(fails(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab"
        ));
        assert!(fails(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
        ));
        assert!(fails(b"HTTP/1.1 200 OK\r\nnot a header\r\n\r\n"));
        // A chunk-size line that never ends stops at its limit.
        let mut endless = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
        endless.resize(endless.len() + MAX_CHUNK_LINE, b'x');
        assert!(fails(&endless));
    }

    proptest! {
        /// However reads cut a response, it decodes the same.
        #[test]
        fn any_cutting_of_a_response_decodes_the_same(
            events in proptest::collection::vec("[a-z{}\":\r\n ]{0,40}", 0..6),
            trailers in prop_oneof![Just(""), Just("x-usage: 5\r\n")],
            cuts in proptest::collection::vec(0usize..2000, 0..12),
        ) {
            let events: Vec<&str> = events.iter().map(String::as_str).collect();
            let wire = chunked(&events, trailers);
            prop_assert_eq!(decode_in_pieces(&wire, &cuts, false).unwrap(), whole(&wire));
            prop_assert_eq!(whole(&wire).body, events.concat().into_bytes());
            let mut sized = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", events.concat().len()).into_bytes();
            sized.extend_from_slice(events.concat().as_bytes());
            prop_assert_eq!(decode_in_pieces(&sized, &cuts, false).unwrap(), whole(&sized));
        }
    }

    /// A pooled connection keeps one read timer: each read still gets its
    /// own limit, shorter or longer than the last one's, and a timer that
    /// went off while the connection sat in the pool does not end the next
    /// read early.
    /// Our end of a connection, as the pool holds one, and the server's.
    async fn connected() -> (
        pingora::protocols::l4::stream::Stream,
        tokio::net::TcpStream,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (ours, theirs) = tokio::join!(ours, listener.accept());
        (ours.unwrap().into(), theirs.unwrap().0)
    }

    #[tokio::test]
    async fn each_read_of_a_pooled_connection_gets_its_own_limit() {
        use tokio::io::AsyncWriteExt;
        const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let (stream, mut server) = connected().await;
        let mut link = Link::new(Box::new(stream));
        let mut exchange = async |link, limit: u64, answer_after: u64| {
            let read = Response::read(link, Some(Duration::from_millis(limit)), false);
            let answer = async {
                tokio::time::sleep(Duration::from_millis(answer_after)).await;
                server.write_all(OK).await.unwrap();
            };
            let (response, ()) = tokio::join!(read, answer);
            let mut response = response.expect("answered within the limit");
            assert_eq!(
                response.read_body().await.unwrap().as_deref(),
                Some(&b"ok"[..])
            );
            assert_eq!(response.read_body().await.unwrap(), None);
            response.into_reusable().expect("reusable")
        };
        // The timer is made by a read that waits, and goes off in the pool.
        link = exchange(link, 100, 20).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        link = exchange(link, 10_000, 150).await;
        // Earlier than the timer's last deadline (10 s from the last read).
        let started = std::time::Instant::now();
        let error = Response::read(link, Some(Duration::from_millis(100)), false)
            .await
            .err()
            .expect("no answer: timed out");
        assert_eq!(error.etype(), &ErrorType::ReadTimedout);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn interim_responses_dripped_do_not_move_the_head_s_deadline() {
        use tokio::io::AsyncWriteExt;
        let (stream, mut server) = connected().await;
        let link = Link::new(Box::new(stream));
        // A `102 Processing` every 50 ms, for ever: each read comes well
        // within the limit, the head never.
        let drip = async {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if server
                    .write_all(b"HTTP/1.1 102 Processing\r\n\r\n")
                    .await
                    .is_err()
                {
                    break;
                }
            }
        };
        let started = std::time::Instant::now();
        let read = Response::read(link, Some(Duration::from_millis(300)), false);
        let raced = async {
            tokio::select! {
                read = read => read.err().expect("no head: an error"),
                () = drip => unreachable!("the drip ends only when the link is gone"),
            }
        };
        let error = tokio::time::timeout(Duration::from_secs(5), raced)
            .await
            .expect("the head's deadline held");
        assert_eq!(error.etype(), &ErrorType::ReadTimedout);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    /// An event stream waits for its next event with no read buffer of its
    /// own, and pieces split across reads (a chunk's size line in one read,
    /// its data in the next) still come out whole.
    #[tokio::test]
    async fn a_waiting_stream_holds_no_read_buffer() {
        use tokio::io::AsyncWriteExt;
        let (stream, mut server) = connected().await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n6")
            .await
            .unwrap();
        let mut response = Response::read(Link::new(Box::new(stream)), None, false)
            .await
            .unwrap();
        let first = response.read_body().await.unwrap();
        assert_eq!(first.as_deref(), Some(&b"first"[..]));
        drop(first);
        // The rest of the chunk is not here yet: the read waits.
        {
            let mut read = pin!(response.read_body());
            let polled = poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
            assert!(polled.is_pending());
        }
        // Only the size line's start is kept, at its size.
        assert_eq!(&response.conn.buf[..], b"6");
        assert!(
            response.conn.buf.capacity() < 64,
            "{}",
            response.conn.buf.capacity()
        );
        server.write_all(b"\r\nsecond\r\n").await.unwrap();
        assert_eq!(
            response.read_body().await.unwrap().as_deref(),
            Some(&b"second"[..])
        );
        // Nothing kept: while the next read waits, no buffer at all.
        {
            let mut read = pin!(response.read_body());
            let polled = poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
            assert!(polled.is_pending());
        }
        assert_eq!(response.conn.buf.capacity(), 0);
        server.write_all(b"0\r\n\r\n").await.unwrap();
        assert_eq!(response.read_body().await.unwrap(), None);
        assert!(response.into_reusable().is_some());
    }
}

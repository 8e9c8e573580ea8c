//! HTTP/1.1 on the client's connection, for the requests our own routes
//! answer: the head parsed, the body read, the response written, straight
//! on the connection.
//!
//! pingora's server session did this before. Per request it allocated and
//! moved a 680-byte session, built a 3.7 KiB future to finish it, wrote each
//! response head into a 4 KiB buffer of its own, and parsed the head into
//! maps that also keep each name's case. The framing is pingora's still
//! where it guards against smuggling (RFC 9112 §6, RFC 9110 §8.6): a length
//! beside a transfer coding is dropped with the connection's reuse, a coding
//! that does not end in `chunked` or comes with HTTP/1.0 is refused, so are
//! lengths that disagree, and an authority that disagrees with `Host`
//! (pingora's own check). Bodies are decoded by [`crate::http1`], as the
//! upstream side's are.
//!
//! [`parse`] is pure; [`Session`] feeds it and the body decoder from the
//! socket and writes the response.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};
use pingora::http::RequestHeader;
use pingora::protocols::http::authority::validate_request_authority;
use pingora::protocols::http::date::get_cached_date;
use pingora::protocols::Stream;
use pingora::{Error, ErrorType, OrErr, Result};
use pingora_timeout::fast_timeout::fast_timeout;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http1::{
    field_name, has_token, is_chunked, is_event_stream, is_name, same_bytes, Body, Chunk, Decoded,
};
use crate::request_id;

/// The longest request head accepted (pingora's limit).
pub const MAX_HEAD: usize = (1 << 20) - 1;
/// The most header fields a request may have (pingora's limit).
const MAX_HEADERS: usize = 256;
/// How much a read of a request body asks for at once.
const BODY_READ: usize = 16 * 1024;
/// Room a whole body's read asks for past the body's end. A read that
/// fills what it asked for leaves tokio taking the socket for readable
/// still, so the next request's read would start with a `recvfrom` that
/// finds nothing: one syscall more for each coding agent's request.
const PAST_BODY: usize = 64;
/// How long each read of a request body may take (pingora's default, and
/// nginx's `client_body_timeout`).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request head cannot be served: it is answered with `status` and
/// the connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed {
    pub status: u16,
    pub why: &'static str,
}

impl Malformed {
    /// A 400: the head breaks HTTP's rules.
    const fn bad(why: &'static str) -> Self {
        Malformed { status: 400, why }
    }
}

/// `http`'s longest target (`Uri`'s limit): a longer one is a 414, as
/// RFC 9110 §15.5.15 has it, not a head that cannot be parsed.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    pub header: RequestHeader,
    /// The head as it arrived (its field values are slices of it): what a
    /// request passed on to pingora's proxy path is parsed from again.
    raw: Bytes,
    body: Body,
    keep_alive: bool,
}

impl Head {
    /// How the request's body is delimited.
    pub fn body(&self) -> &Body {
        &self.body
    }

    /// The request as it arrived, for pingora's proxy path to parse again:
    /// this head, then `rest` (what of the body was read with it).
    pub fn as_sent(&self, rest: &[u8]) -> BytesMut {
        as_sent(&self.raw, rest)
    }
}

fn as_sent(raw: &[u8], rest: &[u8]) -> BytesMut {
    let mut request = BytesMut::with_capacity(raw.len() + rest.len());
    request.extend_from_slice(raw);
    request.extend_from_slice(rest);
    request
}

/// Parses the request head at the start of `buf`, which holds a whole one
/// (a blank line ends it), and takes it off: `buf` keeps what followed.
///
/// A request target with bytes httparse refuses (spaces, quotes, controls)
/// is percent-encoded first, as pingora does.
pub fn parse(buf: &mut BytesMut) -> Result<Head, Malformed> {
    match parse_as_sent(buf) {
        Err(Parsing::Target) => {
            *buf = escape_target(buf).ok_or(MALFORMED)?;
            parse_as_sent(buf).map_err(Parsing::into_malformed)
        }
        parsed => parsed.map_err(Parsing::into_malformed),
    }
}

const MALFORMED: Malformed =
    Malformed::bad("malformed HTTP request: the request line or a header cannot be parsed");

enum Parsing {
    /// The request line has bytes a target may not: escaping may mend it.
    Target,
    Malformed(Malformed),
}

impl Parsing {
    fn into_malformed(self) -> Malformed {
        match self {
            Parsing::Target => MALFORMED,
            Parsing::Malformed(m) => m,
        }
    }
}

impl From<Malformed> for Parsing {
    fn from(m: Malformed) -> Self {
        Parsing::Malformed(m)
    }
}

fn parse_as_sent(buf: &mut BytesMut) -> Result<Head, Parsing> {
    let mut fields = [MaybeUninit::<httparse::Header>::uninit(); MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
        Ok(_) => {
            return Err(Malformed {
                status: 431,
                why: "the request head is larger than 1 MiB",
            }
            .into())
        }
        Err(httparse::Error::Token | httparse::Error::Version) => return Err(Parsing::Target),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Malformed::bad("a request head may have at most 256 header fields").into())
        }
        Err(_) => return Err(MALFORMED.into()),
    };
    // One copy of the head, the values sliced out of it; `buf` keeps the
    // body's bytes and is reused for the rest of them.
    let raw = Bytes::copy_from_slice(&buf[..len]);
    // Room for the one field a request gains (`x-request-id`).
    let mut fields = HeaderMap::with_capacity(request.headers.len() + 1);
    // The fields that frame the body are read as they go by: three
    // lookups in the map afterwards each hashed a name.
    let mut framing = Framing::new();
    for field in request.headers.iter() {
        let name = field_name(field.name.as_bytes()).ok_or(MALFORMED)?;
        let value = same_bytes(&raw, buf, field.value).ok_or(MALFORMED)?;
        // SAFETY: httparse lets into a value the bytes a header value may
        // hold, and no others (HTAB, SP to `~`, and from 0x80): checked once.
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(value) };
        framing.read(&name, field.value);
        fields.try_append(name, value).map_err(|_| MALFORMED)?;
    }
    // Built from `http`'s parts: without pingora's case map, which our
    // HTTP/1 does not read, the fields go into `http`'s map as they are
    // parsed, each name read once (pingora's `insert_header` writes a name
    // out in title case and parses it again, for that map).
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method =
        Method::from_bytes(request.method.unwrap_or_default().as_bytes()).map_err(|_| MALFORMED)?;
    parts.version = match request.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    parts.headers = fields;
    let target = request.path.unwrap_or_default().as_bytes();
    let known = known_target(target);
    let found = known.is_some();
    parts.uri = known.unwrap_or_default();
    let mut header = RequestHeader::from(parts);
    if !found {
        if target.len() > MAX_TARGET {
            return Err(Malformed {
                status: 414,
                why: "the request target is longer than 65,534 bytes",
            }
            .into());
        }
        header.set_raw_path(target).map_err(|_| MALFORMED)?;
    }
    bytes::Buf::advance(buf, len);
    let (body, keep_alive) = framing.decide(&mut header)?;
    Ok(Head {
        header,
        raw,
        body,
        keep_alive,
    })
}

/// The targets most requests have (our routes'), parsed once: a target's
/// parse (pingora's `set_raw_path`, `http`'s checks of it byte by byte)
/// was 800 instructions of a request. A clone shares the static text.
static KNOWN_TARGETS: LazyLock<[Uri; 5]> = LazyLock::new(|| {
    [
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/models",
        "/healthz",
    ]
    .map(Uri::from_static)
});

fn known_target(target: &[u8]) -> Option<Uri> {
    KNOWN_TARGETS
        .iter()
        .find(|uri| uri.path().as_bytes() == target)
        .cloned()
}

/// What a request's fields say of its framing, read field by field.
struct Framing {
    /// `Connection: close`.
    close: bool,
    /// `Connection: keep-alive` (HTTP/1.0).
    keep_alive: bool,
    /// Whether the final `Transfer-Encoding` is `chunked`, if there is one:
    /// only the final coding frames the body (RFC 9112 §6.3).
    chunked: Option<bool>,
    /// A coding other than `chunked` (`gzip, chunked`): the body would be
    /// passed on decoded of its chunks only, as if it were plain.
    other_coding: bool,
    /// The `Content-Length` (`Ok(None)`: none given): identical values,
    /// repeated or listed, are one (RFC 9110 §8.6); values that differ or
    /// are not numbers are refused (when no coding makes the length moot).
    length: Result<Option<u64>, Malformed>,
}

impl Framing {
    fn new() -> Self {
        Framing {
            close: false,
            keep_alive: false,
            chunked: None,
            other_coding: false,
            length: Ok(None),
        }
    }

    fn read(&mut self, name: &HeaderName, value: &[u8]) {
        if *name == CONNECTION {
            self.close |= has_token(value, b"close");
            self.keep_alive |= has_token(value, b"keep-alive");
        } else if *name == TRANSFER_ENCODING {
            self.chunked = Some(is_chunked(value));
            self.other_coding |= value
                .split(|b| *b == b',')
                .map(<[u8]>::trim_ascii)
                .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"chunked"));
        } else if *name == CONTENT_LENGTH {
            self.length = self.length.and_then(|length| more_length(length, value));
        }
    }

    /// How the request's body is delimited, and whether the connection
    /// may serve another request after it.
    fn decide(self, header: &mut RequestHeader) -> Result<(Body, bool), Malformed> {
        validate_request_authority(header).map_err(|_| {
            Malformed::bad("the request's authority is ambiguous or names another host")
        })?;
        let http10 = header.version == Version::HTTP_10;
        let mut keep_alive = !self.close && (!http10 || self.keep_alive);
        let body = match self.chunked {
            Some(chunked) => {
                if http10 {
                    return Err(Malformed::bad(
                        "an HTTP/1.0 request cannot have a Transfer-Encoding",
                    ));
                }
                if !chunked {
                    return Err(Malformed::bad(
                        "the final Transfer-Encoding must be chunked",
                    ));
                }
                // RFC 9112 §6.1: a coding the server does not know is a 501.
                if self.other_coding {
                    return Err(Malformed {
                        status: 501,
                        why: "a Transfer-Encoding other than chunked is not supported",
                    });
                }
                // The coding wins (RFC 9112 §6.3); the connection is not
                // trusted with another request (§6.1).
                if self.length != Ok(None) {
                    header.remove_header(&CONTENT_LENGTH);
                    keep_alive = false;
                }
                Body::Chunked(Chunk::Size)
            }
            None => Body::Length(self.length?.unwrap_or(0)),
        };
        Ok((body, keep_alive))
    }
}

/// `length` with a `Content-Length` value's tokens.
fn more_length(mut length: Option<u64>, value: &[u8]) -> Result<Option<u64>, Malformed> {
    for token in value.split(|b| *b == b',') {
        let token = token.trim_ascii();
        let parsed = (!token.is_empty() && token.iter().all(u8::is_ascii_digit))
            .then(|| std::str::from_utf8(token).ok()?.parse::<u64>().ok())
            .flatten()
            .ok_or(Malformed::bad("the Content-Length is not a number"))?;
        if length.is_some_and(|l| l != parsed) {
            return Err(Malformed::bad("the request has differing Content-Lengths"));
        }
        length = Some(parsed);
    }
    Ok(length)
}

/// `buf` with its request target percent-encoded where httparse refuses
/// it (controls, space, `"`, `<`, `>`, and bytes past ASCII), as pingora
/// does: the target runs from after the method to the last ` HTTP/` of the
/// request line. `None` when there is no such line to mend.
fn escape_target(buf: &[u8]) -> Option<BytesMut> {
    let line_end = buf.iter().position(|b| *b == b'\n')?;
    let line = &buf[..line_end];
    let method_end = line.iter().position(|b| *b == b' ')?;
    if method_end == 0
        || !line[..method_end]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
    {
        return None;
    }
    let start = method_end + 1;
    let end = line
        .windows(7)
        .rposition(|w| w.starts_with(b" HTTP/") && w[6].is_ascii_digit())
        .filter(|end| *end > start)?;
    let escape = |b: u8| !(0x20..0x7f).contains(&b) || matches!(b, b' ' | b'"' | b'<' | b'>');
    let mut escaped = BytesMut::with_capacity(buf.len() + 32);
    escaped.extend_from_slice(&buf[..start]);
    for &b in &line[start..end] {
        if escape(b) {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            escaped.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            escaped.put_u8(b);
        }
    }
    if escaped.len() == end {
        return None;
    }
    escaped.extend_from_slice(&buf[end..]);
    Some(escaped)
}

/// How a response's body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// No response head yet.
    NotStarted,
    /// As it is: its `Content-Length` delimits it.
    Length,
    Chunked,
    /// As it is, delimited by the connection's close.
    Close,
    /// None at all: a `HEAD` request's, or a 204's or 304's.
    Nothing,
    /// The response is complete.
    Ended,
    /// A write failed or timed out, perhaps partway: nothing more is
    /// written (the framing may be broken), and the connection closes.
    Broken,
}

/// What a response head's own fields say, found in one pass over them.
#[derive(Default)]
struct Said {
    length: bool,
    /// The last `Transfer-Encoding` ends in `chunked`.
    chunked: bool,
    date: bool,
    event_stream: bool,
    /// The fields' bytes as written, at most.
    size: usize,
}

impl Said {
    fn of<'f>(fields: impl Iterator<Item = (&'f [u8], &'f [u8])>) -> Said {
        let mut said = Said::default();
        for (name, value) in fields {
            said.size += name.len() + value.len() + 4;
            if is_name(name, b"content-length") {
                said.length = true;
            } else if is_name(name, b"transfer-encoding") {
                said.chunked = is_chunked(value);
            } else if is_name(name, b"date") {
                said.date = true;
            } else if is_name(name, b"content-type") {
                said.event_stream = is_event_stream(value);
            }
        }
        said
    }
}

/// Decides how a body of `status` that `said` describes is framed for a
/// client of `request`. `keep_alive` is cleared when the body runs to the
/// connection's close.
fn frame_response(
    status: StatusCode,
    said: &Said,
    request: &RequestHeader,
    keep_alive: &mut bool,
) -> Out {
    if request.method == Method::HEAD
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
        || status.is_informational()
    {
        Out::Nothing
    } else if said.length {
        Out::Length
    } else if request.version == Version::HTTP_11 && said.chunked {
        Out::Chunked
    } else {
        // An HTTP/1.0 client knows no chunks: the close ends the body (and
        // the head loses its `Transfer-Encoding`).
        *keep_alive = false;
        Out::Close
    }
}

/// The fields every response head gets as it is written: the request's id,
/// `Date` (RFC 9110 §6.6.1, unless the head has one) and `Connection`. The
/// head's own `x-request-id` and `Connection` are not written: these are
/// ours; nor its `Transfer-Encoding` when the close ends the body or there
/// is none, nor its `Content-Length` on a 1xx or 204 (RFC 9110 §8.6, RFC
/// 9112 §6.1: a client would wait for a body that never comes).
struct Stamp<'a> {
    request_id: Option<&'a HeaderValue>,
    date: bool,
    keep_alive: bool,
    coded: bool,
    sized: bool,
}

/// A head of `status` and `fields` in HTTP/1.1's wire format with `stamp`'s
/// fields, its blank line included.
fn head_bytes<'f>(
    status: StatusCode,
    fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
    size: usize,
    stamp: &Stamp,
) -> BytesMut {
    let reason = status.canonical_reason().unwrap_or_default();
    let date = stamp.date.then(get_cached_date);
    let written = |name: &[u8]| {
        !is_name(name, b"connection")
            && !is_name(name, request_id::HEADER.as_str().as_bytes())
            && (stamp.coded || !is_name(name, b"transfer-encoding"))
            && (stamp.sized || !is_name(name, b"content-length"))
    };
    let stamped = stamp.request_id.map_or(0, |id| id.len() + 16)
        + date.as_ref().map_or(0, |d| d.len() + 8)
        + 24;
    let mut buf = BytesMut::with_capacity(17 + reason.len() + size + stamped);
    buf.put_slice(b"HTTP/1.1 ");
    buf.put_slice(status.as_str().as_bytes());
    buf.put_u8(b' ');
    buf.put_slice(reason.as_bytes());
    buf.put_slice(b"\r\n");
    let mut field = |name: &[u8], value: &[u8]| {
        buf.put_slice(name);
        buf.put_slice(b": ");
        buf.put_slice(value);
        buf.put_slice(b"\r\n");
    };
    for (name, value) in fields.filter(|(name, _)| written(name)) {
        field(name, value);
    }
    if let Some(id) = stamp.request_id {
        field(request_id::HEADER.as_str().as_bytes(), id.as_bytes());
    }
    if let Some(date) = &date {
        field(b"date", date.as_bytes());
    }
    let connection: &[u8] = if stamp.keep_alive {
        b"keep-alive"
    } else {
        b"close"
    };
    field(b"connection", connection);
    buf.put_slice(b"\r\n");
    buf
}

/// A written response head, as the request's log line tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    pub status: StatusCode,
    pub event_stream: bool,
}

/// How a connection is left once a response was written.
pub enum Finished {
    /// It may take another request: what of it was already read comes along.
    Reusable(Stream, BytesMut),
    /// The answer went out whole before the request's body was read (an
    /// error, most often): closed with unread bytes, the connection would be
    /// reset, and the client could lose the answer.
    Unread(Stream),
    Closed,
}

/// What of a session watching the client takes ([`Session::head_and_watch`]).
pub struct Watch<'s> {
    stream: &'s mut Stream,
    buf: &'s mut BytesMut,
    body: &'s Body,
    keep_alive: &'s mut bool,
}

impl Watch<'_> {
    /// Resolves when the client goes away (an error), or sends the first
    /// bytes of its next request (kept for it). Pending while the body is
    /// unread: its bytes are not a sign of either.
    pub async fn idle(&mut self) -> Result<()> {
        if !self.body.done() || !self.buf.is_empty() {
            return std::future::pending().await;
        }
        // One byte, as pingora probes: the rest waits in the socket.
        let mut probe = [0u8; 1];
        let read = self
            .stream
            .read(&mut probe)
            .await
            .or_err(ErrorType::ReadError, "while idle")?;
        if read == 0 {
            *self.keep_alive = false;
            return Error::e_explain(ErrorType::ConnectionClosed, "the client closed");
        }
        self.buf.extend_from_slice(&probe[..read]);
        Ok(())
    }
}

/// One request on the client's connection, and its response.
pub struct Session {
    stream: Stream,
    header: RequestHeader,
    raw: Bytes,
    /// Bytes read past the head: the body's, then a next request's.
    buf: BytesMut,
    body: Body,
    keep_alive: bool,
    response: Option<Answered>,
    out: Out,
}

impl Session {
    /// The request `head`, parsed off `rest`, which holds whatever of the
    /// body (or a next request) came with it.
    pub fn new(stream: Stream, head: Head, rest: BytesMut) -> Session {
        let mut session = Session {
            stream,
            header: head.header,
            raw: head.raw,
            buf: rest,
            body: head.body,
            keep_alive: head.keep_alive,
            response: None,
            out: Out::NotStarted,
        };
        session.release_buffer();
        session
    }

    pub fn req_header(&self) -> &RequestHeader {
        &self.header
    }

    pub fn req_header_mut(&mut self) -> &mut RequestHeader {
        &mut self.header
    }

    /// The request's head, lent where it is, beside a watch on the client
    /// ([`Watch::idle`]): work that reads the head (a request passed on
    /// borrows its fields) while the client is watched.
    pub fn head_and_watch(&mut self) -> (&RequestHeader, Watch<'_>) {
        let watch = Watch {
            stream: &mut self.stream,
            buf: &mut self.buf,
            body: &self.body,
            keep_alive: &mut self.keep_alive,
        };
        (&self.header, watch)
    }

    /// The connection closes after this request.
    pub fn close_after(&mut self) {
        self.keep_alive = false;
    }

    pub fn client_addr(&self) -> Option<pingora::protocols::l4::socket::SocketAddr> {
        let digest = self.stream.get_socket_digest()?;
        digest.peer_addr().cloned()
    }

    /// The next piece of the request body; `None` at its end.
    pub async fn read_request_body(&mut self) -> Result<Option<Bytes>> {
        loop {
            let piece = match self.body.decode(&mut self.buf)? {
                Decoded::Data(piece) => Some(piece),
                Decoded::End => None,
                Decoded::NeedMore => {
                    self.buf.reserve(BODY_READ);
                    self.fill_buf().await?;
                    continue;
                }
            };
            // A reader that knows the body's length asks for no end after
            // its last piece: the buffer goes here, or it would hold the
            // room the head was read into (4 KiB), or a large body's memory
            // it shares, for as long as the request lasts (a stream's).
            self.release_buffer();
            return Ok(piece);
        }
    }

    /// The rest of a body of declared length up to `max` bytes, in one
    /// piece: a large one read into one buffer sized for it and handed out
    /// as it is, where pieces would be copied together (a coding agent's
    /// request is tens of KiB); a small one copied out of the read buffer,
    /// which a slice of it would keep whole for as long as the request
    /// lasts (a passed-through stream's). Any other body, the next piece.
    pub async fn read_request_body_whole(&mut self, max: usize) -> Result<Option<Bytes>> {
        let Body::Length(left) = self.body else {
            return self.read_request_body().await;
        };
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        if left > max {
            return self.read_request_body().await;
        }
        self.buf
            .reserve((left + PAST_BODY).saturating_sub(self.buf.len()));
        while self.buf.len() < left {
            self.fill_buf().await?;
        }
        Ok(match self.read_request_body().await? {
            Some(piece) if piece.len() < BODY_READ => Some(Bytes::copy_from_slice(&piece)),
            piece => piece,
        })
    }

    /// Reads what the client sent next into the buffer.
    async fn fill_buf(&mut self) -> Result<()> {
        let read = fast_timeout(BODY_READ_TIMEOUT, self.stream.read_buf(&mut self.buf))
            .await
            .or_err(ErrorType::ReadTimedout, "reading the request body")?
            .or_err(ErrorType::ReadError, "reading the request body")?;
        if read == 0 {
            return Error::e_explain(ErrorType::ConnectionClosed, "the body ended early");
        }
        Ok(())
    }

    /// Once the body is read and nothing of a next request waits: the
    /// buffer's memory goes, so an open stream does not hold it.
    fn release_buffer(&mut self) {
        if self.body_done() && self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
    }

    /// How the request's body is delimited, until it is read.
    pub fn body(&self) -> &Body {
        &self.body
    }

    /// Whether the request's body was read to its end (or has none).
    pub fn body_done(&self) -> bool {
        self.body.done()
    }

    /// `100 Continue`, to a client waiting for it before it sends the body
    /// (never to an HTTP/1.0 one: RFC 9110 §10.1.1).
    pub async fn write_continue_response(&mut self) -> Result<()> {
        if self.header.version == Version::HTTP_10 {
            return Ok(());
        }
        self.send(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        self.flush().await
    }

    /// The response head that was sent.
    pub fn response_written(&self) -> Option<Answered> {
        self.response
    }

    /// The response head of `status` and `fields` in HTTP/1.1's wire
    /// format, to [`send_head`](Self::send_head) next: no map is built for
    /// it (an answer passed on goes out as it came).
    pub fn response_head<'f>(
        &mut self,
        status: StatusCode,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])> + Clone,
    ) -> Result<BytesMut> {
        if self.out != Out::NotStarted {
            return Error::e_explain(ErrorType::InternalError, "a response head was sent already");
        }
        // A body left unread would be taken for the next request; a server
        // shutting down closes the connection after this answer.
        if !self.body_done() || crate::shutdown::draining() {
            self.keep_alive = false;
        }
        let said = Said::of(fields.clone());
        self.out = frame_response(status, &said, &self.header, &mut self.keep_alive);
        let stamp = Stamp {
            request_id: self.header.headers.get(&request_id::HEADER),
            date: !said.date,
            keep_alive: self.keep_alive,
            coded: matches!(self.out, Out::Length | Out::Chunked),
            sized: !(status == StatusCode::NO_CONTENT || status.is_informational()),
        };
        self.response = Some(Answered {
            status,
            event_stream: said.event_stream,
        });
        Ok(head_bytes(status, fields, said.size, &stamp))
    }

    /// Sends a head made by [`response_head`](Self::response_head); `end`:
    /// there is no body. A head without a `Content-Length` (an event
    /// stream) leaves at once, one with it with the body.
    pub async fn send_head(&mut self, head: BytesMut, end: bool) -> Result<()> {
        self.send(&head).await?;
        if end {
            self.end_body().await?;
            self.flush().await
        } else if self.out == Out::Length {
            Ok(())
        } else {
            self.flush().await
        }
    }

    /// Sends a piece of the response body; `end`: it is the last.
    pub async fn write_response_body(&mut self, body: Bytes, end: bool) -> Result<()> {
        match self.out {
            Out::Length | Out::Close => self.send(&body).await?,
            Out::Chunked if !body.is_empty() => {
                let mut size = [0u8; 18];
                let line = chunk_size_line(body.len(), &mut size);
                // One write: a chunk larger than the connection's buffer
                // leaves with what it holds, its CRLF included.
                let mut chunk = [
                    IoSlice::new(line),
                    IoSlice::new(&body),
                    IoSlice::new(b"\r\n"),
                ];
                self.send_vectored(&mut chunk).await?;
            }
            Out::Chunked | Out::Nothing => {}
            Out::NotStarted | Out::Ended => {
                return Error::e_explain(ErrorType::InternalError, "no response body to write")
            }
            Out::Broken => {
                return Error::e_explain(ErrorType::WriteError, "an earlier write failed")
            }
        }
        if end {
            self.end_body().await?;
        }
        self.flush().await
    }

    async fn end_body(&mut self) -> Result<()> {
        if self.out == Out::Chunked {
            self.send(b"0\r\n\r\n").await?;
        }
        if !matches!(self.out, Out::NotStarted | Out::Broken) {
            self.out = Out::Ended;
        }
        Ok(())
    }

    /// [`Watch::idle`].
    pub async fn idle(&mut self) -> Result<()> {
        self.head_and_watch().1.idle().await
    }

    /// Ends the response: its last chunk, and the flush; then [`finished`]
    /// says what became of the connection. In two steps, not one
    /// `finish(self)`: a session moved into that future was copied whole
    /// (456 bytes) twice a request, into memory that at a few hundred
    /// connections is no longer in cache.
    ///
    /// [`finished`]: Self::finished
    pub async fn end(&mut self) {
        let ended = match self.out {
            Out::Chunked => self.end_body().await.is_ok(),
            Out::Length | Out::Nothing | Out::Ended => true,
            // The close ends this body: its last bytes (an event stream's
            // last events, held to leave with the end) go before it.
            Out::Close => {
                let _ = self.flush().await;
                false
            }
            Out::NotStarted | Out::Broken => false,
        };
        let whole = ended && self.flush().await.is_ok();
        // Anything but a whole response leaves the connection to close.
        self.out = if whole { Out::Ended } else { Out::Close };
    }

    /// The connection after [`end`](Self::end): for another request if it
    /// can take one, or with the request's body left unread.
    #[inline]
    pub fn finished(self) -> Finished {
        match (self.out == Out::Ended, self.body_done()) {
            (true, true) if self.keep_alive => Finished::Reusable(self.stream, self.buf),
            (true, false) => Finished::Unread(self.stream),
            _ => Finished::Closed,
        }
    }

    /// The connection and the request as it arrived, for pingora's proxy
    /// path to parse again (the head, and what of the body was read).
    pub fn into_passed_on(self) -> (Stream, BytesMut) {
        let request = as_sent(&self.raw, &self.buf);
        (self.stream, request)
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        let outcome = self.stream.write_all(bytes).await;
        self.written(outcome)
    }

    async fn send_vectored(&mut self, mut bufs: &mut [IoSlice<'_>]) -> Result<()> {
        while !bufs.is_empty() {
            let outcome = self.stream.write_vectored(bufs).await;
            let sent = self.written(outcome)?;
            if sent == 0 {
                return Error::e_explain(ErrorType::WriteError, "the connection takes no more");
            }
            IoSlice::advance_slices(&mut bufs, sent);
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        let outcome = self.stream.flush().await;
        self.written(outcome)
    }

    /// A write's outcome; the response is [`Out::Broken`] unless it was
    /// done (a write the client took nothing of within
    /// `limits.send_timeout_ms` fails: `WriteBuffer`).
    fn written<T>(&mut self, outcome: std::io::Result<T>) -> Result<T> {
        let result = outcome.or_err(ErrorType::WriteError, "writing the response");
        if result.is_err() {
            self.out = Out::Broken;
        }
        result
    }
}

/// Answers a request that cannot be served with `status` and a JSON `body`,
/// the connection to close after it.
pub async fn refuse(stream: &mut Stream, status: u16, body: &[u8]) -> Result<()> {
    let status = StatusCode::from_u16(status).or_err(ErrorType::InternalError, "status")?;
    let mut length = itoa::Buffer::new();
    let fields = [
        (&b"content-type"[..], &b"application/json"[..]),
        (b"content-length", length.format(body.len()).as_bytes()),
    ];
    let stamp = Stamp {
        request_id: None,
        date: true,
        keep_alive: false,
        coded: true,
        sized: true,
    };
    let size = Said::of(fields.into_iter()).size;
    let head = head_bytes(status, fields.into_iter(), size, &stamp);
    for bytes in [&head[..], body] {
        stream
            .write_all(bytes)
            .await
            .or_err(ErrorType::WriteError, "writing the response")?;
    }
    stream
        .flush()
        .await
        .or_err(ErrorType::WriteError, "writing the response")
}

/// A chunk's size line (`{len:x}\r\n`) in `buf`.
fn chunk_size_line(len: usize, buf: &mut [u8; 18]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut at = 16;
    let mut left = len;
    loop {
        at -= 1;
        buf[at] = HEX[left & 15];
        left >>= 4;
        if left == 0 {
            break;
        }
    }
    buf[16] = b'\r';
    buf[17] = b'\n';
    &buf[at..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};

    fn parsed(wire: &str) -> Result<(Head, BytesMut), Malformed> {
        let mut buf = BytesMut::from(wire);
        parse(&mut buf).map(|head| (head, buf))
    }

    fn field<'h>(head: &'h Head, name: &str) -> Option<&'h str> {
        head.header.headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn a_head_is_taken_off_what_follows_it() {
        let (head, rest) = parsed(
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-Custom: v\r\nContent-Length: 4\r\n\r\nbodyGET / HTTP/1.1\r\n",
        )
        .unwrap();
        assert_eq!(head.header.method, Method::POST);
        assert_eq!(head.header.uri.path(), "/v1/chat/completions");
        assert_eq!(head.header.uri.query(), Some("x=1"));
        assert_eq!(field(&head, "x-custom"), Some("v"));
        assert_eq!(head.body, Body::Length(4));
        assert!(head.keep_alive);
        assert_eq!(&rest[..], b"bodyGET / HTTP/1.1\r\n");
    }

    #[test]
    fn whether_the_connection_stays_open() {
        let keep = |wire: &str| parsed(wire).unwrap().0.keep_alive;
        assert!(keep("GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(!keep(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        ));
        assert!(!keep("GET / HTTP/1.0\r\n\r\n"));
        assert!(keep("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    }

    #[test]
    fn framing_that_could_smuggle_a_request_is_refused_or_defused() {
        // Both: the coding wins, the length goes, and so does the connection.
        let (head, _) = parsed(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
        assert_eq!(head.body, Body::Chunked(Chunk::Size));
        assert_eq!(field(&head, "content-length"), None);
        assert!(!head.keep_alive);
        // Identical lengths are one (RFC 9110 §8.6).
        let (head, _) = parsed(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3, 3\r\n\r\n",
        )
        .unwrap();
        assert_eq!(head.body, Body::Length(3));
        for wire in [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET http://evil.example/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
        ] {
            assert!(parsed(wire).is_err(), "{wire:?}");
        }
        // The final coding frames the body; one the proxy cannot undo is a
        // 501 (RFC 9112 §6.1), not a body passed on as if it were plain.
        let (head, _) =
            parsed("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(head.body, Body::Chunked(Chunk::Size));
        for coding in ["gzip, chunked", "gzip\r\nTransfer-Encoding: chunked"] {
            let wire = format!("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {coding}\r\n\r\n");
            assert_eq!(parsed(&wire).unwrap_err().status, 501, "{coding}");
        }
    }

    #[test]
    fn a_route_s_target_made_once_is_the_target_parsed() {
        for target in [
            "/v1/chat/completions",
            "/v1/chat/completions?x=1",
            "/v1/chat/completionsx",
            "/healthz",
            "/v1/models/a",
        ] {
            let wire = format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n");
            let (head, _) = parsed(&wire).unwrap();
            let mut expected = RequestHeader::build("GET", b"/", None).unwrap();
            expected.set_raw_path(target.as_bytes()).unwrap();
            assert_eq!(head.header.uri, expected.uri, "{target}");
            assert_eq!(head.header.raw_path(), target.as_bytes(), "{target}");
        }
        assert!(known_target(b"/v1/responses").is_some());
        assert!(known_target(b"/v1/responses?stream=true").is_none());
    }

    #[test]
    fn a_target_httparse_refuses_is_escaped_as_pingora_does() {
        let (head, rest) = parsed("GET /a b\"c<d> HTTP/1.1\r\nHost: a\r\n\r\nnext").unwrap();
        assert_eq!(head.header.uri.path(), "/a%20b%22c%3Cd%3E");
        assert_eq!(&rest[..], b"next");
        assert_eq!(
            escape_target(b"GET /plain HTTP/1.1\r\n\r\n"),
            None,
            "nothing to escape"
        );
        for wire in [
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/9.9\r\n\r\n",
            "GET /\r\n\r\n",
        ] {
            assert_eq!(parsed(wire).err(), Some(MALFORMED), "{wire:?}");
        }
    }

    #[test]
    fn too_many_fields_or_too_long_a_head_are_refused() {
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            (0..300)
                .map(|i| format!("X-{i}: v\r\n"))
                .collect::<String>()
        );
        let refused = parsed(&many).unwrap_err();
        assert!(refused.why.contains("256") && refused.status == 400);
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let refused = parsed(&long).unwrap_err();
        assert!(refused.why.contains("1 MiB") && refused.status == 431);
    }

    #[test]
    fn a_target_longer_than_a_uri_may_be_is_a_414() {
        let at_most = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET - 1));
        assert_eq!(
            parsed(&at_most).unwrap().0.header.uri.path().len(),
            MAX_TARGET
        );
        let longer = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET));
        assert_eq!(parsed(&longer).unwrap_err().status, 414);
    }

    #[test]
    fn a_chunk_size_line_is_lower_hex() {
        let mut buf = [0; 18];
        assert_eq!(chunk_size_line(0, &mut buf), b"0\r\n");
        assert_eq!(chunk_size_line(255, &mut buf), b"ff\r\n");
        assert_eq!(chunk_size_line(0x1234abcd, &mut buf), b"1234abcd\r\n");
    }

    /// A session on one end of an in-memory connection; the test is the client.
    fn session(wire: &str) -> (Session, DuplexStream) {
        let (ours, client) = duplex(1 << 20);
        let mut buf = BytesMut::from(wire);
        let head = parse(&mut buf).unwrap();
        (Session::new(Box::new(ours), head, buf), client)
    }

    /// The session's response ended, and what became of the connection.
    async fn finish(mut session: Session) -> Finished {
        session.end().await;
        session.finished()
    }

    /// What the client read (header names lower-cased), and whether the
    /// connection could serve another request.
    async fn response(session: Session, mut client: DuplexStream) -> (String, bool) {
        let reusable = matches!(finish(session).await, Finished::Reusable(..));
        client.shutdown().await.unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).await.unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        (
            format!("{}\r\n\r\n{body}", head.to_ascii_lowercase()),
            reusable,
        )
    }

    /// Writes a 200 head of `fields`; `end`: no body follows.
    async fn write_head(s: &mut Session, fields: &[(&str, &str)], end: bool) {
        let fields = fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        let head = s.response_head(StatusCode::OK, fields).unwrap();
        s.send_head(head, end).await.unwrap();
    }

    /// The client's view of `{}` answered to `request` with a length.
    async fn json_reply(request: &str) -> (String, bool) {
        let (mut s, client) = session(request);
        write_head(&mut s, &[("content-length", "2")], false).await;
        s.write_response_body(Bytes::from_static(b"{}"), true)
            .await
            .unwrap();
        assert_eq!(s.response_written().unwrap().status, 200);
        response(s, client).await
    }

    /// The client's view of one event streamed to `request` (and an empty
    /// write, which sends nothing).
    async fn one_event(request: &str) -> (String, bool) {
        let (mut s, client) = session(request);
        write_head(&mut s, &[("transfer-encoding", "chunked")], false).await;
        s.write_response_body(Bytes::from_static(b"data: 1\n\n"), false)
            .await
            .unwrap();
        s.write_response_body(Bytes::new(), false).await.unwrap();
        response(s, client).await
    }

    #[tokio::test]
    async fn a_response_with_a_length_is_sent_as_it_is() {
        let (out, reusable) = json_reply("GET /x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(out.starts_with("http/1.1 200 ok\r\n"), "{out}");
        assert!(out.contains("connection: keep-alive\r\n"), "{out}");
        assert!(out.contains("date: "), "{out}");
        assert!(out.ends_with("\r\n\r\n{}"), "{out}");
        assert!(reusable);
    }

    #[tokio::test]
    async fn a_stream_is_chunked_and_ended_by_finish() {
        let (out, reusable) = one_event("GET /x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(
            out.ends_with("\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n"),
            "{out:?}"
        );
        assert!(reusable);
    }

    #[tokio::test]
    async fn an_http_1_0_client_gets_a_stream_delimited_by_the_close() {
        let (out, reusable) = one_event("GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").await;
        assert!(!out.contains("transfer-encoding"), "{out}");
        assert!(out.contains("connection: close\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\ndata: 1\n\n"), "{out:?}");
        assert!(!reusable);
    }

    #[tokio::test]
    async fn every_head_carries_the_request_id_and_an_upstream_s_date() {
        let (mut s, client) = session("GET /x HTTP/1.1\r\nHost: a\r\nX-Request-Id: ours\r\n\r\n");
        let fields = [
            ("content-length", "0"),
            ("x-request-id", "upstream's"),
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("connection", "keep-alive"),
        ];
        write_head(&mut s, &fields, true).await;
        let (out, _) = response(s, client).await;
        assert!(out.contains("x-request-id: ours\r\n"), "{out}");
        assert!(!out.contains("upstream's"), "{out}");
        assert_eq!(out.matches("date: ").count(), 1, "{out}");
        assert!(out.contains("date: sun, 06 nov 1994"), "{out}");
        assert_eq!(out.matches("connection: ").count(), 1, "{out}");
    }

    #[tokio::test]
    async fn a_head_request_gets_no_body() {
        let (out, reusable) = json_reply("HEAD / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(out.contains("content-length: 2\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "{out:?}");
        assert!(reusable);
    }

    #[tokio::test]
    async fn a_204_or_304_head_says_no_body_is_coming() {
        // As an upstream may send them, and as a passed-on answer without
        // a length gets a coding.
        let fields = [("content-length", "5"), ("transfer-encoding", "chunked")];
        for (status, length) in [(204, false), (304, true)] {
            let (mut s, client) = session("GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
            let named = fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
            let head = s
                .response_head(StatusCode::from_u16(status).unwrap(), named)
                .unwrap();
            s.send_head(head, false).await.unwrap();
            let (out, reusable) = response(s, client).await;
            assert!(!out.contains("transfer-encoding"), "{out}");
            assert_eq!(out.contains("content-length: 5\r\n"), length, "{out}");
            assert!(out.ends_with("\r\n\r\n"), "{out:?}");
            assert!(reusable, "{status}");
        }
    }

    #[tokio::test]
    async fn a_body_left_unread_closes_the_connection() {
        let (mut s, client) = session("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nab");
        write_head(&mut s, &[("content-length", "0")], true).await;
        let (out, reusable) = response(s, client).await;
        assert!(out.contains("connection: close\r\n"), "{out}");
        assert!(!reusable);
    }

    #[tokio::test]
    async fn the_next_request_read_with_this_one_is_handed_back() {
        let (mut s, client) = session(
            "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /next HTTP/1.1\r\n",
        );
        assert_eq!(s.read_request_body().await.unwrap().unwrap(), "abc");
        assert_eq!(s.read_request_body().await.unwrap(), None);
        write_head(&mut s, &[("content-length", "0")], true).await;
        let Finished::Reusable(_, read) = finish(s).await else {
            panic!("not reusable")
        };
        assert_eq!(&read[..], b"GET /next HTTP/1.1\r\n");
        drop(client);
    }

    #[tokio::test]
    async fn a_body_of_declared_length_is_read_whole_in_one_piece() {
        let (mut s, mut client) =
            session("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nab");
        tokio::spawn(async move {
            for piece in [&b"cde"[..], b"fgh", b"iGET /next"] {
                tokio::task::yield_now().await;
                client.write_all(piece).await.unwrap();
            }
            client
        });
        let whole = s.read_request_body_whole(9).await.unwrap().unwrap();
        assert_eq!(whole, "abcdefghi");
        assert_eq!(s.read_request_body_whole(9).await.unwrap(), None);

        // Longer than allowed: piece by piece, for the caller to refuse.
        let (mut s, _client) =
            session("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nab");
        assert_eq!(s.read_request_body_whole(8).await.unwrap().unwrap(), "ab");
    }

    #[tokio::test]
    async fn a_small_body_read_whole_leaves_no_read_buffer_behind() {
        // As a request arrives: its head and body in one read, into a
        // buffer with room to spare.
        let (ours, _client) = duplex(1 << 20);
        let mut buf = BytesMut::with_capacity(4096);
        buf.extend_from_slice(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc");
        let head = parse(&mut buf).unwrap();
        let mut s = Session::new(Box::new(ours), head, buf);
        let whole = s.read_request_body_whole(1024).await.unwrap().unwrap();
        assert_eq!(whole, "abc");
        // A stream lasts minutes: neither the body nor the session keeps
        // the read's room.
        assert!(whole.is_unique());
        assert_eq!(s.buf.capacity(), 0);

        // Bytes of a next request read with it stay.
        let (mut s, _client) =
            session("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /");
        assert_eq!(
            s.read_request_body_whole(1024).await.unwrap().unwrap(),
            "abc"
        );
        assert_eq!(&s.buf[..], b"GET /");
    }

    #[tokio::test]
    async fn a_large_body_read_whole_is_the_only_holder_of_its_memory() {
        let body = "x".repeat(BODY_READ);
        let (mut s, _client) = session(&format!(
            "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: {BODY_READ}\r\n\r\n{body}"
        ));
        let whole = s.read_request_body_whole(BODY_READ).await.unwrap().unwrap();
        assert_eq!(whole, body);
        // Dropping it frees it: an agent lets a coding agent's request go
        // once decoded, while its stream lasts.
        assert!(whole.is_unique());
        assert_eq!(s.buf.capacity(), 0);
    }

    #[tokio::test]
    async fn idle_sees_the_client_leave_or_its_next_request_begin() {
        let (mut s, mut client) = session("GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
        client.write_all(b"GET /next").await.unwrap();
        s.idle().await.unwrap();
        write_head(&mut s, &[("content-length", "0")], true).await;
        let Finished::Reusable(_, read) = finish(s).await else {
            panic!("not reusable")
        };
        assert_eq!(
            &read[..],
            b"G",
            "one byte taken, the rest left in the socket"
        );

        let (mut s, client) = session("GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
        drop(client);
        assert!(s.idle().await.is_err());
    }

    /// Reads a request's whole body, its bytes arriving in `pieces`.
    async fn body_in_pieces(head: &str, body: &[u8], cuts: &[usize]) -> Result<Vec<u8>> {
        let (mut s, mut client) = session(head);
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        points.push(body.len());
        points.sort_unstable();
        let wire = body.to_vec();
        // The client closes after its last piece.
        tokio::spawn(async move {
            let mut fed = 0;
            for end in points {
                let _ = client.write_all(&wire[fed.min(end)..end]).await;
                fed = fed.max(end);
                tokio::task::yield_now().await;
            }
        });
        let mut read = Vec::new();
        while let Some(piece) = s.read_request_body().await? {
            read.extend_from_slice(&piece);
        }
        Ok(read)
    }

    proptest! {
        #[test]
        fn any_cutting_of_a_chunked_body_reads_the_same(
            pieces in proptest::collection::vec("[a-z]{1,40}", 1..8),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            let mut wire = String::new();
            for piece in &pieces {
                wire.push_str(&format!("{:x};ext=1\r\n{piece}\r\n", piece.len()));
            }
            wire.push_str("0\r\nTrailer: x\r\n\r\n");
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let read = runtime.block_on(body_in_pieces(
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                wire.as_bytes(),
                &cuts,
            ));
            prop_assert_eq!(read.unwrap(), pieces.concat().into_bytes());
        }
    }

    #[tokio::test]
    async fn a_body_that_ends_early_or_breaks_its_chunks_is_an_error() {
        let head = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n";
        assert!(body_in_pieces(head, b"short", &[]).await.is_err());
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(body_in_pieces(head, b"3\r\nabcX0\r\n\r\n", &[])
            .await
            .is_err());
        assert!(body_in_pieces(head, b"zz\r\n", &[]).await.is_err());
    }
}

//! HTTP/1.1 framing both sides share (RFC 9112): how a message body is
//! delimited and decoded, and the field-value tokens that decide it. Pure:
//! functions of the bytes read so far. The upstream side reads responses
//! with it ([`crate::http_client`]), the client side requests
//! ([`crate::service`]).

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::{Error, ErrorType, Result};

mod names;
pub use names::field_name;

/// Asks a buffering proxy in front of us (nginx) to pass an event stream
/// on as it comes. A name, not a string: a lookup by a string parses it.
pub const X_ACCEL_BUFFERING: http::HeaderName = http::HeaderName::from_static(X_ACCEL);
/// [`X_ACCEL_BUFFERING`]'s name, as a head's field is written.
pub const X_ACCEL: &str = "x-accel-buffering";

/// The longest chunk-size line (size and extensions) accepted.
pub const MAX_CHUNK_LINE: usize = 4096;
/// The most trailer bytes accepted after the last chunk.
const MAX_TRAILERS: usize = 64 * 1024;

/// A chunked body that breaks its framing.
const BAD_CHUNK: ErrorType = ErrorType::Custom("InvalidChunk");

/// A head's header fields in order, as bytes: a received head's are slices
/// of one copy of it. An answer passed on as it came is written from them
/// with no map built and no name hashed (a map cost about 1.7k instructions
/// of a passthrough request, a twentieth of it). Names are matched without
/// regard to case, as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    raw: Bytes,
    /// Each field's name and value, as offsets into `raw`.
    spans: Vec<[u32; 4]>,
}

impl Fields {
    /// The fields httparse found in `buf`, of which `raw` is a copy of the
    /// start. `None` if a field is not in it, or its value was folded over
    /// lines (`obs-fold`, which httparse may accept): a line end is the one
    /// byte httparse lets into a value that no header value may hold.
    pub fn parse(raw: Bytes, buf: &[u8], fields: &[httparse::Header]) -> Option<Fields> {
        let span = |part: &[u8]| -> Option<[u32; 2]> {
            let span = span(buf, part, raw.len())?;
            Some([
                u32::try_from(span.start).ok()?,
                u32::try_from(span.end).ok()?,
            ])
        };
        let mut spans = Vec::with_capacity(fields.len());
        for field in fields {
            if memchr::memchr2(b'\r', b'\n', field.value).is_some() {
                return None;
            }
            let [name_at, name_end] = span(field.name.as_bytes())?;
            let [value_at, value_end] = span(field.value)?;
            spans.push([name_at, name_end, value_at, value_end]);
        }
        Some(Fields { raw, spans })
    }

    /// The fields of a map (an HTTP/2 answer's), names in lower case.
    pub fn from_map(map: &HeaderMap) -> Fields {
        let mut raw = Vec::new();
        let mut spans = Vec::with_capacity(map.len());
        let mut put = |bytes: &[u8]| {
            let at = raw.len();
            raw.extend_from_slice(bytes);
            // A head is far smaller than 4 GiB: pingora caps it.
            [at as u32, raw.len() as u32]
        };
        for (name, value) in map.iter().map(field_bytes) {
            let [name_at, name_end] = put(name);
            let [value_at, value_end] = put(value);
            spans.push([name_at, name_end, value_at, value_end]);
        }
        Fields {
            raw: raw.into(),
            spans,
        }
    }

    /// Each field's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        let raw = &self.raw[..];
        self.spans
            .iter()
            .map(move |&[name_at, name_end, value_at, value_end]| {
                (
                    &raw[name_at as usize..name_end as usize],
                    &raw[value_at as usize..value_end as usize],
                )
            })
    }

    /// The first value of `name`.
    pub fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        let name = name.as_str().as_bytes();
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    }

    /// The first value of `name`, as a header value sharing these bytes.
    pub fn value(&self, name: &HeaderName) -> Option<HeaderValue> {
        let value = self.raw.slice_ref(self.get(name)?);
        HeaderValue::from_maybe_shared(value).ok()
    }

    /// Removes every field of `name`.
    pub fn remove(&mut self, name: &HeaderName) {
        let name = name.as_str().as_bytes();
        let raw = &self.raw;
        self.spans.retain(|&[name_at, name_end, ..]| {
            !raw[name_at as usize..name_end as usize].eq_ignore_ascii_case(name)
        });
    }
}

/// Whether the field name `name` (a token: httparse's, or a map's) is
/// `known`, a name of lower-case letters, digits and `-`, in any case.
/// Setting bit 5 lowers a letter and leaves these digits and `-` as they
/// are, and no other token byte becomes one of them: one pass with no
/// branch per byte, where `eq_ignore_ascii_case` lowers both sides byte by
/// byte (a forwarded answer's fields are matched against a dozen names).
#[inline]
pub fn is_name(name: &[u8], known: &[u8]) -> bool {
    name.len() == known.len()
        && name.iter().zip(known).fold(0, |differ, (&byte, &lower)| {
            differ | ((byte | 0x20) ^ lower)
        }) == 0
}

/// The field names `Connection` fields list (RFC 9110 §7.6.1): fields for
/// this hop alone, which a proxy does not pass on. Its own options (`close`,
/// `keep-alive`) are left out of the list, so the common head (none, or
/// `keep-alive`) allocates nothing.
#[derive(Debug, Default)]
pub struct ConnectionListed<'a>(Vec<&'a [u8]>);

impl<'a> ConnectionListed<'a> {
    /// The names the `Connection` fields of `headers` list.
    pub fn of(headers: &'a HeaderMap) -> Self {
        let mut listed = ConnectionListed::default();
        for value in headers.get_all(http::header::CONNECTION) {
            listed.add(value.as_bytes());
        }
        listed
    }

    /// The names in `value`, one `Connection` field's value.
    pub fn add(&mut self, value: &'a [u8]) {
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            if !token.is_empty() && !is_name(token, b"close") && !is_name(token, b"keep-alive") {
                self.0.push(token);
            }
        }
    }

    /// Whether the field `name` is listed, in any case.
    pub fn names(&self, name: &[u8]) -> bool {
        self.0
            .iter()
            .any(|listed| listed.eq_ignore_ascii_case(name))
    }
}

/// Whether a `Content-Type` value is an event stream's.
pub fn is_event_stream(content_type: &[u8]) -> bool {
    content_type.starts_with(b"text/event-stream")
}

/// A map's field as the bytes [`Fields`] hold.
pub fn field_bytes<'a>((name, value): (&'a HeaderName, &'a HeaderValue)) -> (&'a [u8], &'a [u8]) {
    (name.as_str().as_bytes(), value.as_bytes())
}

/// `part`, a slice of `buf` (as httparse returns them), out of `copy`, a
/// copy of `buf`'s start.
pub fn same_bytes(copy: &Bytes, buf: &[u8], part: &[u8]) -> Option<Bytes> {
    Some(copy.slice(span(buf, part, copy.len())?))
}

/// Where `part`, a slice of `buf`, lies in it, if within its first `len`
/// bytes.
fn span(buf: &[u8], part: &[u8], len: usize) -> Option<std::ops::Range<usize>> {
    let at = (part.as_ptr() as usize).checked_sub(buf.as_ptr() as usize)?;
    let end = at.checked_add(part.len()).filter(|end| *end <= len)?;
    Some(at..end)
}

/// The last comma-separated token of a field value, trimmed.
fn last_token(value: &[u8]) -> &[u8] {
    value
        .rsplit(|b| *b == b',')
        .next()
        .unwrap_or_default()
        .trim_ascii()
}

/// Whether a `Transfer-Encoding` value's final coding is `chunked`, the
/// one that frames a body (RFC 9112 §6.3).
pub fn is_chunked(coding: &[u8]) -> bool {
    last_token(coding).eq_ignore_ascii_case(b"chunked")
}

pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Where a body's decoding is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// The bytes left of a body of known length.
    Length(u64),
    Chunked(Chunk),
    /// Until the server closes the connection.
    Close,
    /// Read to its end.
    Done,
}

/// Where a chunked body's decoding is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk, this many bytes left.
    Data(u64),
    /// Before the CRLF that ends a chunk's data.
    DataEnd,
    /// After the last chunk: trailer fields up to an empty line.
    Trailers,
}

/// What [`Body::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The next piece of the body.
    Data(Bytes),
    /// Nothing until more bytes arrive.
    NeedMore,
    /// The body's end.
    End,
}

impl Body {
    /// Whether all of it was read (none is a length of 0).
    pub fn done(&self) -> bool {
        matches!(self, Body::Done | Body::Length(0))
    }

    /// Takes the next piece of the body (or framing) off the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded> {
        loop {
            match self {
                Body::Done | Body::Length(0) => {
                    *self = Body::Done;
                    return Ok(Decoded::End);
                }
                Body::Length(left) => return Ok(take(buf, left)),
                Body::Close if buf.is_empty() => return Ok(Decoded::NeedMore),
                Body::Close => return Ok(Decoded::Data(buf.split().freeze())),
                Body::Chunked(Chunk::Data(left)) => {
                    let taken = take(buf, left);
                    if *left == 0 {
                        *self = Body::Chunked(Chunk::DataEnd);
                    }
                    return Ok(taken);
                }
                Body::Chunked(Chunk::Size) => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((len, size))) => {
                        buf.advance(len);
                        *self = Body::Chunked(match size {
                            0 => Chunk::Trailers,
                            n => Chunk::Data(n),
                        });
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_CHUNK_LINE => {
                        return Ok(Decoded::NeedMore)
                    }
                    _ => return Error::e_explain(BAD_CHUNK, "chunk size line"),
                },
                Body::Chunked(Chunk::DataEnd) => match buf.get(..2) {
                    Some(b"\r\n") => {
                        buf.advance(2);
                        *self = Body::Chunked(Chunk::Size);
                    }
                    None if buf.first().is_none_or(|b| *b == b'\r') => {
                        return Ok(Decoded::NeedMore)
                    }
                    _ => return Error::e_explain(BAD_CHUNK, "chunk without CRLF"),
                },
                Body::Chunked(Chunk::Trailers) => {
                    // No trailer fields (the usual case), or up to the empty line.
                    let end = if buf.starts_with(b"\r\n") {
                        Some(2)
                    } else {
                        find(buf, b"\r\n\r\n").map(|at| at + 4)
                    };
                    match end {
                        Some(end) => {
                            buf.advance(end);
                            *self = Body::Done;
                        }
                        None if buf.len() <= MAX_TRAILERS => return Ok(Decoded::NeedMore),
                        None => return Error::e_explain(BAD_CHUNK, "trailers"),
                    }
                }
            }
        }
    }

    /// The server closed the connection: the end of a body that runs to
    /// the close, an error for any other.
    pub fn closed(&mut self) -> Result<()> {
        match self {
            Body::Close | Body::Done => {
                *self = Body::Done;
                Ok(())
            }
            _ => Error::e_explain(ErrorType::ConnectionClosed, "the body ended early"),
        }
    }
}

/// Up to `left` bytes off the front of `buf`.
fn take(buf: &mut BytesMut, left: &mut u64) -> Decoded {
    if buf.is_empty() {
        return Decoded::NeedMore;
    }
    let n = usize::try_from(*left).map_or(buf.len(), |left| left.min(buf.len()));
    *left -= n as u64;
    Decoded::Data(buf.split_to(n).freeze())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_lists_the_fields_of_this_hop_but_not_its_own_options() {
        let connection = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(http::header::CONNECTION, HeaderValue::from_static(value));
            }
            headers
        };
        let headers = connection(&["keep-alive, X-Foo ,,close", "x-bar"]);
        let listed = ConnectionListed::of(&headers);
        assert!(listed.names(b"x-foo") && listed.names(b"X-BAR"));
        assert!(!listed.names(b"keep-alive") && !listed.names(b"close"));
        assert!(!listed.names(b"x-baz") && !listed.names(b""));
        assert!(
            ConnectionListed::of(&connection(&["Keep-Alive", " close "]))
                .0
                .is_empty()
        );
    }

    #[test]
    fn a_known_name_matches_in_any_case_as_lower_casing_does() {
        // Every token byte (RFC 9110 §5.6.2) against every byte a known
        // name is made of: bit 5 matches exactly where lower-casing does.
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        let known = (b'a'..=b'z').chain(b'0'..=b'9').chain([b'-']);
        for lower in known {
            for byte in (0..=255).filter(|&b| token(b)) {
                let want = byte.to_ascii_lowercase() == lower;
                assert_eq!(is_name(&[byte], &[lower]), want, "{byte:#x} {lower:#x}");
            }
        }
        assert!(is_name(b"Content-Length", b"content-length"));
        assert!(is_name(b"X-ACCEL-BUFFERING", b"x-accel-buffering"));
        assert!(!is_name(b"content-lengtH2", b"content-length"));
        assert!(!is_name(b"content-type", b"content-length"));
    }

    #[test]
    fn fields_keep_order_and_case_and_match_names_in_any_case() {
        let mut map = HeaderMap::new();
        map.append("set-cookie", HeaderValue::from_static("a=1"));
        map.append("set-cookie", HeaderValue::from_static("b=2"));
        map.insert("content-length", HeaderValue::from_static("3"));
        let mut fields = Fields::from_map(&map);
        let listed: Vec<_> = fields.iter().collect();
        assert_eq!(
            listed,
            [
                (&b"set-cookie"[..], &b"a=1"[..]),
                (b"set-cookie", b"b=2"),
                (b"content-length", b"3"),
            ]
        );
        assert_eq!(fields.value(&http::header::SET_COOKIE).unwrap(), "a=1");
        fields.remove(&http::header::SET_COOKIE);
        assert_eq!(fields.iter().count(), 1);
        assert_eq!(fields.get(&http::header::CONTENT_LENGTH), Some(&b"3"[..]));
    }
}

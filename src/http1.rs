//! HTTP/1.1 framing both sides share (RFC 9112): how a message body is
//! delimited and decoded, and the field-value tokens that decide it. Pure:
//! functions of the bytes read so far. The upstream side reads responses
//! with it ([`crate::http_client`]), the client side requests
//! ([`crate::service`]).

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use pingora::http::ResponseHeader;
use pingora::{Error, ErrorType, Result};

/// Asks a buffering proxy in front of us (nginx) to pass an event stream
/// on as it comes. A name, not a string: a lookup by a string parses it.
pub const X_ACCEL_BUFFERING: http::HeaderName = http::HeaderName::from_static("x-accel-buffering");

/// The longest chunk-size line (size and extensions) accepted.
pub const MAX_CHUNK_LINE: usize = 4096;
/// The most trailer bytes accepted after the last chunk.
const MAX_TRAILERS: usize = 64 * 1024;

/// A chunked body that breaks its framing.
const BAD_CHUNK: ErrorType = ErrorType::Custom("InvalidChunk");

/// A response head of `status` and `fields`. Without pingora's case map,
/// which our HTTP/1 does not read (names go out as the map has them), the
/// fields go into `http`'s map itself: pingora's `insert_header` writes a
/// name out in title case and parses it again, for that map.
pub fn response_head(status: StatusCode, fields: HeaderMap) -> ResponseHeader {
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = status;
    parts.headers = fields;
    ResponseHeader::from(parts)
}

/// `part`, a slice of `buf` (as httparse returns them), out of `copy`, a
/// copy of `buf`'s start.
pub fn same_bytes(copy: &Bytes, buf: &[u8], part: &[u8]) -> Option<Bytes> {
    let at = (part.as_ptr() as usize).checked_sub(buf.as_ptr() as usize)?;
    let end = at
        .checked_add(part.len())
        .filter(|end| *end <= copy.len())?;
    Some(copy.slice(at..end))
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

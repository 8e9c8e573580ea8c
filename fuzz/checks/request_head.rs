//! A client's bytes to the client side's HTTP/1 parser (`service::h1`):
//! never panics, and what it accepts is framed one way only. A request
//! whose framing could be read two ways (a length beside a coding, lengths
//! that differ, a final coding other than `chunked`) is refused or
//! defused, so no byte of it can be taken for a next request by us and
//! for a body by pingora's proxy path, or the other way round.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::http1::{Body, Chunk};
use agent_proxy::service::h1::parse;
use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};

pub fn check(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let Ok(head) = parse(&mut buf) else {
        return;
    };
    // What follows the head is what followed it in the input: only the
    // request target may have been escaped.
    assert!(buf.len() <= data.len(), "the rest grew");
    assert!(data.ends_with(&buf), "the rest is not the input's tail");
    let headers = &head.header.headers;
    match head.body() {
        Body::Chunked(Chunk::Size) => {
            assert!(
                !headers.contains_key(CONTENT_LENGTH),
                "a length was kept beside a coding"
            );
            let last = headers.get_all(TRANSFER_ENCODING).iter().next_back();
            let last = last.map(|v| v.as_bytes().to_ascii_lowercase());
            assert!(
                last.is_some_and(|v| v.trim_ascii_end().ends_with(b"chunked")),
                "a body is chunked that does not say so last"
            );
        }
        Body::Length(n) => {
            assert!(
                !headers.contains_key(TRANSFER_ENCODING),
                "a coding was ignored"
            );
            for value in headers.get_all(CONTENT_LENGTH) {
                for token in value.as_bytes().split(|b| *b == b',') {
                    let token = std::str::from_utf8(token.trim_ascii()).expect("a number");
                    assert_eq!(token.parse::<u64>().ok(), Some(*n), "lengths differ");
                }
            }
            if headers.get(CONTENT_LENGTH).is_none() {
                assert_eq!(*n, 0, "a body without a length");
            }
        }
        other => panic!("a request body framed as {other:?}"),
    }
}

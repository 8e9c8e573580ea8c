//! A request as our client sends it: a method, a target and headers, in
//! order. HTTP/1 writes it out as it is, with no header map built (hashing
//! every name, a case map) only to be read back in order; HTTP/2, which is
//! pingora's, gets pingora's header made from it.
//!
//! The headers are borrowed from whoever sends: a request passed on carries
//! the client's twenty fields, and two copies of each (its name and value
//! counted up and down twice) were 7% of its instructions.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST};
use http::{HeaderName, HeaderValue, Method};
use pingora::http::RequestHeader;
use pingora::{Error, ErrorType, OrErr, Result};

pub struct Request<'h> {
    method: Method,
    /// The path and query, as the request line carries them.
    target: String,
    /// In the order they go out. `host` is the endpoint's unless set here;
    /// `content-length` is always the body's.
    headers: Vec<(&'h HeaderName, &'h HeaderValue)>,
}

/// `content-type`, to borrow.
pub static CONTENT_TYPE: HeaderName = http::header::CONTENT_TYPE;
/// `application/json`, to borrow.
pub static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The header edits a sender makes, on our request or on pingora's header
/// (the proxy path's): one rule serves both (an upstream's credentials).
pub trait EditHeaders<'h> {
    fn remove(&mut self, name: &HeaderName);
    /// Sets `name` to `value` alone.
    fn insert(&mut self, name: &'h HeaderName, value: &'h HeaderValue) -> Result<()>;
}

impl<'h> Request<'h> {
    /// Refused when `target` could not go on a request line as it is.
    pub fn new(method: &str, target: impl Into<String>) -> Result<Request<'h>> {
        let target = target.into();
        let method = Method::from_bytes(method.as_bytes())
            .or_err(ErrorType::InvalidHTTPHeader, "invalid request method")?;
        // RFC 9112 §3.2: the origin form, visible ASCII; and UTF-8, which
        // the `http` crate's URIs (so a client's path, passed on) take too.
        let writable = target.starts_with('/')
            && target
                .bytes()
                .all(|b| b.is_ascii_graphic() || !b.is_ascii());
        if !writable {
            return Error::e_explain(ErrorType::InvalidHTTPHeader, "request target not writable");
        }
        Ok(Request {
            method,
            target,
            headers: Vec::with_capacity(8),
        })
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Adds a header after those already there.
    pub fn append(&mut self, name: &'h HeaderName, value: &'h HeaderValue) {
        self.headers.push((name, value));
    }

    /// The HTTP/1.1 head: request line, `host`, the headers in order, and
    /// the body's length.
    pub(super) fn h1_head(&self, host: &str, body: Option<usize>) -> Bytes {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        let mut head = BytesMut::with_capacity(self.target.len() + host.len() + headers + 64);
        head.put_slice(self.method.as_str().as_bytes());
        head.put_u8(b' ');
        head.put_slice(self.target.as_bytes());
        head.put_slice(b" HTTP/1.1\r\n");
        if !self.has(&HOST) {
            put_header(&mut head, HOST.as_str(), host.as_bytes());
        }
        for (name, value) in self.sent_headers() {
            put_header(&mut head, name.as_str(), value.as_bytes());
        }
        if let Some(length) = body {
            put_header(
                &mut head,
                CONTENT_LENGTH.as_str(),
                itoa::Buffer::new().format(length).as_bytes(),
            );
        }
        head.put_slice(b"\r\n");
        head.freeze()
    }

    /// pingora's header of this request, for HTTP/2.
    pub(super) fn header(&self, host: &str, body: Option<usize>) -> Result<RequestHeader> {
        let mut req = RequestHeader::build_no_case(
            self.method.clone(),
            self.target.as_bytes(),
            Some(self.headers.len() + 2),
        )?;
        if !self.has(&HOST) {
            req.insert_header(HOST, host)?;
        }
        for (name, value) in self.sent_headers() {
            req.append_header((*name).clone(), (*value).clone())?;
        }
        if let Some(length) = body {
            req.insert_header(CONTENT_LENGTH, length)?;
        }
        Ok(req)
    }

    fn has(&self, name: &HeaderName) -> bool {
        self.headers.iter().any(|(n, _)| *n == name)
    }

    /// The headers to send: a `content-length` of the caller's is not.
    fn sent_headers(&self) -> impl Iterator<Item = &(&'h HeaderName, &'h HeaderValue)> {
        self.headers
            .iter()
            .filter(|(name, _)| *name != CONTENT_LENGTH)
    }
}

impl<'h> EditHeaders<'h> for Request<'h> {
    fn remove(&mut self, name: &HeaderName) {
        self.headers.retain(|(n, _)| *n != name);
    }

    fn insert(&mut self, name: &'h HeaderName, value: &'h HeaderValue) -> Result<()> {
        self.remove(name);
        self.append(name, value);
        Ok(())
    }
}

impl<'h> EditHeaders<'h> for RequestHeader {
    fn remove(&mut self, name: &HeaderName) {
        self.remove_header(name);
    }

    fn insert(&mut self, name: &'h HeaderName, value: &'h HeaderValue) -> Result<()> {
        self.insert_header(name.clone(), value.clone())
    }
}

fn put_header(head: &mut BytesMut, name: &str, value: &[u8]) {
    head.put_slice(name.as_bytes());
    head.put_slice(b": ");
    head.put_slice(value);
    head.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    static ID: HeaderName = HeaderName::from_static("x-request-id");
    static ABC: HeaderValue = HeaderValue::from_static("abc");
    static HOST: HeaderName = http::header::HOST;
    static CONTENT_LENGTH: HeaderName = http::header::CONTENT_LENGTH;
    static AUTHORIZATION: HeaderName = http::header::AUTHORIZATION;

    fn request() -> Request<'static> {
        let mut req = Request::new("POST", "/v1/chat/completions?x=1").unwrap();
        req.append(&CONTENT_TYPE, &JSON);
        req.append(&ID, &ABC);
        req
    }

    #[test]
    fn the_head_is_the_request_line_host_the_headers_in_order_and_the_length() {
        let head = request().h1_head("up:8080", Some(12));
        assert_eq!(
            &head[..],
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: up:8080\r\ncontent-type: application/json\r\nx-request-id: abc\r\ncontent-length: 12\r\n\r\n"
        );
        assert!(request()
            .h1_head("up", None)
            .ends_with(b"x-request-id: abc\r\n\r\n"));
    }

    #[test]
    fn a_host_of_the_senders_wins_and_a_length_of_theirs_is_not_sent() {
        let mut req = request();
        let host = HeaderValue::from_static("virtual.example");
        let length = HeaderValue::from_static("999");
        req.insert(&HOST, &host).unwrap();
        req.append(&CONTENT_LENGTH, &length);
        let head = req.h1_head("up:8080", Some(2));
        let text = std::str::from_utf8(&head).unwrap();
        assert!(text.contains("host: virtual.example\r\n"), "{text}");
        assert!(!text.contains("up:8080"), "{text}");
        assert!(!text.contains("999"), "{text}");
        let header = req.header("up:8080", Some(2)).unwrap();
        assert_eq!(header.headers[&HOST], "virtual.example");
        assert_eq!(header.headers[&CONTENT_LENGTH], "2");
    }

    #[test]
    fn insert_replaces_and_remove_drops_every_value_of_a_name() {
        let mut req = request();
        let auth = &AUTHORIZATION;
        let [a, b, c] = ["Bearer a", "Bearer b", "Bearer c"].map(HeaderValue::from_static);
        req.append(auth, &a);
        req.append(auth, &b);
        req.insert(auth, &c).unwrap();
        let head = req.h1_head("up", None);
        let text = std::str::from_utf8(&head).unwrap();
        assert_eq!(text.matches("authorization").count(), 1, "{text}");
        assert!(text.contains("authorization: Bearer c\r\n"));
        req.remove(auth);
        assert!(!std::str::from_utf8(&req.h1_head("up", None))
            .unwrap()
            .contains("authorization"));
    }

    #[test]
    fn a_target_that_cannot_go_on_a_request_line_is_refused() {
        for target in ["", "v1/models", "/a b", "/a\tb", "/a\r\nx: y"] {
            assert!(Request::new("GET", target).is_err(), "{target:?}");
        }
        for target in [
            "/v1/models?limit=2&after=x%20y",
            "/v1/files/é",
            "/q?f={\"a\":1}",
        ] {
            assert!(Request::new("GET", target).is_ok(), "{target:?}");
        }
        assert!(Request::new("BAD METHOD", "/").is_err());
    }
}

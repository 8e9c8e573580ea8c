//! `x-request-id`: kept when the client sent a sane one, generated otherwise;
//! passed to upstreams and HTTP tools and returned to the client.

use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

/// A name, not a string: a lookup by a string parses it first. A static,
/// to be borrowed by a request (`http_client::Request`).
pub static HEADER: HeaderName = HeaderName::from_static(NAME);
const NAME: &str = "x-request-id";

/// Makes sure `req` carries a request id and returns it. The id is stored in
/// the request header itself, so everything that forwards or answers the
/// request finds it there.
pub fn ensure(req: &mut RequestHeader) -> String {
    if let Some(id) = req
        .headers
        .get(&HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| is_sane(id))
    {
        return id.to_owned();
    }
    let mut hex = [0u8; 32];
    // 16 bytes fill 32 hex digits exactly: it cannot fail.
    let _ = hex::encode_to_slice(fastrand::u128(..).to_be_bytes(), &mut hex);
    let id = std::str::from_utf8(&hex).unwrap_or_default();
    // A hex string is always a valid header value. Named by a static
    // string: pingora copies a `HeaderName` it does not know into a
    // title-cased name, then parses that back.
    if let Ok(value) = HeaderValue::from_str(id) {
        let _ = req.insert_header(NAME, value);
    }
    id.to_owned()
}

fn is_sane(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_sane_id_and_replaces_others() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header(NAME, "abc-123").unwrap();
        assert_eq!(ensure(&mut req), "abc-123");
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header(NAME, "x".repeat(200)).unwrap();
        let id = ensure(&mut req);
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_eq!(req.headers[&HEADER], id.as_str(), "stored in the request");
    }
}

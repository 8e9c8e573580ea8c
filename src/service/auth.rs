//! Client authentication against `auth.api_keys`.

use pingora::http::RequestHeader;

use crate::config::Config;

/// The key a client presents: `Authorization: Bearer <key>` (OpenAI SDKs,
/// the anthropic Python SDK with a token) or `x-api-key` (Anthropic clients).
pub fn presented_key(req: &RequestHeader) -> Option<&[u8]> {
    req.headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .or_else(|| req.headers.get("x-api-key").map(|v| v.as_bytes()))
}

/// With no keys configured every client is allowed. Otherwise the request
/// needs one of them, by [`presented_key`].
pub fn allowed(config: &Config, req: &RequestHeader) -> bool {
    if config.api_keys.is_empty() {
        return true;
    }
    let Some(presented) = presented_key(req) else {
        return false;
    };
    // Check every key, so the time taken does not tell which one was close.
    config.api_keys.iter().fold(false, |found, key| {
        constant_time_eq(key.as_bytes(), presented) | found
    })
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}

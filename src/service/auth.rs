//! Client authentication against `auth.api_keys`.

use pingora::http::RequestHeader;

use crate::config::{ApiKey, Config};

const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// The key a client presents: `Authorization: Bearer <key>` (OpenAI SDKs,
/// the anthropic Python SDK with a token) or `x-api-key` (Anthropic clients).
pub fn presented_key(req: &RequestHeader) -> Option<&[u8]> {
    req.headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| bearer_token(v.as_bytes()))
        .or_else(|| req.headers.get(X_API_KEY).map(|v| v.as_bytes()))
}

/// The token of a `Bearer` credential. The scheme is case-insensitive
/// (RFC 9110 §11.1) and may be followed by more than one space.
fn bearer_token(credentials: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    let (scheme, token) = credentials.split_at_checked(SCHEME.len())?;
    scheme
        .eq_ignore_ascii_case(SCHEME)
        .then_some(token.trim_ascii())
}

/// Whom a request counts against in per-client limits: the configured key
/// it matched when auth is on. With auth off, `None`: any bearer is accepted
/// then, so one the client makes up must not buy it a fresh share (its
/// address counts instead).
pub fn limited_key<'r>(config: &Config, req: &'r RequestHeader) -> Option<&'r [u8]> {
    if config.api_keys.is_empty() {
        return None;
    }
    presented_key(req)
}

/// The client was not let in.
pub struct Refused;

/// With no keys configured every client is allowed (`Ok(None)`). Otherwise
/// the request needs one of them, by [`presented_key`]: the key it matched.
pub fn authenticate<'c>(
    config: &'c Config,
    req: &RequestHeader,
) -> Result<Option<&'c ApiKey>, Refused> {
    if config.api_keys.is_empty() {
        return Ok(None);
    }
    let presented = presented_key(req).ok_or(Refused)?;
    // Check every key, so the time taken does not tell which one was close.
    let matched = config.api_keys.iter().fold(None, |found, key| {
        let same = constant_time_eq(key.key.as_bytes(), presented);
        found.or(same.then_some(key))
    });
    matched.map(Some).ok_or(Refused)
}

/// Whether the request carries one of `auth.admin_keys` (there are some).
pub fn is_admin(config: &Config, req: &RequestHeader) -> bool {
    let Some(presented) = presented_key(req) else {
        return false;
    };
    config.admin_keys.iter().fold(false, |found, key| {
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
    fn the_bearer_scheme_is_case_insensitive_and_spaces_are_tolerated() {
        for credentials in ["Bearer sk-1", "bearer sk-1", "BEARER sk-1", "Bearer   sk-1"] {
            assert_eq!(
                bearer_token(credentials.as_bytes()),
                Some(&b"sk-1"[..]),
                "{credentials}"
            );
        }
        assert_eq!(bearer_token(b"Basic sk-1"), None);
        assert_eq!(bearer_token(b"Bearersk-1"), None);
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}

//! Who a request is for and which conversation it belongs to: the keys an
//! agent's memory is kept under, what tools get by `inject`, what the
//! request log shows.

use http::HeaderName;
use sha2::{Digest, Sha256};

/// Headers clients carry a conversation id in, the explicit one first:
/// `X-Session-Id`, Codex's, Claude Code's, the Agents SDK's, LibreChat's and
/// Open WebUI's (`ENABLE_FORWARD_USER_INFO_HEADERS`). Not `x-client-request-id`:
/// OpenAI's clients make a new one per request.
/// Names, not strings: a name compared with a string is spelled out and
/// compared without case, for each field of every request.
pub static HEADERS: [HeaderName; 6] = [
    HeaderName::from_static(HEADER_NAMES[0]),
    HeaderName::from_static(HEADER_NAMES[1]),
    HeaderName::from_static(HEADER_NAMES[2]),
    HeaderName::from_static(HEADER_NAMES[3]),
    HeaderName::from_static(HEADER_NAMES[4]),
    HeaderName::from_static(HEADER_NAMES[5]),
];

const HEADER_NAMES: [&str; 6] = [
    "x-session-id",
    "session-id",
    "x-claude-code-session-id",
    "thread-id",
    "x-librechat-conversation-id",
    "x-openwebui-chat-id",
];

/// The longest session id kept from a client.
pub const MAX_LEN: usize = 128;

/// The client's session id from `headers` (by [`HEADERS`]), at most
/// [`MAX_LEN`] characters ([`bounded`]).
pub fn from_headers(headers: &http::HeaderMap) -> Option<String> {
    // One pass over the request's headers, not a lookup (a hash of the
    // name) for each of ours: the first of HEADERS present wins. A coding
    // agent sends twenty: a name of none of our lengths is passed over
    // without a compare.
    let (_, value) = headers
        .iter()
        .filter(|(name, _)| LENGTHS & (1 << name.as_str().len().min(63)) != 0)
        .filter_map(|(name, value)| Some((HEADERS.iter().position(|h| name == h)?, value)))
        .min_by_key(|(rank, _)| *rank)?;
    let value = value.to_str().ok().filter(|v| !v.is_empty())?;
    Some(bounded(value))
}

/// `id` as it is when it has at most [`MAX_LEN`] characters; a longer one as
/// its beginning and a digest of the whole, so that two ids alike in their
/// first [`MAX_LEN`] characters stay two (cut, they were one: one user's
/// memory was another's).
pub fn bounded(id: &str) -> String {
    if id.chars().nth(MAX_LEN).is_none() {
        return id.to_owned();
    }
    let digest = Sha256::digest(id.as_bytes());
    let mut hex = [0u8; 32];
    // 16 bytes fill 32 hex digits exactly: it cannot fail.
    let _ = hex::encode_to_slice(&digest[..16], &mut hex);
    let mut out: String = id.chars().take(MAX_LEN - hex.len() - 1).collect();
    out.push('~');
    out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    out
}

/// A bit for the length of each of [`HEADERS`].
const LENGTHS: u64 = {
    let mut bits = 0u64;
    let mut i = 0;
    while i < HEADER_NAMES.len() {
        bits |= 1 << HEADER_NAMES[i].len();
        i += 1;
    }
    bits
};

/// Whom a request is for: the client key's tenant (`store::tenant_of`, set
/// by the operator, unforgeable) or, where the operator trusts it
/// (`auth.trust_user_field`), the request's `user` within that tenant. With
/// auth off and no trusted user, everyone is `anonymous`.
pub fn identity(tenant: &str, user: Option<&str>, trust_user_field: bool) -> String {
    let tenant = if tenant.is_empty() {
        "anonymous"
    } else {
        tenant
    };
    match user.filter(|u| trust_user_field && !u.is_empty()) {
        Some(user) => format!("{tenant}/user:{}", bounded(user)),
        None => tenant.to_owned(),
    }
}

/// A session id for a conversation whose client names none: the same for
/// every turn of it (each re-sends its beginning), apart for other agents,
/// users and conversations.
pub fn derive(agent: &str, identity: &str, first_user_message: &str) -> String {
    let mut hash = Sha256::new();
    for part in [agent, identity, first_user_message] {
        // Length-prefixed, so no two splits of the same bytes collide.
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut hex = [0u8; 24];
    // 12 bytes fill 24 hex digits exactly: it cannot fail.
    let _ = hex::encode_to_slice(&digest[..12], &mut hex);
    let mut id = String::with_capacity(5 + hex.len());
    id.push_str("sess_");
    id.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_explicit_header_wins_and_ids_are_bounded() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(from_headers(&headers), None);
        headers.insert("session-id", "codex-1".parse().unwrap());
        assert_eq!(from_headers(&headers).as_deref(), Some("codex-1"));
        headers.insert("x-session-id", "x".repeat(500).parse().unwrap());
        assert_eq!(from_headers(&headers).map(|s| s.len()), Some(MAX_LEN));
        // Whatever the order they came in.
        let mut headers = http::HeaderMap::new();
        headers.insert("x-openwebui-chat-id", "webui".parse().unwrap());
        headers.insert("thread-id", "sdk".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        assert_eq!(from_headers(&headers).as_deref(), Some("sdk"));
        // A name of a session header's length is not taken for it.
        let mut headers = http::HeaderMap::new();
        headers.insert("x-session-ix", "no".parse().unwrap());
        assert_eq!(from_headers(&headers), None);
        headers.insert("x-claude-code-session-id", "cc".parse().unwrap());
        assert_eq!(from_headers(&headers).as_deref(), Some("cc"));
    }

    #[test]
    fn a_user_field_counts_only_where_trusted_and_within_the_tenant() {
        assert_eq!(identity("name:acme", Some("bob"), false), "name:acme");
        assert_eq!(
            identity("name:acme", Some("bob"), true),
            "name:acme/user:bob"
        );
        assert_eq!(identity("", None, true), "anonymous");
        assert_eq!(identity("", Some(""), true), "anonymous");
        // Two long users alike in their first 128 characters stay two.
        let alice = format!("{}alice", "x".repeat(200));
        let mallory = format!("{}mallory", "x".repeat(200));
        let (a, m) = (
            identity("t", Some(&alice), true),
            identity("t", Some(&mallory), true),
        );
        assert_ne!(a, m);
        assert_eq!(a, identity("t", Some(&alice), true), "and each is stable");
        assert!(a.len() <= "t/user:".len() + MAX_LEN, "{a}");
    }

    #[test]
    fn a_long_id_is_bounded_without_becoming_another() {
        assert_eq!(bounded("short"), "short");
        let exact = "é".repeat(MAX_LEN);
        assert_eq!(
            bounded(&exact),
            exact,
            "128 characters are kept as they are"
        );
        let one = bounded(&format!("{}1", "é".repeat(MAX_LEN)));
        let two = bounded(&format!("{}2", "é".repeat(MAX_LEN)));
        assert_ne!(one, two);
        assert_eq!(one.chars().count(), MAX_LEN);
    }

    #[test]
    fn derived_sessions_are_stable_and_apart() {
        let one = derive("helper", "name:a", "hello");
        assert_eq!(one, derive("helper", "name:a", "hello"));
        // Every version derives the same: replicas mid-upgrade agree, and a
        // conversation keeps its memory across a restart.
        assert_eq!(one, "sess_a2e516f912273059d27afd43");
        assert_ne!(one, derive("helper", "name:b", "hello"));
        assert_ne!(one, derive("other", "name:a", "hello"));
        assert_ne!(derive("ab", "c", ""), derive("a", "bc", ""));
    }
}

//! Credentials a server echoes back are masked, byte for byte, before what
//! it said goes on: to a client, into a model's context, or into the log.
//! A server that answers "Incorrect API key provided: sk-…" or reflects the
//! headers it got must not show the operator's key to the client.

/// `text` with every copy of `secret` overwritten by `*`, the same length (a
/// body's framing holds); `None` when there is none, so the caller keeps
/// what it has without a copy.
pub fn masked(text: &[u8], secret: &[u8]) -> Option<Vec<u8>> {
    if secret.is_empty() {
        return None;
    }
    let finder = memchr::memmem::Finder::new(secret);
    let first = finder.find(text)?;
    let mut out = text.to_vec();
    let mut at = Some(first);
    while let Some(start) = at {
        out[start..start + secret.len()].fill(b'*');
        let from = start + secret.len();
        at = finder.find(&out[from..]).map(|next| from + next);
    }
    Some(out)
}

/// `text` with every copy of each of `secrets` masked (see [`masked`]).
pub fn masked_all(mut text: Vec<u8>, secrets: &[Box<[u8]>]) -> Vec<u8> {
    for secret in secrets {
        if let Some(masked) = masked(&text, secret) {
            text = masked;
        }
    }
    text
}

/// The credentials among configured name-value pairs (a request's header
/// fields, a child's environment): the whole value of one whose name says
/// it holds one (`Authorization`, `X-Api-Key`, `Cookie`, a token or a
/// secret), and the credential after its scheme (`Bearer sk-…`), which a
/// server may echo alone. Values shorter than 8 bytes are left: masking
/// them would garble ordinary text.
pub fn credentials<N: AsRef<str>, V: AsRef<[u8]>>(
    fields: impl IntoIterator<Item = (N, V)>,
) -> Vec<Box<[u8]>> {
    const NAMES: [&str; 6] = ["auth", "key", "token", "secret", "cookie", "password"];
    let mut secrets: Vec<Box<[u8]>> = Vec::new();
    for (name, value) in fields {
        let (name, value) = (name.as_ref().to_ascii_lowercase(), value.as_ref());
        if !NAMES.iter().any(|part| name.contains(part)) {
            continue;
        }
        let credential = value
            .iter()
            .position(|&b| b == b' ')
            .map_or(value, |space| value[space + 1..].trim_ascii_start());
        for secret in [value, credential] {
            if secret.len() >= 8 && !secrets.iter().any(|s| **s == *secret) {
                secrets.push(secret.into());
            }
        }
    }
    // The whole value first: masked first, it leaves no credential behind.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copy_is_masked_at_its_length() {
        let text = b"sk-1234 and sk-12345, not sk-123";
        assert_eq!(
            masked(text, b"sk-1234").unwrap(),
            b"******* and *******5, not sk-123"
        );
        assert_eq!(masked(text, b"sk-999"), None);
        assert_eq!(masked(text, b""), None);
    }

    #[test]
    fn credentials_are_the_values_of_fields_named_for_them() {
        let fields = [
            ("Authorization", &b"Bearer sk-weather-1"[..]),
            ("X-Api-Key", b"k-0123456789"),
            ("Accept", b"application/json"),
            ("X-Token", b"short"),
        ];
        let secrets = credentials(fields);
        let secrets: Vec<&[u8]> = secrets.iter().map(|s| &**s).collect();
        assert_eq!(
            secrets,
            [
                &b"Bearer sk-weather-1"[..],
                b"sk-weather-1",
                b"k-0123456789"
            ]
        );
    }
}

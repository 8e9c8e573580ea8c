//! `${VAR}` and `${VAR:-default}` expansion in config string values.

/// Expands every `${VAR}` / `${VAR:-default}` in `input` using `lookup`.
/// `$$` stands for a literal `$`. An unset variable without a default is an
/// error naming the variable.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    if !input.contains('$') {
        return Ok(input.to_owned());
    }
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated `${{` in {input:?}"))?;
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (expr, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("invalid variable name `{name}`"));
            }
            match (lookup(name), default) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(default)) => out.push_str(default),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set (write `${{{name}:-}}` to allow that)"
                    ))
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "KEY" => Some("sk-1".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_set_and_default() {
        assert_eq!(expand("Bearer ${KEY}", env).unwrap(), "Bearer sk-1");
        assert_eq!(expand("${MISSING:-x}-${KEY}", env).unwrap(), "x-sk-1");
        assert_eq!(expand("${MISSING:-}", env).unwrap(), "");
        assert_eq!(expand("${EMPTY:-d}", env).unwrap(), "");
        assert_eq!(
            expand("cost $5 and $$HOME", env).unwrap(),
            "cost $5 and $HOME"
        );
    }

    #[test]
    fn unset_without_default_is_an_error() {
        let err = expand("${MISSING}", env).unwrap_err();
        assert!(err.contains("MISSING"), "{err}");
        assert!(expand("${KEY", env).is_err());
        assert!(expand("${BAD NAME}", env).is_err());
    }
}

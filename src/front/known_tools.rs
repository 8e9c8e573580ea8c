//! The tool lists of recent requests, by their text: decoded, or checked
//! to be JSON. A coding agent sends the same tools with every request of a
//! session (Claude Code's: 32 KB of schemas and descriptions), and reading
//! them was a quarter of its request's instructions: each string scanned,
//! each schema checked to be JSON. A request whose `tools` begin with the
//! text of a list decoded before takes that list's decoding and moves past
//! its text; the body's shape pass, before it, adds the list's count of
//! values. A request for a model that is no agent is checked to be JSON
//! before it goes on as it came, and that check moves past a known list
//! too: lists it checked are kept for it, without a decoding.
//!
//! The text kept was a whole JSON array, checked, so the same bytes at the
//! same place read as the same value to the same end: a match skips
//! nothing the scanner would have refused. Only lists decoded or checked
//! without error are kept.
//!
//! Each thread keeps its own few (no lock on the request path), the last
//! used kept longest. Bounded: 4 lists per thread of at most 128 KiB of
//! text each; lists under 1 KiB are read again, cheaper than kept.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::budget::Hit;
use crate::conversation::{Dialect, FunctionTool};

/// Lists kept per thread.
const KEPT: usize = 4;
/// A list's text, at least, to be kept.
const SMALLEST: usize = 1024;
/// A list's text, at most, to be kept.
const LARGEST: usize = 128 * 1024;

/// A request's tools as a front decoded them, with what decoding them
/// learned.
#[derive(Debug, Default)]
pub struct Declared {
    pub tools: Vec<Arc<FunctionTool>>,
    /// Types of the hosted tools dropped (the upstream cannot run them).
    pub dropped: Vec<String>,
    /// Responses' namespaced functions.
    pub namespaced: Namespaced,
}

/// Flattened function name (`<namespace>__<name>`) → (namespace, name as
/// the client declared it), shared by the requests declaring them.
pub type Namespaced = Arc<HashMap<String, (String, String)>>;

struct Known {
    text: Box<str>,
    /// The values in it, as the body's shape pass counts them.
    values: usize,
    /// What a front's decoder made of it; `None` for a list only checked.
    decoded: Option<(Dialect, Arc<Declared>)>,
}

thread_local! {
    /// Least recently used first.
    static KNOWN: RefCell<Vec<Known>> = const { RefCell::new(Vec::new()) };
    static NONE: Arc<Declared> = Arc::default();
}

/// No tools: what most requests declare, without an allocation each.
pub fn none() -> Arc<Declared> {
    NONE.with(Arc::clone)
}

/// The list `dialect`'s decoder made of the text `rest` begins with, and
/// that text's length.
pub fn find(dialect: Dialect, rest: &str) -> Option<(usize, Arc<Declared>)> {
    let by = |k: &Known| matches!(&k.decoded, Some((d, _)) if *d == dialect);
    used(rest.as_bytes(), by, |k| {
        let (_, declared) = k.decoded.as_ref()?;
        Some((k.text.len(), declared.clone()))
    })
}

/// The known list `rest` begins with (decoded by any front, or checked):
/// its length, the values in it, and what a front decoded of it. What the
/// body's shape pass counts without reading it, and hands the decoder
/// ([`Found`](super::budget::Found)).
pub fn found(rest: &[u8]) -> Option<Hit<Declared>> {
    used(
        rest,
        |_| true,
        |k| {
            Some(Hit {
                len: k.text.len(),
                values: k.values,
                decoded: k.decoded.clone(),
            })
        },
    )
}

/// The length of the known list `rest` begins with, and the values in it:
/// what the check passes without reading it.
pub fn values(rest: &[u8]) -> Option<(usize, usize)> {
    used(rest, |_| true, |k| Some((k.text.len(), k.values)))
}

/// What `take` takes of the last kept list that `rest` begins with and
/// `by` accepts, made the most recently used.
fn used<T>(
    rest: &[u8],
    by: impl Fn(&Known) -> bool,
    take: impl FnOnce(&Known) -> Option<T>,
) -> Option<T> {
    KNOWN.with_borrow_mut(|known| {
        let at = known
            .iter()
            .rposition(|k| by(k) && rest.starts_with(k.text.as_bytes()))?;
        let kept = known.remove(at);
        let taken = take(&kept);
        known.push(kept);
        taken
    })
}

/// Keeps what `dialect`'s decoder made of `text`, a JSON array read whole.
pub fn keep(dialect: Dialect, text: &str, declared: &Arc<Declared>) {
    let values = || super::budget::values_in(text.as_bytes());
    add(text, values, Some((dialect, declared.clone())));
}

/// Keeps `text`, a JSON array checked whole, and the `values` in it.
pub fn checked(text: &str, values: usize) {
    add(text, || values, None);
}

fn add(text: &str, values: impl FnOnce() -> usize, decoded: Option<(Dialect, Arc<Declared>)>) {
    if !(SMALLEST..=LARGEST).contains(&text.len()) {
        return;
    }
    KNOWN.with_borrow_mut(|known| {
        // A list checked, then decoded: its decoding takes its place.
        if let Some(at) = known.iter().position(|k| *k.text == *text) {
            known.remove(at);
        } else if known.len() == KEPT {
            known.remove(0);
        }
        known.push(Known {
            text: text.into(),
            values: values(),
            decoded,
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(n: usize) -> String {
        format!("[{}]", "{\"name\":\"t\"},".repeat(n) + "{}")
    }

    #[test]
    fn a_list_is_found_by_its_text_and_dialect_and_the_last_used_kept_longest() {
        let (a, b) = (list(100), list(101));
        let declared = Arc::new(Declared::default());
        keep(Dialect::Messages, &a, &declared);
        keep(Dialect::Messages, &b, &declared);
        let body = format!("{a}, \"model\": \"m\"}}");
        assert_eq!(find(Dialect::Messages, &body).map(|f| f.0), Some(a.len()));
        assert!(find(Dialect::Responses, &body).is_none());
        assert!(find(Dialect::Messages, &a[..a.len() - 1]).is_none());
        // `a` was used last: three more lists push `b` out first.
        for n in 0..3 {
            keep(Dialect::Responses, &list(200 + n), &declared);
        }
        assert!(find(Dialect::Messages, &b).is_none());
        assert!(find(Dialect::Messages, &a).is_some());
    }

    #[test]
    fn a_list_checked_then_decoded_is_kept_once_with_its_decoding() {
        let a = list(150);
        checked(&a, 7);
        assert_eq!(values(a.as_bytes()), Some((a.len(), 7)));
        assert!(find(Dialect::Chat, &a).is_none());
        keep(Dialect::Chat, &a, &Arc::new(Declared::default()));
        assert!(find(Dialect::Chat, &a).is_some());
        let count = KNOWN.with_borrow(|known| known.iter().filter(|k| *k.text == *a).count());
        assert_eq!(count, 1);
    }

    #[test]
    fn small_and_large_lists_are_not_kept() {
        let declared = Arc::new(Declared::default());
        let (small, large) = (list(2), list(LARGEST / 12));
        keep(Dialect::Messages, &small, &declared);
        keep(Dialect::Messages, &large, &declared);
        assert!(find(Dialect::Messages, &small).is_none());
        assert!(find(Dialect::Messages, &large).is_none());
    }
}

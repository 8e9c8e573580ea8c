//! Long texts of the history entries a thread keeps decoded
//! (`front/known_entries.rs`), escaped as JSON strings. A session's history
//! goes to the model again with each of its requests, and once its entries
//! were no longer read again, escaping their texts was what was left: a
//! tool call's arguments (a file edit's old and new text, quotes and line
//! breaks throughout) made 38% of a request with thirty edits in its
//! history. A text held here is written by copying its escaped form, found
//! by a hash of the text and compared whole.
//!
//! Held by the entries that carry it (two may carry the same text) and let
//! go with the last of them, so bounded by theirs; texts shorter than
//! [`SMALLEST`], or with nothing to escape (written as fast as copied),
//! are not held. A thread's own, as its entries are.

use std::cell::RefCell;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::BuildHasher;

use foldhash::fast::FixedState;

/// A text's length, at least, to be held.
pub const SMALLEST: usize = 256;

struct Held {
    text: Box<str>,
    /// Escaped, without its quotes.
    json: Box<[u8]>,
    holders: u32,
}

thread_local! {
    static HELD: RefCell<HashMap<u64, Held, FixedState>> = RefCell::default();
}

fn hash(text: &str) -> u64 {
    FixedState::with_seed(0).hash_one(text.as_bytes())
}

/// Holds `text` escaped for [`write`](fn@write), or once more if it is: its key for
/// [`release`], and the bytes it takes. `None`: too short, nothing to
/// escape, or another text holds its key.
pub fn hold(text: &str) -> Option<(u64, usize)> {
    if text.len() < SMALLEST {
        return None;
    }
    let key = hash(text);
    HELD.with_borrow_mut(|held| match held.entry(key) {
        Entry::Occupied(mut entry) => {
            let held = entry.get_mut();
            (*held.text == *text).then(|| {
                held.holders += 1;
                (key, held.text.len() + held.json.len())
            })
        }
        Entry::Vacant(entry) => {
            let mut json = Vec::with_capacity(text.len() + text.len() / 8);
            super::escape_inside(&mut json, text);
            if json.len() == text.len() {
                return None;
            }
            let bytes = text.len() + json.len();
            entry.insert(Held {
                text: text.into(),
                json: json.into(),
                holders: 1,
            });
            Some((key, bytes))
        }
    })
}

/// One holder of the text held under `key` lets it go (nothing to do as
/// the thread ends, its texts gone first).
pub fn release(key: u64) {
    let _ = HELD.try_with(|held| {
        if let Entry::Occupied(mut entry) = held.borrow_mut().entry(key) {
            entry.get_mut().holders -= 1;
            if entry.get().holders == 0 {
                entry.remove();
            }
        }
    });
}

/// Appends `text` escaped, without its quotes, if it is held: whether it
/// did.
pub fn write(text: &str, out: &mut Vec<u8>) -> bool {
    if text.len() < SMALLEST {
        return false;
    }
    HELD.with_borrow(|held| {
        // No hash of the text where nothing is held (no coding agent's
        // session on this thread).
        if held.is_empty() {
            return false;
        }
        match held.get(&hash(text)) {
            Some(held) if *held.text == *text => {
                out.extend_from_slice(&held.json);
                true
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        super::super::escape_inside(&mut out, text);
        out
    }

    #[test]
    fn a_held_text_is_written_escaped_until_its_last_holder_lets_it_go() {
        crate::on_a_new_thread(|| {
            let text = "def f(x):\n\treturn \"é\" \\ 😀\u{1}\n".repeat(12);
            let (key, bytes) = hold(&text).unwrap();
            assert_eq!(bytes, text.len() + escaped(&text).len());
            assert_eq!(hold(&text).map(|held| held.0), Some(key));
            let mut out = b"[".to_vec();
            assert!(write(&text, &mut out));
            assert_eq!(out[1..], escaped(&text));
            release(key);
            assert!(write(&text, &mut Vec::new()));
            release(key);
            assert!(!write(&text, &mut Vec::new()));
            // Too short, or nothing to escape: not held.
            assert!(hold(&text[..SMALLEST - 1]).is_none());
            assert!(hold(&"plain text ".repeat(40)).is_none());
            assert!(HELD.with_borrow(HashMap::is_empty));
        });
    }
}

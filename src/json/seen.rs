//! Long strings with escapes the thread has read before, by their text. A
//! coding agent sends its system prompt and its conversation again with
//! every request of a session, and unescaping them was most of what
//! building a coding agent's request cost the scanner (Codex's request: 381
//! strings with escapes, 48k instructions of the 60k its strings took);
//! checking them, most of what a request passed on to another model costs.
//! Comparing a long string's text with the one it was before costs about a
//! tenth of either. A writer finds a string built from one by its text, and
//! writes it as it came rather than escaping it again.
//!
//! A string whose text (after its opening quote) begins with the text of a
//! string read before, and then a quote, is that same string: the text
//! kept was a whole string's, checked, so it does not end in an escaping
//! backslash and the quote after it closes it. A match skips nothing the
//! scanner would have refused. A string only checked is kept without its
//! unescaped text, which the first build of it adds.
//!
//! Each thread keeps its own few (no lock on the request path), in sets of
//! two picked by bytes of the text's first 256, the one used last kept on a
//! collision. Bounded: 32 strings per thread of 256 bytes to 32 KiB of text
//! each.

use std::cell::RefCell;

/// Sets of [`WAYS`] strings each.
const SETS: usize = 16;
const WAYS: usize = 2;
/// A string's text, at least, to be kept: a shorter one is read again. A
/// build looks a string up only once it is this far into it, so a short one
/// never pays the lookup; a check, which cannot tell a string's length
/// before it has found its end, looks up each string with escapes. 256, not
/// a KiB: a coding agent's edits and commands (Claude Code's `Edit` inputs)
/// are mostly shorter than a KiB, and its requests repeat them too (Codex's
/// request 5% fewer instructions, a Claude Code one with thirty edits 8%).
pub const SMALLEST: usize = 256;
/// A string's text, at most, to be kept.
const LARGEST: usize = 32 * 1024;

struct Seen {
    /// The string's text as it came, escapes and all.
    raw: Box<str>,
    /// Unescaped, once a build has read it.
    text: Option<Box<str>>,
}

#[derive(Default)]
struct Set {
    ways: [Option<Seen>; WAYS],
    /// The way used last.
    last: usize,
}

thread_local! {
    static SEEN: RefCell<[Set; SETS]> = RefCell::new(Default::default());
}

/// The set of a text of at least [`SMALLEST`] bytes: four words spread over
/// its first [`SMALLEST`] (all a lookup can count on being the string's), so
/// that texts alike in their first line are told apart.
fn set(text: &[u8]) -> usize {
    let word = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&text[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let (quarter, half, last) = (SMALLEST / 4, SMALLEST / 2, SMALLEST - 8);
    let mixed = word(0) ^ word(quarter).rotate_left(16) ^ word(half).rotate_left(32) ^ word(last);
    (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % SETS
}

/// What `take` takes of the string that `rest` (a string's text from just
/// past its opening quote) is, if it was kept.
fn find<T>(rest: &[u8], take: impl FnOnce(&Seen) -> Option<T>) -> Option<T> {
    if rest.len() <= SMALLEST {
        return None;
    }
    SEEN.with_borrow_mut(|sets| {
        let set = &mut sets[set(rest)];
        let way = set.ways.iter().position(|way| {
            way.as_ref().is_some_and(|seen| {
                let raw = seen.raw.as_bytes();
                rest.get(raw.len()) == Some(&b'"') && rest.starts_with(raw)
            })
        })?;
        set.last = way;
        take(set.ways[way].as_ref()?)
    })
}

/// For a build: the length of the text as it came, and the text, once a
/// build has read it.
pub fn unescaped(rest: &[u8]) -> Option<(usize, String)> {
    find(rest, |seen| {
        Some((seen.raw.len(), String::from(seen.text.as_deref()?)))
    })
}

/// For a check: the length of the text as it came.
pub fn checked(rest: &[u8]) -> Option<usize> {
    find(rest, |seen| Some(seen.raw.len()))
}

/// For a writer: appends the text as it came of the string a build on this
/// thread read as `text`, and tells whether it did. Escaping a long text
/// again reads it for what to escape, byte by byte where it has many; this
/// compares it once, and copies. What it appends reads as `text` in any
/// JSON reader: it was a whole string, checked.
pub fn write_as_sent(text: &str, out: &mut Vec<u8>) -> bool {
    // A kept string's text may be shorter than what came (its escapes),
    // but not by much in what a client sends.
    if text.len() < SMALLEST / 2 {
        return false;
    }
    SEEN.with_borrow_mut(|sets| {
        for set in sets.iter_mut() {
            for (way, seen) in set.ways.iter().enumerate() {
                if let Some(seen) = seen.as_ref().filter(|s| s.text.as_deref() == Some(text)) {
                    out.extend_from_slice(seen.raw.as_bytes());
                    set.last = way;
                    return true;
                }
            }
        }
        false
    })
}

/// Keeps the string whose text came as `raw` (checked, whole), and its
/// unescaped `text` if it was built.
pub fn keep(raw: &str, text: Option<&str>) {
    if !(SMALLEST..=LARGEST).contains(&raw.len()) {
        return;
    }
    SEEN.with_borrow_mut(|sets| {
        let set = &mut sets[set(raw.as_bytes())];
        // A string checked, then built: its text is added where it is.
        let same = |way: &Option<Seen>| way.as_ref().is_some_and(|seen| *seen.raw == *raw);
        let way = match set.ways.iter().position(same) {
            Some(way) => way,
            None => set
                .ways
                .iter()
                .position(Option::is_none)
                .unwrap_or((set.last + 1) % WAYS),
        };
        let text = text.map(Box::from);
        match &mut set.ways[way] {
            Some(seen) if *seen.raw == *raw => seen.text = text.or(seen.text.take()),
            slot => {
                *slot = Some(Seen {
                    raw: raw.into(),
                    text,
                })
            }
        }
        set.last = way;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A string's text, escaped, of about `len` bytes, its first KiB alike
    /// for every `tail` but its last line.
    fn text(len: usize, tail: &str) -> String {
        format!("{}{tail}", "a line,\\n".repeat(len / 9))
    }

    #[test]
    fn a_kept_string_is_found_only_whole_and_closed() {
        crate::on_a_new_thread(|| {
            let raw = text(3000, "end");
            keep(&raw, Some("its text"));
            let found = |rest: String| unescaped(rest.as_bytes());
            let whole = Some((raw.len(), "its text".to_owned()));
            assert_eq!(found(format!("{raw}\",\"next\":1")), whole);
            // Longer, shorter, or not closed there: another string.
            assert_eq!(found(format!("{raw}x\"")), None);
            assert_eq!(found(format!("{}\"", &raw[..raw.len() - 1])), None);
            assert_eq!(found(raw.clone()), None);
            // An edit's few lines are long enough.
            let edit = text(300, "edit");
            keep(&edit, Some("an edit"));
            assert_eq!(
                found(format!("{edit}\"}}")),
                Some((edit.len(), "an edit".to_owned()))
            );
            // Too short or too long to be kept.
            keep("short", Some("s"));
            assert_eq!(found("short\"".to_owned() + &"x".repeat(SMALLEST)), None);
            let long = text(LARGEST + 10, "");
            keep(&long, Some("l"));
            assert_eq!(found(format!("{long}\"")), None);
        });
    }

    #[test]
    fn strings_alike_share_a_set_and_the_last_used_stays() {
        crate::on_a_new_thread(|| {
            let (a, b, c) = (text(2000, "a"), text(2000, "b"), text(2000, "c"));
            assert_eq!(set(a.as_bytes()), set(b.as_bytes()));
            keep(&a, Some("A"));
            keep(&b, Some("B"));
            let found = |raw: &str| unescaped(format!("{raw}\"").as_bytes()).map(|(_, text)| text);
            assert_eq!(found(&a).as_deref(), Some("A"));
            assert_eq!(found(&b).as_deref(), Some("B"));
            // `b` was used last: `c` takes `a`'s place.
            keep(&c, Some("C"));
            assert_eq!(found(&a), None);
            assert_eq!(found(&b).as_deref(), Some("B"));
            assert_eq!(found(&c).as_deref(), Some("C"));
        });
    }

    #[test]
    fn a_built_string_is_written_as_it_came_by_its_text() {
        crate::on_a_new_thread(|| {
            let raw = text(2000, "\\u00e9");
            let written = |text: &str| {
                let mut out = b"[".to_vec();
                write_as_sent(text, &mut out).then_some(out)
            };
            // Only checked: no text to know it by.
            keep(&raw, None);
            assert_eq!(written("a text"), None);
            keep(&raw, Some(&"t".repeat(1500)));
            let expected = format!("[{raw}").into_bytes();
            assert_eq!(written(&"t".repeat(1500)), Some(expected));
            // Another text, or a part of it: escaped by the caller.
            assert_eq!(written(&"t".repeat(1499)), None);
            assert_eq!(written(&"u".repeat(1500)), None);
        });
    }

    #[test]
    fn a_string_checked_then_built_is_kept_once_with_its_text() {
        crate::on_a_new_thread(|| {
            let raw = text(1500, "x");
            let rest = format!("{raw}\"");
            keep(&raw, None);
            assert_eq!(checked(rest.as_bytes()), Some(raw.len()));
            assert_eq!(unescaped(rest.as_bytes()), None);
            keep(&raw, Some("T"));
            assert_eq!(
                unescaped(rest.as_bytes()),
                Some((raw.len(), "T".to_owned()))
            );
            // Checked again: its text stays.
            keep(&raw, None);
            assert_eq!(
                unescaped(rest.as_bytes()),
                Some((raw.len(), "T".to_owned()))
            );
            let kept = SEEN.with_borrow(|sets| {
                let set = &sets[set(raw.as_bytes())];
                set.ways
                    .iter()
                    .flatten()
                    .filter(|seen| *seen.raw == *raw)
                    .count()
            });
            assert_eq!(kept, 1);
        });
    }
}

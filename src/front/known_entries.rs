//! The history entries of recent requests, by their text, as a front
//! decoded them. A coding agent sends its whole conversation again with
//! every request of a session, each request adding a message or two; a
//! Claude Code request with thirty file edits in its history spent 70% of
//! its instructions building and decoding messages it had sent before. An
//! entry of a request's `messages` (chat, Messages) or `input` (Responses) whose
//! text is that of an entry decoded before takes that decoding and moves
//! past its text; the body's shape pass, before it, adds the entry's count
//! of values.
//!
//! The text kept was a whole JSON object, read and decoded without error,
//! so the same bytes at the same place read as the same object to the same
//! end and decode the same: a decoder is a function of an entry's bytes
//! (an error would name the entry's place, but a kept one has none). A
//! match skips nothing the scanner would have refused.
//!
//! An entry is found by a hash of the `HEAD` bytes its text begins with
//! where it came, the next entry's first bytes too when it is short: a
//! history only grows, so what follows an entry is what followed it
//! before, but for the last entry of the request before. Short entries
//! (a tool's result, a user's line) are most of a history's, and kept with
//! this, found without a hash of their whole text.
//!
//! Each thread keeps its own (no lock on the request path; a session's
//! requests come on its connection, which stays on one thread), the least
//! recently used let go first. Bounded: `KEPT_BYTES` a thread, entries of
//! [`SMALLEST`] bytes to `LARGEST` (a shorter entry is read again,
//! cheaper than kept), `SAME_HEAD` found by the same hash.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use super::budget::Hit;
use crate::conversation::{Dialect, Item, Part, Prompt};
use crate::json::escaped;

/// An entry's text, at least, to be kept.
pub const SMALLEST: usize = 64;
/// The bytes an entry is found by: at most where the body ends (an entry
/// closer to it is read again).
const HEAD: usize = 256;
/// An entry's text, at most, to be kept.
const LARGEST: usize = 256 * 1024;
/// What a thread keeps, at most, counted generously: each entry's text and
/// `ENTRY_BYTES`, its decoding as its text again and `VALUE_BYTES` a JSON
/// value in it, and its long texts held escaped. A long coding session's history, several
/// sessions' shorter ones.
const KEPT_BYTES: usize = 4 * 1024 * 1024;
/// What a decoding may hold for each JSON value of its entry (a value kept
/// as it is, in a map): a small value's text costs this much more.
const VALUE_BYTES: usize = 96;
/// What a kept entry costs besides its text and its decoding: its record,
/// its place in the map and in its hash's list, the allocator's rounding
/// (a small entry checked costs several times its text).
const ENTRY_BYTES: usize = 512;
/// Entries found by the same hash, at most: the same first bytes, told
/// apart by what follows, are compared one by one.
const SAME_HEAD: usize = 4;

/// What a front made of one entry: the items it adds to the conversation
/// and the text it adds to the system prompt.
#[derive(Debug, Default, Clone)]
pub struct Decoding {
    pub items: Vec<Item>,
    pub system: Prompt,
}

struct Kept {
    text: Box<str>,
    /// What it counts for against `KEPT_BYTES`.
    size: usize,
    /// The keys of its long texts held escaped ([`escaped`]).
    held: Vec<u64>,
    /// The values in it, as the body's shape pass counts them.
    values: usize,
    /// What a front's decoder made of it; `None` for an entry only
    /// checked, in a request passed on to another model.
    decoded: Option<(Dialect, Arc<Decoding>)>,
    /// When it was last found or kept, on the thread's clock.
    used: u64,
}

/// An entry let go lets its long texts go.
impl Drop for Kept {
    fn drop(&mut self) {
        self.held.iter().copied().for_each(escaped::release);
    }
}

#[derive(Default)]
struct Entries {
    /// By the hash of the `HEAD` bytes from their start.
    by_head: HashMap<u64, Vec<Kept>, foldhash::fast::FixedState>,
    bytes: usize,
    clock: u64,
}

thread_local! {
    static KNOWN: RefCell<Entries> = RefCell::new(Entries::default());
}

/// The hash an entry is found by, of the `HEAD` bytes of `rest` (an
/// array's text from the entry on); `None` if fewer are left, or if the
/// entry is no object (only objects are kept, nothing else is hashed).
pub fn head(rest: &[u8]) -> Option<u64> {
    let head = rest.get(..HEAD).filter(|head| head[0] == b'{')?;
    Some(foldhash::fast::FixedState::with_seed(0).hash_one(head))
}

impl Entries {
    /// The entry `rest` (with the hash `head`) begins with, decoded by
    /// `dialect` if one is named.
    fn find(&mut self, dialect: Option<Dialect>, head: u64, rest: &[u8]) -> Option<&mut Kept> {
        let bucket = self.by_head.get_mut(&head)?;
        let kept = bucket.iter_mut().find(|kept| {
            let decoded = kept.decoded.as_ref().map(|(by, _)| *by);
            dialect.is_none_or(|dialect| decoded == Some(dialect))
                && rest.starts_with(kept.text.as_bytes())
        })?;
        self.clock += 1;
        kept.used = self.clock;
        Some(kept)
    }

    /// Lets the least recently used entries go until those left, and
    /// `room` more, fit in three quarters of `KEPT_BYTES`: a thread over
    /// its bound sorts its entries once per quarter of it, not per entry.
    fn make_room(&mut self, room: usize) {
        if self.bytes + room <= KEPT_BYTES {
            return;
        }
        // Each entry's clock reading is its own: the oldest that free
        // enough go, those from the first left on stay.
        let mut ages: Vec<(u64, usize)> = self
            .by_head
            .values()
            .flatten()
            .map(|kept| (kept.used, kept.size))
            .collect();
        ages.sort_unstable();
        let over = (self.bytes + room).saturating_sub(KEPT_BYTES / 4 * 3);
        let mut freed = 0;
        let youngest_gone = ages.iter().position(|&(_, len)| {
            freed += len;
            freed >= over
        });
        // All go if those that go are not enough.
        let stays = youngest_gone.and_then(|gone| ages.get(gone + 1));
        let stays = stays.map_or(u64::MAX, |&(used, _)| used);
        self.by_head.retain(|_, bucket| {
            bucket.retain(|kept| kept.used >= stays);
            !bucket.is_empty()
        });
        self.bytes -= freed;
    }
}

/// What `dialect`'s decoder made of the entry `rest` (an array's text from
/// an entry on, whose [`head`] is `head`) begins with, and its length.
pub fn find(dialect: Dialect, head: u64, rest: &str) -> Option<(usize, Arc<Decoding>)> {
    KNOWN.with_borrow_mut(|known| {
        let kept = known.find(Some(dialect), head, rest.as_bytes())?;
        let decoding = kept.decoded.as_ref().map(|(_, decoding)| decoding.clone());
        Some((kept.text.len(), decoding?))
    })
}

/// The length of the entry kept (decoded by any front, or checked) that
/// `rest` (whose [`head`] is `head`) begins with, and the values in it:
/// what the check passes without reading it.
pub fn values(head: u64, rest: &[u8]) -> Option<(usize, usize)> {
    found(head, rest).map(|hit| (hit.len, hit.values))
}

/// [`values`], and what a front decoded of the entry: what the body's
/// shape pass hands the decoder ([`Found`](super::budget::Found)).
pub fn found(head: u64, rest: &[u8]) -> Option<Hit<Decoding>> {
    KNOWN.with_borrow_mut(|known| {
        let kept = known.find(None, head, rest)?;
        Some(Hit {
            len: kept.text.len(),
            values: kept.values,
            decoded: kept.decoded.clone(),
        })
    })
}

/// Keeps what `dialect`'s decoder made of `text`, a JSON object read whole
/// as an entry of a request's history, where its [`head`] was `head`.
pub fn keep(dialect: Dialect, head: u64, text: &str, decoding: Decoding) {
    let values = || super::budget::values_in(text.as_bytes());
    add(head, text, values, Some((dialect, decoding)));
}

/// Keeps `text`, a JSON object checked whole as an entry of a request's
/// history where its [`head`] was `head`, and the `values` in it.
pub fn checked(head: u64, text: &str, values: usize) {
    add(head, text, || values, None);
}

fn add(
    head: u64,
    text: &str,
    values: impl FnOnce() -> usize,
    decoded: Option<(Dialect, Decoding)>,
) {
    if !(SMALLEST..=LARGEST).contains(&text.len()) {
        return;
    }
    KNOWN.with_borrow_mut(|known| {
        let dialect = decoded.as_ref().map(|(dialect, _)| *dialect);
        if let Some(bucket) = known.by_head.get_mut(&head) {
            let same = |kept: &Kept| *kept.text == *text;
            // Kept already: decoded by this front, or checked and now only
            // checked again.
            let by = |kept: &Kept| kept.decoded.as_ref().map(|(by, _)| *by);
            if bucket
                .iter()
                .any(|kept| same(kept) && (by(kept) == dialect || dialect.is_none()))
            {
                return;
            }
            // Checked, now decoded: its decoding takes its place.
            if let Some(at) = bucket
                .iter()
                .position(|kept| same(kept) && by(kept).is_none())
            {
                known.bytes -= bucket.swap_remove(at).size;
            }
        }
        let values = values();
        let mut size = ENTRY_BYTES + text.len();
        let mut held = Vec::new();
        let decoded = decoded.map(|(dialect, decoding)| {
            // Its long texts, as the model's requests will have them.
            size += text.len() + values * VALUE_BYTES;
            each_text(&decoding, |text| {
                if let Some((key, bytes)) = escaped::hold(text) {
                    held.push(key);
                    size += bytes;
                }
            });
            (dialect, Arc::new(decoding))
        });
        known.make_room(size);
        known.clock += 1;
        let kept = Kept {
            text: text.into(),
            size,
            held,
            values,
            decoded,
            used: known.clock,
        };
        known.bytes += size;
        let bucket = known.by_head.entry(head).or_default();
        if bucket.len() == SAME_HEAD {
            let oldest = bucket.iter().enumerate().min_by_key(|(_, kept)| kept.used);
            if let Some((at, _)) = oldest {
                known.bytes -= bucket.swap_remove(at).size;
            }
        }
        bucket.push(kept);
    });
}

/// Each text of `decoding` that a model's request carries as a JSON string:
/// its items', and its system prompt's (a `system` entry of a Messages
/// history, as Claude Code sends; the other fronts keep a history's system
/// messages among its items).
fn each_text<'a>(decoding: &'a Decoding, mut each: impl FnMut(&'a str)) {
    decoding.system.texts().for_each(&mut each);
    for item in &decoding.items {
        match item {
            Item::Message(message) => message.content.iter().for_each(|part| {
                if let Part::Text(text) = part {
                    each(text);
                }
            }),
            Item::Reasoning(reasoning) => each(&reasoning.text),
            Item::ToolCall(call) => each(&call.arguments),
            Item::ToolResult(result) => each(&result.output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Message, Role};

    /// An entry's text of `len` bytes.
    fn entry(tag: usize, len: usize) -> String {
        let head = format!("{{\"role\":\"user\",\"content\":\"{tag} ");
        format!("{head}{}\"}}", "x".repeat(len - head.len() - 2))
    }

    /// What follows an entry in its list, `tag` telling one from another.
    fn after(tag: usize) -> String {
        format!(
            ",{{\"role\":\"user\",\"content\":\"{tag}{}\"}}]",
            " ".repeat(HEAD)
        )
    }

    fn decoding(text: &str) -> Decoding {
        Decoding {
            items: vec![Item::Message(Message::text(Role::User, text))],
            system: Prompt::default(),
        }
    }

    /// Keeps `text` followed by `after(0)`, decoded as `as_text`.
    fn keep_text(dialect: Dialect, text: &str, as_text: &str) {
        let head = head(format!("{text}{}", after(0)).as_bytes()).unwrap();
        keep(dialect, head, text, decoding(as_text));
    }

    /// What was kept of the entry `text`, followed by `after(next)`.
    fn found_before(dialect: Dialect, text: &str, next: usize) -> Option<String> {
        let rest = format!("{text}{}", after(next));
        let (len, decoding) = find(dialect, head(rest.as_bytes())?, &rest)?;
        assert_eq!(len, text.len());
        match decoding.items.as_slice() {
            [Item::Message(message)] => Some(message.text_content()),
            other => panic!("{other:?}"),
        }
    }

    fn found(text: &str) -> Option<String> {
        found_before(Dialect::Messages, text, 0)
    }

    #[test]
    fn an_entry_is_found_by_its_whole_text_and_dialect() {
        crate::on_a_new_thread(|| {
            let (a, b) = (entry(1, 300), entry(2, 300));
            keep_text(Dialect::Messages, &a, "a");
            assert_eq!(found(&a).as_deref(), Some("a"));
            assert_eq!(found(&b), None);
            assert_eq!(found_before(Dialect::Responses, &a, 0), None);
            // The object, and its members' two colons and comma.
            let rest = format!("{a}{}", after(0));
            let at = head(rest.as_bytes()).unwrap();
            assert_eq!(values(at, rest.as_bytes()), Some((a.len(), 4)));
            // The same first bytes, another entry: not taken for it.
            let longer = format!("{}y\"}}", &a[..a.len() - 2]);
            assert_eq!(found(&longer), None);
            // A short entry is found where it came before the same bytes.
            let short = entry(3, SMALLEST);
            keep_text(Dialect::Messages, &short, "short");
            assert_eq!(found(&short).as_deref(), Some("short"));
            assert_eq!(found_before(Dialect::Messages, &short, 1), None);
            // Too short to be kept, or too long.
            keep_text(Dialect::Messages, &entry(4, SMALLEST - 1), "shorter");
            keep_text(Dialect::Messages, &entry(5, LARGEST + 1), "long");
            assert_eq!(found(&entry(4, SMALLEST - 1)), None);
            assert_eq!(found(&entry(5, LARGEST + 1)), None);
            // Too close to the body's end to be found.
            assert_eq!(head(&[b' '; HEAD - 1]), None);
        });
    }

    #[test]
    fn an_entrys_long_texts_are_held_escaped_while_it_is_kept() {
        crate::on_a_new_thread(|| {
            let edit = "def f(x):\n\treturn \"x\"\n".repeat(20);
            let written = |text: &str| crate::json::escaped::write(text, &mut Vec::new());
            keep_text(Dialect::Messages, &entry(1, 300), &edit);
            assert!(written(&edit));
            let size = KNOWN.with_borrow(|known| known.bytes);
            assert!(size > 300 + 2 * edit.len(), "{size}");
            // Pushed out by entries that fill the bound: let go with it.
            for tag in 2..=KEPT_BYTES / (64 * 1024) + 1 {
                keep_text(Dialect::Messages, &entry(tag, 64 * 1024), "x");
            }
            assert!(found(&entry(1, 300)).is_none());
            assert!(!written(&edit));
        });
    }

    #[test]
    fn a_system_entrys_long_text_is_held_escaped_too() {
        crate::on_a_new_thread(|| {
            // A `system` entry of a Messages history, as Claude Code sends:
            // a chat upstream's every request carries it as a JSON string.
            let instructions = "Answer in \"plain\" words.\n".repeat(60);
            let body = serde_json::json!({"model": "m", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": instructions}]},
            ]})
            .to_string();
            let written = |text: &str| crate::json::escaped::write(text, &mut Vec::new());
            assert!(!written(&instructions));
            let (conversation, _) = crate::front::messages::decode(body.as_bytes()).unwrap();
            let system = conversation.system.map(|s| s.text().into_owned());
            assert_eq!(system.as_deref(), Some(instructions.as_str()));
            assert!(written(&instructions));
            // Let go with its entry.
            for tag in 2..=KEPT_BYTES / (64 * 1024) + 1 {
                keep_text(Dialect::Messages, &entry(tag, 64 * 1024), "x");
            }
            assert!(!written(&instructions));
        });
    }

    #[test]
    fn a_thread_keeps_its_bound_letting_the_least_recently_used_go() {
        crate::on_a_new_thread(|| {
            let len = 64 * 1024;
            let first = entry(0, len);
            keep_text(Dialect::Messages, &first, "first");
            // Its text, its decoding as much again, its four values.
            let size = KNOWN.with_borrow(|known| known.bytes);
            assert_eq!(size, ENTRY_BYTES + 2 * len + 4 * VALUE_BYTES);
            let fill = KEPT_BYTES / size;
            for tag in 1..fill {
                keep_text(Dialect::Messages, &entry(tag, len), "x");
                // The first is read again by every request.
                assert!(found(&first).is_some());
            }
            assert_eq!(KNOWN.with_borrow(|known| known.bytes), fill * size);
            // Over the bound: the oldest go, down to three quarters of it.
            keep_text(Dialect::Messages, &entry(1000, len), "new");
            let (bytes, count) =
                KNOWN.with_borrow(|known| (known.bytes, known.by_head.values().flatten().count()));
            assert!(bytes <= KEPT_BYTES / 4 * 3 + size, "{bytes}");
            assert_eq!(bytes, count * size);
            assert!(found(&first).is_some());
            assert!(found(&entry(1, len)).is_none());
            assert!(found(&entry(fill - 1, len)).is_some());
            assert!(found(&entry(1000, len)).is_some());
        });
    }

    #[test]
    fn entries_alike_in_their_first_bytes_are_kept_a_few_at_a_time() {
        crate::on_a_new_thread(|| {
            // The same first 256 bytes, then each its own.
            let alike = |tag: usize| format!("{}{tag}\"}}", &entry(0, 400)[..390]);
            for tag in 0..SAME_HEAD {
                keep_text(Dialect::Messages, &alike(tag), "x");
            }
            assert!(found(&alike(0)).is_some());
            keep_text(Dialect::Messages, &alike(SAME_HEAD), "x");
            // The one used least recently made room.
            assert!(found(&alike(1)).is_none());
            for tag in [0, 2, 3, SAME_HEAD] {
                assert!(found(&alike(tag)).is_some());
            }
            let count = KNOWN.with_borrow(|known| known.by_head.values().flatten().count());
            assert_eq!(count, SAME_HEAD);
        });
    }
}

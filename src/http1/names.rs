//! Header field names as `http`'s [`HeaderName`]s, made once a thread for
//! each spelling a client sends.
//!
//! A client sends the same fields with every request, spelled the same way:
//! Claude Code's 20 (`X-Stainless-Arch`, `anthropic-beta`, …), the OpenAI
//! SDKs' dozen. [`HeaderName::from_bytes`] lowers each name byte by byte,
//! looks it up among the standard ones and, for the others (most of a
//! coding agent's), copies it into an allocation of its own: about 200
//! instructions and an allocation a field. A name found here is a clone (a
//! shared count).

use std::cell::RefCell;
use std::hash::BuildHasher;

use http::HeaderName;

/// Room for the names of a few clients' heads: a fixed table, so that
/// names made up by a client only ever replace others.
const SLOTS: usize = 128;
/// Slots looked at from a name's own: names whose slots collide both stay.
const PROBES: usize = 4;
/// Longer names are made each time: no client's usual field is this long.
const LONGEST: usize = 48;

thread_local! {
    static NAMES: RefCell<Names> = RefCell::new(Names::default());
}

/// The name of a field sent as `sent` (a token, as httparse reads one), or
/// `None` where it is not a field name.
pub fn field_name(sent: &[u8]) -> Option<HeaderName> {
    if sent.len() > LONGEST {
        return HeaderName::from_bytes(sent).ok();
    }
    NAMES
        .try_with(|names| names.borrow_mut().get(sent))
        .unwrap_or_else(|_| HeaderName::from_bytes(sent).ok())
}

struct Names {
    slots: Box<[Option<Slot>]>,
    hasher: foldhash::fast::FixedState,
}

/// A name as sent, and what it was made into.
struct Slot {
    sent: Box<[u8]>,
    name: HeaderName,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            slots: (0..SLOTS).map(|_| None).collect(),
            hasher: foldhash::fast::FixedState::default(),
        }
    }
}

impl Names {
    fn get(&mut self, sent: &[u8]) -> Option<HeaderName> {
        let home = self.hasher.hash_one(sent) as usize % SLOTS;
        let mut free = None;
        for probe in 0..PROBES {
            let at = (home + probe) % SLOTS;
            match &self.slots[at] {
                Some(slot) if *slot.sent == *sent => return Some(slot.name.clone()),
                Some(_) => {}
                None => {
                    free = Some(at);
                    break;
                }
            }
        }
        let name = HeaderName::from_bytes(sent).ok()?;
        // Full around its home, a name takes the home's slot.
        self.slots[free.unwrap_or(home)] = Some(Slot {
            sent: sent.into(),
            name: name.clone(),
        });
        Some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_the_same_made_or_found_whatever_its_case() {
        for sent in [
            "Content-Type",
            "X-Stainless-Arch",
            "x-stainless-arch",
            "anthropic-beta",
        ] {
            let made = HeaderName::from_bytes(sent.as_bytes()).unwrap();
            assert_eq!(field_name(sent.as_bytes()), Some(made.clone()));
            assert_eq!(field_name(sent.as_bytes()), Some(made));
        }
        assert_eq!(field_name(b"bad name"), None);
        assert_eq!(field_name(b"bad name"), None);
        let long = "x".repeat(LONGEST + 1);
        assert_eq!(
            field_name(long.as_bytes()).map(|n| n.as_str().len()),
            Some(LONGEST + 1)
        );
    }

    #[test]
    fn more_names_than_slots_replace_each_other_and_stay_right() {
        let names: Vec<String> = (0..SLOTS * 3).map(|i| format!("X-Made-Up-{i}")).collect();
        for _ in 0..2 {
            for sent in &names {
                let name = field_name(sent.as_bytes()).unwrap();
                assert_eq!(name.as_str(), sent.to_ascii_lowercase());
            }
        }
    }
}

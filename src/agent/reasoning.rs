//! Inline `<think>…</think>` in `content` (llama.cpp with reasoning format
//! `none`, many local models) becomes reasoning. Tags may be split across
//! chunks, so a possible tag prefix at the end of a chunk is held back until
//! the next one.
//!
//! Tags that don't pair up never reach the client as text: a `</think>`
//! outside a block (a chat template that prefilled `<think>` leaves the model
//! only the closing tag; what came before it was already sent as content) and
//! a `<think>` inside one are dropped. A block still open when the round ends
//! was all reasoning.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Content,
    Reasoning,
}

/// The pieces of one delta: almost always the whole delta as one piece,
/// borrowed, so the streaming path does not allocate per chunk.
pub enum Pieces<'a> {
    One(Kind, &'a str),
    Many(Vec<(Kind, String)>),
}

impl Pieces<'_> {
    pub fn iter(&self) -> impl Iterator<Item = (Kind, &str)> {
        let (one, many) = match self {
            Pieces::One(kind, text) => (Some((*kind, *text)), &[][..]),
            Pieces::Many(pieces) => (None, pieces.as_slice()),
        };
        one.into_iter()
            .chain(many.iter().map(|(kind, text)| (*kind, text.as_str())))
    }
}

#[derive(Default)]
pub struct ThinkSplitter {
    inside: bool,
    held: String,
}

impl ThinkSplitter {
    fn kind(&self) -> Kind {
        if self.inside {
            Kind::Reasoning
        } else {
            Kind::Content
        }
    }

    /// Splits one content delta into content and reasoning pieces.
    pub fn split<'a>(&mut self, text: &'a str) -> Pieces<'a> {
        if text.is_empty() {
            return Pieces::Many(Vec::new());
        }
        if self.held.is_empty() && !text.contains('<') {
            return Pieces::One(self.kind(), text);
        }
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(text);
        let mut pieces = Vec::new();
        let mut from = 0;
        loop {
            let tail = &rest[from..];
            let next = [OPEN, CLOSE]
                .into_iter()
                .filter_map(|tag| tail.find(tag).map(|at| (at, tag)))
                .min();
            if let Some((at, tag)) = next {
                if at > 0 {
                    pieces.push((self.kind(), tail[..at].to_owned()));
                }
                // Only the tag that pairs up switches; the other is dropped.
                if (tag == OPEN) != self.inside {
                    self.inside = !self.inside;
                }
                from += at + tag.len();
                continue;
            }
            let keep = (1..CLOSE.len())
                .rev()
                .find(|&n| {
                    tail.len() >= n
                        && tail.is_char_boundary(tail.len() - n)
                        && [OPEN, CLOSE]
                            .iter()
                            .any(|tag| tag.starts_with(&tail[tail.len() - n..]))
                })
                .unwrap_or(0);
            let emit = &tail[..tail.len() - keep];
            if !emit.is_empty() {
                pieces.push((self.kind(), emit.to_owned()));
            }
            self.held = tail[tail.len() - keep..].to_owned();
            return Pieces::Many(pieces);
        }
    }

    /// What was held back at the end of a round.
    pub fn flush(&mut self) -> Option<(Kind, String)> {
        let held = std::mem::take(&mut self.held);
        (!held.is_empty()).then(|| (self.kind(), held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&str]) -> Vec<(Kind, String)> {
        let mut splitter = ThinkSplitter::default();
        let mut out: Vec<(Kind, String)> = Vec::new();
        let mut push = |kind: Kind, text: &str| match out.last_mut() {
            Some((k, t)) if *k == kind => t.push_str(text),
            _ => out.push((kind, text.to_owned())),
        };
        for chunk in chunks {
            for (kind, text) in splitter.split(chunk).iter() {
                push(kind, text);
            }
        }
        if let Some((kind, text)) = splitter.flush() {
            push(kind, &text);
        }
        out
    }

    #[test]
    fn every_split_of_a_think_block_gives_the_same_pieces() {
        let text = "<think>\nhmm, a < b</think>\n\nAnswer <b>bold</b>";
        let expected = vec![
            (Kind::Reasoning, "\nhmm, a < b".to_owned()),
            (Kind::Content, "\n\nAnswer <b>bold</b>".to_owned()),
        ];
        assert_eq!(run(&[text]), expected);
        for at in 1..text.len() {
            assert_eq!(run(&[&text[..at], &text[at..]]), expected, "split at {at}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&refs), expected);
    }

    #[test]
    fn unpaired_tags_are_dropped_and_an_open_block_is_reasoning() {
        let cases: [(&str, &[(Kind, &str)]); 4] = [
            // A template prefilled `<think>`: only the closing tag comes.
            ("</think>\n\nHello", &[(Kind::Content, "\n\nHello")]),
            ("plan</think>Answer", &[(Kind::Content, "planAnswer")]),
            (
                "<think>a<think>b</think>c",
                &[(Kind::Reasoning, "ab"), (Kind::Content, "c")],
            ),
            (
                "x<think>never closed </thi",
                &[
                    (Kind::Content, "x"),
                    (Kind::Reasoning, "never closed </thi"),
                ],
            ),
        ];
        for (text, expected) in cases {
            let expected: Vec<(Kind, String)> =
                expected.iter().map(|(k, t)| (*k, t.to_string())).collect();
            for at in 0..=text.len() {
                for to in at..=text.len() {
                    let chunks = [&text[..at], &text[at..to], &text[to..]];
                    assert_eq!(run(&chunks), expected, "{text:?} split at {at}, {to}");
                }
            }
        }
    }

    #[test]
    fn plain_text_is_borrowed_content() {
        let mut s = ThinkSplitter::default();
        assert!(matches!(
            s.split("hello"),
            Pieces::One(Kind::Content, "hello")
        ));
        assert_eq!(run(&["a <", "x"]), vec![(Kind::Content, "a <x".to_owned())]);
    }
}

//! Inline `<think>…</think>` in `content` (llama.cpp with reasoning format
//! `none`, many local models) becomes reasoning. Tags may be split across
//! chunks, so a possible tag prefix at the end of a chunk is held back until
//! the next one.

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
        if self.held.is_empty() && !text.contains('<') {
            return Pieces::One(self.kind(), text);
        }
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(text);
        let mut pieces = Vec::new();
        let mut from = 0;
        loop {
            let tag = if self.inside { CLOSE } else { OPEN };
            let tail = &rest[from..];
            if let Some(at) = tail.find(tag) {
                if at > 0 {
                    pieces.push((self.kind(), tail[..at].to_owned()));
                }
                self.inside = !self.inside;
                from += at + tag.len();
                continue;
            }
            let keep = (1..tag.len())
                .rev()
                .find(|&n| {
                    tail.len() >= n
                        && tail.is_char_boundary(tail.len() - n)
                        && tag.starts_with(&tail[tail.len() - n..])
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
    fn plain_text_is_borrowed_content() {
        let mut s = ThinkSplitter::default();
        assert!(matches!(
            s.split("hello"),
            Pieces::One(Kind::Content, "hello")
        ));
        assert_eq!(run(&["a <", "x"]), vec![(Kind::Content, "a <x".to_owned())]);
    }
}

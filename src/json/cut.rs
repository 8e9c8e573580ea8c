//! An event a stream writes for each token, cut around what changes.
//!
//! A front writes one event per token: a chat chunk, a Responses text delta,
//! a Messages `content_block_delta`. Member by member that is 600 to 1,200
//! instructions a token, where all but the text (and a number: the event's
//! sequence, or its block's index) are the same bytes every time. A
//! [`Cut`] holds those bytes, taken from the writer's own output: rendered
//! with number 0 and text `""`, again with 1 and with `"x"`, the renders
//! must differ in that digit and that `x` alone. A token's event is then
//! three copies, the number's digits and the text's escape; a writer whose
//! renders do not differ so, or whose cut does not write what it wrote for
//! a third pair, gives no cut, and stays in use. The writer must write its
//! number in digits and its text with [`json::write`](super::write), as the
//! cut does, whatever the number and the text.

use std::cell::OnceCell;

use super::write;

/// A writer's [`Cut`], made as it is first written with: what a stream
/// keeps for each kind of event it writes per token.
#[derive(Default)]
pub struct Lazy(OnceCell<Option<Cut>>);

impl Lazy {
    /// What `writer` writes for `number` and `text`: by the cut, made from
    /// `writer` on the first call, or by `writer` where it has none.
    pub fn write(
        &self,
        writer: impl Fn(u64, &str, &mut Vec<u8>),
        number: u64,
        text: &str,
        out: &mut Vec<u8>,
    ) {
        match self.0.get_or_init(|| Cut::of(&writer)) {
            Some(cut) => cut.write(number, text, out),
            None => writer(number, text, out),
        }
    }

    /// Whether it was made, and cut.
    pub fn is_cut(&self) -> bool {
        matches!(self.0.get(), Some(Some(_)))
    }
}

pub struct Cut {
    /// The render of number 0 and text `""`.
    bytes: Vec<u8>,
    /// Where its `0` is, if the writer writes the number.
    number: Option<usize>,
    /// Where its `""` is.
    text: usize,
}

impl Cut {
    /// The cut of what `writer` writes for a number and a text.
    pub fn of(writer: impl Fn(u64, &str, &mut Vec<u8>)) -> Option<Cut> {
        let render = |number, text| {
            let mut out = Vec::new();
            writer(number, text, &mut out);
            out
        };
        let bytes = render(0, "");
        let one = render(1, "");
        let number = match differ(&bytes, &one) {
            None => None,
            // The digit alone differs.
            Some(at)
                if bytes.get(at) == Some(&b'0')
                    && one.len() == bytes.len()
                    && bytes[at + 1..] == one[at + 1..] =>
            {
                Some(at)
            }
            Some(_) => return None,
        };
        let x = render(0, "x");
        let text = differ(&bytes, &x)?.checked_sub(1)?;
        // The `x` alone is new.
        let x_alone = x.len() == bytes.len() + 1 && x.get(text + 1) == Some(&b'x');
        if !x_alone
            || bytes.get(text..text + 2) != Some(b"\"\"")
            || bytes[text + 1..] != x[text + 2..]
            || number.is_some_and(|n| n >= text)
        {
            return None;
        }
        let cut = Cut {
            bytes,
            number,
            text,
        };
        let (number, text) = (1_234_567, "a\"\\\n\u{1}é ✓");
        let mut check = Vec::new();
        cut.write(number, text, &mut check);
        (check == render(number, text)).then_some(cut)
    }

    /// What the writer writes for `number` and `text`.
    pub fn write(&self, number: u64, text: &str, out: &mut Vec<u8>) {
        out.reserve(self.bytes.len() + 20 + text.len());
        let mut from = 0;
        if let Some(at) = self.number {
            out.extend_from_slice(&self.bytes[..at]);
            out.extend_from_slice(itoa::Buffer::new().format(number).as_bytes());
            from = at + 1;
        }
        out.extend_from_slice(&self.bytes[from..self.text]);
        write(out, text);
        out.extend_from_slice(&self.bytes[self.text + 2..]);
    }
}

/// Where `a` and `b` first differ, if they do.
fn differ(a: &[u8], b: &[u8]) -> Option<usize> {
    let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    (same < a.len().max(b.len())).then_some(same)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(number: u64, text: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: {\"n\":");
        out.extend_from_slice(number.to_string().as_bytes());
        out.extend_from_slice(b",\"text\":");
        write(out, text);
        out.extend_from_slice(b"}\n\n");
    }

    #[test]
    fn a_cut_writes_what_its_writer_writes() {
        let cut = Cut::of(event).unwrap();
        for (number, text) in [
            (0, ""),
            (9, "x"),
            (10, "\"quoted\"\n"),
            (u64::MAX, "é\u{7f}"),
        ] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            cut.write(number, text, &mut ours);
            event(number, text, &mut theirs);
            assert_eq!(ours, theirs);
        }
        // A writer without a number: the number is not written.
        let text_only = Cut::of(|_, text, out| event(7, text, out)).unwrap();
        let mut ours = Vec::new();
        text_only.write(1, "t", &mut ours);
        assert_eq!(ours, b"data: {\"n\":7,\"text\":\"t\"}\n\n");
    }

    #[test]
    fn a_writer_that_does_not_cut_so_has_no_cut() {
        // The text before the number; the number written twice; the text
        // written twice; a number not in digits; the text not a string.
        let text_first = |n: u64, text: &str, out: &mut Vec<u8>| {
            write(out, text);
            out.extend_from_slice(n.to_string().as_bytes());
        };
        let twice = |n: u64, text: &str, out: &mut Vec<u8>| {
            event(n, text, out);
            out.extend_from_slice(n.to_string().as_bytes());
        };
        let text_twice = |n: u64, text: &str, out: &mut Vec<u8>| {
            event(n, text, out);
            write(out, text);
        };
        let words = |n: u64, text: &str, out: &mut Vec<u8>| {
            out.extend_from_slice(if n == 0 { b"zero" } else { b"more" });
            write(out, text);
        };
        let length = |n: u64, text: &str, out: &mut Vec<u8>| {
            event(n, &text.len().to_string(), out);
        };
        assert!(Cut::of(text_first).is_none());
        assert!(Cut::of(twice).is_none());
        assert!(Cut::of(text_twice).is_none());
        assert!(Cut::of(words).is_none());
        assert!(Cut::of(length).is_none());
    }
}

//! Chunking: a document's text cut into pieces of at most `size`
//! characters, each overlapping the one before by about `overlap`, cut
//! where the text breaks (a blank line, else a line end, else a space)
//! rather than mid-word. Pure: text in, chunks out.

/// The chunks of `text`, trimmed, empty ones left out. `overlap` must be
/// below `size` (the config checks it).
pub fn chunks(text: &str, size: usize, overlap: usize) -> Vec<String> {
    let size = size.max(1);
    let overlap = overlap.min(size - 1);
    // Byte offset of every char, and the end: windows are counted in chars.
    let at: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    let chars = at.len() - 1;
    let mut out = Vec::new();
    let mut start = 0;
    while start < chars {
        let mut end = (start + size).min(chars);
        if end < chars {
            end = break_before(text, &at, start + size / 2, end).unwrap_or(end);
        }
        let piece = text[at[start]..at[end]].trim();
        if !piece.is_empty() {
            out.push(piece.to_owned());
        }
        if end == chars {
            break;
        }
        // The next chunk begins `overlap` back, at a word's start when one
        // is near, and always further on than this one began.
        let mut next = end.saturating_sub(overlap).max(start + 1);
        if next < end {
            if let Some(word) = (next..end).find(|&i| i > 0 && is_space(text, &at, i - 1)) {
                next = word;
            }
        }
        start = next;
    }
    out
}

fn is_space(text: &str, at: &[usize], i: usize) -> bool {
    text[at[i]..at[i + 1]].chars().all(char::is_whitespace)
}

/// The best place to end a chunk within (`from`, `to`]: after a blank
/// line, else after a line end, else after a space; the latest of the kind.
fn break_before(text: &str, at: &[usize], from: usize, to: usize) -> Option<usize> {
    let window = &text[at[from]..at[to]];
    let to_char = |byte: usize| from + text[at[from]..at[from] + byte].chars().count();
    for separator in ["\n\n", "\n", " "] {
        if let Some(found) = window.rfind(separator) {
            let end = to_char(found + separator.len());
            if end > from {
                return Some(end);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn paragraphs_are_kept_whole_when_they_fit() {
        let text = "First paragraph here.\n\nSecond one, a bit longer.\n\nThird.";
        assert_eq!(
            chunks(text, 30, 5),
            [
                "First paragraph here.",
                "Second one, a bit longer.",
                "Third."
            ]
        );
        // Within a paragraph, chunks overlap by whole words.
        let long = "alpha beta gamma delta epsilon zeta eta theta iota kappa";
        assert_eq!(
            chunks(long, 25, 10),
            [
                "alpha beta gamma delta",
                "delta epsilon zeta eta",
                "zeta eta theta iota kappa"
            ]
        );
        assert_eq!(chunks("short", 100, 10), ["short"]);
        assert!(chunks("  \n ", 10, 2).is_empty());
    }

    proptest! {
        /// Chunks stay within `size` characters, follow the text in order,
        /// and every word of the text is in one of them.
        #[test]
        fn bounded_in_order_and_covering(
            words in proptest::collection::vec("[a-zé]{1,12}|\n\n|\n", 0..200),
            size in 8usize..200,
            overlap_part in 0usize..100,
        ) {
            let text = words.join(" ");
            let overlap = overlap_part * (size - 1) / 100;
            let got = chunks(&text, size, overlap);
            for chunk in &got {
                prop_assert!(chunk.chars().count() <= size);
            }
            let mut from = 0;
            for chunk in &got {
                let at = text[from..].find(chunk.as_str()).map(|i| from + i);
                prop_assert!(at.is_some(), "{chunk:?} not found after {from}");
                from = at.unwrap_or(from);
            }
            for word in text.split_whitespace().filter(|w| w.chars().count() < size / 2) {
                prop_assert!(got.iter().any(|c| c.contains(word)), "{word:?} lost");
            }
        }
    }
}

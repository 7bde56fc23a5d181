//! An answer's text as it grows, a macro step at a time: its tokens turned
//! into text one by one (end-of-generation and special tokens leave none),
//! cut at the first stop string, and the tail that may still become one held
//! back. Stop strings are searched incrementally: only the new text and the
//! longest stop string's tail before it, so an answer costs time linear in
//! its length, and the tokens a stop string keeps are known from the text's
//! length after each token (no decoding again).

use std::collections::HashSet;

use hamburger::tokenizer::{TextStream, Tokenizer};

/// The text of one answer.
pub(super) struct AnswerText<'t> {
    detok: TextStream<'t>,
    /// Texts that end the answer.
    stop: Vec<String>,
    /// The longest stop string's length in bytes.
    longest_stop: usize,
    /// The text so far (cut at a stop string).
    text: String,
    /// `ends[i]`: the text's length after token `i` (only kept with stop strings).
    ends: Vec<usize>,
    /// Bytes of `text` already searched for stop strings.
    searched: usize,
    /// The tokens up to the one that completed a stop string, once one did.
    stopped_at: Option<usize>,
    /// The stop string that ended the answer, once one did.
    stop_word: Option<String>,
}

impl<'t> AnswerText<'t> {
    /// An empty answer in `tokenizer`'s text, ending at any of `stop`.
    pub(super) fn new(tokenizer: &'t Tokenizer, stop: Vec<String>) -> AnswerText<'t> {
        let longest_stop = stop.iter().map(String::len).max().unwrap_or(0);
        AnswerText {
            detok: TextStream::new(tokenizer),
            stop,
            longest_stop,
            text: String::new(),
            ends: Vec::new(),
            searched: 0,
            stopped_at: None,
            stop_word: None,
        }
    }

    /// Whether the answer has stop strings (its text is then needed at every step).
    pub(super) fn has_stop_strings(&self) -> bool {
        !self.stop.is_empty()
    }

    /// The text so far.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// The tokens up to the one that completed a stop string, once one did.
    pub(super) fn stopped_at(&self) -> Option<usize> {
        self.stopped_at
    }

    /// The stop string that ended the answer, once one did.
    pub(super) fn stop_word(&self) -> Option<&str> {
        self.stop_word.as_deref()
    }

    /// Appends the text of `ids` (those in `hidden` leave none); with `last`,
    /// also the text held back for an incomplete UTF-8 character. Returns
    /// whether a stop string ended the answer (the text is then cut before
    /// it, and [`AnswerText::stopped_at`] counts the tokens kept).
    pub(super) fn push(&mut self, ids: &[u32], hidden: &HashSet<u32>, last: bool) -> bool {
        if self.stopped_at.is_some() {
            return false;
        }
        if self.stop.is_empty() {
            let visible: Vec<u32> = ids.iter().copied().filter(|t| !hidden.contains(t)).collect();
            self.text.push_str(&self.detok.push(&visible));
        } else {
            for &t in ids {
                if !hidden.contains(&t) {
                    self.text.push_str(&self.detok.push(&[t]));
                }
                self.ends.push(self.text.len());
            }
        }
        if last {
            self.text.push_str(&self.detok.finish());
            if let Some(end) = self.ends.last_mut() {
                *end = self.text.len();
            }
        }
        self.cut_at_stop_string()
    }

    /// Cuts the text at the first stop string in the text not yet searched
    /// (a match may start up to the longest stop string's length before it).
    fn cut_at_stop_string(&mut self) -> bool {
        let mut from = self.searched.saturating_sub(self.longest_stop.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let tail = &self.text[from..];
        let found = self
            .stop
            .iter()
            .enumerate()
            .filter_map(|(i, s)| tail.find(s.as_str()).map(|at| (from + at, s.len(), i)))
            .min();
        self.searched = self.text.len();
        let Some((at, len, which)) = found else { return false };
        self.stop_word = Some(self.stop[which].clone());
        self.text.truncate(at);
        // The first token whose text completes the stop string ends the answer.
        self.stopped_at = Some(self.ends.iter().position(|&end| end >= at + len).map_or(self.ends.len(), |i| i + 1));
        true
    }

    /// Where the text that may be sent ends: all of it once the answer is
    /// `done`, else all but the longest tail that begins a stop string.
    pub(super) fn sendable(&self, done: bool) -> usize {
        let text = &self.text;
        if done {
            return text.len();
        }
        let held = self
            .stop
            .iter()
            .flat_map(|s| (1..s.len()).filter(move |&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|prefix| text.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        text.len() - held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-hamburger/tokenizer.json");
        Tokenizer::from_json(&std::fs::read_to_string(dir).unwrap(), 512, None, false).unwrap()
    }

    #[test]
    fn a_stop_string_split_over_steps_cuts_the_text_and_counts_the_tokens_to_it() {
        let tok = tokenizer();
        let ids = tok.encode("one two three four five", false).unwrap();
        let text = tok.decode(&ids);
        let cut = text.find("three").unwrap();
        let mut answer = AnswerText::new(&tok, vec!["three".into(), "zzz".into()]);
        let mut stopped = false;
        for step in ids.chunks(2) {
            stopped = answer.push(step, &HashSet::new(), false);
            if stopped {
                break;
            }
            let sendable = &answer.text()[..answer.sendable(false)];
            assert!(!sendable.contains("thr"), "a tail that may become a stop string is held: {sendable:?}");
        }
        assert!(stopped);
        assert!(!answer.push(&ids, &HashSet::new(), true), "nothing is added after the stop");
        assert_eq!(answer.text(), &text[..cut]);
        let n = answer.stopped_at().unwrap();
        assert!(tok.decode(&ids[..n]).contains("three") && !tok.decode(&ids[..n - 1]).contains("three"), "{n}");
    }

    #[test]
    fn hidden_tokens_leave_no_text() {
        let tok = tokenizer();
        let ids = tok.encode("red green", false).unwrap();
        let mut answer = AnswerText::new(&tok, Vec::new());
        let hidden: HashSet<u32> = ids.iter().copied().collect();
        assert!(!answer.push(&ids, &hidden, true));
        assert_eq!(answer.text(), "");
    }
}

//! Copy candidates of a draft head that copies (`draft_copy.weight`,
//! `hamburger.draft_copy_ngram` M): where the head misses a token the base
//! is sure of, the token is mostly a copy of the text before it (a name of
//! the prompt, a phrase the answer repeats), which a micro decoder reading
//! one row's features cannot see. So at each token it is fed, such a head
//! also reads what followed the latest earlier occurrence of the text's last
//! M, M-1, ..., 1 tokens, one token each: the lookup of `ngram-simple`
//! ([`super::ngram::draft`]), in the text so far (prompt, answer and the
//! drafts before the token), as `hamburger-train draft --copy M` trained it.

use super::ngram;

/// The copy candidates of `text`'s last token, longest n-gram first: for
/// each m from `longest` down to 1, the token that followed the latest
/// earlier occurrence of the last m tokens (None where they did not occur before).
pub fn candidates(text: &[u32], longest: usize) -> impl Iterator<Item = Option<u32>> + '_ {
    (1..=longest).rev().map(move |m| ngram::draft(text, m, 1).first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_size_names_what_followed_its_latest_earlier_match() {
        //          0  1  2  3  4  5  6  7
        let text = [5, 6, 7, 9, 6, 8, 5, 6];
        // [5, 6] ended at 1, followed by 7; [6] last ended at 4, followed by 8.
        assert_eq!(candidates(&text, 2).collect::<Vec<_>>(), [Some(7), Some(8)]);
        // [8, 5, 6] never occurred before.
        assert_eq!(candidates(&text, 3).collect::<Vec<_>>(), [None, Some(7), Some(8)]);
        assert_eq!(candidates(&[4], 2).collect::<Vec<_>>(), [None, None]);
        assert_eq!(candidates(&text, 0).count(), 0);
    }
}

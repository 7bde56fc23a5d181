//! Drafts from the context itself (llama.cpp's `ngram-simple` speculative
//! type): where the context's last `n` tokens occurred before, the tokens
//! that followed them then are a draft of what follows now. A small model's
//! greedy answers repeat themselves (lists, code, phrases of the prompt), and
//! there such a draft is accepted far more often than the micro decoder's;
//! it costs no micro step, only its rows in the next verify forward.
//! Self-verified decoding (`--spec-type ngram-simple,draft-mtp`) drafts from
//! the context first and with the micro decoder where the context has no
//! match.

/// The n-gram size llama.cpp's `--spec-ngram-simple-size-n` sets here: the
/// context's last 2 tokens, measured on the ShareGPT held-out answers of
/// the project's SmolLM2-HAMburger as the size whose drafts, in place of the
/// micro decoder's where they exist, are accepted most per verify forward.
pub const DEFAULT_SIZE: usize = 2;

/// The (up to) `k` tokens that followed the latest earlier occurrence of the
/// last `n` tokens of `context` (empty where they did not occur before, or
/// where the context is not longer than `n`).
pub fn draft(context: &[u32], n: usize, k: usize) -> &[u32] {
    if n == 0 || context.len() <= n {
        return &[];
    }
    let key = &context[context.len() - n..];
    (n..context.len())
        .rev()
        .find(|&end| &context[end - n..end] == key)
        .map_or(&[], |end| &context[end..(end + k).min(context.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_earlier_occurrence_drafts_what_followed_it() {
        //                 0  1  2  3  4  5  6  7  8
        let context = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2];
        assert_eq!(draft(&context, 2, 3), [5, 6, 1], "the latest [1, 2] (at 4) is followed by 5, 6, 1");
        assert_eq!(draft(&context, 3, 3), [] as [u32; 0], "[6, 1, 2] never occurred before");
        assert_eq!(draft(&context, 1, 2), [5, 6], "the latest earlier 2 (at 5)");
        assert_eq!(draft(&[7, 8, 7, 8], 2, 3), [7, 8], "a match near the end drafts what there is");
        assert_eq!(draft(&[7, 7], 2, 3), [] as [u32; 0], "a context no longer than n");
        assert_eq!(draft(&context, 0, 3), [] as [u32; 0]);
    }
}

//! The engine's slots (one sequence each) and what their KV cells hold
//! between requests, for prompt-prefix reuse as llama-server's
//! `cache_prompt`: a finished request leaves its cells in its slot, and a new
//! request goes to the free slot whose cells start with the longest part of
//! its prompt (a chat's previous turn, a shared system prompt).

use hamburger::kv_cache::SeqId;

/// What a slot's cells hold between requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Cached {
    /// The tokens whose entries the cells hold, in order (prompt tokens, then
    /// the generated tokens as they were fed).
    pub(super) tokens: Vec<u32>,
    /// How many leading tokens' cells are what a fresh read of a prompt that
    /// long computes (0: none known), for [`hamburger::row_class::reusable_prefix`].
    pub(super) alike: usize,
}

/// A slot taken for a new prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Taken {
    /// The slot's sequence.
    pub(super) seq: SeqId,
    /// The length of the common start of the prompt and the slot's tokens.
    pub(super) common: usize,
    /// The slot's [`Cached::alike`].
    pub(super) alike: usize,
}

/// The free slots and what each slot's cells hold.
pub(super) struct Slots {
    /// Free slots, the least recently freed first.
    free: Vec<SeqId>,
    /// `held[seq]`: what slot `seq`'s cells hold.
    held: Vec<Cached>,
}

impl Slots {
    /// `n` free slots holding nothing.
    pub(super) fn new(n: usize) -> Slots {
        Slots { free: (0..n).collect(), held: vec![Cached::default(); n] }
    }

    /// How many slots are free.
    pub(super) fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Takes the free slot whose cells hold the longest start of `prompt`
    /// (when `reuse`; ties and no match: the least recently freed, whose
    /// cells are the least likely to serve again).
    pub(super) fn take(&mut self, prompt: &[u32], reuse: bool) -> Option<Taken> {
        let common = |seq: SeqId| if reuse { common_prefix(&self.held[seq].tokens, prompt) } else { 0 };
        let (i, common) =
            self.free.iter().enumerate().map(|(i, &seq)| (i, common(seq))).rev().max_by_key(|&(_, n)| n)?;
        let seq = self.free.remove(i);
        let alike = std::mem::take(&mut self.held[seq]).alike;
        Some(Taken { seq, common, alike })
    }

    /// Frees slot `seq`, whose cells hold `held`.
    pub(super) fn give_back(&mut self, seq: SeqId, held: Cached) {
        self.held[seq] = held;
        self.free.push(seq);
    }
}

/// The length of the common start of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_goes_to_the_slot_holding_its_longest_start() {
        let mut slots = Slots::new(3);
        let held = |tokens: &[u32], alike| Cached { tokens: tokens.to_vec(), alike };
        let taken = |seq, common, alike| Some(Taken { seq, common, alike });
        let (a, b, c) = (slots.take(&[1], true), slots.take(&[1], true), slots.take(&[1], true));
        assert_eq!((a, b), (taken(0, 0, 0), taken(1, 0, 0)), "nothing held: the least recently freed first");
        assert_eq!(c, taken(2, 0, 0));
        assert_eq!(slots.n_free(), 0);
        assert_eq!(slots.take(&[1], true), None);
        slots.give_back(0, held(&[5, 6, 7, 8], 4));
        slots.give_back(1, held(&[5, 6, 9], 2));
        slots.give_back(2, held(&[1, 2], 0));
        assert_eq!(slots.take(&[5, 6, 9, 10], true), taken(1, 3, 2));
        // Without reuse, or with no common start: the least recently freed.
        slots.give_back(1, held(&[5, 6, 9], 2));
        assert_eq!(slots.take(&[5, 6, 7], false), taken(0, 0, 4));
        assert_eq!(slots.take(&[3], true), taken(2, 0, 0));
        assert_eq!(slots.take(&[5, 6, 7], true), taken(1, 2, 2));
    }
}

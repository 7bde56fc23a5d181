//! The engine's slots (one sequence each) and what their KV cells hold
//! between requests, for prompt-prefix reuse as llama-server's
//! `cache_prompt`: a finished request leaves its cells in its slot, and a new
//! request goes to the free slot whose cells start with the longest part of
//! its prompt (a chat's previous turn, a shared system prompt).

use hamburger::kv_cache::SeqId;

/// The free slots and the tokens each slot's cells hold.
pub(super) struct Slots {
    /// Free slots, the least recently freed first.
    free: Vec<SeqId>,
    /// `held[seq]`: the tokens whose entries slot `seq`'s cells hold, in
    /// order (prompt tokens, then the generated tokens as they were fed).
    held: Vec<Vec<u32>>,
}

impl Slots {
    /// `n` free slots holding nothing.
    pub(super) fn new(n: usize) -> Slots {
        Slots { free: (0..n).collect(), held: vec![Vec::new(); n] }
    }

    /// How many slots are free.
    pub(super) fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Takes the free slot whose cells hold the longest start of `prompt`
    /// (when `reuse`; ties and no match: the least recently freed, whose
    /// cells are the least likely to serve again), and returns it with the
    /// length of that common start.
    pub(super) fn take(&mut self, prompt: &[u32], reuse: bool) -> Option<(SeqId, usize)> {
        let common = |seq: SeqId| if reuse { common_prefix(&self.held[seq], prompt) } else { 0 };
        let (i, n) = self.free.iter().enumerate().map(|(i, &seq)| (i, common(seq))).rev().max_by_key(|&(_, n)| n)?;
        let seq = self.free.remove(i);
        self.held[seq].clear();
        Some((seq, n))
    }

    /// Frees slot `seq`, whose cells hold the entries of `held`.
    pub(super) fn give_back(&mut self, seq: SeqId, held: Vec<u32>) {
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
        let (a, b, c) = (slots.take(&[1], true).unwrap(), slots.take(&[1], true).unwrap(), slots.take(&[1], true));
        assert_eq!((a, b), ((0, 0), (1, 0)), "nothing held: the least recently freed first");
        assert_eq!(c, Some((2, 0)));
        assert_eq!(slots.n_free(), 0);
        assert_eq!(slots.take(&[1], true), None);
        slots.give_back(0, vec![5, 6, 7, 8]);
        slots.give_back(1, vec![5, 6, 9]);
        slots.give_back(2, vec![1, 2]);
        assert_eq!(slots.take(&[5, 6, 9, 10], true), Some((1, 3)));
        // Without reuse, or with no common start: the least recently freed.
        slots.give_back(1, vec![5, 6, 9]);
        assert_eq!(slots.take(&[5, 6, 7], false), Some((0, 0)));
        assert_eq!(slots.take(&[3], true), Some((2, 0)));
        assert_eq!(slots.take(&[5, 6, 7], true), Some((1, 2)));
    }
}

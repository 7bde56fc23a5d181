//! A batch of base inputs, possibly of several sequences, for ONE base
//! forward: each input is one token, or the tokens of a macro step merged
//! into one input by the compositional embedder. Each input writes one KV
//! cell; the last input of each sequence in the batch yields outputs
//! (logits, stop probability, features for the micro decoder), and so does
//! every input pushed as an output row (the drafted tokens a self-verified
//! forward checks, [`Batch::push_output_rows`]). A self-verified forward
//! may check a tree of drafts: after the chain of drafted tokens come
//! sibling rows ([`Batch::push_sibling_row`]), each an alternative to one
//! of them, at its position, and each row attends only its own path.

use crate::memory::kv_cache::SeqId;

/// One input of a base forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseInput {
    /// The sequence it belongs to.
    pub seq: SeqId,
    /// Where its tokens start in [`Batch::tokens`].
    pub first: usize,
    /// Its token count: 1, or k > 1 tokens merged into one input.
    pub n_tokens: usize,
    /// Whether it yields outputs even when it is not its sequence's last input.
    pub output: bool,
    /// A sibling row: an alternative to a drafted token, at its position,
    /// attended by no other row; the value is how many positions that
    /// token lies before the sequence's last input that is no sibling.
    pub sibling: Option<usize>,
}

/// The inputs of one base forward, in the order they were added.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    tokens: Vec<u32>,
    inputs: Vec<BaseInput>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds `tokens` of `seq`, each its own input (a prompt).
    pub fn push_tokens(&mut self, seq: SeqId, tokens: &[u32]) {
        self.push_rows(seq, tokens, false);
    }

    /// Adds `tokens` of `seq`, each its own input and each an output row: a
    /// self-verified forward reads the base's distribution after every one
    /// (the last committed token and the drafted tokens that follow it).
    pub fn push_output_rows(&mut self, seq: SeqId, tokens: &[u32]) {
        self.push_rows(seq, tokens, true);
    }

    /// Adds `token` of `seq` as a sibling row: an output row at the position
    /// of the drafted token `back` positions before the last input of `seq`
    /// that is no sibling, which it replaces on its path: it attends the
    /// cells that token attends but that token's own (and the other rows'
    /// at its position), and no other row attends it (a tree of drafts,
    /// EAGLE-2's). Siblings go after the chain, so the chain's rows attend
    /// their cells in the order a chain alone gives them.
    pub fn push_sibling_row(&mut self, seq: SeqId, token: u32, back: usize) {
        self.push_row(seq, token, true, Some(back));
    }

    fn push_rows(&mut self, seq: SeqId, tokens: &[u32], output: bool) {
        for &t in tokens {
            self.push_row(seq, t, output, None);
        }
    }

    fn push_row(&mut self, seq: SeqId, token: u32, output: bool, sibling: Option<usize>) {
        self.inputs.push(BaseInput { seq, first: self.tokens.len(), n_tokens: 1, output, sibling });
        self.tokens.push(token);
    }

    /// Adds `tokens` of `seq` (a macro step's output) merged into ONE input.
    pub fn push_merged(&mut self, seq: SeqId, tokens: &[u32]) {
        if tokens.is_empty() {
            return;
        }
        self.inputs.push(BaseInput {
            seq,
            first: self.tokens.len(),
            n_tokens: tokens.len(),
            output: false,
            sibling: None,
        });
        self.tokens.extend_from_slice(tokens);
    }

    /// The inputs.
    pub fn inputs(&self) -> &[BaseInput] {
        &self.inputs
    }

    /// The tokens of `input`.
    pub fn tokens_of(&self, input: &BaseInput) -> &[u32] {
        &self.tokens[input.first..input.first + input.n_tokens]
    }

    /// Every token, inputs one after another.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether there is no input.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// The sequences of the batch in order of first appearance: the order of
    /// the outputs of the forward.
    pub fn seqs(&self) -> Vec<SeqId> {
        let mut seqs: Vec<SeqId> = Vec::new();
        for i in &self.inputs {
            if !seqs.contains(&i.seq) {
                seqs.push(i.seq);
            }
        }
        seqs
    }
}

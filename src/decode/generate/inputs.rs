//! What one sequence puts into a base forward: the entries a resumed
//! sequence writes again, the tokens it committed and has not fed
//! ([`Pending`]: a merged macro step, tokens fed one input each), its
//! prompt, and self-verified, its drafts, within the forward's budget of
//! inputs.

use super::SeqGen;
use crate::decode::tree;
use crate::memory::batch::Batch;
use crate::memory::kv_cache::SeqId;
use crate::memory::row_class::fresh_chunk;

/// Tokens a sequence has committed and not fed yet: the next base forward
/// takes them first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// The last macro step's tokens, fed as ONE merged input.
    pub merged: Vec<u32>,
    /// Tokens fed one input each: those a grammar forced (which the micro
    /// decoder never saw, so they are not merged) and, self-verified, the
    /// last verified token.
    pub plain: Vec<u32>,
}

impl Pending {
    /// Base inputs these tokens take.
    pub fn n_inputs(&self) -> usize {
        usize::from(!self.merged.is_empty()) + self.plain.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.n_inputs() == 0
    }

    /// Adds them to `batch` as inputs of `seq`, merged first.
    pub fn push_to(&self, batch: &mut Batch, seq: SeqId) {
        batch.push_merged(seq, &self.merged);
        batch.push_tokens(seq, &self.plain);
    }
}

/// What a sequence put into one base forward.
pub(super) struct Fed {
    /// Its index in the sequences.
    pub(super) index: usize,
    /// Drafted rows fed (self-verified: a tree's siblings included), each an output row.
    pub(super) drafts: usize,
    /// Whether everything committed is fed: its outputs are the next token's.
    pub(super) complete: bool,
    /// Prompt tokens fed, and the rows of the chunk a fresh read of the
    /// prompt puts them in ([`crate::memory::row_class::fresh_chunk`]).
    pub(super) prompt: (usize, usize),
}

/// Adds what `sg` has to feed to `batch`, within `budget` inputs: the
/// entries it writes again after a preemption (each input as it was first
/// written; nothing else until they are all fed), then its pending tokens
/// (the merged input whole, the plain ones in order), then its prompt up to
/// the end of the chunk a fresh read would put it in (chunks end at
/// multiples of `n_batch` positions; `next_pos` is the sequence's next
/// position in the cache); then, when all of that fits, its drafts (whole,
/// or none: drafts that do not fit are dropped), the last committed token
/// and each drafted one an output row (a tree's siblings after the chain,
/// [`tree::rows`]).
pub(super) fn feed(
    sg: &mut SeqGen,
    index: usize,
    batch: &mut Batch,
    budget: &mut usize,
    next_pos: usize,
    n_batch: usize,
) -> Fed {
    let seq = sg.seq;
    let refed = sg.refeed.len().min(*budget);
    let mut next_pos = next_pos;
    for input in sg.refeed.drain(..refed) {
        batch.push_merged(seq, &input);
        next_pos += input.len();
    }
    *budget -= refed;
    if !sg.refeed.is_empty() || (refed > 0 && *budget == 0) {
        return Fed { index, drafts: 0, complete: false, prompt: (0, 0) };
    }
    let pos = next_pos + sg.pending.merged.len();
    if !sg.pending.merged.is_empty() {
        batch.push_merged(seq, &std::mem::take(&mut sg.pending.merged));
        *budget = budget.saturating_sub(1);
    }
    let plain: Vec<u32> = sg.pending.plain.drain(..(*budget).min(sg.pending.plain.len())).collect();
    *budget -= plain.len();
    let pos = pos + plain.len();
    let (start, end) = fresh_chunk(pos, pos + sg.prompt.len() - sg.fed, n_batch.max(1));
    let prompt = if sg.pending.plain.is_empty() { (*budget).min(end - pos) } else { 0 };
    *budget -= prompt;
    let complete = sg.pending.plain.is_empty() && sg.fed + prompt == sg.prompt.len();
    let n_drafts = sg.draft.n_rows();
    // Drafts follow a verified token, the one plain input (no forced token, no prompt).
    let drafts = if complete && prompt == 0 && plain.len() == 1 && n_drafts <= *budget { n_drafts } else { 0 };
    if drafts < n_drafts {
        sg.drop_draft();
    }
    *budget -= drafts;
    if drafts > 0 {
        batch.push_output_rows(seq, &plain);
        let chain = sg.draft.tokens.len();
        for node in tree::rows(&sg.draft.tokens, &sg.draft.siblings) {
            if node.sibling {
                batch.push_sibling_row(seq, node.token, chain - node.depth);
            } else {
                batch.push_output_rows(seq, &[node.token]);
            }
        }
    } else {
        batch.push_tokens(seq, &plain);
    }
    batch.push_tokens(seq, &sg.prompt[sg.fed..sg.fed + prompt]);
    sg.fed += prompt;
    Fed { index, drafts, complete, prompt: (prompt, end - start) }
}

//! One micro step of the micro-step decoder for a batch of sequences. Step 0
//! feeds each sequence's base features and embed(t_0) at micro positions
//! 0..=F; step s > 0 feeds embed(t_s) at position F+s, attending to the
//! sequence's micro cache. No final norm.
//!
//! The micro cache gives each sequence a fixed range of cells, one per micro
//! position (F features + S - 1 token embeddings), rewritten every macro step.
//!
//! A draft head with a copy matrix adds `copy . [embed(c_M); ...; embed(c_1)]`
//! to each drafting token's embedding: its copy candidates, given per input
//! ([`crate::decode::copy`]), a missing one a zero vector (its row masked).

use std::rc::Rc;

use ggml::{Backend, Tensor, Type};

use super::layer::{decoder_layer, AttnGroup, AttnInputs, LayerCtx, Row};
use super::{finish, start, token_input, StepGraph, Stops};
use crate::error::Result;
use crate::memory::kv_cache::{KvCache, SeqId, Window};
use crate::model::hparams::HParams;
use crate::model::Model;

/// Cells of the micro cache per sequence: F features + S - 1 token embeddings.
pub fn cells_per_seq(hp: &HParams) -> usize {
    hp.n_features() + hp.max_steps - 1
}

/// The shape a micro graph is built for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MicroShape {
    /// Step 0 (features and t_0 per sequence) or a later step (one token per sequence).
    pub first: bool,
    /// Sequences stepped together.
    pub n_seqs: usize,
    /// Cache cells attended (the whole micro cache).
    pub n_kv: usize,
    /// Whether to compute the stop head.
    pub stop_head: bool,
    /// Whether the sequences draft with the model's draft head ([`MicroWants::drafts`]).
    pub drafts: bool,
    /// Whether the logits are the draft vocabulary's ([`MicroWants::draft_vocab`]).
    pub draft_vocab: bool,
    /// Copy candidates per input (M of a drafting head that copies; 0: none read).
    pub copies: usize,
}

/// What a micro step computes beyond its micro-cache entries and the next
/// token's argmax (the micro step's counterpart of [`super::base::Wants`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroWants {
    /// The next token's stop probability (only when the step length can depend on it).
    pub stop_head: bool,
    /// The next token's logits read back (for sampling or inspection).
    pub logits: bool,
    /// Every sequence drafts for self-verified decoding (never a macro
    /// step's tokens): the step runs the model's draft head (micro decoder
    /// and stop head), where it has one.
    pub drafts: bool,
    /// The next token is drawn from the model's draft vocabulary, where it
    /// has one: drafts that no grammar masks.
    pub draft_vocab: bool,
}

/// Where the sequences of one micro step go in the graph, and the values of its inputs.
pub struct MicroLayout {
    /// The graph's shape.
    pub shape: MicroShape,
    tokens: Vec<i32>,
    /// Each input's copy candidates, longest n-gram first (0 where none)...
    copy_ids: Vec<i32>,
    /// ...and 1 where there is one, 0 where none (the row's factor).
    copy_mask: Vec<f32>,
    /// Step 0: for each row, its column in `[features | embeddings]`.
    gather: Vec<i32>,
    /// The rows in graph order (each sequence's token row last).
    pub rows: Vec<Row>,
}

impl MicroLayout {
    /// Lays out micro step `s` feeding `token` to each `(seq, token)`, with
    /// `n_feature_cols` columns in the feature store, of which step 0 reads
    /// slot `feature_slots[j]` (columns `slot * F..(slot + 1) * F`) for input
    /// `j`, and `n_kv` micro cells, computing what `want` asks for (the
    /// caller asks for the draft vocabulary and the draft head only when the
    /// model has them). A drafting head that copies (`hp.draft_copy_ngram`
    /// M > 0) reads `copies`: M candidates per input, longest n-gram first,
    /// or none at all (empty: no candidate anywhere).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hp: &HParams,
        s: usize,
        inputs: &[(SeqId, u32)],
        copies: &[Option<u32>],
        feature_slots: &[usize],
        n_feature_cols: usize,
        n_kv: usize,
        want: MicroWants,
    ) -> MicroLayout {
        let (f, len) = (hp.n_features(), cells_per_seq(hp));
        let row = |seq: SeqId, pos: usize| Row { seq, pos: pos as i32, cell: seq * len + pos, sibling: false };
        let (rows, gather) = if s == 0 {
            let feature_rows = inputs
                .iter()
                .zip(feature_slots)
                .flat_map(|(&(seq, _), &slot)| (0..f).map(move |p| (row(seq, p), slot * f + p)));
            let token_rows = inputs.iter().enumerate().map(|(j, &(seq, _))| (row(seq, f), n_feature_cols + j));
            feature_rows.chain(token_rows).map(|(r, c)| (r, c as i32)).unzip()
        } else {
            (inputs.iter().map(|&(seq, _)| row(seq, f + s)).collect(), Vec::new())
        };
        let n_copies = if want.drafts { hp.draft_copy_ngram } else { 0 };
        let candidates = (0..inputs.len() * n_copies).map(|i| copies.get(i).copied().flatten());
        let (copy_ids, copy_mask) =
            candidates.map(|c| (c.unwrap_or(0) as i32, f32::from(u8::from(c.is_some())))).unzip();
        MicroLayout {
            shape: MicroShape {
                first: s == 0,
                n_seqs: inputs.len(),
                n_kv,
                stop_head: want.stop_head,
                drafts: want.drafts,
                draft_vocab: want.draft_vocab,
                copies: n_copies,
            },
            tokens: inputs.iter().map(|&(_, t)| t as i32).collect(),
            copy_ids,
            copy_mask,
            gather,
            rows,
        }
    }
}

/// The input tensors of a micro graph.
pub struct MicroInputs {
    tokens: Tensor,
    /// The copy candidates' ids and mask, where the head copies.
    copies: Option<(Tensor, Tensor)>,
    gather: Option<Tensor>,
    attn: AttnInputs,
}

impl MicroInputs {
    /// Writes the values of `layout` (whose cells `cache` already holds).
    ///
    /// # Errors
    /// When a tensor cannot be written.
    pub fn set(&self, cache: &KvCache, layout: &MicroLayout) -> Result<()> {
        self.tokens.write(&layout.tokens)?;
        if let Some((ids, mask)) = &self.copies {
            ids.write(&layout.copy_ids)?;
            mask.write(&layout.copy_mask)?;
        }
        if let Some(t) = &self.gather {
            t.write(&layout.gather)?;
        }
        self.attn.set(cache, &layout.rows)
    }
}

/// Builds the micro graph of `shape` over the micro cache `cache`, reading
/// the feature store `features [D, F * R * n_seq]` at step 0.
///
/// # Errors
/// When the graph cannot be allocated.
pub fn build(
    model: &Model,
    cache: &KvCache,
    features: &Tensor,
    shape: &MicroShape,
    flash: bool,
    backends: &[Rc<Backend>],
) -> Result<StepGraph<MicroInputs>> {
    let (hp, w) = (&model.hp, &model.weights);
    let mut gs = start(hp.n_micro_layer, 1)?;
    let g = gs.g.clone();
    let tokens = token_input(&g, shape.n_seqs);
    let micro_head = w.grafted()?.head_for(shape.drafts);
    let mut e = g.get_rows(&w.tok_embd, &tokens); // [D, n_seqs]
    let copies = match &micro_head.copy {
        Some(copy) if shape.copies > 0 => {
            let n = (shape.copies * shape.n_seqs) as i64;
            let ids = g.new_tensor(Type::I32, &[n]).named("inp_copy");
            let mask = g.new_tensor(Type::F32, &[1, n]).named("inp_copy_mask");
            ids.set_input();
            mask.set_input();
            let c = g.mul(&g.get_rows(&w.tok_embd, &ids), &mask); // [D, M * n_seqs], none zero
            let c = g.reshape(&c, &[(shape.copies * hp.n_embd) as i64, shape.n_seqs as i64]);
            e = g.add(&e, &g.mul_mat(copy, &c));
            Some((ids, mask))
        }
        _ => None,
    };
    let n_rows = if shape.first { shape.n_seqs * (hp.n_features() + 1) } else { shape.n_seqs };
    let gather = shape.first.then(|| {
        let t = g.new_tensor(Type::I32, &[n_rows as i64]).named("inp_gather");
        t.set_input();
        t
    });
    let mut x = match &gather {
        Some(idx) => g.get_rows(&g.concat(features, &e, 1), idx), // [D, n_seqs * (F+1)]
        None => e,
    };
    let attn = AttnInputs::new(
        &g,
        cache,
        hp.n_embd_kv(),
        n_rows,
        &[AttnGroup { n_rows, window: Window { first: 0, n_kv: shape.n_kv } }],
        flash,
    );
    let lc = LayerCtx { hp, cache, attn: &attn, rope_freqs: w.rope_freqs.as_ref() };
    let last = hp.n_micro_layer - 1;
    for (il, lw) in micro_head.micro.iter().enumerate() {
        x = decoder_layer(&g, &mut gs.gf, &lc, lw, il, &x, (il == last).then_some(shape.n_seqs));
    }
    let lm_head = match (&model.draft_vocab, shape.draft_vocab) {
        (Some(d), true) => &d.head,
        _ => w.lm_head(),
    };
    let stops = Stops { p_stop: shape.stop_head.then_some(&micro_head.stop), p_stop_draft: None };
    finish(gs, backends, lm_head, &x, stops, MicroInputs { tokens, copies, gather, attn })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hparams::small;

    fn cells(layout: &MicroLayout) -> Vec<(SeqId, i32, usize)> {
        layout.rows.iter().map(|r| (r.seq, r.pos, r.cell)).collect()
    }

    #[test]
    fn step_0_feeds_each_sequences_features_then_its_tokens_in_its_own_cells() {
        let hp = small(4, 2, 4);
        assert_eq!(cells_per_seq(&hp), 5);
        let want = MicroWants { stop_head: true, logits: false, drafts: false, draft_vocab: false };
        // Sequence 1 reads feature slot 1, sequence 0 slot 2 (a kept verify row).
        let l = MicroLayout::new(&hp, 0, &[(1, 7), (0, 9)], &[], &[1, 2], 8, 10, want);
        // Sequence q owns cells 5q..5q+5: features at positions 0 and 1, t_0 at 2.
        assert_eq!(cells(&l), [(1, 0, 5), (1, 1, 6), (0, 0, 0), (0, 1, 1), (1, 2, 7), (0, 2, 2)]);
        // Feature rows read columns slot * F + f; token rows the embeddings after the 8 feature columns.
        assert_eq!(l.gather, [2, 3, 4, 5, 8, 9]);
        assert_eq!(l.tokens, [7, 9]);
        let shape = MicroShape {
            first: true,
            n_seqs: 2,
            n_kv: 10,
            stop_head: true,
            drafts: false,
            draft_vocab: false,
            copies: 0,
        };
        assert_eq!(l.shape, shape);
    }

    #[test]
    fn a_later_step_feeds_one_token_per_sequence_at_its_step_position() {
        let hp = small(4, 2, 4);
        let want = MicroWants { stop_head: false, logits: true, drafts: true, draft_vocab: true };
        let l = MicroLayout::new(&hp, 2, &[(1, 7), (0, 9)], &[], &[1, 0], 8, 10, want);
        assert_eq!(cells(&l), [(1, 4, 9), (0, 4, 4)]);
        assert!(l.gather.is_empty());
        assert_eq!(
            l.shape,
            MicroShape {
                first: false,
                n_seqs: 2,
                n_kv: 10,
                stop_head: false,
                drafts: true,
                draft_vocab: true,
                copies: 0
            }
        );
    }

    #[test]
    fn a_drafting_head_that_copies_reads_each_inputs_candidates_masked_where_there_is_none() {
        let hp = HParams { draft_copy_ngram: 2, ..small(4, 2, 4) };
        let drafts = MicroWants { stop_head: false, logits: false, drafts: true, draft_vocab: false };
        let copies = [Some(5), None, None, Some(3)];
        let l = MicroLayout::new(&hp, 1, &[(1, 7), (0, 9)], &copies, &[1, 0], 8, 10, drafts);
        assert_eq!(l.shape.copies, 2);
        assert_eq!(
            (l.copy_ids.as_slice(), l.copy_mask.as_slice()),
            ([5, 0, 0, 3].as_slice(), [1.0, 0.0, 0.0, 1.0].as_slice())
        );
        // No candidates given: every one is missing.
        let l = MicroLayout::new(&hp, 1, &[(1, 7), (0, 9)], &[], &[1, 0], 8, 10, drafts);
        assert_eq!((l.copy_ids, l.copy_mask), (vec![0; 4], vec![0.0; 4]));
        // Macro steps never copy.
        let macro_step = MicroWants { drafts: false, ..drafts };
        let l = MicroLayout::new(&hp, 1, &[(1, 7), (0, 9)], &copies, &[1, 0], 8, 10, macro_step);
        assert_eq!(l.shape.copies, 0);
        assert!(l.copy_ids.is_empty());
    }
}

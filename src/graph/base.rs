//! The macro step's base forward: a batch of inputs of one or more sequences
//! (prompt tokens, and the merged inputs of previous macro steps) through
//! every base layer, writing one KV cell per input. At the last input of each
//! sequence (and at every input marked as an output row: the rows a
//! self-verified forward checks) it copies the features out for the micro
//! decoder and computes out_0's logits and stop probability.
//!
//! Graph rows: the embeddings come out grouped (merged inputs by token count,
//! then single tokens); the rows are then ordered so that the output rows
//! come last, where the final layer and the heads read them.

use std::rc::Rc;

use ggml::{Backend, Tensor, Type};

use super::layer::{decoder_layer, AttnGroup, AttnInputs, LayerCtx, Row};
use super::{finish, last_cols, merger, rms_norm, start, token_input, StepGraph, Stops};
use crate::error::Result;
use crate::memory::batch::Batch;
use crate::memory::kv_cache::{KvCache, SeqId};
use crate::model::hparams::HParams;
use crate::model::Model;

/// The rope position of each input of `batch` (in batch order) given each
/// sequence's next token position, and the next positions after it. A
/// merged input sits at the position of its last token, a sibling row
/// ([`Batch::push_sibling_row`]) at that of the drafted token it stands beside.
pub fn positions(batch: &Batch, next_pos: &[usize]) -> (Vec<i32>, Vec<usize>) {
    let mut next = next_pos.to_vec();
    let pos = batch
        .inputs()
        .iter()
        .map(|i| {
            let back = match i.sibling {
                Some(back) => back + 1,
                None => {
                    next[i.seq] += i.n_tokens;
                    1
                }
            };
            next[i.seq].saturating_sub(back) as i32
        })
        .collect();
    (pos, next)
}

/// The most drafted tokens a tree of drafts holds (chain and siblings).
pub const MAX_TREE_DRAFTS: usize = 8;

/// Output rows per sequence whose features one base forward can store: a
/// self-verified forward's last committed token and up to `max_steps - 1`
/// drafted tokens, or [`MAX_TREE_DRAFTS`] in a tree. The feature store
/// keeps this many slots per sequence, so that the next draft can start
/// from whichever row was accepted last.
pub fn feature_rows_per_seq(hp: &HParams) -> usize {
    hp.max_steps.max(1 + MAX_TREE_DRAFTS)
}

/// The shape a base graph is built for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BaseShape {
    /// `merged[k - 2]`: inputs of k merged tokens.
    pub merged: Vec<usize>,
    /// Single-token inputs.
    pub n_plain: usize,
    /// Output rows (one per sequence of the batch, and one per row marked as an output).
    pub n_out: usize,
    /// Whether the rows are reordered after embedding.
    pub permuted: bool,
    /// The attention groups ([`super::layer::attn_groups`]).
    pub attn: Vec<AttnGroup>,
    /// Whether to compute the stop head (not when the step length cannot depend on it).
    pub stop_head: bool,
    /// Whether to compute the draft head's stop head too (see [`Wants::draft_stop`]).
    pub draft_stop: bool,
    /// Whether to store the output rows' features (not when no micro step can follow).
    pub features: bool,
}

impl BaseShape {
    fn n_tokens(&self) -> usize {
        self.n_plain + self.merged.iter().enumerate().map(|(i, m)| (i + 2) * m).sum::<usize>()
    }

    fn n_rows(&self) -> usize {
        self.n_plain + self.merged.iter().sum::<usize>()
    }
}

/// What a base forward computes beyond its KV entries and out_0's argmax:
/// each costs work, and across devices transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    /// out_0's stop probability (only when the step length can depend on it).
    pub stop_head: bool,
    /// Also the draft head's stop probability, which self-verified
    /// sequences' draft gates read (only where the model has a draft head;
    /// the engine drops it otherwise).
    pub draft_stop: bool,
    /// out_0's logits read back (for sampling or inspection).
    pub logits: bool,
    /// The output rows' features, which micro step 0 reads (only when a
    /// micro step can follow: not when every macro step is one token).
    pub features: bool,
}

/// Which inputs of a batch are output rows (the rows the final norm, lm_head
/// and the heads run on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputRows {
    /// Each sequence's last input, and each input marked as an output row
    /// ([`Batch::push_output_rows`]): a decode step, which needs the
    /// distribution of the token after everything fed, and after each token
    /// a self-verified step checks.
    LastOfEachSequence,
    /// Every input, in batch order: scoring a prompt, which needs the
    /// distribution after each of its tokens (only with no features stored).
    Every,
}

/// Where the inputs of one batch go in the graph, and the values of its inputs.
pub struct BaseLayout {
    /// The graph's shape.
    pub shape: BaseShape,
    /// Token ids in embedding order.
    tokens: Vec<i32>,
    /// For each graph row, its index in embedding order.
    perm: Vec<i32>,
    /// The rows in graph order.
    rows: Vec<Row>,
    /// Feature-store rows: `[n_out, F]`, `(seq * R + r) * F + f` for the
    /// `r`th output row of `seq` (`R`: [`feature_rows_per_seq`]).
    feat_idx: Vec<i64>,
    /// The sequence of each output row, in order: sequences in order of
    /// first appearance ([`Batch::seqs`]), each one's output rows in batch
    /// order (every input in batch order with [`OutputRows::Every`]).
    pub out_seqs: Vec<SeqId>,
    /// Each output row's position, cell and kind.
    pub out_rows: Vec<OutRow>,
    /// Each output row's rank among its sequence's output rows (0 for the first).
    pub out_rank: Vec<usize>,
}

/// An output row of a base forward: its rope position, the cache cell it
/// wrote, and whether it was a sibling row of a tree of drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutRow {
    /// Its rope position.
    pub pos: i32,
    /// The cache cell it wrote.
    pub cell: usize,
    /// Whether it is a sibling row ([`crate::memory::batch::Batch::push_sibling_row`]).
    pub sibling: bool,
}

impl BaseLayout {
    /// Lays out `batch`, whose inputs have the rope positions `pos` and the
    /// cache cells `cells` (batch order), its rows attending in the groups
    /// `attn` makes of them ([`super::layer::attn_groups`]), computing what `want` asks
    /// for at the `rows` it names.
    pub fn new(
        hp: &HParams,
        batch: &Batch,
        pos: &[i32],
        cells: &[usize],
        attn: impl FnOnce(&[Row]) -> Vec<AttnGroup>,
        want: Wants,
        rows: OutputRows,
    ) -> BaseLayout {
        let inputs = batch.inputs();
        let group = |i: usize| match inputs[i].n_tokens {
            1 => usize::MAX,
            k => k,
        };
        let mut embed_order: Vec<usize> = (0..inputs.len()).collect();
        embed_order.sort_by_key(|&i| group(i)); // stable: batch order within a group
        let (out_seqs, outs): (Vec<SeqId>, Vec<usize>) = match rows {
            OutputRows::LastOfEachSequence => {
                let last_of = |seq: SeqId| inputs.iter().rposition(|i| i.seq == seq).expect("a sequence of the batch");
                let out_rows_of = |seq: SeqId| {
                    let last = last_of(seq);
                    (0..inputs.len()).filter(move |&i| inputs[i].seq == seq && (inputs[i].output || i == last))
                };
                batch.seqs().into_iter().flat_map(|s| out_rows_of(s).map(move |i| (s, i))).unzip()
            }
            OutputRows::Every => inputs.iter().enumerate().map(|(i, input)| (input.seq, i)).unzip(),
        };
        let out_rank: Vec<usize> =
            out_seqs.iter().enumerate().map(|(j, s)| out_seqs[..j].iter().filter(|&q| q == s).count()).collect();
        let graph_order: Vec<usize> =
            (0..inputs.len()).filter(|i| !outs.contains(i)).chain(outs.iter().copied()).collect();
        let mut merged = vec![0; hp.max_steps.saturating_sub(1)];
        for i in inputs.iter().filter(|i| i.n_tokens > 1) {
            merged[i.n_tokens - 2] += 1;
        }
        let perm: Vec<i32> = graph_order
            .iter()
            .map(|g| embed_order.iter().position(|e| e == g).expect("a batch input") as i32)
            .collect();
        let permuted = perm.iter().enumerate().any(|(r, &p)| p != r as i32);
        let (f, r) = (hp.n_features(), feature_rows_per_seq(hp));
        let slots: Vec<usize> = out_seqs.iter().zip(&out_rank).map(|(&s, &k)| s * r + k).collect();
        let rows: Vec<Row> = graph_order
            .iter()
            .map(|&i| Row { seq: inputs[i].seq, pos: pos[i], cell: cells[i], sibling: inputs[i].sibling.is_some() })
            .collect();
        let attn = attn(&rows);
        BaseLayout {
            shape: BaseShape {
                merged,
                n_plain: inputs.iter().filter(|i| i.n_tokens == 1).count(),
                n_out: outs.len(),
                permuted,
                attn,
                stop_head: want.stop_head,
                draft_stop: want.draft_stop,
                features: want.features,
            },
            tokens: embed_order.iter().flat_map(|&i| batch.tokens_of(&inputs[i]).iter().map(|&t| t as i32)).collect(),
            perm,
            rows,
            feat_idx: (0..f).flat_map(|fi| slots.iter().map(move |&c| (c * f + fi) as i64)).collect(),
            out_rows: outs
                .iter()
                .map(|&i| OutRow { pos: pos[i], cell: cells[i], sibling: inputs[i].sibling.is_some() })
                .collect(),
            out_seqs,
            out_rank,
        }
    }
}

/// The input tensors of a base graph.
pub struct BaseInputs {
    tokens: Tensor,
    perm: Option<Tensor>,
    attn: AttnInputs,
    feat_idx: Option<Tensor>,
}

impl BaseInputs {
    /// Writes the values of `layout` (whose cells `kv` already holds).
    ///
    /// # Errors
    /// When a tensor cannot be written.
    pub fn set(&self, kv: &KvCache, layout: &BaseLayout) -> Result<()> {
        self.tokens.write(&layout.tokens)?;
        if let Some(p) = &self.perm {
            p.write(&layout.perm)?;
        }
        if let Some(f) = &self.feat_idx {
            f.write(&layout.feat_idx)?;
        }
        self.attn.set(kv, &layout.rows)
    }
}

/// Builds the base graph of `shape`; `features [D, F * n_seq]` receives the
/// features of each output row at its sequence's columns.
///
/// # Errors
/// When the graph cannot be allocated.
pub fn build(
    model: &Model,
    kv: &KvCache,
    features: &Tensor,
    shape: &BaseShape,
    flash: bool,
    backends: &[Rc<Backend>],
) -> Result<StepGraph<BaseInputs>> {
    let (hp, w) = (&model.hp, &model.weights);
    let mut gs = start(hp.n_layer, shape.attn.len())?;
    let g = gs.g.clone();
    let tokens = token_input(&g, shape.n_tokens());
    let e = g.get_rows(&w.tok_embd, &tokens); // [D, n_tokens]
    let (d, col) = (hp.n_embd as i64, e.nb()[1]);
    let mut parts = Vec::new();
    let mut first = 0;
    for (k, m) in shape.merged.iter().enumerate().map(|(i, &m)| (i + 2, m)).filter(|&(_, m)| m > 0) {
        let ek = g.view(&e, &[d, (k * m) as i64], &[col], first * col);
        parts.push(merger::merge(&g, &w.grafted()?.merger, hp, &g.reshape(&ek, &[d, k as i64, m as i64]))); // [D, m]
        first += k * m;
    }
    if shape.n_plain > 0 {
        parts.push(if first == 0 { e.clone() } else { last_cols(&g, &e, shape.n_plain) });
    }
    let x = parts.iter().skip(1).fold(parts[0].clone(), |x, p| g.concat(&x, p, 1)); // [D, n]
    let perm = shape.permuted.then(|| {
        let p = g.new_tensor(Type::I32, &[shape.n_rows() as i64]).named("inp_perm");
        p.set_input();
        p
    });
    let mut x = match &perm {
        Some(p) => g.get_rows(&x, p),
        None => x,
    };
    let feat_idx = shape.features.then(|| {
        let t = g.new_tensor(Type::I64, &[shape.n_out as i64, hp.n_features() as i64]).named("inp_feat_idx");
        t.set_input();
        t
    });
    let attn = AttnInputs::new(&g, kv, hp.n_embd_kv(), shape.n_rows(), &shape.attn, flash);
    let lc = LayerCtx { hp, cache: kv, attn: &attn, rope_freqs: w.rope_freqs.as_ref() };
    let last_layer = hp.n_layer - 1;
    // Feature rows are cut out where their layer runs but stored after the
    // last layer: the feature columns live with the tail, and a store in
    // mid-stack would hop to the tail's device and back (two more backend
    // splits, each a round trip to an RPC server or a GPU).
    let mut feature_rows = Vec::new(); // (feature index, rows [D, n_out])
    for (il, lw) in w.layers.iter().enumerate() {
        x = decoder_layer(&g, &mut gs.gf, &lc, lw, il, &x, (il == last_layer).then_some(shape.n_out));
        if il != last_layer && shape.features {
            if let Some(fi) = hp.feature_layers.iter().position(|&l| l == il) {
                feature_rows.push((fi, g.cont(&last_cols(&g, &x, shape.n_out))));
            }
        }
    }
    let out = rms_norm(&g, &x, &w.output_norm, hp.rms_eps).named("out_0"); // [D, n_out]
    if let Some(feat_idx) = &feat_idx {
        feature_rows.push((hp.n_features() - 1, out.clone()));
        for (fi, rows) in &feature_rows {
            let idx = g.view(feat_idx, &[shape.n_out as i64], &[], fi * feat_idx.nb()[1]);
            gs.gf.expand(&g.set_rows(features, rows, &idx));
        }
    }
    let grafted = w.grafted.as_ref();
    let stops = Stops {
        p_stop: grafted.filter(|_| shape.stop_head).map(|g| &g.head.stop),
        p_stop_draft: grafted.and_then(|g| g.draft.as_ref()).filter(|_| shape.draft_stop).map(|d| &d.stop),
    };
    finish(gs, backends, w.lm_head(), &out, stops, BaseInputs { tokens, perm, attn, feat_idx })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::layer::attn_groups;
    use crate::memory::kv_cache::Window;
    use crate::model::hparams::small;

    /// Sequence `s`'s window in these tests.
    fn window(s: SeqId) -> Window {
        Window { first: 256 * s, n_kv: 256 }
    }

    /// Sequence 0's two prompt tokens, sequence 1's macro step of three
    /// tokens, then sequence 0's macro step of two.
    fn mixed_batch() -> Batch {
        let mut b = Batch::new();
        b.push_tokens(0, &[10, 11]);
        b.push_merged(1, &[20, 21, 22]);
        b.push_merged(0, &[30, 31]);
        b
    }

    #[test]
    fn a_merged_input_sits_at_its_last_tokens_position() {
        let (pos, next) = positions(&mixed_batch(), &[5, 2]);
        assert_eq!(pos, [5, 6, 4, 8]);
        assert_eq!(next, [9, 5]);
    }

    #[test]
    fn a_sibling_row_sits_at_the_position_of_the_drafted_token_it_stands_beside() {
        let mut b = Batch::new();
        b.push_output_rows(0, &[1, 2, 3]);
        b.push_sibling_row(0, 4, 1);
        b.push_sibling_row(0, 5, 0);
        b.push_tokens(1, &[6]);
        let (pos, next) = positions(&b, &[10, 3]);
        assert_eq!(pos, [10, 11, 12, 11, 12, 3]);
        assert_eq!(next, [13, 4]);
    }

    #[test]
    fn inputs_are_embedded_by_group_and_each_sequences_last_input_is_an_output_row() {
        let hp = small(4, 2, 4);
        let want = Wants { stop_head: true, logits: false, features: true, draft_stop: false };
        let l = BaseLayout::new(
            &hp,
            &mixed_batch(),
            &[5, 6, 4, 8],
            &[3, 0, 1, 2],
            |r: &[Row]| attn_groups(r, window, true),
            want,
            OutputRows::LastOfEachSequence,
        );
        // Embedding order: merged inputs by token count (2, then 3), then single tokens.
        assert_eq!(l.tokens, [30, 31, 20, 21, 22, 10, 11]);
        // Graph order: the non-output inputs, then each sequence's last input in order of appearance.
        assert_eq!(l.perm, [2, 3, 0, 1]);
        let rows: Vec<(SeqId, i32, usize)> = l.rows.iter().map(|r| (r.seq, r.pos, r.cell)).collect();
        assert_eq!(rows, [(0, 5, 3), (0, 6, 0), (0, 8, 2), (1, 4, 1)]);
        assert_eq!(l.out_seqs, [0, 1]);
        // Feature f of sequence q's first output row goes to column q * R * F + f
        // (R = 9 rows per sequence: a tree's 8 drafts and the verified row), grouped by feature.
        assert_eq!(l.feat_idx, [0, 18, 1, 19]);
        let shape = BaseShape {
            merged: vec![1, 1, 0],
            n_plain: 2,
            n_out: 2,
            permuted: true,
            attn: vec![AttnGroup { n_rows: 3, window: window(0) }, AttnGroup { n_rows: 1, window: window(1) }],
            stop_head: true,
            draft_stop: false,
            features: true,
        };
        assert_eq!(l.shape, shape);
        assert_eq!((l.shape.n_tokens(), l.shape.n_rows()), (7, 4));
        // Not by sequence: every row attends the union of the windows.
        let l = BaseLayout::new(
            &hp,
            &mixed_batch(),
            &[5, 6, 4, 8],
            &[3, 0, 1, 2],
            |r: &[Row]| attn_groups(r, window, false),
            want,
            OutputRows::LastOfEachSequence,
        );
        assert_eq!(l.shape.attn, [AttnGroup { n_rows: 4, window: Window { first: 0, n_kv: 512 } }]);
    }

    #[test]
    fn a_prompt_of_one_sequence_needs_no_permutation() {
        let mut b = Batch::new();
        b.push_tokens(2, &[1, 2, 3]);
        let want = Wants { stop_head: false, logits: true, features: false, draft_stop: false };
        let l = BaseLayout::new(
            &small(4, 2, 4),
            &b,
            &[0, 1, 2],
            &[0, 1, 2],
            |r: &[Row]| attn_groups(r, window, true),
            want,
            OutputRows::LastOfEachSequence,
        );
        assert_eq!(l.perm, [0, 1, 2]);
        assert!(!l.shape.permuted && !l.shape.stop_head && !l.shape.features);
        assert_eq!(l.shape.merged, [0, 0, 0]);
        assert_eq!(l.out_seqs, [2]);
        assert_eq!(l.feat_idx, [36, 37]);
    }

    #[test]
    fn a_verify_forward_outputs_its_last_committed_row_and_each_drafted_row() {
        // Sequence 1: a prompt token; sequence 0: a committed token (a forced
        // one before it) and two drafted tokens.
        let mut b = Batch::new();
        b.push_tokens(1, &[5]);
        b.push_tokens(0, &[40]);
        b.push_output_rows(0, &[41, 42, 43]);
        let want = Wants { stop_head: true, logits: false, features: true, draft_stop: false };
        let l = BaseLayout::new(
            &small(4, 2, 4),
            &b,
            &[3, 7, 8, 9, 10],
            &[0, 1, 2, 3, 4],
            |r: &[Row]| attn_groups(r, window, true),
            want,
            OutputRows::LastOfEachSequence,
        );
        assert_eq!(l.out_seqs, [1, 0, 0, 0]);
        assert_eq!(l.out_rank, [0, 0, 1, 2]);
        assert_eq!(l.out_rows.iter().map(|o| o.pos).collect::<Vec<_>>(), [3, 8, 9, 10]);
        // The forced token is no output: it goes first in graph order.
        assert_eq!(l.perm, [1, 0, 2, 3, 4]);
        // Sequence 0's rows take its feature slots 0, 1, 2 (columns (0 * 9 + r) * 2 + f).
        assert_eq!(l.feat_idx, [18, 0, 2, 4, 19, 1, 3, 5]);
    }

    #[test]
    fn scoring_makes_every_input_an_output_row_in_batch_order() {
        let mut b = Batch::new();
        b.push_tokens(1, &[7, 8, 9]);
        let want = Wants { stop_head: false, logits: true, features: false, draft_stop: false };
        let l = BaseLayout::new(
            &small(4, 2, 4),
            &b,
            &[0, 1, 2],
            &[4, 5, 6],
            |r: &[Row]| attn_groups(r, window, true),
            want,
            OutputRows::Every,
        );
        assert_eq!(l.perm, [0, 1, 2]);
        assert_eq!((l.shape.n_out, l.shape.n_rows()), (3, 3));
        assert_eq!(l.out_seqs, [1, 1, 1]);
        let rows: Vec<(SeqId, i32, usize)> = l.rows.iter().map(|r| (r.seq, r.pos, r.cell)).collect();
        assert_eq!(rows, [(1, 0, 4), (1, 1, 5), (1, 2, 6)]);
    }
}

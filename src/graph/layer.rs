//! What the base and micro stacks share: the per-step attention inputs (rope
//! positions, cells written, mask), which fill themselves from the cache and
//! the rows of a batch, and the Llama decoder layer.

use std::collections::HashMap;

use ggml::{Context, Graph, Tensor, Type};
use half::f16;

use super::{ffn, last_cols, rms_norm, rope_params};
use crate::error::{Error, Result};
use crate::memory::kv_cache::{KvCache, SeqId, Window};
use crate::model::hparams::HParams;
use crate::model::weights::LayerWeights;

/// One row (input position) of a graph: its sequence, rope position and the
/// cache cell its keys and values go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The sequence.
    pub seq: SeqId,
    /// The rope position.
    pub pos: i32,
    /// The cache cell written.
    pub cell: usize,
    /// A sibling row of a tree of drafts ([`crate::memory::batch::Batch::push_sibling_row`]):
    /// it attends no other row's cell at its own position, and no other row attends its cell.
    pub sibling: bool,
}

/// Whether a tree of drafts hides `cell`, written by this graph's `writer`
/// row (None: an earlier forward's), from the query row `r`: a sibling's
/// cell is its own row's alone, and a sibling row sees no other row's cell
/// at its own position (the drafted token it replaces, or another sibling).
fn off_path(writer: Option<&Row>, r: &Row) -> bool {
    writer.is_some_and(|w| w.cell != r.cell && w.seq == r.seq && (w.sibling || (r.sibling && w.pos == r.pos)))
}

/// The rows of one attention group and the window of cells they attend: a
/// graph's rows attend in groups, one per sequence (or one for all rows),
/// so that each sequence's queries scan its own cells rather than every
/// sequence's window (and, on the CPU, a row's attention is summed in the
/// same order whatever other sequences the forward holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttnGroup {
    /// Rows in the group.
    pub n_rows: usize,
    /// The cells attended.
    pub window: Window,
}

/// The graph rows of each sequence of `rows`, sequences in order of first
/// appearance: the attention groups of a graph of several groups.
pub fn rows_by_seq(rows: &[Row]) -> Vec<Vec<usize>> {
    let mut seqs: Vec<SeqId> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match seqs.iter().position(|&s| s == r.seq) {
            Some(g) => groups[g].push(i),
            None => {
                seqs.push(r.seq);
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// The attention groups of `rows`: one per sequence, in order of first
/// appearance, each with its sequence's `window` (`by_seq`); else one of
/// every row, over the union of the windows.
pub fn attn_groups(rows: &[Row], window: impl Fn(SeqId) -> Window, by_seq: bool) -> Vec<AttnGroup> {
    let groups: Vec<AttnGroup> =
        rows_by_seq(rows).iter().map(|m| AttnGroup { n_rows: m.len(), window: window(rows[m[0]].seq) }).collect();
    if by_seq {
        return groups;
    }
    let first = groups.iter().map(|g| g.window.first).min().unwrap_or(0);
    let end = groups.iter().map(|g| g.window.first + g.window.n_kv).max().unwrap_or(0);
    vec![AttnGroup { n_rows: rows.len(), window: Window { first, n_kv: end - first } }]
}

/// The inputs of one attention group.
pub struct GroupInputs {
    /// The group's shape.
    pub group: AttnGroup,
    /// Mask `[n_kv, n_rows]`: F16 for flash attention, else F32.
    pub mask: Tensor,
    /// The group's graph rows `[n_rows]` (i32), when the graph has several groups.
    pub rows: Option<Tensor>,
}

/// The per-step inputs every attention layer of a graph shares.
pub struct AttnInputs {
    /// Rope positions `[n]` (i32).
    pub pos: Tensor,
    /// Cache cells written `[n]` (i64).
    pub kv_idx: Tensor,
    /// Element indices of a transposed-V write `[n*E]` (i64), or the cells again.
    pub v_idx: Tensor,
    /// The attention groups: one of every row, or one per sequence ([`rows_by_seq`]).
    pub groups: Vec<GroupInputs>,
    /// Whether attention is fused flash attention.
    pub flash: bool,
}

impl AttnInputs {
    /// Creates the input tensors for `n` rows of `cache` attending in `groups`.
    pub fn new(
        g: &Context,
        cache: &KvCache,
        n_embd_kv: usize,
        n: usize,
        groups: &[AttnGroup],
        flash: bool,
    ) -> AttnInputs {
        let pos = g.new_tensor(Type::I32, &[n as i64]).named("inp_pos");
        let kv_idx = g.new_tensor(Type::I64, &[n as i64]).named("inp_kv_idx");
        let v_idx = if cache.v_trans() {
            g.new_tensor(Type::I64, &[(n * n_embd_kv) as i64]).named("inp_v_idx")
        } else {
            kv_idx.clone()
        };
        for t in [&pos, &kv_idx, &v_idx] {
            t.set_input();
        }
        let mask_ty = if flash { Type::F16 } else { Type::F32 };
        let groups = groups
            .iter()
            .enumerate()
            .map(|(i, &group)| {
                let mask = g.new_tensor(mask_ty, &[group.window.n_kv as i64, group.n_rows as i64]);
                let mask = mask.named(&format!("inp_mask_{i}"));
                mask.set_input();
                let rows = (groups.len() > 1).then(|| {
                    let t = g.new_tensor(Type::I32, &[group.n_rows as i64]).named(&format!("inp_rows_{i}"));
                    t.set_input();
                    t
                });
                GroupInputs { group, mask, rows }
            })
            .collect();
        AttnInputs { pos, kv_idx, v_idx, groups, flash }
    }

    /// Writes the values for `rows` (whose cells `cache` already holds): each
    /// row attends the cells of its own sequence at positions up to its own,
    /// along its path where the rows hold a tree of drafts ([`Row::sibling`]).
    ///
    /// # Errors
    /// When a tensor cannot be written, or the rows do not fall into the
    /// groups the graph was built for.
    pub fn set(&self, cache: &KvCache, rows: &[Row]) -> Result<()> {
        let pos: Vec<i32> = rows.iter().map(|r| r.pos).collect();
        let cells: Vec<i64> = rows.iter().map(|r| r.cell as i64).collect();
        self.pos.write(&pos)?;
        self.kv_idx.write(&cells)?;
        if cache.v_trans() {
            self.v_idx.write(&cache.v_trans_indices(&cells))?;
        }
        let members = match self.groups.len() {
            1 => vec![(0..rows.len()).collect()],
            _ => rows_by_seq(rows),
        };
        if members.len() != self.groups.len()
            || members.iter().zip(&self.groups).any(|(m, g)| m.len() != g.group.n_rows)
        {
            return Err(Error::Invalid("the rows do not fit the graph's attention groups".into()));
        }
        // A tree of drafts: the row that wrote each cell of this forward.
        let written: HashMap<usize, &Row> = match rows.iter().any(|r| r.sibling) {
            true => rows.iter().map(|r| (r.cell, r)).collect(),
            false => HashMap::new(),
        };
        for (m, gi) in members.iter().zip(&self.groups) {
            if let Some(t) = &gi.rows {
                t.write(&m.iter().map(|&i| i as i32).collect::<Vec<_>>())?;
            }
            let w = gi.group.window;
            let writer = |c: usize| written.get(&c).copied();
            let allowed = m.iter().flat_map(|&i| (w.first..w.first + w.n_kv).map(move |c| (c, rows[i])));
            let allowed = allowed.map(|(c, r)| cache.attends(c, r.seq, r.pos) && !off_path(writer(c), &r));
            if self.flash {
                gi.mask.write(&allowed.map(|a| if a { f16::ZERO } else { f16::NEG_INFINITY }).collect::<Vec<_>>())?;
            } else {
                gi.mask.write(&allowed.map(|a| if a { 0.0f32 } else { f32::NEG_INFINITY }).collect::<Vec<_>>())?;
            }
        }
        Ok(())
    }
}

/// Everything a decoder layer needs besides its weights.
pub struct LayerCtx<'a> {
    /// Hyper-parameters.
    pub hp: &'a HParams,
    /// The cache of this stack of layers.
    pub cache: &'a KvCache,
    /// Shared attention inputs.
    pub attn: &'a AttnInputs,
    /// Llama-3 rope factors, if any.
    pub rope_freqs: Option<&'a Tensor>,
}

/// One Llama decoder layer over `x [D, n]`, writing its keys and values into
/// the cache. With `n_out`, every row is attended and projected as without,
/// but only the last `n_out` rows (the output rows, which builders put last)
/// go on through the residual and the MLP: nothing reads the others after the
/// final layer. The result is `[D, n_out]` (else `[D, n]`).
///
/// The rows are cut after attention, as llama.cpp cuts them: ggml's CPU flash
/// attention sums in another order from 64 query rows on
/// ([`crate::memory::row_class`]), so querying the output rows alone would
/// compute them in another class than the forward's other layers do.
pub fn decoder_layer(
    g: &Context,
    gf: &mut Graph,
    lc: &LayerCtx,
    w: &LayerWeights,
    il: usize,
    x: &Tensor,
    n_out: Option<usize>,
) -> Tensor {
    let hp = lc.hp;
    let (hd, n) = (hp.head_dim as i64, x.ne()[1]);
    let h = rms_norm(g, x, &w.attn_norm, hp.rms_eps); // [D, n]
    let rope = rope_params(hp);
    let k = g.reshape(&g.mul_mat(&w.wk, &h), &[hd, hp.n_head_kv as i64, n]); // [hd, Hkv, n]
    let k = g.rope(&k, &lc.attn.pos, lc.rope_freqs, rope).named(&format!("k_l{il}"));
    let v = g.mul_mat(&w.wv, &h); // [E, n]
    for write in lc.cache.store(g, il, &g.reshape(&k, &[hp.n_embd_kv() as i64, n]), &v, &lc.attn.kv_idx, &lc.attn.v_idx)
    {
        gf.expand(&write);
    }
    let q = g.reshape(&g.mul_mat(&w.wq, &h), &[hd, hp.n_head as i64, n]); // [hd, H, n]
    let q = g.rope(&q, &lc.attn.pos, lc.rope_freqs, rope).named(&format!("q_l{il}"));
    let attn = g.mul_mat(&w.wo, &attention(g, lc, il, &q)); // [D, n]
    let (attn, x) = match n_out.filter(|&m| (m as i64) < n) {
        Some(m) => (last_cols(g, &attn, m), last_cols(g, x, m)),
        None => (attn, x.clone()),
    };
    let x = g.add(&attn, &x); // [D, n_out]
    let h = rms_norm(g, &x, &w.ffn_norm, hp.rms_eps);
    g.add(&ffn(g, w, &h), &x).named(&format!("l_out_{il}"))
}

/// Attention of `q [hd, H, n]` in the graph's groups, each over its window
/// of cache cells under its mask: a group of some rows gathers them, attends,
/// and writes its results back to their rows.
fn attention(g: &Context, lc: &LayerCtx, il: usize, q: &Tensor) -> Tensor {
    let hp = lc.hp;
    let (e, n) = (hp.n_embd_q() as i64, q.ne()[2]);
    let out = match lc.attn.groups.as_slice() {
        [one] => attend(g, lc, il, q, one),
        groups => {
            let q_rows = g.reshape(q, &[e, n]);
            let out = g.new_tensor(Type::F32, &[e, n]);
            groups.iter().fold(out, |out, gi| {
                let rows = gi.rows.as_ref().expect("a graph of several groups names each one's rows");
                let m = gi.group.n_rows as i64;
                let qg = g.reshape(&g.get_rows(&q_rows, rows), &[hp.head_dim as i64, hp.n_head as i64, m]);
                g.set_rows(&out, &g.reshape(&attend(g, lc, il, &qg, gi), &[e, m]), rows)
            })
        }
    };
    g.reshape(&out, &[e, n]).named(&format!("attn_l{il}"))
}

/// Attention of one group's `q [hd, H, m]` over its window: `[hd, H, m]`, contiguous.
fn attend(g: &Context, lc: &LayerCtx, il: usize, q: &Tensor, gi: &GroupInputs) -> Tensor {
    let scale = 1.0 / (lc.hp.head_dim as f32).sqrt();
    let q = g.permute(q, [0, 2, 1, 3]); // [hd, m, H]
    let k = lc.cache.k_view(g, il, gi.group.window); // [hd, n_kv, Hkv]
    let v = lc.cache.v_view(g, il, gi.group.window);
    if lc.attn.flash {
        g.flash_attn_ext(&q, &k, &v, &gi.mask, scale) // [hd, H, m]
    } else {
        let kq = g.mul_mat(&k, &q); // [n_kv, m, H]
        kq.set_f32_accumulation();
        let kq = g.soft_max_ext(&kq, Some(&gi.mask), scale);
        let kqv = g.mul_mat(&v, &kq); // v [n_kv, hd, Hkv] -> [hd, m, H]
        g.cont(&g.permute(&kqv, [0, 2, 1, 3])) // [hd, H, m]
    }
}

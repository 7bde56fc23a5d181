//! What the base and micro stacks share: the per-step attention inputs (rope
//! positions, cells written, mask), which fill themselves from the cache and
//! the rows of a batch, and the Llama decoder layer.

use ggml::{Context, Graph, Tensor, Type};
use half::f16;

use super::{ffn, last_cols, rms_norm, rope_params};
use crate::error::Result;
use crate::memory::kv_cache::{KvCache, SeqId};
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
}

/// The per-step inputs every attention layer of a graph shares.
pub struct AttnInputs {
    /// Rope positions `[n]` (i32).
    pub pos: Tensor,
    /// Cache cells written `[n]` (i64).
    pub kv_idx: Tensor,
    /// Element indices of a transposed-V write `[n*E]` (i64), or the cells again.
    pub v_idx: Tensor,
    /// Mask `[n_kv, n]`: F16 for flash attention, else F32.
    pub mask: Tensor,
    /// Cache cells attended (the window from cell 0).
    pub n_kv: usize,
    /// Whether attention is fused flash attention.
    pub flash: bool,
}

impl AttnInputs {
    /// Creates the input tensors for `n` rows attending the first `n_kv` cells of `cache`.
    pub fn new(g: &Context, cache: &KvCache, n_embd_kv: usize, n: usize, n_kv: usize, flash: bool) -> AttnInputs {
        let pos = g.new_tensor(Type::I32, &[n as i64]).named("inp_pos");
        let kv_idx = g.new_tensor(Type::I64, &[n as i64]).named("inp_kv_idx");
        let v_idx = if cache.v_trans() {
            g.new_tensor(Type::I64, &[(n * n_embd_kv) as i64]).named("inp_v_idx")
        } else {
            kv_idx.clone()
        };
        let mask_ty = if flash { Type::F16 } else { Type::F32 };
        let mask = g.new_tensor(mask_ty, &[n_kv as i64, n as i64]).named("inp_mask");
        for t in [&pos, &kv_idx, &v_idx, &mask] {
            t.set_input();
        }
        AttnInputs { pos, kv_idx, v_idx, mask, n_kv, flash }
    }

    /// Writes the values for `rows` (whose cells `cache` already holds): each
    /// row attends the cells of its own sequence at positions up to its own.
    ///
    /// # Errors
    /// When a tensor cannot be written.
    pub fn set(&self, cache: &KvCache, rows: &[Row]) -> Result<()> {
        let pos: Vec<i32> = rows.iter().map(|r| r.pos).collect();
        let cells: Vec<i64> = rows.iter().map(|r| r.cell as i64).collect();
        self.pos.write(&pos)?;
        self.kv_idx.write(&cells)?;
        if cache.v_trans() {
            self.v_idx.write(&cache.v_trans_indices(&cells))?;
        }
        let allowed = rows.iter().flat_map(|r| (0..self.n_kv).map(move |c| cache.attends(c, r.seq, r.pos)));
        if self.flash {
            self.mask.write(&allowed.map(|a| if a { f16::ZERO } else { f16::NEG_INFINITY }).collect::<Vec<_>>())?;
        } else {
            self.mask.write(&allowed.map(|a| if a { 0.0f32 } else { f32::NEG_INFINITY }).collect::<Vec<_>>())?;
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

/// Attention of `q [hd, H, n]` over the window of cache cells, under the step's mask.
fn attention(g: &Context, lc: &LayerCtx, il: usize, q: &Tensor) -> Tensor {
    let mask = &lc.attn.mask;
    let hp = lc.hp;
    let n = q.ne()[2];
    let scale = 1.0 / (hp.head_dim as f32).sqrt();
    let q = g.permute(q, [0, 2, 1, 3]); // [hd, n, H]
    let k = lc.cache.k_view(g, il, lc.attn.n_kv); // [hd, n_kv, Hkv]
    let v = lc.cache.v_view(g, il, lc.attn.n_kv);
    let out = if lc.attn.flash {
        g.flash_attn_ext(&q, &k, &v, mask, scale) // [hd, H, n]
    } else {
        let kq = g.mul_mat(&k, &q); // [n_kv, n, H]
        kq.set_f32_accumulation();
        let kq = g.soft_max_ext(&kq, Some(mask), scale);
        let kqv = g.mul_mat(&v, &kq); // v [n_kv, hd, Hkv] -> [hd, n, H]
        g.cont(&g.permute(&kqv, [0, 2, 1, 3])) // [hd, H, n]
    };
    g.reshape(&out, &[hp.n_embd_q() as i64, n]).named(&format!("attn_l{il}"))
}

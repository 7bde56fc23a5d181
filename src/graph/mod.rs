//! Graph builders: plain functions of (context, weights, inputs) that return
//! tensors. Shapes are commented in ggml order (`[ne0, ne1, ...]`).
//!
//! * [`base`]: the macro step's base forward (prefill or one merged input);
//! * [`merger`]: the compositional embedder;
//! * [`micro`]: one micro step of the micro-step decoder;
//! * this module: the shared pieces (norm, attention, MLP, heads) and the
//!   [`StepGraph`] every builder returns.

pub mod base;
pub mod merger;
pub mod micro;

use std::rc::Rc;

use ggml::{Backend, Context, Graph, RopeParams, Scheduler, Tensor, Type};

use crate::hparams::HParams;
use crate::kv_cache::KvCache;
use crate::weights::{LayerWeights, Linear, StopHeadWeights};
use crate::Result;

/// Nodes a graph may hold, from the number of transformer layers it runs.
pub fn graph_size(n_layers: usize) -> usize {
    64 * n_layers + 256
}

/// Starts a step graph over `n_layers` transformer layers: its context, the
/// empty graph, the token-id input `[n_tokens]` (i32), and the graph size.
pub fn start(n_layers: usize, n_tokens: usize) -> Result<(Context, Graph, Tensor, usize)> {
    let size = graph_size(n_layers);
    let g = Context::new(2 * size, size)?;
    let gf = Graph::new(&g, size);
    let tokens = g.new_tensor(Type::I32, &[n_tokens as i64]).named("inp_tokens");
    tokens.set_input();
    Ok((g, gf, tokens, size))
}

/// A built graph with its inputs (filled before each run) and outputs, and the
/// scheduler that allocated it: built once per shape, reused every step.
pub struct StepGraph {
    /// The graph.
    pub graph: Graph,
    /// Its scheduler (one per graph, so switching graphs costs no reallocation).
    pub sched: Scheduler,
    /// Token ids `[n_tokens]` (i32).
    pub tokens: Tensor,
    /// Rope positions `[n]` (i32).
    pub pos: Tensor,
    /// Cache slots written `[n]` (i64).
    pub kv_idx: Tensor,
    /// Element indices of a transposed-V write `[n*E]` (i64), or `None`.
    pub v_idx: Option<Tensor>,
    /// Attention mask `[n_kv, n]`.
    pub mask: Tensor,
    /// Logits of the last position `[V]` (f32).
    pub logits: Tensor,
    /// Argmax of the logits `[1]` (i32).
    pub argmax: Tensor,
    /// Stop probability of the last position `[1]` (f32), when the graph computes it.
    pub p_stop: Option<Tensor>,
    /// Cache slots attended.
    pub n_kv: usize,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy)]
pub struct AttnConfig {
    /// Fused flash attention (F16 mask), else matrix products and softmax.
    pub flash: bool,
}

/// The per-step inputs every attention layer of a graph shares.
pub struct AttnInputs {
    /// Rope positions `[n]`.
    pub pos: Tensor,
    /// Cache slots written `[n]`.
    pub kv_idx: Tensor,
    /// Element indices for a transposed V `[n*E]` (or the slots again).
    pub v_idx: Tensor,
    /// Mask `[n_kv, n]`.
    pub mask: Tensor,
    /// Cache slots attended.
    pub n_kv: usize,
}

impl AttnInputs {
    /// Creates the input tensors for `n` inputs attending `n_kv` slots of `cache`.
    pub fn new(g: &Context, cache: &KvCache, n_embd_kv: usize, n: usize, n_kv: usize, cfg: AttnConfig) -> AttnInputs {
        let pos = g.new_tensor(Type::I32, &[n as i64]).named("inp_pos");
        let kv_idx = g.new_tensor(Type::I64, &[n as i64]).named("inp_kv_idx");
        let v_idx = if cache.v_trans() {
            g.new_tensor(Type::I64, &[(n * n_embd_kv) as i64]).named("inp_v_idx")
        } else {
            kv_idx.clone()
        };
        let mask_ty = if cfg.flash { Type::F16 } else { Type::F32 };
        let mask = g.new_tensor(mask_ty, &[n_kv as i64, n as i64]).named("inp_mask");
        for t in [&pos, &kv_idx, &v_idx, &mask] {
            t.set_input();
        }
        AttnInputs { pos, kv_idx, v_idx, mask, n_kv }
    }
}

/// `rms_norm(x) * w`.
pub fn rms_norm(g: &Context, x: &Tensor, w: &Tensor, eps: f32) -> Tensor {
    g.mul(&g.rms_norm(x, eps), w)
}

/// `W x + b`.
pub fn linear(g: &Context, l: &Linear, x: &Tensor) -> Tensor {
    g.add(&g.mul_mat(&l.w, x), &l.b)
}

/// The SwiGLU MLP: `down(silu(gate x) * up x)`.
pub fn ffn(g: &Context, w: &LayerWeights, x: &Tensor) -> Tensor {
    let gate = g.mul_mat(&w.w_gate, x); // [FF, n]
    let up = g.mul_mat(&w.w_up, x); // [FF, n]
    g.mul_mat(&w.w_down, &g.swiglu_split(&gate, &up)) // [D, n]
}

/// The rope configuration shared by the base and micro layers.
pub fn rope_params(hp: &HParams) -> RopeParams {
    RopeParams {
        n_dims: hp.n_rot as i32,
        mode: 0,
        n_ctx_orig: hp.n_ctx_train as i32,
        freq_base: hp.rope_freq_base,
        freq_scale: 1.0,
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
    /// Attention implementation.
    pub cfg: AttnConfig,
}

/// One Llama decoder layer over `x [D, n]`, writing its keys and values into
/// slot `il` of the cache. With `last_only`, every position's keys and values
/// are still cached, but only the last position is queried and goes through
/// the output projection and MLP (nothing reads the others after the final
/// layer): the result is `[D, 1]`.
pub fn decoder_layer(
    g: &Context,
    gf: &mut Graph,
    lc: &LayerCtx,
    w: &LayerWeights,
    il: usize,
    x: &Tensor,
    last_only: bool,
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
    // The queried positions: all, or the last one with its position and mask row.
    let (h, x, pos, mask) = if last_only && n > 1 {
        let last = |t: &Tensor| g.view(t, &[t.ne()[0], 1], &[t.nb()[1]], t.nb()[1] * (n as usize - 1));
        let pos = g.view(&lc.attn.pos, &[1], &[], 4 * (n as usize - 1));
        (last(&h), last(x), pos, last(&lc.attn.mask))
    } else {
        (h, x.clone(), lc.attn.pos.clone(), lc.attn.mask.clone())
    };
    let nq = h.ne()[1];
    let q = g.reshape(&g.mul_mat(&w.wq, &h), &[hd, hp.n_head as i64, nq]); // [hd, H, nq]
    let q = g.rope(&q, &pos, lc.rope_freqs, rope).named(&format!("q_l{il}"));
    let attn = attention(g, lc, il, &q, &mask); // [H*hd, nq]
    let x = g.add(&g.mul_mat(&w.wo, &attn), &x); // [D, nq]
    let h = rms_norm(g, &x, &w.ffn_norm, hp.rms_eps);
    g.add(&ffn(g, w, &h), &x).named(&format!("l_out_{il}"))
}

/// Causal attention of `q [hd, H, n]` over the first `n_kv` cache slots, with
/// `mask [n_kv, n]`.
fn attention(g: &Context, lc: &LayerCtx, il: usize, q: &Tensor, mask: &Tensor) -> Tensor {
    let hp = lc.hp;
    let n = q.ne()[2];
    let scale = 1.0 / (hp.head_dim as f32).sqrt();
    let q = g.permute(q, [0, 2, 1, 3]); // [hd, n, H]
    let k = lc.cache.k_view(g, il, lc.attn.n_kv); // [hd, n_kv, Hkv]
    let v = lc.cache.v_view(g, il, lc.attn.n_kv);
    let out = if lc.cfg.flash {
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

/// The stop head's probability `[1]` for `x [D, 1]`.
pub fn stop_head(g: &Context, w: &StopHeadWeights, x: &Tensor) -> Tensor {
    let h = g.silu(&linear(g, &w.fc1, x));
    let h = g.silu(&linear(g, &w.fc2, &h));
    g.sigmoid(&linear(g, &w.out, &h)).named("p_stop")
}

/// Finishes a step graph: lm_head logits, their argmax and (when `stop` is
/// given: the decision depends on it) the stop head on `out [D, 1]`, all
/// marked as outputs; then allocates the graph on a scheduler of its own.
#[allow(clippy::too_many_arguments)]
pub fn finish(
    g: &Context,
    mut gf: Graph,
    backends: &[Rc<Backend>],
    lm_head: &Tensor,
    stop: Option<&StopHeadWeights>,
    out: &Tensor,
    tokens: Tensor,
    attn: AttnInputs,
    cache: &KvCache,
    size: usize,
) -> Result<StepGraph> {
    let logits = g.mul_mat(lm_head, out).named("logits"); // [V, 1]
    let argmax = g.argmax(&logits).named("argmax"); // [1]
    let p_stop = stop.map(|w| stop_head(g, w, out));
    for t in [Some(&logits), Some(&argmax), p_stop.as_ref()].into_iter().flatten() {
        t.set_output();
        gf.expand(t);
    }
    // With a GPU, let the scheduler move big host-weight products there (llama.cpp's op offload).
    let mut sched = Scheduler::new(backends, size, backends.len() > 1)?;
    sched.alloc(&gf)?;
    Ok(StepGraph {
        graph: gf,
        sched,
        tokens,
        pos: attn.pos,
        v_idx: cache.v_trans().then_some(attn.v_idx),
        kv_idx: attn.kv_idx,
        mask: attn.mask,
        logits,
        argmax,
        p_stop,
        n_kv: attn.n_kv,
    })
}

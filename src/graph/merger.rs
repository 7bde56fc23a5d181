//! The compositional embedder: the k tokens one macro step emitted become ONE
//! input embedding (docs/model.md, "The merger"),
//! for m such steps at once.

use ggml::{Context, Tensor, Type};

use super::linear;
use crate::model::hparams::HParams;
use crate::model::weights::MergerWeights;

/// Merges the token embeddings `e [D, k, m]` (k > 1 tokens, in emission
/// order, of each of m inputs) into `[D, m]`:
/// `mean + Wo · attention(q = Wq·mean, keys/values from [e_j, P_j])`.
pub fn merge(g: &Context, w: &MergerWeights, hp: &HParams, e: &Tensor) -> Tensor {
    let (d, k, m) = (hp.n_embd as i64, e.ne()[1], e.ne()[2]);
    let (hm, hd) = (hp.n_merger_head as i64, hp.merger_head_dim() as i64);
    let mean = g.reshape(&g.mean(&g.cont(&g.transpose(e))), &[d, m]).named("merger_mean"); // [D, m]
    let q = linear(g, &w.q, &mean); // [D, m]
    let pos = g.view(&w.pos, &[d / 2, k], &[w.pos.nb()[1]], 0); // [D/2, k]: rows 0..k of P
    let pos = g.repeat(&pos, &g.new_tensor(Type::F32, &[d / 2, k, m])); // [D/2, k, m]
    let u = g.concat(e, &pos, 0); // [3D/2, k, m]
    let keys = linear(g, &w.k, &u); // [D, k, m]
    let values = linear(g, &w.v, &u); // [D, k, m]
    let q = g.permute(&g.reshape(&q, &[hd, hm, 1, m]), [0, 2, 1, 3]); // [hd, 1, Hm, m]
    let keys = g.permute(&g.reshape(&keys, &[hd, hm, k, m]), [0, 2, 1, 3]); // [hd, k, Hm, m]
    let scores = g.mul_mat(&keys, &q); // [k, 1, Hm, m]
    let attn = g.soft_max_ext(&scores, None, 1.0 / (hd as f32).sqrt()); // softmax over j
    let values = g.cont(&g.permute(&g.reshape(&values, &[hd, hm, k, m]), [1, 2, 0, 3])); // [k, hd, Hm, m]
    let o = g.reshape(&g.mul_mat(&values, &attn), &[d, m]); // [hd, 1, Hm, m] -> concat of heads [D, m]
    g.add(&mean, &linear(g, &w.out, &o)).named("merged")
}

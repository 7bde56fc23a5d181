//! The compositional embedder: the k tokens one macro step emitted become ONE
//! input embedding (shared/docs/hamburger-model.md, "Compositional embedder").

use ggml::{Context, Tensor};

use super::linear;
use crate::hparams::HParams;
use crate::weights::MergerWeights;

/// Merges the token embeddings `e [D, k]` (k > 1, in emission order) into `[D, 1]`:
/// `mean + Wo · attention(q = Wq·mean, keys/values from [e_j, P_j])`.
pub fn merge(g: &Context, w: &MergerWeights, hp: &HParams, e: &Tensor) -> Tensor {
    let (d, k) = (hp.n_embd as i64, e.ne()[1]);
    let (hm, hd) = (hp.n_merger_head as i64, hp.merger_head_dim() as i64);
    let mean = g.reshape(&g.mean(&g.cont(&g.transpose(e))), &[d, 1]).named("merger_mean"); // [D, 1]
    let q = linear(g, &w.q, &mean); // [D, 1]
    let pos = g.view(&w.pos, &[d / 2, k], &[w.pos.nb()[1]], 0); // [D/2, k]: rows 0..k of P
    let u = g.concat(e, &pos, 0); // [3D/2, k]
    let keys = linear(g, &w.k, &u); // [D, k]
    let values = linear(g, &w.v, &u); // [D, k]
    let q = g.permute(&g.reshape(&q, &[hd, hm, 1]), [0, 2, 1, 3]); // [hd, 1, Hm]
    let keys = g.permute(&g.reshape(&keys, &[hd, hm, k]), [0, 2, 1, 3]); // [hd, k, Hm]
    let scores = g.mul_mat(&keys, &q); // [k, 1, Hm]
    let attn = g.soft_max_ext(&scores, None, 1.0 / (hd as f32).sqrt()); // softmax over j
    let values = g.cont(&g.permute(&g.reshape(&values, &[hd, hm, k]), [1, 2, 0, 3])); // [k, hd, Hm]
    let o = g.reshape(&g.mul_mat(&values, &attn), &[d, 1]); // [hd, 1, Hm] -> concat of heads [D, 1]
    g.add(&mean, &linear(g, &w.out, &o)).named("merged")
}

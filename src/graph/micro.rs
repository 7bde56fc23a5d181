//! One micro step of the micro-step decoder: the step's first call feeds the
//! base's features and embed(t_0) at micro positions 0..=F; later calls feed
//! embed(t_s) at position F+s, attending to the micro cache. No final norm.

use std::rc::Rc;

use ggml::{Backend, Tensor};

use super::{decoder_layer, finish, AttnConfig, AttnInputs, LayerCtx, StepGraph};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::Result;

/// Builds the graph of micro step `s` (computing out_{s+1} from t_s), with the
/// stop head when `stop_head`.
///
/// # Errors
/// When the graph cannot be allocated.
pub fn build(
    model: &Model,
    cache: &KvCache,
    features: &Tensor,
    s: usize,
    stop_head: bool,
    cfg: AttnConfig,
    backends: &[Rc<Backend>],
) -> Result<StepGraph> {
    let (hp, w) = (&model.hp, &model.weights);
    let (g, mut gf, tokens, size) = super::start(hp.n_micro_layer, 1)?;
    let e = g.get_rows(&w.tok_embd, &tokens); // [D, 1]
    let mut x = if s == 0 { g.concat(features, &e, 1) } else { e }; // [D, F+1] or [D, 1]
    let n = x.ne()[1] as usize;
    let attn = AttnInputs::new(&g, cache, hp.n_embd_kv(), n, hp.n_features() + s + 1, cfg);
    let lc = LayerCtx { hp, cache, attn: &attn, rope_freqs: w.rope_freqs.as_ref(), cfg };
    let last = hp.n_micro_layer - 1;
    for (il, lw) in w.micro.iter().enumerate() {
        x = decoder_layer(&g, &mut gf, &lc, lw, il, &x, il == last);
    }
    finish(&g, gf, backends, w.lm_head(), stop_head.then_some(&w.stop), &x, tokens, attn, cache, size)
}

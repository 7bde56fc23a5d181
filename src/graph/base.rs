//! The macro step's base forward: a batch of inputs (a prompt chunk, or the
//! one merged input of the previous macro step) through every base layer,
//! writing one KV entry per input, with the features of the last position
//! copied out for the micro decoder and out_0's logits and stop probability.

use std::rc::Rc;

use ggml::{Backend, Tensor};

use super::{decoder_layer, finish, merger, rms_norm, AttnConfig, AttnInputs, LayerCtx, StepGraph};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::Result;

/// The shape a base graph is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseShape {
    /// Token ids read.
    pub n_tokens: usize,
    /// Whether the tokens are merged into one input (a macro step's output, k > 1).
    pub merged: bool,
    /// Cache slots attended (padded).
    pub n_kv: usize,
    /// Whether to compute the stop head (not when the step length is forced).
    pub stop_head: bool,
}

impl BaseShape {
    /// Inputs (KV entries written).
    pub fn n_inputs(&self) -> usize {
        if self.merged {
            1
        } else {
            self.n_tokens
        }
    }
}

/// Builds the base graph; `features [D, F]` receives the last position's features.
///
/// # Errors
/// When the graph cannot be allocated.
pub fn build(
    model: &Model,
    kv: &KvCache,
    features: &Tensor,
    shape: BaseShape,
    cfg: AttnConfig,
    backends: &[Rc<Backend>],
) -> Result<StepGraph> {
    let (hp, w) = (&model.hp, &model.weights);
    let (g, mut gf, tokens, size) = super::start(hp.n_layer, shape.n_tokens)?;
    let e = g.get_rows(&w.tok_embd, &tokens); // [D, n_tokens]
    let mut x = if shape.merged { merger::merge(&g, &w.merger, hp, &e) } else { e }; // [D, n]
    let n = shape.n_inputs();
    let attn = AttnInputs::new(&g, kv, hp.n_embd_kv(), n, shape.n_kv, cfg);
    let lc = LayerCtx { hp, cache: kv, attn: &attn, rope_freqs: w.rope_freqs.as_ref(), cfg };
    let last_col = |t: &Tensor| {
        let nb1 = t.nb()[1];
        g.view(t, &[hp.n_embd as i64, 1], &[nb1], nb1 * (t.ne()[1] as usize - 1))
    };
    let feature_col = |f: usize| g.view(features, &[hp.n_embd as i64, 1], &[features.nb()[1]], f * features.nb()[1]);
    let last_layer = hp.n_layer - 1;
    for (il, lw) in w.layers.iter().enumerate() {
        x = decoder_layer(&g, &mut gf, &lc, lw, il, &x, il == last_layer);
        if il != last_layer {
            if let Some(f) = hp.feature_layers.iter().position(|&l| l == il) {
                gf.expand(&g.cpy(&last_col(&x), &feature_col(f)));
            }
        }
    }
    let out = rms_norm(&g, &x, &w.output_norm, hp.rms_eps).named("out_0"); // [D, 1]
    gf.expand(&g.cpy(&out, &feature_col(hp.n_features() - 1)));
    finish(&g, gf, backends, w.lm_head(), shape.stop_head.then_some(&w.stop), &out, tokens, attn, kv, size)
}

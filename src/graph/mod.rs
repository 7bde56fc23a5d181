//! Graph builders: plain functions of (context, weights, inputs) that return
//! tensors. Shapes are commented in ggml order (`[ne0, ne1, ...]`).
//!
//! * [`base`]: the macro step's base forward over a batch of inputs;
//! * [`merger`]: the compositional embedder;
//! * [`micro`]: one micro step of the micro-step decoder, for a batch of sequences;
//! * [`layer`]: the attention inputs and the decoder layer both stacks share;
//! * [`cache`]: the built graphs an engine keeps by shape, and which are warm;
//! * this module: the shared pieces (norm, linear, MLP, heads) and the
//!   [`StepGraph`] every builder returns.
//!
//! Each builder has an input type that owns its graph's input tensors and
//! writes their values from (cache, batch): structure is built once per
//! shape, data is filled per step.

pub mod base;
pub mod cache;
pub mod layer;
pub mod merger;
pub mod micro;

use std::rc::Rc;

use ggml::{Backend, Context, Graph, RopeParams, Scheduler, Tensor, Type};

use crate::error::Result;
use crate::model::hparams::HParams;
use crate::model::weights::{LayerWeights, Linear, StopHeadWeights};

/// A built graph with the type that fills its inputs and its outputs, and the
/// scheduler that allocated it: built once per shape, reused every step.
pub struct StepGraph<I> {
    /// The graph.
    pub graph: Graph,
    /// Its scheduler (one per graph, so switching graphs costs no reallocation).
    pub sched: Scheduler,
    /// Its inputs.
    pub inputs: I,
    /// Its outputs.
    pub outputs: Outputs,
}

/// The outputs of one graph run at its `n_out` output positions.
pub struct Outputs {
    /// Logits `[V, n_out]` (f32).
    logits: Tensor,
    /// Argmax of each column of the logits `[n_out]` (i32).
    argmax: Tensor,
    /// Stop probabilities `[n_out]` (f32), when the graph computes them.
    p_stop: Option<Tensor>,
    /// The draft head's stop probabilities `[n_out]`, when a base forward
    /// computes them beside the macro steps' (see [`Stops`]).
    p_stop_draft: Option<Tensor>,
}

/// The stop heads a graph runs on its output rows: the one whose
/// probability is `p_stop`, and a base forward's draft head beside it, whose
/// probability self-verified sequences read ([`StepOut::p_stop_for`]).
#[derive(Clone, Copy, Default)]
pub struct Stops<'a> {
    /// The stop head of `p_stop`, if the step length depends on it.
    pub p_stop: Option<&'a StopHeadWeights>,
    /// The draft head's stop head, computed beside it.
    pub p_stop_draft: Option<&'a StopHeadWeights>,
}

/// The outputs of one graph run for one output position.
#[derive(Debug, Clone)]
pub struct StepOut {
    /// The argmax token.
    pub argmax: u32,
    /// The stop probability (NaN when the step length does not depend on it).
    pub p_stop: f32,
    /// A base forward's draft-head stop probability (NaN when the model has
    /// no draft head, or it was not asked for).
    pub p_stop_draft: f32,
    /// The logits, when they were read.
    pub logits: Option<Vec<f32>>,
}

impl StepOut {
    /// The stop probability a sequence reads: a drafting one's from the
    /// draft head where the forward computed it, else the step's own.
    pub fn p_stop_for(&self, drafting: bool) -> f32 {
        if drafting && !self.p_stop_draft.is_nan() {
            self.p_stop_draft
        } else {
            self.p_stop
        }
    }
}

impl Outputs {
    /// The reads [`Outputs::read`] makes, and the bytes they copy.
    pub fn host_reads(&self, want_logits: bool) -> (u64, u64) {
        let tensors =
            [Some(&self.argmax), self.p_stop.as_ref(), self.p_stop_draft.as_ref(), want_logits.then_some(&self.logits)];
        tensors.iter().flatten().fold((0, 0), |(n, bytes), t| (n + 1, bytes + t.nbytes() as u64))
    }

    /// Reads every output position's results (the logits only if `want_logits`).
    ///
    /// # Errors
    /// When a tensor cannot be read.
    pub fn read(&self, want_logits: bool) -> Result<Vec<StepOut>> {
        let n_out = self.argmax.ne()[0] as usize;
        let mut argmax = vec![0i32; n_out];
        self.argmax.read(&mut argmax)?;
        let read = |t: &Option<Tensor>| -> Result<Vec<f32>> {
            let mut v = vec![f32::NAN; n_out];
            if let Some(t) = t {
                t.read(&mut v)?;
            }
            Ok(v)
        };
        let (p_stop, p_stop_draft) = (read(&self.p_stop)?, read(&self.p_stop_draft)?);
        let mut logits = if want_logits { Some(self.logits.to_vec_f32()?) } else { None };
        let n_vocab = self.logits.ne()[0] as usize;
        Ok((0..n_out)
            .map(|j| StepOut {
                argmax: argmax[j] as u32,
                p_stop: p_stop[j],
                p_stop_draft: p_stop_draft[j],
                logits: logits.as_mut().map(|l| l[j * n_vocab..(j + 1) * n_vocab].to_vec()),
            })
            .collect())
    }
}

/// A graph under construction: its context, the graph, and the node budget.
pub struct GraphStart {
    /// The context the graph's tensors live in.
    pub g: Context,
    /// The graph.
    pub gf: Graph,
    size: usize,
}

/// Starts a step graph over `n_layers` transformer layers, each attending in `n_attn_groups` groups.
///
/// # Errors
/// When ggml cannot allocate the context.
pub fn start(n_layers: usize, n_attn_groups: usize) -> Result<GraphStart> {
    // Nodes per layer and per attention group in it, plus the embedding,
    // merger, heads and feature copies.
    const NODES_PER_LAYER: usize = 64;
    const NODES_PER_ATTN_GROUP: usize = 16;
    const NODES_OUTSIDE_LAYERS: usize = 256;
    let size = (NODES_PER_LAYER + NODES_PER_ATTN_GROUP * n_attn_groups) * n_layers + NODES_OUTSIDE_LAYERS;
    let g = Context::new(2 * size, size)?;
    let gf = Graph::new(&g, size);
    Ok(GraphStart { g, gf, size })
}

/// The token-id input `[n]` (i32) of a graph.
pub fn token_input(g: &Context, n: usize) -> Tensor {
    let tokens = g.new_tensor(Type::I32, &[n as i64]).named("inp_tokens");
    tokens.set_input();
    tokens
}

/// Finishes a step graph: the logits of `head` (the lm_head `[D, V]`, or a
/// draft vocabulary's rows of it), their argmax and the stop heads of
/// `stops` (where the step's length depends on them) on `out [D, n_out]`,
/// all marked as outputs; then allocates the graph on a scheduler of its own.
///
/// # Errors
/// When the scheduler cannot be created or the graph allocated.
pub fn finish<I>(
    gs: GraphStart,
    backends: &[Rc<Backend>],
    head: &Tensor,
    out: &Tensor,
    stops: Stops,
    inputs: I,
) -> Result<StepGraph<I>> {
    let GraphStart { g, mut gf, size } = gs;
    let logits = g.mul_mat(head, out).named("logits"); // [V, n_out]
    let argmax = g.argmax(&logits).named("argmax"); // [n_out]
    let p_stop = stops.p_stop.map(|w| stop_probability(&g, w, out).named("p_stop"));
    let p_stop_draft = stops.p_stop_draft.map(|w| stop_probability(&g, w, out).named("p_stop_draft"));
    for t in [Some(&logits), Some(&argmax), p_stop.as_ref(), p_stop_draft.as_ref()].into_iter().flatten() {
        t.set_output();
        gf.expand(t);
    }
    // With a GPU, let the scheduler move big host-weight products there (llama.cpp's op offload).
    let mut sched = Scheduler::new(backends, size, backends.len() > 1)?;
    sched.alloc(&gf)?;
    if log::log_enabled!(log::Level::Debug) {
        let buffers: Vec<String> = sched
            .buffer_sizes()
            .iter()
            .map(|(t, n)| format!("{} {:.1} MiB", t.name(), *n as f64 / ggml::MIB))
            .collect();
        log::debug!(
            "graph: {} nodes, {} splits, compute buffers {}",
            gf.n_nodes(),
            sched.n_splits(),
            buffers.join(", ")
        );
    }
    Ok(StepGraph { graph: gf, sched, inputs, outputs: Outputs { logits, argmax, p_stop, p_stop_draft } })
}

/// The view of the `n` last columns (rows) of `t [D, m]`.
pub fn last_cols(g: &Context, t: &Tensor, n: usize) -> Tensor {
    let nb1 = t.nb()[1];
    g.view(t, &[t.ne()[0], n as i64], &[nb1], nb1 * (t.ne()[1] as usize - n))
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
        mode: ggml::ROPE_MODE_NORMAL,
        n_ctx_orig: hp.n_ctx_train as i32,
        freq_base: hp.rope_freq_base,
        freq_scale: 1.0,
    }
}

/// The stop head's probabilities `[n]` for `x [D, n]`.
pub fn stop_probability(g: &Context, w: &StopHeadWeights, x: &Tensor) -> Tensor {
    let h = g.silu(&linear(g, &w.fc1, x));
    let h = g.silu(&linear(g, &w.fc2, &h));
    let p = g.sigmoid(&linear(g, &w.out, &h)); // [1, n]
    g.reshape(&p, &[x.ne()[1]])
}

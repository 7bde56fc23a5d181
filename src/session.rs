//! A decoding session: the caches, the graphs built for them, and the state
//! of the conversation (KV slots used, token positions, the pending tokens of
//! the last macro step). `feed` runs base forwards; `generate` runs the
//! macro/micro loop of shared/docs/hamburger-model.md.

use std::rc::Rc;
use std::time::Instant;

use ggml::{Backend, Buffer, BufferType, Context, Tensor, ThreadPool, Type};
use half::f16;

use crate::graph::{base, micro, AttnConfig, StepGraph};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::sampling::Sampler;
use crate::{Error, Result};

/// Settings of a session (llama-cli's context flags plus HAMburger's knobs).
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// KV cache slots (base inputs); a prompt plus the tokens to generate must fit.
    pub n_ctx: usize,
    /// Prompt tokens per base forward.
    pub n_batch: usize,
    /// CPU threads.
    pub n_threads: usize,
    /// KV cache element type.
    pub kv_type: Type,
    /// Fused flash attention.
    pub flash_attn: bool,
    /// Stop a macro step when `1 - p_stop < confidence` (> 1: one token per step).
    pub confidence: f32,
    /// Most tokens per macro step (0 or more than the model's: the model's).
    pub max_steps: usize,
    /// Make every macro step emit exactly this many tokens, ignoring the stop
    /// head (benchmarks of untrained grafted modules).
    pub forced_steps: Option<usize>,
    /// Keep generating past end-of-generation tokens (benchmarks).
    pub ignore_eog: bool,
    /// Keep every micro step's logits in the result (tests).
    pub keep_logits: bool,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            n_ctx: 4096,
            n_batch: 512,
            n_threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
            kv_type: Type::F16,
            flash_attn: true,
            confidence: 0.8,
            max_steps: 0,
            forced_steps: None,
            ignore_eog: false,
            keep_logits: false,
        }
    }
}

/// The outputs of one graph run for its last position.
#[derive(Debug, Clone)]
pub struct StepOut {
    /// The argmax token.
    pub argmax: u32,
    /// The stop probability (NaN when the step length does not depend on it).
    pub p_stop: f32,
    /// The logits, when they were read.
    pub logits: Option<Vec<f32>>,
}

/// What one macro step emitted.
#[derive(Debug, Clone, Default)]
pub struct MacroStep {
    /// Tokens, in order.
    pub tokens: Vec<u32>,
    /// Stop probability after each token.
    pub p_stop: Vec<f32>,
    /// Logits of each micro step (only with `keep_logits`).
    pub logits: Vec<Vec<f32>>,
}

/// Timing and cache statistics of a generation.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Milliseconds spent on the prompt.
    pub prompt_ms: f64,
    /// Tokens generated (after truncation).
    pub gen_tokens: usize,
    /// Milliseconds spent generating.
    pub gen_ms: f64,
    /// Macro steps (base forwards) of the generation.
    pub macro_steps: usize,
    /// KV entries in use at the end.
    pub kv_entries: usize,
    /// Tokens (positions) in the context at the end.
    pub context_tokens: usize,
    /// Bytes one KV entry takes.
    pub kv_bytes_per_entry: usize,
    /// `reached[s]`: macro steps that emitted at least `s + 1` tokens.
    pub reached: Vec<usize>,
}

impl Timings {
    /// Mean tokens per macro step.
    pub fn tokens_per_step(&self) -> f64 {
        if self.macro_steps == 0 {
            0.0
        } else {
            self.reached.iter().sum::<usize>() as f64 / self.macro_steps as f64
        }
    }
}

/// The result of [`Session::generate`].
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// Tokens generated, cut at the first end-of-generation token and at the budget.
    pub output_ids: Vec<u32>,
    /// Every macro step as emitted (the last one may reach past the cut).
    pub macro_steps: Vec<MacroStep>,
    /// Statistics.
    pub timings: Timings,
}

/// A mask in the element type the attention kernel wants.
enum Mask {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// Host-side values of a graph's attention inputs.
struct AttnData {
    pos: Vec<i32>,
    slots: Vec<i64>,
    v_idx: Option<Vec<i64>>,
    mask: Mask,
}

impl AttnData {
    fn write(&self, sg: &StepGraph) -> Result<()> {
        sg.pos.write(&self.pos)?;
        sg.kv_idx.write(&self.slots)?;
        if let (Some(t), Some(v)) = (&sg.v_idx, &self.v_idx) {
            t.write(v)?;
        }
        match &self.mask {
            Mask::F16(m) => sg.mask.write(m)?,
            Mask::F32(m) => sg.mask.write(m)?,
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GraphKey {
    Base(base::BaseShape),
    Micro { s: usize, stop_head: bool },
}

/// Built graphs by shape, least recently used evicted first.
struct GraphCache {
    entries: Vec<(GraphKey, StepGraph)>,
}

const GRAPH_CACHE: usize = 16;
/// Attention windows grow in steps of this many slots, so decode graphs are rebuilt rarely.
const KV_PAD: usize = 256;

thread_local! {
    /// CPU thread pools by size, shared by the sessions of a thread: one set of
    /// (spinning) workers however many sessions are open.
    static POOLS: std::cell::RefCell<Vec<(usize, std::rc::Weak<ThreadPool>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The thread pool of `n` threads this thread's sessions share (created on first use).
fn shared_threadpool(n: usize) -> Result<Rc<ThreadPool>> {
    POOLS.with(|pools| {
        let mut pools = pools.borrow_mut();
        pools.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = pools.iter().find(|(k, _)| *k == n).and_then(|(_, w)| w.upgrade()) {
            return Ok(p);
        }
        let p = Rc::new(ThreadPool::new(n)?);
        pools.push((n, Rc::downgrade(&p)));
        Ok(p)
    })
}

/// A decoding session over a borrowed model.
pub struct Session<'m> {
    model: &'m Model,
    params: SessionParams,
    backends: Vec<Rc<Backend>>,
    kv: KvCache,
    micro: KvCache,
    features: Tensor,
    _features_buf: Buffer,
    graphs: GraphCache,
    n_slots: usize,
    n_pos: usize,
    pending: Vec<u32>,
    history: Vec<u32>,
}

impl<'m> Session<'m> {
    /// A session with empty caches.
    ///
    /// # Errors
    /// On invalid settings or failed allocations.
    pub fn new(model: &'m Model, params: SessionParams) -> Result<Session<'m>> {
        let hp = &model.hp;
        if params.n_ctx == 0 || params.n_batch == 0 || params.n_threads == 0 {
            return Err(Error::Invalid("context, batch and thread counts must be positive".into()));
        }
        let cpu = Backend::cpu()?;
        cpu.set_n_threads(params.n_threads);
        cpu.set_threadpool(shared_threadpool(params.n_threads)?);
        let offload = model.offload;
        // The GPU (if any) first: the scheduler prefers earlier backends.
        let mut backends = Vec::new();
        if let Some(dev) = offload.gpu {
            backends.push(Rc::new(Backend::new(dev)?));
        }
        backends.push(Rc::new(cpu));
        // Each layer's cache lives with its weights; the micro decoder's and the
        // features with the last layer.
        let gpu_buft = offload.gpu.map(|d| d.buffer_type());
        let first_gpu = offload.first_gpu_layer(hp.n_layer);
        let buft_of = |on_gpu: bool| gpu_buft.filter(|_| on_gpu).unwrap_or_else(BufferType::cpu);
        let base_bufts: Vec<BufferType> = (0..hp.n_layer).map(|il| buft_of(il >= first_gpu)).collect();
        let tail = buft_of(first_gpu < hp.n_layer);
        let v_trans = !params.flash_attn;
        let kv = KvCache::new(&base_bufts, params.n_ctx, hp.n_embd_kv(), hp.head_dim, params.kv_type, v_trans)
            .map_err(|e| {
                Error::Invalid(format!(
                    "cannot allocate a KV cache of {} entries ({e}): use a smaller context (-c)",
                    params.n_ctx
                ))
            })?;
        let micro = KvCache::new(
            &vec![tail; hp.n_micro_layer],
            hp.micro_cache_len(),
            hp.n_embd_kv(),
            hp.head_dim,
            params.kv_type,
            v_trans,
        )?;
        let fctx = Context::new(1, 0)?;
        let features = fctx.new_tensor(Type::F32, &[hp.n_embd as i64, hp.n_features() as i64]).named("features");
        let features_buf = Buffer::alloc_context(&fctx, tail)?;
        Ok(Session {
            model,
            params,
            backends,
            kv,
            micro,
            features,
            _features_buf: features_buf,
            graphs: GraphCache { entries: Vec::new() },
            n_slots: 0,
            n_pos: 0,
            pending: Vec::new(),
            history: Vec::new(),
        })
    }

    /// The settings.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// KV entries in use.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Bytes of the whole KV cache and of one entry.
    pub fn kv_bytes(&self) -> (usize, usize) {
        (self.kv.bytes(), self.kv.bytes_per_slot())
    }

    /// Forgets the conversation (the caches are reused; stale slots are never attended).
    pub fn clear(&mut self) {
        self.n_slots = 0;
        self.n_pos = 0;
        self.pending.clear();
        self.history.clear();
    }

    fn max_steps(&self) -> usize {
        let m = self.model.hp.max_steps;
        let m = if self.params.max_steps == 0 { m } else { self.params.max_steps.min(m) };
        self.params.forced_steps.map_or(m, |f| f.clamp(1, m))
    }

    /// Whether step lengths depend on the stop head (not when forced, when
    /// every step is one token, or when the confidence stops every step anyway).
    fn needs_stop_head(&self) -> bool {
        self.params.forced_steps.is_none() && self.max_steps() > 1 && self.params.confidence <= 1.0
    }

    fn attn_cfg(&self) -> AttnConfig {
        AttnConfig { flash: self.params.flash_attn }
    }

    /// Gets (building if needed) the graph for `key`, most recent first.
    fn graph(&mut self, key: GraphKey) -> Result<&mut StepGraph> {
        if let Some(i) = self.graphs.entries.iter().position(|(k, _)| *k == key) {
            let e = self.graphs.entries.remove(i);
            self.graphs.entries.insert(0, e);
        } else {
            let built = match key {
                GraphKey::Base(shape) => {
                    base::build(self.model, &self.kv, &self.features, shape, self.attn_cfg(), &self.backends)?
                }
                GraphKey::Micro { s, stop_head } => micro::build(
                    self.model,
                    &self.micro,
                    &self.features,
                    s,
                    stop_head,
                    self.attn_cfg(),
                    &self.backends,
                )?,
            };
            self.graphs.entries.insert(0, (key, built));
            self.graphs.entries.truncate(GRAPH_CACHE);
        }
        Ok(&mut self.graphs.entries[0].1)
    }

    /// The attention inputs of inputs at `positions` written to contiguous
    /// slots from `first_slot`, each attending every slot up to its own.
    fn attention_data(cache: &KvCache, positions: &[i32], first_slot: usize, n_kv: usize, flash: bool) -> AttnData {
        let slots: Vec<i64> = (0..positions.len()).map(|i| (first_slot + i) as i64).collect();
        let allowed = |x: usize| x % n_kv <= first_slot + x / n_kv;
        let cells = 0..positions.len() * n_kv;
        AttnData {
            pos: positions.to_vec(),
            v_idx: cache.v_trans().then(|| cache.v_trans_indices(&slots)),
            slots,
            mask: if flash {
                Mask::F16(cells.map(|x| if allowed(x) { f16::ZERO } else { f16::NEG_INFINITY }).collect())
            } else {
                Mask::F32(cells.map(|x| if allowed(x) { 0.0 } else { f32::NEG_INFINITY }).collect())
            },
        }
    }

    fn read_out(sg: &StepGraph, want_logits: bool) -> Result<StepOut> {
        let (mut a, mut p) = ([0i32], [f32::NAN]);
        sg.argmax.read(&mut a)?;
        if let Some(t) = &sg.p_stop {
            t.read(&mut p)?;
        }
        Ok(StepOut {
            argmax: a[0] as u32,
            p_stop: p[0],
            logits: if want_logits { Some(sg.logits.to_vec_f32()?) } else { None },
        })
    }

    /// One base forward over `tokens` (each its own input, or merged into one).
    fn base_forward(&mut self, tokens: &[u32], merged: bool, want_logits: bool) -> Result<StepOut> {
        let merged = merged && tokens.len() > 1;
        let n = if merged { 1 } else { tokens.len() };
        let n_kv = (self.n_slots + n).next_multiple_of(KV_PAD).min(self.kv.n_slots());
        let shape = base::BaseShape { n_tokens: tokens.len(), merged, n_kv, stop_head: self.needs_stop_head() };
        // A merged input sits at the position of its last token.
        let positions: Vec<i32> = if merged {
            vec![(self.n_pos + tokens.len() - 1) as i32]
        } else {
            (0..n).map(|i| (self.n_pos + i) as i32).collect()
        };
        let data = Self::attention_data(&self.kv, &positions, self.n_slots, n_kv, self.params.flash_attn);
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let sg = self.graph(GraphKey::Base(shape))?;
        sg.tokens.write(&ids)?;
        data.write(sg)?;
        sg.sched.compute(&sg.graph)?;
        let out = Self::read_out(sg, want_logits)?;
        self.n_slots += n;
        self.n_pos += tokens.len();
        Ok(out)
    }

    /// Micro step `s` of the current macro step: feeds `token` (t_s) to the
    /// micro decoder and returns out_{s+1}'s outputs. Step 0 first feeds the
    /// features of the last base forward.
    ///
    /// # Errors
    /// When `s` is beyond the micro cache or a computation fails.
    pub fn micro_step(&mut self, s: usize, token: u32, want_logits: bool) -> Result<StepOut> {
        if s + 1 >= self.model.hp.max_steps {
            return Err(Error::Invalid(format!("micro step {s} is beyond max_steps {}", self.model.hp.max_steps)));
        }
        let f = self.model.hp.n_features();
        let (positions, first): (Vec<i32>, usize) =
            if s == 0 { ((0..=f as i32).collect(), 0) } else { (vec![(f + s) as i32], f + s) };
        let data = Self::attention_data(&self.micro, &positions, first, f + s + 1, self.params.flash_attn);
        let sg = self.graph(GraphKey::Micro { s, stop_head: self.needs_stop_head() })?;
        sg.tokens.write(&[token as i32])?;
        data.write(sg)?;
        sg.sched.compute(&sg.graph)?;
        Self::read_out(sg, want_logits)
    }

    /// Feeds tokens into the context: first the pending tokens of the last macro
    /// step (merged into one input, as generation would have), then `tokens`
    /// each as its own input, in batches. Returns the outputs of the last input.
    ///
    /// # Errors
    /// When the context is full or a computation fails.
    pub fn feed(&mut self, tokens: &[u32], want_logits: bool) -> Result<StepOut> {
        let pending = std::mem::take(&mut self.pending);
        let needed = self.n_slots + usize::from(!pending.is_empty()) + tokens.len();
        if needed > self.kv.n_slots() {
            return Err(Error::ContextOverflow { prompt: needed, n_predict: 0, n_ctx: self.kv.n_slots() });
        }
        let mut out = None;
        if !pending.is_empty() {
            out = Some(self.base_forward(&pending, true, want_logits)?);
        }
        self.history.extend_from_slice(tokens);
        for chunk in tokens.chunks(self.params.n_batch) {
            out = Some(self.base_forward(chunk, false, want_logits)?);
        }
        out.ok_or_else(|| Error::Invalid("nothing to feed: the prompt is empty".into()))
    }

    /// Feeds `tokens` as the output of one macro step: merged into ONE input at
    /// the position of the last token (what [`Session::generate`] does between steps).
    ///
    /// # Errors
    /// When the context is full or a computation fails.
    pub fn feed_merged(&mut self, tokens: &[u32], want_logits: bool) -> Result<StepOut> {
        if !self.pending.is_empty() {
            return Err(Error::Invalid("the last macro step's tokens are still pending".into()));
        }
        self.history.extend_from_slice(tokens);
        self.pending = tokens.to_vec();
        self.feed(&[], want_logits)
    }

    /// Runs the micro steps of one macro step with its tokens given (teacher
    /// forcing): from out_0's outputs `first`, feeds `tokens[..k-1]` and returns
    /// the outputs out_0..out_{k-1}, whose argmax and stop probability a
    /// quantized model can be compared on.
    ///
    /// # Errors
    /// When `tokens` is empty or longer than the model's steps, or a computation fails.
    pub fn forced_micro_steps(&mut self, first: StepOut, tokens: &[u32], want_logits: bool) -> Result<Vec<StepOut>> {
        if tokens.is_empty() || tokens.len() > self.model.hp.max_steps {
            return Err(Error::Invalid(format!("a macro step has 1 to {} tokens", self.model.hp.max_steps)));
        }
        let mut outs = vec![first];
        for (s, &t) in tokens[..tokens.len() - 1].iter().enumerate() {
            outs.push(self.micro_step(s, t, want_logits)?);
        }
        Ok(outs)
    }

    /// Generates up to `n_predict` tokens after `prompt` (which continues the
    /// conversation so far). `on_step` sees each macro step's kept tokens as
    /// soon as it completes and may return false to stop.
    ///
    /// # Errors
    /// When the prompt plus `n_predict` exceed the context, or a computation fails.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_predict: usize,
        sampler: &mut Sampler,
        mut on_step: impl FnMut(&[u32]) -> bool,
    ) -> Result<Generation> {
        let in_context = self.n_slots + usize::from(!self.pending.is_empty()) + prompt.len();
        if in_context + n_predict > self.kv.n_slots() {
            return Err(Error::ContextOverflow { prompt: in_context, n_predict, n_ctx: self.kv.n_slots() });
        }
        let want_logits = self.params.keep_logits || !sampler.is_greedy();
        let mut gen = Generation::default();
        gen.timings.reached = vec![0; self.max_steps()];
        let t0 = Instant::now();
        let mut out = self.feed(prompt, want_logits)?;
        gen.timings.prompt_tokens = prompt.len();
        gen.timings.prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        while gen.output_ids.len() < n_predict {
            let step = self.macro_step(out, sampler, n_predict - gen.output_ids.len(), want_logits)?;
            for (s, r) in gen.timings.reached.iter_mut().enumerate() {
                *r += usize::from(step.tokens.len() > s);
            }
            let eog = step.tokens.iter().position(|t| !self.params.ignore_eog && self.model.vocab.eog.contains(t));
            let kept = &step.tokens[..eog.map_or(step.tokens.len(), |i| i + 1)];
            gen.output_ids.extend_from_slice(kept);
            self.history.extend_from_slice(kept);
            self.pending = kept.to_vec();
            let go_on = on_step(kept);
            gen.macro_steps.push(step);
            if eog.is_some() || !go_on || gen.output_ids.len() >= n_predict {
                break;
            }
            let pending = std::mem::take(&mut self.pending);
            out = self.base_forward(&pending, true, want_logits)?;
        }
        let t = &mut gen.timings;
        t.gen_ms = t1.elapsed().as_secs_f64() * 1e3;
        t.gen_tokens = gen.output_ids.len();
        t.macro_steps = gen.macro_steps.len();
        t.kv_entries = self.n_slots;
        t.context_tokens = self.n_pos + self.pending.len();
        t.kv_bytes_per_entry = self.kv.bytes_per_slot();
        Ok(gen)
    }

    /// The micro loop of one macro step, starting from out_0's outputs `first`,
    /// emitting at most `budget` tokens.
    fn macro_step(
        &mut self,
        first: StepOut,
        sampler: &mut Sampler,
        budget: usize,
        want_logits: bool,
    ) -> Result<MacroStep> {
        let max_steps = self.max_steps();
        let mut step = MacroStep::default();
        let mut out = first;
        loop {
            let token = match &out.logits {
                Some(l) if !sampler.is_greedy() => sampler.sample(l, &self.history),
                _ => out.argmax,
            };
            step.tokens.push(token);
            step.p_stop.push(out.p_stop);
            if self.params.keep_logits {
                step.logits.push(out.logits.take().unwrap_or_default());
            }
            let n = step.tokens.len();
            let stop = match self.params.forced_steps {
                Some(_) => n >= max_steps,
                // Above 1 the rule stops every step whatever p_stop (not computed then).
                None => n >= max_steps || self.params.confidence > 1.0 || 1.0 - out.p_stop < self.params.confidence,
            };
            let eog = !self.params.ignore_eog && self.model.vocab.eog.contains(&token);
            if stop || eog || n >= budget {
                return Ok(step);
            }
            out = self.micro_step(n - 1, token, want_logits)?;
        }
    }
}

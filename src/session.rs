//! A conversation with one sequence: the simple API over an [`Engine`] of one
//! sequence. `generate` runs the decode loop ([`crate::generate`]); `feed`,
//! `feed_merged` and `micro_step` expose single base forwards and micro steps
//! (teacher forcing in sweeps, tests, benchmarks).

use ggml::Type;

use crate::engine::{Engine, EngineParams};
use crate::generate::{self, DecodeConfig, SeqGen};
use crate::graph::base::Wants;
use crate::graph::micro::MicroWants;
use crate::graph::StepOut;
use crate::kv_cache::SeqId;
use crate::model::Model;
use crate::sampling::{Sampler, SamplerParams};
use crate::step::Generation;
use crate::{Batch, Error, Result};

/// Settings of a session (llama-cli's context flags plus HAMburger's knobs).
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// KV cache entries (base inputs); a prompt plus the tokens to generate must fit.
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

impl SessionParams {
    /// The engine settings of these parameters for `n_seq` sequences sharing `n_ctx` cells.
    pub fn engine_params(&self, n_seq: usize) -> EngineParams {
        EngineParams {
            n_ctx: self.n_ctx,
            n_seq,
            n_batch: self.n_batch,
            n_threads: self.n_threads,
            kv_type: self.kv_type,
            flash_attn: self.flash_attn,
        }
    }
}

/// The session's one sequence.
const SEQ: SeqId = 0;

/// A decoding session over a borrowed model.
pub struct Session<'m> {
    engine: Engine<'m>,
    params: SessionParams,
    cfg: DecodeConfig,
    /// The last macro step's tokens, not yet fed (merged into one input next).
    pending: Vec<u32>,
    /// Every token of the conversation (for repetition penalties).
    history: Vec<u32>,
}

impl<'m> Session<'m> {
    /// A session with empty caches.
    ///
    /// # Errors
    /// On invalid settings or failed allocations.
    pub fn new(model: &'m Model, params: SessionParams) -> Result<Session<'m>> {
        Ok(Session {
            engine: Engine::new(model, &params.engine_params(1))?,
            cfg: DecodeConfig::new(model, &params),
            params,
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
        self.engine.kv().n_cells_of(SEQ)
    }

    /// Bytes of the whole KV cache and of one entry.
    pub fn kv_bytes(&self) -> (usize, usize) {
        (self.engine.kv().bytes(), self.engine.kv().bytes_per_cell())
    }

    /// Puts the CPU workers to sleep until the next graph: see [`Engine::pause_threads`].
    pub fn pause_threads(&self) {
        self.engine.pause_threads();
    }

    /// Forgets the conversation (the caches are reused).
    pub fn clear(&mut self) {
        self.engine.clear_seq(SEQ);
        self.pending.clear();
        self.history.clear();
    }

    fn check_room(&self, new_inputs: usize, n_predict: usize) -> Result<()> {
        let in_context = self.n_slots() + usize::from(!self.pending.is_empty()) + new_inputs;
        let n_ctx = self.engine.kv().n_cells();
        if in_context + n_predict > n_ctx {
            return Err(Error::ContextOverflow { prompt: in_context, n_predict, n_ctx });
        }
        Ok(())
    }

    /// Feeds tokens into the context: first the pending tokens of the last macro
    /// step (merged into one input, as generation would have), then `tokens`
    /// each as its own input, in batches. Returns the outputs of the last input.
    ///
    /// # Errors
    /// When nothing is fed, the context is full or a computation fails.
    pub fn feed(&mut self, tokens: &[u32], want_logits: bool) -> Result<StepOut> {
        self.check_room(tokens.len(), 0)?;
        let mut out = None;
        let mut batch = Batch::new();
        batch.push_merged(SEQ, &std::mem::take(&mut self.pending));
        self.history.extend_from_slice(tokens);
        for chunk in tokens.chunks(self.params.n_batch) {
            batch.push_tokens(SEQ, chunk);
            out = Some(self.forward(&std::mem::take(&mut batch), want_logits)?);
        }
        if !batch.is_empty() {
            out = Some(self.forward(&batch, want_logits)?);
        }
        out.ok_or_else(|| Error::Invalid("nothing to feed: the prompt is empty".into()))
    }

    fn forward(&mut self, batch: &Batch, want_logits: bool) -> Result<StepOut> {
        // Features always: the caller may drive micro steps itself.
        let want = Wants { stop_head: self.cfg.rule.needs_stop_head(), logits: want_logits, features: true };
        let mut outs = self.engine.decode(batch, want)?;
        Ok(outs.pop().expect("one sequence, one output").1)
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

    /// Micro step `s` of the current macro step: feeds `token` (t_s) to the
    /// micro decoder and returns out_{s+1}'s outputs. Step 0 first feeds the
    /// features of the last base forward.
    ///
    /// # Errors
    /// When `s` is beyond the micro cache or a computation fails.
    pub fn micro_step(&mut self, s: usize, token: u32, want_logits: bool) -> Result<StepOut> {
        let want = MicroWants { stop_head: self.cfg.rule.needs_stop_head(), logits: want_logits };
        let mut outs = self.engine.micro_step(s, &[(SEQ, token)], want)?;
        Ok(outs.pop().expect("one sequence, one output"))
    }

    /// Runs the micro steps of one macro step with its tokens given (teacher
    /// forcing): from out_0's outputs `first`, feeds `tokens[..k-1]` and returns
    /// the outputs out_0..out_{k-1}, whose argmax and stop probability a
    /// quantized model can be compared on.
    ///
    /// # Errors
    /// When `tokens` is empty or longer than the model's steps, or a computation fails.
    pub fn forced_micro_steps(&mut self, first: StepOut, tokens: &[u32], want_logits: bool) -> Result<Vec<StepOut>> {
        let max = self.engine.model().hp.max_steps;
        if tokens.is_empty() || tokens.len() > max {
            return Err(Error::Invalid(format!("a macro step has 1 to {max} tokens")));
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
        self.check_room(prompt.len(), n_predict)?;
        let pending = std::mem::take(&mut self.pending);
        let history = std::mem::take(&mut self.history);
        let lent = std::mem::replace(sampler, Sampler::new(SamplerParams::greedy()));
        let seq = SeqGen::new(SEQ, prompt, n_predict, lent).continuing(pending, history).on_step(&mut on_step);
        let mut seqs = [seq];
        let result = generate::run(&mut self.engine, &self.cfg, &mut seqs);
        let [seq] = seqs;
        let (gen, pending, history, lent) = seq.into_parts();
        (self.pending, self.history, *sampler) = (pending, history, lent);
        result.map(|()| gen)
    }
}

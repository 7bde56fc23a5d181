//! A conversation with one sequence: the simple API over an [`Engine`] of one
//! sequence. `generate` runs the decode loop ([`crate::decode::generate`]); `feed`,
//! `feed_merged` and `micro_step` expose single base forwards and micro steps
//! (teacher forcing in sweeps, tests, benchmarks).

use crate::decode::generate::{self, DecodeConfig, Pending, SeqGen};
use crate::decode::step::{Generation, StepParams};
use crate::engine::budget::EngineParams;
use crate::engine::counters::EngineCounters;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::error::{Param, ParamError};
use crate::graph::base::Wants;
use crate::graph::micro::MicroWants;
use crate::graph::StepOut;
use crate::memory::batch::Batch;
use crate::memory::kv_cache::SeqId;
use crate::model::Model;
use crate::sampling::constraint::Constraint;
use crate::sampling::{Sampler, SamplerParams};

/// Settings of a session: its engine's, its stop rule's, its sampling, and
/// what a generation keeps.
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// The engine: context, batch, threads, cache type, flash attention
    /// (`n_seq` must be 1: a session holds one sequence).
    pub engine: EngineParams,
    /// When a macro step ends.
    pub step: StepParams,
    /// How each token is picked, micro tokens included (the session's
    /// sampler is made from it, and made anew by [`Session::clear`]).
    pub sampling: SamplerParams,
    /// Keep generating past end-of-generation tokens (benchmarks).
    pub ignore_eog: bool,
    /// Keep every micro step's logits in the result (tests).
    pub keep_logits: bool,
}

impl Default for SessionParams {
    /// llama-cli's engine, the paper's confidence, and greedy decoding: a
    /// session samples only when told to, so that it reproduces by default.
    fn default() -> Self {
        SessionParams {
            engine: EngineParams::default(),
            step: StepParams::default(),
            sampling: SamplerParams::greedy(),
            ignore_eog: false,
            keep_logits: false,
        }
    }
}

impl SessionParams {
    /// The decode loop these settings ask for with `model` (also for an
    /// engine of several sequences decoded alike).
    ///
    /// # Errors
    /// When the stop rule does not fit the model ([`StepParams::validate`]).
    pub fn decode_config(&self, model: &Model) -> Result<DecodeConfig> {
        let cfg = DecodeConfig::new(model, &self.step, self.engine.n_batch)?;
        Ok(DecodeConfig { ignore_eog: self.ignore_eog, keep_logits: self.keep_logits, ..cfg })
    }
}

/// The session's one sequence.
const SEQ: SeqId = 0;

/// A decoding session over a borrowed model.
pub struct Session<'m> {
    engine: Engine<'m>,
    params: SessionParams,
    cfg: DecodeConfig,
    /// The last generation's tokens, not yet fed (the next forward's first inputs).
    pending: Pending,
    /// Every token of the conversation (for repetition penalties).
    history: Vec<u32>,
    /// Picks the tokens (`params.sampling`'s).
    sampler: Sampler,
    /// The constraint each generation's output obeys (started anew per call).
    constraint: Option<Constraint>,
}

impl<'m> Session<'m> {
    /// A session with empty caches.
    ///
    /// # Errors
    /// On invalid settings or failed allocations.
    pub fn new(model: &'m Model, params: SessionParams) -> Result<Session<'m>> {
        if params.engine.n_seq != 1 {
            let message = format!("{} {}: a session holds 1 sequence", Param::NSeq, params.engine.n_seq);
            return Err(ParamError::new(&[Param::NSeq], message).into());
        }
        params.sampling.validate()?;
        Ok(Session {
            sampler: Sampler::new(params.sampling),
            cfg: params.decode_config(model)?,
            engine: Engine::new(model, &params.engine)?,
            params,
            pending: Pending::default(),
            history: Vec::new(),
            constraint: None,
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

    /// Forgets the conversation (the caches are reused) and starts the
    /// sampler anew, so that a cleared session repeats itself.
    pub fn clear(&mut self) {
        self.engine.clear_seq(SEQ);
        self.pending = Pending::default();
        self.history.clear();
        self.sampler = Sampler::new(self.params.sampling);
    }

    fn check_room(&self, new_inputs: usize, n_predict: usize) -> Result<()> {
        let in_context = self.n_slots() + self.pending.n_inputs() + new_inputs;
        let n_ctx = self.engine.kv().n_cells();
        if in_context + n_predict > n_ctx {
            let (np, nc) = (Param::NPredict, Param::NCtx);
            let message = format!(
                "the prompt ({in_context} tokens) plus {n_predict} tokens to generate ({np}) exceed the context of {n_ctx} ({nc})"
            );
            return Err(ParamError::new(&[np, nc], message).into());
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
        std::mem::take(&mut self.pending).push_to(&mut batch, SEQ);
        self.history.extend_from_slice(tokens);
        for chunk in tokens.chunks(self.params.engine.n_batch) {
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
        let want = Wants {
            stop_head: self.cfg.rule.needs_stop_head(),
            logits: want_logits,
            features: true,
            draft_stop: false,
        };
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
        self.pending = Pending { merged: tokens.to_vec(), plain: Vec::new() };
        self.feed(&[], want_logits)
    }

    /// Micro step `s` of the current macro step: feeds `token` (t_s) to the
    /// micro decoder and returns out_{s+1}'s outputs. Step 0 first feeds the
    /// features of the last base forward.
    ///
    /// # Errors
    /// When `s` is beyond the micro cache or a computation fails.
    pub fn micro_step(&mut self, s: usize, token: u32, want_logits: bool) -> Result<StepOut> {
        let want = MicroWants {
            stop_head: self.cfg.rule.needs_stop_head(),
            logits: want_logits,
            drafts: false,
            draft_vocab: false,
        };
        let mut outs = self.engine.micro_step(s, &[(SEQ, token)], &[], want)?;
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

    /// Constrains the output of every later [`Session::generate`] call (each
    /// output on its own, from the grammar's start) by `c`; None lifts it.
    pub fn set_constraint(&mut self, c: Option<Constraint>) {
        self.constraint = c;
    }

    /// What its engine has done so far, counted.
    pub fn counters(&self) -> EngineCounters {
        self.engine.counters()
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
        mut on_step: impl FnMut(&[u32]) -> bool,
    ) -> Result<Generation> {
        self.check_room(prompt.len(), n_predict)?;
        let pending = std::mem::take(&mut self.pending);
        let history = std::mem::take(&mut self.history);
        let lent = std::mem::replace(&mut self.sampler, Sampler::new(SamplerParams::greedy()));
        let mut seq = SeqGen::new(SEQ, prompt, n_predict, lent).continuing(pending, history).on_step(&mut on_step);
        if let Some(c) = &self.constraint {
            seq = seq.constrained(c.start());
        }
        let mut seqs = [seq];
        let result = generate::run(&mut self.engine, &self.cfg, &mut seqs);
        let [seq] = seqs;
        let (gen, pending, history, lent) = seq.into_parts();
        (self.pending, self.history, self.sampler) = (pending, history, lent);
        result.map(|()| gen)
    }
}

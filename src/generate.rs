//! The decode loop of docs/model.md for one or more
//! sequences in lockstep. Each macro step runs ONE base forward over every
//! sequence's pending inputs (prompt chunks, and the merged tokens of its
//! last step as one input), then the micro steps of all sequences whose
//! steps continue, batched, sampling each sequence with its own sampler.

use std::borrow::BorrowMut;
use std::collections::VecDeque;
use std::time::Instant;

use crate::batch::Batch;
use crate::constraint::{MicroPolicy, SeqConstraint};
use crate::engine::Engine;
use crate::graph::base::Wants;
use crate::graph::micro::MicroWants;
use crate::graph::StepOut;
use crate::kv_cache::SeqId;
use crate::sampling::{Sampler, TokenLogprob};
use crate::step::{Generation, MacroStep, StepParams, StepRule};
use crate::{Error, Model, Result};

/// The settings of the decode loop (a sequence may bring its own [`StepRule`]).
#[derive(Debug, Clone)]
pub struct DecodeConfig {
    /// When a macro step ends.
    pub rule: StepRule,
    /// Inputs per base forward, all sequences together.
    pub n_batch: usize,
    /// Keep generating past end-of-generation tokens (benchmarks).
    pub ignore_eog: bool,
    /// Keep every micro step's logits in the result (tests).
    pub keep_logits: bool,
    /// The end-of-generation tokens.
    pub eog: Vec<u32>,
}

impl DecodeConfig {
    /// The loop for `model` with `step`'s rule and `n_batch` inputs per
    /// forward, stopping at end-of-generation tokens and keeping no logits.
    ///
    /// # Errors
    /// When `step` does not fit the model ([`StepParams::validate`]).
    pub fn new(model: &Model, step: &StepParams, n_batch: usize) -> Result<DecodeConfig> {
        Ok(DecodeConfig {
            rule: step.rule(model.hp.max_steps)?,
            n_batch,
            ignore_eog: false,
            keep_logits: false,
            eog: model.vocab.eog.clone(),
        })
    }

    fn is_eog(&self, token: u32) -> bool {
        !self.ignore_eog && self.eog.contains(&token)
    }
}

/// Called with each macro step's kept tokens as soon as it completes; returns
/// false to stop the sequence.
pub type OnStep<'a> = &'a mut dyn FnMut(&[u32]) -> bool;

/// One sequence's generation: what is left to feed, its sampler and budget,
/// and what it has generated.
pub struct SeqGen<'a> {
    seq: SeqId,
    /// The last macro step's tokens, fed first as ONE merged input.
    merged: Vec<u32>,
    prompt: Vec<u32>,
    fed: usize,
    /// Inputs fed again after the sequence was preempted, each ONE base
    /// input as it was first written (a prompt token, or a macro step's
    /// tokens merged), after the prompt.
    refeed: VecDeque<Vec<u32>>,
    n_predict: usize,
    sampler: Sampler,
    /// The structured-output constraint every token of this sequence obeys.
    constraint: Option<SeqConstraint>,
    /// This sequence's stop rule, when it differs from the loop's.
    rule: Option<StepRule>,
    /// Generate past end-of-generation tokens (a benchmark request).
    ignore_eog: bool,
    /// The most KV cells the sequence may hold: it ends ("length") when its
    /// next macro step's merged input would not fit. `None`: no bound but
    /// the cache's.
    max_cells: Option<usize>,
    /// Tokens of the context so far, the current macro step's included (for
    /// repetition penalties).
    history: Vec<u32>,
    /// Alternatives to report beside each token's log-probability; `None`:
    /// no log-probabilities (and no logits read for them).
    logprobs: Option<usize>,
    on_step: Option<OnStep<'a>>,
    gen: Generation,
    done: bool,
    started: Instant,
    gen_started: Option<Instant>,
}

impl<'a> SeqGen<'a> {
    /// Generation of up to `n_predict` tokens after `prompt` in sequence `seq`
    /// (whose context is empty, or is continued with [`SeqGen::continuing`]).
    pub fn new(seq: SeqId, prompt: &[u32], n_predict: usize, sampler: Sampler) -> SeqGen<'a> {
        SeqGen {
            seq,
            merged: Vec::new(),
            prompt: prompt.to_vec(),
            fed: 0,
            refeed: VecDeque::new(),
            n_predict,
            sampler,
            constraint: None,
            rule: None,
            ignore_eog: false,
            max_cells: None,
            history: prompt.to_vec(),
            logprobs: None,
            on_step: None,
            gen: Generation::default(),
            done: false,
            started: Instant::now(),
            gen_started: None,
        }
    }

    /// Continues a conversation: `merged` (the last macro step's tokens, not
    /// yet fed) goes first, and `history` precedes the prompt.
    pub fn continuing(mut self, merged: Vec<u32>, mut history: Vec<u32>) -> SeqGen<'a> {
        history.append(&mut self.history);
        SeqGen { merged, history, ..self }
    }

    /// Calls `f` with each macro step's kept tokens; `f` returns false to stop.
    pub fn on_step(self, f: OnStep<'a>) -> SeqGen<'a> {
        SeqGen { on_step: Some(f), ..self }
    }

    /// Decodes with `rule` instead of the loop's (a request's own confidence or step cap).
    pub fn with_rule(self, rule: StepRule) -> SeqGen<'a> {
        SeqGen { rule: Some(rule), ..self }
    }

    /// Records each token's log-probability with the `top` most likely
    /// alternatives ([`MacroStep::logprobs`]): the base's distribution for a
    /// macro step's first token, the micro decoder's for the others.
    pub fn with_logprobs(self, top: usize) -> SeqGen<'a> {
        SeqGen { logprobs: Some(top), ..self }
    }

    /// Constrains every token of the output (base and micro tokens) by `c`.
    pub fn constrained(self, c: SeqConstraint) -> SeqGen<'a> {
        SeqGen { constraint: Some(c), ..self }
    }

    /// Generates past end-of-generation tokens, whatever the loop's setting.
    pub fn ignoring_eog(self) -> SeqGen<'a> {
        SeqGen { ignore_eog: true, ..self }
    }

    /// Bounds the sequence by the KV cells it takes (one per prompt token,
    /// one per macro step) rather than by its tokens alone: it ends, as at
    /// its token budget, when a next macro step would need a cell past
    /// `max_cells`. A server gives each slot its share of the cache this
    /// way, so that k tokens per step become k times longer answers in the
    /// same cells.
    pub fn with_cell_limit(self, max_cells: usize) -> SeqGen<'a> {
        SeqGen { max_cells: Some(max_cells), ..self }
    }

    /// The sequence id.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// Resumes the sequence in `seq` after it was preempted (its cells
    /// taken back): `seq`'s cells hold the entries of its context's start,
    /// and `inputs` are the rest of its context as it was first written,
    /// each ONE base input (a prompt token, or a macro step's tokens merged),
    /// the last one the input its next macro step would have fed. They
    /// replace whatever was left to feed, so the sequence goes on with the
    /// same KV entries as if it had never stopped (feeding a merged step
    /// token by token instead would change its entries and its answer).
    pub fn refeed(&mut self, seq: SeqId, inputs: Vec<Vec<u32>>) {
        self.seq = seq;
        self.fed = self.prompt.len();
        self.merged.clear();
        self.refeed = inputs.into();
    }

    /// Base inputs it has left to feed before its next macro step's outputs.
    pub fn pending_inputs(&self) -> usize {
        usize::from(!self.merged.is_empty()) + self.prompt.len() - self.fed + self.refeed.len()
    }

    /// Whether its whole prompt has been fed (its entries are all written),
    /// and whatever it had to feed again after a preemption.
    pub fn prompt_fed(&self) -> bool {
        self.fed == self.prompt.len() && self.refeed.is_empty()
    }

    /// Whether the sequence has finished.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What it has generated so far.
    pub fn generation(&self) -> &Generation {
        &self.gen
    }

    /// Ends the sequence now (a stop string matched, the client left).
    pub fn stop(&mut self, engine: &Engine) {
        if !self.done {
            self.finish(engine);
        }
    }

    /// The generation, the last step's tokens (not yet fed), the history and the sampler.
    pub fn into_parts(self) -> (Generation, Vec<u32>, Vec<u32>, Sampler) {
        (self.gen, self.merged, self.history, self.sampler)
    }

    /// The rule that ends this sequence's macro steps: its own, else the loop's.
    fn rule(&self, cfg: &DecodeConfig) -> StepRule {
        self.rule.unwrap_or(cfg.rule)
    }

    fn is_eog(&self, cfg: &DecodeConfig, token: u32) -> bool {
        !self.ignore_eog && cfg.is_eog(token)
    }

    /// Whether this sequence's macro step ends after its `n`th token
    /// `token`, of stop probability `p_stop`: by its stop rule, at an
    /// end-of-generation token, or at its budget.
    fn step_ends(&self, cfg: &DecodeConfig, n: usize, p_stop: f32, token: u32) -> bool {
        self.rule(cfg).stops(n, p_stop) || self.is_eog(cfg, token) || n >= self.remaining()
    }

    fn remaining(&self) -> usize {
        self.n_predict.saturating_sub(self.gen.output_ids.len())
    }

    /// Whether this sequence needs the logits read (to sample, to mask, or
    /// for log-probabilities).
    fn wants_logits(&self) -> bool {
        !self.done && (!self.sampler.is_greedy() || self.logprobs.is_some() || self.constraint.is_some())
    }

    /// Picks the next token of the current macro step from `out` and adds it
    /// to the history (so that the step's later tokens are penalized for
    /// it), recording its log-probability in `step` when asked. A constrained
    /// sequence picks among the allowed tokens, except that under
    /// [`MicroPolicy::EndStep`] a forbidden micro choice gives None: the step
    /// ends before it.
    fn pick(&mut self, out: &StepOut, step: &mut MacroStep) -> Option<u32> {
        let first = step.tokens.is_empty();
        let greedy = self.sampler.is_greedy();
        let (sampler, history) = (&mut self.sampler, &self.history);
        let mut sample = |l: &[f32]| if greedy { crate::sampling::argmax(l) } else { sampler.sample(l, history) };
        let token = match (&mut self.constraint, &out.logits) {
            (None, Some(l)) if !greedy => sample(l),
            (None, _) => out.argmax,
            (Some(c), logits) => {
                let logits = logits.as_deref().expect("a constrained sequence asks for logits");
                let token = if !first && c.policy() == MicroPolicy::EndStep {
                    Some(sample(logits)).filter(|&t| c.allows(t))?
                } else {
                    let mut masked = logits.to_vec();
                    c.mask(&mut masked);
                    sample(&masked)
                };
                c.commit(token);
                token
            }
        };
        if let (Some(top), Some(l)) = (self.logprobs, &out.logits) {
            step.logprobs.push(TokenLogprob::new(l, token, top));
        }
        self.history.push(token);
        Some(token)
    }

    /// The tokens the constraint forces after the step's tokens, which join
    /// the step without a forward of their own (up to its size and budget);
    /// they enter the history, and are certain (log-probability 0) when
    /// log-probabilities are recorded.
    fn forced(&mut self, cfg: &DecodeConfig, step: &mut MacroStep) -> Vec<u32> {
        let room = self.rule(cfg).max_steps.min(self.remaining()).saturating_sub(step.tokens.len());
        let forced = self.constraint.as_mut().map(|c| c.take_forced(room)).unwrap_or_default();
        self.history.extend_from_slice(&forced);
        if self.logprobs.is_some() {
            step.logprobs.extend(forced.iter().map(|&t| TokenLogprob { token: t, logprob: 0.0, top: vec![(t, 0.0)] }));
        }
        forced
    }

    /// Ends the sequence, filling the statistics that describe its end.
    fn finish(&mut self, engine: &Engine) {
        self.done = true;
        let t = &mut self.gen.timings;
        t.gen_ms = self.gen_started.map_or(0.0, |s| s.elapsed().as_secs_f64() * 1e3);
        t.gen_tokens = self.gen.output_ids.len();
        t.macro_steps = self.gen.macro_steps.len();
        t.kv_entries = engine.kv().n_cells_of(self.seq);
        t.context_tokens = engine.next_pos(self.seq) + self.merged.len();
        t.kv_bytes_per_entry = engine.kv().bytes_per_cell();
    }

    /// Records a completed macro step: cut at end-of-generation, kept
    /// tokens become the next merged input.
    fn end_step(&mut self, step: MacroStep, cfg: &DecodeConfig, engine: &Engine) {
        for (s, r) in self.gen.timings.reached.iter_mut().enumerate() {
            *r += usize::from(step.tokens.len() > s);
        }
        let eog = step.tokens.iter().position(|&t| self.is_eog(cfg, t));
        let kept = &step.tokens[..eog.map_or(step.tokens.len(), |i| i + 1)];
        self.gen.output_ids.extend_from_slice(kept);
        // The history already holds the step's tokens (see `sample`); drop those cut.
        self.history.truncate(self.history.len() - (step.tokens.len() - kept.len()));
        self.merged = kept.to_vec();
        let go_on = self.on_step.as_mut().is_none_or(|f| f(kept));
        self.gen.macro_steps.push(step);
        let out_of_cells = self.max_cells.is_some_and(|m| engine.kv().n_cells_of(self.seq) >= m);
        if out_of_cells && eog.is_none() {
            self.gen.context_full = true;
        }
        if eog.is_some() || !go_on || self.remaining() == 0 || out_of_cells {
            self.finish(engine);
        }
    }
}

/// Runs every sequence to its end.
///
/// # Errors
/// As [`macro_step`].
pub fn run<'a, S: BorrowMut<SeqGen<'a>>>(engine: &mut Engine, cfg: &DecodeConfig, seqs: &mut [S]) -> Result<()> {
    let mut seqs: Vec<&mut SeqGen<'a>> = seqs.iter_mut().map(BorrowMut::borrow_mut).collect();
    while seqs.iter().any(|s| !s.done) {
        macro_step(engine, cfg, &mut seqs)?;
    }
    Ok(())
}

/// One macro step of the sequences not done: one base forward over their
/// pending inputs (at most `n_batch`, earlier sequences first), then, for
/// each sequence whose inputs are all fed, the micro steps of the macro step.
/// `seqs` are the sequences themselves or whatever owns one (a server's
/// running request).
///
/// # Errors
/// When a sequence has nothing to feed, the cache is full, or a computation fails.
pub fn macro_step<'a, S: BorrowMut<SeqGen<'a>>>(engine: &mut Engine, cfg: &DecodeConfig, seqs: &mut [S]) -> Result<()> {
    let mut seqs: Vec<&mut SeqGen<'a>> = seqs.iter_mut().map(BorrowMut::borrow_mut).collect();
    let mut batch = Batch::new();
    let mut budget = cfg.n_batch;
    let mut fed: Vec<(usize, usize, usize)> = Vec::new(); // (sequence index, prompt tokens fed, inputs refed)
    for (i, sg) in seqs.iter_mut().enumerate().filter(|(_, s)| !s.done) {
        if sg.pending_inputs() == 0 {
            return Err(Error::Invalid("nothing to feed: the prompt is empty".into()));
        }
        if budget == 0 {
            break;
        }
        if sg.gen.timings.reached.is_empty() {
            sg.gen.timings.reached = vec![0; sg.rule(cfg).max_steps];
            sg.gen.timings.prompt_tokens = sg.prompt.len();
        }
        if !sg.merged.is_empty() {
            batch.push_merged(sg.seq, &sg.merged);
            budget -= 1;
        }
        let take = budget.min(sg.prompt.len() - sg.fed);
        batch.push_tokens(sg.seq, &sg.prompt[sg.fed..sg.fed + take]);
        budget -= take;
        let refed = budget.min(sg.refeed.len());
        sg.refeed.iter().take(refed).for_each(|input| batch.push_merged(sg.seq, input));
        budget -= refed;
        fed.push((i, take, refed));
    }
    let want_logits = cfg.keep_logits || seqs.iter().any(|s| s.wants_logits());
    let stop_head = seqs.iter().any(|s| !s.done && s.rule(cfg).needs_stop_head());
    let features = seqs.iter().any(|s| !s.done && s.rule(cfg).may_continue());
    let mut outs = engine.decode(&batch, Wants { stop_head, logits: want_logits, features })?;
    let mut ready = Vec::new();
    for (i, take, refed) in fed {
        let sg = &mut seqs[i];
        sg.merged.clear();
        sg.fed += take;
        sg.refeed.drain(..refed);
        if sg.fed == sg.prompt.len() && sg.refeed.is_empty() {
            let j = outs.iter().position(|(s, _)| *s == sg.seq).expect("every sequence of the batch has an output");
            if sg.gen_started.is_none() {
                sg.gen.timings.prompt_ms = sg.started.elapsed().as_secs_f64() * 1e3;
                sg.gen_started = Some(Instant::now());
            }
            if sg.remaining() == 0 {
                sg.finish(engine);
            } else {
                ready.push((i, outs.swap_remove(j).1));
            }
        }
    }
    micro_steps(engine, cfg, &mut seqs, ready, MicroWants { stop_head, logits: want_logits })
}

/// The micro loops of the sequences in `ready` (index, out_0), batched: at
/// each micro step every sequence whose step continues feeds its token, and
/// the step computes what `want` asks (as the macro step's base forward did).
fn micro_steps(
    engine: &mut Engine,
    cfg: &DecodeConfig,
    seqs: &mut [&mut SeqGen],
    ready: Vec<(usize, StepOut)>,
    want: MicroWants,
) -> Result<()> {
    let mut steps: Vec<(usize, MacroStep)> = ready.iter().map(|(i, _)| (*i, MacroStep::default())).collect();
    let mut current: Vec<(usize, StepOut)> = ready.into_iter().enumerate().map(|(a, (_, out))| (a, out)).collect();
    for s in 0.. {
        let mut next = Vec::new();
        for (a, mut out) in current {
            let (i, step) = &mut steps[a];
            let sg = &mut seqs[*i];
            let Some(token) = sg.pick(&out, step) else { continue };
            step.tokens.push(token);
            step.p_stop.push(out.p_stop);
            if cfg.keep_logits {
                step.logits.push(out.logits.take().unwrap_or_default());
            }
            let n = step.tokens.len();
            let forced = if sg.step_ends(cfg, n, out.p_stop, token) { Vec::new() } else { sg.forced(cfg, step) };
            if !forced.is_empty() {
                // Forced tokens end the step: the micro decoder never saw
                // them, the next base forward takes them merged.
                step.p_stop.extend(forced.iter().map(|_| 1.0));
                step.tokens.extend(forced);
            } else if !sg.step_ends(cfg, n, out.p_stop, token) {
                next.push((a, sg.seq, token));
            }
        }
        if next.is_empty() {
            break;
        }
        let inputs: Vec<(SeqId, u32)> = next.iter().map(|&(_, seq, t)| (seq, t)).collect();
        let outs = engine.micro_step(s, &inputs, want)?;
        current = next.iter().map(|&(a, _, _)| a).zip(outs).collect();
    }
    for (i, step) in steps {
        seqs[i].end_step(step, cfg, engine);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplerParams;

    const EOG: u32 = 2;

    fn cfg(ignore_eog: bool) -> DecodeConfig {
        let rule = StepParams { confidence: 0.3, ..Default::default() }.rule(4).unwrap();
        DecodeConfig { rule, n_batch: 8, ignore_eog, keep_logits: false, eog: vec![EOG] }
    }

    fn seq<'a>(n_predict: usize) -> SeqGen<'a> {
        SeqGen::new(0, &[1], n_predict, Sampler::new(SamplerParams::greedy()))
    }

    #[test]
    fn a_step_ends_at_end_of_generation_unless_it_is_ignored() {
        let (c, sg) = (cfg(false), seq(10));
        // p_stop 0: the stop rule goes on; only the token decides.
        assert!(!sg.step_ends(&c, 1, 0.0, 5));
        assert!(sg.step_ends(&c, 1, 0.0, EOG));
        assert!(!sg.step_ends(&cfg(true), 1, 0.0, EOG), "the loop ignores end of generation");
        assert!(!seq(10).ignoring_eog().step_ends(&c, 1, 0.0, EOG), "so does a sequence that asks to");
        // The stop rule and the budget end steps too.
        assert!(sg.step_ends(&c, 1, 0.9, 5));
        assert!(sg.step_ends(&c, 4, 0.0, 5));
        assert!(seq(2).step_ends(&c, 2, 0.0, 5));
        // A sequence's own rule wins over the loop's.
        let own = StepParams { max_steps: 1, ..Default::default() }.rule(4).unwrap();
        assert!(seq(10).with_rule(own).step_ends(&c, 1, 0.0, 5));
    }
}

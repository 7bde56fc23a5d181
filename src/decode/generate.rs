//! The decode loop of docs/model.md for one or more
//! sequences in lockstep. Each macro step runs ONE base forward over every
//! sequence's pending inputs (prompt chunks, the merged tokens of its last
//! step as one input, tokens a grammar forced and, self-verified, the last
//! verified token and the drafted ones after it, one input each), then the
//! micro steps of all sequences whose steps continue or draft, batched
//! ([`micro_loop`]), sampling each sequence with its own sampler.
//! Self-verified sequences first check their drafts against the forward's
//! rows ([`verify`]).

mod choose;
mod drafted;
mod inputs;
mod micro_loop;
mod model_drafts;
mod verify;

use std::borrow::BorrowMut;
use std::collections::VecDeque;
use std::time::Instant;

use crate::decode::draft::{DraftGate, DraftRule};
use crate::decode::step::{Generation, MacroStep, StepParams, StepRule};
use crate::engine::forward_cost::Prices;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::graph::base::Wants;
use crate::graph::StepOut;
use crate::memory::batch::Batch;
use crate::memory::kv_cache::SeqId;
use crate::model::Model;
use crate::sampling::constraint::SeqConstraint;
use crate::sampling::Sampler;

use drafted::Draft;
pub use inputs::Pending;
use inputs::{feed, Fed};
pub use model_drafts::SyntheticAcceptance;

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
    /// Committed tokens not fed yet (the prompt's excepted).
    pending: Pending,
    /// Self-verified: the drafts the next forward checks.
    draft: Draft,
    /// Self-verified: when drafts are worth computing.
    gate: Option<DraftGate>,
    /// Self-verified with `ngram-simple`: when the context's drafts are
    /// worth their rows (they cost no micro step).
    context_gate: Option<DraftGate>,
    /// A draft model's drafts accepted at chosen rates (benchmarks).
    synthetic: Option<SyntheticAcceptance>,
    prompt: Vec<u32>,
    fed: usize,
    /// Entries written again after the sequence was preempted, each ONE
    /// base input as it was first written, fed before anything else.
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
    /// Log-probabilities under the sampler's distribution (after
    /// truncation), not the model's.
    sampled_logprobs: bool,
    on_step: Option<OnStep<'a>>,
    /// Whether every prompt token fed so far was read in a forward of the
    /// row-count class a fresh read of the context gives it.
    prompt_alike: bool,
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
            pending: Pending::default(),
            draft: Draft::default(),
            gate: None,
            context_gate: None,
            synthetic: None,
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
            sampled_logprobs: false,
            on_step: None,
            prompt_alike: true,
            gen: Generation::default(),
            done: false,
            started: Instant::now(),
            gen_started: None,
        }
    }

    /// Continues a conversation: `pending` (the last generation's tokens,
    /// not yet fed) goes first, and `history` precedes the prompt.
    pub fn continuing(mut self, pending: Pending, mut history: Vec<u32>) -> SeqGen<'a> {
        history.append(&mut self.history);
        SeqGen { pending, history, ..self }
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

    /// Records the log-probabilities ([`SeqGen::with_logprobs`]) under the
    /// distribution each token was drawn from, after the sampler's biases,
    /// penalties, truncation and temperature
    /// ([`crate::sampling::TokenLogprob::of_distribution`]).
    pub fn with_sampled_logprobs(self) -> SeqGen<'a> {
        SeqGen { sampled_logprobs: true, ..self }
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
    /// and `inputs` are the entries it had written after them, each ONE base
    /// input as it was first written (a prompt token, a plain token, or a
    /// macro step's tokens merged). They are fed first, then what it had
    /// not fed yet (its prompt's rest, its pending tokens), so the sequence
    /// goes on with the same entries as if it had never stopped (feeding a
    /// merged step token by token instead would change its entries and its
    /// answer); its drafts are dropped. The entries fed again are not read
    /// in the forwards a fresh read has, so its prompt no longer counts as
    /// read alike ([`SeqGen::prompt_read_alike`]).
    pub fn refeed(&mut self, seq: SeqId, inputs: Vec<Vec<u32>>) {
        self.seq = seq;
        self.drop_draft();
        self.refeed = inputs.into();
        self.prompt_alike = false;
    }

    /// Base inputs its next forwards feed before its next macro step's
    /// outputs, self-verified drafts included (one KV cell each: what a
    /// scheduler keeps free for it).
    pub fn pending_inputs(&self) -> usize {
        self.refeed.len() + self.pending.n_inputs() + self.prompt.len() - self.fed + self.draft.n_rows()
    }

    /// The tokens of its prompt (those it was given to feed) fed so far.
    pub fn prompt_tokens_fed(&self) -> usize {
        self.fed
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

    /// Whether every prompt token fed so far was read in a forward of the
    /// row-count class ([`crate::memory::row_class`]) that a fresh read of the whole
    /// context, cut into chunks at multiples of `n_batch` positions, gives
    /// it: then, if the cells before the prompt were such a read's too,
    /// the prompt's cells are exactly what a fresh read computes. Reading
    /// beside other sequences can change a forward's class.
    pub fn prompt_read_alike(&self) -> bool {
        self.prompt_alike
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

    /// The generation, the tokens committed and not yet fed, the history and the sampler.
    pub fn into_parts(self) -> (Generation, Pending, Vec<u32>, Sampler) {
        (self.gen, self.pending, self.history, self.sampler)
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

    /// The most drafts of the tree this sequence's micro decoder drafts under
    /// `rule` (0: a chain): under any sampler and constraint; with a draft
    /// model, a chain.
    fn tree_nodes(&self, rule: &DraftRule) -> usize {
        if !rule.by_model {
            rule.tree
        } else {
            0
        }
    }

    /// Whether the micro decoder may run after this sequence's next forward:
    /// always in macro steps, self-verified when its gate may draft at `prices`.
    fn may_draft(&self, cfg: &DecodeConfig, prices: &Prices) -> bool {
        match (self.rule(cfg).draft, &self.gate) {
            (Some(rule), Some(gate)) => gate.may_draft(&rule, prices),
            _ => true,
        }
    }

    /// Takes the drafts away; the constraint forgets them.
    fn take_draft(&mut self) -> Draft {
        let draft = std::mem::take(&mut self.draft);
        if let (Some(c), Some(mark)) = (&mut self.constraint, draft.mark) {
            c.rollback_to(mark);
        }
        draft
    }

    /// Forgets the drafts (they were never fed).
    fn drop_draft(&mut self) {
        self.take_draft();
    }

    /// KV cells this sequence may still take beyond its pending inputs: up
    /// to its cell limit, and what the cache has free.
    fn cells_left(&self, engine: &Engine) -> usize {
        let kv = engine.kv();
        let free = kv.n_cells() - kv.n_used();
        let limit = self.max_cells.map_or(usize::MAX, |m| m.saturating_sub(kv.n_cells_of(self.seq)));
        free.min(limit).saturating_sub(self.pending.n_inputs() + self.refeed.len())
    }

    /// Ends the sequence, filling the statistics that describe its end.
    fn finish(&mut self, engine: &Engine) {
        self.done = true;
        let t = &mut self.gen.timings;
        t.gen_ms = self.gen_started.map_or(0.0, |s| s.elapsed().as_secs_f64() * 1e3);
        t.gen_tokens = self.gen.output_ids.len();
        t.macro_steps = self.gen.macro_steps.len();
        t.kv_entries = engine.kv().n_cells_of(self.seq);
        t.context_tokens = engine.next_pos(self.seq) + self.pending.merged.len() + self.pending.plain.len();
        t.kv_bytes_per_entry = engine.kv().bytes_per_cell();
    }

    /// Records a completed macro step whose last `n_forced` tokens a grammar
    /// forced: cut at end-of-generation; of the kept tokens, those the micro
    /// loop emitted become the next merged input (self-verified: the last
    /// one a plain input), and the forced ones plain inputs after it.
    fn end_step(&mut self, step: MacroStep, n_forced: usize, cfg: &DecodeConfig, engine: &Engine) {
        let t = &mut self.gen.timings;
        if t.reached.len() < step.tokens.len() {
            t.reached.resize(step.tokens.len(), 0);
        }
        for (s, r) in t.reached.iter_mut().enumerate() {
            *r += usize::from(step.tokens.len() > s);
        }
        let eog = step.tokens.iter().position(|&t| self.is_eog(cfg, t));
        let kept = &step.tokens[..eog.map_or(step.tokens.len(), |i| i + 1)];
        self.gen.output_ids.extend_from_slice(kept);
        // The history already holds the step's tokens (see `draw`); drop those cut.
        self.history.truncate(self.history.len() - (step.tokens.len() - kept.len()));
        let emitted = kept.len().min(step.tokens.len() - n_forced);
        let (own, forced) = kept.split_at(emitted);
        self.pending = match self.rule(cfg).draft {
            Some(_) => Pending { merged: Vec::new(), plain: kept[emitted.saturating_sub(1)..].to_vec() },
            None => Pending { merged: own.to_vec(), plain: forced.to_vec() },
        };
        let go_on = self.on_step.as_mut().is_none_or(|f| f(kept));
        self.gen.macro_steps.push(step);
        let out_of_cells =
            self.max_cells.is_some_and(|m| engine.kv().n_cells_of(self.seq) + self.pending.n_inputs() > m);
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
    if seqs.iter().any(|s| s.gate.is_some()) {
        // What the draft gate priced drafts by (`RUST_LOG=hamburger=debug`).
        log::debug!("self-verified: {}", engine.costs());
    }
    Ok(())
}

/// One macro step of the sequences not done: one base forward over their
/// pending inputs (at most `n_batch`, earlier sequences first), then, for
/// each sequence whose inputs are all fed, the check of its drafts
/// (self-verified) and the micro steps of the macro step. `seqs` are the
/// sequences themselves or whatever owns one (a server's running request).
///
/// # Errors
/// When a sequence has nothing to feed, the cache is full, or a computation fails.
pub fn macro_step<'a, S: BorrowMut<SeqGen<'a>>>(engine: &mut Engine, cfg: &DecodeConfig, seqs: &mut [S]) -> Result<()> {
    let mut seqs: Vec<&mut SeqGen<'a>> = seqs.iter_mut().map(BorrowMut::borrow_mut).collect();
    verify::fix_prices(engine, cfg, &seqs)?;
    let mut batch = Batch::new();
    let mut budget = cfg.n_batch.max(1);
    let mut fed: Vec<Fed> = Vec::new();
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
            sg.gate = sg.rule(cfg).draft.filter(|d| !d.by_model).map(|_| DraftGate::new());
            sg.context_gate = sg.rule(cfg).draft.filter(|d| !d.by_model && d.ngram.is_some()).map(|_| DraftGate::new());
        }
        let next_pos = engine.next_pos(sg.seq);
        fed.push(feed(sg, i, &mut batch, &mut budget, next_pos, cfg.n_batch));
    }
    let running = || seqs.iter().filter(|s| !s.done);
    // Each running sequence's drafts share the forwards with one row of every other's.
    let prices = engine.costs().prices(running().count().saturating_sub(1));
    let want_logits = cfg.keep_logits || running().any(|s| s.wants_logits());
    let stop_head = running().any(|s| s.rule(cfg).needs_stop_head() && s.may_draft(cfg, &prices));
    let features = running().any(|s| s.rule(cfg).may_continue() && s.may_draft(cfg, &prices));
    let micro_logits = want_logits
        || running().any(|s| s.rule(cfg).draft.is_some_and(|d| !d.by_model && (d.p_min > 0.0 || d.tree > 0)));
    let drafting = running().any(|s| s.rule(cfg).draft.is_some() && s.may_draft(cfg, &prices));
    let want = Wants { stop_head, logits: want_logits, features, draft_stop: stop_head && drafting };
    let mut outs = engine.decode(&batch, want)?.into_iter();
    let (classes, rows) = (engine.row_classes(), batch.inputs().len());
    for f in &fed {
        // The rows a prompt chunk's attention held: its sequence's, or the forward's.
        let own = batch.inputs().iter().filter(|i| i.seq == seqs[f.index].seq).count();
        let attended = if engine.attended_by_seq() { own } else { rows };
        if f.prompt.0 > 0 && !classes.alike_within(rows, attended, f.prompt.1) {
            seqs[f.index].prompt_alike = false;
        }
    }
    let mut ready = Vec::new();
    for f in fed {
        let sg = &mut seqs[f.index];
        let rows: Vec<StepOut> = outs.by_ref().take(1 + f.drafts).map(|(_, out)| out).collect();
        if !f.complete {
            continue;
        }
        if sg.gen_started.is_none() {
            sg.gen.timings.prompt_ms = sg.started.elapsed().as_secs_f64() * 1e3;
            sg.gen_started = Some(Instant::now());
        }
        if sg.remaining() == 0 {
            sg.finish(engine);
        } else if sg.rule(cfg).draft.is_some() {
            ready.push((f.index, verify::check(sg, cfg, engine, rows, features)?));
        } else {
            let out = rows.into_iter().next().expect("every sequence of the batch has an output");
            ready.push((f.index, micro_loop::Start::Base(out)));
        }
    }
    micro_loop::run(engine, cfg, &mut seqs, ready, stop_head, micro_logits, &prices)
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

//! Speculative decoding with a draft model (llama.cpp's `-md`): a HAMburger
//! drafts for a target of the same vocabulary (a llama GGUF, or any model
//! this runtime loads, decoded one token per forward), and the target
//! verifies the draft in ONE forward whose every row is an output
//! ([`Engine::decode_every`]). The output is the target's: its greedy
//! output token for token, or, sampling, distributed as its samples
//! ([`crate::sampling::speculative`] holds the acceptance rule).
//!
//! One iteration:
//! 1. **Draft**: the draft engine feeds what it has not seen (the accepted
//!    tokens of its own last macro step merged, as it would have fed them,
//!    and the target's tokens and prompts one per input) and runs its macro
//!    steps: ONE draft forward drafts the several
//!    tokens of a macro step (its base's token, then its micro decoder's,
//!    under its stop rule), and further macro steps follow, each fed the
//!    last one's tokens merged, until `n_max` tokens, a token of draft
//!    probability under `p_min`, or an end-of-generation token.
//! 2. **Verify**: the target feeds its last committed token and the drafted
//!    tokens as single-token rows and reads its choice (or distribution) at
//!    each; the agreeing prefix is accepted and the target's token follows.
//! 3. **Roll back**: the target drops the rows of rejected tokens; the
//!    draft drops every entry that covers a rejected token (a macro entry
//!    past the first rejection goes whole, `Engine::keep_prefix`), and its
//!    accepted tokens after its last kept entry are fed again next time.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::decode::step::{Generation, MacroStep, StepParams, StepRule};
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
use crate::sampling::speculative::{draw, verify_greedy, verify_sampled, Verdict};
use crate::sampling::{Sampler, SamplerParams};

/// Each engine holds one sequence.
const SEQ: SeqId = 0;

/// How much to draft (llama.cpp's `--spec-draft-n-max`, `-n-min`, `-p-min`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftModelParams {
    /// The most tokens drafted per verify forward.
    pub n_max: usize,
    /// Fewer drafted tokens than this are not verified: the target decodes
    /// one token alone instead.
    pub n_min: usize,
    /// Drafting stops before a token whose draft probability is below this
    /// (greedy: its softmax probability; sampling: its probability under the
    /// distribution it was drawn from).
    pub p_min: f32,
}

impl Default for DraftModelParams {
    /// llama.cpp's defaults (`common_params_speculative_draft`).
    fn default() -> Self {
        DraftModelParams { n_max: 3, n_min: 0, p_min: 0.0 }
    }
}

impl DraftModelParams {
    /// Checks the ranges.
    ///
    /// # Errors
    /// Naming the parameter: `n_max` 0, `n_min` above `n_max`, `p_min` outside 0..=1.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.n_max == 0 {
            return Err(ParamError::new(&[Param::DraftNMax], format!("{} 0: expected at least 1", Param::DraftNMax)));
        }
        if self.n_min > self.n_max {
            let message = format!("{} {} exceeds {} {}", Param::DraftNMin, self.n_min, Param::DraftNMax, self.n_max);
            return Err(ParamError::new(&[Param::DraftNMin, Param::DraftNMax], message));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            let message = format!("{} {}: expected a number from 0 to 1", Param::DraftPMin, self.p_min);
            return Err(ParamError::new(&[Param::DraftPMin], message));
        }
        Ok(())
    }
}

/// The settings of a [`DraftSession`].
#[derive(Debug, Clone)]
pub struct DraftSessionParams {
    /// Each engine's (`n_seq` 1): the context holds one KV entry per token
    /// in the target.
    pub engine: EngineParams,
    /// The draft's stop rule (its confidence and step cap).
    pub step: StepParams,
    /// The output's sampling (the target's distribution); the draft samples alike.
    pub sampling: SamplerParams,
    /// How much to draft.
    pub draft: DraftModelParams,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eog: bool,
}

/// What the drafting earned.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DraftStats {
    /// Draft forwards (macro steps of the draft model).
    pub draft_forwards: usize,
    /// Target forwards: the prompt's last, then one per verification.
    pub target_forwards: usize,
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
}

impl DraftStats {
    /// Accepted tokens per draft forward.
    pub fn accepted_per_draft_forward(&self) -> f64 {
        self.accepted as f64 / self.draft_forwards.max(1) as f64
    }

    /// The fraction of drafted tokens accepted.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// Tokens drafted for one verification, with the draft distribution each
/// was drawn from (when sampling).
#[derive(Default)]
struct Draft {
    tokens: Vec<u32>,
    q: Vec<Vec<(u32, f32)>>,
}

/// A conversation decoded by a target model with a draft model's help.
pub struct DraftSession<'t, 'd> {
    target: Engine<'t>,
    draft: Engine<'d>,
    /// The draft's stop rule.
    rule: StepRule,
    params: DraftSessionParams,
    /// The output's distributions (the target's and, alike, the draft's).
    sampler: Sampler,
    /// Decides acceptances and draws the target's tokens.
    rng: StdRng,
    /// Draws the drafted tokens.
    draft_rng: StdRng,
    eog: Vec<u32>,
    /// Every token of the conversation.
    context: Vec<u32>,
    /// Tokens whose entries the target holds (all but the last, pending,
    /// once a generation has emitted one).
    target_fed: usize,
    /// Tokens the draft's entries cover.
    draft_fed: usize,
    /// The draft feeds `context[draft_fed..merged_until]` merged: the
    /// accepted tokens of its last macro step, which no kept entry covers
    /// (a macro step is never longer than `max_steps`). Later tokens (the
    /// target's own, prompts) go one per input: merged with drafted tokens
    /// they would make an input the draft never made, which costs it
    /// accuracy (a merge costs a base about a nat at the next token).
    merged_until: usize,
}

impl<'t, 'd> DraftSession<'t, 'd> {
    /// A session of `target` drafted for by `draft`.
    ///
    /// # Errors
    /// When the vocabularies differ (naming both sizes), a setting is out
    /// of range, or an engine cannot be made.
    pub fn new(target: &'t Model, draft: &'d Model, params: DraftSessionParams) -> Result<Self> {
        if target.hp.n_vocab != draft.hp.n_vocab {
            return Err(Error::VocabMismatch {
                draft: draft.path.clone(),
                draft_vocab: draft.hp.n_vocab,
                target: target.path.clone(),
                target_vocab: target.hp.n_vocab,
            });
        }
        let e = &params.engine;
        if e.n_seq != 1 {
            let message = format!("{} {}: a session holds 1 sequence", Param::NSeq, e.n_seq);
            return Err(ParamError::new(&[Param::NSeq], message).into());
        }
        params.draft.validate()?;
        if params.draft.n_max >= e.n_batch {
            let message = format!(
                "{} {} does not fit {} {}: a verify forward takes the drafted tokens and one more",
                Param::DraftNMax,
                params.draft.n_max,
                Param::NBatch,
                e.n_batch
            );
            return Err(ParamError::new(&[Param::DraftNMax, Param::NBatch], message).into());
        }
        params.sampling.validate()?;
        let seed = params.sampling.seed;
        let mut session = DraftSession {
            rule: params.step.rule(draft.hp.max_steps)?,
            target: Engine::new(target, e)?,
            draft: Engine::new(draft, e)?,
            sampler: Sampler::new(params.sampling),
            rng: StdRng::seed_from_u64(seed),
            draft_rng: StdRng::seed_from_u64(seed),
            eog: if params.ignore_eog { Vec::new() } else { target.vocab.eog.clone() },
            params,
            context: Vec::new(),
            target_fed: 0,
            draft_fed: 0,
            merged_until: 0,
        };
        session.restart(seed);
        Ok(session)
    }

    /// The settings.
    pub fn params(&self) -> &DraftSessionParams {
        &self.params
    }

    /// Forgets the conversation (the caches and built graphs are reused) and
    /// restarts the random draws from `seed`.
    pub fn restart(&mut self, seed: u64) {
        self.target.clear_seq(SEQ);
        self.draft.clear_seq(SEQ);
        self.context.clear();
        (self.target_fed, self.draft_fed, self.merged_until) = (0, 0, 0);
        self.params.sampling.seed = seed;
        self.sampler = Sampler::new(self.params.sampling);
        self.rng = StdRng::seed_from_u64(seed);
        self.draft_rng = StdRng::seed_from_u64(seed.wrapping_add(1));
    }

    /// The target's KV entries in use (one per token of the context).
    pub fn n_slots(&self) -> usize {
        self.target.kv().n_cells_of(SEQ)
    }

    /// Whether the output is greedy: the target's argmax decides, and no
    /// logits are read but for `p_min`.
    fn greedy(&self) -> bool {
        self.sampler.is_greedy()
    }

    /// What the target's engine has done so far, counted (the draft model's
    /// engine apart).
    pub fn counters(&self) -> EngineCounters {
        self.target.counters()
    }

    /// Generates up to `n_predict` tokens after `prompt` (which continues
    /// the conversation). `on_step` sees the tokens of each target forward
    /// as soon as they are known and may return false to stop.
    ///
    /// # Errors
    /// When the prompt plus `n_predict` exceed the context, or a computation fails.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_predict: usize,
        mut on_step: impl FnMut(&[u32]) -> bool,
    ) -> Result<(Generation, DraftStats)> {
        let n_ctx = self.params.engine.n_ctx;
        if self.context.len() + prompt.len() + n_predict > n_ctx {
            let (np, nc) = (Param::NPredict, Param::NCtx);
            let message = format!(
                "the prompt ({} tokens) plus {n_predict} tokens to generate ({np}) exceed the context of {n_ctx} ({nc})",
                self.context.len() + prompt.len()
            );
            return Err(ParamError::new(&[np, nc], message).into());
        }
        if self.context.len() + prompt.len() == self.target_fed {
            return Err(Error::Invalid("nothing to feed: the prompt is empty".into()));
        }
        let started = Instant::now();
        let (mut gen, mut stats) = (Generation::default(), DraftStats::default());
        gen.timings.prompt_tokens = prompt.len();
        gen.timings.reached = vec![0; self.params.draft.n_max + 1];
        self.context.extend_from_slice(prompt);
        let mut emitted = vec![self.prefill_target()?];
        stats.target_forwards += 1;
        gen.timings.prompt_ms = started.elapsed().as_secs_f64() * 1e3;
        let gen_started = Instant::now();
        // Each pass emits at least one token (none when n_predict is 0).
        for _ in 0..n_predict {
            let eog = emitted.iter().position(|t| self.eog.contains(t));
            emitted.truncate(eog.map_or(emitted.len(), |i| i + 1).min(n_predict - gen.output_ids.len()));
            self.context.extend_from_slice(&emitted);
            gen.output_ids.extend_from_slice(&emitted);
            for (s, r) in gen.timings.reached.iter_mut().enumerate() {
                *r += usize::from(emitted.len() > s);
            }
            let go_on = on_step(&emitted);
            gen.macro_steps.push(MacroStep { tokens: std::mem::take(&mut emitted), ..Default::default() });
            if !go_on || eog.is_some() || gen.output_ids.len() >= n_predict {
                break;
            }
            // Room for the target's own token after the draft.
            let room = (n_predict - gen.output_ids.len() - 1).min(n_ctx - self.context.len());
            let draft = self.draft(self.params.draft.n_max.min(room), &mut stats)?;
            let draft = if draft.tokens.len() < self.params.draft.n_min { Draft::default() } else { draft };
            let verdict = self.verify(&draft)?;
            stats.target_forwards += 1;
            stats.drafted += draft.tokens.len();
            stats.accepted += verdict.accepted;
            // What covers a rejected token goes: the target's rows after the
            // accepted ones, the draft's entries reaching past them.
            let committed = self.context.len() + verdict.accepted;
            self.target_fed = self.target.keep_prefix(SEQ, committed);
            self.draft_fed = self.draft.keep_prefix(SEQ, committed);
            self.merged_until = committed;
            emitted = draft.tokens[..verdict.accepted].to_vec();
            emitted.push(verdict.next);
        }
        // Entries of tokens cut at the end (past an end of generation or the
        // budget) go too; the last token stays pending in the target.
        let last = self.context.len().saturating_sub(1);
        if n_predict > 0 {
            self.target_fed = self.target.keep_prefix(SEQ, last);
        }
        self.draft_fed = self.draft.keep_prefix(SEQ, self.draft_fed.min(self.context.len()));
        let t = &mut gen.timings;
        t.gen_ms = gen_started.elapsed().as_secs_f64() * 1e3;
        t.gen_tokens = gen.output_ids.len();
        t.macro_steps = gen.macro_steps.len();
        t.kv_entries = self.target.kv().n_cells_of(SEQ);
        t.context_tokens = self.context.len();
        t.kv_bytes_per_entry = self.target.kv().bytes_per_cell();
        Ok((gen, stats))
    }

    /// Feeds the target what it has not seen, `n_batch` tokens per forward,
    /// and returns its token after them.
    fn prefill_target(&mut self) -> Result<u32> {
        let want = Wants { stop_head: false, logits: !self.greedy(), features: false, draft_stop: false };
        let mut out = None;
        for chunk in self.context[self.target_fed..].chunks(self.params.engine.n_batch) {
            let mut batch = Batch::new();
            batch.push_tokens(SEQ, chunk);
            out = self.target.decode(&batch, want)?.pop().map(|(_, o)| o);
        }
        self.target_fed = self.context.len();
        let out = out.expect("generate checked that there is something to feed");
        Ok(match &out.logits {
            Some(logits) => draw(&self.sampler.distribution(logits, &self.context), self.rng.random()),
            None => out.argmax,
        })
    }

    /// Drafts up to `n_max` tokens: macro steps of the draft model, each
    /// one forward, until `n_max` tokens, a token under `p_min`, or an
    /// end of generation.
    fn draft(&mut self, n_max: usize, stats: &mut DraftStats) -> Result<Draft> {
        let mut d = Draft::default();
        if n_max == 0 {
            return Ok(d);
        }
        let logits = !self.greedy() || self.params.draft.p_min > 0.0;
        let stop_head = self.rule.needs_stop_head();
        let want = Wants { stop_head, logits, features: self.rule.may_continue(), draft_stop: false };
        let mut out = self.feed_draft(want)?;
        loop {
            stats.draft_forwards += 1;
            let mut step = Vec::new();
            loop {
                let Some(token) = self.pick_draft(&out, &mut d) else { return Ok(d) };
                step.push(token);
                if self.eog.contains(&token) || d.tokens.len() >= n_max {
                    return Ok(d);
                }
                if self.rule.stops(step.len(), out.p_stop) {
                    break;
                }
                let mut outs = self.draft.micro_step(
                    step.len() - 1,
                    &[(SEQ, token)],
                    MicroWants { stop_head, logits, drafts: false, draft_vocab: false },
                )?;
                out = outs.pop().expect("one sequence, one output");
            }
            let mut batch = Batch::new();
            batch.push_merged(SEQ, &step);
            out = self.draft.decode(&batch, want)?.pop().expect("one sequence, one output").1;
        }
    }

    /// Feeds the draft what its entries do not cover (the accepted tail of
    /// its last macro step merged, at most `max_steps` per input; then one
    /// token per input, `n_batch` inputs per forward) and returns the last
    /// input's outputs.
    fn feed_draft(&mut self, want: Wants) -> Result<StepOut> {
        let n_batch = self.params.engine.n_batch;
        let pending = &self.context[self.draft_fed..];
        let (tail, mut singles) = pending.split_at(self.merged_until.saturating_sub(self.draft_fed).min(pending.len()));
        let mut batch = Batch::new();
        tail.chunks(self.rule.max_steps.max(1)).for_each(|m| batch.push_merged(SEQ, m));
        let nothing = Wants { stop_head: false, logits: false, features: false, draft_stop: false };
        while batch.inputs().len() + singles.len() > n_batch {
            let (now, later) = singles.split_at(singles.len().min(n_batch - batch.inputs().len()));
            batch.push_tokens(SEQ, now);
            self.draft.decode(&std::mem::take(&mut batch), nothing)?;
            singles = later;
        }
        batch.push_tokens(SEQ, singles);
        let out = self.draft.decode(&batch, want)?.pop().expect("one sequence, one output").1;
        self.draft_fed = self.context.len();
        Ok(out)
    }

    /// The draft's token from `out`, added to `d`, or None when its draft
    /// probability is under `p_min` (drafting stops before it).
    fn pick_draft(&mut self, out: &StepOut, d: &mut Draft) -> Option<u32> {
        let (token, p) = match (&out.logits, self.greedy()) {
            (Some(logits), true) => (out.argmax, softmax_at(logits, out.argmax)),
            (Some(logits), false) => {
                let history: Vec<u32> = self.context.iter().chain(&d.tokens).copied().collect();
                let q = self.sampler.distribution(logits, &history);
                let token = draw(&q, self.draft_rng.random());
                let p = q.iter().find(|&&(t, _)| t == token).map_or(0.0, |&(_, p)| p);
                d.q.push(q);
                (token, p)
            }
            (None, _) => (out.argmax, 1.0),
        };
        if p < self.params.draft.p_min {
            d.q.truncate(d.tokens.len());
            return None;
        }
        d.tokens.push(token);
        Some(token)
    }

    /// One target forward over its pending token and the drafted ones,
    /// every row an output, and the verdict on the draft.
    fn verify(&mut self, d: &Draft) -> Result<Verdict> {
        let mut batch = Batch::new();
        batch.push_tokens(SEQ, &self.context[self.target_fed..]);
        batch.push_tokens(SEQ, &d.tokens);
        let want = Wants { stop_head: false, logits: !self.greedy(), features: false, draft_stop: false };
        let outs = self.target.decode_every(&batch, want)?;
        let rows = &outs[outs.len() - d.tokens.len() - 1..];
        if self.greedy() {
            let choices: Vec<u32> = rows.iter().map(|(_, o)| o.argmax).collect();
            return Ok(verify_greedy(&d.tokens, &choices));
        }
        let mut history = self.context.clone();
        let mut p = Vec::with_capacity(rows.len());
        for (i, (_, o)) in rows.iter().enumerate() {
            let logits = o.logits.as_deref().expect("a sampled verification reads the logits");
            p.push(self.sampler.distribution(logits, &history));
            history.extend(d.tokens.get(i));
        }
        Ok(verify_sampled(&d.tokens, &d.q, &p, &mut self.rng))
    }
}

/// The softmax probability of `token` under `logits`.
fn softmax_at(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (logits[token as usize] - max).exp() / sum
}

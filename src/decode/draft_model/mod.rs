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
//!    past the first rejection goes whole, `Engine::keep_prefix`) when it
//!    drafts next, and its accepted tokens after its last kept entry are
//!    fed again then ([`drafter`]).

mod drafter;

pub use drafter::{Draft, DraftPick, DraftTrack, Drafter};

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::decode::draft::DraftRule;
use crate::decode::step::{Generation, MacroStep, StepParams, StepRule};
use crate::engine::budget::EngineParams;
use crate::engine::counters::EngineCounters;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::error::{Param, ParamError};
use crate::graph::base::Wants;
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
    /// Checks the ranges for verify forwards of at most `n_batch` inputs.
    ///
    /// # Errors
    /// Naming the parameter: `n_max` 0 or not below `n_batch` (a verify
    /// forward takes the drafted tokens and one more), `n_min` above
    /// `n_max`, `p_min` outside 0..=1.
    pub fn validate(&self, n_batch: usize) -> Result<(), ParamError> {
        if self.n_max == 0 {
            return Err(ParamError::new(&[Param::DraftNMax], format!("{} 0: expected at least 1", Param::DraftNMax)));
        }
        if self.n_max >= n_batch {
            let (max, nb) = (Param::DraftNMax, Param::NBatch);
            let message = format!(
                "{max} {} does not fit {nb} {n_batch}: a verify forward takes the drafted tokens and one more",
                self.n_max
            );
            return Err(ParamError::new(&[max, nb], message));
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

impl DraftModelParams {
    /// The step rule of a sequence of a batched decode loop, of `n_batch`
    /// inputs per forward, that a draft model drafts for
    /// ([`crate::generate::SeqGen::set_draft`]): the target decodes one
    /// token per forward, beside the drafted tokens it checks.
    ///
    /// # Errors
    /// As [`DraftModelParams::validate`].
    pub fn rule(&self, n_batch: usize) -> Result<StepRule, ParamError> {
        self.validate(n_batch)?;
        let draft =
            DraftRule { n_max: self.n_max, n_min: self.n_min, p_min: self.p_min, by_model: true, ngram: None, tree: 0 };
        Ok(StepRule { max_steps: self.n_max + 1, confidence: 1.0, forced: false, draft: Some(draft) })
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

/// A conversation decoded by a target model with a draft model's help.
pub struct DraftSession<'t, 'd> {
    target: Engine<'t>,
    draft: Engine<'d>,
    /// Drafts with the draft model's macro steps.
    drafter: Drafter,
    /// What the draft's entries cover.
    track: DraftTrack,
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
}

impl<'t, 'd> DraftSession<'t, 'd> {
    /// A session of `target` drafted for by `draft`.
    ///
    /// # Errors
    /// When the vocabularies differ (naming both sizes), a setting is out
    /// of range, or an engine cannot be made.
    pub fn new(target: &'t Model, draft: &'d Model, params: DraftSessionParams) -> Result<Self> {
        let eog = if params.ignore_eog { Vec::new() } else { target.vocab.eog.clone() };
        let drafter = Drafter::new(target, draft, &params.step, params.engine.n_batch, eog.clone())?;
        let e = &params.engine;
        if e.n_seq != 1 {
            let message = format!("{} {}: a session holds 1 sequence", Param::NSeq, e.n_seq);
            return Err(ParamError::new(&[Param::NSeq], message).into());
        }
        params.draft.validate(e.n_batch)?;
        params.sampling.validate()?;
        let seed = params.sampling.seed;
        let mut session = DraftSession {
            drafter,
            track: DraftTrack::new(SEQ),
            target: Engine::new(target, e)?,
            draft: Engine::new(draft, e)?,
            sampler: Sampler::new(params.sampling),
            rng: StdRng::seed_from_u64(seed),
            draft_rng: StdRng::seed_from_u64(seed),
            eog,
            params,
            context: Vec::new(),
            target_fed: 0,
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
        Drafter::forget(&mut self.draft, &mut self.track);
        self.context.clear();
        self.target_fed = 0;
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
            // The target's rows after the accepted ones go (the draft's, when it drafts next).
            self.target_fed = self.target.keep_prefix(SEQ, self.context.len() + verdict.accepted);
            emitted = draft.tokens[..verdict.accepted].to_vec();
            emitted.push(verdict.next);
        }
        // Entries of tokens cut at the end (past an end of generation or the
        // budget) go too; the last token stays pending in the target.
        let last = self.context.len().saturating_sub(1);
        if n_predict > 0 {
            self.target_fed = self.target.keep_prefix(SEQ, last);
        }
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

    /// Drafts up to `n_max` tokens with the draft model ([`Drafter::draft`]).
    fn draft(&mut self, n_max: usize, stats: &mut DraftStats) -> Result<Draft> {
        let pick = if self.greedy() {
            DraftPick::Greedy
        } else {
            DraftPick::Sampled { sampler: &self.sampler, rng: &mut self.draft_rng }
        };
        let (context, p_min) = (&self.context, self.params.draft.p_min);
        let d = self.drafter.draft(&mut self.draft, &mut self.track, context, n_max, p_min, pick)?;
        stats.draft_forwards += d.forwards;
        Ok(d)
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

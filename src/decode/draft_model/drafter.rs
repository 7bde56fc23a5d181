//! A draft model's side of speculative decoding: what one sequence's
//! entries in the draft model's engine cover ([`DraftTrack`]), feeding it
//! what they do not, and drafting with its macro steps ([`Drafter`]).
//! [`super::DraftSession`] (one sequence) and a server's engine loop (one
//! draft sequence per slot) share it.
//!
//! The draft learns what the target kept when it drafts next: its entries
//! that cover drafted tokens the context now has are kept, the rest go
//! (a macro entry reaching past the first rejected token goes whole,
//! [`Engine::keep_prefix`]), and the accepted tokens after its last kept
//! entry are fed again, merged as its last macro step fed them.

use rand::rngs::StdRng;
use rand::Rng;

use crate::decode::step::{StepParams, StepRule};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::graph::base::Wants;
use crate::graph::micro::MicroWants;
use crate::graph::StepOut;
use crate::memory::batch::Batch;
use crate::memory::kv_cache::SeqId;
use crate::model::Model;
use crate::sampling::speculative::draw;
use crate::sampling::Sampler;

/// Where one sequence stands in the draft model's cache.
#[derive(Debug, Clone)]
pub struct DraftTrack {
    /// Its sequence in the draft model's engine.
    seq: SeqId,
    /// Tokens of the context its entries cover.
    fed: usize,
    /// `context[fed..merged_until]` is the accepted tail of its last macro
    /// step, which no kept entry covers: fed merged, as that step fed it.
    /// Later tokens (the target's own, prompts) go one per input: merged
    /// with drafted tokens they would make an input the draft never made,
    /// which costs it accuracy (a merge costs a base about a nat at the
    /// next token).
    merged_until: usize,
    /// The context's length when it last drafted, and what it drafted.
    drafted_at: usize,
    drafted: Vec<u32>,
}

impl DraftTrack {
    /// Sequence `seq` of the draft model's engine, holding no entries.
    pub fn new(seq: SeqId) -> DraftTrack {
        DraftTrack { seq, fed: 0, merged_until: 0, drafted_at: 0, drafted: Vec::new() }
    }
}

/// Tokens drafted for one verification.
#[derive(Debug, Clone, Default)]
pub struct Draft {
    /// The drafted tokens.
    pub tokens: Vec<u32>,
    /// Sampled drafts: the distribution each was drawn from.
    pub q: Vec<Vec<(u32, f32)>>,
    /// The draft model's forwards it took (prompt feeding excepted).
    pub forwards: usize,
}

/// How drafted tokens are chosen.
pub enum DraftPick<'s> {
    /// The draft model's most likely token.
    Greedy,
    /// Drawn from the output's sampling applied to the draft model's logits.
    Sampled {
        /// The output's sampler, whose distribution the draft is drawn from.
        sampler: &'s Sampler,
        /// The draft's own random numbers.
        rng: &'s mut StdRng,
    },
}

impl DraftPick<'_> {
    fn greedy(&self) -> bool {
        matches!(self, DraftPick::Greedy)
    }
}

/// Drafts with a draft model's macro steps.
#[derive(Debug, Clone)]
pub struct Drafter {
    /// The draft model's stop rule.
    rule: StepRule,
    /// Inputs per draft forward.
    n_batch: usize,
    /// Drafting stops after these tokens.
    eog: Vec<u32>,
}

impl Drafter {
    /// Drafting for `target` with `draft`'s macro steps under `step`'s
    /// rule, `n_batch` inputs per forward, stopping after any of `eog`.
    ///
    /// # Errors
    /// When the vocabularies differ (naming both files and sizes), or
    /// `step` does not fit the draft model.
    pub fn new(target: &Model, draft: &Model, step: &StepParams, n_batch: usize, eog: Vec<u32>) -> Result<Drafter> {
        if target.hp.n_vocab != draft.hp.n_vocab {
            return Err(Error::VocabMismatch {
                draft: draft.path.clone(),
                draft_vocab: draft.hp.n_vocab,
                target: target.path.clone(),
                target_vocab: target.hp.n_vocab,
            });
        }
        Ok(Drafter { rule: step.rule(draft.hp.max_steps)?, n_batch: n_batch.max(1), eog })
    }

    /// Drafts up to `n_max` tokens after `context` (every committed token
    /// of the sequence) in the sequence of `engine` that `track` describes: macro steps of the draft model, each one forward, until
    /// `n_max` tokens, a token of draft probability under `p_min`, or an end
    /// of generation.
    ///
    /// # Errors
    /// When the draft's cache is full or a computation fails: then the
    /// sequence's entries are unknown; [`Drafter::forget`] them before
    /// drafting again.
    pub fn draft(
        &self,
        engine: &mut Engine,
        track: &mut DraftTrack,
        context: &[u32],
        n_max: usize,
        p_min: f32,
        mut pick: DraftPick,
    ) -> Result<Draft> {
        let seq = track.seq;
        self.catch_up(engine, track, context);
        if track.fed >= context.len() {
            // Every token has its entry (a draft the check rejected although
            // the target's token is the same, as synthetic acceptance does):
            // the last is fed again, for the outputs drafting starts from.
            track.fed = engine.keep_prefix(seq, context.len().saturating_sub(1));
            track.merged_until = track.fed;
        }
        let mut d = Draft::default();
        if n_max == 0 {
            return Ok(d);
        }
        let logits = !pick.greedy() || p_min > 0.0;
        let stop_head = self.rule.needs_stop_head();
        let want = Wants { stop_head, logits, features: self.rule.may_continue(), draft_stop: false };
        let mut out = self.feed(engine, track, context, want)?;
        track.drafted_at = context.len();
        'steps: loop {
            d.forwards += 1;
            let mut step = Vec::new();
            loop {
                let Some(token) = pick_token(&out, &mut d, context, p_min, &mut pick) else { break 'steps };
                step.push(token);
                if self.eog.contains(&token) || d.tokens.len() >= n_max {
                    break 'steps;
                }
                if self.rule.stops(step.len(), out.p_stop) {
                    break;
                }
                let micro = MicroWants { stop_head, logits, drafts: false, draft_vocab: false };
                out = engine.micro_step(step.len() - 1, &[(seq, token)], &[], micro)?.pop().expect("one output");
            }
            let mut batch = Batch::new();
            batch.push_merged(seq, &step);
            out = engine.decode(&batch, want)?.pop().expect("one sequence, one output").1;
        }
        track.drafted = d.tokens.clone();
        Ok(d)
    }

    /// Forgets the entries of `track`'s sequence (after a failed draft, or
    /// for a new sequence).
    pub fn forget(engine: &mut Engine, track: &mut DraftTrack) {
        engine.clear_seq(track.seq);
        *track = DraftTrack::new(track.seq);
    }

    /// Keeps the entries of the last draft's tokens that `context` holds
    /// (the target accepted them), drops the others, and feeds the accepted
    /// tail merged next.
    fn catch_up(&self, engine: &mut Engine, track: &mut DraftTrack, context: &[u32]) {
        if track.drafted.is_empty() {
            return;
        }
        let after = context.get(track.drafted_at..).unwrap_or_default();
        let accepted = track.drafted.iter().zip(after).take_while(|(d, c)| d == c).count();
        let committed = track.drafted_at + accepted;
        track.fed = engine.keep_prefix(track.seq, committed);
        track.merged_until = committed;
        track.drafted.clear();
    }

    /// Feeds the draft what its entries do not cover of `context` (the
    /// accepted tail of its last macro step merged, at most `max_steps` per
    /// input; then one token per input, `n_batch` inputs per forward) and
    /// returns the last input's outputs.
    fn feed(&self, engine: &mut Engine, track: &mut DraftTrack, context: &[u32], want: Wants) -> Result<StepOut> {
        let seq = track.seq;
        let pending = &context[track.fed.min(context.len())..];
        let (tail, mut singles) = pending.split_at(track.merged_until.saturating_sub(track.fed).min(pending.len()));
        let mut batch = Batch::new();
        tail.chunks(self.rule.max_steps.max(1)).for_each(|m| batch.push_merged(seq, m));
        let nothing = Wants { stop_head: false, logits: false, features: false, draft_stop: false };
        while batch.inputs().len() + singles.len() > self.n_batch {
            let (now, later) = singles.split_at(singles.len().min(self.n_batch - batch.inputs().len()));
            batch.push_tokens(seq, now);
            engine.decode(&std::mem::take(&mut batch), nothing)?;
            singles = later;
        }
        batch.push_tokens(seq, singles);
        let out = engine.decode(&batch, want)?.pop().expect("one sequence, one output").1;
        track.fed = context.len();
        track.merged_until = track.fed;
        Ok(out)
    }
}

/// The draft's token from `out`, added to `d`, or None when its draft
/// probability is under `p_min` (drafting stops before it).
fn pick_token(out: &StepOut, d: &mut Draft, context: &[u32], p_min: f32, pick: &mut DraftPick) -> Option<u32> {
    let (token, p) = match (&out.logits, pick) {
        (Some(logits), DraftPick::Greedy) => (out.argmax, softmax_at(logits, out.argmax)),
        (Some(logits), DraftPick::Sampled { sampler, rng }) => {
            let history: Vec<u32> = context.iter().chain(&d.tokens).copied().collect();
            let q = sampler.distribution(logits, &history);
            let token = draw(&q, rng.random());
            let p = q.iter().find(|&&(t, _)| t == token).map_or(0.0, |&(_, p)| p);
            d.q.push(q);
            (token, p)
        }
        (None, _) => (out.argmax, 1.0),
    };
    if p < p_min {
        d.q.truncate(d.tokens.len());
        return None;
    }
    d.tokens.push(token);
    Some(token)
}

/// The softmax probability of `token` under `logits`.
fn softmax_at(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (logits[token as usize] - max).exp() / sum
}

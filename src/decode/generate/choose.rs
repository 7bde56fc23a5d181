//! How a sequence chooses its tokens: drawn by its sampler from a forward's
//! or a micro step's output, under its constraint's mask, or forced by the
//! constraint after the tokens committed.

use std::borrow::Cow;

use super::SeqGen;
use crate::decode::step::MacroStep;
use crate::engine::Engine;
use crate::graph::StepOut;
use crate::sampling::constraint::MicroPolicy;
use crate::sampling::TokenLogprob;

impl SeqGen<'_> {
    /// Picks the next token of the current macro step from `out` and adds it
    /// to the history (so that the step's later tokens are penalized for
    /// it), recording its log-probability in `step` when asked. A constrained
    /// sequence picks among the allowed tokens, except that under
    /// [`MicroPolicy::EndStep`] a forbidden micro choice gives None: the step
    /// ends before it.
    pub(super) fn pick(&mut self, out: &StepOut, step: &mut MacroStep) -> Option<u32> {
        let first = step.tokens.is_empty();
        let end_step = !first && self.constraint.as_ref().is_some_and(|c| c.policy() == MicroPolicy::EndStep);
        let (token, dist) = self.draw(out, !end_step)?;
        if let Some(lp) = self.token_logprob(out, &dist, token) {
            step.logprobs.push(lp);
        }
        Some(token)
    }

    /// The log-probability of `token` to record, when asked: under the
    /// model's logits in `out`, or under `dist`, the distribution it was
    /// drawn from ([`SeqGen::with_sampled_logprobs`]).
    pub(super) fn token_logprob(&self, out: &StepOut, dist: &[(u32, f32)], token: u32) -> Option<TokenLogprob> {
        let top = self.logprobs?;
        if self.sampled_logprobs {
            return Some(TokenLogprob::of_distribution(dist, token, top));
        }
        out.logits.as_deref().map(|l| TokenLogprob::new(l, token, top))
    }

    /// The distribution of the next token given `out` (the constraint's mask
    /// applied when `masked`), as [`Sampler::distribution`] gives it, or the
    /// graph's argmax alone for a plain greedy sequence (no logits read).
    pub(super) fn distribution(&mut self, out: &StepOut, masked: bool) -> Vec<(u32, f32)> {
        let plain = self.sampler.is_greedy() && self.constraint.is_none();
        match (&out.logits, &mut self.constraint) {
            (Some(l), Some(c)) if masked => {
                let mut l = l.to_vec();
                c.mask(&mut l);
                self.sampler.distribution(&l, &self.history)
            }
            (Some(l), _) if !plain => self.sampler.distribution(l, &self.history),
            _ => vec![(out.argmax, 1.0)],
        }
    }

    /// `logits` as the sampler weighs them before drawing the next token:
    /// its biases and penalties ([`Sampler::adjusted`]) and the
    /// constraint's mask (`-inf` where it forbids), before truncation.
    pub(super) fn weighed<'l>(&mut self, logits: &'l [f32]) -> Cow<'l, [f32]> {
        let mut weighed = self.sampler.adjusted(logits, &self.history);
        if let Some(c) = &mut self.constraint {
            c.mask(weighed.to_mut());
        }
        weighed
    }

    /// Draws the next token from `out` (see [`SeqGen::distribution`]),
    /// commits it to the constraint and the history, and returns it with the
    /// distribution it was drawn from. Unmasked (`masked` false), a token
    /// the constraint forbids gives None and is not committed.
    pub(super) fn draw(&mut self, out: &StepOut, masked: bool) -> Option<(u32, Vec<(u32, f32)>)> {
        let dist = self.distribution(out, masked);
        let token = self.sampler.draw(&dist);
        if let Some(c) = &mut self.constraint {
            if !masked && !c.allows(token) {
                return None;
            }
            c.commit(token);
        }
        self.history.push(token);
        Some((token, dist))
    }

    /// The tokens the constraint forces after those committed, which join
    /// the output without a forward of their own (up to the budget and the
    /// cells left) and are fed one input each by the next forward; they
    /// enter the history, and are certain (log-probability 0) when
    /// log-probabilities are recorded.
    pub(super) fn forced(&mut self, engine: &Engine, step: &mut MacroStep) -> Vec<u32> {
        let room = self.remaining().saturating_sub(step.tokens.len()).min(self.cells_left(engine));
        let forced = self.constraint.as_mut().map(|c| c.take_forced(room)).unwrap_or_default();
        self.history.extend_from_slice(&forced);
        if self.logprobs.is_some() {
            step.logprobs.extend(forced.iter().map(|&t| TokenLogprob { token: t, logprob: 0.0, top: vec![(t, 0.0)] }));
        }
        forced
    }
}

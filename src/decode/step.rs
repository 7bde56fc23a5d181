//! What one macro step is: HAMburger's stop rule (how many tokens a step
//! emits), or, self-verified, the draft rule (how many tokens the micro
//! decoder drafts for the base to check), the settings they are resolved
//! from, and the records a generation returns.

use crate::decode::draft::{DraftParams, DraftRule};
use crate::error::{Param, ParamError};
use crate::sampling::TokenLogprob;

/// The settings of the stop rule, as a user gives them; resolved once
/// against the model into a [`StepRule`] ([`StepParams::rule`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepParams {
    /// Stop a macro step when `1 - p_stop < confidence` (above 1: one token per step).
    pub confidence: f32,
    /// Most tokens per macro step (0: the model's).
    pub max_steps: usize,
    /// Make every macro step emit exactly this many tokens, ignoring the stop
    /// head (benchmarks of untrained grafted modules).
    pub forced_steps: Option<usize>,
    /// Self-verified decoding with these drafts: the micro decoder's tokens
    /// are drafts that the next base forward checks, one KV entry per token,
    /// and the output is the base's (`None`: HAMburger's macro steps).
    pub draft: Option<DraftParams>,
}

impl Default for StepParams {
    fn default() -> Self {
        StepParams { confidence: 0.8, max_steps: 0, forced_steps: None, draft: None }
    }
}

impl StepParams {
    /// Checks the settings for a model of `model_max` tokens per macro step.
    ///
    /// # Errors
    /// Naming the parameter: a confidence that is negative or not finite, a
    /// step cap beyond the model's, forced steps of 0 or beyond the cap or
    /// with self-verified decoding, drafts out of range ([`DraftParams::validate`]).
    pub fn validate(&self, model_max: usize) -> Result<(), ParamError> {
        let c = self.confidence;
        if !(c.is_finite() && c >= 0.0) {
            return Err(ParamError::new(
                &[Param::Confidence],
                format!("{} {c}: expected a finite number >= 0", Param::Confidence),
            ));
        }
        if self.max_steps > model_max {
            return Err(ParamError::new(
                &[Param::MaxSteps],
                format!("{} {} exceeds the model's {model_max} tokens per macro step", Param::MaxSteps, self.max_steps),
            ));
        }
        match self.forced_steps {
            Some(0) => Err(ParamError::new(
                &[Param::ForcedSteps],
                format!("{} 0: expected at least 1 token per macro step", Param::ForcedSteps),
            )),
            Some(k) if k > self.cap(model_max) && self.max_steps == 0 => Err(ParamError::new(
                &[Param::ForcedSteps],
                format!("{} {k} exceeds the model's {model_max} tokens per macro step", Param::ForcedSteps),
            )),
            Some(k) if k > self.cap(model_max) => Err(ParamError::new(
                &[Param::ForcedSteps, Param::MaxSteps],
                format!("{} {k} exceeds {} {}", Param::ForcedSteps, Param::MaxSteps, self.max_steps),
            )),
            Some(k) if self.draft.is_some() => Err(ParamError::new(
                &[Param::ForcedSteps, Param::SpecType],
                format!(
                    "{} {k} fixes the length of macro steps, and self-verified decoding ({}) has none: draft with {} instead",
                    Param::ForcedSteps,
                    Param::SpecType,
                    Param::DraftNMin
                ),
            )),
            _ if self.draft.is_some() && model_max <= 1 => Err(ParamError::new(
                &[Param::SpecType],
                format!(
                    "{} draft-mtp drafts with the model's micro decoder, and this model has none (a base-only \
                     llama GGUF decodes one token per forward)",
                    Param::SpecType
                ),
            )),
            _ => self.draft.map_or(Ok(()), |d| d.validate(self.cap(model_max))),
        }
    }

    /// The rule these settings give a model of `model_max` tokens per macro step.
    ///
    /// # Errors
    /// As [`StepParams::validate`].
    pub fn rule(&self, model_max: usize) -> Result<StepRule, ParamError> {
        self.validate(model_max)?;
        let max_steps = self.forced_steps.unwrap_or(self.cap(model_max));
        let draft = self.draft.map(|d| d.rule(max_steps)).transpose()?;
        Ok(StepRule { max_steps, confidence: self.confidence, forced: self.forced_steps.is_some(), draft })
    }

    /// The most tokens per macro step: the cap, else the model's.
    fn cap(&self, model_max: usize) -> usize {
        if self.max_steps == 0 {
            model_max
        } else {
            self.max_steps
        }
    }
}

/// The rule that ends a macro step, resolved once from [`StepParams`] and the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRule {
    /// Most tokens per macro step.
    pub max_steps: usize,
    /// Stop when `1 - p_stop < confidence` (above 1: one token per step).
    pub confidence: f32,
    /// Every step emits exactly `max_steps` tokens, ignoring the stop head.
    pub forced: bool,
    /// Self-verified decoding's drafts (`None`: macro steps; then the
    /// confidence and the step cap above end each step).
    pub draft: Option<DraftRule>,
}

impl StepRule {
    /// Whether step lengths depend on the stop head (not when forced, when
    /// every step is one token, or when the confidence stops every step
    /// anyway); self-verified, whether drafts may be gated by it.
    pub fn needs_stop_head(&self) -> bool {
        match self.draft {
            Some(d) => !d.by_model && d.n_max > d.n_min,
            None => !self.forced && self.may_continue(),
        }
    }

    /// Whether a macro step may go past its first token (and so needs the
    /// base forward's features for micro step 0); self-verified, whether
    /// the micro decoder may draft.
    pub fn may_continue(&self) -> bool {
        match self.draft {
            Some(d) => !d.by_model && d.n_max > 0,
            None => self.max_steps > 1 && (self.forced || self.confidence <= 1.0),
        }
    }

    /// Whether a step that has emitted `n` tokens, the last with stop
    /// probability `p_stop`, ends here.
    pub fn stops(&self, n: usize, p_stop: f32) -> bool {
        // Above 1 the rule stops every step whatever p_stop (not computed then).
        n >= self.max_steps || (!self.forced && (self.confidence > 1.0 || 1.0 - p_stop < self.confidence))
    }
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
    /// Each token's log-probability (only for a sequence that asks,
    /// [`crate::decode::generate::SeqGen::with_logprobs`]): the first under the base's
    /// distribution, the others under the micro decoder's.
    pub logprobs: Vec<TokenLogprob>,
}

/// Timing and cache statistics of a generation.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Prompt tokens before those, whose KV entries an earlier generation
    /// left in the sequence and that were not processed again (a server's
    /// prompt-prefix reuse).
    pub cached_tokens: usize,
    /// Milliseconds spent on the prompt.
    pub prompt_ms: f64,
    /// Tokens generated (after truncation).
    pub gen_tokens: usize,
    /// Milliseconds spent generating.
    pub gen_ms: f64,
    /// Macro steps (base forwards) of the generation.
    pub macro_steps: usize,
    /// KV entries of the sequence at the end.
    pub kv_entries: usize,
    /// Tokens (positions) in the sequence's context at the end.
    pub context_tokens: usize,
    /// Bytes one KV entry takes.
    pub kv_bytes_per_entry: usize,
    /// `reached[s]`: macro steps that emitted at least `s + 1` tokens.
    pub reached: Vec<usize>,
    /// Self-verified: tokens the micro decoder drafted that a base forward checked.
    pub drafted: usize,
    /// Self-verified: of those, the tokens the base accepted.
    pub draft_accepted: usize,
    /// Self-verified: base forwards that checked at least one drafted token.
    pub verify_forwards: usize,
}

impl Timings {
    /// Self-verified: drafted tokens accepted per base forward that checked
    /// drafts (what the micro decoder earns as a draft head; 0 without drafts).
    pub fn accepted_per_verify(&self) -> f64 {
        self.draft_accepted as f64 / self.verify_forwards.max(1) as f64
    }

    /// Mean tokens per macro step.
    pub fn tokens_per_step(&self) -> f64 {
        if self.macro_steps == 0 {
            0.0
        } else {
            self.reached.iter().sum::<usize>() as f64 / self.macro_steps as f64
        }
    }
}

/// The result of a generation.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// Tokens generated, cut at the first end-of-generation token and at the budget.
    pub output_ids: Vec<u32>,
    /// Every macro step as emitted (the last one may reach past the cut).
    pub macro_steps: Vec<MacroStep>,
    /// Statistics.
    pub timings: Timings,
    /// It ended because its KV cells were full ([`crate::decode::generate::SeqGen::with_cell_limit`]):
    /// an answer cut for length, like one at its token budget.
    pub context_full: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL_MAX: usize = 4;

    fn rule(confidence: f32, max_steps: usize, forced_steps: Option<usize>) -> StepRule {
        StepParams { confidence, max_steps, forced_steps, draft: None }.rule(MODEL_MAX).unwrap()
    }

    #[test]
    fn a_step_ends_when_the_stop_head_is_confident() {
        let r = rule(0.3, 0, None);
        assert_eq!(r.max_steps, MODEL_MAX, "0 caps at the model's steps");
        // 1 - 0.8 = 0.2 < 0.3: stop; 1 - 0.6 = 0.4: go on.
        assert!(r.stops(1, 0.8));
        assert!(!r.stops(1, 0.6));
        assert!(!r.stops(3, 0.0));
        assert!(r.stops(4, 0.0), "the cap ends a step whatever the stop head says");
        assert!(r.needs_stop_head() && r.may_continue());
    }

    #[test]
    fn above_one_every_step_is_one_token() {
        let r = rule(1.01, 0, None);
        assert!(r.stops(1, 0.0));
        assert!(!r.may_continue() && !r.needs_stop_head());
        // Exactly 1 still asks the stop head (1 - p_stop < 1 unless p_stop is 0).
        let r = rule(1.0, 0, None);
        assert!(r.may_continue() && !r.stops(1, 0.0) && r.stops(1, 0.1));
    }

    #[test]
    fn max_steps_caps_and_forced_steps_fix_the_length() {
        let r = rule(0.0, 2, None);
        assert_eq!(r.max_steps, 2);
        assert!(!r.stops(1, 0.0) && r.stops(2, 0.0));
        let r = rule(1.01, 0, Some(3));
        assert!(r.forced && r.max_steps == 3 && r.may_continue() && !r.needs_stop_head());
        assert!(!r.stops(2, 1.0), "a forced step ignores the stop head");
        assert!(r.stops(3, 0.0));
        assert!(!rule(0.8, 1, None).may_continue(), "one token per step needs no micro step");
    }

    #[test]
    fn validation_names_the_parameter() {
        let err = |p: StepParams| p.validate(MODEL_MAX).unwrap_err();
        let e = err(StepParams { confidence: -0.5, ..Default::default() });
        assert_eq!(
            (e.params.as_slice(), e.to_string().as_str()),
            ([Param::Confidence].as_slice(), "confidence -0.5: expected a finite number >= 0")
        );
        assert_eq!(err(StepParams { confidence: f32::NAN, ..Default::default() }).params, [Param::Confidence]);
        let e = err(StepParams { max_steps: 5, ..Default::default() });
        assert_eq!(e.to_string(), "max_steps 5 exceeds the model's 4 tokens per macro step");
        let e = err(StepParams { forced_steps: Some(0), ..Default::default() });
        assert_eq!(e.params, [Param::ForcedSteps]);
        let e = err(StepParams { forced_steps: Some(5), ..Default::default() });
        assert_eq!(e.to_string(), "forced_steps 5 exceeds the model's 4 tokens per macro step");
        let e = err(StepParams { max_steps: 2, forced_steps: Some(3), ..Default::default() });
        assert_eq!(e.params, [Param::ForcedSteps, Param::MaxSteps]);
        assert_eq!(e.naming(|p| format!("--{}", p.name().replace('_', "-"))), "--forced-steps 3 exceeds --max-steps 2");
        let drafts = Some(DraftParams::default());
        let e = err(StepParams { forced_steps: Some(2), draft: drafts, ..Default::default() });
        assert_eq!(e.params, [Param::ForcedSteps, Param::SpecType]);
        // Drafts are bounded by the step cap.
        let e = err(StepParams {
            max_steps: 2,
            draft: Some(DraftParams { n_max: Some(2), ..Default::default() }),
            ..Default::default()
        });
        assert_eq!(e.params, [Param::DraftNMax]);
        for ok in [
            StepParams { confidence: 0.0, max_steps: 4, forced_steps: Some(4), draft: None },
            StepParams { confidence: 7.0, max_steps: 0, forced_steps: Some(1), draft: None },
            StepParams {
                max_steps: 2,
                draft: Some(DraftParams { n_max: Some(1), ..Default::default() }),
                ..Default::default()
            },
        ] {
            assert_eq!(ok.validate(MODEL_MAX), Ok(()), "{ok:?}");
        }
    }
}

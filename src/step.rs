//! What one macro step is: HAMburger's stop rule (how many tokens a step
//! emits) and the records a generation returns.

/// The rule that ends a macro step, resolved once from the settings and the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRule {
    /// Most tokens per macro step.
    pub max_steps: usize,
    /// Stop when `1 - p_stop < confidence` (above 1: one token per step).
    pub confidence: f32,
    /// Every step emits exactly `max_steps` tokens, ignoring the stop head.
    pub forced: bool,
}

impl StepRule {
    /// The rule for a model of `model_max` steps: `max_steps` caps it (0: the
    /// model's), `forced_steps` forces the length (clamped to 1..=that cap).
    pub fn new(model_max: usize, max_steps: usize, confidence: f32, forced_steps: Option<usize>) -> StepRule {
        let m = if max_steps == 0 { model_max } else { max_steps.min(model_max) };
        StepRule { max_steps: forced_steps.map_or(m, |f| f.clamp(1, m)), confidence, forced: forced_steps.is_some() }
    }

    /// Whether step lengths depend on the stop head (not when forced, when
    /// every step is one token, or when the confidence stops every step anyway).
    pub fn needs_stop_head(&self) -> bool {
        !self.forced && self.may_continue()
    }

    /// Whether a macro step may go past its first token (and so needs the
    /// base forward's features for micro step 0).
    pub fn may_continue(&self) -> bool {
        self.max_steps > 1 && (self.forced || self.confidence <= 1.0)
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
    /// KV entries of the sequence at the end.
    pub kv_entries: usize,
    /// Tokens (positions) in the sequence's context at the end.
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

/// The result of a generation.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// Tokens generated, cut at the first end-of-generation token and at the budget.
    pub output_ids: Vec<u32>,
    /// Every macro step as emitted (the last one may reach past the cut).
    pub macro_steps: Vec<MacroStep>,
    /// Statistics.
    pub timings: Timings,
}

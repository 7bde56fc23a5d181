//! What `hamburger-cli` decodes with: a [`Session`] of one model (macro
//! steps), or a [`DraftSession`] of a target verifying a draft model's
//! tokens (`-md`): one interface for completion and chat.

use hamburger::draft_model::{DraftSession, DraftStats};
use hamburger::{EngineCounters, Generation, Result, Session};

/// The CLI's decoder.
pub enum Decoder<'t, 'd> {
    /// One model's macro steps.
    Macro(Box<Session<'t>>),
    /// A target model verifying a draft model's tokens.
    Drafted(Box<DraftSession<'t, 'd>>),
}

impl Decoder<'_, '_> {
    /// KV entries of the context.
    pub fn n_ctx(&self) -> usize {
        match self {
            Decoder::Macro(s) => s.params().engine.n_ctx,
            Decoder::Drafted(s) => s.params().engine.n_ctx,
        }
    }

    /// KV entries in use.
    pub fn n_slots(&self) -> usize {
        match self {
            Decoder::Macro(s) => s.n_slots(),
            Decoder::Drafted(s) => s.n_slots(),
        }
    }

    /// What the (target's) engine has done so far, counted.
    pub fn counters(&self) -> EngineCounters {
        match self {
            Decoder::Macro(s) => s.counters(),
            Decoder::Drafted(s) => s.counters(),
        }
    }

    /// Generates up to `n_predict` tokens after `prompt`, `on_step` seeing
    /// the tokens of each step (a macro step, or a verify forward); with a
    /// draft model, also what the drafting earned.
    ///
    /// # Errors
    /// As [`Session::generate`] and [`DraftSession::generate`].
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_predict: usize,
        on_step: impl FnMut(&[u32]) -> bool,
    ) -> Result<(Generation, Option<DraftStats>)> {
        match self {
            Decoder::Macro(s) => Ok((s.generate(prompt, n_predict, on_step)?, None)),
            Decoder::Drafted(s) => s.generate(prompt, n_predict, on_step).map(|(g, d)| (g, Some(d))),
        }
    }
}

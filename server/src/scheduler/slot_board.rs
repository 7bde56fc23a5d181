//! What each slot is doing, as llama-server's `/slots` shows it: the engine
//! thread publishes every slot's state each time it delivers text, before a
//! finished request's answer goes out (one lock and a copy of a few small
//! records, next to a macro step), and the HTTP side reads the last
//! published copy without waiting for the engine.

use std::sync::Mutex;

use serde::Serialize;

use crate::job::JobParams;

/// The settings a slot's request runs with (llama-server's `params`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotParams {
    /// Tokens it may generate at most.
    pub n_predict: usize,
    /// Sampling temperature (0 or less: greedy).
    pub temperature: f32,
    /// Top-k (0: all tokens).
    pub top_k: usize,
    /// Top-p.
    pub top_p: f32,
    /// Min-p.
    pub min_p: f32,
    /// Repetition penalty (1: off).
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back at.
    pub repeat_last_n: usize,
    /// The sampler's seed.
    pub seed: u64,
    /// HAMburger: a macro step ends when `1 - p_stop < confidence`.
    pub confidence: f32,
    /// HAMburger: the most tokens a macro step emits.
    pub max_steps: usize,
    /// Texts that end the generation.
    pub stop: Vec<String>,
    /// Whether it generates past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Whether its text is streamed.
    pub stream: bool,
}

impl From<&JobParams> for SlotParams {
    fn from(p: &JobParams) -> SlotParams {
        let s = &p.sampler;
        SlotParams {
            n_predict: p.n_predict,
            temperature: s.temp,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            repeat_last_n: s.repeat_last_n,
            seed: s.seed,
            confidence: p.rule.confidence,
            max_steps: p.rule.max_steps,
            stop: p.stop.clone(),
            ignore_eos: p.ignore_eos,
            stream: p.stream,
        }
    }
}

/// One slot (one engine sequence) as `/slots` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotState {
    /// The slot's number (its engine sequence).
    pub id: usize,
    /// The request running in it (its number in the log), -1 when idle as in llama-server.
    pub id_task: i64,
    /// The KV cells the slot may use.
    pub n_ctx: usize,
    /// Whether a request runs in it.
    pub is_processing: bool,
    /// The running request's prompt tokens.
    pub n_prompt_tokens: usize,
    /// The tokens it has generated so far.
    pub n_decoded: usize,
    /// The macro steps it has run so far.
    pub n_macro_steps: usize,
    /// Its settings (left out when idle, as llama-server shows an idle slot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<SlotParams>,
}

impl SlotState {
    /// Slot `id` with nothing running in it.
    fn idle(id: usize, n_ctx: usize) -> SlotState {
        SlotState {
            id,
            id_task: -1,
            n_ctx,
            is_processing: false,
            n_prompt_tokens: 0,
            n_decoded: 0,
            n_macro_steps: 0,
            params: None,
        }
    }
}

/// The slots' last published state, shared by the engine thread (which
/// writes it) and the HTTP side (which reads it).
#[derive(Debug)]
pub struct SlotBoard {
    slots: Mutex<Vec<SlotState>>,
}

impl SlotBoard {
    /// `n_slots` idle slots of `n_ctx` cells each.
    pub(super) fn new(n_slots: usize, n_ctx: usize) -> SlotBoard {
        SlotBoard { slots: Mutex::new((0..n_slots).map(|id| SlotState::idle(id, n_ctx)).collect()) }
    }

    /// Publishes `running` (one state per busy slot); every other slot is idle.
    pub(super) fn publish(&self, running: impl Iterator<Item = SlotState>) {
        let mut slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for slot in slots.iter_mut() {
            *slot = SlotState::idle(slot.id, slot.n_ctx);
        }
        for state in running {
            if let Some(slot) = slots.get_mut(state.id) {
                *slot = state;
            }
        }
    }

    /// The slots as last published, by id.
    pub fn snapshot(&self) -> Vec<SlotState> {
        self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

//! A draft model beside the engine (llama-server's `-md`): its own engine
//! with one sequence per slot. Before each macro step it drafts for every
//! running request that decodes with it and has room for drafts
//! ([`hamburger::SeqGen::draft_room`]), after the request's context; the
//! step's forward checks the drafts beside everyone's inputs. A draft
//! sequence's entries follow the request in its slot: they are dropped when
//! another request takes the slot, and drafting stops for a request whose
//! draft failed (the draft's cache full), which then decodes one token per
//! forward.

use std::borrow::BorrowMut;
use std::path::PathBuf;

use hamburger::draft_model::{DraftModelParams, DraftPick, DraftTrack, Drafter};
use hamburger::generate::{DecodeConfig, SeqGen};
use hamburger::{Engine, EngineParams, Model, StepParams};

use super::engine_loop::guarded;
use super::request::Request;

/// The server's draft model and how it drafts.
#[derive(Debug, Clone)]
pub struct DraftModelConfig {
    /// The draft model's GGUF (a HAMburger or a llama file of the model's vocabulary).
    pub model: PathBuf,
    /// How much to draft, unless a request's `speculative.*` fields say.
    pub params: DraftModelParams,
    /// The draft model's own stop rule (its macro steps).
    pub step: StepParams,
    /// Benchmarks: drafts accepted at these per-position rates, not checked
    /// (llama-server's `--spec-synth-rates`).
    pub synthetic_rates: Option<Vec<f64>>,
}

/// One slot's draft sequence: whose context its entries hold, and where it stands.
struct Slot {
    task: u64,
    track: DraftTrack,
    /// A draft failed for this request: it drafts no more.
    off: bool,
}

/// The draft model's engine and what each of its sequences holds.
pub(super) struct Drafting<'m> {
    engine: Engine<'m>,
    drafter: Drafter,
    slots: Vec<Option<Slot>>,
}

impl<'m> Drafting<'m> {
    /// A draft engine for `draft` beside a target of `target`'s vocabulary,
    /// with the target engine's sequences and cells (`engine`).
    ///
    /// # Errors
    /// When the vocabularies differ (naming both files and sizes), the
    /// draft's stop rule does not fit it, or its engine cannot be made.
    pub(super) fn new(
        draft: &'m Model,
        target: &Model,
        engine: &EngineParams,
        cfg: &DraftModelConfig,
    ) -> hamburger::Result<Self> {
        Ok(Drafting {
            drafter: Drafter::new(target, draft, &cfg.step, engine.n_batch, target.vocab.eog.clone())?,
            engine: Engine::new(draft, engine)?,
            slots: (0..engine.n_seq).map(|_| None).collect(),
        })
    }

    /// Drafts for each request of `running` that has room for drafts in
    /// `target` under `decode`'s loop, and frees the draft sequences of
    /// requests no longer running.
    pub(super) fn draft(&mut self, running: &mut [Request], target: &Engine, decode: &DecodeConfig) {
        for (seq, slot) in self.slots.iter_mut().enumerate() {
            let holder = slot.as_ref().map(|s| s.task);
            if holder.is_some() && !running.iter().any(|r| Some(r.task()) == holder && r.seq() == seq) {
                self.engine.clear_seq(seq);
                *slot = None;
            }
        }
        for r in running.iter_mut() {
            let (task, seq) = (r.task(), r.seq());
            let sg: &mut SeqGen = r.borrow_mut();
            let Some(rule) = sg.draft_room(target, decode) else { continue };
            let slot = self.slots[seq].get_or_insert_with(|| Slot { task, track: DraftTrack::new(seq), off: false });
            if slot.off {
                continue;
            }
            let (engine, drafter) = (&mut self.engine, &self.drafter);
            let context = sg.context();
            let drafted =
                guarded(|| drafter.draft(engine, &mut slot.track, context, rule.n_max, rule.p_min, DraftPick::Greedy));
            match drafted {
                Ok(Ok(d)) if d.tokens.len() >= rule.n_min => sg.set_draft(d.tokens),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => self.stop(task, seq, &e.to_string()),
                Err(why) => self.stop(task, seq, &why),
            }
        }
    }

    /// Stops drafting for `task` in `seq` after its draft failed.
    fn stop(&mut self, task: u64, seq: usize, why: &str) {
        log::warn!("task {task}: drafting stops ({why}); it decodes one token per forward");
        let slot = self.slots[seq].get_or_insert_with(|| Slot { task, track: DraftTrack::new(seq), off: true });
        Drafter::forget(&mut self.engine, &mut slot.track);
        slot.off = true;
    }
}

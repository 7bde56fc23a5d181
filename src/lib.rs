//! The HAMburger runtime: loads a HAMburger GGUF and decodes with macro steps
//! (one base forward, one KV entry) that emit up to `max_steps` tokens through
//! the micro-step decoder. See `docs/architecture.md` and
//! `docs/model.md` (the model's specification).
//!
//! The folders are the layers, after llama.cpp's split, each importing only
//! the ones before it in this list: [`model`] (the model and its file:
//! names, hyper-parameters, placement, weights), [`text`] (tokenizer, chat
//! templates), [`memory`] (KV cache, batches, which cached rows are
//! reusable), [`graph`] (the graph builders), [`sampling`] (choosing tokens
//! from logits: samplers, the speculative acceptance rule, constraints),
//! [`engine`] (caches and graphs of many sequences, its settings and
//! measured costs) and [`decode`] (the macro/micro loop, its stop and draft
//! rules, and the sessions on top). Errors ([`Error`], [`ParamError`]) are
//! shared by all.

pub mod decode;
pub mod engine;
mod error;
pub mod graph;
pub mod memory;
pub mod model;
pub mod sampling;
pub mod text;

// The modules' paths before they were grouped into folders, kept for the
// crates that name them (`hamburger::chat`, `hamburger::draft_model`, ...).
// Modules inside this crate import from the folders, never from here.
pub use decode::{draft, draft_model, generate, ngram, session, step};
pub use engine::{budget, forward_cost};
pub use memory::{batch, kv_cache, row_class};
pub use model::{arch, hparams, placement, weights};
pub use sampling::{constraint, speculative};
pub use text::{chat, tokenizer};

pub use decode::draft::{DraftParams, DraftRule};
pub use decode::generate::{DecodeConfig, SeqGen};
pub use decode::session::{Session, SessionParams};
pub use decode::step::{Generation, MacroStep, StepParams, StepRule, Timings};
pub use engine::budget::EngineParams;
pub use engine::counters::EngineCounters;
pub use engine::Engine;
pub use error::{Error, Param, ParamError, Result};
pub use graph::base::Wants;
pub use graph::micro::MicroWants;
pub use graph::StepOut;
pub use memory::batch::Batch;
pub use model::placement::{DeviceChoice, LoadOptions};
pub use model::Model;
pub use sampling::{Sampler, SamplerParams, TokenLogprob, MAX_TOP_LOGPROBS};

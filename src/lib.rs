//! The HAMburger runtime: loads a HAMburger GGUF and decodes with macro steps
//! (one base forward, one KV entry) that emit up to `max_steps` tokens through
//! the micro-step decoder. See `docs/architecture.md` and
//! `docs/model.md` (the model's specification).
//!
//! Modules follow llama.cpp's split: [`arch`] (names), [`hparams`],
//! [`placement`] and [`weights`] (loader), [`model`], [`budget`] (an engine's settings
//! and what they allocate), [`kv_cache`],
//! [`graph`] (builders), [`engine`] (caches and graphs of many sequences),
//! [`batch`], [`generate`] (the macro/micro loop), [`draft`] (self-verified
//! decoding's drafts), [`session`] (one
//! sequence), [`sampling`], and the text side ([`tokenizer`], [`chat`]).

pub mod arch;
pub mod batch;
pub mod budget;
pub mod chat;
pub mod constraint;
pub mod draft;
pub mod draft_model;
pub mod engine;
mod error;
pub mod forward_cost;
pub mod generate;
pub mod graph;
pub mod hparams;
pub mod kv_cache;
pub mod model;
pub mod placement;
pub mod row_class;
pub mod sampling;
pub mod session;
pub mod speculative;
pub mod step;
mod threads;
pub mod tokenizer;
pub mod weights;

pub use batch::Batch;
pub use budget::EngineParams;
pub use draft::{DraftParams, DraftRule};
pub use engine::Engine;
pub use error::{Error, Param, ParamError, Result};
pub use generate::{DecodeConfig, SeqGen};
pub use graph::base::Wants;
pub use graph::micro::MicroWants;
pub use graph::StepOut;
pub use model::Model;
pub use placement::{DeviceChoice, LoadOptions};
pub use sampling::{Sampler, SamplerParams, TokenLogprob, MAX_TOP_LOGPROBS};
pub use session::{Session, SessionParams};
pub use step::{Generation, MacroStep, StepParams, StepRule, Timings};

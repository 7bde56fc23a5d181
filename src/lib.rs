//! The HAMburger runtime: loads a HAMburger GGUF and decodes with macro steps
//! (one base forward, one KV entry) that emit up to `max_steps` tokens through
//! the micro-step decoder. See `docs/` and `shared/docs/hamburger-model.md`.
//!
//! Modules follow llama.cpp's split: [`arch`] (names), [`hparams`],
//! [`weights`] (loader), [`kv_cache`], [`graph`] (builders), [`session`]
//! (the macro/micro loop), [`sampling`], and the text side
//! ([`tokenizer`], [`chat`]).

pub mod arch;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod device;
mod error;
pub mod graph;
pub mod hparams;
pub mod kv_cache;
pub mod model;
pub mod sampling;
pub mod session;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
pub use model::Model;
pub use sampling::{Sampler, SamplerParams};
pub use session::{Generation, MacroStep, Session, SessionParams, Timings};

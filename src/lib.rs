//! The HAMburger runtime: loads a HAMburger GGUF and decodes with macro steps
//! (one base forward, one KV entry) that emit up to `max_steps` tokens through
//! the micro-step decoder. See `docs/` and `../shared/docs/hamburger-model.md`.

pub mod arch;
mod error;
pub mod hparams;

pub use error::{Error, Result};

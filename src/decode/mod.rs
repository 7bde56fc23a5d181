//! Decoding: the macro/micro loop over an engine and the rules it runs by,
//! and the sessions built on it, the runtime's top layer (llama.cpp's
//! `common/speculative` and `llama-cli` loop; mistral.rs's `pipeline/`).
//! Everything below it computes; this decides what to compute next and when
//! a step or a generation ends.
//!
//! * [`step`]: the stop rule's settings and rule, and the records a
//!   generation returns;
//! * [`draft`]: self-verified decoding's drafts and the gate that decides,
//!   at the engine's measured prices, whether the next one is worth it;
//! * [`tree`]: trees of drafts, the chain and the likeliest alternatives
//!   to its tokens, verified by one forward;
//! * [`ngram`]: drafts from the context itself (llama.cpp's `ngram-simple`);
//! * [`copy`]: the same lookup as inputs of a draft head that copies;
//! * [`generate`]: the decode loop for one or many sequences in lockstep;
//! * [`session`]: [`Session`](session::Session), the one-sequence API;
//! * [`draft_model`]: [`DraftSession`](draft_model::DraftSession), a target
//!   model verifying a HAMburger draft model's macro steps.

pub mod copy;
pub mod draft;
pub mod draft_model;
pub mod generate;
pub mod ngram;
pub mod session;
pub mod step;
pub mod tree;

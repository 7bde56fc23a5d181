//! The engine's integration tests, one binary (`cargo test --test integration`):
//! each module is one concern, named in its own opening comment; one binary
//! links the engine once instead of once per file.

mod batch;
mod chat;
mod chat_templates;
mod constraint;
mod context_size;
mod draft_model;
mod fast_forward;
mod golden;
mod gpu;
mod preemption;
mod sampling;
mod smollm2;
mod threads;
mod units;
mod verified;
mod verified_sampling;

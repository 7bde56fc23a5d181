//! A safe Rust layer over ggml, gguf and (as an in-process baseline) libllama.
//!
//! Everything `unsafe` in the HAMburger project lives in this crate. The raw
//! bindings come from `llama-cpp-sys-2`; this crate wraps them in owning types
//! that free their handles on drop ([`Context`], [`Backend`], [`Buffer`],
//! [`Scheduler`], [`ThreadPool`], [`llama::LlamaModel`]) and reference-counted
//! handles ([`Tensor`]) that keep the memory they point into alive.
//!
//! The shape of the API follows ggml's own lifecycle (see ggml's
//! `examples/simple/simple-backend.cpp`): a [`Context`] that allocates no
//! data holds tensor metadata; a [`Graph`] is built from it; a [`Scheduler`]
//! allocates compute buffers on one or more [`Backend`]s and runs the graph;
//! inputs and outputs move through [`Tensor::write`] / [`Tensor::read`].

mod backend;
mod context;
mod error;
mod fatal;
pub mod gguf;
mod graph;
mod groups;
#[cfg(feature = "llama")]
pub mod llama;
mod log_bridge;
mod mmap;
mod ops;
mod quants;
pub mod rpc;
mod sched;
mod types;

pub use backend::{Backend, Buffer, BufferType, Device, DeviceKind, ThreadPool, WeightOp};
pub use context::{as_bytes, Context, Pod, Tensor};
pub use error::{Error, Result};
pub use fatal::exit_on_ggml_abort;
pub use graph::Graph;
pub use groups::ContextGroups;
pub use log_bridge::init_logging;
pub use mmap::MappedFile;
pub use ops::{RopeParams, ROPE_MODE_NORMAL};
pub use quants::{dequantize, quantize_rows};
pub use sched::Scheduler;
pub use types::Type;

/// The raw bindings, for the few callers that need a constant.
pub use llama_cpp_sys_2 as sys;

/// The maximum number of dimensions of a ggml tensor.
pub const MAX_DIMS: usize = 4;

/// Bytes in a mebibyte, for size reports.
pub const MIB: f64 = (1u64 << 20) as f64;

//! Test support for the HAMburger crates, used only as a dev-dependency
//! (and by `hamburger-testmodel`):
//!
//! * [`reference`]: a plain-f32 implementation of the HAMburger spec on the
//!   checkpoint's original layout, the oracle the ggml runtime is checked
//!   against (it reads checkpoints through the converter's readers, but
//!   computes nothing with the runtime or ggml);
//! * [`testmodel`]: builders of test and benchmark checkpoints (SmolLM2 plus
//!   random grafted modules, random checkpoints of the release's shapes) and
//!   the cache of their conversions;
//! * [`golden`]: the golden cases of the tiny fixture, checked end to end;
//! * [`gpu`]: the GPU a GPU test runs on (the first of this build) and
//!   models opened with layers on it;
//! * [`near_tie`]: greedy decodes that may round differently (batch shapes,
//!   backends, implementations) compared decision by decision, parting only
//!   at a near-tie;
//! * [`parallel`]: a test's independent generations spread over every core;
//! * [`process`]: the tools run under a memory limit, or interrupted;
//! * [`registry`]: files taken from PyPI packages (pip, cached);
//! * [`sharegpt`]: chat files in the ShareGPT dataset's layout;
//! * [`merger`]: the merger alone as a runnable graph, for unit tests and benchmarks.

pub mod golden;
pub mod gpu;
pub mod merger;
pub mod near_tie;
pub mod parallel;
pub mod process;
pub mod reference;
pub mod registry;
pub mod sharegpt;
pub mod testmodel;

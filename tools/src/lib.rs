//! The front-ends of the HAMburger binaries: what the libraries leave to a
//! tool (flags, logging, one-line error reports, printing).
//!
//! * [`cli`]: argument parsing that reports one line, the logger, flag parsers
//!   shared by every binary;
//! * [`devices`]: the device listing of `--list-devices`;
//! * [`bench`]: llama-bench-style measurements of our engine against libllama;
//! * [`eval`]: a trained model against its base on real prompts (speed and
//!   the base's log-likelihood of the outputs), and the base's entropies;
//! * [`sweep`] and [`compare`] (with [`plot`]): `hamburger-quantize`'s
//!   quantization sweeps and its timing against llama.cpp's quantizer.

pub mod bench;
pub mod cli;
pub mod compare;
pub mod devices;
pub mod eval;
pub mod plot;
pub mod sweep;

//! The front-ends of the HAMburger binaries: what the libraries leave to a
//! tool (flags, logging, one-line error reports, printing).
//!
//! * [`cli`]: argument parsing that reports one line (the library's
//!   parameters named as our flags), the logger, the flags several binaries
//!   share (placement, stop rule, sampling, flash attention) and their parsers;
//! * [`decoder`]: what `hamburger-cli` decodes with: one model's macro
//!   steps, or a target verifying a draft model's tokens (`-md`);
//! * [`devices`]: the device listing of `--list-devices`;
//! * [`server_flags`]: llama-server's launch flags, honoured, accepted or
//!   refused in one line, for `hamburger-server`;
//! * [`grammar`]: the structured-output flags (`--grammar`, `--json-schema`);
//! * [`bench`]: llama-bench-style measurements of our engine against libllama;
//! * [`draft_eval`]: `hamburger-eval draft`, a HAMburger drafting for a
//!   target against libllama with an ordinary draft, in the same run;
//! * [`eval`]: a trained model against its base on real prompts (speed and
//!   the base's log-likelihood of the outputs), and the base's entropies;
//! * [`sweep`] and [`compare`] (with [`sweep_table`] and [`plot`], its
//!   results as tables and as a chart): `hamburger-quantize`'s quantization
//!   sweeps and its timing against llama.cpp's quantizer;
//! * [`logits`]: next-token distributions from logits (log-softmax, KL
//!   divergence), shared by the sweep and the evaluation.

pub mod bench;
pub mod cli;
pub mod cli_output;
pub mod compare;
pub mod decode_flags;
pub mod decoder;
pub mod devices;
pub mod draft_eval;
pub mod eval;
pub mod grammar;
pub mod logits;
pub mod plot;
pub mod server_flags;
pub mod sweep;
pub mod sweep_table;

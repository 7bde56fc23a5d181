//! Quantization for HAMburger GGUFs: llama.cpp's mixes for the base, a
//! per-role policy for the grafted tensors ([`policy`]), the conversion of f32
//! rows through ggml's own quantizers, a streaming parallel writer shared
//! with the converter ([`stream`]). Sweeps and timing against llama.cpp are
//! `hamburger-quantize`'s front-ends, in the tools crate.
//! Both `hamburger-convert --outtype` and `hamburger-quantize` go through here.

mod error;
pub mod mix;
pub mod policy;
pub mod quantize;
pub mod stream;

pub use error::QuantError;
pub use mix::Mix;
pub use policy::{conversion_type, Overrides, Role};

/// Converts rows of f32 values (`row_len` wide) to `ty` with ggml's kernels.
///
/// # Errors
/// When the rows do not fit the type's blocks or the values are not finite.
pub fn quantize_rows(ty: ggml::Type, src: &[f32], row_len: usize) -> Result<Vec<u8>, ggml::Error> {
    ggml::quantize_rows(ty, src, row_len, None)
}

//! Quantization for HAMburger GGUFs: which ggml type each tensor gets (the
//! per-role policy) and the conversion of f32 rows to that type through ggml's
//! own quantizers. Both `hamburger-convert --outtype` and `hamburger-quantize`
//! go through this crate.

pub mod policy;

pub use policy::{conversion_type, Role};

/// Converts rows of f32 values (`row_len` wide) to `ty` with ggml's kernels.
///
/// # Errors
/// When the rows do not fit the type's blocks or the values are not finite.
pub fn quantize(ty: ggml::Type, src: &[f32], row_len: usize) -> Result<Vec<u8>, ggml::Error> {
    ggml::quantize_rows(ty, src, row_len, None)
}

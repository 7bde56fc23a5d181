//! ggml's tensor element types, with their block geometry.

use std::ffi::CStr;
use std::fmt;

use crate::sys;

macro_rules! ggml_types {
    ($($variant:ident = $raw:ident),* $(,)?) => {
        /// A ggml tensor element type (plain or block-quantized).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, missing_docs)]
        pub enum Type {
            $($variant),*
        }

        impl Type {
            /// Every type this build of ggml knows.
            pub const ALL: &'static [Type] = &[$(Type::$variant),*];

            /// The raw `ggml_type` value.
            pub fn raw(self) -> sys::ggml_type {
                match self {
                    $(Type::$variant => sys::$raw),*
                }
            }

            /// The type with raw value `raw`, or `None` for an id this build does not know.
            pub fn from_raw(raw: sys::ggml_type) -> Option<Type> {
                match raw {
                    $(sys::$raw => Some(Type::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

ggml_types! {
    F32 = GGML_TYPE_F32, F16 = GGML_TYPE_F16, BF16 = GGML_TYPE_BF16, F64 = GGML_TYPE_F64,
    I8 = GGML_TYPE_I8, I16 = GGML_TYPE_I16, I32 = GGML_TYPE_I32, I64 = GGML_TYPE_I64,
    Q4_0 = GGML_TYPE_Q4_0, Q4_1 = GGML_TYPE_Q4_1, Q5_0 = GGML_TYPE_Q5_0, Q5_1 = GGML_TYPE_Q5_1,
    Q8_0 = GGML_TYPE_Q8_0, Q8_1 = GGML_TYPE_Q8_1,
    Q2_K = GGML_TYPE_Q2_K, Q3_K = GGML_TYPE_Q3_K, Q4_K = GGML_TYPE_Q4_K, Q5_K = GGML_TYPE_Q5_K,
    Q6_K = GGML_TYPE_Q6_K, Q8_K = GGML_TYPE_Q8_K,
    IQ2_XXS = GGML_TYPE_IQ2_XXS, IQ2_XS = GGML_TYPE_IQ2_XS, IQ2_S = GGML_TYPE_IQ2_S,
    IQ3_XXS = GGML_TYPE_IQ3_XXS, IQ3_S = GGML_TYPE_IQ3_S, IQ1_S = GGML_TYPE_IQ1_S,
    IQ1_M = GGML_TYPE_IQ1_M, IQ4_NL = GGML_TYPE_IQ4_NL, IQ4_XS = GGML_TYPE_IQ4_XS,
    TQ1_0 = GGML_TYPE_TQ1_0, TQ2_0 = GGML_TYPE_TQ2_0, MXFP4 = GGML_TYPE_MXFP4,
    NVFP4 = GGML_TYPE_NVFP4, Q1_0 = GGML_TYPE_Q1_0, Q2_0 = GGML_TYPE_Q2_0,
}

impl Type {
    fn traits(self) -> &'static sys::ggml_type_traits {
        // SAFETY: ggml returns a pointer into its static type-traits table for every
        // valid type id; `raw()` only yields valid ids.
        unsafe { &*sys::ggml_get_type_traits(self.raw()) }
    }

    /// ggml's name of the type (`"f32"`, `"q4_K"`, ...).
    pub fn name(self) -> &'static str {
        // SAFETY: type_name points to a static NUL-terminated string in ggml.
        unsafe { CStr::from_ptr(self.traits().type_name) }.to_str().unwrap_or("?")
    }

    /// Elements per block (1 for plain types, 32 or 256 for quantized ones).
    pub fn block_size(self) -> usize {
        self.traits().blck_size as usize
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.traits().type_size
    }

    /// Whether the type is block-quantized.
    pub fn is_quantized(self) -> bool {
        self.traits().is_quantized
    }

    /// Bytes of one row of `n` elements, or `None` when `n` is not a multiple of the block size.
    pub fn row_size(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size()).then(|| n / self.block_size() * self.type_size())
    }

    /// Bytes of a tensor of `n_elements` whose rows are `row_len` wide.
    pub fn nbytes(self, row_len: usize, n_elements: usize) -> Option<usize> {
        if row_len == 0 {
            return Some(0);
        }
        Some(self.row_size(row_len)? * (n_elements / row_len))
    }

    /// Bits per weight of the type.
    pub fn bits_per_weight(self) -> f64 {
        self.type_size() as f64 * 8.0 / self.block_size() as f64
    }

    /// Whether ggml can convert rows of this type to f32 (needed to dequantize).
    pub fn can_dequantize(self) -> bool {
        self.traits().to_float.is_some()
    }

    /// Whether ggml can produce this type from f32 rows (`ggml_quantize_chunk`'s
    /// targets): the float types and the block quantizations, but not the
    /// integer types, F64, or Q8_1 / Q8_K (intermediates of matrix products).
    pub fn is_quantization_target(self) -> bool {
        use Type::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | Q1_0
                | Q2_0
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | MXFP4
                | NVFP4
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | TQ1_0
                | TQ2_0
                | IQ2_XXS
                | IQ2_XS
                | IQ3_XXS
                | IQ3_S
                | IQ2_S
                | IQ1_S
                | IQ1_M
                | IQ4_NL
                | IQ4_XS
        )
    }

    /// Looks a type up by ggml's name, case-insensitively (`"q8_0"`, `"Q4_K"`, `"bf16"`).
    pub fn from_name(name: &str) -> Option<Type> {
        Type::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name().to_ascii_uppercase())
    }
}

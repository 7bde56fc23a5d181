//! llama.cpp's quantization mixes ("file types"): the default type of each
//! mix and the per-tensor bumps its K-quant mixes give attention values, FFN
//! down projections, attention outputs and the output matrix (llama.cpp's
//! `llama_tensor_get_type`, for the tensors a Llama stack has).

use ggml::Type;
use hamburger::arch::LayerTensor;

macro_rules! mixes {
    ($($variant:ident => $name:literal, $default:ident, $ftype:ident;)*) => {
        /// A quantization mix, by llama.cpp's name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, missing_docs)]
        pub enum Mix { $($variant),* }

        impl Mix {
            /// Every mix `hamburger-quantize` offers.
            pub const ALL: &'static [Mix] = &[$(Mix::$variant),*];

            /// llama.cpp's name (`Q4_K_M`).
            pub fn name(self) -> &'static str {
                match self { $(Mix::$variant => $name),* }
            }

            /// The type most matrices get.
            pub fn default_type(self) -> Type {
                match self { $(Mix::$variant => Type::$default),* }
            }

            /// llama.cpp's `general.file_type` id of the mix (`LLAMA_FTYPE_*`).
            pub fn file_type(self) -> u32 {
                match self { $(Mix::$variant => ggml::sys::$ftype),* }
            }
        }
    };
}

mixes! {
    F32 => "F32", F32, LLAMA_FTYPE_ALL_F32;
    F16 => "F16", F16, LLAMA_FTYPE_MOSTLY_F16;
    BF16 => "BF16", BF16, LLAMA_FTYPE_MOSTLY_BF16;
    Q8_0 => "Q8_0", Q8_0, LLAMA_FTYPE_MOSTLY_Q8_0;
    Q6_K => "Q6_K", Q6_K, LLAMA_FTYPE_MOSTLY_Q6_K;
    Q5_K_M => "Q5_K_M", Q5_K, LLAMA_FTYPE_MOSTLY_Q5_K_M;
    Q5_K_S => "Q5_K_S", Q5_K, LLAMA_FTYPE_MOSTLY_Q5_K_S;
    Q5_1 => "Q5_1", Q5_1, LLAMA_FTYPE_MOSTLY_Q5_1;
    Q5_0 => "Q5_0", Q5_0, LLAMA_FTYPE_MOSTLY_Q5_0;
    Q4_K_M => "Q4_K_M", Q4_K, LLAMA_FTYPE_MOSTLY_Q4_K_M;
    Q4_K_S => "Q4_K_S", Q4_K, LLAMA_FTYPE_MOSTLY_Q4_K_S;
    Q4_1 => "Q4_1", Q4_1, LLAMA_FTYPE_MOSTLY_Q4_1;
    Q4_0 => "Q4_0", Q4_0, LLAMA_FTYPE_MOSTLY_Q4_0;
    IQ4_NL => "IQ4_NL", IQ4_NL, LLAMA_FTYPE_MOSTLY_IQ4_NL;
    IQ4_XS => "IQ4_XS", IQ4_XS, LLAMA_FTYPE_MOSTLY_IQ4_XS;
    Q3_K_L => "Q3_K_L", Q3_K, LLAMA_FTYPE_MOSTLY_Q3_K_L;
    Q3_K_M => "Q3_K_M", Q3_K, LLAMA_FTYPE_MOSTLY_Q3_K_M;
    Q3_K_S => "Q3_K_S", Q3_K, LLAMA_FTYPE_MOSTLY_Q3_K_S;
    Q2_K => "Q2_K", Q2_K, LLAMA_FTYPE_MOSTLY_Q2_K;
}

impl Mix {
    /// Parses a mix name, case-insensitively.
    pub fn from_name(s: &str) -> Option<Mix> {
        Mix::ALL.iter().copied().find(|m| m.name().eq_ignore_ascii_case(s))
    }

    /// The names of every mix, for error messages.
    pub fn names() -> String {
        Mix::ALL.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
    }

    /// Whether the mix quantizes (rather than storing floats).
    pub fn is_quantized(self) -> bool {
        self.default_type().is_quantized()
    }

    /// The type of the output matrix (or the embedding tied to it) with rows of
    /// `row_len`: llama.cpp keeps it at Q6_K (Q8_0 when the rows do not fit
    /// 256-blocks) in every quantized mix below Q8_0.
    pub fn output_type(self, row_len: usize) -> Type {
        let d = self.default_type();
        if !d.is_quantized() || d == Type::Q8_0 {
            d
        } else if !row_len.is_multiple_of(d.block_size()) || !row_len.is_multiple_of(Type::Q6_K.block_size()) {
            Type::Q8_0
        } else {
            Type::Q6_K
        }
    }

    /// The type of layer tensor `lt` of layer `layer` in a stack of `n_layer`
    /// layers with `n_gqa` query heads per key/value head.
    pub fn layer_type(self, lt: LayerTensor, layer: usize, n_layer: usize, n_gqa: usize) -> Type {
        use LayerTensor::*;
        let more_bits = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
        let d = self.default_type();
        match (self, lt) {
            (Mix::Q2_K, AttnV) => {
                if n_gqa >= 4 {
                    Type::Q4_K
                } else {
                    Type::Q3_K
                }
            }
            (Mix::Q3_K_M, AttnV) => {
                if layer < 2 {
                    Type::Q5_K
                } else {
                    Type::Q4_K
                }
            }
            (Mix::Q3_K_L, AttnV) => Type::Q5_K,
            (Mix::IQ4_NL | Mix::IQ4_XS, AttnV) if n_gqa >= 4 => Type::Q5_K,
            (Mix::Q4_K_M | Mix::Q5_K_M, AttnV) if more_bits => Type::Q6_K,
            (Mix::Q4_K_S, AttnV) if layer < 4 => Type::Q5_K,
            (Mix::Q2_K, FfnDown) => Type::Q3_K,
            (Mix::Q3_K_M, FfnDown) => {
                if layer < n_layer / 16 {
                    Type::Q5_K
                } else {
                    Type::Q4_K
                }
            }
            (Mix::Q3_K_L, FfnDown) => Type::Q5_K,
            (Mix::Q4_K_M | Mix::Q5_K_M, FfnDown) if more_bits => Type::Q6_K,
            (Mix::IQ4_NL | Mix::IQ4_XS, FfnDown) if layer < n_layer / 8 => Type::Q5_K,
            (Mix::Q4_K_S, FfnDown) if layer < n_layer / 8 => Type::Q5_K,
            (Mix::Q2_K, AttnOutput) => Type::Q3_K,
            (Mix::Q3_K_M, AttnOutput) => Type::Q4_K,
            (Mix::Q3_K_L, AttnOutput) => Type::Q5_K,
            _ => d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_bumps_like_llama_cpp() {
        // 16 layers: more bits for layers 0,1 (< n/8), 14,15 (>= 7n/8) and 4,7,10,13.
        let bumped: Vec<usize> =
            (0..16).filter(|&l| Mix::Q4_K_M.layer_type(LayerTensor::FfnDown, l, 16, 4) == Type::Q6_K).collect();
        assert_eq!(bumped, [0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(Mix::Q4_K_M.layer_type(LayerTensor::AttnQ, 4, 16, 4), Type::Q4_K);
        assert_eq!(Mix::Q4_0.output_type(2048), Type::Q6_K);
        assert_eq!(Mix::Q4_0.output_type(576), Type::Q8_0);
        assert_eq!(Mix::Q8_0.output_type(2048), Type::Q8_0);
        assert_eq!(Mix::from_name("q4_k_m"), Some(Mix::Q4_K_M));
    }
}

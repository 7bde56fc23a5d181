//! Every GGUF key and tensor name of the HAMburger format, spelled once.
//!
//! The base model uses llama.cpp's names and layout, so that the base-only
//! export is a plain llama GGUF; the grafted modules get new roles:
//! `merger.*` (compositional embedder), `micro.blk.N.*` (micro-step decoder
//! layers, with the base layers' suffixes) and `stop_head.*`.
//! `docs/gguf-format.md` documents the same table for readers.

use std::fmt;

/// `general.architecture` of a HAMburger GGUF.
pub const ARCH_HAMBURGER: &str = "hamburger";
/// `general.architecture` of a base-only (llama.cpp) GGUF.
pub const ARCH_LLAMA: &str = "llama";

/// Metadata keys whose full name is `<arch>.<suffix>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Trained context length (tokens).
    ContextLength,
    /// Hidden size D.
    EmbeddingLength,
    /// Base layer count L.
    BlockCount,
    /// MLP width.
    FeedForwardLength,
    /// Attention heads H.
    HeadCount,
    /// Key/value heads Hkv.
    HeadCountKv,
    /// RMSNorm epsilon.
    RmsEps,
    /// Rope theta.
    RopeFreqBase,
    /// Rotated dimensions per head.
    RopeDimensionCount,
    /// Key head size.
    KeyLength,
    /// Value head size.
    ValueLength,
    /// Vocabulary size V.
    VocabSize,
    /// HAMburger: most tokens one macro step may emit (S).
    MaxSteps,
    /// HAMburger: micro-step decoder layer count.
    MicroBlockCount,
    /// HAMburger: base layers whose outputs feed the micro decoder (array).
    FeatureLayers,
    /// HAMburger: merger attention heads (Hm).
    MergerHeadCount,
}

impl Key {
    /// The key's suffix after `<arch>.`.
    pub fn suffix(self) -> &'static str {
        match self {
            Key::ContextLength => "context_length",
            Key::EmbeddingLength => "embedding_length",
            Key::BlockCount => "block_count",
            Key::FeedForwardLength => "feed_forward_length",
            Key::HeadCount => "attention.head_count",
            Key::HeadCountKv => "attention.head_count_kv",
            Key::RmsEps => "attention.layer_norm_rms_epsilon",
            Key::RopeFreqBase => "rope.freq_base",
            Key::RopeDimensionCount => "rope.dimension_count",
            Key::KeyLength => "attention.key_length",
            Key::ValueLength => "attention.value_length",
            Key::VocabSize => "vocab_size",
            Key::MaxSteps => "max_steps",
            Key::MicroBlockCount => "micro.block_count",
            Key::FeatureLayers => "feature_layers",
            Key::MergerHeadCount => "merger.head_count",
        }
    }

    /// The full key for architecture `arch`.
    pub fn name(self, arch: &str) -> String {
        format!("{arch}.{}", self.suffix())
    }
}

/// Values of `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
pub mod token_type {
    /// An ordinary token.
    pub const NORMAL: i32 = 1;
    /// A control token (BOS, EOS, end-of-turn markers...).
    pub const CONTROL: i32 = 3;
    /// A token added by the user, matched before tokenization.
    pub const USER_DEFINED: i32 = 4;
    /// A padding id without a token.
    pub const UNUSED: i32 = 5;
}

/// General and tokenizer keys (no architecture prefix).
pub mod keys {
    /// The architecture name.
    pub const ARCHITECTURE: &str = "general.architecture";
    /// The model's name.
    pub const NAME: &str = "general.name";
    /// llama.cpp's file type (dominant quantization).
    pub const FILE_TYPE: &str = "general.file_type";
    /// Version of the quantization formats.
    pub const QUANTIZATION_VERSION: &str = "general.quantization_version";
    /// Tokenizer model family (`gpt2` for byte-level BPE).
    pub const TOKENIZER_MODEL: &str = "tokenizer.ggml.model";
    /// Pre-tokenizer name (llama.cpp's regex set).
    pub const TOKENIZER_PRE: &str = "tokenizer.ggml.pre";
    /// Token strings by id.
    pub const TOKENIZER_TOKENS: &str = "tokenizer.ggml.tokens";
    /// Token types by id (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte).
    pub const TOKENIZER_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    /// BPE merges (`"a b"`).
    pub const TOKENIZER_MERGES: &str = "tokenizer.ggml.merges";
    /// Beginning-of-sequence token id.
    pub const TOKENIZER_BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    /// End-of-sequence token id.
    pub const TOKENIZER_EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    /// End-of-turn token id.
    pub const TOKENIZER_EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    /// End-of-message token id.
    pub const TOKENIZER_EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    /// Padding token id.
    pub const TOKENIZER_PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    /// Unknown token id.
    pub const TOKENIZER_UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    /// Whether to prepend BOS.
    pub const TOKENIZER_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    /// Whether to append EOS.
    pub const TOKENIZER_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// The Hugging Face `tokenizer.json`, verbatim.
    pub const TOKENIZER_HF_JSON: &str = "tokenizer.huggingface.json";
    /// The Jinja chat template.
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// A tensor of a transformer layer (base or micro decoder); llama.cpp's suffixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerTensor {
    /// RMSNorm before attention.
    AttnNorm,
    /// Query projection (rows permuted for ggml's rope).
    AttnQ,
    /// Key projection (rows permuted for ggml's rope).
    AttnK,
    /// Value projection.
    AttnV,
    /// Attention output projection.
    AttnOutput,
    /// RMSNorm before the MLP.
    FfnNorm,
    /// SwiGLU gate projection.
    FfnGate,
    /// SwiGLU up projection.
    FfnUp,
    /// MLP down projection.
    FfnDown,
}

impl LayerTensor {
    /// All layer tensors in file order.
    pub const ALL: [LayerTensor; 9] = [
        LayerTensor::AttnNorm,
        LayerTensor::AttnQ,
        LayerTensor::AttnK,
        LayerTensor::AttnV,
        LayerTensor::AttnOutput,
        LayerTensor::FfnNorm,
        LayerTensor::FfnGate,
        LayerTensor::FfnUp,
        LayerTensor::FfnDown,
    ];

    fn suffix(self) -> &'static str {
        match self {
            LayerTensor::AttnNorm => "attn_norm",
            LayerTensor::AttnQ => "attn_q",
            LayerTensor::AttnK => "attn_k",
            LayerTensor::AttnV => "attn_v",
            LayerTensor::AttnOutput => "attn_output",
            LayerTensor::FfnNorm => "ffn_norm",
            LayerTensor::FfnGate => "ffn_gate",
            LayerTensor::FfnUp => "ffn_up",
            LayerTensor::FfnDown => "ffn_down",
        }
    }
}

/// A linear layer of the merger or stop head: weight or bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The weight matrix.
    Weight,
    /// The bias vector.
    Bias,
}

impl Part {
    fn suffix(self) -> &'static str {
        match self {
            Part::Weight => "weight",
            Part::Bias => "bias",
        }
    }
}

/// The linear layers of the compositional embedder (merger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MergerLinear {
    /// Query from the mean embedding (D x D).
    Q,
    /// Keys from `[e_j, P_j]` (D x 3D/2).
    K,
    /// Values from `[e_j, P_j]` (D x 3D/2).
    V,
    /// Output projection added to the mean (D x D).
    Out,
}

/// The linear layers of the stop head (Linear, SiLU, Linear, SiLU, Linear).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopLinear {
    /// First hidden layer (D x D).
    Fc1,
    /// Second hidden layer (D x D).
    Fc2,
    /// Output logit (1 x D).
    Out,
}

/// Every tensor of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorName {
    /// Token embedding table `[D, V]`.
    TokenEmbd,
    /// Final RMSNorm weight `[D]`.
    OutputNorm,
    /// Untied lm_head `[D, V]` (absent when tied to the embedding).
    Output,
    /// Llama-3 rope frequency divisors `[head_dim/2]`.
    RopeFreqs,
    /// A base layer tensor.
    Base(usize, LayerTensor),
    /// A micro-step decoder layer tensor.
    Micro(usize, LayerTensor),
    /// A merger projection.
    Merger(MergerLinear, Part),
    /// The merger's in-chunk position table `[D/2, S]`.
    MergerPos,
    /// A stop-head layer.
    Stop(StopLinear, Part),
}

impl TensorName {
    /// Whether the tensor belongs to the base model (and so to a base-only export).
    pub fn is_base(self) -> bool {
        matches!(
            self,
            TensorName::TokenEmbd
                | TensorName::OutputNorm
                | TensorName::Output
                | TensorName::RopeFreqs
                | TensorName::Base(..)
        )
    }

    /// Parses a GGUF tensor name.
    pub fn parse(name: &str) -> Option<TensorName> {
        let simple = [
            TensorName::TokenEmbd,
            TensorName::OutputNorm,
            TensorName::Output,
            TensorName::RopeFreqs,
            TensorName::MergerPos,
        ];
        if let Some(t) = simple.into_iter().find(|t| t.to_string() == name) {
            return Some(t);
        }
        let parts = [Part::Weight, Part::Bias];
        for m in [MergerLinear::Q, MergerLinear::K, MergerLinear::V, MergerLinear::Out] {
            for p in parts {
                if TensorName::Merger(m, p).to_string() == name {
                    return Some(TensorName::Merger(m, p));
                }
            }
        }
        for s in [StopLinear::Fc1, StopLinear::Fc2, StopLinear::Out] {
            for p in parts {
                if TensorName::Stop(s, p).to_string() == name {
                    return Some(TensorName::Stop(s, p));
                }
            }
        }
        let (micro, rest) = match name.strip_prefix("micro.blk.") {
            Some(rest) => (true, rest),
            None => (false, name.strip_prefix("blk.")?),
        };
        let (layer, rest) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let suffix = rest.strip_suffix(".weight")?;
        let lt = LayerTensor::ALL.into_iter().find(|t| t.suffix() == suffix)?;
        Some(if micro { TensorName::Micro(layer, lt) } else { TensorName::Base(layer, lt) })
    }
}

impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TensorName::TokenEmbd => f.write_str("token_embd.weight"),
            TensorName::OutputNorm => f.write_str("output_norm.weight"),
            TensorName::Output => f.write_str("output.weight"),
            TensorName::RopeFreqs => f.write_str("rope_freqs.weight"),
            TensorName::Base(i, t) => write!(f, "blk.{i}.{}.weight", t.suffix()),
            TensorName::Micro(i, t) => write!(f, "micro.blk.{i}.{}.weight", t.suffix()),
            TensorName::Merger(m, p) => {
                let m = match m {
                    MergerLinear::Q => "attn_q",
                    MergerLinear::K => "attn_k",
                    MergerLinear::V => "attn_v",
                    MergerLinear::Out => "attn_output",
                };
                write!(f, "merger.{m}.{}", p.suffix())
            }
            TensorName::MergerPos => f.write_str("merger.pos_embd.weight"),
            TensorName::Stop(s, p) => {
                let s = match s {
                    StopLinear::Fc1 => "fc1",
                    StopLinear::Fc2 => "fc2",
                    StopLinear::Out => "out",
                };
                write!(f, "stop_head.{s}.{}", p.suffix())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let mut all = vec![
            TensorName::TokenEmbd,
            TensorName::OutputNorm,
            TensorName::Output,
            TensorName::RopeFreqs,
            TensorName::MergerPos,
        ];
        for lt in LayerTensor::ALL {
            all.push(TensorName::Base(12, lt));
            all.push(TensorName::Micro(3, lt));
        }
        for m in [MergerLinear::Q, MergerLinear::K, MergerLinear::V, MergerLinear::Out] {
            all.push(TensorName::Merger(m, Part::Weight));
            all.push(TensorName::Merger(m, Part::Bias));
        }
        for s in [StopLinear::Fc1, StopLinear::Fc2, StopLinear::Out] {
            all.push(TensorName::Stop(s, Part::Bias));
        }
        for t in all {
            assert_eq!(TensorName::parse(&t.to_string()), Some(t), "{t}");
        }
        assert_eq!(TensorName::parse("blk.x.attn_q.weight"), None);
        assert_eq!(TensorName::parse("blk.1.attn_q.bias"), None);
    }
}

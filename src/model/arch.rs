//! Every GGUF key and tensor name of the HAMburger format, spelled once.
//!
//! The base model uses llama.cpp's names and layout, so that the base-only
//! export is a plain llama GGUF; the grafted modules get new roles:
//! `merger.*` (compositional embedder), `micro.blk.N.*` (micro-step decoder
//! layers, with the base layers' suffixes) and `stop_head.*`.
//! `docs/gguf-format.md` documents the same table for readers.
//!
//! The tensors and the table of their facts live in `arch/tensor.rs`,
//! re-exported here.

mod tensor;

pub use tensor::{
    LayerTensor, MergerLinear, Module, Part, Presence, StopLinear, TensorInfo, TensorName, TensorSet, TensorUse,
};

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
    /// HAMburger: the confidence the model's makers recommend (f32, optional);
    /// the tools' default when present.
    RecommendedConfidence,
    /// HAMburger: the draft vocabulary (token ids, optional): the tokens
    /// self-verified decoding drafts from, through the lm_head's rows of
    /// those tokens alone ([`crate::model::draft_vocab`]).
    DraftVocab,
    /// HAMburger: the longest n-gram the draft head copies from (optional;
    /// with `draft_copy.weight`): its micro decoder reads, beside each
    /// token, what followed the latest earlier occurrence of the text's
    /// last M, M-1, ..., 1 tokens ([`crate::decode::copy`]).
    DraftCopyNgram,
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
            Key::RecommendedConfidence => "recommended_confidence",
            Key::DraftVocab => "draft_vocab",
            Key::DraftCopyNgram => "draft_copy_ngram",
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

/// Texts of the special tokens that end a turn or a text, as llama.cpp
/// recognises them, most specific first: the converter takes the first one a
/// tokenizer has as its end-of-turn id, and the runtime treats every control
/// token with one of these texts as end of generation.
pub const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<EOT>",
];

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

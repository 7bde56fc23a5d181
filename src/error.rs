//! The runtime library's error type.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a HAMburger model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A failure in the ggml layer (GGUF parsing, allocation, compute).
    #[error(transparent)]
    Ggml(#[from] ggml::Error),
    /// Required metadata keys are missing or have the wrong type.
    #[error("{path}: missing or mistyped metadata: {keys}")]
    MissingKeys {
        /// The model file.
        path: PathBuf,
        /// Every key at fault, comma-separated.
        keys: String,
    },
    /// Hyper-parameters that contradict each other.
    #[error("{origin}: invalid hyper-parameters: {problems}")]
    HParams {
        /// Where they came from (a file).
        origin: String,
        /// Every problem, `;`-separated.
        problems: String,
    },
    /// The file is neither a HAMburger GGUF nor a llama one (a base alone).
    #[error("{path}: architecture is '{found}', expected 'hamburger' (or 'llama', a base model alone)")]
    WrongArchitecture {
        /// The model file.
        path: PathBuf,
        /// The architecture it declares.
        found: String,
    },
    /// A required tensor is absent.
    #[error("{path}: tensor {name} is missing")]
    MissingTensor {
        /// The model file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// A tensor's shape differs from the hyper-parameters'.
    #[error("{path}: tensor {name} has wrong shape; expected {expected:?}, got {got:?}")]
    TensorShape {
        /// The model file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Expected shape (ggml order).
        expected: Vec<i64>,
        /// Shape in the file.
        got: Vec<i64>,
    },
    /// A tensor's type is not usable in its role.
    #[error("{path}: tensor {name} has type {ty}, which is not supported for it")]
    TensorType {
        /// The model file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its type.
        ty: ggml::Type,
    },
    /// A tensor the format does not define.
    #[error("{path}: unexpected tensor {name}")]
    UnexpectedTensor {
        /// The model file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
    /// A setting outside what the runtime accepts (it names the parameters at fault).
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A draft model whose vocabulary is not the target's: its token ids
    /// would mean other tokens.
    #[error("the draft model {draft} has a vocabulary of {draft_vocab} tokens, the target {target} one of {target_vocab}: a draft model needs the target's vocabulary")]
    VocabMismatch {
        /// The draft model's file.
        draft: PathBuf,
        /// Its vocabulary size.
        draft_vocab: usize,
        /// The target model's file.
        target: PathBuf,
        /// Its vocabulary size.
        target_vocab: usize,
    },
    /// An invalid option value.
    #[error("{0}")]
    Invalid(String),
}

/// A setting the runtime calls a parameter: what its messages name, as
/// `n_ctx` or `top_p`, never as one front-end's flag or request field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// KV cells of an engine ([`crate::engine::budget::EngineParams::n_ctx`]).
    NCtx,
    /// Sequences of an engine.
    NSeq,
    /// Inputs per base forward.
    NBatch,
    /// CPU threads.
    NThreads,
    /// Tokens to generate.
    NPredict,
    /// The stop rule's confidence ([`crate::decode::step::StepParams::confidence`]).
    Confidence,
    /// The cap of tokens per macro step.
    MaxSteps,
    /// The forced tokens per macro step.
    ForcedSteps,
    /// Sampling temperature ([`crate::sampling::SamplerParams::temp`]).
    Temp,
    /// Nucleus sampling.
    TopP,
    /// Min-p sampling.
    MinP,
    /// The repeat penalty.
    RepeatPenalty,
    /// The frequency penalty.
    FrequencyPenalty,
    /// The presence penalty.
    PresencePenalty,
    /// How the micro decoder's tokens are used: kept as macro steps, or
    /// drafted and verified by the base ([`crate::decode::step::StepParams::draft`]).
    SpecType,
    /// The most tokens drafted per verify forward, by the micro decoder
    /// ([`crate::decode::draft::DraftParams::n_max`]) or a draft model.
    DraftNMax,
    /// The tokens always drafted (self-verified), or the fewest drafted
    /// tokens worth a verify forward (a draft model).
    DraftNMin,
    /// The least probability a drafted token needs.
    DraftPMin,
    /// The most drafts of a tree ([`crate::decode::draft::DraftParams::tree`]).
    DraftTree,
    /// The n-gram the context drafts after ([`crate::decode::draft::DraftParams::ngram`]).
    NgramSizeN,
    /// The device a model runs on ([`crate::model::placement::LoadOptions::device`]).
    Device,
    /// The offload devices' shares of the offloaded layers.
    TensorSplit,
}

impl Param {
    /// The parameter's name in messages: the field's name in the settings.
    pub fn name(self) -> &'static str {
        match self {
            Param::NCtx => "n_ctx",
            Param::NSeq => "n_seq",
            Param::NBatch => "n_batch",
            Param::NThreads => "n_threads",
            Param::NPredict => "n_predict",
            Param::Confidence => "confidence",
            Param::MaxSteps => "max_steps",
            Param::ForcedSteps => "forced_steps",
            Param::Temp => "temp",
            Param::TopP => "top_p",
            Param::Device => "device",
            Param::TensorSplit => "tensor_split",
            Param::MinP => "min_p",
            Param::RepeatPenalty => "repeat_penalty",
            Param::FrequencyPenalty => "frequency_penalty",
            Param::PresencePenalty => "presence_penalty",
            Param::SpecType => "spec_type",
            Param::DraftNMax => "draft_n_max",
            Param::DraftNMin => "draft_n_min",
            Param::DraftPMin => "draft_p_min",
            Param::DraftTree => "draft_tree",
            Param::NgramSizeN => "ngram_size_n",
        }
    }
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings the runtime refuses: a message that names each parameter at
/// fault by [`Param::name`], and those parameters, so that a front-end can
/// say them its own way ([`ParamError::naming`]: `-c` in the CLI,
/// `max_tokens` in a server request).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    /// The parameters at fault, the first the main one.
    pub params: Vec<Param>,
    message: String,
}

impl ParamError {
    /// `message` about `params`, each named in it by its [`Param::name`].
    pub fn new(params: &[Param], message: String) -> ParamError {
        ParamError { params: params.to_vec(), message }
    }

    /// The message with each parameter named by `name` instead (a flag, a request field).
    pub fn naming(&self, name: impl Fn(Param) -> String) -> String {
        self.params.iter().fold(self.message.clone(), |m, &p| m.replace(p.name(), &name(p)))
    }
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

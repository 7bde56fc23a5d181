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
    /// The file is not a HAMburger GGUF.
    #[error(
        "{path}: architecture is '{found}', expected 'hamburger' (a base-only llama GGUF runs in llama.cpp, not here)"
    )]
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
    /// The prompt and the tokens to generate do not fit the context.
    #[error("the prompt ({prompt} tokens) plus {n_predict} tokens to generate exceed the context of {n_ctx} (use -c to enlarge it or -n to generate less)")]
    ContextOverflow {
        /// Prompt tokens (including history already in the cache).
        prompt: usize,
        /// Tokens asked for.
        n_predict: usize,
        /// Context size.
        n_ctx: usize,
    },
    /// An invalid option value.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The converter's error type: every message names the file and, where there
//! is one, the tensor.

use std::path::PathBuf;

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The checkpoint is malformed or of an unknown format.
    #[error("{path}: {msg}")]
    Checkpoint {
        /// The checkpoint.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A config file is malformed or contradicts the weights.
    #[error("{path}: {msg}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The tokenizer files are malformed or unsupported.
    #[error("{path}: {msg}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The base model's files (config, tokenizer) are not in the folder read.
    #[error("{}: no {} here: a HAMburger checkpoint does not hold its base's configuration and tokenizer; put the base model's files beside the checkpoint or name their folder as the base directory", dir.display(), missing.join(", "))]
    MissingBaseFiles {
        /// The folder that was read.
        dir: PathBuf,
        /// The files it lacks.
        missing: Vec<&'static str>,
    },
    /// A required tensor is absent.
    #[error("{path}: missing tensor {name}")]
    MissingTensor {
        /// The checkpoint.
        path: PathBuf,
        /// The state-dict name.
        name: String,
    },
    /// A tensor has the wrong shape for the config.
    #[error("{path}: tensor {name} has shape {got:?}, but the config implies {expected:?}")]
    Shape {
        /// The checkpoint.
        path: PathBuf,
        /// The state-dict name.
        name: String,
        /// Expected (PyTorch order).
        expected: Vec<usize>,
        /// Found.
        got: Vec<usize>,
    },
    /// A tensor has an element type that is not a float type.
    #[error("{path}: tensor {name} has dtype {dtype}; only float32/float16/bfloat16/float64 weights can be converted")]
    Dtype {
        /// The checkpoint.
        path: PathBuf,
        /// The state-dict name.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor the HAMburger layout does not have.
    #[error("{path}: unexpected tensor {name} (not a HAMburger checkpoint layout?)")]
    UnexpectedTensor {
        /// The checkpoint.
        path: PathBuf,
        /// The state-dict name.
        name: String,
    },
    /// Converting one tensor's data failed.
    #[error("tensor {name}: {msg}")]
    Tensor {
        /// The GGUF tensor name.
        name: String,
        /// What went wrong.
        msg: String,
    },
    /// The hyper-parameters are inconsistent.
    #[error(transparent)]
    HParams(#[from] hamburger::Error),
    /// The ggml layer failed (GGUF writing).
    #[error(transparent)]
    Ggml(#[from] ggml::Error),
}

impl ConvertError {
    /// An I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ConvertError::Io { path: path.into(), source }
    }
}

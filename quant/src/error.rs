//! The quantizer's error type.

use std::path::PathBuf;

/// Why quantizing or a sweep failed.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The ggml layer failed (reading, writing, quantizing).
    #[error(transparent)]
    Ggml(#[from] ggml::Error),
    /// The runtime failed (sweep measurements).
    #[error(transparent)]
    Runtime(#[from] hamburger::Error),
    /// An I/O error with its path.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The input is already quantized and requantizing was not allowed.
    #[error(
        "{path}: tensor {tensor} is already {ty}; requantizing loses quality, pass --allow-requantize to do it anyway"
    )]
    Requantize {
        /// The input.
        path: PathBuf,
        /// The first such tensor.
        tensor: String,
        /// Its type.
        ty: ggml::Type,
    },
    /// The input is not a HAMburger or llama GGUF this tool knows.
    #[error("{path}: {msg}")]
    Input {
        /// The input.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Quantizing one tensor failed.
    #[error("tensor {name}: {msg}")]
    Tensor {
        /// The tensor.
        name: String,
        /// What went wrong.
        msg: String,
    },
}

impl QuantError {
    /// An I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        QuantError::Io { path: path.into(), source }
    }
}

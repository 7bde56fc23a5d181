//! The error type of the ggml layer.

use std::path::PathBuf;

/// Errors from the ggml layer: every failure a C call can report, turned into a value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A GGUF file could not be parsed; `reason` is ggml's own message when it gave one.
    #[error("{path}: not a valid GGUF file: {reason}")]
    GgufRead {
        /// The file.
        path: PathBuf,
        /// What ggml's reader reported.
        reason: String,
    },
    /// A GGUF value has another type than the caller expects.
    #[error("{}: key {key} holds {found}, expected {expected}", path.display())]
    GgufType {
        /// The file.
        path: std::path::PathBuf,
        /// The metadata key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type stored.
        found: String,
    },
    /// An argument the C side would abort on was rejected before the call.
    #[error("{0}")]
    Invalid(String),
    /// A backend buffer could not be allocated.
    #[error("failed to allocate a {size}-byte buffer on {buffer_type}")]
    Alloc {
        /// The buffer type's name.
        buffer_type: String,
        /// Bytes asked for.
        size: usize,
    },
    /// A backend could not be initialised.
    #[error("failed to initialise backend {0}")]
    BackendInit(String),
    /// A graph computation failed (ggml status code).
    #[error("graph computation failed with status {0}")]
    Compute(i32),
    /// The scheduler could not allocate a graph.
    #[error("the scheduler could not allocate the graph (out of device memory?)")]
    SchedAlloc,
    /// libllama reported an error.
    #[error("llama.cpp: {0}")]
    Llama(String),
    /// An I/O error, with the file it concerns.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

//! `hamburger._native`: the runtime inside a Python process, no server. An
//! [`engine::Engine`] loads a model onto the server's engine thread (one
//! pool of KV cells, continuous batching) and answers requests by calling
//! the server's routes directly, without a socket, so that every request
//! field, tool format, constraint and answer shape is the server's own; the
//! Python package (`hamburger/`) turns llama-cpp-python's arguments into
//! those requests. Waiting releases the GIL, and a pending signal
//! (KeyboardInterrupt) cancels the generation.
//!
//! * `engine`: loading, requests, tokenization;
//! * `stream`: a streamed answer as a Python iterator of its events;
//! * `errors`: the runtime's errors as Python exceptions;
//! * `wait`: waiting for the engine with the GIL released.

mod engine;
mod errors;
mod stream;
mod wait;

use pyo3::prelude::*;

/// The module: `Engine`, `Stream` and `LoadError`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<stream::Stream>()?;
    m.add("LoadError", m.py().get_type::<errors::LoadError>())?;
    Ok(())
}

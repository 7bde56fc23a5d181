//! The runtime's errors as Python exceptions, each with the runtime's
//! one-line message: a refused setting is a `ValueError` naming the Python
//! argument, a model that does not load a `LoadError`.

use hamburger::{Param, ParamError};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyErr;
use server::scheduler::StartError;

pyo3::create_exception!(
    _native,
    LoadError,
    PyRuntimeError,
    "The model could not be loaded: not a HAMburger or llama GGUF, a damaged file, or settings it cannot take."
);

/// The `Llama` argument that sets the library's parameter `p`.
fn argument(p: Param) -> &'static str {
    match p {
        Param::NSeq => "n_parallel",
        Param::Temp => "temperature",
        Param::NPredict => "max_tokens",
        p => p.name(),
    }
}

/// `e` in one line, its causes after it.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        cause = c.source();
    }
    line
}

/// A refused setting, named by its Python argument.
pub fn param(e: &ParamError) -> PyErr {
    PyValueError::new_err(e.naming(|p| argument(p).to_string()))
}

/// Why the engine did not start: a refused setting (`ValueError`) or a
/// model that does not load (`LoadError`).
pub fn start(e: &StartError) -> PyErr {
    match e {
        StartError::Open(hamburger::Error::Param(p)) | StartError::Model(_, hamburger::Error::Param(p)) => param(p),
        e => LoadError::new_err(one_line(e)),
    }
}

//! Waiting for the engine thread with the GIL released: other Python
//! threads run meanwhile, and every tenth of a second the wait checks for
//! signals, so that Ctrl-C (KeyboardInterrupt) ends it.

use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::sync::mpsc::Receiver;

/// How often a wait looks at Python's signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The next item of `rx`, or `None` once its sender is gone. A pending
/// signal's exception is raised instead: the caller drops what it waits for,
/// which cancels the generation.
pub fn next<T: Send>(py: Python<'_>, rt: &tokio::runtime::Handle, rx: &mut Receiver<T>) -> PyResult<Option<T>> {
    loop {
        let got = py.detach(|| rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, rx.recv()).await }));
        match got {
            Ok(item) => return Ok(item),
            Err(_elapsed) => py.check_signals()?,
        }
    }
}

/// The one item `rx` is sent, as [`next`] waits for it.
///
/// # Errors
/// A signal's exception, or a `RuntimeError` when the sender went away
/// without an answer (the engine thread stopped).
pub fn one<T: Send>(py: Python<'_>, rt: &tokio::runtime::Handle, rx: &mut Receiver<T>) -> PyResult<T> {
    next(py, rt, rx)?.ok_or_else(|| PyRuntimeError::new_err("the engine stopped before it answered"))
}

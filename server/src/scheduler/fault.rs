//! Fault injection for the engine thread's tests (compiled in tests only):
//! a request whose prompt is the injected one panics when the engine thread
//! turns its tokens into text, so a test can check that it fails alone.

use std::sync::Mutex;

/// The prompt whose request panics.
static INJECTED: Mutex<Option<Vec<u32>>> = Mutex::new(None);

/// Makes the request of `prompt` panic on the engine thread.
pub(crate) fn inject_panic(prompt: Vec<u32>) {
    *INJECTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(prompt);
}

/// Panics when `prompt` is the injected one.
pub(super) fn panic_if_injected(prompt: &[u32]) {
    let injected = INJECTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if injected.as_deref() == Some(prompt) {
        panic!("injected fault");
    }
}

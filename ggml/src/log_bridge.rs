//! Routes ggml's and libllama's log output into the `log` crate and keeps
//! the last error line so that a failed call can say why.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

use crate::sys;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
    static PARTIAL: RefCell<String> = const { RefCell::new(String::new()) };
}

extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated string that lives for the duration of the call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    // ggml emits a line in pieces (and GGML_LOG_LEVEL_CONT continues the last one):
    // gather until a newline so each record is a whole line.
    let line = PARTIAL.with(|p| {
        let mut p = p.borrow_mut();
        p.push_str(&text);
        if p.ends_with('\n') {
            Some(std::mem::take(&mut *p))
        } else {
            None
        }
    });
    let Some(line) = line else { return };
    let line = line.trim_end();
    match level {
        sys::GGML_LOG_LEVEL_ERROR => {
            LAST_ERROR.with(|e| *e.borrow_mut() = line.to_string());
            log::error!(target: "ggml", "{line}");
        }
        sys::GGML_LOG_LEVEL_WARN => log::warn!(target: "ggml", "{line}"),
        sys::GGML_LOG_LEVEL_INFO => log::debug!(target: "ggml", "{line}"),
        _ => log::trace!(target: "ggml", "{line}"),
    }
}

/// Installs the log bridge (idempotent). Every constructor of this crate calls
/// it, so callers only need it to silence logs before their first ggml call.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the callback is a plain `extern "C"` function valid for the whole
        // program; a null user pointer is allowed.
        unsafe {
            sys::ggml_log_set(Some(log_callback), std::ptr::null_mut());
            sys::llama_log_set(Some(log_callback), std::ptr::null_mut());
        }
    });
}

/// Clears the remembered error line before a call whose failure we want to explain.
pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|e| e.borrow_mut().clear());
}

/// The last error line ggml logged on this thread, without its `function: ` prefix.
pub(crate) fn last_error() -> Option<String> {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if e.is_empty() {
            return None;
        }
        let msg = match e.split_once(": ") {
            Some((func, rest)) if !func.contains(' ') => rest,
            _ => e.as_str(),
        };
        Some(msg.to_string())
    })
}

//! Routes ggml's and libllama's log output into the `log` crate and keeps
//! the last error line so that a failed call can say why.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

use crate::sys;

thread_local! {
    /// Error lines gathered while a caller is capturing (`Some`), to be folded
    /// into that caller's error value instead of being logged.
    static CAPTURED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
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
            let captured = CAPTURED.with(|c| c.borrow_mut().as_mut().map(|v| v.push(strip_function(line))).is_some());
            if captured {
                log::debug!(target: "ggml", "{line}");
            } else {
                log::error!(target: "ggml", "{line}");
            }
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

/// Runs `f` (a ggml call that may fail) while gathering the error lines ggml
/// logs on this thread; returns its result and those lines joined with `; `
/// (most specific first), if any. The lines are logged at debug level only,
/// since the caller reports them in its error value.
pub(crate) fn capture_errors<T>(f: impl FnOnce() -> T) -> (T, Option<String>) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let lines = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, (!lines.is_empty()).then(|| lines.join("; ")))
}

/// Drops ggml's `function_name: ` prefix.
fn strip_function(line: &str) -> String {
    match line.split_once(": ") {
        Some((func, rest)) if !func.contains(' ') => rest.to_string(),
        _ => line.to_string(),
    }
}

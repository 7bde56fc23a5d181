//! What happens when ggml gives up: `GGML_ABORT` and `GGML_ASSERT` end the
//! process. The checks of this project stop every input we know of before it
//! reaches one, but some conditions only ggml sees (an RPC server that dies
//! mid-generation, a device that fails). A tool installs
//! [`exit_on_ggml_abort`] so that those, too, end in one line on stderr and
//! exit status 1 instead of an abort with a backtrace.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use crate::sys;

/// The program name the one-line message starts with.
static PROGRAM: OnceLock<String> = OnceLock::new();

extern "C" fn on_abort(message: *const c_char) {
    let text = if message.is_null() {
        String::from("ggml aborted")
    } else {
        // SAFETY: ggml passes a NUL-terminated message buffer alive for the call.
        unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
    };
    // "file:line: reason": the reason is what a user can act on.
    let reason = text.split_once(": ").map_or(text.as_str(), |(_, r)| r).trim().replace('\n', " ");
    let program = PROGRAM.get().map_or("hamburger", String::as_str);
    eprintln!("{program}: error: ggml: {reason}");
    std::process::exit(1);
}

/// Makes a ggml abort print `PROGRAM: error: ggml: REASON` and exit with
/// status 1 (the first call's `program` is kept).
pub fn exit_on_ggml_abort(program: &str) {
    let _ = PROGRAM.set(program.to_string());
    // SAFETY: the callback is a plain `extern "C"` function valid for the whole program.
    unsafe { sys::ggml_set_abort_callback(Some(on_abort)) };
}

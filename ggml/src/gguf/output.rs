//! Keeping output files safe: an output may not replace one of the inputs,
//! and the partial files of interrupted writes can be removed from a signal
//! handler (a SIGINT or SIGTERM ends the program without running destructors).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{Error, Result};

/// The partial files being written now (see [`remove_partial_files`]).
static PARTIAL: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers a partial file for as long as it lives.
pub(super) struct PartialFile(PathBuf);

impl PartialFile {
    /// Registers `path`.
    pub(super) fn new(path: &Path) -> PartialFile {
        PARTIAL.lock().unwrap_or_else(|e| e.into_inner()).push(path.to_path_buf());
        PartialFile(path.to_path_buf())
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        PARTIAL.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| *p != self.0);
    }
}

/// Deletes every partial GGUF file being written. Tools call it from their
/// SIGINT/SIGTERM handler just before exiting, so an interrupted conversion or
/// quantization leaves no `.part` file behind.
pub fn remove_partial_files() {
    for p in PARTIAL.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Refuses to write `out` when it is one of `inputs` (the same file under any
/// name): the finished output would replace the file it is made from.
///
/// # Errors
/// Naming both paths.
pub fn refuse_overwriting_inputs<'a>(out: &Path, inputs: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    let Ok(out_id) = file_id(out) else { return Ok(()) };
    for input in inputs {
        if file_id(input).is_ok_and(|id| id == out_id) {
            return Err(Error::Invalid(format!(
                "the output {} is the input {}: refusing to overwrite it",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// What makes two paths the same file: device and inode on Unix, the
/// canonical path elsewhere.
#[cfg(unix)]
fn file_id(p: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(p: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(p)
}

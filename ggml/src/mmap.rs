//! Read-only memory maps of model files.

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A whole file mapped read-only into memory.
pub struct MappedFile {
    map: memmap2::Mmap,
    path: PathBuf,
}

impl MappedFile {
    /// Maps `path`.
    ///
    /// # Errors
    /// When the file cannot be opened or mapped.
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only. Model files are treated as immutable while
        // in use (as llama.cpp does); truncating one under a running process is
        // outside what any mmap-based loader can defend against.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile { map, path: path.to_path_buf() })
    }

    /// Tells the kernel the pages of `range` will not be needed soon, so they
    /// stop counting towards this process's memory (a later read pages them in
    /// again). Converters call it after each chunk to keep their footprint flat.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let page = 4096;
        let start = range.start.next_multiple_of(page);
        let end = range.end.min(self.map.len()) / page * page;
        if end > start {
            // SAFETY: the mapping is read-only and backed by the file, so dropping
            // its pages loses nothing: a later access reads them from the file again.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    /// The mapped file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

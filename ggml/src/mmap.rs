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

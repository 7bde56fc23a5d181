//! What the fuzz targets share: a scratch directory for inputs that the code
//! under test reads from a path, the fixture the tokenizer target uses (the
//! test crate's), and small valid files to start from.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// This process's scratch directory (removed at exit by the OS's temp cleaner
/// only; libFuzzer never returns normally).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a scratch directory")).path()
}

/// Writes `data` to `name` in the scratch directory and returns its path.
pub fn scratch(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch_dir().join(name);
    std::fs::write(&p, data).expect("scratch file written");
    p
}

pub use testing::testmodel::tiny_fixture;

/// The tiny fixture's vocabulary size.
pub const TINY_VOCAB: usize = 512;

/// Opens a checkpoint as the converter does and reads the first elements of
/// every tensor whose dtype it converts.
pub fn read_checkpoint(path: &Path) {
    let Ok(ck) = convert::checkpoint::Checkpoint::open(path) else { return };
    for t in ck.tensors.values() {
        if t.dtype.is_ok() {
            ck.read_f32(t, 0, t.n_elements().min(4));
        }
    }
}

/// The shard an index target's JSON may name: `model-00001-of-00001.safetensors`
/// with one F32 tensor `w` of shape [2, 2], written once per process.
pub fn shard() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        std::fs::write(scratch_dir().join(SHARD), small_safetensors()).expect("shard written");
    });
}

/// The shard's file name.
pub const SHARD: &str = "model-00001-of-00001.safetensors";

/// A small valid safetensors file: `w` (F32 [2, 2]) and `b` (BF16 [3]).
pub fn small_safetensors() -> Vec<u8> {
    use safetensors::tensor::TensorView;
    let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let b = vec![0x80u8, 0x3f, 0, 0x40, 0x40, 0x40];
    let views = vec![
        ("w", TensorView::new(safetensors::Dtype::F32, vec![2, 2], &w).expect("view")),
        ("b", TensorView::new(safetensors::Dtype::BF16, vec![3], &b).expect("view")),
    ];
    safetensors::serialize(views, None).expect("serialized")
}

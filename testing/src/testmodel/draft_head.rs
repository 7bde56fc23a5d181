//! A checkpoint with a draft head (`draft_head.*`, the GGUF's `draft.blk.N.*`
//! and `draft_stop.*`), as `hamburger-train draft` writes one: another
//! checkpoint's macro micro decoder and stop head, beside the first's own;
//! and, as `draft --copy M` writes one, a copy matrix (`draft_head.copy.weight`).

use std::io::Read;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use convert::ConvertError;

/// A draft head's copy matrix: `[dim, longest * dim]` values, row-major
/// (PyTorch's `nn.Linear(longest * dim, dim).weight`).
pub struct CopyMatrix {
    /// The embedding width D.
    pub dim: usize,
    /// The longest n-gram copied from (M).
    pub longest: usize,
    /// `dim * longest * dim` values.
    pub values: Vec<f32>,
}

impl CopyMatrix {
    /// A matrix of `dim` and `longest` whose entries are `f(i)` in order.
    pub fn from_fn(dim: usize, longest: usize, f: impl Fn(usize) -> f32) -> CopyMatrix {
        CopyMatrix { dim, longest, values: (0..dim * longest * dim).map(f).collect() }
    }
}

/// Writes into `dir` the checkpoint `ck` (linked, not copied) with a draft
/// head copied from `head`'s micro decoder and stop head, and `copy` as its
/// copy matrix when given: a second shard beside `ck`'s
/// `model.safetensors`, through a safetensors index. Returns the
/// checkpoint directory.
///
/// # Errors
/// When a file cannot be read or written, or `head` has no micro decoder.
pub fn with_draft_head(dir: &Path, ck: &Path, head: &Path, copy: Option<&CopyMatrix>) -> Result<PathBuf, ConvertError> {
    let src = dir.join("ck");
    std::fs::create_dir_all(&src).map_err(io(&src))?;
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "hamburger.json", "model.safetensors"] {
        std::os::unix::fs::symlink(ck.join(f), src.join(f)).map_err(io(&src.join(f)))?;
    }
    let head_file = head.join("model.safetensors");
    let bytes = std::fs::read(&head_file).map_err(io(&head_file))?;
    let bad = |e: &dyn std::fmt::Display| ConvertError::io(&head_file, std::io::Error::other(e.to_string()));
    let head_st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(&e))?;
    let mut draft: Vec<(String, TensorView)> = head_st
        .tensors()
        .into_iter()
        .filter_map(|(k, t)| Some((format!("draft_head.{}", k.strip_prefix("micro_step_decoder.")?), t)))
        .collect();
    if draft.is_empty() {
        return Err(bad(&"no micro_step_decoder.* tensors"));
    }
    let copy_bytes: Vec<u8> = copy.map(|c| c.values.iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap_or_default();
    if let Some(c) = copy {
        let view = TensorView::new(Dtype::F32, vec![c.dim, c.longest * c.dim], &copy_bytes).map_err(|e| bad(&e))?;
        draft.push(("draft_head.copy.weight".into(), view));
    }
    let shard = src.join("draft.safetensors");
    let data = safetensors::serialize(draft.clone(), None).map_err(|e| bad(&e))?;
    std::fs::write(&shard, data).map_err(io(&shard))?;
    let mut map = serde_json::Map::new();
    for k in tensor_names(&ck.join("model.safetensors"))? {
        map.insert(k, "model.safetensors".into());
    }
    for (k, _) in &draft {
        map.insert(k.clone(), "draft.safetensors".into());
    }
    let index = src.join("model.safetensors.index.json");
    let json = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(&index, json.to_string()).map_err(io(&index))?;
    Ok(src)
}

/// An I/O error's conversion, naming `p`.
fn io(p: &Path) -> impl Fn(std::io::Error) -> ConvertError + '_ {
    move |e| ConvertError::io(p, e)
}

/// The tensor names of a safetensors file, from its header.
fn tensor_names(path: &Path) -> Result<Vec<String>, ConvertError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(io(path))?;
    let mut header = vec![0u8; u64::from_le_bytes(n) as usize];
    f.read_exact(&mut header).map_err(io(path))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| io(path)(std::io::Error::other(e)))?;
    Ok(header.into_iter().map(|(k, _)| k).filter(|k| k != "__metadata__").collect())
}

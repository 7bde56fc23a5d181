//! Writes a checkpoint directory: `model.safetensors` streamed one tensor at a
//! time (never the whole model in memory), plus the JSON side files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::bf16;
use serde_json::json;

use convert::checkpoint::SrcDtype;
use convert::ConvertError;

/// Streams `model.safetensors` into a directory: declare every tensor first
/// (the header holds all offsets), then write their data in order.
pub struct CheckpointWriter {
    path: PathBuf,
    dtype: SrcDtype,
    tensors: Vec<(String, Vec<usize>)>,
}

impl CheckpointWriter {
    /// A writer of `dir/model.safetensors` storing `dtype` (F32 or BF16).
    pub fn new(dir: &Path, dtype: SrcDtype) -> CheckpointWriter {
        CheckpointWriter { path: dir.join("model.safetensors"), dtype, tensors: Vec::new() }
    }

    /// Declares a tensor (PyTorch shape order).
    pub fn declare(&mut self, name: &str, shape: &[usize]) {
        self.tensors.push((name.to_string(), shape.to_vec()));
    }

    /// Writes the header, then asks `data(i)` for each declared tensor's values in order.
    ///
    /// # Errors
    /// On I/O errors or when `data` fails or returns the wrong length.
    pub fn write(self, mut data: impl FnMut(usize) -> Result<Vec<f32>, ConvertError>) -> Result<(), ConvertError> {
        let esize = self.dtype.size();
        let (st_dtype, mut offset) = (if self.dtype == SrcDtype::BF16 { "BF16" } else { "F32" }, 0usize);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        for (name, shape) in &self.tensors {
            let n: usize = shape.iter().product::<usize>() * esize;
            header
                .insert(name.clone(), json!({"dtype": st_dtype, "shape": shape, "data_offsets": [offset, offset + n]}));
            offset += n;
        }
        let mut text = serde_json::to_string(&header).expect("JSON of plain values");
        while !text.len().is_multiple_of(8) {
            text.push(' ');
        }
        let io = |e| ConvertError::io(&self.path, e);
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&self.path).map_err(io)?);
        out.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
        out.write_all(text.as_bytes()).map_err(io)?;
        for (i, (name, shape)) in self.tensors.iter().enumerate() {
            let values = data(i)?;
            if values.len() != shape.iter().product::<usize>() {
                return Err(ConvertError::Tensor { name: name.clone(), msg: "wrong number of values".into() });
            }
            let bytes: Vec<u8> = match self.dtype {
                SrcDtype::BF16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
                _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            out.write_all(&bytes).map_err(io)?;
        }
        out.flush().map_err(io)
    }
}

/// Writes `value` as pretty JSON to `dir/name`.
///
/// # Errors
/// On I/O errors.
pub fn write_json(dir: &Path, name: &str, value: &serde_json::Value) -> Result<(), ConvertError> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON of plain values");
    std::fs::write(&path, text).map_err(|e| ConvertError::io(&path, e))
}

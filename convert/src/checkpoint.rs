//! Tensor sources: a Lightning/torch `.ckpt` (zip + pickle), a `.safetensors`
//! file, or a directory with `model.safetensors` or a sharded index. Files are
//! memory-mapped; tensors are byte ranges of the maps, never copied up front.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ggml::MappedFile;
use half::{bf16, f16};

use crate::pickle::{self, StorageDtype, Value};
use crate::ConvertError;

/// Element type of a source tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcDtype {
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16
    BF16,
    /// float64
    F64,
}

impl SrcDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            SrcDtype::F32 => 4,
            SrcDtype::F16 | SrcDtype::BF16 => 2,
            SrcDtype::F64 => 8,
        }
    }
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// Element type, or the name of an unusable (integer, unknown) one.
    pub dtype: Result<SrcDtype, String>,
    /// Shape (PyTorch order: the last dimension is contiguous).
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    len: usize,
}

impl SourceTensor {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether `other` is the same bytes (an alias such as a tied lm_head).
    pub fn same_data(&self, other: &SourceTensor) -> bool {
        self.file == other.file && self.start == other.start && self.len == other.len
    }
}

/// A checkpoint's tensors and the hyper-parameters it stores.
pub struct Checkpoint {
    /// The file or directory given.
    pub path: PathBuf,
    maps: Vec<MappedFile>,
    /// Tensors by their state-dict name.
    pub tensors: BTreeMap<String, SourceTensor>,
    /// `hyper_parameters.max_steps` of a Lightning checkpoint.
    pub max_steps: Option<usize>,
    /// `hyper_parameters.base_model_name` of a Lightning checkpoint.
    pub base_model_name: Option<String>,
}

impl Checkpoint {
    /// Opens a `.ckpt`/`.pt`/`.pth`, `.safetensors`, `model.safetensors.index.json`,
    /// or a directory holding one of the latter.
    ///
    /// # Errors
    /// When the file is missing, not of a known format, or malformed.
    pub fn open(path: &Path) -> Result<Checkpoint, ConvertError> {
        let mut ck = Checkpoint {
            path: path.to_path_buf(),
            maps: Vec::new(),
            tensors: BTreeMap::new(),
            max_steps: None,
            base_model_name: None,
        };
        if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            let single = path.join("model.safetensors");
            if index.exists() {
                ck.load_index(&index)?;
            } else if single.exists() {
                ck.load_safetensors(&single)?;
            } else {
                return Err(
                    ck.error("directory holds neither model.safetensors nor model.safetensors.index.json".to_string())
                );
            }
            return Ok(ck);
        }
        let map = MappedFile::open(path)?;
        if map.starts_with(b"PK\x03\x04") {
            ck.maps.push(map);
            ck.load_torch_zip()?;
        } else if path.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".index.json")) {
            ck.load_index(path)?;
        } else if path.extension().is_some_and(|e| e == "safetensors") {
            ck.load_safetensors(path)?;
        } else {
            return Err(
                ck.error("not a torch zip checkpoint (.ckpt/.pt), .safetensors file, or safetensors index".into())
            );
        }
        Ok(ck)
    }

    /// Adds the tensors of a second `.safetensors` file, one that no index
    /// lists (a draft head shipped beside the grafted modules, say); a
    /// tensor both hold is refused, naming it.
    ///
    /// # Errors
    /// When the file is not a readable safetensors file or repeats a tensor.
    pub fn add_safetensors(&mut self, path: &Path) -> Result<(), ConvertError> {
        if path.extension().is_none_or(|e| e != "safetensors") {
            return Err(ConvertError::Checkpoint { path: path.into(), msg: "not a .safetensors file".into() });
        }
        self.load_safetensors(path)
    }

    fn error(&self, msg: String) -> ConvertError {
        ConvertError::Checkpoint { path: self.path.clone(), msg }
    }

    fn load_index(&mut self, index: &Path) -> Result<(), ConvertError> {
        let text = std::fs::read_to_string(index).map_err(|e| ConvertError::io(index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ConvertError::Checkpoint { path: index.into(), msg: format!("invalid JSON: {e}") })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ConvertError::Checkpoint { path: index.into(), msg: "no weight_map".into() })?;
        let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
        shards.sort();
        shards.dedup();
        let dir = index.parent().unwrap_or(Path::new("."));
        for shard in shards {
            if shard.contains("..") || Path::new(shard).is_absolute() {
                return Err(ConvertError::Checkpoint {
                    path: index.into(),
                    msg: format!("shard path {shard} leaves the directory"),
                });
            }
            self.load_safetensors(&dir.join(shard))?;
        }
        Ok(())
    }

    fn load_safetensors(&mut self, path: &Path) -> Result<(), ConvertError> {
        let map = MappedFile::open(path)?;
        let bad = |msg: String| ConvertError::Checkpoint { path: path.into(), msg };
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map[..])
            .map_err(|e| bad(format!("invalid safetensors file: {e}")))?;
        let data_start = 8 + header_len;
        let file = self.maps.len();
        for (name, info) in meta.tensors() {
            let dtype = match info.dtype {
                safetensors::Dtype::F32 => Ok(SrcDtype::F32),
                safetensors::Dtype::F16 => Ok(SrcDtype::F16),
                safetensors::Dtype::BF16 => Ok(SrcDtype::BF16),
                safetensors::Dtype::F64 => Ok(SrcDtype::F64),
                other => Err(format!("{other:?}")),
            };
            let (begin, end) = info.data_offsets;
            let start = data_start + begin;
            if data_start + end > map.len() {
                return Err(bad(format!("tensor {name} extends past the end of the file")));
            }
            if self.tensors.contains_key(&name) {
                return Err(bad(format!("tensor {name} appears in two shards")));
            }
            self.tensors.insert(name, SourceTensor { dtype, shape: info.shape.clone(), file, start, len: end - begin });
        }
        self.maps.push(map);
        Ok(())
    }

    fn load_torch_zip(&mut self) -> Result<(), ConvertError> {
        let bytes: &[u8] = &self.maps[0];
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
            .map_err(|e| self.error(format!("invalid zip archive (truncated?): {e}")))?;
        let names: Vec<String> = zip.file_names().filter_map(|n| n.ok().map(|n| n.into_owned())).collect();
        let pkl = names
            .iter()
            .find(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
            .ok_or_else(|| self.error("no data.pkl in the archive (not a torch checkpoint)".into()))?
            .clone();
        let prefix = pkl.trim_end_matches("data.pkl").to_string();
        if let Ok(f) = zip.by_name(&format!("{prefix}byteorder")) {
            // "little" or "big"; a hostile entry may claim (or inflate to) gigabytes.
            let mut order = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(f, 16), &mut order).ok();
            if order.trim() == "big" {
                return Err(self.error("big-endian checkpoints are not supported".into()));
            }
        }
        // Locate every stored entry's bytes inside the map.
        let mut entries: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for i in 0..zip.len() {
            let f = zip.by_index_raw(i).map_err(|e| self.error(format!("zip entry {i}: {e}")))?;
            let name = f.name().map(|n| n.into_owned()).unwrap_or_default();
            let start = f.data_start().ok_or_else(|| self.error(format!("zip entry {name} has no data offset")))?;
            let stored = f.compression() == zip::CompressionMethod::Stored;
            let (start, size) = (start as usize, f.compressed_size() as usize);
            if start.checked_add(size).is_none_or(|e| e > bytes.len()) {
                return Err(self.error(format!("zip entry {name} extends past the end of the file")));
            }
            if stored {
                entries.insert(name, (start, size));
            }
        }
        let &(pkl_start, pkl_len) =
            entries.get(&pkl).ok_or_else(|| self.error("data.pkl is compressed (not written by torch.save)".into()))?;
        let unpickled = pickle::unpickle(&bytes[pkl_start..pkl_start + pkl_len], pickle::torch_storage)
            .map_err(|e| self.error(e.to_string()))?;
        let root = &unpickled.root;

        if let Some(hp) = root.get("hyper_parameters") {
            if let Some(Value::Int(s)) = hp.get("max_steps") {
                self.max_steps = usize::try_from(s).ok();
            }
            if let Some(Value::Str(s)) = hp.get("base_model_name") {
                self.base_model_name = Some(s.to_string());
            }
        }
        let state = match root.get("state_dict") {
            Some(sd) => sd,
            None if root.dict_entries().is_some() => root.clone(),
            None => return Err(self.error(format!("top level is a {}, not a dict", root.describe()))),
        };
        let entries_of_state = state
            .dict_entries()
            .ok_or_else(|| self.error(format!("state_dict is a {}, not a dict", state.describe())))?;
        for (key, value) in entries_of_state {
            let Value::Str(name) = key else { continue };
            let Value::Tensor(t) = value else {
                log::debug!("ignoring non-tensor state-dict entry {name}");
                continue;
            };
            let entry = format!("{prefix}data/{}", t.storage.key);
            let &(start, size) = entries
                .get(&entry)
                .ok_or_else(|| self.error(format!("tensor {name}: storage {entry} is missing or compressed")))?;
            let src = self.torch_tensor(&name, &t, start, size)?;
            self.tensors.insert(name.to_string(), src);
        }
        Ok(())
    }

    fn torch_tensor(
        &self,
        name: &str,
        t: &Rc<pickle::TensorRef>,
        start: usize,
        size: usize,
    ) -> Result<SourceTensor, ConvertError> {
        let esize = t.storage.dtype.size();
        let dtype = match t.storage.dtype {
            StorageDtype::F32 => Ok(SrcDtype::F32),
            StorageDtype::F16 => Ok(SrcDtype::F16),
            StorageDtype::BF16 => Ok(SrcDtype::BF16),
            StorageDtype::F64 => Ok(SrcDtype::F64),
            StorageDtype::Other(n) => Err(n.to_string()),
        };
        // Contiguous row-major only (what torch.save writes for parameters).
        let mut expect = 1usize;
        for (&dim, &stride) in t.shape.iter().zip(&t.stride).rev() {
            if dim != 1 && stride != expect {
                return Err(self.error(format!("tensor {name} is not contiguous (strides {:?})", t.stride)));
            }
            expect = expect.saturating_mul(dim);
        }
        let numel: usize = t
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| self.error(format!("tensor {name} has an overflowing shape")))?;
        let end = t.offset.checked_add(numel).filter(|&e| e <= t.storage.numel);
        let bytes_end = end.and_then(|e| e.checked_mul(esize)).filter(|&b| b <= size);
        if bytes_end.is_none() {
            return Err(self.error(format!(
                "tensor {name} ({numel} elements at {}) lies outside its storage of {} bytes: truncated?",
                t.offset, size
            )));
        }
        Ok(SourceTensor { dtype, shape: t.shape.clone(), file: 0, start: start + t.offset * esize, len: numel * esize })
    }

    /// The files the tensors are read from.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.maps.iter().map(MappedFile::path)
    }

    /// The raw bytes of `t`.
    pub fn bytes(&self, t: &SourceTensor) -> &[u8] {
        &self.maps[t.file][t.start..t.start + t.len]
    }

    /// Lets the pages of elements `[begin, end)` of `t` go (see [`MappedFile::release`]).
    pub fn release(&self, t: &SourceTensor, begin: usize, end: usize) {
        if let Ok(d) = t.dtype {
            self.maps[t.file].release(t.start + begin * d.size()..t.start + end * d.size());
        }
    }

    /// Elements `[begin, end)` of `t` converted to f32.
    ///
    /// # Panics
    /// When `t` has an unusable dtype (callers check `t.dtype` first) or the range is out of bounds.
    pub fn read_f32(&self, t: &SourceTensor, begin: usize, end: usize) -> Vec<f32> {
        let dtype = t.dtype.clone().expect("dtype checked by the caller");
        let s = dtype.size();
        let b = &self.bytes(t)[begin * s..end * s];
        match dtype {
            SrcDtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            SrcDtype::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            SrcDtype::BF16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            SrcDtype::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        }
    }
}

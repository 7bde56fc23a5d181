//! GGUF files: reading metadata and tensor directory (through ggml's own
//! parser, which bounds every length by the bytes left in the file) and writing
//! new files by streaming tensor data after ggml-built metadata.

mod output;
mod write;

use std::ffi::{CStr, CString};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::log_bridge::capture_errors;
use crate::{sys, Error, Result, Type};

pub use output::{refuse_overwriting_inputs, remove_partial_files};
pub use write::{GgufBuilder, GgufWriter};

/// An array value of GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
        }
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as i64 when the array holds integers.
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Array),
}

impl Value {
    /// The value as an integer, for any integer type.
    pub fn as_int(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(x) => x as i64,
            Value::I8(x) => x as i64,
            Value::U16(x) => x as i64,
            Value::I16(x) => x as i64,
            Value::U32(x) => x as i64,
            Value::I32(x) => x as i64,
            Value::U64(x) => x as i64,
            Value::I64(x) => x,
            _ => return None,
        })
    }

    /// The value as a float, for float types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x as f64),
            Value::F64(x) => Some(x),
            _ => None,
        }
    }

    /// The type and value, shortened, for error messages (`u64 18446744073709551615`,
    /// `string "abc"`, `array of 3`).
    pub fn describe(&self) -> String {
        let value = match self {
            Value::U64(x) => x.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Str(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
            Value::Array(a) => return format!("an array of {}", a.len()),
            v => match (v.as_int(), v.as_f64()) {
                (Some(i), _) => i.to_string(),
                (_, Some(f)) => f.to_string(),
                _ => String::new(),
            },
        };
        format!("{} {value}", self.type_name())
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One tensor of a GGUF file's directory.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub ty: Type,
    /// Shape in ggml order, padded with 1s.
    pub ne: [i64; 4],
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> i64 {
        self.ne.iter().product()
    }
}

/// The metadata and tensor directory of a GGUF file (tensor data stays on disk).
#[derive(Debug, Clone)]
pub struct Gguf {
    /// The file.
    pub path: PathBuf,
    /// Format version.
    pub version: u32,
    /// Data alignment.
    pub alignment: usize,
    /// Key/value metadata in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor directory in file order.
    pub tensors: Vec<TensorInfo>,
    /// File length in bytes.
    pub file_len: u64,
}

struct GgufCtx(NonNull<sys::gguf_context>);

impl Drop for GgufCtx {
    fn drop(&mut self) {
        // SAFETY: freed once.
        unsafe { sys::gguf_free(self.0.as_ptr()) }
    }
}

fn read_array(ctx: *const sys::gguf_context, id: i64) -> Result<Array, String> {
    // SAFETY: for the whole block, `id` is a valid key index of a live context whose
    // value is an array; gguf_get_arr_data returns `n` elements of the array type.
    unsafe {
        let n = sys::gguf_get_arr_n(ctx, id);
        let ty = sys::gguf_get_arr_type(ctx, id);
        macro_rules! slice {
            ($t:ty) => {
                std::slice::from_raw_parts(sys::gguf_get_arr_data(ctx, id) as *const $t, n).to_vec()
            };
        }
        Ok(match ty {
            sys::GGUF_TYPE_UINT8 => Array::U8(slice!(u8)),
            sys::GGUF_TYPE_INT8 => Array::I8(slice!(i8)),
            sys::GGUF_TYPE_UINT16 => Array::U16(slice!(u16)),
            sys::GGUF_TYPE_INT16 => Array::I16(slice!(i16)),
            sys::GGUF_TYPE_UINT32 => Array::U32(slice!(u32)),
            sys::GGUF_TYPE_INT32 => Array::I32(slice!(i32)),
            sys::GGUF_TYPE_UINT64 => Array::U64(slice!(u64)),
            sys::GGUF_TYPE_INT64 => Array::I64(slice!(i64)),
            sys::GGUF_TYPE_FLOAT32 => Array::F32(slice!(f32)),
            sys::GGUF_TYPE_FLOAT64 => Array::F64(slice!(f64)),
            sys::GGUF_TYPE_BOOL => Array::Bool(slice!(u8).into_iter().map(|b| b != 0).collect()),
            sys::GGUF_TYPE_STRING => Array::Str(
                (0..n)
                    .map(|i| CStr::from_ptr(sys::gguf_get_arr_str(ctx, id, i)).to_string_lossy().into_owned())
                    .collect(),
            ),
            other => return Err(format!("unsupported array element type {other}")),
        })
    }
}

fn read_value(ctx: *const sys::gguf_context, id: i64) -> Result<Value, String> {
    // SAFETY: for the whole block, `id` is a valid key index; each getter matches the stored type.
    unsafe {
        Ok(match sys::gguf_get_kv_type(ctx, id) {
            sys::GGUF_TYPE_UINT8 => Value::U8(sys::gguf_get_val_u8(ctx, id)),
            sys::GGUF_TYPE_INT8 => Value::I8(sys::gguf_get_val_i8(ctx, id)),
            sys::GGUF_TYPE_UINT16 => Value::U16(sys::gguf_get_val_u16(ctx, id)),
            sys::GGUF_TYPE_INT16 => Value::I16(sys::gguf_get_val_i16(ctx, id)),
            sys::GGUF_TYPE_UINT32 => Value::U32(sys::gguf_get_val_u32(ctx, id)),
            sys::GGUF_TYPE_INT32 => Value::I32(sys::gguf_get_val_i32(ctx, id)),
            sys::GGUF_TYPE_UINT64 => Value::U64(sys::gguf_get_val_u64(ctx, id)),
            sys::GGUF_TYPE_INT64 => Value::I64(sys::gguf_get_val_i64(ctx, id)),
            sys::GGUF_TYPE_FLOAT32 => Value::F32(sys::gguf_get_val_f32(ctx, id)),
            sys::GGUF_TYPE_FLOAT64 => Value::F64(sys::gguf_get_val_f64(ctx, id)),
            sys::GGUF_TYPE_BOOL => Value::Bool(sys::gguf_get_val_bool(ctx, id)),
            sys::GGUF_TYPE_STRING => {
                Value::Str(CStr::from_ptr(sys::gguf_get_val_str(ctx, id)).to_string_lossy().into_owned())
            }
            sys::GGUF_TYPE_ARRAY => Value::Array(read_array(ctx, id)?),
            other => return Err(format!("unsupported value type {other}")),
        })
    }
}

impl Gguf {
    /// Reads the metadata and tensor directory of `path`, and checks that every
    /// tensor's data lies inside the file.
    ///
    /// # Errors
    /// When the file cannot be opened, is not GGUF, is truncated or malformed
    /// (ggml's reason is included), or uses a tensor type this build does not know.
    pub fn open(path: &Path) -> Result<Gguf> {
        crate::init_logging();
        let bad = |reason: String| Error::GgufRead { path: path.to_path_buf(), reason };
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            return Err(bad("it is a directory; give the .gguf file inside it".into()));
        }
        let file_len = meta.len();
        File::open(path).map_err(|e| Error::io(path, e))?;
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| bad("path contains NUL".into()))?;
        let params = sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
        // SAFETY: cpath is NUL-terminated; with ctx null no tensor data is loaded.
        let (raw, why) = capture_errors(|| unsafe { sys::gguf_init_from_file(cpath.as_ptr(), params) });
        let ctx = GgufCtx(NonNull::new(raw).ok_or_else(|| bad(why.unwrap_or_else(|| "unreadable header".into())))?);
        let c = ctx.0.as_ptr();
        // SAFETY: c is a live context for all calls below; indices are in range.
        let (version, alignment, data_offset, n_kv, n_tensors) = unsafe {
            (
                sys::gguf_get_version(c),
                sys::gguf_get_alignment(c),
                sys::gguf_get_data_offset(c) as u64,
                sys::gguf_get_n_kv(c),
                sys::gguf_get_n_tensors(c),
            )
        };
        let mut metadata = Vec::with_capacity(n_kv as usize);
        for id in 0..n_kv {
            // SAFETY: valid key index.
            let key = unsafe { CStr::from_ptr(sys::gguf_get_key(c, id)) }.to_string_lossy().into_owned();
            let value = read_value(c, id).map_err(|e| bad(format!("key {key}: {e}")))?;
            metadata.push((key, value));
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for id in 0..n_tensors {
            // SAFETY: valid tensor index; ne points to GGML_MAX_DIMS values.
            let (name, raw_ty, ne, offset, size) = unsafe {
                (
                    CStr::from_ptr(sys::gguf_get_tensor_name(c, id)).to_string_lossy().into_owned(),
                    sys::gguf_get_tensor_type(c, id),
                    *(sys::gguf_get_tensor_ne(c, id) as *const [i64; 4]),
                    sys::gguf_get_tensor_offset(c, id) as u64,
                    sys::gguf_get_tensor_size(c, id) as u64,
                )
            };
            let ty =
                Type::from_raw(raw_ty).ok_or_else(|| bad(format!("tensor {name} has unknown type id {raw_ty}")))?;
            let offset = data_offset + offset;
            if offset.checked_add(size).is_none_or(|end| end > file_len) {
                return Err(bad(format!(
                    "tensor {name} ({size} bytes at offset {offset}) extends past the end of the file ({file_len} bytes): truncated?"
                )));
            }
            tensors.push(TensorInfo { name, ty, ne, offset, size });
        }
        Ok(Gguf { path: path.to_path_buf(), version, alignment, metadata, tensors, file_len })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The string value of `key`, if present.
    ///
    /// # Errors
    /// When the key holds another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(v) => Err(self.type_error(key, "a string", v)),
        }
    }

    /// The value of integer key `key` as a `usize`, if present.
    ///
    /// # Errors
    /// When the key holds another type or a negative value (naming the file and key).
    pub fn get_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int().map(usize::try_from) {
                Some(Ok(n)) => Ok(Some(n)),
                _ => Err(self.type_error(key, "a non-negative integer", v)),
            },
        }
    }

    /// The value of numeric key `key` as an `f64`, if present.
    ///
    /// # Errors
    /// When the key holds another type (naming the file and key).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.type_error(key, "a number", v)),
        }
    }

    /// The value of boolean key `key`, if present.
    ///
    /// # Errors
    /// When the key holds another type (naming the file and key).
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.type_error(key, "a bool", v)),
        }
    }

    /// The value of array key `key`, if present.
    ///
    /// # Errors
    /// When the key holds another type (naming the file and key).
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.type_error(key, "an array", v)),
        }
    }

    /// The error for `key` holding `v` where `expected` was wanted.
    fn type_error(&self, key: &str, expected: &'static str, v: &Value) -> Error {
        Error::GgufType { path: self.path.clone(), key: key.into(), expected, found: v.describe() }
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

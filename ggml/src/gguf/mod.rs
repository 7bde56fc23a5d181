//! GGUF files: reading metadata and tensor directory (through ggml's own
//! parser, which bounds every length by the bytes left in the file) and writing
//! new files by streaming tensor data after ggml-built metadata.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::log_bridge::capture_errors;
use crate::{sys, Context, Error, Result, Type};

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
    // SAFETY (whole function): `id` is a valid key index of a live context whose
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
    // SAFETY (whole function): `id` is a valid key index; each getter matches the stored type.
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
        let file_len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
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
            Some(v) => Err(type_error(key, "string", v)),
        }
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn type_error(key: &str, expected: &'static str, v: &Value) -> Error {
    Error::GgufType { key: key.into(), expected, found: v.type_name().into() }
}

/// Builds the metadata and tensor directory of a new GGUF file.
pub struct GgufBuilder {
    ctx: GgufCtx,
    /// Headers of the tensors added (ggml needs a tensor to describe one).
    headers: Context,
    sizes: Vec<(String, usize)>,
}

impl GgufBuilder {
    /// An empty builder with room for `max_tensors` tensors.
    ///
    /// # Errors
    /// When ggml cannot allocate.
    pub fn new(max_tensors: usize) -> Result<GgufBuilder> {
        crate::init_logging();
        // SAFETY: plain constructor.
        let raw = unsafe { sys::gguf_init_empty() };
        Ok(GgufBuilder {
            ctx: GgufCtx(NonNull::new(raw).ok_or_else(|| Error::Invalid("gguf_init_empty failed".into()))?),
            headers: Context::new(max_tensors.max(1), 0)?,
            sizes: Vec::new(),
        })
    }

    /// Sets `key` to `value` (replacing an earlier value).
    ///
    /// # Errors
    /// When the key or a string contains NUL.
    pub fn set(&mut self, key: &str, value: &Value) -> Result<()> {
        let c = self.ctx.0.as_ptr();
        let k = cstring(key)?;
        let k = k.as_ptr();
        // SAFETY (all arms): c is live; k and strings are NUL-terminated; array data
        // pointers cover `len` elements of the declared gguf type (bools as u8).
        unsafe {
            match value {
                Value::U8(x) => sys::gguf_set_val_u8(c, k, *x),
                Value::I8(x) => sys::gguf_set_val_i8(c, k, *x),
                Value::U16(x) => sys::gguf_set_val_u16(c, k, *x),
                Value::I16(x) => sys::gguf_set_val_i16(c, k, *x),
                Value::U32(x) => sys::gguf_set_val_u32(c, k, *x),
                Value::I32(x) => sys::gguf_set_val_i32(c, k, *x),
                Value::U64(x) => sys::gguf_set_val_u64(c, k, *x),
                Value::I64(x) => sys::gguf_set_val_i64(c, k, *x),
                Value::F32(x) => sys::gguf_set_val_f32(c, k, *x),
                Value::F64(x) => sys::gguf_set_val_f64(c, k, *x),
                Value::Bool(x) => sys::gguf_set_val_bool(c, k, *x),
                Value::Str(s) => sys::gguf_set_val_str(c, k, cstring(s)?.as_ptr()),
                Value::Array(a) => {
                    macro_rules! arr {
                        ($v:expr, $t:ident) => {
                            sys::gguf_set_arr_data(c, k, sys::$t, $v.as_ptr().cast(), $v.len())
                        };
                    }
                    match a {
                        Array::U8(v) => arr!(v, GGUF_TYPE_UINT8),
                        Array::I8(v) => arr!(v, GGUF_TYPE_INT8),
                        Array::U16(v) => arr!(v, GGUF_TYPE_UINT16),
                        Array::I16(v) => arr!(v, GGUF_TYPE_INT16),
                        Array::U32(v) => arr!(v, GGUF_TYPE_UINT32),
                        Array::I32(v) => arr!(v, GGUF_TYPE_INT32),
                        Array::U64(v) => arr!(v, GGUF_TYPE_UINT64),
                        Array::I64(v) => arr!(v, GGUF_TYPE_INT64),
                        Array::F32(v) => arr!(v, GGUF_TYPE_FLOAT32),
                        Array::F64(v) => arr!(v, GGUF_TYPE_FLOAT64),
                        Array::Bool(v) => {
                            let bytes: Vec<u8> = v.iter().map(|&b| b as u8).collect();
                            arr!(bytes, GGUF_TYPE_BOOL)
                        }
                        Array::Str(v) => {
                            let owned = v.iter().map(|s| cstring(s)).collect::<Result<Vec<_>>>()?;
                            let mut ptrs: Vec<*const std::ffi::c_char> = owned.iter().map(|s| s.as_ptr()).collect();
                            sys::gguf_set_arr_str(c, k, ptrs.as_mut_ptr(), ptrs.len())
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Appends a tensor of type `ty` and shape `ne` (ggml order) to the directory.
    ///
    /// # Errors
    /// On a duplicate or over-long name, or a row length the type's blocks do not divide.
    pub fn add_tensor(&mut self, name: &str, ty: Type, ne: &[i64]) -> Result<()> {
        if self.sizes.iter().any(|(n, _)| n == name) {
            return Err(Error::Invalid(format!("duplicate tensor name {name}")));
        }
        if name.len() >= 64 {
            return Err(Error::Invalid(format!("tensor name {name} is longer than 63 bytes")));
        }
        let row = ne[0] as usize;
        let n: i64 = ne.iter().product();
        let size = ty.nbytes(row, n as usize).ok_or_else(|| {
            Error::Invalid(format!("tensor {name}: rows of {row} do not fit {ty} blocks of {}", ty.block_size()))
        })?;
        let t = self.headers.new_tensor(ty, ne).named(name);
        // SAFETY: both live; the name is unique (checked above) so ggml does not abort.
        unsafe { sys::gguf_add_tensor(self.ctx.0.as_ptr(), t.raw()) };
        self.sizes.push((name.to_string(), size));
        Ok(())
    }

    /// Starts writing the file: metadata now, then tensor data through the
    /// returned writer in directory order. The data goes to a temporary file
    /// next to `path`, renamed to `path` by [`GgufWriter::finish`] only.
    ///
    /// # Errors
    /// When the temporary file cannot be created or written.
    pub fn write(self, path: &Path) -> Result<GgufWriter> {
        let c = self.ctx.0.as_ptr();
        // SAFETY: c is live; the buffer has exactly gguf_get_meta_size bytes.
        let meta = unsafe {
            let mut meta = vec![0u8; sys::gguf_get_meta_size(c)];
            sys::gguf_get_meta_data(c, meta.as_mut_ptr().cast());
            meta
        };
        // SAFETY: c is live.
        let alignment = unsafe { sys::gguf_get_alignment(c) };
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = tempfile::Builder::new()
            .prefix(".hamburger-")
            .suffix(".gguf.part")
            .tempfile_in(dir)
            .map_err(|e| Error::io(dir, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        out.write_all(&meta).map_err(|e| Error::io(path, e))?;
        Ok(GgufWriter { out, path: path.to_path_buf(), sizes: self.sizes, current: 0, written: 0, alignment })
    }
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Invalid(format!("string with NUL byte: {s:?}")))
}

/// Streams tensor data of a GGUF file in directory order (see [`GgufBuilder::write`]).
/// Dropping it before [`GgufWriter::finish`] deletes the partial file.
pub struct GgufWriter {
    out: BufWriter<tempfile::NamedTempFile>,
    path: PathBuf,
    sizes: Vec<(String, usize)>,
    current: usize,
    written: usize,
    alignment: usize,
}

impl GgufWriter {
    /// Appends `bytes` to the current tensor's data, moving on to the next tensor
    /// (with alignment padding) once one is complete.
    ///
    /// # Errors
    /// On I/O failure, or when more bytes arrive than the directory declared.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let Some(&(_, size)) = self.sizes.get(self.current) else {
                return Err(Error::Invalid("more tensor data than the GGUF directory declares".into()));
            };
            let take = bytes.len().min(size - self.written);
            self.out.write_all(&bytes[..take]).map_err(|e| Error::io(&self.path, e))?;
            self.written += take;
            bytes = &bytes[take..];
            self.advance()?;
        }
        Ok(())
    }

    /// Pads and moves to the next tensor once the current one is complete.
    fn advance(&mut self) -> Result<()> {
        while let Some((_, size)) = self.sizes.get(self.current) {
            if self.written < *size {
                break;
            }
            let pad = size.next_multiple_of(self.alignment) - size;
            self.out.write_all(&vec![0u8; pad]).map_err(|e| Error::io(&self.path, e))?;
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Checks every tensor was written, flushes, and renames the file into place.
    ///
    /// # Errors
    /// When data is missing or the file cannot be flushed or renamed.
    pub fn finish(mut self) -> Result<()> {
        self.advance()?;
        if let Some((name, size)) = self.sizes.get(self.current) {
            return Err(Error::Invalid(format!("tensor {name}: {} of {size} bytes written", self.written)));
        }
        let tmp = self.out.into_inner().map_err(|e| Error::io(&self.path, e.into_error()))?;
        tmp.as_file().sync_all().map_err(|e| Error::io(&self.path, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // Temporary files are created private; the result is an ordinary model file.
            let perms = std::fs::Permissions::from_mode(0o644);
            tmp.as_file().set_permissions(perms).map_err(|e| Error::io(&self.path, e))?;
        }
        tmp.persist(&self.path).map_err(|e| Error::io(&self.path, e.error))?;
        Ok(())
    }
}

//! Writing GGUF files: metadata and tensor directory built by ggml, then
//! tensor data streamed in directory order to a temporary file that is
//! renamed into place only when complete.

use std::ffi::CString;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::output::PartialFile;
use super::{Array, GgufCtx, Value};
use crate::{sys, Context, Error, Result, Type};

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
        // SAFETY: in every arm, c is live; k and strings are NUL-terminated; array data
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
            .map_err(|e| Error::io(path, cannot_create_in(dir, &e)))?;
        let partial = PartialFile::new(tmp.path());
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        out.write_all(&meta).map_err(|e| Error::io(path, e))?;
        Ok(GgufWriter {
            out,
            _partial: partial,
            path: path.to_path_buf(),
            sizes: self.sizes,
            current: 0,
            written: 0,
            alignment,
        })
    }
}

/// Why no file could be created in `dir`, without the temporary file's
/// name (the user named the output, not the `.part` file beside it).
fn cannot_create_in(dir: &Path, e: &std::io::Error) -> std::io::Error {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => format!("the folder {} does not exist", dir.display()),
        std::io::ErrorKind::PermissionDenied => format!("no permission to write in {}", dir.display()),
        kind => format!("cannot create a file in {}: {kind}", dir.display()),
    };
    std::io::Error::new(e.kind(), why)
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Invalid(format!("string with NUL byte: {s:?}")))
}

/// Streams tensor data of a GGUF file in directory order (see [`GgufBuilder::write`]).
/// Dropping it before [`GgufWriter::finish`] deletes the partial file.
pub struct GgufWriter {
    out: BufWriter<tempfile::NamedTempFile>,
    /// Listed for signal handlers until the file is renamed or deleted.
    _partial: PartialFile,
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

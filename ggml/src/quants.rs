//! Row quantization and dequantization through ggml's own kernels.

use crate::{sys, Error, Result, Type};

/// Quantizes `src` (rows of `row_len` f32 values) to `ty` with ggml's reference
/// quantizers, optionally weighted by an importance vector of `row_len` values.
/// Thread-safe: callers may quantize different tensors or row ranges in parallel.
///
/// # Errors
/// When `ty` is no quantization target ([`Type::is_quantization_target`]),
/// `row_len` is not a multiple of the type's block size, `src` is not
/// whole rows, the type needs an importance matrix that is missing, or ggml
/// rejects the data (NaN/inf in the input).
pub fn quantize_rows(ty: Type, src: &[f32], row_len: usize, imatrix: Option<&[f32]>) -> Result<Vec<u8>> {
    if !ty.is_quantization_target() {
        return Err(Error::Invalid(format!("{ty} is not a type ggml can quantize to")));
    }
    // SAFETY: initialises the type's lookup tables; ggml guards this with its own
    // critical section and makes repeated calls no-ops, so it is thread-safe.
    unsafe { sys::ggml_quantize_init(ty.raw()) };
    let row_size = ty
        .row_size(row_len)
        .ok_or_else(|| Error::Invalid(format!("rows of {row_len} do not fit {ty} blocks of {}", ty.block_size())))?;
    if row_len == 0 || !src.len().is_multiple_of(row_len) {
        return Err(Error::Invalid(format!("{} values are not whole rows of {row_len}", src.len())));
    }
    if let Some(im) = imatrix {
        if im.len() != row_len {
            return Err(Error::Invalid(format!("importance vector of {} for rows of {row_len}", im.len())));
        }
    }
    // SAFETY: pure query.
    if imatrix.is_none() && unsafe { sys::ggml_quantize_requires_imatrix(ty.raw()) } {
        return Err(Error::Invalid(format!("{ty} needs an importance matrix")));
    }
    let nrows = src.len() / row_len;
    let mut out = vec![0u8; nrows * row_size];
    let im = imatrix.map_or(std::ptr::null(), |m| m.as_ptr());
    // SAFETY: src holds nrows*row_len floats; out has room for nrows rows of the
    // type; im is null or row_len floats; quantization tables are initialised.
    let written = unsafe {
        sys::ggml_quantize_chunk(ty.raw(), src.as_ptr(), out.as_mut_ptr().cast(), 0, nrows as i64, row_len as i64, im)
    };
    if written != out.len() {
        return Err(Error::Invalid(format!("ggml quantized {written} of {} bytes", out.len())));
    }
    // SAFETY: out holds `written` bytes of `ty` data.
    if ty.is_quantized() && !unsafe { sys::ggml_validate_row_data(ty.raw(), out.as_ptr().cast(), out.len()) } {
        return Err(Error::Invalid(format!("{ty} quantization produced invalid values (NaN or inf in the input?)")));
    }
    Ok(out)
}

/// Converts `n` elements of `ty` data in `src` to f32.
///
/// # Errors
/// When the type cannot be dequantized or `src` does not hold `n` elements.
pub fn dequantize(ty: Type, src: &[u8], n: usize) -> Result<Vec<f32>> {
    let need = ty
        .nbytes(ty.block_size(), n)
        .filter(|_| n.is_multiple_of(ty.block_size()))
        .ok_or_else(|| Error::Invalid(format!("{n} elements are not whole {ty} blocks")))?;
    if src.len() != need {
        return Err(Error::Invalid(format!("{ty}: {} bytes for {n} elements, expected {need}", src.len())));
    }
    if ty == Type::F32 {
        return Ok(src.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect());
    }
    // SAFETY: static traits table entry of a valid type.
    let to_float = unsafe { (*sys::ggml_get_type_traits(ty.raw())).to_float }
        .ok_or_else(|| Error::Invalid(format!("ggml cannot dequantize {ty}")))?;
    let mut out = vec![0f32; n];
    // SAFETY: src holds exactly n elements of `ty` (checked), out has room for n floats.
    unsafe { to_float(src.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
    Ok(out)
}

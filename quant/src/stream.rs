//! Writes tensor data converted in parallel, in file order: tensors are cut
//! into chunks of whole rows, a window of chunks is converted on the rayon
//! pool, then written before the next window starts, so memory stays at a
//! few chunks whatever the model size. Shared by the converter and the quantizer.

use ggml::gguf::GgufWriter;
use rayon::prelude::*;

/// Rows `[row0, row1)` of tensor number `tensor`.
#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    /// Index of the tensor in the caller's list.
    pub tensor: usize,
    /// First row.
    pub row0: usize,
    /// One past the last row.
    pub row1: usize,
}

/// Elements per chunk (whole rows).
const CHUNK_ELEMENTS: usize = 1 << 22;

/// Cuts tensors given as `(rows, row_len, whole)` into chunks; a `whole`
/// tensor (one whose rows move across the tensor, like a rope permutation) is one chunk.
pub fn chunks(tensors: impl IntoIterator<Item = (usize, usize, bool)>) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (i, (rows, row_len, whole)) in tensors.into_iter().enumerate() {
        let step = if whole { rows.max(1) } else { (CHUNK_ELEMENTS / row_len.max(1)).max(1) };
        let mut r = 0;
        while r < rows {
            out.push(Chunk { tensor: i, row0: r, row1: (r + step).min(rows) });
            r += step;
        }
    }
    out
}

/// Converts every chunk with `convert` (in parallel) and writes the bytes in
/// order to `out`, calling `done` after each chunk is written.
///
/// # Errors
/// The first error of `convert` or of the writer.
pub fn write_ordered<E: From<ggml::Error> + Send>(
    out: &mut GgufWriter,
    chunks: &[Chunk],
    convert: impl Fn(&Chunk) -> Result<Vec<u8>, E> + Sync,
    mut done: impl FnMut(&Chunk),
) -> Result<(), E> {
    let window = rayon::current_num_threads().max(1) * 2;
    for batch in chunks.chunks(window) {
        let results: Vec<Result<Vec<u8>, E>> = batch.par_iter().map(&convert).collect();
        for (bytes, chunk) in results.into_iter().zip(batch) {
            out.write_data(&bytes?)?;
            done(chunk);
        }
    }
    Ok(())
}

/// A progress bar over `total` units on stderr, or a hidden one.
pub fn progress_bar(show: bool, total: u64, label: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    let template = format!("{label} [{{elapsed_precise}}] {{wide_bar}} {{percent}}% ({{eta}} left)");
    bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("valid template"));
    bar
}

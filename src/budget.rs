//! What an engine will allocate, checked before anything is: each size must
//! be representable (ggml counts elements in `i64`, bytes in `usize`) and fit
//! the memory of the device that holds it. A huge `-c` (or a file's huge
//! training context with `-c 0`), a huge `-b` or `-t` in the thousands then
//! gives a one-line error instead of a ggml abort, an out-of-memory kill
//! after the kernel overcommitted, or a machine spinning thousands of threads.

use ggml::DeviceKind;

use crate::engine::EngineParams;
use crate::model::Model;
use crate::{Error, Result};

/// The most threads a ggml thread pool takes (`GGML_MAX_N_THREADS`).
pub const MAX_THREADS: usize = 512;

const GIB: f64 = (1u64 << 30) as f64;

/// Checks `p` against ggml's limits and the machine's memory for `model`.
///
/// # Errors
/// Naming the flag to change (`-t`, `-c`, `-b`) and what it would have needed.
pub fn check(model: &Model, p: &EngineParams) -> Result<()> {
    if p.n_threads > MAX_THREADS {
        return Err(Error::Invalid(format!("{} threads (-t) exceed ggml's limit of {MAX_THREADS}", p.n_threads)));
    }
    let hp = &model.hp;
    let cells = p.n_ctx as u128;
    // One K and one V row per cell and layer.
    let row = crate::kv_cache::row_bytes(p.kv_type, hp.n_embd_kv())? as u128;
    let per_layer = 2 * row * cells;
    // The widest forward: a batch of prompt tokens attending to the whole context
    // (the engine's padded window never passes it): the f32 mask, and without
    // flash attention the f32 scores of every head.
    let window = cells;
    let tokens = p.n_batch.min(p.n_ctx) as u128;
    let per_token_cell = if p.flash_attn { 4 } else { 4 * (hp.n_head as u128 + 1) };
    let scores = tokens * window * per_token_cell;
    let elements_ok =
        cells * (hp.n_embd_kv() as u128) < i64::MAX as u128 && tokens * window * (hp.n_head as u128) < i64::MAX as u128;
    if !elements_ok {
        return Err(Error::Invalid(format!(
            "a context of {} entries (-c) with batches of {} tokens (-b) is beyond what ggml can represent",
            p.n_ctx, p.n_batch
        )));
    }
    // Each sequence's micro cache and feature columns live with the tail.
    let seqs = p.n_seq as u128;
    let micro = hp.n_micro_layer as u128 * 2 * row * crate::graph::micro::cells_per_seq(hp) as u128 * seqs
        + hp.n_embd as u128 * hp.n_features() as u128 * seqs * 4;
    let tail = model.plan.tail_device();
    for (device, layers) in model.plan.layer_counts() {
        let Some((name, total)) = memory(device) else { continue };
        let layers = layers as u128;
        let here = device == tail;
        let kv = layers * per_layer + if here { micro } else { 0 };
        if kv > total {
            return Err(Error::Invalid(format!(
                "a KV cache of {} entries (-c) for {} sequences (-np) needs {:.1} GiB, more than the {:.1} GiB of memory of {name}: use a smaller context (-c) or fewer sequences (-np)",
                p.n_ctx,
                p.n_seq,
                kv as f64 / GIB,
                total as f64 / GIB
            )));
        }
        if layers > 0 && kv + scores > total {
            return Err(Error::Invalid(format!(
                "batches of {} tokens (-b) over a context of {} entries (-c) need {:.1} GiB of attention scores per forward besides a {:.1} GiB KV cache, more than the {:.1} GiB of memory of {name}: use a smaller -b or -c",
                p.n_batch,
                p.n_ctx,
                scores as f64 / GIB,
                kv as f64 / GIB,
                total as f64 / GIB
            )));
        }
    }
    Ok(())
}

/// The name and total memory of `device` (the CPU when `None`), unless it does not say.
fn memory(device: Option<ggml::Device>) -> Option<(String, u128)> {
    let dev = device.or_else(|| ggml::Device::all().into_iter().find(|d| d.kind() == DeviceKind::Cpu))?;
    let (_, total) = dev.memory();
    (total > 0).then(|| (dev.name(), total as u128))
}

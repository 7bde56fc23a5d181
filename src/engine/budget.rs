//! An engine's settings and what they will allocate, checked before
//! anything is: each count must be positive, each size representable (ggml
//! counts elements in `i64`, bytes in `usize`) and within the memory of the
//! device that holds it. A huge context (or a file's huge training context),
//! a huge batch or threads in the thousands then give a one-line error
//! instead of a ggml abort, an out-of-memory kill after the kernel
//! overcommitted, or a machine spinning thousands of threads.

use ggml::{DeviceKind, Type};

use crate::error::{Error, Result};
use crate::error::{Param, ParamError};
use crate::model::Model;

/// The most threads a ggml thread pool takes (`GGML_MAX_N_THREADS`).
pub const MAX_THREADS: usize = 512;

const GIB: f64 = (1u64 << 30) as f64;

/// The settings of an engine: what it allocates and how it computes.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineParams {
    /// Base KV cells, shared by all sequences.
    pub n_ctx: usize,
    /// Sequences (ids `0..n_seq`).
    pub n_seq: usize,
    /// The most tokens one forward takes (prompt chunks); sizes the attention buffers.
    pub n_batch: usize,
    /// CPU threads.
    pub n_threads: usize,
    /// KV cache element type.
    pub kv_type: Type,
    /// Fused flash attention: `Some` as given, `None` (llama.cpp's `-fa
    /// auto`) as [`EngineParams::fused_attention`] chooses for the model's
    /// placement.
    pub flash_attn: Option<bool>,
}

impl Default for EngineParams {
    /// llama-cli's defaults, for one sequence on every core.
    fn default() -> Self {
        EngineParams {
            n_ctx: 4096,
            n_seq: 1,
            n_batch: 512,
            n_threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
            kv_type: Type::F16,
            flash_attn: None,
        }
    }
}

/// The most bytes of attention scores per forward that `flash_attn: None`
/// lets the separate products allocate (a batch of prompt tokens by every
/// cell of the context and every head, in f32) before it fuses instead.
pub const MAX_UNFUSED_SCORES: u128 = 1 << 30;

impl EngineParams {
    /// Whether attention is fused (flash attention) for `model` as placed.
    ///
    /// Given, as given. Else fused wherever a layer or the micro decoder
    /// runs off the CPU (the GPU backends' fused kernels are their fast
    /// ones) and for a quantized cache (only the fused kernel reads one).
    /// On the CPU alone, the separate products: ggml's fused CPU kernel
    /// scans the cache one cell at a time, and decoding SmolLM2 with it took
    /// 1.8x the time at 1,024 cached tokens and 2.8x at 4,096 (one row; 2.9x
    /// and 5.3x at 8 rows; docs/performance.md), where the separate products
    /// run as matrix products. Those allocate the scores of every head,
    /// though, so a context whose scores would pass
    /// [`MAX_UNFUSED_SCORES`] is fused there too.
    pub fn fused_attention(&self, model: &Model) -> bool {
        if let Some(fused) = self.flash_attn {
            return fused;
        }
        !model.plan.cpu_only() || self.kv_type.is_quantized() || self.scores_bytes(model, false) > MAX_UNFUSED_SCORES
    }

    /// Bytes of the widest forward's attention scores: a batch of prompt
    /// tokens against the whole context (the engine's padded window never
    /// passes it), the f32 mask, and unfused the f32 scores of every head.
    fn scores_bytes(&self, model: &Model, fused: bool) -> u128 {
        let tokens = self.n_batch.min(self.n_ctx) as u128;
        let per_token_cell = if fused { 4 } else { 4 * (model.hp.n_head as u128 + 1) };
        tokens * self.n_ctx as u128 * per_token_cell
    }

    /// Checks these settings against ggml's limits and the machine's memory for `model`.
    ///
    /// # Errors
    /// A [`ParamError`] naming the parameters to change (`n_threads`,
    /// `n_ctx`, `n_batch`, `n_seq`) and what they would have needed; a KV
    /// type that cannot hold the model's rows.
    pub fn check(&self, model: &Model) -> Result<()> {
        let p = self;
        let counts = [
            (Param::NCtx, p.n_ctx),
            (Param::NSeq, p.n_seq),
            (Param::NBatch, p.n_batch),
            (Param::NThreads, p.n_threads),
        ];
        if let Some((param, _)) = counts.into_iter().find(|&(_, n)| n == 0) {
            return Err(refused(&[param], format!("{param} 0: expected at least 1")));
        }
        if p.n_threads > MAX_THREADS {
            return Err(refused(
                &[Param::NThreads],
                format!("{} {} exceeds ggml's limit of {MAX_THREADS} threads", Param::NThreads, p.n_threads),
            ));
        }
        let hp = &model.hp;
        let cells = p.n_ctx as u128;
        // One K and one V row per cell and layer.
        let row = crate::memory::kv_cache::row_bytes(p.kv_type, hp.n_embd_kv())? as u128;
        let per_layer = 2 * row * cells;
        let tokens = p.n_batch.min(p.n_ctx) as u128;
        let scores = p.scores_bytes(model, p.fused_attention(model));
        let elements_ok = cells * (hp.n_embd_kv() as u128) < i64::MAX as u128
            && tokens * cells * (hp.n_head as u128) < i64::MAX as u128;
        if !elements_ok {
            return Err(refused(
                &[Param::NCtx, Param::NBatch],
                format!(
                    "a context of {} entries ({}) with batches of {} tokens ({}) is beyond what ggml can represent",
                    p.n_ctx,
                    Param::NCtx,
                    p.n_batch,
                    Param::NBatch
                ),
            ));
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
                return Err(refused(
                    &[Param::NCtx, Param::NSeq],
                    format!(
                        "a KV cache of {} entries ({}) for {} sequences ({}) needs {:.1} GiB, more than the {:.1} GiB of memory of {name}: use a smaller context or fewer sequences",
                        p.n_ctx,
                        Param::NCtx,
                        p.n_seq,
                        Param::NSeq,
                        kv as f64 / GIB,
                        total as f64 / GIB
                    ),
                ));
            }
            if layers > 0 && kv + scores > total {
                return Err(refused(
                    &[Param::NBatch, Param::NCtx],
                    format!(
                        "batches of {} tokens ({}) over a context of {} entries ({}) need {:.1} GiB of attention scores per forward besides a {:.1} GiB KV cache, more than the {:.1} GiB of memory of {name}: use smaller batches or a smaller context",
                        p.n_batch,
                        Param::NBatch,
                        p.n_ctx,
                        Param::NCtx,
                        scores as f64 / GIB,
                        kv as f64 / GIB,
                        total as f64 / GIB
                    ),
                ));
            }
        }
        if p.n_seq > crate::memory::kv_cache::MAX_SEQ {
            return Err(refused(
                &[Param::NSeq],
                format!(
                    "{} {} exceeds the cache's limit of {} sequences",
                    Param::NSeq,
                    p.n_seq,
                    crate::memory::kv_cache::MAX_SEQ
                ),
            ));
        }
        Ok(())
    }
}

/// The error refusing `params`, named in `message`.
fn refused(params: &[Param], message: String) -> Error {
    ParamError::new(params, message).into()
}

/// The name and total memory of `device` (the CPU when `None`), unless it does not say.
fn memory(device: Option<ggml::Device>) -> Option<(String, u128)> {
    let dev = device.or_else(|| ggml::Device::all().into_iter().find(|d| d.kind() == DeviceKind::Cpu))?;
    let (_, total) = dev.memory();
    (total > 0).then(|| (dev.name(), total as u128))
}

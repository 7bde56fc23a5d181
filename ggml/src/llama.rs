//! libllama (llama.cpp's own model runner, linked from the same ggml build) as
//! an in-process baseline: the parity tests and `hamburger-bench --baseline`
//! compare against it, and the quantizer is timed against its quantizer.

use std::ffi::CString;
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Once;

use crate::log_bridge::capture_errors;
use crate::{sys, Error, Result, Type};

fn backend_init() {
    static ONCE: Once = Once::new();
    crate::init_logging();
    // SAFETY: one-time global initialisation.
    ONCE.call_once(|| unsafe { sys::llama_backend_init() });
}

fn path_cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Invalid(format!("{}: path contains NUL", path.display())))
}

/// Where libllama puts a model's weights: the same choices our placement
/// makes, so a baseline runs on exactly the hardware we run on.
#[derive(Debug, Clone, Copy)]
pub struct LlamaPlacement<'a> {
    /// The devices layers may be offloaded to, in order (`Some(&[])`: the
    /// CPU alone). `None` is libllama's default: every GPU and RPC device it
    /// finds, whose host buffer then holds even the CPU's weights (unpacked)
    /// and takes large batches from the CPU, as `llama-bench -ngl 0` does on
    /// a GPU machine.
    pub devices: Option<&'a [crate::Device]>,
    /// Layers offloaded (the last ones).
    pub n_gpu_layers: i32,
    /// Each listed device's share of the offloaded layers (empty: equal).
    pub tensor_split: &'a [f32],
    /// Whether CPU weights may use the repacked layouts (llama.cpp's `use_extra_bufts`).
    pub repack: bool,
}

/// A model loaded by libllama.
pub struct LlamaModel(NonNull<sys::llama_model>);

impl Drop for LlamaModel {
    fn drop(&mut self) {
        // SAFETY: freed once; contexts borrow the model, so none outlives it.
        unsafe { sys::llama_model_free(self.0.as_ptr()) }
    }
}

impl LlamaModel {
    /// Loads a llama.cpp GGUF, offloading `n_gpu_layers` layers to any GPU
    /// libllama finds (its default device choice) and using the CPU's
    /// repacked layouts.
    ///
    /// # Errors
    /// When libllama rejects the file (its reason is included).
    pub fn load(path: &Path, n_gpu_layers: i32) -> Result<LlamaModel> {
        LlamaModel::load_with(path, &LlamaPlacement { devices: None, n_gpu_layers, tensor_split: &[], repack: true })
    }

    /// Loads a llama.cpp GGUF placed as `placement` says.
    ///
    /// # Errors
    /// As [`LlamaModel::load`], and when the split does not name one share per device.
    pub fn load_with(path: &Path, placement: &LlamaPlacement) -> Result<LlamaModel> {
        backend_init();
        let c = path_cstring(path)?;
        // SAFETY: default params by value.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = placement.n_gpu_layers;
        params.use_extra_bufts = placement.repack;
        // libllama reads both lists during the load only; they outlive the call.
        let mut devices: Option<Vec<sys::ggml_backend_dev_t>> =
            placement.devices.map(|d| d.iter().map(|d| d.raw()).chain(std::iter::once(std::ptr::null_mut())).collect());
        if let Some(d) = devices.as_mut() {
            params.devices = d.as_mut_ptr();
        }
        // llama.cpp's own front-ends pass llama_max_devices() shares (a row
        // split reads that many): pad with zeros.
        let mut split = placement.tensor_split.to_vec();
        if !split.is_empty() {
            if placement.devices.is_none_or(|d| d.len() != split.len()) {
                return Err(Error::Invalid("libllama: the tensor split needs one share per listed device".into()));
            }
            // SAFETY: a plain getter.
            split.resize(unsafe { sys::llama_max_devices() }.max(split.len()), 0.0);
            params.tensor_split = split.as_ptr();
        }
        // SAFETY: c is NUL-terminated; params is initialised and its lists live until the call returns.
        let (ptr, why) = capture_errors(|| unsafe { sys::llama_model_load_from_file(c.as_ptr(), params) });
        NonNull::new(ptr).map(LlamaModel).ok_or_else(|| {
            Error::Llama(format!("{}: {}", path.display(), why.unwrap_or_else(|| "failed to load model".into())))
        })
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_get_vocab(self.0.as_ptr()) }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the vocab belongs to the live model.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) as usize }
    }

    /// Bytes one token's keys and values take in a cache of element type `ty`.
    pub fn kv_bytes_per_token(&self, ty: Type) -> usize {
        // SAFETY: plain getters of a live model.
        let (n_layer, n_embd, n_head, n_head_kv) = unsafe {
            let m = self.0.as_ptr();
            (
                sys::llama_model_n_layer(m) as usize,
                sys::llama_model_n_embd(m) as usize,
                sys::llama_model_n_head(m).max(1) as usize,
                sys::llama_model_n_head_kv(m) as usize,
            )
        };
        2 * n_layer * ty.row_size(n_embd / n_head * n_head_kv).unwrap_or(0)
    }

    /// Whether `token` ends generation.
    pub fn is_eog(&self, token: i32) -> bool {
        // SAFETY: the vocab belongs to the live model; any id is accepted.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// Tokenizes with llama.cpp's tokenizer.
    ///
    /// # Errors
    /// When the text is too long to tokenize.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<i32>> {
        let mut out = vec![0i32; text.len() + 8];
        // SAFETY: text bytes and out buffer are valid for their stated lengths.
        let n = unsafe {
            sys::llama_tokenize(
                self.vocab(),
                text.as_ptr().cast(),
                text.len() as i32,
                out.as_mut_ptr(),
                out.len() as i32,
                add_special,
                parse_special,
            )
        };
        if n < 0 {
            return Err(Error::Llama(format!("tokenization needs {} tokens", -n)));
        }
        out.truncate(n as usize);
        Ok(out)
    }
}

/// Options of a [`LlamaContext`].
#[derive(Debug, Clone, Copy)]
pub struct LlamaContextParams {
    /// KV cache size in tokens.
    pub n_ctx: u32,
    /// Largest batch passed to decode.
    pub n_batch: u32,
    /// CPU threads.
    pub n_threads: i32,
    /// Flash attention: `None` lets llama.cpp decide.
    pub flash_attn: Option<bool>,
    /// KV cache element type.
    pub kv_type: Type,
    /// Sequences the context holds (llama-server's slots), sharing one unified cache.
    pub n_seq_max: u32,
}

impl Default for LlamaContextParams {
    fn default() -> Self {
        LlamaContextParams {
            n_ctx: 2048,
            n_batch: 512,
            n_threads: 2,
            flash_attn: None,
            kv_type: Type::F16,
            n_seq_max: 1,
        }
    }
}

/// An inference context of libllama over a borrowed [`LlamaModel`].
pub struct LlamaContext<'m> {
    ptr: NonNull<sys::llama_context>,
    n_vocab: usize,
    /// The persistent CPU thread pool (as llama-bench attaches one); freed after the context.
    threadpool: crate::ThreadPool,
    _model: PhantomData<&'m LlamaModel>,
}

impl Drop for LlamaContext<'_> {
    fn drop(&mut self) {
        // SAFETY: freed once, before the model (lifetime 'm).
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

impl<'m> LlamaContext<'m> {
    /// A new context.
    ///
    /// # Errors
    /// When libllama cannot create it.
    pub fn new(model: &'m LlamaModel, p: LlamaContextParams) -> Result<LlamaContext<'m>> {
        // SAFETY: default params by value.
        let mut params = unsafe { sys::llama_context_default_params() };
        params.n_ctx = p.n_ctx;
        params.n_batch = p.n_batch;
        params.n_ubatch = p.n_batch;
        params.n_threads = p.n_threads;
        params.n_threads_batch = p.n_threads;
        params.type_k = p.kv_type.raw();
        params.type_v = p.kv_type.raw();
        params.flash_attn_type = match p.flash_attn {
            None => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
            Some(true) => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            Some(false) => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        params.no_perf = true;
        params.n_seq_max = p.n_seq_max;
        params.kv_unified = true;
        // SAFETY: the model is live for 'm; params is initialised.
        let (ptr, why) = capture_errors(|| unsafe { sys::llama_init_from_model(model.0.as_ptr(), params) });
        let ptr =
            NonNull::new(ptr).ok_or_else(|| Error::Llama(why.unwrap_or_else(|| "failed to create context".into())))?;
        let threadpool = crate::ThreadPool::new(p.n_threads.max(1) as usize)?;
        // SAFETY: both live; the context keeps using the pool, which it owns (dropped after it).
        unsafe { sys::llama_attach_threadpool(ptr.as_ptr(), threadpool.ptr.as_ptr(), threadpool.ptr.as_ptr()) };
        Ok(LlamaContext { ptr, n_vocab: model.n_vocab(), threadpool, _model: PhantomData })
    }

    /// Puts this context's CPU workers to sleep now: see [`crate::ThreadPool::pause`].
    pub fn pause_threads(&self) {
        self.threadpool.pause();
    }

    /// Feeds `tokens` (at the next positions) and computes the logits of the last one.
    ///
    /// # Errors
    /// When decoding fails (context full, ...).
    pub fn decode(&mut self, tokens: &[i32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Invalid("decode of no tokens".into()));
        }
        // llama_batch_get_one only reads the tokens.
        let mut toks = tokens.to_vec();
        // SAFETY: toks outlives the call; the batch only borrows it.
        let rc = unsafe {
            let batch = sys::llama_batch_get_one(toks.as_mut_ptr(), toks.len() as i32);
            sys::llama_decode(self.ptr.as_ptr(), batch)
        };
        if rc != 0 {
            return Err(Error::Llama(format!("llama_decode returned {rc}")));
        }
        Ok(())
    }

    /// One decode of several sequences: each `(token, position, sequence)`
    /// is one input, and every input gets logits (as llama-server decodes one
    /// token of each running slot per step).
    ///
    /// # Errors
    /// When decoding fails (context full, sequence beyond `n_seq_max`, ...).
    pub fn decode_seqs(&mut self, inputs: &[(i32, i32, i32)]) -> Result<()> {
        if inputs.is_empty() {
            return Err(Error::Invalid("decode of no tokens".into()));
        }
        let n = inputs.len();
        // SAFETY: a batch of n tokens with one sequence id each, filled below
        // within those bounds and freed after the decode.
        let rc = unsafe {
            let batch = sys::llama_batch_init(n as i32, 0, 1);
            for (i, &(token, pos, seq)) in inputs.iter().enumerate() {
                *batch.token.add(i) = token;
                *batch.pos.add(i) = pos;
                *batch.n_seq_id.add(i) = 1;
                **batch.seq_id.add(i) = seq;
                *batch.logits.add(i) = 1;
            }
            let mut b = batch;
            b.n_tokens = n as i32;
            let rc = sys::llama_decode(self.ptr.as_ptr(), b);
            sys::llama_batch_free(batch);
            rc
        };
        if rc != 0 {
            return Err(Error::Llama(format!("llama_decode returned {rc}")));
        }
        Ok(())
    }

    /// The logits of the last decoded token.
    pub fn logits(&self) -> Vec<f32> {
        // SAFETY: after a successful decode the last token has n_vocab logits.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), -1);
            std::slice::from_raw_parts(p, self.n_vocab).to_vec()
        }
    }

    /// The logits of input `i` of the last [`LlamaContext::decode_seqs`], which
    /// gives every input logits (a scorer reads the whole sequence's).
    ///
    /// # Errors
    /// When input `i` has no logits (out of range, or not asked for).
    pub fn logits_ith(&self, i: usize) -> Result<Vec<f32>> {
        let i = i32::try_from(i).map_err(|_| Error::Invalid(format!("logits of input {i}: out of range")))?;
        // SAFETY: libllama checks `i` against the last batch and returns null
        // (logging the reason) when that input has no logits.
        let p = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        if p.is_null() {
            return Err(Error::Invalid(format!("input {i} of the last decode has no logits")));
        }
        // SAFETY: a non-null row holds n_vocab logits, valid until the next decode.
        Ok(unsafe { std::slice::from_raw_parts(p, self.n_vocab) }.to_vec())
    }

    /// Forgets everything in the KV cache.
    pub fn clear(&mut self) {
        // SAFETY: the context and its memory are live.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) }
    }

    /// Forgets sequence `seq`'s entries at positions `pos` and later (a
    /// verification's rejected rows).
    ///
    /// # Errors
    /// When libllama refuses (a partial removal its memory cannot do).
    pub fn truncate(&mut self, seq: i32, pos: i32) -> Result<()> {
        // SAFETY: the context and its memory are live; -1 is "to the end".
        let ok = unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), seq, pos, -1) };
        if !ok {
            return Err(Error::Llama(format!("cannot remove sequence {seq}'s entries from position {pos}")));
        }
        Ok(())
    }

    /// Waits for pending computation.
    pub fn synchronize(&self) {
        // SAFETY: the context is live.
        unsafe { sys::llama_synchronize(self.ptr.as_ptr()) }
    }

    /// Greedy generation of up to `n` tokens after `prompt` with libllama's
    /// own greedy sampler, stopping after an end-of-generation token when
    /// `model` is given.
    ///
    /// # Errors
    /// When a decode fails.
    pub fn greedy(&mut self, prompt: &[i32], n: usize, model: Option<&LlamaModel>) -> Result<Vec<i32>> {
        self.greedy_decode(prompt, n, model, false).map(|(tokens, _)| tokens)
    }

    /// [`LlamaContext::greedy`], with the logits each token was chosen from
    /// (a test tells a near-tie from a difference with them).
    ///
    /// # Errors
    /// When a decode fails.
    pub fn greedy_with_logits(
        &mut self,
        prompt: &[i32],
        n: usize,
        model: Option<&LlamaModel>,
    ) -> Result<(Vec<i32>, Vec<Vec<f32>>)> {
        self.greedy_decode(prompt, n, model, true)
    }

    fn greedy_decode(
        &mut self,
        prompt: &[i32],
        n: usize,
        model: Option<&LlamaModel>,
        keep_logits: bool,
    ) -> Result<(Vec<i32>, Vec<Vec<f32>>)> {
        self.clear();
        self.decode(prompt)?;
        let sampler = LlamaSampler::greedy()?;
        let (mut out, mut logits) = (Vec::with_capacity(n), Vec::new());
        for _ in 0..n {
            if keep_logits {
                logits.push(self.logits());
            }
            // SAFETY: the sampler and the context are live; the last decode
            // produced logits for its last token (index -1).
            let tok = unsafe { sys::llama_sampler_sample(sampler.0.as_ptr(), self.ptr.as_ptr(), -1) };
            out.push(tok);
            if model.is_some_and(|m| m.is_eog(tok)) || out.len() == n {
                break;
            }
            self.decode(&[tok])?;
        }
        Ok((out, logits))
    }
}

/// A libllama sampler (a chain or one sampler), freed on drop: greedy for
/// the baseline's decodes, or llama-server's default chain, the reference
/// our own sampler is tested against.
pub struct LlamaSampler(NonNull<sys::llama_sampler>);

/// The settings of llama-server's default sampler chain that
/// [`LlamaSampler::chain`] applies (its other samplers are off at their
/// defaults: penalties, DRY, top-n-sigma, typical, XTC).
#[derive(Debug, Clone, Copy)]
pub struct ChainSettings {
    /// Keep the k most likely tokens (0: all).
    pub top_k: i32,
    /// Nucleus sampling's p (1: off).
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely (0: off).
    pub min_p: f32,
    /// Temperature.
    pub temp: f32,
    /// Seed of the final `dist` sampler.
    pub seed: u32,
}

impl LlamaSampler {
    fn wrap(p: *mut sys::llama_sampler, what: &str) -> Result<LlamaSampler> {
        NonNull::new(p).map(LlamaSampler).ok_or_else(|| Error::Llama(format!("cannot create the {what} sampler")))
    }

    /// libllama's greedy sampler.
    ///
    /// # Errors
    /// When libllama cannot create it.
    pub fn greedy() -> Result<LlamaSampler> {
        // SAFETY: no arguments; a null return is handled.
        Self::wrap(unsafe { sys::llama_sampler_init_greedy() }, "greedy")
    }

    /// llama-server's chain for `s`: top-k, top-p, min-p, temperature, then
    /// a seeded draw (`common_sampler_init`'s order, min_keep 0).
    ///
    /// # Errors
    /// When libllama cannot create a sampler.
    pub fn chain(s: ChainSettings) -> Result<LlamaSampler> {
        backend_init();
        // SAFETY: default parameters by value; a null return is handled.
        let chain =
            Self::wrap(unsafe { sys::llama_sampler_chain_init(sys::llama_sampler_chain_default_params()) }, "chain")?;
        // SAFETY: plain values in, a new sampler (or null) out.
        let parts = unsafe {
            [
                sys::llama_sampler_init_top_k(s.top_k),
                sys::llama_sampler_init_top_p(s.top_p, 0),
                sys::llama_sampler_init_min_p(s.min_p, 0),
                sys::llama_sampler_init_temp_ext(s.temp, 0.0, 1.0),
                sys::llama_sampler_init_dist(s.seed),
            ]
        };
        for p in parts {
            let part = Self::wrap(p, "chain's")?;
            // SAFETY: both live; the chain takes ownership of `part`, which
            // is therefore not dropped here.
            unsafe { sys::llama_sampler_chain_add(chain.0.as_ptr(), std::mem::ManuallyDrop::new(part).0.as_ptr()) };
        }
        Ok(chain)
    }

    /// The token this sampler picks from `logits` (one per vocabulary
    /// token), advancing its random state as llama-server's does.
    pub fn sample_logits(&mut self, logits: &[f32]) -> u32 {
        let mut data: Vec<sys::llama_token_data> = logits
            .iter()
            .enumerate()
            .map(|(i, &logit)| sys::llama_token_data { id: i as i32, logit, p: 0.0 })
            .collect();
        let mut cur =
            sys::llama_token_data_array { data: data.as_mut_ptr(), size: data.len(), selected: -1, sorted: false };
        // SAFETY: `cur` points at `data`, alive and `size` long; the samplers
        // reorder and shrink it in place.
        unsafe { sys::llama_sampler_apply(self.0.as_ptr(), &mut cur) };
        let Some(i) = usize::try_from(cur.selected).ok().filter(|&i| i < cur.size) else { return 0 };
        // SAFETY: `selected` indexes the `size` candidates at `cur.data`
        // (our buffer, or one the chain owns), alive until the next apply.
        unsafe { (*cur.data.add(i)).id as u32 }
    }
}

impl Drop for LlamaSampler {
    fn drop(&mut self) {
        // SAFETY: created by a llama_sampler_init_* call and freed once, here
        // (a chain frees its parts).
        unsafe { sys::llama_sampler_free(self.0.as_ptr()) }
    }
}

/// Quantizes a llama GGUF with libllama's `llama_model_quantize` to the mix
/// whose llama.cpp file type (`LLAMA_FTYPE_*`) is `ftype`.
///
/// # Errors
/// On an unknown mix or when libllama fails.
pub fn quantize_model(input: &Path, output: &Path, ftype: u32, n_threads: i32) -> Result<()> {
    backend_init();
    let (i, o) = (path_cstring(input)?, path_cstring(output)?);
    // SAFETY: default params by value.
    let mut params = unsafe { sys::llama_model_quantize_default_params() };
    params.nthread = n_threads;
    params.ftype = ftype as _;
    // SAFETY: paths are NUL-terminated; params initialised and outlive the call.
    let (rc, why) = capture_errors(|| unsafe { sys::llama_model_quantize(i.as_ptr(), o.as_ptr(), &params) });
    if rc != 0 {
        return Err(Error::Llama(why.unwrap_or_else(|| format!("quantization failed ({rc})"))));
    }
    Ok(())
}

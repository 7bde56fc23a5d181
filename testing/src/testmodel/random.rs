//! Random-weight HAMburger checkpoints with real shapes (the released 1B model
//! or SmolLM2-135M), with a synthetic byte-level BPE tokenizer of the right
//! size, so speed can be measured and reproduced without the real weights.

use std::path::Path;

use hamburger::arch::TensorSet;
use hamburger::hparams::{
    default_feature_layers, HParams, DEFAULT_MAX_STEPS, DEFAULT_MERGER_HEADS, DEFAULT_MICRO_LAYERS,
};
use serde_json::{json, Value as Json};

use super::{init_of, init_values, write_config, write_hamburger_json, CheckpointWriter};
use convert::checkpoint::SrcDtype;
use convert::plan;
use convert::ConvertError;

/// The model shapes [`write`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The released model: a Llama-3.2-1B-Instruct base.
    Llama32_1b,
    /// SmolLM2-135M.
    Smollm2_135m,
}

impl Shape {
    /// Parses `llama-3.2-1b` or `smollm2-135m`.
    pub fn from_name(s: &str) -> Option<Shape> {
        match s {
            "llama-3.2-1b" | "1b" => Some(Shape::Llama32_1b),
            "smollm2-135m" | "smollm2" => Some(Shape::Smollm2_135m),
            _ => None,
        }
    }

    /// The hyper-parameters.
    pub fn hparams(self) -> HParams {
        let (n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, theta, ctx) = match self {
            Shape::Llama32_1b => (128256, 2048, 16, 32, 8, 8192, 500000.0, 131072),
            Shape::Smollm2_135m => (49152, 576, 30, 9, 3, 1536, 100000.0, 8192),
        };
        HParams {
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim: 64,
            n_ff,
            rms_eps: 1e-5,
            rope_freq_base: theta,
            n_rot: 64,
            n_ctx_train: ctx,
            max_steps: DEFAULT_MAX_STEPS,
            n_micro_layer: DEFAULT_MICRO_LAYERS,
            feature_layers: default_feature_layers(n_layer),
            n_merger_head: DEFAULT_MERGER_HEADS,
            draft_copy_ngram: 0,
        }
    }
}

/// GPT-2's byte-to-character table of byte-level BPE.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars: Vec<(u32, u32)> = printable.iter().map(|&b| (b, b)).collect();
    let mut next = 256;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars.push((b, next));
            next += 1;
        }
    }
    printable.clear();
    chars.sort();
    chars.into_iter().map(|(_, c)| char::from_u32(c).expect("valid char")).collect()
}

/// A byte-level BPE vocabulary of exactly `n_vocab` tokens: the 256 bytes,
/// then pairs and triples of them (each with its merge), then `specials`.
fn synthetic_tokenizer(n_vocab: usize, specials: &[(usize, &str)]) -> Json {
    let bytes = byte_chars();
    let mut tokens: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut merges: Vec<String> = Vec::new();
    let n_regular = n_vocab - specials.len();
    'outer: for a in &bytes {
        for b in &bytes {
            if tokens.len() >= n_regular {
                break 'outer;
            }
            tokens.push(format!("{a}{b}"));
            merges.push(format!("{a} {b}"));
        }
    }
    let pairs: Vec<String> = tokens[256..].to_vec();
    'outer3: for p in &pairs {
        for c in &bytes {
            if tokens.len() >= n_regular {
                break 'outer3;
            }
            tokens.push(format!("{p}{c}"));
            merges.push(format!("{p} {c}"));
        }
    }
    let mut vocab = serde_json::Map::new();
    let mut id = 0;
    let mut added = Vec::new();
    let mut regular = tokens.into_iter();
    while id < n_vocab {
        if let Some((_, text)) = specials.iter().find(|(i, _)| *i == id) {
            vocab.insert(text.to_string(), json!(id));
            added.push(json!({"id": id, "content": text, "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}));
        } else {
            vocab.insert(regular.next().expect("enough regular tokens"), json!(id));
        }
        id += 1;
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    })
}

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Writes a random-weight HAMburger checkpoint of `shape` (bf16, like the
/// release) into `dir`.
///
/// # Errors
/// On write errors.
pub fn write(shape: Shape, dir: &Path, seed: u64) -> Result<(), ConvertError> {
    let hp = shape.hparams();
    let shapes = hp.tensor_shapes(TensorSet { tied_output: true, ..Default::default() });
    let mut ck = CheckpointWriter::new(dir, SrcDtype::BF16);
    for (name, ne) in &shapes {
        let key = plan::source_key(*name, "model.").expect("every tensor but rope_freqs has a key");
        ck.declare(&key, &ne.iter().rev().map(|&d| d as usize).collect::<Vec<_>>());
    }
    ck.write(|i| {
        let (name, ne) = &shapes[i];
        Ok(init_values(init_of(*name, ne[0] as usize), seed, i, ne.iter().product::<i64>() as usize))
    })?;
    let v = hp.n_vocab;
    let (bos, eos, eot) = (v - 256, v - 255, v - 247);
    let specials = [(bos, "<|im_start|>"), (eos, "<|endoftext|>"), (eot, "<|im_end|>")];
    let rope_scaling = match shape {
        Shape::Llama32_1b => json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        Shape::Smollm2_135m => Json::Null,
    };
    write_config(dir, &hp, true, bos as i64, json!([eos, eot]), rope_scaling, "bfloat16")?;
    write_hamburger_json(dir, &hp, None)?;
    super::writer::write_json(dir, "tokenizer.json", &synthetic_tokenizer(v, &specials))?;
    super::writer::write_json(
        dir,
        "tokenizer_config.json",
        &json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": CHATML}),
    )
}

//! The conversion plan: for every GGUF tensor, where its data comes from in
//! the checkpoint (name map + q/k row permutation), its shape and its type.
//! Every source is checked against the hyper-parameters before anything is written.

use std::collections::BTreeSet;

use ggml::Type;
use hamburger::arch::{LayerTensor, MergerLinear, Part, StopLinear, TensorName, TensorSet};
use hamburger::hparams::HParams;

use crate::checkpoint::{Checkpoint, SourceTensor};
use crate::ConvertError;

/// How source rows are rearranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// Copied as is.
    None,
    /// Rows of each of `n_head` heads reordered from Hugging Face's rotate-half
    /// rope layout to ggml's adjacent-pair layout (llama.cpp's `permute`).
    RopePermute {
        /// Heads the rows are grouped in.
        n_head: usize,
    },
}

/// Where a GGUF tensor's values come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A checkpoint tensor.
    Checkpoint {
        /// Its state-dict name.
        key: String,
        /// Row rearrangement.
        transform: Transform,
    },
    /// Values computed by the converter (the llama3 rope factors).
    Computed(Vec<f32>),
}

/// One tensor of the output file.
#[derive(Debug, Clone)]
pub struct PlannedTensor {
    /// Its GGUF name.
    pub name: TensorName,
    /// Shape in ggml order.
    pub ne: Vec<i64>,
    /// Output type.
    pub ty: Type,
    /// Where the data comes from.
    pub source: Source,
}

impl PlannedTensor {
    /// Elements per row.
    pub fn row_len(&self) -> usize {
        self.ne[0] as usize
    }

    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.ne.iter().product::<i64>() as usize
    }
}

/// State-dict prefixes of the base model and the grafted modules.
const HAMBURGER_BASE: &str = "model.";
const MICRO: &str = "micro_step_decoder.decoders";
/// State-dict prefix of the optional draft head (`hamburger-train draft`'s
/// micro decoder and stop head, beside the macro steps' own).
pub const DRAFT_HEAD: &str = "draft_head.";

/// Whether `ck` carries a draft head (any `draft_head.*` tensor): then its
/// GGUF gets the draft roles, and every tensor of the head must be there.
pub fn has_draft_head(ck: &Checkpoint) -> bool {
    ck.tensors.keys().any(|k| k.starts_with(DRAFT_HEAD))
}

/// The longest n-gram `ck`'s draft head copies from: M of its copy matrix
/// `draft_head.copy.weight` `[D, M*D]` (`hamburger-train draft --copy M`),
/// 0 where it has none.
///
/// # Errors
/// A copy matrix whose shape is not `[n_embd, M * n_embd]`, M at least 1.
pub fn draft_copy_ngram(ck: &Checkpoint, n_embd: usize) -> Result<usize, ConvertError> {
    let key = format!("{DRAFT_HEAD}copy.weight");
    let Some(t) = ck.tensors.get(&key) else {
        return Ok(0);
    };
    match t.shape[..] {
        [d, m_d] if d == n_embd && n_embd > 0 && m_d > 0 && m_d % n_embd == 0 => Ok(m_d / n_embd),
        _ => Err(ConvertError::Config {
            path: ck.path.clone(),
            msg: format!("{key} is {:?}, not [{n_embd}, M x {n_embd}] (M: the longest n-gram copied from)", t.shape),
        }),
    }
}

fn layer_key(lt: LayerTensor) -> &'static str {
    match lt {
        LayerTensor::AttnNorm => "input_layernorm",
        LayerTensor::AttnQ => "self_attn.q_proj",
        LayerTensor::AttnK => "self_attn.k_proj",
        LayerTensor::AttnV => "self_attn.v_proj",
        LayerTensor::AttnOutput => "self_attn.o_proj",
        LayerTensor::FfnNorm => "post_attention_layernorm",
        LayerTensor::FfnGate => "mlp.gate_proj",
        LayerTensor::FfnUp => "mlp.up_proj",
        LayerTensor::FfnDown => "mlp.down_proj",
    }
}

/// The state-dict key of a GGUF tensor, given the base model's key prefix
/// (`model.` in a HAMburger checkpoint, empty in a plain Llama one).
pub fn source_key(name: TensorName, base: &str) -> Option<String> {
    let part = |p: Part| match p {
        Part::Weight => "weight",
        Part::Bias => "bias",
    };
    Some(match name {
        TensorName::TokenEmbd => format!("{base}model.embed_tokens.weight"),
        TensorName::OutputNorm => format!("{base}model.norm.weight"),
        TensorName::Output => format!("{base}lm_head.weight"),
        TensorName::RopeFreqs => return None,
        TensorName::Base(i, lt) => format!("{base}model.layers.{i}.{}.weight", layer_key(lt)),
        TensorName::Micro(i, lt) => format!("{MICRO}.{i}.{}.weight", layer_key(lt)),
        TensorName::Merger(m, p) => match m {
            MergerLinear::Q => format!("comp_embedder.merger.q_proj.{}", part(p)),
            MergerLinear::K => format!("comp_embedder.merger.k_proj.{}", part(p)),
            MergerLinear::V => format!("comp_embedder.merger.v_proj.{}", part(p)),
            MergerLinear::Out => format!("comp_embedder.out_proj.{}", part(p)),
        },
        TensorName::MergerPos => "comp_embedder.merger.pos".into(),
        TensorName::Stop(s, p) => format!("micro_step_decoder.stop_head.{}.{}", stop_index(s), part(p)),
        TensorName::DraftMicro(i, lt) => format!("{DRAFT_HEAD}decoders.{i}.{}.weight", layer_key(lt)),
        TensorName::DraftStop(s, p) => format!("{DRAFT_HEAD}stop_head.{}.{}", stop_index(s), part(p)),
        TensorName::DraftCopy => format!("{DRAFT_HEAD}copy.weight"),
    })
}

/// A stop-head layer's index in its `nn.Sequential` (Linear, SiLU, Linear, SiLU, Linear).
fn stop_index(s: StopLinear) -> usize {
    match s {
        StopLinear::Fc1 => 0,
        StopLinear::Fc2 => 2,
        StopLinear::Out => 4,
    }
}

/// Entries a checkpoint may hold that the format does not use.
fn ignorable(key: &str) -> bool {
    key.ends_with("rotary_emb.inv_freq") || key.starts_with("teacher.")
}

/// Decides whether the lm_head is tied to the embedding: absent, the same
/// bytes, or equal values mean tied.
///
/// # Errors
/// When the config and the weights disagree.
pub fn detect_tied(ck: &Checkpoint, base: &str, config_tied: bool) -> Result<bool, ConvertError> {
    let embd = ck.tensors.get(&format!("{base}model.embed_tokens.weight"));
    let head_key = format!("{base}lm_head.weight");
    match (ck.tensors.get(&head_key), embd) {
        (None, _) if !config_tied => Err(ConvertError::MissingTensor { path: ck.path.clone(), name: head_key }),
        (None, _) => Ok(true),
        (Some(h), Some(e)) if h.same_data(e) || ck.bytes(h) == ck.bytes(e) => Ok(true),
        (Some(_), _) if config_tied => Err(ConvertError::Config {
            path: ck.path.clone(),
            msg: "tie_word_embeddings is true but lm_head.weight differs from embed_tokens.weight".into(),
        }),
        (Some(_), _) => Ok(false),
    }
}

/// The base model's key prefix in `ck`.
pub fn base_prefix(ck: &Checkpoint) -> &'static str {
    if ck.tensors.contains_key("model.embed_tokens.weight")
        && !ck.tensors.contains_key("model.model.embed_tokens.weight")
    {
        ""
    } else {
        HAMBURGER_BASE
    }
}

/// What the GGUF holds beside the checkpoint's tensors, named instead of
/// positional flags.
#[derive(Debug, Clone, Default)]
pub struct PlanOutput {
    /// The llama3 rope frequency factors, written as a tensor of their own.
    pub rope_freqs: Option<Vec<f32>>,
    /// The lm_head is the token embedding (not written twice).
    pub tied: bool,
    /// Only the base model, as a plain llama GGUF.
    pub base_only: bool,
}

/// Builds and checks the plan: every tensor present with a usable dtype and
/// the shape the hyper-parameters demand, and no unknown tensors left over.
///
/// # Errors
/// The first missing, mistyped, misshapen or unexpected tensor.
pub fn plan(
    ck: &Checkpoint,
    hp: &HParams,
    output: &PlanOutput,
    choose_type: impl Fn(TensorName, &[i64]) -> Type,
) -> Result<Vec<PlannedTensor>, ConvertError> {
    let PlanOutput { rope_freqs, tied, base_only } = output;
    let (tied, base_only) = (*tied, *base_only);
    let base = base_prefix(ck);
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    let draft_head = !base_only && has_draft_head(ck);
    let draft_copy = draft_head && hp.draft_copy_ngram > 0;
    let set = TensorSet { tied_output: tied, rope_freqs: rope_freqs.is_some(), base_only, draft_head, draft_copy };
    for (name, ne) in hp.tensor_shapes(set) {
        let ty = choose_type(name, &ne);
        let source = match source_key(name, base) {
            None => Source::Computed(rope_freqs.clone().unwrap_or_default()),
            Some(key) => {
                let t = ck
                    .tensors
                    .get(&key)
                    .ok_or_else(|| ConvertError::MissingTensor { path: ck.path.clone(), name: key.clone() })?;
                check_source(ck, &key, t, &ne)?;
                used.insert(key.clone());
                let transform = match name {
                    TensorName::Base(_, LayerTensor::AttnQ)
                    | TensorName::Micro(_, LayerTensor::AttnQ)
                    | TensorName::DraftMicro(_, LayerTensor::AttnQ) => Transform::RopePermute { n_head: hp.n_head },
                    TensorName::Base(_, LayerTensor::AttnK)
                    | TensorName::Micro(_, LayerTensor::AttnK)
                    | TensorName::DraftMicro(_, LayerTensor::AttnK) => Transform::RopePermute { n_head: hp.n_head_kv },
                    _ => Transform::None,
                };
                Source::Checkpoint { key, transform }
            }
        };
        out.push(PlannedTensor { name, ne, ty, source });
    }
    // Aliases of the embedding (tied lm_head, the embedder's copy) are not data of their own.
    let embd_key = format!("{base}model.embed_tokens.weight");
    let embd = &ck.tensors[&embd_key];
    for alias in [format!("{base}lm_head.weight"), "comp_embedder.embedding.weight".to_string()] {
        if let Some(t) = ck.tensors.get(&alias) {
            if used.contains(&alias) {
                continue;
            }
            if !(t.same_data(embd) || ck.bytes(t) == ck.bytes(embd)) {
                return Err(ConvertError::Config {
                    path: ck.path.clone(),
                    msg: format!("{alias} differs from {embd_key}; the format expects it to be the same table"),
                });
            }
            used.insert(alias);
        }
    }
    for key in ck.tensors.keys() {
        let grafted = ["comp_embedder.", "micro_step_decoder.", DRAFT_HEAD].iter().any(|p| key.starts_with(p));
        let skipped = ignorable(key) || (base_only && grafted);
        if !used.contains(key) && !skipped {
            return Err(ConvertError::UnexpectedTensor { path: ck.path.clone(), name: key.clone() });
        }
    }
    Ok(out)
}

fn check_source(ck: &Checkpoint, key: &str, t: &SourceTensor, ne: &[i64]) -> Result<(), ConvertError> {
    if let Err(dtype) = &t.dtype {
        return Err(ConvertError::Dtype { path: ck.path.clone(), name: key.into(), dtype: dtype.clone() });
    }
    let expected: Vec<usize> = ne.iter().rev().map(|&d| d as usize).collect();
    if t.shape != expected {
        return Err(ConvertError::Shape { path: ck.path.clone(), name: key.into(), expected, got: t.shape.clone() });
    }
    Ok(())
}

/// Applies `transform` to whole rows `src` (`row_len` wide); `inverse` maps
/// ggml's adjacent-pair layout back to rotate-half.
pub fn apply(transform: Transform, src: Vec<f32>, row_len: usize, inverse: bool) -> Vec<f32> {
    let Transform::RopePermute { n_head } = transform else { return src };
    let head_dim = src.len() / row_len / n_head;
    let half = head_dim / 2;
    let mut out = vec![0f32; src.len()];
    for h in 0..n_head {
        for j in 0..half {
            for k in 0..2 {
                // Row 2j+k of a head in ggml's layout is row k*half+j in Hugging Face's.
                let ggml_row = h * head_dim + 2 * j + k;
                let hf_row = h * head_dim + k * half + j;
                let (to, from) = if inverse { (hf_row, ggml_row) } else { (ggml_row, hf_row) };
                out[to * row_len..(to + 1) * row_len].copy_from_slice(&src[from * row_len..(from + 1) * row_len]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_matches_llama_cpp_and_inverts() {
        // One head of dim 4, rows r0..r3 (rotate-half: pairs (r0,r2), (r1,r3)).
        let src: Vec<f32> = (0..8).map(|x| x as f32).collect(); // 4 rows of 2
        let p = apply(Transform::RopePermute { n_head: 1 }, src.clone(), 2, false);
        assert_eq!(p, vec![0., 1., 4., 5., 2., 3., 6., 7.]); // rows r0, r2, r1, r3
        assert_eq!(apply(Transform::RopePermute { n_head: 1 }, p, 2, true), src);
    }
}

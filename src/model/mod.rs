//! The model and its file, the runtime's lowest layer: what a HAMburger GGUF
//! holds and where its weights are placed. It imports nothing of caches,
//! graphs or decoding, which read it (llama.cpp's `llama-arch`,
//! `llama-hparams`, `llama-model-loader` and `llama-model`).
//!
//! * [`arch`]: every GGUF key and tensor name, spelled once, and each
//!   tensor's facts (shared by converter, runtime and quantizer);
//! * [`hparams`]: the hyper-parameters, read and validated once, and the
//!   shapes they imply;
//! * [`placement`]: which device holds each layer and cache, decided once
//!   (`threads`: the CPU thread pools its backends run on);
//! * [`weights`]: the loader, each tensor checked against its expected shape
//!   and placed as the plan says;
//! * [`draft_vocab`]: the tokens self-verified decoding drafts from, and
//!   the lm_head's rows of them (optional);
//! * here, [`Model`]: a loaded HAMburger model: hyper-parameters, vocabulary
//!   metadata and weights, read from one GGUF file (memory-mapped).

pub mod arch;
pub mod draft_vocab;
pub mod hparams;
pub mod placement;
mod threads;
pub mod weights;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use ggml::gguf::{Array, Gguf};
use ggml::MappedFile;

use crate::error::{Error, Result};
use crate::model::arch::{keys, token_type, Key, ARCH_HAMBURGER, ARCH_LLAMA, END_OF_GENERATION_TEXTS};
use crate::model::draft_vocab::DraftVocab;
use crate::model::hparams::HParams;
use crate::model::placement::{LoadOptions, PlacementPlan};
use crate::model::weights::Weights;

/// The vocabulary facts the runtime needs (the tokenizer itself is built from
/// `tokenizer_json`, see [`crate::text::tokenizer`]).
#[derive(Debug, Clone)]
pub struct VocabInfo {
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: Option<u32>,
    /// Every end-of-generation token (eos, eot, eom and the usual end-of-turn specials).
    pub eog: Vec<u32>,
    /// Whether prompts start with BOS.
    pub add_bos: bool,
    /// The Hugging Face tokenizer JSON.
    pub tokenizer_json: Option<String>,
    /// The Jinja chat template.
    pub chat_template: Option<String>,
    /// Token texts by id.
    pub tokens: Vec<String>,
}

impl VocabInfo {
    /// Reads the vocabulary keys of `g` for a model of `n_vocab` tokens. As
    /// llama.cpp does, a special token id outside the vocabulary is ignored
    /// with a warning naming the file and key; a key of the wrong type is an error.
    fn from_gguf(g: &Gguf, n_vocab: usize) -> Result<VocabInfo> {
        let special = |k: &str| -> Result<Option<u32>> {
            Ok(match g.get_usize(k)? {
                Some(id) if id < n_vocab => Some(id as u32),
                Some(id) => {
                    log::warn!(
                        "{}: {k} = {id} is outside the vocabulary of {n_vocab} tokens; ignored",
                        g.path.display()
                    );
                    None
                }
                None => None,
            })
        };
        let tokens = match g.get_array(keys::TOKENIZER_TOKENS)? {
            Some(Array::Str(t)) => t.clone(),
            _ => Vec::new(),
        };
        let types = g.get_array(keys::TOKENIZER_TOKEN_TYPE)?.and_then(Array::as_ints).unwrap_or_default();
        let (bos, eos) = (special(keys::TOKENIZER_BOS_ID)?, special(keys::TOKENIZER_EOS_ID)?);
        for k in [keys::TOKENIZER_PAD_ID, keys::TOKENIZER_UNK_ID] {
            special(k)?;
        }
        let mut eog: Vec<u32> = eos.into_iter().collect();
        for k in [keys::TOKENIZER_EOT_ID, keys::TOKENIZER_EOM_ID] {
            eog.extend(special(k)?);
        }
        for (i, t) in tokens.iter().enumerate() {
            let control =
                types.get(i).is_some_and(|&ty| [token_type::CONTROL, token_type::USER_DEFINED].contains(&(ty as i32)));
            if control && i < n_vocab && END_OF_GENERATION_TEXTS.contains(&t.as_str()) && !eog.contains(&(i as u32)) {
                eog.push(i as u32);
            }
        }
        Ok(VocabInfo {
            bos,
            eos,
            eog,
            add_bos: g.get_bool(keys::TOKENIZER_ADD_BOS)?.unwrap_or(false),
            tokenizer_json: g.get_str(keys::TOKENIZER_HF_JSON)?.map(str::to_string),
            chat_template: g.get_str(keys::CHAT_TEMPLATE)?.map(str::to_string),
            tokens,
        })
    }
}

/// A HAMburger model, or a base-only (llama) one: the same loader, graphs
/// and engine, without the grafted modules (one token per forward), as the
/// target a HAMburger drafts for (`crate::decode::draft_model`).
pub struct Model {
    /// The GGUF file.
    pub path: PathBuf,
    /// `general.name`.
    pub name: String,
    /// Hyper-parameters.
    pub hp: HParams,
    /// Vocabulary metadata.
    pub vocab: VocabInfo,
    /// Weights.
    pub weights: Weights,
    /// Bytes of tensor data in the file.
    pub size_bytes: u64,
    /// Where the weights are, and so where the caches and graphs go.
    pub plan: PlacementPlan,
    /// The confidence its makers recommend (`hamburger.recommended_confidence`), if stored.
    pub recommended_confidence: Option<f32>,
    /// The draft vocabulary of self-verified decoding (`hamburger.draft_vocab`), if stored.
    pub draft_vocab: Option<DraftVocab>,
}

/// The confidence a HAMburger GGUF recommends (`hamburger.recommended_confidence`),
/// if it stores one: the default of every tool that decodes it.
///
/// # Errors
/// When the value is not a number.
pub fn recommended_confidence(gguf: &Gguf) -> Result<Option<f32>> {
    Ok(gguf.get_f64(&Key::RecommendedConfidence.name(ARCH_HAMBURGER))?.map(|c| c as f32))
}

/// [`recommended_confidence`] of the GGUF at `path`, reading its header only
/// (for a front-end that needs it before the model loads).
///
/// # Errors
/// When the file cannot be read as a GGUF, or the value is not a number.
pub fn recommended_confidence_of(path: &Path) -> Result<Option<f32>> {
    recommended_confidence(&Gguf::open(path)?)
}

/// The context the GGUF at `path` was trained with (`{arch}.context_length`),
/// reading its header only (llama.cpp's `n_ctx = 0`: the model's own).
///
/// # Errors
/// When the file cannot be read as a HAMburger or llama GGUF, or its
/// hyper-parameters are invalid.
pub fn context_length_of(path: &Path) -> Result<usize> {
    let gguf = Gguf::open(path)?;
    let arch = gguf.get_str(keys::ARCHITECTURE)?.unwrap_or("").to_string();
    if arch != ARCH_HAMBURGER && arch != ARCH_LLAMA {
        return Err(Error::WrongArchitecture { path: path.into(), found: arch });
    }
    Ok(HParams::from_gguf(&gguf, &arch)?.n_ctx_train)
}

impl Model {
    /// Opens a HAMburger GGUF, or a llama GGUF as a base-only model (its
    /// base alone: [`HParams::without_grafted`]): the header is parsed once,
    /// the hyper-parameters validated, a [`PlacementPlan`] built from
    /// `options`, and every weight checked and placed. CPU weights stay on
    /// the memory-mapped file, except matrices whose type has a repacked CPU
    /// layout (Q4_0, Q4_K, IQ4_NL... on x86), which are copied into it as
    /// llama.cpp does by default.
    ///
    /// # Errors
    /// When the file is not a valid HAMburger or llama GGUF (another
    /// architecture, missing keys, missing/misshapen tensors), naming the
    /// file and the culprit; when the device asked for is not available; on
    /// failed allocations.
    pub fn open(path: &Path, options: &LoadOptions) -> Result<Model> {
        let gguf = Gguf::open(path)?;
        let arch = gguf.get_str(keys::ARCHITECTURE)?.unwrap_or("").to_string();
        let base_only = match arch.as_str() {
            ARCH_HAMBURGER => false,
            ARCH_LLAMA => true,
            _ => return Err(Error::WrongArchitecture { path: path.into(), found: arch }),
        };
        let hp = HParams::from_gguf(&gguf, &arch)?;
        let hp = if base_only { hp.without_grafted() } else { hp };
        let vocab = VocabInfo::from_gguf(&gguf, hp.n_vocab)?;
        let plan = PlacementPlan::new(options, hp.n_layer)?;
        let map = Rc::new(MappedFile::open(path)?);
        let weights = weights::load(&gguf, map.clone(), &hp, &plan, base_only)?;
        let draft_vocab = if base_only { None } else { DraftVocab::load(&gguf, &map, &hp, &plan)? };
        Ok(Model {
            path: path.into(),
            name: gguf.get_str(keys::NAME)?.unwrap_or("").to_string(),
            hp,
            vocab,
            weights,
            size_bytes: gguf.tensors.iter().map(|t| t.size).sum(),
            plan,
            recommended_confidence: recommended_confidence(&gguf)?,
            draft_vocab,
        })
    }

    /// Whether this is a base model alone (a llama GGUF): no merger, micro
    /// decoder or stop head, one token per forward.
    pub fn is_base_only(&self) -> bool {
        self.weights.grafted.is_none()
    }
}

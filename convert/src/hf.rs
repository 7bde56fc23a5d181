//! The base model's Hugging Face `config.json` and HAMburger's `hamburger.json`:
//! read, checked, and turned into [`HParams`].

use std::path::Path;

use hamburger::hparams::{
    default_feature_layers, HParams, DEFAULT_MAX_STEPS, DEFAULT_MERGER_HEADS, DEFAULT_MICRO_LAYERS,
};
use serde::Deserialize;

use crate::ConvertError;

/// An int or a list of ints (HF writes `eos_token_id` either way).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// A single id.
    One(i64),
    /// Several ids.
    Many(Vec<i64>),
}

impl OneOrMany {
    /// All ids.
    pub fn ids(&self) -> Vec<i64> {
        match self {
            OneOrMany::One(i) => vec![*i],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// `rope_scaling` of a Llama config.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScaling {
    /// `rope_type` (or the older `type`).
    #[serde(alias = "type")]
    pub rope_type: String,
    /// Scale factor.
    pub factor: Option<f64>,
    /// Llama 3: low-frequency factor.
    pub low_freq_factor: Option<f64>,
    /// Llama 3: high-frequency factor.
    pub high_freq_factor: Option<f64>,
    /// Llama 3: the original context.
    pub original_max_position_embeddings: Option<f64>,
}

/// The fields of a Llama `config.json` the converter uses.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct HfConfig {
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_ctx")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    pub rope_scaling: Option<RopeScaling>,
    pub bos_token_id: Option<OneOrMany>,
    pub eos_token_id: Option<OneOrMany>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    pub hidden_act: Option<String>,
    pub torch_dtype: Option<String>,
}

fn default_theta() -> f64 {
    10000.0
}
fn default_ctx() -> usize {
    2048
}

/// HAMburger's hyper-parameters that the release does not store (`hamburger.json`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HamburgerJson {
    /// Most tokens per macro step.
    pub max_steps: Option<usize>,
    /// Micro-decoder layers.
    pub micro_layers: Option<usize>,
    /// Feature layers.
    pub feature_layers: Option<Vec<usize>>,
    /// Merger heads.
    pub merger_heads: Option<usize>,
    /// The confidence to recommend (`hamburger.recommended_confidence`): the
    /// tools' default for this model; none written when absent.
    pub recommended_confidence: Option<f32>,
    /// The draft vocabulary of self-verified decoding (`hamburger.draft_vocab`,
    /// token ids, the most frequent first); none written when absent.
    pub draft_vocab: Option<Vec<i64>>,
}

/// Reads and parses a JSON file into `T`.
///
/// # Errors
/// When the file is missing or does not parse as `T`.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConvertError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ConvertError::Config { path: path.into(), msg: e.to_string() })
}

impl HfConfig {
    /// Checks the config describes a plain Llama this converter supports.
    ///
    /// # Errors
    /// On biases, activations or rope scalings a llama GGUF cannot express.
    pub fn check(&self, path: &Path) -> Result<(), ConvertError> {
        let bad = |msg: String| Err(ConvertError::Config { path: path.into(), msg });
        if let Some(t) = &self.model_type {
            if t != "llama" {
                return bad(format!("model_type '{t}' is not supported (only llama bases)"));
            }
        }
        if self.attention_bias || self.mlp_bias {
            return bad("attention or MLP biases are not supported by llama GGUFs".into());
        }
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return bad(format!("hidden_act '{act}' is not supported (SwiGLU/silu only)"));
            }
        }
        if let Some(rs) = &self.rope_scaling {
            if rs.rope_type != "llama3" && rs.rope_type != "default" {
                return bad(format!("rope_scaling type '{}' is not supported (llama3 or none)", rs.rope_type));
            }
        }
        // Values that would make non-finite weights or divide by zero at run time.
        let mut numbers = vec![("rms_norm_eps", Some(self.rms_norm_eps)), ("rope_theta", Some(self.rope_theta))];
        if let Some(rs) = self.rope_scaling.as_ref().filter(|r| r.rope_type == "llama3") {
            numbers.extend([
                ("rope_scaling.factor", rs.factor),
                ("rope_scaling.low_freq_factor", rs.low_freq_factor),
                ("rope_scaling.high_freq_factor", rs.high_freq_factor),
                ("rope_scaling.original_max_position_embeddings", rs.original_max_position_embeddings),
            ]);
            if rs.high_freq_factor.unwrap_or(4.0) <= rs.low_freq_factor.unwrap_or(1.0) {
                return bad("rope_scaling.high_freq_factor must exceed low_freq_factor".into());
            }
        }
        for (name, v) in numbers {
            if let Some(v) = v.filter(|v| !v.is_finite() || *v <= 0.0 || !(*v as f32).is_normal()) {
                return bad(format!("{name} {v} must be a finite positive number"));
            }
        }
        if let Some(bad_freq) = self.llama3_rope_freqs().and_then(|f| f.into_iter().find(|x| !x.is_normal())) {
            return bad(format!("rope_scaling makes a rope frequency factor of {bad_freq}"));
        }
        Ok(())
    }

    /// Head size.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Llama 3 rope frequency divisors (`rope_freqs.weight`), as llama.cpp's
    /// converter computes them, or `None` without llama3 scaling.
    pub fn llama3_rope_freqs(&self) -> Option<Vec<f32>> {
        let rs = self.rope_scaling.as_ref().filter(|r| r.rope_type == "llama3")?;
        let factor = rs.factor.unwrap_or(8.0);
        let low = rs.low_freq_factor.unwrap_or(1.0);
        let high = rs.high_freq_factor.unwrap_or(4.0);
        let old_ctx = rs.original_max_position_embeddings.unwrap_or(8192.0);
        let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
        let dim = self.head_dim();
        Some(
            (0..dim / 2)
                .map(|i| {
                    let freq = 1.0 / self.rope_theta.powf((2 * i) as f64 / dim as f64);
                    let wavelen = 2.0 * std::f64::consts::PI / freq;
                    let f = if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        factor
                    } else {
                        let smooth = (old_ctx / wavelen - low) / (high - low);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    };
                    f as f32
                })
                .collect(),
        )
    }

    /// The hyper-parameters, with the HAMburger ones taken from (in order of
    /// precedence) `overrides`, then `json`, then `ckpt_max_steps`, then the release's defaults.
    pub fn hparams(&self, json: &HamburgerJson, overrides: &HamburgerJson, ckpt_max_steps: Option<usize>) -> HParams {
        let pick = |o: Option<usize>, j: Option<usize>| o.or(j);
        HParams {
            n_vocab: self.vocab_size,
            n_embd: self.hidden_size,
            n_layer: self.num_hidden_layers,
            n_head: self.num_attention_heads,
            n_head_kv: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self.head_dim(),
            n_ff: self.intermediate_size,
            rms_eps: self.rms_norm_eps as f32,
            rope_freq_base: self.rope_theta as f32,
            n_rot: self.head_dim(),
            n_ctx_train: self.max_position_embeddings,
            max_steps: pick(overrides.max_steps, json.max_steps).or(ckpt_max_steps).unwrap_or(DEFAULT_MAX_STEPS),
            n_micro_layer: pick(overrides.micro_layers, json.micro_layers).unwrap_or(DEFAULT_MICRO_LAYERS),
            feature_layers: overrides
                .feature_layers
                .clone()
                .or_else(|| json.feature_layers.clone())
                .unwrap_or_else(|| default_feature_layers(self.num_hidden_layers)),
            n_merger_head: pick(overrides.merger_heads, json.merger_heads).unwrap_or(DEFAULT_MERGER_HEADS),
            // The checkpoint's tensors say it (`plan::draft_copy_ngram`).
            draft_copy_ngram: 0,
        }
    }
}

//! The hyper-parameters of a HAMburger model: one struct, read and validated
//! once, with derived sizes as methods and the expected tensor shapes.

use ggml::gguf::{Array, Gguf, Value};

use crate::error::{Error, Result};
use crate::model::arch::{Key, LayerTensor, MergerLinear, Part, StopLinear, TensorName, TensorSet, ARCH_HAMBURGER};

/// The released model's feature layers (of 16), used when nothing else says.
pub const DEFAULT_FEATURE_LAYERS: [usize; 4] = [3, 7, 11, 15];
/// The released model's micro-decoder depth.
pub const DEFAULT_MICRO_LAYERS: usize = 4;
/// The released model's merger head count.
pub const DEFAULT_MERGER_HEADS: usize = 64;
/// The released model's most tokens per macro step.
pub const DEFAULT_MAX_STEPS: usize = 4;

/// Hyper-parameters of the base model and the grafted modules.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    /// Vocabulary size V.
    pub n_vocab: usize,
    /// Hidden size D.
    pub n_embd: usize,
    /// Base layers L.
    pub n_layer: usize,
    /// Attention heads H.
    pub n_head: usize,
    /// Key/value heads Hkv.
    pub n_head_kv: usize,
    /// Size of one attention head.
    pub head_dim: usize,
    /// MLP width.
    pub n_ff: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rope theta.
    pub rope_freq_base: f32,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Trained context length.
    pub n_ctx_train: usize,
    /// Most tokens one macro step may emit (S).
    pub max_steps: usize,
    /// Micro-step decoder layers.
    pub n_micro_layer: usize,
    /// Base layers whose last-position outputs are the micro decoder's features
    /// (strictly increasing; the last is the final layer, taken after the final norm).
    pub feature_layers: Vec<usize>,
    /// Merger attention heads (Hm).
    pub n_merger_head: usize,
    /// The longest n-gram the draft head copies from (M; 0: its micro
    /// decoder reads no copy candidates, and the file has no `draft_copy.weight`).
    pub draft_copy_ngram: usize,
}

impl HParams {
    /// Query width H x head_dim.
    pub fn n_embd_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width Hkv x head_dim.
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Number of features F fed to the micro decoder.
    pub fn n_features(&self) -> usize {
        self.feature_layers.len()
    }

    /// Input width of the merger's key/value projections (D + D/2).
    pub fn merger_in(&self) -> usize {
        self.n_embd + self.n_embd / 2
    }

    /// Size of one merger head (D / Hm).
    pub fn merger_head_dim(&self) -> usize {
        self.n_embd / self.n_merger_head.max(1)
    }

    /// These hyper-parameters as the runtime runs a base-only (llama) model:
    /// one token per forward (`max_steps` 1), no micro decoder, and the
    /// final layer as the only feature layer, so that nothing is sized for
    /// grafted modules the file does not have. (Checked before: a micro
    /// decoder of 0 layers is no valid HAMburger.)
    pub fn without_grafted(self) -> HParams {
        HParams { max_steps: 1, n_micro_layer: 0, feature_layers: vec![self.n_layer - 1], draft_copy_ngram: 0, ..self }
    }

    /// Every inconsistency, one line each (empty when valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let positive = [
            ("vocab size", self.n_vocab),
            ("embedding length", self.n_embd),
            ("block count", self.n_layer),
            ("head count", self.n_head),
            ("kv head count", self.n_head_kv),
            ("head dim", self.head_dim),
            ("feed-forward length", self.n_ff),
            ("max steps", self.max_steps),
            ("micro block count", self.n_micro_layer),
            ("merger head count", self.n_merger_head),
        ];
        for (what, v) in positive {
            if v == 0 {
                p.push(format!("{what} must be positive"));
            }
        }
        // Bounds that keep a hostile file from sizing tables by its claims (llama.cpp caps layers at 512).
        let caps = [
            ("block count", self.n_layer, 512),
            ("micro block count", self.n_micro_layer, 64),
            ("max steps", self.max_steps, 64),
            ("feature layer count", self.feature_layers.len(), 64),
            ("head count", self.n_head, 1 << 12),
            // Real heads are 64 to 256 wide; beyond this only a hostile file goes.
            ("head dim", self.head_dim, 1 << 12),
            ("feed-forward length", self.n_ff, 1 << 22),
            ("embedding length", self.n_embd, 1 << 20),
            ("vocab size", self.n_vocab, 1 << 24),
            ("draft copy n-gram", self.draft_copy_ngram, 8),
        ];
        for (what, v, max) in caps {
            if v > max {
                p.push(format!("{what} {v} exceeds {max}"));
            }
        }
        if self.n_head_kv > 0 && !self.n_head.is_multiple_of(self.n_head_kv) {
            p.push(format!("head count {} is not a multiple of kv head count {}", self.n_head, self.n_head_kv));
        }
        if self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            p.push(format!("rope dimension {} does not fit head dim {}", self.n_rot, self.head_dim));
        }
        if !self.n_embd.is_multiple_of(2) {
            p.push(format!("embedding length {} is odd (the merger's position table is D/2 wide)", self.n_embd));
        }
        if self.n_merger_head > 0 && !self.n_embd.is_multiple_of(self.n_merger_head) {
            p.push(format!(
                "merger head count {} does not divide embedding length {}",
                self.n_merger_head, self.n_embd
            ));
        }
        if self.feature_layers.is_empty() {
            p.push("feature layers are empty".into());
        } else {
            if self.feature_layers.windows(2).any(|w| w[0] >= w[1]) {
                p.push(format!("feature layers {:?} are not strictly increasing", self.feature_layers));
            }
            if self.feature_layers.last() != Some(&(self.n_layer.saturating_sub(1))) {
                p.push(format!(
                    "the last feature layer must be the final layer {} (got {:?})",
                    self.n_layer.saturating_sub(1),
                    self.feature_layers
                ));
            }
        }
        if !self.rms_eps.is_finite() || self.rms_eps <= 0.0 {
            p.push(format!("rms epsilon {} must be finite and positive", self.rms_eps));
        }
        if !self.rope_freq_base.is_finite() || self.rope_freq_base <= 0.0 {
            p.push(format!("rope base {} must be finite and positive", self.rope_freq_base));
        }
        p
    }

    /// Checks [`HParams::problems`].
    ///
    /// # Errors
    /// Every problem, in one message.
    pub fn validate(&self, source: &str) -> Result<()> {
        let p = self.problems();
        if p.is_empty() {
            Ok(())
        } else {
            Err(Error::HParams { origin: source.into(), problems: p.join("; ") })
        }
    }

    /// Reads the hyper-parameters of architecture `arch` from GGUF metadata,
    /// reporting every missing or mistyped key at once. A `llama` file gets the
    /// HAMburger defaults for the grafted modules (it has none).
    ///
    /// # Errors
    /// Missing/mistyped keys or inconsistent values.
    pub fn from_gguf(gguf: &Gguf, arch: &str) -> Result<HParams> {
        let mut missing = Vec::new();
        let mut int = |key: Key, default: Option<usize>| -> Result<usize> {
            let name = key.name(arch);
            Ok(match gguf.get_usize(&name)? {
                Some(v) => v,
                None => default.unwrap_or_else(|| {
                    missing.push(name);
                    0
                }),
            })
        };
        let n_embd = int(Key::EmbeddingLength, None)?;
        let n_head = int(Key::HeadCount, None)?;
        let n_layer = int(Key::BlockCount, None)?;
        let head_dim = int(Key::KeyLength, Some(n_embd.checked_div(n_head).unwrap_or(0)))?;
        let grafted = arch == ARCH_HAMBURGER;
        let req = |d: usize| if grafted { None } else { Some(d) };
        let mut hp = HParams {
            n_vocab: int(Key::VocabSize, Some(0))?,
            n_embd,
            n_layer,
            n_head,
            n_head_kv: int(Key::HeadCountKv, Some(n_head))?,
            head_dim,
            n_ff: int(Key::FeedForwardLength, None)?,
            rms_eps: 0.0,
            rope_freq_base: 10000.0,
            n_rot: int(Key::RopeDimensionCount, Some(head_dim))?,
            n_ctx_train: int(Key::ContextLength, None)?,
            max_steps: int(Key::MaxSteps, req(DEFAULT_MAX_STEPS))?,
            n_micro_layer: int(Key::MicroBlockCount, req(DEFAULT_MICRO_LAYERS))?,
            feature_layers: Vec::new(),
            n_merger_head: int(Key::MergerHeadCount, req(DEFAULT_MERGER_HEADS))?,
            draft_copy_ngram: if grafted { int(Key::DraftCopyNgram, Some(0))? } else { 0 },
        };
        match gguf.get_f64(&Key::RmsEps.name(arch))? {
            Some(e) => hp.rms_eps = e as f32,
            None => missing.push(Key::RmsEps.name(arch)),
        }
        if let Some(b) = gguf.get_f64(&Key::RopeFreqBase.name(arch))? {
            hp.rope_freq_base = b as f32;
        }
        let fl_key = Key::FeatureLayers.name(arch);
        match gguf.get_array(&fl_key)? {
            Some(a) => match a.as_ints() {
                Some(v) if v.iter().all(|&x| x >= 0) => hp.feature_layers = v.into_iter().map(|x| x as usize).collect(),
                _ => missing.push(format!("{fl_key} (as non-negative integers)")),
            },
            None if grafted => missing.push(fl_key),
            None => hp.feature_layers = default_feature_layers(n_layer),
        }
        if hp.n_vocab == 0 {
            // llama.cpp files may omit vocab_size; the token list has it.
            if let Some(Value::Array(a)) = gguf.get(crate::model::arch::keys::TOKENIZER_TOKENS) {
                hp.n_vocab = a.len();
            }
        }
        if !missing.is_empty() {
            return Err(Error::MissingKeys { path: gguf.path.clone(), keys: missing.join(", ") });
        }
        hp.validate(&gguf.path.display().to_string())?;
        Ok(hp)
    }

    /// The metadata of these hyper-parameters for architecture `arch` (the
    /// HAMburger keys only when `arch` is `hamburger`).
    pub fn to_metadata(&self, arch: &str) -> Vec<(String, Value)> {
        let u = |v: usize| Value::U32(v as u32);
        let mut kv = vec![
            (Key::ContextLength, u(self.n_ctx_train)),
            (Key::EmbeddingLength, u(self.n_embd)),
            (Key::BlockCount, u(self.n_layer)),
            (Key::FeedForwardLength, u(self.n_ff)),
            (Key::HeadCount, u(self.n_head)),
            (Key::HeadCountKv, u(self.n_head_kv)),
            (Key::RmsEps, Value::F32(self.rms_eps)),
            (Key::RopeFreqBase, Value::F32(self.rope_freq_base)),
            (Key::RopeDimensionCount, u(self.n_rot)),
            (Key::KeyLength, u(self.head_dim)),
            (Key::ValueLength, u(self.head_dim)),
            (Key::VocabSize, u(self.n_vocab)),
        ];
        if arch == ARCH_HAMBURGER {
            kv.extend([
                (Key::MaxSteps, u(self.max_steps)),
                (Key::MicroBlockCount, u(self.n_micro_layer)),
                (Key::FeatureLayers, Value::Array(Array::U32(self.feature_layers.iter().map(|&l| l as u32).collect()))),
                (Key::MergerHeadCount, u(self.n_merger_head)),
            ]);
            if self.draft_copy_ngram > 0 {
                kv.push((Key::DraftCopyNgram, u(self.draft_copy_ngram)));
            }
        }
        kv.into_iter().map(|(k, v)| (k.name(arch), v)).collect()
    }

    /// Every tensor of `set` with its shape in ggml order, in file order.
    pub fn tensor_shapes(&self, set: TensorSet) -> Vec<(TensorName, Vec<i64>)> {
        let (d, v) = (self.n_embd as i64, self.n_vocab as i64);
        let mut out = vec![(TensorName::TokenEmbd, vec![d, v]), (TensorName::RopeFreqs, vec![self.n_rot as i64 / 2])];
        for il in 0..self.n_layer {
            for lt in LayerTensor::ALL {
                out.push((TensorName::Base(il, lt), self.layer_shape(lt)));
            }
        }
        out.push((TensorName::OutputNorm, vec![d]));
        out.push((TensorName::Output, vec![d, v]));
        let (m_in, s) = (self.merger_in() as i64, self.max_steps as i64);
        for (m, n_in) in
            [(MergerLinear::Q, d), (MergerLinear::K, m_in), (MergerLinear::V, m_in), (MergerLinear::Out, d)]
        {
            out.push((TensorName::Merger(m, Part::Weight), vec![n_in, d]));
            out.push((TensorName::Merger(m, Part::Bias), vec![d]));
        }
        out.push((TensorName::MergerPos, vec![d / 2, s]));
        for il in 0..self.n_micro_layer {
            for lt in LayerTensor::ALL {
                out.push((TensorName::Micro(il, lt), self.layer_shape(lt)));
            }
        }
        for il in 0..self.n_micro_layer {
            for lt in LayerTensor::ALL {
                out.push((TensorName::DraftMicro(il, lt), self.layer_shape(lt)));
            }
        }
        for (st, n_out) in [(StopLinear::Fc1, d), (StopLinear::Fc2, d), (StopLinear::Out, 1)] {
            for stop in [TensorName::Stop, TensorName::DraftStop] {
                out.push((stop(st, Part::Weight), vec![d, n_out]));
                out.push((stop(st, Part::Bias), vec![n_out]));
            }
        }
        out.push((TensorName::DraftCopy, vec![self.draft_copy_ngram as i64 * d, d]));
        out.retain(|(name, _)| set.contains(*name));
        out
    }

    fn layer_shape(&self, lt: LayerTensor) -> Vec<i64> {
        let (d, q, kv, ff) = (self.n_embd as i64, self.n_embd_q() as i64, self.n_embd_kv() as i64, self.n_ff as i64);
        match lt {
            LayerTensor::AttnNorm | LayerTensor::FfnNorm => vec![d],
            LayerTensor::AttnQ => vec![d, q],
            LayerTensor::AttnK | LayerTensor::AttnV => vec![d, kv],
            LayerTensor::AttnOutput => vec![q, d],
            LayerTensor::FfnGate | LayerTensor::FfnUp => vec![d, ff],
            LayerTensor::FfnDown => vec![ff, d],
        }
    }
}

/// Feature layers for a base of `n_layer` layers when none are given: the
/// released model's spacing (every quarter, ending at the last layer).
/// For 16 layers this is [`DEFAULT_FEATURE_LAYERS`].
pub fn default_feature_layers(n_layer: usize) -> Vec<usize> {
    (1..=4).map(|q| (n_layer * q / 4).saturating_sub(1)).collect()
}

/// Small valid hyper-parameters for the unit tests of the layouts: `n_layer`
/// base layers whose last `n_features` are the feature layers, and
/// `max_steps` tokens per macro step.
#[cfg(test)]
pub(crate) fn small(n_layer: usize, n_features: usize, max_steps: usize) -> HParams {
    HParams {
        n_vocab: 64,
        n_embd: 8,
        n_layer,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 4,
        n_ff: 16,
        rms_eps: 1e-5,
        rope_freq_base: 10000.0,
        n_rot: 4,
        n_ctx_train: 64,
        max_steps,
        n_micro_layer: 1,
        feature_layers: (n_layer - n_features..n_layer).collect(),
        n_merger_head: 2,
        draft_copy_ngram: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_hyper_parameters_are_valid() {
        assert_eq!(small(4, 2, 3).problems(), Vec::<String>::new());
    }

    #[test]
    fn default_feature_layers_follow_the_release() {
        assert_eq!(default_feature_layers(16), DEFAULT_FEATURE_LAYERS);
        assert_eq!(default_feature_layers(30), [6, 14, 21, 29]);
    }
}

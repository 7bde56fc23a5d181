//! Every tensor of the format: its name, and the table of its facts (module,
//! per layer or not, how the graph uses it and so whether it may be
//! quantized, required, optional or tied) that the loader, the placement,
//! the converter and the quantizer consult, as llama.cpp's `LLM_TENSOR_INFOS`.

use std::fmt;

/// A tensor of a transformer layer (base or micro decoder); llama.cpp's suffixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerTensor {
    /// RMSNorm before attention.
    AttnNorm,
    /// Query projection (rows permuted for ggml's rope).
    AttnQ,
    /// Key projection (rows permuted for ggml's rope).
    AttnK,
    /// Value projection.
    AttnV,
    /// Attention output projection.
    AttnOutput,
    /// RMSNorm before the MLP.
    FfnNorm,
    /// SwiGLU gate projection.
    FfnGate,
    /// SwiGLU up projection.
    FfnUp,
    /// MLP down projection.
    FfnDown,
}

impl LayerTensor {
    /// All layer tensors in file order.
    pub const ALL: [LayerTensor; 9] = [
        LayerTensor::AttnNorm,
        LayerTensor::AttnQ,
        LayerTensor::AttnK,
        LayerTensor::AttnV,
        LayerTensor::AttnOutput,
        LayerTensor::FfnNorm,
        LayerTensor::FfnGate,
        LayerTensor::FfnUp,
        LayerTensor::FfnDown,
    ];

    /// How a layer uses this tensor: the norms scale element-wise, the rest are matrices.
    fn usage(self) -> TensorUse {
        match self {
            LayerTensor::AttnNorm | LayerTensor::FfnNorm => TensorUse::Elementwise,
            _ => TensorUse::MatMul,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            LayerTensor::AttnNorm => "attn_norm",
            LayerTensor::AttnQ => "attn_q",
            LayerTensor::AttnK => "attn_k",
            LayerTensor::AttnV => "attn_v",
            LayerTensor::AttnOutput => "attn_output",
            LayerTensor::FfnNorm => "ffn_norm",
            LayerTensor::FfnGate => "ffn_gate",
            LayerTensor::FfnUp => "ffn_up",
            LayerTensor::FfnDown => "ffn_down",
        }
    }
}

/// A linear layer of the merger or stop head: weight or bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The weight matrix.
    Weight,
    /// The bias vector.
    Bias,
}

impl Part {
    /// A weight is multiplied, a bias added.
    fn usage(self) -> TensorUse {
        match self {
            Part::Weight => TensorUse::MatMul,
            Part::Bias => TensorUse::Elementwise,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Part::Weight => "weight",
            Part::Bias => "bias",
        }
    }
}

/// The linear layers of the compositional embedder (merger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MergerLinear {
    /// Query from the mean embedding (D x D).
    Q,
    /// Keys from `[e_j, P_j]` (D x 3D/2).
    K,
    /// Values from `[e_j, P_j]` (D x 3D/2).
    V,
    /// Output projection added to the mean (D x D).
    Out,
}

/// The linear layers of the stop head (Linear, SiLU, Linear, SiLU, Linear).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopLinear {
    /// First hidden layer (D x D).
    Fc1,
    /// Second hidden layer (D x D).
    Fc2,
    /// Output logit (1 x D).
    Out,
}

impl StopLinear {
    /// Its part of the tensor name.
    fn suffix(self) -> &'static str {
        match self {
            StopLinear::Fc1 => "fc1",
            StopLinear::Fc2 => "fc2",
            StopLinear::Out => "out",
        }
    }
}

/// Every tensor of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorName {
    /// Token embedding table `[D, V]`.
    TokenEmbd,
    /// Final RMSNorm weight `[D]`.
    OutputNorm,
    /// Untied lm_head `[D, V]` (absent when tied to the embedding).
    Output,
    /// Llama-3 rope frequency divisors `[head_dim/2]`.
    RopeFreqs,
    /// A base layer tensor.
    Base(usize, LayerTensor),
    /// A micro-step decoder layer tensor.
    Micro(usize, LayerTensor),
    /// A merger projection.
    Merger(MergerLinear, Part),
    /// The merger's in-chunk position table `[D/2, S]`.
    MergerPos,
    /// A stop-head layer.
    Stop(StopLinear, Part),
    /// A draft head's micro-decoder layer tensor: the micro decoder that
    /// self-verified decoding drafts with, when the file has one.
    DraftMicro(usize, LayerTensor),
    /// A draft head's stop-head layer: the gate's signal when drafting.
    DraftStop(StopLinear, Part),
    /// A draft head's copy matrix `[M*D, D]`: its micro decoder adds
    /// `copy . [embed(c_M); ...; embed(c_1)]` to each token's embedding,
    /// c_m the copy candidate of the text's last m tokens (a missing one a
    /// zero vector).
    DraftCopy,
}

/// The module a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    /// The base Llama model (all of a base-only export).
    Base,
    /// The compositional embedder.
    Merger,
    /// The micro-step decoder.
    Micro,
    /// The stop head.
    StopHead,
}

/// How the graph uses a tensor (llama.cpp's op column of `LLM_TENSOR_INFOS`),
/// which decides the types it may have and where it may be repacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorUse {
    /// Rows looked up by token id (the embedding table).
    Lookup,
    /// A matrix multiplied with activations: any type ggml's matrix
    /// product takes, quantized ones included.
    MatMul,
    /// Added to or multiplied element-wise into activations (norms, biases,
    /// rope factors, the merger's position table): F32 only, since ggml's
    /// element-wise ops take no quantized operand.
    Elementwise,
}

/// Whether a file must hold a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Presence {
    /// Always there.
    Required,
    /// There only when the model uses it.
    Optional,
    /// Absent when tied: the named tensor stands in for it.
    TiedTo(TensorName),
    /// Part of the optional draft head: a file holds all of it or none.
    DraftHead,
    /// The draft head's copy matrix: there when the file's
    /// `hamburger.draft_copy_ngram` says the head copies.
    DraftCopy,
}

/// The facts of one tensor every reader of the format consults: the loader,
/// the placement, the converter and the quantizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    /// The module it belongs to.
    pub module: Module,
    /// Whether there is one per layer of its module's stack.
    pub per_layer: bool,
    /// How the graph uses it.
    pub usage: TensorUse,
    /// Whether a file must hold it.
    pub presence: Presence,
}

impl TensorInfo {
    /// Whether the tensor must be stored as F32 (it is never quantized).
    pub fn f32_only(self) -> bool {
        self.usage == TensorUse::Elementwise
    }
}

impl TensorName {
    /// The tensor's facts: one table for the whole format.
    pub fn info(self) -> TensorInfo {
        use Presence::{DraftCopy, DraftHead, Optional, Required, TiedTo};
        use TensorUse::{Elementwise, Lookup, MatMul};
        let info = |module, per_layer, usage, presence| TensorInfo { module, per_layer, usage, presence };
        match self {
            TensorName::TokenEmbd => info(Module::Base, false, Lookup, Required),
            TensorName::OutputNorm => info(Module::Base, false, Elementwise, Required),
            TensorName::Output => info(Module::Base, false, MatMul, TiedTo(TensorName::TokenEmbd)),
            TensorName::RopeFreqs => info(Module::Base, false, Elementwise, Optional),
            TensorName::Base(_, lt) => info(Module::Base, true, lt.usage(), Required),
            TensorName::Micro(_, lt) => info(Module::Micro, true, lt.usage(), Required),
            TensorName::Merger(_, part) => info(Module::Merger, false, part.usage(), Required),
            TensorName::MergerPos => info(Module::Merger, false, Elementwise, Required),
            TensorName::Stop(_, part) => info(Module::StopHead, false, part.usage(), Required),
            TensorName::DraftMicro(_, lt) => info(Module::Micro, true, lt.usage(), DraftHead),
            TensorName::DraftStop(_, part) => info(Module::StopHead, false, part.usage(), DraftHead),
            TensorName::DraftCopy => info(Module::Micro, false, MatMul, DraftCopy),
        }
    }

    /// Whether the tensor belongs to the base model (and so to a base-only export).
    pub fn is_base(self) -> bool {
        self.info().module == Module::Base
    }

    /// Parses a GGUF tensor name.
    pub fn parse(name: &str) -> Option<TensorName> {
        let simple = [
            TensorName::TokenEmbd,
            TensorName::OutputNorm,
            TensorName::Output,
            TensorName::RopeFreqs,
            TensorName::MergerPos,
            TensorName::DraftCopy,
        ];
        if let Some(t) = simple.into_iter().find(|t| t.to_string() == name) {
            return Some(t);
        }
        let parts = [Part::Weight, Part::Bias];
        for m in [MergerLinear::Q, MergerLinear::K, MergerLinear::V, MergerLinear::Out] {
            for p in parts {
                if TensorName::Merger(m, p).to_string() == name {
                    return Some(TensorName::Merger(m, p));
                }
            }
        }
        for s in [StopLinear::Fc1, StopLinear::Fc2, StopLinear::Out] {
            for p in parts {
                for t in [TensorName::Stop(s, p), TensorName::DraftStop(s, p)] {
                    if t.to_string() == name {
                        return Some(t);
                    }
                }
            }
        }
        type Stack = fn(usize, LayerTensor) -> TensorName;
        let stacks: [(&str, Stack); 3] =
            [("micro.blk.", TensorName::Micro), ("draft.blk.", TensorName::DraftMicro), ("blk.", TensorName::Base)];
        let (stack, rest) = stacks.into_iter().find_map(|(prefix, stack)| Some((stack, name.strip_prefix(prefix)?)))?;
        let (layer, rest) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let suffix = rest.strip_suffix(".weight")?;
        let lt = LayerTensor::ALL.into_iter().find(|t| t.suffix() == suffix)?;
        Some(stack(layer, lt))
    }
}

/// Which of the format's tensors one file holds: its optional ones, and
/// whether the grafted modules are there at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TensorSet {
    /// The lm_head is the embedding: `output.weight` is absent.
    pub tied_output: bool,
    /// Llama-3's rope frequency table `rope_freqs.weight` is present.
    pub rope_freqs: bool,
    /// Only the base model's tensors (a base-only llama export).
    pub base_only: bool,
    /// The draft head (`draft.blk.N.*`, `draft_stop.*`) is present.
    pub draft_head: bool,
    /// The draft head's copy matrix (`draft_copy.weight`) is present.
    pub draft_copy: bool,
}

impl TensorSet {
    /// The set of a file holding every grafted module and the tensors for
    /// which `present` says yes among those that are not required.
    pub fn of_file(present: impl Fn(TensorName) -> bool) -> TensorSet {
        TensorSet {
            tied_output: !present(TensorName::Output),
            rope_freqs: present(TensorName::RopeFreqs),
            base_only: false,
            // One of its tensors is enough: the rest are then expected, and
            // a missing one is named.
            draft_head: present(TensorName::DraftStop(StopLinear::Fc1, Part::Weight))
                || present(TensorName::DraftMicro(0, LayerTensor::AttnNorm)),
            draft_copy: present(TensorName::DraftCopy),
        }
    }

    /// Whether the set holds tensor `name` (`rope_freqs.weight` is the
    /// format's one optional tensor, the draft head its one optional group,
    /// `output.weight` its one tied tensor).
    pub fn contains(&self, name: TensorName) -> bool {
        let info = name.info();
        let present = match info.presence {
            Presence::Required => true,
            Presence::TiedTo(_) => !self.tied_output,
            Presence::Optional => self.rope_freqs,
            Presence::DraftHead => self.draft_head,
            Presence::DraftCopy => self.draft_copy,
        };
        present && (info.module == Module::Base || !self.base_only)
    }
}

impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TensorName::TokenEmbd => f.write_str("token_embd.weight"),
            TensorName::OutputNorm => f.write_str("output_norm.weight"),
            TensorName::Output => f.write_str("output.weight"),
            TensorName::RopeFreqs => f.write_str("rope_freqs.weight"),
            TensorName::Base(i, t) => write!(f, "blk.{i}.{}.weight", t.suffix()),
            TensorName::Micro(i, t) => write!(f, "micro.blk.{i}.{}.weight", t.suffix()),
            TensorName::Merger(m, p) => {
                let m = match m {
                    MergerLinear::Q => "attn_q",
                    MergerLinear::K => "attn_k",
                    MergerLinear::V => "attn_v",
                    MergerLinear::Out => "attn_output",
                };
                write!(f, "merger.{m}.{}", p.suffix())
            }
            TensorName::MergerPos => f.write_str("merger.pos_embd.weight"),
            TensorName::DraftMicro(i, t) => write!(f, "draft.blk.{i}.{}.weight", t.suffix()),
            TensorName::Stop(s, p) => write!(f, "stop_head.{}.{}", s.suffix(), p.suffix()),
            TensorName::DraftStop(s, p) => write!(f, "draft_stop.{}.{}", s.suffix(), p.suffix()),
            TensorName::DraftCopy => f.write_str("draft_copy.weight"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let mut all = vec![
            TensorName::TokenEmbd,
            TensorName::OutputNorm,
            TensorName::Output,
            TensorName::RopeFreqs,
            TensorName::MergerPos,
            TensorName::DraftCopy,
        ];
        for lt in LayerTensor::ALL {
            all.push(TensorName::Base(12, lt));
            all.push(TensorName::Micro(3, lt));
            all.push(TensorName::DraftMicro(1, lt));
        }
        for m in [MergerLinear::Q, MergerLinear::K, MergerLinear::V, MergerLinear::Out] {
            all.push(TensorName::Merger(m, Part::Weight));
            all.push(TensorName::Merger(m, Part::Bias));
        }
        for s in [StopLinear::Fc1, StopLinear::Fc2, StopLinear::Out] {
            all.push(TensorName::Stop(s, Part::Bias));
            all.push(TensorName::DraftStop(s, Part::Weight));
        }
        for t in all {
            assert_eq!(TensorName::parse(&t.to_string()), Some(t), "{t}");
        }
        assert_eq!(TensorName::parse("blk.x.attn_q.weight"), None);
        assert_eq!(TensorName::parse("blk.1.attn_q.bias"), None);
    }

    #[test]
    fn vectors_and_tables_are_f32_only_and_matrices_may_be_quantized() {
        let cases = [
            (TensorName::OutputNorm, true),
            (TensorName::RopeFreqs, true),
            (TensorName::MergerPos, true),
            (TensorName::Base(0, LayerTensor::AttnNorm), true),
            (TensorName::Micro(1, LayerTensor::FfnNorm), true),
            (TensorName::Merger(MergerLinear::K, Part::Bias), true),
            (TensorName::Stop(StopLinear::Out, Part::Bias), true),
            (TensorName::TokenEmbd, false),
            (TensorName::Output, false),
            (TensorName::Base(0, LayerTensor::AttnQ), false),
            (TensorName::Micro(1, LayerTensor::FfnDown), false),
            (TensorName::Merger(MergerLinear::K, Part::Weight), false),
            (TensorName::Stop(StopLinear::Out, Part::Weight), false),
        ];
        for (t, f32_only) in cases {
            assert_eq!(t.info().f32_only(), f32_only, "{t}");
        }
    }

    #[test]
    fn a_set_holds_the_optional_tensors_it_names_and_its_modules() {
        let merger = TensorName::Merger(MergerLinear::Q, Part::Weight);
        let all = TensorSet::of_file(|_| true);
        assert!(all.contains(TensorName::Output) && all.contains(TensorName::RopeFreqs) && all.contains(merger));
        let draft =
            |t: TensorName| matches!(t, TensorName::DraftMicro(..) | TensorName::DraftStop(..) | TensorName::DraftCopy);
        let tied = TensorSet::of_file(|t| t != TensorName::Output && t != TensorName::RopeFreqs && !draft(t));
        let none =
            TensorSet { tied_output: true, rope_freqs: false, base_only: false, draft_head: false, draft_copy: false };
        assert_eq!(tied, none);
        assert!(all.contains(TensorName::DraftCopy) && !tied.contains(TensorName::DraftCopy));
        assert!(all.draft_head && all.contains(TensorName::DraftStop(StopLinear::Out, Part::Bias)));
        assert!(!tied.contains(TensorName::DraftMicro(0, LayerTensor::AttnQ)));
        assert!(!tied.contains(TensorName::Output) && !tied.contains(TensorName::RopeFreqs));
        assert!(tied.contains(TensorName::TokenEmbd) && tied.contains(TensorName::Micro(0, LayerTensor::AttnQ)));
        let base = TensorSet { base_only: true, ..all };
        assert!(base.contains(TensorName::Base(3, LayerTensor::FfnUp)) && base.contains(TensorName::Output));
        assert!(!base.contains(merger) && !base.contains(TensorName::MergerPos));
        assert!(!base.contains(TensorName::Stop(StopLinear::Fc1, Part::Bias)));
    }
}

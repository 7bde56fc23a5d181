//! The per-role type policy: which tensors keep full precision and which
//! follow the requested type (with a fallback when rows do not fit its blocks).

use ggml::Type;
use hamburger::arch::{MergerLinear, Part, StopLinear, TensorName};

/// What a tensor does, for choosing its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Norm weights, biases, rope factors: 1-D, always F32.
    Vector,
    /// The token embedding table.
    TokenEmbd,
    /// The untied lm_head.
    Output,
    /// A base layer matrix.
    BaseMatrix,
    /// A micro-decoder layer matrix.
    MicroMatrix,
    /// A merger projection.
    Merger,
    /// The merger's in-chunk position table (added to embeddings, not multiplied).
    MergerPos,
    /// A hidden stop-head layer.
    StopHidden,
    /// The stop head's final 1 x D row.
    StopOut,
}

impl Role {
    /// The role of a tensor of the format.
    pub fn of(name: TensorName) -> Role {
        match name {
            TensorName::TokenEmbd => Role::TokenEmbd,
            TensorName::Output => Role::Output,
            TensorName::OutputNorm | TensorName::RopeFreqs => Role::Vector,
            TensorName::Base(_, lt) | TensorName::Micro(_, lt) if is_norm(lt) => Role::Vector,
            TensorName::Base(..) => Role::BaseMatrix,
            TensorName::Micro(..) => Role::MicroMatrix,
            TensorName::Merger(_, Part::Bias) | TensorName::Stop(_, Part::Bias) => Role::Vector,
            TensorName::Merger(MergerLinear::Q | MergerLinear::K | MergerLinear::V | MergerLinear::Out, Part::Weight) => {
                Role::Merger
            }
            TensorName::MergerPos => Role::MergerPos,
            TensorName::Stop(StopLinear::Out, Part::Weight) => Role::StopOut,
            TensorName::Stop(_, Part::Weight) => Role::StopHidden,
        }
    }
}

fn is_norm(lt: hamburger::arch::LayerTensor) -> bool {
    use hamburger::arch::LayerTensor::*;
    matches!(lt, AttnNorm | FfnNorm)
}

/// The type a converter gives tensor `name` (row length `row_len`) when the
/// requested output type is `target`, with a note when it had to fall back.
///
/// Vectors, the position table and the stop head's output row stay F32 (they
/// are tiny and feed additions or a threshold); everything else takes `target`,
/// or, when its rows do not fit `target`'s blocks, the nearest type that fits.
pub fn conversion_type(name: TensorName, row_len: usize, target: Type) -> (Type, Option<String>) {
    match Role::of(name) {
        Role::Vector | Role::MergerPos | Role::StopOut => (Type::F32, None),
        _ => fit(target, row_len).map_or((target, None), |(t, why)| (t, Some(why))),
    }
}

/// When rows of `row_len` do not fit `target`'s blocks, a type that does
/// (the same bits where possible), with the reason.
pub fn fit(target: Type, row_len: usize) -> Option<(Type, String)> {
    if row_len % target.block_size() == 0 {
        return None;
    }
    let fallbacks: &[Type] = match target {
        Type::Q2_K | Type::Q3_K | Type::IQ4_XS => &[Type::IQ4_NL, Type::Q4_0, Type::Q5_0, Type::Q8_0],
        Type::Q4_K => &[Type::Q5_0, Type::Q5_1, Type::Q8_0],
        Type::Q5_K => &[Type::Q5_1, Type::Q8_0],
        Type::Q6_K => &[Type::Q8_0],
        _ => &[Type::Q8_0],
    };
    let t = fallbacks
        .iter()
        .copied()
        .find(|t| row_len % t.block_size() == 0)
        .unwrap_or(Type::F16);
    Some((t, format!("rows of {row_len} do not fit {target} blocks of {}", target.block_size())))
}

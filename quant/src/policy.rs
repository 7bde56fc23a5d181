//! The per-role type policy: which type every tensor of a HAMburger (or
//! base-only llama) GGUF gets for a mix, with the user's overrides applied and
//! a fallback when rows do not fit the type's blocks. docs/quantization.md
//! explains and measures the choices.

use ggml::Type;
use hamburger::arch::{Module, StopLinear, TensorName};

use crate::Mix;

/// What a tensor does, for choosing its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Norm weights, biases, rope factors: always F32.
    Vector,
    /// The token embedding table (untied).
    TokenEmbd,
    /// The lm_head: `output.weight`, or the embedding when tied.
    Output,
    /// A base layer matrix.
    Base,
    /// A micro-decoder layer matrix.
    Micro,
    /// A merger projection.
    Merger,
    /// The merger's position table (added to embeddings): F32.
    MergerPos,
    /// A hidden stop-head layer.
    StopHidden,
    /// The stop head's final row: F32.
    StopOut,
}

impl Role {
    /// The role of `name` (by the format's table of tensor facts); `tied`
    /// says whether the embedding is also the lm_head.
    pub fn of(name: TensorName, tied: bool) -> Role {
        let info = name.info();
        match (info.module, name) {
            (_, TensorName::MergerPos) => Role::MergerPos,
            _ if info.f32_only() => Role::Vector,
            (_, TensorName::TokenEmbd) if tied => Role::Output,
            (_, TensorName::TokenEmbd) => Role::TokenEmbd,
            (Module::Base, _) if info.per_layer => Role::Base,
            (Module::Base, _) => Role::Output,
            (Module::Micro, _) => Role::Micro,
            (Module::Merger, _) => Role::Merger,
            (Module::StopHead, TensorName::Stop(StopLinear::Out, _) | TensorName::DraftStop(StopLinear::Out, _)) => {
                Role::StopOut
            }
            (Module::StopHead, _) => Role::StopHidden,
        }
    }

    /// A short name for plans and tables.
    pub fn label(self) -> &'static str {
        match self {
            Role::Vector => "vector",
            Role::TokenEmbd => "token_embd",
            Role::Output => "output",
            Role::Base => "base",
            Role::Micro => "micro",
            Role::Merger => "merger",
            Role::MergerPos => "merger_pos",
            Role::StopHidden => "stop_hidden",
            Role::StopOut => "stop_out",
        }
    }
}

/// The shape facts a mix's layer rules need.
#[derive(Debug, Clone, Copy)]
pub struct Stacks {
    /// Base layers.
    pub n_layer: usize,
    /// Micro-decoder layers.
    pub n_micro: usize,
    /// Query heads per key/value head.
    pub n_gqa: usize,
}

/// User overrides, llama-quantize's flags.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Every matrix gets the mix's default type (no per-tensor bumps).
    pub pure: bool,
    /// Type of the lm_head.
    pub output: Option<Type>,
    /// Type of the (untied) token embedding.
    pub token_embd: Option<Type>,
    /// Type of the grafted matrices (merger, micro decoder, stop head hidden layers).
    pub grafted: Option<Type>,
    /// `(pattern, type)` overrides by tensor name; the first match wins.
    pub tensor_types: Vec<(regex::Regex, Type)>,
}

/// The type chosen for one tensor, with a note when it had to fall back.
#[derive(Debug, Clone)]
pub struct Choice {
    /// The type.
    pub ty: Type,
    /// Why it is not the type the rules asked for, if so.
    pub fallback: Option<String>,
}

/// The type of tensor `name` (shape `ne`, ggml order) under `mix` and `ov`.
///
/// What the format keeps F32 (vectors, the merger's position table) stays
/// F32, and so does the stop head's output row (one row of D whose sigmoid
/// is thresholded). Base matrices follow llama.cpp's rules for the mix; micro-decoder
/// matrices follow the same rules as a stack of their own (so its last layers
/// get the mix's extra bits); merger and stop-head hidden layers stay at Q8_0
/// in mixes below 8 bits (they run once per macro step and steer its
/// boundaries, for 2% of the weights); the lm_head gets the mix's output type.
pub fn choose(name: TensorName, ne: &[i64], tied: bool, mix: Mix, stacks: Stacks, ov: &Overrides) -> Choice {
    let role = Role::of(name, tied);
    if name.info().f32_only() || role == Role::StopOut || ne.len() < 2 {
        return Choice { ty: Type::F32, fallback: None };
    }
    let row = ne[0] as usize;
    let full = name.to_string();
    let manual = ov.tensor_types.iter().find(|(re, _)| re.is_match(&full)).map(|(_, t)| *t);
    let grafted_role = matches!(role, Role::Merger | Role::Micro | Role::StopHidden);
    let wanted = manual
        .or(match role {
            Role::Output => ov.output,
            Role::TokenEmbd => ov.token_embd,
            _ if grafted_role => ov.grafted,
            _ => None,
        })
        .unwrap_or_else(|| {
            let d = mix.default_type();
            if ov.pure || !mix.is_quantized() {
                return d;
            }
            match (role, name) {
                (Role::Output, _) => mix.output_type(row),
                (Role::Base, TensorName::Base(l, lt)) => mix.layer_type(lt, l, stacks.n_layer, stacks.n_gqa),
                (Role::Micro, TensorName::Micro(l, lt) | TensorName::DraftMicro(l, lt)) => {
                    mix.layer_type(lt, l, stacks.n_micro, stacks.n_gqa)
                }
                (Role::Merger | Role::StopHidden, _) | (Role::Micro, TensorName::DraftCopy)
                    if d.bits_per_weight() < 8.0 =>
                {
                    Type::Q8_0
                }
                _ => d,
            }
        });
    match fit(wanted, row) {
        Some((ty, why)) => Choice { ty, fallback: Some(why) },
        None => Choice { ty: wanted, fallback: None },
    }
}

/// When rows of `row_len` do not fit `target`'s blocks, the type llama.cpp
/// falls back to (F16 when even that does not fit), with the reason.
pub fn fit(target: Type, row_len: usize) -> Option<(Type, String)> {
    if row_len.is_multiple_of(target.block_size()) {
        return None;
    }
    let fallback = match target {
        Type::IQ4_XS
        | Type::IQ2_XXS
        | Type::IQ2_XS
        | Type::IQ2_S
        | Type::IQ3_XXS
        | Type::IQ3_S
        | Type::IQ1_S
        | Type::IQ1_M => Type::IQ4_NL,
        Type::Q2_K | Type::Q3_K => Type::Q4_0,
        Type::Q4_K => Type::Q5_0,
        Type::Q5_K => Type::Q5_1,
        Type::Q6_K => Type::Q8_0,
        other => other,
    };
    let ty = if row_len.is_multiple_of(fallback.block_size()) { fallback } else { Type::F16 };
    Some((ty, format!("rows of {row_len} do not fit {target} blocks of {}", target.block_size())))
}

/// The type a converter gives `name` for an all-`outtype` file: the same
/// policy with the mix of that type (F32, F16, BF16, Q8_0, ...).
pub fn conversion_type(name: TensorName, ne: &[i64], tied: bool, outtype: Type) -> Choice {
    let mix = Mix::ALL.iter().copied().find(|m| m.default_type() == outtype).unwrap_or(Mix::F16);
    let stacks = Stacks { n_layer: 1, n_micro: 1, n_gqa: 1 };
    choose(name, ne, tied, mix, stacks, &Overrides { pure: true, ..Default::default() })
}

/// Parses the name of a type tensors can be quantized to, for a flag,
/// listing the valid names on error.
///
/// # Errors
/// An unknown name, or a type that is no quantization target (integers,
/// F64, the Q8_1 / Q8_K intermediates).
pub fn parse_type(s: &str) -> Result<Type, String> {
    match Type::from_name(s) {
        Some(t) if t.is_quantization_target() => Ok(t),
        found => {
            let names: Vec<&str> = Type::ALL.iter().filter(|t| t.is_quantization_target()).map(|t| t.name()).collect();
            let what = if found.is_some() { "not a quantization target" } else { "unknown" };
            Err(format!("ggml type '{s}' is {what} (valid: {})", names.join(", ")))
        }
    }
}

/// Parses `REGEX=TYPE` (`--tensor-type`).
///
/// # Errors
/// A missing `=`, a bad pattern or an unknown type.
pub fn parse_tensor_type(s: &str) -> Result<(regex::Regex, Type), String> {
    let (re, ty) = s.rsplit_once('=').ok_or_else(|| format!("'{s}' is not REGEX=TYPE"))?;
    let re = regex::Regex::new(re).map_err(|e| format!("bad pattern '{re}': {e}"))?;
    Ok((re, parse_type(ty)?))
}

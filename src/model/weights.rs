//! The model's weights as ggml tensors: each one created from the name table
//! with the shape the hyper-parameters demand, checked against the file, and
//! placed either on the memory-mapped file itself (host, no copy) or in a
//! device buffer (copied once).

use std::collections::HashMap;
use std::rc::Rc;

use ggml::gguf::Gguf;
use ggml::{Buffer, ContextGroups, MappedFile, Tensor, Type};

use crate::error::{Error, Result};
use crate::model::arch::{LayerTensor, MergerLinear, Part, Presence, StopLinear, TensorName, TensorSet};
use crate::model::hparams::HParams;
use crate::model::placement::{Placement, PlacementPlan};

/// One transformer layer (base or micro decoder).
pub struct LayerWeights {
    /// RMSNorm before attention `[D]`.
    pub attn_norm: Tensor,
    /// Query projection `[D, H*hd]`.
    pub wq: Tensor,
    /// Key projection `[D, Hkv*hd]`.
    pub wk: Tensor,
    /// Value projection `[D, Hkv*hd]`.
    pub wv: Tensor,
    /// Output projection `[H*hd, D]`.
    pub wo: Tensor,
    /// RMSNorm before the MLP `[D]`.
    pub ffn_norm: Tensor,
    /// Gate projection `[D, FF]`.
    pub w_gate: Tensor,
    /// Up projection `[D, FF]`.
    pub w_up: Tensor,
    /// Down projection `[FF, D]`.
    pub w_down: Tensor,
}

/// A linear layer with bias.
pub struct Linear {
    /// Weight `[in, out]` (ggml order).
    pub w: Tensor,
    /// Bias `[out]`.
    pub b: Tensor,
}

/// The compositional embedder.
pub struct MergerWeights {
    /// Query from the mean embedding.
    pub q: Linear,
    /// Keys from `[e_j, P_j]`.
    pub k: Linear,
    /// Values from `[e_j, P_j]`.
    pub v: Linear,
    /// Output projection.
    pub out: Linear,
    /// In-chunk position table `[D/2, S]`.
    pub pos: Tensor,
}

/// The stop head: Linear, SiLU, Linear, SiLU, Linear (then a sigmoid).
pub struct StopHeadWeights {
    /// First hidden layer.
    pub fc1: Linear,
    /// Second hidden layer.
    pub fc2: Linear,
    /// Output logit.
    pub out: Linear,
}

/// A micro decoder and its stop head: the macro steps' own, or a draft head's.
pub struct MicroHead {
    /// Micro-step decoder layers.
    pub micro: Vec<LayerWeights>,
    /// The stop head.
    pub stop: StopHeadWeights,
    /// A draft head's copy matrix `[M*D, D]`, where its micro decoder reads
    /// copy candidates ([`crate::decode::copy`]); never a macro step's.
    pub copy: Option<Tensor>,
}

/// The modules grafted onto the base: absent from a base-only (llama) model.
pub struct GraftedWeights {
    /// The micro decoder and stop head of macro steps (and of drafts, when
    /// there is no draft head).
    pub head: MicroHead,
    /// The merger.
    pub merger: MergerWeights,
    /// The draft head (`draft.blk.N.*`, `draft_stop.*`), if the file has one:
    /// self-verified decoding drafts with it, macro steps never read it.
    pub draft: Option<MicroHead>,
}

impl GraftedWeights {
    /// The micro decoder and stop head that `drafting` steps run (the draft
    /// head where there is one), or that macro steps run.
    pub fn head_for(&self, drafting: bool) -> &MicroHead {
        match &self.draft {
            Some(d) if drafting => d,
            _ => &self.head,
        }
    }
}

/// All weights of a HAMburger model, or of its base alone.
pub struct Weights {
    /// Token embedding `[D, V]`.
    pub tok_embd: Tensor,
    /// Final norm `[D]`.
    pub output_norm: Tensor,
    /// Untied lm_head `[D, V]`, or `None` when tied to `tok_embd`.
    pub output: Option<Tensor>,
    /// Llama-3 rope frequency divisors.
    pub rope_freqs: Option<Tensor>,
    /// Base layers.
    pub layers: Vec<LayerWeights>,
    /// The merger, micro decoder and stop head; `None` for a base-only
    /// (llama) model, which reads one token per input and emits one per forward.
    pub grafted: Option<GraftedWeights>,
}

impl Weights {
    /// The lm_head matrix (the embedding when tied).
    pub fn lm_head(&self) -> &Tensor {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }

    /// Whether the model has a draft head (`draft.blk.N.*`, `draft_stop.*`).
    pub fn has_draft_head(&self) -> bool {
        self.grafted.as_ref().is_some_and(|g| g.draft.is_some())
    }

    /// The grafted modules, which a merged input, a micro step or the stop
    /// head need.
    ///
    /// # Errors
    /// For a base-only model, which has none.
    pub fn grafted(&self) -> Result<&GraftedWeights> {
        self.grafted.as_ref().ok_or_else(|| {
            Error::Invalid(
                "a base-only (llama) model has no merger, micro decoder or stop head: it reads and emits one token per forward"
                    .into(),
            )
        })
    }
}

/// Whether type `ty` is allowed for tensor `name`: F32 for what the format
/// keeps F32, else any type ggml can multiply with.
fn type_allowed(name: TensorName, ty: Type) -> bool {
    if name.info().f32_only() {
        ty == Type::F32
    } else {
        matches!(ty, Type::F32 | Type::F16 | Type::BF16) || (ty.is_quantized() && ty.can_dequantize())
    }
}

/// A weight created in its placement's context, waiting for its bytes.
#[derive(Clone)]
struct Placed {
    tensor: Tensor,
    /// Where its bytes start in the file.
    offset: u64,
    /// How many bytes it has.
    size: u64,
    place: Placement,
}

/// Loads and checks every weight of `gguf` (already mapped as `map`),
/// placing each where `plan` says; a `base_only` file holds the base's
/// tensors alone (a llama GGUF).
///
/// # Errors
/// A missing, unexpected, misshapen or mistyped tensor, or a failed allocation.
pub fn load(gguf: &Gguf, map: Rc<MappedFile>, hp: &HParams, plan: &PlacementPlan, base_only: bool) -> Result<Weights> {
    let path = &gguf.path;
    let set = TensorSet { base_only, ..TensorSet::of_file(|name| gguf.tensor(&name.to_string()).is_some()) };
    // The key says whether the draft head copies: a copy matrix without it is unexpected, one missing is named.
    let set = TensorSet { draft_copy: hp.draft_copy_ngram > 0 && !base_only, ..set };
    if set.draft_copy && !set.draft_head {
        return Err(Error::Invalid(format!(
            "{}: {}: the draft head's copy matrix, and the file has no draft head",
            path.display(),
            TensorName::DraftCopy
        )));
    }
    let expected = hp.tensor_shapes(set);
    for t in &gguf.tensors {
        if !expected.iter().any(|(n, _)| n.to_string() == t.name) {
            return Err(Error::UnexpectedTensor { path: path.clone(), name: t.name.clone() });
        }
    }
    // One metadata context per placement, so device buffers hold exactly their tensors.
    // (+1: a tied lm_head may be duplicated onto a device.)
    let mut contexts = ContextGroups::<Placement>::new(expected.len() + 1);
    let mut tensors: HashMap<TensorName, Tensor> = HashMap::new();
    let mut placed: Vec<Placed> = Vec::new();
    for (name, ne) in &expected {
        let s = name.to_string();
        let info = gguf.tensor(&s).ok_or_else(|| Error::MissingTensor { path: path.clone(), name: s.clone() })?;
        let mut want = [1i64; 4];
        want[..ne.len()].copy_from_slice(ne);
        if info.ne != want {
            let n = info.ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1).max(ne.len());
            return Err(Error::TensorShape {
                path: path.clone(),
                name: s,
                expected: ne.clone(),
                got: info.ne[..n].to_vec(),
            });
        }
        if !type_allowed(*name, info.ty) || info.ty.row_size(ne[0] as usize).is_none() {
            return Err(Error::TensorType { path: path.clone(), name: s, ty: info.ty });
        }
        let place = plan.weight(*name, info.ty, ne);
        let t = contexts.get(place)?.new_tensor(info.ty, ne).named(&s);
        placed.push(Placed { tensor: t.clone(), offset: info.offset, size: info.size, place });
        tensors.insert(*name, t);
    }
    // A tied lm_head placed away from the tensor it is tied to (on a GPU)
    // gets its own copy there, as llama.cpp duplicates it, so the product runs on the device.
    let mut output_dup = None;
    if let (true, Presence::TiedTo(source)) = (set.tied_output, TensorName::Output.info().presence) {
        let source = placed.iter().find(|p| p.tensor.name() == source.to_string()).expect("the tied tensor").clone();
        let ne = [hp.n_embd as i64, hp.n_vocab as i64];
        let place = plan.weight(TensorName::Output, source.tensor.ty(), &ne);
        if place != source.place {
            let t = contexts.get(place)?.new_tensor(source.tensor.ty(), &ne).named(&TensorName::Output.to_string());
            placed.push(Placed { tensor: t.clone(), place, ..source });
            output_dup = Some(t);
        }
    }
    for (place, ctx) in contexts.iter() {
        match place {
            Placement::Mapped => {
                let buf = Buffer::from_host_memory(map.clone())?;
                for p in placed.iter().filter(|p| p.place == *place) {
                    buf.place(&p.tensor, p.offset as usize)?;
                }
                buf.set_weights_usage();
            }
            Placement::Buffer(buft) => {
                let buf = Buffer::alloc_context(ctx, *buft)?;
                buf.set_weights_usage();
                for p in placed.iter().filter(|p| p.place == *place) {
                    p.tensor.write_bytes(0, &map[p.offset as usize..(p.offset + p.size) as usize])?;
                }
            }
        }
    }
    let mut take = |n: TensorName| tensors.remove(&n).expect("every expected tensor was created");
    let layer = |take: &mut dyn FnMut(TensorName) -> Tensor, f: &dyn Fn(LayerTensor) -> TensorName| LayerWeights {
        attn_norm: take(f(LayerTensor::AttnNorm)),
        wq: take(f(LayerTensor::AttnQ)),
        wk: take(f(LayerTensor::AttnK)),
        wv: take(f(LayerTensor::AttnV)),
        wo: take(f(LayerTensor::AttnOutput)),
        ffn_norm: take(f(LayerTensor::FfnNorm)),
        w_gate: take(f(LayerTensor::FfnGate)),
        w_up: take(f(LayerTensor::FfnUp)),
        w_down: take(f(LayerTensor::FfnDown)),
    };
    let layers = (0..hp.n_layer).map(|i| layer(&mut take, &|lt| TensorName::Base(i, lt))).collect();
    let linear = |take: &mut dyn FnMut(TensorName) -> Tensor, p: &dyn Fn(Part) -> TensorName| Linear {
        w: take(p(Part::Weight)),
        b: take(p(Part::Bias)),
    };
    let head = |take: &mut dyn FnMut(TensorName) -> Tensor,
                micro: fn(usize, LayerTensor) -> TensorName,
                stop: fn(StopLinear, Part) -> TensorName| MicroHead {
        micro: (0..hp.n_micro_layer).map(|i| layer(take, &|lt| micro(i, lt))).collect(),
        stop: StopHeadWeights {
            fc1: linear(take, &|p| stop(StopLinear::Fc1, p)),
            fc2: linear(take, &|p| stop(StopLinear::Fc2, p)),
            out: linear(take, &|p| stop(StopLinear::Out, p)),
        },
        copy: None,
    };
    let grafted = (!base_only).then(|| {
        let merger = MergerWeights {
            q: linear(&mut take, &|p| TensorName::Merger(MergerLinear::Q, p)),
            k: linear(&mut take, &|p| TensorName::Merger(MergerLinear::K, p)),
            v: linear(&mut take, &|p| TensorName::Merger(MergerLinear::V, p)),
            out: linear(&mut take, &|p| TensorName::Merger(MergerLinear::Out, p)),
            pos: take(TensorName::MergerPos),
        };
        GraftedWeights {
            head: head(&mut take, TensorName::Micro, TensorName::Stop),
            merger,
            draft: set.draft_head.then(|| MicroHead {
                copy: set.draft_copy.then(|| take(TensorName::DraftCopy)),
                ..head(&mut take, TensorName::DraftMicro, TensorName::DraftStop)
            }),
        }
    });
    Ok(Weights {
        tok_embd: take(TensorName::TokenEmbd),
        output_norm: take(TensorName::OutputNorm),
        output: if set.tied_output { output_dup } else { Some(take(TensorName::Output)) },
        rope_freqs: set.rope_freqs.then(|| take(TensorName::RopeFreqs)),
        layers,
        grafted,
    })
}

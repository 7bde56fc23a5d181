//! A request's decoding mode, in llama-server's `speculative.*` fields:
//! `speculative.type` (`none`: HAMburger's macro steps; `draft-mtp`:
//! self-verified, the micro decoder drafts and the base checks every token;
//! `draft-simple`: the server's draft model (`-md`) drafts;
//! `ngram-simple,draft-mtp`: self-verified, the context drafting first), and
//! the drafts' `speculative.n_max`, `speculative.n_min`, `speculative.p_min`
//! and `speculative.ngram_size_n`. A
//! request that sets no type decodes as the server's flags say: with the
//! draft model when it has one, else by `--spec-type` and `--spec-draft-*`.

use hamburger::draft::SpecType;
use hamburger::draft_model::DraftModelParams;
use hamburger::ngram;
use hamburger::DraftParams;

use crate::error::ApiError;

/// A request's `speculative.*` fields, as it sent them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecFields<'a> {
    /// `speculative.type`.
    pub spec_type: Option<&'a str>,
    /// `speculative.n_max`.
    pub n_max: Option<u64>,
    /// `speculative.n_min`.
    pub n_min: Option<u64>,
    /// `speculative.p_min`.
    pub p_min: Option<f64>,
    /// `speculative.ngram_size_n`.
    pub ngram_size_n: Option<u64>,
}

/// How a request decodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoding {
    /// HAMburger's macro steps.
    Macro,
    /// Self-verified: the micro decoder drafts.
    SelfVerified(DraftParams),
    /// The server's draft model drafts.
    DraftModel(DraftModelParams),
}

/// How `c` asks to decode; where it sets nothing, as the server does: with
/// its draft model (`draft_model`, its settings) when it has one, else
/// self-verified with `default`'s drafts when that is set, else macro
/// steps. Ranges are checked with the step rule.
///
/// # Errors
/// A 400 naming `speculative.type` for a type that does not apply, is
/// unknown, or needs a draft model the server has not loaded, or naming a
/// draft field given for macro steps.
pub fn decoding(
    c: SpecFields,
    default: Option<DraftParams>,
    draft_model: Option<DraftModelParams>,
) -> Result<Decoding, ApiError> {
    let spec_type = match c.spec_type.map(SpecType::parse) {
        None if draft_model.is_some() => SpecType::DraftModel,
        None if default.is_some() => SpecType::SelfVerified { ngram: default.is_some_and(|d| d.ngram.is_some()) },
        None => SpecType::None,
        Some(Ok(t)) => t,
        Some(Err(e)) => return Err(ApiError::field("speculative.type", format!("'speculative.type': {e}"))),
    };
    let count = |v: Option<u64>| v.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let p_min = c.p_min.map(|p| p as f32);
    match spec_type {
        SpecType::DraftModel => {
            let Some(d) = draft_model else {
                return Err(ApiError::field(
                    "speculative.type",
                    "'speculative.type' draft-simple needs a draft model, which this server does not load (-md)",
                ));
            };
            Ok(Decoding::DraftModel(DraftModelParams {
                n_max: count(c.n_max).unwrap_or(d.n_max),
                n_min: count(c.n_min).unwrap_or(d.n_min),
                p_min: p_min.unwrap_or(d.p_min),
            }))
        }
        SpecType::SelfVerified { ngram: false } if c.ngram_size_n.is_some() => Err(ApiError::field(
            "speculative.ngram_size_n",
            "'speculative.ngram_size_n' applies where the context drafts: set 'speculative.type' to \
             \"ngram-simple,draft-mtp\"",
        )),
        SpecType::SelfVerified { ngram } => {
            let d = default.unwrap_or_default();
            Ok(Decoding::SelfVerified(DraftParams {
                n_max: count(c.n_max).or(d.n_max),
                n_min: count(c.n_min).unwrap_or(d.n_min),
                p_min: p_min.unwrap_or(d.p_min),
                ngram: ngram.then(|| count(c.ngram_size_n).or(d.ngram).unwrap_or(ngram::DEFAULT_SIZE)),
                tree: d.tree,
            }))
        }
        SpecType::None => {
            let given = [
                ("speculative.n_max", c.n_max.is_some()),
                ("speculative.n_min", c.n_min.is_some()),
                ("speculative.p_min", c.p_min.is_some()),
                ("speculative.ngram_size_n", c.ngram_size_n.is_some()),
            ];
            match given.iter().find(|g| g.1) {
                Some((name, _)) => Err(ApiError::field(
                    name,
                    format!(
                        "'{name}' applies to drafts: set 'speculative.type' to \"draft-mtp\" (or \"draft-simple\" \
                         with a draft model)"
                    ),
                )),
                None => Ok(Decoding::Macro),
            }
        }
    }
}

//! A request's decoding mode, in llama-server's `speculative.*` fields:
//! `speculative.type` (`none`: HAMburger's macro steps; `draft-mtp`:
//! self-verified, the micro decoder drafts and the base checks every token),
//! and the drafts' `speculative.n_max`, `speculative.n_min` and
//! `speculative.p_min`. A request that sets none decodes as the server's
//! flags say (`--spec-type` and `--spec-draft-*`).

use hamburger::draft::SpecType;
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
}

/// The drafts `c` asks for, `default` (the server's) where it sets nothing:
/// `None` decodes macro steps. Ranges are checked with the step rule.
///
/// # Errors
/// A 400 naming `speculative.type` for a type that does not apply or is
/// unknown, or naming a draft field given for macro steps.
pub fn draft(c: SpecFields, default: Option<DraftParams>) -> Result<Option<DraftParams>, ApiError> {
    let verified = match c.spec_type.map(SpecType::parse) {
        None => default.is_some(),
        Some(Ok(SpecType::None)) => false,
        Some(Ok(SpecType::SelfVerified)) => true,
        Some(Ok(SpecType::DraftModel)) => {
            return Err(ApiError::field(
                "speculative.type",
                "'speculative.type' draft-simple needs a draft model, which this server does not load",
            ))
        }
        Some(Err(e)) => return Err(ApiError::field("speculative.type", format!("'speculative.type': {e}"))),
    };
    let given = [
        ("speculative.n_max", c.n_max.is_some()),
        ("speculative.n_min", c.n_min.is_some()),
        ("speculative.p_min", c.p_min.is_some()),
    ];
    if !verified {
        if let Some((name, _)) = given.iter().find(|g| g.1) {
            return Err(ApiError::field(
                name,
                format!("'{name}' applies to self-verified decoding: set 'speculative.type' to \"draft-mtp\""),
            ));
        }
        return Ok(None);
    }
    let d = default.unwrap_or_default();
    let count = |v: Option<u64>| v.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    Ok(Some(DraftParams {
        n_max: count(c.n_max).or(d.n_max),
        n_min: count(c.n_min).unwrap_or(d.n_min),
        p_min: c.p_min.map_or(d.p_min, |p| p as f32),
    }))
}

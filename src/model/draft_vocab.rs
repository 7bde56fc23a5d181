//! The draft vocabulary (`hamburger.draft_vocab`, optional): the tokens
//! self-verified decoding drafts from, FR-Spec's and EAGLE-3's cut of the
//! output layer.
//!
//! A micro step ends in the lm_head's product over the whole vocabulary
//! (SmolLM2's 49,152 rows; the 1B shapes' tied Q6_K embedding is 215 MB of
//! the 763 MB a forward reads), while drafts are mostly right on frequent
//! tokens: the 2,048 most frequent tokens of the trained model's answers
//! cover 94% of them. So a file may list K token ids, and at load the
//! runtime copies the lm_head's rows of those tokens, bytes as stored, into
//! a `[D, K]` matrix of the lm_head's type: each of its logits is the value
//! the full product gives that token. A self-verified micro step multiplies
//! by it alone and maps the result back to token ids; the base forward that
//! verifies the drafts still reads the whole lm_head, so the output stays
//! the base's, and only which tokens can be drafted changes. Macro steps,
//! whose micro tokens are the output, never use it.

use std::collections::HashSet;

use ggml::gguf::{Gguf, Value};
use ggml::{Buffer, BufferType, Context, MappedFile, Tensor};

use crate::error::{Error, Result};
use crate::model::arch::{Key, TensorName, ARCH_HAMBURGER};
use crate::model::hparams::HParams;
use crate::model::placement::{Placement, PlacementPlan};

/// The draft vocabulary and its rows of the lm_head, placed with it.
pub struct DraftVocab {
    /// The token id of each row of `head`.
    pub ids: Vec<u32>,
    /// The lm_head's rows of those tokens `[D, K]`, in the lm_head's type.
    pub head: Tensor,
    _buf: Buffer,
}

impl DraftVocab {
    /// Reads `hamburger.draft_vocab` of `gguf` and copies the lm_head's rows
    /// of its tokens out of the file (`map`) into a matrix placed where
    /// `plan` puts the lm_head; None when the file has no such key.
    ///
    /// # Errors
    /// When the key is not a list of distinct token ids below `n_vocab`, at
    /// least one; when the lm_head is missing from the file; when the
    /// matrix cannot be allocated.
    pub fn load(gguf: &Gguf, map: &MappedFile, hp: &HParams, plan: &PlacementPlan) -> Result<Option<DraftVocab>> {
        let key = Key::DraftVocab.name(ARCH_HAMBURGER);
        let Some(value) = gguf.get(&key) else {
            return Ok(None);
        };
        let bad = |why: String| Error::Invalid(format!("{}: {key}: {why}", gguf.path.display()));
        let ints = match value {
            Value::Array(a) => a.as_ints(),
            _ => None,
        };
        let ints = ints.ok_or_else(|| bad(format!("expected an array of token ids, got {}", value.type_name())))?;
        let ids = token_ids(&ints, hp.n_vocab).map_err(bad)?;
        let lm_head = [TensorName::Output, TensorName::TokenEmbd].into_iter().find_map(|n| gguf.tensor(&n.to_string()));
        let lm_head = lm_head.ok_or_else(|| bad("the file has no lm_head to take its rows from".into()))?;
        let row = lm_head
            .ty
            .row_size(hp.n_embd)
            .ok_or_else(|| bad(format!("the lm_head's type {} has no rows of {}", lm_head.ty, hp.n_embd)))?;
        let mut bytes = Vec::with_capacity(row * ids.len());
        for &id in &ids {
            let start = lm_head.offset as usize + id as usize * row;
            bytes.extend_from_slice(&map[start..start + row]);
        }
        let ne = [hp.n_embd as i64, ids.len() as i64];
        let buft = match plan.weight(TensorName::Output, lm_head.ty, &ne) {
            Placement::Buffer(b) => b,
            Placement::Mapped => BufferType::cpu(),
        };
        let ctx = Context::new(1, 0)?;
        let head = ctx.new_tensor(lm_head.ty, &ne).named("draft_vocab.head");
        let buf = Buffer::alloc_context(&ctx, buft)?;
        buf.set_weights_usage();
        head.write_bytes(0, &bytes)?;
        Ok(Some(DraftVocab { ids, head, _buf: buf }))
    }

    /// The full vocabulary's logits (`n_vocab` of them) of the draft
    /// vocabulary's `logits`: minus infinity for every token outside it.
    pub fn scatter(&self, logits: &[f32], n_vocab: usize) -> Vec<f32> {
        let mut full = vec![f32::NEG_INFINITY; n_vocab];
        for (&id, &l) in self.ids.iter().zip(logits) {
            full[id as usize] = l;
        }
        full
    }
}

/// `ints` as token ids, checked: at least one, each below `n_vocab`, no two
/// alike (the converter checks a `hamburger.json`'s list with it too).
///
/// # Errors
/// The first id that is not, or that the list is empty, in words.
pub fn token_ids(ints: &[i64], n_vocab: usize) -> std::result::Result<Vec<u32>, String> {
    if ints.is_empty() {
        return Err("no token ids".into());
    }
    let mut seen = HashSet::with_capacity(ints.len());
    ints.iter()
        .map(|&i| match usize::try_from(i) {
            Ok(id) if id < n_vocab && seen.insert(id) => Ok(id as u32),
            Ok(id) if id < n_vocab => Err(format!("token id {id} is listed twice")),
            _ => Err(format!("token id {i} is outside the vocabulary of {n_vocab}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_are_checked() {
        assert_eq!(token_ids(&[5, 0, 9], 10), Ok(vec![5, 0, 9]));
        assert_eq!(token_ids(&[], 10), Err("no token ids".into()));
        assert_eq!(token_ids(&[3, 10], 10), Err("token id 10 is outside the vocabulary of 10".into()));
        assert_eq!(token_ids(&[-1], 10), Err("token id -1 is outside the vocabulary of 10".into()));
        assert_eq!(token_ids(&[3, 4, 3], 10), Err("token id 3 is listed twice".into()));
    }
}

//! A sequence that a draft model drafts for (llama.cpp's `-md` in a
//! batched loop, [`crate::draft_model::DraftModelParams::rule`]): between
//! macro steps its owner asks how much may be drafted
//! ([`SeqGen::draft_room`]), drafts after its context ([`SeqGen::context`])
//! with the draft model, and gives the tokens ([`SeqGen::set_draft`]); the
//! next forward checks them ([`super::verify`]). Benchmarks may replace the
//! check by [`SyntheticAcceptance`].

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{DecodeConfig, SeqGen};
use crate::decode::draft::DraftRule;
use crate::engine::Engine;

/// Synthetic acceptance for benchmarking (llama.cpp's
/// `--spec-synth-rates`): the drafted token at depth i is kept with
/// probability `rates[i] / rates[i - 1]` (so that `rates[i]` of the drafts
/// reach depth i), whatever the target's token; a rejected one is replaced
/// by the target's, an end-of-generation draft never kept. The output is
/// then not the target's: it measures speed at a chosen acceptance.
#[derive(Debug, Clone)]
pub struct SyntheticAcceptance {
    /// The probability of keeping the draft at each depth, given the one before was kept.
    keep: Vec<f64>,
    rng: StdRng,
}

impl SyntheticAcceptance {
    /// Acceptance at `rates` (one per drafted position, from 0 to 1, not
    /// increasing), drawn from `seed`.
    ///
    /// # Errors
    /// Saying which rule `rates` breaks.
    pub fn new(rates: &[f64], seed: u64) -> Result<SyntheticAcceptance, String> {
        if rates.is_empty() {
            return Err("expected at least one rate".into());
        }
        if let Some(r) = rates.iter().find(|r| !(r.is_finite() && (0.0..=1.0).contains(*r))) {
            return Err(format!("{r}: rates must be finite and from 0 to 1"));
        }
        if rates.windows(2).any(|w| w[1] > w[0]) {
            return Err("rates must not increase from one position to the next".into());
        }
        let keep = rates.iter().scan(1.0, |before, &r| {
            let p = if *before > 0.0 { r / *before } else { 0.0 };
            *before = r;
            Some(p)
        });
        Ok(SyntheticAcceptance { keep: keep.collect(), rng: StdRng::seed_from_u64(seed) })
    }

    /// The rates of llama.cpp's `--spec-synth-len`: `p^(i+1)` at depth i,
    /// `p` chosen so that a verify forward yields `length` tokens on average
    /// (its accepted drafts, of `n_max`, and the target's own token).
    ///
    /// # Errors
    /// A length that is not finite or outside 1..=n_max + 1, or no drafts.
    pub fn rates_for_length(length: f64, n_max: usize) -> Result<Vec<f64>, String> {
        if n_max == 0 {
            return Err("expected at least one drafted token".into());
        }
        let most = n_max as f64 + 1.0;
        if !(length.is_finite() && (1.0..=most).contains(&length)) {
            return Err(format!("{length}: expected a length from 1 to {most} (the drafts and the target's token)"));
        }
        // Accepted drafts expected at p: p + p^2 + ... + p^n_max, rising in p.
        let accepted = |p: f64| (1..=n_max as i32).map(|i| p.powi(i)).sum::<f64>();
        let p = if length >= most {
            1.0
        } else if length <= 1.0 {
            0.0
        } else {
            let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
            for _ in 0..60 {
                let mid = 0.5 * (lo + hi);
                if accepted(mid) < length - 1.0 {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            0.5 * (lo + hi)
        };
        Ok((1..=n_max as i32).map(|i| p.powi(i)).collect())
    }

    /// Whether the draft at `depth` (0 first) is kept.
    pub(super) fn keeps(&mut self, depth: usize) -> bool {
        let p = self.keep.get(depth).copied().unwrap_or(0.0);
        self.rng.random::<f64>() < p
    }
}

impl SeqGen<'_> {
    /// Accepts drafts at `synthetic`'s rates instead of checking them
    /// (benchmarks of a draft model's sequences).
    pub fn with_synthetic_acceptance(self, synthetic: SyntheticAcceptance) -> Self {
        SeqGen { synthetic: Some(synthetic), ..self }
    }

    /// Every token of the context committed so far (between macro steps:
    /// the prompt and what it generated): what a draft model drafts after.
    pub fn context(&self) -> &[u32] {
        &self.history
    }

    /// How much a draft model may draft for this sequence's next forward:
    /// its rule with `n_max` cut to what the budget, the cells and the
    /// forward's `n_batch` leave after the target's own token; `None` when it
    /// drafts nothing now (its rule drafts by model, and it has fed all but
    /// its last token and has no grammar, whose every token a draft model's
    /// drafts would have to obey; at least `n_min` must fit).
    pub fn draft_room(&self, engine: &Engine, cfg: &DecodeConfig) -> Option<DraftRule> {
        let rule = self.rule(cfg).draft.filter(|d| d.by_model)?;
        let ready = !self.done
            && self.prompt_fed()
            && self.pending.merged.is_empty()
            && self.pending.plain.len() == 1
            && self.draft.tokens.is_empty()
            && self.constraint.is_none();
        if !ready {
            return None;
        }
        let room = self.remaining().saturating_sub(1).min(self.cells_left(engine)).min(cfg.n_batch.saturating_sub(1));
        let n_max = rule.n_max.min(room);
        (n_max > 0 && n_max >= rule.n_min).then_some(DraftRule { n_max, ..rule })
    }

    /// The tokens a draft model drafted (after [`SeqGen::draft_room`] said
    /// how many fit) for the next forward to check.
    pub fn set_draft(&mut self, tokens: Vec<u32>) {
        self.draft.tokens = tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mean_length_gives_geometric_rates_that_reach_it() {
        let rates = SyntheticAcceptance::rates_for_length(2.5, 4).unwrap();
        assert_eq!(rates.len(), 4);
        assert!((rates.iter().sum::<f64>() - 1.5).abs() < 1e-9, "{rates:?}");
        assert!((rates[1] - rates[0] * rates[0]).abs() < 1e-12, "{rates:?}");
        assert_eq!(SyntheticAcceptance::rates_for_length(5.0, 4).unwrap(), vec![1.0; 4]);
        assert_eq!(SyntheticAcceptance::rates_for_length(1.0, 2).unwrap(), vec![0.0; 2]);
        assert!(SyntheticAcceptance::rates_for_length(5.5, 4).unwrap_err().contains("from 1 to 5"));
        assert!(SyntheticAcceptance::rates_for_length(f64::NAN, 4).is_err());
        // Rates are kept at each depth given the one before: all of them at 1, none at 0.
        let mut all = SyntheticAcceptance::new(&[1.0, 1.0], 7).unwrap();
        assert!(all.keeps(0) && all.keeps(1));
        let mut none = SyntheticAcceptance::new(&[0.0, 0.0], 7).unwrap();
        assert!(!none.keeps(0));
        assert!(SyntheticAcceptance::new(&[0.5, 0.9], 7).unwrap_err().contains("increase"));
    }
}

//! The acceptance rule of speculative decoding, one home for every drafter
//! (a draft model, [`crate::decode::draft_model`]; the micro decoder verifying itself):
//! given the tokens a drafter proposed and the target's outputs at each
//! verified row, how many drafted tokens the target accepts and which token
//! it adds after them. Pure functions of their inputs, so that the rule
//! that makes the output the target's is tested on its own.
//!
//! Row `i` of a verify forward is the target's prediction of the token after
//! the first `i` drafted tokens: row 0 follows the last committed token,
//! row `n` follows the whole draft of `n` tokens.
//!
//! * Greedy ([`verify_greedy`]): accept while the target's choice at row `i`
//!   equals draft token `i`; the target's choice at the first disagreeing
//!   row (or at row `n`, a bonus token) follows. The output is token for
//!   token the target's own greedy output.
//! * Sampling ([`verify_sampled`], speculative sampling: Leviathan et al.
//!   2023, Chen et al. 2023): draft token `x` drawn from the drafter's
//!   distribution `q` is accepted with probability `min(1, p(x) / q(x))`
//!   under the target's distribution `p`; at the first rejection the token
//!   is drawn from the residual `max(0, p - q)`, normalised; after a wholly
//!   accepted draft, from `p` at row `n`. Each emitted token is then
//!   distributed exactly as a draw from `p`, whatever `q` is.

use std::collections::HashMap;

use rand::Rng;

/// A distribution over tokens: `(token, probability)` pairs, the tokens a
/// sampler keeps after its truncations, probabilities summing to 1 (a
/// greedy sampler's is one token of probability 1).
pub type Distribution = [(u32, f32)];

/// What the target makes of a draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Drafted tokens accepted, from the first.
    pub accepted: usize,
    /// The target's token after them: its correction of the first rejected
    /// token, or a bonus token after a wholly accepted draft.
    pub next: u32,
}

/// Greedy verification of `draft` against `target` (the target's choice at
/// each row; at least `draft.len() + 1` rows).
///
/// # Panics
/// When `target` has fewer rows than the draft needs.
pub fn verify_greedy(draft: &[u32], target: &[u32]) -> Verdict {
    assert!(target.len() > draft.len(), "{} target rows verify at most {} drafted tokens", target.len(), draft.len());
    let accepted = draft.iter().zip(target).take_while(|(d, t)| d == t).count();
    Verdict { accepted, next: target[accepted] }
}

/// Speculative sampling of `draft`, each token `draft[i]` drawn from
/// `q[i]`, against the target's distributions `p` (at least
/// `draft.len() + 1` rows), with `rng` deciding acceptances and drawing the
/// target's token.
///
/// # Panics
/// When `q` does not have one distribution per drafted token or `p` has
/// fewer rows than the draft needs.
pub fn verify_sampled(draft: &[u32], q: &[Vec<(u32, f32)>], p: &[Vec<(u32, f32)>], rng: &mut impl Rng) -> Verdict {
    assert_eq!(q.len(), draft.len(), "one draft distribution per drafted token");
    assert!(p.len() > draft.len(), "{} target rows verify at most {} drafted tokens", p.len(), draft.len());
    for (i, &x) in draft.iter().enumerate() {
        if let Some(next) = check_draft(&p[i], &q[i], x, rng) {
            return Verdict { accepted: i, next };
        }
    }
    Verdict { accepted: draft.len(), next: draw(&p[draft.len()], rng.random()) }
}

/// Speculative sampling's check of one drafted token `x`, drawn from `q`,
/// against the target's `p`: `None` when it is accepted (with probability
/// `min(1, p(x) / q(x))`; no random number is drawn when `p(x) >= q(x)`, so
/// greedy distributions draw none when they agree), else `Some` token drawn
/// from the normalised residual `max(0, p - q)` (from `p` when rounding
/// left no residual), which takes its place.
pub fn check_draft(p: &Distribution, q: &Distribution, x: u32, rng: &mut impl Rng) -> Option<u32> {
    let (px, qx) = (prob(p, x), prob(q, x));
    // u < p/q, written without a division (q(x) > 0: x was drawn from q).
    if px >= qx || rng.random::<f32>() * qx < px {
        return None;
    }
    let r = residual(p, q);
    Some(if r.is_empty() { draw(p, rng.random()) } else { draw(&r, rng.random()) })
}

/// The token of `dist` (probabilities in order) at which the cumulative
/// probability first reaches `r` (in 0..1) times the total: a draw, given a
/// uniform `r`, summed in f64 as llama.cpp's `dist` sampler sums.
pub fn draw(dist: &[(u32, f32)], r: f64) -> u32 {
    let target = r * dist.iter().map(|c| f64::from(c.1)).sum::<f64>();
    let mut acc = 0.0;
    for &(t, p) in dist {
        acc += f64::from(p);
        if acc >= target {
            return t;
        }
    }
    dist.last().map_or(0, |c| c.0)
}

/// The probability of `token` under `d`.
fn prob(d: &Distribution, token: u32) -> f32 {
    d.iter().find(|&&(t, _)| t == token).map_or(0.0, |&(_, p)| p)
}

/// `max(0, p - q)` normalised; empty when it is zero everywhere (p = q up
/// to rounding, where a rejection is then a matter of rounding too and a
/// draw from `p` is as right).
fn residual(p: &Distribution, q: &Distribution) -> Vec<(u32, f32)> {
    let q: HashMap<u32, f32> = q.iter().copied().collect();
    let r: Vec<(u32, f32)> = p
        .iter()
        .map(|&(t, pt)| (t, (pt - q.get(&t).copied().unwrap_or(0.0)).max(0.0)))
        .filter(|&(_, r)| r > 0.0)
        .collect();
    let sum: f32 = r.iter().map(|&(_, r)| r).sum();
    if sum <= f32::EPSILON {
        return Vec::new();
    }
    r.into_iter().map(|(t, r)| (t, r / sum)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn greedy_accepts_the_agreeing_prefix_and_adds_the_targets_token() {
        assert_eq!(verify_greedy(&[5, 6, 7], &[5, 6, 9, 1]), Verdict { accepted: 2, next: 9 });
        assert_eq!(verify_greedy(&[5, 6, 7], &[4, 6, 7, 1]), Verdict { accepted: 0, next: 4 });
        assert_eq!(verify_greedy(&[5, 6, 7], &[5, 6, 7, 1]), Verdict { accepted: 3, next: 1 }, "a bonus token");
        assert_eq!(verify_greedy(&[], &[3]), Verdict { accepted: 0, next: 3 }, "no draft: a plain step");
        // Agreement after a rejection counts for nothing.
        assert_eq!(verify_greedy(&[5, 6, 7], &[5, 0, 7, 1]), Verdict { accepted: 1, next: 0 });
    }

    #[test]
    fn one_hot_distributions_make_sampling_greedy() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let one = |t| vec![(t, 1.0)];
        let q = [one(5), one(6), one(7)];
        for target in [[5, 6, 9, 1], [4, 6, 7, 1], [5, 6, 7, 1]] {
            let p: Vec<_> = target.iter().map(|&t| one(t)).collect();
            assert_eq!(verify_sampled(&[5, 6, 7], &q, &p, &mut rng), verify_greedy(&[5, 6, 7], &target));
        }
    }

    /// The emitted first token must be distributed as `p[0]`, whatever the
    /// draft's distribution: a chi-square goodness-of-fit over many seeded
    /// trials, each drafting its token from `q` and verifying it.
    fn first_token_frequencies(p: &[(u32, f32)], q: &[(u32, f32)], trials: usize) -> Vec<usize> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let mut counts = vec![0; 4];
        let bonus = vec![(3, 1.0)];
        for _ in 0..trials {
            let x = draw(q, rng.random());
            let v = verify_sampled(&[x], &[q.to_vec()], &[p.to_vec(), bonus.clone()], &mut rng);
            counts[if v.accepted == 1 { x } else { v.next } as usize] += 1;
        }
        counts
    }

    fn chi_square(counts: &[usize], p: &[(u32, f32)]) -> f64 {
        let n: usize = counts.iter().sum();
        p.iter()
            .map(|&(t, pt)| {
                let expected = n as f64 * pt as f64;
                (counts[t as usize] as f64 - expected).powi(2) / expected
            })
            .sum()
    }

    #[test]
    fn sampled_output_follows_the_target_whatever_the_draft() {
        let p = [(0, 0.5), (1, 0.3), (2, 0.15), (3, 0.05)];
        // 3 degrees of freedom: 16.27 is the 0.999 quantile of chi-square.
        const CHI2_3_999: f64 = 16.27;
        for q in [vec![(0, 0.1), (1, 0.1), (2, 0.7), (3, 0.1)], vec![(2, 1.0)], p.to_vec()] {
            let counts = first_token_frequencies(&p, &q, 20_000);
            let chi2 = chi_square(&counts, &p);
            assert!(chi2 < CHI2_3_999, "draft {q:?}: counts {counts:?}, chi-square {chi2:.1}");
        }
        // Accepting every draft (the mutation the rule must not be) follows
        // q instead, and the test sees it.
        let q = [(0, 0.1), (1, 0.1), (2, 0.7), (3, 0.1)];
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let mut counts = vec![0; 4];
        (0..20_000).for_each(|_| counts[draw(&q, rng.random()) as usize] += 1);
        assert!(chi_square(&counts, &p) > CHI2_3_999);
    }

    #[test]
    fn the_residual_removes_the_drafts_mass() {
        let r = residual(&[(0, 0.5), (1, 0.5)], &[(0, 0.8), (1, 0.2)]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, 1);
        assert!((r[0].1 - 1.0).abs() < 1e-6);
        assert!(residual(&[(0, 1.0)], &[(0, 1.0)]).is_empty());
    }
}

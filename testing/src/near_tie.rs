//! Comparing greedy decodes that may round differently.
//!
//! Two decodes of one model agree bit for bit only when every row they
//! compute is computed alike: the same kernels, the same row-count classes
//! of forwards (`hamburger::row_class`), threads and backend. A decode alone
//! and the same decode batched with other sequences, a CPU and a GPU, our
//! engine and libllama or the plain-f32 reference, round their sums in other
//! orders. Their logits then differ in the last places (F32) or more (F16,
//! TF32, quantized), and a greedy decision flips only where it was a
//! near-tie. So such decodes are compared decision by decision: each token
//! (the argmax of its logits, with its margin over the runner-up) and each
//! macro step's end (decided by the stop rule, with the stop probability's
//! distance from the confidence). They must agree up to the first
//! difference, and that difference must be a near-tie on one side: a margin
//! below the stated tolerance. What follows it is not compared.

use hamburger::{Generation, MacroStep, StepRule};

use crate::reference::RefStep;

/// One token of a decode and how close its decisions were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The token.
    pub token: u32,
    /// Its logit minus the best other token's (`f32::INFINITY`: not known,
    /// so never a near-tie).
    pub margin: f32,
    /// Whether its macro step ended after it.
    pub step_ends: bool,
    /// How far the stop rule was from deciding otherwise: `|1 - p_stop -
    /// confidence|`, or `f32::INFINITY` when the rule did not look at `p_stop`
    /// (forced steps, one token per step, a full step).
    pub stop_distance: f32,
}

/// Where two decodes part, and how close the decision there was.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// The index of the first decision that differs.
    pub at: usize,
    /// What differs: "token 5 vs 7" or "step end".
    pub what: String,
    /// The smaller of the two sides' margins for that decision.
    pub margin: f32,
}

/// The best logit minus the second best (`f32::INFINITY` for fewer than two).
pub fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > a {
            (a, b) = (l, a);
        } else if l > b {
            b = l;
        }
    }
    if b.is_finite() {
        a - b
    } else {
        f32::INFINITY
    }
}

/// The decisions of macro steps given as (tokens, stop probabilities, each
/// token's margin), under `rule`.
pub fn decisions_of<'a>(
    steps: impl IntoIterator<Item = (&'a [u32], &'a [f32], Vec<f32>)>,
    rule: &StepRule,
) -> Vec<Decision> {
    let mut out = Vec::new();
    for (tokens, p_stop, margins) in steps {
        for (i, &token) in tokens.iter().enumerate() {
            let n = i + 1;
            let decided_by_p_stop = !rule.forced && rule.confidence <= 1.0 && n < rule.max_steps;
            let stop_distance = match p_stop.get(i) {
                Some(&p) if decided_by_p_stop => (1.0 - p - rule.confidence).abs(),
                _ => f32::INFINITY,
            };
            let margin = margins.get(i).copied().unwrap_or(f32::INFINITY);
            out.push(Decision { token, margin, step_ends: n == tokens.len(), stop_distance });
        }
    }
    out
}

/// The decisions of our decode, with margins from the logits it kept
/// (`keep_logits`; without them every margin is unknown).
pub fn decisions_of_generation(gen: &Generation, rule: &StepRule) -> Vec<Decision> {
    let margins = |s: &MacroStep| s.logits.iter().map(|l| top2_margin(l)).collect();
    decisions_of(gen.macro_steps.iter().map(|s| (&s.tokens[..], &s.p_stop[..], margins(s))), rule)
}

/// The decisions of the plain-f32 reference's decode.
pub fn decisions_of_reference(steps: &[RefStep], rule: &StepRule) -> Vec<Decision> {
    let margins = |s: &RefStep| s.logits.iter().map(|l| top2_margin(l)).collect();
    decisions_of(steps.iter().map(|s| (&s.tokens[..], &s.p_stop[..], margins(s))), rule)
}

/// Decisions of one token per step (libllama, a plain base), with each
/// token's margin.
pub fn one_token_steps(tokens: &[u32], margins: &[f32]) -> Vec<Decision> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &token)| Decision {
            token,
            margin: margins.get(i).copied().unwrap_or(f32::INFINITY),
            step_ends: true,
            stop_distance: f32::INFINITY,
        })
        .collect()
}

/// The first decision where `got` and `want` differ, over the tokens both
/// have; a step end is compared for every token but the last compared (a
/// budget may cut either side's last step).
pub fn divergence(got: &[Decision], want: &[Decision]) -> Option<Divergence> {
    let n = got.len().min(want.len());
    for (i, (g, w)) in got.iter().zip(want).take(n).enumerate() {
        if g.token != w.token {
            let what = format!("token {} vs {}", g.token, w.token);
            return Some(Divergence { at: i, what, margin: g.margin.min(w.margin) });
        }
        if i + 1 < n && g.step_ends != w.step_ends {
            let what = format!("step end {} vs {}", g.step_ends, w.step_ends);
            return Some(Divergence { at: i, what, margin: g.stop_distance.min(w.stop_distance) });
        }
    }
    None
}

/// Asserts that `got` equals `want` decision by decision, or that they part
/// at a near-tie: a token whose margin, or a step end whose stop distance,
/// is below `logit_tol` or `stop_tol` on one side. Returns the divergence,
/// if any (printed, so a run shows how often ties part them).
///
/// # Panics
/// When they part at a decision that was not a near-tie.
pub fn assert_agree(
    got: &[Decision],
    want: &[Decision],
    logit_tol: f32,
    stop_tol: f32,
    what: &str,
) -> Option<Divergence> {
    let d = divergence(got, want)?;
    assert_near_tie(&d, logit_tol, stop_tol, what);
    Some(d)
}

/// Asserts that the divergence `d` is a near-tie: a token margin below
/// `logit_tol`, or a step end's stop distance below `stop_tol` (printed, so
/// a run shows how often ties part two decodes).
///
/// # Panics
/// When it is not.
pub fn assert_near_tie(d: &Divergence, logit_tol: f32, stop_tol: f32, what: &str) {
    let tol = if d.what.starts_with("token") { logit_tol } else { stop_tol };
    eprintln!("{what}: parts at decision {} ({}) where the margin is {:.2e}", d.at, d.what, d.margin);
    assert!(
        d.margin < tol,
        "{what}: decision {} differs ({}) with a margin of {:.3e}, not a near-tie (tolerance {tol:.1e})",
        d.at,
        d.what,
        d.margin
    );
}

/// [`assert_agree`] for two decodes whose logits were kept (one vector per
/// decision), with the token tolerance measured rather than stated: twice
/// the worst logit departure between the two over the decisions before they
/// part (both decoded the same context up to there, so that is how far
/// their rounding sets them apart). Returns the divergence and the departure.
///
/// # Panics
/// As [`assert_agree`]; when a side has fewer logit vectors than decisions.
pub fn assert_agree_measured(
    got: &[Decision],
    got_logits: &[Vec<f32>],
    want: &[Decision],
    want_logits: &[Vec<f32>],
    stop_tol: f32,
    what: &str,
) -> (Option<Divergence>, f32) {
    let compared = divergence(got, want).map_or(got.len().min(want.len()), |d| d.at + 1);
    assert!(got_logits.len() >= compared && want_logits.len() >= compared, "{what}: logits not kept");
    let departure = got_logits[..compared]
        .iter()
        .zip(&want_logits[..compared])
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    eprintln!("{what}: worst logit departure {departure:.2e} over {compared} decisions");
    (assert_agree(got, want, 2.0 * departure, stop_tol, what), departure)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> StepRule {
        StepRule { max_steps: 4, confidence: 0.5, forced: false, draft: None }
    }

    #[test]
    fn margins_and_stop_distances_follow_the_rule() {
        assert_eq!(top2_margin(&[0.0, 3.0, 1.0]), 2.0);
        assert_eq!(top2_margin(&[1.0]), f32::INFINITY);
        let d = decisions_of([(&[7u32, 8][..], &[0.1f32, 0.45][..], vec![2.0, 0.5])], &rule());
        assert_eq!((d[0].token, d[0].margin, d[0].step_ends), (7, 2.0, false));
        assert!((d[0].stop_distance - 0.4).abs() < 1e-6);
        assert!(d[1].step_ends && (d[1].stop_distance - 0.05).abs() < 1e-6);
        let forced = StepRule { forced: true, ..rule() };
        assert_eq!(decisions_of([(&[7u32][..], &[0.5f32][..], vec![])], &forced)[0].stop_distance, f32::INFINITY);
    }

    #[test]
    fn only_a_near_tie_may_part_two_decodes() {
        let want = decisions_of([(&[1u32, 2, 3][..], &[0.0f32, 0.0, 0.9][..], vec![5.0, 0.01, 5.0])], &rule());
        let same = want.clone();
        assert_eq!(assert_agree(&same, &want, 0.05, 0.01, "same"), None);
        let mut tie = want.clone();
        tie[1].token = 9;
        assert_eq!(assert_agree(&tie, &want, 0.05, 0.01, "tie").map(|d| d.at), Some(1));
        let mut far = want.clone();
        far[0].token = 9;
        assert!(std::panic::catch_unwind(|| assert_agree(&far, &want, 0.05, 0.01, "far")).is_err());
        // A step that ends early where the stop rule was 0.5 from its threshold is no tie.
        let mut early = want.clone();
        early[0].step_ends = true;
        assert!(std::panic::catch_unwind(|| assert_agree(&early, &want, 0.05, 0.01, "early")).is_err());
        // The last compared token's step end is not compared (a budget may cut it).
        let mut cut = want[..2].to_vec();
        cut[1].step_ends = true;
        assert_eq!(divergence(&cut, &want), None);
    }
}

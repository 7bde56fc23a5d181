//! Trees of drafts: one verify forward checks the chain the micro decoder
//! drafted and, beside it, the likeliest alternatives to its tokens
//! (siblings read from the same micro steps' distributions, so a tree costs
//! more rows and no more micro steps), each row attending only its own
//! path. The nodes are taken best-first by the micro decoder's probability
//! of the path to each, as EAGLE-2's dynamic trees are, and an accepted
//! sibling ends the path (nothing is drafted after it). The check walks
//! the chain as a chain's is checked (greedy: the base's token; sampling:
//! speculative sampling's acceptance of the drafted token); where the
//! chain's token is not kept, the token the base draws in its place (its
//! own greedy token, or its draw from the residual distribution) keeps the
//! sibling that equals it, if one does. A sibling is a fixed candidate, not
//! a draw, so keeping it where it equals that token changes no probability:
//! every token is distributed as the base alone would draw it. The
//! siblings are the micro decoder's likeliest other tokens; sampling, they
//! come after the whole chain ([`Level::new`]).

use crate::engine::forward_cost::Prices;
use crate::sampling::TokenLogprob;

/// What one micro step drafted: the chain's token's probability under the
/// micro decoder, and the likeliest other tokens with theirs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Level {
    /// The drafted token's probability.
    pub p: f32,
    /// The next likeliest tokens and their probabilities, likeliest first.
    pub alternatives: Vec<(u32, f32)>,
}

impl Level {
    /// The level of `token`, drafted from `logits` (the micro decoder's,
    /// with the sampler's biases and penalties and a constraint's mask,
    /// before its truncations): the `n` likeliest other tokens a mask
    /// allows, with their probabilities, and for
    /// the token its own, or 1 where it was `drawn` (sampling), since
    /// speculative sampling keeps a drawn token with probability
    /// `min(1, p/q)`, on average the overlap of the base's and the micro
    /// decoder's distributions (all of it where they are one), far more
    /// than its own probability, while a sibling is kept only where the
    /// drawn token is not: the tree then takes the chain whole before any
    /// sibling.
    pub fn new(logits: &[f32], token: u32, n: usize, drawn: bool) -> Level {
        let lp = TokenLogprob::new(logits, token, n + 1);
        let others = lp.top.iter().filter(|&&(t, l)| t != token && l > f32::NEG_INFINITY);
        let alternatives = others.take(n).map(|&(t, l)| (t, l.exp()));
        Level { p: if drawn { 1.0 } else { lp.logprob.exp() }, alternatives: alternatives.collect() }
    }
}

/// One drafted row of a verify forward after the last verified token's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// Drafts from the verified token to it, itself included (1: the first).
    pub depth: usize,
    /// Its token.
    pub token: u32,
    /// Whether it is a sibling (an alternative to the chain's token at its
    /// depth) rather than the chain's.
    pub sibling: bool,
}

/// The tree of at most `nodes` drafts (chain tokens and siblings) best-first
/// by path probability among the chain of `levels` (one per drafted token)
/// and their alternatives: how many chain tokens it keeps, and the
/// siblings, each `(depth, token)`, by depth. A node's parent (the chain
/// token before its depth) is in the tree, and so is the chain's token at a
/// sibling's depth (whose position the sibling shares in the verify
/// forward): the nodes without them (ties) are left out.
pub fn choose(levels: &[Level], nodes: usize) -> (usize, Vec<(usize, u32)>) {
    // (path probability, depth, None for the chain's token, or an alternative)
    let mut scored: Vec<(f32, usize, Option<u32>)> = Vec::new();
    let mut before = 1.0f32;
    for (i, l) in levels.iter().enumerate() {
        scored.push((before * l.p, i + 1, None));
        scored.extend(l.alternatives.iter().map(|&(t, q)| (before * q, i + 1, Some(t))));
        before *= l.p;
    }
    // Stable: the chain's token first among equals, alternatives in order.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.truncate(nodes);
    let mut chain = 0;
    while scored.iter().any(|&(_, d, t)| d == chain + 1 && t.is_none()) {
        chain += 1;
    }
    let mut siblings: Vec<(usize, u32)> =
        scored.iter().filter_map(|&(_, d, t)| t.filter(|_| d <= chain).map(|t| (d, t))).collect();
    siblings.sort_by_key(|&(d, _)| d);
    (chain, siblings)
}

/// Under the draft gate: the siblings that join the chain of `levels` (kept
/// whole: the gate drafted it at `prices`) in a tree of at most `nodes`
/// drafts, `(depth, token)` by depth. Best-first by path probability, a
/// sibling joins where that probability per the price of its row beats the
/// step's expected tokens per price so far (the verified token's 1 and
/// each chain token's path probability, over [`Prices::step`] of the
/// chain: micro steps and rows), which it then adds to. Where a row costs
/// about a forward (two CPU cores) no sibling pays; where rows are nearly
/// free (a GPU) the likely ones do.
pub fn priced_siblings(levels: &[Level], nodes: usize, prices: &Prices) -> Vec<(usize, u32)> {
    let chain = levels.len();
    let (mut before, mut expected) = (1.0f32, 1.0f32);
    let mut scored: Vec<(f32, usize, u32)> = Vec::new();
    for (i, l) in levels.iter().enumerate() {
        scored.extend(l.alternatives.iter().map(|&(t, q)| (before * q, i + 1, t)));
        before *= l.p;
        expected += before;
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (rows, mut cost) = (prices.rows_only(), prices.step(chain));
    let mut siblings = Vec::new();
    for (score, depth, token) in scored.into_iter().take(nodes.saturating_sub(chain)) {
        let n = chain + siblings.len();
        let row = rows.step(n + 1) - rows.step(n);
        if score * cost <= expected * row {
            break;
        }
        (expected, cost) = (expected + score, cost + row);
        siblings.push((depth, token));
    }
    siblings.sort_by_key(|&(d, _)| d);
    siblings
}

/// The drafted rows of a verify forward in the order it reads them: the
/// chain, then the siblings by depth (so the chain's rows attend their
/// cells in the order a chain alone gives them, and round alike).
pub fn rows(chain: &[u32], siblings: &[(usize, u32)]) -> Vec<Node> {
    let chain = chain.iter().enumerate().map(|(i, &token)| Node { depth: i + 1, token, sibling: false });
    chain.chain(siblings.iter().map(|&(depth, token)| Node { depth, token, sibling: true })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(p: f32, alternatives: &[(u32, f32)]) -> Level {
        Level { p, alternatives: alternatives.to_vec() }
    }

    #[test]
    fn best_first_by_path_probability() {
        // Paths: chain 0.6, 0.3, 0.06; alternatives 0.3 and 0.05 (depth 1), 0.15 (2), 0.06 and 0.03 (3).
        let levels =
            [level(0.6, &[(10, 0.3), (11, 0.05)]), level(0.5, &[(20, 0.25)]), level(0.2, &[(30, 0.2), (31, 0.1)])];
        assert_eq!(choose(&levels, 3), (2, vec![(1, 10)]));
        assert_eq!(choose(&levels, 4), (2, vec![(1, 10), (2, 20)]));
        assert_eq!(choose(&levels, 5), (3, vec![(1, 10), (2, 20)]));
        assert_eq!(choose(&levels, 6), (3, vec![(1, 10), (2, 20), (3, 30)]));
        assert_eq!(choose(&levels, 7), (3, vec![(1, 10), (1, 11), (2, 20), (3, 30)]));
        // A sibling whose chain token is not in the tree has no row to share: left out.
        assert_eq!(choose(&[level(0.2, &[(10, 0.5)])], 1), (0, vec![]));
        assert_eq!(choose(&levels, 1), (1, vec![]));
        assert_eq!(choose(&[], 4), (0, vec![]));
    }

    #[test]
    fn a_level_holds_the_likeliest_other_tokens_and_a_drawn_tokens_chain_goes_first() {
        let logits = [0.0f32, 2.0, 1.0, 3.0];
        let e: Vec<f32> = logits.iter().map(|l| l.exp() / logits.iter().map(|l| l.exp()).sum::<f32>()).collect();
        let close = |a: &Level, b: &Level| {
            a.alternatives.len() == b.alternatives.len()
                && (a.p - b.p).abs() < 1e-6
                && a.alternatives.iter().zip(&b.alternatives).all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-6)
        };
        assert!(close(&Level::new(&logits, 1, 2, false), &level(e[1], &[(3, e[3]), (2, e[2])])));
        assert!(close(&Level::new(&logits, 3, 8, true), &level(1.0, &[(1, e[1]), (2, e[2]), (0, e[0])])));
        // Drawn: the chain's tokens outrank every sibling, however unlikely.
        let levels = [Level::new(&logits, 0, 2, true), Level::new(&logits, 2, 1, true)];
        assert_eq!(choose(&levels, 3), (2, vec![(1, 3)]));
        assert_eq!(choose(&levels, 5), (2, vec![(1, 3), (1, 1), (2, 3)]));
    }

    #[test]
    fn under_the_gate_siblings_join_where_their_rows_pay() {
        // A chain of 2 (0.8, then 0.5) and alternatives of 0.15 (depth 1) and 0.3 (depth 2).
        let levels = [level(0.8, &[(10, 0.15)]), level(0.5, &[(20, 0.3)])];
        // Rows nearly free (a GPU): both siblings, by depth.
        let free = Prices::from_curve(&[1.0, 1.01, 1.02, 1.03, 1.04], 0.05);
        assert_eq!(priced_siblings(&levels, 4, &free), vec![(1, 10), (2, 20)]);
        assert_eq!(priced_siblings(&levels, 3, &free), vec![(2, 20)], "the likelier path first, within the size");
        assert_eq!(priced_siblings(&levels, 2, &free), vec![]);
        // A row about a forward (two CPU cores): none.
        let dear = Prices::from_curve(&[1.0, 1.9, 2.8, 3.7, 4.6], 0.1);
        assert_eq!(priced_siblings(&levels, 4, &dear), vec![]);
    }

    #[test]
    fn rows_put_siblings_after_the_chain() {
        let r = rows(&[5, 6], &[(1, 7), (1, 8), (2, 9)]);
        let tokens: Vec<(usize, u32, bool)> = r.iter().map(|n| (n.depth, n.token, n.sibling)).collect();
        assert_eq!(tokens, [(1, 5, false), (2, 6, false), (1, 7, true), (1, 8, true), (2, 9, true)]);
    }
}

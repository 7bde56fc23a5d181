//! The drafts a self-verified sequence holds between the micro steps that
//! draft them and the forward that checks them: a chain, and where the
//! sequence drafts trees ([`crate::decode::tree`]), the siblings beside it.

use crate::decode::tree;
use crate::engine::forward_cost::Prices;

/// The tokens a self-verified sequence drafted and the next forward checks.
#[derive(Debug, Clone, Default)]
pub(super) struct Draft {
    pub(super) tokens: Vec<u32>,
    /// The distribution each was drawn from ([`crate::sampling::Sampler::distribution`]).
    pub(super) q: Vec<Vec<(u32, f32)>>,
    /// The stop probability after the token each one follows (the gate's signal).
    pub(super) p_stop_before: Vec<f32>,
    /// The constraint's mark before the drafted tokens were committed to it
    /// (they are taken back before the check).
    pub(super) mark: Option<usize>,
    /// The context drafted them (`ngram-simple`), not the micro decoder:
    /// the context's gate learns from their check.
    pub(super) from_context: bool,
    /// A tree's: what each drafting micro step offered, then (once the tree
    /// is chosen) the siblings verified beside the chain, `(depth, token)`.
    pub(super) levels: Vec<tree::Level>,
    pub(super) siblings: Vec<(usize, u32)>,
}

impl Draft {
    /// Rows it takes in a verify forward.
    pub(super) fn n_rows(&self) -> usize {
        self.tokens.len() + self.siblings.len()
    }

    /// Makes it a tree of at most `nodes` drafts from what its micro steps
    /// offered: under the draft gate (`prices`), the chain whole and the
    /// siblings whose rows pay ([`tree::priced_siblings`]), where it fits;
    /// else best-first ([`tree::choose`]), the chain cut where the tree
    /// leaves its tokens out.
    pub(super) fn grow_tree(&mut self, nodes: usize, prices: Option<&Prices>) {
        if self.levels.is_empty() {
            return;
        }
        let (chain, siblings) = match prices.filter(|_| nodes >= self.levels.len()) {
            Some(prices) => (self.levels.len(), tree::priced_siblings(&self.levels, nodes, prices)),
            None => tree::choose(&self.levels, nodes),
        };
        self.tokens.truncate(chain);
        self.q.truncate(chain);
        self.p_stop_before.truncate(chain);
        self.siblings = siblings;
        self.levels.clear();
    }
}

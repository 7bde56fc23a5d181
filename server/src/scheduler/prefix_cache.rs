//! The prompt-prefix cache: KV entries kept by the tokens they cover, so that
//! every sequence whose context starts with them shares them (the choices of
//! `n`, requests with the same system prompt, a chat's next turn) instead of
//! computing them again, as vLLM's and SGLang's prefix caches do.
//!
//! A trie of entries: each node is one KV entry (one cell), reached from the
//! root by the token spans of the entries before it; its own span is one
//! prompt token, or the k tokens of a macro step merged into one input. Two
//! contexts share a node exactly when they share every entry up to it, so
//! the node's entry is the same for both. Each node pins its cell
//! ([`hamburger::Engine::pin`]): the cell outlives the sequences that wrote
//! or shared it, until the pool needs it; then the least recently used
//! leaves whose cells no sequence holds go first.
//!
//! Each node also knows whether its entry is what a fresh read of some
//! prompt computed (issue 38): the length of that prompt, so that a prompt
//! adopts such entries only as far as [`hamburger::row_class::reusable_prefix`]
//! says it may and still gets the fresh answer bit for bit.

use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;

use hamburger::kv_cache::{KvCache, KV_TILE};
use hamburger::Engine;

/// The root's index in the arena.
const ROOT: usize = 0;

/// One cached entry.
struct Node {
    /// The tokens it covers.
    span: Box<[u32]>,
    /// Its cell (none for the root).
    cell: usize,
    parent: usize,
    /// The entries after it, by span.
    children: HashMap<Box<[u32]>, usize>,
    /// When it was last part of a lookup or an insertion.
    last_used: u64,
    /// The length of a prompt whose fresh read computed the entries from the
    /// root to this one (0: none known, such as a macro step's).
    fresh: usize,
}

/// The longest cached start of some tokens ([`PrefixCache::lookup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    /// Its cells, in order.
    pub(super) cells: Vec<usize>,
    /// The tokens they cover.
    pub(super) covered: usize,
    /// How many leading tokens' cells are what a fresh read of a prompt that
    /// long computes (the `alike` of [`hamburger::row_class::reusable_prefix`]).
    pub(super) alike: usize,
}

/// The cached entries.
pub(super) struct PrefixCache {
    /// The nodes; `None` for a recycled slot.
    nodes: Vec<Option<Node>>,
    /// Recycled slots.
    free: Vec<usize>,
    /// Counts lookups and insertions (the recency of a node).
    clock: u64,
}

impl PrefixCache {
    /// An empty cache.
    pub(super) fn new() -> PrefixCache {
        let root = Node {
            span: Box::new([]),
            cell: usize::MAX,
            parent: ROOT,
            children: HashMap::new(),
            last_used: 0,
            fresh: 0,
        };
        PrefixCache { nodes: vec![Some(root)], free: Vec::new(), clock: 0 }
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("a live node")
    }

    /// Cached entries (cells the cache pins).
    pub(super) fn len(&self) -> usize {
        self.nodes.len() - self.free.len() - 1
    }

    /// The cells of the longest cached start of `tokens` that covers at
    /// most `max` tokens, in order, and the tokens they cover; with `spans`,
    /// only entries of exactly those spans, in that order (a context fed
    /// back as it was first written). Marks them used. Its `alike` is the
    /// fresh prompt length of its last entry when every entry has one, else
    /// the tokens its leading entries that have one cover.
    pub(super) fn lookup(&mut self, tokens: &[u32], max: usize, spans: Option<&[usize]>) -> Found {
        self.clock += 1;
        let (mut at, mut node, mut cells) = (0, ROOT, Vec::new());
        // The fresh prompt length of the last entry of the leading run that has one, and where that run ends.
        let (mut fresh, mut run_end, mut in_run) = (0, 0, true);
        for step in 0.. {
            let rest = &tokens[at..max.min(tokens.len())];
            let next = match spans {
                Some(spans) => {
                    spans.get(step).and_then(|&n| rest.get(..n)).and_then(|s| self.node(node).children.get(s))
                }
                // The longest span that matches: fewer entries for the same tokens.
                None => self
                    .node(node)
                    .children
                    .iter()
                    .filter(|(span, _)| rest.starts_with(span))
                    .max_by_key(|(span, _)| span.len())
                    .map(|(_, i)| i),
            };
            let Some(&child) = next else { break };
            let clock = self.clock;
            let c = self.node_mut(child);
            c.last_used = clock;
            at += c.span.len();
            cells.push(c.cell);
            in_run &= c.fresh > 0;
            if in_run {
                (fresh, run_end) = (c.fresh, at);
            }
            node = child;
        }
        Found { cells, covered: at, alike: if at == run_end { fresh } else { run_end } }
    }

    /// Caches the entries of a context of `tokens` held in `entries` (cells
    /// and positions, by position; an entry covers the tokens after the
    /// previous one's up to its position), those of its first `fresh` tokens
    /// what a fresh read of a prompt that long computes (0: none known):
    /// entries already cached are marked used, and each new one pins its
    /// cell. Where a span is cached with another cell (computed twice), that
    /// one stays cached and the rest of the context is not cached: its
    /// entries were computed over other cells than the cached ones.
    pub(super) fn insert(&mut self, engine: &mut Engine, tokens: &[u32], entries: &[(usize, i32)], fresh: usize) {
        self.clock += 1;
        let (mut node, mut start) = (ROOT, 0);
        for &(cell, pos) in entries {
            let end = pos as usize + 1;
            if end > tokens.len() || end <= start {
                break;
            }
            let span = &tokens[start..end];
            let label = if end <= fresh { fresh } else { 0 };
            let child = match self.node(node).children.get(span) {
                Some(&child) if self.node(child).cell != cell => break,
                Some(&child) => {
                    if label > 0 {
                        self.node_mut(child).fresh = label;
                    }
                    child
                }
                None => {
                    if !engine.pin(cell) {
                        break;
                    }
                    let children = HashMap::new();
                    let n =
                        Node { span: span.into(), cell, parent: node, children, last_used: self.clock, fresh: label };
                    let child = match self.free.pop() {
                        Some(i) => {
                            self.nodes[i] = Some(n);
                            i
                        }
                        None => {
                            self.nodes.push(Some(n));
                            self.nodes.len() - 1
                        }
                    };
                    self.node_mut(node).children.insert(span.into(), child);
                    child
                }
            };
            let clock = self.clock;
            self.node_mut(child).last_used = clock;
            (node, start) = (child, end);
        }
    }

    /// Drops cached entries, least recently used leaves first and only those
    /// whose cells no sequence holds, until `engine`'s cache has `need` free
    /// cells or nothing more can go. Returns whether it has them.
    pub(super) fn evict(&mut self, engine: &mut Engine, need: usize) -> bool {
        let mut free = engine.kv().n_free();
        if free >= need {
            return true;
        }
        let evictable = |n: &Node| n.children.is_empty() && !engine.kv().is_held(n.cell);
        let mut leaves: BinaryHeap<(std::cmp::Reverse<u64>, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, n)| n.as_ref().filter(|n| evictable(n)).map(|n| (std::cmp::Reverse(n.last_used), i)))
            .collect();
        while free < need {
            let Some((_, i)) = leaves.pop() else { return false };
            let Some(parent) = self.nodes[i].as_ref().map(|n| n.parent) else { continue };
            self.drop_subtree(engine, i);
            free = engine.kv().n_free();
            let p = self.node(parent);
            if parent != ROOT && p.children.is_empty() && !engine.kv().is_held(p.cell) {
                leaves.push((std::cmp::Reverse(p.last_used), parent));
            }
        }
        true
    }

    /// Drops node `i` and every entry after it (unreachable without it).
    fn drop_subtree(&mut self, engine: &mut Engine, i: usize) {
        let Some(n) = self.nodes[i].as_ref() else { return };
        let (parent, span) = (n.parent, n.span.clone());
        self.node_mut(parent).children.remove(&span);
        let mut stack = vec![i];
        while let Some(j) = stack.pop() {
            let Some(n) = self.nodes[j].take() else { continue };
            self.free.push(j);
            engine.unpin(n.cell);
            stack.extend(n.children.into_values());
        }
    }

    /// Frees a run of `len` consecutive cells for a sequence that holds the
    /// cells `own` (one run, or none; its home is cell `home`), dropping the
    /// cached entries in it, and returns its first cell (`None` when no run
    /// qualifies; see [`PrefixCache::choose_run`]).
    pub(super) fn clear_run(
        &mut self,
        engine: &mut Engine,
        len: usize,
        home: usize,
        own: Range<usize>,
        avoid: &[Range<usize>],
    ) -> Option<usize> {
        let start = self.choose_run(engine.kv(), engine.n_seq(), len, home, &own, avoid)?;
        let run = start..start + len;
        let kv = engine.kv();
        let doomed: Vec<usize> = (1..self.nodes.len())
            .filter(|&i| self.nodes[i].as_ref().is_some_and(|n| run.contains(&n.cell) && !kv.is_held(n.cell)))
            .collect();
        for i in doomed {
            self.drop_subtree(engine, i);
        }
        let kept = if start == own.start { own.len() } else { 0 };
        engine.kv().is_free_run(start + kept, len - kept).then_some(start)
    }

    /// Where [`PrefixCache::clear_run`] frees its run. The run starts a
    /// whole number of [`KV_TILE`]s from `own`'s start (so entries moved
    /// there are summed in the same tiles; from a multiple of it when `own`
    /// is empty), holds no other sequence's cell and crosses none of the
    /// `avoid` ranges (runs other sequences are to write); a run from
    /// `own`'s start may hold `own` (the sequence stays where it is). Of
    /// such runs: the one whose cached entries were used least recently
    /// (none at all first), then one from a sequence's home (so that runs
    /// of up to a share pack the pool, as llama.cpp's per-slot streams do),
    /// then the one with the fewest cached entries, then the nearest after
    /// `home`.
    fn choose_run(
        &self,
        kv: &KvCache,
        n_seq: usize,
        len: usize,
        home: usize,
        own: &Range<usize>,
        avoid: &[Range<usize>],
    ) -> Option<usize> {
        let n = kv.n_cells();
        let first = own.start % KV_TILE;
        if len == 0 || first + len > n || own.len() > len {
            return None;
        }
        // Per cell: whether an entry of the cache is there, and when it was
        // last used if no sequence holds it (0: nothing to drop).
        let (mut is_cached, mut used) = (vec![false; n], vec![0u64; n]);
        for node in self.nodes.iter().skip(1).flatten() {
            is_cached[node.cell] = true;
            if !kv.is_held(node.cell) {
                used[node.cell] = node.last_used;
            }
        }
        // Cells before each cell that a run may not take, and cached entries it would drop.
        let (mut blocked, mut cached) = (vec![0; n + 1], vec![0; n + 1]);
        for c in 0..n {
            let held = kv.is_held(c);
            let taken = held || (kv.pos_of(c).is_some() && !is_cached[c]) || avoid.iter().any(|r| r.contains(&c));
            blocked[c + 1] = blocked[c] + usize::from(taken);
            cached[c + 1] = cached[c] + usize::from(is_cached[c] && !held);
        }
        // The latest use in each tile of candidate starts, then in a run.
        let tiles: Vec<u64> = used[first..].chunks(KV_TILE).map(|t| t.iter().copied().max().unwrap_or(0)).collect();
        let newest = |s: usize| {
            let (t, full) = ((s - first) / KV_TILE, len / KV_TILE);
            tiles[t..t + full].iter().chain(&used[s + full * KV_TILE..s + len]).copied().max().unwrap_or(0)
        };
        let align = |cell: usize| (cell + KV_TILE - 1 - first) / KV_TILE * KV_TILE + first;
        let homes: Vec<usize> = (0..n_seq).map(|q| align(kv.home_of(q))).collect();
        let allowed = |s: usize| if s == own.start { own.len() } else { 0 };
        (first..=n - len)
            .step_by(KV_TILE)
            .filter(|&s| blocked[s + len] - blocked[s] == allowed(s))
            .min_by_key(|&s| (newest(s), !homes.contains(&s), cached[s + len] - cached[s], (s + n - home % n) % n))
    }
}

//! Key/value caches shared by many sequences: preallocated per-layer tensors
//! of `n_cells` entries, and for each cell the set of sequences it belongs to
//! and the rope position of its entry (llama.cpp's unified cache, whose cells
//! hold a set of sequence ids). A graph writes its inputs' keys and values
//! into cells with `set_rows` at cell indices given as graph inputs, and
//! attends a window of cells under a mask that lets a query see only the
//! cells of its own sequence at positions up to its own; a cell shared by
//! several sequences (a common prompt prefix) is in each one's mask. A cell
//! may also be pinned (a cache of prefixes keeps it for sequences to come):
//! it is free only when no sequence holds it and nothing pins it. Entries
//! are never rewritten, so a sequence that goes on past a shared part takes
//! cells of its own: sharing needs no copy.
//!
//! The base model's cache holds one cell per macro step (a merged input
//! writes ONE entry), each sequence's cells taken after its last one where
//! free (so they stay in position order), else first-free. The micro decoder's cache gives
//! each sequence a fixed range of cells, rewritten every macro step (the
//! layout is [`crate::graph::micro`]'s).

use ggml::{Buffer, BufferType, Context, ContextGroups, Tensor, Type};

use crate::error::{Error, Result};

/// A sequence's index, below the engine's sequence count.
pub type SeqId = usize;

/// The most sequences one cache serves (llama.cpp's `LLAMA_MAX_SEQ`).
pub const MAX_SEQ: usize = 256;

/// A set of sequences (ids below [`MAX_SEQ`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SeqSet([u64; MAX_SEQ / 64]);

impl SeqSet {
    fn of(seq: SeqId) -> SeqSet {
        let mut set = SeqSet::default();
        set.insert(seq);
        set
    }

    fn contains(&self, seq: SeqId) -> bool {
        self.0[seq / 64] & (1 << (seq % 64)) != 0
    }

    fn insert(&mut self, seq: SeqId) {
        self.0[seq / 64] |= 1 << (seq % 64);
    }

    fn remove(&mut self, seq: SeqId) {
        self.0[seq / 64] &= !(1 << (seq % 64));
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
}

/// What an occupied cell holds: the entry at rope position `pos` of the
/// sequences `seqs`, pinned `pins` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    seqs: SeqSet,
    pos: i32,
    pins: u32,
}

impl Cell {
    /// Whether nothing holds it any more.
    fn is_unused(&self) -> bool {
        self.pins == 0 && self.seqs.is_empty()
    }
}

/// Removes `seq` from `slot`'s cell, freeing the cell when nothing else holds it.
fn leave(slot: &mut Option<Cell>, seq: SeqId) {
    if let Some(c) = slot {
        c.seqs.remove(seq);
        if c.is_unused() {
            *slot = None;
        }
    }
}

/// A preallocated cache of `n_cells` entries for each of its layers.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    n_embd_kv: usize,
    head_dim: usize,
    /// V is stored transposed (`[n_cells, E]`), as plain attention's matrix
    /// product wants it; flash attention reads it untransposed.
    v_trans: bool,
    /// Bytes of one cell's K (or V) row in one layer.
    row_bytes: usize,
    /// Bytes of one head's `head_dim` values.
    head_bytes: usize,
    cells: Vec<Option<Cell>>,
    buffers: Vec<Buffer>,
}

impl KvCache {
    /// Allocates and zeroes a cache of `n_cells` cells whose layer `il` lives
    /// in a buffer of type `bufts[il]` (the device of that layer's weights).
    ///
    /// # Errors
    /// When the row size overflows or a buffer cannot be allocated.
    pub fn new(
        bufts: &[BufferType],
        n_cells: usize,
        n_embd_kv: usize,
        head_dim: usize,
        ty: Type,
        v_trans: bool,
    ) -> Result<KvCache> {
        let (row_bytes, head_bytes) = (row_bytes(ty, n_embd_kv)?, row_bytes(ty, head_dim)?);
        let mut groups = ContextGroups::new(2 * bufts.len());
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let (e, n) = (n_embd_kv as i64, n_cells as i64);
        for (il, buft) in bufts.iter().enumerate() {
            let ctx = groups.get(*buft)?;
            k.push(ctx.new_tensor(ty, &[e, n]).named(&format!("cache_k_l{il}")));
            let v_shape = if v_trans { [n, e] } else { [e, n] };
            v.push(ctx.new_tensor(ty, &v_shape).named(&format!("cache_v_l{il}")));
        }
        let buffers = groups
            .iter()
            .map(|(buft, ctx)| {
                let b = Buffer::alloc_context(ctx, *buft)?;
                // Masked cells are multiplied by zero weights: they must hold finite values.
                b.clear(0);
                Ok(b)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache { k, v, n_embd_kv, head_dim, v_trans, row_bytes, head_bytes, cells: vec![None; n_cells], buffers })
    }

    /// Cells per layer.
    pub fn n_cells(&self) -> usize {
        self.cells.len()
    }

    /// Whether V is stored transposed.
    pub fn v_trans(&self) -> bool {
        self.v_trans
    }

    /// Bytes of the whole cache.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::size).sum()
    }

    /// Bytes one cell takes over all layers (K and V).
    pub fn bytes_per_cell(&self) -> usize {
        2 * self.k.len() * self.row_bytes
    }

    /// Cells in use, all sequences together.
    pub fn n_used(&self) -> usize {
        self.cells.iter().filter(|c| c.is_some()).count()
    }

    /// Cells `seq` holds (its own and those it shares).
    pub fn n_cells_of(&self, seq: SeqId) -> usize {
        self.cells.iter().filter(|c| c.is_some_and(|c| c.seqs.contains(seq))).count()
    }

    /// Free cells.
    pub fn n_free(&self) -> usize {
        self.cells.iter().filter(|c| c.is_none()).count()
    }

    /// Cells no sequence holds that are only pinned: what unpinning could free.
    pub fn n_pinned_only(&self) -> usize {
        self.cells.iter().filter(|c| c.is_some_and(|c| c.seqs.is_empty())).count()
    }

    /// The cells `seq` holds and the position of each, by position.
    pub fn entries_of(&self, seq: SeqId) -> Vec<(usize, i32)> {
        let mut entries: Vec<(usize, i32)> = self
            .cells
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.filter(|c| c.seqs.contains(seq)).map(|c| (i, c.pos)))
            .collect();
        entries.sort_by_key(|&(_, pos)| pos);
        entries
    }

    /// The position of cell `cell`'s entry, when it holds one.
    pub fn pos_of(&self, cell: usize) -> Option<i32> {
        self.cells.get(cell).copied().flatten().map(|c| c.pos)
    }

    /// Whether a sequence holds cell `cell`.
    pub fn is_held(&self, cell: usize) -> bool {
        self.cells.get(cell).copied().flatten().is_some_and(|c| !c.seqs.is_empty())
    }

    /// The cell holding `seq`'s entry at position `pos`, if any.
    pub fn cell_of(&self, seq: SeqId, pos: i32) -> Option<usize> {
        self.cells.iter().position(|c| c.is_some_and(|c| c.seqs.contains(seq) && c.pos == pos))
    }

    /// Free cells for new entries of the sequences `seqs` (one cell each, in
    /// order): each sequence's after the last cell it holds (or was given
    /// earlier in `seqs`) where the pool has free cells there, else the
    /// first free ones; `None` when fewer are free. A sequence's cells thus
    /// stay in position order where the pool allows, as a fresh read of its
    /// context lays them out: attention sums over cells in cell order, so a
    /// cached start followed by cells in another order would change the
    /// last bits of what is computed over it.
    pub fn find_free_for(&self, seqs: &[SeqId]) -> Option<Vec<usize>> {
        let mut taken = vec![false; self.cells.len()];
        let mut last: std::collections::HashMap<SeqId, usize> = std::collections::HashMap::new();
        let mut cells = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            let after = *last.entry(seq).or_insert_with(|| {
                self.cells.iter().rposition(|c| c.is_some_and(|c| c.seqs.contains(seq))).map_or(0, |c| c + 1)
            });
            let is_free = |i: &usize| self.cells[*i].is_none() && !taken[*i];
            let cell = (after..self.cells.len()).find(is_free).or_else(|| (0..after).find(is_free))?;
            taken[cell] = true;
            last.insert(seq, cell + 1);
            cells.push(cell);
        }
        Some(cells)
    }

    /// Gives cell `cell` to `seq`'s entry at position `pos`.
    pub fn occupy(&mut self, cell: usize, seq: SeqId, pos: i32) {
        self.cells[cell] = Some(Cell { seqs: SeqSet::of(seq), pos, pins: 0 });
    }

    /// Adds `seq` to the sequences of occupied cell `cell` (its entry becomes
    /// part of `seq`'s context); false when the cell is free.
    pub fn share(&mut self, cell: usize, seq: SeqId) -> bool {
        match &mut self.cells[cell] {
            Some(c) => {
                c.seqs.insert(seq);
                true
            }
            None => false,
        }
    }

    /// Pins occupied cell `cell`: it stays when its sequences leave it; false when it is free.
    pub fn pin(&mut self, cell: usize) -> bool {
        match &mut self.cells[cell] {
            Some(c) => {
                c.pins += 1;
                true
            }
            None => false,
        }
    }

    /// Takes one pin off cell `cell`, freeing it when nothing holds it any more.
    pub fn unpin(&mut self, cell: usize) {
        if let Some(c) = &mut self.cells[cell] {
            c.pins = c.pins.saturating_sub(1);
            if c.is_unused() {
                self.cells[cell] = None;
            }
        }
    }

    /// Frees cell `cell`.
    pub fn release(&mut self, cell: usize) {
        self.cells[cell] = None;
    }

    /// Takes `seq` out of every cell, freeing those nothing else holds
    /// (their stale contents are never attended).
    pub fn clear_seq(&mut self, seq: SeqId) {
        for c in &mut self.cells {
            leave(c, seq);
        }
    }

    /// Keeps the entries of `seq` that cover only its first `n` tokens and
    /// takes `seq` out of the others (freed when nothing else holds them);
    /// returns the tokens the kept entries cover: `n`, or less when a merged
    /// entry straddles token `n` (an entry's position is that of its last
    /// token, so it is dropped and its tokens must be fed again).
    pub fn keep_prefix(&mut self, seq: SeqId, n: usize) -> usize {
        let mut kept = 0;
        for c in &mut self.cells {
            match *c {
                Some(cell) if cell.seqs.contains(seq) && cell.pos as usize >= n => leave(c, seq),
                Some(cell) if cell.seqs.contains(seq) => kept = kept.max(cell.pos as usize + 1),
                _ => {}
            }
        }
        kept
    }

    /// One past the last occupied cell: the cells a graph must attend.
    pub fn used_window(&self) -> usize {
        self.cells.iter().rposition(Option::is_some).map_or(0, |i| i + 1)
    }

    /// Whether a query of `seq` at position `pos` attends cell `cell`.
    pub fn attends(&self, cell: usize, seq: SeqId, pos: i32) -> bool {
        self.cells[cell].is_some_and(|c| c.seqs.contains(seq) && c.pos <= pos)
    }

    /// The writes of `k_cur`/`v_cur` (`[E, n]`) of layer `il` into the cells
    /// given by `k_idx` (`[n]` i64; for a transposed V, `v_idx` holds `[n*E]`
    /// element indices). The caller expands them into the graph before
    /// anything reads the cache.
    pub fn store(
        &self,
        g: &Context,
        il: usize,
        k_cur: &Tensor,
        v_cur: &Tensor,
        k_idx: &Tensor,
        v_idx: &Tensor,
    ) -> [Tensor; 2] {
        let n = k_cur.ne()[1];
        let k = g.set_rows(&self.k[il], k_cur, k_idx);
        let v = if self.v_trans {
            let e = self.n_embd_kv as i64;
            let dst = g.reshape(&self.v[il], &[1, e * self.n_cells() as i64]);
            let src = g.reshape(v_cur, &[1, e * n]);
            g.set_rows(&dst, &src, v_idx)
        } else {
            g.set_rows(&self.v[il], v_cur, k_idx)
        };
        [k, v]
    }

    /// Keys of the first `n_kv` cells of layer `il` as `[head_dim, n_kv, n_head_kv]`.
    pub fn k_view(&self, g: &Context, il: usize, n_kv: usize) -> Tensor {
        let k = &self.k[il];
        let n_head_kv = (self.n_embd_kv / self.head_dim) as i64;
        g.view(k, &[self.head_dim as i64, n_kv as i64, n_head_kv], &[k.nb()[1], self.head_bytes], 0)
    }

    /// Values of the first `n_kv` cells of layer `il`: `[n_kv, head_dim, n_head_kv]`
    /// when transposed, else `[head_dim, n_kv, n_head_kv]`.
    pub fn v_view(&self, g: &Context, il: usize, n_kv: usize) -> Tensor {
        let v = &self.v[il];
        let hd = self.head_dim;
        let n_head_kv = (self.n_embd_kv / hd) as i64;
        if self.v_trans {
            let row = v.nb()[1];
            g.view(v, &[n_kv as i64, hd as i64, n_head_kv], &[row, row * hd], 0)
        } else {
            g.view(v, &[hd as i64, n_kv as i64, n_head_kv], &[v.nb()[1], self.head_bytes], 0)
        }
    }

    /// The element indices of a transposed-V write of `cells` (see [`KvCache::store`]).
    pub fn v_trans_indices(&self, cells: &[i64]) -> Vec<i64> {
        let (e, n) = (self.n_embd_kv as i64, self.n_cells() as i64);
        cells.iter().flat_map(|&c| (0..e).map(move |i| i * n + c)).collect()
    }
}

/// Bytes of one cache row of `n` values of type `ty`.
///
/// # Errors
/// When `n` is not a whole number of `ty`'s blocks.
pub(crate) fn row_bytes(ty: Type, n: usize) -> Result<usize> {
    ty.row_size(n).ok_or_else(|| Error::Invalid(format!("a KV row of {n} values does not fit type {ty}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU cache of `n` cells, one layer of one head of 4 values.
    fn cache(n: usize) -> KvCache {
        KvCache::new(&[BufferType::cpu()], n, 4, 4, Type::F32, true).unwrap()
    }

    #[test]
    fn free_cells_are_taken_first_free_and_a_sequences_cells_freed_together() {
        let mut kv = cache(6);
        assert_eq!(kv.find_free_for(&[2; 6]), Some(vec![0, 1, 2, 3, 4, 5]));
        assert_eq!(kv.find_free_for(&[2; 7]), None);
        for (cell, seq, pos) in [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)] {
            kv.occupy(cell, seq, pos);
        }
        assert_eq!((kv.n_used(), kv.n_cells_of(0), kv.n_cells_of(1)), (4, 2, 2));
        assert_eq!(kv.find_free_for(&[2; 2]), Some(vec![4, 5]));
        assert_eq!(kv.find_free_for(&[2; 3]), None);
        kv.clear_seq(0);
        assert_eq!((kv.n_used(), kv.n_cells_of(0), kv.n_cells_of(1)), (2, 0, 2));
        assert_eq!(kv.find_free_for(&[2; 3]), Some(vec![0, 2, 4]));
        kv.release(3);
        assert_eq!(kv.n_cells_of(1), 1);
    }

    #[test]
    fn a_prefix_keeps_the_entries_that_end_before_the_cut() {
        let mut kv = cache(8);
        // Sequence 0: prompt tokens 0, 1, 2 (one entry each), then a merged
        // entry of tokens 3..=5 (at position 5) and one of 6..=7 (at 7).
        for (cell, pos) in [(0, 0), (1, 1), (2, 2), (4, 5), (6, 7)] {
            kv.occupy(cell, 0, pos);
        }
        kv.occupy(3, 1, 4);
        // A cut inside the merged entry drops it: only tokens 0..3 remain.
        assert_eq!(kv.positions_of(0), vec![0, 1, 2, 5, 7]);
        assert_eq!(kv.keep_prefix(0, 4), 3);
        assert_eq!(kv.positions_of(0), vec![0, 1, 2]);
        assert_eq!(kv.n_cells_of(1), 1, "another sequence's cells stay");
        // A cut at an entry's end keeps it; a cut at 0 keeps nothing.
        assert_eq!(kv.keep_prefix(0, 3), 3);
        assert_eq!(kv.keep_prefix(0, 2), 2);
        assert_eq!(kv.keep_prefix(0, 0), 0);
        assert_eq!((kv.n_cells_of(0), kv.n_used()), (0, 1));
    }

    impl KvCache {
        /// The positions of `seq`'s entries, in cell order.
        fn positions_of(&self, seq: SeqId) -> Vec<i32> {
            self.cells.iter().flatten().filter(|c| c.seqs.contains(seq)).map(|c| c.pos).collect()
        }
    }

    #[test]
    fn a_shared_cell_is_in_each_sequences_mask_and_freed_when_the_last_one_leaves() {
        let mut kv = cache(4);
        kv.occupy(0, 0, 0);
        kv.occupy(1, 0, 1);
        assert!(kv.share(0, 1) && kv.share(1, 1));
        assert!(!kv.share(2, 1), "a free cell cannot be shared");
        kv.occupy(2, 1, 2);
        assert!(kv.attends(0, 1, 2) && kv.attends(1, 1, 2) && kv.attends(2, 1, 2));
        assert!(!kv.attends(2, 0, 2), "sequence 0 does not see 1's own cell");
        assert_eq!((kv.n_cells_of(0), kv.n_cells_of(1), kv.n_used()), (2, 3, 3));
        assert_eq!(kv.entries_of(1), [(0, 0), (1, 1), (2, 2)]);
        kv.clear_seq(0);
        assert_eq!(kv.n_used(), 3, "sequence 1 still holds the shared cells");
        // A pinned cell outlives its sequences; unpinned, it is free.
        assert!(kv.pin(0));
        kv.clear_seq(1);
        assert_eq!((kv.n_used(), kv.n_pinned_only(), kv.n_free()), (1, 1, 3));
        assert!(!kv.is_held(0));
        assert!(kv.share(0, 2), "a pinned cell joins a new sequence");
        assert_eq!(kv.keep_prefix(2, 0), 0);
        assert_eq!(kv.n_pinned_only(), 1, "keep_prefix leaves the pinned cell");
        kv.unpin(0);
        assert_eq!(kv.n_free(), 4);
    }

    #[test]
    fn a_sequences_new_cells_follow_its_last_one_where_the_pool_allows() {
        let mut kv = cache(8);
        kv.occupy(0, 0, 0);
        kv.occupy(3, 0, 1);
        kv.occupy(5, 1, 0);
        // Sequence 0 continues after cell 3, sequence 1 after cell 5, sequence 2 (new) at the first free cell.
        assert_eq!(kv.find_free_for(&[0, 1, 0, 2]), Some(vec![4, 6, 7, 1]));
        // Past the last cell, the first free ones.
        assert_eq!(kv.find_free_for(&[1, 1, 1]), Some(vec![6, 7, 1]));
        assert_eq!(kv.find_free_for(&[0; 6]), None);
        assert_eq!(kv.cell_of(0, 1), Some(3));
        assert_eq!(kv.cell_of(1, 1), None);
    }

    #[test]
    fn the_window_ends_after_the_last_occupied_cell() {
        let mut kv = cache(8);
        assert_eq!(kv.used_window(), 0);
        kv.occupy(5, 0, 0);
        kv.occupy(1, 1, 0);
        assert_eq!(kv.used_window(), 6);
        kv.release(5);
        assert_eq!(kv.used_window(), 2);
    }

    #[test]
    fn a_query_attends_its_own_sequences_cells_up_to_its_position() {
        let mut kv = cache(4);
        kv.occupy(0, 0, 0);
        kv.occupy(1, 1, 0);
        kv.occupy(2, 0, 3);
        let row = |seq, pos| (0..4).map(|c| kv.attends(c, seq, pos)).collect::<Vec<_>>();
        assert_eq!(row(0, 3), [true, false, true, false]);
        assert_eq!(row(0, 2), [true, false, false, false]);
        assert_eq!(row(1, 5), [false, true, false, false]);
        assert_eq!(row(2, 5), [false; 4]);
    }

    #[test]
    fn a_transposed_value_write_indexes_each_element_of_each_cell() {
        // V is [n_cells, E]: element i of cell c is at i * n_cells + c.
        assert_eq!(cache(6).v_trans_indices(&[1, 4]), [1, 7, 13, 19, 4, 10, 16, 22]);
    }
}

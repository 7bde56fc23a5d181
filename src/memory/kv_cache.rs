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
//! free (so they stay in position order), else first-free; a sequence's
//! first cell is sought from its home, the start of its share of the pool
//! (or from where a caller placed it), so that sequences decoded together
//! hold separate runs of cells and each attends a window of its own run
//! (llama.cpp's per-slot streams, in a pool whose cells can still be
//! shared). A sequence's entries can also be copied whole to another run
//! of cells whole tiles away, attended there bit for bit as before. The micro decoder's cache gives
//! each sequence a fixed range of cells, rewritten every macro step (the
//! layout is [`crate::graph::micro`]'s).

use ggml::{Buffer, BufferType, ContextGroups, Tensor, Type};

use crate::error::{Error, Result};

/// A sequence's index, below the engine's sequence count.
pub type SeqId = usize;

/// The most sequences one cache serves (llama.cpp's `LLAMA_MAX_SEQ`).
pub const MAX_SEQ: usize = 256;

/// Cells that ggml's CPU flash attention sums as one tile (windows start at
/// multiples of it): entries moved by a multiple of it are summed in the
/// same tiles, so a context moved so is attended bit for bit as before.
pub const KV_TILE: usize = 64;

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

    fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// The cells a group of queries attends: `n_kv` cells from cell `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// The first cell.
    pub first: usize,
    /// Cells from it.
    pub n_kv: usize,
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
    /// Sequences the pool is shared among, each with a home (see [`KvCache::with_homes`]).
    n_homes: usize,
    /// Where each sequence's first cell is sought instead of its home, when
    /// placed ([`KvCache::place`]).
    placed: Vec<Option<usize>>,
    buffers: Vec<Buffer>,
}

impl KvCache {
    /// Allocates and zeroes a cache of `n_cells` cells (in tensors of whole
    /// tiles) whose layer `il` lives in a buffer of type `bufts[il]` (the
    /// device of that layer's weights).
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
        let (e, n) = (n_embd_kv as i64, columns(n_cells) as i64);
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
        Ok(KvCache {
            k,
            v,
            n_embd_kv,
            head_dim,
            v_trans,
            row_bytes,
            head_bytes,
            cells: vec![None; n_cells],
            n_homes: 1,
            placed: vec![None],
            buffers,
        })
    }

    /// Gives each of `n_seq` sequences a home, the start of its equal share
    /// of the cells, where its first cell is sought (a sequence past its
    /// share goes on into the next one's, and a full share sends a new
    /// sequence to the next free cell): sequences decoded together then hold
    /// separate runs, and each one's attention window spans its own run
    /// rather than the whole pool.
    pub fn with_homes(mut self, n_seq: usize) -> KvCache {
        self.n_homes = n_seq.max(1);
        self.placed = vec![None; self.n_homes];
        self
    }

    /// The start of `seq`'s share of the cells.
    pub fn home_of(&self, seq: SeqId) -> usize {
        seq % self.n_homes * self.cells.len() / self.n_homes
    }

    /// Where `seq`'s first cell is sought: where it was placed, else its home.
    fn start_of(&self, seq: SeqId) -> usize {
        self.placed.get(seq).copied().flatten().unwrap_or_else(|| self.home_of(seq))
    }

    /// Seeks `seq`'s first cell from `cell` rather than from its home, until
    /// it is cleared ([`KvCache::clear_seq`]): for a caller that has made a
    /// free run there for all the sequence will write.
    pub fn place(&mut self, seq: SeqId, cell: usize) {
        if let Some(p) = self.placed.get_mut(seq) {
            *p = Some(cell);
        }
    }

    /// Whether the `len` cells from `start` are all free (and in the pool).
    pub fn is_free_run(&self, start: usize, len: usize) -> bool {
        self.cells.get(start..start + len).is_some_and(|run| run.iter().all(Option::is_none))
    }

    /// Moves `seq`'s entries, which must fill the consecutive cells from its
    /// first, into as many free cells from `to` (a multiple of [`KV_TILE`]
    /// cells away, so they are summed in the same tiles): their keys and
    /// values are copied, `seq` leaves the old cells (those that other
    /// sequences or pins hold keep their entries) and holds the new ones at
    /// the same positions. For a sequence that adopted cached entries far
    /// from the free cells it is about to write: its window then spans one
    /// run of cells rather than both places.
    ///
    /// # Errors
    /// When `seq`'s cells are not one run, the target cells are not free or
    /// not a whole number of tiles away, or a copy fails.
    pub fn relocate(&mut self, seq: SeqId, to: usize) -> Result<()> {
        let Some((from, last)) = self.span_of(seq) else { return Ok(()) };
        let len = last + 1 - from;
        if self.n_cells_of(seq) != len || !self.is_free_run(to, len) || from.abs_diff(to) % KV_TILE != 0 {
            return Err(Error::Invalid(format!(
                "cannot move sequence {seq}'s cells {from}..={last} to cell {to}: not one run, or not to free cells a whole number of {KV_TILE}-cell tiles away"
            )));
        }
        self.copy_cells(from, to, len)?;
        for i in 0..len {
            let pos = self.cells[from + i].map_or(0, |c| c.pos);
            leave(&mut self.cells[from + i], seq);
            self.occupy(to + i, seq, pos);
        }
        Ok(())
    }

    /// The first and the last cell `seq` holds (its own and shared ones), if any.
    pub fn span_of(&self, seq: SeqId) -> Option<(usize, usize)> {
        let holds = |c: &Option<Cell>| c.is_some_and(|c| c.seqs.contains(seq));
        Some((self.cells.iter().position(holds)?, self.cells.iter().rposition(holds)?))
    }

    /// The window of `seq`'s cells: from a multiple of `align` cells (so
    /// that where attention sums in tiles, they are the same tiles whatever
    /// the window) to a multiple of `pad` (so that a growing sequence keeps
    /// its graph's shape for `pad` steps), within the tensors' cells (past
    /// the usable ones up to a whole tile, which no window with `pad` a
    /// divisor of [`KV_TILE`] then cuts); `None` when it holds no cell.
    pub fn window_of(&self, seq: SeqId, align: usize, pad: usize) -> Option<Window> {
        let (lo, hi) = self.span_of(seq)?;
        let first = lo / align * align;
        Some(Window { first, n_kv: (hi + 1 - first).next_multiple_of(pad).min(self.n_columns() - first) })
    }

    /// Cells the tensors hold: the usable ones rounded up to whole tiles
    /// ([`columns`]).
    pub(super) fn n_columns(&self) -> usize {
        columns(self.cells.len())
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

    /// Whether more than one sequence holds cell `cell`.
    pub fn is_shared(&self, cell: usize) -> bool {
        self.cells.get(cell).copied().flatten().is_some_and(|c| c.seqs.len() > 1)
    }

    /// The cell holding `seq`'s entry at position `pos`, if any.
    pub fn cell_of(&self, seq: SeqId, pos: i32) -> Option<usize> {
        self.cells.iter().position(|c| c.is_some_and(|c| c.seqs.contains(seq) && c.pos == pos))
    }

    /// Free cells for new entries of the sequences `seqs` (one cell each, in
    /// order): each sequence's after the last cell it holds (or was given
    /// earlier in `seqs`; from its home when it holds none) where the pool
    /// has free cells there, else the first free ones; `None` when fewer are free. A sequence's cells thus
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
                self.cells
                    .iter()
                    .rposition(|c| c.is_some_and(|c| c.seqs.contains(seq)))
                    .map_or(self.start_of(seq), |c| c + 1)
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

    /// Copies the keys and values of cell `from` into cell `to` in every
    /// layer; the cells' bookkeeping stays as it was.
    ///
    /// # Errors
    /// When a cell is beyond the cache, or a copy fails.
    pub fn copy_cell(&mut self, from: usize, to: usize) -> Result<()> {
        if from.max(to) >= self.cells.len() {
            return Err(Error::Invalid(format!("cannot copy cell {from} to cell {to}: beyond the cache")));
        }
        self.copy_cells(from, to, 1)
    }

    /// Takes `seq` out of cell `cell`, freeing it when nothing else holds it.
    pub fn leave(&mut self, cell: usize, seq: SeqId) {
        if let Some(slot) = self.cells.get_mut(cell) {
            leave(slot, seq);
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
        if let Some(p) = self.placed.get_mut(seq) {
            *p = None;
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

    /// Whether a query of `seq` at position `pos` attends cell `cell`.
    pub fn attends(&self, cell: usize, seq: SeqId, pos: i32) -> bool {
        self.cells.get(cell).copied().flatten().is_some_and(|c| c.seqs.contains(seq) && c.pos <= pos)
    }
}

/// Cells the tensors of a cache of `n_cells` usable cells hold: whole tiles
/// ([`KV_TILE`]). The cells past the usable ones never hold an entry; they
/// let a window padded to a tile end past the last usable cell instead of
/// being cut there, since a window of another length is summed in another
/// order (ggml's products sum a row's last, odd cells apart, and its flash
/// attention sums by tiles): cut, the same context would give other logits
/// in a cache of another size.
fn columns(n_cells: usize) -> usize {
    n_cells.next_multiple_of(KV_TILE)
}

/// Bytes of one cache row of `n` values of type `ty`.
///
/// # Errors
/// When `n` is not a whole number of `ty`'s blocks.
pub(crate) fn row_bytes(ty: Type, n: usize) -> Result<usize> {
    ty.row_size(n).ok_or_else(|| Error::Invalid(format!("a KV row of {n} values does not fit type {ty}")))
}

mod tensors;

#[cfg(test)]
mod tests;

//! A sequence's context in the engine's caches: what it keeps, drops,
//! rewinds to, adopts from other sequences' cached prefixes, and where its
//! cells lie. Every change that moves a sequence's next position goes
//! through one place (`restart_at`), so its micro cache, features and output
//! rows never describe a forward it no longer holds.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::memory::kv_cache::SeqId;

impl Engine<'_> {
    /// Forgets `seq`: frees its cells and restarts its positions.
    pub fn clear_seq(&mut self, seq: SeqId) {
        self.kv.clear_seq(seq);
        self.restart_at(seq, 0, 0);
    }

    /// Keeps `seq`'s entries that cover only its first `n` tokens (a new
    /// prompt that starts with them reuses them) and forgets the rest;
    /// returns the tokens kept: `n`, or less when a merged entry straddles
    /// token `n`. The next input of `seq` continues at that position.
    pub fn keep_prefix(&mut self, seq: SeqId, n: usize) -> usize {
        let kept = self.kv.keep_prefix(seq, n.min(self.next_pos[seq]));
        self.restart_at(seq, kept, 0);
        kept
    }

    /// Makes `seq`'s next input start at position `n` again while it keeps
    /// its entries from `n` on: inputs at those positions rewrite them in
    /// place, in the cells they are in (shared or pinned ones included), so
    /// the context keeps its cell layout. For a cached prompt read again
    /// exactly as it was first read (`crate::memory::row_class::reusable_prefix`'s
    /// rest): the entries written are the ones already there, and since
    /// attention sums over cells in cell order (flash attention's tiled path
    /// even by 64-cell tiles), only the same cells give the same sums. When
    /// the entries from `n` on are not one token each, they are dropped
    /// instead ([`Engine::keep_prefix`]). Returns the position the next input
    /// starts at.
    pub fn rewind(&mut self, seq: SeqId, n: usize) -> usize {
        let end = self.next_pos[seq];
        let later = self.kv.entries_of(seq).into_iter().filter(|&(_, p)| p as usize >= n).count();
        if n >= end || later != end - n {
            return self.keep_prefix(seq, n);
        }
        self.restart_at(seq, n, end);
        n
    }

    /// Makes the cached entries in `cells` (held or pinned, in position
    /// order, a prefix of some context from position 0) the context of
    /// `seq`, which must hold nothing: its next input continues after the
    /// last of them. Returns the tokens they cover (0 when `cells` is empty).
    ///
    /// # Errors
    /// When `seq` is unknown or holds cells, or a cell is free.
    pub fn adopt(&mut self, seq: SeqId, cells: &[usize]) -> Result<usize> {
        if seq >= self.n_seq() || self.kv.n_cells_of(seq) > 0 {
            return Err(Error::Invalid(format!("sequence {seq} cannot adopt cached entries: unknown or not empty")));
        }
        let mut next = 0;
        for &c in cells {
            let Some(pos) = self.kv.pos_of(c) else {
                self.kv.clear_seq(seq);
                return Err(Error::Invalid(format!("cell {c} holds no entry to adopt")));
            };
            self.kv.share(c, seq);
            next = next.max(pos as usize + 1);
        }
        self.restart_at(seq, next, 0);
        Ok(next)
    }

    /// Seeks `seq`'s first cell from `cell` (see [`KvCache::place`](crate::memory::kv_cache::KvCache::place)).
    pub fn place(&mut self, seq: SeqId, cell: usize) {
        self.kv.place(seq, cell);
    }

    /// Moves `seq`'s entries, one run of cells, to the free cells from `to`
    /// (see [`KvCache::relocate`](crate::memory::kv_cache::KvCache::relocate)): what it attends is bit for bit the same.
    ///
    /// # Errors
    /// As [`KvCache::relocate`](crate::memory::kv_cache::KvCache::relocate).
    pub fn relocate(&mut self, seq: SeqId, to: usize) -> Result<()> {
        self.kv.relocate(seq, to)
    }

    /// Pins cell `cell`: it keeps its entry when the sequences holding it
    /// leave (a cache of prefixes keeps it for later sequences to
    /// [`Engine::adopt`]); false when it is free.
    pub fn pin(&mut self, cell: usize) -> bool {
        self.kv.pin(cell)
    }

    /// Takes one pin off cell `cell`, freeing it when no sequence holds it.
    pub fn unpin(&mut self, cell: usize) {
        self.kv.unpin(cell);
    }

    /// Keeps `seq`'s last base forward up to its output row `row` (0: the
    /// first output row of `seq` in that forward) and drops the entries of
    /// the inputs after it: the drafted tokens a self-verified step rejected.
    /// In a tree of drafts, the path to `row` is kept and the sibling rows
    /// go: a kept sibling's entry is copied into the cell of the drafted
    /// token it replaced, so that the context's cells stay one run in
    /// position order, as a chain's (a hole would change the order
    /// attention sums in, and so its rounding). The next input of `seq`
    /// continues after that row, and micro step 0 reads that row's features
    /// (when the forward stored them), so the next draft starts from the
    /// last accepted token.
    ///
    /// # Errors
    /// When the last forward of `seq` had no such output row.
    pub fn keep_through_output(&mut self, seq: SeqId, row: usize) -> Result<()> {
        let Some(&kept_row) = self.out_rows.get(seq).and_then(|p| p.get(row)) else {
            return Err(Error::Invalid(format!("sequence {seq}'s last base forward has no output row {row}")));
        };
        if kept_row.sibling {
            // Its entry goes where the chain's token at its position wrote,
            // so the cells stay one run, as a chain's would.
            let twin = self.out_rows[seq].iter().find(|o| !o.sibling && o.pos == kept_row.pos);
            let Some(twin) = twin.copied() else {
                return Err(Error::Invalid(format!("sequence {seq}'s sibling row {row} has no chain row beside it")));
            };
            self.kv.copy_cell(kept_row.cell, twin.cell)?;
        }
        for o in self.out_rows[seq].iter().filter(|o| o.sibling) {
            self.kv.leave(o.cell, seq);
        }
        let pos = kept_row.pos as usize;
        let kept = self.kv.keep_prefix(seq, pos + 1);
        debug_assert_eq!(kept, pos + 1, "a verified row is one token's entry");
        self.next_pos[seq] = kept;
        self.rewrite_below[seq] = self.rewrite_below[seq].min(kept);
        self.out_rows[seq].truncate(row + 1);
        if self.feature_row[seq].is_some() {
            self.feature_row[seq] = Some(row);
        }
        Ok(())
    }

    /// Continues `seq` at position `next`: its micro cache, features and
    /// last forward's output rows are forgotten, and inputs below
    /// `rewrite_below` rewrite the entries it holds there ([`Engine::rewind`]).
    fn restart_at(&mut self, seq: SeqId, next: usize, rewrite_below: usize) {
        self.micro.clear_seq(seq);
        self.next_pos[seq] = next;
        self.feature_row[seq] = None;
        self.out_rows[seq].clear();
        self.rewrite_below[seq] = rewrite_below;
    }
}

//! The one pool of KV cells every request draws from: the engine's
//! sequences not in use, and the prefix cache that keeps entries for
//! sequences to come. A request takes a sequence, adopts the cached entries
//! its context starts with, and takes cells as it grows (one per prompt
//! token, one per macro step); when it ends (or is preempted) its entries
//! go to the cache and its sequence is free again. Cells the cache alone
//! holds are taken back, least recently used first, whenever the pool needs
//! them.
//!
//! A request is also given one run of free cells for its context, the cells
//! it adopts and all it will write (prompt and answer, up to its share of
//! the pool), taken back from the cache where needed: its attention window
//! then spans its own cells and few others (see
//! [`hamburger::kv_cache::KvCache::with_homes`]). Cached entries it adopts
//! that are not followed by such a run, or that another running request
//! holds too, are copied to the start of one.

use std::collections::HashMap;
use std::ops::Range;

use hamburger::kv_cache::SeqId;
use hamburger::Engine;

use super::prefix_cache::{Found, PrefixCache};

/// The sequences not in use and the cached prefixes.
pub(super) struct Pool {
    cache: PrefixCache,
    /// Sequences no request runs in, the least recently freed first.
    free_seqs: Vec<SeqId>,
    /// The run of cells each running sequence was given (see [`Pool::take`]).
    runs: HashMap<SeqId, Range<usize>>,
}

impl Pool {
    /// A pool over an engine of `n_seq` sequences, nothing cached.
    pub(super) fn new(n_seq: usize) -> Pool {
        Pool { cache: PrefixCache::new(), free_seqs: (0..n_seq).rev().collect(), runs: HashMap::new() }
    }

    /// Whether a sequence is free.
    pub(super) fn has_free_seq(&self) -> bool {
        !self.free_seqs.is_empty()
    }

    /// Entries the prefix cache keeps.
    pub(super) fn n_cached(&self) -> usize {
        self.cache.len()
    }

    /// The longest cached start of `tokens` covering at most `max` tokens
    /// (with `spans`, entries of exactly those spans).
    pub(super) fn lookup(&mut self, tokens: &[u32], max: usize, spans: Option<&[usize]>) -> Found {
        self.cache.lookup(tokens, max, spans)
    }

    /// Takes a free sequence whose context is `cells` (cached entries, see
    /// [`Pool::lookup`]) and that will write `grow` more entries, once
    /// `need` more cells are free for it (cached entries taken back as
    /// needed); `None` (nothing taken) when no sequence is free or the cells
    /// cannot be found. With `grow`, it is given a run of cells (see
    /// [`Pool::seat`]).
    pub(super) fn take(&mut self, engine: &mut Engine, cells: &[usize], grow: usize, need: usize) -> Option<SeqId> {
        let seq = self.free_seqs.pop()?;
        // Adopted first, so that making room cannot take back these very cells.
        let adopted = engine.adopt(seq, cells).is_ok();
        if adopted && grow > 0 {
            self.seat(engine, seq, cells, grow);
        }
        if adopted && self.cache.evict(engine, need) {
            return Some(seq);
        }
        engine.clear_seq(seq);
        self.runs.remove(&seq);
        self.free_seqs.push(seq);
        None
    }

    /// Gives `seq`, which holds the adopted `cells` (in position order), a
    /// run of free cells for them and the `grow` entries it will write (at
    /// most its share of the pool) that no other running sequence's run
    /// crosses: the run after its cells where it is free, else one freed of
    /// cached entries (see [`PrefixCache::clear_run`]), to which its cells
    /// are copied unless the run starts with them. Cells another running
    /// sequence holds too (a system prompt both start with, the `n` choices
    /// of one prompt) are copied as well, and stay with that sequence: left
    /// shared, the new sequence's window would span both runs, and
    /// attention would read every cell between them at every step. Where
    /// its cells are not one run or no run can be had, it stays as it is.
    fn seat(&mut self, engine: &mut Engine, seq: SeqId, cells: &[usize], grow: usize) {
        let share = engine.kv().n_cells() / engine.n_seq().max(1);
        let len = cells.len();
        let want = (len + grow).min(share.max(len));
        let avoid: Vec<Range<usize>> = self.runs.values().cloned().collect();
        let own = match cells {
            [] => 0..0,
            [c0, .., last] | [c0 @ last] if *last + 1 - c0 == len => *c0..last + 1,
            _ => return,
        };
        let crosses = |run: &Range<usize>| avoid.iter().any(|r| r.start < run.end && run.start < r.end);
        if len > 0 && engine.kv().is_free_run(own.end, want - len) && !crosses(&(own.end..own.start + want)) {
            self.runs.insert(seq, own.start..own.start + want);
            return;
        }
        let home = engine.kv().home_of(seq);
        let Some(start) = self.cache.clear_run(engine, want, home, own.clone(), &avoid) else {
            log::debug!("sequence {seq}: no run of {want} free cells for it");
            return;
        };
        let placed = match len {
            0 => {
                engine.place(seq, start);
                true
            }
            _ if start == own.start => true,
            _ => engine.relocate(seq, start).map_err(|e| log::warn!("{e}")).is_ok(),
        };
        if placed {
            log::debug!("sequence {seq}: cells {start}..{} for its {len} adopted and {grow} new entries", start + want);
            self.runs.insert(seq, start..start + want);
        }
    }

    /// Caches the entries `seq` holds of a context of `tokens` (those it
    /// wrote are kept when it leaves them), those of its first `fresh`
    /// tokens what a fresh read of a prompt that long computes.
    pub(super) fn publish(&mut self, engine: &mut Engine, seq: SeqId, tokens: &[u32], fresh: usize) {
        let entries = engine.kv().entries_of(seq);
        self.cache.insert(engine, tokens, &entries, fresh);
    }

    /// Frees `seq`; with `context` (its tokens, and the fresh prompt length
    /// of [`Pool::publish`]), its entries stay cached.
    pub(super) fn release(&mut self, engine: &mut Engine, seq: SeqId, context: Option<(&[u32], usize)>) {
        if let Some((tokens, fresh)) = context {
            self.publish(engine, seq, tokens, fresh);
        }
        engine.clear_seq(seq);
        self.runs.remove(&seq);
        self.free_seqs.insert(0, seq);
    }

    /// Takes back cached entries until `need` cells are free; whether they are.
    pub(super) fn make_room(&mut self, engine: &mut Engine, need: usize) -> bool {
        self.cache.evict(engine, need)
    }
}

#[cfg(test)]
mod tests;

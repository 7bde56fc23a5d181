//! The one pool of KV cells every request draws from: the engine's
//! sequences not in use, and the prefix cache that keeps entries for
//! sequences to come. A request takes a sequence, adopts the cached entries
//! its context starts with, and takes cells as it grows (one per prompt
//! token, one per macro step); when it ends (or is preempted) its entries
//! go to the cache and its sequence is free again. Cells the cache alone
//! holds are taken back, least recently used first, whenever the pool needs
//! them.

use hamburger::kv_cache::SeqId;
use hamburger::Engine;

use super::prefix_cache::{Found, PrefixCache};

/// The sequences not in use and the cached prefixes.
pub(super) struct Pool {
    cache: PrefixCache,
    /// Sequences no request runs in, the least recently freed first.
    free_seqs: Vec<SeqId>,
}

impl Pool {
    /// A pool over an engine of `n_seq` sequences, nothing cached.
    pub(super) fn new(n_seq: usize) -> Pool {
        Pool { cache: PrefixCache::new(), free_seqs: (0..n_seq).rev().collect() }
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
    /// [`Pool::lookup`]), once `need` more cells are free for it (cached
    /// entries taken back as needed); `None` (nothing taken) when no
    /// sequence is free or the cells cannot be found.
    pub(super) fn take(&mut self, engine: &mut Engine, cells: &[usize], need: usize) -> Option<SeqId> {
        let seq = self.free_seqs.pop()?;
        // Adopted first, so that making room cannot take back these very cells.
        let adopted = engine.adopt(seq, cells).is_ok();
        if adopted && self.cache.evict(engine, need) {
            return Some(seq);
        }
        engine.clear_seq(seq);
        self.free_seqs.push(seq);
        None
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
        self.free_seqs.insert(0, seq);
    }

    /// Takes back cached entries until `need` cells are free; whether they are.
    pub(super) fn make_room(&mut self, engine: &mut Engine, need: usize) -> bool {
        self.cache.evict(engine, need)
    }
}

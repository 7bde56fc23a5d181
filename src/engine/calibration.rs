//! The draft gate's prices, fixed once per engine so that a self-verified
//! greedy answer is the same text run after run
//! ([`crate::engine::forward_cost`] says why they must not follow the clock).
//!
//! [`Engine::fix_prices`] times base forwards of the row counts a
//! self-verified sequence reads (1 to `n_max + 1`, and, for an engine of
//! several sequences, doubling from there up to their rows together) and its
//! micro steps, on a scratch sequence, before the first self-verified
//! sequence is fed; then the prices stay. Those times are written to the
//! price cache, a small text file per model and settings under
//! `$HAMBURGER_CACHE/draft-prices` (else `$XDG_CACHE_HOME/hamburger`, else
//! `~/.cache/hamburger`), and a later run with the same model file (path,
//! size and modification time), backends, threads, KV type and attention
//! reads them instead of timing again: the same command then drafts alike,
//! and gives the same text, run after run on one machine. The cache is best
//! effort, as ccache's or Triton's are: a file that cannot be read or is
//! damaged is timed again and rewritten, one that cannot be written is
//! skipped (a debug log line says so), and the prices only steer how many
//! tokens are drafted, never which are kept (verification is exact).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::engine::forward_cost::ForwardCosts;
use crate::engine::Engine;
use crate::error::Result;
use crate::graph::base::{self, Wants};
use crate::graph::micro::MicroWants;
use crate::memory::batch::Batch;
use crate::memory::kv_cache::SeqId;

/// Runs of each row count and of each micro step: the engine leaves out a
/// graph's first two ([`ForwardCosts`]), and the price is the median of the rest.
const RUNS: usize = 5;
/// The most rows timed: more, as in prompt chunks, is not the gate's concern.
const MOST_ROWS: usize = 16;

impl Engine<'_> {
    /// Fixes the draft gate's prices for this engine's lifetime, if they are
    /// not yet: read from the price cache, or timed on `seq` (which must hold
    /// no cells; it holds none after) for sequences drafting up to `n_max`
    /// tokens, and written to the cache. The forwards timed are not counted
    /// in [`Engine::counters`] or [`Engine::n_forwards`].
    ///
    /// # Errors
    /// When a forward or micro step fails.
    pub fn fix_prices(&mut self, seq: SeqId, n_max: usize) -> Result<()> {
        if self.costs.is_fixed() {
            return Ok(());
        }
        let rows = self.rows_to_time(n_max);
        let file = self.price_file(&rows);
        let cached = file.as_deref().and_then(|f| std::fs::read_to_string(f).ok());
        if let Some(costs) = cached.and_then(|text| ForwardCosts::from_text(&self.model.hp, &text)) {
            self.costs = costs;
            log::debug!("draft prices read from the cache: {}", self.costs);
            return Ok(());
        }
        let (forwards, counters) = (self.forwards, self.counters);
        let timed = self.time_forwards(seq, &rows, n_max);
        self.clear_seq(seq);
        (self.forwards, self.counters) = (forwards, counters);
        timed?;
        self.costs.fix();
        log::debug!("draft prices timed: {}", self.costs);
        if let Some(file) = file {
            if let Err(e) = write_atomically(&file, &self.costs.to_text()) {
                log::debug!("the draft prices are not cached: {}: {e}", file.display());
            }
        }
        Ok(())
    }

    /// 1 to `n_max + 1` rows (one sequence's verify forwards), then doubling
    /// up to every sequence's together, at most [`MOST_ROWS`].
    fn rows_to_time(&self, n_max: usize) -> Vec<usize> {
        let one = (n_max + 1).min(MOST_ROWS);
        let all = (one * self.n_seq()).min(MOST_ROWS);
        let mut rows: Vec<usize> = (1..=one).collect();
        while rows[rows.len() - 1] < all {
            rows.push((rows[rows.len() - 1] * 2).min(all));
        }
        rows
    }

    /// Times `rows`' forwards on `seq` (its features stored when one
    /// sequence may have that many output rows), then `n_max` micro steps.
    fn time_forwards(&mut self, seq: SeqId, rows: &[usize], n_max: usize) -> Result<()> {
        let hp = &self.model.hp;
        let tokens: Vec<u32> = (0..MOST_ROWS as u32).map(|t| t % hp.n_vocab as u32).collect();
        let per_seq = base::feature_rows_per_seq(hp);
        let steps = n_max.min(hp.max_steps.saturating_sub(1));
        for &r in rows {
            for _ in 0..RUNS {
                self.clear_seq(seq);
                let mut batch = Batch::new();
                batch.push_output_rows(seq, &tokens[..r]);
                self.decode(
                    &batch,
                    Wants { stop_head: true, logits: false, features: r <= per_seq, draft_stop: true },
                )?;
            }
        }
        for _ in 0..if steps > 0 { RUNS } else { 0 } {
            self.clear_seq(seq);
            let mut batch = Batch::new();
            batch.push_output_rows(seq, &tokens[..1]);
            self.decode(&batch, Wants { stop_head: true, logits: false, features: true, draft_stop: true })?;
            for (s, &token) in tokens[..steps].iter().enumerate() {
                self.micro_step(
                    s,
                    &[(seq, token)],
                    &[],
                    MicroWants { stop_head: true, logits: false, drafts: true, draft_vocab: true },
                )?;
            }
        }
        Ok(())
    }

    /// The price cache's file for this engine timing `rows`, None when no
    /// cache folder is known or the model file cannot be read.
    fn price_file(&self, rows: &[usize]) -> Option<PathBuf> {
        let dir = cache_dir()?;
        let meta = std::fs::metadata(&self.model.path).ok()?;
        let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
        let path = std::fs::canonicalize(&self.model.path).ok()?;
        let devices: Vec<String> = self.backends.iter().map(|b| b.device().description()).collect();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (env!("CARGO_PKG_VERSION"), path, meta.len(), modified, devices, self.model.plan.n_gpu_layers()).hash(&mut h);
        (self.n_threads, self.flash, format!("{:?}", self.kv_type), rows).hash(&mut h);
        Some(dir.join("draft-prices").join(format!("{:016x}.txt", h.finish())))
    }
}

/// The project's cache folder (the price cache here; the tests' downloads
/// too): `$HAMBURGER_CACHE`, else `$XDG_CACHE_HOME/hamburger`, else
/// `~/.cache/hamburger`; None when none of those is set.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HAMBURGER_CACHE") {
        return Some(d.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(base.join("hamburger"))
}

/// Writes `text` to `file` whole or not at all: to a file beside it, then renamed.
fn write_atomically(file: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let part = file.with_extension(format!("{}.part", std::process::id()));
    std::fs::write(&part, text).and_then(|()| std::fs::rename(&part, file)).inspect_err(|_| {
        let _ = std::fs::remove_file(&part);
    })
}

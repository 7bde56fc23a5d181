//! How a base forward's rows attend the KV cache: in one group per sequence,
//! each over its own window, or all together in one group over the union of
//! the windows ([`crate::graph::layer::attn_groups`]). A row's result is the
//! same either way (`crate::memory::row_class`); what differs is the work.

use crate::memory::kv_cache::Window;

/// From this many cells, one query row's fused attention (ggml's CPU flash
/// attention) is split across the threads by cells, so a window mostly of
/// other sequences' cells leaves the threads given those cells idle.
const SPLIT_BY_CELLS: usize = 512;

/// One sequence of a forward, as its attention sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqWindow {
    /// The sequence's rows in the forward.
    pub rows: usize,
    /// Its window.
    pub window: Window,
    /// The cells it holds (all inside its window).
    pub held: usize,
}

impl SeqWindow {
    /// A window split by cells whose sequence holds less than half its cells.
    fn is_scattered(&self) -> bool {
        self.window.n_kv >= SPLIT_BY_CELLS && 2 * self.held < self.window.n_kv
    }

    /// Row-cells its group attends.
    fn work(&self) -> usize {
        self.rows * self.window.n_kv
    }
}

/// Whether the rows of `seqs` attend by sequence rather than all over the
/// union of their windows. Attention costs each row every cell of its
/// group's window, so the union never costs less; with the separate
/// products (`fused` false) every cell costs alike, and the union is taken
/// only where it costs no more (one group instead of several alike). Fused,
/// a masked cell costs less than a held one, but one row's scattered window
/// is split by cells and can leave all but one of `n_threads` threads idle:
/// there the union is taken, where some window is scattered, as long as it
/// costs at most `n_threads` times the row-cells of attending by sequence.
/// (Before this bound, one scattered sequence sent every row of a 16,384-cell
/// pool to the union, and a long-running server several times slower.)
pub(super) fn attend_by_seq(seqs: &[SeqWindow], fused: bool, n_threads: usize) -> bool {
    if !seqs.iter().any(SeqWindow::is_scattered) {
        return true;
    }
    let first = seqs.iter().map(|s| s.window.first).min().unwrap_or(0);
    let end = seqs.iter().map(|s| s.window.first + s.window.n_kv).max().unwrap_or(0);
    let union = seqs.iter().map(|s| s.rows).sum::<usize>() * (end - first);
    let by_seq: usize = seqs.iter().map(SeqWindow::work).sum();
    let slack = if fused { n_threads.max(1) } else { 1 };
    union > slack * by_seq
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(rows: usize, first: usize, n_kv: usize, held: usize) -> SeqWindow {
        SeqWindow { rows, window: Window { first, n_kv }, held }
    }

    #[test]
    fn compact_windows_attend_by_sequence() {
        let seqs = [seq(1, 0, 1024, 1000), seq(1, 1024, 256, 10), seq(8, 2048, 512, 300)];
        assert!(attend_by_seq(&seqs, false, 2));
        assert!(attend_by_seq(&seqs, true, 2));
    }

    #[test]
    fn one_scattered_window_in_a_wide_pool_no_longer_sends_every_row_to_the_union() {
        // What a long-running 16-slot server showed: one sequence holding 185
        // cells of a 1,024-cell window, 15 compact ones spread over 16,384 cells.
        let mut seqs: Vec<SeqWindow> = (1..16).map(|s| seq(1, s * 1024, 896, 850)).collect();
        seqs.push(seq(1, 0, 1024, 185));
        assert!(attend_by_seq(&seqs, false, 2));
        assert!(attend_by_seq(&seqs, true, 2));
        // A prompt's many rows make the union dearer still.
        seqs[3].rows = 512;
        assert!(attend_by_seq(&seqs, true, 16));
    }

    #[test]
    fn scattered_windows_that_mostly_overlap_attend_together_when_fused() {
        // Every sequence shares a cached prompt at the pool's start and
        // writes at its home after it: the windows nest.
        let seqs: Vec<SeqWindow> = (0..8).map(|s| seq(1, 0, (s + 1) * 1024, 300)).collect();
        assert!(!attend_by_seq(&seqs, true, 2));
        // The separate products pay every cell: by sequence costs less.
        assert!(attend_by_seq(&seqs, false, 2));
        // Alike windows cost the same either way: one group.
        let alike = [seq(1, 0, 2048, 300), seq(1, 0, 2048, 300)];
        assert!(!attend_by_seq(&alike, false, 2));
    }
}

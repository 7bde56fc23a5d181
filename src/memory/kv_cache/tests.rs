//! The cache's bookkeeping: free cells, homes, sharing, windows, prefixes.

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
fn with_homes_each_sequence_starts_in_its_own_share_and_runs_on_past_it() {
    let mut kv = cache(8).with_homes(2);
    // Sequence 1's home is cell 4, sequence 2's (2 % 2 = 0) cell 0.
    assert_eq!(kv.find_free_for(&[1, 1, 0, 0]), Some(vec![4, 5, 0, 1]));
    for (cell, seq, pos) in [(4, 1, 0), (5, 1, 1), (6, 1, 2), (7, 1, 3)] {
        kv.occupy(cell, seq, pos);
    }
    assert_eq!(kv.span_of(1), Some((4, 7)));
    assert_eq!(kv.window_of(1, 3, 3), Some(Window { first: 3, n_kv: 6 }), "widened, into the tensors' last tile");
    assert_eq!(kv.span_of(0), None);
    // A sequence past the pool's end, or a new one whose home and the
    // cells after it are full, takes the first free cell.
    assert_eq!(kv.find_free_for(&[1]), Some(vec![0]));
    assert_eq!(kv.find_free_for(&[3]), Some(vec![0]));
}

#[test]
fn a_sequences_window_spans_its_own_and_shared_cells() {
    let mut kv = cache(8);
    assert_eq!(kv.window_of(0, 2, 2), None);
    kv.occupy(5, 0, 1);
    kv.occupy(1, 1, 0);
    assert_eq!(kv.window_of(0, 2, 2), Some(Window { first: 4, n_kv: 2 }));
    assert!(kv.share(1, 0), "a shared prefix cell widens the window");
    assert_eq!(kv.window_of(0, 2, 2), Some(Window { first: 0, n_kv: 6 }));
    assert_eq!(kv.window_of(0, 4, 4), Some(Window { first: 0, n_kv: 8 }));
    assert_eq!(kv.window_of(1, 4, 3), Some(Window { first: 0, n_kv: 3 }), "the end padded from the start");
}

#[test]
fn a_window_at_the_end_of_a_cache_of_any_size_is_a_whole_number_of_tiles() {
    // 100 usable cells, tensors of 128: the window is never cut at 100,
    // and the padding cells are attended by nobody.
    let mut kv = cache(100);
    assert_eq!(kv.n_cells(), 100);
    for pos in 0..100 {
        kv.occupy(pos, 0, pos as i32);
    }
    assert_eq!(kv.window_of(0, KV_TILE, KV_TILE), Some(Window { first: 0, n_kv: 128 }));
    assert!(kv.attends(99, 0, 99) && !kv.attends(100, 0, 200) && !kv.attends(127, 0, 200));
    assert_eq!(kv.find_free_for(&[0]), None, "no entry goes past the usable cells");
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
    // V is [64, E] for 6 cells (whole tiles): element i of cell c is at i * 64 + c.
    assert_eq!(cache(6).v_trans_indices(&[1, 4]), [1, 65, 129, 193, 4, 68, 132, 196]);
}

#[test]
fn a_placed_sequence_starts_where_it_was_placed_until_cleared() {
    let mut kv = cache(8).with_homes(2);
    kv.place(1, 1);
    assert_eq!(kv.find_free_for(&[1, 1]), Some(vec![1, 2]), "from cell 1, not its home 4");
    kv.clear_seq(1);
    assert_eq!(kv.find_free_for(&[1]), Some(vec![4]), "home again");
    assert!(kv.is_free_run(5, 3) && !kv.is_free_run(5, 4), "a run past the pool is not free");
}

#[test]
fn a_moved_run_keeps_its_keys_values_and_positions_and_leaves_what_others_hold() {
    for v_trans in [true, false] {
        // Four values per cell, 200 cells in tensors of 256: V is [256, 4] transposed, else [4, 256].
        let mut kv = KvCache::new(&[BufferType::cpu()], 200, 4, 4, Type::F32, v_trans).unwrap();
        for (cell, pos) in [(2, 0), (3, 1), (4, 2)] {
            kv.occupy(cell, 0, pos);
        }
        assert!(kv.share(2, 1), "sequence 1 shares cell 2");
        let (k, v) = (kv.k[0].clone(), kv.v[0].clone());
        let values: Vec<f32> = (0..4 * 256).map(|i| i as f32).collect();
        k.write(&values).unwrap();
        v.write(&values).unwrap();
        // Element e of cell c: K at c * 4 + e; V at e * 256 + c transposed, else as K.
        let v_at = |c: usize, e: usize| if v_trans { e * 256 + c } else { c * 4 + e };
        let err = kv.relocate(0, 3).unwrap_err().to_string();
        assert!(err.contains("cells 2..=4"), "{err}");
        kv.relocate(0, 66).unwrap();
        assert_eq!(kv.entries_of(0), [(66, 0), (67, 1), (68, 2)]);
        assert_eq!(kv.entries_of(1), [(2, 0)], "the shared cell stays its other sequence's");
        assert_eq!(kv.n_used(), 4);
        let (k, v) = (k.to_vec_f32().unwrap(), v.to_vec_f32().unwrap());
        for (from, to) in [(2, 66), (3, 67), (4, 68)] {
            for e in 0..4 {
                assert_eq!(k[to * 4 + e], (from * 4 + e) as f32, "K of cell {to}, element {e}");
                assert_eq!(v[v_at(to, e)], v_at(from, e) as f32, "V of cell {to}, element {e} (transposed: {v_trans})");
            }
        }
        assert!(kv.relocate(0, 2).is_err() && kv.relocate(0, 65).is_err(), "not free, or not a tile away");
        kv.occupy(100, 0, 3);
        assert!(kv.relocate(0, 130).is_err(), "cells that are not one run stay");
        assert_eq!(kv.cell_of(0, 3), Some(100));
    }
}

//! Where the pool seats requests, over a real engine (the tiny fixture in
//! F32, 512 cells shared by 2 sequences: a share of 256 each).

use hamburger::batch::Batch;
use hamburger::{Engine, EngineParams, LoadOptions, Model, Wants};
use testing::testmodel::{converted, tiny_fixture};

use super::Pool;

fn tiny_f32() -> Model {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    Model::open(&gguf, &LoadOptions::default()).unwrap()
}

/// Writes one entry per token of `tokens` for `seq`.
fn read(engine: &mut Engine, seq: usize, tokens: &[u32]) {
    let mut batch = Batch::new();
    batch.push_tokens(seq, tokens);
    engine.decode(&batch, Wants { stop_head: false, logits: false, features: false, draft_stop: false }).unwrap();
}

/// An engine of `n_ctx` cells for `n_seq` sequences, and a pool over it
/// holding the entries of `tokens`, read in a sequence of its own and cached.
fn cached_pool<'m>(model: &'m Model, n_ctx: usize, n_seq: usize, tokens: &[u32]) -> (Engine<'m>, Pool) {
    let p = EngineParams { n_ctx, n_seq, kv_type: ggml::Type::F32, n_threads: 2, ..Default::default() };
    let mut engine = Engine::new(model, &p).unwrap();
    let mut pool = Pool::new(n_seq);
    let seq = pool.take(&mut engine, &[], tokens.len(), tokens.len()).unwrap();
    read(&mut engine, seq, tokens);
    // Nothing else cached: it starts at its home, cell 0.
    assert_eq!(cells_of(&engine, seq), (0..tokens.len()).collect::<Vec<_>>());
    pool.release(&mut engine, seq, Some((tokens, 0)));
    assert_eq!((pool.n_cached(), engine.kv().n_used()), (tokens.len(), tokens.len()));
    (engine, pool)
}

fn cells_of(engine: &Engine, seq: usize) -> Vec<usize> {
    engine.kv().entries_of(seq).iter().map(|&(cell, _)| cell).collect()
}

#[test]
fn a_request_gets_one_run_of_cells_and_a_cached_start_others_follow_is_copied_to_one() {
    let model = tiny_f32();
    let a: Vec<u32> = (1..=64).collect();
    let (mut engine, mut pool) = cached_pool(&model, 512, 2, &a);

    // B starts with A's first 32 tokens: the cells after them are cached
    // ones, so its start is copied to a free run (its home, cell 256).
    let found = pool.lookup(&a, 32, None);
    assert_eq!((found.covered, found.cells.len()), (32, 32));
    let seq_b = pool.take(&mut engine, &found.cells, 64, 64).unwrap();
    assert_eq!(seq_b, 1);
    assert_eq!(cells_of(&engine, seq_b), (256..288).collect::<Vec<_>>());
    read(&mut engine, seq_b, &[7; 8]);
    assert_eq!(cells_of(&engine, seq_b), (256..296).collect::<Vec<_>>(), "it goes on in its run");
    assert_eq!(pool.n_cached(), 64, "A's entries stay cached where they were");

    // C wants more than a share: of the runs that cross neither B's cells
    // nor its run (256..352), only the one from cell 0 fits, so A's cached
    // entries there are taken back for it.
    let seq_c = pool.take(&mut engine, &[], 400, 400).unwrap();
    assert_eq!((pool.n_cached(), engine.kv().n_used()), (0, 40));
    read(&mut engine, seq_c, &[9; 4]);
    assert_eq!(cells_of(&engine, seq_c), (0..4).collect::<Vec<_>>());
}

#[test]
fn a_request_takes_a_free_run_before_evicting_what_is_cached_at_its_home() {
    let model = tiny_f32();
    let a: Vec<u32> = (1..=40).collect();
    let (mut engine, mut pool) = cached_pool(&model, 256, 1, &a);
    // Another prompt: the first tile-aligned free run, A's entries kept.
    let seq = pool.take(&mut engine, &[], 100, 100).unwrap();
    read(&mut engine, seq, &[5; 3]);
    assert_eq!(cells_of(&engine, seq), [64, 65, 66]);
    assert_eq!(pool.n_cached(), 40);
    pool.release(&mut engine, seq, None);
    // No other run of 200 cells: A's cached entries are taken back for one.
    let seq = pool.take(&mut engine, &[], 200, 200).unwrap();
    read(&mut engine, seq, &[6; 2]);
    assert_eq!((cells_of(&engine, seq), pool.n_cached()), (vec![0, 1], 0));
}

#[test]
fn a_cached_start_a_running_request_holds_too_is_copied_and_stays_with_it() {
    let model = tiny_f32();
    let a: Vec<u32> = (1..=64).collect();
    let (mut engine, mut pool) = cached_pool(&model, 512, 2, &a);
    // B adopts all of A's entries and goes on after them, where they are.
    let found = pool.lookup(&a, 64, None);
    let seq_b = pool.take(&mut engine, &found.cells, 64, 64).unwrap();
    assert_eq!(cells_of(&engine, seq_b), (0..64).collect::<Vec<_>>());
    // C starts with the same 32 tokens while B runs: they are copied to a
    // run of C's own, by whole tiles, outside B's run (0..128); B keeps its cells.
    let found = pool.lookup(&a, 32, None);
    let seq_c = pool.take(&mut engine, &found.cells, 64, 64).unwrap();
    let c = cells_of(&engine, seq_c);
    assert!(c[0] >= 128 && c[0].is_multiple_of(64) && c == (c[0]..c[0] + 32).collect::<Vec<_>>(), "{c:?}");
    assert_eq!(cells_of(&engine, seq_b), (0..64).collect::<Vec<_>>());
    let positions: Vec<i32> = engine.kv().entries_of(seq_c).iter().map(|&(_, pos)| pos).collect();
    assert_eq!(positions, (0..32).collect::<Vec<i32>>());
    read(&mut engine, seq_c, &[7; 4]);
    assert_eq!(cells_of(&engine, seq_c), (c[0]..c[0] + 36).collect::<Vec<_>>(), "it goes on in its run");
}

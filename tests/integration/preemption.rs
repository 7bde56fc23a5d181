//! A sequence preempted mid-answer and resumed, as the server's pool does it:
//! the entries of its start stay cached (pinned cells, [`Engine::pin`]) when
//! its cells are taken back, a new sequence adopts them ([`Engine::adopt`]),
//! and [`SeqGen::refeed`] writes the others again exactly as they were first
//! written (a prompt token one input, each macro step's tokens merged into
//! one). So the resumed answer ends with one KV entry per prompt token and
//! per macro step, and it is the uninterrupted answer (the same decisions,
//! logits within float rounding: the entries fed again are read in one
//! forward of more rows than the one-row steps that first wrote them, which
//! ggml sums in another order, `hamburger::row_class`; rounding may part the
//! two at a near-tie, and only there). Feeding a merged step token by token
//! instead would write other entries and change the answer.

use hamburger::generate::{self, SeqGen};
use hamburger::{
    Engine, EngineParams, Generation, LoadOptions, Model, Sampler, SamplerParams, SessionParams, StepParams,
};
use testing::near_tie::{assert_agree, decisions_of_generation};
use testing::testmodel::{converted, tiny_fixture};

/// How far a logit / stop probability may move where the entries fed again
/// were read in a forward of another row count (as `tests/integration/batch.rs`).
const LOGIT_TOL: f32 = 1e-4;
const STOP_TOL: f32 = 1e-5;

fn tiny_f32() -> Model {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    Model::open(&gguf, &LoadOptions::default()).unwrap()
}

/// The first golden prompt at confidence 0.3.
fn prompt() -> Vec<u32> {
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap();
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["confidence"].as_f64() == Some(0.3)).unwrap();
    case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn params() -> SessionParams {
    SessionParams {
        engine: EngineParams { n_ctx: 256, n_seq: 2, kv_type: ggml::Type::F32, n_threads: 2, ..Default::default() },
        step: StepParams { confidence: 0.3, ..Default::default() },
        keep_logits: true,
        ..Default::default()
    }
}

const N: usize = 24;

fn greedy<'a>(seq: usize, prompt: &[u32]) -> SeqGen<'a> {
    SeqGen::new(seq, prompt, N, Sampler::new(SamplerParams::greedy()))
}

/// The answer decoded without a stop.
fn uninterrupted(model: &Model, prompt: &[u32]) -> Generation {
    let p = params();
    let mut engine = Engine::new(model, &p.engine).unwrap();
    let mut seqs = vec![greedy(0, prompt)];
    generate::run(&mut engine, &p.decode_config(model).unwrap(), &mut seqs).unwrap();
    seqs.pop().unwrap().into_parts().0
}

/// The answer preempted after `steps` macro steps, its first `cached`
/// entries kept pinned, and resumed in sequence 1; whether the pinned cells
/// were freed once unpinned, and how many merged inputs were fed again.
fn preempted(model: &Model, prompt: &[u32], steps: usize, cached: usize) -> (Generation, bool, usize) {
    let p = params();
    let cfg = p.decode_config(model).unwrap();
    let mut engine = Engine::new(model, &p.engine).unwrap();
    let mut seqs = vec![greedy(0, prompt)];
    while seqs[0].generation().macro_steps.len() < steps {
        generate::macro_step(&mut engine, &cfg, &mut seqs).unwrap();
    }
    // Preempted: the start stays cached, the sequence leaves its cells.
    let entries = engine.kv().entries_of(0);
    let kept: Vec<usize> = entries[..cached].iter().map(|&(cell, _)| cell).collect();
    assert!(kept.iter().all(|&c| engine.pin(c)));
    engine.clear_seq(0);
    assert_eq!(engine.kv().n_used(), cached, "only the pinned cells stay");
    // Resumed in another sequence: the cached start adopted, the rest written again as it was.
    let context: Vec<u32> = prompt.iter().chain(&seqs[0].generation().output_ids).copied().collect();
    let covered = engine.adopt(1, &kept).unwrap();
    assert_eq!(covered, entries[cached - 1].1 as usize + 1);
    let mut start = covered;
    let inputs: Vec<Vec<u32>> = entries[cached..]
        .iter()
        .map(|&(_, pos)| {
            let span = context[start..=pos as usize].to_vec();
            start = pos as usize + 1;
            span
        })
        .collect();
    let merged = inputs.iter().filter(|i| i.len() > 1).count();
    seqs[0].refeed(1, inputs);
    assert!(!seqs[0].prompt_read_alike(), "entries fed again are not a fresh read's");
    generate::run(&mut engine, &cfg, &mut seqs).unwrap();
    let gen = seqs.pop().unwrap().into_parts().0;
    engine.clear_seq(1);
    kept.iter().for_each(|&c| engine.unpin(c));
    (gen, engine.kv().n_used() == 0, merged)
}

#[test]
fn a_preempted_sequence_resumes_with_the_same_entries_and_answer() {
    let model = tiny_f32();
    let prompt = prompt();
    let want = uninterrupted(&model, &prompt);
    let rule = params().decode_config(&model).unwrap().rule;
    assert!(want.macro_steps.len() > 6 && want.output_ids.len() > want.macro_steps.len(), "merged steps");
    let mut merged = 0;
    for (steps, cached) in [(3, 2), (5, prompt.len() + 2), (6, 1)] {
        let what = format!("preempted after {steps} steps, {cached} entries cached");
        let (got, freed, m) = preempted(&model, &prompt, steps, cached);
        merged += m;
        assert!(freed, "{what}: unpinned, the cached cells are free");
        let part = assert_agree(
            &decisions_of_generation(&got, &rule),
            &decisions_of_generation(&want, &rule),
            2.0 * LOGIT_TOL,
            2.0 * STOP_TOL,
            &what,
        );
        if part.is_none() {
            assert_eq!(got.output_ids, want.output_ids, "{what}: tokens");
            assert_eq!(got.timings.kv_entries, want.timings.kv_entries, "{what}: one entry per prompt token and step");
            assert_eq!(got.timings.kv_entries, prompt.len() + want.macro_steps.len() - 1, "{what}");
        }
    }
    assert!(merged > 0, "merged macro steps were fed again merged");
}

/// The answer of a sequence that adopts the cached entries of `prompt`'s
/// start (but its last token) and, with `to`, moves them to the cells from
/// `to` first ([`Engine::relocate`], as the server's pool does where other
/// entries follow a cached start): its greedy answer, logits kept.
fn adopted_answer(model: &Model, prompt: &[u32], flash_attn: bool, to: Option<usize>) -> Generation {
    let mut p = params();
    p.engine.flash_attn = Some(flash_attn);
    let cfg = p.decode_config(model).unwrap();
    let mut engine = Engine::new(model, &p.engine).unwrap();
    let n = prompt.len() - 1;
    let mut reader = vec![SeqGen::new(0, &prompt[..n], 0, Sampler::new(SamplerParams::greedy()))];
    generate::run(&mut engine, &cfg, &mut reader).unwrap();
    let cells: Vec<usize> = engine.kv().entries_of(0).iter().map(|&(cell, _)| cell).collect();
    assert_eq!(cells, (0..n).collect::<Vec<_>>(), "the prompt's entries, from the home of sequence 0");
    assert!(cells.iter().all(|&c| engine.pin(c)));
    engine.clear_seq(0);
    assert_eq!(engine.adopt(1, &cells).unwrap(), n);
    if let Some(to) = to {
        assert!(engine.relocate(1, to + 1).is_err(), "a move by part of a tile is refused");
        engine.relocate(1, to).unwrap();
        let moved: Vec<usize> = engine.kv().entries_of(1).iter().map(|&(cell, _)| cell).collect();
        assert_eq!(moved, (to..to + n).collect::<Vec<_>>());
        assert_eq!(engine.kv().n_used(), 2 * n, "the cached entries stay where they were");
    }
    let mut seqs = vec![greedy(1, &prompt[n..])];
    generate::run(&mut engine, &cfg, &mut seqs).unwrap();
    seqs.pop().unwrap().into_parts().0
}

#[test]
fn a_cached_start_moved_by_whole_tiles_answers_bit_for_bit_as_in_place() {
    let model = tiny_f32();
    let prompt = prompt();
    for flash_attn in [false, true] {
        let want = adopted_answer(&model, &prompt, flash_attn, None);
        assert!(want.macro_steps.len() > 6);
        for to in [64, 192] {
            let got = adopted_answer(&model, &prompt, flash_attn, Some(to));
            let what = format!("moved to cell {to}, flash attention {flash_attn}");
            assert_eq!(got.output_ids, want.output_ids, "{what}");
            for (g, w) in got.macro_steps.iter().zip(&want.macro_steps) {
                let bits = |s: &hamburger::MacroStep| {
                    let logits = s.logits.iter().flatten().chain(&s.p_stop).map(|x| x.to_bits());
                    logits.collect::<Vec<_>>()
                };
                assert!(!g.logits.is_empty() && bits(g) == bits(w), "{what}: logits and stop probabilities");
            }
        }
    }
}

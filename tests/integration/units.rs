//! Unit checks of the graph pieces against the plain-Rust f32 reference:
//! the merger alone, the rope position of a merged input, and the micro
//! cache over all four micro positions; and which attention an engine
//! builds when the settings leave it to the engine.

use ggml::Type;
use hamburger::budget::MAX_UNFUSED_SCORES;
use hamburger::row_class::RowClasses;
use hamburger::{
    Engine, EngineParams, LoadOptions, Model, SamplerParams, Session, SessionParams, StepParams, StepRule, TokenLogprob,
};
use testing::merger::StandaloneMerger;
use testing::near_tie::{assert_agree, decisions_of_generation, decisions_of_reference};
use testing::reference::Reference;
use testing::testmodel::{converted, tiny_fixture};

fn tiny() -> (Model, Reference) {
    let ck = tiny_fixture().join("hamburger.ckpt");
    let model = Model::open(&converted(&ck, "tiny", Type::F32, false).unwrap(), &LoadOptions::default()).unwrap();
    (model, Reference::load(&ck, &tiny_fixture()).unwrap())
}

/// The unit checks' engine: 64 cells of F32 cache, attention unfused.
fn f32_engine() -> EngineParams {
    EngineParams { n_ctx: 64, kv_type: Type::F32, flash_attn: Some(false), n_threads: 2, ..Default::default() }
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn merger_graph_equals_plain_rust() {
    let (model, reference) = tiny();
    for tokens in [vec![5u32, 300], vec![17, 17, 42], vec![1, 2, 3, 511]] {
        let got = StandaloneMerger::new(&model, tokens.len(), 2).unwrap().run(&tokens).unwrap();
        let want = reference.merge(&tokens);
        assert!(close(&got, &want, 1e-5), "{tokens:?}: {:?} vs {:?}", &got[..4], &want[..4]);
        // And it is not just the mean: the attention part contributes.
        let mean: Vec<f32> = (0..want.len())
            .map(|i| tokens.iter().map(|&t| reference_embed(&model, t)[i]).sum::<f32>() / tokens.len() as f32)
            .collect();
        assert!(!close(&got, &mean, 1e-4));
    }
}

fn reference_embed(model: &Model, t: u32) -> Vec<f32> {
    let all = model.weights.tok_embd.to_vec_f32().unwrap();
    let d = model.hp.n_embd;
    all[t as usize * d..(t as usize + 1) * d].to_vec()
}

/// Scoring a prompt (every input an output row, in chunks of `n_batch`)
/// gives each token's log-probability under the base as the plain
/// reference computes it token by token, and leaves the last token unfed.
#[test]
fn scoring_a_prompt_gives_the_bases_log_probability_of_every_token() {
    let (model, reference) = tiny();
    let prompt = [54u32, 442, 437, 223, 368, 12, 200, 7];
    let want = reference.base_logits(&prompt);
    let p = f32_engine();
    for n_batch in [3, 512] {
        let mut engine = Engine::new(&model, &p).unwrap();
        let got = engine.score(0, &prompt, n_batch, 3).unwrap();
        assert_eq!(got.len(), prompt.len() - 1);
        assert_eq!(engine.next_pos(0), prompt.len() - 1, "the last token is left to feed");
        for (i, lp) in got.iter().enumerate() {
            let w = TokenLogprob::new(&want[i], prompt[i + 1], 3);
            assert_eq!(lp.token, prompt[i + 1]);
            assert!((lp.logprob - w.logprob).abs() < 1e-4, "n_batch {n_batch}, token {}: {lp:?} vs {w:?}", i + 1);
            // The alternatives: each the reference's log-probability of that
            // token, and the best three up to a near-tie (1e-4 each side).
            let max = want[i].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max + want[i].iter().map(|l| (l - max).exp()).sum::<f32>().ln();
            let reference_of = |t: u32| want[i][t as usize] - lse;
            for &(t, l) in &lp.top {
                assert!((l - reference_of(t)).abs() < 1e-4, "n_batch {n_batch}, token {}: alternative {t}", i + 1);
            }
            assert!(lp.top.last().unwrap().1 > w.top.last().unwrap().1 - 2e-4, "{lp:?} vs {w:?}");
        }
    }
    let mut engine = Engine::new(&model, &p).unwrap();
    assert!(engine.score(0, &prompt[..1], 4, 1).unwrap().is_empty(), "nothing predicts a lone token");
}

#[test]
fn merged_input_sits_at_the_position_of_its_last_token() {
    let (model, reference) = tiny();
    let prompt = [54u32, 442, 437, 223, 368];
    let step = [162u32, 12, 200];
    let p = SessionParams { engine: f32_engine(), keep_logits: true, ..Default::default() };
    let mut s = Session::new(&model, p).unwrap();
    s.feed(&prompt, false).unwrap();
    // Feed the step's tokens as the pending output of a macro step: merged into one input.
    let out = s.feed_merged(&step, true).unwrap();
    let got = out.logits.unwrap();
    let right = reference.logits_after_merge(&prompt, &step, prompt.len() + step.len() - 1);
    let wrong = reference.logits_after_merge(&prompt, &step, prompt.len());
    assert!(close(&got, &right, 1e-4));
    assert!(!close(&got, &wrong, 1e-4), "the position must matter for this check to mean anything");
    assert_eq!(s.n_slots(), prompt.len() + 1, "a merged input writes ONE KV entry");
}

#[test]
fn micro_cache_serves_every_micro_position() {
    let (model, reference) = tiny();
    let prompt = [54u32, 442, 437, 223, 368, 402, 85];
    let p = SessionParams {
        engine: f32_engine(),
        step: StepParams { forced_steps: Some(4), ..Default::default() },
        keep_logits: true,
        ignore_eog: true,
        ..Default::default()
    };
    let mut s = Session::new(&model, p).unwrap();
    let gen = s.generate(&prompt, 12, |_| true).unwrap();
    let want = reference.generate_with(&prompt, 0.0, Some(4), 12, &[]);
    assert_eq!(gen.macro_steps.len(), 3);
    // Tokens equal the reference's up to a near-tie (logits within 1e-3, relative).
    let rule = StepRule { max_steps: 4, confidence: 0.0, forced: true, draft: None };
    let (g, w) = (decisions_of_generation(&gen, &rule), decisions_of_reference(&want, &rule));
    let part = assert_agree(&g, &w, 2e-3, 0.0, "forced k=4 against the reference");
    let logits = |steps: Vec<&Vec<Vec<f32>>>| steps.into_iter().flatten().cloned().collect::<Vec<_>>();
    let (gl, wl) =
        (logits(gen.macro_steps.iter().map(|s| &s.logits).collect()), logits(want.iter().map(|s| &s.logits).collect()));
    for (a, b) in gl.iter().zip(&wl).take(part.map_or(w.len(), |d| d.at + 1)) {
        assert!(close(a, b, 1e-3));
    }
    assert_eq!(gen.timings.reached, vec![3, 3, 3, 3]);
    assert_eq!(gen.timings.kv_entries, prompt.len() + 2);
}

/// A session samples with its own settings, and `clear` starts its sampler
/// anew: the same seed gives the same answer after a clear, and the default
/// is greedy.
#[test]
fn a_session_owns_its_sampler_and_clear_restarts_it() {
    let (model, _) = tiny();
    let prompt = [54u32, 442, 437, 223, 368];
    let engine = f32_engine();
    let sampling = SamplerParams { temp: 1.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 7, ..Default::default() };
    let mut s = Session::new(&model, SessionParams { engine: engine.clone(), sampling, ..Default::default() }).unwrap();
    let first = s.generate(&prompt, 16, |_| true).unwrap().output_ids;
    s.clear();
    assert_eq!(s.generate(&prompt, 16, |_| true).unwrap().output_ids, first, "same seed after clear");
    let mut greedy = Session::new(&model, SessionParams { engine, ..Default::default() }).unwrap();
    let want: Vec<u32> = greedy.generate(&prompt, 16, |_| true).unwrap().output_ids;
    assert_ne!(first, want, "sampling at temperature 1.5 leaves the greedy path");
}

/// Flash attention left to the engine (llama.cpp's `-fa auto`, the default)
/// is off on the CPU, where ggml's fused kernel decodes slower: on for a
/// quantized cache, which only the fused kernel reads, and for a context
/// whose separate scores would pass the bound; a given setting is kept.
#[test]
fn auto_attention_is_unfused_on_the_cpu_but_for_quantized_caches_and_huge_contexts() {
    let (model, _) = tiny();
    let auto = EngineParams { n_ctx: 64, n_threads: 2, ..Default::default() };
    assert_eq!(auto.flash_attn, None, "auto is the default");
    let engine = |p: &EngineParams| Engine::new(&model, p).unwrap();
    assert!(!engine(&auto).fuses_attention());
    assert_eq!(engine(&auto).row_classes(), RowClasses::Cpu);
    let quantized = engine(&EngineParams { kv_type: Type::Q8_0, ..auto.clone() });
    assert!(quantized.fuses_attention());
    assert_eq!(quantized.row_classes(), RowClasses::CpuFlashAttention);
    assert!(engine(&EngineParams { flash_attn: Some(true), ..auto.clone() }).fuses_attention());
    // 512 prompt rows against every cell, every head's f32 score and the mask.
    let per_cell = 512 * 4 * (model.hp.n_head as u128 + 1);
    let largest = (MAX_UNFUSED_SCORES / per_cell) as usize;
    assert!(!EngineParams { n_ctx: largest, ..auto.clone() }.fused_attention(&model));
    assert!(EngineParams { n_ctx: largest + 1, ..auto.clone() }.fused_attention(&model));
    assert!(!EngineParams { n_ctx: largest + 1, flash_attn: Some(false), ..auto }.fused_attention(&model));
}

//! Several sequences decoded together by one engine: every macro step runs
//! ONE base forward over all of them (prompts, then merged inputs of
//! different token counts at different positions) and batches their micro
//! steps. Each sequence must get what a single-sequence session gives: the
//! same tokens in the same macro steps, and the same stop probabilities and
//! logits up to float rounding (F32 weights and cache); the batch's forwards
//! have more rows, summed in another order, so rounding may part the two at
//! a near-tie, and only there (`testing::near_tie`).

use hamburger::generate::{self, SeqGen};
use hamburger::{
    Batch, Engine, EngineParams, Generation, LoadOptions, MicroWants, Model, Sampler, SamplerParams, Session,
    SessionParams, StepParams, StepRule, Wants,
};
use testing::near_tie::{assert_agree, decisions_of_generation};
use testing::testmodel::{converted, tiny_fixture};

/// The prompts and confidence of the golden cases at `confidence`.
fn golden_prompts(confidence: f64) -> Vec<Vec<u32>> {
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["confidence"].as_f64() == Some(confidence))
        .map(|c| c["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .collect()
}

fn tiny_f32() -> Model {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    Model::open(&gguf, &LoadOptions::default()).unwrap()
}

fn solo(model: &Model, params: &SessionParams, prompt: &[u32], n: usize) -> Generation {
    let mut s = Session::new(model, params.clone()).unwrap();
    s.generate(prompt, n, |_| true).unwrap()
}

/// Decodes `prompts` together in one engine; returns each generation and the base forwards run.
fn together(model: &Model, params: &SessionParams, prompts: &[Vec<u32>], n: usize) -> (Vec<Generation>, usize) {
    let mut engine = Engine::new(model, &EngineParams { n_seq: prompts.len(), ..params.engine.clone() }).unwrap();
    let cfg = params.decode_config(model).unwrap();
    let greedy = || Sampler::new(SamplerParams::greedy());
    let mut seqs: Vec<SeqGen> = prompts.iter().enumerate().map(|(i, p)| SeqGen::new(i, p, n, greedy())).collect();
    generate::run(&mut engine, &cfg, &mut seqs).unwrap();
    (seqs.into_iter().map(|s| s.into_parts().0).collect(), engine.n_forwards())
}

/// How far one logit / stop probability may move between a sequence decoded
/// alone and in a batch: the batch's forwards have more rows, whose sums
/// ggml runs in another order (`hamburger::row_class`).
const LOGIT_TOL: f32 = 1e-4;
const STOP_TOL: f32 = 1e-5;

/// `got` (decoded in a batch) against `want` (alone): the same decisions
/// (tokens, macro-step ends) and KV entries, logits and stop probabilities
/// within the tolerances; or, where rounding parts them, the same up to a
/// near-tie (a margin below twice a tolerance: each side may be off by one).
fn assert_same(got: &Generation, want: &Generation, rule: &StepRule, what: &str) {
    let (g, w) = (decisions_of_generation(got, rule), decisions_of_generation(want, rule));
    let part = assert_agree(&g, &w, 2.0 * LOGIT_TOL, 2.0 * STOP_TOL, what);
    if part.is_none() {
        assert_eq!(got.output_ids, want.output_ids, "{what}: tokens");
        assert_eq!(got.timings.kv_entries, want.timings.kv_entries, "{what}: KV entries");
    }
    let compared = part.map_or(w.len(), |d| d.at + 1);
    let per_token = |gen: &Generation| -> Vec<(f32, Vec<f32>)> {
        gen.macro_steps.iter().flat_map(|s| s.p_stop.iter().copied().zip(s.logits.iter().cloned())).collect()
    };
    for ((p, la), (q, lb)) in per_token(got).into_iter().zip(per_token(want)).take(compared) {
        assert!((p - q).abs() < STOP_TOL, "{what}: p_stop {p} vs {q}");
        let d = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(d < LOGIT_TOL, "{what}: logits differ by {d}");
    }
}

fn check(flash_attn: bool, confidence: f64, group: usize) {
    let model = tiny_f32();
    let params = SessionParams {
        engine: EngineParams {
            n_ctx: 512,
            kv_type: ggml::Type::F32,
            flash_attn: Some(flash_attn),
            n_threads: 2,
            ..Default::default()
        },
        step: StepParams { confidence: confidence as f32, ..Default::default() },
        keep_logits: true,
        ..Default::default()
    };
    const N: usize = 24;
    let prompts = golden_prompts(confidence);
    let solos: Vec<Generation> = prompts.iter().map(|p| solo(&model, &params, p, N)).collect();
    let cfg = params.decode_config(&model).unwrap();
    for (ci, chunk) in prompts.chunks(group).enumerate() {
        let (gens, forwards) = together(&model, &params, chunk, N);
        let longest = gens.iter().map(|g| g.macro_steps.len()).max().unwrap();
        assert_eq!(forwards, longest, "one base forward per macro step for all sequences together");
        for (j, g) in gens.iter().enumerate() {
            let what = format!("confidence {confidence}, prompt {}", ci * group + j);
            assert_same(g, &solos[ci * group + j], &cfg.rule, &what);
        }
    }
}

#[test]
fn two_prompts_in_one_batch_decode_like_single_sessions() {
    check(false, 0.3, 2);
    check(false, 0.5, 2);
}

#[test]
fn six_prompts_in_one_batch_with_flash_attention() {
    check(true, 0.3, 6);
    check(true, 0.8, 6);
}

/// Greedy one-token macro steps driven on the engine, storing the features or not.
fn one_token_steps(model: &Model, prompt: &[u32], n: usize, features: bool) -> Vec<u32> {
    let mut engine = Engine::new(model, &EngineParams { n_ctx: 64, ..Default::default() }).unwrap();
    let want = Wants { stop_head: false, logits: false, features, draft_stop: false };
    let mut batch = Batch::new();
    batch.push_tokens(0, prompt);
    let mut out = Vec::new();
    for _ in 0..n {
        let t = engine.decode(&batch, want).unwrap()[0].1.argmax;
        out.push(t);
        batch = Batch::new();
        batch.push_merged(0, &[t]);
    }
    out
}

#[test]
fn one_token_steps_skip_the_features_and_micro_step_0_then_refuses() {
    let model = tiny_f32();
    let prompt = &golden_prompts(0.3)[0];
    assert_eq!(one_token_steps(&model, prompt, 8, false), one_token_steps(&model, prompt, 8, true));
    let mut engine = Engine::new(&model, &EngineParams::default()).unwrap();
    let mut batch = Batch::new();
    batch.push_tokens(0, prompt);
    let t = engine
        .decode(&batch, Wants { stop_head: false, logits: false, features: false, draft_stop: false })
        .unwrap()[0]
        .1
        .argmax;
    let err = engine
        .micro_step(
            0,
            &[(0, t)],
            &[],
            MicroWants { stop_head: false, logits: false, drafts: false, draft_vocab: false },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("stored no features"), "{err}");
    let mut batch = Batch::new();
    batch.push_merged(0, &[t]);
    let t =
        engine.decode(&batch, Wants { stop_head: false, logits: false, features: true, draft_stop: false }).unwrap()[0]
            .1
            .argmax;
    engine
        .micro_step(
            0,
            &[(0, t)],
            &[],
            MicroWants { stop_head: false, logits: false, drafts: false, draft_vocab: false },
        )
        .unwrap();
}

/// Consecutive one-row decode steps run one graph, built once: ggml-cuda
/// replays a captured CUDA graph only while the graph stays the same. A new
/// one is built only when the attention window grows past its padding, and
/// each step reads back its argmax alone (4 bytes).
#[test]
fn consecutive_decode_steps_reuse_one_graph_until_the_attention_window_grows() {
    let model = tiny_f32();
    let prompt = &golden_prompts(0.3)[0];
    let mut engine = Engine::new(&model, &EngineParams { n_ctx: 1024, ..Default::default() }).unwrap();
    let want = Wants { stop_head: false, logits: false, features: false, draft_stop: false };
    let mut batch = Batch::new();
    batch.push_tokens(0, prompt);
    let mut t = engine.decode(&batch, want).unwrap()[0].1.argmax;
    let after_prompt = engine.counters();
    assert_eq!((after_prompt.graph_builds, after_prompt.graph_computes), (1, 1));
    let mut builds_at = Vec::new();
    for step in 0..300 - prompt.len() {
        let before = engine.counters();
        let mut batch = Batch::new();
        batch.push_tokens(0, &[t]);
        t = engine.decode(&batch, want).unwrap()[0].1.argmax;
        let d = engine.counters() - before;
        assert_eq!((d.graph_computes, d.host_reads, d.host_read_bytes), (1, 1, 4), "step {step}");
        if d.graph_builds > 0 {
            builds_at.push(prompt.len() + step);
        }
    }
    // Cells in use when a step is built: the first decode step, then each
    // step whose entry is the first past a window of a multiple of 64 cells.
    let expected: Vec<usize> =
        std::iter::once(prompt.len()).chain((64..300).step_by(64).filter(|&c| c > prompt.len())).collect();
    assert_eq!(builds_at, expected, "the steps that built a graph");
}

/// A sequence whose cells lie scattered (it adopted the first cells of
/// another's long context and writes its own after that context) sends the
/// rows of a forward to the union of all windows only where that costs no
/// more than attending by sequence: never beside a compact window far away
/// (before, one scattered window sent every row to the union, about the
/// whole pool), and beside a window nested in its own only fused, where a
/// one-row window split across threads by cells idles the threads given
/// the other sequence's cells.
#[test]
fn a_scattered_sequence_attends_the_union_only_where_it_costs_no_more() {
    let model = tiny_f32();
    let prompt = &golden_prompts(0.3)[0];
    let long: Vec<u32> = prompt.iter().copied().cycle().take(600).collect();
    let want = Wants { stop_head: false, logits: false, features: false, draft_stop: false };
    let forward = |engine: &mut Engine, inputs: &[(usize, &[u32])]| {
        let mut batch = Batch::new();
        for &(seq, tokens) in inputs {
            batch.push_tokens(seq, tokens);
        }
        engine.decode(&batch, want).unwrap();
        engine.attended_by_seq()
    };
    for flash in [false, true] {
        let params = EngineParams {
            n_ctx: 4096,
            n_seq: 4,
            kv_type: ggml::Type::F32,
            flash_attn: Some(flash),
            n_threads: 2,
            ..Default::default()
        };
        let mut engine = Engine::new(&model, &params).unwrap();
        forward(&mut engine, &[(0, prompt)]); // from its home, cell 0
        forward(&mut engine, &[(2, &long[..300])]); // from its home, cell 2048
        forward(&mut engine, &[(2, &long[300..])]);
        let shared: Vec<usize> = engine.kv().entries_of(2).iter().take(4).map(|&(c, _)| c).collect();
        assert_eq!(engine.adopt(1, &shared).unwrap(), 4);
        // Its own 60 cells follow sequence 2's 600: a window of 704 cells, 64 its own.
        forward(&mut engine, &[(1, &long[4..64])]);
        assert_eq!(engine.kv().span_of(1), Some((2048, 2048 + 600 + 59)), "flash {flash}");
        // Sequence 2 drops its last 10 entries: its next cells fill their gap,
        // so its window stays nested in sequence 1's.
        assert_eq!(engine.keep_prefix(2, 590), 590);
        let one = |seq| (seq, &prompt[..1]);
        assert!(forward(&mut engine, &[one(0), one(1), one(2)]), "flash {flash}: beside a window far away");
        assert_eq!(forward(&mut engine, &[one(1), one(2)]), !flash, "flash {flash}: beside a nested window");
    }
}

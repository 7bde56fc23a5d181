//! GPU runs (CUDA or Metal builds on a machine with a GPU): the golden cases
//! on the device, partial offload (`-ngl`) decoding like the CPU in F32 (the
//! same decisions up to a near-tie, `testing::near_tie`), and Q8_0 agreeing
//! with the CPU. They are ignored by default and,
//! when asked for, fail where this build or machine has no GPU:
//! `cargo test --release --features cuda --test gpu -- --ignored`.
//!
//! The SmolLM2 tests read the GGUF from the test cache (`$HAMBURGER_CACHE`);
//! on a machine without network, copy that cache from one that has run
//! them. F32 on the GPU is not F32 throughout: ggml-cuda runs products of
//! more than 3 columns (prefill) in TF32, so the golden logits get
//! tolerances from TF32's arithmetic emulated on the CPU
//! ([`testing::golden::tf32_emulation`]), and greedy decisions may part from
//! the CPU's where they were near-ties.

use hamburger::tokenizer::Tokenizer;
use hamburger::{
    DeviceChoice, EngineParams, Generation, LoadOptions, Model, Session, SessionParams, StepParams, StepRule,
};
use testing::near_tie::{assert_agree_measured, decisions_of_generation};
use testing::testmodel::{converted, smollm2_checkpoint, tiny_fixture};

/// Why the tests are ignored, and how to run them.
const NEEDS_GPU: &str = "needs a GPU: cargo test --release --features cuda --test gpu -- --ignored";

/// Opens `gguf` with its last `ngl` base layers (and what follows them) on the
/// first GPU; fails where there is none.
fn on_gpu(gguf: &std::path::Path, ngl: usize) -> Model {
    let model = Model::open(gguf, &LoadOptions { device: DeviceChoice::Auto, n_gpu_layers: ngl, ..Default::default() })
        .unwrap();
    assert!(model.plan.gpu().is_some(), "no GPU backend in this build or no GPU on this machine ({NEEDS_GPU})");
    model
}

fn greedy(model: &Model, params: &SessionParams, prompts: &[Vec<u32>], n: usize) -> Vec<Generation> {
    let mut s = Session::new(model, params.clone()).unwrap();
    prompts
        .iter()
        .map(|p| {
            s.clear();
            s.generate(p, n, |_| true).unwrap()
        })
        .collect()
}

fn greedy_tokens(model: &Model, params: &SessionParams, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    greedy(model, params, prompts, n).into_iter().map(|g| g.output_ids).collect()
}

fn smollm2_prompts(model: &Model) -> Vec<Vec<u32>> {
    let tok = Tokenizer::from_model(model).unwrap();
    [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time,",
        "The three primary colors are",
        "Water boils at",
    ]
    .iter()
    .map(|p| tok.encode(p, true).unwrap())
    .collect()
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features cuda --test gpu -- --ignored"]
fn golden_cases_on_the_gpu() {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    // Twice TF32's departures on this fixture (5.1e-2 logit, 2.3e-3 p_stop
    // on the CPU when written); the GPU rounds only its prefill products, so
    // it should stay well inside (6.6e-3 seen at one logit on an H100).
    let (logit, stop) = testing::golden::tf32_emulation();
    let model = on_gpu(&gguf, 999);
    let p = SessionParams {
        engine: EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, flash_attn: false, ..Default::default() },
        keep_logits: true,
        ..Default::default()
    };
    testing::golden::check_golden(&model, p, 2.0 * logit.diff, 2.0 * stop.diff);
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features cuda --test gpu -- --ignored"]
fn partial_offload_decodes_like_the_cpu_in_f32() {
    let gguf = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let cpu = Model::open(&gguf, &LoadOptions::default()).unwrap();
    let p = SessionParams {
        engine: EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, flash_attn: false, ..Default::default() },
        step: StepParams { confidence: 0.3, ..Default::default() },
        keep_logits: true,
        ..Default::default()
    };
    let prompts = smollm2_prompts(&cpu);
    let want = greedy(&cpu, &p, &prompts, 32);
    let rule = StepRule { max_steps: cpu.hp.max_steps, confidence: 0.3, forced: false, draft: None };
    let logits = |g: &Generation| g.macro_steps.iter().flat_map(|s| s.logits.iter().cloned()).collect::<Vec<_>>();
    for ngl in [10, 30] {
        let model = on_gpu(&gguf, ngl);
        // The GPU's kernels round otherwise (TF32 products): the same
        // decisions up to a near-tie within twice the measured departure.
        for (i, (g, w)) in greedy(&model, &p, &prompts, 32).iter().zip(&want).enumerate() {
            let (dg, dw) = (decisions_of_generation(g, &rule), decisions_of_generation(w, &rule));
            assert_agree_measured(&dg, &logits(g), &dw, &logits(w), 5e-3, &format!("-ngl {ngl}, prompt {i}"));
        }
    }
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features cuda --test gpu -- --ignored"]
fn q8_0_on_the_gpu_agrees_with_the_cpu() {
    let gguf = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::Q8_0, false).unwrap();
    let cpu = Model::open(&gguf, &LoadOptions::default()).unwrap();
    let model = on_gpu(&gguf, 999);
    let p = SessionParams {
        engine: EngineParams { n_ctx: 256, ..Default::default() },
        step: StepParams { confidence: 1.01, ..Default::default() },
        ..Default::default()
    };
    let prompts = smollm2_prompts(&cpu);
    let (a, b) = (greedy_tokens(&cpu, &p, &prompts, 32), greedy_tokens(&model, &p, &prompts, 32));
    let same: usize = a.iter().zip(&b).map(|(x, y)| x.iter().zip(y).take_while(|(u, v)| u == v).count()).sum();
    let total: usize = a.iter().map(Vec::len).sum();
    assert!(same * 10 >= total * 8, "GPU and CPU agree on {same} of {total} leading tokens");
}

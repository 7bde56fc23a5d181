//! GPU runs (a CUDA, Vulkan or Metal build on a machine with such a device;
//! CI runs them through Vulkan on Mesa's lavapipe): the golden cases with
//! none, part and all of the base layers on the GPU, in F32 and F16; partial
//! offload decoding like the CPU in F32 (the same decisions up to a
//! near-tie, `testing::near_tie`); and Q8_0 agreeing with the CPU. They are
//! ignored by default and, when asked for, fail where this build or machine
//! has no GPU: `cargo test --release --features vulkan --test integration -- --ignored gpu::`.
//!
//! The SmolLM2 tests read the GGUF from the test cache (`$HAMBURGER_CACHE`);
//! on a machine without network, copy that cache from one that has run
//! them. F32 on the GPU is not F32 throughout: ggml-cuda runs products of
//! more than 3 columns (prefill) in TF32, and ggml-vulkan's matrix-matrix
//! shaders hold their operand tiles in F16 wherever the device has F16
//! arithmetic (and accumulate in F16 for F16 weights), so the golden logits
//! get tolerances from that arithmetic ([`testing::gpu::golden_tolerances`]:
//! TF32 emulated on the CPU, ggml-vulkan measured on lavapipe), and greedy
//! decisions may part from the original's or the CPU's only where they were
//! near-ties. `docs/gpu.md` has the departures measured on each
//! device.

use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, Generation, LoadOptions, Model, Session, SessionParams, StepParams, StepRule};
use testing::gpu::{golden_tolerances, gpu_choice, on_gpu};
use testing::near_tie::{assert_agree_measured, decisions_of_generation};
use testing::testmodel::{converted, smollm2_checkpoint, tiny_fixture};

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

/// The tiny fixture's 16 base layers: none, half and all of them offloaded.
const TINY_OFFLOADS: [usize; 3] = [0, 8, 16];

/// The golden cases of the tiny fixture converted to `ty`, with a cache of
/// `ty` (and flash attention with F16, the tools' default), at each of
/// [`TINY_OFFLOADS`]: the original's tokens and macro steps, parting only at
/// a near-tie ([`testing::golden::check_golden`]), the worst logit and p_stop
/// departures within the tolerances of `ty` on this GPU's backend; all 18
/// cases (on Mesa 25's lavapipe, CI's device, both precisions take under a
/// minute).
fn golden_on_the_gpu(ty: ggml::Type) {
    let (logit_tol, stop_tol) = golden_tolerances(gpu_choice(), ty);
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ty, false).unwrap();
    let engine =
        EngineParams { n_ctx: 256, kv_type: ty, flash_attn: Some(ty == ggml::Type::F16), ..Default::default() };
    let p = SessionParams { engine, keep_logits: true, ..Default::default() };
    for ngl in TINY_OFFLOADS {
        let model = on_gpu(&gguf, ngl);
        eprintln!("{} -ngl {ngl}: {}", ty.name(), model.plan.describe());
        testing::golden::check_golden(&model, p.clone(), logit_tol, stop_tol);
    }
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test integration -- --ignored gpu::"]
fn golden_cases_on_the_gpu_in_f32() {
    golden_on_the_gpu(ggml::Type::F32);
}

/// F16 accumulation moves logits by tenths (lavapipe: case 17 takes the
/// original's second choice where it trailed by 0.055): near-ties part.
#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test integration -- --ignored gpu::"]
fn golden_cases_on_the_gpu_in_f16() {
    golden_on_the_gpu(ggml::Type::F16);
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test integration -- --ignored gpu::"]
fn partial_offload_decodes_like_the_cpu_in_f32() {
    let gguf = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let cpu = Model::open(&gguf, &LoadOptions::default()).unwrap();
    let p = SessionParams {
        engine: EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, flash_attn: Some(false), ..Default::default() },
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
#[ignore = "needs a GPU: cargo test --release --features vulkan --test integration -- --ignored gpu::"]
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

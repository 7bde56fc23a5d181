//! GPU runs (a CUDA, Vulkan or Metal build on a machine with such a device;
//! CI runs them through Vulkan on Mesa's lavapipe): the golden cases with
//! none, part and all of the base layers on the GPU, in F32 and F16; partial
//! offload decoding exactly like the CPU in F32; and Q8_0 agreeing with the
//! CPU. They are ignored by default and, when asked for, fail where this
//! build or machine has no GPU:
//! `cargo test --release --features vulkan --test gpu -- --ignored`.
//!
//! The SmolLM2 tests read the GGUF from the test cache (`$HAMBURGER_CACHE`);
//! on a machine without network, copy that cache from one that has run
//! them. F32 on the GPU is not F32 throughout: ggml-cuda runs products of
//! more than 3 columns (prefill) in TF32, and ggml-vulkan's matrix-matrix
//! shaders hold their operand tiles in F16 wherever the device has F16
//! arithmetic (and accumulate in F16 for F16 weights), so the golden logits
//! get tolerances from that arithmetic ([`testing::gpu::golden_tolerances`]:
//! TF32 emulated on the CPU, ggml-vulkan measured on lavapipe); 10-bit
//! operands also keep all five SmolLM2 prompts' 32 greedy tokens equal to
//! F32's, which is why the partial-offload test asks for exact tokens.
//! `docs/performance.md` has the departures measured on each device.

use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams, StepParams};
use testing::golden::Tokens;
use testing::gpu::{golden_tolerances, gpu_choice, on_gpu};
use testing::testmodel::{converted, smollm2_checkpoint, tiny_fixture};

fn greedy_tokens(model: &Model, params: &SessionParams, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let mut s = Session::new(model, params.clone()).unwrap();
    prompts
        .iter()
        .map(|p| {
            s.clear();
            s.generate(p, n, |_| true).unwrap().output_ids
        })
        .collect()
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
/// [`TINY_OFFLOADS`]: tokens and macro steps as `tokens` asks, the worst
/// logit and p_stop departures within `logit_tol` and `stop_tol` of the
/// original's.
fn golden_on_the_gpu(ty: ggml::Type, tokens: Tokens, logit_tol: f32, stop_tol: f32) {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ty, false).unwrap();
    let engine = EngineParams { n_ctx: 256, kv_type: ty, flash_attn: ty == ggml::Type::F16, ..Default::default() };
    let p = SessionParams { engine, keep_logits: true, ..Default::default() };
    for ngl in TINY_OFFLOADS {
        let model = on_gpu(&gguf, ngl);
        eprintln!("{} -ngl {ngl}: {}", ty.name(), model.plan.describe());
        testing::golden::check_golden_tokens(&model, p.clone(), tokens, logit_tol, stop_tol);
    }
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test gpu -- --ignored"]
fn golden_cases_on_the_gpu_in_f32() {
    let (logit, stop) = golden_tolerances(gpu_choice(), ggml::Type::F32);
    golden_on_the_gpu(ggml::Type::F32, Tokens::Exact, logit, stop);
}

/// F16 accumulation moves logits by tenths (lavapipe: case 17 takes the
/// original's second choice where it trailed by 0.055): near-ties may flip.
#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test gpu -- --ignored"]
fn golden_cases_on_the_gpu_in_f16() {
    let (logit, stop) = golden_tolerances(gpu_choice(), ggml::Type::F16);
    golden_on_the_gpu(ggml::Type::F16, Tokens::NearTies, logit, stop);
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test gpu -- --ignored"]
fn partial_offload_decodes_like_the_cpu_in_f32() {
    let gguf = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let cpu = Model::open(&gguf, &LoadOptions::default()).unwrap();
    let p = SessionParams {
        engine: EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, flash_attn: false, ..Default::default() },
        step: StepParams { confidence: 0.3, ..Default::default() },
        ..Default::default()
    };
    let prompts = smollm2_prompts(&cpu);
    let want = greedy_tokens(&cpu, &p, &prompts, 32);
    for ngl in [10, 30] {
        let model = on_gpu(&gguf, ngl);
        assert_eq!(greedy_tokens(&model, &p, &prompts, 32), want, "-ngl {ngl}");
    }
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan --test gpu -- --ignored"]
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

//! GPU runs (CUDA or Metal builds on a machine with a GPU): the golden cases
//! on the device, partial offload (`-ngl`) decoding exactly like the CPU in
//! F32, and Q8_0 agreeing with the CPU. Where this build or machine has no
//! GPU, each test says so and passes without running.

use convert::testmodel::{converted, smollm2_checkpoint, tiny_fixture};
use hamburger::device::{self, DeviceChoice, Offload};
use hamburger::tokenizer::Tokenizer;
use hamburger::{Model, Sampler, SamplerParams, Session, SessionParams};

mod common;

fn gpu() -> Option<ggml::Device> {
    let d = device::select(DeviceChoice::Auto).unwrap();
    if d.is_none() {
        eprintln!(
            "skipped: no GPU backend in this build or no GPU on this machine (build with --features cuda or metal)"
        );
    }
    d
}

fn greedy_tokens(model: &Model, params: &SessionParams, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let mut s = Session::new(model, params.clone()).unwrap();
    prompts
        .iter()
        .map(|p| {
            s.clear();
            s.generate(p, n, &mut Sampler::new(SamplerParams::greedy()), |_| true).unwrap().output_ids
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

#[test]
fn golden_cases_on_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    let model = Model::load_offloaded(&gguf, Offload { gpu: Some(gpu), n_gpu_layers: 999 }).unwrap();
    let p = SessionParams {
        n_ctx: 256,
        kv_type: ggml::Type::F32,
        flash_attn: false,
        keep_logits: true,
        ..Default::default()
    };
    common::check_golden(&model, p, 5e-3, 5e-4);
}

#[test]
fn partial_offload_decodes_like_the_cpu_in_f32() {
    let Some(gpu) = gpu() else { return };
    let gguf = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let cpu = Model::load(&gguf).unwrap();
    let p = SessionParams {
        n_ctx: 256,
        kv_type: ggml::Type::F32,
        flash_attn: false,
        confidence: 0.3,
        ..Default::default()
    };
    let prompts = smollm2_prompts(&cpu);
    let want = greedy_tokens(&cpu, &p, &prompts, 32);
    for ngl in [10, 30] {
        let model = Model::load_offloaded(&gguf, Offload { gpu: Some(gpu), n_gpu_layers: ngl }).unwrap();
        assert_eq!(greedy_tokens(&model, &p, &prompts, 32), want, "-ngl {ngl}");
    }
}

#[test]
fn q8_0_on_the_gpu_agrees_with_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let gguf = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::Q8_0, false).unwrap();
    let cpu = Model::load(&gguf).unwrap();
    let model = Model::load_offloaded(&gguf, Offload { gpu: Some(gpu), n_gpu_layers: 999 }).unwrap();
    let p = SessionParams { n_ctx: 256, confidence: 1.01, ..Default::default() };
    let prompts = smollm2_prompts(&cpu);
    let (a, b) = (greedy_tokens(&cpu, &p, &prompts, 32), greedy_tokens(&model, &p, &prompts, 32));
    let same: usize = a.iter().zip(&b).map(|(x, y)| x.iter().zip(y).take_while(|(u, v)| u == v).count()).sum();
    let total: usize = a.iter().map(Vec::len).sum();
    assert!(same * 10 >= total * 8, "GPU and CPU agree on {same} of {total} leading tokens");
}

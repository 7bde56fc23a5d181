//! SmolLM2-HAMburger (a real 135M base with seeded random grafted modules):
//! at confidence > 1 the runtime decodes exactly like libllama on the base-only
//! export; at lower confidence macro steps emit several tokens, the KV cache
//! holds one entry per macro step, and the tokens match the reference.

use ggml::llama::{LlamaContext, LlamaContextParams, LlamaModel};
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams, StepParams};
use testing::reference::Reference;
use testing::testmodel::{converted, smollm2_checkpoint};

const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
];

fn greedy(session: &mut Session, prompt: &[u32], n: usize) -> hamburger::Generation {
    session.clear();
    session.generate(prompt, n, |_| true).unwrap()
}

/// Greedy tokens of our engine on the HAMburger at confidence > 1, or on the
/// base-only export itself (`base_only`: the llama GGUF through the same
/// loader and graphs), against libllama's on the base-only export.
fn parity_with_libllama(ty: ggml::Type, kv_type: ggml::Type, flash: bool, base_only: bool) {
    let ck = smollm2_checkpoint().unwrap();
    let ours = Model::open(&converted(&ck, "smollm2", ty, base_only).unwrap(), &LoadOptions::default()).unwrap();
    assert_eq!(ours.is_base_only(), base_only);
    let base = LlamaModel::load(&converted(&ck, "smollm2", ty, true).unwrap(), 0).unwrap();
    let lp = LlamaContextParams { n_ctx: 256, flash_attn: Some(flash), kv_type, n_threads: 2, ..Default::default() };
    let mut llama = LlamaContext::new(&base, lp).unwrap();
    let sp = SessionParams {
        engine: EngineParams { n_ctx: 256, kv_type, flash_attn: flash, n_threads: 2, ..Default::default() },
        step: StepParams { confidence: 1.01, ..Default::default() },
        ..Default::default()
    };
    let mut session = Session::new(&ours, sp).unwrap();
    let tok = Tokenizer::from_model(&ours).unwrap();
    for p in PROMPTS {
        let ids = tok.encode(p, true).unwrap();
        let llama_ids: Vec<i32> = base.tokenize(p, true, true).unwrap();
        assert_eq!(ids.iter().map(|&t| t as i32).collect::<Vec<_>>(), llama_ids, "tokenization of {p:?}");
        let want: Vec<u32> = llama.greedy(&llama_ids, 32, Some(&base)).unwrap().into_iter().map(|t| t as u32).collect();
        let gen = greedy(&mut session, &ids, 32);
        assert_eq!(gen.output_ids, want, "{ty}: {p:?}");
        assert!(gen.macro_steps.iter().all(|s| s.tokens.len() == 1));
    }
}

#[test]
fn one_token_per_step_equals_libllama_f32() {
    parity_with_libllama(ggml::Type::F32, ggml::Type::F32, false, false);
}

#[test]
fn a_base_only_llama_gguf_decodes_like_libllama_f32() {
    parity_with_libllama(ggml::Type::F32, ggml::Type::F32, false, true);
}

#[test]
fn one_token_per_step_equals_libllama_q8_0() {
    parity_with_libllama(ggml::Type::Q8_0, ggml::Type::F16, true, false);
}

#[test]
fn lower_confidence_emits_several_tokens_per_kv_entry() {
    let ck = smollm2_checkpoint().unwrap();
    let model =
        Model::open(&converted(&ck, "smollm2", ggml::Type::F32, false).unwrap(), &LoadOptions::default()).unwrap();
    let sp = SessionParams {
        engine: EngineParams {
            n_ctx: 256,
            kv_type: ggml::Type::F32,
            flash_attn: false,
            n_threads: 2,
            ..Default::default()
        },
        step: StepParams { confidence: 0.3, ..Default::default() },
        ..Default::default()
    };
    let mut session = Session::new(&model, sp).unwrap();
    let tok = Tokenizer::from_model(&model).unwrap();
    let reference = Reference::load(&ck, &ck).unwrap();
    let (mut tokens, mut steps) = (0, 0);
    for p in &PROMPTS[..2] {
        let ids = tok.encode(p, true).unwrap();
        let gen = greedy(&mut session, &ids, 24);
        // One KV entry per prompt token and per macro step but the last (pending).
        assert_eq!(gen.timings.kv_entries, ids.len() + gen.macro_steps.len() - 1);
        tokens += gen.output_ids.len();
        steps += gen.macro_steps.len();
        // The same tokens and boundaries as the reference implementation.
        let eos: Vec<u32> = model.vocab.eog.clone();
        let want: Vec<Vec<u32>> = reference.generate(&ids, 0.3, 24, &eos).into_iter().map(|s| s.tokens).collect();
        let got: Vec<Vec<u32>> = gen.macro_steps.iter().map(|s| s.tokens.clone()).collect();
        let flat = |v: &[Vec<u32>]| {
            v.iter().enumerate().flat_map(|(i, s)| s.iter().map(move |&t| (i, t))).take(24).collect::<Vec<_>>()
        };
        assert_eq!(flat(&got), flat(&want), "{p:?}");
    }
    assert!(tokens as f64 / steps as f64 > 1.3, "{tokens} tokens in {steps} macro steps");
}

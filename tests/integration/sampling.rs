//! Sampling on multi-token macro steps, on the tiny grafted model at forced
//! k = 4: the penalties see every earlier token, those of the same macro step
//! included, and the log-probabilities are those of the distribution each
//! token was drawn from (the base's for a step's first token, the micro
//! decoder's for the others).

use hamburger::generate::{self, SeqGen};
use hamburger::{
    Engine, EngineParams, Generation, LoadOptions, Model, Sampler, SamplerParams, SessionParams, StepParams,
    TokenLogprob,
};
use testing::testmodel::{converted, tiny_fixture};

const PROMPT: [u32; 6] = [1, 20, 31, 42, 53, 64];

fn tiny_f32() -> Model {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    Model::open(&gguf, &LoadOptions::default()).unwrap()
}

/// Generates `n` tokens after [`PROMPT`] at forced k = 4, keeping every micro
/// step's logits, with log-probabilities and `top` alternatives when asked.
fn generate(model: &Model, sampling: SamplerParams, logprobs: Option<usize>, n: usize) -> Generation {
    let params = SessionParams {
        engine: EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, n_threads: 2, ..Default::default() },
        step: StepParams { forced_steps: Some(4), ..Default::default() },
        keep_logits: true,
        ignore_eog: true,
        ..Default::default()
    };
    let mut engine = Engine::new(model, &params.engine).unwrap();
    let cfg = params.decode_config(model).unwrap();
    let sg = SeqGen::new(0, &PROMPT, n, Sampler::new(sampling));
    let mut seqs = [match logprobs {
        Some(top) => sg.with_logprobs(top),
        None => sg,
    }];
    generate::run(&mut engine, &cfg, &mut seqs).unwrap();
    let [sg] = seqs;
    sg.into_parts().0
}

/// Every token is the one a fresh greedy sampler picks from its micro step's
/// logits given ALL the tokens before it (the repeat penalty once looked only
/// at the tokens of earlier macro steps: this failed then).
#[test]
fn penalties_see_the_earlier_tokens_of_the_same_macro_step() {
    let model = tiny_f32();
    let sampling =
        SamplerParams { presence_penalty: 2.0, repeat_penalty: 1.5, repeat_last_n: 256, ..SamplerParams::greedy() };
    let gen = generate(&model, sampling, None, 32);
    assert!(gen.macro_steps.iter().all(|s| s.tokens.len() == 4), "forced k = 4");
    let mut history = PROMPT.to_vec();
    for step in &gen.macro_steps {
        for (t, logits) in step.tokens.iter().zip(&step.logits) {
            assert_eq!(
                *t,
                Sampler::new(sampling).sample(logits, &history),
                "token {} after {history:?}",
                history.len()
            );
            history.push(*t);
        }
    }
    // The penalties changed something: greedy without them differs.
    assert_ne!(gen.output_ids, generate(&model, SamplerParams::greedy(), None, 32).output_ids);
}

/// Log-probabilities are computed only when asked, and are the log-softmax of
/// the logits each token was picked from; asking changes no token.
#[test]
fn log_probabilities_of_every_token_of_a_step() {
    let model = tiny_f32();
    let plain = generate(&model, SamplerParams::greedy(), None, 12);
    assert!(plain.macro_steps.iter().all(|s| s.logprobs.is_empty()));
    let gen = generate(&model, SamplerParams::greedy(), Some(3), 12);
    assert_eq!(gen.output_ids, plain.output_ids);
    for step in &gen.macro_steps {
        assert_eq!(step.logprobs.len(), step.tokens.len());
        for ((lp, t), logits) in step.logprobs.iter().zip(&step.tokens).zip(&step.logits) {
            assert_eq!(*lp, TokenLogprob::new(logits, *t, 3));
            assert_eq!(lp.top[0].0, *t, "greedy picks the most likely token");
            assert!(lp.logprob <= 0.0 && lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        }
    }
}

/// A seed draws what llama.cpp draws with it: on the same logits, our
/// sampler and libllama's chain as llama-server builds it (top-k, top-p,
/// min-p, temperature, `dist`) pick the same tokens, step after step, so a
/// sampled answer is llama-server's own where the logits agree.
#[test]
fn seeded_sampling_draws_what_llama_cpp_draws() {
    use rand::{seq::SliceRandom, SeedableRng};
    let mut gen = rand::rngs::StdRng::seed_from_u64(1);
    let n_vocab = 49_152;
    let d = SamplerParams::default();
    for (top_k, top_p, min_p, temp, seed) in [
        (d.top_k, d.top_p, d.min_p, d.temp, 42),
        (d.top_k, d.top_p, d.min_p, d.temp, 7),
        (0, 1.0, 0.0, 1.5, 42),
        (100, 0.5, 0.0, 1.0, 3),
        (0, 1.0, 0.2, 0.7, 42),
        (1, 1.0, 0.0, 0.8, 42),
    ] {
        let ours = SamplerParams { top_k, top_p, min_p, temp, seed, ..d };
        let mut ours = Sampler::new(ours);
        let settings = ggml::llama::ChainSettings { top_k: top_k as i32, top_p, min_p, temp, seed: seed as u32 };
        let mut theirs = ggml::llama::LlamaSampler::chain(settings).unwrap();
        let mut distinct = std::collections::HashSet::new();
        for step in 0..300 {
            // Distinct logits (llama.cpp's sort orders ties its own way), in random order.
            let mut logits: Vec<f32> = (0..n_vocab).map(|i| (i as f32 / n_vocab as f32).powi(4) * 12.0).collect();
            logits.shuffle(&mut gen);
            let (a, b) = (ours.sample(&logits, &[]), theirs.sample_logits(&logits));
            assert_eq!(a, b, "step {step} of {settings:?}");
            distinct.insert(a);
        }
        assert!(top_k == 1 || distinct.len() > 10, "{settings:?}: the draws vary ({distinct:?})");
    }
}

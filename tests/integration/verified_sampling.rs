//! Self-verified sampling is distributed as sampling one token per forward:
//! on the tiny fixture, the first 3 tokens of thousands of seeded
//! generations, drafting 2 tokens at every step (so tokens 2 and 3 go
//! through speculative sampling's acceptance or its residual), against the
//! exact distribution of the one-token-per-step sampler (its distributions
//! multiplied along every prefix), by a chi-square goodness-of-fit test.
//!
//! The sampler has every knob on: temperature, top-k, top-p, min-p, a
//! presence penalty (which sees the earlier tokens of the answer, so the
//! history each check uses matters) and logit biases, which pull the base's
//! and the micro decoder's distributions onto the same three tokens (top-k
//! 3 keeps only them), so that drafts are accepted often enough and
//! rejected often enough for both branches to count. The threshold is the chi-square quantile at p = 1e-3
//! for the test's degrees of freedom; the seeds are fixed, so the statistic
//! is too (no flakiness). A verifier that accepts every draft (the mutation
//! this test was checked to catch) gives tokens 2 and 3 from the micro
//! decoder's distribution and fails by far. A tree of drafts around the
//! chain (siblings kept where the residual's draw equals them) is held to
//! the same distribution; on the trained SmolLM2 under llama.cpp's
//! default sampler, a tree keeps more drafts per verify forward than its
//! chain.

use std::path::{Path, PathBuf};

use hamburger::generate::{self, SeqGen};
use hamburger::tokenizer::Tokenizer;
use hamburger::{
    DraftParams, Engine, EngineParams, LoadOptions, Model, Sampler, SamplerParams, Session, SessionParams, StepParams,
};
use testing::parallel::on_every_core;
use testing::testmodel::{converted, smollm2_trained_checkpoint, tiny_fixture};

const PROMPT: [u32; 6] = [1, 20, 31, 42, 53, 64];
/// The tokens the logit biases favour: three whose base logits after
/// [`PROMPT`] are close (8.5, 8.5 and 8.3, where the most likely is 12.2).
const FAVOURED: [u32; 3] = [132, 331, 287];
/// Generations sampled per run.
const SAMPLES: u64 = 4000;

fn tiny_f32() -> PathBuf {
    converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap()
}

fn open(path: &Path) -> Model {
    Model::open(path, &LoadOptions::default()).unwrap()
}

fn sampling(seed: u64) -> SamplerParams {
    SamplerParams {
        temp: 1.5,
        top_k: 3,
        top_p: 0.98,
        min_p: 0.01,
        presence_penalty: 0.4,
        repeat_last_n: 64,
        seed,
        ..Default::default()
    }
}

fn sampler(seed: u64) -> Sampler {
    Sampler::new(sampling(seed)).with_logit_bias(FAVOURED.iter().map(|&t| (t, 20.0)).collect())
}

fn engine_params() -> EngineParams {
    EngineParams { n_ctx: 64, kv_type: ggml::Type::F32, n_threads: 1, ..Default::default() }
}

/// The exact probability of each 3-token start whose tokens are all
/// favoured (27 outcomes), under one-token-per-step sampling: the sampler's
/// distribution after each prefix, multiplied.
fn exact(model: &Model) -> Vec<([u32; 3], f64)> {
    let params = SessionParams {
        engine: engine_params(),
        step: StepParams { confidence: 1.01, ..Default::default() },
        ..Default::default()
    };
    let mut s = Session::new(model, params).unwrap();
    let s0 = sampler(0);
    let mut dist = |prefix: &[u32]| {
        s.clear();
        let mut out = s.feed(&PROMPT, true).unwrap();
        for &t in prefix {
            out = s.feed(&[t], true).unwrap();
        }
        let history = [&PROMPT[..], prefix].concat();
        s0.distribution(out.logits.as_deref().unwrap(), &history)
    };
    let prob = |d: &[(u32, f32)], t: u32| d.iter().find(|c| c.0 == t).map_or(0.0, |c| c.1 as f64);
    let mut out = Vec::new();
    let d1 = dist(&[]);
    for a in FAVOURED {
        let d2 = dist(&[a]);
        for b in FAVOURED {
            let d3 = dist(&[a, b]);
            for c in FAVOURED {
                out.push(([a, b, c], prob(&d1, a) * prob(&d2, b) * prob(&d3, c)));
            }
        }
    }
    out
}

/// The first 3 tokens of `SAMPLES` seeded generations (`draft`: self-verified),
/// the seeds shared over every core (each opening the model).
/// Also returns the drafts accepted per drafted row and per verify forward.
fn sample(model: &Path, draft: Option<DraftParams>) -> (Vec<[u32; 3]>, f64, f64) {
    let params =
        SessionParams { step: StepParams { confidence: 1.01, draft, ..Default::default() }, ..Default::default() };
    let cfg = params.decode_config(&open(model)).unwrap();
    let seeds: Vec<u64> = (0..SAMPLES).collect();
    let runs = on_every_core(&seeds, |share| {
        let model = open(model);
        let mut engine = Engine::new(&model, &engine_params()).unwrap();
        let mut first_three = |seed| {
            engine.clear_seq(0);
            let mut seqs = [SeqGen::new(0, &PROMPT, 4, sampler(seed)).ignoring_eog()];
            generate::run(&mut engine, &cfg, &mut seqs).unwrap();
            let [sg] = seqs;
            let gen = sg.into_parts().0;
            let t = &gen.timings;
            (
                [gen.output_ids[0], gen.output_ids[1], gen.output_ids[2]],
                [t.draft_accepted, t.drafted, t.verify_forwards],
            )
        };
        share.iter().map(|&seed| first_three(seed)).collect()
    });
    let [accepted, drafted, forwards] =
        runs.iter().fold([0; 3], |[a, d, f], (_, r)| [a + r[0], d + r[1], f + r[2]]).map(|n| n.max(1) as f64);
    (runs.into_iter().map(|r| r.0).collect(), accepted / drafted, accepted / forwards)
}

/// The chi-square statistic of `starts` against `exact` (each outcome's
/// bin, and one bin for every start with an unfavoured token), its degrees
/// of freedom and its threshold at p = 1e-3 (Wilson-Hilferty).
fn chi_square(starts: &[[u32; 3]], exact: &[([u32; 3], f64)]) -> (f64, usize, f64) {
    let n = starts.len() as f64;
    let mut observed: Vec<f64> = exact.iter().map(|(o, _)| starts.iter().filter(|s| *s == o).count() as f64).collect();
    observed.push(n - observed.iter().sum::<f64>());
    let mut expected: Vec<f64> = exact.iter().map(|(_, p)| p * n).collect();
    expected.push(n - expected.iter().sum::<f64>());
    // Bins expecting fewer than 5 go into one.
    let (mut stat, mut bins, mut small_o, mut small_e) = (0.0, 0, 0.0, 0.0);
    for (o, e) in observed.iter().zip(&expected) {
        if *e < 5.0 {
            small_o += o;
            small_e += e;
        } else {
            stat += (o - e).powi(2) / e;
            bins += 1;
        }
    }
    if small_e > 0.0 {
        stat += (small_o - small_e).powi(2) / small_e.max(1e-9);
        bins += 1;
    }
    let df = bins - 1;
    let k = df as f64;
    let z = 3.090; // the standard normal's 1 - 1e-3 quantile
    let threshold = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    (stat, df, threshold)
}

#[test]
fn verified_sampling_is_distributed_as_one_token_per_step() {
    let model = tiny_f32();
    let exact = exact(&open(&model));
    let mass: f64 = exact.iter().map(|(_, p)| p).sum();
    assert!(mass > 0.5, "the favoured tokens carry most of the mass ({mass})");
    let (plain, _, _) = sample(&model, None);
    let (stat, df, threshold) = chi_square(&plain, &exact);
    eprintln!("one token per step: chi-square {stat:.1} on {df} degrees of freedom (threshold {threshold:.1})");
    assert!(stat < threshold, "the one-token sampler against its own exact distribution");
    let chain = DraftParams { n_max: Some(2), n_min: 2, ..DraftParams::default() };
    let (verified, acceptance, chain_per_forward) = sample(&model, Some(chain));
    let (stat, df, threshold) = chi_square(&verified, &exact);
    eprintln!(
        "self-verified, 2 drafts per step ({:.0}% accepted, {chain_per_forward:.3} per verify forward): chi-square {stat:.1} on {df} degrees of freedom (threshold {threshold:.1})",
        acceptance * 100.0
    );
    assert!((0.1..0.9).contains(&acceptance), "both acceptance and the residual are exercised: {acceptance}");
    assert!(stat < threshold, "self-verified sampling against the one-token-per-step distribution");
    // A tree of 8: the chain of 2 and 6 siblings (the micro decoder ranks the
    // other favoured tokens low, so they are among them now and then),
    // kept where the residual's draw is theirs.
    let tree = DraftParams { tree: 8, ..chain };
    let (verified, acceptance, per_forward) = sample(&model, Some(tree));
    let (stat, df, threshold) = chi_square(&verified, &exact);
    eprintln!(
        "a tree of 8 around them ({:.0}% of rows accepted, {per_forward:.3} per verify forward): chi-square {stat:.1} on {df} degrees of freedom (threshold {threshold:.1})",
        acceptance * 100.0
    );
    assert!(
        per_forward > chain_per_forward + 0.1,
        "siblings are kept: {per_forward} against the chain's {chain_per_forward}"
    );
    assert!(stat < threshold, "a tree's sampling against the one-token-per-step distribution");
}

/// llama.cpp's default sampler (temperature 0.8, top-k 40, top-p 0.95,
/// min-p 0.05) on the trained SmolLM2-HAMburger (Q8_0), chat and code
/// prompts, several seeds: a tree of 5 around 3 forced drafts keeps more of
/// them per verify forward than the chain of 3, its siblings kept where
/// the base's draw from the residual is theirs.
#[test]
fn a_tree_keeps_more_drafts_than_its_chain_under_llama_cpps_default_sampler() {
    let path = converted(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained", ggml::Type::Q8_0, false).unwrap();
    let model = open(&path);
    let tok = Tokenizer::from_model(&model).unwrap();
    let prompts: Vec<Vec<u32>> = [
        "<|im_start|>user\nGive me three tips for sleeping better.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nExplain recursion to a ten-year-old.<|im_end|>\n<|im_start|>assistant\n",
        "def fibonacci(n):",
    ]
    .iter()
    .map(|p| tok.encode(p, true).unwrap())
    .collect();
    let forced = DraftParams { n_max: Some(3), n_min: 3, ..DraftParams::default() };
    let per_forward = |draft: DraftParams| {
        let (mut accepted, mut forwards) = (0, 0);
        for seed in 0..4 {
            let params = SessionParams {
                engine: EngineParams { n_ctx: 512, n_threads: 1, ..Default::default() },
                step: StepParams { confidence: 1.01, draft: Some(draft), ..Default::default() },
                sampling: SamplerParams { seed, ..Default::default() },
                ..Default::default()
            };
            let mut s = Session::new(&model, params).unwrap();
            for prompt in &prompts {
                s.clear();
                let t = s.generate(prompt, 48, |_| true).unwrap().timings;
                (accepted, forwards) = (accepted + t.draft_accepted, forwards + t.verify_forwards);
            }
        }
        accepted as f64 / forwards as f64
    };
    let (chain, tree) = (per_forward(forced), per_forward(DraftParams { tree: 5, ..forced }));
    eprintln!("llama.cpp's default sampler, accepted per verify forward: chain of 3 {chain:.3}, tree of 5 {tree:.3}");
    assert!(tree > chain + 0.1, "tree of 5 {tree} against the chain's {chain}");
}

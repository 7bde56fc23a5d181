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
//! decoder's distribution and fails by far.

use std::path::{Path, PathBuf};

use hamburger::generate::{self, SeqGen};
use hamburger::{
    DraftParams, Engine, EngineParams, LoadOptions, Model, Sampler, SamplerParams, Session, SessionParams, StepParams,
};
use testing::parallel::on_every_core;
use testing::testmodel::{converted, tiny_fixture};

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
fn sample(model: &Path, draft: Option<DraftParams>) -> (Vec<[u32; 3]>, f64) {
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
            ([gen.output_ids[0], gen.output_ids[1], gen.output_ids[2]], gen.timings.draft_accepted, gen.timings.drafted)
        };
        share.iter().map(|&seed| first_three(seed)).collect()
    });
    let (accepted, drafted) = runs.iter().fold((0, 0), |(a, d), r| (a + r.1, d + r.2));
    (runs.into_iter().map(|r| r.0).collect(), accepted as f64 / drafted.max(1) as f64)
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
    let (plain, _) = sample(&model, None);
    let (stat, df, threshold) = chi_square(&plain, &exact);
    eprintln!("one token per step: chi-square {stat:.1} on {df} degrees of freedom (threshold {threshold:.1})");
    assert!(stat < threshold, "the one-token sampler against its own exact distribution");
    let draft = DraftParams { n_max: Some(2), n_min: 2, ..DraftParams::default() };
    let (verified, acceptance) = sample(&model, Some(draft));
    let (stat, df, threshold) = chi_square(&verified, &exact);
    eprintln!(
        "self-verified, 2 drafts per step ({:.0}% accepted): chi-square {stat:.1} on {df} degrees of freedom (threshold {threshold:.1})",
        acceptance * 100.0
    );
    assert!((0.1..0.9).contains(&acceptance), "both acceptance and the residual are exercised: {acceptance}");
    assert!(stat < threshold, "self-verified sampling against the one-token-per-step distribution");
}

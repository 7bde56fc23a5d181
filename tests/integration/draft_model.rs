//! A HAMburger drafting for a target of the same vocabulary (`-md`): the
//! verified output is the target's own greedy output, token for token, on
//! every golden prompt of the tiny fixture and on SmolLM2 with the trained
//! SmolLM2-HAMburger drafting, in F32, with drafts of 1 to 3 tokens and
//! acceptance high (a draft that decodes like the target) and low (random
//! grafted modules forced to 3 tokens a step).
//!
//! Near-tie rule. The target's own greedy run reads ONE row per forward;
//! a verify forward reads several, and ggml's CPU kernels sum in another
//! order for 2+ rows (tinyBLAS against vec_dot), so a token whose two best
//! logits are within rounding may differ. The comparison therefore goes
//! token by token: equal, or, where the tokens differ, the verified token's
//! logit under the target's own run is within `NEAR_TIE` of its best (and
//! the comparison goes on from a fresh target run on the verified prefix).
//! Every such exception is counted and printed; none is allowed elsewhere.

use std::path::Path;

use hamburger::draft_model::{DraftModelParams, DraftSession, DraftSessionParams, DraftStats};
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, LoadOptions, Model, SamplerParams, Session, SessionParams, StepParams};
use testing::parallel::on_every_core;
use testing::testmodel::{converted, smollm2_checkpoint, smollm2_trained_checkpoint, tiny_fixture};

/// F32 logits of the same row under 1-row and multi-row kernels differ by
/// about 1e-5 of their size here; a tie closer than this may go either way.
const NEAR_TIE: f32 = 1e-3;

/// One thread: a row's result does not depend on the thread count, and a
/// shared machine's other load leaves ggml's barriers spinning less.
fn engine() -> EngineParams {
    EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, flash_attn: Some(false), n_threads: 1, ..Default::default() }
}

/// One drafting setting: the draft's stop rule and the draft's length.
#[derive(Debug, Clone, Copy)]
struct Setting {
    step: StepParams,
    n_max: usize,
}

/// The target's own greedy output after `prompt`, with each token's logits.
fn target_greedy(target: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let p = SessionParams {
        engine: engine(),
        step: StepParams { confidence: 1.01, ..Default::default() },
        keep_logits: true,
        ..Default::default()
    };
    let gen = Session::new(target, p).unwrap().generate(prompt, n, |_| true).unwrap();
    let logits = gen.macro_steps.into_iter().flat_map(|s| s.logits).collect();
    (gen.output_ids, logits)
}

/// A prompt, the tokens to generate after it, and the target's own greedy
/// output there with its logits (computed once for every setting checked).
struct Case {
    prompt: Vec<u32>,
    n: usize,
    greedy: (Vec<u32>, Vec<Vec<f32>>),
}

/// The [`Case`]s of `prompts` (each with its token count) on `target`, the
/// prompts shared over every core.
fn cases(target: &Path, prompts: Vec<(Vec<u32>, usize)>) -> Vec<Case> {
    on_every_core(&prompts, |share| {
        let target = open(target);
        share.iter().map(|(p, n)| Case { prompt: p.clone(), n: *n, greedy: target_greedy(&target, p, *n) }).collect()
    })
}

/// Checks the verified output of every case against the target's own
/// greedy output under the near-tie rule, the cases shared over every
/// core (each opening both models); returns the drafting statistics and the
/// near ties met.
fn check(target: &Path, draft: &Path, cases: &[Case], s: Setting) -> (DraftStats, usize) {
    let params = DraftSessionParams {
        engine: engine(),
        step: s.step,
        sampling: SamplerParams::greedy(),
        draft: DraftModelParams { n_max: s.n_max, n_min: 0, p_min: 0.0 },
        ignore_eog: false,
    };
    let indexed: Vec<(usize, &Case)> = cases.iter().enumerate().collect();
    let per_prompt = on_every_core(&indexed, |share| {
        let (target, draft) = (open(target), open(draft));
        share.iter().map(|&(pi, case)| check_one(&target, &draft, &params, pi, case, s)).collect()
    });
    let (mut total, mut near_ties) = (DraftStats::default(), 0);
    for (stats, ties) in per_prompt {
        total.draft_forwards += stats.draft_forwards;
        total.target_forwards += stats.target_forwards;
        total.drafted += stats.drafted;
        total.accepted += stats.accepted;
        near_ties += ties;
    }
    eprintln!(
        "{s:?}: {} drafted, {:.0}% accepted, {:.2} accepted per draft forward, {} target forwards, {near_ties} near ties",
        total.drafted,
        100.0 * total.acceptance(),
        total.accepted_per_draft_forward(),
        total.target_forwards
    );
    (total, near_ties)
}

/// [`check`] on case `pi`: its drafting statistics and near ties.
fn check_one(
    target: &Model,
    draft: &Model,
    params: &DraftSessionParams,
    pi: usize,
    case: &Case,
    s: Setting,
) -> (DraftStats, usize) {
    let prompt = &case.prompt;
    let mut session = DraftSession::new(target, draft, params.clone()).unwrap();
    let (gen, stats) = session.generate(prompt, case.n, |_| true).unwrap();
    let got = gen.output_ids;
    assert!(gen.macro_steps.iter().all(|step| step.tokens.len() <= s.n_max + 1));
    let (mut from, mut near_ties) = (0, 0);
    while from < got.len() {
        let fresh;
        let (want, logits) = if from == 0 {
            (&case.greedy.0[..got.len().min(case.greedy.0.len())], &case.greedy.1)
        } else {
            let context: Vec<u32> = prompt.iter().chain(&got[..from]).copied().collect();
            fresh = target_greedy(target, &context, got.len() - from);
            (&fresh.0[..], &fresh.1)
        };
        let same = got[from..].iter().zip(want).take_while(|(a, b)| a == b).count();
        if same == want.len() {
            assert_eq!(got.len() - from, want.len(), "prompt {pi} {s:?}: the target ends at {}", from + same);
            break;
        }
        let (i, ours, theirs) = (from + same, got[from + same], want[same]);
        let l = &logits[same];
        let gap = l[theirs as usize] - l[ours as usize];
        assert!(
            gap <= NEAR_TIE,
            "prompt {pi} {s:?}: token {i} is {ours}, the target's is {theirs} by {gap} (no near tie)"
        );
        near_ties += 1;
        from = i + 1;
    }
    (stats, near_ties)
}

fn open(path: &Path) -> Model {
    Model::open(path, &LoadOptions::default()).unwrap()
}

fn forced(k: usize) -> StepParams {
    StepParams { confidence: 1.01, forced_steps: Some(k), ..Default::default() }
}

#[test]
fn the_tiny_hamburger_drafting_for_its_base_gives_the_bases_greedy_output() {
    let ckpt = tiny_fixture().join("hamburger.ckpt");
    let (target, draft) = (
        converted(&ckpt, "tiny", ggml::Type::F32, true).unwrap(),
        converted(&ckpt, "tiny", ggml::Type::F32, false).unwrap(),
    );
    assert!(open(&target).is_base_only() && !open(&draft).is_base_only());
    let prompts =
        cases(&target, testing::golden::cases().into_iter().map(|c| (c.prompt_ids, c.max_new_tokens)).collect());
    // One token per draft step: the draft's base is the target, so almost
    // every drafted token is accepted.
    for n_max in 1..=3 {
        let (stats, _) = check(&target, &draft, &prompts, Setting { step: forced(1), n_max });
        assert!(stats.acceptance() > 0.9, "n_max {n_max}: {stats:?}");
    }
    // Random micro decoders forced to 3 tokens a step, drafts of 1 to 3:
    // most drafts are rejected, and the output is the target's all the same.
    for n_max in 1..=3 {
        let (stats, _) = check(&target, &draft, &prompts, Setting { step: forced(3), n_max });
        assert!(stats.drafted > 0, "{stats:?}");
        if n_max == 3 {
            assert!(stats.acceptance() < 0.5, "random micro decoders: {stats:?}");
        }
    }
    // The golden cases' own stop rule (confidence 0.3: steps of 1 to 4).
    check(&target, &draft, &prompts, Setting { step: StepParams { confidence: 0.3, ..Default::default() }, n_max: 3 });
}

#[test]
fn the_trained_smollm2_hamburger_drafting_for_smollm2_gives_smollm2s_greedy_output() {
    let target = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, true).unwrap();
    let draft = converted(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained", ggml::Type::F32, false).unwrap();
    let tok = Tokenizer::from_model(&open(&target)).unwrap();
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
        "<|im_start|>user\nList three primary colors.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    ]
    .iter()
    .map(|p| (tok.encode(p, true).unwrap(), 40))
    .collect();
    let prompts = cases(&target, prompts);
    let recommended = StepParams { confidence: open(&draft).recommended_confidence.unwrap(), ..Default::default() };
    for n_max in [1, 3] {
        let (stats, _) = check(&target, &draft, &prompts, Setting { step: recommended, n_max });
        assert!(stats.accepted > 0, "the trained draft earns something: {stats:?}");
    }
    let (stats, _) = check(&target, &draft, &prompts, Setting { step: forced(3), n_max: 3 });
    assert!(stats.drafted > stats.accepted, "{stats:?}");
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_naming_both_sizes() {
    let tiny = open(&converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap());
    let smol = open(&converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, true).unwrap());
    let params = DraftSessionParams {
        engine: engine(),
        step: StepParams::default(),
        sampling: SamplerParams::greedy(),
        draft: DraftModelParams::default(),
        ignore_eog: false,
    };
    let e = DraftSession::new(&smol, &tiny, params).err().unwrap().to_string();
    assert!(e.contains("512") && e.contains(&smol.hp.n_vocab.to_string()), "{e}");
}

/// Sampling at temperature 1 over the 3 most likely tokens.
fn top3(seed: u64) -> SamplerParams {
    SamplerParams { temp: 1.0, top_k: 3, top_p: 1.0, min_p: 0.0, seed, ..Default::default() }
}

/// The target's exact distribution of its first 3 sampled tokens after
/// `prompt` under [`top3`]: the product of its distributions along each
/// branch (1 + 3 + 9 forwards).
fn first_three(target: &Model, prompt: &[u32]) -> std::collections::HashMap<[u32; 3], f64> {
    let p = SessionParams {
        engine: engine(),
        step: StepParams { confidence: 1.01, ..Default::default() },
        ..Default::default()
    };
    let mut session = Session::new(target, p).unwrap();
    let sampler = hamburger::Sampler::new(top3(0));
    let mut dist = |context: &[u32]| {
        session.clear();
        let out = session.feed(context, true).unwrap();
        sampler.distribution(out.logits.as_deref().unwrap(), context)
    };
    let mut exact = std::collections::HashMap::new();
    for (a, pa) in dist(prompt) {
        let ca: Vec<u32> = prompt.iter().copied().chain([a]).collect();
        for (b, pb) in dist(&ca) {
            let cb: Vec<u32> = ca.iter().copied().chain([b]).collect();
            for (c, pc) in dist(&cb) {
                exact.insert([a, b, c], pa as f64 * pb as f64 * pc as f64);
            }
        }
    }
    exact
}

/// Pearson's chi-square of `counts` against `exact` (cells expecting fewer
/// than 5 pooled into one), and its 0.999 quantile for the cells' degrees of
/// freedom (Wilson-Hilferty: within 1% of the table from 5 degrees up).
fn chi_square(
    counts: &std::collections::HashMap<[u32; 3], usize>,
    exact: &std::collections::HashMap<[u32; 3], f64>,
    n: usize,
) -> (f64, f64) {
    let (mut chi2, mut cells, mut pooled_e, mut pooled_o) = (0.0, 0, 0.0, 0.0);
    for (k, &p) in exact {
        let (e, o) = (p * n as f64, *counts.get(k).unwrap_or(&0) as f64);
        if e < 5.0 {
            (pooled_e, pooled_o) = (pooled_e + e, pooled_o + o);
        } else {
            chi2 += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_e > 0.0 {
        chi2 += (pooled_o - pooled_e).powi(2) / pooled_e.max(1e-9);
        cells += 1;
    }
    let unknown: usize = counts.iter().filter(|(k, _)| !exact.contains_key(*k)).map(|(_, &c)| c).sum();
    assert_eq!(unknown, 0, "tuples the target cannot sample");
    let df = (cells - 1) as f64;
    let z = 3.090; // the standard normal's 0.999 quantile
    (chi2, df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3))
}

#[test]
fn sampled_with_a_draft_model_the_first_three_tokens_follow_the_target() {
    let ckpt = tiny_fixture().join("hamburger.ckpt");
    let (target, draft) = (
        converted(&ckpt, "tiny", ggml::Type::F32, true).unwrap(),
        converted(&ckpt, "tiny", ggml::Type::F32, false).unwrap(),
    );
    let prompt = testing::golden::cases()[0].prompt_ids.clone();
    let exact = first_three(&open(&target), &prompt);
    const N: usize = 3000;
    // The first token is the target's own (its prompt's forward); the
    // second is drafted by the draft's base, the third by its micro decoder
    // (forced steps of 3) or either (confidence 0.3): 5 tokens are decoded so
    // that the drafts reach past the third.
    for (step, n_max) in [(forced(3), 3), (StepParams { confidence: 0.3, ..Default::default() }, 3)] {
        let params = DraftSessionParams {
            engine: engine(),
            step,
            sampling: top3(0),
            draft: DraftModelParams { n_max, n_min: 0, p_min: 0.0 },
            ignore_eog: true,
        };
        let seeds: Vec<u64> = (0..N as u64).collect();
        let runs = on_every_core(&seeds, |share| {
            let (target, draft) = (open(&target), open(&draft));
            let mut session = DraftSession::new(&target, &draft, params.clone()).unwrap();
            let mut sample = |seed| {
                session.restart(seed);
                let (gen, s) = session.generate(&prompt, 5, |_| true).unwrap();
                (<[u32; 3]>::try_from(&gen.output_ids[..3]).unwrap(), s)
            };
            share.iter().map(|&seed| sample(seed)).collect()
        });
        let mut counts = std::collections::HashMap::new();
        let mut stats = DraftStats::default();
        for (tuple, s) in runs {
            *counts.entry(tuple).or_insert(0) += 1;
            (stats.drafted, stats.accepted) = (stats.drafted + s.drafted, stats.accepted + s.accepted);
        }
        let (chi2, limit) = chi_square(&counts, &exact, N);
        eprintln!(
            "{step:?} n_max {n_max}: {:.0}% accepted, chi-square {chi2:.1} (0.999 quantile {limit:.1})",
            100.0 * stats.acceptance()
        );
        assert!(stats.drafted > 0 && stats.accepted > 0 && stats.accepted < stats.drafted, "{stats:?}");
        assert!(chi2 < limit, "{step:?}: chi-square {chi2:.1} over {limit:.1}");
    }
    // Accepting every draft would give the draft's own samples: the same
    // test tells them from the target's.
    let p =
        SessionParams { engine: engine(), step: forced(3), sampling: top3(0), ignore_eog: true, ..Default::default() };
    const N_DRAFT: usize = 1000;
    let seeds: Vec<u64> = (0..N_DRAFT as u64).collect();
    let tuples = on_every_core(&seeds, |share| {
        let draft = open(&draft);
        let sample = |seed| {
            let p = SessionParams { sampling: top3(seed), ..p.clone() };
            let gen = Session::new(&draft, p).unwrap().generate(&prompt, 3, |_| true).unwrap();
            <[u32; 3]>::try_from(gen.output_ids).unwrap()
        };
        share.iter().map(|&seed| sample(seed)).collect()
    });
    let mut counts = std::collections::HashMap::new();
    for tuple in tuples {
        *counts.entry(if exact.contains_key(&tuple) { tuple } else { [u32::MAX; 3] }).or_insert(0) += 1;
    }
    let outside = counts.remove(&[u32::MAX; 3]).unwrap_or(0);
    let (chi2, limit) = chi_square(&counts, &exact, N_DRAFT - outside);
    eprintln!("the draft's own samples: {outside} outside the target's support, chi-square {chi2:.1} (0.999 quantile {limit:.1})");
    assert!(outside > 0 || chi2 > limit, "the test cannot tell the draft's samples from the target's");
}

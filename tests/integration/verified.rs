//! Self-verified decoding is exact: greedy, its tokens are the base's one
//! token per forward, on the tiny fixture (random grafted modules: nearly
//! every draft is rejected) and the trained SmolLM2-HAMburger (drafts often
//! accepted), F32, every golden prompt, drafts of 1 to 3 and the gated
//! default.
//!
//! How the comparison is exact by construction: a verify forward reads 2 to
//! 4 rows of the sequence where one token per forward reads 1, and ggml's
//! CPU matrix products sum in another order for 1 row (vec_dot) than for 2
//! or more (tinyBLAS, whose order per output does not depend on the row
//! count). So the reference is one token per forward computed in the
//! 2-or-more-rows class: each forward reads the token and a throwaway row
//! after it, which the token's row does not attend and which is dropped
//! again ([`two_row_reference`]); the verified tokens must equal it exactly.
//! Against the plain one-token session (1-row forwards) the tokens must be
//! equal up to the first position where the two disagree, and there the
//! session's own logits must give the two tokens within [`NEAR_TIE`]: a
//! near-tie that the summation order may flip, not a verification error.
//! Trees of drafts are held to that second check only: a sibling row sums
//! its cells, among the chain's that it does not attend, in another order.

use std::path::{Path, PathBuf};

use hamburger::tokenizer::Tokenizer;
use hamburger::{
    Batch, DraftParams, Engine, EngineParams, Generation, LoadOptions, Model, Session, SessionParams, StepParams, Wants,
};
use testing::parallel::on_every_core;
use testing::testmodel::{converted, smollm2_trained_checkpoint, tiny_fixture};

/// Logits of two tokens closer than this (F32) are a near-tie.
const NEAR_TIE: f32 = 1e-3;
/// The same for Q8_0 weights: the row-count classes differ in how Q8_0 dot
/// products are summed, by a few 1e-3 of a logit on SmolLM2.
const NEAR_TIE_Q8_0: f32 = 0.05;
/// Tokens generated per prompt.
const N: usize = 32;

fn tiny_f32() -> PathBuf {
    converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap()
}

fn trained(ty: ggml::Type) -> PathBuf {
    converted(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained", ty, false).unwrap()
}

fn open(path: &Path) -> Model {
    Model::open(path, &LoadOptions::default()).unwrap()
}

/// The golden cases' prompts (each once).
fn golden_prompts() -> Vec<Vec<u32>> {
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap();
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    for c in g["cases"].as_array().unwrap() {
        let p: Vec<u32> = c["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        if !prompts.contains(&p) {
            prompts.push(p);
        }
    }
    prompts
}

/// Chat and code prompts for SmolLM2, tokenized.
fn smollm2_prompts(model: &Model) -> Vec<Vec<u32>> {
    let tok = Tokenizer::from_model(model).unwrap();
    [
        "The capital of France is",
        "def fibonacci(n):",
        "import numpy as np\nimport matplotlib.pyplot as plt\n",
        "Once upon a time, in a small village,",
        "<|im_start|>user\nList three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    ]
    .iter()
    .map(|p| tok.encode(p, true).unwrap())
    .collect()
}

fn engine_params(flash_attn: bool) -> EngineParams {
    // One thread: the same sums as two (ggml splits a product by rows), and
    // no spinning barriers on a busy machine.
    EngineParams {
        n_ctx: 512,
        kv_type: ggml::Type::F32,
        flash_attn: Some(flash_attn),
        n_threads: 1,
        ..Default::default()
    }
}

/// A greedy session, self-verified with `draft` or one token per step.
fn session(model: &Model, draft: Option<DraftParams>, flash_attn: bool) -> Session<'_> {
    let step = StepParams { confidence: 1.01, draft, ..Default::default() };
    Session::new(
        model,
        SessionParams { engine: engine_params(flash_attn), step, keep_logits: true, ..Default::default() },
    )
    .unwrap()
}

fn generate(s: &mut Session, prompt: &[u32]) -> Generation {
    s.clear();
    s.generate(prompt, N, |_| true).unwrap()
}

/// Greedy decoding, one token per base forward, each forward reading the
/// token and a throwaway row after it (dropped again): the base's choices
/// computed in the row-count class of a verify forward.
fn two_row_reference(model: &Model, prompt: &[u32], flash_attn: bool) -> Vec<u32> {
    let mut engine = Engine::new(model, &engine_params(flash_attn)).unwrap();
    let want = Wants { stop_head: false, logits: false, features: false, draft_stop: false };
    let mut batch = Batch::new();
    batch.push_tokens(0, prompt);
    let mut out = vec![engine.decode(&batch, want).unwrap()[0].1.argmax];
    while out.len() < N && !model.vocab.eog.contains(out.last().unwrap()) {
        let mut batch = Batch::new();
        batch.push_output_rows(0, &[*out.last().unwrap(), 0]);
        let rows = engine.decode(&batch, want).unwrap();
        engine.keep_through_output(0, 0).unwrap();
        out.push(rows[0].1.argmax);
    }
    out
}

/// The forced and gated drafts the tests run: 1, 2 and 3 tokens at every
/// step (`n_min` = `n_max`), and the default (gated) drafts; then 3 and
/// gated with the context drafting first (`ngram-simple,draft-mtp`); then
/// trees of drafts: of 5 around 3 forced, and of 8 around the gated chain
/// (its siblings where their rows pay at this machine's prices).
fn drafts() -> Vec<(&'static str, DraftParams)> {
    let forced = |k| DraftParams { n_max: Some(k), n_min: k, ..DraftParams::default() };
    let ngram = Some(hamburger::ngram::DEFAULT_SIZE);
    vec![
        ("k=1", forced(1)),
        ("k=2", forced(2)),
        ("k=3", forced(3)),
        ("gated", DraftParams::default()),
        ("ngram k=3", DraftParams { ngram, ..forced(3) }),
        ("ngram gated", DraftParams { ngram, ..DraftParams::default() }),
        ("tree 5 k=3", DraftParams { tree: 5, ..forced(3) }),
        ("tree 8 gated", DraftParams { tree: 8, ..DraftParams::default() }),
    ]
}

/// Checks every prompt and draft setting on `model` (F32): exactly against
/// the two-row reference, up to near-ties against one row per forward;
/// returns the drafted tokens accepted per verify forward of each setting.
/// The runs are shared over every core, each opening the model.
fn check_exact(model: &Path, prompts: &[Vec<u32>], flash_attn: bool) -> Vec<(&'static str, f64)> {
    let references: Vec<(Vec<u32>, Generation)> = on_every_core(prompts, |share| {
        let model = open(model);
        let mut one = session(&model, None, flash_attn);
        share.iter().map(|p| (two_row_reference(&model, p, flash_attn), generate(&mut one, p))).collect()
    });
    let counts = on_every_core(&runs(prompts.len()), |share| {
        let model = open(model);
        let check = |&(name, draft, pi): &(&'static str, DraftParams, usize)| {
            let (prompt, (want, plain)) = (&prompts[pi], &references[pi]);
            let gen = generate(&mut session(&model, Some(draft), flash_attn), prompt);
            // A tree's sibling rows sum their cells in another order than a
            // chain's (`a_sibling_row_reads_its_path_and_is_kept_in_place`):
            // they agree with the reference up to near-ties only.
            if draft.tree == 0 {
                assert_eq!(&gen.output_ids, want, "{name}, prompt {pi}: verified tokens against the two-row reference");
            }
            assert_eq!(gen.timings.kv_entries, prompt.len() + gen.output_ids.len() - 1, "one KV entry per token");
            if name.contains("k=") {
                // Every step drafts, but the last (nothing follows) and
                // where the budget leaves room for one token only.
                let drafted = gen.timings.verify_forwards;
                let steps = gen.macro_steps.len();
                assert!(drafted + 2 >= steps, "{name}: {drafted} of {steps} steps drafted");
            }
            assert_near_tie_equal(&gen.output_ids, plain, NEAR_TIE, &format!("{name}, prompt {pi}"));
            (name, gen.timings.draft_accepted, gen.timings.verify_forwards)
        };
        share.iter().map(check).collect()
    });
    drafts()
        .into_iter()
        .map(|(name, _)| {
            let (accepted, verifies) =
                counts.iter().filter(|c| c.0 == name).fold((0, 0), |(a, v), c| (a + c.1, v + c.2));
            (name, accepted as f64 / verifies.max(1) as f64)
        })
        .collect()
}

/// Every draft setting of [`drafts`] with every prompt index below `n_prompts`.
fn runs(n_prompts: usize) -> Vec<(&'static str, DraftParams, usize)> {
    drafts().into_iter().flat_map(|(name, draft)| (0..n_prompts).map(move |pi| (name, draft, pi))).collect()
}

/// `got` equals the one-token session's tokens up to their first difference,
/// where the session's logits rank the two tokens within `margin`; returns
/// whether they are equal throughout.
fn assert_near_tie_equal(got: &[u32], plain: &Generation, margin: f32, what: &str) -> bool {
    let Some(i) = got.iter().zip(&plain.output_ids).position(|(a, b)| a != b) else {
        assert_eq!(got.len(), plain.output_ids.len(), "{what}: lengths");
        return true;
    };
    let logits = &plain.macro_steps[i].logits[0];
    let gap = (logits[got[i] as usize] - logits[plain.output_ids[i] as usize]).abs();
    assert!(
        gap < margin,
        "{what}: token {i} differs ({} vs {}) by {gap} logits: not a near-tie",
        got[i],
        plain.output_ids[i]
    );
    eprintln!("{what}: token {i} differs from the one-row run's at a near-tie ({gap:e} logits)");
    false
}

#[test]
fn greedy_verified_equals_one_token_per_step_on_the_tiny_fixture() {
    let acceptance = check_exact(&tiny_f32(), &golden_prompts(), false);
    eprintln!("tiny fixture, drafted tokens accepted per verify forward: {acceptance:?}");
    // Random grafted modules: nearly every draft is rejected.
    assert!(acceptance.iter().filter(|(name, _)| name.starts_with("k=")).all(|&(_, a)| a < 0.2), "{acceptance:?}");
    // Its answers repeat themselves: there the context's drafts are accepted.
    let of = |name| acceptance.iter().find(|a| a.0 == name).map(|a| a.1).unwrap();
    assert!(of("ngram k=3") > 0.5, "{acceptance:?}");
}

#[test]
fn greedy_verified_equals_one_token_per_step_with_flash_attention() {
    check_exact(&tiny_f32(), &golden_prompts()[..3], true);
}

#[test]
fn greedy_verified_equals_one_token_per_step_on_the_trained_smollm2() {
    let model = trained(ggml::Type::F32);
    let acceptance = check_exact(&model, &smollm2_prompts(&open(&model)), false);
    eprintln!("trained SmolLM2, drafted tokens accepted per verify forward: {acceptance:?}");
    // The trained micro decoder drafts what the base says far more often,
    // and the context's drafts, where it repeats itself, more often still.
    assert!(acceptance.iter().any(|&(_, a)| a > 0.3), "{acceptance:?}");
    let of = |name| acceptance.iter().find(|a| a.0 == name).map(|a| a.1).unwrap();
    assert!(of("ngram k=3") > of("k=3"), "{acceptance:?}");
    // A tree's siblings are accepted where the chain's token is not.
    assert!(of("tree 5 k=3") > of("k=3"), "{acceptance:?}");
}

/// Quantized (Q8_0) weights: a verify forward's rows and one token's row sum
/// the Q8_0 products in different orders, so the outputs may part at a
/// near-tie; every divergence must be one (within [`NEAR_TIE_Q8_0`] of the
/// one-row run's logits), and the test reports how many answers agree.
#[test]
fn quantized_verified_output_agrees_up_to_near_ties() {
    let model = trained(ggml::Type::Q8_0);
    let prompts = smollm2_prompts(&open(&model));
    let plain = on_every_core(&prompts, |share| {
        let model = open(&model);
        let mut one = session(&model, None, false);
        share.iter().map(|p| generate(&mut one, p)).collect()
    });
    let runs = runs(prompts.len());
    let agreed = on_every_core(&runs, |share| {
        let model = open(&model);
        let agrees = |&(name, draft, pi): &(&'static str, DraftParams, usize)| {
            let gen = generate(&mut session(&model, Some(draft), false), &prompts[pi]);
            assert_near_tie_equal(&gen.output_ids, &plain[pi], NEAR_TIE_Q8_0, &format!("Q8_0 {name}, prompt {pi}"))
        };
        share.iter().map(agrees).collect()
    });
    let (agree, runs) = (agreed.iter().filter(|&&a| a).count(), runs.len());
    eprintln!(
        "Q8_0: {agree} of {runs} verified answers equal the one-token-per-step answers; the others part at near-ties"
    );
}

/// A tree of drafts' sibling row reads what a chain of its path reads (the
/// sums over its cells in another order: within rounding), and once it is
/// kept its entry takes the place of the drafted token it replaced: the
/// context's cells are one run again, and the next forward reads what it
/// reads after the chain (bit for bit, but for the sibling's own rounding).
#[test]
fn a_sibling_row_reads_its_path_and_is_kept_in_place() {
    for ty in [ggml::Type::F32, ggml::Type::Q8_0] {
        let model = open(&trained(ty));
        let prompt = &smollm2_prompts(&model)[3];
        let want = Wants { stop_head: false, logits: true, features: false, draft_stop: false };
        let (t0, d1, s1, d2, next) = (prompt[prompt.len() - 1], 100, 200, 300, 400);
        let run = |tree: bool| {
            let mut engine = Engine::new(&model, &engine_params(false)).unwrap();
            let mut batch = Batch::new();
            batch.push_tokens(0, &prompt[..prompt.len() - 1]);
            engine.decode(&batch, want).unwrap();
            let mut batch = Batch::new();
            let row = if tree {
                // s1 stands beside d1, one position before the chain's last token d2.
                batch.push_output_rows(0, &[t0, d1, d2]);
                batch.push_sibling_row(0, s1, 1);
                3
            } else {
                batch.push_output_rows(0, &[t0, s1]);
                1
            };
            let rows = engine.decode(&batch, want).unwrap();
            engine.keep_through_output(0, row).unwrap();
            let cells = engine.kv().entries_of(0);
            let mut batch = Batch::new();
            batch.push_tokens(0, &[next]);
            let after = engine.decode(&batch, want).unwrap().remove(0).1;
            (rows[row].1.logits.clone().unwrap(), cells, after.logits.unwrap())
        };
        let (tree, chain) = (run(true), run(false));
        let gap = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(gap(&tree.0, &chain.0) < 1e-3, "{ty}: the sibling row's logits, {}", gap(&tree.0, &chain.0));
        assert_eq!(tree.1, chain.1, "{ty}: the cells kept and their positions");
        assert!(gap(&tree.2, &chain.2) < 1e-3, "{ty}: the next forward's logits, {}", gap(&tree.2, &chain.2));
    }
}

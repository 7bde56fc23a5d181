//! The golden cases of the shared tiny fixture (greedy outputs of the
//! ORIGINAL implementation), and their end-to-end check on a loaded model.

use hamburger::{Model, Sampler, SamplerParams, Session, SessionParams};
use serde_json::Value;

use crate::testmodel::tiny_fixture;

/// One golden case: a prompt, the settings, and what the original emitted.
pub struct GoldenCase {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Tokens the case generates (its last macro step may reach past them).
    pub max_new_tokens: usize,
    /// The stop confidence.
    pub confidence: f32,
    /// The (macro step, token) pairs of the first `max_new_tokens` tokens.
    pub steps: Vec<(usize, u32)>,
    /// The whole JSON record (per-micro-step `p_stop` and `top5` logits).
    pub raw: Value,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Every case of `golden.json` (18).
///
/// # Panics
/// When the fixture cannot be read: a test error.
pub fn cases() -> Vec<GoldenCase> {
    let text = std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap();
    let g: Value = serde_json::from_str(&text).unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let max_new_tokens = c["max_new_tokens"].as_u64().unwrap() as usize;
            let steps = c["macro_steps"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .flat_map(|(si, s)| ids(&s["tokens"]).into_iter().map(move |t| (si, t)))
                .take(max_new_tokens)
                .collect();
            GoldenCase {
                prompt_ids: ids(&c["prompt_ids"]),
                max_new_tokens,
                confidence: c["confidence"].as_f64().unwrap() as f32,
                steps,
                raw: c.clone(),
            }
        })
        .collect()
}

/// Runs every golden case on `model` (an F32 conversion of the fixture):
/// (macro step, token) pairs exact for the first `max_new_tokens`, logits and
/// stop probabilities within the tolerances (when `params.keep_logits`).
///
/// # Panics
/// On any departure from the golden file: a test failure.
pub fn check_golden(model: &Model, params: SessionParams, logit_tol: f32, stop_tol: f32) {
    let cases = cases();
    assert_eq!(cases.len(), 18);
    for (ci, case) in cases.iter().enumerate() {
        let p = SessionParams { confidence: case.confidence, ..params.clone() };
        let mut session = Session::new(model, p).unwrap();
        let gen = session
            .generate(&case.prompt_ids, case.max_new_tokens, &mut Sampler::new(SamplerParams::greedy()), |_| true)
            .unwrap();
        let got: Vec<(usize, u32)> =
            gen.macro_steps.iter().enumerate().flat_map(|(si, s)| s.tokens.iter().map(move |&t| (si, t))).collect();
        assert_eq!(got, case.steps, "case {ci}: (macro step, token) sequence");
        let want_steps = case.raw["macro_steps"].as_array().unwrap();
        for (si, (step, w)) in gen.macro_steps.iter().zip(want_steps).enumerate() {
            for (mi, p) in step.p_stop.iter().enumerate() {
                let wp = w["p_stop"][mi].as_f64().unwrap() as f32;
                assert!((p - wp).abs() < stop_tol, "case {ci} step {si}.{mi}: p_stop {p} vs {wp}");
                for pair in w["top5"][mi].as_array().unwrap() {
                    let (id, l) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
                    let ours = step.logits[mi][id];
                    assert!((ours - l).abs() < logit_tol, "case {ci} step {si}.{mi}: logit[{id}] {ours} vs {l}");
                }
            }
        }
        assert_eq!(gen.output_ids.len(), case.max_new_tokens, "case {ci}: output cut at the budget");
        assert_eq!(gen.timings.kv_entries, case.prompt_ids.len() + gen.macro_steps.len() - 1);
    }
}

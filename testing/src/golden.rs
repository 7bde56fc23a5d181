//! Shared checks of the integration tests.

use crate::testmodel::tiny_fixture;
use hamburger::{Model, Sampler, SamplerParams, Session, SessionParams};

fn golden() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Runs every golden case of the tiny fixture on `model` (an F32 conversion):
/// (macro step, token) pairs exact for the first `max_new_tokens`, logits and
/// stop probabilities within the tolerances (when `params.keep_logits`).
pub fn check_golden(model: &Model, params: SessionParams, logit_tol: f32, stop_tol: f32) {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 18);
    for (ci, case) in cases.iter().enumerate() {
        let max_new = case["max_new_tokens"].as_u64().unwrap() as usize;
        let p = SessionParams { confidence: case["confidence"].as_f64().unwrap() as f32, ..params.clone() };
        let mut session = Session::new(model, p).unwrap();
        let gen = session
            .generate(&ids(&case["prompt_ids"]), max_new, &mut Sampler::new(SamplerParams::greedy()), |_| true)
            .unwrap();
        let want: Vec<(usize, u32)> = case["macro_steps"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .flat_map(|(si, s)| ids(&s["tokens"]).into_iter().map(move |t| (si, t)))
            .take(max_new)
            .collect();
        let got: Vec<(usize, u32)> =
            gen.macro_steps.iter().enumerate().flat_map(|(si, s)| s.tokens.iter().map(move |&t| (si, t))).collect();
        assert_eq!(got, want, "case {ci}: (macro step, token) sequence");
        for (si, (step, w)) in gen.macro_steps.iter().zip(case["macro_steps"].as_array().unwrap()).enumerate() {
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
        assert_eq!(gen.output_ids.len(), max_new, "case {ci}: output cut at the budget");
        assert_eq!(gen.timings.kv_entries, case["prompt_ids"].as_array().unwrap().len() + gen.macro_steps.len() - 1);
    }
}

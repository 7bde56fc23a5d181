//! The golden cases of the tiny fixture (greedy outputs of the
//! ORIGINAL implementation), and their end-to-end check on a loaded model.

use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams, StepParams, StepRule};
use serde_json::Value;

use crate::near_tie::{assert_near_tie, decisions_of, decisions_of_generation, divergence, Decision};
use crate::testmodel::{converted, tiny_fixture};

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

/// The `hamburger-cli` flags that decode `case` as the golden file did:
/// its prompt ids, budget and confidence, greedy, an F32 cache, `--json`
/// (the model, threads and device flags are the caller's).
pub fn cli_args(case: &GoldenCase) -> Vec<String> {
    let ids: Vec<String> = case.prompt_ids.iter().map(u32::to_string).collect();
    let args = ["--prompt-ids", &ids.join(","), "-n", &case.max_new_tokens.to_string()];
    let rest = ["--confidence", &case.confidence.to_string(), "--temp", "0", "--cache-type", "f32", "--json"];
    args.iter().chain(&rest).map(|a| a.to_string()).collect()
}

/// The (macro step, token) pairs of `hamburger-cli --json`'s output.
///
/// # Panics
/// When the output is not the CLI's JSON: a test failure.
pub fn cli_steps(json: &str) -> Vec<(usize, u32)> {
    let v: Value = serde_json::from_str(json).unwrap();
    v["macro_steps"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .flat_map(|(si, s)| s.as_array().unwrap().iter().map(move |t| (si, t.as_u64().unwrap() as u32)))
        .collect()
}

/// The largest departure of one kind (logit or stop probability) from the
/// golden file, and where it is.
#[derive(Debug, Clone, Default)]
pub struct Worst {
    /// The absolute difference.
    pub diff: f32,
    /// `case C step S.M: what ours vs golden`.
    pub at: String,
}

impl Worst {
    fn see(&mut self, diff: f32, at: impl FnOnce() -> String) {
        if diff > self.diff || diff.is_nan() {
            *self = Worst { diff, at: at() };
        }
    }
}

/// The golden decode of `case` as decisions ([`crate::near_tie`]): each
/// token with the original's top-2 logit margin, each step end with its stop
/// probability's distance from the case's confidence, for the first
/// `max_new_tokens` tokens.
fn golden_decisions(case: &GoldenCase, max_steps: usize) -> Vec<Decision> {
    let rule = StepRule { max_steps, confidence: case.confidence, forced: false, draft: None };
    let steps: Vec<(Vec<u32>, Vec<f32>, Vec<f32>)> = case.raw["macro_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let floats = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            (ids(&s["tokens"]), floats(&s["p_stop"]), floats(&s["top2_margin"]))
        })
        .collect();
    let mut d = decisions_of(steps.iter().map(|(t, p, m)| (&t[..], &p[..], m.clone())), &rule);
    d.truncate(case.max_new_tokens);
    d
}

/// The golden cases the server's GPU test asks for over HTTP (text compared
/// exactly, so no near-tie may part): each of the six prompts once and each
/// of the three confidences twice, the 35-token prompt (whose prompt-sized
/// products ggml offloads even at `-ngl 0`) and the F16 near-tie of case 17
/// among them.
pub const SAMPLED: [usize; 6] = [0, 3, 7, 10, 14, 17];

/// Runs every golden case on `model` (an F32 conversion of the fixture, or
/// any lower precision with tolerances to match), with `params.keep_logits`:
/// the decisions (tokens and macro-step ends) equal the original's for the
/// first `max_new_tokens` tokens, except that a case may part from it at a
/// near-tie ([`crate::near_tie`]): a token whose top-2 margin, or a step end
/// whose stop probability's distance from the confidence, is below twice the
/// tolerance (each side's value may be off by it), or twice the worst
/// departure measured when the tolerance is infinite; the worst top-5 logit
/// and stop probability departures over the decisions before any parting
/// within the tolerances. The worst departures are printed (`--nocapture`)
/// and returned, so a tolerance can be set from measurement.
///
/// # Panics
/// On any departure beyond them: a test failure.
pub fn check_golden(model: &Model, params: SessionParams, logit_tol: f32, stop_tol: f32) -> (Worst, Worst) {
    let cases = cases();
    assert_eq!(cases.len(), 18);
    let (mut logit, mut stop) = (Worst::default(), Worst::default());
    let mut parted = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let p = SessionParams { step: StepParams { confidence: case.confidence, ..params.step }, ..params.clone() };
        let mut session = Session::new(model, p).unwrap();
        let gen = session.generate(&case.prompt_ids, case.max_new_tokens, |_| true).unwrap();
        let rule = StepRule { max_steps: model.hp.max_steps, confidence: case.confidence, forced: false, draft: None };
        let want = golden_decisions(case, model.hp.max_steps);
        let got = decisions_of_generation(&gen, &rule);
        let part = divergence(&got, &want);
        // Departures are compared where both decoded the same context.
        let compared = part.as_ref().map_or(want.len(), |d| d.at + 1);
        let want_steps = case.raw["macro_steps"].as_array().unwrap();
        let pairs = gen
            .macro_steps
            .iter()
            .zip(want_steps)
            .flat_map(|(step, w)| (0..step.tokens.len()).map(move |mi| (step, w, mi)));
        for (i, (step, w, mi)) in pairs.take(compared).enumerate() {
            let p = step.p_stop[mi];
            let wp = w["p_stop"][mi].as_f64().unwrap() as f32;
            stop.see((p - wp).abs(), || format!("case {ci} token {i}: p_stop {p} vs {wp}"));
            for pair in w["top5"][mi].as_array().unwrap() {
                let (id, l) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
                let ours = step.logits[mi][id];
                logit.see((ours - l).abs(), || format!("case {ci} token {i}: logit[{id}] {ours} vs {l}"));
            }
        }
        match part {
            Some(d) => parted.push((ci, d)),
            None => {
                assert_eq!(gen.output_ids.len(), case.max_new_tokens, "case {ci}: output cut at the budget");
                assert_eq!(gen.timings.kv_entries, case.prompt_ids.len() + gen.macro_steps.len() - 1);
            }
        }
    }
    eprintln!("golden: worst logit {:.3e} ({}); worst p_stop {:.3e} ({})", logit.diff, logit.at, stop.diff, stop.at);
    assert!(logit.diff < logit_tol, "logit beyond {logit_tol}: {}", logit.at);
    assert!(stop.diff < stop_tol, "p_stop beyond {stop_tol}: {}", stop.at);
    let tie = |tol: f32, worst: f32| 2.0 * if tol.is_finite() { tol } else { worst };
    let (tie_logit, tie_stop) = (tie(logit_tol, logit.diff), tie(stop_tol, stop.diff));
    for (ci, d) in parted {
        assert_near_tie(&d, tie_logit, tie_stop, &format!("golden case {ci}"));
    }
    (logit, stop)
}

/// The golden cases in TF32's arithmetic, on the CPU: an F16 conversion with
/// an F16 cache rounds every matrix-product operand (weights, activations,
/// keys, values) to 10 mantissa bits, TF32's, and accumulates in F32 as
/// tensor cores do. ggml-cuda runs F32 products of more than 3 columns in
/// TF32 on Ampere and later (its `mmf` kernels' `tf32` MMA instructions up
/// to 16 columns, cuBLAS in `CUBLAS_TF32_TENSOR_OP_MATH` above), so these
/// departures are the scale of what an F32 model on such a GPU may show.
/// Tokens may part from the original only at a near-tie of twice the
/// departures measured; the worst departures are returned.
///
/// # Panics
/// When the tokens depart: a test failure.
pub fn tf32_emulation() -> (Worst, Worst) {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F16, false).unwrap();
    let p = SessionParams {
        engine: EngineParams {
            n_ctx: 256,
            kv_type: ggml::Type::F16,
            flash_attn: Some(false),
            n_threads: 2,
            ..Default::default()
        },
        keep_logits: true,
        ..Default::default()
    };
    check_golden(&Model::open(&gguf, &LoadOptions::default()).unwrap(), p, f32::INFINITY, f32::INFINITY)
}

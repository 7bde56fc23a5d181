//! The golden cases of the tiny fixture (greedy outputs of the
//! ORIGINAL implementation), and their end-to-end check on a loaded model.

use hamburger::{EngineParams, LoadOptions, MacroStep, Model, Session, SessionParams, StepParams};
use serde_json::Value;

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

/// How a run's tokens must match the golden file's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// Every (macro step, token) pair of the first `max_new_tokens` equal.
    Exact,
    /// Equal up to a first departure, which must be where the original was
    /// itself near a tie that logits within the tolerances can flip: a
    /// different token whose original logit is within twice the logit
    /// tolerance of the original's pick, or a step boundary where the
    /// original's `1 - p_stop` was within the stop tolerance of the
    /// confidence. From there the run takes another path: nothing after it
    /// is compared. For arithmetic that cannot be exact (F16 accumulation).
    NearTies,
}

/// Runs every golden case on `model` (an F32 conversion of the fixture, or
/// any lower precision with tolerances to match): (macro step, token) pairs
/// as `tokens` asks for the first `max_new_tokens`, and, when
/// `params.keep_logits`, the worst top-5 logit and stop probability over all
/// compared positions within the tolerances. The worst departures (and any
/// near-tie departure) are printed (`--nocapture`) and returned, so a
/// tolerance can be set from measurement.
///
/// # Panics
/// On any departure beyond them: a test failure.
pub fn check_golden_tokens(
    model: &Model,
    params: SessionParams,
    tokens: Tokens,
    logit_tol: f32,
    stop_tol: f32,
) -> (Worst, Worst) {
    let cases = cases();
    assert_eq!(cases.len(), 18);
    let (mut logit, mut stop) = (Worst::default(), Worst::default());
    for (ci, case) in cases.iter().enumerate() {
        let p = SessionParams { step: StepParams { confidence: case.confidence, ..params.step }, ..params.clone() };
        let mut session = Session::new(model, p).unwrap();
        let gen = session.generate(&case.prompt_ids, case.max_new_tokens, |_| true).unwrap();
        if tokens == Tokens::Exact {
            let got: Vec<(usize, u32)> = gen
                .macro_steps
                .iter()
                .enumerate()
                .flat_map(|(si, s)| s.tokens.iter().map(move |&t| (si, t)))
                .collect();
            assert_eq!(got, case.steps, "case {ci}: (macro step, token) sequence");
        }
        let departed = walk(ci, case, &gen.macro_steps, &mut logit, &mut stop);
        match departed {
            None => {
                assert_eq!(gen.output_ids.len(), case.max_new_tokens, "case {ci}: output cut at the budget");
                assert_eq!(gen.timings.kv_entries, case.prompt_ids.len() + gen.macro_steps.len() - 1);
            }
            Some(Departure::Token { at, ours, gap }) => {
                eprintln!("golden: case {ci} departs at {at}: token {ours}, {gap:.3e} below the original's pick");
                assert!(gap <= 2.0 * logit_tol, "case {ci} at {at}: token {ours} is no near-tie ({gap} below)");
            }
            Some(Departure::Boundary { at, margin }) => {
                eprintln!("golden: case {ci} departs at {at}: a step boundary, 1 - p_stop {margin:.3e} from the confidence");
                assert!(margin <= stop_tol, "case {ci} at {at}: the step boundary moved ({margin} from the confidence)");
            }
        }
    }
    eprintln!("golden: worst logit {:.3e} ({}); worst p_stop {:.3e} ({})", logit.diff, logit.at, stop.diff, stop.at);
    assert!(logit.diff < logit_tol, "logit beyond {logit_tol}: {}", logit.at);
    assert!(stop.diff < stop_tol, "p_stop beyond {stop_tol}: {}", stop.at);
    (logit, stop)
}

/// [`check_golden_tokens`] with exact tokens.
///
/// # Panics
/// On any departure beyond the tolerances or of a token: a test failure.
pub fn check_golden(model: &Model, params: SessionParams, logit_tol: f32, stop_tol: f32) -> (Worst, Worst) {
    check_golden_tokens(model, params, Tokens::Exact, logit_tol, stop_tol)
}

/// Where a run first left the original's path.
enum Departure {
    /// Another token at `at`, whose original logit is `gap` below the original's pick
    /// (infinite when it was not among the original's top 5).
    Token { at: String, ours: u32, gap: f32 },
    /// A step ended where the original's went on, or the other way round;
    /// `margin`: how far the original's `1 - p_stop` was from the confidence.
    Boundary { at: String, margin: f32 },
}

/// Walks `ours` along `case`'s macro steps for its first `max_new_tokens`,
/// noting the logit and p_stop departures of every position both have, up
/// to the first position where the paths part.
fn walk(ci: usize, case: &GoldenCase, ours: &[MacroStep], logit: &mut Worst, stop: &mut Worst) -> Option<Departure> {
    let mut n = 0;
    for (si, w) in case.raw["macro_steps"].as_array().unwrap().iter().enumerate() {
        let want = ids(&w["tokens"]);
        let step = ours.get(si);
        let original_p_stop = |mi: usize| w["p_stop"][mi].as_f64().unwrap() as f32;
        let boundary = |mi: usize| Departure::Boundary {
            at: format!("step {si}.{mi}"),
            margin: ((1.0 - original_p_stop(mi - 1)) - case.confidence).abs(),
        };
        for (mi, &wt) in want.iter().enumerate() {
            if n == case.max_new_tokens {
                return None;
            }
            let Some(&t) = step.and_then(|s| s.tokens.get(mi)) else {
                // Ours ended this step after token mi - 1 (a step has one token at least).
                return Some(boundary(mi.max(1)));
            };
            let step = step.unwrap();
            let (p, wp) = (step.p_stop[mi], original_p_stop(mi));
            stop.see((p - wp).abs(), || format!("case {ci} step {si}.{mi}: p_stop {p} vs {wp}"));
            let top5: Vec<(u32, f32)> = w["top5"][mi]
                .as_array()
                .unwrap()
                .iter()
                .map(|pair| (pair[0].as_u64().unwrap() as u32, pair[1].as_f64().unwrap() as f32))
                .collect();
            if let Some(logits) = step.logits.get(mi) {
                for &(id, l) in &top5 {
                    let o = logits[id as usize];
                    logit.see((o - l).abs(), || format!("case {ci} step {si}.{mi}: logit[{id}] {o} vs {l}"));
                }
            }
            if t != wt {
                let best = top5.iter().map(|&(_, l)| l).fold(f32::NEG_INFINITY, f32::max);
                let gap = top5.iter().find(|&&(id, _)| id == t).map_or(f32::INFINITY, |&(_, l)| best - l);
                return Some(Departure::Token { at: format!("step {si}.{mi}"), ours: t, gap });
            }
            n += 1;
        }
        if n < case.max_new_tokens && step.is_some_and(|s| s.tokens.len() > want.len()) {
            // Ours went on where the original ended this step.
            return Some(boundary(want.len()));
        }
    }
    None
}

/// The golden cases in TF32's arithmetic, on the CPU: an F16 conversion with
/// an F16 cache rounds every matrix-product operand (weights, activations,
/// keys, values) to 10 mantissa bits, TF32's, and accumulates in F32 as
/// tensor cores do. ggml-cuda runs F32 products of more than 3 columns in
/// TF32 on Ampere and later (its `mmf` kernels' `tf32` MMA instructions up
/// to 16 columns, cuBLAS in `CUBLAS_TF32_TENSOR_OP_MATH` above), so these
/// departures are the scale of what an F32 model on such a GPU may show.
/// Tokens must still match exactly; the worst departures are returned.
///
/// # Panics
/// When the tokens depart: a test failure.
pub fn tf32_emulation() -> (Worst, Worst) {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F16, false).unwrap();
    let p = SessionParams {
        engine: EngineParams {
            n_ctx: 256,
            kv_type: ggml::Type::F16,
            flash_attn: false,
            n_threads: 2,
            ..Default::default()
        },
        keep_logits: true,
        ..Default::default()
    };
    check_golden(&Model::open(&gguf, &LoadOptions::default()).unwrap(), p, f32::INFINITY, f32::INFINITY)
}

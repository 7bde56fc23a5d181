//! A draft model in the server (llama-server's `-md`): SmolLM2-HAMburger
//! drafts for itself, one draft sequence per slot, and the target checks
//! every drafted token in its macro step's forward. The answers are the
//! target's own (greedy and sampled: each row's token is drawn as a plain
//! decode draws it) up to a near-tie (a verify forward reads several rows,
//! see `common`), the drafts are counted in `timings`, a request chooses its
//! drafts with `speculative.*`, and synthetic acceptance
//! (`--spec-synth-rates`) keeps the drafts at the rates given.

use crate::common;

use crate::common::TestServer;
use hamburger::draft_model::DraftModelParams;
use hamburger::StepParams;
use serde_json::{json, Value};
use server::scheduler::DraftModelConfig;

const PROMPTS: [&str; 3] = [
    "The three most useful things to pack for a hike are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
];

/// One token per forward: what the drafted target must reproduce.
fn plain() -> StepParams {
    StepParams { confidence: 1.01, ..Default::default() }
}

/// A server of 2 slots whose draft model is its own model, drafting 3
/// tokens (at most) per verify forward, its drafts accepted at `rates` when given.
fn drafted(rates: Option<Vec<f64>>) -> TestServer {
    let mut cfg = TestServer::config(2, 512, 8, plain(), None);
    cfg.draft = Some(DraftModelConfig {
        model: cfg.model.clone(),
        params: DraftModelParams { n_max: 3, n_min: 0, p_min: 0.0 },
        step: StepParams::default(),
        synthetic_rates: rates,
    });
    TestServer::from_config(cfg, None)
}

fn completion(prompt: &str, extra: Value) -> Value {
    let mut body = json!({"prompt": prompt, "max_tokens": 32, "temperature": 0, "logprobs": 2});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn timing(answer: &Value, name: &str) -> u64 {
    answer["timings"][name].as_u64().unwrap_or_else(|| panic!("no timings.{name}: {answer}"))
}

#[test]
fn drafted_answers_are_the_targets_own_greedy_and_sampled() {
    let (want, got) = {
        let plain = TestServer::start_with(2, 512, 8, None, plain(), None);
        let drafted = drafted(None);
        let ask = |s: &TestServer, body: &Value| {
            let (status, answer) = s.post("/v1/completions", body);
            assert_eq!(status, 200, "{answer}");
            answer
        };
        let mut want = Vec::new();
        let mut got = Vec::new();
        for (i, p) in PROMPTS.iter().enumerate() {
            for extra in [json!({}), json!({"temperature": 0.8, "seed": 7 + i})] {
                let body = completion(p, extra);
                want.push(ask(&plain, &body));
                got.push(ask(&drafted, &body));
            }
        }
        (want, got)
    };
    let (mut drafted, mut accepted) = (0, 0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        common::assert_same_up_to_a_tie(&g["choices"][0], &w["choices"][0], &format!("answer {i}"));
        assert_eq!(timing(w, "draft_n"), 0, "no draft model, no drafts: {w}");
        drafted += timing(g, "draft_n");
        accepted += timing(g, "draft_n_accepted");
        assert!(timing(g, "draft_n") <= 3 * timing(g, "verify_forwards"), "at most n_max per verify forward: {g}");
    }
    // The draft is the target itself: its drafts are mostly right.
    assert!(drafted > 0 && 2 * accepted > drafted, "{accepted} of {drafted} drafted tokens accepted");
}

#[test]
fn requests_choose_their_drafts_and_slots_draft_side_by_side() {
    let s = drafted(None);
    // Two requests at once, each in its own slot and draft sequence.
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            PROMPTS[..2].iter().map(|p| scope.spawn(|| s.post("/v1/completions", &completion(p, json!({}))))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .map(|(status, a)| (assert_eq!(status, 200, "{a}"), a).1)
            .collect()
    });
    for a in &answers {
        assert!(timing(a, "draft_n") > 0, "{a}");
    }
    // A request's own n_max, and none: one token per forward.
    let (status, one) = s.post("/v1/completions", &completion(PROMPTS[2], json!({"speculative.n_max": 1})));
    assert_eq!(status, 200, "{one}");
    assert!(timing(&one, "draft_n") > 0 && timing(&one, "draft_n") <= timing(&one, "verify_forwards"), "{one}");
    let (status, none) = s.post("/v1/completions", &completion(PROMPTS[2], json!({"speculative.type": "none"})));
    assert_eq!(status, 200, "{none}");
    assert_eq!(timing(&none, "draft_n"), 0, "{none}");
    // Bad fields: a 400 naming the field, and the server goes on.
    let (status, e) = s.post("/v1/completions", &completion(PROMPTS[2], json!({"speculative.n_min": 5})));
    assert_eq!(status, 400, "{e}");
    assert!(e.to_string().contains("speculative.n_min"), "{e}");
    let (status, e) = s.post("/v1/completions", &completion(PROMPTS[2], json!({"speculative.n_max": 1u64 << 40})));
    assert_eq!(status, 400, "{e}");
    assert!(e.to_string().contains("speculative.n_max"), "more drafts than a forward holds: {e}");
    let (status, e) = s.post("/v1/completions", &completion(PROMPTS[2], json!({"speculative.type": "draft-eagle3"})));
    assert_eq!(status, 400, "{e}");
    let (status, _) = s.post("/v1/completions", &completion(PROMPTS[2], json!({})));
    assert_eq!(status, 200);
}

#[test]
fn synthetic_acceptance_keeps_every_draft_at_rate_one_and_none_at_zero() {
    let body = completion(PROMPTS[0], json!({"temperature": 0.8, "seed": 3}));
    let s = drafted(Some(vec![1.0; 3]));
    let (status, a) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{a}");
    assert!(timing(&a, "draft_n") > 0, "{a}");
    assert_eq!(timing(&a, "draft_n_accepted"), timing(&a, "draft_n"), "{a}");
    drop(s);
    // At rate 0 every draft is replaced by the target's token, which is
    // mostly the drafted one here (the draft is the target): drafting goes
    // on after each such forward, whose entries the draft already holds.
    let s = drafted(Some(vec![0.0; 3]));
    let (status, a) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{a}");
    assert_eq!(timing(&a, "draft_n_accepted"), 0, "{a}");
    assert!(timing(&a, "verify_forwards") > 8, "drafting goes on: {a}");
}

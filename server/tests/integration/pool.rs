//! One pool of KV cells for every request, over real loopback HTTP on
//! SmolLM2-HAMburger in F32 with an F32 cache: a long answer takes the cells
//! others leave free, requests that outgrow the pool together are preempted
//! and resumed with the same KV entries (their answers those they give
//! alone), and prompt prefixes are computed once for every request that
//! shares them.

use crate::common::TestServer;
use hamburger::row_class::{reusable_prefix, RowClasses};
use hamburger::StepParams;
use serde_json::{json, Value};

use crate::common;

fn step() -> StepParams {
    StepParams { confidence: 0.3, ..Default::default() }
}

/// Posts every body at once; the answers in order.
fn together(s: &TestServer, path: &str, bodies: &[Value]) -> Vec<Value> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = bodies.iter().map(|b| scope.spawn(move || s.post(path, b))).collect();
        handles
            .into_iter()
            .map(|h| {
                let (status, v) = h.join().unwrap();
                assert_eq!(status, 200, "{v}");
                v
            })
            .collect()
    })
}

/// KV as one pool: answers that outgrow it together are preempted and
/// resumed, each with the same entries as before (its merged macro steps fed
/// again merged, not token by token), so every answer is whole and equals
/// the same request alone, and the entries it ends with are exactly one per
/// prompt token and per macro step.
#[test]
fn answers_that_outgrow_the_pool_together_are_preempted_and_equal_their_answers_alone() {
    let prompts = ["Count with me:", "The list of colors:", "Write a poem about", "Numbers from ten:"];
    // Forced 4 tokens a step: 160 tokens in 40 macro steps, ~45 cells each.
    let body = |p: &str| {
        json!({"prompt": p, "max_tokens": 160, "temperature": 0, "ignore_eos": true, "confidence": 0.0,
               "max_steps": 4, "logprobs": 2})
    };
    let bodies: Vec<Value> = prompts.iter().map(|p| body(p)).collect();
    let alone: Vec<Value> = {
        let s = TestServer::start_with(1, 512, 8, None, step(), None);
        bodies.iter().map(|b| s.post("/v1/completions", b).1).collect()
    };
    // Four slots over 120 cells: each answer fits alone, the four do not.
    let s = TestServer::start_with(4, 30, 8, None, step(), None);
    let pressed = together(&s, "/v1/completions", &bodies);
    assert!(s.metric("preemptions_total") >= 1.0, "the pool ran out: requests were preempted");
    for (i, (a, b)) in pressed.iter().zip(&alone).enumerate() {
        assert_eq!(a["usage"]["completion_tokens"], 160, "request {i} is whole: {a}");
        assert_eq!(a["choices"][0]["finish_reason"], "length", "request {i}");
        let t = &a["timings"];
        assert_eq!(t["macro_steps"], 40, "request {i}: {t}");
        let entries = a["usage"]["prompt_tokens"].as_u64().unwrap() + 40 - 1;
        assert_eq!(t["kv_entries"].as_u64().unwrap(), entries, "request {i}: one entry per prompt token and step");
        common::assert_same_up_to_a_tie(&a["choices"][0], &b["choices"][0], &format!("request {i}"));
    }
}

/// No fixed shares: one answer takes the cells the others leave, where a
/// slot's share (32 cells) would have cut it.
#[test]
fn a_long_answer_takes_the_cells_others_leave() {
    let s = TestServer::start_with(4, 32, 8, None, step(), None);
    let body =
        |p: &str, n: usize| json!({"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true, "max_steps": 1});
    let bodies = [body("Count with me:", 90), body("Red,", 8), body("One,", 8), body("Hello", 8)];
    let answers = together(&s, "/v1/completions", &bodies);
    for (v, want) in answers.iter().zip([90, 8, 8, 8]) {
        assert_eq!(v["usage"]["completion_tokens"], want, "{v}");
    }
    assert!(answers[0]["timings"]["kv_entries"].as_u64().unwrap() > 32, "{}", answers[0]["timings"]);
}

/// The prompt tokens a prompt of `len` tokens adopts of an earlier
/// prompt's `earlier` tokens read fresh, when they share `common`: as many
/// as leave the rest to be read as a fresh read of it reads it (the test
/// servers' flash attention on the CPU, `hamburger::row_class`).
fn adopted(common: usize, len: usize, earlier: usize) -> u64 {
    let n_batch = hamburger::EngineParams::default().n_batch;
    reusable_prefix(RowClasses::CpuFlashAttention, n_batch, common, len, earlier).keep as u64
}

/// `n` choices compute their prompt once: the first choice feeds it, the
/// others adopt its entries, all but those of the tail a fresh read of the
/// prompt reads in a forward of its own size class (at least the last
/// token, whose forward each choice's first macro step needs), so every
/// choice reads its prompt as a fresh read would.
#[test]
fn n_choices_process_their_prompt_once() {
    let s = TestServer::start(4, 8, None);
    let prompt = "The three primary colors are red, yellow and blue. Mixing two of them gives";
    let (status, v) = s.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "n": 4, "cache_prompt": true}),
    );
    assert_eq!(status, 200, "{v}");
    let len = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let keep = adopted(len as usize - 1, len as usize, len as usize);
    assert!(keep > 0 && keep < len - 1, "{keep} of {len}");
    let t = &v["timings"];
    assert_eq!(t["prompt_n"].as_u64().unwrap(), len + 3 * (len - keep), "{t}");
    assert_eq!(t["cache_n"].as_u64().unwrap(), 3 * keep, "{t}");
    assert_eq!(s.metric("prompt_tokens_total"), (len + 3 * (len - keep)) as f64);
    let texts: Vec<&str> = v["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert!(texts.iter().all(|t| !t.is_empty()), "{texts:?}");
}

/// Clients sending the same system prompt together compute it once: the
/// first feeds it, the others wait for its entries and adopt them (up to
/// where the rest of their prompt is read as a fresh read reads it).
#[test]
fn concurrent_chats_with_one_system_prompt_compute_it_once() {
    let s = TestServer::start(4, 8, None);
    let system = "You are a careful assistant. ".repeat(30);
    let questions = ["Name a fruit.", "Name a color.", "Name a city.", "Name an animal."];
    let chat = |q: &str| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
               "max_tokens": 6, "temperature": 0})
    };
    let ids = |q: &str| {
        let (_, p) = s.post("/apply-template", &chat(q));
        let (_, t) = s.post("/tokenize", &json!({"content": p["prompt"], "add_special": true}));
        t["tokens"].as_array().unwrap().clone()
    };
    let all: Vec<Vec<Value>> = questions.iter().map(|q| ids(q)).collect();
    let common = |a: &[Value], b: &[Value]| a.iter().zip(b).take_while(|(x, y)| x == y).count() as u64;
    // What every pair of the four prompts shares: the system prompt and the template around it.
    let shared = all.iter().flat_map(|a| all.iter().map(|b| common(a, b))).min().unwrap();
    assert!(shared > 150, "{shared}");
    let bodies: Vec<Value> = questions.iter().map(|q| chat(q)).collect();
    let answers = together(&s, "/v1/chat/completions", &bodies);
    let cached: Vec<u64> = answers.iter().map(|v| v["timings"]["cache_n"].as_u64().unwrap()).collect();
    assert_eq!(cached.iter().filter(|&&c| c == 0).count(), 1, "one computed the system prompt: {cached:?}");
    let first = cached.iter().position(|&c| c == 0).unwrap();
    for (i, &c) in cached.iter().enumerate().filter(|&(i, _)| i != first) {
        let keep = adopted(common(&all[first], &all[i]) as usize, all[i].len(), all[first].len());
        assert!(keep > 0, "{shared}");
        assert_eq!(c, keep, "chat {i} adopted the system prompt: {cached:?}");
    }
    assert_eq!(s.metric("prompt_tokens_cached_total"), cached.iter().sum::<u64>() as f64);
}

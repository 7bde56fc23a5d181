//! A request of several choices over real loopback HTTP, on SmolLM2-HAMburger
//! in F32 with an F32 cache: `n` choices, a completions `prompt` listing
//! several prompts, streamed choices, and log-probabilities in streams.
//! Choices are compared exactly where both runs read alike (the same number
//! of sequences in every forward, fixed macro steps, short prompts: see the
//! harness), and up to a near-tie against a lone request.

use crate::common::TestServer;
use hamburger::StepParams;
use serde_json::{json, Value};

use crate::common;

/// The JSON chunks of a streamed request (its last payload `[DONE]`).
fn stream(s: &TestServer, path: &str, body: &Value) -> Vec<Value> {
    let text = common::client().post(format!("{}{path}", s.url)).json(body).send().unwrap().text().unwrap();
    let payloads: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(payloads.last(), Some(&"[DONE]"), "{text}");
    payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect()
}

/// A choice's text, chat's or a completion's.
fn text(choice: &Value) -> &str {
    choice["message"]["content"].as_str().or(choice["text"].as_str()).unwrap()
}

fn texts(v: &Value) -> Vec<&str> {
    v["choices"].as_array().unwrap().iter().map(text).collect()
}

fn indices(v: &Value) -> Vec<u64> {
    v["choices"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect()
}

#[test]
fn n_choices_sample_apart_each_as_its_own_seed_would() {
    // Two tokens a macro step and no end of generation, so that every
    // choice runs as many macro steps as the others: a request's choices
    // decode three to a forward from first to last, and so compute alike
    // whichever seeds they carry.
    let forced = StepParams { forced_steps: Some(2), ..Default::default() };
    let s = TestServer::start_with(4, 512, 8, None, forced, None);
    let body = |n: u64, seed: u64| json!({"prompt": "A cat", "max_tokens": 16, "temperature": 1.0, "seed": seed, "n": n, "ignore_eos": true});
    let (status, three) = s.post("/v1/completions", &body(3, 7));
    assert_eq!(status, 200, "{three}");
    assert_eq!(indices(&three), [0, 1, 2]);
    // Admitted together, the choices decode in the same macro steps: their
    // steps share base forwards.
    let (steps, forwards) = (s.metric("macro_steps_total"), s.metric("base_forwards_total"));
    assert!(forwards < steps, "{forwards} base forwards for {steps} macro steps of 3 choices");
    let got = texts(&three);
    assert!(got[0] != got[1] && got[1] != got[2] && got[0] != got[2], "sampled choices differ: {got:?}");
    let mut fresh = body(3, 7);
    fresh["cache_prompt"] = json!(false);
    let (_, again) = s.post("/v1/completions", &fresh);
    assert_eq!(texts(&again), got, "a seed reproduces the request");

    // Choice j samples with seed + j: the request seeded 8 starts with the
    // choices of seeds 8 and 9.
    fresh["seed"] = json!(8);
    let (_, shifted) = s.post("/v1/completions", &fresh);
    assert_eq!(texts(&shifted)[..2], got[1..], "choice j samples with seed + j");

    // What a request of n choices counts: the prompt once, each choice's tokens and steps.
    let alone: Vec<Value> = (7..10).map(|seed| s.post("/v1/completions", &body(1, seed)).1).collect();
    let (u, u1) = (&three["usage"], &alone[0]["usage"]);
    assert_eq!(u["prompt_tokens"], u1["prompt_tokens"], "the prompt counted once");
    let completion: u64 = alone.iter().map(|v| v["usage"]["completion_tokens"].as_u64().unwrap()).sum();
    assert_eq!(u["completion_tokens"].as_u64().unwrap(), completion);
    assert_eq!(u["total_tokens"].as_u64().unwrap(), u1["prompt_tokens"].as_u64().unwrap() + completion);
    let steps: u64 = alone.iter().map(|v| v["timings"]["macro_steps"].as_u64().unwrap()).sum();
    assert_eq!(three["timings"]["macro_steps"].as_u64().unwrap(), steps);

    for (n, status) in [(0, 400), (5, 400)] {
        let (got, v) = s.post("/v1/completions", &body(n, 7));
        assert_eq!((got, &v["error"]["param"]), (status, &json!("n")), "n = {n}: {v}");
    }
}

#[test]
fn a_list_of_prompts_answers_one_choice_per_prompt_and_n() {
    // Fixed macro steps and no end of generation: the prompts of a request
    // decode side by side from first to last, so a list of two, the same as
    // ids, and two choices of each read alike; a lone prompt reads one row a
    // forward, so it is compared up to a near-tie.
    let forced = StepParams { forced_steps: Some(2), ..Default::default() };
    let s = TestServer::start_with(4, 512, 8, None, forced, None);
    let prompts = ["The three primary colors are", "Once upon a time,"];
    let body = |prompt: Value, n: u64| {
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "n": n, "ignore_eos": true, "logprobs": 2,
               "cache_prompt": false})
    };
    let alone: Vec<Value> = prompts.iter().map(|p| s.post("/v1/completions", &body(json!(p), 1)).1).collect();

    let (status, listed) = s.post("/v1/completions", &body(json!(prompts), 1));
    assert_eq!(status, 200, "{listed}");
    assert_eq!(indices(&listed), [0, 1]);
    for (i, v) in alone.iter().enumerate() {
        common::assert_same_up_to_a_tie(&listed["choices"][i], &v["choices"][0], &format!("listed prompt {i}"));
    }
    let want = texts(&listed);
    let prompt_tokens: u64 = alone.iter().map(|v| v["usage"]["prompt_tokens"].as_u64().unwrap()).sum();
    assert_eq!(listed["usage"]["prompt_tokens"].as_u64().unwrap(), prompt_tokens);

    // lm-eval's local-completions: token id lists.
    let ids: Vec<Value> = prompts
        .iter()
        .map(|p| s.post("/tokenize", &json!({"content": p, "add_special": true})).1["tokens"].clone())
        .collect();
    let (status, by_ids) = s.post("/v1/completions", &body(json!(ids), 1));
    assert_eq!(status, 200, "{by_ids}");
    assert_eq!(texts(&by_ids), want);

    // Prompt-major: index = prompt_i * n + j (greedy: a prompt's choices agree).
    let (status, two_each) = s.post("/v1/completions", &body(json!(prompts), 2));
    assert_eq!(status, 200, "{two_each}");
    assert_eq!(indices(&two_each), [0, 1, 2, 3]);
    assert_eq!(texts(&two_each), [want[0], want[0], want[1], want[1]]);
    assert_eq!(two_each["usage"]["prompt_tokens"].as_u64().unwrap(), prompt_tokens, "each prompt counted once");

    let (status, v) = s.post("/v1/completions", &body(json!([]), 1));
    assert_eq!((status, &v["error"]["param"]), (400, &json!("prompt")), "{v}");
    // More choices than the queue of 8 holds.
    let (status, v) = s.post("/v1/completions", &body(json!(["a", "b", "c", "d", "e"]), 2));
    assert_eq!((status, &v["error"]["param"]), (400, &json!("prompt")), "{v}");
}

#[test]
fn streamed_choices_reassemble_to_the_unstreamed_answer() {
    let s = TestServer::start(2, 8, None);
    for (path, mut body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Write a short poem about the sea."}], "max_tokens": 24}),
        ),
        ("/v1/completions", json!({"prompt": "Once upon a time,", "max_tokens": 24})),
    ] {
        body["n"] = json!(2);
        body["temperature"] = json!(0.9);
        body["seed"] = json!(11);
        // Both read fresh: the same forwards over the same cells.
        body["cache_prompt"] = json!(false);
        let (status, whole) = s.post(path, &body);
        assert_eq!(status, 200, "{whole}");
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let chunks = stream(&s, path, &body);
        let mut got = [String::new(), String::new()];
        let mut finish = [Value::Null, Value::Null];
        for c in &chunks {
            for choice in c["choices"].as_array().unwrap() {
                let i = choice["index"].as_u64().unwrap() as usize;
                got[i].push_str(choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or(""));
                if !choice["finish_reason"].is_null() {
                    finish[i] = choice["finish_reason"].clone();
                }
            }
        }
        assert_eq!(got.iter().map(String::as_str).collect::<Vec<_>>(), texts(&whole), "{path}");
        assert_ne!(got[0], got[1], "{path}: the choices sampled apart");
        for i in 0..2 {
            assert_eq!(finish[i], whole["choices"][i]["finish_reason"], "{path} choice {i}");
        }
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]), "{path}: the usage chunk ends the stream");
        assert_eq!(usage["usage"], whole["usage"], "{path}");
    }
}

/// Whether `a` and `b` are the same JSON but for numbers within `1e-4`.
fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() <= 1e-4,
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn streamed_log_probabilities_concatenate_to_the_unstreamed_ones() {
    // One slot and no prompt reuse: the same tokens, and log-probabilities
    // equal but for the last bits: the two answers are computed in different
    // cells of the pool (the first one's stay cached), and attention sums
    // over cells in cell order.
    let s = TestServer::start(1, 8, None);
    let chat = json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 20,
        "temperature": 0.8, "seed": 3, "logprobs": true, "top_logprobs": 2, "stop": [","], "cache_prompt": false});
    let completion = json!({"prompt": "The three primary colors are", "max_tokens": 20, "temperature": 0.8,
        "seed": 3, "logprobs": 2, "stop": ["."], "cache_prompt": false});
    for (path, body) in [("/v1/chat/completions", chat), ("/v1/completions", completion)] {
        let (status, whole) = s.post(path, &body);
        assert_eq!(status, 200, "{whole}");
        let want = &whole["choices"][0]["logprobs"];
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let chunks = stream(&s, path, &streamed);
        let parts: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0].get("logprobs")).collect();
        let concat = |key: &str| -> Vec<Value> {
            parts.iter().filter(|p| !p.is_null()).flat_map(|p| p[key].as_array().unwrap().clone()).collect()
        };
        if path == "/v1/chat/completions" {
            let content = concat("content");
            assert!(close(&json!(content), &want["content"]), "{path}: {content:?} against {}", want["content"]);
            assert_eq!(content.len() as u64, whole["usage"]["completion_tokens"].as_u64().unwrap(), "{path}");
        } else {
            for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                let got = json!(concat(key));
                assert!(close(&got, &want[key]), "{path}: {key}: {got} against {}", want[key]);
            }
            let n = want["tokens"].as_array().unwrap().len() as u64;
            assert_eq!(n, whole["usage"]["completion_tokens"].as_u64().unwrap(), "{path}");
        }
    }
}

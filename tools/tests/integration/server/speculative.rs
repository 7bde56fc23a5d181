//! Self-verified requests (`speculative.type` "draft-mtp", llama-server's
//! `speculative.*` fields) over loopback HTTP: the answer is the one-token-
//! per-step answer, its timings say what the drafts earned, a server's
//! `--spec-type` is the default a request overrides, macro-step and
//! self-verified requests decode together, the context drafts first where
//! asked (`ngram-simple,draft-mtp`), and bad values are 400s naming the field.

use serde_json::{json, Value};

use super::served::Served;

/// A greedy completion of 24 tokens of the tiny fixture, with `extra` fields.
fn body(extra: Value) -> Value {
    let mut b = json!({"prompt": [1, 20, 31, 42, 53, 64], "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

#[test]
fn a_self_verified_answer_is_the_one_token_per_step_answer() {
    let s = Served::tiny(&["-np", "2", "-c", "512", "--confidence", "0.3"]);
    let (plain, _) = s.complete(&body(json!({"confidence": 2})));
    let (macro_steps, m) = s.complete(&body(json!({})));
    assert_eq!(m["timings"]["draft_n"], 0, "{m}");
    assert!(m["timings"]["tokens_per_step"].as_f64().unwrap() > 1.0, "confidence 0.3 merges tokens: {m}");
    let drafts = json!({"speculative.type": "draft-mtp", "speculative.n_max": 2, "speculative.n_min": 2});
    let (verified, v) = s.complete(&body(drafts.clone()));
    assert_eq!(verified, plain, "the base's own greedy answer");
    assert_ne!(macro_steps, plain, "macro steps of random modules are not the base's answer");
    let t = &v["timings"];
    assert!(t["draft_n"].as_u64().unwrap() > 0 && t["verify_forwards"].as_u64().unwrap() > 0, "{t}");
    assert!(t["accepted_per_verify"].as_f64().is_some() && t["draft_n_accepted"].as_u64().is_some(), "{t}");
    assert_eq!(t["kv_entries"].as_u64().unwrap(), 6 + 24 - 1, "one KV entry per token: {t}");
    // Both modes in the same base forwards: two requests at once.
    let both = std::thread::scope(|scope| {
        let a = scope.spawn(|| s.complete(&body(drafts.clone())).0);
        let b = scope.spawn(|| s.complete(&body(json!({}))).0);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(both, (plain.clone(), macro_steps));
    // The context drafting first (ngram-simple,draft-mtp): still the base's
    // answer, and the tiny model's answer repeats itself, so its drafts are
    // accepted where the random micro decoder's are not.
    let context = json!({"speculative.type": "ngram-simple,draft-mtp", "speculative.n_max": 2, "speculative.n_min": 2,
                         "speculative.ngram_size_n": 2});
    let (from_context, c) = s.complete(&body(context));
    assert_eq!(from_context, plain, "the base's own greedy answer");
    let accepted = |v: &Value| v["timings"]["draft_n_accepted"].as_u64().unwrap();
    assert!(accepted(&c) > accepted(&v), "{c} {v}");
}

#[test]
fn the_servers_spec_type_is_the_default_a_request_overrides() {
    let s = Served::tiny(&["-np", "1", "-c", "512", "--spec-type", "draft-mtp", "--spec-draft-n-min", "1"]);
    let (_, v) = s.complete(&body(json!({})));
    assert!(v["timings"]["draft_n"].as_u64().unwrap() > 0, "{v}");
    let (_, v) = s.complete(&body(json!({"speculative.type": "none", "confidence": 0.3})));
    assert_eq!(v["timings"]["draft_n"], 0, "{v}");
}

#[test]
fn bad_speculative_fields_are_400s_naming_them() {
    let s = Served::tiny(&["-np", "1", "-c", "512"]);
    let mtp = |extra: Value| {
        body(
            json!({"speculative.type": "draft-mtp"})
                .as_object()
                .unwrap()
                .clone()
                .into_iter()
                .chain(extra.as_object().unwrap().clone())
                .collect::<serde_json::Map<_, _>>()
                .into(),
        )
    };
    for (field, b) in [
        ("speculative.type", body(json!({"speculative.type": "ngram-mod"}))),
        ("speculative.type", body(json!({"speculative.type": "draft-simple"}))),
        ("speculative.type", body(json!({"speculative.type": "fast"}))),
        ("speculative.n_max", mtp(json!({"speculative.n_max": 4}))),
        ("speculative.n_min", mtp(json!({"speculative.n_min": 3, "speculative.n_max": 1}))),
        ("speculative.p_min", mtp(json!({"speculative.p_min": 1.5}))),
        ("speculative.ngram_size_n", mtp(json!({"speculative.ngram_size_n": 2}))),
        (
            "speculative.ngram_size_n",
            body(json!({"speculative.type": "ngram-simple,draft-mtp", "speculative.ngram_size_n": 0})),
        ),
        ("speculative.type", body(json!({"speculative.type": "ngram-simple"}))),
        ("speculative.ngram_size_n", body(json!({"speculative.ngram_size_n": 2}))),
        ("speculative.n_min", body(json!({"speculative.n_min": 1}))),
    ] {
        let (status, v) = s.post("/v1/completions", &b);
        assert_eq!(status, 400, "{b}: {v}");
        assert_eq!(v["error"]["param"], field, "{b}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field) && !message.contains('\n'), "{message}");
    }
}

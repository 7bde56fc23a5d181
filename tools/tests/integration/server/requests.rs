//! What real clients send to `hamburger-server` and what they get back, over
//! loopback HTTP against the binary: every request field honoured, refused
//! with a 400 naming it, or a documented no-op; seeds; usage chunks; finish
//! reasons and token counts at the edges; special tokens and cut characters
//! in the text; the deadline; clients that leave; keep-alives; CORS; metrics. llama-server's own flags and routes are in
//! `llama_server.rs`.

use std::io::{BufRead, BufReader};

use serde_json::{json, Value};

use super::served::{eventually, read_until, Served};

#[test]
fn every_request_field_is_honoured_refused_by_name_or_a_listed_no_op() {
    let s = Served::tiny(&["-np", "1", "-c", "512"]);
    let base = json!({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    for (field, value) in [
        // Honoured, but these do not compile: GBNF is not llguidance's grammar syntax.
        ("response_format", json!({"type": "xml"})),
        ("grammar", json!("root ::= [a")),
        ("json_schema", json!({"type": "nonsense"})),
        ("tools", json!([{"type": "function", "function": {"name": "f"}}])),
        ("tool_choice", json!("auto")),
        ("functions", json!([{"name": "f"}])),
        ("logprobs", json!(21)),
        ("top_logprobs", json!(2)),
        ("logit_bias", json!({"x": "high"})),
        ("best_of", json!(2)),
        ("suffix", json!("end")),
        ("presence_penalty", json!(2.5)),
        ("frequency_penalty", json!(-3)),
        ("repeat_penalty", json!(0)),
        ("repeat_last_n", json!(-2)),
        ("n", json!(0)),
        ("n", json!(2)),
        ("no_such_field", json!(1)),
    ] {
        let (status, v) = s.post("/v1/completions", &with(field, value));
        assert_eq!(status, 400, "{field}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    for (field, value) in [
        ("user", json!("u1")),
        ("metadata", json!({"k": "v"})),
        ("store", json!(false)),
        ("parallel_tool_calls", json!(false)),
        ("cache_prompt", json!(true)),
        ("service_tier", json!("auto")),
        ("response_format", json!({"type": "text"})),
        ("logprobs", json!(null)),
        ("echo", json!(false)),
        ("logit_bias", json!({})),
        ("presence_penalty", json!(0)),
        ("repeat_penalty", json!(1.0)),
        ("n", json!(1)),
    ] {
        let (status, v) = s.post("/v1/completions", &with(field, value));
        assert_eq!(status, 200, "{field}: {v}");
    }
    // lm-eval's local-completions sends prompts of ids in a list: one choice
    // each, as that prompt alone answers (one slot: each runs in turn).
    let (by_ids, _) = s.complete(&base);
    let (by_list, _) = s.complete(&with("prompt", json!([[1, 2, 3]])));
    assert_eq!(by_list, by_ids);
    let (other, _) = s.complete(&with("prompt", json!([3, 2, 1])));
    let (status, v) = s.post("/v1/completions", &with("prompt", json!([[1, 2, 3], [3, 2, 1]])));
    assert_eq!(status, 200, "{v}");
    assert_eq!((&v["choices"][0]["text"], &v["choices"][1]["text"]), (&json!(by_ids), &json!(other)), "{v}");
}

/// The penalties and a logit bias change a greedy answer of the tiny model (whose macro
/// steps repeat tokens), and neutral values change nothing.
#[test]
fn penalties_and_logit_bias_are_honoured() {
    let s = Served::tiny(&["-np", "1", "-c", "512", "--forced-steps", "4"]);
    let base = json!({"prompt": [1, 2, 3], "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (plain, _) = s.complete(&base);
    for (field, neutral, value) in [
        ("presence_penalty", json!(0), json!(2)),
        ("frequency_penalty", json!(0), json!(2)),
        ("repeat_penalty", json!(1), json!(3)),
    ] {
        let mut body = base.clone();
        body[field] = neutral;
        assert_eq!(s.complete(&body).0, plain, "{field} neutral");
        body[field] = value;
        assert_ne!(s.complete(&body).0, plain, "{field} honoured");
        body["repeat_last_n"] = json!(0);
        assert_eq!(s.complete(&body).0, plain, "{field} over no recent token");
    }
    // A bias of 100 makes every token, micro tokens included, the one biased.
    let mut body = base.clone();
    body["logit_bias"] = json!({"300": 100});
    let (text, v) = s.complete(&body);
    assert_eq!(v["usage"]["completion_tokens"], 24);
    let (_, want) = s.post("/detokenize", &json!({"tokens": vec![300; 24]}));
    assert_eq!(text, want["content"].as_str().unwrap());
    for bad in [json!([[300]]), json!({"99999999": 1}), json!({"300": 101})] {
        body["logit_bias"] = bad;
        let (status, v) = s.post("/v1/completions", &body);
        assert_eq!((status, &v["error"]["param"]), (400, &json!("logit_bias")), "{v}");
    }
}

/// Greedy answers with log-probabilities: one per counted token, the chosen
/// token the most likely of its alternatives, in OpenAI's chat and legacy
/// completion shapes; asking for them changes no token.
#[test]
fn log_probabilities_in_chat_and_completion_shapes() {
    let s = Served::smollm2(&["-np", "1", "-c", "512"]);
    let chat = json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 12,
        "temperature": 0});
    let (_, plain) = s.post("/v1/chat/completions", &chat);
    let mut asked = chat.clone();
    asked["logprobs"] = json!(true);
    asked["top_logprobs"] = json!(3);
    let (status, v) = s.post("/v1/chat/completions", &asked);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"], plain["choices"][0]["message"]);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    for c in content {
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{c}");
        assert_eq!((&top[0]["token"], &top[0]["logprob"]), (&c["token"], &c["logprob"]), "greedy: {c}");
        assert!(c["logprob"].as_f64().unwrap() <= 0.0 && top[1]["logprob"].as_f64() <= top[0]["logprob"].as_f64());
        assert_eq!(c["bytes"].as_array().unwrap().len(), c["token"].as_str().unwrap().len());
    }
    assert!(plain["choices"][0]["logprobs"].is_null());

    let body = json!({"prompt": "The three primary colors are", "max_tokens": 10, "temperature": 0, "logprobs": 2});
    let (text, v) = s.complete(&body);
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), 10);
    assert_eq!(tokens.concat(), text);
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).zip(&tokens).all(|(w, t)| w[1] - w[0] == t.len() as u64));
    for (i, t) in tokens.iter().enumerate() {
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(top.len() <= 2 && top.contains_key(*t), "{top:?}");
        assert_eq!(top[*t], lp["token_logprobs"][i]);
    }
    for (field, value, param) in [("logprobs", json!(21), "logprobs"), ("top_logprobs", json!(3), "top_logprobs")] {
        let mut bad = if field == "top_logprobs" { chat.clone() } else { body.clone() };
        bad[field] = value;
        let path = if field == "top_logprobs" { "/v1/chat/completions" } else { "/v1/completions" };
        let (status, v) = s.post(path, &bad);
        assert_eq!((status, &v["error"]["param"]), (400, &json!(param)), "{field}: {v}");
    }
}

#[test]
fn chat_messages_with_null_content_or_an_unknown_role_are_refused_by_name() {
    let s = Served::smollm2(&["-np", "1", "-c", "512"]);
    for (messages, param) in [
        (json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": null}]), "messages[1].content"),
        (json!([{"role": "wizard", "content": "Hi"}]), "messages[0].role"),
    ] {
        let (status, v) = s.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 2}));
        assert_eq!((status, &v["error"]["param"]), (400, &json!(param)), "{v}");
    }
}

#[test]
fn sampling_without_a_seed_varies_and_a_seed_reproduces() {
    let s = Served::tiny(&["-np", "1", "-c", "512"]);
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 24, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "min_p": 0, "ignore_eos": true});
    let (a, _) = s.complete(&body);
    let (b, _) = s.complete(&body);
    assert_ne!(a, b, "two unseeded samples");
    let mut seeded = body.clone();
    seeded["seed"] = json!(7);
    assert_eq!(s.complete(&seeded).0, s.complete(&seeded).0, "one seed, one sample");
}

#[test]
fn include_usage_ends_the_stream_with_a_usage_chunk() {
    let s = Served::tiny(&["-np", "1", "-c", "512"]);
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}});
    let payloads = s.stream("/v1/completions", &body);
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    assert_eq!(last["usage"]["completion_tokens"], 5, "{last}");
}

#[test]
fn a_deadline_answers_what_there_is_with_finish_reason_length() {
    let s = Served::tiny(&["-np", "1", "-c", "512", "--timeout", "0"]);
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": true});
    let (_, v) = s.complete(&body);
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 400, "{v}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let payloads = s.stream("/v1/completions", &streamed);
    let last: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
}

/// CORS as llama-server answers it: any origin by default, only those of
/// `--cors-origins` with it.
#[test]
fn cors_headers_for_any_origin_or_the_listed_ones() {
    for (args, origin, allowed) in [
        (&[][..], "http://example.com", true),
        (&["--cors-origins", "http://app.example"][..], "http://app.example", true),
        (&["--cors-origins", "http://app.example"][..], "http://example.com", false),
    ] {
        let s = Served::tiny(&[&["-np", "1", "-c", "512"][..], args].concat());
        let r = reqwest::blocking::Client::new()
            .request(reqwest::Method::OPTIONS, s.url("/v1/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type,authorization")
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers().contains_key("access-control-allow-origin"), allowed, "{args:?}: {:?}", r.headers());
    }
}

#[test]
fn clients_that_leave_after_the_headers_are_dropped_before_a_slot_runs_them() {
    let s = Served::smollm2(&["-np", "2", "-c", "2048"]);
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 500, "stream": true, "ignore_eos": true});
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let mut reader = BufReader::new(s.open_stream(&body));
            read_until(&mut reader, "\r\n");
            reader
        })
        .collect();
    eventually("two running, four waiting", || {
        s.metric("requests_processing") == 2.0 && s.metric("queue_depth") == 4.0
    });
    drop(clients);
    eventually("every client's leaving noticed", || s.metric("requests_cancelled_total") == 6.0);
    // The two admitted prompts' tokens, processed or adopted from the other's cells (the pool shares them).
    let admitted = s.metric("prompt_tokens_total") + s.metric("prompt_tokens_cached_total");
    assert_eq!(admitted, 6.0, "no waiting request was given a slot after its client left");
    assert_eq!(s.metric("tokens_generated_total"), 0.0, "no answer ran to its end");
    eventually("nothing running", || s.metric("requests_processing") == 0.0 && s.metric("queue_depth") == 0.0);
}

#[test]
fn an_end_of_generation_token_at_max_tokens_finishes_with_stop() {
    let s = Served::smollm2(&["-np", "1", "-c", "1024"]);
    let chat = |max_tokens: u64| {
        let body = json!({"messages": [{"role": "user", "content": "What is 2 + 3? Answer with the number only."}],
            "max_tokens": max_tokens, "temperature": 0});
        let (status, v) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        (
            v["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
            v["usage"]["completion_tokens"].as_u64().unwrap(),
        )
    };
    let (reason, n) = chat(64);
    assert_eq!(reason, "stop", "the answer ends by itself within 64 tokens");
    assert_eq!(chat(n), ("stop".to_string(), n), "its end-of-generation token is the last it may generate");
    assert_eq!(chat(n - 1), ("length".to_string(), n - 1));
}

#[test]
fn stop_strings_count_the_tokens_up_to_the_one_that_completes_them() {
    let s = Served::smollm2(&["-np", "1", "-c", "1024"]);
    let body = json!({"prompt": "The history of the Roman Empire", "max_tokens": 24, "temperature": 0});
    let (full, v) = s.complete(&body);
    let (_, ids) = s.post("/tokenize", &json!({"content": full}));
    let ids: Vec<u64> = ids["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(
        ids.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        "the text retokenizes as generated"
    );
    let prefix =
        |k: usize| s.post("/detokenize", &json!({"tokens": ids[..k]})).1["content"].as_str().unwrap().to_string();
    let mut words: Vec<&str> = full.split_whitespace().filter(|w| full.find(w).unwrap() > 0).collect();
    words.dedup();
    for word in words.into_iter().take(4) {
        let k = (1..=ids.len()).find(|&k| prefix(k).contains(word)).unwrap();
        let mut stopped = body.clone();
        stopped["stop"] = json!([word]);
        let (text, v) = s.complete(&stopped);
        assert_eq!(text, full[..full.find(word).unwrap()], "{word}");
        assert_eq!(v["usage"]["completion_tokens"], k, "'{word}' is complete after {k} tokens");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

#[test]
fn special_tokens_are_left_out_of_the_text() {
    let s = Served::smollm2(&["-np", "1", "-c", "1024"]);
    let prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n";
    let (text, v) = s.complete(&json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true}));
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert!(!text.contains("<|"), "{text:?}");
}

#[test]
fn an_answer_cut_inside_a_character_keeps_the_text_before_it() {
    let s = Served::smollm2(&["-np", "1", "-c", "1024"]);
    let body = |k: usize| {
        json!({"prompt": "English: Good morning, how are you?\nJapanese: おはようございます、お元気ですか？\nEnglish: Thank you very much.\nJapanese:",
            "max_tokens": k, "temperature": 0})
    };
    let (full, _) = s.complete(&body(16));
    assert!(full.chars().any(|c| c.len_utf8() > 1), "a multi-byte answer: {full:?}");
    let mut before = String::new();
    for k in 1..=16 {
        let (text, _) = s.complete(&body(k));
        let whole = text.trim_end_matches('\u{FFFD}');
        assert!(full.starts_with(whole) && whole.len() >= before.len(), "{k} tokens: {text:?} after {before:?}");
        // A stream never sends the incomplete character at the end (llama-server's
        // neither): its pieces make the text before it.
        let mut streamed = body(k);
        streamed["stream"] = json!(true);
        let pieces = s.stream("/v1/completions", &streamed);
        let parsed = pieces.iter().filter_map(|p| serde_json::from_str::<serde_json::Value>(p).ok());
        let joined: String = parsed.filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_string)).collect();
        assert_eq!(joined, text.strip_suffix('\u{FFFD}').unwrap_or(&text), "{k} tokens streamed: {pieces:?}");
        before = whole.to_string();
    }
    // A chat answer drops it too, as llama-server's chat answers do: a
    // token that ends inside a character adds no text.
    let chat = |k: usize| {
        let body = json!({"messages": [{"role": "user", "content": "Translate to Japanese: Thank you very much."}],
            "max_tokens": k, "temperature": 0});
        let (status, v) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    };
    let answers: Vec<String> = (1..=12).map(chat).collect();
    // (U+FFFD inside stands for bytes that are no character: this model writes some.)
    assert!(answers.iter().all(|a| answers[11].starts_with(a.as_str())), "{answers:?}");
    assert!(answers.windows(2).any(|w| w[0] == w[1]), "a token inside a character: {answers:?}");
}

#[test]
fn tokens_per_step_counts_the_steps_of_finished_answers() {
    let s = Served::smollm2(&["-np", "1", "-c", "2048"]);
    s.complete(&json!({"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}));
    let mut reader = BufReader::new(s.open_stream(
        &json!({"prompt": "Count to a thousand:", "max_tokens": 1500, "stream": true, "ignore_eos": true}),
    ));
    // Four chunks: four macro steps of an answer still running (the finished one had two tokens).
    for _ in 0..4 {
        read_until(&mut reader, "data: ");
    }
    let per_step = s.metric("tokens_per_step");
    assert!(per_step >= 1.0, "every macro step emits a token at least: {per_step}");
}

#[test]
fn a_stream_waiting_for_a_slot_gets_keep_alive_comments() {
    let s = Served::smollm2(&["-np", "1", "-c", "2048"]);
    let long = json!({"prompt": "Count to a thousand:", "max_tokens": 1500, "stream": true, "ignore_eos": true});
    let mut running = BufReader::new(s.open_stream(&long));
    read_until(&mut running, "data: ");
    let mut waiting = BufReader::new(s.open_stream(&long));
    read_until(&mut waiting, "\r\n");
    let mut line = String::new();
    while !(line.starts_with(':') || line.starts_with("data: ")) {
        line.clear();
        waiting.read_line(&mut line).unwrap();
    }
    assert_eq!(line.trim_end(), ": keep-alive", "before its first chunk");
}

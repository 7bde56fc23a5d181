//! hamburger-server over real loopback HTTP with a real client, on
//! SmolLM2-HAMburger in F32 with an F32 cache: chat and completions,
//! streaming, concurrent requests against their solo results (up to a
//! near-tie: see the harness), every error, slot release when a client
//! leaves, and the metrics.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::TestServer;
use hamburger::StepParams;
use serde_json::{json, Value};

use crate::common;

fn chat_body(text: &str, max_tokens: usize) -> Value {
    json!({"model": "x", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0})
}

/// The `data:` payloads of a Server-Sent Events body.
fn sse_payloads(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

#[test]
fn chat_and_completion_answer_in_openai_shape() {
    let s = TestServer::start(2, 8, None);
    let (status, v) = s.post("/v1/chat/completions", &chat_body("What is the capital of France?", 24));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(!v["choices"][0]["message"]["content"].as_str().unwrap().is_empty());
    let u = &v["usage"];
    assert_eq!(u["total_tokens"], u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap());
    let t = &v["timings"];
    assert!(t["macro_steps"].as_u64().unwrap() >= 1 && t["tokens_per_step"].as_f64().unwrap() >= 1.0);
    assert_eq!(
        t["kv_entries"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + t["macro_steps"].as_u64().unwrap() - 1
    );

    let (status, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "The three primary colors are", "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let (_, ids) = s.post("/tokenize", &json!({"content": "The three primary colors are", "add_special": true}));
    let (_, by_ids) = s.post("/v1/completions", &json!({"prompt": ids["tokens"], "max_tokens": 16, "temperature": 0}));
    assert_eq!(by_ids["choices"][0]["text"], v["choices"][0]["text"], "a prompt as token ids");
    let (_, text) = s.post("/detokenize", &json!({"tokens": ids["tokens"]}));
    assert!(text["content"].as_str().unwrap().ends_with("The three primary colors are"));

    let models: Value = reqwest::blocking::get(format!("{}/v1/models", s.url)).unwrap().json().unwrap();
    assert_eq!(models["data"][0]["object"], "model");
    let health: Value = reqwest::blocking::get(format!("{}/health", s.url)).unwrap().json().unwrap();
    assert_eq!(health["status"], "ok");
}

#[test]
fn streamed_chunks_concatenate_to_the_unstreamed_text() {
    let s = TestServer::start(2, 8, None);
    for (path, body) in [
        ("/v1/chat/completions", chat_body("Write a short poem about the sea.", 40)),
        ("/v1/completions", json!({"prompt": "Once upon a time,", "max_tokens": 40, "temperature": 0})),
    ] {
        let (_, whole) = s.post(path, &body);
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let r = common::client().post(format!("{}{path}", s.url)).json(&streamed).send().unwrap();
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let payloads = sse_payloads(&r.text().unwrap());
        assert_eq!(payloads.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> =
            payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().or(c["choices"][0]["text"].as_str()))
            .collect();
        let want = whole["choices"][0]["message"]["content"].as_str().or(whole["choices"][0]["text"].as_str());
        assert_eq!(Some(text.as_str()), want, "{path}");
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
        for count in ["prompt_tokens", "completion_tokens"] {
            assert_eq!(last["usage"][count], whole["usage"][count]);
        }
        // One chunk per macro step (plus the role chunk of chat and the final one).
        let steps = whole["timings"]["macro_steps"].as_u64().unwrap() as usize;
        assert!(chunks.len() <= steps + 2, "{} chunks for {steps} macro steps", chunks.len());
    }
}

#[test]
fn eight_concurrent_requests_each_equal_their_solo_result() {
    // Three tokens a macro step, so that a step's end is no near-tie of
    // the stop head's (the API does not show p_stop); tokens are compared up
    // to a near-tie, since a batch's forwards have more rows than a lone
    // request's.
    let forced = StepParams { forced_steps: Some(3), ..Default::default() };
    let prompts: Vec<String> = (0..8).map(|i| format!("Tell me fact number {i} about the Moon.")).collect();
    let body = |p: &str| {
        let mut b = chat_body(p, 32);
        b["logprobs"] = json!(true);
        b["top_logprobs"] = json!(2);
        b
    };
    let solo: Vec<Value> = {
        let s = TestServer::start_with(1, 512, 8, None, forced, None);
        prompts.iter().map(|p| s.post("/v1/chat/completions", &body(p)).1).collect()
    };
    let s = TestServer::start_with(8, 512, 8, None, forced, None);
    let together: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            prompts.iter().map(|p| scope.spawn(|| s.post("/v1/chat/completions", &body(p)).1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in together.iter().zip(&solo).enumerate() {
        if common::assert_same_up_to_a_tie(&a["choices"][0], &b["choices"][0], &format!("request {i}")) {
            assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"], "request {i}");
            assert_eq!(a["timings"]["macro_steps"], b["timings"]["macro_steps"], "request {i}");
        }
    }
    // The eight shared base forwards: far fewer forwards than macro steps.
    let steps = s.metric("macro_steps_total");
    assert!(s.metric("base_forwards_total") < steps, "base forwards were shared");
    assert_eq!(s.metric("requests_total"), 8.0);
    let generated: u64 = together.iter().map(|v| v["usage"]["completion_tokens"].as_u64().unwrap()).sum();
    assert_eq!(s.metric("tokens_generated_total"), generated as f64);
}

fn assert_error(s: &TestServer, path: &str, raw: &str, status: u16, mentions: &str) {
    let r = common::client()
        .post(format!("{}{path}", s.url))
        .header("content-type", "application/json")
        .body(raw.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), status, "{raw}");
    let v: Value = r.json().unwrap();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(mentions) || v["error"]["param"] == mentions, "{raw}: {v}");
}

#[test]
fn bad_requests_get_openai_shaped_errors() {
    let s = TestServer::start(1, 1, None);
    let chat = "/v1/chat/completions";
    assert_error(&s, chat, "{not json", 400, "invalid JSON");
    assert_error(&s, chat, r#"{"messages": "hi"}"#, 400, "messages");
    assert_error(
        &s,
        chat,
        r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}"#,
        400,
        "temperature",
    );
    assert_error(&s, chat, r#"{"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}"#, 400, "top_p");
    assert_error(&s, chat, r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#, 400, "max_tokens");
    assert_error(&s, chat, r#"{"messages": [{"role": "user", "content": "hi"}], "confidence": -1}"#, 400, "confidence");
    assert_error(&s, chat, r#"{"messages": [{"role": "user", "content": "hi"}], "max_steps": 99}"#, 400, "max_steps");
    assert_error(&s, chat, r#"{"messages": [{"role": "user", "content": "hi"}], "n": 2}"#, 400, "n");
    assert_error(&s, chat, r#"{"messages": []}"#, 400, "messages");
    assert_error(&s, "/v1/completions", r#"{"prompt": [1, 99999999]}"#, 400, "prompt");
    let long = format!(r#"{{"prompt": "{}"}}"#, "word ".repeat(600));
    assert_error(
        &s,
        "/v1/completions",
        &long,
        400,
        "exceeds the available context size: the prompt is 601 tokens and a request's context holds 512 KV cells",
    );
    let huge = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(server::http::BODY_LIMIT + 1));
    assert_error(&s, "/v1/completions", &huge, 413, "");
    let r = reqwest::blocking::get(format!("{}/v1/nothing", s.url)).unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // llama-server's answer for a model without fill-in-the-middle tokens.
    let infill = r#"{"input_prefix": "int main() {", "input_suffix": "}"}"#;
    assert_error(&s, "/infill", infill, 501, "fill-in-the-middle");
}

#[test]
fn api_key_is_required_when_set() {
    let s = TestServer::start(1, 1, Some("sesame"));
    let client = common::client();
    let body = json!({"prompt": "Hi", "max_tokens": 2});
    let url = format!("{}/v1/completions", s.url);
    assert_eq!(client.post(&url).json(&body).send().unwrap().status().as_u16(), 401);
    let wrong = client.post(&url).bearer_auth("open").json(&body).send().unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let v: Value = wrong.json().unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    assert_eq!(client.post(&url).bearer_auth("sesame").json(&body).send().unwrap().status().as_u16(), 200);
    assert_eq!(reqwest::blocking::get(format!("{}/health", s.url)).unwrap().status().as_u16(), 200);
}

/// Opens a raw streaming request (with `headers`, each ending in CRLF) and
/// reads until the first chunk arrives.
fn start_stream(url: &str, max_tokens: usize, headers: &str) -> TcpStream {
    let addr = url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).unwrap();
    let body = json!({"prompt": "Count from one to one thousand:", "max_tokens": max_tokens, "stream": true, "ignore_eos": true, "temperature": 0}).to_string();
    write!(conn, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    conn
}

/// Polls `cond` until it holds, failing after a generous deadline.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_client_that_leaves_frees_its_slot_and_a_full_queue_answers_503() {
    let s = TestServer::start(1, 1, None);
    let conn = start_stream(&s.url, 400, "");
    assert_eq!(s.metric("requests_processing"), 1.0);
    // The one slot is busy: one request may wait, the next is refused.
    let waiting = {
        let url = s.url.clone();
        std::thread::spawn(move || {
            common::client()
                .post(format!("{url}/v1/completions"))
                .json(&json!({"prompt": "Hello", "max_tokens": 4}))
                .send()
                .unwrap()
                .status()
                .as_u16()
        })
    };
    eventually("the second request queued", || s.metric("queue_depth") == 1.0);
    let (status, v) = s.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 4}));
    assert_eq!(status, 503, "{v}");
    assert_eq!(s.metric("requests_rejected_total"), 1.0);
    // The streaming client leaves: its slot frees at once and the waiting request runs.
    drop(conn);
    eventually("the slot freed", || s.metric("requests_cancelled_total") == 1.0);
    assert_eq!(waiting.join().unwrap(), 200);
    // Idle, no request holds a cell: what stays (the stream's entries and the
    // last request's) is the prefix cache's, taken back when the pool needs it.
    eventually("nothing running", || s.metric("requests_processing") == 0.0);
    assert!(s.metric("kv_cells_used") > 0.0);
    assert_eq!(s.metric("kv_cells_used"), s.metric("kv_cells_cached"));
}

#[test]
fn a_prompt_that_extends_an_earlier_one_reuses_its_cells_and_answers_the_same() {
    let s = TestServer::start(2, 8, None);
    let body = |prompt: &str, cache: bool| json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "cache_prompt": cache});
    let first = "The three primary colors are red, yellow and blue. Mixing two of them";
    let (status, a) = s.post("/v1/completions", &body(first, true));
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["timings"]["cache_n"], 0, "a fresh server holds nothing");
    let n_first = a["usage"]["prompt_tokens"].as_u64().unwrap();

    // The second prompt extends the first: its slot holds the first's entries.
    let second = format!("{first} gives a secondary color, and mixing all three");
    let (_, warm) = s.post("/v1/completions", &body(&second, true));
    let (_, cold) = s.post("/v1/completions", &body(&second, false));
    let cache_n = warm["timings"]["cache_n"].as_u64().unwrap();
    assert!(cache_n >= n_first - 1, "{cache_n} of the first prompt's {n_first} tokens reused");
    assert_eq!(cold["timings"]["cache_n"], 0, "cache_prompt false processes the whole prompt");
    assert_eq!(warm["usage"]["prompt_tokens"], cold["usage"]["prompt_tokens"], "usage counts the whole prompt");
    let n_second = warm["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(warm["timings"]["prompt_n"].as_u64().unwrap(), n_second - cache_n);
    assert_eq!(warm["choices"][0]["text"], cold["choices"][0]["text"], "greedy: the same answer");

    // A chat's second turn reuses the first turn and its answer (but the
    // merged entry that holds the answer's last step, never fed).
    let turn = |messages: &Value| json!({"messages": messages, "max_tokens": 16, "temperature": 0});
    let mut messages = json!([{"role": "user", "content": "Name a fruit that is yellow."}]);
    let (_, t1) = s.post("/v1/chat/completions", &turn(&messages));
    let n_turn1 = t1["usage"]["prompt_tokens"].as_u64().unwrap();
    messages.as_array_mut().unwrap().push(t1["choices"][0]["message"].clone());
    messages.as_array_mut().unwrap().push(json!({"role": "user", "content": "And a red one?"}));
    let (status, t2) = s.post("/v1/chat/completions", &turn(&messages));
    assert_eq!(status, 200, "{t2}");
    assert!(t2["timings"]["cache_n"].as_u64().unwrap() >= n_turn1, "{t2}");
    assert!(!t2["choices"][0]["message"]["content"].as_str().unwrap().is_empty());

    let reused = [&a, &warm, &cold, &t1, &t2].iter().map(|v| v["timings"]["cache_n"].as_u64().unwrap()).sum::<u64>();
    assert_eq!(s.metric("prompt_tokens_cached_total"), reused as f64);
}

/// KV as capacity: a slot's share of the cache bounds an answer by its
/// macro steps (one cell each), not by its tokens, so at 4 tokens a step an
/// answer runs far past the slot's cells; at one token a step it ends
/// "length" when they are full, as llama-server's slot context does.
#[test]
fn a_slot_holds_an_answer_as_long_as_its_macro_steps_fit_its_cells() {
    let s = TestServer::start_with(1, 64, 8, None, StepParams { confidence: 0.3, ..Default::default() }, None);
    let body = |max_steps: usize| {
        json!({"prompt": "Count with me:", "max_tokens": 160, "temperature": 0, "ignore_eos": true,
               "confidence": 0.0, "max_steps": max_steps})
    };
    let (status, k4) = s.post("/v1/completions", &body(4));
    assert_eq!(status, 200, "{k4}");
    assert_eq!(k4["usage"]["completion_tokens"], 160, "160 tokens in 40 macro steps fit 64 cells: {k4}");
    assert_eq!(k4["choices"][0]["finish_reason"], "length");
    assert!(k4["timings"]["kv_entries"].as_u64().unwrap() <= 64, "{}", k4["timings"]);

    let (status, k1) = s.post("/v1/completions", &body(1));
    assert_eq!(status, 200, "{k1}");
    let n_prompt = k1["usage"]["prompt_tokens"].as_u64().unwrap();
    // The prompt's cells, then one per step but one left free (llama-server's
    // rule: an answer ends when its next token would fill the context); the
    // last step's token needs none.
    assert_eq!(k1["usage"]["completion_tokens"].as_u64().unwrap(), 64 - n_prompt, "{k1}");
    assert_eq!(k1["choices"][0]["finish_reason"], "length", "cut by the full slot: {k1}");
}

#[test]
fn a_conversations_stream_outlives_its_client_replays_from_any_offset_and_stops_on_delete() {
    let s = TestServer::start(1, 4, None);
    let stream = |id: &str| format!("{}/v1/stream?conv_id={id}", s.url);
    // The client leaves after the first chunk; the generation goes on and is kept.
    drop(start_stream(&s.url, 24, "X-Conversation-Id: c1\r\n"));
    let whole = common::client().get(format!("{}&from=0", stream("c1"))).send().unwrap();
    assert_eq!(whole.headers()["content-type"], "text/event-stream");
    let whole = whole.text().unwrap();
    let payloads = sse_payloads(&whole);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let text: String = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    let (_, solo) = s.post(
        "/v1/completions",
        &json!({"prompt": "Count from one to one thousand:", "max_tokens": 24, "ignore_eos": true, "temperature": 0}),
    );
    assert_eq!(text, solo["choices"][0]["text"].as_str().unwrap(), "the kept stream is the whole answer");
    // From an offset: the rest of the bytes.
    let tail = common::client().get(format!("{}&from=10", stream("c1"))).send().unwrap().text().unwrap();
    assert_eq!(tail, whole[10..]);
    let found = common::client()
        .post(format!("{}/v1/streams/lookup", s.url))
        .json(&json!({"conversation_ids": ["c1", "c2"]}))
        .send()
        .unwrap();
    let found: Value = found.json().unwrap();
    assert_eq!((found[0]["conversation_id"].as_str(), found[0]["is_done"].as_bool()), (Some("c1"), Some(true)));
    assert_eq!(found[0]["total_bytes"].as_u64(), Some(whole.len() as u64));
    assert_eq!(found.as_array().unwrap().len(), 1);
    for (url, want) in [(format!("{}&from=x", stream("c1")), 400), (format!("{}/v1/stream?from=0", s.url), 400)] {
        assert_eq!(common::client().get(url).send().unwrap().status().as_u16(), want);
    }
    // A stop forgets it.
    assert_eq!(common::client().delete(stream("c1")).send().unwrap().status().as_u16(), 204);
    assert_eq!(common::client().get(stream("c1")).send().unwrap().status().as_u16(), 404);
    // A stop during generation cancels it and frees the slot.
    drop(start_stream(&s.url, 400, "X-Conversation-Id: c2\r\n"));
    assert_eq!(s.metric("requests_processing"), 1.0);
    assert_eq!(common::client().delete(stream("c2")).send().unwrap().status().as_u16(), 204);
    eventually("the stopped generation cancelled", || s.metric("requests_cancelled_total") == 1.0);
}

#[test]
fn vertex_ai_predictions_answer_each_instance_by_the_route_it_names() {
    let s = TestServer::start(2, 4, None);
    let chat = chat_body("Say hello", 8);
    let mut instance = chat.clone();
    instance["@requestFormat"] = json!("chatCompletions");
    instance["stream"] = json!(true);
    let body = json!({"instances": [instance, {"@requestFormat": "tokenize", "content": "hi"}, {"@requestFormat": "nope"}, 3]});
    let (status, v) = s.post("/predict", &body);
    assert_eq!(status, 200, "{v}");
    let p = &v["predictions"];
    let (_, solo) = s.post("/v1/chat/completions", &chat);
    assert_eq!(p[0]["choices"][0]["message"]["content"], solo["choices"][0]["message"]["content"], "not streamed");
    assert!(p[1]["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{v}");
    assert!(p[2]["error"]["message"].as_str().unwrap().contains("nope"), "{v}");
    assert!(p[3]["error"]["message"].as_str().unwrap().contains("JSON object"), "{v}");
    let (status, v) = s.post("/predict", &json!({"instances": "x"}));
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("instances")), "{v}");
    let health = common::client().get(format!("{}/vertex/health", s.url)).send().unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

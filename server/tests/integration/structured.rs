//! Structured output over real loopback HTTP on SmolLM2-HAMburger (random
//! grafted modules, confidence 0.3: several tokens per macro step):
//! `response_format` (json_object, json_schema), `grammar` and `json_schema`
//! are honoured for every token, the streamed text of a constrained answer
//! equals the unstreamed one, and a constraint that does not compile is a 400
//! naming its field.

use crate::common::TestServer;
use serde_json::{json, Value};

use crate::common;

fn chat(text: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 200, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("no content: {v}")).to_string()
}

/// The text of a streamed answer to `body`.
fn streamed(s: &TestServer, body: &Value) -> String {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = common::client().post(format!("{}/v1/chat/completions", s.url)).json(&body).send().unwrap();
    let text = r.text().unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|p| *p != "[DONE]")
        .filter_map(|p| {
            serde_json::from_str::<Value>(p).unwrap()["choices"][0]["delta"]["content"].as_str().map(str::to_string)
        })
        .collect()
}

#[test]
fn constrained_answers_hold_and_stream_the_same_text() {
    let s = TestServer::start(2, 4, None);
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"enum": ["France", "Germany", "Italy"]},
            "population": {"type": "integer", "minimum": 0, "maximum": 100000000}
        },
        "required": ["city", "country", "population"],
        "additionalProperties": false
    });
    let format = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "city", "strict": true, "schema": schema}}});
    let body = chat("Describe the capital of France as JSON.", format);
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let text = content(&v);
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(["France", "Germany", "Italy"].contains(&doc["country"].as_str().unwrap()), "{text}");
    assert!(doc["city"].as_str().unwrap().chars().count() <= 20, "{text}");
    assert!(doc["population"].as_u64().unwrap() <= 100_000_000, "{text}");
    assert_eq!(doc.as_object().unwrap().len(), 3, "{text}");
    assert_eq!(streamed(&s, &body), text, "streamed and unstreamed constrained answers");

    let (status, v) = s.post(
        "/v1/chat/completions",
        &chat("Any JSON object, please.", json!({"response_format": {"type": "json_object"}})),
    );
    assert_eq!(status, 200, "{v}");
    // Any object may run on past max_tokens on random modules: a finished one parses.
    let text = content(&v);
    assert!(text.starts_with('{'), "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(&text).unwrap().is_object(), "{v}");
    }

    let grammar = "start: (\"yes\" | \"no\") \", \" /[a-z]{1,12}/ \".\"";
    let (status, v) = s.post("/v1/chat/completions", &chat("Is water wet?", json!({"grammar": grammar})));
    assert_eq!(status, 200, "{v}");
    let text = content(&v);
    assert!(regex::Regex::new(r"^(yes|no), [a-z]{1,12}\.$").unwrap().is_match(&text), "{text:?}");

    let (status, v) = s.post(
        "/v1/chat/completions",
        &chat("A number.", json!({"json_schema": {"type": "integer", "minimum": 10, "maximum": 99}})),
    );
    assert_eq!(status, 200, "{v}");
    let n: u64 = content(&v).parse().unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!((10..=99).contains(&n), "{n}");
}

#[test]
fn constraints_that_do_not_compile_are_400s_naming_the_field() {
    let s = TestServer::start(1, 1, None);
    for (extra, field) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (json!({"response_format": {"type": "xml"}}), "response_format"),
        (json!({"grammar": "start: undefined_rule"}), "grammar"),
        (json!({"json_schema": {"type": "string", "pattern": "(unclosed"}}), "json_schema"),
        (json!({"grammar": "start: \"a\"", "json_schema": {}}), "json_schema"),
    ] {
        let (status, v) = s.post("/v1/chat/completions", &chat("hi", extra.clone()));
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], field, "{extra}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().contains('\n'), "{v}");
    }
}

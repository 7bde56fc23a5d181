//! Tool calling over real loopback HTTP on SmolLM2-HAMburger (random grafted
//! modules at forced k = 4: every macro step emits four tokens): with Llama
//! 3.2's chat template (llama.cpp's copy, which renders `tools` and documents
//! `{"name": ..., "parameters": {...}}`), `tool_choice` "required" or a named
//! function returns a call whose arguments validate against the tool's
//! schema; a conversation with an assistant's call and the tool's answer is
//! rendered; SmolLM2's own ChatML template renders no tools: they are offered
//! in a system message and called the same way, streamed or not.

use crate::common::TestServer;
use hamburger::StepParams;
use serde_json::{json, Value};

use crate::common;

/// Two tools of real APIs' shapes: enums, bounds, patterns, an optional field.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City name", "maxLength": 30},
                    "unit": {"enum": ["celsius", "fahrenheit"]}
                },
                "required": ["location", "unit"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {
            "name": "search_flights",
            "description": "Flights between two airports.",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                    "nonstop": {"type": "boolean"}
                },
                "required": ["origin", "destination", "passengers"],
                "additionalProperties": false
            }
        }}
    ])
}

fn llama32() -> String {
    let dir = testing::registry::llama_cpp_templates().unwrap();
    std::fs::read_to_string(dir.join("meta-llama-Llama-3.2-3B-Instruct.jinja")).unwrap()
}

fn request(messages: Value, choice: Value) -> Value {
    json!({"messages": messages, "tools": tools(), "tool_choice": choice, "max_tokens": 200, "temperature": 0})
}

fn ask(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The one call of answer `v`: its name and parsed arguments, checked
/// against the tool's schema.
fn the_call(v: &Value) -> (String, Value) {
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool_calls: {v}"));
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function", "{v}");
    assert!(calls[0]["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{v}");
    let name = calls[0]["function"]["name"].as_str().unwrap().to_string();
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {v}"));
    let tool = tools().as_array().unwrap().iter().find(|t| t["function"]["name"] == name.as_str()).cloned();
    let schema = &tool.unwrap_or_else(|| panic!("a call of no given tool: {v}"))["function"]["parameters"];
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&args).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{name}({args}) breaks its schema: {errors:?}");
    (name, args)
}

#[test]
fn required_and_named_tool_calls_follow_the_tools_schemas_at_forced_k4() {
    let step = StepParams { forced_steps: Some(4), ..Default::default() };
    let s = TestServer::start_with(1, 1024, 4, None, step, Some(llama32()));
    let prompts = ["What is the weather in Paris?", "Find me a flight from Berlin to Rome for two.", "Hello there."];
    for prompt in prompts {
        let (status, v) = s.post("/v1/chat/completions", &request(ask(prompt), json!("required")));
        assert_eq!(status, 200, "{v}");
        let (name, _) = the_call(&v);
        assert!(["get_weather", "search_flights"].contains(&name.as_str()), "{v}");
    }
    for name in ["get_weather", "search_flights"] {
        let choice = json!({"type": "function", "function": {"name": name}});
        let (status, v) = s.post("/v1/chat/completions", &request(ask(prompts[0]), choice));
        assert_eq!(status, 200, "{v}");
        assert_eq!(the_call(&v).0, name, "{v}");
    }

    // The call and the tool's answer go back into the conversation; "auto"
    // lets the model answer text or call again (then a valid call).
    let (_, v) = s.post("/v1/chat/completions", &request(ask(prompts[0]), json!("required")));
    let call = v["choices"][0]["message"]["tool_calls"][0].clone();
    let messages = json!([
        {"role": "user", "content": prompts[0]},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 18}"}
    ]);
    let (status, v) = s.post("/v1/chat/completions", &request(messages, json!("auto")));
    assert_eq!(status, 200, "{v}");
    match v["choices"][0]["finish_reason"].as_str() {
        Some("tool_calls") => drop(the_call(&v)),
        _ => {
            let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{v}"));
            assert!(!text.starts_with('{'), "text that starts a call is a call: {v}");
        }
    }

    let (status, v) = s.post("/v1/chat/completions", &request(ask("hi"), json!("none")));
    assert_eq!(status, 200, "{v}");
    assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
    // "none" makes no call, but the template still shows the tools (as llama-server's does).
    let (_, bare) = s.post("/v1/chat/completions", &json!({"messages": ask("hi"), "max_tokens": 1}));
    let prompt_tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens(&v) > prompt_tokens(&bare) + 50, "{v} against {bare}");

    for (body, field) in [
        (request(ask("hi"), json!({"type": "function", "function": {"name": "book_hotel"}})), "tool_choice"),
        (request(ask("hi"), json!("sometimes")), "tool_choice"),
        (json!({"messages": ask("hi"), "tool_choice": "required"}), "tool_choice"),
        (json!({"messages": ask("hi"), "tools": [{"type": "function", "function": {}}]}), "tools[0]"),
        (json!({"messages": ask("hi"), "tools": tools(), "grammar": "start: \"a\""}), "grammar"),
        (json!({"messages": ask("hi"), "functions": [{"name": "f"}]}), "functions"),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}),
            "messages[0].tool_calls",
        ),
    ] {
        let (status, v) = s.post("/v1/chat/completions", &body);
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some(field)), "{body}: {v}");
    }
    let (status, v) = s.post("/v1/completions", &json!({"prompt": "hi", "tools": tools()}));
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("tools")), "{v}");
}

#[test]
fn a_template_without_tools_is_offered_them_in_a_system_message_and_a_stream_ends_with_the_call() {
    let s = TestServer::start(1, 1, None);
    let body = request(ask("What is the weather in Paris?"), json!("required"));
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let (name, args) = the_call(&v);
    // Streamed: the text is held to the end, then the whole call in one chunk.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = common::client().post(format!("{}/v1/chat/completions", s.url)).json(&streamed).send().unwrap();
    let chunks: Vec<Value> = r
        .text()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0][0]["function"]["name"], name.as_str());
    assert_eq!(serde_json::from_str::<Value>(calls[0][0]["function"]["arguments"].as_str().unwrap()).unwrap(), args);
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"].as_str().is_none_or(str::is_empty)));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    // tool_choice "none" asks for no tool: the request is answered.
    let mut body = request(ask("hi"), json!("none"));
    body["max_tokens"] = json!(8);
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
}

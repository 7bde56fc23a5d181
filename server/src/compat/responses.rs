//! OpenAI's Responses API (`/v1/responses`), as llama-server serves it: a
//! body rewritten into a chat request, the chat answer into a response
//! object, or its stream of chunks into the API's events.
//!
//! What maps to what: `instructions` is a first system message; `input`
//! text is a user message, an item list is messages (`input_text` /
//! `output_text` parts are text, `input_image` an image part, refused as
//! every image is), `function_call` items an assistant's tool calls and
//! `function_call_output` items `tool` messages; function `tools` are chat
//! tools; `max_output_tokens` is `max_tokens`. `previous_response_id` is
//! refused (no response is stored). llama-server's `timings_per_token` and
//! `return_progress` carry over: `timings` on text deltas and on
//! `response.completed`, `prompt_progress` on `response.in_progress`.

use serde_json::{json, Value};

use crate::error::ApiError;

/// The ids of one response: the response's and its message's.
#[derive(Debug, Clone)]
pub struct ResponseIds {
    response: String,
    message: String,
}

impl ResponseIds {
    /// Fresh ids.
    pub fn new() -> ResponseIds {
        let id = crate::ids::unique();
        ResponseIds { response: format!("resp_{id}"), message: format!("msg_{id}") }
    }
}

impl Default for ResponseIds {
    fn default() -> Self {
        ResponseIds::new()
    }
}

/// The chat request of a Responses body.
///
/// # Errors
/// A 400 naming the field for a body that is not the API's shape.
pub fn chat_request(body: &[u8]) -> Result<Value, ApiError> {
    let body: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::field("body", format!("invalid JSON body: {e}")))?;
    let Some(obj) = body.as_object() else { return Err(ApiError::field("body", "the body must be a JSON object")) };
    if obj.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::field(
            "previous_response_id",
            "'previous_response_id' is not supported: no response is stored; send the whole conversation in 'input'",
        ));
    }
    let mut messages = Vec::new();
    if let Some(text) = obj.get("instructions").and_then(Value::as_str) {
        messages.push(json!({"role": "system", "content": text}));
    }
    match obj.get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut messages, item, i)?;
            }
        }
        _ => return Err(ApiError::field("input", "'input' is required: text or a list of items")),
    }
    let renames = [
        ("model", "model"),
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("timings_per_token", "timings_per_token"),
        ("return_progress", "return_progress"),
        ("tool_choice", "tool_choice"),
    ];
    let mut chat = super::chat_body(messages, obj, &renames);
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let functions: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = json!({"name": t["name"], "description": t["description"], "parameters": t["parameters"]});
                json!({"type": "function", "function": f})
            })
            .collect();
        chat.insert("tools".into(), functions.into());
    }
    Ok(Value::Object(chat))
}

/// Adds the chat message(s) of input item `i`: a message, a function call
/// (merged into the assistant message before it) or a function's output.
fn push_item(messages: &mut Vec<Value>, item: &Value, i: usize) -> Result<(), ApiError> {
    let field = format!("input[{i}]");
    match item["type"].as_str() {
        Some("function_call") => {
            let call = json!({"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}});
            match messages.last_mut() {
                Some(m) if m["role"] == "assistant" => {
                    let calls = m.as_object_mut().map(|o| o.entry("tool_calls").or_insert(json!([])));
                    if let Some(Value::Array(calls)) = calls {
                        calls.push(call);
                    }
                }
                _ => messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => {
            messages.push(json!({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}));
        }
        _ => {
            let role = item["role"]
                .as_str()
                .ok_or_else(|| ApiError::field(&field, format!("{field}: an item needs a 'role' or a 'type'")))?;
            let content = match &item["content"] {
                Value::String(text) => json!(text),
                Value::Array(parts) => Value::Array(parts.iter().map(|p| part(p, &field)).collect::<Result<_, _>>()?),
                _ => {
                    return Err(ApiError::field(&format!("{field}.content"), "content must be text or a list of parts"))
                }
            };
            messages.push(json!({"role": role, "content": content}));
        }
    }
    Ok(())
}

/// A content part as a chat part.
fn part(p: &Value, field: &str) -> Result<Value, ApiError> {
    match p["type"].as_str() {
        Some("input_text" | "output_text") => Ok(json!({"type": "text", "text": p["text"]})),
        Some("refusal") => Ok(json!({"type": "text", "text": p["refusal"]})),
        Some("input_image") => Ok(json!({"type": "image_url", "image_url": {"url": p["image_url"]}})),
        other => Err(ApiError::field(
            &format!("{field}.content"),
            format!("content parts of type {other:?} are not supported (input_text, output_text, input_image)"),
        )),
    }
}

/// The output items of a chat answer's message: its text as a message, its calls as function calls.
fn output(ids: &ResponseIds, text: &str, calls: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        out.push(json!({
            "type": "message", "id": ids.message, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }));
    }
    for c in calls {
        let id = c["id"].as_str().unwrap_or_default();
        out.push(json!({
            "type": "function_call", "id": format!("fc_{id}"), "call_id": id, "status": "completed",
            "name": c.pointer("/function/name"), "arguments": c.pointer("/function/arguments"),
        }));
    }
    out
}

/// The response's usage of a chat `usage`.
fn usage(u: &Value) -> Value {
    let (input, output) = (u["prompt_tokens"].as_u64().unwrap_or(0), u["completion_tokens"].as_u64().unwrap_or(0));
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "total_tokens": input + output,
        "input_tokens_details": {"cached_tokens": u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0)},
    })
}

fn response(ids: &ResponseIds, model: &Value, status: &str, output: Value) -> Value {
    let now = crate::response::now();
    json!({"id": ids.response, "object": "response", "created_at": now, "model": model, "status": status, "output": output})
}

/// The response object of a chat completion.
pub fn of_chat(ids: &ResponseIds, chat: &Value) -> Value {
    let message = &chat["choices"][0]["message"];
    let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
    let mut r = response(
        ids,
        &chat["model"],
        "completed",
        output(ids, message["content"].as_str().unwrap_or(""), &calls).into(),
    );
    r["completed_at"] = r["created_at"].clone();
    r["usage"] = usage(&chat["usage"]);
    r
}

/// Rewrites a streamed chat's chunks into the API's events.
pub struct EventStream {
    ids: ResponseIds,
    started: bool,
    text: String,
    calls: Vec<Value>,
}

impl EventStream {
    /// The events of a response of `ids`.
    pub fn new(ids: ResponseIds) -> EventStream {
        EventStream { ids, started: false, text: String::new(), calls: Vec::new() }
    }

    /// The events (type, data) of one chunk.
    pub fn events(&mut self, chunk: &str) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        let Ok(c) = serde_json::from_str::<Value>(chunk) else { return out };
        if let Some(e) = c.get("error") {
            out.push(("error", json!({"type": "error", "code": e["code"], "message": e["message"]})));
            return out;
        }
        let in_progress = || response(&self.ids, &c["model"], "in_progress", json!([]));
        if !self.started {
            self.started = true;
            out.push(("response.created", json!({"type": "response.created", "response": in_progress()})));
            out.push(("response.in_progress", json!({"type": "response.in_progress", "response": in_progress()})));
        }
        if let Some(progress) = c.get("prompt_progress") {
            let mut v = json!({"type": "response.in_progress", "response": in_progress(), "prompt_progress": progress});
            if let Some(t) = c.get("timings") {
                v["timings"] = t.clone();
            }
            out.push(("response.in_progress", v));
        }
        let delta = &c["choices"][0]["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            if self.text.is_empty() {
                let item = json!({"type": "message", "id": self.ids.message, "role": "assistant", "status": "in_progress", "content": []});
                out.push(("response.output_item.added", json!({"type": "response.output_item.added", "item": item})));
                let part = json!({"type": "output_text", "text": ""});
                out.push((
                    "response.content_part.added",
                    json!({"type": "response.content_part.added", "item_id": self.ids.message, "part": part}),
                ));
            }
            self.text.push_str(text);
            let mut v = json!({"type": "response.output_text.delta", "item_id": self.ids.message, "delta": text});
            if let Some(t) = c.get("timings") {
                v["timings"] = t.clone();
            }
            out.push(("response.output_text.delta", v));
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            self.calls.extend(calls.iter().cloned());
        }
        if c["usage"].is_object() {
            out.extend(self.finish(&c));
        }
        out
    }

    /// The closing events: each item done, then the whole response.
    fn finish(&self, c: &Value) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        let items = output(&self.ids, &self.text, &self.calls);
        if !self.text.is_empty() {
            out.push((
                "response.output_text.done",
                json!({"type": "response.output_text.done", "item_id": self.ids.message, "text": self.text}),
            ));
            out.push(("response.content_part.done", json!({"type": "response.content_part.done", "item_id": self.ids.message, "part": items[0]["content"][0]})));
        }
        for item in items.iter().filter(|i| i["type"] == "function_call" || !self.text.is_empty()) {
            out.push(("response.output_item.done", json!({"type": "response.output_item.done", "item": item})));
        }
        let mut r = response(&self.ids, &c["model"], "completed", items.into());
        r["usage"] = usage(&c["usage"]);
        let mut done = json!({"type": "response.completed", "response": r});
        if let Some(t) = c.get("timings") {
            done["timings"] = t.clone();
        }
        out.push(("response.completed", done));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_messages_calls_and_tool_answers() {
        let body = json!({
            "instructions": "Be brief.",
            "max_output_tokens": 8,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        });
        let chat = chat_request(body.to_string().as_bytes()).unwrap();
        let roles: Vec<&str> =
            chat["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(chat["messages"][2]["tool_calls"][0]["id"], "c1");
        assert_eq!((&chat["max_tokens"], &chat["tools"][0]["function"]["name"]), (&json!(8), &json!("w")));
        assert!(chat_request(br#"{"input": "x", "previous_response_id": "r"}"#).is_err());
        assert!(chat_request(br#"{"max_output_tokens": 3}"#).unwrap_err().message.contains("input"));
    }

    #[test]
    fn a_stream_adds_the_message_deltas_its_text_and_completes() {
        let mut s = EventStream::new(ResponseIds::new());
        let mut events = Vec::new();
        for c in [
            json!({"model": "m", "choices": [{"delta": {"role": "assistant", "content": null}}]}),
            json!({"model": "m", "choices": [], "prompt_progress": {"total": 4, "cache": 0, "processed": 4}}),
            json!({"model": "m", "choices": [{"delta": {"content": "Hi"}}], "timings": {"predicted_per_second": 1.0}}),
            json!({"model": "m", "choices": [{"delta": {"content": " there"}}]}),
            json!({"model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}, "timings": {}}),
        ] {
            events.extend(s.events(&c.to_string()));
        }
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            names[..4],
            ["response.created", "response.in_progress", "response.in_progress", "response.output_item.added"]
        );
        let done = &events.last().unwrap().1;
        assert_eq!(done["type"], "response.completed");
        assert_eq!(done["response"]["output"][0]["content"][0]["text"], "Hi there");
        assert_eq!(done["response"]["usage"]["total_tokens"], 6);
        assert!(events.iter().any(|e| e.0 == "response.output_text.delta" && e.1["timings"].is_object()));
    }
}

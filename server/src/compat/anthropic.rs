//! Anthropic's Messages API, as llama-server serves it: a `/v1/messages`
//! body rewritten into an OpenAI chat request (the same checks, template,
//! tools and sampling), and the chat answer rewritten into Anthropic's
//! message, or its stream of chunks into Anthropic's events.
//!
//! What maps to what: `system` (text or text blocks) is the first message;
//! `text` blocks are text, `image` blocks image parts (refused, as every
//! image is), `tool_use` blocks an assistant's tool calls, `thinking` blocks
//! its `reasoning_content`, and `tool_result` blocks `tool` messages after
//! the user's text; `tools` (`input_schema`) are functions, `tool_choice`
//! `auto`/`any`/`tool`/`none` are `auto`/`required`/a named function/`none`;
//! `stop_sequences` is `stop`; `metadata` and `thinking` are taken and
//! ignored. An answer's `finish_reason` `stop`/`length`/`tool_calls` is
//! `end_turn`/`max_tokens`/`tool_use`.

use serde_json::{json, Value};

use crate::error::ApiError;

/// The OpenAI chat request of Anthropic's `body` (streamed answers always
/// carry their usage: Anthropic's last events need it).
///
/// # Errors
/// A 400 naming the field for a body that is not Anthropic's shape.
pub fn chat_request(body: &[u8]) -> Result<Value, ApiError> {
    let body: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::field("body", format!("invalid JSON body: {e}")))?;
    let Some(obj) = body.as_object() else { return Err(ApiError::field("body", "the body must be a JSON object")) };
    let Some(messages) = obj.get("messages").and_then(Value::as_array) else {
        return Err(ApiError::field("messages", "'messages' is required: a list of messages"));
    };
    let mut out = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => out.push(json!({"role": "system", "content": text_of(system, "system")?})),
    }
    for (i, m) in messages.iter().enumerate() {
        out.extend(messages_of(m, i)?);
    }
    if out.iter().all(|m| m["role"] == "system") {
        // llama-server answers an empty conversation; an empty user turn stands for it.
        out.push(json!({"role": "user", "content": ""}));
    }
    let renames = [
        ("model", "model"),
        ("max_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop_sequences", "stop"),
        ("stream", "stream"),
    ];
    let mut chat = super::chat_body(out, obj, &renames);
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let functions: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut f =
                    json!({"name": t["name"], "parameters": t.get("input_schema").cloned().unwrap_or(json!({}))});
                if let Some(d) = t.get("description") {
                    f["description"] = d.clone();
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        chat.insert("tools".into(), functions.into());
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let openai = match choice["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice["name"]}}),
            _ => return Err(ApiError::field("tool_choice", "'tool_choice.type' must be auto, any, tool or none")),
        };
        chat.insert("tool_choice".into(), openai);
    }
    Ok(Value::Object(chat))
}

/// Text, or text blocks joined (a system prompt, a tool's result).
fn text_of(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => Ok(blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n")),
        _ => Err(ApiError::field(field, format!("'{field}' must be text or a list of text blocks"))),
    }
}

/// An image block as an OpenAI image part (the checks refuse it like any image).
fn image_part(block: &Value) -> Value {
    let src = &block["source"];
    let url = match src["type"].as_str() {
        Some("base64") => {
            format!("data:{};base64,{}", src["media_type"].as_str().unwrap_or(""), src["data"].as_str().unwrap_or(""))
        }
        _ => src["url"].as_str().unwrap_or_default().to_string(),
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// The OpenAI messages of Anthropic's message `i`: one, or for a user's
/// tool results, its text first and then one `tool` message per result.
fn messages_of(m: &Value, i: usize) -> Result<Vec<Value>, ApiError> {
    let field = format!("messages[{i}]");
    let role = m["role"].as_str().ok_or_else(|| ApiError::field(&field, format!("{field}.role is required")))?;
    let blocks = match &m["content"] {
        Value::String(text) => return Ok(vec![json!({"role": role, "content": text})]),
        Value::Array(blocks) => blocks,
        _ => return Err(ApiError::field(&format!("{field}.content"), "content must be text or a list of blocks")),
    };
    let (mut parts, mut calls, mut tools, mut thinking) = (Vec::new(), Vec::new(), Vec::new(), String::new());
    for b in blocks {
        match b["type"].as_str().unwrap_or_default() {
            "text" => parts.push(json!({"type": "text", "text": b["text"]})),
            "image" => parts.push(image_part(b)),
            "thinking" => thinking.push_str(b["thinking"].as_str().unwrap_or_default()),
            "redacted_thinking" => {}
            "tool_use" => calls.push(json!({
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": b.get("input").unwrap_or(&json!({})).to_string()},
            })),
            "tool_result" => {
                let content = match &b["content"] {
                    Value::Array(inner) => {
                        let inner: Vec<Value> = inner
                            .iter()
                            .map(|p| {
                                if p["type"] == "image" {
                                    image_part(p)
                                } else {
                                    json!({"type": "text", "text": p["text"]})
                                }
                            })
                            .collect();
                        Value::Array(inner)
                    }
                    Value::Null => json!(""),
                    other => other.clone(),
                };
                tools.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"], "content": content}));
            }
            other => {
                return Err(ApiError::field(
                    &format!("{field}.content"),
                    format!("unknown content block type '{other}'"),
                ))
            }
        }
    }
    let mut out = Vec::new();
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": parts});
        if parts_empty(&msg) {
            msg["content"] = if calls.is_empty() { json!("") } else { Value::Null };
        }
        if !calls.is_empty() {
            msg["tool_calls"] = calls.into();
        }
        if !thinking.is_empty() {
            msg["reasoning_content"] = thinking.into();
        }
        out.push(msg);
    } else {
        if !parts.is_empty() || tools.is_empty() {
            out.push(json!({"role": role, "content": parts}));
        }
        out.extend(tools);
    }
    Ok(out)
}

fn parts_empty(msg: &Value) -> bool {
    msg["content"].as_array().is_some_and(Vec::is_empty)
}

/// Anthropic's `stop_reason` of an OpenAI `finish_reason`.
fn stop_reason(finish: &Value) -> &'static str {
    match finish.as_str() {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        _ => "end_turn",
    }
}

/// Anthropic's usage of an OpenAI `usage`: the prompt's tokens read from
/// the cache apart from the others, which alone are `input_tokens`
/// (Anthropic's split, and llama-server's).
fn usage(u: &Value) -> Value {
    let cached = u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
    json!({
        "input_tokens": u["prompt_tokens"].as_u64().unwrap_or(0).saturating_sub(cached),
        "output_tokens": u["completion_tokens"].as_u64().unwrap_or(0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

/// A tool call's `tool_use` block (its arguments parsed; text that is not a
/// JSON object is kept under `input.arguments`).
fn tool_use(call: &Value) -> Value {
    let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
    let input = serde_json::from_str::<Value>(args).ok().filter(Value::is_object).unwrap_or(json!({"arguments": args}));
    json!({"type": "tool_use", "id": call["id"], "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null), "input": input})
}

/// Anthropic's message of an OpenAI chat completion (`timings` left out, as llama-server does).
pub fn message(chat: &Value) -> Value {
    let choice = &chat["choices"][0];
    let text = choice.pointer("/message/content").and_then(Value::as_str).unwrap_or_default();
    let calls = choice.pointer("/message/tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut content = Vec::new();
    if let Some(thinking) = choice.pointer("/message/reasoning_content").and_then(Value::as_str) {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() || calls.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    content.extend(calls.iter().map(tool_use));
    json!({
        "id": message_id(chat),
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": stop_reason(&choice["finish_reason"]),
        "stop_sequence": null,
        "usage": usage(&chat["usage"]),
    })
}

fn message_id(chat: &Value) -> String {
    let id = chat["id"].as_str().unwrap_or_default();
    format!("msg_{}", id.strip_prefix("chatcmpl-").unwrap_or(id))
}

/// Rewrites a streamed chat's chunks into Anthropic's events: `message_start`,
/// for each block (text, then each tool call) `content_block_start`, its
/// deltas and `content_block_stop`, then `message_delta` (the stop reason and
/// usage) and `message_stop`.
pub struct EventStream {
    input_tokens: usize,
    started: bool,
    /// The open block: its index, and the tool call's index for a tool block.
    open: Option<(usize, Option<u64>)>,
    next_index: usize,
    stop_reason: Option<&'static str>,
}

impl EventStream {
    /// A stream whose prompt had `input_tokens` tokens.
    pub fn new(input_tokens: usize) -> EventStream {
        EventStream { input_tokens, started: false, open: None, next_index: 0, stop_reason: None }
    }

    /// The events (type, data) of one chunk (`[DONE]` ends the stream).
    pub fn events(&mut self, chunk: &str) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if chunk == "[DONE]" {
            return out;
        }
        let Ok(c) = serde_json::from_str::<Value>(chunk) else { return out };
        if let Some(e) = c.get("error") {
            out.push(("error", json!({"type": "error", "error": {"type": e["type"], "message": e["message"]}})));
            return out;
        }
        if !self.started {
            self.started = true;
            let message = json!({
                "id": message_id(&c), "type": "message", "role": "assistant", "model": c["model"], "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
            });
            out.push(("message_start", json!({"type": "message_start", "message": message})));
        }
        let choice = &c["choices"][0];
        if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let index = self.open_block(None, &mut out, || json!({"type": "text", "text": ""}));
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
            ));
        }
        for call in choice.pointer("/delta/tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let which = call["index"].as_u64().unwrap_or(0);
            let block =
                || json!({"type": "tool_use", "id": call["id"], "name": call.pointer("/function/name"), "input": {}});
            let index = self.open_block(Some(which), &mut out, block);
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str).filter(|a| !a.is_empty()) {
                out.push(("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": args}})));
            }
        }
        if !choice["finish_reason"].is_null() && choice.is_object() {
            self.stop_reason = Some(stop_reason(&choice["finish_reason"]));
        }
        if c["usage"].is_object() {
            self.close_block(&mut out);
            let delta = json!({"stop_reason": self.stop_reason.unwrap_or("end_turn"), "stop_sequence": null});
            let output_tokens = c["usage"]["completion_tokens"].as_u64().unwrap_or(0);
            out.push((
                "message_delta",
                json!({"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}}),
            ));
            out.push(("message_stop", json!({"type": "message_stop"})));
        }
        out
    }

    /// The index of the block for `tool` (None: text), opening it (and
    /// closing the one before) unless it is the open one.
    fn open_block(
        &mut self,
        tool: Option<u64>,
        out: &mut Vec<(&'static str, Value)>,
        block: impl FnOnce() -> Value,
    ) -> usize {
        if let Some((index, open)) = self.open {
            if open == tool {
                return index;
            }
        }
        self.close_block(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, tool));
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block()}),
        ));
        index
    }

    fn close_block(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if let Some((index, _)) = self.open.take() {
            out.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_follow_the_users_text_and_tool_uses_are_calls() {
        let body = json!({
            "system": [{"type": "text", "text": "Be brief."}],
            "max_tokens": 10,
            "stop_sequences": ["END"],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "look"}, {"type": "tool_use", "id": "t1", "name": "w", "input": {"at": "Paris"}}]},
                {"role": "user", "content": [{"type": "text", "text": "Here:"}, {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}]},
            ],
        });
        let chat = chat_request(body.to_string().as_bytes()).unwrap();
        let roles: Vec<&str> =
            chat["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "tool"]);
        assert_eq!(chat["messages"][2]["tool_calls"][0]["function"]["arguments"], r#"{"at":"Paris"}"#);
        assert_eq!(chat["messages"][2]["reasoning_content"], "look");
        assert_eq!(chat["messages"][4]["tool_call_id"], "t1");
        assert_eq!((&chat["stop"], &chat["tool_choice"]), (&json!(["END"]), &json!("required")));
        assert_eq!(chat["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        assert!(chat_request(br#"{"max_tokens": 5}"#).unwrap_err().message.contains("messages"));
    }

    #[test]
    fn a_stream_opens_and_closes_each_block_in_order() {
        let mut s = EventStream::new(7);
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "chatcmpl-x", "model": "m", "choices": [{"delta": delta, "finish_reason": finish}]})
                .to_string()
        };
        let mut types = Vec::new();
        for c in [
            chunk(json!({"role": "assistant", "content": null}), Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
            json!({"id": "chatcmpl-x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
                .to_string(),
            "[DONE]".to_string(),
        ] {
            types.extend(
                s.events(&c)
                    .into_iter()
                    .map(|(t, v)| (t, v["index"].as_u64(), v.pointer("/delta/stop_reason").cloned())),
            );
        }
        let names: Vec<&str> = types.iter().map(|t| t.0).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(types[4].1, Some(1), "the tool block is the second");
        assert_eq!(types[7].2, Some(json!("tool_use")));
    }
}

//! Other APIs served over the chat pipeline, as llama-server serves them:
//! each rewrites its body into an OpenAI chat request (then checked,
//! rendered and generated as a chat) and the chat answer, or its stream of
//! chunks, into its own shapes.
//!
//! * [`anthropic`]: Anthropic's Messages API (`/v1/messages`);
//! * [`responses`]: OpenAI's Responses API (`/v1/responses`);
//! * here: the chat body both build.

pub mod anthropic;
pub mod responses;

use serde_json::{json, Map, Value};

/// A chat request body of `messages` and the fields of `body` that `renames`
/// lists (`(theirs, chat's)`, nulls left out); a streamed one carries its
/// usage, which the other API's last events need.
fn chat_body(messages: Vec<Value>, body: &Map<String, Value>, renames: &[(&str, &str)]) -> Map<String, Value> {
    let mut chat = Map::new();
    chat.insert("messages".into(), messages.into());
    for (from, to) in renames {
        if let Some(v) = body.get(*from).filter(|v| !v.is_null()) {
            chat.insert((*to).into(), v.clone());
        }
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    chat
}

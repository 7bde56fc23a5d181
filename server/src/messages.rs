//! Chat messages in OpenAI's shapes (text or text parts, the `developer`
//! role, assistants' tool calls, `tool` answers), checked into the messages
//! a chat template renders, each error naming the message's field.

use hamburger::chat::Message;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{status, ApiError};

/// A message's content: text, or parts of which the text ones count.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (other types are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`...
    pub role: String,
    /// Its content (null only beside an assistant's `tool_calls`).
    pub content: Option<Content>,
    /// An assistant's tool calls (OpenAI's shape, the arguments a JSON string).
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name.
    pub name: Option<String>,
    /// An assistant's reasoning (rendered by templates of thinking models).
    pub reasoning_content: Option<String>,
}

/// The roles a chat template knows.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The chat messages as the template wants them, a message's text parts
/// joined as llama-server joins them.
///
/// # Errors
/// A 400 for no message, an unknown role, a null content (but beside an
/// assistant's tool calls), a non-text content part, or tool calls that are
/// not OpenAI's shape, naming the message's field; a 500 for an image, as
/// llama-server answers one without a multimodal projector.
pub fn chat_messages(messages: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::field("messages", "'messages' must hold at least one message"));
    }
    // A final assistant message is the start of the answer (a prefill); two
    // in a row at the end leave no turn to continue (llama-server refuses them too).
    if let [.., a, b] = messages {
        if a.role == "assistant" && b.role == "assistant" {
            return Err(ApiError::field(
                &format!("messages[{}]", messages.len() - 1),
                "the conversation ends with two assistant messages: merge them, or end with one (a prefill)",
            ));
        }
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::field(
                    &format!("messages[{i}].role"),
                    format!("unknown role '{}' (one of {})", m.role, ROLES.join(", ")),
                ));
            }
            let content = match &m.content {
                None if m.role == "assistant" && m.tool_calls.is_some() => String::new(),
                None => {
                    return Err(ApiError::field(
                        &format!("messages[{i}].content"),
                        format!("messages[{i}].content must be text or text parts, not null"),
                    ))
                }
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => parts
                    .iter()
                    .map(|p| match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => Ok(t.as_str()),
                        // llama-server's answer to an image for a text model: a 500, in its words.
                        ("image_url" | "input_image", _) => Err(ApiError {
                            param: Some(format!("messages[{i}].content")),
                            ..ApiError::new(
                                status::INTERNAL,
                                "image input is not supported: this server runs text models (no multimodal projector)",
                            )
                        }),
                        _ => Err(ApiError::field(
                            &format!("messages[{i}].content"),
                            format!("content parts of type '{}' are not supported (text only)", p.kind),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    // As llama-server joins a message's text parts: with a
                    // newline, but a final assistant message's (the start
                    // of the answer) with two.
                    .join(if i + 1 == messages.len() && m.role == "assistant" { "\n\n" } else { "\n" }),
            };
            // OpenAI's newer name of the system role, which templates do not know.
            let role = if m.role == "developer" { "system" } else { m.role.as_str() };
            let tool_calls = m.tool_calls.as_deref().map(|c| template_calls(i, c)).transpose()?;
            Ok(Message {
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                reasoning_content: m.reasoning_content.clone(),
                ..Message::new(role, &content)
            })
        })
        .collect()
}

/// An assistant message's `tool_calls` as templates take them: each
/// `{id, type, function: {name, arguments}}` with the arguments (a JSON
/// string in OpenAI's shape) parsed into an object, as llama-server gives them.
///
/// # Errors
/// A 400 naming `messages[i].tool_calls` for a call without a function name
/// or whose arguments are not JSON.
fn template_calls(i: usize, calls: &[Value]) -> Result<Vec<Value>, ApiError> {
    let field = format!("messages[{i}].tool_calls");
    calls
        .iter()
        .map(|c| {
            let bad = |why: &str| ApiError::field(&field, format!("{field}: {why}"));
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a call needs 'function.name'"))?;
            let args = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).map_err(|e| bad(&format!("'arguments' is not JSON: {e}")))?
                }
                Some(v @ Value::Object(_)) => v.clone(),
                None | Some(Value::Null) => json!({}),
                Some(_) => return Err(bad("'arguments' must be a JSON string")),
            };
            Ok(json!({"id": c["id"], "type": "function", "function": {"name": name, "arguments": args}}))
        })
        .collect()
}

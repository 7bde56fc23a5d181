//! A chat request rendered to its prompt text with the model's chat
//! template, as llama-server renders it: the template's variables
//! (`enable_thinking` from `--reasoning`, `functions`, the tools as JSON
//! text, today's `date_string` and `datetime`, the request's
//! `chat_template_kwargs`), `add_generation_prompt`, and a final assistant
//! message continued (a prefill: the turns before it rendered with the
//! assistant's turn opened, then its text).

use hamburger::chat::Message;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::job::ModelInfo;
use crate::protocol::ChatRequest;

/// A chat rendered: the prompt text, and the final assistant message it
/// continues (its last part), which llama-server's answer starts with.
pub struct Rendered {
    /// The prompt, the prefill included.
    pub text: String,
    /// The final assistant message's text, when the prompt continues it.
    pub prefill: Option<String>,
}

/// The prompt text of `req` (its `tools` as the template takes them, and
/// `tool_prompt`, the tools offered in text, added to its system message).
///
/// # Errors
/// A 400 naming the field: a model without a chat template, bad messages,
/// `add_generation_prompt` with `continue_final_message`, a template that fails.
pub fn render(
    info: &ModelInfo,
    req: &ChatRequest,
    tools: &[Value],
    tool_prompt: Option<&str>,
) -> Result<Rendered, ApiError> {
    let mut messages = crate::messages::chat_messages(&req.messages)?;
    if let Some(text) = tool_prompt {
        match messages.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
            _ => messages.insert(0, Message::new("system", text)),
        }
    }
    let template = info
        .chat_template
        .as_ref()
        .ok_or_else(|| ApiError::field("messages", "the model has no chat template: use /v1/completions"))?;
    if req.add_generation_prompt == Some(true) && req.continue_final_message == Some(true) {
        return Err(ApiError::field(
            "continue_final_message",
            "'add_generation_prompt' and 'continue_final_message' exclude each other: continue the last message, or open a new turn",
        ));
    }
    // A final assistant message is continued unless the request opens a new turn after it.
    let prefill = match messages.last() {
        Some(m)
            if m.role == "assistant"
                && m.tool_calls.is_none()
                && req.add_generation_prompt != Some(true)
                && messages.len() > 1 =>
        {
            messages.pop().map(|m| m.content)
        }
        _ => None,
    };
    let add_generation_prompt = prefill.is_some() || req.add_generation_prompt.unwrap_or(true);
    let mut kwargs: Map<String, Value> = info.defaults.template_kwargs.clone();
    // llama.cpp's `functions`: the tools as indented JSON text (FireFunction's templates print it).
    let functions =
        if tools.is_empty() { String::new() } else { serde_json::to_string_pretty(tools).unwrap_or_default() };
    kwargs.insert("functions".into(), Value::String(functions));
    // llama.cpp's dates: Llama 3.x's `date_string`, FireFunction's `datetime`
    // (today's, or SOURCE_DATE_EPOCH's: `hamburger::chat::template_now`).
    for (key, format) in [("date_string", "%d %b %Y"), ("datetime", "%b %d %Y")] {
        let date = hamburger::chat::template_date(format).map_err(|e| ApiError::field("messages", e.to_string()))?;
        kwargs.insert(key.into(), Value::String(date));
    }
    kwargs.extend(req.chat_template_kwargs.clone().unwrap_or_default());
    let text = template
        .render_with_kwargs(&messages, tools, add_generation_prompt, &kwargs)
        .map_err(|e| ApiError::field("messages", e.to_string()))?;
    Ok(Rendered { text: text + prefill.as_deref().unwrap_or(""), prefill })
}

//! Anthropic's Messages API routes (`POST /v1/messages`,
//! `/v1/messages/count_tokens`), over the chat pipeline: the body rewritten
//! by [`crate::compat::anthropic`], then checked, rendered and generated as a chat.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::state::{body, AppState};
use super::{chat_of, queue, rewritten_stream, Queued};
use crate::compat::anthropic::{self, EventStream};
use crate::error::ApiError;
use crate::response::Kind;

/// The routes of this module.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/v1/messages", post(messages)).route("/v1/messages/count_tokens", post(count_tokens))
}

/// `POST /v1/messages`: Anthropic's message, or its events streamed.
async fn messages(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (common, tools, prompt) = chat_of(&s, anthropic::chat_request(&body(b)?)?.to_string().as_bytes()).await?;
    let input_tokens = prompt.ids.len();
    let Queued { answer, choices } = queue(&s, Kind::Chat, vec![prompt], &common, tools, None).await?;
    if !common.stream() {
        return Ok(Json(anthropic::message(&answer.collect(choices).await?)).into_response());
    }
    let mut events = EventStream::new(input_tokens);
    Ok(rewritten_stream(answer.stream(choices, true), move |chunk| events.events(chunk)))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the prompt's tokens.
async fn count_tokens(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let (_, _, prompt) = chat_of(&s, anthropic::chat_request(&body(b)?)?.to_string().as_bytes()).await?;
    Ok(Json(json!({"input_tokens": prompt.ids.len()})))
}

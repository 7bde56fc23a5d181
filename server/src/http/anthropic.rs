//! Anthropic's Messages API routes (`POST /v1/messages`,
//! `/v1/messages/count_tokens`), over the chat pipeline: the body rewritten
//! by [`crate::anthropic`], then checked, rendered and generated as a chat.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::state::{body, AppState};
use super::{chat_prompt, queue, Queued, KEEP_ALIVE};
use crate::anthropic::{self, EventStream};
use crate::error::ApiError;
use crate::plan::Prompted;
use crate::protocol::{self, ChatRequest, Common};
use crate::response::Kind;
use crate::tools::ToolRequest;

/// The routes of this module.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/v1/messages", post(messages)).route("/v1/messages/count_tokens", post(count_tokens))
}

/// The chat request of an Anthropic body, its settings, tools and prompt.
async fn chat_of(
    s: &AppState,
    b: Result<Bytes, BytesRejection>,
) -> Result<(Common, Option<ToolRequest>, Vec<u32>), ApiError> {
    let chat = anthropic::chat_request(&body(b)?)?;
    let (req, common) = protocol::parse_request::<ChatRequest>(chat.to_string().as_bytes())?;
    let tools = ToolRequest::of_request(req.tools.as_deref(), req.tool_choice.as_ref(), s.tool_format, &common)?;
    let prompt = chat_prompt(s, &req, tools.as_ref()).await?;
    Ok((common, tools, prompt))
}

/// `POST /v1/messages`: Anthropic's message, or its events streamed.
async fn messages(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (common, tools, prompt) = chat_of(&s, b).await?;
    let input_tokens = prompt.len();
    let Queued { answer, choices } =
        queue(&s, Kind::Chat, vec![Prompted { ids: prompt, echo: None }], &common, tools, None).await?;
    if !common.stream() {
        return Ok(Json(anthropic::message(&answer.collect(choices).await?)).into_response());
    }
    // A task rewrites each chunk into its events; dropping the chunks (the
    // client left) cancels the generation.
    let mut chunks = answer.stream(choices, true);
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut events = EventStream::new(input_tokens);
        while let Some(chunk) = chunks.recv().await {
            for (kind, data) in events.events(&chunk) {
                if tx.send(SseEvent::default().event(kind).data(data.to_string())).await.is_err() {
                    return;
                }
            }
        }
    });
    let sse = ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    Ok(Sse::new(sse).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response())
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the prompt's tokens.
async fn count_tokens(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let (_, _, prompt) = chat_of(&s, b).await?;
    Ok(Json(json!({"input_tokens": prompt.len()})))
}

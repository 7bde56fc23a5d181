//! OpenAI's Responses API route (`POST /v1/responses`, also `/responses`),
//! over the chat pipeline: the body rewritten by [`crate::compat::responses`], then
//! checked, rendered and generated as a chat.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use super::state::{body, AppState};
use super::{chat_of, queue, rewritten_stream, Queued};
use crate::compat::responses::{self, EventStream, ResponseIds};
use crate::error::ApiError;
use crate::response::Kind;

/// The routes of this module.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/v1/responses", post(create)).route("/responses", post(create))
}

/// `POST /v1/responses`: the response object, or its events streamed.
async fn create(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (common, tools, prompt) = chat_of(&s, responses::chat_request(&body(b)?)?.to_string().as_bytes()).await?;
    let Queued { answer, choices } = queue(&s, Kind::Chat, vec![prompt], &common, tools, None).await?;
    let ids = ResponseIds::new();
    if !common.stream() {
        return Ok(Json(responses::of_chat(&ids, &answer.collect(choices).await?)).into_response());
    }
    let mut events = EventStream::new(ids);
    Ok(rewritten_stream(answer.stream(choices, true), move |chunk| events.events(chunk)))
}

//! What every handler shares, and the small pieces each needs: the body
//! (413 over the limit), CPU work off the async workers, and an
//! [`ApiError`] as a response.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hamburger::chat::CallFormat;
use tokio::sync::watch;

use crate::error::{status, ApiError};
use crate::job::ModelInfo;
use crate::metrics::Metrics;
use crate::scheduler::slot_board::SlotBoard;
use crate::scheduler::Submitter;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Queues jobs for the engine thread.
    pub submitter: Submitter,
    /// The model.
    pub info: Arc<ModelInfo>,
    /// How the chat template's model calls tools (None: it renders no tools),
    /// probed once at start-up.
    pub tool_format: Option<CallFormat>,
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// The key clients must send as `Authorization: Bearer KEY`, if any.
    pub api_key: Option<String>,
    /// Longest a generation may take, waiting for a slot included; then it
    /// answers what it has with `finish_reason: "length"`.
    pub timeout: Duration,
    /// Which origins' browsers may call the API (CORS).
    pub cors: super::Cors,
    /// Whether `/slots` is served (llama-server's `--slots`, the default).
    pub slots_endpoint: bool,
    /// Whether `/metrics` is served (llama-server's `--metrics`).
    pub metrics_endpoint: bool,
    /// The model's names (`--alias a,b`), sorted: the first is its id.
    pub aliases: Vec<String>,
    /// Its tags (`--tags`).
    pub tags: Vec<String>,
    /// The model file's path (`/props`).
    pub model_path: String,
    /// The slots (`/props`).
    pub total_slots: usize,
    /// What each slot is doing (`/slots`).
    pub slots: Arc<SlotBoard>,
    /// True while the engine thread runs.
    pub alive: watch::Receiver<bool>,
    /// Whether the chat page is served at `/`.
    pub webui: bool,
    /// The resumable streams, by conversation id.
    pub streams: Arc<super::StreamSessions>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, Json(self.body())).into_response()
    }
}

/// The body, or the error (413 over the limit) in OpenAI's shape.
pub(super) fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|r| ApiError::new(r.status().as_u16(), r.body_text()))
}

/// Runs `f` (a template, the tokenizer, a grammar: CPU work) on tokio's
/// blocking pool, so the async workers keep serving other connections meanwhile.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ApiError::new(status::INTERNAL, format!("the request's task failed: {e}"))))
}

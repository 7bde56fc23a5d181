//! llama-server's own operations routes, for its clients and dashboards:
//! `/props` (the server's settings), `/apply-template` (a chat rendered to
//! its prompt), `/slots` (what each slot is doing), and an answer that names
//! what to use instead of `/completion` (llama-server's native completion).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::state::{blocking, body, AppState};
use crate::error::{status, ApiError};
use crate::protocol::{self, ChatRequest};
use crate::scheduler::slot_board::SlotState;

/// The routes of this module, merged into the server's router.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/props", get(props))
        .route("/apply-template", post(apply_template))
        .route("/completion", post(native_completion))
        .route("/completions", post(native_completion))
        .route("/slots", get(slots))
}

/// llama-server's `/props`: the settings a request that sets nothing gets,
/// the slots, the model's path and chat template, the context of a slot.
async fn props(State(s): State<AppState>) -> Json<Value> {
    let info = &s.info;
    let n_predict = info.n_predict.map_or(-1, |n| n as i64);
    Json(json!({
        "default_generation_settings": {
            "n_ctx": info.n_ctx,
            "params": {
                "n_predict": n_predict,
                "temperature": hamburger::SamplerParams::default().temp.to_string().parse::<f64>().unwrap_or_default(),
                // As the flag was written (0.8, not f32's 0.800000011920929).
                "confidence": info.step.confidence.to_string().parse::<f64>().unwrap_or_default(),
                "max_steps": if info.step.max_steps == 0 { info.max_steps } else { info.step.max_steps },
            },
        },
        "total_slots": s.total_slots,
        "model_alias": info.name,
        "model_path": s.model_path,
        "chat_template": info.chat_template.as_ref().map_or("", |t| t.source()),
        "n_ctx": info.n_ctx,
        "n_vocab": info.n_vocab,
    }))
}

/// llama-server's `/apply-template`: `messages` rendered with the model's
/// chat template (the assistant's turn opened), as `{"prompt": text}`.
async fn apply_template(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: ChatRequest = protocol::parse(&body(b)?)?;
    let messages = crate::messages::chat_messages(&req.messages)?;
    let info = s.info.clone();
    let prompt = blocking(move || {
        let template =
            info.chat_template.as_ref().ok_or_else(|| ApiError::field("messages", "the model has no chat template"))?;
        template.render(&messages, true).map_err(|e| ApiError::field("messages", e.to_string()))
    })
    .await?;
    Ok(Json(json!({"prompt": prompt})))
}

/// llama-server's native completion is not served: a 404 naming the
/// OpenAI route that does the same.
async fn native_completion() -> ApiError {
    ApiError::new(
        status::NOT_FOUND,
        "llama-server's native /completion is not served: use /v1/completions (prompt, max_tokens, stream, ...)",
    )
}

/// llama-server's `/slots`: each slot's state as the engine thread last
/// published it (the running request's task, prompt and generated tokens so
/// far, and its settings).
async fn slots(State(s): State<AppState>) -> Json<Vec<SlotState>> {
    Json(s.slots.snapshot())
}

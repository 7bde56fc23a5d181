//! llama-server's own routes, for its clients and dashboards: the native
//! completion (`/completion`, `/completions`; see [`crate::native`]),
//! `/props` (the server's settings), `/apply-template` (a chat rendered to
//! its prompt) and `/slots` (what each slot is doing); `/infill` answers
//! what llama-server answers for a model without fill-in-the-middle tokens.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use axum::response::{IntoResponse, Response};

use super::state::{blocking, body, AppState};
use super::{generate, Native};
use crate::error::{status, ApiError};
use crate::native::{self, NativeRequest};
use crate::plan::Prompted;
use crate::protocol::{self, ChatRequest, Logprobs};
use crate::response::Kind;
use crate::scheduler::slot_board::SlotState;

/// The routes of this module, merged into the server's router.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/props", get(props))
        .route("/apply-template", post(apply_template))
        .route("/completion", post(native_completion))
        .route("/completions", post(native_completion))
        .route("/slots", get(slots))
        .route("/infill", post(infill))
}

/// llama-server's `/infill` (code completion between a prefix and a
/// suffix) needs a model trained with fill-in-the-middle tokens, and it
/// answers 501 for one without, before reading the request. No HAMburger has
/// them (the release and SmolLM2-HAMburger are chat models), so this server
/// answers every request so (refused by design, `docs/server.md`).
async fn infill() -> ApiError {
    ApiError::new(
        status::NOT_IMPLEMENTED,
        "infill is not supported by this model: it has no fill-in-the-middle tokens (prefix, suffix, middle)",
    )
}

/// llama-server's `/props`: the settings a request that sets nothing gets,
/// the slots, the model's path and chat template, the context of a slot.
async fn props(State(s): State<AppState>) -> Json<Value> {
    let info = &s.info;
    let n_predict = info.n_predict.map_or(-1, |n| n as i64);
    Json(json!({
        "default_generation_settings": {
            "n_ctx": info.n_ctx_seq,
            "params": {
                "n_predict": n_predict,
                "seed": info.defaults.seed.map_or(-1, |s| s as i64),
                "temperature": info.defaults.sampler.temp.to_string().parse::<f64>().unwrap_or_default(),
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

/// llama-server's `/apply-template`: the chat rendered with the model's
/// chat template as a chat completion would render it, its tools as sent,
/// as `{"prompt": text}`.
async fn apply_template(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: ChatRequest = protocol::parse(&body(b)?)?;
    let tools: Vec<Value> = req.tools.iter().flatten().filter_map(|t| serde_json::to_value(t).ok()).collect();
    let info = s.info.clone();
    let prompt = blocking(move || crate::prompt::render(&info, &req, &tools, None)).await?.text;
    Ok(Json(json!({"prompt": prompt})))
}

/// llama-server's native completion: its prompts ([`NativeRequest::prompts`])
/// tokenized, `n_probs` read as `logprobs`, answered in its shape.
async fn native_completion(
    State(s): State<AppState>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, mut common) = protocol::parse_request::<NativeRequest>(&body(b)?)?;
    if let Some(n) = req.n_probs.filter(|&n| n > 0) {
        common.logprobs = Some(Logprobs::Count(n));
    }
    let (pieces, info) = (req.prompts()?, s.info.clone());
    let prompts = blocking(move || {
        pieces
            .into_iter()
            .map(|p| Ok(Prompted { ids: native::tokenize(&info, p)?, echo: None, prefill: None }))
            .collect()
    })
    .await?;
    let native = Native { return_tokens: req.return_tokens.unwrap_or(false), fields: req.response_fields };
    let conversation = super::resume::conversation_id(&headers);
    generate(&s, Kind::Native, prompts, common, None, Some(native), conversation).await
}

/// llama-server's `/slots`: each slot's state as the engine thread last
/// published it (the running request's task, prompt and generated tokens so
/// far, and its settings); 501 with `--no-slots`.
async fn slots(State(s): State<AppState>) -> Response {
    if !s.slots_endpoint {
        return ApiError::new(status::NOT_IMPLEMENTED, "the slots endpoint is off (--no-slots)").into_response();
    }
    Json::<Vec<SlotState>>(s.slots.snapshot()).into_response()
}

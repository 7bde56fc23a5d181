//! The HTTP layer, on top of everything: axum routes, the API-key check,
//! body limits, CORS, and each completion's path through the layers below
//! (parse once, check messages and tools, plan jobs, compile the
//! constraint, queue, then send the assembled answer as JSON or as
//! Server-Sent Events, comments keeping an idle stream alive).
//!
//! * `state`: what the handlers share;
//! * `llama`: llama-server's operations routes (`/props`, `/slots`, ...);
//! * `webui`: the chat page at `/`.

mod llama;
mod state;
mod webui;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tower_http::cors::CorsLayer;

pub use state::AppState;
use state::{blocking, body};

use crate::choices::Choices;
use crate::error::{status, ApiError};
use crate::plan::{self, Prompted};
use crate::protocol::{self, ChatRequest, Common, CompletionRequest, DetokenizeRequest, OnePrompt, TokenizeRequest};
use crate::response::{Answer, Kind};
use crate::scheduler::SubmitError;
use crate::tools::ToolRequest;

/// Largest request body accepted; a larger one is answered 413.
pub const BODY_LIMIT: usize = 4 << 20;

/// How long a stream may stay silent (waiting for a slot, or a long prompt)
/// before a `: keep-alive` comment is sent, so proxies and clients keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The server's routes over `state`.
pub fn router(state: AppState) -> Router {
    let (cors, webui) = (state.cors, state.webui);
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .merge(llama::routes())
        .layer(middleware::from_fn_with_state(state.clone(), check_key))
        .route("/health", get(health))
        .merge(if webui { webui::routes() } else { Router::new() })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .fallback(|| async { ApiError::new(status::NOT_FOUND, "no such endpoint") })
        .with_state(state);
    if cors {
        router.layer(CorsLayer::permissive())
    } else {
        router
    }
}

/// "ok" while the engine thread runs; 503 once it has stopped.
async fn health(State(s): State<AppState>) -> Response {
    if *s.alive.borrow() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::new(status::UNAVAILABLE, "the engine thread has stopped").into_response()
    }
}

async fn check_key(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = &s.api_key else { return next.run(req).await };
    let sent = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if sent.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|sent| same_key(sent.as_bytes(), key.as_bytes())) {
        next.run(req).await
    } else {
        ApiError::new(status::UNAUTHORIZED, "invalid or missing API key").into_response()
    }
}

/// Compares keys without an early exit, so the answer's timing says nothing
/// of how much of a guessed key was right.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Plans `prompts` (`n` choices each) into jobs, queues them and answers
/// them, streamed or not; each choice's answer starts with its prompt's
/// `echo`, when given; `tools` constrain the answers to a call when the
/// request uses them.
async fn generate(
    s: &AppState,
    kind: Kind,
    prompts: Vec<Prompted>,
    common: Common,
    tools: Option<ToolRequest>,
) -> Result<Response, ApiError> {
    let deadline = Instant::now() + s.timeout;
    let mut planned = plan::plan(&s.info, prompts, &common, deadline, s.submitter.limit())?;
    let (info, t, c) = (s.info.clone(), tools.clone(), common.clone());
    let constraint = blocking(move || plan::constraint(&c, t.as_ref(), info.grammars.as_ref())).await?;
    planned.constrain(constraint.as_ref());
    s.submitter.submit(planned.jobs).map_err(|e| match e {
        SubmitError::Full => ApiError::new(status::UNAVAILABLE, "the server is busy: the queue is full"),
        SubmitError::Closed => ApiError::new(status::UNAVAILABLE, "the server is shutting down"),
    })?;
    let choices = Choices::new(planned.events, planned.n);
    let answer = Answer::new(kind, planned.echoes, planned.n, s.info.clone(), planned.logprobs, tools);
    if common.stream() {
        let events = ReceiverStream::new(answer.stream(choices, common.include_usage()))
            .map(|data| Ok::<_, Infallible>(SseEvent::default().data(data)));
        Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response())
    } else {
        Ok(Json(answer.collect(choices).await?).into_response())
    }
}

async fn chat(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (req, common) = protocol::parse_request::<ChatRequest>(&body(b)?)?;
    let messages = crate::messages::chat_messages(&req.messages)?;
    let tools = ToolRequest::of_request(req.tools.as_deref(), req.tool_choice.as_ref(), s.tool_format, &common)?;
    let template_tools = tools.as_ref().map(|t| t.for_template().to_vec()).unwrap_or_default();
    let info = s.info.clone();
    let prompt = blocking(move || {
        let template = info
            .chat_template
            .as_ref()
            .ok_or_else(|| ApiError::field("messages", "the model has no chat template: use /v1/completions"))?;
        let text = template
            .render_with_tools(&messages, &template_tools, true)
            .map_err(|e| ApiError::field("messages", e.to_string()))?;
        info.tokenizer.encode(&text, true).map_err(|e| ApiError::field("messages", e.to_string()))
    })
    .await?;
    generate(&s, Kind::Chat, vec![Prompted { ids: prompt, echo: None }], common, tools).await
}

async fn completions(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (req, common) = protocol::parse_request::<CompletionRequest>(&body(b)?)?;
    let (echo, prompts, info) = (req.echo(), req.prompt.all()?, s.info.clone());
    let prompts = blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                // An echoed id prompt is its ids decoded (checked against the vocabulary first).
                OnePrompt::Ids(ids) if echo => {
                    plan::check_vocab(&info, "prompt", &ids)?;
                    let text = info.tokenizer.decode(&ids);
                    Ok(Prompted { ids, echo: Some(text) })
                }
                OnePrompt::Ids(ids) => Ok(Prompted { ids, echo: None }),
                OnePrompt::Text(text) => {
                    let ids =
                        info.tokenizer.encode(&text, true).map_err(|e| ApiError::field("prompt", e.to_string()))?;
                    Ok(Prompted { ids, echo: echo.then_some(text) })
                }
            })
            .collect()
    })
    .await?;
    generate(&s, Kind::Completion, prompts, common, None).await
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.info.name,
            "object": "model",
            "created": 0,
            "owned_by": "hamburger",
            "meta": {"n_ctx": s.info.n_ctx, "n_vocab": s.info.n_vocab, "max_steps": s.info.max_steps},
        }],
    }))
}

async fn tokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: TokenizeRequest = protocol::parse(&body(b)?)?;
    let info = s.info.clone();
    let tokens = blocking(move || {
        info.tokenizer.encode(&req.content, req.add_special).map_err(|e| ApiError::field("content", e.to_string()))
    })
    .await?;
    Ok(Json(json!({"tokens": tokens})))
}

async fn detokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeRequest = protocol::parse(&body(b)?)?;
    plan::check_vocab(&s.info, "tokens", &req.tokens)?;
    let info = s.info.clone();
    let content = blocking(move || Ok(info.tokenizer.decode(&req.tokens))).await?;
    Ok(Json(json!({"content": content})))
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

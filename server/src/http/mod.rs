//! The HTTP layer, on top of everything: axum routes, the API-key check,
//! body limits, CORS, and each completion's path through the layers below
//! (parse once, check messages and tools, plan jobs, compile the
//! constraint, queue, then send the assembled answer as JSON or as
//! Server-Sent Events, comments keeping an idle stream alive).
//!
//! * `state`: what the handlers share;
//! * `cors`: cross-origin requests, as llama-server answers them;
//! * `llama`: llama-server's own routes (`/completion`, `/props`, `/slots`, ...);
//! * `anthropic`: Anthropic's Messages API (`/v1/messages`);
//! * `responses`: OpenAI's Responses API (`/v1/responses`);
//! * `resume`: resumable streams (`X-Conversation-Id`, `/v1/stream`);
//! * `vertex`: Google Cloud's Vertex AI prediction route (`AIP_MODE`);
//! * `webui`: the chat page at `/`.

mod anthropic;
mod cors;
mod llama;
mod responses;
mod resume;
mod state;
pub mod vertex;
mod webui;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

pub use cors::Cors;
pub use resume::StreamSessions;
pub use state::AppState;
use state::{blocking, body};
pub use vertex::Vertex;

use crate::choices::Choices;
use crate::error::{status, ApiError};
use crate::plan::{self, Prompted};
use crate::protocol::{self, ChatRequest, Common, CompletionRequest, DetokenizeRequest, OnePrompt, TokenizeRequest};
use crate::response::{Answer, Kind, NativeOptions};
use crate::scheduler::SubmitError;
use crate::tools::ToolRequest;

/// Largest request body accepted; a larger one is answered 413.
pub const BODY_LIMIT: usize = 4 << 20;

/// How long a stream may stay silent (waiting for a slot, or a long prompt)
/// before a `: keep-alive` comment is sent, so proxies and clients keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The server's routes over `state`.
pub fn router(state: AppState) -> Router {
    let webui = state.webui;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/chat/completions/input_tokens", post(chat_input_tokens))
        .route("/v1/chat/completions/input_tokens", post(chat_input_tokens))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .merge(llama::routes())
        .merge(resume::routes())
        .merge(anthropic::routes())
        .merge(responses::routes())
        .layer(middleware::from_fn_with_state(state.clone(), check_key))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .merge(if webui { webui::routes() } else { Router::new() })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .fallback(|| async { ApiError::new(status::NOT_FOUND, "no such endpoint") })
        .layer(middleware::from_fn_with_state(state.clone(), cors::layer))
        .with_state(state)
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
    let headers = req.headers();
    let text = |name: &header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    // `Authorization: Bearer KEY`, or Anthropic's `X-Api-Key: KEY` (llama-server takes both).
    let sent = text(&header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer ")).or_else(|| text(&X_API_KEY));
    let valid = sent.is_some_and(|sent| same_key(sent.as_bytes(), key.as_bytes()));
    if valid {
        next.run(req).await
    } else {
        ApiError::new(status::UNAUTHORIZED, "invalid or missing API key").into_response()
    }
}

/// Anthropic's API key header.
const X_API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

/// Compares keys without an early exit, so the answer's timing says nothing
/// of how much of a guessed key was right.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a native answer asks besides the OpenAI fields.
struct Native {
    /// `return_tokens`.
    return_tokens: bool,
    /// `response_fields`.
    fields: Option<Vec<String>>,
}

/// A queued generation: what assembles its answer, and its choices' events.
struct Queued {
    answer: Answer,
    choices: Choices,
}

/// Plans `prompts` (`n` choices each) into jobs and queues them; each
/// choice's answer starts with its prompt's `echo`, when given; `tools`
/// constrain the answers to a call when the request uses them.
async fn queue(
    s: &AppState,
    kind: Kind,
    prompts: Vec<Prompted>,
    common: &Common,
    tools: Option<ToolRequest>,
    native: Option<Native>,
) -> Result<Queued, ApiError> {
    let deadline = Instant::now() + s.timeout;
    let ids: Vec<Vec<u32>> =
        if native.is_some() { prompts.iter().map(|p| p.ids.clone()).collect() } else { Vec::new() };
    let verbose = common.verbose.unwrap_or(s.info.defaults.verbose) && !common.stream();
    let verbose_ids = prompts.first().filter(|_| verbose).map(|p| p.ids.clone()).unwrap_or_default();
    let mut planned = plan::plan(&s.info, prompts, common, deadline, s.submitter.limit())?;
    let native = native.map(|o| NativeOptions {
        settings: planned.jobs.first().map_or(Value::Null, |j| crate::native::generation_settings(&j.params, &s.info)),
        return_tokens: o.return_tokens,
        fields: o.fields,
        prompts: ids,
        post_sampling: common.post_sampling_probs.unwrap_or(false),
    });
    let (info, t, c) = (s.info.clone(), tools.clone(), common.clone());
    let constraint = blocking(move || plan::constraint(&c, t.as_ref(), &info)).await?;
    planned.constrain(constraint.as_ref());
    s.submitter.submit(planned.jobs).map_err(|e| match e {
        SubmitError::Full => ApiError::new(status::UNAVAILABLE, "the server is busy: the queue is full"),
        SubmitError::Closed => ApiError::new(status::UNAVAILABLE, "the server is shutting down"),
    })?;
    let choices = Choices::new(planned.events, planned.n);
    let mut answer = Answer::new(kind, planned.echoes, planned.n, s.info.clone(), planned.logprobs, tools);
    if let Some(options) = native {
        answer = answer.native(options);
    }
    if verbose {
        answer = answer.verbose(s.info.tokenizer.decode(&verbose_ids));
    }
    Ok(Queued { answer, choices })
}

/// Queues a generation ([`queue`]) and answers it, streamed or not. A
/// stream sent with a conversation id (the `X-Conversation-Id` header) is
/// kept resumable under it.
async fn generate(
    s: &AppState,
    kind: Kind,
    prompts: Vec<Prompted>,
    common: Common,
    tools: Option<ToolRequest>,
    native: Option<Native>,
    conversation: Option<String>,
) -> Result<Response, ApiError> {
    let Queued { answer, choices } = queue(s, kind, prompts, &common, tools, native).await?;
    if common.stream() {
        let events = answer.stream(choices, common.include_usage());
        if let Some(id) = conversation {
            return Ok(resume::resumable(&s.streams, &id, events));
        }
        let events = ReceiverStream::new(events).map(|data| Ok::<_, Infallible>(SseEvent::default().data(data)));
        Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response())
    } else {
        Ok(Json(answer.collect(choices).await?).into_response())
    }
}

async fn chat(
    State(s): State<AppState>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (common, tools, prompt) = chat_of(&s, &body(b)?).await?;
    let conversation = resume::conversation_id(&headers);
    generate(&s, Kind::Chat, vec![prompt], common, tools, None, conversation).await
}

/// A chat request's body (`/v1/chat/completions`', or another API's body
/// rewritten into one): its settings, tools and prompt, checked and rendered.
async fn chat_of(s: &AppState, chat: &[u8]) -> Result<(Common, Option<ToolRequest>, Prompted), ApiError> {
    let (req, common) = protocol::parse_request::<ChatRequest>(chat)?;
    let tools = ToolRequest::of_request(req.tools.as_deref(), req.tool_choice.as_ref(), s.tool_format, &common)?;
    let prompt = chat_prompt(s, &req, tools.as_ref()).await?;
    Ok((common, tools, prompt))
}

/// A stream of another API's named events: a task rewrites each chat chunk
/// into its events (`rewrite`); when the client leaves, the chunks are
/// dropped and the generation is cancelled.
fn rewritten_stream(
    mut chunks: tokio::sync::mpsc::Receiver<String>,
    mut rewrite: impl FnMut(&str) -> Vec<(&'static str, Value)> + Send + 'static,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Some(chunk) = chunks.recv().await {
            for (kind, data) in rewrite(&chunk) {
                if tx.send(SseEvent::default().event(kind).data(data.to_string())).await.is_err() {
                    return;
                }
            }
        }
    });
    let events = ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response()
}

/// A chat's prompt ([`crate::prompt::render`]), its tools given to the
/// template, as token ids, with the prefill its answer starts with.
async fn chat_prompt(s: &AppState, req: &ChatRequest, tools: Option<&ToolRequest>) -> Result<Prompted, ApiError> {
    let template_tools = match tools {
        Some(t) => t.for_template().to_vec(),
        None => ToolRequest::shown_only(req.tools.as_deref(), req.tool_choice.as_ref(), s.tool_format),
    };
    let tool_prompt = tools.and_then(ToolRequest::instructions).map(str::to_string);
    let (info, req) = (s.info.clone(), req.clone());
    blocking(move || {
        let rendered = crate::prompt::render(&info, &req, &template_tools, tool_prompt.as_deref())?;
        let ids =
            info.tokenizer.encode(&rendered.text, true).map_err(|e| ApiError::field("messages", e.to_string()))?;
        Ok(Prompted { ids, echo: None, prefill: rendered.prefill })
    })
    .await
}

/// llama-server's count of a chat's prompt tokens, `{"input_tokens": n}`.
async fn chat_input_tokens(
    State(s): State<AppState>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (_, _, prompt) = chat_of(&s, &body(b)?).await?;
    Ok(Json(json!({"input_tokens": prompt.ids.len()})))
}

async fn completions(
    State(s): State<AppState>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
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
                    Ok(Prompted { ids, echo: Some(text), prefill: None })
                }
                OnePrompt::Ids(ids) => Ok(Prompted { ids, echo: None, prefill: None }),
                OnePrompt::Text(text) => {
                    let ids =
                        info.tokenizer.encode(&text, true).map_err(|e| ApiError::field("prompt", e.to_string()))?;
                    Ok(Prompted { ids, echo: echo.then_some(text), prefill: None })
                }
            })
            .collect()
    })
    .await?;
    generate(&s, Kind::Completion, prompts, common, None, None, resume::conversation_id(&headers)).await
}

/// The one model: its name (the first alias in sorted order, as
/// llama-server picks it), every alias and tag, its sizes.
async fn models(State(s): State<AppState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.info.name,
            "aliases": s.aliases,
            "tags": s.tags,
            "object": "model",
            "created": 0,
            "owned_by": "hamburger",
            "meta": {"n_ctx": s.info.n_ctx, "n_ctx_seq": s.info.n_ctx_seq, "n_vocab": s.info.n_vocab, "max_steps": s.info.max_steps},
        }],
    }))
}

async fn tokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: TokenizeRequest = protocol::parse(&body(b)?)?;
    let info = s.info.clone();
    let tokens = blocking(move || {
        let ids = info
            .tokenizer
            .encode(&req.content, req.add_special)
            .map_err(|e| ApiError::field("content", e.to_string()))?;
        if !req.with_pieces {
            return Ok(json!(ids));
        }
        // Each token with its own decoding (a piece of a multi-byte character is U+FFFD).
        Ok(ids.iter().map(|&id| json!({"id": id, "piece": info.tokenizer.decode(&[id])})).collect())
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

/// The counters in Prometheus' text format (501 unless the server was
/// started with `--metrics`, as llama-server), with llama-server's
/// `Process-Start-Time-Unix` header.
async fn metrics(State(s): State<AppState>) -> Response {
    if !s.metrics_endpoint {
        return ApiError::new(status::NOT_IMPLEMENTED, "the metrics endpoint is off: start the server with --metrics")
            .into_response();
    }
    let started = s.metrics.started_unix().to_string();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4".to_string()), (PROCESS_START.clone(), started)],
        s.metrics.render(),
    )
        .into_response()
}

/// llama-server's header of when the process started (Unix seconds).
static PROCESS_START: header::HeaderName = header::HeaderName::from_static("process-start-time-unix");

/// Serves `app` on `listener` until `stop` turns true, then lets the open
/// connections finish. Header names go out in title case
/// (`Access-Control-Allow-Origin`), as llama-server sends them: clients that
/// read headers into a plain map look them up that way.
///
/// # Errors
/// Never after start: a failed accept or connection is logged and skipped.
pub async fn listen(
    listener: tokio::net::TcpListener,
    app: Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use hyper_util::rt::TokioIo;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    log::warn!("accepting a connection failed: {e}");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = hyper::server::conn::http1::Builder::new()
            .title_case_headers(true)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                log::debug!("connection ended: {e}");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

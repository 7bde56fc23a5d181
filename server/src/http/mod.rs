//! The HTTP side: axum routes, the API-key check, body limits, CORS, and
//! turning a request's choices' events into a JSON answer or Server-Sent
//! Events (one chunk per choice's macro step, comments keeping an idle stream
//! alive, then `data: [DONE]`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tower_http::cors::CorsLayer;

use crate::api::{self, ChatRequest, Common, CompletionRequest, DetokenizeRequest, OnePrompt, TokenizeRequest};
use crate::choices::{self, Choices, Totals};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::slot_board::SlotBoard;
use crate::scheduler::{Event, FinishReason, ModelInfo, Submitter};
use hamburger::TokenLogprob;

/// Largest request body accepted; a larger one is answered 413.
pub const BODY_LIMIT: usize = 4 << 20;

/// How long a stream may stay silent (waiting for a slot, or a long prompt)
/// before a `: keep-alive` comment is sent, so proxies and clients keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Queues jobs for the engine thread.
    pub submitter: Submitter,
    /// The model.
    pub info: Arc<ModelInfo>,
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// The key clients must send as `Authorization: Bearer KEY`, if any.
    pub api_key: Option<String>,
    /// Longest a generation may take, waiting for a slot included; then it
    /// answers what it has with `finish_reason: "length"`.
    pub timeout: Duration,
    /// Whether browsers of any origin may call the API (CORS).
    pub cors: bool,
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
}

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
        .merge(crate::llama_routes::routes())
        .layer(middleware::from_fn_with_state(state.clone(), check_key))
        .route("/health", get(health))
        .merge(if webui { crate::webui::routes() } else { Router::new() })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
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
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine thread has stopped").into_response()
    }
}

async fn check_key(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = &s.api_key else { return next.run(req).await };
    let sent = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if sent.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|sent| same_key(sent.as_bytes(), key.as_bytes())) {
        next.run(req).await
    } else {
        ApiError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key").into_response()
    }
}

/// Compares keys without an early exit, so the answer's timing says nothing
/// of how much of a guessed key was right.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The body, or the error (413 over the limit) in OpenAI's shape.
pub(crate) fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|r| ApiError::new(r.status(), r.body_text()))
}

/// A 400 naming `field` when one of `ids` is outside the vocabulary.
fn check_vocab(info: &ModelInfo, field: &str, ids: &[u32]) -> Result<(), ApiError> {
    match ids.iter().find(|&&t| t as usize >= info.n_vocab) {
        Some(t) => Err(ApiError::field(field, format!("token id {t} is outside the vocabulary of {}", info.n_vocab))),
        None => Ok(()),
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Which OpenAI object a generation answers as.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// Choice `index` carrying `text` (a delta when streaming).
    fn choice(self, index: usize, text: Option<&str>, finish: Option<&str>, chunk: bool) -> Value {
        match (self, chunk) {
            (Kind::Chat, false) => {
                json!({"index": index, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
            }
            (Kind::Chat, true) => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!({"index": index, "delta": delta, "finish_reason": finish})
            }
            (Kind::Completion, _) => {
                json!({"index": index, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        }
    }
}

/// A prompt echoed at the start of a completion's answer (`echo`).
struct Echo {
    /// The prompt's text (as sent, or its ids decoded).
    text: String,
    /// Its first token, which `logprobs` lists with no log-probability.
    first: u32,
}

/// A generation answered as `kind`: its id and model name for every chunk.
struct Answer {
    kind: Kind,
    /// Each prompt, when the answers start with it (`echo`; empty otherwise).
    echoes: Vec<Echo>,
    /// Choices per prompt (`n`): choice `i` answers prompt `i / n`.
    n: usize,
    /// The model (its tokenizer spells the tokens of `logprobs`).
    info: Arc<ModelInfo>,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// The tools of a chat request that uses them: a call answers as `tool_calls`.
    tools: Option<crate::tools::ToolRequest>,
    id: String,
    model: String,
    created: u64,
}

impl Answer {
    fn object(&self, choice: Value, chunk: bool) -> Value {
        self.with_choices(json!([choice]), chunk)
    }

    fn with_choices(&self, choices: Value, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.kind.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// The chunk that ends a stream with `stream_options.include_usage`: no choice, the usage.
    fn usage_chunk(&self, totals: &Totals) -> Value {
        let mut v = self.with_choices(json!([]), true);
        v["usage"] = totals.usage();
        v
    }

    /// The prompt choice `i` starts with, when echoed.
    fn echo_of(&self, i: usize) -> Option<&Echo> {
        self.echoes.get(i / self.n)
    }

    /// Sets `choice`'s `logprobs` to those of `lps` when the request asked
    /// (a completion's led by `first`, an echoed prompt's first token, which
    /// has none); a completion's `text_offset` starts at `offset`, which
    /// moves past the tokens.
    fn set_logprobs(&self, choice: &mut Value, first: Option<u32>, lps: &[TokenLogprob], offset: &mut usize) {
        if !self.logprobs {
            return;
        }
        let tok = &self.info.tokenizer;
        choice["logprobs"] = match self.kind {
            Kind::Chat => crate::logprobs::chat(lps, tok),
            Kind::Completion => crate::logprobs::completion(first, lps, tok, *offset),
        };
        let tokens = first.iter().chain(lps.iter().map(|lp| &lp.token));
        *offset += tokens.map(|&t| tok.decode(&[t]).len()).sum::<usize>();
    }

    /// The chunk ending `choice`, and when the request has no choice left
    /// (`totals` complete), its usage and timings.
    fn finished(&self, choice: Value, totals: Option<&Totals>) -> Value {
        let mut v = self.object(choice, true);
        if let Some(t) = totals {
            v["usage"] = t.usage();
            v["timings"] = t.timings();
        }
        v
    }
}

/// One prompt of a request: its ids, and its text when the answer starts with it (`echo`).
struct Prompted {
    ids: Vec<u32>,
    echo: Option<String>,
}

/// Queues the jobs of `prompts` (`n` choices each) and answers them, streamed
/// or not; each choice's answer starts with its prompt's `echo`, when given;
/// `tools` constrain the answers to a call when the request uses them.
async fn generate(
    s: &AppState,
    kind: Kind,
    prompts: Vec<Prompted>,
    common: &Common,
    tools: Option<crate::tools::ToolRequest>,
) -> Result<Response, ApiError> {
    let n = common.n_choices(s.info.n_slots)?;
    let mut jobs = Vec::with_capacity(prompts.len());
    let mut echoes = Vec::new();
    for Prompted { ids, echo } in prompts {
        check_vocab(&s.info, "prompt", &ids)?;
        let params = common.job_params(&s.info, ids.len(), echo.is_some())?;
        if let Some(text) = echo {
            echoes.push(Echo { text, first: ids[0] });
        }
        jobs.push((ids, params));
    }
    let logprobs = jobs.first().is_some_and(|(_, p)| p.logprobs.is_some());
    let constraint = if let Some(t) = &tools {
        let (info, t) = (s.info.clone(), t.clone());
        Some(blocking(move || t.constraint(&info)).await?)
    } else if crate::structured::spec(common)?.is_some() {
        let (info, common) = (s.info.clone(), common.clone());
        blocking(move || crate::structured::compile(&info, &common)).await?
    } else {
        None
    };
    for (_, params) in &mut jobs {
        params.constraint.clone_from(&constraint);
    }
    let choices = choices::submit(&s.submitter, jobs, n, common, Instant::now() + s.timeout)?;
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    let serial = s.metrics.requests.load(std::sync::atomic::Ordering::Relaxed);
    let answer = Answer {
        kind,
        echoes,
        n,
        info: s.info.clone(),
        logprobs,
        tools,
        id: format!("{prefix}-{:x}{serial:04x}", now()),
        model: s.info.name.clone(),
        created: now(),
    };
    Ok(if common.stream() { stream(answer, choices, common.include_usage()) } else { collect(answer, choices).await })
}

/// Waits for every choice and answers them in one object, in index order.
async fn collect(a: Answer, mut choices: Choices) -> Response {
    let n = choices.len();
    let mut texts: Vec<String> = (0..n).map(|i| a.echo_of(i).map_or_else(String::new, |e| e.text.clone())).collect();
    let (mut lps, mut reasons) = (vec![Vec::new(); n], vec![FinishReason::Stop; n]);
    let mut prompt_lps = vec![Vec::new(); n];
    let mut totals = choices.totals();
    while !choices.all_done() {
        match choices.next().await {
            Ok((i, Event::Text { text, logprobs, .. })) => {
                texts[i].push_str(&text);
                lps[i].extend(logprobs);
            }
            Ok((i, Event::Done { reason, timings, logprobs, prompt_logprobs })) => {
                lps[i].extend(logprobs);
                prompt_lps[i] = prompt_logprobs;
                reasons[i] = reason;
                totals.add(i, &timings);
            }
            Ok((_, Event::Failed(_))) => unreachable!("Choices::next turns failures into errors"),
            Err(e) => return e.into_response(),
        }
    }
    let list: Vec<Value> = (0..n)
        .map(|i| {
            let mut c = a.kind.choice(i, Some(&texts[i]), Some(api::finish_reason(reasons[i])), false);
            if let Some(calls) = a.tools.as_ref().and_then(|t| t.calls(&texts[i])) {
                c["message"] = json!({"role": "assistant", "content": null, "tool_calls": calls});
                c["finish_reason"] = json!("tool_calls");
            }
            let all: Vec<TokenLogprob> = prompt_lps[i].drain(..).chain(lps[i].drain(..)).collect();
            a.set_logprobs(&mut c, a.echo_of(i).map(|e| e.first), &all, &mut 0);
            c
        })
        .collect();
    let mut v = a.with_choices(Value::Array(list), false);
    v["usage"] = totals.usage();
    v["timings"] = totals.timings();
    Json(v).into_response()
}

/// Streams the choices as Server-Sent Events: a task forwards each choice's
/// events as chunks carrying its `index` (an echoed prompt first, in a chunk
/// of its own; each text chunk with its tokens' `logprobs` when asked, and a
/// non-standard `hamburger` object: the `tokens` and `macro_steps` it covers,
/// so a client sees the steps), one chunk with each choice's finish reason,
/// the last of them with the request's usage and timings (then a chunk of no
/// choice with `usage` when `include_usage`), or an error; when the client
/// leaves, the task notices at once, ends, and the jobs' channels close.
fn stream(a: Answer, mut choices: Choices, include_usage: bool) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(SseEvent::default().data(v.to_string())));
        if matches!(a.kind, Kind::Chat) {
            for i in 0..choices.len() {
                let role = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
                if send(a.object(role, true)).await.is_err() {
                    return;
                }
            }
        }
        for i in 0..choices.len() {
            if let Some(echo) = a.echo_of(i) {
                if send(a.object(a.kind.choice(i, Some(&echo.text), None, true), true)).await.is_err() {
                    return;
                }
            }
        }
        let mut offsets = vec![0; choices.len()];
        let mut totals = choices.totals();
        loop {
            let event = tokio::select! {
                e = choices.next() => e,
                () = tx.closed() => return,
            };
            let (v, last, usage) = match event {
                Ok((i, Event::Text { text, tokens, steps, logprobs })) => {
                    let mut c = a.kind.choice(i, Some(&text), None, true);
                    a.set_logprobs(&mut c, None, &logprobs, &mut offsets[i]);
                    let mut v = a.object(c, true);
                    v["hamburger"] = json!({"tokens": tokens, "macro_steps": steps});
                    (v, false, None)
                }
                Ok((i, Event::Done { reason, timings, logprobs, .. })) => {
                    totals.add(i, &timings);
                    let mut c = a.kind.choice(i, None, Some(api::finish_reason(reason)), true);
                    a.set_logprobs(&mut c, None, &logprobs, &mut offsets[i]);
                    let last = choices.all_done();
                    let usage = (last && include_usage).then(|| a.usage_chunk(&totals));
                    (a.finished(c, last.then_some(&totals)), last, usage)
                }
                Ok((_, Event::Failed(_))) => unreachable!("Choices::next turns failures into errors"),
                Err(e) => (e.body(), true, None),
            };
            for v in std::iter::once(v).chain(usage) {
                if send(v).await.is_err() {
                    return;
                }
            }
            if last {
                let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                return;
            }
        }
    });
    Sse::new(ReceiverStream::new(out))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response()
}

async fn chat(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (req, common) = api::parse_request::<ChatRequest>(&body(b)?)?;
    let messages = crate::messages::chat_messages(&req.messages)?;
    let tools =
        crate::tools::ToolRequest::of_request(req.tools.as_deref(), req.tool_choice.as_ref(), &s.info, &common)?;
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
    generate(&s, Kind::Chat, vec![Prompted { ids: prompt, echo: None }], &common, tools).await
}

/// Runs `f` (a template, the tokenizer: CPU work) on tokio's blocking pool,
/// so the async workers keep serving other connections meanwhile.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the request's task failed: {e}")))
    })
}

async fn completions(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (req, common) = api::parse_request::<CompletionRequest>(&body(b)?)?;
    let (echo, prompts, info) = (req.echo(), req.prompt.all()?, s.info.clone());
    let prompts = blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                // An echoed id prompt is its ids decoded (checked against the vocabulary first).
                OnePrompt::Ids(ids) if echo => {
                    check_vocab(&info, "prompt", &ids)?;
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
    generate(&s, Kind::Completion, prompts, &common, None).await
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.info.name,
            "object": "model",
            "created": 0,
            "owned_by": "hamburger",
            "meta": {"n_ctx_slot": s.info.n_ctx_slot, "n_vocab": s.info.n_vocab, "max_steps": s.info.max_steps},
        }],
    }))
}

async fn tokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: TokenizeRequest = api::parse(&body(b)?)?;
    let info = s.info.clone();
    let tokens = blocking(move || {
        info.tokenizer.encode(&req.content, req.add_special).map_err(|e| ApiError::field("content", e.to_string()))
    })
    .await?;
    Ok(Json(json!({"tokens": tokens})))
}

async fn detokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeRequest = api::parse(&body(b)?)?;
    check_vocab(&s.info, "tokens", &req.tokens)?;
    let info = s.info.clone();
    let content = blocking(move || Ok(info.tokenizer.decode(&req.tokens))).await?;
    Ok(Json(json!({"content": content})))
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}
